"""`run.json`: what a run directory records so the run can be resumed as it was started.

The resolved config, the mode (`embedded` / `distributed`), the database (its URL with any
password masked: secrets never go to disk), the cascade id in that database, and what the
rollout source needs to clean up after a dead process (the distributed run's Redis key prefix).
`resume_command` turns it into the command line that continues the run.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from cascade.config import CascadeConfig

RECORD_FILE = "run.json"
MASK = "***"


def public_db_url(url: str) -> str:
    """`url` without its password (masked), as it may be written to disk and printed."""
    parsed = make_url(url)
    if parsed.password is None:
        return parsed.render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=True)


@dataclass
class RunRecord:
    config: dict[str, Any]
    distill: bool
    kind: str
    db_url: str
    cascade_id: int
    sources: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        *,
        config: CascadeConfig,
        distill: bool,
        kind: str,
        db_url: str,
        cascade_id: int,
        sources: dict[str, Any],
    ) -> RunRecord:
        return cls(
            config=config.model_dump(mode="json"),
            distill=distill,
            kind=kind,
            db_url=public_db_url(db_url),
            cascade_id=cascade_id,
            sources=sources,
        )

    @property
    def db_url_complete(self) -> bool:
        """False when the password was masked: `--db` must be given again on resume."""
        return MASK not in self.db_url


def write_record(run_dir: Path, record: RunRecord) -> None:
    tmp = run_dir / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(record), indent=1))
    tmp.replace(run_dir / RECORD_FILE)


def read_record(run_dir: Path) -> RunRecord | None:
    path = run_dir / RECORD_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if "kind" not in data:  # written before resume records existed: config and distill only
        return None
    return RunRecord(**data)


def resume_command(
    config_path: str | Path | None, run_dir: Path, record: RunRecord | None, *, embedded: bool
) -> str:
    """The command that continues this run, as the operator can paste it (`cascade run` reads
    the config from run.json when no YAML is given)."""
    words = ["cascade", "run" if embedded else "up"]
    words += [str(config_path)] if config_path is not None else []
    words += ["--resume", "--run-dir", str(run_dir)]
    own_db = f"sqlite:///{(run_dir / 'cascade.db').resolve()}"
    if record is not None and record.db_url != own_db:
        words += ["--db", record.db_url, "--cascade-id", str(record.cascade_id)]
    line = shlex.join(words)
    if record is not None and not record.db_url_complete:
        line += "   (put the database password back in --db)"
    return line
