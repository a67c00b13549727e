"""A seeds study of distillation (`bench/ablation_seeds.py`, `make ablation-seeds`): per domain,
the paired difference of final-minus-best with and without distillation over seeds, and each
stage's gain on its own domain, each with a t interval over seeds (`cascade.eval.stats`)."""

from __future__ import annotations

from statistics import mean
from typing import Any

from cascade.eval.stats import t_interval
from cascade.store.history import RegressionTable


def paired_effects(tables: dict[int, dict[str, RegressionTable]]) -> dict[str, dict[str, Any]]:
    """Per domain: each seed's final-minus-best with and without distillation, their paired
    differences (with minus without), and the differences' mean with its t interval."""
    out: dict[str, dict[str, Any]] = {}
    for domain in [r.domain for r in next(iter(tables.values()))["distill"].rows]:
        per_seed = {}
        for seed, pair in sorted(tables.items()):
            with_, without = (pair[k].row(domain).final_minus_best for k in ("distill", "no_distill"))
            if with_ is not None and without is not None:
                per_seed[seed] = {"distill": with_, "no_distill": without, "difference": with_ - without}
        diffs = [v["difference"] for v in per_seed.values()]
        ci = t_interval(diffs)
        out[domain] = {
            "per_seed": per_seed,
            "mean_difference": mean(diffs) if diffs else None,
            "interval": None if ci is None else [ci[1], ci[2]],
            "outside_noise": None if ci is None else (ci[1] > 0 or ci[2] < 0),
        }
    return out


def own_stage_gains(
    tables: dict[int, RegressionTable], stage_domains: list[str]
) -> dict[str, dict[str, Any]]:
    """Per stage: its domain's score after the stage minus before it, each seed, with a t interval."""
    out: dict[str, dict[str, Any]] = {}
    for i, domain in enumerate(stage_domains):
        gains = {}
        for seed, table in sorted(tables.items()):
            row = table.row(domain)
            before = row.start if i == 0 else row.after[i - 1]
            after = row.after[i]
            if before is not None and after is not None:
                gains[seed] = after - before
        ci = t_interval(list(gains.values()))
        label = next(iter(tables.values())).stage_labels[i]
        out[label] = {
            "domain": domain,
            "per_seed": gains,
            "interval": None if ci is None else [ci[1], ci[2]],
            "outside_noise": None if ci is None else ci[1] > 0,
        }
    return out
