"""A scripted `GenerateFn` for the multi-turn tests: each episode writes a fixed list of turns."""

from __future__ import annotations

import json
from typing import Any

from transformers import PreTrainedTokenizerBase

from cascade.domains.base import Problem
from cascade.engine.base import Generation, SamplingSettings, VersionedGeneration

LP = -0.5  # the scripted engine's log-prob of every token it "samples"


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedEngine:
    """A `GenerateFn` whose episode k (by its prompt's first occurrence) writes `scripts[k][t]`
    at its turn t, ending it with the end-of-turn token, cut at `max_tokens` ("length")."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], scripts: list[list[str]]
    ):
        self.tok = tokenizer
        self.eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.prompts = [tuple(p) for p in prompts]
        self.scripts = scripts
        self.calls: list[tuple[list[list[int]], int, SamplingSettings]] = []

    def __call__(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        self.calls.append((prompts, n, sampling))
        ids, lps, reasons = [], [], []
        for context in prompts:
            k = next(i for i, p in enumerate(self.prompts) if tuple(context[: len(p)]) == p)
            # each model turn so far ended with <|im_end|>, and so did the tool turn after it
            turn = context[len(self.prompts[k]) :].count(self.eos) // 2
            for _ in range(n):
                row = self.tok(self.scripts[k][turn], add_special_tokens=False)["input_ids"] + [self.eos]
                reason = "stop"
                if len(row) > sampling.max_tokens:
                    row, reason = row[: sampling.max_tokens], "length"
                ids.append(row)
                lps.append([LP] * len(row))
                reasons.append(reason)
        return VersionedGeneration(Generation(ids, lps, reasons), version=len(self.calls), n=n)


def store_problem(pid: str, store: dict[str, int], reads: list[str], answer: str) -> Problem:
    meta = {"task": "store", "seed": 0, "store": store, "tools": ["kv_get", "kv_set", "calc"]}
    meta |= {"reads": reads, "check": {"answer": answer}}
    return Problem(id=pid, domain="agent", prompt=f"[{pid}] What is it?", answer=answer, meta=meta)
