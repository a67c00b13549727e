"""Typed configuration for a cascade: one YAML file, validated by these models.

The CLI, the services and the control plane all load cascades through `load_cascade_config`,
so a field means the same thing everywhere. Unknown fields are refused (a typo must not
silently fall back to a default), and every error names the field path.

This package's public names are re-exported here (`from cascade.config import X`). The schema is
split by section: `base` (the strict model, domain names), `domains` (prompt sources, rewards,
`DomainConfig`), `hf` (the `kind: hf` prompt source), `schedules`, `evaluation` (evals and the
advance rule), `stage` (GRPO, filters, distillation, `StageConfig`), `run` (model, chat,
checkpoints, lease, resilience, learner, rollout), `vllm` (the vLLM engine), `tracking` (the
trackers), `cascade` (`CascadeConfig` and its overrides). Apart from the schema: `loader` (the
hardened YAML/JSON loader and `ConfigError`; a file's relative paths are taken from its
directory), `paths` (what the config names on disk, resolved), `preflight` (what it asks of the
model directory: the context, a chat template) and `diff` (which settings change training, their
hash).
"""

from __future__ import annotations

from cascade.config.base import BUILTIN_DOMAINS, DomainName, StrictModel, VerifierKind
from cascade.config.cascade import CascadeConfig, with_learner_device, with_tracking
from cascade.config.domains import (
    AgentReward,
    CodeReward,
    DomainConfig,
    IfReward,
    JsonlPrompts,
    MathReward,
    PromptSource,
    PythonReward,
    RewardConfig,
    RlhfReward,
    SweReward,
    SyntheticPrompts,
)
from cascade.config.evaluation import (
    EVAL_METRIC_PATTERN,
    AdvanceRule,
    EvalConfig,
    metric_k,
    parse_watched_metric,
)
from cascade.config.hf import HfPrompts
from cascade.config.loader import (
    MAX_DEPTH,
    ConfigError,
    NestingTooDeep,
    check_json_depth,
    dump_cascade_yaml,
    load_cascade_config,
    parse_cascade_config,
    parse_cascade_json,
    parse_cascade_yaml,
    parse_domain_config,
)
from cascade.config.paths import (
    ConfigPath,
    PathKind,
    check_paths,
    config_paths,
    resolve_path,
    unwritable_dir,
    with_paths_from,
    with_resolved_paths,
)
from cascade.config.preflight import (
    chat_template_problems,
    context_problems,
    model_context,
    preflight_problems,
    tokenizer_has_chat_template,
)
from cascade.config.run import (
    DEVICE_PATTERN,
    ChatConfig,
    CheckpointConfig,
    LearnerConfig,
    LeaseConfig,
    ModelConfig,
    ResilienceConfig,
    RolloutConfig,
    device_setting,
)
from cascade.config.schedules import ConstantSchedule, CosineSchedule, LinearSchedule, Schedule, TokenBudget
from cascade.config.stage import DistillConfig, FilterConfig, GrpoConfig, StageConfig
from cascade.config.tracking import BackendName, TrackingConfig
from cascade.config.vllm import VllmEngineConfig

__all__ = [
    "DEVICE_PATTERN",
    "EVAL_METRIC_PATTERN",
    "MAX_DEPTH",
    "AdvanceRule",
    "AgentReward",
    "BackendName",
    "CascadeConfig",
    "ChatConfig",
    "CheckpointConfig",
    "CodeReward",
    "ConfigError",
    "ConfigPath",
    "ConstantSchedule",
    "CosineSchedule",
    "DistillConfig",
    "DomainConfig",
    "BUILTIN_DOMAINS",
    "DomainName",
    "PythonReward",
    "VerifierKind",
    "EvalConfig",
    "FilterConfig",
    "GrpoConfig",
    "HfPrompts",
    "IfReward",
    "JsonlPrompts",
    "LearnerConfig",
    "LeaseConfig",
    "LinearSchedule",
    "MathReward",
    "ModelConfig",
    "NestingTooDeep",
    "PathKind",
    "PromptSource",
    "ResilienceConfig",
    "RewardConfig",
    "RlhfReward",
    "RolloutConfig",
    "Schedule",
    "StageConfig",
    "StrictModel",
    "SweReward",
    "SyntheticPrompts",
    "TokenBudget",
    "TrackingConfig",
    "VllmEngineConfig",
    "chat_template_problems",
    "check_json_depth",
    "check_paths",
    "config_paths",
    "context_problems",
    "device_setting",
    "dump_cascade_yaml",
    "load_cascade_config",
    "metric_k",
    "model_context",
    "parse_cascade_config",
    "parse_cascade_json",
    "parse_cascade_yaml",
    "parse_domain_config",
    "parse_watched_metric",
    "preflight_problems",
    "resolve_path",
    "tokenizer_has_chat_template",
    "unwritable_dir",
    "with_learner_device",
    "with_paths_from",
    "with_resolved_paths",
    "with_tracking",
]
