"""Unified diffs: parsing, a whitespace-normalised canonical form, and lexical patch similarity.

Parsing (`parse_patch`) reads the unified format `diff -u` and `git diff` write:

    diff --git a/src/util.py b/src/util.py      (optional; like `index`, mode and other
    index 1234567..89abcde 100644                 metadata lines, and prose, it is skipped)
    --- a/src/util.py                             (file header: `---` then `+++`; a `a/` or `b/`
    +++ b/src/util.py                              prefix and a tab-separated timestamp are dropped;
    @@ -3,7 +3,7 @@ def f(x):                      `/dev/null` marks a created or deleted file)
         context line
    -    removed line
    +    added line
    \\ No newline at end of file                   (skipped)

It raises `PatchParseError` (a ValueError, with the line number) on malformed input: non-blank
text without any file header, a `---` header not followed by `+++` (or the reverse), a file
header with no hunk, a hunk header that is not `@@ -a[,b] +c[,d] @@`, a hunk outside a file, or a
hunk without lines. Hunk line counts are checked only with `strict_counts=True`: model-written
diffs often miscount, and the reward below does not use positions. A hunk's body is read while
lines start with ` `, `-`, `+` or `\\` (an empty line is an empty context line, as editors strip
trailing spaces); it ends at the next `@@`, at a `diff --git` line, at a file header (a `---`
line then a `+++` line) once the header's counts are satisfied or when a `@@` line follows it,
or at any other line (trailing prose); trailing empty lines are dropped.

Canonical form (`Patch.changes`): for each file (by its new path, or its old path when
deleted), the sequence of changed lines in order, each `-text` or `+text` where `text` is the
line with whitespace normalised (`normalise_line`: leading and trailing whitespace dropped,
inner runs collapsed to one space); lines blank after normalisation are dropped, context lines
and hunk positions are ignored. Two patches are equal (`patches_equal`) when their canonical
forms are. A patch is a no-op (`Patch.is_noop`) when no file has a changed line, or when every
file's removed lines equal its added lines (it deletes and re-adds the same text).

Lexical similarity (`lexical_similarity`) between a predicted patch P and a gold patch G, over
the files U = files(P) | files(G) that have changes in either:

    file_overlap = |files(P) & files(G)| / |U|                   (Jaccard of the file sets)
    content      = (1/|U|) * sum_{f in U} ratio(tokens_P(f), tokens_G(f))
    similarity   = (file_overlap + content) / 2

where `ratio` is difflib's `SequenceMatcher(None, a, b, autojunk=False).ratio()` = 2M/(|a|+|b|)
(M = matched elements), a file missing from one side has ratio 0, and `tokens_X(f)` is f's
canonical changed lines of X as a token sequence: per line a `-`/`+` tag token, the line's
identifiers, numbers and single punctuation characters, and an end-of-line token. Tokens rather
than characters make the ratio reward the right identifiers and operators and keep its
quadratic worst case small (a 400-line patch is a few thousand tokens). The similarity is 1
exactly when the canonical forms are equal, and 0 when no changed file is shared; both empty
gives 1, one empty gives 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_HUNK_LINE_TAGS = (" ", "-", "+", "\\")
_NULL_PATH = "/dev/null"


class PatchParseError(ValueError):
    """The text is not a well-formed unified diff; the message says where and why."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[tuple[str, str], ...]
    """(tag, text) pairs; tag is " " (context), "-" (removed) or "+" (added)."""
    section: str = ""
    """Text after the closing `@@` (often the enclosing function)."""

    @property
    def removed(self) -> list[str]:
        return [text for tag, text in self.lines if tag == "-"]

    @property
    def added(self) -> list[str]:
        return [text for tag, text in self.lines if tag == "+"]

    def counts(self) -> tuple[int, int]:
        """(old, new) line counts of the body: context + removed, context + added."""
        context = sum(1 for tag, _ in self.lines if tag == " ")
        return context + len(self.removed), context + len(self.added)


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None
    """None for a created file (`--- /dev/null`)."""
    new_path: str | None
    """None for a deleted file (`+++ /dev/null`)."""
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.new_path if self.new_path is not None else self.old_path
        assert path is not None  # the parser refuses /dev/null on both sides
        return path

    def changed_lines(self) -> list[tuple[str, str]]:
        """("-" or "+", raw text) for every changed line, in order."""
        return [(tag, text) for hunk in self.hunks for tag, text in hunk.lines if tag != " "]


