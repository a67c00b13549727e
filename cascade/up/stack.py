"""`cascade up CONFIG`: the distributed mode as local processes, without the control plane.

Starts the rollout service (`rollout_replicas` processes: `rollout`, `rollout-1`, ...), the
reward service (gRPC front + Celery workers), the teacher service, rollout workers and the
learner, each in its own session (its pid is its process group), on free loopback ports, against
the local Redis and the given database. Prints where each listens and where it logs; when the
learner finishes, or on Ctrl-C / SIGTERM, stops them all (SIGTERM to each group, SIGKILL to what
lingers), the learner first. With `supervise`, a process other than the learner that dies is
reported and started again (`cascade.up.supervisor`). Logs are appended to, never truncated:
each start of a process writes a marker line first, and `Proc.log()` is what this start wrote.

Each process gets SIGTERM when the process that started it dies, even SIGKILLed
(`cascade.up.deathsig`), and each start is written down in the log directory
(`cascade.up.orphans`: what outlives a `cascade up` keeps the next one from starting). No
password goes on a command line (`ps` shows those to every user): the Redis and database URLs
reach the processes in their environment (`CASCADE_LEARNER_DB_URL`, `CASCADE_LEARNER_REDIS_URL`,
`CASCADE_WORKER_REDIS_URL`, `CASCADE_REWARD_BROKER_URL`), which only the same user can read.

The services are started by module name (`python -m services...`): `cascade` imports none of them.
"""

from __future__ import annotations

import codecs
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cascade.config import ConfigError, PythonReward, VllmEngineConfig, load_cascade_config
from cascade.engine import vllm_env
from cascade.transport.health import wait_until_serving
from cascade.up import deathsig
from cascade.up.orphans import StackRecord
from cascade.up.supervisor import RestartBound, Supervised, Supervisor

REPO = Path(__file__).resolve().parents[2]

CREDENTIAL_ENV = ("CASCADE_LEARNER_DB_URL", "CASCADE_LEARNER_REDIS_URL", "CASCADE_WORKER_REDIS_URL")
"""Where the learner and the rollout workers read the URLs that may hold a password (instead
of `--db` / `--redis-url`): set by the stack for its processes only, never inherited."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replica_no(name: str) -> int:
    return 0 if name == "rollout" else int(name.rsplit("-", 1)[1])


def python_reward_flags(config: Path) -> list[str]:
    """The reward front's `--python-reward` (and `--python-reward-path`) for each user reward
    function the cascade names: the service calls only the functions its command line lists."""
    flags: list[str] = []
    try:
        domains = load_cascade_config(config).domains
    except ConfigError:  # none yet (a stack started before its cascade is chosen), or the learner's
        return flags  # to report: it loads the same file and names what is wrong
    for domain in domains:
        if isinstance(domain.reward, PythonReward):
            flags += ["--python-reward", domain.reward.function]
            for directory in domain.reward.python_path:
                flags += ["--python-reward-path", str(directory)]
    return flags


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    port: int | None = None
    metrics_port: int | None = None
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    start_offset: int = 0
    """Where this start's output begins in the log (earlier starts' output lies before it)."""
    stopped: bool = False
    """Stopped on purpose (not to be restarted)."""
    env_extra: dict[str, str] = field(default_factory=dict)
    """Set over the environment it is started with (the vLLM rollout service's variables)."""
    start_timeout_s: float | None = None
    """How long its start may take, where longer than the stack's default (a vLLM engine)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, env: dict[str, str], nice: int = 0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        previous = f"; the previous process: {self.exit_status()}" if self.popen is not None else ""
        self.starts += 1
        self.stopped = False
        with self.log_path.open("ab") as log:
            if log.tell() > 0 and _last_byte(self.log_path) != b"\n":
                log.write(b"\n")
            when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            again = f" (restart {self.starts - 1}{previous})" if self.starts > 1 else ""
            log.write(f"=== cascade up {when}: starting {self.name}{again} ===\n".encode())
            log.flush()
            self.start_offset = log.tell()
            argv = ["nice", "-n", str(nice), *self.argv] if nice else self.argv
            self.popen = subprocess.Popen(
                deathsig.wrap(argv),  # SIGTERM when this process dies
                cwd=REPO,
                env={**env, **self.env_extra},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_status(self) -> str:
        code = None if self.popen is None else self.popen.poll()
        if code is None:
            return "running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def log(self) -> str:
        """What this start of the process logged (the log file keeps earlier starts' too)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(self.start_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 20, max_bytes: int = 16384) -> str:
        """The last `lines` lines this start logged (reading at most `max_bytes` of the file)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(self.start_offset, end - max_bytes))
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def signal_group(self, sig: signal.Signals) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 8.0) -> None:
        self.stopped = True
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)  # stragglers of the group, if any
        if self.popen.poll() is None:
            self.popen.wait(timeout=10)


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _report(line: str) -> None:
    when = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[cascade up {when}] {line}", file=sys.stderr, flush=True)


def wait_serving(proc: Proc, timeout_s: float) -> None:
    """Until the gRPC health check of `proc` answers SERVING (or it exits, or time runs out)."""
    why = wait_until_serving(proc.address, timeout_s=timeout_s, alive=proc.alive, poll_s=0.2)
    if why == "exited":
        raise RuntimeError(f"{proc.name} exited:\n{proc.log()[-3000:]}")
    if why == "timeout":
        raise TimeoutError(f"{proc.name} not serving within {timeout_s}s:\n{proc.log()[-3000:]}")


@dataclass
class LocalStack:
    """The processes of one distributed run (build, `start()`, `wait()`, `stop()`)."""

    config: Path
    model: Path
    run_dir: Path
    log_dir: Path
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None
    """The reward service's Celery broker, where it is not `redis_url` (a test restarting the
    streams' Redis alone)."""
    db: str | None = None
    stream_prefix: str = "cascade:up"
    workers: int = 2
    rollout_replicas: int = 1
    """Rollout service processes; the learner pushes weights to all, workers spread over them."""
    celery_workers: int = 1
    fresh: bool = False
    resume: bool = False
    cascade_id: int | None = None
    follow: bool = True
    distill: bool = True
    nice: int = 0
    learner_ranks: int = 1
    """Ranks of the learner (> 1: torchrun, the policy sharded with FSDP2)."""
    track: list[str] | None = None
    """`--track` for the learner (None: the config's `tracking.backends`)."""
    claim_idle_ms: int = 30_000
    worker_flags: dict[int, list[str]] = field(default_factory=dict)
    """Extra flags for worker i (fault-injection tests)."""
    python: str = sys.executable
    engine: Literal["hf", "vllm"] = "hf"
    """The rollout service's engine: `hf`, or `vllm` (run by `vllm_python`; see `cascade.engine.vllm_env`)."""
    vllm: VllmEngineConfig = field(default_factory=VllmEngineConfig)
    vllm_python: str = field(default_factory=lambda: str(vllm_env.default_python()))
    supervise: bool = False
    """Report and restart a process other than the learner that died (`cascade up` does)."""
    restart_bound: RestartBound = field(default_factory=RestartBound)
    reward_flags: list[str] = field(default_factory=list)
    """Extra flags for the reward front (e.g. `--remote-domains`)."""
    process_env: dict[str, str] = field(default_factory=dict)
    """Set in every process's environment (e.g. `CASCADE_REWARD_*` settings of the Celery workers)."""
    report: Callable[[str], None] = _report
    """Where the supervisor's reports go (stderr, timestamped)."""
    launch_extra: dict[str, Any] = field(default_factory=dict)
    """More of `launch()` (the engine's flags: `cascade.cli.engine.engine_launch`)."""
    procs: dict[str, Proc] = field(default_factory=dict)
    supervisor: Supervisor | None = None
    _record_seen: int = 0
    _record: StackRecord | None = None

    def _env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CASCADE_REWARD_") and k not in CREDENTIAL_ENV
        }
        env.update(
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            CASCADE_REWARD_BROKER_URL=self.broker_url or self.redis_url,
        )
        env.update(self.process_env)
        env.update(extra)
        return env

    def _service(self, name: str, module: str, *flags: str, python: str | None = None) -> Proc:
        port, metrics = free_port(), free_port()
        argv = [python or self.python, "-m", module, "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--metrics-port", str(metrics), *flags]
        proc = Proc(name, argv, self.log_dir / f"{name}.log", port, metrics)
        self.procs[name] = proc
        return proc

    def rollout_service(self, i: int) -> Proc:
        """Rollout replica i (not started): `rollout` for 0, `rollout-<i>` after."""
        name = "rollout" if i == 0 else f"rollout-{i}"
        model = ("--model", str(self.model), "--torch-threads", "1")
        if self.engine != "vllm":
            return self._service(name, "services.rollout.main", *model)
        flags = vllm_env.service_flags(self.vllm)
        proc = self._service(name, "services.rollout.main", *model, *flags, python=self.vllm_python)
        proc.env_extra = vllm_env.process_env(self.vllm_python)
        proc.start_timeout_s = vllm_env.START_TIMEOUT_S
        return proc

    def rollout_addresses(self) -> str:
        """Every rollout replica started, `host:port,host:port` (the learner's and workers' --rollout)."""
        names = sorted((n for n in self.procs if n == "rollout" or n.startswith("rollout-")), key=_replica_no)
        return ",".join(self.procs[n].address for n in names)

    def start_services(self, timeout_s: float = 180.0) -> None:
        if self.engine == "vllm":  # before any process starts: the fix named, not a dead service's log
            vllm_env.check_python(self.vllm_python)
        rollouts = [self.rollout_service(i) for i in range(self.rollout_replicas)]
        # the broker: CASCADE_REWARD_BROKER_URL (`_env`), not `--broker-url` (it may hold a password)
        reward_flags = [*python_reward_flags(self.config), *self.reward_flags]
        reward = self._service("reward", "services.reward.main", *reward_flags)
        teacher = self._service("teacher", "services.teacher.main", "--torch-threads", "1")
        for proc in (*rollouts, reward, teacher):
            self._start(proc)
        for i in range(self.celery_workers):
            argv = [self.python, "-m", "celery", "-A", "services.reward.tasks", "worker", "-l", "INFO"]
            argv += ["--concurrency", "1", "--hostname", f"up{i}-{os.getpid()}@%h"]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
            proc = Proc(f"celery-{i}", argv, self.log_dir / f"celery-{i}.log")
            self.procs[proc.name] = proc
            self._start(proc)
        for proc in (*rollouts, reward, teacher):
            wait_serving(proc, max(timeout_s, proc.start_timeout_s or 0.0))

    def worker(self, i: int) -> Proc:
        name = f"worker-{i}"
        argv = [self.python, "-m", "services.rollout.worker"]  # --redis-url: in its environment
        argv += ["--stream-prefix", self.stream_prefix, "--rollout", self.rollout_addresses()]
        argv += ["--reward", self.procs["reward"].address, "--tokenizer", str(self.model)]
        argv += ["--name", name, "--claim-idle-ms", str(self.claim_idle_ms), *self.worker_flags.get(i, [])]
        proc = Proc(name, argv, self.log_dir / f"{name}.log")
        proc.env_extra = {"CASCADE_WORKER_REDIS_URL": self.redis_url}
        self.procs[name] = proc
        self._start(proc)
        return proc

    def start_learner(self) -> Proc:
        # --redis-url and --db: in its environment (a password is not for `ps` to show)
        secrets = {"CASCADE_LEARNER_REDIS_URL": self.redis_url}
        if self.db:
            secrets["CASCADE_LEARNER_DB_URL"] = self.db
        argv = [str(self.config), "--run-dir", str(self.run_dir), "--stream-prefix", self.stream_prefix]
        argv += ["--rollout", self.rollout_addresses(), "--teacher", self.procs["teacher"].address]
        argv += ["--reward", self.procs["reward"].address]
        metrics = free_port()
        argv += ["--host", "127.0.0.1", "--metrics-port", str(metrics)]
        if self.cascade_id is not None:
            argv += ["--cascade-id", str(self.cascade_id)]
        if self.fresh:
            argv += ["--fresh", "--yes"]  # `cascade up` asked already
        if self.resume:
            argv.append("--resume")
        if self.follow:
            argv.append("--follow")
        if not self.distill:
            argv.append("--no-distill")
        if self.track is not None:
            argv += ["--track", ",".join(self.track) or "none"]
        if self.learner_ranks > 1:  # the policy sharded over ranks of this host (torchrun)
            from cascade.parallel.launch import torchrun_argv

            argv = torchrun_argv(self.learner_ranks, "services.learner.main", argv, python=self.python)
        else:
            argv = [self.python, "-m", "services.learner.main", *argv]
        proc = Proc("learner", argv, self.log_dir / "learner.log", metrics_port=metrics, env_extra=secrets)
        self.procs["learner"] = proc
        self._start(proc)
        return proc

    def start(self) -> None:
        self.start_services()
        for i in range(self.workers):
            self.worker(i)
        self.start_learner()

    def wait(self, timeout_s: float | None = None, echo: bool = False) -> int:
        """Until the learner exits (its return code); `echo`: copy its log lines to stdout. With
        `supervise`, the other processes are watched meanwhile (`GaveUp` past a restart bound).
        `run.json` gets the stack's `launch` once the learner has written it."""
        learner = self.procs["learner"]
        assert learner.popen is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        shown = learner.start_offset
        while True:
            if echo:
                shown = self._echo(learner, shown, decoder)
            self.record_launch()
            code = learner.popen.poll()
            if code is not None:
                if echo:
                    self._echo(learner, shown, decoder)
                return code
            if self.supervise:
                self.check()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"learner still running after {timeout_s}s:\n{learner.log()[-3000:]}")
            time.sleep(0.2)

    @staticmethod
    def _echo(proc: Proc, shown: int, decoder: codecs.IncrementalDecoder) -> int:
        """Copy what `proc` logged past byte `shown` to stdout; the new position."""
        if not proc.log_path.exists():
            return shown
        with proc.log_path.open("rb") as f:
            f.seek(shown)
            data = f.read()
        if data:
            sys.stdout.write(decoder.decode(data))
            sys.stdout.flush()
        return shown + len(data)

    def check(self) -> None:
        """One supervision pass over every process but the learner (see `cascade.up.supervisor`)."""
        if self.supervisor is None:
            self.supervisor = Supervisor(self.restart_bound, restart=self._restart, report=self.report)
        watched = [p for n, p in self.procs.items() if n != "learner" and not p.stopped and p.popen]
        self.supervisor.check(watched)

    def _restart(self, proc: Supervised) -> None:
        assert isinstance(proc, Proc)
        proc.signal_group(signal.SIGKILL)  # what the dead leader left of its group (pool children)
        self._start(proc)

    def _start(self, proc: Proc) -> None:
        """Start (or start again) `proc` and write its pid down (`cascade.up.orphans`). From the
        main thread only: the parent-death signal fires when the forking thread ends."""
        proc.start(self._env(), self.nice)
        if self._record is None:
            self._record = StackRecord(self.log_dir, self.run_dir)
        self._record.started(proc.name, proc.pid)

    def launch(self) -> dict[str, Any]:
        """`cascade up`'s flags that start this stack again (`run.json`'s `launch`)."""
        from cascade.runner.record import public_url

        return {
            "redis_url": public_url(self.redis_url),
            "stream_prefix": self.stream_prefix,
            "workers": self.workers,
            "celery_workers": self.celery_workers,
            "rollout_replicas": self.rollout_replicas,
            "learner_ranks": self.learner_ranks,
            **self.launch_extra,
            "log_dir": str(self.log_dir),
            "nice": self.nice,
            "no_follow": not self.follow,
            "track": self.track,
            "max_restarts": self.restart_bound.max_restarts,
            "restart_window_s": self.restart_bound.window_s,
        }

    def record_launch(self) -> None:
        """Write `launch()` into the run's `run.json` when the learner (re)wrote it."""
        from cascade.runner.record import RECORD_FILE, record_launch

        try:
            mtime = (self.run_dir / RECORD_FILE).stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._record_seen:
            record_launch(self.run_dir, self.launch())
            self._record_seen = (self.run_dir / RECORD_FILE).stat().st_mtime_ns

    def stop(self) -> None:
        order = ["learner", *sorted(n for n in self.procs if n.startswith("worker")), "teacher"]
        order += [n for n in self.procs if n not in order]
        for name in order:
            if name in self.procs:
                self.procs[name].stop()
        if self._record is not None:
            self._record.stopped()  # every group was killed and every leader waited for

    def stop_run(self) -> None:
        """Stop the learner and the workers only (the services stay up for another run)."""
        for name in ["learner", *sorted(n for n in self.procs if n.startswith("worker"))]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.stop()

    def describe(self) -> str:
        lines = []
        for p in self.procs.values():
            grpc = f"grpc {p.address}  " if p.port else ""
            where = f"{grpc}metrics http://127.0.0.1:{p.metrics_port}" if p.metrics_port else grpc
            lines.append(f"  {p.name:<10} pid {p.pid:<7} {where:<48} log {p.log_path}")
        return "\n".join(lines)
