"""`cascade model init`: build the tiny policy locally, from nothing.

Trains a tokenizer on the synthetic data, creates a small Qwen3 causal LM (a real
`transformers` architecture), and supervised-tunes it on reference answers of every toy
domain until a stopping rule says it is a useful RL starting point: every domain at or above
`floor`, none meant to be near perfect. Domains that pass `ceiling` get a smaller share of the
SFT mix, because the useful window is narrow (8% -> 80% within 100 steps was seen here).

Two named specs (`SPECS`): `tiny` (the default: math, code, if; what `make demo` runs on) and
`full` (all five domains in the paper's order, what `make demo-full` runs on). The `full` one
needs a reward model to score its "rlhf" validation problems: `cascade model init --spec full`
builds the tiny one first (`reward_model.build_tiny_reward_model`) into `<out>/reward_model`.
Its swe prompts (a whole Python file) and patches are long, so it has a larger vocabulary and
context, batches one domain at a time (a swe example would otherwise pad every batch to ~350
tokens), and its stop rule has one floor per domain plus a step bound.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from cascade.bootstrap.sft_traces import tool_markers, trace_completion
from cascade.bootstrap.tokenizer import train_tokenizer
from cascade.config import ChatConfig, DomainConfig, RlhfReward
from cascade.domains import make_domain
from cascade.domains.agent import default_format, prompt_tools
from cascade.domains.base import Domain, Problem
from cascade.engine.batch import build_batch, right_pad
from cascade.engine.logprobs import completion_logits, gather_logprobs
from cascade.eval.evaluate import evaluate_domain
from cascade.model.chat import render_prompt, token_encoder
from cascade.model.files import as_umask_allows
from cascade.model.loading import Policy
from cascade.rollout.policy import PolicyGenerate
from cascade.tools.template import TOOL_CHAT_TEMPLATE, format_of_tokenizer, template_renderer

TINY_DOMAINS = ("math", "code", "if")


@dataclass(frozen=True)
class TinyModelSpec:
    seed: int = 0
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    vocab_size: int = 384
    max_positions: int = 256
    sft_problems_per_domain: int = 3000
    val_problems_per_domain: int = 64
    batch_size: int = 48
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    decay_to: float | None = None
    """Cosine-decay the learning rate after warmup to this fraction of it at `max_steps`; None
    keeps it constant. `FULL_SPEC` says why it decays."""
    max_steps: int = 2500
    eval_every: int = 100
    min_steps: int = 100
    floor: float = 0.2
    """Stop once every domain's greedy validation score reaches this."""
    ceiling: float = 0.6
    """A domain above this gets `ceiling_weight` of the SFT mix."""
    ceiling_weight: float = 0.1
    thinking_fraction: float = 0.1
    """Share of SFT examples rendered with the think flag (empty think block)."""
    domains: tuple[str, ...] = TINY_DOMAINS
    mix: tuple[float, ...] = (3.0, 2.0, 1.0)
    """SFT sampling weight per domain (arithmetic needs the most steps, IF the fewest)."""
    floors: tuple[float, ...] = ()
    """Per-domain floors of the stop rule, aligned with `domains`; empty = `floor` for each."""
    ceilings: tuple[float, ...] = ()
    """Per-domain ceilings, aligned with `domains`; empty = `ceiling` for each."""
    sft_problems: tuple[int, ...] = ()
    """Per-domain SFT problem counts, aligned with `domains`; empty = `sft_problems_per_domain`
    for each (the rlhf generator holds only ~220 "sft" prompts)."""
    batch_by_domain: bool = False
    """Draw each step's domain by `mix`, then a whole batch from it (instead of mixing domains
    in a batch), so short examples are not padded to the longest domain's length."""
    batch_sizes: tuple[int, ...] = ()
    """With `batch_by_domain`: per-domain batch sizes aligned with `domains` (empty = `batch_size`)."""
    eval_max_new_tokens: int = 48
    """Greedy budget of the validation evals (a swe patch needs ~110 tokens)."""
    tool_tokens: bool = False
    """The chat template's tool markers (`<tool_call>`, `<tool_response>`, their closings) are one
    token each, as in Qwen3's vocabulary, instead of ~7 BPE pieces."""

    def __post_init__(self) -> None:
        for name in ("mix", "floors", "ceilings", "sft_problems", "batch_sizes"):
            value = getattr(self, name)
            if value and len(value) != len(self.domains):
                raise ValueError(f"{name} has {len(value)} entries for {len(self.domains)} domains")

    def floor_of(self, domain: str) -> float:
        return self.floors[self.domains.index(domain)] if self.floors else self.floor

    def ceiling_of(self, domain: str) -> float:
        return self.ceilings[self.domains.index(domain)] if self.ceilings else self.ceiling

    def sft_count(self, domain: str) -> int:
        if not self.sft_problems:
            return self.sft_problems_per_domain
        return self.sft_problems[self.domains.index(domain)]

    def batch_size_of(self, domain: str) -> int:
        return self.batch_sizes[self.domains.index(domain)] if self.batch_sizes else self.batch_size


