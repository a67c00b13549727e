"""deploy/docker-compose.yml without a Docker engine: it validates against the Compose
Specification's JSON schema (vendored, see schemas/README.md), every service runs a real command
of the project (its image's entry point from deploy/docker/ or its own, plus its command), and
the one-host layout holds: healthy Postgres and Redis first, migrations before the learner,
GPUs reserved for rollout/teacher/learner, reward workers scalable with `--scale`, and one
checkpoint volume the learner writes and rollout/teacher read.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_checks import (
    DEPLOY,
    EntryPointPending,
    check_argv,
    defaults,
    dockerfiles,
    interpolate,
    read_env_file,
    variables,
)

from cascade.config import parse_cascade_yaml
from services.api.settings import load_settings

COMPOSE_FILE = DEPLOY / "docker-compose.yml"
SCHEMA = json.loads((DEPLOY.parent / "tests/deploy/schemas/compose-spec.json").read_text())
RAW: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
ENV = read_env_file(DEPLOY / ".env.example", documented=True)
COMPOSE: dict[str, Any] = interpolate(RAW, ENV)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GPU_SERVICES = {"rollout", "teacher", "learner"}
THIRD_PARTY = {"postgres": "postgres:", "redis": "redis:"}


# The file says draft 2019-09 (as http://...#, which jsonschema does not look up by name).
VALIDATOR = jsonschema.Draft201909Validator


def test_validates_against_the_compose_schema() -> None:
    VALIDATOR.check_schema(SCHEMA)
    validator = VALIDATOR(SCHEMA)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(RAW)]
    assert not errors, errors
    assert not list(validator.iter_errors(COMPOSE))  # and once interpolated


def test_the_schema_check_has_teeth() -> None:
    validator = VALIDATOR(SCHEMA)
    broken = copy.deepcopy(RAW)
    broken["services"]["reward-worker"]["security_opts"] = ["seccomp=unconfined"]  # typo
    broken["services"]["api"]["depends_on"]["postgres"] = {"condition": "service_up"}
    messages = [e.message for e in validator.iter_errors(broken)]
    assert any("security_opts" in m for m in messages) and any("service_up" in m for m in messages)


def _effective_argv(service: dict[str, Any]) -> tuple[list[str], bool]:
    """(entry point + command, whether the entry point is the image's own)."""
    build = service.get("build")
    image_entry: list[str] = []
    image_cmd: list[str] = []
    if build:
        df = dockerfiles()[build["dockerfile"].rsplit("/", 1)[-1].removesuffix(".Dockerfile")]
        image_entry = df.exec_form("ENTRYPOINT", build.get("target")) or []
        image_cmd = df.exec_form("CMD", build.get("target")) or []
    entry = service.get("entrypoint", image_entry)
    # Docker: a service entrypoint drops the image's CMD; a service command replaces it.
    command = service.get("command", [] if "entrypoint" in service else image_cmd)
    assert isinstance(entry, list) and isinstance(command, list), "use exec form (lists)"
    return [*entry, *command], entry == image_entry


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_runs_a_real_command(name: str) -> None:
    service = SERVICES[name]
    if name in THIRD_PARTY:
        assert service["image"].startswith(THIRD_PARTY[name]) and "build" not in service
        return
    assert "build" in service, f"{name}: project services are built from deploy/docker/"
    build = service["build"]
    assert build["context"] == ".."
    df = dockerfiles()[build["dockerfile"].rsplit("/", 1)[-1].removesuffix(".Dockerfile")]
    df.stage(build.get("target"))  # the target exists
    argv, own_entry = _effective_argv(service)
    if not own_entry:
        # Another program than the image's: the image's health check probes the wrong thing.
        assert "healthcheck" in service, f"{name}: overrides the entry point but not the health check"
    try:
        problems = check_argv(argv)
    except EntryPointPending as pending:
        pytest.xfail(str(pending))
    assert not problems, f"{name}: {problems}"


def test_postgres_and_redis_are_healthy_before_their_users() -> None:
    for name in ("postgres", "redis"):
        assert SERVICES[name]["healthcheck"]["test"], name
    for name, service in SERVICES.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        for dep in ("postgres", "redis"):
            if dep in deps:
                assert deps[dep] == {"condition": "service_healthy"}, name
    # The API migrates at start-up and reports healthy after; the learner waits for it.
    assert SERVICES["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert SERVICES["learner"]["depends_on"]["api"]["condition"] == "service_healthy"
    for dep in ("rollout", "teacher", "redis"):
        assert SERVICES["learner"]["depends_on"][dep]["condition"] == "service_healthy"


def _gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = (
        service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    )
    return devices


def test_gpu_reservations() -> None:
    for name, service in SERVICES.items():
        devices = _gpu_devices(service)
        if name in GPU_SERVICES:
            assert len(devices) == 1, name
            assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"], name
            # count and device_ids exclude each other (Docker refuses both)
            assert ("count" in devices[0]) != ("device_ids" in devices[0]), name
            assert "--device" not in _effective_argv(service)[0] or "cuda" in _effective_argv(service)[0]
        else:
            assert not devices, f"{name} reserves a GPU"
    # The learner takes LEARNER_RANKS GPUs by count (Docker gives the first ids, 0..N-1); rollout
    # and teacher default to ids after them, so the defaults share no GPU.
    learner = _gpu_devices(SERVICES["learner"])[0]
    ranks = int(ENV["LEARNER_RANKS"])
    assert int(learner["count"]) == ranks == 1
    assert SERVICES["learner"]["environment"]["LEARNER_RANKS"] == ENV["LEARNER_RANKS"]
    others = [int(_gpu_devices(SERVICES[n])[0]["device_ids"][0]) for n in ("rollout", "teacher")]
    assert len(set(others)) == 2 and not set(others) & set(range(ranks)), others


def test_learner_ranks_on_one_host() -> None:
    """LEARNER_RANKS=2: the file still validates once interpolated, the learner reserves 2 GPUs
    and its image's entry point gets LEARNER_RANKS=2 (learner-entrypoint.sh then runs torchrun
    --standalone --nproc-per-node=2; tests/deploy/test_images.py runs the script)."""
    two = interpolate(RAW, {**ENV, "LEARNER_RANKS": "2"})
    assert not list(VALIDATOR(SCHEMA).iter_errors(two))
    learner = two["services"]["learner"]
    assert int(_gpu_devices(learner)[0]["count"]) == 2
    assert learner["environment"]["LEARNER_RANKS"] == "2"
    assert learner["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # merged, kept
    assert learner["shm_size"]  # NCCL's shared memory between the ranks
    argv, own_entry = _effective_argv(learner)
    assert own_entry and argv[0] == "/opt/cascade/learner-entrypoint.sh"
    assert _effective_argv(learner) == _effective_argv(SERVICES["learner"])  # same command either way
    # Unset, the learner is one rank (the default in the file, not only in .env.example).
    bare = interpolate(RAW, {k: v for k, v in ENV.items() if k != "LEARNER_RANKS"})
    assert int(_gpu_devices(bare["services"]["learner"])[0]["count"]) == 1


def test_reward_workers_scale_separately() -> None:
    worker = SERVICES["reward-worker"]
    # `--scale reward-worker=N` needs no fixed name and no host port.
    assert "container_name" not in worker and "ports" not in worker
    assert set(worker["security_opt"]) == {
        "seccomp=unconfined",
        "apparmor=unconfined",
        "systempaths=unconfined",
    }
    assert "privileged" not in worker and "cap_add" not in worker and "user" not in worker
    assert worker["build"]["target"] == "worker" and SERVICES["reward"]["build"]["target"] == "front"
    broker = worker["environment"]["CASCADE_REWARD_BROKER_URL"]
    front = _effective_argv(SERVICES["reward"])[0]
    assert front[front.index("--broker-url") + 1] == broker  # front and workers share one queue


def test_one_checkpoint_volume() -> None:
    mounts = {name: s.get("volumes", []) for name, s in SERVICES.items()}
    assert "checkpoints:/checkpoints" in mounts["learner"]
    assert "checkpoints:/checkpoints:ro" in mounts["rollout"]
    assert "checkpoints:/checkpoints:ro" in mounts["teacher"]
    assert "checkpoints" in COMPOSE["volumes"]


def test_addresses_name_services_and_ports() -> None:
    for name, service in SERVICES.items():
        if name in THIRD_PARTY:
            continue
        for token in _effective_argv(service)[0]:
            for host, port in re.findall(r"(?:^|[/@])([a-z][\w-]*):(\d+)(?:/|$)", token):
                assert host in SERVICES, f"{name}: {token}: no service {host}"
                if host in THIRD_PARTY:
                    continue
                target = _effective_argv(SERVICES[host])[0]
                assert target[target.index("--port") + 1] == port, f"{name}: {token}: {host} serves elsewhere"


def test_mounted_configs_are_valid() -> None:
    files = {
        v.split(":")[1]: DEPLOY / v.split(":")[0]
        for s in SERVICES.values()
        for v in s.get("volumes", [])
        if v.startswith("./")
    }
    assert set(files) == {"/etc/cascade/api.yaml", "/etc/cascade/cascade.yaml"}
    cfg = parse_cascade_yaml(files["/etc/cascade/cascade.yaml"].read_text(), "cascade.yaml")
    rollout = _effective_argv(SERVICES["rollout"])[0]
    assert str(cfg.model.path) == rollout[rollout.index("--model") + 1]
    assert str(cfg.output_dir).startswith("/checkpoints/")
    prefix = _effective_argv(SERVICES["learner"])[0]
    assert prefix[prefix.index("--stream-prefix") + 1] == f"cascade:{cfg.name}"
    settings = load_settings(str(files["/etc/cascade/api.yaml"]))
    for token in settings.tokens:
        assert token.token_env in RAW["services"]["api"]["environment"]


def test_env_example_names_every_variable() -> None:
    assert variables(RAW) <= set(ENV), sorted(variables(RAW) - set(ENV))


def test_env_example_sets_only_what_has_no_default() -> None:
    """A copy of .env.example changes nothing but the two secrets: every other variable is shown
    commented out at the GPU file's own default (so the CPU profile keeps its own defaults: a
    value set there once made `make stack-up` ask a 2-core host for 4 CPUs)."""
    active = read_env_file(DEPLOY / ".env.example")
    assert set(active) == {"POSTGRES_PASSWORD", "CASCADE_TOKEN_ADMIN"}
    shown = read_env_file(DEPLOY / ".env.example", documented=True)
    wrong = {k: (v, shown[k]) for k, v in defaults(RAW).items() if k not in active and shown.get(k, v) != v}
    assert wrong == {"CASCADE_TAG": ("dev", "0.1.0")}, wrong  # the tag's line shows a release tag
