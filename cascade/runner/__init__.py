"""The stage loop of both modes (`CascadeRunner`) and the interfaces of what it is given."""

from cascade.runner.loop import CascadeRunner
from cascade.runner.sources import RolloutSource, RunSources, TeacherSource, WeightSink

__all__ = ["CascadeRunner", "RolloutSource", "RunSources", "TeacherSource", "WeightSink"]
