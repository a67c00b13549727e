"""rl_term with failed verifiers: masked out of the group statistics, measured, and bounded."""

from __future__ import annotations

import pytest
import torch

from cascade.algo import GrpoLossInput, grpo_loss
from cascade.config import GrpoConfig
from cascade.domains.base import INFRA_ERROR, OK, WRONG_ANSWER, Problem, RewardVerdict
from cascade.rollout.requests import RolloutBatch
from cascade.runner.rl import VerifierFailureError, check_verifier_failures, rl_term


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).eval()


def _batch(verdicts: list[RewardVerdict], group_size: int = 4) -> RolloutBatch:
    n = len(verdicts)
    problems = [
        Problem(id=f"math-test-{i}", domain="math", prompt="q", answer="1") for i in range(n // group_size)
    ]
    return RolloutBatch(
        domain="math",
        problems=problems,
        group_size=group_size,
        prompt_ids=[[3, 4, 5]] * n,
        completion_ids=[[6 + i % 7, 7, 8 + i % 5] for i in range(n)],
        logprobs=[[-1.0] * 3] * n,
        finish_reasons=["stop"] * n,
        texts=[""] * n,
        verdicts=verdicts,
        policy_version=0,
        temperature=1.0,
    )


RIGHT = RewardVerdict(1.0, OK)
WRONG = RewardVerdict(0.0, WRONG_ANSWER, "got 2")


def _failed(cause: str = "math worker process died") -> RewardVerdict:
    return RewardVerdict(0.0, INFRA_ERROR, cause)


def test_failed_samples_have_no_advantage_and_no_weight(model: torch.nn.Module) -> None:
    batch = _batch([RIGHT, WRONG, _failed(), _failed()])
    term = rl_term(model, batch, GrpoConfig(), pad_id=0, current_version=0, drop_zero_variance=True)
    assert term.metrics["verifier_failure_fraction"] == 0.5
    assert term.metrics["kept_sequences"] == 2.0
    assert term.metrics["reward_mean"] == 0.5  # over the valid samples only
    # The same loss as GRPO on the two valid samples alone with advantages +-0.707106
    # (mean 0.5, sample std 0.707107), not the +-1.2247 the failed samples used to cause.
    from cascade.engine.batch import build_batch
    from cascade.engine.logprobs import completion_logprobs

    sb = build_batch(batch.prompt_ids[:2], batch.completion_ids[:2], 0)
    expected = grpo_loss(
        GrpoLossInput(
            logprobs=completion_logprobs(model, sb, 1.0),
            advantages=torch.tensor([0.707106, -0.707106]),
            mask=sb.completion_mask,
            group_ids=torch.tensor([0, 0]),
        )
    )
    assert term.loss is not None
    torch.testing.assert_close(term.loss, expected.loss, atol=1e-5, rtol=0)


def test_no_failures_reports_zero(model: torch.nn.Module) -> None:
    batch = _batch([RIGHT, WRONG, WRONG, RIGHT])
    term = rl_term(model, batch, GrpoConfig(), pad_id=0, current_version=0, drop_zero_variance=True)
    assert term.metrics["verifier_failure_fraction"] == 0.0
    assert term.metrics["kept_sequences"] == 4.0


def test_a_step_past_the_bound_raises_with_the_causes(model: torch.nn.Module) -> None:
    queue = _failed("reward queue unavailable")
    batch = _batch([RIGHT, WRONG, _failed(), _failed(), queue, WRONG, RIGHT, WRONG])  # 3 of 8: 0.375
    cfg = GrpoConfig(max_verifier_failure_fraction=0.25)
    with pytest.raises(VerifierFailureError) as info:
        rl_term(model, batch, cfg, pad_id=0, current_version=0, drop_zero_variance=True)
    err = info.value
    assert (err.n_failed, err.n_total, err.fraction, err.bound) == (3, 8, 0.375, 0.25)
    assert err.causes == [("math worker process died", 2), ("reward queue unavailable", 1)]
    message = str(err)
    assert "3 of 8 samples (37.5%)" in message
    assert "max_verifier_failure_fraction=0.25" in message
    assert "2x math worker process died; 1x reward queue unavailable" in message
    # At the bound is allowed (only passing it stops the step); 1 never stops.
    assert check_verifier_failures(batch, 0.375) == 0.375
    all_failed = _batch([_failed()] * 4)
    assert check_verifier_failures(all_failed, 1.0) == 1.0
    term = rl_term(
        model,
        all_failed,
        GrpoConfig(max_verifier_failure_fraction=1.0),
        pad_id=0,
        current_version=0,
        drop_zero_variance=True,
    )
    assert term.loss is None and term.metrics["verifier_failure_fraction"] == 1.0


def test_bound_is_validated() -> None:
    assert GrpoConfig().max_verifier_failure_fraction == 0.5
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="max_verifier_failure_fraction"):
            GrpoConfig(max_verifier_failure_fraction=bad)
