"""Eval of every configured domain: the rows of the regression table, each with its interval.

The completions come from a `GenerateFn`: the policy in this process (embedded run, SFT) or the
rollout service holding the learner's current weights (distributed run). Same prompts, same
batches, same decoding, same sampling seed: the same scores either way.

Per stage, `eval.metrics` chooses what is reported (see `cascade.eval.stats` for the
estimators and intervals): `greedy` (one greedy completion per prompt, the default), `avg@k`
and `pass@k` (from `eval.samples` sampled completions per prompt). The first metric is the
eval's `score`; with the default config that is exactly the greedy mean reward, as before.
"""

from __future__ import annotations

from collections import Counter

from transformers import PreTrainedTokenizerBase

from cascade.config import ChatConfig, EvalConfig, metric_k
from cascade.domains.agent import prompt_tools, turn_setup
from cascade.domains.base import Domain, Problem, score_for_eval
from cascade.engine.base import SamplingSettings
from cascade.eval.results import DomainEval, MetricValue
from cascade.eval.stats import mean_interval, pass_at_k, ratio_interval
from cascade.model.chat import completion_decoder, encode_prompts, token_encoder
from cascade.rollout.requests import GenerateFn, request_seed
from cascade.tools.environment import EpisodeStats
from cascade.tools.turn_loop import run_turns


def _generate_and_score(
    generate_fn: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    domain: Domain,
    problems: list[Problem],
    *,
    n: int,
    sampling: SamplingSettings,
    thinking: bool,
    batch_size: int,
    reasons: Counter[str],
    episodes: list[EpisodeStats] | None = None,
) -> list[list[float]]:
    """Per prompt, the rewards of its `n` completions (infra errors left out); `episodes` gets
    the counts of each multi-turn episode (agent store tasks) as the verifier replayed it."""
    out: list[list[float]] = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        tools = [prompt_tools(p) if domain.name == "agent" else None for p in chunk]
        prompt_ids = encode_prompts(tokenizer, chat, [p.prompt for p in chunk], thinking, tools)
        settings = sampling
        if sampling.seed is not None and start:
            settings = SamplingSettings(
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                greedy=sampling.greedy,
                seed=request_seed(sampling.seed, start),
            )
        repeated = [p for p in chunk for _ in range(n)]
        texts, stats = _completions(
            generate_fn, tokenizer, domain, repeated, prompt_ids, n, settings, thinking
        )
        if episodes is not None and stats is not None:
            episodes += [s for p, s in zip(repeated, stats, strict=True) if p.meta.get("task") == "store"]
        verdicts = score_for_eval(domain, repeated, texts)
        for i in range(len(chunk)):
            rewards = []
            for v in verdicts[i * n : (i + 1) * n]:
                reasons[v.reason] += 1
                if not v.is_infra_error:
                    rewards.append(v.reward)
            out.append(rewards)
    return out


def _completions(
    generate_fn: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    domain: Domain,
    repeated: list[Problem],
    prompt_ids: list[list[int]],
    n: int,
    settings: SamplingSettings,
    thinking: bool,
) -> tuple[list[str], list[EpisodeStats] | None]:
    """The texts of `n` completions per prompt: multi-turn transcripts for the agent domain
    (the turn loop of the rollouts, with each episode's counts), one generation otherwise.
    The domain is recognised by name: `make_domain` hands it over wrapped (`LengthBounded`)."""

    decode = completion_decoder(tokenizer)

    config = getattr(domain, "config", None) if domain.name == "agent" else None
    setup = turn_setup(repeated, config.model_dump(mode="json")) if config is not None else None
    if setup is None:
        return decode(generate_fn(prompt_ids, n, settings).generation.completion_ids), None
    seed = settings.seed
    out = run_turns(
        prompt_ids,
        n,
        settings,
        generate_fn=generate_fn,
        decode=decode,
        encode=token_encoder(tokenizer),
        environments=setup.environments,
        fmt=setup.format,
        thinking=thinking,
        max_turns=setup.max_turns,
        round_seed=lambda r: None if seed is None else request_seed(seed, "turn", r),
        keep_kv=setup.keep_kv,
    )
    return out.records, out.stats  # the verifier judges the loop's record, never the text re-parsed


