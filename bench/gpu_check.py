"""GPU check: the HF engine's batched KV-cache generation on a GPU, tokens/s, and the rollout
log-probs against the learner's computation on the same device.

Needs only torch (a CUDA build) and transformers 5.x: no tokenizer and no other part of the
cascade install (prompts are random token ids). Run through `bench/gpu_check.sh`, which finds or
prepares such a Python. Prints one JSON object; exits 1 if the log-prob check fails, 2 if there
is no GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def build_model(hidden: int, layers: int, vocab: int, context: int, device: str, dtype: torch.dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    heads = max(hidden // 64, 2)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        head_dim=hidden // heads,
        max_position_embeddings=context,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype).eval()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model directory instead of a random tiny Qwen3")
    p.add_argument("--hidden", type=int, default=128, help="random model width (tiny model: 128)")
    p.add_argument("--layers", type=int, default=4, help="random model depth (tiny model: 4)")
    p.add_argument("--batch", type=int, default=128, help="sequences per generate call")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script without a GPU")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False", "torch": torch.__version__}))
        return 2
    from cascade.engine.batch import build_batch
    from cascade.engine.hf import generate
    from cascade.engine.logprobs import completion_logprobs

    device, dtype = args.device, getattr(torch, args.dtype)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    else:
        model = build_model(args.hidden, args.layers, 384, 256, device, dtype)
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 25, (args.batch,), generator=gen).tolist()
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    never = [10**9]  # an EOS no model produces: every row runs the full budget

    def run(seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        return generate(model, prompts, max_new_tokens=args.max_tokens, eos_ids=never, pad_id=0, generator=g)

    run(0)  # warm-up (CUDA context, kernels)
    times = []
    for i in range(args.repeats):
        sync()
        start = time.perf_counter()
        out = run(i + 1)
        sync()
        times.append(time.perf_counter() - start)
    tokens = sum(len(c) for c in out.completion_ids)

    sb = build_batch(prompts, out.completion_ids, pad_id=0)
    for name in ("input_ids", "attention_mask", "position_ids", "completion_ids", "completion_mask"):
        setattr(sb, name, getattr(sb, name).to(device))
    with torch.no_grad():
        learner = completion_logprobs(model, sb, 1.0).float().cpu()
    rollout = torch.tensor(out.logprobs)
    max_diff = float((learner - rollout).abs().max())
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    report = {
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
        "torch": torch.__version__,
        "model": args.model or f"random Qwen3, hidden {args.hidden}, {args.layers} layers, vocab {vocab}",
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "dtype": args.dtype,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "tokens_per_s": round(tokens / statistics.median(times), 1),
        "median_s": round(statistics.median(times), 4),
        "logprob_max_abs_diff_vs_learner": max_diff,
        "logprobs_match": max_diff <= tolerance,
    }
    print(json.dumps(report, indent=1))
    return 0 if report["logprobs_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
