"""`run.json`: what a run directory records so the run can be resumed as it was started.

The resolved config, the mode (`embedded` / `distributed`), the database (its URL with any
password masked: secrets never go to disk), the cascade id in that database, and what the
rollout source needs to clean up after a dead process (the distributed run's Redis key prefix).
A run started by `cascade up` also records how its stack was launched (`launch`: Redis URL with
any password masked, stream prefix, workers, replicas, learner ranks, Celery workers, engine, log
directory, restart bound), written there by `cascade up` once the learner has written the file.
`resume_command` turns it into the command line that continues the run as it was started.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def public_url(url: str) -> str:
    """Any `scheme://user:password@host/...` URL (Redis) with its password masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}:{MASK}@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class RunRecord:
    config: dict[str, Any]
    distill: bool
    kind: str
    db_url: str
    cascade_id: int
    sources: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    """`cascade up`'s flags that rebuild the stack (by their flag names: `redis_url`, `workers`,
    ...); empty for a run not started by `cascade up`."""

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


def launch_flags(launch: dict[str, Any]) -> list[str]:
    """`cascade up`'s flags from a recorded launch: `key: value` is `--key value` (underscores as
    dashes), True a bare `--key`, False and None nothing, a list comma-joined (empty: `none`)."""
    words: list[str] = []
    for key, value in launch.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, ",".join(str(v) for v in value) or "none"]
        else:
            words += [flag, str(value)]
    return words


def record_launch(run_dir: Path, launch: dict[str, Any]) -> bool:
    """Add `cascade up`'s launch to the run.json the learner wrote (True if it was written)."""
    record = read_record(run_dir)
    if record is None or record.launch == launch:
        return False
    record.launch = launch
    tmp = run_dir / f".{RECORD_FILE}.launch.tmp"  # not the learner's temporary name
    tmp.write_text(json.dumps(asdict(record), indent=1))
    tmp.replace(run_dir / RECORD_FILE)
    return True


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
    if record is not None and not record.distill:
        words.append("--no-distill")  # the learner takes it from the flag, not from run.json
    if record is not None and not embedded:
        words += launch_flags(record.launch)
    line = shlex.join(words)
    if record is not None and not record.db_url_complete:
        line += "   (put the database password back in --db)"
    if record is not None and not embedded and MASK in str(record.launch.get("redis_url", "")):
        line += "   (put the Redis password back in --redis-url)"
    return line
