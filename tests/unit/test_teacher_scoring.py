"""Teacher scoring equals the learner's computation in every mode; the teacher pool loads on
demand within its memory budget; the batcher merges requests and fails bad ones alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from cascade.distill.scoring import ScoreRequest, check_score_request, score_sequences
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logits
from cascade.model.loading import load_model_weights_only
from services.teacher.batching import ScoringBatcher
from services.teacher.pool import TeacherLoadError, TeacherPool, UnknownTeacherError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[1, 5, 9, 13, 17], [4, 8], [30, 31, 32]]
COMPLETIONS = [[40, 41, 42], [50, 51, 52, 53, 54, 2], [60]]


def learner_logprobs(model, prompts, completions, t: float) -> torch.Tensor:
    sb = build_batch(prompts, completions, pad_id=0)
    with torch.no_grad():
        return torch.log_softmax(completion_logits(model, sb, t), dim=-1)  # [B, C, V]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_all_modes_match_the_learner(random_tiny_model: Path, temperature: float) -> None:
    model = load_model_weights_only(random_tiny_model)
    ref = learner_logprobs(model, PROMPTS, COMPLETIONS, temperature)
    requests = [
        ScoreRequest(PROMPTS, COMPLETIONS, mode, temperature=temperature, topk=8)
        for mode in ("sampled", "topk", "full")
    ]
    # max_batch=2 splits the 9 sequences across forwards with different padding
    sampled, topk, full = score_sequences(model, requests, pad_id=0, max_batch=2)
    for i, c in enumerate(COMPLETIONS):
        n = len(c)
        want = ref[i, :n].gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(sampled[i].logprobs, want, atol=1e-5, rtol=0)
        values, ids = ref[i, :n].topk(8, dim=-1)
        assert torch.equal(topk[i].topk_ids, ids)
        torch.testing.assert_close(topk[i].topk_logprobs, values, atol=1e-5, rtol=0)
        torch.testing.assert_close(full[i].full_logprobs, ref[i, :n], atol=1e-5, rtol=0)
        assert sampled[i].full_logprobs is None and full[i].logprobs is None


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ScoreRequest([[1]], [[384]], "sampled"), "completion_ids: token id 384 out of the vocabulary"),
        (ScoreRequest([[-3]], [[1]], "sampled"), "prompt_ids: token id -3 out of"),
        (ScoreRequest([[]], [[1]], "sampled"), "empty prompt"),
        (ScoreRequest([[1]], [[]], "sampled"), "completion_ids: empty"),
        (ScoreRequest([], [], "sampled"), "sequences: empty"),
        (
            ScoreRequest([[1] * 200], [[1] * 57], "sampled"),
            "200 \\+ 57 tokens exceed the teacher's context of 256",
        ),
        (ScoreRequest([[1]], [[1]], "topk", topk=0), "topk: must be in \\[1, 384\\]"),
        (ScoreRequest([[1]], [[1]], "topk", topk=385), "topk: must be in"),
        (ScoreRequest([[1]], [[1]], "sampled", temperature=0.0), "temperature: must be > 0"),
    ],
)
def test_bad_score_requests(request_: ScoreRequest, message: str) -> None:
    with pytest.raises(EngineRequestError, match=message):
        check_score_request(request_, vocab_size=384, max_context=256)


def test_pool_loads_on_demand_and_evicts_within_budget(tiny_checkpoints: dict[str, Path]) -> None:
    one_model = 3_400_000  # the tiny model: ~3.3 MB of float32 weights
    pool = TeacherPool(
        {"math": tiny_checkpoints["base"], "code": tiny_checkpoints["perturbed1"]},
        memory_budget_bytes=int(1.5 * one_model),
    )
    assert pool.names() == ["code", "math"] and pool.resident_bytes == 0
    math = pool.get("math")
    assert math.vocab_size == 384 and math.max_context == 256 and pool.loads == 1
    assert pool.get("math").model is math.model and pool.loads == 1  # cached
    pool.get("code")  # two do not fit: math goes
    assert pool.evictions == 1 and [s.loaded for s in pool.statuses()] == [True, False]
    assert 0 < pool.resident_bytes <= pool.memory_budget_bytes
    pool.set("code", tiny_checkpoints["perturbed2"])  # a new best checkpoint: reloads on use
    assert [s.loaded for s in pool.statuses()] == [False, False]
    assert pool.get("code").path == str(tiny_checkpoints["perturbed2"])
    with pytest.raises(UnknownTeacherError, match="unknown teacher 'swe' \\(known: code, math\\)"):
        pool.get("swe")
    with pytest.raises(TeacherLoadError, match="not a model directory"):
        pool.set("swe", tiny_checkpoints["base"] / "nope")
    small = TeacherPool({"math": tiny_checkpoints["base"]}, memory_budget_bytes=1000)
    with pytest.raises(TeacherLoadError, match="exceed the memory budget"):
        small.get("math")
    broken = TeacherPool({"if": tiny_checkpoints["truncated"]}, memory_budget_bytes=10 * one_model)
    with pytest.raises(TeacherLoadError, match="unreadable checkpoint"):
        broken.get("if")


def test_batcher_merges_requests_and_fails_bad_ones_alone(random_tiny_model: Path) -> None:
    pool = TeacherPool({"math": random_tiny_model}, memory_budget_bytes=1 << 30)
    batches: list[tuple[str, int, int]] = []
    batcher = ScoringBatcher(
        pool, max_batch_sequences=64, max_wait_s=1.0, on_batch=lambda *a: batches.append(a)
    )
    try:
        pool.get("math")  # load first, so the requests below queue up together
        gate = threading.Barrier(3)
        futures: dict[str, object] = {}

        def submit(key: str, req: ScoreRequest) -> None:
            with batcher.announce():  # as the server does from the moment an RPC arrives
                gate.wait()
                futures[key] = batcher.submit("math", req)

        good = ScoreRequest(PROMPTS, COMPLETIONS, "sampled")
        bad = ScoreRequest([[1]], [[999]], "sampled")
        threads = [threading.Thread(target=submit, args=a) for a in (("a", good), ("b", bad), ("c", good))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a = futures["a"].result(timeout=30)  # type: ignore[attr-defined]
        c = futures["c"].result(timeout=30)  # type: ignore[attr-defined]
        with pytest.raises(EngineRequestError, match="token id 999"):
            futures["b"].result(timeout=30)  # type: ignore[attr-defined]
        assert batches == [("math", 2, 6)]  # one forward batch for both good requests
        for x, y in zip(a.scores, c.scores, strict=True):
            assert torch.equal(x.logprobs, y.logprobs)
        with pytest.raises(UnknownTeacherError):
            batcher.submit("nope", good).result(timeout=30)
        start = time.monotonic()
        batcher.submit("math", good).result(timeout=30)  # nothing announced: no waiting
        assert time.monotonic() - start < 0.5  # max_wait_s is 1.0
    finally:
        batcher.close()