def tool_use_metrics(episodes: list[EpisodeStats], *, seed: int, level: float) -> dict[str, MetricValue]:
    """How the agent's episodes used their tools (one episode per task; the greedy ones when the
    eval has greedy): `calls_per_task` (well-formed calls that ran) and `tool_error_rate` (calls
    whose tool answered an error, over every call attempt, malformed ones included: the step
    metrics' `turns/tool_error_rate`), each with a bootstrap interval over tasks. Task success
    is the eval's score itself (0/1 per task: a Wilson interval)."""
    calls = [float(e.calls) for e in episodes]
    failed = [float(e.tool_errors) for e in episodes]
    attempts = [float(e.calls + sum(e.malformed.values())) for e in episodes]
    (c_low, c_high), method = mean_interval(calls, seed=seed, level=level)
    total = sum(attempts)
    e_low, e_high = ratio_interval(failed, attempts, seed=seed, level=level) if total else (0.0, 1.0)
    return {
        "calls_per_task": MetricValue(sum(calls) / len(calls), c_low, c_high, len(calls), method),
        "tool_error_rate": MetricValue(
            sum(failed) / total if total else 0.0, e_low, e_high, len(episodes), "bootstrap"
        ),
    }


def _metric(values: list[float], *, seed: int, level: float) -> MetricValue:
    value = sum(values) / len(values) if values else 0.0
    (low, high), method = mean_interval(values, seed=seed, level=level)
    if not values:
        low, high = 0.0, 1.0
    return MetricValue(value=value, low=low, high=high, n=len(values), method=method)


def evaluate_domain(
    generate_fn: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatConfig,
    domain: Domain,
    problems: list[Problem],
    *,
    max_new_tokens: int,
    thinking: bool = False,
    batch_size: int = 256,
    spec: EvalConfig | None = None,
    seed: int = 0,
    name: str | None = None,
) -> DomainEval:
    """Evaluate `domain` on `problems` with the metrics of `spec` (default: greedy only); `name`:
    the domain's name in the config (default the verifier's kind: they differ for `gsm8k` of kind
    math).

    `seed` seeds the sampled completions and the bootstrap: pass the same one in every mode
    (the runner uses `request_seed(cfg.seed, "eval", global_step, domain)`).
    """
    spec = spec or EvalConfig()
    reasons: Counter[str] = Counter()
    per_prompt: dict[str, list[float]] = {}
    episodes: list[EpisodeStats] = []
    if "greedy" in spec.metrics:
        greedy = _generate_and_score(
            generate_fn,
            tokenizer,
            chat,
            domain,
            problems,
            n=1,
            sampling=SamplingSettings(max_tokens=max_new_tokens, greedy=True),
            thinking=thinking,
            batch_size=batch_size,
            reasons=reasons,
            episodes=episodes,
        )
        per_prompt["greedy"] = [r[0] for r in greedy if r]
    sampled_metrics = [m for m in spec.metrics if m != "greedy"]
    if sampled_metrics:
        sample_reasons: Counter[str] = Counter()
        sampled = _generate_and_score(
            generate_fn,
            tokenizer,
            chat,
            domain,
            problems,
            n=spec.samples,
            sampling=SamplingSettings(
                max_tokens=max_new_tokens,
                temperature=spec.temperature,
                top_p=spec.top_p,
                seed=request_seed(seed, "sampled"),
            ),
            thinking=thinking,
            batch_size=batch_size,
            reasons=sample_reasons,
            episodes=None if "greedy" in spec.metrics else episodes,
        )
        if "greedy" not in spec.metrics:
            reasons = sample_reasons
        for m in sampled_metrics:
            k = metric_k(m)
            if m.startswith("avg@"):
                per_prompt[m] = [sum(r[:k]) / len(r[:k]) for r in sampled if r[:k]]
            else:
                per_prompt[m] = [
                    pass_at_k(len(r), sum(1 for x in r if x >= spec.pass_threshold), k)
                    for r in sampled
                    if len(r) >= k
                ]
    metrics = {
        m: _metric(per_prompt[m], seed=request_seed(seed, "bootstrap", m), level=spec.confidence)
        for m in spec.metrics
    }
    if episodes:
        tools_seed = request_seed(seed, "bootstrap", "tools")
        metrics |= tool_use_metrics(episodes, seed=tools_seed, level=spec.confidence)
    primary = metrics[spec.primary]
    return DomainEval(
        domain=name or domain.name,
        score=primary.value,
        n=primary.n,
        reasons=dict(reasons),
        metrics=metrics,
        primary=spec.primary,
    )
