"""The distributed learner's eval verifiers with `--reward`: code evals scored by a real reward
service (gRPC front, a Celery worker running the programs in bubblewrap) give the verdicts the
learner's own verifier gives, the learner's side never looks for a sandbox, the domains that run
no program stay local, and a reward service that stays away stops the eval past its bound
(`resilience.reward_s`) naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reward_procs import REDIS, Front, Proc, flush_or_skip, free_port, redis_client, start_worker

from cascade.config import load_cascade_config
from cascade.domains import make_domain
from cascade.domains.base import NeedsPreparing
from cascade.resilience import DependencyDown
from services.learner.eval_scoring import EvalScorers, ServiceScored, reward_outage

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
DB = 14


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    flush_or_skip(DB)
    log_dir = tmp_path_factory.mktemp("eval-scoring")
    url = f"redis://{REDIS}/{DB}"
    procs: list[Proc | Front] = []
    try:
        worker = start_worker("eval-worker", url, log_dir)
        procs.append(worker)
        f = Front("eval-front", url, log_dir, "--task-timeout-s", "60")
        procs.append(f)
        worker.wait_for_log("ready.", 30)
        worker.wait_for_log("code sandbox ready", 30)  # the passed check, in the worker's own log
        f.wait_serving(30)
        yield f
    finally:
        for proc in procs:
            proc.stop()
        redis_client(DB).flushdb()


def test_code_evals_scored_by_the_service_match_the_local_verifier(front: Front) -> None:
    config = load_cascade_config(REPO / "examples" / "tiny-cascade.yaml")
    assert {d.name for d in config.domains} >= {"math", "code"}
    lines: list[str] = []
    scorers = EvalScorers(config, f"127.0.0.1:{front.port}", reward_outage(30, lines.append))
    try:
        code = scorers.domains["code"]
        assert isinstance(code, ServiceScored) and not isinstance(code, NeedsPreparing)
        assert not isinstance(scorers.domains["math"], ServiceScored)
        problems = code.make_problems("eval", 3, 0)
        local = make_domain(next(d for d in config.domains if d.name == "code"))
        assert problems == local.make_problems("eval", 3, 0)
        completions = [
            f"```python\n{problems[0].answer}\n```",  # the reference: passes every test
            "```python\ndef f(x):\n    return -1\n```",  # runs, wrong
            "```python\nimport os\nos.system('cat /etc/passwd')\ndef f(x): return 0\n```",
        ]
        remote = code.score_batch([problems[0], problems[1], problems[2]], completions)
        mine = local.score_batch([problems[0], problems[1], problems[2]], completions)
    finally:
        scorers.close()
    assert remote[0].reward == 1.0
    assert [(v.reward, v.reason) for v in remote] == [(v.reward, v.reason) for v in mine]
    assert lines == []  # no outage


def test_a_reward_service_that_stays_away_stops_the_eval_naming_it() -> None:
    config = load_cascade_config(REPO / "examples" / "tiny-cascade.yaml")
    lines: list[str] = []
    scorers = EvalScorers(config, f"127.0.0.1:{free_port()}", reward_outage(1.0, lines.append))
    try:
        code = scorers.domains["code"]
        problem = code.make_problems("eval", 1, 0)[0]
        with pytest.raises(DependencyDown, match="reward unreachable"):
            code.score_batch([problem], ["```python\ndef f(x): return x\n```"])
    finally:
        scorers.close()
    assert any("reward" in line for line in lines)
