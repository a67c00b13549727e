"""Where the learner's tensors live and in what precision: `learner.device` and
`learner.precision` resolved once, for the policy, the KL reference and local teachers.

On the CPU nothing changes from a run without this module: float32, no autocast, the same
CPU generator. On CUDA the default (`precision: auto`) is mixed precision: the policy's
parameters stay float32 (the master weights the optimizer updates), the loss's forward passes
run under bfloat16 autocast, and logits are cast to float32 before any log-softmax or reduction
(`cascade.engine.logprobs`); frozen models (reference, teachers) are held in bfloat16.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from cascade.config import DEVICE_PATTERN, LearnerConfig


class DeviceError(ValueError):
    """A device or precision this host cannot honour; the message names the setting."""


@dataclass(frozen=True)
class Accel:
    device: torch.device
    autocast_dtype: torch.dtype | None
    """bfloat16 for mixed precision; None: full precision, no autocast."""
    frozen_dtype: str
    """The dtype frozen models (KL reference, local teachers) are loaded in."""

    @property
    def precision(self) -> str:
        return "float32" if self.autocast_dtype is None else "bfloat16"

    def autocast(self) -> AbstractContextManager[object]:
        """Around the loss's forward passes (and nothing else)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def generator(self, seed: int) -> torch.Generator:
        """The run's sampling generator, on the device the policy samples on."""
        if self.device.type == "cpu":
            return torch.Generator().manual_seed(seed)
        return torch.Generator(device=self.device).manual_seed(seed)

    def describe(self) -> str:
        return f"learner on {self.device} ({self.precision})"


def resolve_device(setting: str, *, field: str = "learner.device", cuda: bool | None = None) -> torch.device:
    """`auto | cpu | cuda | cuda:N` -> a device this host has; `DeviceError` naming `field` if not."""
    if not re.match(DEVICE_PATTERN, setting):
        raise DeviceError(f"{field}: {setting!r} is not one of auto, cpu, cuda, cuda:N")
    available = torch.cuda.is_available() if cuda is None else cuda
    if setting == "auto":
        return torch.device("cuda", 0) if available else torch.device("cpu")
    if setting == "cpu":
        return torch.device("cpu")
    if not available:
        raise DeviceError(f"{field}: {setting!r} asked for, but torch sees no CUDA device on this host")
    device = torch.device(setting)
    index = device.index or 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"{field}: {setting!r} asked for, but this host has {count} CUDA device(s)")
    return torch.device("cuda", index)


def resolve_learner(cfg: LearnerConfig, model_dtype: str, *, cuda: bool | None = None) -> Accel:
    """The learner's device and precision policy. `cuda` overrides detection (tests)."""
    device = resolve_device(cfg.device, cuda=cuda)
    if device.type == "cpu":
        if cfg.precision == "bfloat16":
            raise DeviceError("learner.precision: bfloat16 needs a CUDA device (the learner is on cpu)")
        return Accel(device=device, autocast_dtype=None, frozen_dtype=model_dtype)
    if cfg.precision == "float32":
        return Accel(device=device, autocast_dtype=None, frozen_dtype=model_dtype)
    return Accel(device=device, autocast_dtype=torch.bfloat16, frozen_dtype="bfloat16")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch on `n` intra-op threads inside the block, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
