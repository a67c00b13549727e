"""Generate-and-score of one request: the rollout worker's whole job and the embedded run's rollout
of one request, with whatever engine and verifier each passes in; then the overlong rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cascade.domains.base import INFRA_ERROR, TRUNCATED, Problem, RewardVerdict
from cascade.engine.base import Generation
from cascade.rollout.requests import GenerateFn, PromptRequest, ScoredChunk, ScoreFn, request_seed


def generate_and_score(
    req: PromptRequest,
    *,
    generate_fn: GenerateFn,
    decode: Callable[[list[list[int]]], list[str]],
    score: ScoreFn,
    worker: str,
    encode: Callable[[str, bool], list[int]] | None = None,
) -> ScoredChunk:
    """Generate one request's groups, score them, apply the overlong rule: the rollout worker's
    whole job, and the embedded run's rollout of one request. Agent problems are multi-turn
    (`cascade.tools.turn_loop`, which needs `encode`: `(text, literal) -> ids`)."""
    import time

    t0 = time.perf_counter()
    problems = [p for p in req.problem_objects() for _ in range(req.group_size)]
    layouts: list[list[list[int]]] = []
    episode_counts: list[dict[str, float]] = []
    unavailable: list[str | None] = []
    turns = _turn_setup(req, problems)
    if turns is None:
        result = generate_fn(req.prompt_ids, req.group_size, req.sampling())
        gen, version = result.generation, result.version
        texts = scored = decode(gen.completion_ids)
    else:
        if encode is None:
            raise ValueError(f"domain {req.domain}: multi-turn rollouts need an encoder")
        from cascade.tools.turn_loop import run_turns

        seed = req.seed
        episodes = run_turns(
            req.prompt_ids,
            req.group_size,
            req.sampling(),
            generate_fn=generate_fn,
            decode=decode,
            encode=encode,
            environments=turns.environments,
            fmt=turns.format,
            thinking=req.thinking,
            max_turns=turns.max_turns,
            round_seed=lambda r: None if seed is None else request_seed(seed, "turn", r),
            keep_kv=turns.keep_kv,
        )
        gen = Generation(episodes.completion_ids, episodes.logprobs, episodes.finish_reasons)
        version, texts, scored = episodes.version, episodes.texts, episodes.records
        layouts = [[[n, int(m)] for n, m in lay.runs] for lay in episodes.layouts]
        episode_counts = [s.as_metrics() for s in episodes.stats]
        unavailable = episodes.unavailable
    t_gen = time.perf_counter()
    verdicts = apply_overlong(
        score(req.domain, problems, scored, req.reward_config), gen.finish_reasons, req.overlong
    )
    if any(unavailable):  # a tool the infrastructure could not run: never a reward the model earned
        verdicts = [
            RewardVerdict(0.0, INFRA_ERROR, why) if why else v
            for v, why in zip(verdicts, unavailable, strict=True)
        ]
    return ScoredChunk(
        batch=req.batch,
        index=req.index,
        worker=worker,
        engine_version=version,
        sample_ids=req.sample_ids,
        completion_ids=gen.completion_ids,
        logprobs=gen.logprobs,
        finish_reasons=gen.finish_reasons,
        texts=texts,
        verdicts=[(v.reward, v.reason, v.detail) for v in verdicts],
        timings={"generate_s": t_gen - t0, "score_s": time.perf_counter() - t_gen},
        attempt=req.attempt,
        layouts=layouts,
        episodes=episode_counts,
    )


def _turn_setup(req: PromptRequest, problems: list[Problem]) -> Any:
    return multi_turn_setup(req.domain, problems, req.reward_config)


def multi_turn_setup(domain: str, problems: list[Problem], reward_config: dict[str, Any] | None) -> Any:
    """The turn loop's environments and format when `domain`'s problems are multi-turn (the
    agent domain's store tasks, one fresh environment per episode in `problems`), else None:
    one rule for RL requests and distillation samples alike. The verifier kind is the reward
    config's (a domain's name is free), else the name's."""
    if (reward_config or {}).get("kind", domain) != "agent":
        return None
    from cascade.domains.agent import turn_setup

    return turn_setup(problems, reward_config)


def apply_overlong(
    verdicts: list[RewardVerdict], finish_reasons: list[str], overlong: str
) -> list[RewardVerdict]:
    """`overlong: zero`: a completion cut by the token budget scores 0 (infra errors stay)."""
    if overlong != "zero":
        return verdicts
    return [
        RewardVerdict(0.0, TRUNCATED, "cut by the token budget")
        if fin == "length" and v.reason != INFRA_ERROR
        else v
        for v, fin in zip(verdicts, finish_reasons, strict=True)
    ]
