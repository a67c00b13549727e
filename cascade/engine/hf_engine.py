"""The Hugging Face engine: `cascade.engine.hf.generate` behind the `Engine` interface, with
versioned weight updates.

Two ways to switch weights (`swap` picks one):

- `swap=True` (default): the new weights go into a copy of the model built off to the side,
  then one reference assignment makes it current. A `generate` call holds the (model, version)
  pair it started with, so calls in flight finish on the old weights and report the old version
  while new calls already use the new ones. Costs a second copy of the weights during the
  switch (and while old calls finish).
- `swap=False`: drain. The update waits for calls in flight to finish, holds new ones back,
  loads in place, and lets them go. No second copy; new calls wait for the load.

Either way the incoming tensors are fully read and checked first (`cascade.engine.weights`),
so a refused update changes nothing.

Multi-turn rollouts: a request that is a round of one (`SamplingSettings.turn`) keeps its
keys/values in the engine's `TurnKV` (at most `turn_kv_bytes`, dropped at every weight switch)
and a later round reuses them (`cascade.engine.prefix_kv`: the rule, and why it is the same in
the embedded run).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from cascade.engine.base import (
    EngineInfo,
    Generation,
    SamplingSettings,
    VersionedGeneration,
    WeightUpdate,
    WeightUpdateError,
    check_generate_request,
    next_version,
)
from cascade.engine.hf import generate_kv
from cascade.engine.prefix_kv import DEFAULT_MAX_BYTES, TurnKV, weights_stamp
from cascade.engine.sampling import request_generator
from cascade.engine.weights import (
    check_config,
    check_tensors,
    embedding_rows,
    model_specs,
    read_checkpoint,
    read_config,
)
from cascade.model.loading import Policy, load_policy


class HFEngine:
    def __init__(
        self,
        policy: Policy,
        *,
        model_dir: str | Path,
        version: int = 0,
        swap: bool = True,
        turn_kv_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        model = policy.model
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.tokenizer = policy.tokenizer
        self.swap = swap
        self._slot: tuple[PreTrainedModel, int] = (model, version)
        self._config: dict[str, Any] = model.config.to_dict()
        self._info = EngineInfo(
            kind="hf",
            model=str(model_dir),
            vocab_size=embedding_rows(model),
            max_context=int(getattr(model.config, "max_position_embeddings", 0) or 2**31 - 1),
            eos_token_ids=policy.eos_token_ids,
            pad_token_id=policy.pad_token_id,
        )
        self._update_lock = threading.Lock()
        self._cond = threading.Condition()
        self._active = 0
        self._draining = False
        self.turns = TurnKV(turn_kv_bytes)

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        version: int = 0,
        swap: bool = True,
        turn_kv_bytes: int = DEFAULT_MAX_BYTES,
    ) -> HFEngine:
        policy = load_policy(path, dtype=dtype, device=device)
        return cls(policy, model_dir=path, version=version, swap=swap, turn_kv_bytes=turn_kv_bytes)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def version(self) -> int:
        return self._slot[1]

    @property
    def model(self) -> PreTrainedModel:
        """The current weights (for in-process callers such as the benchmarks)."""
        return self._slot[0]

    @contextmanager
    def _acquire(self) -> Iterator[tuple[PreTrainedModel, int]]:
        with self._cond:
            while self._draining:
                self._cond.wait()
            self._active += 1
            slot = self._slot
        try:
            yield slot
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> VersionedGeneration:
        check_generate_request(self._info, prompts, n, sampling)
        with self._acquire() as (model, version):
            gen = sample_request(
                model,
                prompts,
                n,
                sampling,
                eos_ids=self._info.eos_token_ids,
                pad_id=self._info.pad_token_id,
                turns=self.turns,
                stamp=(version, *weights_stamp(model)),
            )
        return VersionedGeneration(generation=gen, version=version, n=n)

    def load_checkpoint(self, path: str | Path, version: int | None = None) -> WeightUpdate:
        start = time.perf_counter()
        source = str(path)
        check_config(self._config, read_config(path), source)
        return self._switch(read_checkpoint(path), version, source, start)

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> WeightUpdate:
        return self._switch(tensors, version, "streamed weights", time.perf_counter())

    def _switch(
        self, tensors: Mapping[str, torch.Tensor], version: int | None, source: str, start: float
    ) -> WeightUpdate:
        with self._update_lock:
            current, current_version = self._slot
            new_version = next_version(current_version, version)
            specs, tied = model_specs(current)
            nbytes = check_tensors(specs, tensors, source, optional=tied)
            if self.swap:
                fresh = copy.deepcopy(current)
                _load(fresh, tensors, source)
                self._slot = (fresh, new_version)  # one assignment: the atomic switch
            else:
                with self._cond:
                    self._draining = True
                    try:
                        while self._active:
                            self._cond.wait()
                        _load(current, tensors, source)
                        self._slot = (current, new_version)
                    finally:
                        self._draining = False
                        self._cond.notify_all()
            self.turns.clear()
        return WeightUpdate(new_version, time.perf_counter() - start, nbytes, source)

    def close(self) -> None:
        pass


def sample_request(
    model: PreTrainedModel,
    prompts: list[list[int]],
    n: int,
    sampling: SamplingSettings,
    *,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    turns: TurnKV | None = None,
    stamp: Hashable = None,
) -> Generation:
    """`n` completions of every prompt (prompt-major): the one sampling path of the HF engine
    and of the policy in the learner's process (`cascade.rollout.policy.PolicyGenerate`), so the two
    give the same tokens for the same seed. A request with a seed samples from
    `request_generator(seed)`, one without from `generator` (any device).

    A round of a multi-turn rollout (`sampling.turn`) keeps its keys/values in `turns` (under
    `stamp`: the weights they were computed with) and, from round 1, reuses those of the
    previous round when `turns` holds all of them (`cascade.engine.prefix_kv`); without `turns`,
    or with reuse off, it is computed as a request on its own."""
    if sampling.seed is not None:
        generator = request_generator(sampling.seed)
    rows = [ids for ids in prompts for _ in range(n)]
    turn = sampling.turn
    store = turns if turn is not None and turns is not None and turns.enabled else None
    prefixes = (
        store.take(turn, stamp, rows) if store is not None and turn is not None and turn.round else None
    )
    gen, kept = generate_kv(
        model,
        rows,
        max_new_tokens=sampling.max_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        greedy=sampling.greedy,
        generator=None if sampling.greedy else generator,
        prefixes=prefixes,
        keep=store is not None,
    )
    if store is not None and turn is not None:
        store.keep(turn, stamp, kept)
    return gen


def _load(model: PreTrainedModel, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Copy the checked tensors into `model` (cast to its dtype and device)."""
    try:
        with torch.no_grad():
            model.load_state_dict(dict(tensors), strict=False)
    except RuntimeError as err:  # only reachable if the checks above missed something
        raise WeightUpdateError(f"{source}: {err}") from None
