"""What `cascade up` starts carries no password on its command line, dies with `cascade up` (even
SIGKILLed), and is written down so that a later `cascade up` refuses to start beside whatever
outlived its own (issue 34). Real processes, Linux only (`/proc`, `prctl`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.cli.main import main as cli_main
from cascade.up import deathsig, orphans
from cascade.up import stack as stack_module
from cascade.up.orphans import STATE_FILE, orphan_refusal, start_time, survivors
from cascade.up.stack import LocalStack, Proc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc and prctl")

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cret-pw-34"


def _until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s}s")
        time.sleep(0.05)


def _gone(pid: int, start: int | None) -> bool:
    return not orphans.running(pid, start)


class FakePopen:
    """Records what `Proc.start` would run; this test process stands in for the child."""

    calls: list[tuple[list[str], dict[str, str]]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        FakePopen.calls.append((list(argv), dict(kwargs["env"])))
        self.pid = os.getpid()
        self.returncode = None

    def poll(self) -> int | None:
        return None


def test_no_password_reaches_a_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The URLs go to each process in its environment, where its flags' defaults find them."""
    from services.learner.main import parse_args as learner_args
    from services.reward.main import parse_args as reward_args
    from services.rollout.worker import parse_args as worker_args

    redis_url = f"redis://default:{SECRET}@127.0.0.1:6379/0"
    db_url = f"postgresql+psycopg://cascade:{SECRET}@127.0.0.1:5432/test"
    (tmp_path / "c.yaml").write_text("name: x\n")
    monkeypatch.setenv("CASCADE_LEARNER_DB_URL", "sqlite:///inherited.db")  # never passed on
    monkeypatch.setattr(stack_module.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(stack_module, "wait_serving", lambda proc, timeout_s: None)
    FakePopen.calls = []
    stack = LocalStack(
        config=tmp_path / "c.yaml",
        model=tmp_path,
        run_dir=tmp_path / "run",
        log_dir=tmp_path / "logs",
        redis_url=redis_url,
        db=db_url,
        cascade_id=7,
        workers=1,
    )
    stack.start()
    envs = {proc.name: env for proc, (_, env) in zip(stack.procs.values(), FakePopen.calls, strict=True)}
    assert set(envs) == {"rollout", "reward", "teacher", "celery-0", "worker-0", "learner"}
    for argv, _ in FakePopen.calls:
        assert not any(SECRET in word for word in argv), argv
        assert argv[:3] == [sys.executable, "-I", "-S"] and argv[4:6] == [str(os.getpid()), "--"]

    def parsed(parse: Callable[[list[str]], Any], name: str, env: dict[str, str]) -> Any:
        """What the process makes of its flags, in the environment it was given."""
        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.startswith("CASCADE_")]:
                m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            return parse(stack.procs[name].argv[3:])

    assert parsed(reward_args, "reward", envs["reward"]).broker_url == redis_url
    assert parsed(worker_args, "worker-0", envs["worker-0"]).redis_url == redis_url
    learner = parsed(learner_args, "learner", envs["learner"])
    assert (learner.redis_url, learner.db, learner.cascade_id) == (redis_url, db_url, 7)
    assert envs["celery-0"]["CASCADE_REWARD_BROKER_URL"] == redis_url
    assert not {"CASCADE_LEARNER_DB_URL", "CASCADE_WORKER_REDIS_URL"} & set(envs["rollout"])

    stack.db, stack.cascade_id = None, None  # no --db: the run dir's SQLite, not the inherited URL
    stack.start_learner()
    env = FakePopen.calls[-1][1]
    assert "CASCADE_LEARNER_DB_URL" not in env
    assert parsed(learner_args, "learner", env).db is None


_PARENT = """
import os, sys, time
from pathlib import Path
from cascade.up.stack import Proc

sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
procs = [Proc("a", sleep, Path(sys.argv[1]) / "a.log"), Proc("b", sleep, Path(sys.argv[1]) / "b.log")]
procs[0].start(dict(os.environ))
procs[1].start(dict(os.environ), nice=5)  # through `nice`: exec keeps the death signal
print(" ".join(str(p.pid) for p in procs), flush=True)
time.sleep(300)
"""


