"""The control plane's configuration: the database, the bearer tokens, the bounds on requests
and the roots a created cascade's paths must stay in (YAML, typed).

Tokens are `SecretStr` from the moment they are read, so a repr, a log line or a validation
error never shows one; a token may be written inline or, better, named by environment variable.

```yaml
database_url: postgresql://cascade@db:5432/cascade
tokens:
  - {name: alice, role: write, token_env: CASCADE_TOKEN_ALICE}
  - {name: dashboard, role: read, token_env: CASCADE_TOKEN_DASHBOARD, optional: true}
limits: {max_body_bytes: 1000000, max_config_depth: 64, max_stages_per_cascade: 64, body_timeout_s: 30}
paths: {runs_root: /checkpoints/runs, model_roots: [/models], data_roots: [/data]}
```

Environment variables override the file (`with_environment`): CASCADE_API_BASE_DIR,
CASCADE_API_RUNS_ROOT, CASCADE_API_MODEL_ROOTS and CASCADE_API_DATA_ROOTS (several roots
separated by `:`), CASCADE_API_BODY_TIMEOUT_S.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
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
    optional: bool = False
    """With `token_env`: when the variable is unset or empty, start without this token (the
    start-up log says so) instead of refusing to start. A token that is set is still checked."""

    @model_validator(mode="after")
    def _one_source(self) -> TokenConfig:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give exactly one of token, token_env")
        if self.optional and self.token_env is None:
            raise ValueError("optional applies to token_env only (an inline token is always there)")
        return self

    def absent(self) -> bool:
        """An optional token whose environment variable is unset or empty."""
        return self.optional and self.token_env is not None and not os.environ.get(self.token_env)

    def secret(self) -> str:
        if self.token is not None:
            value = self.token.get_secret_value()
        else:
            assert self.token_env is not None
            value = os.environ.get(self.token_env, "")
            if not value:
                raise SettingsError(
                    f"tokens.{self.name}: environment variable {self.token_env} is not set "
                    "(set it, or mark the token `optional: true`)"
                )
        if len(value) < MIN_TOKEN_CHARS:
            raise SettingsError(f"tokens.{self.name}: a token needs at least {MIN_TOKEN_CHARS} characters")
        return value


class ApiLimits(BaseModel):
    """Bounds on what a request may ask of the server; past one, a 4xx that names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(1_000_000, ge=1024, le=100_000_000)
    """Largest request body (a cascade config, JSON or YAML) read; larger ones get 413 without
    being read to the end."""
    max_config_depth: int = Field(64, ge=8, le=200)
    """Deepest nesting of mappings and lists in a config (a real one nests about 5 deep); deeper
    ones get 422 before they are parsed further."""
    max_stages_per_cascade: int = Field(64, ge=1, le=10_000)
    """Most stages one cascade may have (422 past it)."""
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Longest a request body may take to arrive, from the request's headers to its last byte;
    past it the request is answered 408 and the connection closed (a client that sends part of
    a body and stalls holds nothing longer)."""


class ApiPaths(BaseModel):
    """Where the paths of a config created through the API may point. Every path in it is
    resolved (made absolute from `base_dir`, `..` and symlinks resolved) and stored resolved, so
    the runner opens what was checked wherever it runs; one outside its roots is a 422 naming
    the field. Relative roots are taken from `base_dir` too. The CLI (`cascade run config.yaml`)
    is not confined: its user chose the paths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_dir: Path | None = None
    """What relative paths are taken from; default: the API's working directory."""
    runs_root: Path = Path("runs")
    """`output_dir` (so every run directory, `<output_dir>/<name>`) and the trackers' local
    output (TensorBoard's `log_dir`, W&B's `dir`, a file or SQLite MLflow store) must be in it."""
    model_roots: list[Path] = Field(default_factory=lambda: [Path("models")], min_length=1)
    """The policy (`model.path`), reward and judge models and chat-template tokenizers must be
    in one of these."""
    data_roots: list[Path] = Field(default_factory=lambda: [Path("data")], min_length=1)
    """Prompt files and data sets (`domains.*.prompts`) must be in one of these."""


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str | None = None
    """SQLAlchemy URL (`postgresql://...`); `--db` and CASCADE_API_DB_URL override it."""
    tokens: list[TokenConfig] = []
    db_wait_s: float = Field(30.0, ge=0)
    """How long start-up waits for the database before giving up."""
    limits: ApiLimits = ApiLimits()
    paths: ApiPaths = ApiPaths()


ENV_PATHS = {
    "CASCADE_API_BASE_DIR": "base_dir",
    "CASCADE_API_RUNS_ROOT": "runs_root",
    "CASCADE_API_MODEL_ROOTS": "model_roots",
    "CASCADE_API_DATA_ROOTS": "data_roots",
}
"""Environment variables that override `paths` (the lists: roots separated by `os.pathsep`)."""
ENV_BODY_TIMEOUT = "CASCADE_API_BODY_TIMEOUT_S"


def with_environment(settings: ApiSettings, environ: Mapping[str, str] | None = None) -> ApiSettings:
    """`settings` with the environment's CASCADE_API_* path roots and body timeout over the
    file's (an empty variable is ignored). SettingsError names a bad one."""
    env = os.environ if environ is None else environ
    paths = settings.paths.model_dump()
    for var, name in ENV_PATHS.items():
        value = env.get(var, "")
        if value:
            paths[name] = [p for p in value.split(os.pathsep) if p] if name.endswith("_roots") else value
    limits = settings.limits.model_dump()
    if env.get(ENV_BODY_TIMEOUT):
        limits["body_timeout_s"] = env[ENV_BODY_TIMEOUT]
    try:
        return settings.model_copy(
            update={"paths": ApiPaths.model_validate(paths), "limits": ApiLimits.model_validate(limits)}
        )
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        var = next((v for v, n in ENV_PATHS.items() if where.startswith(n)), ENV_BODY_TIMEOUT)
        raise SettingsError(f"{var}: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"api:{self.name}"


class TokenTable:
    """Bearer token -> principal, compared in constant time against every configured token."""

    def __init__(self, entries: list[tuple[bytes, Principal]], skipped: tuple[str, ...] = ()) -> None:
        self._entries = entries
        self.skipped = skipped
        """Optional tokens left out because their environment variable is unset (by name)."""

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> TokenTable:
        names = [t.name for t in settings.tokens]
        if len(set(names)) != len(names):
            raise SettingsError(f"tokens: names must be unique, got {names}")
        present = [t for t in settings.tokens if not t.absent()]
        skipped = tuple(f"{t.name} (${t.token_env} unset)" for t in settings.tokens if t.absent())
        entries = [(t.secret().encode(), Principal(t.name, t.role)) for t in present]
        secrets = [e[0] for e in entries]
        if len(set(secrets)) != len(secrets):
            raise SettingsError("tokens: two entries share one token")
        return cls(entries, skipped)

    def lookup(self, presented: str) -> Principal | None:
        given = presented.encode()
        found = None
        for secret, principal in self._entries:  # no early exit: timing says nothing
            if hmac.compare_digest(secret, given):
                found = principal
        return found

    def describe(self) -> str:
        """For the start-up log: names and roles, never the tokens."""
        held = ", ".join(f"{p.name} ({p.role})" for _, p in self._entries) or "none (read-only API)"
        return held + (f"; optional, not set: {', '.join(self.skipped)}" if self.skipped else "")


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
