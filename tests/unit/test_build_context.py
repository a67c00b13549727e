"""The Docker build context leaves out everything git ignores at the top level.

`make test` builds the vLLM virtual environment and the images side by side; a build context that
held `.venv-vllm` tarred files pip was deleting (a CI run failed on it) and shipped gigabytes to
the daemon for nothing.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _patterns(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _top_level_ignored() -> list[str]:
    """Top-level names .gitignore excludes whole (negations and nested patterns aside)."""
    names = []
    for pattern in _patterns(ROOT / ".gitignore"):
        name = pattern.strip("/")
        if pattern.startswith("!") or "/" in name or "*" in name:
            continue
        names.append(name)
    return names


def _excluded(name: str, patterns: list[str]) -> bool:
    """Docker's rules for a top-level name: `**/` also matches at the root."""
    return any(
        not pattern.startswith("!") and fnmatch.fnmatch(name, pattern.strip("/").removeprefix("**/"))
        for pattern in patterns
    )


def test_every_git_ignored_directory_is_outside_the_build_context() -> None:
    docker = _patterns(ROOT / ".dockerignore")
    ignored = _top_level_ignored()
    assert {".venv", ".venv-vllm", "models", "runs"} <= set(ignored)
    missing = [name for name in ignored if not _excluded(name, docker)]
    assert missing == [], f".dockerignore lets these into the build context: {missing}"


def test_the_vllm_environment_by_any_name_is_outside_the_build_context() -> None:
    docker = _patterns(ROOT / ".dockerignore")
    assert _excluded(".venv-vllm-cu128", docker)
