"""GPU learner check: a few learner steps on CUDA (the `learner.precision: auto` policy, bfloat16
autocast over float32 master weights) against the same steps on the CPU (float32), same weights,
same batch; every step's loss must agree within a relative tolerance.

Runs the learner's own code: `resolve_learner`, `completion_logprobs`, `grpo_loss`,
`apply_update` (AdamW, clipping). On-policy, the GRPO loss's *value* is `-mean(advantage)`
whatever the weights (the ratio is 1), so what is compared is the loss's forward: the masked mean
token NLL of the batch under the policy at each step (before that step's update, so steps 2..N
also check the updates), plus the GRPO loss and the gradient norm. Tolerance: 2e-2 relative
for bfloat16 on the NLL and the loss, 5e-2 on the gradient norm; 1e-4 on all three for
`--precision float32`. Prints one JSON object; exits 0
when every step agrees, 1 on a mismatch, 2 with no GPU. `--device cpu` runs the script here
(CPU against CPU: the plumbing only).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu to try it here")
    p.add_argument("--precision", choices=["auto", "float32"], default="auto")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="sequences (groups of 4)")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False", "torch": torch.__version__}))
        return 2
    from bench.gpu_check import build_model
    from cascade.accel import resolve_learner
    from cascade.algo import GrpoLossInput, grpo_loss
    from cascade.config import LearnerConfig
    from cascade.engine.batch import build_batch
    from cascade.engine.logprobs import completion_logprobs
    from cascade.runner.optimizer_step import LossTerm, apply_update

    vocab = 384
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, vocab, (int(n),), generator=gen).tolist()
        for n in torch.randint(6, 20, (args.batch,), generator=gen)
    ]
    completions = [
        torch.randint(3, vocab, (int(n),), generator=gen).tolist()
        for n in torch.randint(4, 24, (args.batch,), generator=gen)
    ]
    advantages = 0.5 + torch.rand(args.batch, generator=gen)  # > 0: the loss stays away from 0
    group_ids = torch.arange(args.batch) // 4
    sb = build_batch(prompts, completions, pad_id=0)

    def train(device: str, precision: str) -> tuple[list[float], list[float], str]:
        accel = resolve_learner(LearnerConfig(device=device, precision=precision), "float32")  # type: ignore[arg-type]
        model = build_model(args.hidden, args.layers, vocab, 256, str(accel.device), torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, nlls, norms = [], [], []
        for _ in range(args.steps):
            with accel.autocast():
                batch = sb.to(accel.device)
                logp = completion_logprobs(model, batch, 1.0)
                nll = -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()
                out = grpo_loss(
                    GrpoLossInput(
                        logprobs=logp,
                        advantages=advantages.to(accel.device),
                        mask=batch.completion_mask,
                        group_ids=group_ids.to(accel.device),
                    )
                )
            metrics = apply_update(
                model, optimizer, rl=LossTerm(out.loss), distill=[], lam=0.0, max_grad_norm=1.0, lr=1e-3
            )
            assert next(model.parameters()).dtype == torch.float32  # the master weights
            losses.append(metrics["loss_rl"])
            nlls.append(float(nll.detach()))
            norms.append(metrics["grad_norm"])
        return {"loss": losses, "nll": nlls, "grad_norm": norms}, accel.describe()

    ref, ref_desc = train("cpu", "float32")
    got, desc = train(args.device, args.precision)
    bf16 = "bfloat16" in desc
    rtol = {"loss": 2e-2, "nll": 2e-2, "grad_norm": 5e-2} if bf16 else dict.fromkeys(ref, 1e-4)

    def rel(key: str) -> list[float]:
        return [abs(a - b) / max(abs(b), 1e-8) for a, b in zip(got[key], ref[key], strict=True)]

    diffs = {k: rel(k) for k in ref}
    report = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "learner": desc,
        "reference": ref_desc,
        "steps": args.steps,
        **{k: got[k] for k in ref},
        **{f"{k}_cpu": ref[k] for k in ref},
        **{f"{k}_rel_diff": diffs[k] for k in ref},
        "tolerance_rel": rtol,
        "losses_match": all(max(diffs[k]) <= rtol[k] for k in ref),
    }
    print(json.dumps(report, indent=1))
    return 0 if report["losses_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
