"""The `tracking:` section of a cascade: which experiment trackers a run logs to, and how.

Kept apart from `cascade.config.cascade` (which holds it as `CascadeConfig.tracking`) so the
trackers' options sit together; the logging itself is `cascade.tracking`. Tracking changes
nothing about what is learned (`cascade.config.diff` leaves it out of the training hash): a run
may be resumed with more or other trackers, and `--track` on the command line replaces
`backends`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BackendName = Literal["tensorboard", "mlflow", "wandb"]
BACKENDS: tuple[BackendName, ...] = ("tensorboard", "mlflow", "wandb")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorBoardSettings(_Strict):
    log_dir: Path | None = None
    """Where the event files go (default: `<run dir>/tensorboard`). A resumed run writes to the
    same directory and purges the steps it redoes, so TensorBoard shows each step once."""


class MlflowSettings(_Strict):
    tracking_uri: str | None = None
    """Any MLflow tracking URI (`http://host:5000`, `postgresql://...`, `databricks`, ...).
    Default: a SQLite store in the run directory, `sqlite:///<run dir>/mlflow/mlflow.db`, with
    the artifacts beside it in `<run dir>/mlflow/artifacts` (`mlflow ui --backend-store-uri`
    reads it)."""
    experiment: str | None = None
    """Experiment name (default: the cascade's `name`)."""
    run_name: str | None = None
    """Run name (default: the run directory's name)."""
    tags: dict[str, str] = Field(default_factory=dict)


class WandbSettings(_Strict):
    mode: Literal["offline", "online"] = "offline"
    """`offline` (the default): the run is written under `dir` only, never sent anywhere
    (`wandb sync` uploads it later). `online`: logged to the W&B server as it runs (needs
    `wandb login` or `WANDB_API_KEY`)."""
    project: str | None = None
    """W&B project (default: the cascade's `name`)."""
    entity: str | None = None
    """W&B team or user (default: the logged-in user's)."""
    name: str | None = None
    """Run display name (default: the run directory's name)."""
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    dir: Path | None = None
    """Where the `wandb/` folder goes (default: the run directory)."""


class TrackingConfig(_Strict):
    """Experiment trackers the run logs to: every step's metrics, every eval with its interval,
    the resolved config, checkpoints' paths, and at the end the regression table, the report's
    files and curves. None by default."""

    backends: list[BackendName] = Field(default_factory=list)
    """Any of `tensorboard`, `mlflow`, `wandb` (each needs the `tracking` extra:
    `pip install 'cascade-rl[tracking]'`, which `make` installs)."""
    tensorboard: TensorBoardSettings = TensorBoardSettings()
    mlflow: MlflowSettings = MlflowSettings()
    wandb: WandbSettings = WandbSettings()

    @field_validator("backends")
    @classmethod
    def _unique(cls, value: list[BackendName]) -> list[BackendName]:
        if len(set(value)) != len(value):
            raise ValueError(f"a backend is listed twice: {value}")
        return value


def parse_track_flag(value: str) -> list[BackendName]:
    """`--track tensorboard,mlflow,wandb` (or `none`) as a list of backends; ValueError names a bad one."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["none"]:
        return []
    out: list[BackendName] = []
    for name in names:
        if name not in BACKENDS:
            raise ValueError(f"unknown tracking backend {name!r} (choose from {', '.join(BACKENDS)}, none)")
        if name not in out:
            out.append(name)  # type: ignore[arg-type]  # checked against BACKENDS just above
    return out
