"""The distributed mode end to end on local processes: rollout, reward and teacher services,
rollout workers over Redis streams, and the learner writing to Postgres (`cascade.up.stack.LocalStack`).

One set of services serves every test (started once, stopped by pid at the end); each test
starts its own learner and workers on a fresh stream prefix (the two-replica test adds a second
rollout service for its run). The two-stage cascade's embedded run, the reference of the equality
tests, runs once per module. Needs Redis on 127.0.0.1:6379
(skipped without it) and Postgres (the `postgres_url` fixture).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stack_probe import REDIS_URL, redis_up

from cascade.up.stack import LocalStack, wait_serving


@pytest.fixture(scope="module")
def stack(random_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    root = tmp_path_factory.mktemp("distributed")
    s = LocalStack(
        config=root / "unset.yaml",
        model=random_tiny_model,
        run_dir=root / "unset",
        log_dir=root / "logs",
        redis_url=REDIS_URL,
        celery_workers=0,  # if / math are scored in the reward front; Celery is for code / rlhf
        claim_idle_ms=1000,
    )
    try:
        s.start_services(timeout_s=120)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def two_stage_reference(e2e: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The embedded run of the two-stage cascade (`_two_stage`): what every distributed run of it
    must equal, metric for metric."""
    root = tmp_path_factory.mktemp("embedded-two-stage")
    cfg = e2e.config(root, _two_stage)
    e2e.run(cfg, run_dir=root / "embedded")
    return e2e.rows(e2e.sqlite_url(root / "embedded"))


def _use(stack: LocalStack, config: Path, run_dir: Path, db: str | None) -> None:
    stack.config, stack.run_dir, stack.db = config, run_dir, db
    stack.stream_prefix = f"cascade:test:{uuid.uuid4().hex[:8]}"


def _two_stage(data: dict[str, Any]) -> None:
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    # stage 2 samples in thinking mode: its prompts, the decode that keeps the reasoning markers
    # and the verdicts on what follows them are the same in both modes
    data["stages"][1]["grpo"]["thinking"] = True
    for stage in data["stages"]:
        stage["advance"]["max_steps"] = 3
        # sampled eval through the rollout service, seeded as in the embedded run
        stage["eval"].update(samples=4, temperature=0.8, metrics=["greedy", "avg@4", "pass@2"])


def _scrape_while_training(port: int | None, stack: LocalStack, timeout_s: float = 150) -> dict[str, float]:
    """The learner's /metrics once it has taken a step (it serves them only while training)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and stack.procs["learner"].popen.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        if values.get("cascade_learner_steps_total", 0) >= 1:
            return values
        time.sleep(0.2)
    return {}


def test_two_stage_cascade_with_distillation_matches_embedded(
    stack, e2e, tmp_path, postgres_url, two_stage_reference
) -> None:
    e2e.config(tmp_path, _two_stage)
    run_dir = tmp_path / "distributed"
    _use(stack, tmp_path / "cascade.yaml", run_dir, postgres_url)
    stack.claim_idle_ms = 60_000  # no take-overs of slow-but-alive workers here (test below)
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        scraped = _scrape_while_training(learner.metrics_port, stack)
        assert stack.wait(timeout_s=150) == 0, stack.procs["learner"].log()[-3000:]
        assert scraped.get("cascade_learner_steps_total", 0) >= 1, scraped
        assert 0.0 <= scraped["cascade_learner_idle_fraction"] <= 1.0
        from cascade.transport.teacher_client import TeacherClient

        client = TeacherClient(stack.procs["teacher"].address)
        registered = {t.name: t.checkpoint for t in client.list_teachers().teachers}
        client.close()
    finally:
        stack.stop_run()
    rows = e2e.rows(postgres_url)
    assert rows.run_status == "completed"
    assert _keys_left(stack.stream_prefix) == []  # a finished run leaves nothing in Redis
    assert [(i, d, st) for i, _, d, st in rows.stages] == [(0, "if", "completed"), (1, "math", "completed")]
    expected = [(0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 1, 4), (1, 2, 5), (1, 3, 6)]
    assert [(s, st, g) for s, st, g, _ in rows.steps] == expected
    for _, _, _, m in rows.steps:
        assert 0.0 <= m["idle_fraction"] <= 1.0 and m["time_wait_s"] >= 0 and m["duplicate_chunks"] == 0
        assert m["staleness"] == 0.0
    assert all(any(k.startswith("distill_if_") for k in m) for m in rows.step_metrics(1))
    assert not any(any(k.startswith("distill_") for k in m) for m in rows.step_metrics(0))
    # the best checkpoint per trained domain is the teacher, in the store and in the teacher service
    teachers = {d: path for d, _, path in rows.teachers}
    assert set(teachers) == {"if", "math"}
    assert Path(registered["if"]).resolve() == Path(teachers["if"]).resolve()

    # same config and seed in one process: the same numbers, step for step (sampling is seeded
    # per request from (seed, batch, request); weights go through float32 safetensors unchanged)
    e2e.assert_equal_runs(rows, two_stage_reference)
    assert all(m["rollout_replicas"] == 1 and m["replicas_out"] == 0 for _, _, _, m in rows.steps)


def _scrape_until(port: int | None, stack: LocalStack, wanted: Any, timeout_s: float = 120) -> dict[str, Any]:
    """The learner's /metrics samples (name, labels) -> value, once `wanted(samples)` holds."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    values: dict[Any, float] = {}
    while time.monotonic() < deadline and stack.procs["learner"].alive():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        values = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        if wanted(values):
            return values
        time.sleep(0.2)
    return values


