"""Multi-turn rollouts with and without KV reuse between turns, end to end on the HF engine path.

One rollout request as a rollout worker or the embedded run makes it: `run_turns` (the turn
loop) over `PolicyGenerate` (the learner's engine; the rollout service's `HFEngine` runs the same
`sample_request`), 2 prompts x 4 episodes, on the agent spec's architecture (Qwen3, vocab 512,
hidden 128, 4 layers, 4 query / 2 key-value heads) with random weights and its tokenizer and
tool format; CPU, 1 torch thread. Prompts are random ids of 64 / 128 / 192 tokens; every turn is
answered as a tool call (a fixed response: ~25 ids with the template's markers), so an episode
goes on until `MAX_TURNS` model turns or its token budget. With random weights the model would
almost never sample its end-of-turn token, so every 32nd id of the vocabulary ends a turn too
(17 ids in all: turns of ~30 tokens, at most what is left of the budget).

The two rows of each prompt length do the same work: the same prompts, seeds, environment and
(asserted) the same sampled tokens. The only difference is the turn loop's `keep_kv` (the agent
domain's `reuse_kv`):
- `off`: every round prefills every live episode's whole context (the prompt, every turn and
  every tool response so far), as before reuse existed;
- `on`: round 0 is the same request; from round 1 the engine prefills only the ids it has not
  processed (the previous turn's last token and the environment's ids), batched over the
  episodes, on the keys/values it kept from the previous round's prefill and decode steps.

Times are the best of `REPEATS` whole rollouts per row (the rows alternate), and per round the
best of that round's `generate` call over the repeats (every repeat is the same work: asserted);
"rounds 1+" is the sum of those.

A second table times the prefill alone, the part reuse changes (`cascade.engine.hf._prefill`,
the full batched prefill, vs `_prefill_on`, the batched prefill of only the new ids on kept
keys/values), for 8 rows whose kept lengths differ (kept, kept + 4, kept + 8) and 24 or 48 new
ids each: where it loses, if anywhere, is where a threshold would belong.

Writes bench/results/turn_kv_reuse.{json,md}.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from cascade.bootstrap.policy import AGENT_SPEC, save_untrained_model
from cascade.engine import hf
from cascade.engine.base import SamplingSettings, VersionedGeneration
from cascade.engine.prefix_kv import RowKV
from cascade.model.chat import token_encoder
from cascade.model.loading import Policy, load_policy
from cascade.rollout.policy import PolicyGenerate
from cascade.tools.environment import CallOutcome, StepResult, ToolEnvironment
from cascade.tools.template import format_of_tokenizer
from cascade.tools.turn_loop import TurnRollout, env_ids, run_turns

PROMPTS, GROUP, BUDGET, MAX_TURNS, REPEATS = 2, 4, 400, 4, 7
CONTEXTS = (64, 128, 192)
PREFILL_KEPT, PREFILL_NEW, PREFILL_ROWS = (8, 32, 64, 128, 256), (24, 48), 8
OUT = Path(__file__).parent / "results"


RESPONSE = "kv_get: 42 (the value stored under the key)"


class _Answered(ToolEnvironment):
    """Every turn is a call, answered with the same response."""

    def step(self, turn_text: str) -> StepResult:
        return StepResult((CallOutcome(None, RESPONSE, "tool_error"),))


def _policy(path: Path) -> Policy:
    policy = load_policy(path)
    vocab = policy.model.config.vocab_size
    policy.model.generation_config.eos_token_id = [policy.tokenizer.eos_token_id, *range(32, vocab, 32)]
    return policy


class _Timed:
    """A `GenerateFn` that times each round and counts the ids its prefill had to process."""

    def __init__(self, engine: PolicyGenerate, keep_kv: bool) -> None:
        self.engine, self.keep_kv = engine, keep_kv
        self.rounds: list[dict[str, float]] = []
        self._processed: dict[int, int] = {}  # episode -> ids through the model after its last round

    def __call__(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        t0 = time.perf_counter()
        out = self.engine(prompts, n, sampling)
        seconds = time.perf_counter() - t0
        rows = [p for p in prompts for _ in range(n)]
        turn = sampling.turn
        episodes = turn.episodes if turn is not None and turn.round else tuple(range(len(rows)))
        reuse = self.keep_kv and bool(turn is not None and turn.round)
        prefilled = sum(
            len(p) - (self._processed[e] if reuse else 0) for p, e in zip(rows, episodes, strict=True)
        )
        gen = out.generation
        self._processed = {
            e: len(p) + len(c) - 1 for p, e, c in zip(rows, episodes, gen.completion_ids, strict=True)
        }
        self.rounds.append(
            {
                "seconds": seconds,
                "episodes": len(rows),
                "context_ids": sum(len(p) for p in rows),
                "prefilled_ids": prefilled,
                "new_tokens": sum(len(c) for c in gen.completion_ids),
            }
        )
        return out


def _rollout(policy: Policy, prompts: list[list[int]], keep_kv: bool) -> tuple[TurnRollout, _Timed]:
    tok = policy.tokenizer
    fmt = format_of_tokenizer(tok)
    timed = _Timed(PolicyGenerate(policy), keep_kv)
    out = run_turns(
        prompts,
        GROUP,
        SamplingSettings(max_tokens=BUDGET, temperature=1.0, seed=len(prompts[0])),
        generate_fn=timed,
        decode=lambda ids: tok.batch_decode(ids, skip_special_tokens=True),
        encode=token_encoder(tok),
        environments=[_Answered(fmt, {}) for _ in range(len(prompts) * GROUP)],
        fmt=fmt,
        thinking=False,
        max_turns=MAX_TURNS,
        round_seed=lambda r: 1000 + r,
        keep_kv=keep_kv,
    )
    return out, timed


def _measure(policy: Policy, ctx: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(ctx)
    vocab = policy.model.config.vocab_size
    eos = set(policy.eos_token_ids)
    prompts = [
        [t for t in torch.randint(1, vocab, (2 * ctx,), generator=g).tolist() if t not in eos][:ctx]
        for _ in range(PROMPTS)
    ]
    runs: dict[bool, list[tuple[float, TurnRollout, _Timed]]] = {False: [], True: []}
    for _ in range(REPEATS):
        for keep_kv in (False, True):
            t0 = time.perf_counter()
            out, timed = _rollout(policy, prompts, keep_kv)
            runs[keep_kv].append((time.perf_counter() - t0, out, timed))
    off, on = runs[False][0][1], runs[True][0][1]
    for done in runs.values():  # every repeat is the same work
        assert all(r[1] == done[0][1] for r in done), "a repeat sampled other tokens"
    assert on.completion_ids == off.completion_ids, "reuse sampled other tokens than the full prefill"
    diff = max(
        abs(a - b) for x, y in zip(on.logprobs, off.logprobs, strict=True) for a, b in zip(x, y, strict=True)
    )
    rows = []
    for keep_kv, done in runs.items():
        out, timed = done[0][1], done[0][2]
        per_round = [min(r[2].rounds[i]["seconds"] for r in done) for i in range(out.rounds)]
        rows.append(
            {
                "prompt_ids": ctx,
                "reuse": "on" if keep_kv else "off",
                "rollout_s": round(min(r[0] for r in done), 4),
                "round0_s": round(per_round[0], 4),
                "later_rounds_s": round(sum(per_round[1:]), 4),
                "rounds": out.rounds,
                "episodes_per_round": [r["episodes"] for r in timed.rounds],
                "mean_context_per_round": [round(r["context_ids"] / r["episodes"], 1) for r in timed.rounds],
                "prefilled_ids_per_round": [r["prefilled_ids"] for r in timed.rounds],
                "new_tokens": sum(r["new_tokens"] for r in timed.rounds),
                "round_s": [round(t, 4) for t in per_round],
                "max_abs_logprob_diff_vs_off": diff if keep_kv else 0.0,
            }
        )
    return rows


@torch.no_grad()
def _prefills(policy: Policy) -> list[dict[str, Any]]:
    model, vocab = policy.model, policy.model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def best(fn: Any) -> float:
        times = []
        for _ in range(2 * REPEATS):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    rows = []
    for kept in PREFILL_KEPT:
        for new in PREFILL_NEW:
            lengths = [kept + 4 * (i % 3) for i in range(PREFILL_ROWS)]
            contexts = [torch.randint(1, vocab, (n + new,), generator=g).tolist() for n in lengths]
            prefixes = []
            for c, n in zip(contexts, lengths, strict=True):
                cache = DynamicCache()
                model(input_ids=torch.tensor([c[:n]]), cache=cache, use_cache=True)
                keys = [layer.keys[0] for layer in cache.layers]  # type: ignore[union-attr]
                values = [layer.values[0] for layer in cache.layers]  # type: ignore[union-attr]
                prefixes.append(RowKV(tuple(c[:n]), keys, values))
            full = best(lambda c=contexts: hf._prefill(model, c, 0))
            reused = best(lambda c=contexts, p=prefixes: hf._prefill_on(model, c, p, 0))
            rows.append(
                {
                    "kept_ids": kept,
                    "new_ids": new,
                    "full_prefill_ms": round(full * 1e3, 2),
                    "reuse_prefill_ms": round(reused * 1e3, 2),
                    "ratio": round(reused / full, 2),
                }
            )
    return rows


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        policy = _policy(save_untrained_model(Path(tmp) / "agent", AGENT_SPEC))
    tok = policy.tokenizer
    env_len = len(env_ids(format_of_tokenizer(tok), [RESPONSE], False, token_encoder(tok), [])[0])
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for ctx in CONTEXTS:
        rows += _measure(policy, ctx)
        for r in rows[-2:]:
            print(
                {
                    k: r[k]
                    for k in ("prompt_ids", "reuse", "rollout_s", "later_rounds_s", "prefilled_ids_per_round")
                }
            )
    prefills = _prefills(policy)
    setup = {
        "architecture": "AGENT_SPEC: Qwen3, vocab 512, hidden 128, 4 layers, 4 / 2 kv heads, random",
        "prompts": PROMPTS,
        "group": GROUP,
        "budget": BUDGET,
        "max_turns": MAX_TURNS,
        "end_of_turn_ids": len(policy.eos_token_ids),
        "environment_ids_per_answer": env_len,
        "threads": 1,
        "repeats": REPEATS,
        "load_avg_1min_start": round(load, 1),
        "load_avg_1min_end": round(os.getloadavg()[0], 1),
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "turn_kv_reuse.json").write_text(
        json.dumps({"setup": setup, "rows": rows, "prefill": prefills}, indent=2) + "\n"
    )
    lines = [
        "# KV reuse between turns, end to end (agent spec architecture, random weights, CPU, 1 thread)",
        "",
        f"One request: {PROMPTS} prompts x {GROUP} episodes through `run_turns` + `PolicyGenerate`, budget "
        f"{BUDGET} tokens, up to {MAX_TURNS} turns, every turn answered ({env_len} environment ids); "
        f"{len(policy.eos_token_ids)} ids end a turn. Best of {REPEATS} rollouts per row "
        f"(per round: best of {REPEATS}). Load average "
        f"{setup['load_avg_1min_start']} / {setup['load_avg_1min_end']} (start / end; 2 shared cores).",
        "",
        "Same prompts, seeds and sampled tokens in both rows (asserted); the only difference: `off` "
        "prefills every live episode's whole context each round, `on` prefills only the ids the "
        "engine has not processed (last token of the previous turn + the environment's ids) on the "
        "keys/values kept from the previous round.",
        "",
        "| prompt | reuse | rollout (s) | round 0 (s) | rounds 1+ (s) | per round (s) "
        "| mean context per round | ids prefilled per round | max abs log-prob diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['prompt_ids']} | {r['reuse']} | {r['rollout_s']} | {r['round0_s']} "
            f"| {r['later_rounds_s']} "
            f"| {' / '.join(str(s) for s in r['round_s'])} "
            f"| {' / '.join(str(c) for c in r['mean_context_per_round'])} "
            f"| {' / '.join(str(c) for c in r['prefilled_ids_per_round'])} "
            f"| {r['max_abs_logprob_diff_vs_off']:.1e} |"
        )
    lines += [
        "",
        f"Prefill alone, {PREFILL_ROWS} rows (kept ids: the column, +4, +8), best of {2 * REPEATS}:",
        "",
        "| kept ids | new ids | full prefill (ms) | prefill on kept keys/values (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    for p in prefills:
        lines.append(
            f"| {p['kept_ids']} | {p['new_ids']} | {p['full_prefill_ms']} "
            f"| {p['reuse_prefill_ms']} | {p['ratio']} |"
        )
    (OUT / "turn_kv_reuse.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
