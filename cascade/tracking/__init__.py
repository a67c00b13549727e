"""Experiment tracking: TensorBoard, MLflow and W&B behind one `Tracker` the stage loop calls.

The loop holds a `Tracker` built from the config's `tracking:` section (`Tracker.from_config`),
with no backends by default: then every call is a no-op, and no tracking library is imported.
Each backend lives in its own module and imports its library only when it opens its run.
"""

from cascade.tracking.base import EXTRA_HINT, TrackingUnavailable
from cascade.tracking.tracker import STATE_FILE, Tracker, check_tracking, read_state

__all__ = ["EXTRA_HINT", "STATE_FILE", "Tracker", "TrackingUnavailable", "check_tracking", "read_state"]
