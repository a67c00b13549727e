"""Benchmark: the learner's peak memory for one update against the step's size, the micro-batch
bound (`learner.micro_batch_tokens`) and activation checkpointing, with the step-memory estimate
beside every measurement and TRL's GRPOTrainer on the same batches.

Usage: `.venv/bin/python bench/learner_memory.py [--quick] [--allocator-neutral] [--threads 1]
[--only ID,ID] [--merge]`; writes `bench/results/learner_memory.{json,md}` (`--quick`: small steps,
about 10 minutes here, its own files `learner_memory_quick.*` unless `--out` says otherwise). The
full set takes about 47 minutes on this machine's shared cores (load average ~3), 70 with
`--allocator-neutral` (three runs again with `MALLOC_MMAP_THRESHOLD_`, see `MMAP_THRESHOLD`).
`--list` prints the configurations and their ids; `--only` runs some, `--merge` keeps the JSON's
other runs; `--render` recomputes the estimates and the tables from the JSON without running.

The models: random Qwen3s built here with `transformers`' `Qwen3Config`/`Qwen3ForCausalLM` (no
download), float32, tied embeddings as Qwen3-0.6B: `narrow` (hidden 256, 4 layers, intermediate
768, 4 heads of 64, 2 KV heads) with the real Qwen3 vocabulary of 151,936 tokens, so the logits
weigh what a real model's do while the layers stay cheap; `qwen3-0.6b` (hidden 1024, 28 layers,
intermediate 3072, 16 heads of 128, 8 KV heads, vocabulary 151,936), the real shape.

The batches: prefabricated rollouts, no generation. A step of N prompts x group 8: prompt lengths
uniform in 100..300 tokens, each group's prompt shared by its 8 rows; completion lengths
`round(exp(N(log(max / 5), 0.9)))` clamped to 16..max (median max/5, mean ~0.3 max, ~4% at the
max: a long tail); random token ids; random 0/1 rewards with every group's variance nonzero
(one reward flipped where a group came out all equal), group-normalised advantages
(`cascade.algo.group_advantages`); an `RlPlan` built directly, on-policy (`old_logprobs=None`),
every row in the loss. The same seed gives the same rows to every configuration and every side.

Each configuration runs in a FRESH SUBPROCESS (its own allocator and peak RSS): build the model,
an AdamW optimizer as `cascade/runner/training.py` makes it (weight decay 0), a warm-up update on
a tiny batch (2 rows of 8 + 8 tokens, the same settings) so AdamW's moments exist before the
measured update (they are counted in `rss_before`, not in the update's delta), a float32 matmul
peak measurement, then `gc.collect()` + `malloc_trim(0)`, `rss_before` (VmRSS), the peak-RSS
counter reset (`/proc/self/clear_refs` = 5, which resets VmHWM and so `ru_maxrss`), and ONE
measured update: `run_update(model, optimizer, UpdateRequest(..., batching=MicroBatching(...)),
distill=lambda: [], accel=cpu float32, frozen=...)`. Reported: `update_peak_mb` = `ru_maxrss`
after the update - `rss_before` (what the update adds over weights + AdamW state), `peak_mb` =
`ru_maxrss` - the RSS measured after imports and before the model existed (the learner's whole
footprint: weights, gradients, AdamW moments, activations, logits; the estimate's scope), step
wall and process CPU time. The parent watches each worker's RSS and kills it past `--cap-gib`
(or when the machine's available memory falls under 1 GiB): such a run is reported as not fitting.

`cascade_before`: the same worker on the learner as committed at `--before-ref` (exported with
`git archive` to a temp dir and put first on `PYTHONPATH`): the whole step in one forward with
its full [rows, completion, vocabulary] logits, no micro-batches, no checkpointing.

TRL: `trl.GRPOTrainer` (1.16) on the same model weights and rows: its generation replaced by the
prefabricated batch (`_generate_and_score_completions` returns the step's prompt/completion ids,
masks, the same advantages and `num_items_in_batch`); everything after it is TRL's: its shuffle
and split of the generation batch into `per_device_train_batch_size` micro-batches, gradient
accumulation over `gradient_accumulation_steps` of them, `gradient_checkpointing`, its fused
chunked LM head (`add_fused_lm_head`; on a CPU it scores every position of the padded rows),
`loss_type="dapo"`, beta 0, clipping at 1, the AdamW step; `max_steps=2`, the first step on a
tiny batch (the warm-up), the second measured between `on_step_begin` and `on_step_end` as above.
TRL pads every row of a step to the step's longest prompt + longest completion, so its micro-batch
holds `per_device_train_batch_size x (P_max + C_max)` padded tokens; the Cascade run it is paired
with gets exactly that as `micro_batch_tokens`.

Model FLOPs (as `bench/vs_trl.py`): `6 x N_body x T_forward + 6 x (d x V) x T_completion` per
update, N_body the parameters outside the tied embedding/head, T_forward the real tokens the
layers run on (Cascade: each group's prompt once per micro-batch it appears in plus every
completion; TRL: every row's prompt and completion), d x V the output head, T_completion the
completion tokens. Checkpointing's recomputed forward (`2 x N_body x T_forward`) and the
recomputed logits chunks (`2 x d x V x T_completion`) are hardware work, not model FLOPs: `hfu`
counts them. MFU = model FLOPs / (step wall time x peak), the peak being the best float32
`torch.mm` of 2048 x 2048 (2 n^3 FLOPs, best of 4) timed in the same worker process at the same
thread count just before the update.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PREFIX = "@@learner_memory "
GROUP = 8
LR = 1e-6
SEED = 0
MIB = 2**20
GIB = 2**30
BEFORE_REF = "76c9a91"
"""The last commit with the learner before micro-batching (issue 32): config fields only."""

SHAPES: dict[str, dict[str, Any]] = {
    "narrow": {
        "hidden": 256,
        "layers": 4,
        "intermediate": 768,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 64,
        "vocab": 151936,
    },
    "qwen3-0.6b": {
        "hidden": 1024,
        "layers": 28,
        "intermediate": 3072,
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 128,
        "vocab": 151936,
    },
    "tiny": {  # the GPU script's --tiny and the tests: cheap everywhere
        "hidden": 64,
        "layers": 2,
        "intermediate": 192,
        "heads": 2,
        "kv_heads": 1,
        "head_dim": 32,
        "vocab": 4096,
    },
}
PAD_ID = {"narrow": 151643, "qwen3-0.6b": 151643, "tiny": 0}
"""Qwen3's `<|endoftext|>` (its pad token) where the vocabulary is Qwen3's."""


# --------------------------------------------------------------------------- shared helpers


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset VmHWM (and so `ru_maxrss`) to the current RSS: Linux >= 4.0, clear_refs value 5."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def model_config(shape: str, max_positions: int = 40960) -> Any:
    from transformers import Qwen3Config

    s = SHAPES[shape]
    return Qwen3Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        max_position_embeddings=max_positions,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID[shape],
        eos_token_id=PAD_ID[shape],
        bos_token_id=PAD_ID[shape],
    )


def build_model(shape: str, *, seed: int = SEED, device: str = "cpu") -> Any:
    """A random-weight Qwen3 of `shape` in float32, in train mode (same seed, same weights)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(model_config(shape))
    return model.to(device=device, dtype=torch.float32).train()


def model_dims(model: Any) -> dict[str, Any]:
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == emb.data_ptr()
    total = sum(p.numel() for p in model.parameters())
    return {
        "params_total": total,
        "params_body": total - emb.numel() - (0 if tied else head.numel()),
        "head_d_x_v": head.numel(),
        "tied": tied,
    }


def completion_lengths(n: int, max_tokens: int, gen: Any) -> list[int]:
    import torch

    z = torch.randn(n, generator=gen)
    raw = torch.exp(math.log(max_tokens / 5) + 0.9 * z).round()
    return [int(x) for x in raw.clamp(16, max_tokens)]


def make_rollouts(prompts: int, group: int, max_tokens: int, vocab: int, seed: int = SEED) -> dict[str, Any]:
    """The step's rows: group-contiguous, each group's prompt shared; rewards with variance."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    top = min(vocab, 151643) - 1
    prompt_lens = torch.randint(100, 301, (prompts,), generator=gen).tolist()
    group_prompts = [torch.randint(1, top, (int(n),), generator=gen).tolist() for n in prompt_lens]
    lens = completion_lengths(prompts * group, max_tokens, gen)
    completions = [torch.randint(1, top, (n,), generator=gen).tolist() for n in lens]
    rewards = torch.bernoulli(torch.full((prompts, group), 0.5), generator=gen)
    for g in range(prompts):
        if bool((rewards[g] == rewards[g, 0]).all()):
            rewards[g, 0] = 1.0 - rewards[g, 0]
    return {
        "prompt_ids": [group_prompts[i // group] for i in range(prompts * group)],
        "completion_ids": completions,
        "rewards": rewards,
        "group": group,
    }


def make_plan(rollouts: dict[str, Any]) -> Any:
    from cascade.algo import group_advantages
    from cascade.runner.rl import RlPlan

    group = rollouts["group"]
    adv = group_advantages(rollouts["rewards"]).flatten().tolist()
    rows = len(rollouts["completion_ids"])
    return RlPlan(
        metrics={},
        prompt_ids=rollouts["prompt_ids"],
        completion_ids=rollouts["completion_ids"],
        group_ids=[i // group for i in range(rows)],
        advantages=adv,
        old_logprobs=None,
        temperature=1.0,
        global_rows=rows,
    )


def step_counts(rollouts: dict[str, Any], mbt: int | None) -> dict[str, Any]:
    """Tokens of the step and of its micro-batches as `cascade.engine.microbatch` cuts it."""
    from cascade.engine.microbatch import MicroBatching, micro_batch_spans, padded_tokens

    p = [len(x) for x in rollouts["prompt_ids"]]
    c = [len(x) for x in rollouts["completion_ids"]]
    spans = micro_batch_spans(p, c, MicroBatching(tokens=mbt))
    real, padded = padded_tokens(p, c, spans)
    group = rollouts["group"]
    # each group's prompt once per micro-batch it appears in (the shared-prompt forward)
    prompt_once = sum(p[g * group] for lo, hi in spans for g in range(lo // group, (hi - 1) // group + 1))
    widths = [(hi - lo) * (max(p[lo:hi]) + max(1, max(c[lo:hi]))) for lo, hi in spans]
    return {
        "rows": len(c),
        "prompt_tokens_every_row": sum(p),
        "prompt_tokens_shared": prompt_once,
        "completion_tokens": sum(c),
        "longest_completion": max(c),
        "longest_prompt": max(p),
        "real_tokens": real,
        "padded_tokens": padded,
        "micro_batches": len(spans),
        "largest_micro_batch_padded_tokens": max(widths),
        "rows_per_micro_batch": [hi - lo for lo, hi in spans],
    }


def matmul_peak(n: int = 2048, repeats: int = 4) -> tuple[float, float]:
    """This process's float32 `torch.mm` rate at its thread count: (FLOP/s over wall time, FLOP/s
    over process CPU time), each the best of `repeats` (2 n^3 FLOPs each). On a loaded machine
    the wall figure drops with the share of the cores this process gets; the CPU-time one less
    (with 1 thread it is the core's own rate)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    wall = cpu = float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=out)
        wall = min(wall, time.perf_counter() - t)
        cpu = min(cpu, time.process_time() - c)
    return 2 * n**3 / wall, 2 * n**3 / max(cpu, 1e-9)


def estimate_bytes(
    shape: str,
    rows: int,
    prompt_tokens: int,
    completion_tokens: int,
    mbt: int | None,
    ckpt: bool,
    compute_dtype_bytes: int = 4,
) -> dict[str, Any] | None:
    """`cascade.runner.step_memory.estimate_step` for a step of `rows` sequences, each taken at
    `prompt_tokens` + `completion_tokens` (the step's longest prompt and completion), cut by
    `MicroBatching(tokens=mbt, activation_checkpointing=ckpt)`: its parts and `total` in bytes.
    None where the module has no `estimate_step` (the learner before micro-batching)."""
    try:
        from cascade.engine.microbatch import MicroBatching
        from cascade.runner import step_memory
    except ImportError:
        return None
    fn: Callable[..., Any] | None = getattr(step_memory, "estimate_step", None)
    if fn is None:
        return None
    try:
        est = fn(
            step_memory.ModelShape.from_config(model_config(shape).to_dict()),
            sequences=rows,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            batching=MicroBatching(tokens=mbt, activation_checkpointing=ckpt),
            compute_dtype_bytes=compute_dtype_bytes,
        )
    except TypeError as e:  # the signature changed under us: say so in the results
        return {"error": f"estimate_step: {e}"}
    return {
        **est.parts(),
        "rows_per_micro_batch": est.rows,
        "width": est.width,
        "micro_batches": est.micro_batches,
    }


# --------------------------------------------------------------------------- worker side


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _flops(dims: dict[str, Any], forward_tokens: int, completion_tokens: int, ckpt: bool) -> dict[str, float]:
    model = 6 * dims["params_body"] * forward_tokens + 6 * dims["head_d_x_v"] * completion_tokens
    extra = 2 * dims["params_body"] * forward_tokens + 2 * dims["head_d_x_v"] * completion_tokens
    return {"model_flops": float(model), "hardware_flops": float(model + (extra if ckpt else 0))}


def cascade_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    import torch

    import cascade
    from cascade.accel import resolve_learner
    from cascade.config import GrpoConfig, LearnerConfig, StageConfig, TokenBudget
    from cascade.runner.frozen_models import FrozenModelCache
    from cascade.runner.update import UpdateRequest, run_update

    rss_runtime = rss_bytes()
    shape, mbt, ckpt = spec["shape"], spec["mbt"], spec["ckpt"]
    model = build_model(shape)
    dims = model_dims(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    accel = resolve_learner(LearnerConfig(device="cpu", precision="float32"), "float32")
    frozen = FrozenModelCache("float32", "cpu")
    rollouts = make_rollouts(spec["prompts"], GROUP, spec["max_tokens"], SHAPES[shape]["vocab"])
    plan = make_plan(rollouts)
    warm = make_plan(
        {
            "prompt_ids": [[5] * 8] * 2,
            "completion_ids": [[7] * 8, [9] * 8],
            "rewards": torch.tensor([[0.0, 1.0]]),
            "group": 2,
        }
    )
    stage = StageConfig(
        domain="math",
        grpo=GrpoConfig(
            group_size=GROUP,
            prompts_per_step=spec["prompts"],
            learning_rate=LR,
            budget=TokenBudget(max_new_tokens=spec["max_tokens"]),
        ),
    )
    has_batching = any(f.name == "batching" for f in dataclasses.fields(UpdateRequest))
    extra: dict[str, Any] = {}
    if has_batching:
        from cascade.engine.microbatch import MicroBatching

        extra["batching"] = MicroBatching(tokens=mbt, activation_checkpointing=ckpt)
    elif mbt is not None or ckpt:
        raise SystemExit("this learner has no UpdateRequest.batching: run it with mbt None, ckpt off")

    def request(p: Any) -> Any:
        return UpdateRequest(
            rl=p, stage=stage, stage_step=0, lr=LR, pad_id=PAD_ID[shape], reference=None, **extra
        )

    run_update(model, optimizer, request(warm), lambda: [], accel=accel, frozen=frozen)
    adam_state = sum(
        t.numel() * t.element_size()
        for st in optimizer.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor)
    )
    peak_flops, peak_flops_cpu = matmul_peak()
    req = request(plan)
    release_memory()
    rss_before = rss_bytes()
    reset_ok = reset_peak_rss()
    load0 = os.getloadavg()
    w0, c0 = time.perf_counter(), time.process_time()
    metrics, forward_s = run_update(model, optimizer, req, lambda: [], accel=accel, frozen=frozen)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = peak_rss_bytes()
    counts = step_counts(rollouts, mbt if has_batching else None)
    shared = _prompt_shared(model)
    fwd = counts["completion_tokens"] + (
        counts["prompt_tokens_shared"] if shared else counts["prompt_tokens_every_row"]
    )
    flops = _flops(dims, fwd, counts["completion_tokens"], ckpt)
    return {
        "cascade_module": str(Path(cascade.__file__).parent),
        "has_batching": has_batching,
        "dims": dims,
        "adam_state_mb": adam_state / MIB,
        "rss_runtime_mb": rss_runtime / MIB,
        "rss_before_mb": rss_before / MIB,
        "peak_rss_mb": peak / MIB,
        "update_peak_mb": (peak - rss_before) / MIB,
        "peak_mb": (peak - rss_runtime) / MIB,
        "peak_reset": reset_ok,
        "step_s": wall,
        "step_cpu_s": cpu,
        "forward_s": forward_s,
        "loss_rl": metrics.get("loss_rl"),
        "grad_norm": metrics.get("grad_norm"),
        "prompt_shared_forward": shared,
        "forward_tokens": fwd,
        **counts,
        **flops,
        "peak_gflops": peak_flops / 1e9,
        "peak_gflops_cpu_time": peak_flops_cpu / 1e9,
        "mfu": flops["model_flops"] / (wall * peak_flops),
        "hfu": flops["hardware_flops"] / (wall * peak_flops),
        "mfu_cpu_time": flops["model_flops"] / (cpu * peak_flops_cpu),
        "hfu_cpu_time": flops["hardware_flops"] / (cpu * peak_flops_cpu),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
    }


def _prompt_shared(model: Any) -> bool:
    """Whether the learner's forward runs a group's prompt once (`completion_logits`'s rule:
    a stack `cascade.engine.decode` supports, at most half the rows distinct; always so here)."""
    from cascade.engine import decode

    return bool(decode.supports(model))


def _tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2, "p": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _trl_batch(rollouts: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """The step as TRL's `_generate_and_score_completions` returns it: prompts left-padded and
    completions right-padded to the step's longest."""
    import torch

    from cascade.algo import group_advantages
    from cascade.engine.batch import left_pad, right_pad

    p_ids, p_mask = left_pad(rollouts["prompt_ids"], pad_id)
    c_ids, c_mask = right_pad(rollouts["completion_ids"], pad_id)
    return {
        "prompt_ids": p_ids,
        "prompt_mask": p_mask,
        "completion_ids": c_ids,
        "completion_mask": c_mask,
        "advantages": group_advantages(rollouts["rewards"]).flatten().float(),
        "num_items_in_batch": c_mask.sum().to(torch.float32),
    }


def trl_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    rss_runtime = rss_bytes()
    shape, bs, ckpt = spec["shape"], spec["trl_batch"], spec["ckpt"]
    pad = PAD_ID[shape]
    rollouts = make_rollouts(spec["prompts"], GROUP, spec["max_tokens"], SHAPES[shape]["vocab"])
    rows = len(rollouts["completion_ids"])
    if rows % bs:
        raise SystemExit(f"per_device_train_batch_size {bs} does not divide the step's {rows} rows")
    real = _trl_batch(rollouts, pad)
    warm = _trl_batch(
        {
            "prompt_ids": [[5] * 8] * rows,
            "completion_ids": [[7] * 8] * rows,
            "rewards": torch.tensor([[float(j % 2) for j in range(GROUP)]] * (rows // GROUP)),
            "group": GROUP,
        },
        pad,
    )
    batches = [warm, real]
    model = build_model(shape)
    dims = model_dims(model)
    optim = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda _s: 1.0)
    state: dict[str, Any] = {}

    class PrefabGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            return batches.pop(0)

    class Measure(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            if st.global_step == 1:
                state["peak"], state["peak_cpu"] = matmul_peak()
                release_memory()
                state["rss_before"] = rss_bytes()
                state["peak_reset"] = reset_peak_rss()
                state["load0"] = os.getloadavg()
                state["w0"], state["c0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            if st.global_step == 2:
                state["wall"] = time.perf_counter() - state["w0"]
                state["cpu"] = time.process_time() - state["c0"]
                state["peak_rss"] = peak_rss_bytes()
                state["ckpt_active"] = bool(model.is_gradient_checkpointing)

    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="learner_memory-trl-"),
        use_cpu=True,
        seed=SEED,
        max_steps=2,
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=rows // bs,
        num_generations=GROUP,
        max_completion_length=spec["max_tokens"],
        learning_rate=LR,
        lr_scheduler_type="constant",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        max_grad_norm=1.0,
        num_iterations=1,
        shuffle_dataset=False,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=False,
        gradient_checkpointing=ckpt,
        activation_checkpointing=ckpt,
    )
    dataset = Dataset.from_dict({"prompt": ["p"] * (4 * spec["prompts"])})
    trainer = PrefabGRPOTrainer(
        model=model,
        reward_funcs=lambda **_: [0.0] * rows,
        args=args,
        train_dataset=dataset,
        processing_class=_tiny_tokenizer(),
        callbacks=[Measure()],
        optimizers=(optim, sched),
    )
    trainer.train()
    if batches:
        raise SystemExit("TRL did not consume both prefabricated batches")
    rss_before, peak, wall = state["rss_before"], state["peak_rss"], state["wall"]
    width = real["prompt_ids"].shape[1] + real["completion_ids"].shape[1]
    completion = int(real["completion_mask"].sum())
    prompt = int(real["prompt_mask"].sum())
    flops = _flops(dims, prompt + completion, completion, ckpt)
    return {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "dims": dims,
        "per_device_train_batch_size": bs,
        "gradient_accumulation_steps": rows // bs,
        "gradient_checkpointing": ckpt,
        "gradient_checkpointing_active": state["ckpt_active"],
        "rss_runtime_mb": rss_runtime / MIB,
        "rss_before_mb": rss_before / MIB,
        "peak_rss_mb": peak / MIB,
        "update_peak_mb": (peak - rss_before) / MIB,
        "peak_mb": (peak - rss_runtime) / MIB,
        "peak_reset": state["peak_reset"],
        "step_s": wall,
        "step_cpu_s": state["cpu"],
        "rows": rows,
        "micro_batches": rows // bs,
        "largest_micro_batch_padded_tokens": bs * width,
        "padded_tokens": rows * width,
        "real_tokens": prompt + completion,
        "forward_tokens": prompt + completion,
        "completion_tokens": completion,
        "lm_head_positions": rows * (width - 1),
        **flops,
        "peak_gflops": state["peak"] / 1e9,
        "peak_gflops_cpu_time": state["peak_cpu"] / 1e9,
        "mfu": flops["model_flops"] / (wall * state["peak"]),
        "hfu": flops["hardware_flops"] / (wall * state["peak"]),
        "mfu_cpu_time": flops["model_flops"] / (state["cpu"] * state["peak_cpu"]),
        "hfu_cpu_time": flops["hardware_flops"] / (state["cpu"] * state["peak_cpu"]),
        "loadavg_start": state["load0"],
        "loadavg_end": os.getloadavg(),
    }


# --------------------------------------------------------------------------- configurations


def config(
    cid: str,
    group_name: str,
    *,
    shape: str = "narrow",
    prompts: int,
    max_tokens: int,
    mbt: int | None,
    ckpt: bool,
    side: str = "cascade",
    trl_batch: int | None = None,
    mmap_threshold: int | None = None,
) -> dict[str, Any]:
    return {
        "id": cid,
        "group": group_name,
        "side": side,
        "shape": shape,
        "prompts": prompts,
        "max_tokens": max_tokens,
        "mbt": mbt,
        "ckpt": ckpt,
        "trl_batch": trl_batch,
        "mmap_threshold": mmap_threshold,
    }


def trl_micro_tokens(prompts: int, max_tokens: int, shape: str, trl_batch: int) -> int:
    """TRL's micro-batch: `trl_batch` rows padded to the step's longest prompt + completion."""
    r = make_rollouts(prompts, GROUP, max_tokens, SHAPES[shape]["vocab"])
    return trl_batch * (max(map(len, r["prompt_ids"])) + max(map(len, r["completion_ids"])))


MMAP_THRESHOLD = 65536
"""`alloc-*` runs: glibc's `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB, so every allocation of 64 KiB
or more is its own mapping, returned to the system when freed. By default glibc raises that
threshold (up to 32 MiB) each time a mapped block is freed, after which such blocks come from the
heap and stay in the RSS once freed: the default RSS holds the tensors plus what the allocator
kept, which varies by a few hundred MB from run to run here. The fixed threshold's RSS is close
to the live tensors."""

PLANS: dict[str, dict[str, Any]] = {
    "full": {
        "short": 1024,  # the short completion budget
        "long": 4096,  # the long one
        "mbt": 8192,  # micro_batch_tokens of the step and checkpointing groups
        "steps_short": [2, 4, 8],  # prompts (x 8) per step at the short budget
        "steps_long": [1, 2],
        "fixed": 2,  # the step of the micro_batch_tokens sweep and the checkpointing pair
        "sweep": [2048, 4096, 16384, 32768, None],  # (+ mbt, from the step group)
        "old": [(1, 256), (1, 512), (2, 256)],  # (prompts, budget): the learner before, fits here
        "trl": [(1, 1024, 2)],  # (prompts, budget, per_device_train_batch_size)
        "big": (1, 1024, 4096),  # Qwen3-0.6B's shape: (prompts, budget, micro_batch_tokens)
        "alloc": ["step-2x8-1024", "step-8x8-1024", "qwen3-0.6b-1x8-1024"],  # again, allocator-neutral
    },
    "quick": {
        "short": 256,
        "long": 1024,
        "mbt": 2048,
        "steps_short": [1, 2],
        "steps_long": [1],
        "fixed": 1,
        "sweep": [512, None],
        "old": [(1, 64)],
        "trl": [(1, 256, 2)],
        "big": None,
        "alloc": ["step-1x8-256", "step-2x8-256"],
    },
}
"""What each mode runs. The full mode's steps are the largest whose update finishes in minutes
on one core of this machine (the 64 x 8 steps are extrapolated from them, see `extrapolate`)."""


def configurations(quick: bool) -> list[dict[str, Any]]:
    """Every configuration of the mode, cheapest and most telling first (a partial run still
    answers the question)."""
    plan = PLANS["quick" if quick else "full"]
    short, long_, mbt, fixed = plan["short"], plan["long"], plan["mbt"], plan["fixed"]
    out: list[dict[str, Any]] = []
    for n in plan["steps_short"]:
        out.append(config(f"step-{n}x8-{short}", "step", prompts=n, max_tokens=short, mbt=mbt, ckpt=True))
    for t in plan["sweep"]:
        out.append(config(f"mbt-{t or 'none'}", "mbt", prompts=fixed, max_tokens=short, mbt=t, ckpt=True))
    out.append(config("ckpt-off", "ckpt", prompts=fixed, max_tokens=short, mbt=mbt, ckpt=False))
    for n, tok in plan["old"]:
        for side, m, ck, label in (
            ("cascade_before", None, False, "before"),
            ("cascade", None, False, "none"),
            ("cascade", mbt, True, f"mbt{mbt}"),
        ):
            out.append(
                config(
                    f"old-{n}x8-{tok}-{label}", "old", side=side, prompts=n, max_tokens=tok, mbt=m, ckpt=ck
                )
            )
    if plan["big"] is not None:
        n, tok, m = plan["big"]
        out.append(
            config(
                f"qwen3-0.6b-{n}x8-{tok}",
                "0.6b",
                shape="qwen3-0.6b",
                prompts=n,
                max_tokens=tok,
                mbt=m,
                ckpt=True,
            )
        )
    for n in plan["steps_long"]:
        out.append(config(f"step-{n}x8-{long_}", "step", prompts=n, max_tokens=long_, mbt=mbt, ckpt=True))
    for n, tok, bs in plan["trl"]:
        t = trl_micro_tokens(n, tok, "narrow", bs)
        out.append(
            config(
                f"trl-{n}x8-{tok}-bs{bs}",
                "trl",
                side="trl",
                prompts=n,
                max_tokens=tok,
                mbt=None,
                ckpt=True,
                trl_batch=bs,
            )
        )
        out.append(config(f"trl-{n}x8-{tok}-cascade", "trl", prompts=n, max_tokens=tok, mbt=t, ckpt=True))
    by_id = {c["id"]: c for c in out}
    for cid in plan["alloc"]:
        out.append({**by_id[cid], "id": f"alloc-{cid}", "group": "alloc", "mmap_threshold": MMAP_THRESHOLD})
    return out


# --------------------------------------------------------------------------- coordinator side


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _proc_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_config(
    spec: dict[str, Any], threads: int, cap: int, before_dir: Path | None, log: Path
) -> dict[str, Any]:
    env = dict(os.environ)
    path = [str(ROOT)]
    if spec["side"] == "cascade_before":
        assert before_dir is not None
        path.insert(0, str(before_dir))
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if spec.get("mmap_threshold"):
        env["MALLOC_MMAP_THRESHOLD_"] = str(spec["mmap_threshold"])
    argv = [sys.executable, __file__, "--worker", json.dumps(spec), "--threads", str(threads)]
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        watch = {"max_rss": 0, "killed": None}

        def watchdog() -> None:
            while proc.poll() is None:
                rss = _proc_rss(proc.pid)
                watch["max_rss"] = max(watch["max_rss"], rss)
                if rss > cap:
                    watch["killed"] = f"RSS {rss / GIB:.1f} GiB over the cap {cap / GIB:.1f} GiB"
                elif _mem_available() < GIB:
                    watch["killed"] = f"machine's available memory under 1 GiB at RSS {rss / GIB:.1f} GiB"
                if watch["killed"]:
                    proc.kill()
                    return
                time.sleep(0.05)

        th = threading.Thread(target=watchdog, daemon=True)
        th.start()
        assert proc.stdout is not None
        result: dict[str, Any] | None = None
        for line in proc.stdout:
            if line.startswith(PREFIX):
                result = json.loads(line[len(PREFIX) :])
        rc = proc.wait()
        th.join()
    out = {
        **spec,
        "wall_with_setup_s": time.perf_counter() - t0,
        "watched_max_rss_mb": watch["max_rss"] / MIB,
    }
    if watch["killed"]:
        return {**out, "fits": False, "error": f"killed: {watch['killed']}"}
    if rc != 0 or result is None:
        tail = log.read_text().strip().splitlines()[-3:]
        return {**out, "fits": rc != -9, "error": f"worker rc {rc}: {' | '.join(tail)}"}
    return {**out, "fits": True, **result}


def code_version() -> str:
    """HEAD's short hash, `+dirty` when `cascade/` has uncommitted changes (others edit this tree)."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "cascade"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def export_before(ref: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="learner_memory-before-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "cascade"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small steps and lengths: a few minutes")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every worker")
    ap.add_argument("--only", default="", help="comma-separated configuration ids (see --list)")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument(
        "--allocator-neutral",
        action="store_true",
        help=f"also the alloc-* runs (MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}; ~25 min more in full)",
    )
    ap.add_argument("--cap-gib", type=float, default=14.0, help="kill a worker whose RSS passes this")
    ap.add_argument("--before-ref", default=BEFORE_REF, help="git ref of the learner before micro-batching")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (the .md is written beside it)")
    ap.add_argument("--merge", action="store_true", help="keep the JSON's other configurations' results")
    ap.add_argument(
        "--render",
        action="store_true",
        help="recompute the estimates, claims and the .md from the JSON (no run)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        spec = json.loads(args.worker)
        fn = trl_worker if spec["side"] == "trl" else cascade_worker
        _send(fn(spec))
        return
    specs = configurations(args.quick)
    if not (args.allocator_neutral or args.only):
        specs = [s for s in specs if s["group"] != "alloc"]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s["id"] for s in specs}
        if unknown:
            raise SystemExit(f"unknown ids {sorted(unknown)}; --list shows them")
        specs = [s for s in specs if s["id"] in wanted]
    if args.list:
        for s in specs:
            print(json.dumps(s))
        return
    out = args.out or RESULTS / ("learner_memory_quick.json" if args.quick else "learner_memory.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.render:
        report = json.loads(out.read_text())
        for r in report["runs"]:
            r["estimate"] = _estimate_of(r)
        report["extrapolated"] = extrapolate(report["runs"], report["quick"])
        report["claims"] = claims(report)
        out.write_text(json.dumps(report, indent=1))
        out.with_suffix(".md").write_text(markdown(report))
        print(f"rendered {out} and {out.with_suffix('.md')}")
        return
    previous: dict[str, Any] = {}
    before_report: dict[str, Any] = {}
    if args.merge and out.exists():
        before_report = json.loads(out.read_text())
        previous = {r["id"]: r for r in before_report["runs"]}
    before_dir = export_before(args.before_ref) if any(s["side"] == "cascade_before" for s in specs) else None
    logs = Path(tempfile.mkdtemp(prefix="learner_memory-logs-"))
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    runs: dict[str, Any] = dict(previous)
    for i, spec in enumerate(specs):
        print(f"[{i + 1}/{len(specs)}] {spec['id']} ...", flush=True)
        code = args.before_ref if spec["side"] == "cascade_before" else code_version()
        r = run_config(spec, args.threads, int(args.cap_gib * GIB), before_dir, logs / f"{spec['id']}.log")
        r["code"] = code
        r["estimate"] = _estimate_of(r)
        runs[spec["id"]] = r
        print("    " + _one_line(r), flush=True)
    report = {
        "what": (
            "the learner's peak memory (RSS) for one update of random-weight Qwen3 models on prefabricated "
            "rollouts, each configuration in a fresh process, against the step, micro_batch_tokens, "
            "activation checkpointing, the learner before micro-batching, and TRL's GRPOTrainer"
        ),
        "quick": args.quick,
        "threads": args.threads,
        "cap_gib": args.cap_gib,
        "before_ref": args.before_ref,
        "shapes": SHAPES,
        "lengths": (
            "prompts uniform 100..300 (one per group of 8); completions round(exp(N(log(max/5), 0.9))) "
            "clamped to 16..max"
        ),
        "machine": {
            "cpus": os.cpu_count(),
            "mem_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB,
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
            "wall_s": time.perf_counter() - t0,
        },
        "extrapolated": extrapolate(list(runs.values()), args.quick),
        "runs": list(runs.values()),
    }
    if before_report:  # the first run's machine line stays; each merged run is listed under it
        merged = {"ids": [s["id"] for s in specs], **report["machine"]}
        report["machine"] = {
            **before_report["machine"],
            "merged": [*before_report["machine"].get("merged", []), merged],
        }
    report["claims"] = claims(report)
    out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out} and {out.with_suffix('.md')} ({time.perf_counter() - t0:.0f} s)")


def _estimate_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The estimate for a Cascade run's step (None for TRL's and the learner before: the estimate
    is of the learner as it is now), every row at the step's longest prompt and completion."""
    if spec["side"] != "cascade":
        return None
    rl = make_rollouts(spec["prompts"], GROUP, spec["max_tokens"], SHAPES[spec["shape"]]["vocab"])
    longest = (max(map(len, rl["prompt_ids"])), max(map(len, rl["completion_ids"])))
    return estimate_bytes(spec["shape"], len(rl["completion_ids"]), *longest, spec["mbt"], spec["ckpt"])


def _one_line(r: dict[str, Any]) -> str:
    if r.get("error"):
        return f"{r['id']}: {r['error']}"
    est = r.get("estimate") or {}
    e = f", estimate {est['total'] / MIB:.0f} MB" if "total" in est else ""
    return (
        f"update +{r['update_peak_mb']:.0f} MB over {r['rss_before_mb']:.0f} MB, "
        f"learner peak {r['peak_mb']:.0f} MB{e}, step {r['step_s']:.1f} s "
        f"({r['micro_batches']} micro-batches, {r['real_tokens']} tokens), "
        f"MFU {r['mfu']:.1%}"
    )


def extrapolate(runs: list[dict[str, Any]], quick: bool) -> dict[str, Any]:
    """The full steps not run: their tokens (the same rollout generator) at the measured rate of
    the largest step run at that length."""
    out: dict[str, Any] = {}
    plan = PLANS["quick" if quick else "full"]
    for tokens in (plan["short"], plan["long"]):
        done = [r for r in runs if r["group"] == "step" and r["max_tokens"] == tokens and not r.get("error")]
        if not done:
            continue
        ref = max(done, key=lambda r: r["real_tokens"])
        rate = ref["real_tokens"] / ref["step_s"]
        for n in (8, 16, 32, 64):
            r = make_rollouts(n, GROUP, tokens, 8)  # lengths only depend on the seed and the max
            real = sum(map(len, r["prompt_ids"])) + sum(map(len, r["completion_ids"]))
            out[f"{n}x8-{tokens}"] = {
                "real_tokens": real,
                "estimated_step_s": real / rate,
                "from": ref["id"],
                "tokens_per_s": rate,
            }
    return out


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _est_ratio(r: dict[str, Any]) -> float | None:
    est = r.get("estimate") or {}
    if "total" not in est or r.get("error"):
        return None
    return float(est["total"]) / MIB / r["peak_mb"]


def claims(report: dict[str, Any]) -> dict[str, Any]:
    """What the runs show: the peak's spread over the step (flat: within 15% of the smallest
    step's), and the estimate against every measured peak (within 25%)."""
    runs = [r for r in report["runs"] if not r.get("error")]
    flat: dict[str, Any] = {}
    keys = sorted({(r["group"], r["max_tokens"]) for r in runs if r["group"] in ("step", "alloc")})
    for group, tokens in keys:
        rs = sorted(
            (
                r
                for r in runs
                if r["group"] == group
                and r["max_tokens"] == tokens
                and r["mbt"] is not None
                and r["shape"] == "narrow"
            ),
            key=lambda r: r["prompts"],
        )
        if len(rs) < 2:
            continue
        first = rs[0]
        upd = [r["update_peak_mb"] / first["update_peak_mb"] for r in rs]
        lrn = [r["peak_mb"] / first["peak_mb"] for r in rs]
        flat[f"{tokens}" if group == "step" else f"{tokens}-allocator-neutral"] = {
            "steps": [f"{r['prompts']}x{GROUP}" for r in rs],
            "update_peak_mb": [r["update_peak_mb"] for r in rs],
            "learner_peak_mb": [r["peak_mb"] for r in rs],
            "update_over_smallest_step": upd,
            "learner_over_smallest_step": lrn,
            "flat_within_15pct": all(abs(x - 1) <= 0.15 for x in lrn),
            "update_flat_within_15pct": all(abs(x - 1) <= 0.15 for x in upd),
        }
    estimates = {r["id"]: _est_ratio(r) for r in runs if _est_ratio(r) is not None}
    return {
        "flat_in_the_step": flat,
        "estimate_over_measured": estimates,
        "estimate_within_25pct": {k: abs(v - 1) <= 0.25 for k, v in estimates.items()},
    }


ROW_HEAD = (
    "| run | step | max tokens | micro_batch_tokens | ckpt | micro-batches (largest, padded tokens) | tokens "
    "| update MB | learner MB | estimate MB (/ measured) | step s (CPU s) | MFU, wall (CPU time) |"
)
ROW_RULE = "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"


def _row(r: dict[str, Any]) -> str:
    step = f"{r['prompts']}x{GROUP}"
    mbt = "none" if r["mbt"] is None else f"{r['mbt']:,}"
    if r["side"] == "trl":
        mbt = f"TRL bs {r['trl_batch']}"
    name = r["id"] + {"cascade": "", "cascade_before": " (learner before)", "trl": " (TRL)"}[r["side"]]
    head = f"| {name} | {step} | {r['max_tokens']} | {mbt} | {'on' if r['ckpt'] else 'off'} |"
    if r.get("error"):
        return head + f" - | - | {r['error']} | | | | |"
    ratio = _est_ratio(r)
    est = "-" if ratio is None else f"{r['estimate']['total'] / MIB:,.0f} ({ratio:.2f})"
    return head + (
        f" {r['micro_batches']} ({r['largest_micro_batch_padded_tokens']:,}) | {r['real_tokens']:,} | "
        f"{_mb(r['update_peak_mb'])} | {_mb(r['peak_mb'])} | {est} | "
        f"{r['step_s']:.0f} ({r['step_cpu_s']:.0f}) | "
        f"{r['mfu']:.1%} ({r.get('mfu_cpu_time', float('nan')):.1%}) |"
    )


def _table(rows: list[dict[str, Any]]) -> list[str]:
    return [ROW_HEAD, ROW_RULE, *(_row(r) for r in rows), ""]


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    m = report["machine"]
    plan = PLANS["quick" if report["quick"] else "full"]
    c = report["claims"]
    lines = [
        "# Learner memory: one update's peak against the step, micro_batch_tokens, checkpointing, TRL",
        "",
        f"`bench/learner_memory.py{' --quick' if report['quick'] else ''}`: every run one update in a "
        f"fresh process, {report['threads']} torch thread(s), float32 on the CPU, {m['cpus']} cores shared "
        f"with other work ({m['mem_total_gib']:.0f} GiB; load average {m['loadavg_start'][0]:.1f} at the "
        f"start, {m['loadavg_end'][0]:.1f} at the end; {m['wall_s'] / 60:.0f} min). Model `narrow` unless "
        "the run says otherwise (random Qwen3, hidden 256, 4 layers, vocabulary 151,936, tied).",
        "",
        "- `update MB`: peak RSS during the update - RSS just before it (weights and AdamW's moments "
        "already there, made by a warm-up update on a tiny batch).",
        "- `learner MB`: peak RSS - RSS after the imports, before the model existed: weights, gradients, "
        "AdamW moments and the update's transient memory, the scope of `step_memory.estimate_step` (whose "
        "total is beside it, over the measured figure).",
        "- `tokens`: real prompt + completion tokens, every row's prompt counted; `micro-batches`: as "
        "`cascade.engine.microbatch` cuts the step, with the largest one's padded tokens.",
        "- MFU: `6 x N_body x T_forward + 6 x (d x V) x T_completion` over the step's wall time x the "
        "float32 `torch.mm` peak measured in the same process (and over its CPU time x the mm's CPU-time "
        "peak).",
        "",
    ]
    for merged in m.get("merged", []):
        lines += [
            f"Re-run later and merged in: {', '.join(merged['ids'])} (load average "
            f"{merged['loadavg_start'][0]:.1f} / {merged['loadavg_end'][0]:.1f}, "
            f"{merged['wall_s'] / 60:.0f} min).",
            "",
        ]
    codes = sorted({r["code"] for r in runs if r.get("code") and r["side"] != "cascade_before"})
    if codes:
        lines += [f"The learner's code (git HEAD of `cascade/` per run): {', '.join(codes)}.", ""]
    for tokens in (plan["short"], plan["long"]):
        rs = [r for r in runs if r["group"] == "step" and r["max_tokens"] == tokens]
        rs.sort(key=lambda r: r["prompts"])
        if not rs:
            continue
        lines += [f"## The step growing, completions up to {tokens} tokens", "", *_table(rs)]
        f = c["flat_in_the_step"].get(str(tokens))
        if f:
            lines += [
                "Each step's peak over the smallest step's: learner "
                + " / ".join(f"{x:.2f}" for x in f["learner_over_smallest_step"])
                + ", update "
                + " / ".join(f"{x:.2f}" for x in f["update_over_smallest_step"])
                + f" (learner within 15%: {'yes' if f['flat_within_15pct'] else 'NO'}; update: "
                + f"{'yes' if f['update_flat_within_15pct'] else 'NO'}).",
                "",
            ]
    sweep = [
        r
        for r in runs
        if r["group"] in ("step", "mbt")
        and r["prompts"] == plan["fixed"]
        and r["max_tokens"] == plan["short"]
        and r["ckpt"]
        and r["side"] == "cascade"
    ]
    sweep.sort(key=lambda r: float("inf") if r["mbt"] is None else r["mbt"])
    if sweep:
        lines += ["## micro_batch_tokens at a fixed step", "", *_table(sweep)]
    pair = [
        r
        for r in runs
        if r["group"] in ("step", "ckpt")
        and r["prompts"] == plan["fixed"]
        and r["max_tokens"] == plan["short"]
        and r["mbt"] == plan["mbt"]
    ]
    if pair:
        lines += ["## Activation checkpointing on and off", "", *_table(pair)]
    old = [r for r in runs if r["group"] == "old"]
    if old:
        lines += [
            "## Before and after: the learner before micro-batching against the new one",
            "",
            f"`(learner before)`: `cascade/` as of `{report['before_ref']}` (the whole step in one forward, "
            "its full [rows, completion, vocabulary] float32 logits); `none`: the new learner with "
            "`micro_batch_tokens` unset (one pass, the logits in vocabulary chunks).",
            "",
            *_table(old),
        ]
    trl = [r for r in runs if r["group"] == "trl"]
    if trl:
        lines += [
            "## TRL's GRPOTrainer on the same rows",
            "",
            "TRL 1.16 (`per_device_train_batch_size` rows per micro-batch, `gradient_accumulation_steps` = "
            "rows / it, `gradient_checkpointing=True`, `loss_type=dapo`, beta 0, float32), its generation "
            "replaced by the same prefabricated rows; the Cascade run beside it gets TRL's micro-batch size "
            "in padded tokens as `micro_batch_tokens`.",
            "",
            *_table(trl),
        ]
    alloc = [r for r in runs if r["group"] == "alloc"]
    if alloc:
        by_id = {r["id"]: r for r in runs}
        lines += [
            "## The allocator's share",
            "",
            f"The same runs again with glibc's `MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}` (every block of 64 "
            "KiB or more mapped on its own and returned when freed; by default glibc raises the threshold "
            "after freeing a mapped block and keeps later ones in its heap): that RSS is close to the live "
            "tensors, the default one adds what the allocator kept.",
            "",
            "| run | update MB, default | update MB, allocator-neutral | learner MB, default | learner MB, "
            "allocator-neutral | estimate / allocator-neutral |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in alloc:
            base = by_id.get(r["id"].removeprefix("alloc-"), {})
            if r.get("error") or not base or base.get("error"):
                continue
            ratio = _est_ratio(r)
            lines.append(
                f"| {base['id']} | {base['update_peak_mb']:,.0f} | {r['update_peak_mb']:,.0f} | "
                f"{base['peak_mb']:,.0f} | {r['peak_mb']:,.0f} | {'-' if ratio is None else f'{ratio:.2f}'} |"
            )
        f = c["flat_in_the_step"].get(f"{plan['short']}-allocator-neutral")
        if f:
            lines += [
                "",
                "Allocator-neutral, each step's peak over the smallest step's: learner "
                + " / ".join(f"{x:.2f}" for x in f["learner_over_smallest_step"])
                + ", update "
                + " / ".join(f"{x:.2f}" for x in f["update_over_smallest_step"])
                + ".",
            ]
        lines.append("")
    big = [r for r in runs if r["group"] == "0.6b"]
    if big:
        lines += ["## The real Qwen3-0.6B shape", "", *_table(big)]
    if c["estimate_over_measured"]:
        lines += [
            "## The estimate against the measured peak",
            "",
            "| run | estimate / measured | within 25% |",
        ]
        lines += ["|---|---:|---|"]
        for k, v in c["estimate_over_measured"].items():
            lines.append(f"| {k} | {v:.2f} | {'yes' if c['estimate_within_25pct'][k] else 'NO'} |")
        lines.append("")
    if report.get("extrapolated"):
        lines += [
            "## Steps not run",
            "",
            "Their tokens (the same rollout generator) at the rate of the largest step run at that length:",
            "",
            "| step | real tokens | estimated update time | from | tokens/s |",
            "|---|---:|---:|---|---:|",
        ]
        for k, v in report["extrapolated"].items():
            lines.append(
                f"| {k} | {v['real_tokens']:,} | {v['estimated_step_s'] / 60:,.0f} min | {v['from']} | "
                f"{v['tokens_per_s']:.0f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
