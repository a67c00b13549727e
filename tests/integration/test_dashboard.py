"""The dashboard in headless Chromium (Debian's `chromium`) against a real server with data.

The page is loaded twice with `--dump-dom` (scripts run; virtual time lets its 2 s polling
fire a few times) and once with `--screenshot`, kept as `test-artifacts/dashboard.png`. Checked:
the page reached its ready state with no error shown; the stage timeline, one eval curve per
domain, the regression table and the reward-reason bars are drawn from the run's rows; the page
polls; and a second load shows steps the run recorded in between (live data).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_procs import REPO, ApiServer, fresh_schema, running_api
from api_seed import DOMAINS, seed

from cascade.store import repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Run, Stage

pytestmark = pytest.mark.postgres
CHROMIUM = shutil.which("chromium")
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def chromium() -> str:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make chromium / scripts/ensure-chromium.sh)")
    return CHROMIUM


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str, int]]:
    with fresh_schema() as db_url, running_api(db_url, tmp_path_factory.mktemp("dash")) as server:
        yield server, db_url, seed(db_url)


def browse(chromium: str, url: str, profile: Path, *flags: str) -> str:
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    argv += [f"--user-data-dir={profile}", "--virtual-time-budget=7000", *flags, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_dashboard_renders_a_run(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    api, db_url, cascade_id = served
    page = f"{api.url}/?cascade={cascade_id}"
    polls_before = api.log().count(f"GET /api/cascades/{cascade_id}/evals ")
    dom = browse(chromium, page, tmp_path / "p1", "--dump-dom")
    assert 'data-state="ready"' in dom and f'data-cascade="{cascade_id}"' in dom, dom[:3000]
    assert '<p id="error" class="error" hidden="">' in dom
    # The timeline: two completed stages and the running one, 40 of 60 steps in.
    assert re.findall(r'class="stage state-(\w+)" data-stage="(\w+)"', dom) == [
        ("completed", "math"), ("completed", "code"), ("running", "if"),
    ]  # fmt: skip
    assert "running · 40/60 steps" in dom
    assert '<span id="live" class="live">' in dom  # not hidden: a stage is running
    # One eval curve per domain, each a line through its evals.
    for domain in DOMAINS:
        curve = re.search(rf'<svg[^>]*class="curve" data-domain="{domain}".*?</svg>', dom)
        assert curve is not None, domain
        assert "<polyline" in curve.group(0)
        assert curve.group(0).count("<circle") == 7 + 6 + 4  # start + 6 per finished stage + 4
    # The regression table, from the same numbers as the API's.
    _, table = api.call("GET", f"/api/cascades/{cascade_id}/regression")
    for row in table["rows"]:
        cells = re.search(rf'<tr data-domain="{row["domain"]}">(.*?)</tr>', dom)
        assert cells is not None
        assert f"<td>{100 * row['start']:.1f}%</td>" in cells.group(1)
        assert f"{100 * row['final_minus_best']:.1f} pp" in cells.group(1)
    # Reward reasons per stage and per domain, events with their actor.
    for title in ("training · math", "training · if", "latest eval · code"):
        assert f'data-title="{title}"' in dom
    assert "wrong_answer 537" in dom
    assert "if: transition pending → running" in dom and "by runner" in dom
    # The page polls (every 2 s; 7 s of virtual time).
    assert api.log().count(f"GET /api/cascades/{cascade_id}/evals ") - polls_before >= 3

    # Live: the run goes on; the next load shows it.
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            run = s.query(Run).filter_by(cascade_id=cascade_id).one()
            stage = s.query(Stage).filter_by(cascade_id=cascade_id, name="if").one()
            for step in range(41, 46):
                repo.record_step(
                    s, run_id=run.id, stage_id=stage.id, step=step, global_step=120 + step,
                    metrics={"reasons": {"ok": 16}},
                )  # fmt: skip
    finally:
        engine.dispose()
    dom = browse(chromium, page, tmp_path / "p2", "--dump-dom")
    assert "running · 45/60 steps" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    browse(chromium, page, tmp_path / "p3", f"--screenshot={shot}", "--window-size=1400,1150")
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1400, 1150)