@dataclass(frozen=True)
class Patch:
    files: tuple[FilePatch, ...]

    @property
    def changed_line_count(self) -> int:
        """Removed plus added lines (raw, blank ones included)."""
        return sum(len(f.changed_lines()) for f in self.files)

    @property
    def changes(self) -> dict[str, tuple[str, ...]]:
        """The canonical form: path -> normalised changed lines (`-text`/`+text`), blank lines dropped.

        Files with no such line are left out; two sections for one path are merged in order.
        """
        merged: dict[str, list[str]] = {}
        for file in self.files:
            for tag, text in file.changed_lines():
                norm = normalise_line(text)
                if norm:
                    merged.setdefault(file.path, []).append(tag + norm)
        return {path: tuple(lines) for path, lines in merged.items()}

    @property
    def is_noop(self) -> bool:
        """True when the patch changes nothing beyond whitespace (see the module docstring)."""
        for lines in self.changes.values():
            removed = [line[1:] for line in lines if line[0] == "-"]
            added = [line[1:] for line in lines if line[0] == "+"]
            if removed != added:
                return False
        return True


def normalise_line(text: str) -> str:
    """Whitespace-normalised line: ends stripped, inner whitespace runs collapsed to one space."""
    return " ".join(text.split())


def parse_patch(text: str, *, strict_counts: bool = False) -> Patch:
    """Parse a unified diff (see the module docstring); blank text gives an empty patch."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _is_file_header(lines, i):
            header_lineno = i + 1
            old_path, new_path = _header_path(line[4:]), _header_path(lines[i + 1][4:])
            if old_path is None and new_path is None:
                raise PatchParseError(f"line {header_lineno}: both sides of the file header are {_NULL_PATH}")
            i += 2
            hunks: list[Hunk] = []
            while i < len(lines) and lines[i].startswith("@@"):
                hunk, i = _parse_hunk(lines, i, strict_counts)
                hunks.append(hunk)
            if not hunks:
                raise PatchParseError(
                    f"line {header_lineno}: file header for {new_path or old_path!r} has no hunk "
                    "(expected '@@ -a,b +c,d @@' next)"
                )
            files.append(FilePatch(old_path, new_path, tuple(hunks)))
            continue
        if line.startswith("@@"):
            raise PatchParseError(
                f"line {i + 1}: hunk header before any '--- a/<path>' / '+++ b/<path>' header"
            )
        if line.startswith("--- "):
            raise PatchParseError(f"line {i + 1}: '--- ' file header not followed by a '+++ ' line")
        if line.startswith("+++ "):
            raise PatchParseError(f"line {i + 1}: '+++ ' file header without a '--- ' line before it")
        i += 1
    if not files and text.strip():
        raise PatchParseError("no file header ('--- a/<path>' then '+++ b/<path>') found: not a unified diff")
    return Patch(tuple(files))


def _is_file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _header_path(raw: str) -> str | None:
    path = raw.split("\t", 1)[0].strip()
    if len(path) >= 2 and path[0] == path[-1] == '"':
        path = path[1:-1]
    if path == _NULL_PATH:
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    if not path:
        raise PatchParseError(f"empty path in file header {raw!r}")
    return path


def _parse_hunk(lines: list[str], i: int, strict_counts: bool) -> tuple[Hunk, int]:
    """The hunk whose header is `lines[i]`, and the index of the first line after it."""
    header_lineno = i + 1
    match = _HUNK_HEADER.match(lines[i])
    if match is None:
        raise PatchParseError(
            f"line {header_lineno}: malformed hunk header {lines[i][:80]!r}; expected '@@ -a,b +c,d @@'"
        )
    old_start, new_start = int(match[1]), int(match[3])
    old_len = int(match[2]) if match[2] is not None else 1
    new_len = int(match[4]) if match[4] is not None else 1
    i += 1
    body: list[tuple[str, str]] = []
    raw_empty: list[bool] = []
    old_seen = new_seen = 0
    while i < len(lines):
        line = lines[i]
        satisfied = old_seen >= old_len and new_seen >= new_len
        if line.startswith("@@") or (
            _is_file_header(lines, i)
            and (satisfied or (i + 2 < len(lines) and lines[i + 2].startswith("@@")))
        ):
            break
        if line.startswith("diff --git "):
            break
        if line == "":
            tag, text = " ", ""
        elif line.startswith(_HUNK_LINE_TAGS):
            tag, text = line[0], line[1:]
        else:
            break
        i += 1
        if tag == "\\":
            continue
        body.append((tag, text))
        raw_empty.append(line == "")
        old_seen += tag != "+"
        new_seen += tag != "-"
    while raw_empty and raw_empty[-1]:
        raw_empty.pop()
        body.pop()
    if not body:
        raise PatchParseError(f"line {header_lineno}: hunk has no lines")
    hunk = Hunk(old_start, old_len, new_start, new_len, tuple(body), match[5].strip())
    if strict_counts and hunk.counts() != (old_len, new_len):
        old, new = hunk.counts()
        raise PatchParseError(
            f"line {header_lineno}: hunk header says -{old_len} +{new_len} lines, body has -{old} +{new}"
        )
    return hunk, i


def patches_equal(pred: Patch, gold: Patch) -> bool:
    """Equal canonical forms: the same files with the same changed lines up to whitespace."""
    return pred.changes == gold.changes


def _tokens(lines: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.append("\x00" + line[0])  # the tag, distinct from a `-` or `+` in the code
        out.extend(_TOKEN.findall(line[1:]))
        out.append("\x00\n")
    return out


def file_overlap_and_content(pred: Patch, gold: Patch) -> tuple[float, float]:
    """(file_overlap, content) of the similarity formula (see the module docstring)."""
    pred_changes, gold_changes = pred.changes, gold.changes
    union = set(pred_changes) | set(gold_changes)
    if not union:
        return 1.0, 1.0
    shared = set(pred_changes) & set(gold_changes)
    content = 0.0
    for path in shared:
        a, b = _tokens(pred_changes[path]), _tokens(gold_changes[path])
        content += SequenceMatcher(None, a, b, autojunk=False).ratio()
    return len(shared) / len(union), content / len(union)


def lexical_similarity(pred: Patch, gold: Patch) -> float:
    """(file-set Jaccard + mean per-file token ratio) / 2, in [0, 1]; see the module docstring."""
    file_overlap, content = file_overlap_and_content(pred, gold)
    return (file_overlap + content) / 2


def apply_file_patch(source: str, file_patch: FilePatch) -> str:
    """`source` with `file_patch` applied, exactly (no fuzz): each hunk's old lines (context and
    removed) must appear in `source`; of the places they do, the one nearest the header's
    position wins (the earlier one on a tie). Hunks without a changed line change nothing and
    are skipped unchecked.

    Raises PatchParseError when a hunk does not match. The result ends with a newline when it
    has any line. Time: per hunk, one C-level scan of the file for the hunk's first old line and
    a comparison at each place it occurs (no per-line Python loop over the whole file).
    """
    lines = source.splitlines()
    offset = 0
    for hunk in file_patch.hunks:
        if all(tag == " " for tag, _ in hunk.lines):
            continue
        old = [text for tag, text in hunk.lines if tag != "+"]
        new = [text for tag, text in hunk.lines if tag != "-"]
        guess = max(hunk.old_start - 1 + offset, 0) if hunk.old_len else hunk.old_start + offset
        at = _find_block(lines, old, guess)
        if at is None:
            raise PatchParseError(f"hunk @@ -{hunk.old_start},{hunk.old_len} @@ does not match the source")
        lines[at : at + len(old)] = new
        offset += len(new) - len(old)
    return "\n".join(lines) + "\n" if lines else ""


def _find_block(lines: list[str], block: list[str], guess: int) -> int | None:
    """Where `block` occurs in `lines` nearest `guess` (the earlier on a tie), or None."""
    n = len(block)
    if n == 0:
        return min(max(guess, 0), len(lines))
    best: int | None = None
    at = -1
    last = len(lines) - n
    if last < 0:
        return None
    while True:
        try:
            at = lines.index(block[0], at + 1, last + 1)
        except ValueError:
            return best
        if lines[at : at + n] == block and (best is None or abs(at - guess) < abs(best - guess)):
            best = at
