"""Multi-turn rounds on the agent spec's architecture (random weights): the prefill a round pays
with a full re-encode of the context vs with `cascade.engine.prefix_kv` reusing the previous
round's keys/values (only the last 24 ids: the environment's answer, are new).

Per context length (64/128/192) and a batch of 8 episodes: the round through
`cascade.engine.hf.generate` (full prefill + 40 decode tokens), its full batched prefill alone,
and the reused prefill (each episode's suffix on its cached prefix). The round time with reuse
is that round less the full prefill plus the reused one: `prefix_kv` is not yet wired into
`generate`, so it is derived, not run. Writes bench/results/turn_kv_reuse.{json,md}.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cascade.engine.batch import left_pad, positions
from cascade.engine.hf import generate
from cascade.engine.prefix_kv import PrefixKV, prefill
from cascade.model.build import AGENT_SPEC

BATCH, NEW_TOKENS, SUFFIX, REPEATS = 8, 40, 24, 3
OUT = Path(__file__).parent / "results"


def _model() -> Qwen3ForCausalLM:
    s = AGENT_SPEC
    cfg = Qwen3Config(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _best(fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _fill(model: Qwen3ForCausalLM, contexts: list[list[int]]) -> list[PrefixKV]:
    """One cache per episode holding its previous round (all but the new ids)."""
    caches = []
    for c in contexts:
        cache = PrefixKV()
        prefill(model, c[:-SUFFIX], cache)
        caches.append(cache)
    return caches


def _reused(model: Qwen3ForCausalLM, contexts: list[list[int]], caches: list[PrefixKV]) -> float:
    t0 = time.perf_counter()
    for c, cache in zip(contexts, caches, strict=True):
        _, _, reused = prefill(model, c, cache)
        assert reused == len(c) - SUFFIX
    return time.perf_counter() - t0


@torch.no_grad()
def _measure(model: Qwen3ForCausalLM, ctx: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(ctx)
    vocab = AGENT_SPEC.vocab_size
    contexts = [torch.randint(1, vocab, (ctx,), generator=g).tolist() for _ in range(BATCH)]

    def full_round() -> None:
        gen = torch.Generator()
        generate(model, contexts, max_new_tokens=NEW_TOKENS, eos_ids=[], pad_id=0, generator=gen)

    def full_prefill() -> None:
        ids, attn = left_pad(contexts, 0)
        model(input_ids=ids, attention_mask=attn, position_ids=positions(attn), use_cache=True)

    round_s, prefill_s = _best(full_round), _best(full_prefill)
    reused_s = min(_reused(model, contexts, _fill(model, contexts)) for _ in range(REPEATS))
    with_reuse = round_s - prefill_s + reused_s
    return {
        "context": ctx,
        "round_s_full": round(round_s, 4),
        "prefill_s_full": round(prefill_s, 4),
        "prefill_share_full": round(prefill_s / round_s, 3),
        "prefill_s_reused": round(reused_s, 4),
        "round_s_reused_derived": round(with_reuse, 4),
        "prefill_share_reused": round(reused_s / with_reuse, 3),
    }


def main() -> None:
    torch.set_num_threads(1)
    model = _model()
    rows = []
    for ctx in (64, 128, 192):
        rows.append(_measure(model, ctx))
        print(rows[-1], flush=True)
    setup = {"batch": BATCH, "new_tokens": NEW_TOKENS, "new_ids_per_round": SUFFIX, "threads": 1}
    OUT.mkdir(exist_ok=True)
    (OUT / "turn_kv_reuse.json").write_text(json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")
    lines = [
        "# KV reuse between turns (agent spec architecture, random weights, CPU, 1 thread)",
        "",
        f"Batch {BATCH}, {NEW_TOKENS} new tokens a round, {SUFFIX} new ids on the cached prefix.",
        "Round time with reuse is derived (round - full prefill + reused prefill): not yet wired.",
        "",
        "| context | round full (s) | prefill share | reused prefill (s) | round reused (s) | share |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context']} | {r['round_s_full']} | {r['prefill_share_full']:.0%} "
            f"| {r['prefill_s_reused']} | {r['round_s_reused_derived']} | {r['prefill_share_reused']:.0%} |"
        )
    (OUT / "turn_kv_reuse.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
