"""Benchmark: the same GRPO stage through TRL's `GRPOTrainer` and through Cascade, in lockstep.

Usage: `make bench-trl` (installs the `bench-trl` extra), or
`.venv/bin/python bench/vs_trl.py [--model models/tiny] [--steps 100] [--threads 1]`.
Writes `bench/results/vs_trl.json`.

The work, identical on both sides: the tiny local model (float32, CPU), the math domain's train
prompts in order (16 per step, no shuffling, so both sides see the same prompts at the same
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

Cascade runs twice, as two workers: `cascade` with its stage defaults, which drop groups whose
rewards are all equal from the loss (`filter.drop_zero_variance`; their advantages, hence their
gradient, are 0 on every side, but TRL still runs them through the forward and backward), and
`cascade_all_groups`, which puts every sequence through the loss as TRL does (the same work,
row for row). The report has a speedup for each and the mean number of sequences kept.

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
left out, as TRL's logging is). Medians leave out the first two steps (first-call costs).
"""

from __future__ import annotations

import argparse
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


# --------------------------------------------------------------------------- worker side


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _wait_go() -> bool:
    line = sys.stdin.readline()
    return line.strip() == "step"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


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
    from cascade.model.chat import encode_prompts
    from cascade.model.loading import load_policy
    from cascade.rollout.policy import PolicyGenerate
    from cascade.rollout.requests import PromptRequest, merge_chunks, problem_fields
    from cascade.rollout.scoring import generate_and_score
    from cascade.runner.optimizer_step import apply_update
    from cascade.runner.rl import rl_term

    problems, _, domain = _problems_and_texts(model_dir)
    policy = load_policy(model_dir)
    policy.model.train()
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

    def score(_d: str, probs: list[Any], texts: list[str], _c: dict[str, Any] | None) -> list[Any]:
        return domain.score_batch(probs, texts)  # type: ignore[no-any-return]

    _send({"ready": True, "rss_mb": _peak_rss_mb()})
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
        chunk = generate_and_score(req, generate_fn=engine, decode=decode, score=score, worker="bench")
        batch = merge_chunks([req], [chunk], policy_version=step, temperature=cfg.temperature)
        w1 = time.perf_counter()
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
        _send(
            {
                "step": step,
                "wall_s": w2 - w0,
                "cpu_s": c2 - c0,
                "generate_s": chunk.timings["generate_s"],
                "reward_s": chunk.timings["score_s"],
                "learner_s": w2 - w1,
                "reward": rl.metrics["reward_mean"],
                "kept_sequences": rl.metrics["kept_sequences"],
                "completion_tokens_mean": rl.metrics["completion_tokens_mean"],
                "lr": lr,
            }
        )
    _send({"done": True, "peak_rss_mb": _peak_rss_mb()})


def trl_worker(model_dir: str, steps: int) -> None:
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
    timing: dict[str, float] = {"generate_s": 0.0, "reward_s": 0.0}
    rewards: list[float] = []

    def math_reward(
        prompts: list[str], completions: list[str], problem_index: list[int], **_: Any
    ) -> list[float]:
        t = time.perf_counter()
        verdicts = domain.score_batch([problems[i] for i in problem_index], list(completions))
        values = [float(v.reward) for v in verdicts]
        rewards.append(sum(values) / len(values))
        timing["reward_s"] += time.perf_counter() - t
        return values

    class TimedGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = super()._generate_single_turn(*args, **kwargs)
            timing["generate_s"] += time.perf_counter() - t
            return out

    class Lockstep(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not _wait_go():
                control.should_training_stop = True
            timing.update(generate_s=0.0, reward_s=0.0, lr=optim.param_groups[0]["lr"])
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
                    "reward": rewards[-1] if rewards else float("nan"),
                    "lr": timing["lr"],
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
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }
    )
    trainer.train()
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

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read()

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        msg = self.read()
        self.proc.wait(timeout=120)
        self.log.close()
        return msg


