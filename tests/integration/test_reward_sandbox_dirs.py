"""A reward worker that scored code and was stopped leaves no staged sandbox directory.

Each Celery prefork child scoring code starts its own sandbox pool, with a directory
`cascade-sandbox-<pid>-XXXX` in the temp dir; the child leaves through `os._exit`, past `atexit`,
at a warm shutdown and on the SIGTERM sent to the whole process group alike. Here a
private Redis, a private temp dir, a worker and a front, then one code item, then the stop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from reward_procs import Front, free_port, start_redis, start_worker

from cascade.config import DomainConfig
from cascade.domains import make_domain
from cascade_proto.v1 import reward_pb2 as pb
from cascade_proto.v1 import reward_pb2_grpc as pb_grpc

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
]


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The service's temp dir (TMPDIR), in the real one: the sandbox uid must reach the harness."""
    tmp = Path(tempfile.mkdtemp(prefix="test-reward-tmp-"))
    tmp.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(tmp))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _staged(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("cascade-sandbox-*"))


@pytest.mark.parametrize("stop", ["sigterm-to-the-group", "warm-shutdown"])
def test_stopped_worker_leaves_no_sandbox_directory(private_tmp: Path, tmp_path: Path, stop: str) -> None:
    port = free_port()
    redis = start_redis(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    worker = start_worker("worker", url, tmp_path, concurrency=1)
    front = Front("front", url, tmp_path, "--local-workers", "0")
    try:
        worker.wait_for_log("ready.", 60)
        front.wait_serving(60)
        problem = make_domain(DomainConfig(name="code")).make_problems("eval", 1, 0)[0]
        item = pb.Item(
            problem=pb.Problem(
                id=problem.id,
                prompt=problem.prompt,
                answer=problem.answer,
                meta_json=json.dumps(problem.meta),
            ),
            completion=problem.answer,
        )
        reply = pb_grpc.RewardServiceStub(front.channel).Score(
            pb.ScoreRequest(domain="code", items=[item]), timeout=60
        )
        assert [(v.reward, v.reason) for v in reply.verdicts] == [(1.0, "ok")]
        staged = _staged(private_tmp)
        assert len(staged) == 1, staged  # the scoring child's pool (the start check's is closed)
        owner = int(staged[0].split("-")[2])
        assert owner != worker.pid  # a prefork child, not the main process
        if stop == "warm-shutdown":  # SIGTERM to the main process alone: it stops its children
            os.kill(worker.pid, signal.SIGTERM)
            worker.popen.wait(timeout=30)
        worker.stop()  # SIGTERM to the whole group (then SIGKILL to stragglers)
        assert "Traceback" not in worker.log()
        assert _staged(private_tmp) == []
    finally:
        front.stop()
        worker.stop()
        redis.stop()
