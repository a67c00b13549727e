"""Nemotron-Cascade 2's recipe as `examples/cascade2.yaml` writes it (IF-RL -> multi-domain RL ->
MOPD -> RLHF -> long-context RL -> code RL -> SWE RL), shortened to 2 steps a stage on the random
`full` model: every stage runs with its kind and domains, the multi-domain stage reports each
domain, the MOPD stage distils each domain from its own best checkpoint with no outcome term,
and `cascade up`'s services (rollout, reward with a Celery worker, teacher, rollout workers over
Redis, the learner on Postgres) make the same run, step for step."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from stack_probe import REDIS_URL, redis_up

from cascade.up.stack import LocalStack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cascade2.yaml"
STAGE_STEPS = 2
BUDGETS = {"rlhf": 12, "if": 8, "math": 8, "code": 8, "swe": 16}


def _shortened(models: tuple[Path, Path], output_dir: Path) -> dict[str, Any]:
    """The example's stages (names, kinds, domains, shares) with tiny sizes and the test's models."""
    policy, rm = models
    data = yaml.safe_load(EXAMPLE.read_text())
    data["model"]["path"] = str(policy)
    data["output_dir"] = str(output_dir)
    data["rollout"] = {"seeding": "per_request", "prompts_per_request": 2}
    for d in data["domains"]:
        d["prompts"] = {"kind": "synthetic", "seed": 0, "n_train": 32, "n_eval": 4}
        if d["name"] == "rlhf":
            d["reward"]["model_path"] = str(rm)
    for stage in data["stages"]:
        domains = list(stage.get("domains") or [stage["domain"]])
        grown = 2 if stage["name"] == "long-context-rl" else 1  # the stage that only raises the budget
        stage["grpo"].update(
            group_size=2,
            prompts_per_step=len(domains) if stage.get("kind") == "mopd" else 2,
            budget={"max_new_tokens": grown * max(BUDGETS[d] for d in domains)},
        )
        stage["filter"] = {"prompt_filter": False}
        stage["distill"] = {**stage.get("distill", {}), "prompts_per_teacher": 2}
        stage["advance"] = {"max_steps": STAGE_STEPS}
        stage["eval"] = {"every": STAGE_STEPS, "max_new_tokens": 16}
    return data


@pytest.fixture(scope="module")
def embedded(e2e: Any, full_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("cascade2")
    cfg = e2e.config(root, lambda data: data.update(_shortened(full_models, root / "runs")))
    logged = e2e.run(cfg, run_dir=root / "embedded")
    assert logged.result.stopped_by == "completed", logged.lines[-20:]
    return e2e.rows(e2e.sqlite_url(root / "embedded"))


def test_every_stage_runs_as_its_kind(embedded: Any) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    names = [s["name"] for s in example["stages"]]
    assert [(label, state) for _, label, _, state in embedded.stages] == [(n, "completed") for n in names]
    labels = {label: domain for _, label, domain, _ in embedded.stages}
    assert labels["multi-domain-rl"] == "math+code" and labels["mopd"] == "if+math+code"
    assert [s for s, _, _, _ in embedded.steps] == [i for i in range(len(names)) for _ in range(STAGE_STEPS)]

    multi = embedded.step_metrics(names.index("multi-domain-rl"))
    for m in multi:  # one group per domain each step (2 prompts, shares 1:1), each domain's reward
        assert m["groups/math"] == 1 and m["groups/code"] == 1
        assert {"reward_mean/math", "reward_mean/code", "zero_variance_groups/code"} <= set(m)
        assert not any(k.startswith("distill_") and "_if_" not in k for k in m)  # if: the earlier domain

    for m in embedded.step_metrics(names.index("mopd")):
        assert "reward_mean" not in m and "grpo_n_tokens" not in m  # no outcome term, no RL batch
        for d in ("if", "math", "code"):  # each domain's samples went to its own teacher
            assert m[f"distill_{d}_n_tokens"] > 0, (d, m)
            assert 0.0 <= m[f"distill_{d}_overlap"] <= 1.0
            assert 0.0 <= m[f"distill_{d}_kept_fraction"] <= 1.0
        # the update is the distillation term alone (on the random model every teacher is still
        # the student's own weights: rewards are all 0, so no earlier stage moved it)
        assert "grad_norm_distill" in m and "grad_norm_rl" not in m or m["grad_norm_rl"] == 0.0


def test_domains_whose_best_checkpoint_is_one_step_share_one_directory(embedded: Any) -> None:
    """math and code first get a teacher at the multi-domain stage's end eval, from one step's
    weights: one directory, registered for both."""
    teachers = {d: (g, path) for d, g, path in embedded.teachers}
    candidates = [(d, g) for d, g in embedded.teacher_candidates]
    first = {d: min(g for dd, g in candidates if dd == d) for d in ("math", "code")}
    assert first["math"] == first["code"] == 2 * STAGE_STEPS
    same_step = [d for d in ("math", "code") if teachers[d][0] == first[d]]
    if len(same_step) == 2:  # neither improved later (the random model rarely does)
        assert teachers["math"][1] == teachers["code"][1]


@pytest.fixture
def stack(full_models: tuple[Path, Path], tmp_path: Path, postgres_url: str) -> Iterator[LocalStack]:
    if not redis_up():
        pytest.skip(f"Redis unreachable at {REDIS_URL}")
    s = LocalStack(
        config=tmp_path / "cascade.yaml",
        model=full_models[0],
        run_dir=tmp_path / "distributed",
        log_dir=tmp_path / "logs",
        redis_url=REDIS_URL,
        celery_workers=1,  # code, rlhf and swe are scored by the reward service's Celery workers
        db=postgres_url,
    )
    s.stream_prefix = f"cascade:test:{uuid.uuid4().hex[:8]}"
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.postgres
def test_distributed_run_equals_the_embedded_one_step_for_step(
    e2e: Any,
    full_models: tuple[Path, Path],
    stack: LocalStack,
    tmp_path: Path,
    postgres_url: str,
    embedded: Any,
) -> None:
    e2e.config(tmp_path, lambda data: data.update(_shortened(full_models, tmp_path / "runs")))
    stack.start_services(timeout_s=120)
    stack.worker(0)
    stack.start_learner()
    assert stack.wait(timeout_s=600) == 0, stack.procs["learner"].log()[-3000:]
    rows = e2e.rows(postgres_url)
    assert rows.run_status == "completed"
    e2e.assert_equal_runs(rows, embedded)
