"""Benchmark: where an embedded GRPO step spends its time on the tiny model (CPU).

Runs a few steps of the demo's first stage settings and writes the per-phase medians to
`bench/results/embedded_step.json`. Usage: `.venv/bin/python bench/embedded_step.py [MODEL_DIR]`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from cascade.config import ChatConfig, DomainConfig, GrpoConfig
from cascade.domains import load_problems, make_domain
from cascade.model.chat import encode_prompts
from cascade.model.loading import load_policy
from cascade.rollout.policy import PolicyGenerate
from cascade.rollout.requests import PromptRequest, merge_chunks, problem_fields
from cascade.rollout.scoring import generate_and_score
from cascade.runner.optimizer_step import LossTerm, apply_update
from cascade.runner.rl import rl_term

STEPS = 8


def main() -> None:
    model_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "models/tiny")
    policy = load_policy(model_dir)
    optim = torch.optim.AdamW(policy.model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    results: dict[str, dict[str, float]] = {}
    for name in ("math", "code", "if"):
        dcfg = DomainConfig(name=name)
        domain = make_domain(dcfg)
        problems = load_problems(dcfg, "train")
        g = GrpoConfig()
        phases: dict[str, list[float]] = {"rollout_and_score_s": [], "loss_s": [], "update_s": []}
        for step in range(STEPS):
            batch_problems = problems[step * 16 : (step + 1) * 16]
            t0 = time.perf_counter()
            req = PromptRequest(
                batch=step,
                index=0,
                domain=name,
                policy_version=0,
                seed=None,
                group_size=8,
                max_tokens=24,
                temperature=1.0,
                top_p=1.0,
                overlong="mask",
                problems=[problem_fields(p) for p in batch_problems],
                prompt_ids=encode_prompts(
                    policy.tokenizer, ChatConfig(), [p.prompt for p in batch_problems], False
                ),
                sample_ids=[[f"{p.id}/{j}" for j in range(8)] for p in batch_problems],
            )
            chunk = generate_and_score(
                req,
                generate_fn=PolicyGenerate(policy, generator=gen),
                decode=lambda ids: policy.tokenizer.batch_decode(ids, skip_special_tokens=True),
                score=lambda _d, probs, texts, _c, domain=domain: domain.score_batch(probs, texts),
                worker="bench",
            )
            batch = merge_chunks([req], [chunk], policy_version=0, temperature=1.0)
            t1 = time.perf_counter()
            rl: LossTerm = rl_term(
                policy.model,
                batch,
                g,
                pad_id=policy.pad_token_id,
                current_version=0,
                drop_zero_variance=False,
            )
            t2 = time.perf_counter()
            apply_update(policy.model, optim, rl=rl, distill=[], lam=0.0, max_grad_norm=1.0, lr=1e-5)
            t3 = time.perf_counter()
            phases["rollout_and_score_s"].append(t1 - t0)
            phases["loss_s"].append(t2 - t1)
            phases["update_s"].append(t3 - t2)
        med = {k: statistics.median(v) for k, v in phases.items()}
        med["step_s"] = sum(med.values())
        med["sequences_per_step"] = 128
        results[name] = med
        print(name, {k: round(v, 3) for k, v in med.items()})
        close = getattr(domain, "close", None)
        if close:
            close()
    out = Path("bench/results/embedded_step.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"model": str(model_dir), "threads": torch.get_num_threads(), "domains": results}, indent=1
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
