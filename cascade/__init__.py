"""Cascade: cascaded GRPO with on-policy distillation, from a laptop CPU to GPU pools."""

__version__ = "0.1.0"
