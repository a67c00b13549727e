"""Values scheduled over a stage's steps (the distillation weight) and the growing token budget."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from cascade.config.base import StrictModel


class ConstantSchedule(StrictModel):
    kind: Literal["constant"] = "constant"
    value: float = Field(..., ge=0)


class LinearSchedule(StrictModel):
    """Linear from `start` to `end` over `steps` stage steps, then held at `end`."""

    kind: Literal["linear"] = "linear"
    start: float = Field(..., ge=0)
    end: float = Field(..., ge=0)
    steps: int = Field(..., ge=1)


class CosineSchedule(StrictModel):
    """Half-cosine from `start` to `end` over `steps` stage steps, then held at `end`."""

    kind: Literal["cosine"] = "cosine"
    start: float = Field(..., ge=0)
    end: float = Field(..., ge=0)
    steps: int = Field(..., ge=1)


Schedule = Annotated[ConstantSchedule | LinearSchedule | CosineSchedule, Field(discriminator="kind")]


class TokenBudget(StrictModel):
    """Max new tokens, optionally growing within the stage (the paper's 24K -> 32K -> 40K)."""

    max_new_tokens: int = Field(..., ge=1)
    grow_to: list[int] = Field(default_factory=list)
    """Later budgets, each larger than the one before."""
    grow_every: int | None = Field(None, ge=1)
    """Stage steps between two growths; required when `grow_to` is set."""

    @model_validator(mode="after")
    def _check_growth(self) -> TokenBudget:
        prev = self.max_new_tokens
        for value in self.grow_to:
            if value <= prev:
                raise ValueError(f"grow_to must increase: {value} after {prev}")
            prev = value
        if self.grow_to and self.grow_every is None:
            raise ValueError("grow_every is required when grow_to is set")
        return self
