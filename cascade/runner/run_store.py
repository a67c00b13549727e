"""The runner's view of the store: one short transaction per event, by stage index.

The embedded runner and the distributed learner both write through this, so stage state,
metrics, evals and checkpoints land in the same rows whether the database is the run's
SQLite file or the control plane's Postgres.

Every transaction of the loop goes through one `Dependency("database")` (`@_retried`): a
database restart or failover is ridden out within `resilience.database_s`, then `DependencyDown`.
So each method is one transaction that may be repeated after a failure whose commit in fact
took effect: each is idempotent (a step, eval or checkpoint row is inserted only if absent, a
transition to the current state is a no-op, the lease is taken by this runner's token).

Every write is fenced (`cascade.store.leases.fence`): it commits only while this runner's lease
epoch still holds, in the same transaction, so a runner that was frozen or cut off past its
lease and taken over has its late writes refused (`LeaseLost`) and stops; the new holder never
meets them. A file that must appear with a row (a step's sample ids, a checkpoint's rename)
is written by the row's transaction after the fence and before the commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from pydantic import ValidationError
from sqlalchemy import event, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cascade.config import CascadeConfig
from cascade.config.diff import training_diff
from cascade.eval.results import DomainEval
from cascade.resilience import Dependency
from cascade.store import db, leases, repo
from cascade.store.leases import Fence, Holder, LeaseHeld, LeaseLost
from cascade.store.lifecycle import get_row
from cascade.store.models import Cascade, Run, RunLease, Stage
from cascade.store.transient import database_dependency

ACTOR = "runner"

__all__ = ["CascadeHasHistory", "CascadeMismatch", "LeaseHeld", "LeaseLost", "RunStore", "stored_config"]


class CascadeMismatch(ValueError):
    """The config is not the config of the cascade the runner was asked to run (or the cascade
    or run cannot be run any more)."""


def _normalised(config: dict[str, Any], cascade_id: int) -> dict[str, Any]:
    """A stored config as this version of the code reads it (defaults of newer fields filled)."""
    try:
        return CascadeConfig.model_validate(config).model_dump(mode="json")
    except ValidationError as err:
        raise CascadeMismatch(f"cascade {cascade_id}: its stored config no longer validates: {err}") from None


def _existing_cascade(s: Session, cascade_id: int, cfg: CascadeConfig) -> tuple[Cascade, list[Stage]]:
    cascade = get_row(s, Cascade, cascade_id)
    stages = repo.list_stages(s, cascade_id=cascade_id)
    want = [(st.label, st.domain_label) for st in cfg.stages]
    have = [(st.name, st.domain) for st in stages]
    if want != have:
        raise CascadeMismatch(f"cascade {cascade_id} has stages {have}, the config has {want}")
    if cascade.status in ("completed", "failed", "aborted"):
        raise CascadeMismatch(f"cascade {cascade_id} is {cascade.status}")
    diff = training_diff(_normalised(cascade.config, cascade_id), cfg.model_dump(mode="json"))
    if diff:
        shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
        raise CascadeMismatch(
            f"cascade {cascade_id} was created with another config ({shown}): run it with its own "
            f"config (leave the YAML out: `cascade run --db ... --cascade-id {cascade_id}`)"
        )
    return cascade, stages


class CascadeHasHistory(CascadeMismatch):
    """A cascade that was run before is joined only by `--resume` (its run goes on) or `--fresh`
    (a new run starts the unfinished stage over): never silently."""


def _refuse_history(s: Session, cascade_id: int) -> None:
    last = s.scalars(select(Run).where(Run.cascade_id == cascade_id).order_by(Run.id.desc())).first()
    if last is None:
        return
    raise CascadeHasHistory(
        f"cascade {cascade_id} was run before (run {last.id}, {last.status}, run dir {last.output_dir}): "
        f"pass --resume with that --run-dir to continue it, or --fresh to start its unfinished stage "
        "over in a new run"
    )


def stored_config(url: str, cascade_id: int) -> CascadeConfig:
    """The config the control plane stored for a cascade (to run it without a YAML)."""
    engine = db.make_engine(url)
    try:
        with db.session_scope(engine) as s:
            cascade = s.get(Cascade, cascade_id)
            if cascade is None:
                raise CascadeMismatch(f"cascade {cascade_id} does not exist in this database")
            return CascadeConfig.model_validate(_normalised(cascade.config, cascade_id))
    finally:
        engine.dispose()


IDLE_IN_TRANSACTION_S = 10
"""Postgres ends a runner's session that sits this long inside a transaction (a runner frozen
or cut off mid-write), so the locks it holds (the lease row's, taken by the fence) do not hold
up the runner that takes over. A runner's transactions never wait on anything but the database
and a local file (a samples line, a rename)."""


def _bound_idle_transactions(dbapi_connection: Any, connection_record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'")
    dbapi_connection.commit()


P = ParamSpec("P")
R = TypeVar("R")


def _retried(method: Callable[Concatenate[RunStore, P], R]) -> Callable[Concatenate[RunStore, P], R]:
    """The whole method (one transaction) again while the database is down, up to the bound."""

    @wraps(method)
    def call(self: RunStore, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.database.call(lambda: method(self, *args, **kwargs))

    return call


def _begun_by(s: Session, holder: Holder) -> tuple[dict[str, Any], int] | None:
    """The ids of the run `holder` already began (its lease row names the run) and the lease's
    epoch, if any."""
    lease = s.scalars(select(RunLease).where(RunLease.token == holder.token)).one_or_none()
    if lease is None or lease.run_id is None:
        return None
    stages = repo.list_stages(s, cascade_id=lease.cascade_id)
    ids = {"cascade_id": lease.cascade_id, "run_id": lease.run_id, "stage_ids": [st.id for st in stages]}
    return ids, lease.epoch


class RunStore:
    def __init__(
        self, url: str, *, give_up_after_s: float = 300.0, log: Callable[[str], None] = print
    ) -> None:
        """`give_up_after_s`: how long one database outage is ridden out (`resilience.database_s`)."""
        self.engine = db.make_engine(url)
        if self.engine.dialect.name == "postgresql":
            event.listen(self.engine, "connect", _bound_idle_transactions)
        self.log = log
        db.prepare_schema(self.engine)
        self.database = database_dependency(give_up_after_s, log)
        self.watched: list[Dependency] = [self.database]
        """Dependencies whose ended outages `record_step` logs as `outage` events."""
        self._outages_logged: dict[str, tuple[int, float]] = {}
        self._degraded_shown: set[str] = set()
        self.cascade_id: int | None = None
        self.run_id: int | None = None
        self.stage_ids: list[int] = []
        self.fence: Fence | None = None
        """The lease this runner's writes are checked against (None: it writes nothing)."""
        self.expiry_s = 30.0
        self._skew_warned = False

    # ------------------------------------------------------------------ identity

    @_retried
    def begin(
        self,
        cfg: CascadeConfig,
        *,
        run_dir: Path,
        distill: bool,
        cascade_id: int | None = None,
        kind: str = "embedded",
        holder: Holder,
        rejoin: bool = False,
    ) -> dict[str, Any]:
        """Create the run's rows and take the cascade's lease, in one transaction; with
        `cascade_id`, run a cascade the control plane created (`LeaseHeld` if a live runner
        has it; `CascadeHasHistory` if it was run before, unless `rejoin`: `--fresh`). Runs of
        the cascade left `running` by dead runners are closed as failed."""
        kwargs: dict[str, Any] = dict(
            run_dir=run_dir, distill=distill, cascade_id=cascade_id, kind=kind, holder=holder, rejoin=rejoin
        )
        try:
            return self._begin(cfg, **kwargs)
        except IntegrityError:  # another runner inserted the lease row first
            return self._begin(cfg, **kwargs)

    def check_joinable(self, cfg: CascadeConfig, *, cascade_id: int | None) -> None:
        """What `begin` would refuse, checked without writing anything (`--fresh` checks it before
        it moves the old run aside): `CascadeMismatch` for a cascade that cannot be run,
        `LeaseHeld` while a live runner holds it."""
        if cascade_id is None:
            return
        with db.session_scope(self.engine) as s:
            _existing_cascade(s, cascade_id, cfg)
            lease = leases.lease_of(s, cascade_id)
            now = leases.db_now(s)
            if lease is not None and not leases.holder_is_dead(lease, now):
                raise LeaseHeld(lease, now)

    def _begin(
        self,
        cfg: CascadeConfig,
        *,
        run_dir: Path,
        distill: bool,
        cascade_id: int | None,
        kind: str,
        holder: Holder,
        rejoin: bool,
    ) -> dict[str, Any]:
        expiry = self.expiry_s = cfg.lease.expiry_s
        with db.session_scope(self.engine) as s:
            self._check_clock(s)
            done = _begun_by(s, holder)
            if done is not None:  # this begin committed already; its reply was lost
                ids, epoch = done
                self.attach(ids)
                self.fence = Fence(int(ids["cascade_id"]), holder.token, epoch)
                return ids
            if cascade_id is None:
                cascade = repo.create_cascade(s, name=cfg.name, config=cfg.model_dump(mode="json"))
                stages = repo.create_stages(
                    s, cascade_id=cascade.id, stages=[(st.label, st.domain_label) for st in cfg.stages]
                )
            else:
                cascade, stages = _existing_cascade(s, cascade_id, cfg)
            leases.acquire(s, cascade_id=cascade.id, run_id=None, holder=holder, expiry_s=expiry)
            if cascade_id is not None and not rejoin:  # after the lease: a live holder is named first
                _refuse_history(s, cascade_id)
            for old in s.scalars(select(Run).where(Run.cascade_id == cascade.id, Run.status == "running")):
                repo.finish_run(
                    s, run_id=old.id, status="failed", actor=ACTOR, detail={"reason": "superseded"}
                )
            run = repo.start_run(
                s,
                cascade_id=cascade.id,
                seed=cfg.seed,
                distill=distill,
                output_dir=str(run_dir),
                kind=kind,
                actor=ACTOR,
            )
            repo.set_cascade_status(s, cascade_id=cascade.id, status="running", actor=ACTOR)
            lease = leases.acquire(s, cascade_id=cascade.id, run_id=run.id, holder=holder, expiry_s=expiry)
            ids = {"cascade_id": cascade.id, "run_id": run.id, "stage_ids": [st.id for st in stages]}
            fence = Fence(cascade.id, holder.token, lease.epoch)
        self.attach(ids)
        self.fence = fence
        return ids

    @_retried
    def resume(self, ids: dict[str, Any], *, holder: Holder | None, expiry_s: float) -> None:
        """Attach to a run from its checkpoint and take its cascade's lease over (`LeaseHeld`
        while the previous runner is alive; `CascadeMismatch` if the run was closed meanwhile)."""
        self.attach(ids)
        if holder is None:  # a finished run, only to write its report again
            return
        cascade_id, run_id = self._ids()
        self.expiry_s = expiry_s
        with db.session_scope(self.engine) as s:
            self._check_clock(s)
            run = get_row(s, Run, run_id)
            if run.status != "running":
                raise CascadeMismatch(
                    f"run {run_id} is {run.status}: there is nothing to resume (start with --fresh)"
                )
            lease = leases.acquire(s, cascade_id=cascade_id, run_id=run_id, holder=holder, expiry_s=expiry_s)
            fence = Fence(cascade_id, holder.token, lease.epoch)
        self.fence = fence

    def _check_clock(self, s: Session) -> None:
        """Say once when this host's clock is off the database's by more than a few seconds (lease
        decisions use the database's clock; the event and metric times this host writes do not)."""
        skew = leases.clock_skew_s(s)
        if abs(skew) > leases.SKEW_WARN_S and not self._skew_warned:
            self.log(
                f"warning: this host's clock is {abs(skew):.1f}s {'ahead of' if skew > 0 else 'behind'} "
                "the database's; leases use the database's clock, but times this host writes are off "
                "by as much (synchronise it with NTP)"
            )
        self._skew_warned = abs(skew) > leases.SKEW_WARN_S

    def _fenced(self, s: Session) -> None:
        """Refuse this transaction's writes once this runner's lease was taken over."""
        if self.fence is not None:
            leases.fence(s, self.fence, expiry_s=self.expiry_s)

    # not `_retried`: the heartbeat thread retries at its next beat, and a release during an
    # outage would hold up the exit (an unreleased lease expires by itself)
    def renew_lease(self, token: str, expiry_s: float) -> bool:
        """The heartbeat; with it, a `degraded` event for each watched dependency (other than the
        database, which cannot be written to while down) whose outage began since the last beat,
        so the API shows it while it lasts (its end is the `outage` event of the next step)."""
        cascade_id, run_id = self._ids()
        down = [d for d in self.watched if d.degraded and d is not self.database]
        new = [d for d in down if d.name not in self._degraded_shown]
        with db.session_scope(self.engine) as s:
            self._check_clock(s)
            held = leases.renew(s, cascade_id=cascade_id, token=token, expiry_s=expiry_s)
            for dep in new if held else ():
                detail = {"run_id": run_id, "dependency": dep.name, "cause": dep.cause}
                repo.log_event(s, cascade_id=cascade_id, kind="degraded", actor=ACTOR, detail=detail)
        self._degraded_shown = {d.name for d in down}
        return held

    def release_lease(self, token: str) -> None:
        if self.cascade_id is None:
            return
        with db.session_scope(self.engine) as s:
            leases.release(s, cascade_id=self.cascade_id, token=token)

    @_retried
    def check_lease(self) -> None:
        """`LeaseLost` unless this runner still holds its lease (renewing it): asked before a write
        that does not go through the store (the weights pushed to the rollout replicas)."""
        with db.session_scope(self.engine) as s:
            self._fenced(s)

    def attach(self, ids: dict[str, Any]) -> None:
        self.cascade_id = int(ids["cascade_id"])
        self.run_id = int(ids["run_id"])
        self.stage_ids = [int(i) for i in ids["stage_ids"]]

    def _ids(self) -> tuple[int, int]:
        assert self.cascade_id is not None and self.run_id is not None, "store not attached to a run"
        return self.cascade_id, self.run_id

    # ------------------------------------------------------------------ stage state

    @_retried
    def stage_started(self, index: int) -> None:
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            stage = s.get(Stage, self.stage_ids[index])
            assert stage is not None
            if stage.state in ("pending", "paused"):
                repo.transition_stage(s, stage_id=stage.id, to_state="running", actor=ACTOR)

    @_retried
    def desired_state(self, index: int) -> str | None:
        """The operator's request for the stage; `aborted` too when the control plane aborted
        the stage itself (it does so for paused and pending stages)."""
        with db.session_scope(self.engine) as s:
            row = s.execute(
                select(Stage.state, Stage.desired_state).where(Stage.id == self.stage_ids[index])
            ).one()
            return "aborted" if row.state == "aborted" else row.desired_state

    @_retried
    def held_paused(self, index: int) -> bool:
        """The stage is paused by an operator and not (yet) asked to resume: a runner that
        resumes it waits instead of running it (a pause outlives the runner that applied it)."""
        with db.session_scope(self.engine) as s:
            row = s.execute(
                select(Stage.state, Stage.desired_state).where(Stage.id == self.stage_ids[index])
            ).one()
            return bool(row.state == "paused" and row.desired_state not in ("running", "completed"))

    def wait_while_paused(self, index: int, poll_s: float) -> str:
        """Block until an operator resumes the paused stage (returns `running`, after moving it
        back to running) or aborts it (returns `aborted`)."""
        while True:
            command = self.desired_state(index)
            if command == "aborted":
                return command
            if command == "running":
                self.stage_started(index)
                return command
            time.sleep(poll_s)

    @_retried
    def acknowledge(self, index: int, state: str) -> None:
        """Apply an operator's pause or abort at this step boundary."""
        cascade_id, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.transition_stage(s, stage_id=self.stage_ids[index], to_state=state, actor=ACTOR)
            if state == "aborted":
                repo.finish_run(s, run_id=run_id, status="aborted", actor=ACTOR)
                repo.set_cascade_status(s, cascade_id=cascade_id, status="aborted", actor=ACTOR)

    @_retried
    def stage_completed(self, index: int, *, stopped_by: str, steps: int) -> None:
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.transition_stage(
                s,
                stage_id=self.stage_ids[index],
                to_state="completed",
                actor=ACTOR,
                detail={"stopped_by": stopped_by, "steps": steps},
            )

    @_retried
    def gate_event(self, index: int, kind: str, detail: dict[str, Any]) -> None:
        """A regression gate's decision (`gate_opened`: the fallen domains and the interval test
        that found them) or a phase's end (`gate_closed`: recovered or bound), as a stage event."""
        cascade_id, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.log_event(
                s,
                cascade_id=cascade_id,
                stage_id=self.stage_ids[index],
                kind=kind,
                actor=ACTOR,
                detail={"run_id": run_id, **detail},
            )

    @_retried
    def stage_failed(self, index: int, *, reason: str) -> None:
        """The stage cannot go on (e.g. too many failed verifications): stage, run and cascade
        failed, with the reason in the event log."""
        cascade_id, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.transition_stage(
                s, stage_id=self.stage_ids[index], to_state="failed", actor=ACTOR, detail={"reason": reason}
            )
            repo.finish_run(s, run_id=run_id, status="failed", actor=ACTOR, detail={"reason": reason})
            repo.set_cascade_status(s, cascade_id=cascade_id, status="failed", actor=ACTOR)

    @_retried
    def finish(self, status: str) -> None:
        cascade_id, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.finish_run(s, run_id=run_id, status=status, actor=ACTOR)
            repo.set_cascade_status(s, cascade_id=cascade_id, status=status, actor=ACTOR)

    # ------------------------------------------------------------------ metrics

    @_retried
    def truncate_after(self, global_step: int, *, then: Callable[[], None] | None = None) -> None:
        """Drop the rows past `global_step` (a resume redoes those steps); `then` (the samples log
        cut the same way; idempotent) runs inside the fenced transaction."""
        _, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.discard_after(s, run_id=run_id, global_step=global_step)
            if then is not None:
                then()

    @_retried
    def record_step(
        self,
        index: int,
        step: int,
        global_step: int,
        metrics: dict[str, Any],
        *,
        then: Callable[[], None] | None = None,
    ) -> None:
        """The step's row, and an `outage` event for each watched dependency's outages that ended
        since the last step (one transaction: a step written twice logs them once). `then` (the
        step's line in the run's samples log; idempotent: a retried transaction calls it again)
        runs inside the fenced transaction, after the row, before the commit."""
        cascade_id, run_id = self._ids()
        ended = self._ended_outages()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            _, new = repo.record_step(
                s,
                run_id=run_id,
                stage_id=self.stage_ids[index],
                step=step,
                global_step=global_step,
                metrics=metrics,
            )
            for name, (count, down_s, cause) in ended.items() if new else ():
                repo.log_event(
                    s,
                    cascade_id=cascade_id,
                    stage_id=self.stage_ids[index],
                    kind="outage",
                    actor=ACTOR,
                    detail={
                        "run_id": run_id,
                        "dependency": name,
                        "outages": count,
                        "down_s": round(down_s, 3),
                        "cause": cause,
                        "global_step": global_step,
                    },
                )
            if then is not None:
                then()
        for name, (count, down_s, _) in ended.items():
            logged, logged_s = self._outages_logged.get(name, (0, 0.0))
            self._outages_logged[name] = (logged + count, logged_s + down_s)

    def _ended_outages(self) -> dict[str, tuple[int, float, str | None]]:
        """name -> (outages ended, seconds down, a cause) since the last step row."""
        out: dict[str, tuple[int, float, str | None]] = {}
        for dep in self.watched:
            count, down_s = self._outages_logged.get(dep.name, (0, 0.0))
            ended = dep.stats.outages - count - (1 if dep.degraded else 0)
            if ended > 0:
                out[dep.name] = (ended, dep.stats.down_s - down_s, dep.cause)
        return out

    @_retried
    def record_eval(self, index: int, step: int, global_step: int, result: DomainEval) -> None:
        _, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.record_eval(
                s,
                run_id=run_id,
                stage_id=self.stage_ids[index],
                step=step,
                global_step=global_step,
                domain=result.domain,
                score=result.score,
                n=result.n,
                reasons=result.reasons,
                metrics={name: m.to_dict() for name, m in result.metrics.items()},
            )

    @_retried
    def record_checkpoint(
        self,
        index: int,
        step: int,
        global_step: int,
        path: Path,
        *,
        publish: Callable[[], None] | None = None,
    ) -> None:
        """The checkpoint's row; `publish` (renaming the checkpoint, written under a staging name,
        into place) runs inside the fenced transaction, so a stale runner never puts one in place."""
        _, run_id = self._ids()
        index = min(index, len(self.stage_ids) - 1)
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            repo.record_checkpoint(
                s,
                run_id=run_id,
                stage_id=self.stage_ids[index],
                step=step,
                global_step=global_step,
                path=str(path),
                kind="resume",
            )
            if publish is not None:
                publish()

    @_retried
    def record_teacher(
        self,
        index: int,
        step: int,
        global_step: int,
        *,
        domain: str,
        score: float,
        path: Path,
        publish: Callable[[], None] | None = None,
    ) -> None:
        """The domain's new best checkpoint; `publish` as in `record_checkpoint`."""
        _, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            self._fenced(s)
            row = repo.record_checkpoint(
                s,
                run_id=run_id,
                stage_id=self.stage_ids[index],
                step=step,
                global_step=global_step,
                path=str(path),
                kind="teacher",
                domain=domain,
                score=score,
            )
            repo.mark_teacher(s, run_id=run_id, domain=domain, checkpoint_id=row.id, actor=ACTOR)
            if publish is not None:
                publish()

    # ------------------------------------------------------------------ report

    @_retried
    def write_report(self, out_dir: Path) -> None:
        from cascade.runner.report import write_report

        _, run_id = self._ids()
        with db.session_scope(self.engine) as s:
            history = repo.load_history(s, run_id)
        write_report(history, run_id, out_dir)
