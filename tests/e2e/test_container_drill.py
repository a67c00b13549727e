"""The container drill: every service image built (CPU variants, scripts/build-images.sh) and a
two-stage cascade driven through the containers of deploy/docker-compose.yml with the CPU profile
(deploy/docker-compose.cpu.yml: host networking, the host's Postgres and Redis).

The API container serves the REST the cascade is created and steered through (pause, resume);
the learner container (`docker compose run`) trains math then code on the tiny model, mounted
read-only; the code stage is scored by the reward-worker container, in bubblewrap; `docker kill`
of the learner mid-run and a second learner container with `--resume` finish it with contiguous
steps; the dashboard (`GET /` of the API container) shows the completed cascade.

Everything the drill starts carries the label io.cascade.stack=<drill id> (the compose project is
named after it too) and is removed by label at the end: containers and volumes. The images stay,
so that the next run builds from the daemon's cache. Docker comes from scripts/ensure-docker.sh
(`make test` runs it); without a daemon the drill skips, unless CASCADE_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pg_schema import fresh_schema
from stack_probe import redis_up

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILES = ["-f", str(DEPLOY / "docker-compose.yml"), "-f", str(DEPLOY / "docker-compose.cpu.yml")]
TAG = "cpu"
BROKER_DB = 12  # Redis databases of their own: no other test's Celery worker takes the drill's tasks
STREAMS_DB = 13
LABEL_KEY = "io.cascade.stack"
MATH_STEPS, CODE_STEPS = 30, 4

pytestmark = [
    pytest.mark.postgres,
    # `make test` and `make test-containers` run it (they build the images first); a bare pytest
    # run skips it rather than start ~10 minutes of image builds.
    pytest.mark.skipif(
        os.environ.get("CASCADE_CONTAINER_DRILL") != "1",
        reason="container drill: make test / make test-containers (CASCADE_CONTAINER_DRILL=1)",
    ),
]


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client (scripts/ensure-docker.sh)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"no docker daemon answers (scripts/ensure-docker.sh): {info.stderr.strip()[-300:]}"
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    if compose.returncode != 0:
        return "no compose v2 CLI plugin (scripts/ensure-docker.sh)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(argv)}: rc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@dataclass
class Drill:
    """One compose project of the CPU profile, named and labelled after its id."""

    id: str
    env: dict[str, str]
    api_port: int
    token: str
    learners: list[str] = field(default_factory=list)

    def compose(self, *args: str, timeout: float = 600) -> str:
        return _run(
            ["docker", "compose", "-p", self.id, *COMPOSE_FILES, *args], env=self.env, timeout=timeout
        )

    def call(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if ctype:
            headers["Content-Type"] = ctype
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}", data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:
                raw = reply.read().decode()
                status = reply.status
        except urllib.error.HTTPError as err:
            raw, status = err.read().decode(), err.code
        try:
            return status, json.loads(raw)
        except json.JSONDecodeError:
            return status, raw

    def start_learner(self, name: str, *args: str) -> str:
        """A learner container of the compose service (its volumes, network, labels)."""
        container = f"{self.id}-{name}"
        self.compose("run", "-d", "--no-deps", "--name", container, "learner", *self.learner_args(), *args)
        self.learners.append(container)
        return container

    def learner_args(self) -> list[str]:
        e = self.env
        return [
            "/etc/cascade/cascade.yaml",
            "--db", e["CASCADE_DB_URL"],
            "--redis-url", e["CASCADE_STREAMS_URL"],
            "--stream-prefix", e["CASCADE_STREAM_PREFIX"],
            "--rollout", f"127.0.0.1:{e['CASCADE_ROLLOUT_PORT']}",
            "--teacher", f"127.0.0.1:{e['CASCADE_TEACHER_PORT']}",
            "--reward", f"127.0.0.1:{e['CASCADE_REWARD_PORT']}",
            "--device", "cpu",
            "--metrics-port", e["CASCADE_LEARNER_METRICS_PORT"],
        ]  # fmt: skip

    def logs(self, container: str) -> str:
        done = subprocess.run(["docker", "logs", container], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    def state(self, container: str) -> dict[str, Any]:
        out = _run(["docker", "inspect", "-f", "{{json .State}}", container])
        state: dict[str, Any] = json.loads(out)
        return state

    def service_logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", service, timeout=120)

    def cleanup(self) -> None:
        """Down, then whatever still carries the label (the learners `compose run` started)."""
        subprocess.run(
            ["docker", "compose", "-p", self.id, *COMPOSE_FILES, "down", "-v", "--remove-orphans", "-t", "5"],
            env=self.env, capture_output=True, timeout=300,
        )  # fmt: skip
        label = f"label={LABEL_KEY}={self.id}"
        ids = _run(["docker", "ps", "-aq", "--filter", label]).split()
        if ids:
            subprocess.run(["docker", "rm", "-f", "-v", *ids], capture_output=True, timeout=120)
        vols = _run(["docker", "volume", "ls", "-q", "--filter", label]).split()
        if vols:
            subprocess.run(["docker", "volume", "rm", "-f", *vols], capture_output=True, timeout=120)


def _wait(
    what: str,
    cond: Callable[[], bool],
    *,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
    poll_s: float = 1.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if alive is not None and not alive():
            if cond():
                return
            raise AssertionError(f"{what}: the container exited first")
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def _policy_dir(tmp: Path, random_tiny_model: Path) -> Path:
    """models/tiny (built by `make test`) or the session's random tiny model, copied where the
    images' uid 10001 can read it (pytest's tmp dirs are 0700)."""
    source = REPO / "models" / "tiny"
    if not (source / "config.json").is_file():
        source = random_tiny_model
    target = tmp / "policy"
    shutil.copytree(source, target)
    for path in [tmp, *tmp.parents]:
        if path == Path("/"):
            break
        if path.stat().st_uid == os.getuid():
            path.chmod(path.stat().st_mode | 0o755)
    target.chmod(0o755)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def _two_stage_config(path: Path) -> None:
    """math then code, code distilling from math; checkpoints every 2. The math stage is long
    enough (MATH_STEPS) for a pause, a resume and a kill to land inside it on a fast machine."""
    grpo = {"group_size": 4, "prompts_per_step": 4, "budget": {"max_new_tokens": 16}}
    prompts = {"kind": "synthetic", "seed": 0, "n_train": 64, "n_eval": 8}
    data = {
        "name": "container-drill",
        "seed": 0,
        "model": {"path": "/models/policy"},
        "domains": [
            {"name": "math", "prompts": dict(prompts), "reward": {"kind": "math", "timeout_s": 5}},
            {
                "name": "code",
                "prompts": dict(prompts),
                "reward": {"kind": "code", "mode": "all_pass", "time_limit_s": 2, "memory_mb": 256},
            },
        ],
        "stages": [
            {
                "domain": "math",
                "grpo": dict(grpo),
                "advance": {"max_steps": MATH_STEPS},
                "eval": {"every": MATH_STEPS // 2},
            },
            {
                "domain": "code",
                "grpo": dict(grpo),
                "distill": {"loss": "sampled", "prompts_per_teacher": 4},
                "advance": {"max_steps": CODE_STEPS},
                "eval": {"every": CODE_STEPS},
            },
        ],
        "rollout": {"seeding": "per_request", "prompts_per_request": 2},
        "checkpoint": {"every": 2, "keep_last": 2},
        "output_dir": "/checkpoints",
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o644)


@pytest.fixture(scope="module")
def built_images() -> dict[str, str]:
    """Every service image, CPU variants (cached by the daemon after the first build)."""
    problem = _docker_problem()
    if problem is not None:
        if os.environ.get("CASCADE_REQUIRE_DOCKER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    timings = REPO / "build" / "images-timings.tsv"
    if os.environ.get("CASCADE_DRILL_PREBUILT") == "1" and timings.is_file():  # `make images` ran
        rows = [line.split("\t") for line in timings.read_text().splitlines() if line]
        return {name: f"{name}:{TAG}" for name, _, _ in rows}
    env = {**os.environ, "CASCADE_TAG": TAG, "TIMINGS": str(timings)}
    _run(["bash", str(REPO / "scripts" / "build-images.sh")], env=env, timeout=3600)
    rows = [line.split("\t") for line in timings.read_text().splitlines() if line]
    return {name: f"{name}:{TAG}" for name, _, _ in rows}


@pytest.fixture()
def drill(
    built_images: dict[str, str], random_tiny_model: Path, tmp_path: Path
) -> Iterator[tuple[Drill, str]]:
    if not redis_up():
        pytest.skip("Redis unreachable at 127.0.0.1:6379")
    drill_id = f"cascade-drill-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "drill"
    work.mkdir()
    policy = _policy_dir(work, random_tiny_model)
    config = work / "cascade.yaml"
    _two_stage_config(config)
    with fresh_schema("drill") as db_url:
        ports = {
            name: str(_free_port())
            for name in (
                "CASCADE_API_PORT", "CASCADE_REWARD_PORT", "CASCADE_REWARD_METRICS_PORT",
                "CASCADE_ROLLOUT_PORT", "CASCADE_ROLLOUT_METRICS_PORT", "CASCADE_TEACHER_PORT",
                "CASCADE_TEACHER_METRICS_PORT", "CASCADE_LEARNER_METRICS_PORT",
            )
        }  # fmt: skip
        token = "drill-" + uuid.uuid4().hex
        env = {
            **os.environ,
            **ports,
            "CASCADE_STACK_ID": drill_id,
            "CASCADE_TAG": TAG,
            "CASCADE_API_HOST": "127.0.0.1",
            "CASCADE_DB_URL": db_url,
            "CASCADE_REWARD_BROKER_URL": f"redis://127.0.0.1:6379/{BROKER_DB}",
            "CASCADE_STREAMS_URL": f"redis://127.0.0.1:6379/{STREAMS_DB}",
            "CASCADE_STREAM_PREFIX": f"cascade:{drill_id}",
            "CASCADE_POLICY_DIR": str(policy),
            "CASCADE_CONFIG": str(config),
            "CASCADE_TOKEN_ADMIN": token,
            "POSTGRES_PASSWORD": "unused",
            "CASCADE_REWARD_CPUS": "1",
            "CASCADE_REWARD_CONCURRENCY": "1",
        }
        d = Drill(id=drill_id, env=env, api_port=int(ports["CASCADE_API_PORT"]), token=token)
        try:
            yield d, db_url
        finally:
            (REPO / "test-artifacts").mkdir(exist_ok=True)
            services = subprocess.run(
                ["docker", "compose", "-p", drill_id, *COMPOSE_FILES, "logs", "--no-color"],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            (REPO / "test-artifacts" / f"{drill_id}-services.log").write_text(
                services.stdout + services.stderr
            )
            for container in d.learners:
                log = d.logs(container)
                (REPO / "test-artifacts").mkdir(exist_ok=True)
                (REPO / "test-artifacts" / f"{container}.log").write_text(log)
            d.cleanup()
            label = f"label={LABEL_KEY}={drill_id}"
            assert _run(["docker", "ps", "-aq", "--filter", label]).split() == []
            assert _run(["docker", "volume", "ls", "-q", "--filter", label]).split() == []


def test_cascade_through_the_containers(drill: tuple[Drill, str], e2e: Any) -> None:
    d, db_url = drill
    # --wait needs a health check on each service it waits for: the rollout workers have none.
    healthy = ["api", "reward", "reward-worker", "rollout", "teacher"]
    d.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "300", *healthy, timeout=420)
    d.compose("up", "-d", "--no-build", "rollout-worker", timeout=120)
    status, health = d.call("GET", "/health")
    assert status == 200, health

    config = Path(d.env["CASCADE_CONFIG"]).read_bytes()
    status, body = d.call("POST", "/api/cascades", config, "application/yaml")
    assert status == 201, body
    cascade_id = int(body["id"])
    first, second = (s["id"] for s in body["stages"])

    def detail() -> dict[str, Any]:
        status, out = d.call("GET", f"/api/cascades/{cascade_id}")
        assert status == 200, out
        result: dict[str, Any] = out
        return result

    def stages() -> list[dict[str, Any]]:
        stage_list: list[dict[str, Any]] = detail()["stages"]
        return stage_list

    def command(stage_id: int, name: str) -> None:
        status, out = d.call("POST", f"/api/stages/{stage_id}/{name}")
        assert status == 200, out

    learner = d.start_learner("learner-1", "--cascade-id", str(cascade_id), "--follow")

    def running() -> bool:
        return bool(d.state(learner)["Running"])

    _wait("a first step", lambda: stages()[0]["steps_done"] >= 1, timeout_s=600, alive=running, poll_s=0.2)
    command(first, "pause")
    _wait("the pause", lambda: stages()[0]["state"] == "paused", timeout_s=120, alive=running, poll_s=0.2)
    paused_at = stages()[0]["steps_done"]
    time.sleep(3.0)  # the learner polls every second: a paused stage takes no step meanwhile
    assert running(), "a pause keeps the learner up (--follow)"
    assert stages()[0]["steps_done"] == paused_at
    command(first, "resume")

    # Killed once a checkpoint exists past the pause (every 2 steps), mid-stage.
    _wait("steps after the resume", lambda: stages()[0]["steps_done"] >= max(paused_at + 1, 3),
          timeout_s=600, alive=running)  # fmt: skip
    _run(["docker", "kill", learner])
    _wait("the killed learner", lambda: not running(), timeout_s=60)
    assert d.state(learner)["ExitCode"] == 137
    assert detail()["status"] != "completed"
    # The killed container's lease runs out (lease.expiry_s, 30 s): the API shows the run stalled.
    # Until then a new learner refuses (another container's pid says nothing about this one's).
    _wait("the stalled run", lambda: detail()["runs"][-1]["status"] == "stalled", timeout_s=120)

    resumed = d.start_learner("learner-2", "--cascade-id", str(cascade_id), "--follow", "--resume")

    def resumed_running() -> bool:
        return bool(d.state(resumed)["Running"])

    _wait(
        "the cascade's end", lambda: detail()["status"] == "completed", timeout_s=900, alive=resumed_running
    )
    _wait("the resumed learner's exit", lambda: not resumed_running(), timeout_s=120)
    log = d.logs(resumed)
    assert d.state(resumed)["ExitCode"] == 0, log[-3000:]
    assert re.search(r"resumed from step-\d+", log), log[-3000:]

    done = detail()
    assert [s["state"] for s in done["stages"]] == ["completed", "completed"]
    assert second == done["stages"][1]["id"]
    rows = e2e.rows(db_url)
    assert [(s, st) for s, st, _, _ in rows.steps] == [(0, i) for i in range(1, MATH_STEPS + 1)] + [
        (1, i) for i in range(1, CODE_STEPS + 1)
    ]
    assert [g for _, _, g, _ in rows.steps] == list(range(1, MATH_STEPS + CODE_STEPS + 1))  # none twice
    assert any(kind == "transition" and to == "paused" for kind, _, to, _ in rows.events), rows.events

    # The code stage was scored by the reward-worker container, in bubblewrap.
    worker_log = d.service_logs("reward-worker")
    worker_id = d.compose("ps", "-q", "reward-worker").split()[0]
    health = _run(["docker", "inspect", "-f", "{{.State.Health.Status}}", worker_id]).strip()
    assert health == "healthy", health  # its health check is `cascade sandbox check`
    assert re.search(r"Task cascade\.reward\.score_items\[[\w-]+\] succeeded", worker_log), worker_log[-3000:]
    assert re.search(r"\d+/\d+ passed", worker_log), worker_log[-3000:]  # the harness ran programs
    code_steps = rows.step_metrics(1)
    assert len(code_steps) == CODE_STEPS
    assert all(m["verifier_failure_fraction"] == 0 for m in code_steps), code_steps

    # The dashboard: the API container serves it, and (headless Chromium, where installed) it
    # renders the completed cascade.
    with urllib.request.urlopen(f"http://127.0.0.1:{d.api_port}/", timeout=30) as reply:
        page = reply.read().decode()
    assert reply.status == 200 and "<html" in page.lower()
    chromium = shutil.which("chromium")
    if chromium is not None:
        profile = Path(d.env["CASCADE_CONFIG"]).parent / "chromium"
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
        argv += [f"--user-data-dir={profile}", "--virtual-time-budget=7000", "--dump-dom"]
        dom = _run([*argv, f"http://127.0.0.1:{d.api_port}/?cascade={cascade_id}"], timeout=180)
        assert f'data-cascade="{cascade_id}"' in dom, dom[:3000]
        assert re.findall(r'class="stage state-(\w+)" data-stage="(\w+)"', dom) == [
            ("completed", "math"), ("completed", "code"),
        ]  # fmt: skip
