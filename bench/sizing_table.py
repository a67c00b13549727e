"""What fits where: the learner's step memory (`cascade.runner.step_memory.estimate_step`) for
Qwen3-0.6B, -8B and -14B shapes on a 24 GB, an 80 GB and a 141 GB GPU, at the Nemotron-Cascade
RL recipe's batch (128 prompts x group 8), 8K and 32K-token completions, with and without
activation checkpointing. Computed, not measured: no GPU is needed (docs/sizing.md explains it).

Each cell is the step's estimated peak on one GPU at `learner.micro_batch_tokens: 16384`; when
that fits, the largest `micro_batch_tokens` that still fits there; when it does not, the fewest
GPUs of that size a sharded learner (FSDP2, `cascade run --nproc N`) fits on, and the per-GPU
peak of its busiest rank (rank 0, which also holds the full bfloat16 policy that generates).

Usage: `.venv/bin/python bench/sizing_table.py` writes `bench/results/sizing_table.json` and
`bench/results/sizing_table.md`; `--check` only says whether they are current (exit 1 if not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cascade.engine.microbatch import MicroBatching
from cascade.runner.step_memory import GIB, PROMPT_TOKENS, ModelShape, StepEstimate, estimate_step

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "sizing_table"

MODELS: dict[str, dict[str, Any]] = {
    # the fields of each model's config.json that the estimate reads
    "Qwen3-0.6B": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
    "Qwen3-14B": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "intermediate_size": 17408,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
}
GPUS = {"24 GB": 23.6, "80 GB": 79.1, "141 GB": 139.7}
"""GiB a learner can count on: about what torch reports as an RTX 4090's, an H100 80GB's and an
H200's total memory."""
PROMPTS, GROUP = 128, 8
COMPLETIONS = (8192, 32768)
MICRO_BATCH_TOKENS = 16384
MAX_RANKS = 64


