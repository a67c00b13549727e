"""The learner's step-memory estimate (`cascade.runner.step_memory.estimate_step`): every part
against a hand computation on a tiny shape, the decoder layer's activations against what torch
actually saves for the backward in Hugging Face's Qwen3 (float32 and bfloat16 autocast, one row
and padded rows, with and without activation checkpointing), the parameter counts of the Qwen3
shapes docs/sizing.md uses, and the sizing table in bench/results being the estimate's current
output. The config-level checks and refusals are in `test_step_memory.py`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from cascade.engine.microbatch import MicroBatching
from cascade.runner.step_memory import ModelShape, estimate_step

REPO = Path(__file__).resolve().parents[2]

TINY = ModelShape(hidden=8, layers=2, vocab=32, intermediate=16, tied=True, heads=2, kv_heads=1, head_dim=4)


def test_every_part_of_a_tiny_step_by_hand() -> None:
    # parameters: embeddings 32 x 8 = 256 (tied: once); per layer q 8 x 8 = 64 (q_dim = 2 heads
    # x 4 = 8), k and v 2 x 8 x 4 = 64 (kv_dim = 1 x 4), o 64, MLP 3 x 8 x 16 = 384, the two
    # RMSNorms 16: 592; two layers and the final norm (8): 256 + 1184 + 8 = 1448
    assert TINY.params() == 1448
    est = estimate_step(
        TINY,
        sequences=4,
        prompt_tokens=2,
        completion_tokens=6,  # width 8
        batching=MicroBatching(tokens=16, logits_chunk_bytes=4 * 32 * 5),  # 2 rows; 5-token chunks
        compute_dtype_bytes=2,  # bfloat16 autocast
        frozen_models=1,  # a KL reference, in bfloat16
    )
    assert (est.rows, est.width, est.micro_batches) == (2, 8, 2)
    # held: float32 weights 4 x 1448, gradients the same, AdamW's two moments 8 x 1448
    assert (est.weights, est.gradients, est.optimizer) == (5792, 5792, 11584)
    assert est.frozen == 1448 * 2 and est.driver_copy == 0 and est.teacher_data == 0
    # step data: 4 rows x (8 tokens x 24 bytes of ids/mask/positions + 6 x 16 of completion ids,
    # mask and behaviour log-probs) = 4 x 288
    assert est.step_data == 1152
    # one micro-batch: no distillation, so no RL gradient kept; autocast's bfloat16 weights
    assert est.gradient_snapshot == 0 and est.weight_copies == 1448 * 2
    # a decoder layer per token, 2 rows (so a mask, k and v repeated to both heads):
    #   RMSNorms 2 x (2 x 4 x 8 + 4) = 136; q, k, v and gate, up inputs 5 x 2 x 8 = 80;
    #   attention 2 x (2 x 8 + 2 x 8) + 4 x 2 (log-sum-exp) + 2 x 8 (the mask's float copy) = 88;
    #   MLP 4 x 2 x 16 = 128: 432
    assert TINY.layer_activation_bytes(width=8, compute_dtype_bytes=2, masked=True) == 432
    # outside the layers per token: final norm 2 x 4 x 8 + 4, ids 8, rotary cos/sin 2 x 4 x 4,
    # boolean mask 8: 116. Two layers: 2 x 432 + 116 = 980 a token, x 16 tokens
    assert est.activations == 16 * 980
    assert est.completion_hidden == 2 * 6 * 4 * 8  # float32 hidden states, 12 completion positions
    # one chunk of 5 positions x 32 vocabulary x (4 float32 copies + the bfloat16 logits)
    assert est.logits_chunk == 5 * 32 * 18 == 2880
    # the optimizer step: AdamW's foreach temporary, one float32 copy (no RL gradient copy
    # without a distillation term)
    assert est.optimizer_step == 5792
    assert est.held == 5792 + 5792 + 11584 + 2896 + 1152 == 27216
    assert est.micro_batch == 2896 + 15680 + 384 + 2880 == 21840
    assert est.total == 27216 + 21840 == 49056
    assert est.parts()["total"] == 49056

    # with checkpointing: each layer's float32 input (4 x 8) plus one layer recomputed
    ckpt = estimate_step(
        TINY,
        sequences=4,
        prompt_tokens=2,
        completion_tokens=6,
        batching=MicroBatching(tokens=16, logits_chunk_bytes=4 * 32 * 5, activation_checkpointing=True),
        compute_dtype_bytes=2,
    )
    assert ckpt.activations == 16 * (2 * 32 + 432 + 116)
    # float32, one row a micro-batch: no mask, k and v at their own head; one float32 tensor
    # feeds q, k and v (and one gate and up); no weight copies
    one = estimate_step(
        TINY,
        sequences=4,
        prompt_tokens=2,
        completion_tokens=6,
        batching=MicroBatching(tokens=8),
        compute_dtype_bytes=4,
    )
    # 136 + 2 x 4 x 8 + (4 x (2 x 8 + 2 x 4) + 8) + 4 x 4 x 16 = 136 + 64 + 104 + 256 = 560
    assert TINY.layer_activation_bytes(width=8, compute_dtype_bytes=4, masked=False) == 560
    assert (one.rows, one.micro_batches, one.weight_copies) == (1, 4, 0)
    assert one.activations == 8 * (2 * 560 + 108)
    # the default 256 MiB chunk holds more than a micro-batch's 6 positions: the chunk is those 6
    assert one.logits_chunk == 6 * 32 * 16


def test_distillation_ranks_and_teachers() -> None:
    base = dict(
        prompt_tokens=2, completion_tokens=6, batching=MicroBatching(tokens=16), compute_dtype_bytes=2
    )
    both = estimate_step(TINY, sequences=4, distill_sequences=6, teacher_token_bytes=8, **base)  # type: ignore[arg-type]
    # the RL gradient kept through distillation's passes (dropped once the distillation norm is
    # taken, a parameter's difference at a time); at the step, AdamW's temporary
    assert both.gradient_snapshot == 5792 and both.optimizer_step == 5792
    assert both.teacher_data == 6 * 6 * 8 and both.step_data == 10 * 288
    assert both.micro_batches == 3  # the 6 distillation rows, 2 at a time
    sharded = estimate_step(TINY, sequences=4, ranks=4, checkpoint_dtype_bytes=2, **base)  # type: ignore[arg-type]
    assert sharded.weights == 5792 // 4 and sharded.optimizer == 2 * (5792 // 4)
    assert sharded.driver_copy == 1448 * 2  # rank 0's generating copy
    # FSDP2: the root (256 embedding parameters) and two blocks gathered in bfloat16, the root's
    # and one block's gradients unsharded
    assert sharded.weight_copies == 2 * (256 + 2 * 592) + 2 * (256 + 592)


def test_one_pass_keeps_both_terms_graphs() -> None:
    """No micro-batch bound: the RL and distillation forwards' graphs are alive together."""
    kw = dict(prompt_tokens=2, completion_tokens=6, compute_dtype_bytes=2)
    whole = estimate_step(TINY, sequences=4, distill_sequences=2, batching=MicroBatching(), **kw)  # type: ignore[arg-type]
    rl = estimate_step(TINY, sequences=4, batching=MicroBatching(), **kw)  # type: ignore[arg-type]
    distill = estimate_step(TINY, sequences=2, batching=MicroBatching(), **kw)  # type: ignore[arg-type]
    assert whole.micro_batches == 1 and whole.activations == rl.activations + distill.activations


def _saved_bytes(layers: int, *, autocast: bool, checkpointing: bool, rows: int, width: int = 40) -> int:
    """Bytes of the distinct tensors autograd saves in a forward of a random Qwen3 (parameters
    themselves not counted), on the learner's batch layout (left-padded prompts)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SMALL, num_hidden_layers=layers, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).float().train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, config.vocab_size, (rows, width))
    mask = torch.ones(rows, width, dtype=torch.long)
    if rows > 1:
        mask[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision:
        model.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return sum(saved.values())


SMALL = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # q_dim 128, not the hidden size: the two are told apart
    intermediate_size=192,
    vocab_size=512,
    tie_word_embeddings=True,
)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bfloat16-autocast"])
@pytest.mark.parametrize("rows", [1, 2], ids=["one-row", "padded-rows"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["all", "checkpointed"])
def test_a_layers_activations_are_what_torch_saves(autocast: bool, rows: int, checkpointing: bool) -> None:
    """One decoder layer more adds exactly the estimate's bytes to what autograd saves (under
    autocast, plus the layer's bfloat16 weight casts, which the estimate counts as weight copies);
    checkpointed, only the layer's float32 input."""
    shape = ModelShape.from_config({**SMALL, "model_type": "qwen3", "num_hidden_layers": 2})
    width = 40
    one = _saved_bytes(1, autocast=autocast, checkpointing=checkpointing, rows=rows)
    two = _saved_bytes(2, autocast=autocast, checkpointing=checkpointing, rows=rows)
    tokens = rows * width
    if checkpointing:
        assert two - one == tokens * 4 * shape.hidden
        return
    layer = shape.layer_activation_bytes(
        width=width, compute_dtype_bytes=2 if autocast else 4, masked=rows > 1
    )
    casts = 2 * (shape.layer_params() - 2 * shape.hidden - 2 * shape.head_dim) if autocast else 0
    assert two - one == tokens * layer + casts
    # outside the layers: the final norm, ids and rotary tables are saved; the boolean mask is
    # not saved (the layers save their float copies) but is alive through the forward
    outside = shape.model_activation_bytes(width=width, masked=rows > 1) - (width if rows > 1 else 0)
    assert one - (two - one) == tokens * outside


