"""The run loop: the stage loop of both modes (`loop.CascadeRunner`) and the interfaces of what
it is given (`sources`), the step's planning, update and distillation, curriculum and advance,
checkpoints, the run's state and store, progress and the report."""