FULL_DOMAINS = ("rlhf", "if", "math", "code", "swe")
"""The paper's stage order (RLHF -> IF -> math -> code -> SWE)."""

FULL_SPEC = TinyModelSpec(
    vocab_size=768,
    max_positions=384,
    domains=FULL_DOMAINS,
    # if gets twice its old share: at 1.5 it stayed at 0% through 1000 steps (it must restate the
    # prompt's words, in capitals half the time, and the vocabulary spells capitals letter by letter)
    mix=(0.5, 3.0, 3.5, 2.0, 1.0),
    floors=(0.2, 0.2, 0.2, 0.2, 0.2),
    # rlhf's win probability against the reference tops out near 0.5 (the reference is what
    # SFT imitates), so it is held lower to leave RL room; swe is never held back (its patch
    # format collapses within ~100 steps of a reduced share, which made it swing -18% <-> 83%).
    ceilings=(0.35, 0.6, 0.6, 0.6, 2.0),
    sft_problems=(150, 3000, 3000, 3000, 3000),
    batch_by_domain=True,
    batch_sizes=(48, 48, 48, 48, 16),
    eval_max_new_tokens=112,
    # One domain a batch at a constant rate left the model tilted to the last batch's domain
    # (checks 100 steps apart swung by up to 66 points); a decay to 10% settles it.
    decay_to=0.1,
    max_steps=1500,
)
"""All five toy domains; see the module docstring."""

AGENT_DOMAINS = ("math", "code", "agent")
"""The recipe's order with the agentic stage last (`examples/agent-cascade.yaml`)."""

AGENT_SPEC = TinyModelSpec(
    vocab_size=512,
    max_positions=512,
    domains=AGENT_DOMAINS,
    mix=(3.0, 2.0, 2.0),
    # The agent's templated traces are learned far faster than math: held at 0.6 it ended SFT at
    # ~74% and its RL stage had nothing left to learn (docs/agent.md), so it is held lower.
    ceilings=(0.6, 0.6, 0.35),
    # one domain a batch: math and code rows are not padded to a ~200-token tool-call trace
    batch_by_domain=True,
    batch_sizes=(48, 48, 16),
    tool_tokens=True,
    eval_max_new_tokens=192,
    max_steps=1500,
)
"""math, code and tool-call traces of the agent domain: single-token tool markers and 512
positions, so a `set` task (prompt with its tools, five model turns, four tool turns) fits."""

SPECS: dict[str, TinyModelSpec] = {"tiny": TinyModelSpec(), "full": FULL_SPEC, "agent": AGENT_SPEC}
"""Named specs for `cascade model init --spec`."""

REWARD_MODEL_SUBDIR = "reward_model"
"""Where `cascade model init` puts the reward model a spec with "rlhf" needs (inside `--out`)."""


@dataclass
class SftLog:
    steps: int = 0
    stopped_by: str = ""
    history: list[dict] = field(default_factory=list)
    final_scores: dict[str, float] = field(default_factory=dict)