def _estimate(
    shape: ModelShape, completion: int, checkpointing: bool, tokens: int, ranks: int
) -> StepEstimate:
    """An RL step (no KL reference, no distillation) of this rank's share of the groups, in
    bfloat16 autocast (CUDA, `precision: auto`), bfloat16 checkpoint."""
    return estimate_step(
        shape,
        sequences=GROUP * -(-PROMPTS // ranks),
        prompt_tokens=PROMPT_TOKENS,
        completion_tokens=completion,
        batching=MicroBatching(tokens=tokens, activation_checkpointing=checkpointing),
        compute_dtype_bytes=2,
        ranks=ranks,
        checkpoint_dtype_bytes=2,
    )


def _cell(shape: ModelShape, completion: int, checkpointing: bool, gib: float) -> dict[str, Any]:
    limit = gib * GIB
    one = _estimate(shape, completion, checkpointing, MICRO_BATCH_TOKENS, 1)
    cell: dict[str, Any] = {"gpu_gib": gib, "one_gpu_gib": round(one.total / GIB, 1)}
    if one.total <= limit:
        width = one.width
        lo, hi = 1, PROMPTS * GROUP  # the most rows a micro-batch can have and fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _estimate(shape, completion, checkpointing, mid * width, 1).total <= limit:
                lo = mid
            else:
                hi = mid - 1
        rows = lo
        cell.update(fits=True, max_micro_batch_tokens=rows * width, max_rows=rows)
        return cell
    for ranks in range(2, MAX_RANKS + 1):
        est = _estimate(shape, completion, checkpointing, MICRO_BATCH_TOKENS, ranks)
        if est.total <= limit:
            cell.update(fits=False, ranks=ranks, per_gpu_gib=round(est.total / GIB, 1))
            return cell
    cell.update(fits=False, ranks=None)
    return cell


def table() -> dict[str, Any]:
    rows = []
    for name, config in MODELS.items():
        shape = ModelShape.from_config(config)
        for completion in COMPLETIONS:
            for checkpointing in (False, True):
                one = _estimate(shape, completion, checkpointing, MICRO_BATCH_TOKENS, 1)
                rows.append(
                    {
                        "model": name,
                        "params": shape.params(),
                        "completion_tokens": completion,
                        "activation_checkpointing": checkpointing,
                        "one_gpu_parts_gib": {k: round(v / GIB, 2) for k, v in one.parts().items()},
                        "gpus": {
                            gpu: _cell(shape, completion, checkpointing, gib) for gpu, gib in GPUS.items()
                        },
                    }
                )
    return {
        "settings": {
            "prompts_per_step": PROMPTS,
            "group_size": GROUP,
            "prompt_tokens": PROMPT_TOKENS,
            "micro_batch_tokens": MICRO_BATCH_TOKENS,
            "logits_chunk_mib": MicroBatching().logits_chunk_bytes / 2**20,
            "precision": "auto on CUDA: bfloat16 autocast, float32 master weights and AdamW",
            "checkpoint_dtype": "bfloat16",
            "kl_coef": 0,
            "distillation": "none (an RL stage)",
            "gpu_gib": GPUS,
        },
        "state_gib": {
            name: round(16 * ModelShape.from_config(c).params() / GIB, 1) for name, c in MODELS.items()
        },
        "rows": rows,
    }


def _say(cell: dict[str, Any]) -> str:
    if cell["fits"]:
        return f"fits: {cell['one_gpu_gib']:.1f} GiB; up to {cell['max_micro_batch_tokens']:,} tokens"
    if cell["ranks"] is None:
        return f"no ({cell['one_gpu_gib']:.1f} GiB), not on {MAX_RANKS} either"
    return f"no ({cell['one_gpu_gib']:.1f} GiB): {cell['ranks']} GPUs, {cell['per_gpu_gib']:.1f} GiB each"


def markdown(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        "# Sizing a run: what fits where (computed)",
        "",
        f"An RL step of {s['prompts_per_step']} prompts x group {s['group_size']}, "
        f"{s['prompt_tokens']}-token prompts, bfloat16 autocast over float32 master weights and "
        f"AdamW, a bfloat16 checkpoint, no KL reference, no distillation, "
        f"logits chunks of {s['logits_chunk_mib']:g} MiB. Each cell: the estimated peak on one GPU "
        f"at `micro_batch_tokens: {s['micro_batch_tokens']}`; if it fits, the largest "
        "`micro_batch_tokens` that does; if not, the fewest GPUs a sharded learner fits on and "
        "its busiest rank's peak. From `bench/sizing_table.py` (`cascade.runner.step_memory`).",
        "",
        "| model | completion | checkpointing | "
        + " | ".join(f"{g} ({v} GiB)" for g, v in s["gpu_gib"].items())
        + " |",
        "|---|---|---|" + "---|" * len(s["gpu_gib"]),
    ]
    for row in data["rows"]:
        cells = " | ".join(_say(c) for c in row["gpus"].values())
        ckpt = "on" if row["activation_checkpointing"] else "off"
        lines.append(f"| {row['model']} | {row['completion_tokens'] // 1024}K | {ckpt} | {cells} |")
    lines += [
        "",
        "Float32 weights, gradients and AdamW moments alone (16 bytes a parameter): "
        + ", ".join(f"{name} {gib:,.1f} GiB" for name, gib in data["state_gib"].items())
        + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the results files are not current")
    args = p.parse_args(argv)
    data = table()
    text_json = json.dumps(data, indent=1) + "\n"
    text_md = markdown(data)
    json_path, md_path = OUT.with_suffix(".json"), OUT.with_suffix(".md")
    if args.check:
        current = json_path.exists() and json_path.read_text() == text_json
        current = current and md_path.exists() and md_path.read_text() == text_md
        print("current" if current else f"stale: run {Path(__file__).relative_to(ROOT)}")
        return 0 if current else 1
    json_path.write_text(text_json)
    md_path.write_text(text_md)
    print(text_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