def test_two_rollout_replicas_one_killed_mid_run_still_match_embedded(
    stack, e2e, tmp_path, two_stage_reference
) -> None:
    """Two rollout service processes: the learner pushes every version to both, the workers
    spread their requests over both (`--rollout a,b`). After step 2 the second replica is
    SIGKILLed: the learner takes it out (an ERROR line, the step metrics, Prometheus), the
    workers' requests go to the first, and every step metric and eval still equals the embedded
    run's (per-request seeding: a request generates the same tokens on either replica)."""
    e2e.config(tmp_path, _two_stage)
    run_dir = tmp_path / "distributed"
    _use(stack, tmp_path / "cascade.yaml", run_dir, None)
    stack.claim_idle_ms = 60_000
    extra = stack.rollout_service(1)
    extra.start(stack._env(), stack.nice)
    first = stack.procs["rollout"].address
    try:
        wait_serving(extra, 120)
        assert stack.rollout_addresses() == f"{first},{extra.address}"
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        _wait(
            "step 2",
            lambda: (run_dir / "samples.jsonl").exists() and len(_trained(run_dir)) >= 2,
            alive=learner.alive,
        )
        served = "".join(stack.procs[f"worker-{i}"].log() for i in range(2))
        extra.signal_group(signal.SIGKILL)
        extra.popen.wait(timeout=10)
        key = ("cascade_learner_rollout_replicas_out", ())
        scraped = _scrape_until(learner.metrics_port, stack, lambda v: v.get(key, 0) >= 1)
        assert stack.wait(timeout_s=150) == 0, learner.log()[-3000:]
        log = learner.log()
    finally:
        stack.stop_run()
        stack.procs.pop("rollout-1").stop()
    # both replicas served requests before the kill
    assert f"replica {first})" in served and f"replica {extra.address})" in served, served[-2000:]
    assert f"ERROR rollout replica {extra.address} taken out of service" in log, log[-3000:]
    assert scraped.get(key) == 1, scraped
    failures = {k: v for k, v in scraped.items() if k[0] == "cascade_learner_rollout_replica_failures_total"}
    assert [dict(k[1])["replica"] for k, v in failures.items() if v == 1] == [extra.address], failures

    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.run_status == "completed"
    metrics = [m for _, _, _, m in rows.steps]
    assert metrics[0]["rollout_replicas"] == 2 and metrics[0]["replicas_out"] == 0
    assert metrics[-1]["rollout_replicas"] == 1 and metrics[-1]["replicas_out"] == 1
    assert sum(m["replica_failures"] for m in metrics) == 1
    e2e.assert_equal_runs(rows, two_stage_reference)


def _keys_left(prefix: str) -> list[bytes]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{prefix}:*"))
    finally:
        client.close()


def _trained(run_dir: Path) -> list[list[str]]:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return [json.loads(line)["sample_ids"] for line in lines]


