"""The distillation mode registry (`cascade.distill.modes`): one object per `distill.loss` value,
agreeing with the config and the proto; each mode's question to the teacher service, teacher-side
scores and token layouts on a hand example small enough to write out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, get_args

import pytest
import torch

from cascade.config import DistillConfig
from cascade.distill.modes import (
    MODES,
    DistillMode,
    FullMode,
    SampledMode,
    TeacherRequest,
    TopkMode,
    UnknownModeError,
    distill_mode,
    local_teacher_tokens,
    mode_of_enum,
    register,
)
from cascade.distill.samples import SequenceScores
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import build_batch
from cascade_proto.v1 import teacher_pb2 as pb

# The fake teacher's logits depend on the current token only: row t predicts the token after t.
TABLE = torch.tensor(
    [
        [0.0, 0.0, 0.0, 0.0],
        [1.0, 2.0, 0.5, -1.0],
        [0.3, -0.2, 2.5, 0.1],
        [-1.0, 0.0, 1.0, 3.0],
    ]
)
V = TABLE.shape[1]


class TableModel(torch.nn.Module):
    """A language model whose next-token logits are `TABLE[current token]`."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(TABLE.clone(), requires_grad=False)
        self.config = SimpleNamespace(model_type="table")

    @property
    def device(self) -> torch.device:
        return self.table.device

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids])


def test_an_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownModeError) as err:
        distill_mode("kl")
    assert str(err.value) == "unknown distillation mode 'kl'; valid modes: sampled, topk, full"
    assert isinstance(err.value, KeyError)


def test_the_registry_agrees_with_the_config_and_the_proto() -> None:
    assert set(get_args(DistillConfig.model_fields["loss"].annotation)) == set(MODES)
    wire = {v for v in pb.LogprobMode.values() if v != pb.LOGPROB_MODE_UNSPECIFIED}
    assert {m.proto_enum for m in MODES.values()} == wire
    for name, m in MODES.items():
        assert m.name == name and distill_mode(name) is m and mode_of_enum(m.proto_enum) is m
        assert pb.LogprobMode.Name(m.proto_enum) == f"LOGPROB_MODE_{name.upper()}"
    assert mode_of_enum(pb.LOGPROB_MODE_UNSPECIFIED) is None


def test_a_name_or_enum_is_registered_once() -> None:
    class Again(SampledMode):
        proto_enum = pb.LOGPROB_MODE_UNSPECIFIED

    class SameEnum(SampledMode):
        name = "sampled-again"

    for cls in (Again, SameEnum):
        with pytest.raises(ValueError, match="sampled"):
            register(cls)
    assert list(MODES) == ["sampled", "topk", "full"]


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("sampled", (TeacherRequest("sampled", 0.7, 4),)),
        ("topk", (TeacherRequest("topk", 1.0, 4), TeacherRequest("sampled", 1.0, 0))),
        ("full", (TeacherRequest("full", 1.0, 4),)),
    ],
)
def test_what_each_mode_asks_the_teacher_service(mode: str, want: tuple[TeacherRequest, ...]) -> None:
    """The distillation temperature for `sampled` only (the other losses temper the T=1 teacher
    themselves); k capped at the vocabulary; top-k's T=1 pass for its reverse-KL metric."""
    cfg = DistillConfig(loss=mode, temperature=0.7, topk=9)  # type: ignore[arg-type]
    assert distill_mode(mode).requests(cfg, vocab_size=V) == want


def _lp(t: float = 1.0) -> torch.Tensor:
    """Log-probs predicting completion [2, 3] after prompt [1]: rows TABLE[1], TABLE[2]."""
    return torch.log_softmax(TABLE[[1, 2]] / t, dim=-1)


def test_the_teacher_side_scores_of_each_mode() -> None:
    lp, tokens = _lp(0.5), torch.tensor([2, 3])
    sampled = SampledMode().score(lp, 0, tokens)
    assert torch.equal(sampled.logprobs, torch.stack([lp[0, 2], lp[1, 3]]))  # type: ignore[arg-type]
    assert sampled.topk_ids is None and sampled.full_logprobs is None
    top = TopkMode().score(lp, 2, tokens)
    assert top.topk_ids is not None and top.topk_ids.tolist() == [[1, 0], [2, 0]]
    assert torch.equal(top.topk_logprobs, lp.gather(-1, top.topk_ids))  # type: ignore[arg-type]
    assert TopkMode().score(lp, 99, tokens).topk_ids.shape == (2, V)  # type: ignore[union-attr]
    assert torch.equal(FullMode().score(lp, 0, tokens).full_logprobs, lp)  # type: ignore[arg-type]


