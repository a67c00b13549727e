"""The control plane's configuration: the database and the bearer tokens (YAML, typed).

Tokens are `SecretStr` from the moment they are read, so a repr, a log line or a validation
error never shows one; a token may be written inline or, better, named by environment variable.

```yaml
database_url: postgresql://cascade@db:5432/cascade
tokens:
  - {name: alice, role: write, token_env: CASCADE_TOKEN_ALICE}
  - {name: dashboard, role: read, token_env: CASCADE_TOKEN_DASHBOARD}
```
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

MIN_TOKEN_CHARS = 16


class SettingsError(Exception):
    """Unusable settings; the message is one line naming the field (and never a secret)."""


class TokenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    """Who holds it: events record `api:<name>` as the actor."""
    role: Literal["read", "write"]
    """`write` may create cascades and move stages; `read` is refused those routes (403)."""
    token: SecretStr | None = None
    token_env: str | None = None
    """Name of the environment variable holding the token (preferred over `token`)."""

    @model_validator(mode="after")
    def _one_source(self) -> TokenConfig:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give exactly one of token, token_env")
        return self

    def secret(self) -> str:
        if self.token is not None:
            value = self.token.get_secret_value()
        else:
            assert self.token_env is not None
            value = os.environ.get(self.token_env, "")
            if not value:
                raise SettingsError(f"tokens.{self.name}: environment variable {self.token_env} is not set")
        if len(value) < MIN_TOKEN_CHARS:
            raise SettingsError(f"tokens.{self.name}: a token needs at least {MIN_TOKEN_CHARS} characters")
        return value


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str | None = None
    """SQLAlchemy URL (`postgresql://...`); `--db` and CASCADE_API_DB_URL override it."""
    tokens: list[TokenConfig] = []
    db_wait_s: float = Field(30.0, ge=0)
    """How long start-up waits for the database before giving up."""


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"api:{self.name}"


class TokenTable:
    """Bearer token -> principal, compared in constant time against every configured token."""

    def __init__(self, entries: list[tuple[bytes, Principal]]) -> None:
        self._entries = entries

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> TokenTable:
        names = [t.name for t in settings.tokens]
        if len(set(names)) != len(names):
            raise SettingsError(f"tokens: names must be unique, got {names}")
        entries = [(t.secret().encode(), Principal(t.name, t.role)) for t in settings.tokens]
        secrets = [e[0] for e in entries]
        if len(set(secrets)) != len(secrets):
            raise SettingsError("tokens: two entries share one token")
        return cls(entries)

    def lookup(self, presented: str) -> Principal | None:
        given = presented.encode()
        found = None
        for secret, principal in self._entries:  # no early exit: timing says nothing
            if hmac.compare_digest(secret, given):
                found = principal
        return found

    def describe(self) -> str:
        """For the start-up log: names and roles, never the tokens."""
        return ", ".join(f"{p.name} ({p.role})" for _, p in self._entries) or "none (read-only API)"


def load_settings(path: str | Path | None) -> ApiSettings:
    if path is None:
        return ApiSettings()
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise SettingsError(f"{path}: cannot read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise SettingsError(f"{path}: invalid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping at the top level")
    try:
        return ApiSettings.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        # Never echo the input: it may be a token.
        raise SettingsError(f"{path}: {loc}: {first['msg']}") from None
