"""The CPU compose stack brought up exactly as the docs say (docs/deployment.md, README):

    cp deploy/.env.example deploy/.env    # then set POSTGRES_PASSWORD and CASCADE_TOKEN_ADMIN
    make stack-up

in a copy of the repository (its tracked files, as a user's checkout), with the tiny model where
`make demo` puts it. `make stack-up` must exit 0 with every service healthy, and again after a
`make stack-down` (the learner goes on from the run it left in the checkpoint volume). Each of
these failed once: `.env.example` named images `make images` does not build, the CPU profile was
asked for 4 CPUs on a 2-core host, no database role existed for the containers, the rollout
worker had no health check for `--wait`, and a recreated learner refused its own run directory.

Run by `make test` (the images built first) with the container drill; a bare pytest skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("CASCADE_CONTAINER_DRILL") != "1",
        reason="compose stack: make test / make test-containers (CASCADE_CONTAINER_DRILL=1)",
    ),
]


def _checkout(target: Path) -> Path:
    """The repository's tracked (and not ignored) files, as they are in this working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _make(checkout: Path, target: str, timeout_s: float = 1200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "COMPOSE_"))}
    return subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _services(checkout: Path) -> dict[str, str]:
    compose = ["docker", "compose", "-f", "deploy/docker-compose.yml", "-f", "deploy/docker-compose.cpu.yml"]
    out = subprocess.run(
        [*compose, "ps", "--all", "--format", "json"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    if len(rows) == 1 and isinstance(rows[0], list):  # older compose: one JSON array
        rows = rows[0]
    return {row["Service"]: f"{row['State']}/{row.get('Health', '')}" for row in rows}


@pytest.fixture
def checkout(tmp_path: Path, random_tiny_model: Path) -> Iterator[Path]:
    root = _checkout(tmp_path / "cascade")
    model = REPO / "models" / "tiny"
    shutil.copytree(
        model if (model / "config.json").is_file() else random_tiny_model, root / "models" / "tiny"
    )
    for path in [tmp_path, *tmp_path.parents]:  # the images' uid reads the model through its mount
        if path == Path("/"):
            break
        if path.stat().st_uid == os.getuid():
            path.chmod(path.stat().st_mode | 0o755)
    for path in (root / "models").rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    yield root
    _make(root, "stack-down", timeout_s=300)
    subprocess.run(["docker", "volume", "rm", "-f", "deploy_checkpoints"], capture_output=True, timeout=120)


def test_make_stack_up_as_the_docs_say(checkout: Path) -> None:
    if shutil.which("docker") is None:
        pytest.fail("no docker (scripts/ensure-docker.sh; make test installs it)")
    env_file = checkout / "deploy" / ".env"
    shutil.copy(checkout / "deploy" / ".env.example", env_file)  # cp deploy/.env.example deploy/.env
    text = env_file.read_text()
    assert "\nPOSTGRES_PASSWORD=change-me\n" in text and "\nCASCADE_TOKEN_ADMIN=\n" in text
    text = text.replace("POSTGRES_PASSWORD=change-me", "POSTGRES_PASSWORD=stack-docs-test-password")
    text = text.replace("CASCADE_TOKEN_ADMIN=", "CASCADE_TOKEN_ADMIN=" + "0f" * 24)
    env_file.write_text(text)

    for attempt in ("first", "after stack-down"):
        done = _make(checkout, "stack-up")
        assert done.returncode == 0, f"{attempt}: make stack-up: rc={done.returncode}\n{done.stderr[-4000:]}"
        services = _services(checkout)
        assert set(services) == {
            "api",
            "reward",
            "reward-worker",
            "rollout",
            "rollout-worker",
            "teacher",
            "learner",
        }, services
        assert all(state == "running/healthy" for state in services.values()), (attempt, services)
        if attempt == "first":
            assert _make(checkout, "stack-down", timeout_s=300).returncode == 0