def _completion_text(problem: Problem, thinking: bool, eos: str) -> str:
    # With thinking on, the generation prompt ends at "assistant\n": the model writes the
    # (here empty) think block itself.
    prefix = "<think>\n\n</think>\n\n" if thinking else ""
    return f"{prefix}{problem.answer}{eos}"


def sft_learning_rate(spec: TinyModelSpec, step: int) -> float:
    """The SFT learning rate at `step` (1-based): linear warmup, then constant or cosine decay.
    Not `cascade.algo.schedules.schedule_value`: its cosine rounds differently in the last bit at
    a third of the steps, and the full spec's model (its measured tables) came from this one."""
    if spec.decay_to is None or step <= spec.warmup_steps:
        return spec.learning_rate * min(1.0, step / max(1, spec.warmup_steps))
    progress = (step - spec.warmup_steps) / max(1, spec.max_steps - spec.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return spec.learning_rate * (spec.decay_to + (1.0 - spec.decay_to) * cosine)


def greedy_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    domains: dict[str, Domain],
    problems: dict[str, list[Problem]],
    max_new_tokens: int = 48,
) -> dict[str, float]:
    """Each domain's greedy score on `problems`: the runner's own eval, on the model being tuned."""
    policy = Policy(model=model, tokenizer=tokenizer)
    return {
        name: evaluate_domain(
            PolicyGenerate(policy), tokenizer, chat, domains[name], probs, max_new_tokens=max_new_tokens
        ).score
        for name, probs in problems.items()
    }


def sft_domain_config(name: str, reward_model: Path | None = None) -> DomainConfig:
    """The domain config SFT uses: default rewards; "rlhf" scores against its reference answer."""
    if name != "rlhf":
        return DomainConfig(name=name)
    if reward_model is None:
        raise ValueError("the rlhf domain needs a reward model (build one with build_tiny_reward_model)")
    return DomainConfig(name="rlhf", reward=RlhfReward(model_path=reward_model, baseline="reference"))


def _sft_split(
    spec: TinyModelSpec, reward_model: Path | None = None
) -> tuple[dict[str, Domain], dict[str, list[Problem]], dict[str, list[Problem]]]:
    domains = {n: make_domain(sft_domain_config(n, reward_model)) for n in spec.domains}
    sft: dict[str, list[Problem]] = {}
    val: dict[str, list[Problem]] = {}
    for name, dom in domains.items():
        n_sft = spec.sft_count(name)
        probs = dom.make_problems("sft", n_sft + spec.val_problems_per_domain, spec.seed)
        sft[name] = probs[:n_sft]
        val[name] = probs[n_sft:]
    return domains, sft, val


def init_tokenizer_and_model(
    spec: TinyModelSpec, sft: dict[str, list[Problem]]
) -> tuple[PreTrainedTokenizerFast, Qwen3ForCausalLM]:
    """A tokenizer trained on the SFT data and a randomly initialised Qwen3 of the spec's size."""
    torch.manual_seed(spec.seed)
    chat = ChatConfig()
    render_tools = template_renderer(TOOL_CHAT_TEMPLATE)
    corpus: list[str] = []
    for probs in sft.values():
        for p in probs[:1000]:
            corpus.append(
                f"<|im_start|>user\n{p.prompt} {chat.no_think_flag}<|im_end|>\n<|im_start|>assistant\n"
            )
            corpus.append(f"{p.prompt} {chat.think_flag}\n{p.answer}")
            tools = prompt_tools(p) if p.domain == "agent" else None
            if tools:
                corpus.append(render_tools([{"role": "user", "content": p.prompt}], list(tools), False))
    markers = tool_markers(default_format()) if spec.tool_tokens else ()
    tokenizer = train_tokenizer(corpus, vocab_size=spec.vocab_size, single_tokens=markers)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden_size // spec.heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


def save_untrained_model(
    out_dir: Path, spec: TinyModelSpec = TinyModelSpec(), reward_model: Path | None = None
) -> Path:
    """A random (untrained) tiny model: the fast fixture for plumbing tests."""
    _, sft, _ = _sft_split(spec, reward_model)
    tokenizer, model = init_tokenizer_and_model(spec, sft)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    as_umask_allows(out_dir)
    return out_dir


