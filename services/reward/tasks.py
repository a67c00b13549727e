"""The Celery app of the reward workers: one task that scores a chunk of a batch.

Run workers with `celery -A services.reward.tasks worker --concurrency N` (N processes is the
scaling knob). Delivery is at-least-once: a task is acknowledged only after it returns
(`task_acks_late`), a worker process that dies mid-task has its task requeued
(`task_reject_on_worker_lost`), and a whole worker that is killed leaves its task unacked in
Redis, which redelivers it to another worker after the broker's visibility timeout. Scoring is
deterministic and side-effect free, so running a chunk twice is harmless.

Settings come from the environment when the app is first configured (workers), or from
`configure` (the gRPC front, from its flags); both use `celery_settings`, so they agree.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from celery import Celery, Task
from celery.signals import worker_init, worker_process_shutdown, worker_ready

from cascade.domains import RewardVerdict
from services.reward.batch import DomainCache, batch_from_payload, infra_verdicts, verdicts_to_json
from services.reward.budget import score_each

log = logging.getLogger(__name__)

QUEUE = "cascade-reward"
TASK_NAME = "cascade.reward.score_items"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
PROGRESS = "PROGRESS"
"""The state of a task that has scored some of its items (its meta: their verdicts)."""
PRIORITY_LEVELS = 10
"""Task priorities 0 (first) to 9 (Redis serves the lower number first): the front gives a
request's k-th task priority `min(9, k.bit_length())`, so a small request's tasks pass a big
request's backlog (see `scoring`)."""


def celery_settings(
    *,
    broker_url: str,
    result_backend: str | None = None,
    visibility_timeout_s: float = 3600.0,
    restore_interval_s: float = 10.0,
    task_time_limit_s: float = 600.0,
) -> dict[str, Any]:
    """Settings shared by the front and the workers.

    `visibility_timeout_s`: how long a task fetched by a worker that then vanished stays
    invisible before it goes back to the queue for another worker; must exceed the longest
    task (a slower one is run twice). `restore_interval_s`: how often each worker looks for
    such tasks. `task_time_limit_s`: a worker process running one task longer is killed.
    """
    return {
        "broker_url": broker_url,
        "result_backend": result_backend or broker_url,
        "task_default_queue": QUEUE,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        "task_time_limit": task_time_limit_s,
        "result_expires": 3600,
        "broker_transport_options": {
            "priority_steps": list(range(PRIORITY_LEVELS)),
            "queue_order_strategy": "priority",
            "visibility_timeout": visibility_timeout_s,
            "unacked_restore_interval": restore_interval_s,
            "unacked_restore_throttle": 1,  # scan on every sweep (kombu's default: every 10th)
            "socket_connect_timeout": 5,
            "socket_timeout": 30,
        },
        "broker_connection_timeout": 5,
        "broker_connection_retry_on_startup": True,
        # Give up on an unreachable result store within seconds (default: 20 retries, 1 s
        # apart); the front then answers `infra_error` instead of hanging.
        "result_backend_transport_options": {
            "retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}
        },
        "redis_socket_connect_timeout": 5,
        "redis_socket_timeout": 30,
        "task_publish_retry_policy": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 1,
        },
    }


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """`CASCADE_REWARD_BROKER_URL` (default: local Redis db 0), `CASCADE_REWARD_RESULT_BACKEND`
    (default: the broker), `CASCADE_REWARD_VISIBILITY_TIMEOUT_S`, `CASCADE_REWARD_RESTORE_INTERVAL_S`,
    `CASCADE_REWARD_TASK_TIME_LIMIT_S`."""
    return celery_settings(
        broker_url=environ.get("CASCADE_REWARD_BROKER_URL", DEFAULT_REDIS_URL),
        result_backend=environ.get("CASCADE_REWARD_RESULT_BACKEND") or None,
        visibility_timeout_s=float(environ.get("CASCADE_REWARD_VISIBILITY_TIMEOUT_S", 3600)),
        restore_interval_s=float(environ.get("CASCADE_REWARD_RESTORE_INTERVAL_S", 10)),
        task_time_limit_s=float(environ.get("CASCADE_REWARD_TASK_TIME_LIMIT_S", 600)),
    )