def test_children_die_with_their_parent_even_sigkilled(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    starts: dict[int, int | None] = {}
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, pids
        starts.update({pid: start_time(pid) for pid in pids})
        # each is itself (after the exec), not the wrapper, with SIGTERM as its parent-death signal
        _until(
            "the exec", lambda: all(b"time.sleep" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
        )
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text()
            assert "\nPPid:\t" + str(parent.pid) + "\n" in status
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        _until("the children's end", lambda: all(_gone(p, starts[p]) for p in pids), timeout_s=20)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in pids:
            if not _gone(pid, starts.get(pid)):
                os.kill(pid, signal.SIGKILL)


def test_a_child_whose_parent_died_before_the_prctl_starts_nothing(tmp_path: Path) -> None:
    """The wrapper's parent is not the one it was started for (that one is gone): it exits."""
    mark = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(mark)!r}, 'w')"]
    gone = _dead_pid()
    run = subprocess.run(deathsig.wrap(touch, parent=gone), capture_output=True, text=True)
    assert run.returncode == deathsig.EXIT_PARENT_GONE and not mark.exists(), run.stderr
    assert f"cascade up (pid {gone}) ended before" in run.stderr
    assert subprocess.run(deathsig.wrap(touch)).returncode == 0 and mark.exists()  # its parent: runs


