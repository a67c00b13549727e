"""The roots a cascade created through the API must keep its paths in (the settings' `paths`).

Every path the config names (`cascade.config.config_paths`: the model, reward and judge models,
prompt files and data sets, `output_dir`, the trackers' local output) is resolved from the
settings' `base_dir` (`..` and symlinks resolved as far as they exist here) and must then lie
in its roots: `output_dir` and tracker output in `runs_root`, models in `model_roots`, prompts
in `data_roots`. The config is stored with the resolved paths, so the runner opens what was
checked from whichever directory it runs. Where this host sees the runs root, `output_dir` may
not lie inside another run's directory either (its `run.json` or `cascade.db`), nor a tracker's
output inside a run directory other than the config's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cascade.config import CascadeConfig, ConfigError, config_paths, resolve_path, with_resolved_paths
from services.api.settings import ApiPaths, SettingsError

RUN_DIR_FILES = ("run.json", "cascade.db")
"""Files only a run directory holds (`cascade.runner.fresh.RUN_MARKERS` has these two among its
markers): a directory with one of them is another run's."""


@dataclass(frozen=True)
class PathRoots:
    """`ApiPaths` resolved once, at start-up."""

    base: Path
    runs: Path
    models: tuple[Path, ...]
    data: tuple[Path, ...]

    @classmethod
    def from_settings(cls, paths: ApiPaths, cwd: Path | None = None) -> PathRoots:
        try:
            base = resolve_path(paths.base_dir or Path("."), cwd or Path.cwd())
            return cls(
                base=base,
                runs=resolve_path(paths.runs_root, base),
                models=tuple(resolve_path(r, base) for r in paths.model_roots),
                data=tuple(resolve_path(r, base) for r in paths.data_roots),
            )
        except ValueError as err:
            raise SettingsError(f"paths: {err}") from None

    def describe(self) -> str:
        """For the start-up log."""
        join = ", ".join
        return (
            f"runs in {self.runs}; models in {join(map(str, self.models))}; "
            f"data in {join(map(str, self.data))}; relative paths from {self.base}"
        )

    def allowed(self, kind: str) -> tuple[tuple[Path, ...], str]:
        """The roots of a kind of path (`cascade.config.paths.PathKind`) and their setting."""
        if kind == "model":
            return self.models, "paths.model_roots"
        if kind == "data":
            return self.data, "paths.data_roots"
        return (self.runs,), "paths.runs_root"


def _held_run(path: Path, runs_root: Path) -> Path | None:
    """`path` or the nearest of its parents inside `runs_root` (not the root itself) that holds a
    run, if any."""
    for candidate in (path, *path.parents):
        if candidate == runs_root or not candidate.is_relative_to(runs_root):
            return None
        if any((candidate / name).is_file() for name in RUN_DIR_FILES):
            return candidate
    return None


def confine(cfg: CascadeConfig, roots: PathRoots, source: str = "body") -> CascadeConfig:
    """`cfg` with every path resolved; ConfigError (`<source>: <field>: ...`, the API's 422) for
    the first path outside its roots or inside another run's directory."""
    try:
        resolved = with_resolved_paths(cfg, roots.base)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    given: dict[str, object] = {p.field: p.path for p in config_paths(cfg)}
    given["tracking.mlflow.tracking_uri"] = cfg.tracking.mlflow.tracking_uri  # as written, not its path
    own_run = resolved.output_dir / resolved.name
    for entry in config_paths(resolved):
        allowed, setting = roots.allowed(entry.kind)
        shown = f"{str(given.get(entry.field, entry.path))!r}"
        if not any(entry.path.is_relative_to(root) for root in allowed):
            where = ", ".join(str(r) for r in allowed)
            raise ConfigError(
                f"{source}: {entry.field}: {shown} resolves to {entry.path}, outside {where} "
                f"(the API's {setting})"
            )
        tracker_in_own_run = entry.field != "output_dir" and entry.path.is_relative_to(own_run)
        if entry.kind == "output" and not tracker_in_own_run:
            held = _held_run(entry.path, roots.runs)
            if held is not None:
                raise ConfigError(
                    f"{source}: {entry.field}: {shown} resolves to {entry.path}, inside the run "
                    f"directory {held}: a run's output may not go into another run's"
                )
    return resolved
