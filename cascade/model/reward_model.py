"""A tiny reward model for the toy "rlhf" domain, built locally from nothing.

The preference data is synthetic and deterministic in the seed: a prompt asks for a polite
reply to a request (`Reply politely to: please open the door`); the chosen response is
polite, on-topic and concise (`Of course! I will open the door for you. Have a nice day.`),
and each prompt carries three rejected responses: rude, off-topic (polite but about
something else) and rambling (fillers and digressions around the request).

`build_tiny_reward_model` trains a byte-level tokenizer (or reuses one), a small
`Qwen3ForSequenceClassification` with one output (the scalar reward, read at the last
non-pad token), fits it with the Bradley-Terry loss `-log sigmoid(r_chosen - r_rejected)` on
the "train" split and reports pairwise accuracy on the held-out "eval" split.
"""

from __future__ import annotations

import json
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

from cascade.domains.base import Problem
from cascade.domains.common import Candidate, generate_problems
from cascade.model.tokenizer import train_tokenizer

RLHF_DOMAIN = "rlhf"

_VERBS = (
    "open", "close", "clean", "fix", "find", "bring", "check", "paint",
    "move", "fold", "carry", "lock",
)  # fmt: skip
_OBJECTS = (
    "the door", "the window", "my desk", "the report", "the lamp", "a chair", "the garden",
    "my bike", "the map", "the box", "the car", "my coat", "the shelf", "the gate",
    "the letter", "the kettle",
)  # fmt: skip
_TEMPLATES = ("please {req}", "can you {req}?", "{req} now")
_OPENERS = ("Of course!", "Certainly.", "Sure, happy to help.", "Gladly.")
_CLOSERS = ("Have a nice day.", "Thank you for asking.", "Glad to help.", "Take care.")
_RUDE_OPENERS = ("No way.", "Ugh, whatever.", "Stop bothering me.", "Not my problem.")
_RUDE_CLOSERS = ("Go away.", "Leave me alone.", "How annoying.", "Figure it out, idiot.")
_FACTS = (
    "the moon is very far away",
    "cats sleep most of the day",
    "bananas are rich in potassium",
    "the sea looks blue on sunny days",
    "trains were once pulled by steam engines",
    "honey never really spoils",
    "owls can turn their heads a long way",
    "snow is made of tiny ice crystals",
)
REJECTED_KINDS = ("rude", "off_topic", "rambling")


def draw_rlhf_problem(rng: random.Random) -> Candidate:
    """One prompt with a chosen response (the answer) and one rejected response per kind."""
    req = f"{rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    prompt = "Reply politely to: " + rng.choice(_TEMPLATES).format(req=req)
    chosen = f"{rng.choice(_OPENERS)} I will {req} for you. {rng.choice(_CLOSERS)}"
    fact_a, fact_b = rng.sample(_FACTS, 2)
    rejected = {
        "rude": f"{rng.choice(_RUDE_OPENERS)} {req.capitalize()} yourself. {rng.choice(_RUDE_CLOSERS)}",
        "off_topic": f"{rng.choice(_OPENERS)} Did you know that {fact_a}? Also, {fact_b}.",
        "rambling": (
            f"{rng.choice(_OPENERS)} Um, well, so, you know, I guess I could maybe {req}, but first "
            f"let me tell you that {fact_a}, and also {fact_b}, and basically, anyway, who knows, "
            f"it is a long story, um, where was I."
        ),
    }
    meta: dict[str, Any] = {"rejected": [rejected[k] for k in REJECTED_KINDS], "kinds": list(REJECTED_KINDS)}
    return prompt, chosen, meta


def make_rlhf_problems(split: str, n: int, seed: int) -> list[Problem]:
    """`n` deterministic "rlhf" problems; splits are disjoint by `sha256(prompt) % 8` (see `common`).

    `answer` is the chosen response; `meta["rejected"]` holds the rejected ones (kinds in
    `meta["kinds"]`). The prompt space holds 576 prompts (about 72 of them in "eval").
    """
    return generate_problems(RLHF_DOMAIN, split, n, seed, draw_rlhf_problem)