def _record(
    path: Path, up: tuple[int, int | None], procs: dict[str, tuple[int, int | None]], **kw: Any
) -> Path:
    data = {
        "up": {"pid": up[0], "start": up[1]},
        "host": socket.gethostname(),
        "boot_id": orphans.boot_id(),
        "run_dir": "/nowhere",
        "stopped": False,
        "processes": {n: {"pid": p, "start": s} for n, (p, s) in procs.items()},
    }
    data.update(kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_record_is_not_fooled_by_pid_reuse_a_reboot_or_another_host(tmp_path: Path) -> None:
    me, mine = os.getpid(), start_time(os.getpid())
    assert mine is not None
    path = tmp_path / STATE_FILE
    dead_up = (_dead_pid(), 1)
    _record(path, dead_up, {"learner": (me, mine)})
    found = survivors(path)
    assert found is not None and not found.up_alive
    assert [(o.name, o.pid) for o in found.orphans] == [("learner", me)]
    assert f"learner (pid {me})" in found.message() and "orphan learner" in found.message()

    _record(path, dead_up, {"learner": (me, mine + 1)})  # the pid, but another process's start
    assert survivors(path) is None
    for other in ({"host": "elsewhere"}, {"boot_id": "before-a-reboot"}, {"stopped": True}):
        _record(path, dead_up, {"learner": (me, mine)}, **other)
        assert survivors(path) is None, other
    path.write_text("{not json")
    assert survivors(path) is None

    _record(path, (me, mine), {"learner": (me, mine)})  # the `cascade up` that wrote it still runs
    found = survivors(path)
    assert found is not None and found.up_alive
    assert f"cascade up (pid {me}) still runs the stack recorded in {path}" in found.message()


def test_the_stack_writes_each_start_down_and_a_clean_stop(tmp_path: Path) -> None:
    stack = LocalStack(
        config=tmp_path / "c.yaml", model=tmp_path, run_dir=tmp_path / "run", log_dir=tmp_path / "logs"
    )
    proc = Proc(
        "worker-0", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "logs" / "w.log"
    )
    stack.procs["worker-0"] = proc
    try:
        stack._start(proc)
        path = tmp_path / "logs" / STATE_FILE
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        data = json.loads(path.read_text())
        assert data["up"] == {"pid": os.getpid(), "start": start_time(os.getpid())}
        assert data["processes"] == {"worker-0": {"pid": proc.pid, "start": start_time(proc.pid)}}
        assert data["run_dir"] == str(tmp_path / "run") and data["stopped"] is False
        first = proc.pid
        proc.stop()
        stack._restart(proc)  # a restart is written down too
        assert json.loads(path.read_text())["processes"]["worker-0"]["pid"] == proc.pid != first
    finally:
        stack.stop()
    assert json.loads(path.read_text())["stopped"] is True
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [STATE_FILE, "w.log"]


# a `cascade up` of older code: no death signal; its learner started a process of its own
_OLD_UP = """
import sys, time
from pathlib import Path
from cascade.up import deathsig
from cascade.up.stack import LocalStack, Proc

deathsig.wrap = lambda argv, parent=None: list(argv)
logs = Path(sys.argv[1])
stack = LocalStack(config=logs / "c.yaml", model=logs, run_dir=Path(sys.argv[2]), log_dir=logs)
learner = "import subprocess, time; subprocess.Popen(['sleep', '300']); print('grandchild', flush=True); "
learner += "time.sleep(300)"
for name, code in (("learner", learner), ("worker-0", "import time; time.sleep(300)")):
    proc = Proc(name, [sys.executable, "-c", code], logs / f"{name}.log")
    stack.procs[name] = proc
    stack._start(proc)
print("up", flush=True)
time.sleep(300)
"""


def _config(tmp_path: Path) -> Path:
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 8, "n_eval": 4}
    data = {
        "name": "orphans",
        "model": {"path": str(tmp_path / "model")},
        "domains": [{"name": "math", "prompts": prompts}],
        "stages": [{"domain": "math", "advance": {"max_steps": 2}}],
        "output_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # never loaded: nothing starts
    path = tmp_path / "cascade.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_up_refuses_to_start_beside_the_orphans_of_a_killed_up_and_says_how_to_stop_them(
    tmp_path: Path, popen_calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path)
    run_dir = tmp_path / "run"
    logs = Path(f"{run_dir}-logs")  # the default log directory: found with any --log-dir given
    logs.mkdir()
    with (tmp_path / "old-up.out").open("w+") as out:
        old = subprocess.Popen([sys.executable, "-c", _OLD_UP, str(logs), str(run_dir)], cwd=REPO, stdout=out)
        try:
            _until("the old stack", lambda: "up" in (tmp_path / "old-up.out").read_text())
            _until("the learner's own process", lambda: "grandchild" in (logs / "learner.log").read_text())
        finally:
            old.send_signal(signal.SIGKILL)
            old.wait(timeout=10)
    recorded = json.loads((logs / STATE_FILE).read_text())["processes"]
    pids = {name: int(p["pid"]) for name, p in recorded.items()}
    started_before = len(popen_calls)  # the old stack's own
    try:
        argv = [
            "up",
            str(cfg),
            "--resume",
            "--run-dir",
            str(run_dir),
            "--log-dir",
            str(tmp_path / "new-logs"),
        ]
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: processes of an earlier cascade up"), err
        assert f"(pid {old.pid}, gone) still run" in err
        assert f"learner (pid {pids['learner']} and 1 more in its process group)" in err, err
        assert f"worker-0 (pid {pids['worker-0']})" in err and "orphan learner" in err
        assert err.rstrip().endswith("then start again; nothing was started"), err
        assert popen_calls[started_before:] == [] and not (tmp_path / "new-logs").exists()

        command = err.split("stop them with `")[1].split("`")[0]
        assert command == f"kill -TERM -- -{pids['learner']} -{pids['worker-0']}"
        subprocess.run(["bash", "-c", command], check=True)  # as an operator pastes it
        path = logs / STATE_FILE
        _until("the orphans' end", lambda: survivors(path) is None, timeout_s=20)
        assert orphan_refusal([path]) is None
    finally:
        for pid in pids.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_record_of_an_earlier_launch_is_looked_up_in_run_json(tmp_path: Path) -> None:
    from cascade.runner.record import RunRecord, write_record

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launch = {"log_dir": str(tmp_path / "elsewhere")}
    record = RunRecord(
        config={}, distill=True, kind="distributed", db_url="sqlite://", cascade_id=1, launch=launch
    )
    write_record(run_dir, record)
    paths = orphans.record_paths(run_dir, tmp_path / "given")
    assert paths == [
        (tmp_path / "given" / STATE_FILE).resolve(),
        (tmp_path / "run-logs" / STATE_FILE).resolve(),
        (tmp_path / "elsewhere" / STATE_FILE).resolve(),
    ]
    assert orphans.record_paths(tmp_path / "new", tmp_path / "new-logs") == [
        (tmp_path / "new-logs" / STATE_FILE).resolve()
    ]
