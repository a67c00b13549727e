"""The distributed learner started (or resumed) while its rollout service is down past
`--rollout-wait-s` stops with one line naming the bound and the exact resume command, exit 75
(EX_TEMPFAIL), not a traceback: found by the chaos drill (tests/e2e/test_chaos_drill.py), whose
rollout service was killed while the resumed learner attached. Needs Redis on 127.0.0.1:6379."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from cascade.up.stack import REPO, free_port

REDIS_URL = os.environ.get("CASCADE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def test_no_rollout_replica_past_the_start_bound_stops_with_the_resume_command(
    e2e: Any, tmp_path: Path
) -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.RedisError:
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    e2e.config(tmp_path)
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    argv = [sys.executable, "-m", "services.learner.main", str(tmp_path / "cascade.yaml")]
    argv += ["--run-dir", str(tmp_path / "run"), "--redis-url", REDIS_URL]
    argv += ["--stream-prefix", f"cascade:start-bound:{uuid.uuid4().hex[:8]}", "--rollout", nobody]
    argv += ["--rollout-wait-s", "2", "--host", "127.0.0.1", "--metrics-port", "0", "--no-distill"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    err = done.stderr
    assert done.returncode == 75, err[-3000:]
    assert f"error: learner stopped: no rollout replica answered within 2s ({nobody})" in err, err[-3000:]
    assert "continue with: " in err and "--resume" in err.split("continue with: ")[-1], err[-3000:]
    assert "Traceback" not in err + done.stdout, err[-3000:]
