"""A cascade with a run's worth of rows, written through `cascade.store.repo` (as a runner would).

math -> code -> if, 60 steps per stage, evals of every domain every 10 steps with curves shaped
like the README's demo (each stage lifts its own domain; earlier ones dip a little), verdict
reasons per step, resume and teacher checkpoints. The last stage is left running at step 40.
"""

from __future__ import annotations

import math

from cascade.eval.stats import wilson_interval
from cascade.store import repo
from cascade.store.db import make_engine, prepare_schema, session_scope

DOMAINS = ("math", "code", "if")
STEPS = 60
EVAL_EVERY = 10
START = {"math": 0.16, "code": 0.21, "if": 0.56}
GAIN = {"math": 0.22, "code": 0.2, "if": 0.22}
REASONS = {"math": ("wrong_answer", "no_answer_found"), "code": ("wrong_answer", "timeout", "runtime_error"),
           "if": ("rule_failed", "no_answer_found")}  # fmt: skip


def config(name: str = "demo") -> dict:
    return {
        "name": name,
        "model": {"path": "models/tiny"},
        "domains": [{"name": d} for d in DOMAINS],
        "stages": [
            {"domain": d, "advance": {"max_steps": STEPS}, "eval": {"every": EVAL_EVERY}} for d in DOMAINS
        ],
    }


def score(domain: str, stage: int, step: int) -> float:
    """The curve: the trained domain rises, an already-trained one drifts down a little."""
    own = DOMAINS.index(domain)
    value = START[domain]
    for s in range(stage + 1):
        done = STEPS if s < stage else step
        if s == own:
            value += GAIN[domain] * (1 - math.exp(-done / 20))
        elif s > own:
            value -= 0.03 * done / STEPS
    return round(max(0.0, min(1.0, value + 0.01 * math.sin(step + 3 * own))), 4)


def seed(db_url: str, *, running_steps: int = 40, name: str = "demo") -> int:
    """Write the rows; returns the cascade id."""
    engine = make_engine(db_url)
    prepare_schema(engine)
    try:
        with session_scope(engine) as s:
            cascade = repo.create_cascade(s, name=name, config=config(name))
            stages = repo.create_stages(s, cascade_id=cascade.id, stages=[(d, d) for d in DOMAINS])
            run = repo.start_run(s, cascade_id=cascade.id, seed=0, distill=True, output_dir=f"runs/{name}")
            repo.set_cascade_status(s, cascade_id=cascade.id, status="running", actor="runner")
            g = 0
            for i, stage in enumerate(stages):
                repo.transition_stage(s, stage_id=stage.id, to_state="running", actor="runner")
                last = STEPS if i < len(stages) - 1 else running_steps
                best: dict[str, float] = {}
                for step in range(0, last + 1):
                    if step > 0:
                        g += 1
                        ok = round(16 * score(stage.domain, i, step))
                        bad = REASONS[stage.domain]
                        reasons = {"ok": ok, bad[0]: 16 - ok - 2, bad[-1]: 2}
                        repo.record_step(
                            s, run_id=run.id, stage_id=stage.id, step=step, global_step=g,
                            metrics={"reward_mean": ok / 16, "loss_rl": 0.1, "reasons": reasons},
                        )  # fmt: skip
                    if step % EVAL_EVERY or (step == 0 and i > 0):
                        continue
                    for d in DOMAINS:
                        value = score(d, i, step)
                        n = 256
                        right = round(n * value)
                        low, high = wilson_interval(right, n)
                        greedy = {"value": value, "low": low, "high": high, "n": n, "method": "wilson"}
                        repo.record_eval(
                            s, run_id=run.id, stage_id=stage.id, step=step, global_step=g, domain=d,
                            score=value, n=n, reasons={"ok": right, REASONS[d][0]: n - right},
                            metrics={"greedy": greedy},
                        )  # fmt: skip
                        if d == stage.domain and step > 0 and value > best.get(d, -1.0):
                            best[d] = value
                            ck = repo.record_checkpoint(
                                s, run_id=run.id, stage_id=stage.id, step=step, global_step=g,
                                path=f"runs/{name}/teachers/{d}-{g}", kind="teacher", domain=d, score=value,
                            )  # fmt: skip
                            repo.mark_teacher(s, run_id=run.id, domain=d, checkpoint_id=ck.id)
                    repo.record_checkpoint(
                        s, run_id=run.id, stage_id=stage.id, step=step, global_step=g,
                        path=f"runs/{name}/checkpoints/step-{g:06d}", kind="resume",
                    )  # fmt: skip
                if i < len(stages) - 1:
                    repo.transition_stage(s, stage_id=stage.id, to_state="completed", actor="runner")
            return cascade.id
    finally:
        engine.dispose()
