"""Which operator commands a stage or cascade offers now, and the state each leads to.

The dashboard renders exactly these (it holds no state machine of its own). A command is offered
when `cascade.store.control` would accept it *and* it would change something: a refused one
(409) or a repeat (a no-op) is not offered. The moves are checked against the store's
`ALLOWED_TRANSITIONS`; which state each command may start from mirrors `control`'s handlers,
and tests/integration/test_api_actions.py runs every command against real rows in every state
to keep the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable

from cascade.store.lifecycle import ALLOWED_TRANSITIONS
from cascade.store.models import Cascade, Run, Stage
from services.api import schemas

LEADS_TO = {"pause": "paused", "resume": "running", "advance": "completed"}
"""The stage state each stage command asks for (applied by the runner at its next step boundary)."""
FINAL_CASCADE = ("completed", "failed")
"""A cascade in one of these can no longer be aborted (409)."""


def offered_stage_commands(state: str, desired: str | None) -> list[str]:
    """The stage commands that would change a stage in `state` with request `desired`."""
    if desired == "aborted":  # control.AbortPending: nothing may replace an abort
        return []
    intent = desired or state
    offered = []
    for command, target in LEADS_TO.items():
        if target == intent:
            continue  # already asked for (or already there): a repeat changes nothing
        if command == "resume" and state == "running":
            legal = desired == "paused"  # withdraws a pause the runner has not applied yet
        else:
            from_ = "paused" if command == "resume" else "running"
            legal = state == from_ and target in ALLOWED_TRANSITIONS[state]
        if legal:
            offered.append(command)
    return offered


def stage_actions(stage: Stage) -> list[schemas.ActionOut]:
    return [
        schemas.ActionOut(command=c, leads_to=LEADS_TO[c], path=f"/api/stages/{stage.id}/{c}")
        for c in offered_stage_commands(stage.state, stage.desired_state)
    ]


def abort_offered(cascade: Cascade, stages: Iterable[Stage], runs: Iterable[Run], runner_live: bool) -> bool:
    """Whether `control.abort_cascade` would change something (not refused, not a repeat)."""
    if cascade.status in FINAL_CASCADE:
        return False
    if cascade.status != "aborted":
        return True
    stages = list(stages)
    for stage in stages:
        if stage.state in ("pending", "paused"):
            return True
        if stage.state == "running" and (stage.desired_state != "aborted" or not runner_live):
            return True  # not yet asked, or no runner left to apply it: aborted at once
    still_running = any(s.state == "running" for s in stages)
    return not still_running and any(r.status == "running" for r in runs)


def cascade_actions(
    cascade: Cascade, stages: Iterable[Stage], runs: Iterable[Run], runner_live: bool
) -> list[schemas.ActionOut]:
    if not abort_offered(cascade, stages, runs, runner_live):
        return []
    return [schemas.ActionOut(command="abort", leads_to="aborted", path=f"/api/cascades/{cascade.id}/abort")]
