"""Secrets out of what the API serves: stored configs and event details are readable without a
token (and by the dashboard), so credentials in them are masked on the way out.

Masked: the value of every key named like a credential (`password`, `token`, `secret`,
`api_key`, ... as a word of the key: `max_new_tokens` is not one), the password of any
`scheme://user:password@host` URL, and query parameters named like a credential
(`?token=...`), in strings at any depth. The database keeps the config as it was given: the
runner reads it from there, not through the API.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "secret", "secrets", "token", "apikey", "credential", "credentials"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:)[^/?#\s]*@")
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<key>[^=&;#\s]+)=)(?P<value>[^&;#\s]*)")


def secret_key(key: str) -> bool:
    """A key named like a credential: one of its words is `token`, `password`, `secret`, ...,
    or two of them are `api key`, `access key`, `private key` (`snake_case`, `kebab-case`,
    `camelCase` alike)."""
    words = [w.lower() for w in _WORD.findall(key)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False))


def _masked(key: str, value: Any) -> bool:
    """A scalar under a credential's key (a number too: YAML reads `password: 123456` as one);
    None, empty strings and booleans say nothing, mappings and lists are searched instead."""
    if isinstance(value, bool) or value is None or value == "":
        return False
    return isinstance(value, str | int | float) and secret_key(key)


def redact_text(text: str) -> str:
    """`text` with URL passwords and credential-named query parameters masked."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)

    def param(m: re.Match[str]) -> str:
        return f"{m['head']}{MASK}" if secret_key(m["key"]) and m["value"] else m[0]

    return _QUERY_PARAM.sub(param, text) if "=" in text else text


def redact(value: Any) -> Any:
    """A copy of a JSON value with every secret masked (the input is not changed)."""
    if isinstance(value, dict):
        return {k: MASK if _masked(str(k), v) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
