"""Teacher scoring equals the learner's computation in every mode, within any memory bound (token
micro-batches, logits over chunks of positions); the teacher pool loads on demand within its
memory budget; the batcher merges requests and fails bad ones alone, and refuses what its bounds
cannot hold before computing anything."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cascade.distill.scoring import UNBOUNDED, ScoreRequest, check_score_request, score_sequences
from cascade.engine.base import EngineRequestError
from cascade.engine.batch import build_batch
from cascade.engine.logprobs import completion_logits
from cascade.engine.microbatch import MicroBatching
from cascade.model.loading import load_model_weights_only
from services.teacher.batching import ScoringBatcher
from services.teacher.main import parse_args
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
    # two sequences per forward split the 9 sequences across forwards with different padding
    sampled, topk, full = score_sequences(model, requests, pad_id=0, batching=replace(UNBOUNDED, sequences=2))
    for i, c in enumerate(COMPLETIONS):
        n = len(c)
        want = ref[i, :n].gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(sampled[i].logprobs, want, atol=1e-5, rtol=0)
        values, ids = ref[i, :n].topk(8, dim=-1)
        assert torch.equal(topk[i].topk_ids, ids)
        torch.testing.assert_close(topk[i].topk_logprobs, values, atol=1e-5, rtol=0)
        torch.testing.assert_close(full[i].full_logprobs, ref[i, :n], atol=1e-5, rtol=0)
        assert sampled[i].full_logprobs is None and full[i].logprobs is None


VOCAB = 384  # the tiny model's
ONE_SEQUENCE = MicroBatching(tokens=1, logits_chunk_bytes=3 * 4 * VOCAB)
"""One sequence per forward, the logits of 3 positions at a time."""
BOUNDS = {
    "one sequence, 3 positions": ONE_SEQUENCE,
    "48 tokens, 5 positions": MicroBatching(tokens=48, logits_chunk_bytes=5 * 4 * VOCAB),
    "all at once, 3 positions": replace(UNBOUNDED, logits_chunk_bytes=3 * 4 * VOCAB),
    "one sequence, whole logits": replace(ONE_SEQUENCE, logits_chunk_bytes=2**40),
}


def long_requests(mode: str) -> list[ScoreRequest]:
    """Two requests, 7 sequences: the first four share their prompt (so the unbounded forward
    takes the shared-prefix path), completions from 1 to 25 tokens."""
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=gen).tolist()

    shared = ids(7)
    prompts = [shared, shared, shared, shared, [1, 5, 9], ids(20), [4, 8]]
    completions = [ids(n) for n in (11, 3, 17, 2, 1, 9, 25)]
    return [
        ScoreRequest(prompts[:4], completions[:4], mode, temperature=0.7, topk=8),
        ScoreRequest(prompts[4:], completions[4:], mode, temperature=0.7, topk=8),
    ]


@pytest.mark.parametrize("mode", ["sampled", "topk", "full"])
@pytest.mark.parametrize("bound", list(BOUNDS))
def test_bounded_scoring_matches_the_unbounded(
    random_tiny_model: Path, monkeypatch: pytest.MonkeyPatch, mode: str, bound: str
) -> None:
    model = load_model_weights_only(random_tiny_model)
    requests = long_requests(mode)
    want = score_sequences(model, requests, pad_id=0)
    batching = BOUNDS[bound]
    forwards: list[tuple[int, int]] = []
    logits: list[torch.Size] = []
    model.model.register_forward_pre_hook(
        lambda _m, _a, kw: forwards.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    log_softmax = torch.log_softmax
    monkeypatch.setattr(
        torch, "log_softmax", lambda x, dim: logits.append(x.shape) or log_softmax(x, dim=dim)
    )
    got = score_sequences(model, requests, pad_id=0, batching=batching)
    for rows, cols in forwards:  # every forward within the token bound (a longer sequence alone)
        assert rows == 1 or batching.tokens is None or rows * cols <= batching.tokens
    if batching.tokens == 1:
        assert len(forwards) == 7
    for shape in logits:  # never more float32 logits at once than the bound
        assert shape.numel() * 4 <= batching.logits_chunk_bytes
    for want_r, got_r in zip(want, got, strict=True):
        for w, g in zip(want_r, got_r, strict=True):
            if mode == "sampled":
                torch.testing.assert_close(g.logprobs, w.logprobs, atol=1e-5, rtol=0)
            elif mode == "topk":
                assert torch.equal(g.topk_ids, w.topk_ids)
                torch.testing.assert_close(g.topk_logprobs, w.topk_logprobs, atol=1e-5, rtol=0)
            else:
                torch.testing.assert_close(g.full_logprobs, w.full_logprobs, atol=1e-5, rtol=0)
            assert {f for f in vars(g) if getattr(g, f) is not None} == {
                f for f in vars(w) if getattr(w, f) is not None
            }


def test_bounds_that_do_not_bind_change_nothing(random_tiny_model: Path) -> None:
    """The service's defaults on small requests: the unbounded computation, bit for bit (what
    keeps a distributed run's teacher log-probs equal to the embedded run's)."""
    model = load_model_weights_only(random_tiny_model)
    defaults = MicroBatching(tokens=32768, sequences=64, logits_chunk_bytes=256 * 2**20)
    for mode in ("sampled", "topk", "full"):
        requests = long_requests(mode)
        want = score_sequences(model, requests, pad_id=0)
        got = score_sequences(model, requests, pad_id=0, batching=defaults)
        for w, g in zip(sum(want, []), sum(got, []), strict=True):
            for name, value in vars(w).items():
                assert (value is None) == (getattr(g, name) is None)
                assert value is None or torch.equal(value, getattr(g, name)), (mode, name)


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


def test_pool_holds_one_copy_of_a_checkpoint_several_domains_share(tiny_checkpoints: dict[str, Path]) -> None:
    one_model = 3_400_000
    pool = TeacherPool(
        {"math": tiny_checkpoints["base"], "code": tiny_checkpoints["base"]},
        memory_budget_bytes=int(1.5 * one_model),
    )
    math = pool.get("math")
    code = pool.get("code")  # the same directory: the loaded copy, no second load, no eviction
    assert code.model is math.model and pool.loads == 1 and pool.evictions == 0
    assert 0 < pool.resident_bytes < one_model * 1.1  # counted once
    pool.set("math", tiny_checkpoints["perturbed1"])  # math's best moves on: code keeps (and counts) it
    assert pool.get("code").model is math.model and 0 < pool.resident_bytes < one_model * 1.1
    pool.get("math")  # two distinct copies do not fit: the shared one goes
    assert pool.loads == 2 and pool.evictions == 1 and [s.loaded for s in pool.statuses()] == [False, True]


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


def test_batcher_refuses_what_its_bounds_cannot_hold(random_tiny_model: Path) -> None:
    """A sequence longer than a forward may be, a reply over the message limit: refused before
    anything is computed, naming the bound; a request within them is scored in bounded forwards."""
    pool = TeacherPool({"math": random_tiny_model}, memory_budget_bytes=1 << 30)
    batches: list[tuple[str, int, int]] = []
    tokens = sum(len(c) for c in COMPLETIONS)  # 10 completion tokens
    batcher = ScoringBatcher(
        pool,
        max_batch_tokens=12,
        logits_chunk_bytes=2 * 4 * VOCAB,
        max_reply_bytes=tokens * VOCAB * 4,
        max_wait_s=0.0,
        on_batch=lambda *a: batches.append(a),
    )
    try:
        long = ScoreRequest([[1] * 5], [[7] * 8], "sampled")
        message = r"sequences\[0\]: 5 \+ 8 tokens exceed the teacher service's --max-batch-tokens of 12"
        with pytest.raises(EngineRequestError, match=message):
            batcher.submit("math", long).result(timeout=30)
        too_big = ScoreRequest([*PROMPTS, [2]], [*COMPLETIONS, [3]], "full")  # one token over
        with pytest.raises(EngineRequestError, match="message limit: send fewer sequences or use topk"):
            batcher.submit("math", too_big).result(timeout=30)
        assert batches == []  # neither reached the model
        request = ScoreRequest(PROMPTS, COMPLETIONS, "full")
        got = batcher.submit("math", request).result(timeout=30).scores
        want = score_sequences(load_model_weights_only(random_tiny_model), [request], pad_id=0)[0]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.full_logprobs, w.full_logprobs, atol=1e-5, rtol=0)
        assert batches == [("math", 1, 3)]
    finally:
        batcher.close()


def test_service_bounds_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([])
    assert (args.max_batch_tokens, args.logits_chunk_mib) == (32768, 256.0)
    for argv, message in (
        (["--max-batch-tokens", "0"], "--max-batch-tokens must be at least 1"),
        (["--logits-chunk-mib", "0"], "--logits-chunk-mib must be positive (got 0.0)"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