def build_tiny_model(
    out_dir: Path, spec: TinyModelSpec = TinyModelSpec(), log=print, reward_model: Path | None = None
) -> SftLog:
    """SFT a fresh tiny model on the spec's domains (a spec with "rlhf" needs `reward_model`)."""
    rng = random.Random(spec.seed)
    chat = ChatConfig()
    domains, sft, val = _sft_split(spec, reward_model)
    tokenizer, model = init_tokenizer_and_model(spec, sft)
    eos_text = tokenizer.eos_token
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny model: Qwen3ForCausalLM, {n_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}")

    fmt = format_of_tokenizer(tokenizer)
    encode_text = token_encoder(tokenizer)

    def encode(problem: Problem, thinking: bool) -> tuple[list[int], list[int], list[bool]]:
        """Prompt ids, completion ids and which completion tokens are trained (the model's)."""
        tools = prompt_tools(problem) if problem.domain == "agent" else None
        prompt = render_prompt(tokenizer, chat, problem.prompt, thinking, tools)
        p_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if "trace" in problem.meta:
            c_ids, trained = trace_completion(problem, fmt, encode_text, tokenizer.eos_token_id, thinking)
            return p_ids, c_ids, trained
        c_ids = list(
            tokenizer(_completion_text(problem, thinking, eos_text), add_special_tokens=False)["input_ids"]
        )
        return p_ids, c_ids, [True] * len(c_ids)

    optim = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    weights = dict(zip(spec.domains, spec.mix, strict=True))
    base_weights = dict(weights)
    result = SftLog()
    model.train()
    for step in range(1, spec.max_steps + 1):
        names = list(weights)
        if spec.batch_by_domain:
            name = rng.choices(names, weights=[weights[n] for n in names])[0]
            picks = [name] * spec.batch_size_of(name)
        else:
            picks = rng.choices(names, weights=[weights[n] for n in names], k=spec.batch_size)
        rows = [encode(rng.choice(sft[n]), rng.random() < spec.thinking_fraction) for n in picks]
        batch = build_batch([p for p, _, _ in rows], [c for _, c, _ in rows], tokenizer.pad_token_id)
        logits = completion_logits(model, batch)
        logp = gather_logprobs(logits, batch.completion_ids)
        mask = batch.completion_mask
        if not all(all(t) for _, _, t in rows):  # tool responses in a trace are not trained
            trained, _ = right_pad([[int(x) for x in t] for _, _, t in rows], 0)
            mask = mask * trained.to(mask.dtype)
        loss = -(logp * mask).sum() / mask.sum()
        for group in optim.param_groups:
            group["lr"] = sft_learning_rate(spec, step)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        if step % spec.eval_every == 0:
            scores = greedy_scores(model, tokenizer, chat, domains, val, spec.eval_max_new_tokens)
            model.train()
            result.history.append({"step": step, "loss": float(loss.detach()), **scores})
            log(
                f"sft step {step}: loss {float(loss.detach()):.3f} "
                + " ".join(f"{k} {v:.0%}" for k, v in scores.items())
            )
            for name, score in scores.items():
                weights[name] = spec.ceiling_weight if score >= spec.ceiling_of(name) else base_weights[name]
            if step >= spec.min_steps and all(v >= spec.floor_of(k) for k, v in scores.items()):
                floors = {spec.floor_of(n) for n in spec.domains}
                result.stopped_by = (
                    f"every domain >= floor {spec.floor}"
                    if floors == {spec.floor}
                    else "every domain >= its floor"
                )
                result.final_scores = scores
                result.steps = step
                break
    else:
        result.stopped_by = "max_steps"
        result.steps = spec.max_steps
        result.final_scores = greedy_scores(model, tokenizer, chat, domains, val, spec.eval_max_new_tokens)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    as_umask_allows(out_dir)
    (out_dir / "sft_log.json").write_text(
        json.dumps({"spec": asdict(spec), "n_parameters": n_params, **asdict(result)}, indent=2)
    )
    return result
