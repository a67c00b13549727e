"""Benchmark: the same GRPO stage through TRL's `GRPOTrainer` and through Cascade, in lockstep.

Usage: `make bench-trl` (installs the `bench-trl` extra), or
`.venv/bin/python bench/vs_trl.py [--model models/tiny] [--steps 100] [--threads 1]`.
Writes `bench/results/vs_trl.json`.

The work, identical on every side: the tiny local model (float32, CPU), the math domain's train
prompts in order (16 per step, no shuffling, so every side sees the same prompts at the same
step) rendered by Cascade's chat template (`render_prompt`; TRL gets the rendered text and
tokenizes it to the same ids, checked at start), 8 completions per prompt, at most 24 new
tokens, temperature 1, the math verifier as the reward (wrapped as a TRL reward function),
group-normalised advantages, clip 0.2/0.28, no KL (beta 0), AdamW at the same learning rate
with the same linear warm-up (TRL gets Cascade's schedule as a `LambdaLR`), gradient clipping
at 1, completions cut by the budget masked out of the loss (Cascade `overlong: mask`, TRL
`mask_truncated_completions`), one optimizer step per generation. Token-level loss: Cascade's
`token` aggregation (each group's token sum over its token count, averaged over groups); TRL
has no per-group form, its closest is `dapo` (token sum over the batch's token count; with one
process and no accumulation the same as `bnpo`).

Four workers. TRL runs twice, with its `gradient_checkpointing` set explicitly each time: `trl`
with `True`, TRL 1.16's default (`GRPOConfig` turns it on, unlike `transformers`' `Trainer`:
every backward recomputes the layers' forward), and `trl_no_checkpointing` with `False` (one
forward per backward, as Cascade does). bf16 is off on both (`bf16=False`, float32 as Cascade).
Cascade runs twice: `cascade` with its stage defaults, which drop groups whose rewards are all
equal from the loss (`filter.drop_zero_variance`; their advantages, hence their gradient, are 0
on every side, but TRL still runs them through the forward and backward), and
`cascade_all_groups`, which puts every group through the loss as TRL does. The same work is
`trl_no_checkpointing` against `cascade_all_groups`; the report has a ratio for every pair it
names, each with a `compares` line saying what it compares.

How it is run: each trainer lives in its own subprocess (its own imports, allocator and peak
RSS; none warms another's caches), and this process steps them in turn, one step each,
rotating which goes first every step, so machine load hits all alike. A worker times its step
from the moment it is told to go until the update is applied: wall time and the process's CPU
time (far less sensitive to other jobs on the machine). All run
`torch.set_num_threads(--threads)` (1 by default: the model is tiny, the machine small and
shared). TRL's step is everything between its `on_step_begin` and `on_step_end` callbacks
(generation, reward, the loss forward/backward, clipping, the optimizer and scheduler step);
Cascade's is the embedded step: encode the step's prompts, `generate_and_score`, the batch
merge, `rl_term`, `apply_update` (the stage loop's own bookkeeping, such as metrics rows, is
left out, as TRL's logging is). Phases: `generate_s` (TRL: its `_generate_single_turn`;
Cascade: `generate_and_score`'s generation), `reward_s` (the verifier) and `learner_s` (TRL:
the step less those two, so it also holds TRL's batch preparation -- padding, advantages;
Cascade: `rl_term` + `apply_update`), each also in process CPU time (`generate_cpu_s` ...).
Medians leave out the first two steps (first-call costs).

Model-FLOPs utilisation (MFU), measured in the same run. The peak: each worker times float32
`torch.matmul`s of square matrices (1024 and 2048, best of several) at the run's thread count,
2 n^3 FLOPs each, when the rotation tells it to (before the first step, halfway, after the
last; one worker at a time, none stepping); the run's peak is the best of all. The update's
model FLOPs per step: 6 x N_body x T_forward + 6 x d x V x T_completion, where N_body is the
parameters outside the embedding and the output head, T_forward the real (unpadded) tokens
the loss forward runs the layers on (prompts included: every row's prompt for TRL, each
distinct prompt once where Cascade's forward shares a group's prompt), d x V the output head
and T_completion the completion tokens whose logits the loss needs (the rows in the loss;
TRL's truncated rows included, as they go through its forward). Left out: attention's
score/value products (quadratic in the length), norms, activations, softmax, the optimizer
step; padding and the forward recomputed by gradient checkpointing are extra hardware work,
not model FLOPs. MFU = model FLOPs / (learner_s x peak), the median over steps. Generation:
2 x (N_body + d x V) x generated tokens over generate_s (prefill of the prompts left out, so a
lower bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "@@vs_trl "
PROMPTS_PER_STEP = 16
GROUP = 8
MAX_NEW_TOKENS = 24
LEARNING_RATE = 2e-4  # the demo's math stage (examples/tiny-cascade.yaml)
WARMUP_STEPS = 5
SEED = 0
SKIP = 2
"""Steps left out of the medians (first-call costs: lazy imports, allocator growth)."""
PEAK_SIZES = ((1024, 6), (2048, 3))
"""Square float32 matmuls timed for the peak: (n, repeats); FLOP/s = 2 n^3 / best time."""


# --------------------------------------------------------------------------- worker side


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _matmul_peak() -> dict[str, Any]:
    """This CPU's float32 matmul rate at the process's torch thread count (best of repeats)."""
    import torch

    by_size: dict[str, float] = {}
    for n, repeats in PEAK_SIZES:
        a, b = torch.randn(n, n), torch.randn(n, n)
        out = torch.empty(n, n)
        torch.matmul(a, b, out=out)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - t)
        by_size[str(n)] = 2 * n**3 / best
    return {
        "peak": True,
        "flops": max(by_size.values()),
        "by_size": by_size,
        "threads": torch.get_num_threads(),
    }


def _wait_go() -> bool:
    """Serve peak measurements until told to step (True) or until stdin closes (False)."""
    for line in sys.stdin:
        if line.strip() == "peak":
            _send(_matmul_peak())
            continue
        return line.strip() == "step"
    return False


def _serve_until_eof() -> None:
    while _wait_go():
        raise RuntimeError("told to step after the last step")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _model_dims(model: Any) -> dict[str, Any]:
    """The parameter counts the FLOP formula uses: N_body (all but the embedding and the output
    head), d x V (the output head's matmul), whether the head shares the embedding's weights."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == emb.data_ptr()
    total = sum(p.numel() for p in model.parameters())
    body = total - emb.numel() - (0 if tied else head.numel())
    return {
        "params_total": total,
        "params_body": body,
        "head_d_x_v": head.numel(),
        "hidden": head.shape[1],
        "vocab": head.shape[0],
        "tied_embeddings": tied,
        "layers": model.config.num_hidden_layers,
    }


def _problems_and_texts(model_dir: str) -> tuple[list[Any], list[str], Any]:
    from cascade.config import ChatConfig, DomainConfig
    from cascade.domains import load_problems, make_domain
    from cascade.model.chat import render_prompt
    from cascade.model.loading import load_policy

    dcfg = DomainConfig(name="math")
    problems = load_problems(dcfg, "train")
    policy = load_policy(model_dir)
    texts = [render_prompt(policy.tokenizer, ChatConfig(), p.prompt, False) for p in problems]
    return problems, texts, make_domain(dcfg)


def _step_problems(problems: list[Any], step: int) -> list[int]:
    start = (step * PROMPTS_PER_STEP) % len(problems)
    return [(start + i) % len(problems) for i in range(PROMPTS_PER_STEP)]


def cascade_worker(model_dir: str, steps: int, keep_zero_variance: bool) -> None:
    import torch

    from cascade.algo import warmup_lr_factor
    from cascade.config import ChatConfig, GrpoConfig, TokenBudget
    from cascade.engine import decode as engine_decode
    from cascade.model.chat import encode_prompts
    from cascade.model.loading import load_policy
    from cascade.rollout.policy import PolicyGenerate
    from cascade.rollout.requests import PromptRequest, merge_chunks, problem_fields
    from cascade.rollout.scoring import generate_and_score
    from cascade.runner.optimizer_step import apply_update
    from cascade.runner.rl import plan_rl, rl_term

    problems, _, domain = _problems_and_texts(model_dir)
    policy = load_policy(model_dir)
    policy.model.train()
    shares_prompts = engine_decode.supports(policy.model)
    cfg = GrpoConfig(
        group_size=GROUP,
        prompts_per_step=PROMPTS_PER_STEP,
        learning_rate=LEARNING_RATE,
        warmup_steps=WARMUP_STEPS,
        budget=TokenBudget(max_new_tokens=MAX_NEW_TOKENS),
        loss_aggregation="token",
        kl_coef=0.0,
        overlong="mask",
    )
    optim = torch.optim.AdamW(policy.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    engine = PolicyGenerate(policy, generator=torch.Generator().manual_seed(SEED))

    def decode(ids: list[list[int]]) -> list[str]:
        return policy.tokenizer.batch_decode(ids, skip_special_tokens=True)

    score_cpu: list[float] = []  # process time when the verifier starts and ends

    def score(_d: str, probs: list[Any], texts: list[str], _c: dict[str, Any] | None) -> list[Any]:
        score_cpu[:] = [time.process_time()]
        out = domain.score_batch(probs, texts)
        score_cpu.append(time.process_time())
        return out  # type: ignore[no-any-return]

    _send({"ready": True, "rss_mb": _peak_rss_mb(), "dims": _model_dims(policy.model)})
    for step in range(steps):
        if not _wait_go():
            break
        w0, c0 = time.perf_counter(), time.process_time()
        batch_problems = [problems[i] for i in _step_problems(problems, step)]
        req = PromptRequest(
            batch=step,
            index=0,
            domain="math",
            policy_version=step,
            seed=None,
            group_size=GROUP,
            max_tokens=MAX_NEW_TOKENS,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            overlong=cfg.overlong,
            problems=[problem_fields(p) for p in batch_problems],
            prompt_ids=encode_prompts(
                policy.tokenizer, ChatConfig(), [p.prompt for p in batch_problems], False
            ),
            sample_ids=[[f"{p.id}/{j}" for j in range(GROUP)] for p in batch_problems],
        )
        cg = time.process_time()
        chunk = generate_and_score(req, generate_fn=engine, decode=decode, score=score, worker="bench")
        batch = merge_chunks([req], [chunk], policy_version=step, temperature=cfg.temperature)
        w1, c1 = time.perf_counter(), time.process_time()
        rl = rl_term(
            policy.model,
            batch,
            cfg,
            pad_id=policy.pad_token_id,
            current_version=step,
            drop_zero_variance=not keep_zero_variance,
        )
        lr = cfg.learning_rate * warmup_lr_factor(step, cfg.warmup_steps)
        apply_update(policy.model, optim, rl=rl, distill=[], lam=0.0, max_grad_norm=cfg.max_grad_norm, lr=lr)
        w2, c2 = time.perf_counter(), time.process_time()
        # The loss's rows again (untimed, the same deterministic choice rl_term made), to count
        # the tokens its forward ran: `completion_logits` runs each distinct prompt once when
        # at most half the rows are distinct prompts on a stack `decode` supports.
        plan = plan_rl(batch, cfg, current_version=step, drop_zero_variance=not keep_zero_variance)
        distinct = {tuple(p) for p in plan.prompt_ids}
        shared = shares_prompts and 2 * len(distinct) <= len(plan.prompt_ids)
        prompt_tokens = sum(len(p) for p in distinct) if shared else sum(len(p) for p in plan.prompt_ids)
        completion_tokens = sum(len(c) for c in plan.completion_ids)
        width_p = max((len(p) for p in plan.prompt_ids), default=0)
        width_c = max((len(c) for c in plan.completion_ids), default=0)
        rows = len(plan.prompt_ids)
        _send(
            {
                "step": step,
                "wall_s": w2 - w0,
                "cpu_s": c2 - c0,
                "generate_s": chunk.timings["generate_s"],
                "reward_s": chunk.timings["score_s"],
                "learner_s": w2 - w1,
                "generate_cpu_s": score_cpu[0] - cg,
                "reward_cpu_s": score_cpu[1] - score_cpu[0],
                "learner_cpu_s": c2 - c1,
                "reward": rl.metrics["reward_mean"],
                "kept_sequences": rl.metrics["kept_sequences"],
                "completion_tokens_mean": rl.metrics["completion_tokens_mean"],
                "lr": lr,
                "loss_rows": rows,
                "loss_prompt_tokens": prompt_tokens,
                "loss_completion_tokens": completion_tokens,
                "loss_positions_padded": (len(distinct) if shared else rows) * width_p + rows * width_c,
                "loss_prompt_shared": shared,
                "generated_tokens": sum(len(c) for c in batch.completion_ids),
            }
        )
    _serve_until_eof()
    _send({"done": True, "peak_rss_mb": _peak_rss_mb()})


def trl_worker(model_dir: str, steps: int, gradient_checkpointing: bool) -> None:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    from cascade.algo import warmup_lr_factor
    from cascade.config import ChatConfig
    from cascade.model.chat import encode_prompts
    from cascade.model.loading import load_policy

    problems, texts, domain = _problems_and_texts(model_dir)
    policy = load_policy(model_dir)
    tokenizer = policy.tokenizer
    n = min(len(problems), steps * PROMPTS_PER_STEP)
    order = [i for s in range(steps) for i in _step_problems(problems, s)][:n]
    want = encode_prompts(tokenizer, ChatConfig(), [problems[i].prompt for i in order[:64]], False)
    got = [list(ids) for ids in tokenizer(text=[texts[i] for i in order[:64]])["input_ids"]]
    if got != want:
        raise SystemExit("TRL's tokenization of the rendered prompts differs from Cascade's prompt ids")
    dataset = Dataset.from_dict({"prompt": [texts[i] for i in order], "problem_index": order})
    timing: dict[str, Any] = {}
    counts: dict[str, int] = {}
    rewards: list[float] = []

    def math_reward(
        prompts: list[str], completions: list[str], problem_index: list[int], **_: Any
    ) -> list[float]:
        t, c = time.perf_counter(), time.process_time()
        verdicts = domain.score_batch([problems[i] for i in problem_index], list(completions))
        values = [float(v.reward) for v in verdicts]
        rewards.append(sum(values) / len(values))
        timing["reward_s"] += time.perf_counter() - t
        timing["reward_cpu_s"] += time.process_time() - c
        return values

    class TimedGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            out = super()._generate_single_turn(*args, **kwargs)
            timing["generate_s"] += time.perf_counter() - t
            timing["generate_cpu_s"] += time.process_time() - c
            return out

        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            # Count what the loss forward runs on (cheap sums, inside the step). A truncated
            # row's completion mask is all zeros (mask_truncated_completions) yet its tokens go
            # through the forward: it ran to the budget, the padded width.
            pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
            rows, width_c = cm.shape
            truncated = int((cm.sum(dim=1) == 0).sum())
            counts["loss_rows"] = counts.get("loss_rows", 0) + rows
            counts["loss_prompt_tokens"] = counts.get("loss_prompt_tokens", 0) + int(pm.sum())
            completion = int(cm.sum()) + truncated * width_c
            counts["loss_completion_tokens"] = counts.get("loss_completion_tokens", 0) + completion
            counts["loss_positions_padded"] = counts.get("loss_positions_padded", 0) + rows * (
                pm.shape[1] + width_c
            )
            counts["generated_tokens"] = counts.get("generated_tokens", 0) + completion
            return super().compute_loss(model, inputs, *args, **kwargs)

    class Lockstep(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not _wait_go():
                control.should_training_stop = True
            timing.update(generate_s=0.0, reward_s=0.0, generate_cpu_s=0.0, reward_cpu_s=0.0)
            timing["lr"] = optim.param_groups[0]["lr"]
            counts.clear()
            self.w0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            w, c = time.perf_counter() - self.w0, time.process_time() - self.c0
            step = state.global_step - 1
            _send(
                {
                    "step": step,
                    "wall_s": w,
                    "cpu_s": c,
                    "generate_s": timing["generate_s"],
                    "reward_s": timing["reward_s"],
                    "learner_s": w - timing["generate_s"] - timing["reward_s"],
                    "generate_cpu_s": timing["generate_cpu_s"],
                    "reward_cpu_s": timing["reward_cpu_s"],
                    "learner_cpu_s": c - timing["generate_cpu_s"] - timing["reward_cpu_s"],
                    "reward": rewards[-1] if rewards else float("nan"),
                    "lr": timing["lr"],
                    "kept_sequences": counts.get("loss_rows", 0),
                    "gradient_checkpointing_active": bool(model.is_gradient_checkpointing),
                    **counts,
                }
            )

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optim = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: warmup_lr_factor(s, WARMUP_STEPS))
    out_dir = tempfile.mkdtemp(prefix="vs_trl-")
    args = trl.GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        seed=SEED,
        max_steps=steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        learning_rate=LEARNING_RATE,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=True,
        max_grad_norm=1.0,
        num_iterations=1,
        shuffle_dataset=False,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=False,
        # TRL 1.16's default is True; transformers 5 renamed it `activation_checkpointing` (the old
        # name an alias): both set, so neither default applies
        gradient_checkpointing=gradient_checkpointing,
        activation_checkpointing=gradient_checkpointing,
    )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=math_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Lockstep()],
        optimizers=(optim, sched),
    )
    if set(trainer.eos_token_ids) != set(policy.eos_token_ids):
        raise SystemExit(f"EOS ids differ: TRL {trainer.eos_token_ids}, Cascade {policy.eos_token_ids}")
    _send(
        {
            "ready": True,
            "rss_mb": _peak_rss_mb(),
            "dims": _model_dims(model),
            "gradient_checkpointing": args.gradient_checkpointing,
            "trl_default_gradient_checkpointing": next(
                f.default for f in dataclasses.fields(trl.GRPOConfig) if f.name == "gradient_checkpointing"
            ),
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }
    )
    trainer.train()
    _serve_until_eof()
    _send({"done": True, "peak_rss_mb": _peak_rss_mb()})


# --------------------------------------------------------------------------- coordinator side


class Worker:
    def __init__(self, kind: str, argv: list[str], log: Path) -> None:
        self.kind = kind
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", kind, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return dict(json.loads(line[len(PREFIX) :]))
        raise RuntimeError(f"{self.kind} worker exited (rc {self.proc.wait()}); see {self.log.name}")

    def tell(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        msg = self.read()
        self.proc.wait(timeout=120)
        self.log.close()
        return msg


KINDS = ("trl", "trl_no_checkpointing", "cascade", "cascade_all_groups")
"""`trl`: TRL 1.16's default `gradient_checkpointing=True` (the forward recomputed in the
backward); `trl_no_checkpointing`: `False`; `cascade`: the stage defaults (zero-variance groups
dropped from the loss); `cascade_all_groups`: every group through the loss, as TRL does."""

RATIOS: dict[str, tuple[str, str, str]] = {
    "speedup_same_work_vs_trl_no_checkpointing": (
        "trl_no_checkpointing",
        "cascade_all_groups",
        "the same work: TRL without gradient checkpointing vs Cascade putting every group through "
        "the loss (one forward per backward on both, the same rows generated and scored, every "
        "group in the loss); TRL time / Cascade time",
    ),
    "speedup_vs_trl_default_all_groups": (
        "trl",
        "cascade_all_groups",
        "TRL as it comes (gradient checkpointing on: the layers' forward recomputed in the "
        "backward) vs Cascade putting every group through the loss; TRL time / Cascade time",
    ),
    "speedup_stage_defaults_vs_trl_no_checkpointing": (
        "trl_no_checkpointing",
        "cascade",
        "TRL without gradient checkpointing vs Cascade's stage defaults (groups whose rewards are "
        "all equal, gradient 0 on every side, left out of Cascade's loss); TRL time / Cascade time",
    ),
    "speedup_stage_defaults_vs_trl_default": (
        "trl",
        "cascade",
        "TRL as it comes (gradient checkpointing on) vs Cascade's stage defaults (zero-variance "
        "groups left out of the loss); TRL time / Cascade time",
    ),
    "trl_checkpointing_cost": (
        "trl",
        "trl_no_checkpointing",
        "TRL with its default gradient checkpointing vs TRL without: how much time the recomputed "
        "forward costs TRL; checkpointed time / plain time",
    ),
}

MFU_FORMULA = {
    "peak_flops": (
        "best 2 n^3 / t over float32 torch.matmul of n x n matrices, n in (1024, 2048), timed in "
        "every worker process at the run's torch thread count, before the first step, halfway and "
        "after the last (one worker at a time, none stepping)"
    ),
    "update_model_flops": (
        "6 x N_body x T_forward + 6 x (d x V) x T_completion per step: N_body = parameters outside "
        "the token embedding and the output head; T_forward = real (unpadded) tokens the loss "
        "forward runs the layers on, prompts included (TRL: every row's prompt; Cascade: each "
        "distinct prompt once when its forward shares a group's prompt); d x V = the output "
        "head; T_completion = completion tokens of the loss's rows (TRL's truncated rows "
        "included: they go through its forward though masked out of its loss)"
    ),
    "update_mfu": "update_model_flops / (learner_s x peak_flops), median over steps",
    "update_mfu_cpu_time": (
        "the same over learner_cpu_s (the process's CPU time in that phase; with one torch thread "
        "the time it held a core, so less sensitive to other jobs on the machine)"
    ),
    "generate_model_flops": (
        "2 x (N_body + d x V) x generated tokens (all 128 rows); the prompts' prefill left out, so "
        "generation MFU is a lower bound"
    ),
    "generate_mfu": "generate_model_flops / (generate_s x peak_flops), median over steps",
    "generate_mfu_cpu_time": "the same over generate_cpu_s",
    "left_out": (
        "attention's score and value products (quadratic in the sequence length), norms, "
        "activations, rotary embeddings, softmax/log-softmax, the embedding lookup, the optimizer "
        "step; padding positions and the forward that gradient checkpointing recomputes (about "
        "2 x N_body x T_forward more per step for `trl`) are extra hardware work, not model FLOPs"
    ),
    "learner_s": (
        "TRL: the step less generation and reward (so it also holds TRL's batch preparation: "
        "padding, advantages); Cascade: rl_term + apply_update"
    ),
}


def _update_flops(row: dict[str, Any], dims: dict[str, Any]) -> float:
    forward = row["loss_prompt_tokens"] + row["loss_completion_tokens"]
    return float(6 * dims["params_body"] * forward + 6 * dims["head_d_x_v"] * row["loss_completion_tokens"])


def _generate_flops(row: dict[str, Any], dims: dict[str, Any]) -> float:
    return float(2 * (dims["params_body"] + dims["head_d_x_v"]) * row["generated_tokens"])


def _summary(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    timed = rows[SKIP:] or rows
    out: dict[str, Any] = {f"median_{k}": statistics.median(r[k] for r in timed) for k in keys}
    rewards = [r["reward"] for r in rows]
    out["reward_first10"] = statistics.fmean(rewards[:10])
    out["reward_last10"] = statistics.fmean(rewards[-10:])
    return out


def _ratios(t: dict[str, Any], c: dict[str, Any], compares: str) -> dict[str, Any]:
    """How many times longer the first side's medians are than the second's."""
    return {
        "compares": compares,
        "step_wall": t["median_wall_s"] / c["median_wall_s"],
        "step_cpu": t["median_cpu_s"] / c["median_cpu_s"],
        "generate": t["median_generate_s"] / c["median_generate_s"],
        "generate_and_reward": (t["median_generate_s"] + t["median_reward_s"])
        / (c["median_generate_s"] + c["median_reward_s"]),
        "learner": t["median_learner_s"] / c["median_learner_s"],
    }


def _rotation(step: int) -> tuple[str, ...]:
    shift = step % len(KINDS)  # who goes first rotates every step
    return KINDS[shift:] + KINDS[:shift]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each worker (equal for all)")
    ap.add_argument("--out", default="bench/results/vs_trl.json")
    ap.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        if args.worker.startswith("trl"):
            trl_worker(args.model, args.steps, gradient_checkpointing=args.worker == "trl")
        else:
            cascade_worker(args.model, args.steps, keep_zero_variance=args.worker == "cascade_all_groups")
        return

    if not (Path(args.model) / "config.json").exists():
        raise SystemExit(
            f"{args.model}: no model; run `cascade model init --out {args.model}` (make bench-trl does)"
        )
    argv = ["--model", args.model, "--steps", str(args.steps), "--threads", str(args.threads)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="vs_trl-logs-"))
    load_start = os.getloadavg()
    workers = {k: Worker(k, argv, logs / f"{k}.log") for k in KINDS}
    ready = {k: w.read() for k, w in workers.items()}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    peaks: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}

    def measure_peaks(step: int) -> None:
        for kind in _rotation(step):
            peaks[kind].append({"before_step": step, **workers[kind].tell("peak")})

    t0 = time.perf_counter()
    for step in range(args.steps):
        if step in (0, args.steps // 2):
            measure_peaks(step)
        for kind in _rotation(step):
            rows[kind].append(workers[kind].tell("step"))
        print(
            f"step {step:3d}  "
            + "  |  ".join(
                f"{k} {rows[k][-1]['wall_s']:.3f}s/{rows[k][-1]['cpu_s']:.3f}cpu "
                f"(gen {rows[k][-1]['generate_s']:.3f}) reward {rows[k][-1]['reward']:.3f}"
                for k in KINDS
            ),
            flush=True,
        )
    measure_peaks(args.steps)
    finals = {k: w.finish() for k, w in workers.items()}
    load_end = os.getloadavg()
    run_wall = time.perf_counter() - t0

    peak = max(p["flops"] for ps in peaks.values() for p in ps)
    keys = (
        "wall_s",
        "cpu_s",
        "generate_s",
        "reward_s",
        "learner_s",
        "generate_cpu_s",
        "reward_cpu_s",
        "learner_cpu_s",
    )
    summary = {k: _summary(rows[k], keys) for k in KINDS}
    for k in KINDS:
        dims = ready[k]["dims"]
        timed = rows[k][SKIP:] or rows[k]
        s = summary[k]
        s["peak_rss_mb"] = finals[k]["peak_rss_mb"]
        s["rss_after_setup_mb"] = ready[k]["rss_mb"]
        s["mean_kept_sequences"] = statistics.fmean(r["kept_sequences"] for r in rows[k])
        for field in (
            "loss_prompt_tokens",
            "loss_completion_tokens",
            "loss_positions_padded",
            "generated_tokens",
        ):
            s[f"mean_{field}"] = statistics.fmean(r[field] for r in rows[k])
        s["median_update_model_gflop"] = statistics.median(_update_flops(r, dims) for r in timed) / 1e9
        s["median_update_mfu"] = statistics.median(
            _update_flops(r, dims) / (r["learner_s"] * peak) for r in timed
        )
        s["median_update_mfu_cpu_time"] = statistics.median(
            _update_flops(r, dims) / (r["learner_cpu_s"] * peak) for r in timed
        )
        s["median_generate_model_gflop"] = statistics.median(_generate_flops(r, dims) for r in timed) / 1e9
        s["median_generate_mfu"] = statistics.median(
            _generate_flops(r, dims) / (r["generate_s"] * peak) for r in timed
        )
        s["median_generate_mfu_cpu_time"] = statistics.median(
            _generate_flops(r, dims) / (r["generate_cpu_s"] * peak) for r in timed
        )
        s["peak_gflops_measured_here"] = [p["flops"] / 1e9 for p in peaks[k]]
        if k.startswith("trl"):
            s["gradient_checkpointing"] = ready[k]["gradient_checkpointing"]
            s["gradient_checkpointing_as_set_every_step"] = all(
                r["gradient_checkpointing_active"] == ready[k]["gradient_checkpointing"] for r in rows[k]
            )
        else:
            s["loss_prompt_shared_steps"] = sum(bool(r["loss_prompt_shared"]) for r in rows[k])
    ratios = {name: _ratios(summary[a], summary[b], what) for name, (a, b, what) in RATIOS.items()}
    dims = ready["cascade"]["dims"]
    result = {
        "what": (
            "one GRPO step (16 prompts x 8 completions, <= 24 new tokens, math reward, token-level loss, "
            "no KL, AdamW) on the tiny model on a CPU: TRL's GRPOTrainer with and without gradient "
            "checkpointing vs Cascade's embedded step with and without its zero-variance filter, "
            "stepped in lockstep, each in its own process; every ratio is first side's median / "
            "second side's median and says what it compares"
        ),
        "steps": args.steps,
        "medians_skip_first": SKIP,
        "workers": {
            "trl": "TRL GRPOTrainer, gradient_checkpointing=True (TRL 1.16's GRPOConfig default), bf16=False",
            "trl_no_checkpointing": "TRL GRPOTrainer, gradient_checkpointing=False, bf16=False",
            "cascade": "Cascade's embedded step, stage defaults: zero-variance groups dropped from the loss",
            "cascade_all_groups": "Cascade's embedded step with every group through the loss, as TRL does",
        },
        **ratios,
        "mfu": {
            "peak_gflops": peak / 1e9,
            "peak_threads": args.threads,
            "update": {k: summary[k]["median_update_mfu"] for k in KINDS},
            "update_cpu_time": {k: summary[k]["median_update_mfu_cpu_time"] for k in KINDS},
            "generate": {k: summary[k]["median_generate_mfu"] for k in KINDS},
            "generate_cpu_time": {k: summary[k]["median_generate_mfu_cpu_time"] for k in KINDS},
            "model": dims,
            "formula": MFU_FORMULA,
        },
        **summary,
        "peak_measurements": peaks,
        "settings": {
            "model": args.model,
            "prompts_per_step": PROMPTS_PER_STEP,
            "group_size": GROUP,
            "max_new_tokens": MAX_NEW_TOKENS,
            "learning_rate": LEARNING_RATE,
            "warmup_steps": WARMUP_STEPS,
            "beta": 0.0,
            "clip": [0.2, 0.28],
            "cascade_loss_aggregation": "token (per-group token mean, averaged over groups)",
            "trl_loss_type": "dapo (token sum / tokens in the batch; = bnpo with one process)",
            "trl_default_gradient_checkpointing": ready["trl"]["trl_default_gradient_checkpointing"],
            "truncated_completions": (
                "masked out of the loss on every side (Cascade leaves those rows out of its forward; "
                "TRL runs them through it with a zero mask)"
            ),
            "torch_threads": args.threads,
            "versions": {k: ready["trl"][k] for k in ("trl", "transformers", "torch")},
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "wall_s": run_wall,
            "note": (
                "a shared machine: other jobs ran alongside; the trainers take turns step by step, so "
                "load hits all alike, and CPU-time medians (step_cpu) are less load-sensitive"
            ),
        },
        "per_step": rows,
    }
    out.write_text(json.dumps(result, indent=1))
    for name in RATIOS:
        r = ratios[name]
        print(
            f"{name}: {r['step_wall']:.2f}x wall, {r['step_cpu']:.2f}x CPU "
            f"(generation {r['generate']:.2f}x, learner {r['learner']:.2f}x)"
        )
    print(f"peak {peak / 1e9:.1f} GFLOP/s at {args.threads} thread(s)")
    for k in KINDS:
        s = summary[k]
        print(
            f"{k}: step {s['median_wall_s']:.3f}s ({s['median_cpu_s']:.3f}s CPU), update MFU "
            f"{s['median_update_mfu']:.1%} ({s['median_update_mfu_cpu_time']:.1%} on CPU time), "
            f"generation MFU {s['median_generate_mfu']:.1%} ({s['median_generate_mfu_cpu_time']:.1%}), "
            f"reward first/last 10 {s['reward_first10']:.3f}/{s['reward_last10']:.3f}, "
            f"peak RSS {s['peak_rss_mb']:.0f} MB"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
