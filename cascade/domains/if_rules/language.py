"""Which language a response is in: `langdetect` (the detector IFEval's checkers use), seeded.

langdetect draws random samples of the text's n-grams; its module-level factory is unseeded by
default (two calls on the same short text may disagree) and is loaded lazily without a lock. Here
one factory is loaded once under a lock, and every detection seeds its own detector, so the same
text always gets the same language, from any thread.
"""

from __future__ import annotations

import threading
from typing import Any

from cascade.domains.if_rules.core import WORD_RE

MAX_CHARS = 5_000
"""langdetect reads at most this much of a response (its own cap is 10,000): a detection costs
at most ~0.15 s of CPU on a hostile 24,000-character completion, and a reply's language shows
long before its 5,000th character."""

_lock = threading.Lock()
_factory: Any = None


def _load_factory() -> Any:
    global _factory
    with _lock:
        if _factory is None:
            from langdetect import detector_factory

            factory = detector_factory.DetectorFactory()
            factory.load_profile(detector_factory.PROFILES_DIRECTORY)
            factory.seed = 0
            _factory = factory
    return _factory


def detect_language(text: str) -> str | None:
    """The ISO 639-1 code langdetect gives `text` (`zh-cn`, `zh-tw` for Chinese), or None when the
    text has nothing to detect (no letters: langdetect refuses it)."""
    if WORD_RE.search(text) is None:
        return None
    from langdetect.lang_detect_exception import LangDetectException

    detector = _load_factory().create()
    detector.set_max_text_length(MAX_CHARS)
    detector.append(text[: MAX_CHARS * 2])
    try:
        return str(detector.detect())
    except LangDetectException:
        return None
