"""A tiny reward model for the toy "rlhf" domain, built locally from nothing.

The preference data (`cascade.domains.rlhf_preferences`) is synthetic and deterministic in
the seed: each prompt asks for a polite reply to a request, the chosen response is the polite,
on-request, concise reply, and each prompt carries one rejected response per kind: bad
replies (rude, off-topic, rambling) and the hacks a policy finds once the polite frame alone
is paid (another request's reply, padding, repetition, closers only, the prompt echoed,
reasoning with no reply, junk after the reply, the reply cut off, ...).

`build_tiny_reward_model` trains a byte-level tokenizer (or reuses one), a small
`Qwen3ForSequenceClassification` with one output (the scalar reward, read at the last
non-pad token), fits it with the Bradley-Terry loss `-log sigmoid(r_chosen - r_rejected)` on
the "train" split and reports pairwise accuracy, overall and per rejected kind, on the
held-out "eval" split (disjoint prompts).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForSequenceClassification,
)

from cascade.accel import torch_threads
from cascade.bootstrap.tokenizer import train_tokenizer
from cascade.domains.rlhf_preferences import (
    REJECTED_KINDS,
    PreferencePair,
    make_rlhf_problems,
    preference_pairs,
)
from cascade.model.files import as_umask_allows
from cascade.model.reward_model import format_rm_input, rewards_of

__all__ = [
    "REJECTED_KINDS",
    "build_tiny_reward_model",
    "format_rm_input",
    "make_rlhf_problems",
    "pairwise_accuracy",
    "pairwise_margins",
    "preference_pairs",
    "report_by_kind",
    "rewards_of",
]


@torch.no_grad()
def pairwise_margins(
    model: Qwen3ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[PreferencePair],
    max_length: int = 256,
) -> list[float]:
    """Per pair: reward of the chosen response minus reward of the rejected one.

    Each distinct text is scored once (a prompt's chosen response recurs in every pair).
    """
    chosen = [format_rm_input(tokenizer, p.prompt, p.chosen) for p in pairs]
    rejected = [format_rm_input(tokenizer, p.prompt, p.rejected) for p in pairs]
    unique = list(dict.fromkeys(chosen + rejected))
    was_training = model.training
    model.eval()
    scores = rewards_of(model, tokenizer, unique, max_length=max_length, bucket_size=64).tolist()
    model.train(was_training)
    reward = dict(zip(unique, scores, strict=True))
    return [reward[c] - reward[r] for c, r in zip(chosen, rejected, strict=True)]


def pairwise_accuracy(
    model: Qwen3ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[PreferencePair],
    max_length: int = 256,
) -> float:
    """Share of pairs whose chosen response gets a strictly higher reward than the rejected one."""
    margins = pairwise_margins(model, tokenizer, pairs, max_length=max_length)
    return sum(m > 0 for m in margins) / len(margins) if margins else 0.0


def report_by_kind(pairs: Sequence[PreferencePair], margins: Sequence[float]) -> dict[str, dict[str, float]]:
    """Per rejected kind (in order of first appearance): how surely the chosen response wins.

    `accuracy`: share of pairs the chosen response wins strictly. `rejected_win_probability`:
    mean Bradley-Terry probability that the rejected response beats the chosen one,
    `sigmoid(r_rejected - r_chosen)`, which is the reward the rlhf domain pays the rejected
    response with `baseline: reference` (the chosen response is the reference; it gets 0.5).
    A hack that wins no pair but sits just below the reference still earns about 0.5: this is
    the figure that says whether it costs anything.
    """
    by_kind: dict[str, list[float]] = {}
    for pair, margin in zip(pairs, margins, strict=True):
        by_kind.setdefault(pair.kind, []).append(margin)
    return {
        kind: {
            "accuracy": sum(m > 0 for m in ms) / len(ms),
            "rejected_win_probability": sum(1.0 / (1.0 + math.exp(min(m, 60.0))) for m in ms) / len(ms),
        }
        for kind, ms in by_kind.items()
    }


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup, then linear decay to a tenth of the peak at the last step."""
    if step <= warmup:
        return step / warmup
    return 1.0 - 0.9 * (step - warmup) / max(1, steps - warmup)


def build_tiny_reward_model(
    out_dir: Path | str,
    *,
    seed: int = 0,
    steps: int = 240,
    batch_size: int = 32,
    learning_rate: float = 5e-3,
    tokenizer_dir: Path | str | None = None,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_length: int = 256,
    vocab_size: int = 640,
    kinds: Sequence[str] = REJECTED_KINDS,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Train and save a tiny Bradley-Terry reward model; returns its metrics.

    Trains on the "train" split's preference pairs whose rejected kind is in `kinds` (all by
    default; `kinds=ORIGINAL_KINDS, steps=60, learning_rate=3e-3, vocab_size=384` is the first
    preference data and budget, whose model paid the polite frame whatever was asked), measures
    pairwise accuracy on the "eval" split (held out: disjoint prompts) over every kind, overall
    and per kind, whatever it was trained on, and saves model (safetensors) + tokenizer +
    `rm_metrics.json` to `out_dir`.

    The defaults are sized for the off-request kinds, which the model learns last (it must match
    the reply's request to the prompt's): 240 steps with a decaying learning rate, and a vocabulary
    large enough that every request word is one token. About 30 CPU-seconds.

    Torch runs on `threads` threads meanwhile (restored after): this model's operations are too
    small to split, and on a loaded machine a second thread made the build several times slower.
    """
    with torch_threads(threads):
        started, started_cpu = time.perf_counter(), time.process_time()
        out = Path(out_dir)
        rng = random.Random(f"rm-{seed}")
        torch.manual_seed(seed)
        train_problems = make_rlhf_problems("train", 250, seed)
        eval_problems = make_rlhf_problems("eval", 60, seed)
        train_pairs = preference_pairs(train_problems, kinds)
        eval_pairs = preference_pairs(eval_problems)

        tokenizer: PreTrainedTokenizerBase
        if tokenizer_dir is not None:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        else:
            corpus = [f"{p.prompt}\n{p.chosen}\n{p.rejected}" for p in train_pairs]
            tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
        if tokenizer.pad_token_id is None:
            raise ValueError("the reward model's tokenizer needs a pad token")
        # Right padding: with a causal model the pad tokens after the text change nothing, and
        # the reward is read at the last non-pad token.
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "left"

        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=hidden_size // heads,
            intermediate_size=hidden_size * 3,
            max_position_embeddings=max_length,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        config.num_labels = 1  # one output: the scalar reward
        model = Qwen3ForSequenceClassification(config)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"tiny reward model: {n_params / 1e6:.2f}M parameters, {len(train_pairs)} train pairs")

        optim = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
        warmup = max(1, steps // 10)
        model.train()
        loss_value = float("nan")
        for step in range(1, steps + 1):
            chunk = rng.sample(train_pairs, min(batch_size, len(train_pairs)))
            texts = [format_rm_input(tokenizer, p.prompt, p.chosen) for p in chunk]
            texts += [format_rm_input(tokenizer, p.prompt, p.rejected) for p in chunk]
            rewards = rewards_of(model, tokenizer, texts, max_length=max_length)
            k = len(chunk)
            loss = -F.logsigmoid(rewards[:k] - rewards[k:]).mean()
            for group in optim.param_groups:
                group["lr"] = learning_rate * _lr_factor(step, steps, warmup)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            loss_value = float(loss.detach())
            if step % 20 == 0 or step == steps:
                log(f"rm step {step}: loss {loss_value:.4f}")

        # Train accuracy on the first 20 train prompts only: scoring all ~6k pairs would cost
        # about as much as the training itself.
        train_probe = preference_pairs(train_problems[:20], kinds)
        eval_margins = pairwise_margins(model, tokenizer, eval_pairs, max_length=max_length)
        by_kind = report_by_kind(eval_pairs, eval_margins)
        metrics: dict[str, Any] = {
            "steps": steps,
            "seed": seed,
            "n_parameters": n_params,
            "kinds": list(dict.fromkeys(p.kind for p in train_pairs)),
            "train_pairs": len(train_pairs),
            "eval_pairs": len(eval_pairs),
            "final_loss": loss_value,
            "train_pairwise_accuracy": pairwise_accuracy(
                model, tokenizer, train_probe, max_length=max_length
            ),
            "eval_pairwise_accuracy": sum(m > 0 for m in eval_margins) / len(eval_margins),
            "eval_by_kind": by_kind,
        }
        metrics["seconds"] = round(time.perf_counter() - started, 2)
        metrics["cpu_seconds"] = round(time.process_time() - started_cpu, 2)
        log(
            f"rm: held-out pairwise accuracy {metrics['eval_pairwise_accuracy']:.1%} "
            f"(train {metrics['train_pairwise_accuracy']:.1%}) in {metrics['seconds']}s; per kind: "
            + ", ".join(f"{k} {v['accuracy']:.0%}" for k, v in by_kind.items())
        )
        out.mkdir(parents=True, exist_ok=True)
        model.eval()
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        as_umask_allows(out)
        (out / "rm_metrics.json").write_text(json.dumps(metrics, indent=2))
        return metrics
