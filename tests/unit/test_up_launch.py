"""The resume hint of `cascade up` restarts the stack as it was: `run.json`'s `launch`, turned
back into flags, parses into the same stack settings (no secret written or printed)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from cascade.cli.engine import engine_launch
from cascade.cli.main import build_parser
from cascade.config import VllmEngineConfig
from cascade.runner.record import (
    RunRecord,
    launch_flags,
    public_url,
    read_record,
    record_launch,
    resume_command,
    write_record,
)
from cascade.up.stack import LocalStack
from cascade.up.supervisor import RestartBound


def _record(run_dir: Path, **kw: object) -> RunRecord:
    fields: dict = dict(
        config={},
        distill=True,
        kind="distributed",
        db_url="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        cascade_id=7,
        sources={"stream_prefix": "cascade:x:1"},
    )
    fields.update(kw)
    return RunRecord(**fields)


def test_public_url_masks_a_redis_password() -> None:
    assert public_url("redis://:s3cret@redis.svc:6380/2") == "redis://:***@redis.svc:6380/2"
    assert public_url("rediss://user:s3cret@[::1]/0") == "rediss://user:***@[::1]/0"
    assert public_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_launch_flags_spell_each_kind_of_value() -> None:
    launch = {"workers": 3, "no_follow": True, "nice": 0, "track": [], "engine": None, "fresh": False}
    assert launch_flags(launch) == ["--workers", "3", "--no-follow", "--nice", "0", "--track", "none"]


def test_the_hint_parses_into_the_same_stack(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    vllm = VllmEngineConfig(kv_cache_gib=2.0, enforce_eager=False)
    stack = LocalStack(
        config=tmp_path / "c.yaml",
        model=tmp_path,
        run_dir=run_dir,
        log_dir=tmp_path / "logs",
        redis_url="redis://:s3cret@10.0.0.5:6390/3",
        stream_prefix="cascade:e2e:abcd",
        workers=3,
        rollout_replicas=2,
        celery_workers=0,
        learner_ranks=2,
        follow=False,
        nice=5,
        track=["tensorboard"],
        restart_bound=RestartBound(max_restarts=7, window_s=120),
        launch_extra=engine_launch("vllm", vllm, "/opt/vllm/bin/python"),
    )
    record = _record(run_dir, distill=False, launch=stack.launch())
    write_record(run_dir, record)
    assert "s3cret" not in (run_dir / "run.json").read_text()
    hint = resume_command("c.yaml", run_dir, read_record(run_dir), embedded=False)
    assert hint.endswith("(put the Redis password back in --redis-url)")
    words = shlex.split(hint.split("   (")[0])
    assert words[:2] == ["cascade", "up"]
    args = build_parser().parse_args(words[1:])
    assert (args.config, args.resume, Path(args.run_dir)) == ("c.yaml", True, run_dir)
    assert (args.db, args.cascade_id, args.no_distill) == (record.db_url, 7, True)
    assert args.redis_url == "redis://:***@10.0.0.5:6390/3"
    assert (args.stream_prefix, args.workers, args.rollout_replicas) == ("cascade:e2e:abcd", 3, 2)
    assert (args.celery_workers, args.learner_ranks, args.nice, args.no_follow) == (0, 2, 5, True)
    assert (args.track, args.max_restarts, args.restart_window_s) == (["tensorboard"], 7, 120.0)
    assert Path(args.log_dir) == tmp_path / "logs"
    assert (args.engine, args.vllm_python, args.vllm_kv_cache_gib) == ("vllm", "/opt/vllm/bin/python", 2.0)
    assert args.vllm_enforce_eager is False


def test_record_launch_adds_to_what_the_learner_wrote(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert not record_launch(run_dir, {"workers": 2})  # no run.json yet: nothing written
    write_record(run_dir, _record(run_dir))
    assert record_launch(run_dir, {"workers": 2, "redis_url": "redis://127.0.0.1:6379/0"})
    assert not record_launch(run_dir, {"workers": 2, "redis_url": "redis://127.0.0.1:6379/0"})
    data = json.loads((run_dir / "run.json").read_text())
    assert data["launch"] == {"workers": 2, "redis_url": "redis://127.0.0.1:6379/0"}
    assert data["cascade_id"] == 7 and data["sources"] == {"stream_prefix": "cascade:x:1"}
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]  # no temporary file left
    embedded = resume_command(None, run_dir, read_record(run_dir), embedded=True)
    assert "--workers" not in embedded  # `cascade run` has no stack to rebuild