def format_rm_input(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    """The text the reward model reads: the chat-rendered (prompt, response) exchange."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if isinstance(text, str):
            return text
    return f"{prompt}\n{response}"


def preference_pairs(problems: Sequence[Problem]) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) for every rejected response of every problem."""
    return [(p.prompt, p.answer, r) for p in problems for r in p.meta.get("rejected", [])]


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    enc = tokenizer(
        texts,
        add_special_tokens=False,
        padding=True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@torch.no_grad()
def pairwise_accuracy(
    model: Qwen3ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str, str]],
    batch_size: int = 64,
    max_length: int = 256,
) -> float:
    """Share of pairs whose chosen response gets a strictly higher reward than the rejected one."""
    if not pairs:
        return 0.0
    was_training = model.training
    model.eval()
    wins = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        texts = [format_rm_input(tokenizer, p, c) for p, c, _ in chunk]
        texts += [format_rm_input(tokenizer, p, r) for p, _, r in chunk]
        rewards = model(**_encode(tokenizer, texts, max_length)).logits[:, 0]
        k = len(chunk)
        wins += int((rewards[:k] > rewards[k:]).sum())
    model.train(was_training)
    return wins / len(pairs)


def build_tiny_reward_model(
    out_dir: Path | str,
    *,
    seed: int = 0,
    steps: int = 60,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    tokenizer_dir: Path | str | None = None,
    hidden_size: int = 64,
    layers: int = 2,
    max_length: int = 256,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Train and save a tiny Bradley-Terry reward model; returns its metrics.

    Trains on the "train" split's preference pairs, measures pairwise accuracy on the "eval"
    split (held out: disjoint prompts), saves model (safetensors) + tokenizer + `rm_metrics.json`
    to `out_dir`. Runs on CPU in a few seconds with the defaults.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    rng = random.Random(f"rm-{seed}")
    torch.manual_seed(seed)
    train_problems = make_rlhf_problems("train", 250, seed)
    eval_problems = make_rlhf_problems("eval", 60, seed)
    train_pairs = preference_pairs(train_problems)
    eval_pairs = preference_pairs(eval_problems)

    tokenizer: PreTrainedTokenizerBase
    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    else:
        corpus = [f"{p}\n{c}\n{r}" for p, c, r in train_pairs]
        tokenizer = train_tokenizer(corpus, vocab_size=384)
    if tokenizer.pad_token_id is None:
        raise ValueError("the reward model's tokenizer needs a pad token")
    # Right padding: with a causal model the pad tokens after the text change nothing, and
    # the reward is read at the last non-pad token.
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"

    heads = 4
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
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
        texts = [format_rm_input(tokenizer, p, c) for p, c, _ in chunk]
        texts += [format_rm_input(tokenizer, p, r) for p, _, r in chunk]
        rewards = model(**_encode(tokenizer, texts, max_length)).logits[:, 0]
        k = len(chunk)
        loss = -F.logsigmoid(rewards[:k] - rewards[k:]).mean()
        for group in optim.param_groups:
            group["lr"] = learning_rate * min(1.0, step / warmup)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        loss_value = float(loss.detach())
        if step % 20 == 0 or step == steps:
            log(f"rm step {step}: loss {loss_value:.4f}")

    metrics: dict[str, Any] = {
        "steps": steps,
        "seed": seed,
        "n_parameters": n_params,
        "train_pairs": len(train_pairs),
        "eval_pairs": len(eval_pairs),
        "final_loss": loss_value,
        "train_pairwise_accuracy": pairwise_accuracy(model, tokenizer, train_pairs, max_length=max_length),
        "eval_pairwise_accuracy": pairwise_accuracy(model, tokenizer, eval_pairs, max_length=max_length),
    }
    metrics["seconds"] = round(time.perf_counter() - started, 2)
    log(
        f"rm: held-out pairwise accuracy {metrics['eval_pairwise_accuracy']:.1%} "
        f"(train {metrics['train_pairwise_accuracy']:.1%}) in {metrics['seconds']}s"
    )
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "rm_metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics
