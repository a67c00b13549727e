"""What a run needs on this host, built or checked: `cascade model init` (the tiny models, from
nothing) and `cascade sandbox check`."""

from __future__ import annotations

import argparse
from pathlib import Path

from cascade.cli.common import quiet_hub_progress


def cmd_model_init(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if (out / "config.json").exists() and not args.force:
        print(f"{out} already holds a model (use --force to rebuild)")
        return 0
    quiet_hub_progress()
    import dataclasses

    from cascade.bootstrap.policy import REWARD_MODEL_SUBDIR, SPECS, build_tiny_model

    spec = dataclasses.replace(SPECS[args.spec], seed=args.seed)
    if args.max_steps is not None:
        cap = args.max_steps
        spec = dataclasses.replace(spec, max_steps=cap, min_steps=min(cap, spec.min_steps))
    reward_model = None
    if "rlhf" in spec.domains:
        from cascade.bootstrap.reward_model import build_tiny_reward_model

        reward_model = out / REWARD_MODEL_SUBDIR
        if args.force or not (reward_model / "config.json").exists():
            build_tiny_reward_model(reward_model, seed=args.seed)
    result = build_tiny_model(out, spec, reward_model=reward_model)
    print(
        f"saved {out} after {result.steps} SFT steps ({result.stopped_by}): "
        + ", ".join(f"{k} {v:.0%}" for k, v in result.final_scores.items())
    )
    return 0


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from cascade.sandbox import preflight
    from cascade.sandbox.pool import BwrapSettings

    checks = preflight.check(BwrapSettings(uid=args.uid))
    print(preflight.format_report(checks))
    if all(c.ok for c in checks if c.required):
        return 0
    print(preflight.KUBERNETES_NEEDS)
    return 1