QWEN3 = {
    "Qwen3-0.6B": (
        dict(
            hidden_size=1024,
            num_hidden_layers=28,
            intermediate_size=3072,
            num_attention_heads=16,
            tie_word_embeddings=True,
        ),
        596_049_920,
    ),
    "Qwen3-8B": (
        dict(
            hidden_size=4096,
            num_hidden_layers=36,
            intermediate_size=12288,
            num_attention_heads=32,
            tie_word_embeddings=False,
        ),
        8_190_735_360,
    ),
    "Qwen3-14B": (
        dict(
            hidden_size=5120,
            num_hidden_layers=40,
            intermediate_size=17408,
            num_attention_heads=40,
            tie_word_embeddings=False,
        ),
        14_768_307_200,
    ),
}


@pytest.mark.parametrize("name", list(QWEN3))
def test_qwen3_parameter_counts(name: str) -> None:
    """The published models' parameter counts (0.6B: 0.44B besides the embeddings; 8.2B; 14.8B)."""
    fields, params = QWEN3[name]
    shape = ModelShape.from_config(
        {"model_type": "qwen3", "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128, **fields}
    )
    assert shape.params() == params
    assert shape.qk_norm and shape.q_dim == shape.heads * 128


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sizing_table", REPO / "bench" / "sizing_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sizing_table_is_the_estimates_current_output() -> None:
    bench = _bench()
    data = bench.table()
    committed = json.loads((REPO / "bench" / "results" / "sizing_table.json").read_text())
    assert committed == data, "run .venv/bin/python bench/sizing_table.py"
    assert (REPO / "bench" / "results" / "sizing_table.md").read_text() == bench.markdown(data)
    by = {
        (r["model"], r["completion_tokens"], r["activation_checkpointing"]): r["gpus"] for r in data["rows"]
    }
    assert by[("Qwen3-0.6B", 8192, True)]["80 GB"]["fits"]
    assert not by[("Qwen3-8B", 8192, True)]["141 GB"]["fits"]  # 16 bytes a parameter: 122 GiB of state
    assert by[("Qwen3-8B", 8192, True)]["141 GB"]["ranks"] == 2