def _summary(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    timed = rows[SKIP:] or rows
    out = {f"median_{k}": statistics.median(r[k] for r in timed) for k in keys}
    rewards = [r["reward"] for r in rows]
    out["reward_first10"] = statistics.fmean(rewards[:10])
    out["reward_last10"] = statistics.fmean(rewards[-10:])
    return out


KINDS = ("trl", "cascade", "cascade_all_groups")
"""`cascade`: the stage defaults (zero-variance groups dropped from the loss);
`cascade_all_groups`: every sequence through the loss, as TRL does (the same work row for row)."""


def _speedups(t: dict[str, float], c: dict[str, float]) -> dict[str, float]:
    """How many times faster Cascade's medians are than TRL's (TRL time / Cascade time)."""
    return {
        "step_wall": t["median_wall_s"] / c["median_wall_s"],
        "step_cpu": t["median_cpu_s"] / c["median_cpu_s"],
        "generate": t["median_generate_s"] / c["median_generate_s"],
        "generate_and_reward": (t["median_generate_s"] + t["median_reward_s"])
        / (c["median_generate_s"] + c["median_reward_s"]),
        "learner": t["median_learner_s"] / c["median_learner_s"],
    }


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
        if args.worker == "trl":
            trl_worker(args.model, args.steps)
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
    t0 = time.perf_counter()
    for step in range(args.steps):
        shift = step % len(KINDS)  # who goes first rotates every step
        for kind in KINDS[shift:] + KINDS[:shift]:
            rows[kind].append(workers[kind].go())
        print(
            f"step {step:3d}  "
            + "  |  ".join(
                f"{k} {rows[k][-1]['wall_s']:.3f}s (gen {rows[k][-1]['generate_s']:.3f}) "
                f"reward {rows[k][-1]['reward']:.3f}"
                for k in KINDS
            ),
            flush=True,
        )
    finals = {k: w.finish() for k, w in workers.items()}
    load_end = os.getloadavg()
    keys = ("wall_s", "cpu_s", "generate_s", "reward_s", "learner_s")
    summary = {k: _summary(rows[k], keys) for k in KINDS}
    for k in KINDS:
        summary[k]["peak_rss_mb"] = finals[k]["peak_rss_mb"]
        summary[k]["rss_after_setup_mb"] = ready[k]["rss_mb"]
        if k != "trl":
            summary[k]["mean_kept_sequences"] = statistics.fmean(r["kept_sequences"] for r in rows[k])
    t = summary["trl"]
    result = {
        "what": (
            "one GRPO step (16 prompts x 8 completions, <= 24 new tokens, math reward, token-level loss, "
            "no KL, AdamW) on the tiny model on a CPU: TRL's GRPOTrainer vs Cascade's embedded step, "
            "stepped in lockstep, each in its own process; speedup = TRL median / Cascade median"
        ),
        "steps": args.steps,
        "medians_skip_first": SKIP,
        "speedup": _speedups(t, summary["cascade"]),
        "speedup_all_groups": _speedups(t, summary["cascade_all_groups"]),
        **summary,
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
            "cascade": "stage defaults: zero-variance groups dropped from the loss (their gradient is 0)",
            "cascade_all_groups": "every sequence through the loss forward/backward, as TRL does",
            "truncated_completions": "masked out of the loss on every side",
            "torch_threads": args.threads,
            "versions": {k: ready["trl"][k] for k in ("trl", "transformers", "torch")},
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "wall_s": time.perf_counter() - t0,
            "note": (
                "a shared machine: other jobs ran alongside; the trainers take turns step by step, so "
                "load hits all alike, and CPU-time medians (step_cpu) are less load-sensitive"
            ),
        },
        "per_step": rows,
    }
    out.write_text(json.dumps(result, indent=1))
    for k in ("cascade", "cascade_all_groups"):
        sp, c = result["speedup" if k == "cascade" else "speedup_all_groups"], summary[k]
        print(
            f"{k}: step {c['median_wall_s']:.3f}s vs trl {t['median_wall_s']:.3f}s -> "
            f"{sp['step_wall']:.2f}x faster (CPU time {sp['step_cpu']:.2f}x; "
            f"generation {sp['generate']:.2f}x, learner {sp['learner']:.2f}x); "
            f"reward first/last 10 {c['reward_first10']:.3f}/"
            f"{c['reward_last10']:.3f} (trl {t['reward_first10']:.3f}/{t['reward_last10']:.3f})"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