def test_the_teacher_side_checks_and_reply_fields() -> None:
    for k in (0, V + 1):
        with pytest.raises(EngineRequestError, match=rf"topk: must be in \[1, {V}\] for mode topk"):
            distill_mode("topk").check_request(k, V)
    for m in MODES.values():
        m.check_request(0, V) if m.name != "topk" else m.check_request(V, V)
    assert [m.reply_topk(5) for m in MODES.values()] == [0, 5, 0]
    assert FullMode().reply_size_error(16, 4, 256) is None  # exactly 256 bytes
    assert FullMode().reply_size_error(16, 4, 255) == (
        "full log-probs for 16 tokens x 4 vocabulary (0 MiB) exceed the 0 MiB message limit: "
        "send fewer sequences or use topk"
    )
    assert SampledMode().reply_size_error(10**9, 10**6, 1) is None


@pytest.mark.parametrize("mode", ["sampled", "topk", "full"])
def test_local_and_remote_layouts_agree_on_a_hand_example(mode: str) -> None:
    """Two sequences, completions of 2 and 1 tokens: the [B, C=2, ...] layout, the same from a
    teacher model in this process and from the service's replies at the counted positions
    (the replies' padding is zeros; the local model's is whatever it predicts there)."""
    cfg = DistillConfig(loss=mode, temperature=0.5, topk=2)  # type: ignore[arg-type]
    sb = build_batch([[1], [3]], [[2, 3], [1]], pad_id=0)
    local = local_teacher_tokens(TableModel(), sb, cfg)  # type: ignore[arg-type]
    row0, row1 = TABLE[[1, 2]], TABLE[[3]]  # logits predicting each completion token
    m = distill_mode(mode)
    replies = []
    for r in m.requests(cfg, V):
        rows = [torch.log_softmax(x / r.temperature, dim=-1) for x in (row0, row1)]
        toks = [torch.tensor([2, 3]), torch.tensor([1])]
        replies.append([distill_mode(r.mode).score(x, r.topk, t) for x, t in zip(rows, toks, strict=True)])
    remote = m.remote_tokens(replies, sb)
    t1 = torch.log_softmax(TABLE, dim=-1)
    if mode == "sampled":
        tempered = torch.log_softmax(TABLE / 0.5, dim=-1)
        want = torch.tensor([[tempered[1, 2], tempered[2, 3]], [tempered[3, 1], 0.0]])
        assert torch.allclose(local.logprobs, want) and torch.allclose(remote.logprobs, want)  # type: ignore[arg-type]
        assert local.logits is None and local.topk_ids is None
    elif mode == "topk":
        assert (
            local.topk_ids is not None and local.topk_logprobs is not None and local.logprobs_t1 is not None
        )
        assert (
            remote.topk_ids is not None
            and remote.topk_logprobs is not None
            and remote.logprobs_t1 is not None
        )
        assert remote.topk_ids.tolist() == [[[1, 0], [2, 0]], [[3, 2], [0, 0]]]
        assert remote.topk_ids.dtype == torch.long
        want_top = torch.tensor(
            [[[t1[1, 1], t1[1, 0]], [t1[2, 2], t1[2, 0]]], [[t1[3, 3], t1[3, 2]], [0.0, 0.0]]]
        )
        assert torch.allclose(remote.topk_logprobs, want_top)
        want_t1 = torch.tensor([[t1[1, 2], t1[2, 3]], [t1[3, 1], 0.0]])
        assert torch.allclose(remote.logprobs_t1, want_t1)
        counted = sb.completion_mask.bool()
        assert torch.equal(local.topk_ids[counted], remote.topk_ids[counted])
        assert torch.allclose(local.topk_logprobs[counted], want_top[counted])
        assert torch.allclose(local.logprobs_t1[counted], want_t1[counted])
        assert m.remote_tokens(replies[:1], sb).logprobs_t1 is None  # the metric's pass is optional
    else:
        assert torch.equal(local.logits[0], row0) and torch.equal(local.logits[1, :1], row1)  # type: ignore[index]
        assert torch.allclose(remote.logits[0], t1[[1, 2]]) and torch.allclose(remote.logits[1, :1], t1[[3]])  # type: ignore[index]
        assert not remote.logits[1, 1].any()  # type: ignore[index]


def test_a_reply_without_the_mode_s_field_is_refused() -> None:
    sb = build_batch([[1]], [[2]], pad_id=0)
    with pytest.raises(ValueError, match="teacher reply lacks topk_ids for a topk loss"):
        distill_mode("topk").remote_tokens([[SequenceScores(logprobs=torch.zeros(1))]], sb)


def test_every_mode_is_a_distill_mode() -> None:
    assert all(isinstance(m, DistillMode) for m in MODES.values())
