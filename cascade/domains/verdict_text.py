"""Verdict text that can always be sent, stored and shown: the reason and detail of a verdict.

A detail often quotes what a completion controls (its parsed answer, a program's output or
exception), so it may hold anything a policy can write: lone surrogates (not encodable as
UTF-8, which protobuf string fields, JSON to Postgres and most loggers require), terminal
escape sequences, carriage returns that overwrite a log line, bidirectional-override
characters that reorder what an operator reads, or megabytes of text. One such detail must
not fail the `Score` RPC that carries the whole batch, so `RewardVerdict` passes its text
through `verdict_text` when it is built, and nothing can bypass it.

The rules, in order:

1. Valid UTF-8: every lone surrogate (U+D800..U+DFFF) becomes U+FFFD.
2. Line structure kept, nothing else: `\\n` and `\\t` stay (tracebacks and diffs stay
   readable), `\\r\\n` becomes `\\n`, every other C0/C1 control character, DEL, and the
   bidirectional embedding/override/isolate marks are removed.
3. Capped: at most `max_chars` characters (a reason: `MAX_REASON_CHARS`; a detail:
   `MAX_DETAIL_CHARS`), cut text ending with a marker that gives the original length.
"""

from __future__ import annotations

import re

MAX_DETAIL_CHARS = 2000
"""Longest detail kept (characters; at most 4 bytes each in UTF-8)."""
MAX_REASON_CHARS = 64
"""Longest reason kept; reasons are short codes such as `wrong_answer`."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls, and the bidi marks and overrides."""


def verdict_text(value: object, max_chars: int = MAX_DETAIL_CHARS) -> str:
    """`value` as text that is valid UTF-8, free of control characters but `\\n` and `\\t`,
    and at most `max_chars` characters long (see the module docstring)."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    text = value if isinstance(value, str) else _to_str(value)
    total = len(text)
    # Bound the work first: a huge detail is cut before any regex sees it.
    text = text[: max_chars * 2]
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    text = _CONTROL.sub("", text.replace("\r\n", "\n"))
    if len(text) > max_chars or total > max_chars * 2:
        marker = f" [cut: {total} chars in all]"
        text = (text[: max(0, max_chars - len(marker))] + marker)[:max_chars]
    return text


def _to_str(value: object) -> str:
    try:
        return str(value)
    except Exception as err:  # a hostile __str__ must not fail the verdict
        return f"<unprintable {type(value).__name__}: {type(err).__name__}>"
