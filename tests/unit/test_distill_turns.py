"""Distillation on a two-turn episode (an agent teacher's prompt): the student's own tokens are
distilled, the tool's never are, whichever side the teacher's values come from.

The row is the one of `test_turn_mask.py` (completion `m m m | e e | m m`: three tokens of turn
1, two of the tool's response, two of turn 2), carried as `DistillSamples` with its layout, so
the batch the teacher and the student are scored on is `distill_batch`'s. The teacher's values
at the tool's positions are nan or huge: any of them reaching the loss or a metric shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cascade.algo.distill import (
    FullDistillInput,
    SampledDistillInput,
    full_distill_loss,
    sampled_distill_loss,
)
from cascade.algo.turn_mask import TurnLayout
from cascade.config import DistillConfig, StageConfig
from cascade.distill.modes import local_teacher_tokens, remote_teacher_tokens
from cascade.distill.samples import DistillSamples, SequenceScores, TeacherTokens, distill_batch
from cascade.engine.logprobs import completion_logits, completion_logprobs
from cascade.model.loading import load_policy
from cascade.runner.distill import DistillData, distill_loss_term, distill_terms, share_distill

LAYOUT, IDS = TurnLayout.of_pieces([([11, 12, 13], True), ([90, 91], False), ([14, 15], True)])
MODEL = [0, 1, 2, 5, 6]
ENV = [3, 4]
PROMPT = [5, 6, 7]
NAN = float("nan")


def _samples(rollout: list[float], temperature: float = 1.0) -> DistillSamples:
    """The two-turn row and a single-turn row of two tokens (padding after it)."""
    return DistillSamples(
        "agent",
        [PROMPT, PROMPT[:2]],
        [IDS, [20, 21]],
        [rollout, [0.0, 0.0]],
        temperature,
        [LAYOUT, TurnLayout(((2, True),))],
    )


def test_the_batch_counts_only_the_students_tokens() -> None:
    sb = distill_batch(_samples([0.0] * 7), pad_id=0)
    assert sb.completion_mask.tolist() == [[1, 1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]]
    # every token is context: the tool's response is in the forward pass of both models
    assert sb.attention_mask[0, sb.prompt_len :].tolist() == [1] * 7
    shared = share_distill(
        DistillData(_samples([0.0] * 7), sb, TeacherTokens(logprobs=torch.zeros(2, 7))), 0, 2, 0
    )
    assert shared.batch.completion_mask.tolist() == [[1, 1, 1, 0, 0, 1, 1]]


def test_sampled_loss_by_hand_from_a_remote_teachers_reply() -> None:
    """The teacher service scores every completion token; its values at the tool's tokens (nan
    here) change nothing. By hand (as in test_turn_mask): student s = [-1, -0.5, -2, -0.3, -1.2],
    teacher t = [-0.5, -0.5, -1, -0.6, -1.2] at the model's tokens, on-policy: a = t - s =
    [0.5, 0, 1, -0.3, 0]; loss = mean(-a * s) over the five = (0.5 + 0 + 2 - 0.09 + 0) / 5."""
    samples = _samples([0.0] * 7)
    sb = distill_batch(samples, pad_id=0)
    teacher = [-0.5, -0.5, -1.0, NAN, 1e4, -0.6, -1.2]
    reply = [
        SequenceScores(logprobs=torch.tensor(teacher)),
        SequenceScores(logprobs=torch.tensor([-1.0, -1.0])),
    ]
    tokens = remote_teacher_tokens(reply, sb, DistillConfig(loss="sampled"))
    student = torch.tensor(
        [[-1.0, -0.5, -2.0, NAN, NAN, -0.3, -1.2], [-1.0, -1.0, NAN, NAN, NAN, NAN, NAN]]
    ).requires_grad_()
    out = sampled_distill_loss(
        SampledDistillInput(
            student_logprobs=student, teacher_logprobs=tokens.logprobs, mask=sb.completion_mask
        )
    )
    # the single-turn row adds two tokens with a = 0 (teacher == student): 7 tokens in the mean
    assert out.loss.item() == pytest.approx((0.5 + 2.0 - 0.09) / 7, abs=1e-6)
    assert out.metrics["n_tokens"] == 7
    out.loss.backward()
    assert student.grad is not None
    assert student.grad[0].tolist() == pytest.approx(
        [-0.5 / 7, 0.0, -1 / 7, 0.0, 0.0, 0.3 / 7, 0.0], abs=1e-6
    )


@pytest.fixture(scope="module")
def student_and_teacher(random_tiny_model: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The random tiny model as the student; the same with perturbed weights as the teacher."""
    student = load_policy(random_tiny_model).model.eval()
    teacher = load_policy(random_tiny_model).model.eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return student, teacher


