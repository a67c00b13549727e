"""The cascade's stage loop, written once for both modes.

Stages in order; in each, steps of: plan the RL batch's requests, keep `max_staleness + 1`
batches in flight, fetch the distillation data, the trainer's update (`cascade.runner.update`),
push the weights; eval of every domain on its cadence, the advance rule, best-checkpoint
teachers, resumable checkpoints, the operator's commands from the store at every step boundary.

What differs between one process and the services is passed in as `RunSources` (rollouts,
teacher log-probs, weights): `cascade.runner.embedded` builds the loop with in-process sources,
`services.learner` with Redis/gRPC ones. The loop never asks which.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from cascade.accel import resolve_learner
from cascade.algo import PromptPassRateFilter, token_budget, warmup_lr_factor
from cascade.config import CascadeConfig, StageConfig, parse_watched_metric
from cascade.config.schedules import ConstantSchedule
from cascade.domains import load_problems, make_domain
from cascade.domains.agent import prompt_tools
from cascade.domains.base import Domain, NeedsPreparing, Problem
from cascade.engine.microbatch import MicroBatching
from cascade.eval.evaluate import evaluate_domain
from cascade.eval.results import DomainEval
from cascade.model.chat import completion_decoder, encode_prompts, token_encoder
from cascade.parallel.world import World
from cascade.resilience import resilience_metrics
from cascade.rollout.requests import PromptRequest, RolloutBatch, merge_chunks, request_seed
from cascade.runner.checkpoint import (
    newest_verified_checkpoint,
    prune_checkpoints,
    read_runner_state,
    save_model_dir_atomically,
    write_text_atomically,
)
from cascade.runner.curriculum import AdvanceTracker, TeacherRegistry
from cascade.runner.distill import DistillData, DistillJob, fetch_distill
from cascade.runner.domain_mix import per_domain_metrics, prompt_counts
from cascade.runner.drift import DriftWarning
from cascade.runner.fresh import check_is_run_dir, check_not_held, check_not_nested, move_aside
from cascade.runner.gate import fallen_domains
from cascade.runner.lease import LeaseKeeper
from cascade.runner.planning import distill_seed, plan_requests
from cascade.runner.progress import RunProgress
from cascade.runner.record import RunRecord, read_record, write_record
from cascade.runner.rl import RlPlan, VerifierFailureError, plan_rl
from cascade.runner.run_state import RunDirError, RunResult, RunState, rng_state_from_json, rng_state_to_json
from cascade.runner.run_store import RunStore
from cascade.runner.sources import RunSources, SourceStopped
from cascade.runner.staging import clear_stale, publish, staged_path
from cascade.runner.step_logs import (
    COMPLETION_GROUPS,
    COMPLETIONS_LOG,
    SAMPLES_LOG,
    STEP_LOGS,
    completion_records,
    lines_to_keep,
)
from cascade.runner.step_memory import step_memory_problems
from cascade.runner.training import PolicyTrainer, make_trainer
from cascade.runner.update import UpdateRequest
from cascade.store.leases import Holder, LeaseLost
from cascade.tracking import Tracker

"""One line per step: the sample ids it trained on (a sample trained twice would show here)."""


def _lr_for(stage: StageConfig, step: int) -> float:
    return stage.grpo.learning_rate * warmup_lr_factor(step, stage.grpo.warmup_steps)


@dataclass
class Ticket:
    """One RL batch in flight: its requests, submitted to the rollout source."""

    batch: int
    requests: list[PromptRequest]


class CascadeRunner:
    def __init__(
        self,
        config: CascadeConfig,
        sources: RunSources,
        *,
        run_dir: Path,
        db_url: str | None = None,
        distill: bool = True,
        resume: bool = False,
        fresh: bool = False,
        log: Callable[[str], None] = print,
        progress: RunProgress | None = None,
        stop_after_steps: int | None = None,
        cascade_id: int | None = None,
        follow: bool = False,
        poll_s: float = 1.0,
        on_step: Callable[[int, dict[str, Any]], None] | None = None,
        domains: dict[str, Domain] | None = None,
        world: World | None = None,
    ) -> None:
        """`cascade_id`: run a cascade the control plane created in the `db_url` database (its
        stages must match the config's). `follow`: when an operator pauses a stage, stay up and
        continue when it is resumed (polling every `poll_s`) instead of returning. `on_step`:
        called with (global step, metrics) after each step. `domains`: the verifiers for eval
        (built from the config when not given). `world`: the ranks the policy is sharded over
        (this process is rank 0; the others run `cascade.runner.sharded.follow`)."""
        self.cfg = config
        self.world = world or World()
        self.accel = self.world.place(resolve_learner(config.learner, config.model.dtype))
        """The device and precision policy (a device this host lacks fails here, before any write)."""
        too_big = step_memory_problems(
            config,
            str(self.accel.device),
            ranks=self.world.size,
            local_teachers=getattr(sources.teachers, "in_learner", True),
        )
        if too_big:  # a step that cannot fit: refused before anything is written
            raise RunDirError(too_big[0])
        self.trainer: PolicyTrainer = make_trainer(self.world, self.accel, config.model.dtype)
        self.sources = sources
        self.cascade_id = cascade_id
        self.follow = follow
        self.poll_s = poll_s
        self.run_dir = run_dir
        self.distill = distill
        self.log = log
        self.progress = progress or RunProgress(enabled=False)
        self.stop_after_steps = stop_after_steps
        self.on_step = on_step
        self.ckpt_root = run_dir / "checkpoints"
        self.teacher_root = run_dir / "teachers"
        check_not_nested(run_dir)
        if db_url is not None:
            try:
                make_url(db_url)
            except ArgumentError:
                raise RunDirError(f"--db: not a database URL: {db_url!r}") from None
        self.tracker = Tracker.from_config(
            config, run_dir, resume=resume, log=log, extra={"distill": distill, "mode": sources.rollouts.kind}
        )
        """Experiment tracking (`cascade.tracking`): does nothing unless `tracking.backends` names one;
        a backend whose library is missing fails here, before anything is written."""
        self.previous = read_record(run_dir) if resume else None
        self.fresh = fresh
        self.db_url = db_url or f"sqlite:///{(run_dir / 'cascade.db').resolve()}"
        store: RunStore | None = None
        if fresh:  # every check before the old run is moved aside (`cascade.runner.fresh`)
            check_is_run_dir(run_dir)
            check_not_held(run_dir, db_url)
            if db_url is not None:
                store = self._open_store()
                store.check_joinable(config, cascade_id=cascade_id)
        self._prepare_run_dir(resume=resume, fresh=fresh)
        self.store = store or self._open_store()
        self.domains: dict[str, Domain] = domains or {d.name: make_domain(d) for d in config.domains}
        self.train_problems: dict[str, list[Problem]] = {}
        self.eval_problems: dict[str, list[Problem]] = {}
        for d in config.domains:
            self.train_problems[d.name] = load_problems(d, "train")
            self.eval_problems[d.name] = load_problems(d, "eval")
        self._by_id = {n: {p.id: p for p in probs} for n, probs in self.train_problems.items()}
        self.generator = self.accel.generator(config.seed)
        torch.manual_seed(config.seed)
        self.rng = random.Random(config.seed)
        self.filters = {n: PromptPassRateFilter(self._filter_cfg(n)) for n in self.domains}
        self.registry = TeacherRegistry()
        self._pending_teacher_deletes: list[Path] = []
        self._inflight: deque[Ticket] = deque()
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distill")
        self.per_request = config.rollout.seeding == "per_request" or sources.rollouts.overlaps
        self.attempt = uuid.uuid4().hex[:12]
        """This process's attempt at the run: a chunk made for another attempt is never taken."""
        self.holder = Holder.this_process(token=uuid.uuid4().hex)
        self.lease: LeaseKeeper | None = None
        self._idle_s = 0.0
        self._step_logged = -1
        self.state = RunState()
        self._last_evals: dict[str, DomainEval] = {}
        """Each domain's latest eval (the advance rule's and the regression gate's)."""
        self._drift_warning: DriftWarning | None = None
        """The drift warning's stage-start policy and probes (made at its first reading)."""
        # the newest checkpoint that proves itself (manifest, finite weights); the ones skipped, in one line
        self.resume_from = newest_verified_checkpoint(self.ckpt_root, self.log) if resume else None
        if resume and self.resume_from is None and self.previous is not None:
            raise RunDirError(f"{self.run_dir}: no complete checkpoint to resume from (start with --fresh)")

    # ------------------------------------------------------------------ set-up

    def _open_store(self) -> RunStore:
        try:
            return RunStore(self.db_url, give_up_after_s=self.cfg.resilience.database_s, log=self.log)
        except OperationalError as err:
            if self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
                self.run_dir.rmdir()
            raise RunDirError(f"cannot open the database: {str(err.orig).strip().splitlines()[0]}") from None

    def _prepare_run_dir(self, *, resume: bool, fresh: bool) -> None:
        if fresh:
            move_aside(self.run_dir, self.log)
        if self.run_dir.exists() and any(self.run_dir.iterdir()) and not resume:
            raise RunDirError(
                f"{self.run_dir} already holds a run: pass --resume to continue it or --fresh to start over"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _filter_cfg(self, domain: str):
        for s in self.cfg.stages:
            if domain in s.mix:
                return s.filter
        return self.cfg.stages[0].filter

    def _load(self) -> None:
        for verifier in self.domains.values():  # a verifier that cannot run fails the run now
            if isinstance(verifier, NeedsPreparing):
                verifier.prepare()
        if self.resume_from is not None:
            # every check of a resume comes before its first change (the store's rows, the samples log)
            saved = read_runner_state(self.resume_from)
            step_logs = self._step_logs_to_keep(saved["global_step"])
            self.trainer.load(self.resume_from)
            self.policy = self.trainer.policy
            self.state = RunState(**saved)
            if self.state.py_rng is not None:
                self.rng.setstate(rng_state_from_json(self.state.py_rng))
            for n, f in self.filters.items():
                if n in self.state.filters:
                    f.load_state_dict(self.state.filters[n])
            self.registry.load_state_dict(self.state.teachers)
            holder = None if self.state.finished else self.holder
            self.store.resume(self.state.store_ids, holder=holder, expiry_s=self.cfg.lease.expiry_s)
            self.store.truncate_after(
                self.state.global_step, then=lambda: self._truncate_step_logs(step_logs)
            )
            self.log(
                f"resumed from {self.resume_from.name}: stage {self.state.stage_index + 1}, "
                f"step {self.state.stage_step} (global step {self.state.global_step})"
            )
        else:
            self.trainer.load(self.cfg.model.path)
            self.policy = self.trainer.policy
            self.state.store_ids = self.store.begin(
                self.cfg,
                run_dir=self.run_dir,
                distill=self.distill,
                cascade_id=self.cascade_id,
                kind=self.sources.rollouts.kind,
                holder=self.holder,
                rejoin=self.fresh,
            )
        if self.state.finished:  # nothing to train: only the report is written again
            return
        for gone in clear_stale(self.ckpt_root) + clear_stale(self.teacher_root):
            self.log(f"removed {gone.name}: a write its runner never published")
        if self.accel.device.type != "cpu":
            self.log(self.accel.describe())
        self.lease = LeaseKeeper(
            self.store,
            self.holder.token,
            heartbeat_s=self.cfg.lease.heartbeat_s,
            expiry_s=self.cfg.lease.expiry_s,
            log=self.log,
        )
        self.lease.start()
        rollouts = self.sources.rollouts
        rollouts.stop_when(self.lease.lost.is_set)  # a runner taken over takes no more results
        rollouts.attach(self.policy, self.generator, lambda: self.state.policy_version)
        if self.previous is not None:
            rollouts.forget(self.previous.sources)
        # what the services held for the dead process: the checkpoint's weights, its teachers
        self.sources.weights.push(self.policy, self.state.policy_version)
        for domain in self.registry.domains():
            entry = self.registry.teacher(domain)
            assert entry is not None
            self.sources.teachers.register(domain, Path(entry.path).resolve())
        write_record(
            self.run_dir,
            RunRecord.make(
                config=self.cfg,
                distill=self.distill,
                kind=rollouts.kind,
                db_url=self.db_url,
                cascade_id=int(self.state.store_ids["cascade_id"]),
                sources=rollouts.record(),
            ),
        )

    def _step_logs_to_keep(self, global_step: int) -> dict[str, list[str]]:
        """Each per-step log's lines up to `global_step` (`step_logs`), read and checked before a
        resume changes anything."""
        kept = {name: lines_to_keep(self.run_dir / name, global_step, self.log) for name in STEP_LOGS}
        return {name: lines for name, lines in kept.items() if lines is not None}

    def _truncate_step_logs(self, kept: dict[str, list[str]]) -> None:
        """The per-step logs as `_step_logs_to_keep` left them, each written atomically (the steps
        after the checkpoint are redone: their lines go, as their rows do)."""
        for name, lines in kept.items():
            write_text_atomically(self.run_dir / name, "".join(f"{line}\n" for line in lines))

    # ------------------------------------------------------------------ main loop

    def run(self) -> RunResult:
        """The cascade from where it stands; the lease is released however this returns (a
        runner that dies without returning leaves it to expire: its run then shows `stalled`),
        and the following ranks of a sharded learner are let go."""
        try:
            return self._run()
        except (LeaseLost, SourceStopped) as err:  # another runner holds the cascade now
            self.log(str(err))
            self._discard_inflight()
            if self.lease is not None:
                self.lease.lost.set()  # and nothing to release
            return self._finish("lease lost", write_report=False)
        finally:
            self._background.shutdown(wait=False, cancel_futures=True)
            if self.lease is not None:
                self.lease.stop(release=True)
            self.trainer.close()
            self.tracker.close()  # a run that raised: its tracked runs end too

    def _run(self) -> RunResult:
        self._load()
        self.tracker.start(self.state.global_step)
        if self.state.finished:
            self.log("run already finished; writing the report again")
            return self._finish("already finished")
        steps_this_call = 0
        while self.state.stage_index < len(self.cfg.stages):
            i = self.state.stage_index
            stage = self.cfg.stages[i]
            self.trainer.start_stage(stage)
            tracker = AdvanceTracker(stage.advance)
            resuming = self.resume_from is not None
            if resuming:
                assert self.resume_from is not None
                # a checkpoint between stages holds no optimizer of the next stage: it starts fresh
                # (loading the placeholder would give it the placeholder's lr and weight decay)
                self.trainer.restore(
                    self.resume_from, optimizer=self.state.stage_started, generator=self.generator
                )
                self.resume_from = None
            if resuming and self.state.stage_started:
                tracker.load_state_dict(self.state.tracker)
                if self.store.held_paused(i):  # an operator's pause outlives the runner that applied it
                    held = self._stay_paused(i, stage)
                    if held is not None:
                        return held
                self.store.stage_started(i)  # a stage an operator resumed meanwhile runs again
            else:
                self.state.stage_started = True
                self.store.stage_started(i)
                if i == 0 and self.state.global_step == 0:
                    self._evaluate(stage)
            self.log(
                f"stage {i + 1}/{len(self.cfg.stages)} '{stage.label}' ({stage.domain_label}), "
                f"teachers: {self._teacher_domains(i) or 'none'}"
            )
            self.progress.start_stage(i, stage.label, stage.advance.max_steps, self.state.stage_step)
            stopped_by = "max_steps"
            last_step = stage.advance.max_steps
            if stage.kind == "mopd" and not self._teacher_domains(i):
                self.log(f"stage '{stage.label}' skipped: no teacher to distill from (distillation is off)")
                stopped_by, last_step = "no teacher", 0
            if self.state.gate_phase and self._gate(i, stage, tracker) == "lease lost":  # resumed inside one
                return self._finish("lease lost", write_report=False)
            while self.state.stage_step < last_step:
                if self.lease is not None and self.lease.lost.is_set():
                    self._discard_inflight()
                    return self._finish("lease lost", write_report=False)
                command = self.store.desired_state(i)
                if command in ("paused", "aborted"):
                    self._discard_inflight()
                    self._checkpoint(tracker)
                    self.store.acknowledge(i, command)
                    self.log(f"stage '{stage.label}' {command} by operator at step {self.state.stage_step}")
                    if command == "paused" and self.follow:
                        command = self.store.wait_while_paused(i, self.poll_s)
                        if command == "running":
                            self.log(f"stage '{stage.label}' resumed by operator")
                            continue
                        self.store.acknowledge(i, command)
                    return self._finish(command, write_report=False)
                if command == "completed":
                    stopped_by = "operator"
                    break
                try:
                    metrics = self._step(stage)
                except VerifierFailureError as err:
                    self._discard_inflight()
                    self.store.stage_failed(i, reason=str(err))
                    self.log(f"stage '{stage.label}' failed: {err}")
                    return self._finish("failed", write_report=False)
                self.progress.update(self.state.stage_step, metrics)
                advanced = False
                if self.state.stage_step % stage.eval.every == 0:
                    scores = self._evaluate(stage)
                    self.progress.set_eval(scores)
                    advanced = tracker.observe(self.state.stage_step, self._watched_value(stage))
                    if stage.gate.check == "every_eval" and self._gate(i, stage, tracker) == "lease lost":
                        return self._finish("lease lost", write_report=False)
                if self.state.stage_step % self.cfg.checkpoint.every == 0:
                    self._checkpoint(tracker)
                steps_this_call += 1
                if advanced:
                    stopped_by = "threshold"
                    break
                if self.stop_after_steps is not None and steps_this_call >= self.stop_after_steps:
                    self._discard_inflight()
                    self._checkpoint(tracker)
                    self.progress.stop()
                    return self._finish("interrupted", write_report=False)
            stale = self.state.last_eval_global_step != self.state.global_step
            if stale or (self.cfg.guarded_by_gate(i) and not self._last_evals):
                self._evaluate(stage)
            if self._gate(i, stage, tracker) == "lease lost":
                return self._finish("lease lost", write_report=False)
            self.progress.end_stage()
            self.store.stage_completed(i, stopped_by=stopped_by, steps=self.state.stage_step)
            self.log(f"stage '{stage.label}' done after {self.state.stage_step} steps ({stopped_by})")
            self._discard_inflight()
            self.state.stage_index += 1
            self.state.stage_step = 0
            self.state.stage_started = False
            self.state.gate_phase = {}
            self.state.tracker = {}
            self.trainer.end_stage()
            self._checkpoint(None)
        self.state.finished = True
        self._checkpoint(None)
        return self._finish("completed")

    def _stay_paused(self, i: int, stage: StageConfig) -> RunResult | None:
        """A resumed runner of a stage an operator paused: with `follow`, wait for the resume
        (None: go on) or the abort; without, stop as paused (the stage stays paused)."""
        self.log(f"stage '{stage.label}' is paused by an operator: it stays paused until it is resumed")
        if not self.follow:
            return self._finish("paused", write_report=False)
        command = self.store.wait_while_paused(i, self.poll_s)
        if command == "running":
            self.log(f"stage '{stage.label}' resumed by operator")
            return None
        self.store.acknowledge(i, command)
        return self._finish(command, write_report=False)

    def _teacher_domains(self, stage_index: int, stage: StageConfig | None = None) -> list[str]:
        """The teachers with a best checkpoint: the config stage's, or those of `stage` when it is
        a phase the gate inserted (an mopd stage over the fallen domains)."""
        if not self.distill:
            return []
        wanted = list(stage.mix) if stage is not None else self.cfg.teachers_for(stage_index)
        return [d for d in wanted if self.registry.teacher(d) is not None]

    # ------------------------------------------------------------------ one step

    def _step(self, stage: StageConfig, *, gate_phase: bool = False) -> dict[str, float]:
        t0 = time.perf_counter()
        self._idle_s = 0.0
        g = stage.grpo
        step = self.state.stage_step
        budget = token_budget(g.budget, step)
        batch: RolloutBatch | None = None
        if stage.kind == "mopd":  # distillation alone: no RL batch, no outcome reward
            distill_future = self._start_distill(stage, budget)
            plan = RlPlan({}, [], [], [], [], None, g.temperature, global_rows=0)
        else:
            batch, distill_future = self._next_batch(stage, budget)
        t_gen = time.perf_counter()
        if batch is not None:
            plan = plan_rl(
                batch,
                g,
                current_version=self.state.policy_version,
                drop_zero_variance=stage.filter.drop_zero_variance,
            )
            if len(stage.mix) > 1:
                plan.metrics.update(per_domain_metrics(batch))
        request = UpdateRequest(
            rl=plan,
            stage=stage,
            stage_step=step,
            lr=_lr_for(stage, step),
            pad_id=self.policy.pad_token_id,
            reference=self._reference(stage),
            batching=MicroBatching.of(self.cfg.learner),
        )

        def distill() -> list[DistillData]:
            return self._wait(distill_future) if distill_future is not None else []

        if stage.gate.drift_every > 0:
            self._stage_start(stage)  # the drift warning's baseline, before the stage's first update
        update, forward_s = self.trainer.update(request, distill)
        self.state.policy_version += 1
        self.state.stage_step += 1
        self.state.global_step += 1
        self.store.check_lease()  # a runner taken over while it trained must not push its weights
        pushed = self.sources.weights.push(self.policy, self.state.policy_version)
        t_end = time.perf_counter()
        metrics: dict[str, Any] = {
            **update,
            "token_budget": float(budget),
            "time_rollout_s": t_gen - t0,
            "time_loss_s": forward_s,
            "time_update_s": t_end - t_gen - forward_s,
            "time_step_s": t_end - t0,
            "time_wait_s": self._idle_s,
            "idle_fraction": self._idle_s / max(t_end - t0, 1e-9),
            "reasons": batch.reason_counts() if batch is not None else {},
            **pushed,
            **self.sources.rollouts.stats(),
            **resilience_metrics(self.store.watched),
            **({"gate_phase": 1.0} if gate_phase else {}),
            **self._drift(stage),
        }
        global_step = self.state.global_step
        lines: dict[str, str] = {}
        if batch is not None:
            prompts = [p.prompt for p in batch.problems]
            shown = completion_records(batch, global_step, stage.label, COMPLETION_GROUPS, prompts)
            lines = {
                SAMPLES_LOG: json.dumps({"global_step": global_step, "sample_ids": batch.sample_ids}) + "\n",
                COMPLETIONS_LOG: "".join(json.dumps(r) + "\n" for r in shown),
            }
        self.store.record_step(
            self.state.stage_index,
            self.state.stage_step,
            self.state.global_step,
            metrics,
            then=lambda: self._log_step(global_step, lines),
        )
        if self.on_step is not None:
            self.on_step(self.state.global_step, metrics)
        self.tracker.log_step(self.state.global_step, metrics, stage=self.state.stage_index)
        return metrics

    # ------------------------------------------------------------------ the regression gate

    def _gate(self, i: int, stage: StageConfig, tracker: AdvanceTracker) -> str | None:
        """The regression gate after an eval of stage `i` (`stages[].gate`): when guarded earlier
        domains have fallen below their best checkpoints outside the eval's noise, an MOPD phase
        (their best checkpoints as teachers, steps of this stage marked `gate_phase`) runs until
        an eval finds every one of them back or `gate.max_steps` is reached. The decision and its
        evidence, and the phase's end, are stage events. Returns "lease lost" when it stopped."""
        gate = stage.gate
        guarded = self.cfg.guarded_by_gate(i)
        if not guarded or not self.distill:
            return None
        entries = {d: self.registry.teacher(d) for d in guarded}
        if not self.state.gate_phase:
            fallen = fallen_domains(guarded, self._last_evals, entries)
            if not fallen:
                return None
            self.log(
                f"  regression gate: {'; '.join(f.describe() for f in fallen)}: distilling from "
                f"the best checkpoints (at most {gate.max_steps} steps) before going on"
            )
            self.state.gate_phase = {
                "domains": [f.domain for f in fallen],
                "steps": 0,
                "opened_at": self.state.global_step,
            }
            self.store.gate_event(
                i,
                "gate_opened",
                {
                    "global_step": self.state.global_step,
                    "fallen": [f.to_dict() for f in fallen],
                    "test": "latest eval's interval wholly below the best checkpoint's",
                    "max_steps": gate.max_steps,
                },
            )
        names = list(self.state.gate_phase["domains"])
        phase = stage.model_copy(
            update={
                "kind": "mopd",
                "domains": {d: 1.0 for d in names},
                "distill": stage.distill.model_copy(
                    update={"enabled": True, "loss": "sampled", "lam": ConstantSchedule(value=1.0)}
                ),
            }
        )
        outcome = "bound"
        while self.state.gate_phase["steps"] < gate.max_steps:
            if self.lease is not None and self.lease.lost.is_set():
                return "lease lost"
            self.progress.update(self.state.stage_step, self._step(phase, gate_phase=True))
            self.state.gate_phase["steps"] += 1
            steps = self.state.gate_phase["steps"]
            if self.state.stage_step % self.cfg.checkpoint.every == 0:
                self._checkpoint(tracker)
            if steps % gate.eval_every == 0 or steps == gate.max_steps:
                self.progress.set_eval(self._evaluate(stage))
                if not fallen_domains(names, self._last_evals, entries):
                    outcome = "recovered"
                    break
        steps = self.state.gate_phase["steps"]
        now = {d: self._last_evals[d].score for d in names if d in self._last_evals}
        shown = ", ".join(f"{d} {v:.1%}" for d, v in now.items())
        self.log(f"  regression gate: {outcome} after {steps} steps ({shown})")
        self.store.gate_event(
            i,
            "gate_closed",
            {"global_step": self.state.global_step, "outcome": outcome, "steps": steps, "scores": now},
        )
        self.state.gate_phase = {}
        return None

    def _wait(self, future: Future[list[DistillData]]) -> list[DistillData]:
        t0 = time.perf_counter()
        out = future.result()
        self._idle_s += time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ rollouts

    def _encode(self, problems: list[Problem], thinking: bool) -> list[list[int]]:
        tools = [prompt_tools(p) if self.domains[p.domain].name == "agent" else None for p in problems]
        prompts = [p.prompt for p in problems]
        return encode_prompts(self.policy.tokenizer, self.cfg.chat, prompts, thinking, tools)

    def _pick_problems(self, domain: str, k: int) -> list[Problem]:
        ids = [p.id for p in self.train_problems[domain]]
        picked = self.filters[domain].sample(ids, min(k, len(ids)), self.rng)
        return [self._by_id[domain][pid] for pid in picked]

    def _step_prompts(self, stage: StageConfig, total: int) -> dict[str, list[Problem]]:
        """Each of the stage's domains with its prompts for one step (`total` split by shares)."""
        return {d: self._pick_problems(d, k) for d, k in prompt_counts(total, stage.mix).items()}

    def _submit(self, stage: StageConfig, budget: int) -> Ticket:
        seq = self.state.batches_made
        self.state.batches_made += 1
        requests: list[PromptRequest] = []
        for domain, chosen in self._step_prompts(stage, stage.grpo.prompts_per_step).items():
            reward = self.cfg.domain(domain).reward_settings  # carries the kind of a free name
            requests += plan_requests(
                seed=self.cfg.seed,
                batch=seq,
                stage=stage,
                domain=domain,
                problems=chosen,
                prompt_ids=self._encode(chosen, stage.grpo.thinking),
                budget=budget,
                policy_version=self.state.policy_version,
                per_request=self.per_request,
                prompts_per_request=self.cfg.rollout.prompts_per_request,
                reward_config=reward.model_dump(mode="json") if reward is not None else None,
                attempt=self.attempt,
                first_index=len(requests),
            )
        self.sources.rollouts.submit(requests)
        return Ticket(seq, requests)

    def _next_batch(
        self, stage: StageConfig, budget: int
    ) -> tuple[RolloutBatch, Future[list[DistillData]] | None]:
        """The batch to train on now, and the step's distillation data on its way.

        With `max_staleness = s`, s + 1 batches are in flight: the oldest is trained on now (made
        by weights up to s versions old), the others generate meanwhile. A batch older than s
        versions (possible after a long wait) is dropped and replaced."""
        s = stage.grpo.max_staleness
        while len(self._inflight) < s + 1:
            self._inflight.append(self._submit(stage, budget))
        distill = self._start_distill(stage, budget)
        while True:
            ticket = self._inflight.popleft()
            t0 = time.perf_counter()
            chunks = self.sources.rollouts.collect(ticket.batch)
            self._idle_s += time.perf_counter() - t0
            version = min(c.engine_version for c in chunks)
            batch = merge_chunks(
                ticket.requests, chunks, policy_version=version, temperature=stage.grpo.temperature
            )
            self._update_filter(batch)
            if self.state.policy_version - batch.policy_version <= s:
                return batch, distill
            self.log(f"dropped a batch of version {batch.policy_version}: older than max_staleness {s}")
            self._inflight.append(self._submit(stage, budget))

    def _discard_inflight(self) -> None:
        """Batches asked for but not trained on (stage over, pause, stop) are taken back."""
        if self._inflight:
            self.sources.rollouts.discard([t.batch for t in self._inflight])
        self._inflight.clear()

    def _update_filter(self, batch: RolloutBatch) -> None:
        rewards = batch.rewards()
        for gi, p in enumerate(batch.problems):
            self.filters[p.domain].update(p.id, rewards[gi].tolist())

    # ------------------------------------------------------------------ distillation

    def _start_distill(self, stage: StageConfig, budget: int) -> Future[list[DistillData]] | None:
        """Pick the replay prompts now (the run's RNG order), fetch the data: in a thread when
        generation runs elsewhere, here otherwise."""
        phase = stage if stage is not self.cfg.stages[self.state.stage_index] else None
        teachers = self._teacher_domains(self.state.stage_index, phase)
        if not teachers:
            return None
        jobs = []
        counts = prompt_counts(stage.grpo.prompts_per_step, stage.mix) if stage.kind == "mopd" else {}
        for d in teachers:
            problems = self._distill_problems(stage, d, counts.get(d))
            if not problems:
                continue
            seed = distill_seed(self.cfg.seed, self.state.global_step, d, per_request=self.per_request)
            domain = d if stage.distill.prompt_source == "replay" or stage.kind == "mopd" else stage.domain
            reward = self.cfg.domain(domain).reward_settings
            jobs.append(
                DistillJob(
                    d,
                    self._encode(problems, stage.grpo.thinking),
                    seed,
                    problems=problems,
                    domain=domain,
                    reward_config=reward.model_dump(mode="json") if reward is not None else None,
                    thinking=stage.grpo.thinking,
                )
            )
        tokenizer = self._distill_tokenizer()

        def fetch() -> list[DistillData]:
            return fetch_distill(
                jobs,
                stage=stage,
                budget=budget,
                pad_id=self.policy.pad_token_id,
                rollouts=self.sources.rollouts,
                teachers=self.sources.teachers,
                decode=completion_decoder(tokenizer),
                encode=token_encoder(tokenizer),
            )

        if self.sources.rollouts.overlaps:
            return self._background.submit(fetch)
        done: Future[list[DistillData]] = Future()
        done.set_result(fetch())
        return done

    def _distill_tokenizer(self) -> Any:
        """The tokenizer the distillation fetch decodes and encodes episodes with: a copy of the
        policy's, since the fetch may run in a thread while this one encodes prompts (a fast
        tokenizer is not safe to share across threads)."""
        if getattr(self, "_fetch_tokenizer", None) is None:
            self._fetch_tokenizer = copy.deepcopy(self.policy.tokenizer)
        return self._fetch_tokenizer

    def _distill_problems(self, stage: StageConfig, teacher: str, k: int | None = None) -> list[Problem]:
        """`k` of the prompts the teacher's samples are made on (default `prompts_per_teacher`;
        an mopd stage's teacher is its own domain's, on that domain's prompts)."""
        dc = stage.distill
        replay = dc.prompt_source == "replay" or stage.kind == "mopd"
        pool = self.train_problems[teacher if replay else stage.domain]
        return self.rng.sample(pool, min(dc.prompts_per_teacher if k is None else k, len(pool)))

    def _reference(self, stage: StageConfig) -> Path | None:
        """The frozen stage-start policy for the k3 KL term (None without one)."""
        return self._stage_start(stage) if stage.grpo.kl_coef > 0 else None

    def _stage_start(self, stage: StageConfig) -> Path:
        """The stage-start policy, written once per stage before its first update (the k3 KL
        term's reference and the drift warning's baseline)."""
        path = self.run_dir / "references" / f"stage-{self.state.stage_index}"
        if not path.exists():
            save_model_dir_atomically(self.policy, path)
        return path.resolve()

    def _drift(self, stage: StageConfig) -> dict[str, float]:
        """`drift_kl/<domain>` every `gate.drift_every` stage steps (`cascade.runner.drift`); on one
        rank only (a sharded policy's forward is a collective the other ranks are not in)."""
        every, i = stage.gate.drift_every, self.state.stage_index
        domains = self.cfg.gate_domains(i)
        if every <= 0 or self.state.stage_step % every or not domains or self.world.size > 1:
            return {}
        if self._drift_warning is None:
            self._drift_warning = DriftWarning(self.accel.frozen_dtype, self.accel.device)
        return self._drift_warning.readings(
            i,
            self.policy,
            self._stage_start(stage),
            self.cfg.chat,
            {d: self.eval_problems[d][: stage.gate.drift_prompts] for d in domains},
            max_new_tokens=token_budget(stage.grpo.budget, 0),
            thinking=stage.grpo.thinking,
        )

    # ------------------------------------------------------------------ eval, teachers, checkpoints

    def _trained_domains(self) -> set[str]:
        return {d for s in self.cfg.stages[: self.state.stage_index + 1] for d in s.mix}

    def _evaluate(self, stage: StageConfig) -> dict[str, float]:
        """Eval of every domain with the current weights, generated by the rollout source, with
        the stage's eval metrics; returns each domain's primary score (all kept in `_last_evals`).
        """
        scores: dict[str, float] = {}
        self._last_evals = {}
        budget = stage.eval.max_new_tokens or token_budget(stage.grpo.budget, self.state.stage_step)
        trained = self._trained_domains()
        for name, domain in self.domains.items():
            problems = self.eval_problems[name]
            if stage.eval.n_prompts:
                problems = problems[: stage.eval.n_prompts]
            result = evaluate_domain(
                self.sources.rollouts.generate,
                self.policy.tokenizer,
                self.cfg.chat,
                domain,
                problems,
                max_new_tokens=budget,
                thinking=stage.grpo.thinking,
                spec=stage.eval,
                seed=request_seed(self.cfg.seed, "eval", self.state.global_step, name),
                name=name,
            )
            scores[name] = result.score
            self._last_evals[name] = result
            self.store.record_eval(
                self.state.stage_index, self.state.stage_step, self.state.global_step, result
            )
            if name in trained and self.state.global_step > 0:
                self._offer_teacher(name, result)
        self.tracker.log_eval(self.state.global_step, self._last_evals)
        self.state.last_eval_global_step = self.state.global_step
        self.log(
            f"  eval @ step {self.state.global_step} (stage step {self.state.stage_step}): "
            + "  ".join(f"{k} {v:.1%}" for k, v in scores.items())
        )
        return scores

    def _watched_value(self, stage: StageConfig) -> float:
        """The value of `stage.advance.metric` in the latest eval (0 when it was not evaluated)."""
        domain, metric = parse_watched_metric(stage.advance.metric)
        result = self._last_evals.get(stage.domain if domain == "{domain}" else domain)
        return 0.0 if result is None else result.metric(metric)

    def _offer_teacher(self, domain: str, result: DomainEval) -> None:
        """Offer the current weights as `domain`'s teacher, by its primary eval score (the first
        of `eval.metrics`, the same metric in every stage), kept with its interval (the gate's)."""
        score = result.score
        primary = result.metrics.get(result.primary)
        interval = (primary.low, primary.high) if primary is not None else None
        old = self.registry.teacher(domain)
        # another domain's best checkpoint of this very step holds these weights: one directory
        twin = next(
            (
                e.path
                for d in self.registry.domains()
                if (e := self.registry.teacher(d)) and e.step == self.state.global_step
            ),
            None,
        )
        path = Path(twin) if twin else self.teacher_root / f"{domain}-g{self.state.global_step:06d}"
        if not self.registry.offer(domain, score, self.state.global_step, str(path), interval):
            return
        staged = staged_path(path, self._epoch())
        if twin is None:
            save_model_dir_atomically(self.policy, staged)
        self.store.record_teacher(
            self.state.stage_index,
            self.state.stage_step,
            self.state.global_step,
            domain=domain,
            score=score,
            path=path,
            publish=None if twin else lambda: publish(staged, path),
        )
        self.sources.teachers.register(domain, path.resolve())
        if old is not None and Path(old.path) != path:
            self._pending_teacher_deletes.append(Path(old.path))

    def _epoch(self) -> int:
        return self.store.fence.epoch if self.store.fence is not None else 0

    def _log_step(self, global_step: int, lines: dict[str, str]) -> None:
        """The step's lines of the per-step logs, once (the step's transaction may be retried)."""
        if self._step_logged == global_step:
            return
        for name, text in lines.items():
            if text:
                with (self.run_dir / name).open("a") as f:
                    f.write(text)
        self._step_logged = global_step

    def _checkpoint(self, tracker: AdvanceTracker | None) -> None:
        self.state.tracker = tracker.state_dict() if tracker is not None else {}
        self.state.teachers = self.registry.state_dict()
        self.state.filters = {n: f.state_dict() for n, f in self.filters.items()}
        self.state.py_rng = rng_state_to_json(self.rng.getstate())
        path = self.ckpt_root / f"step-{self.state.global_step:06d}"
        staged = staged_path(path, self._epoch())
        self.trainer.save(staged, generator=self.generator, runner_state=self.state.__dict__.copy())
        self.store.record_checkpoint(
            self.state.stage_index,
            self.state.stage_step,
            self.state.global_step,
            path,
            publish=lambda: publish(staged, path),
        )
        self.tracker.log_checkpoint(self.state.global_step, path)
        prune_checkpoints(self.ckpt_root, self.cfg.checkpoint.keep_last)
        in_use = {Path(e.path) for d in self.registry.domains() if (e := self.registry.teacher(d))}
        for old in self._pending_teacher_deletes:
            if old not in in_use:  # a directory another domain's teacher still is stays
                shutil.rmtree(old, ignore_errors=True)
        self._pending_teacher_deletes.clear()

    def _finish(self, stopped_by: str, write_report: bool = True) -> RunResult:
        if stopped_by in ("completed", "aborted", "failed"):
            self.sources.rollouts.finish()
        report_dir = self.run_dir / "report"
        if write_report:
            self.store.finish(
                status="completed" if stopped_by in ("completed", "already finished") else stopped_by
            )
            self.store.write_report(report_dir)
        self.tracker.finish(stopped_by, report_dir if write_report else None)
        return RunResult(
            run_dir=self.run_dir,
            report_dir=report_dir,
            finished=self.state.finished,
            stopped_by=stopped_by,
        )

    def close(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)
        self.trainer.close()
        self.sources.close()
