"""Load a policy (model + tokenizer) from a Hugging Face checkpoint directory.

The same code loads the tiny model built by `cascade model init` and a real checkpoint
(e.g. a Qwen3 directory): only `Auto*` classes, no architecture switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

MASTER_DTYPE = "float32"
"""The dtype of the parameters the optimizer updates, whatever the checkpoint's dtype: an AdamW
step at a learning rate like 1e-5 moves most weights by less than half a bfloat16 unit in the
last place, so a policy trained in bfloat16 keeps few of its updates (one GRPO update on a
103M Qwen3 changed 7.3% of the parameters in bfloat16, 99.995% in float32). bfloat16 compute
comes from autocast (`cascade.accel`) or FSDP2's mixed precision (`cascade.parallel.fsdp`)."""


class ModelLoadError(Exception):
    pass


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    save_dtype: str | None = None
    """The dtype the weights are written in (`cascade.runner.checkpoint.save_model_dir`): the
    checkpoint's (`model.dtype`), what teachers, KL references and rollout replicas load. None:
    the parameters' own dtype. It differs from the parameters' only for a policy that trains
    (`load_trainable_policy`)."""

    @property
    def eos_token_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None) if gen is not None else None
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list):
            ids.update(extra)
        return sorted(i for i in ids if i is not None)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    path = Path(path)
    if not (path / "tokenizer_config.json").exists() and not (path / "tokenizer.json").exists():
        raise ModelLoadError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    # a tokenizer without a chat template loads: the config may give one (`chat.template_path`),
    # and rendering without either fails with `cascade.model.chat.NoChatTemplate`
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu") -> Policy:
    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path}: not a model directory (no config.json); run `cascade model init`?")
    tok = load_tokenizer(path)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], local_files_only=True
    )
    model.to(device)  # type: ignore[arg-type]
    return Policy(model=model, tokenizer=tok)


def load_trainable_policy(path: str | Path, dtype: str, device: str = "cpu") -> Policy:
    """The policy the optimizer updates: float32 parameters (`MASTER_DTYPE`) whatever `dtype`
    (the checkpoint's, e.g. bfloat16 for a Qwen3 directory), which stays the dtype it is saved
    and served in."""
    policy = load_policy(path, MASTER_DTYPE, device)
    policy.save_dtype = dtype
    return policy


def load_model_weights_only(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """A frozen copy (teacher or KL reference) sharing the tokenizer of the policy."""
    model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=DTYPES[dtype], local_files_only=True)
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
