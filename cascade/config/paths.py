"""What a valid config names on disk and is not there (`cascade validate`, `cascade run`)."""

from __future__ import annotations

from pathlib import Path

from cascade.config.cascade import CascadeConfig
from cascade.config.domains import JsonlPrompts, RlhfReward
from cascade.config.hf import HfPrompts


def check_paths(cfg: CascadeConfig) -> list[str]:
    """What the config names on disk and is not there: one `field: problem` line per missing or
    wrong-kind path (empty when all is well). Relative paths are checked as the runner reads
    them: from the working directory (the model's also next to the config file, as
    `load_cascade_config` resolved it).

    Kept apart from the schema checks: the control plane validates configs for runners on
    other hosts (it need not hold the model); `cascade validate` and `cascade run` call both.
    """
    problems: list[str] = []

    def shown(path: Path) -> str:
        return str(path) if path.is_absolute() else f"{path} ({path.absolute()})"

    def model_dir(field: str, path: Path, hint: str = "") -> None:
        if not path.exists():
            problems.append(f"{field}: {shown(path)} does not exist{hint}")
        elif not (path / "config.json").is_file():
            problems.append(f"{field}: {shown(path)} is not a model directory (no config.json){hint}")

    model_dir("model.path", cfg.model.path, " (build the tiny one with `cascade model init`)")
    for i, domain in enumerate(cfg.domains):
        if isinstance(domain.prompts, JsonlPrompts):
            for name in ("train_path", "eval_path"):
                path = getattr(domain.prompts, name)
                if not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
                elif not path.is_file():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} is not a file")
        if isinstance(domain.prompts, HfPrompts):
            sources = [("path", domain.prompts.path)] if domain.prompts.path is not None else []
            for split, files in (domain.prompts.data_files or {}).items():
                sources += [(f"data_files.{split}.{j}", f) for j, f in enumerate(files)]
            for name, path in sources:
                if path is not None and not path.exists():
                    problems.append(f"domains.{i}.prompts.{name}: {shown(path)} does not exist")
        if isinstance(domain.reward, RlhfReward):
            model_dir(f"domains.{i}.reward.model_path", domain.reward.model_path)
    if cfg.output_dir.exists() and not cfg.output_dir.is_dir():
        problems.append(f"output_dir: {shown(cfg.output_dir)} exists and is not a directory")
    return problems
