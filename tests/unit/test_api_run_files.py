"""The API's reader of a run directory's completions log: only its tail, whole lines only."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.runner.step_logs import COMPLETIONS_LOG
from services.api import run_files


def test_the_log_name_is_the_runners() -> None:
    assert run_files.COMPLETIONS_LOG == COMPLETIONS_LOG


def test_tail_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_files, "_CHUNK", 7)  # many reads back from the end
    log = tmp_path / "log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)) + b'{"cut')
    assert run_files.tail_lines(log, 3) == [b"line 97", b"line 98", b"line 99"]
    assert run_files.tail_lines(log, 1000)[:2] == [b"line 0", b"line 1"]
    # a byte limit: the line it cuts is left out, never half of it
    assert run_files.tail_lines(log, 1000, limit=30) == [b"line 97", b"line 98", b"line 99"]
    log.write_bytes(b"")
    assert run_files.tail_lines(log, 5) == []
    log.write_bytes(b"only\n\n")
    assert run_files.tail_lines(log, 5) == [b"only"]