def test_student_and_teacher_terms_leave_out_the_tool_tokens(
    student_and_teacher: tuple[torch.nn.Module, torch.nn.Module],
) -> None:
    """Through `distill_loss_term` on real models: the loss is the hand formula over the model's
    tokens of each row, the same whether the teacher's tokens come from this process or from a
    reply whose tool positions are nan; the student's gradient at the tool's positions is 0."""
    student, teacher = student_and_teacher
    cfg = DistillConfig(loss="sampled")
    probe = distill_batch(_samples([0.0] * 7), pad_id=0)
    with torch.no_grad():
        s = completion_logprobs(student, probe, 1.0)
    # on-policy rollout log-probs, scattered as the turn loop hands them (0.0 at the tool's tokens)
    samples = _samples(LAYOUT.scatter([float(s[0, i]) for i in MODEL]))
    samples.rollout_logprobs[1] = [float(v) for v in s[1, :2]]
    sb = distill_batch(samples, pad_id=0)
    local = local_teacher_tokens(teacher, sb, cfg)
    assert local.logprobs is not None
    t = local.logprobs
    # by hand: mean over the 5 + 2 model tokens of -(t - s) * s (w = 1 on-policy)
    terms = [-(t[0, i] - s[0, i]) * s[0, i] for i in MODEL] + [-(t[1, i] - s[1, i]) * s[1, i] for i in (0, 1)]
    expected = float(sum(terms)) / 7
    got = distill_loss_term(student, sb, local, samples, cfg)
    assert got.loss is not None and got.loss.item() == pytest.approx(expected, rel=1e-5)
    assert got.metrics["distill_agent_n_tokens"] == 7

    wild = t.clone()
    wild[0, ENV] = torch.tensor([NAN, 1e4])
    reply = [SequenceScores(logprobs=wild[0]), SequenceScores(logprobs=wild[1, :2])]
    remote = distill_loss_term(student, sb, remote_teacher_tokens(reply, sb, cfg), samples, cfg)
    assert remote.loss is not None and remote.loss.item() == pytest.approx(expected, rel=1e-5)
    assert remote.metrics == pytest.approx(got.metrics)

    # counting the tool's tokens would have changed the loss: the mask is what keeps them out
    naive = _samples(samples.rollout_logprobs[0])
    naive.layouts = None
    unmasked = distill_loss_term(student, distill_batch(naive, 0), local, naive, cfg)
    assert unmasked.metrics["distill_agent_n_tokens"] == 9
    assert unmasked.loss is not None and abs(unmasked.loss.item() - expected) > 1e-4


@pytest.mark.parametrize("loss", ["full", "topk"])
def test_full_and_topk_terms_equal_the_loss_of_the_model_tokens(
    student_and_teacher: tuple[torch.nn.Module, torch.nn.Module], loss: str
) -> None:
    """Full and top-k modes: the teacher's logits at the tool's tokens (made wild) change
    nothing; the full loss equals the one over the model's tokens alone, and the reverse-KL
    metric is finite with nan teacher log-probs there."""
    student, teacher = student_and_teacher
    cfg = DistillConfig(loss=loss, topk=4, temperature=2.0)  # type: ignore[arg-type]
    samples = _samples([0.0] * 7)
    sb = distill_batch(samples, pad_id=0)
    local = local_teacher_tokens(teacher, sb, cfg)
    base = distill_loss_term(student, sb, local, samples, cfg)
    if loss == "full":
        assert local.logits is not None
        wild = TeacherTokens(logits=local.logits.clone())
        assert wild.logits is not None
        wild.logits[0, ENV] = 1e4 * torch.randn(
            2, wild.logits.shape[-1], generator=torch.Generator().manual_seed(2)
        )
        with torch.no_grad():
            s_logits = completion_logits(student, sb, 1.0)
        keep = sb.completion_mask.bool()
        alone = full_distill_loss(
            FullDistillInput(
                s_logits[keep].unsqueeze(0),
                local.logits[keep].unsqueeze(0),
                torch.ones(1, 7),
                temperature=2.0,
            )
        )
        assert base.loss is not None and base.loss.item() == pytest.approx(alone.loss.item(), rel=1e-5)
    else:
        assert (
            local.topk_ids is not None and local.topk_logprobs is not None and local.logprobs_t1 is not None
        )
        ids, lps, t1 = local.topk_ids.clone(), local.topk_logprobs.clone(), local.logprobs_t1.clone()
        lps[0, ENV] = 50.0
        ids[0, ENV] = 0
        t1[0, ENV] = NAN
        wild = TeacherTokens(topk_ids=ids, topk_logprobs=lps, logprobs_t1=t1)
    moved = distill_loss_term(student, sb, wild, samples, cfg)
    assert moved.loss is not None and base.loss is not None
    assert moved.loss.item() == pytest.approx(base.loss.item(), rel=1e-6)
    assert moved.metrics == pytest.approx(base.metrics)
    kl = moved.metrics["distill_agent_reverse_kl"]
    assert kl == kl  # not nan
    _, metrics = distill_terms(
        student, [DistillData(samples, sb, local, {"distill_agent_x": 1.0})], _stage(cfg)
    )
    assert metrics["distill_agent_x"] == 1.0 and metrics["distill_agent_n_tokens"] == 7


def _stage(cfg: DistillConfig) -> StageConfig:
    return StageConfig(domain="math", distill=cfg)
