"""Which language a response is in: `langdetect` (the detector IFEval's checkers use), seeded.

A response is in a language when every part of it is (`in_language`): the whole text is cut
into consecutive windows of at least `WINDOW_CHARS` characters (equal lengths, under twice that),
and each window with `MIN_LETTERS` letters or more must be detected as that language. langdetect
alone reads only a prefix (its cap is 10,000 characters), so a reply could open with enough text
in the asked language and go on in another; here no part of the text goes unread.

langdetect draws random samples of the text's n-grams; its module-level factory is unseeded by
default (two calls on the same short text may disagree) and is loaded lazily without a lock. Here
one factory is loaded once under a lock, and every detection seeds its own detector, so the same
text always gets the same language, from any thread.
"""

from __future__ import annotations

import threading
from typing import Any

from cascade.domains.if_rules.core import WORD_RE

WINDOW_CHARS = 2_000
"""The shortest window `in_language` detects (langdetect is reliable far below this; the windows
together cover the whole text, each detection costs a few milliseconds of CPU, linear in total)."""

MIN_LETTERS = 40
"""A window with fewer letters (a table of numbers, a stretch of code punctuation) is not judged
on its own: langdetect guesses at random on a handful of letters."""

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
    """The ISO 639-1 code langdetect gives all of `text` (`zh-cn`, `zh-tw` for Chinese), or None
    when the text has nothing to detect (no letters: langdetect refuses it)."""
    if WORD_RE.search(text) is None:
        return None
    from langdetect.lang_detect_exception import LangDetectException

    detector = _load_factory().create()
    detector.set_max_text_length(len(text) + 1)
    detector.append(text)
    try:
        return str(detector.detect())
    except LangDetectException:
        return None


def windows(text: str) -> list[str]:
    """`text` cut into consecutive windows of equal length, each at least `WINDOW_CHARS` long
    (a text shorter than that is one window)."""
    count = max(1, len(text) // WINDOW_CHARS)
    bounds = [len(text) * i // count for i in range(count + 1)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def in_language(text: str, language: str) -> bool:
    """Every window of `text` (`windows`) with at least `MIN_LETTERS` letters is detected as
    `language`; a text with no such window is judged whole (a text with nothing to detect, no
    letters, is in no language)."""
    judged = [w for w in windows(text) if sum(c.isalpha() for c in w) >= MIN_LETTERS]
    if not judged:
        return detect_language(text) == language
    return all(detect_language(window) == language for window in judged)