class _EnvSettings(Mapping[str, Any]):
    """`settings_from_env`, read when Celery first needs its configuration (not at import)."""

    @functools.cached_property
    def _settings(self) -> dict[str, Any]:
        return settings_from_env(os.environ)

    def __getitem__(self, key: str) -> Any:
        return self._settings[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings)

    def __len__(self) -> int:
        return len(self._settings)


app = Celery("cascade_reward", set_as_current=False)
app.config_from_object(_EnvSettings())


@worker_init.connect
def _check_sandbox(**_: Any) -> None:
    """Refuse to start a worker that would have to run code without the sandbox.

    `CASCADE_REWARD_SANDBOX_CHECK=0` skips it (workers that never score code).
    """
    if os.environ.get("CASCADE_REWARD_SANDBOX_CHECK", "1") == "0":
        return
    from cascade.sandbox import preflight

    try:
        checks = preflight.require()
    except preflight.SandboxUnavailable as err:
        log.critical("%s", err)
        raise SystemExit(78) from None  # EX_CONFIG
    _sandbox_report.append(preflight.format_report(checks))


_sandbox_report: list[str] = []
"""The passed check's report, logged once the worker's logging is set up (at `worker_init` an
INFO line goes nowhere)."""


@worker_ready.connect
def _report_sandbox(**_: Any) -> None:
    for report in _sandbox_report:
        log.info("code sandbox ready:\n%s", report)


@worker_process_shutdown.connect
def _close_sandboxes(**_: Any) -> None:
    """Stop this pool process's sandbox workers and remove their staged directory: a prefork
    child leaves through `os._exit`, past `atexit` and the finalizers, both at a warm shutdown
    and on a SIGTERM of its own (billiard's handler exits through the same path)."""
    from cascade.sandbox.pool import close_pools

    close_pools()


def configure(settings: Mapping[str, Any]) -> Celery:
    """The app with `settings` over the environment's (the front, from its flags); call it
    before the app is first used."""
    app.conf.update(settings)
    return app


class ScoringTask(Task):
    """Holds the worker process's domains, built on first use and kept across tasks."""

    _domains: DomainCache | None = None

    @property
    def domains(self) -> DomainCache:
        if self._domains is None:
            self._domains = DomainCache()
        return self._domains


@app.task(bind=True, base=ScoringTask, name=TASK_NAME)
def score_items(
    self: ScoringTask, domain_json: str, items: list[dict[str, Any]], budget_s: float | None = None
) -> list[list[Any]]:
    """[reward, reason, detail] per item; a failure to score is an `infra_error` verdict.

    Items are scored one at a time, each within `budget_s` (`budget.score_each`: one over it
    is `timeout`). After each item but the last, the verdicts so far are published as the
    task's `PROGRESS` state (`{"verdicts": {index: [reward, reason, detail]}}`), so a front
    whose client's deadline comes first still answers the finished ones.
    """
    try:
        batch = batch_from_payload(domain_json, items)
    except (ValueError, KeyError, TypeError) as err:
        return verdicts_to_json(infra_verdicts(len(items), f"malformed task payload: {err!r:.200}"))
    known: dict[str, list[Any]] = {}

    def done(i: int, verdict: RewardVerdict) -> None:
        known[str(i)] = verdicts_to_json([verdict])[0]
        if len(known) < len(items) and self.request.id is not None:
            try:
                self.update_state(state=PROGRESS, meta={"verdicts": known})
            except Exception:  # the result store: the final result may still get through
                log.warning("cannot publish the progress of task %s", self.request.id, exc_info=True)

    return verdicts_to_json(score_each(self.domains, batch, budget_s, done))