def _wait_log(stack: LocalStack, name: str, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in stack.procs[name].log():
        assert stack.procs[name].alive(), stack.procs[name].log()[-2000:]
        assert time.monotonic() < deadline, f"{name}: no {text!r}:\n{stack.procs[name].log()[-2000:]}"
        time.sleep(0.1)


def test_killed_workers_lose_no_sample_and_none_is_trained_twice(stack, e2e, tmp_path) -> None:
    """worker-0 publishes its request's groups and dies before acknowledging (a re-delivery would
    train them twice); worker-1 dies after taking a request, before generating (it would be
    lost). Both are SIGKILLed; worker-2 claims both requests."""

    def one_stage(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
        data["stages"] = data["stages"][:1]
        data["stages"][0]["advance"]["max_steps"] = 3

    e2e.config(tmp_path, one_stage)
    run_dir = tmp_path / "run"
    _use(stack, tmp_path / "cascade.yaml", run_dir, None)
    stack.claim_idle_ms = 1000
    stack.worker_flags = {
        0: ["--fault-hold-s", "600", "--fault-at", "before_ack"],
        1: ["--fault-hold-s", "600", "--fault-at", "before_generate"],
    }
    try:
        stack.worker(0)
        stack.worker(1)
        stack.start_learner()
        _wait_log(stack, "worker-0", "fault hold", 90)
        _wait_log(stack, "worker-1", "fault hold", 30)
        for name in ("worker-0", "worker-1"):
            stack.procs[name].signal_group(signal.SIGKILL)
        stack.worker(2)
        assert stack.wait(timeout_s=90) == 0, stack.procs["learner"].log()[-3000:]
        worker2 = stack.procs["worker-2"].log()
    finally:
        stack.worker_flags = {}
        stack.stop_run()
    assert worker2.count("claimed") >= 2, worker2[-2000:]
    trained = _trained(run_dir)
    assert len(trained) == 3
    everything = [sid for step in trained for sid in step]
    assert all(len(step) == 4 * 4 for step in trained)  # 4 prompts x group of 4, none missing
    assert [sid for sid, n in Counter(everything).items() if n > 1] == []  # none twice
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    # worker-0's request came back twice (its own publish + worker-2's); a slow worker-2 request
    # may also be claimed by nobody else here (one live worker), so exactly one duplicate
    assert sum(m["duplicate_chunks"] for m in rows.step_metrics(0)) == 1


# ---------------------------------------------------------------------- operators and faults


def _wait(what: str, check: Any, timeout_s: float = 120, alive: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if alive is not None and not alive():
            raise AssertionError(f"exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s}s")
        time.sleep(0.1)


def _same_steps(e2e: Any, dist: Any, emb: Any) -> None:
    skip = set(e2e.DISTRIBUTED_ONLY) | set(TIMING)
    assert [s[:3] for s in dist.steps] == [s[:3] for s in emb.steps]
    for (_, _, g, a), (_, _, _, b) in zip(dist.steps, emb.steps, strict=True):
        assert {k: v for k, v in a.items() if k in e2e.comparable_keys(a, skip)} == {
            k: v for k, v in b.items() if k not in skip
        }, g


TIMING = ("time_rollout_s", "time_loss_s", "time_update_s", "time_step_s")


def test_operator_pauses_resumes_advances_and_aborts_a_distributed_run(stack, e2e, tmp_path) -> None:
    """The learner joined to an API cascade (`--cascade-id --follow`): a REST pause keeps the stack
    up and sends no rollout request while paused; resume continues; advance ends stage 1; a pause
    then abort in stage 2 ends the run. The steps equal an embedded run stopped at the same steps."""
    import redis
    from api_procs import WRITE_TOKEN, fresh_schema, running_api

    def edit(data: dict[str, Any]) -> None:
        data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = 200

    cfg_path = tmp_path / "cascade.yaml"
    e2e.config(tmp_path, edit)
    with fresh_schema() as url, running_api(url, tmp_path) as api:
        status, body = api.call(
            "POST",
            "/api/cascades",
            token=WRITE_TOKEN,
            body=cfg_path.read_bytes(),
            content_type="application/yaml",
        )
        assert status == 201, body
        cascade_id = int(body["id"])
        first, second = (s["id"] for s in body["stages"])

        def stages() -> list[dict[str, Any]]:
            return api.call("GET", f"/api/cascades/{cascade_id}")[1]["stages"]

        def command(stage_id: int, name: str) -> None:
            status, out = api.call("POST", f"/api/stages/{stage_id}/{name}", token=WRITE_TOKEN)
            assert status == 200, out

        run_dir = tmp_path / "distributed"
        _use(stack, cfg_path, run_dir, url)
        stack.cascade_id, stack.follow = cascade_id, True
        client = redis.Redis.from_url(REDIS_URL)
        try:
            for i in range(2):
                stack.worker(i)
            learner = stack.start_learner()
            alive = learner.alive
            _wait("a step", lambda: stages()[0]["steps_done"] >= 1, alive=alive)
            command(first, "pause")
            _wait("the pause", lambda: stages()[0]["state"] == "paused", alive=alive)
            requests_before = client.xlen(f"{stack.stream_prefix}:prompts")
            took_before = [stack.procs[f"worker-{i}"].log().count("took") for i in range(2)]
            steps = stages()[0]["steps_done"]
            time.sleep(3.0)  # the learner polls every second: nothing may be asked for meanwhile
            assert all(p.alive() for p in stack.procs.values()), "a pause must keep the stack up"
            assert client.xlen(f"{stack.stream_prefix}:prompts") == requests_before
            assert [stack.procs[f"worker-{i}"].log().count("took") for i in range(2)] == took_before
            assert stages()[0]["steps_done"] == steps

            command(first, "resume")
            _wait("steps after resume", lambda: stages()[0]["steps_done"] >= steps + 2, alive=alive)
            command(first, "advance")
            _wait("stage 2 steps", lambda: stages()[1]["steps_done"] >= 2, alive=alive)
            command(second, "pause")
            _wait("the second pause", lambda: stages()[1]["state"] == "paused", alive=alive)
            status, out = api.call("POST", f"/api/cascades/{cascade_id}/abort", token=WRITE_TOKEN)
            assert status == 200 and out["changed"]
            assert stack.wait(timeout_s=60) == 0, learner.log()[-3000:]
        finally:
            client.close()
            stack.cascade_id = None
            stack.stop_run()
        assert _keys_left(stack.stream_prefix) == []
        _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
        assert detail["status"] == "aborted"
        assert [s["state"] for s in detail["stages"]] == ["completed", "aborted"]
        assert [(r["kind"], r["status"]) for r in detail["runs"]] == [("distributed", "aborted")]
        rows = e2e.rows(url)
    k1 = len(rows.step_metrics(0))
    k2 = len(rows.step_metrics(1))
    assert k1 >= steps + 2 and k2 >= 2

    def stopped_there(data: dict[str, Any]) -> None:
        edit(data)
        data["stages"][0]["advance"]["max_steps"] = k1
        data["stages"][1]["advance"]["max_steps"] = k2

    embedded_dir = tmp_path / "embedded"
    cfg = e2e.config(tmp_path / "embedded-config", stopped_there)
    e2e.run(cfg, run_dir=embedded_dir)
    ref = e2e.rows(e2e.sqlite_url(embedded_dir))
    _same_steps(e2e, rows, ref)
    # the aborted run has no final eval of stage 2; every eval it made is the embedded run's
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals][: len(rows.evals)]


def test_killed_learner_resumes_with_weights_and_teachers_restored(
    stack, e2e, tmp_path, postgres_url
) -> None:
    """SIGKILL of the learner mid-stage 2 (after a teacher was registered), and the teacher
    service restarted empty; the learner alone, `--resume`, with the rollout service and workers
    still up: the steps after the checkpoint are redone once, the rollout service gets the
    checkpoint's weights and the teacher service the teachers back, and every step equals an
    uninterrupted run's."""
    from cascade.transport.health import wait_until_serving
    from cascade.transport.teacher_client import TeacherClient

    def edit(data: dict[str, Any]) -> None:
        _two_stage(data)
        for stage in data["stages"]:
            stage["advance"]["max_steps"] = 4
        data["checkpoint"] = {"every": 4, "keep_last": 2}

    cfg = e2e.config(tmp_path, edit)
    run_dir = tmp_path / "distributed"
    _use(stack, tmp_path / "cascade.yaml", run_dir, postgres_url)
    try:
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        log_file = run_dir / "samples.jsonl"
        _wait("step 6", lambda: log_file.exists() and len(_trained(run_dir)) >= 6, alive=learner.alive)
        learner.signal_group(signal.SIGKILL)
        learner.popen.wait(timeout=10)
        killed_at = len(_trained(run_dir))
        teacher = stack.procs["teacher"]
        teacher.stop()
        teacher.start(stack._env(), stack.nice)
        assert wait_until_serving(teacher.address, timeout_s=60, alive=teacher.alive, poll_s=0.2) is None
        client = TeacherClient(teacher.address)
        assert list(client.list_teachers().teachers) == []  # a fresh teacher service knows no teacher
        client.close()

        stack.fresh, stack.resume = False, True
        resumed = stack.start_learner()
        assert stack.wait(timeout_s=150) == 0, resumed.log()[-3000:]
        log = resumed.log()
    finally:
        stack.resume = False
        stack.stop_run()
    assert "resumed from step-000004" in log, log[-2000:]
    assert killed_at >= 5
    rows = e2e.rows(postgres_url)
    assert rows.run_status == "completed"
    assert [g for _, _, g, _ in rows.steps] == list(range(1, 9))  # contiguous, none twice
    trained = _trained(run_dir)
    assert len(trained) == 8 and len({sid for step in trained for sid in step}) == 8 * 16

    embedded_dir = tmp_path / "embedded"
    e2e.run(cfg, run_dir=embedded_dir)
    ref = e2e.rows(e2e.sqlite_url(embedded_dir))
    _same_steps(e2e, rows, ref)  # the distillation steps after the kill used the restored teacher
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]
    assert rows.eval_metrics == ref.eval_metrics  # sampled eval metrics and intervals too


TRAINED_TINY = Path(__file__).resolve().parents[2] / "models" / "tiny"


def _trained_two_stage(data: dict[str, Any]) -> None:
    """The two-stage cascade on the trained tiny model (the Makefile builds it before the
    tests), math first: RL has signal, so the teacher differs from the student once stage 2 has
    begun. (The trained model earns almost nothing on the if rules, which pay only replies that
    restate the prompt's words: an if stage first would leave its teacher equal to the student,
    and the distillation term at rounding level, which AdamW turns into steps of learning-rate
    size that the two modes take differently.)"""
    data["model"]["path"] = str(TRAINED_TINY)
    first, second = data["stages"]
    first["domain"], second["domain"] = "math", "if"
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    for stage in data["stages"]:
        stage["advance"]["max_steps"] = 3
        stage["eval"] = {"every": 3}


def _assert_close_to(e2e: Any, rows: Any, ref: Any) -> None:
    """The same course as the one-process run: steps, trained samples, rewards and evals
    identical; losses, gradient norms and other floats close. They agree to float rounding, not
    bit for bit: the sharded update sums partial gradients in another order, and right after a
    teacher is registered (teacher = student) the distillation term is itself at rounding level,
    which AdamW's normalisation turns into steps of learning-rate size. The 1e-5 agreement on
    the same batches is tests/integration/test_sharded_learner.py's."""
    skip = set(TIMING) | e2e.DISTRIBUTED_ONLY
    assert [s[:3] for s in rows.steps] == [s[:3] for s in ref.steps]
    for (_, _, g, dist), (_, _, _, emb) in zip(rows.steps, ref.steps, strict=True):
        assert e2e.comparable_keys(dist, skip) == set(emb) - skip, g
        for key in set(emb) - skip:
            a, b = dist[key], emb[key]
            if isinstance(b, float) and key not in ("reward_mean", "kept_sequences", "grpo_n_tokens"):
                assert a == pytest.approx(b, rel=5e-2, abs=1e-3), (g, key, a, b)
            else:
                assert a == b, (g, key, a, b)
    assert [e[:5] for e in rows.evals] == [e[:5] for e in ref.evals]


def test_two_rank_learner_with_two_rollout_replicas_matches_one_process(stack, e2e, tmp_path) -> None:
    """`cascade up --learner-ranks 2 --rollout-replicas 2` on local processes: the learner runs
    under torchrun with the policy sharded over 2 ranks (gloo), pushes every version to both
    replicas, writes sharded checkpoints, and the cascade takes the one-process run's course."""
    if not (TRAINED_TINY / "config.json").exists():
        pytest.skip("models/tiny not built (make test builds it first)")
    reference_dir = tmp_path / "embedded"
    e2e.run(e2e.config(tmp_path / "ref", _trained_two_stage), run_dir=reference_dir)
    reference = e2e.rows(e2e.sqlite_url(reference_dir))
    e2e.config(tmp_path, _trained_two_stage)
    run_dir = tmp_path / "distributed"
    _use(stack, tmp_path / "cascade.yaml", run_dir, None)
    stack.claim_idle_ms = 60_000
    stack.learner_ranks = 2
    extra = stack.rollout_service(1)
    extra.start(stack._env(), stack.nice)
    try:
        wait_serving(extra, 120)
        for i in range(2):
            stack.worker(i)
        learner = stack.start_learner()
        assert stack.wait(timeout_s=240) == 0, learner.log()[-3000:]
    finally:
        stack.learner_ranks = 1
        stack.stop_run()
        stack.procs.pop("rollout-1").stop()
    assert "--nproc-per-node=2" in learner.argv, learner.argv
    rows = e2e.rows(e2e.sqlite_url(run_dir))
    assert rows.run_status == "completed"
    assert all(m["rollout_replicas"] == 2 and m["replicas_out"] == 0 for _, _, _, m in rows.steps)
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert sorted(p.name for p in (last / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert any(m["reward_mean"] > 0 for _, _, _, m in rows.steps)  # RL had something to learn from
    _assert_close_to(e2e, rows, reference)
