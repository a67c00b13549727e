"""`cascade.engine.prefix_kv` through the HF engine's sampling path (`sample_request`): a later
round on the kept keys/values agrees with a full prefill (to 1e-5, the same tokens on a seed),
round 0 and requests on their own are exactly as without reuse, the reuse decision depends on
the request and the round only (never on what else the engine served), any weight change
invalidates, and the kept bytes stay under the bound."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from cascade.engine import decode
from cascade.engine.base import (
    EngineInfo,
    EngineRequestError,
    Generation,
    SamplingSettings,
    TurnStep,
    check_generate_request,
)
from cascade.engine.hf_engine import sample_request
from cascade.engine.prefix_kv import TurnKV, weights_stamp

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 97
EOS = list(range(1, 16))  # likely enough that most turns stop and their episodes go on
PAD = 0


def _model() -> PreTrainedModel:
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(16, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [_ids(12, 1), _ids(30, 2), _ids(7, 3)]


def _sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    n: int,
    sampling: SamplingSettings,
    turns: TurnKV | None,
) -> Generation:
    return sample_request(
        model,
        prompts,
        n,
        sampling,
        eos_ids=EOS,
        pad_id=PAD,
        turns=turns,
        stamp=weights_stamp(model),
    )


class Rounds:
    """A turn loop in miniature: each stopped episode gets `env` new ids and goes on."""

    def __init__(self, model: PreTrainedModel, turns: TurnKV | None, caller: str = "c", rollout: str = "r"):
        self.model, self.turns, self.caller, self.rollout = model, turns, caller, rollout
        self.contexts: dict[int, list[int]] = {}
        self.round = 0

    def step(self, *, tokens: int = 12, env: int = 9) -> Generation:
        if self.round == 0:
            prompts, n, live = PROMPTS, 2, list(range(2 * len(PROMPTS)))
            turn = TurnStep(self.caller, self.rollout, 0)
            self.contexts = {e: list(PROMPTS[e // 2]) for e in live}
        else:
            live = sorted(self.contexts)
            prompts, n = [self.contexts[e] for e in live], 1
            turn = TurnStep(self.caller, self.rollout, self.round, tuple(live))
        sampling = SamplingSettings(max_tokens=tokens, temperature=1.0, seed=100 + self.round, turn=turn)
        gen = _sample(self.model, prompts, n, sampling, self.turns)
        for e, ids, reason in zip(live, gen.completion_ids, gen.finish_reasons, strict=True):
            if reason == "stop":
                self.contexts[e] = self.contexts[e] + ids + _ids(env, 1000 * self.round + e)
            else:
                del self.contexts[e]
        self.round += 1
        return gen


@pytest.mark.parametrize("static", [True, False], ids=["StaticDecoder", "HFStepper"])
def test_reuse_agrees_with_a_full_prefill_round_after_round(
    static: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not static:
        monkeypatch.setattr(decode, "supports", lambda model: False)
    model = _model()
    turns = TurnKV()
    reuse, full = Rounds(model, turns), Rounds(model, None)
    for r in range(4):
        got, want = reuse.step(), full.step()
        assert got.completion_ids == want.completion_ids  # the same tokens on a seed
        assert got.finish_reasons == want.finish_reasons
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
        if r == 0:
            assert got == want  # round 0 is a request on its own, exactly
        assert reuse.contexts == full.contexts
    assert turns.reused == 3 and turns.full == 0
    assert len(full.contexts) > 0  # episodes went on to the last round


def test_kept_keys_and_values_are_those_of_a_full_prefill() -> None:
    model = _model()
    turns = TurnKV()
    rounds = Rounds(model, turns)
    rounds.step()
    rounds.step()
    held = turns._held["c"]
    assert held.round == 1 and held.rows
    for row in held.rows.values():
        with torch.no_grad():
            out = model(input_ids=torch.tensor([list(row.ids)]), use_cache=True)
        for layer, k, v in zip(out.cache.layers, row.keys, row.values, strict=True):
            torch.testing.assert_close(k, layer.keys[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(v, layer.values[0], atol=1e-5, rtol=0)


def test_round_zero_and_requests_on_their_own_are_exactly_as_without_reuse() -> None:
    model = _model()
    plain = SamplingSettings(max_tokens=10, seed=5)
    turns = TurnKV()
    alone = _sample(model, PROMPTS, 3, plain, turns)
    assert len(turns) == 0  # nothing kept for a request that is no round
    first = _sample(
        model, PROMPTS, 3, SamplingSettings(max_tokens=10, seed=5, turn=TurnStep("c", "r", 0)), turns
    )
    assert alone == first == _sample(model, PROMPTS, 3, plain, None)
    assert len(turns) == 1


def test_the_decision_depends_on_the_request_and_the_round_only() -> None:
    """Two engines (the embedded run's and the rollout service's) serve the same rollout; the
    service also serves other callers' rollouts and requests on their own in between. Every
    round is the same, bit for bit."""
    model = _model()
    embedded, service = TurnKV(), TurnKV()
    ours = Rounds(model, embedded, caller="worker-0")
    theirs = Rounds(model, service, caller="worker-0")
    others = [Rounds(model, service, caller=f"worker-{i}", rollout=f"x{i}") for i in (1, 2)]
    for _ in range(4):
        for o in others:
            if o.round == 0 or o.contexts:
                o.step(tokens=8)
        _sample(model, [_ids(20, 9)], 2, SamplingSettings(max_tokens=6, seed=3), service)  # an eval
        assert ours.step() == theirs.step()
    assert embedded.reused == service.reused - sum(o.round - 1 for o in others) == 3


def test_a_miss_is_the_full_prefill_exactly() -> None:
    """A round the engine cannot continue (another rollout, a round skipped, its state evicted)
    is computed as without reuse, bit for bit, and kept for the next round."""
    model = _model()
    turns = TurnKV()
    rounds, full = Rounds(model, turns), Rounds(model, None)
    rounds.step(), full.step()
    turns.clear()  # e.g. the service restarted, or another replica
    assert rounds.step() == full.step()
    assert turns.full == 1 and turns.reused == 0
    rounds.step(), full.step()
    assert turns.reused == 1
    stale = Rounds(model, turns, rollout="r")  # a new rollout of the caller replaces the old one
    stale.step()
    rounds.rollout = "r-again"
    assert rounds.step() == full.step()  # its state is not this rollout's: a miss
    assert turns.full == 2


def test_a_weight_change_invalidates() -> None:
    model = _model()
    turns = TurnKV()
    rounds, full = Rounds(model, turns), Rounds(model, None)
    rounds.step(), full.step()
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # what an optimizer step does: in place
    assert rounds.step() == full.step()  # no stale keys/values: the full prefill on the new weights
    assert turns.full == 1 and turns.reused == 0
    rounds.step(), full.step()
    assert turns.reused == 1
    model.load_state_dict(_model().state_dict())
    assert rounds.step() == full.step()
    assert turns.full == 2


def test_bounded_by_bytes() -> None:
    model = _model()
    probe = TurnKV()
    rounds = Rounds(model, probe)
    rounds.step()
    first = probe.nbytes
    rounds.step()
    cap = max(first, probe.nbytes)  # one rollout fits at any round, two do not
    assert 0 < cap < 2 * first
    turns = TurnKV(max_bytes=cap)
    a, b = Rounds(model, turns, caller="a"), Rounds(model, turns, caller="b")
    a.step()
    b.step()  # evicts a's (the least recently used other caller)
    assert turns.nbytes <= cap and list(turns._held) == ["b"]
    b.step()
    assert turns.reused == 1 and turns.full == 0
    a.step()
    assert turns.reused == 1 and turns.full == 1  # a's round 1 found nothing: a full prefill
    assert turns.nbytes <= cap and list(turns._held) == ["a"]
    small = TurnKV(max_bytes=first // 2)  # a rollout alone over the bound is not kept
    Rounds(model, small).step()
    assert len(small) == 0 and small.nbytes == 0
    off = TurnKV(max_bytes=0)
    r = Rounds(model, off)
    r.step(), r.step()
    assert len(off) == 0 and off.reused == off.full == 0  # off: never asked


def test_turn_steps_are_checked() -> None:
    info = EngineInfo("hf", "m", VOCAB, 512, EOS, PAD)

    def check(turn: TurnStep, prompts: int = 2, n: int = 1) -> None:
        check_generate_request(info, [[9]] * prompts, n, SamplingSettings(max_tokens=4, turn=turn))

    check(TurnStep("c", "r", 0), n=4)
    check(TurnStep("c", "r", 2, (0, 5)))
    for turn, n, why in [
        (TurnStep("", "r", 0), 1, "caller and rollout"),
        (TurnStep("c", "r", 0, (0, 1)), 1, "round 0's episodes"),
        (TurnStep("c", "r", 1, (0, 1)), 2, "group_size 1"),
        (TurnStep("c", "r", 1, (0,)), 1, "1 for 2 prompts"),
        (TurnStep("c", "r", 1, (4, 4)), 1, "at most once"),
    ]:
        with pytest.raises(EngineRequestError, match=why):
            check(turn, n=n)
