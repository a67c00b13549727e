"""The dashboard in headless Chromium (Debian's `chromium`) against a real server with data.

The page is loaded twice with `--dump-dom` (scripts run; virtual time lets its 2 s polling
fire a few times) and once with `--screenshot`, kept as `test-artifacts/dashboard.png`. Checked:
the page reached its ready state with no error shown; the stage timeline, one eval curve per
domain, the regression table and the reward-reason bars are drawn from the run's rows; the
cascade's stored config is in its collapsible section; the page polls; a second load shows steps
the run recorded in between (live data); and once the runner's lease expires the run shows as
stalled with its last heartbeat. `/docs` (Swagger UI) renders its operations with every host
but the API's unresolvable (its assets are served locally).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from api_procs import REPO, ApiServer, fresh_schema, running_api
from api_seed import DOMAINS, seed

from cascade.store import leases, repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Run, RunLease, Stage, utcnow

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
    """The seeded run with a live runner attached (its lease held for an hour)."""
    with fresh_schema() as db_url, running_api(db_url, tmp_path_factory.mktemp("dash")) as server:
        cascade_id = seed(db_url)
        engine = make_engine(db_url)
        try:
            with session_scope(engine) as s:
                run = s.query(Run).filter_by(cascade_id=cascade_id).one()
                holder = leases.Holder(token=uuid.uuid4().hex, host="gpu-node-1", pid=4242)
                leases.acquire(s, cascade_id=cascade_id, run_id=run.id, holder=holder, expiry_s=3600)
        finally:
            engine.dispose()
        yield server, db_url, cascade_id


def browse(chromium: str, url: str, profile: Path, *flags: str) -> str:
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    argv += [f"--user-data-dir={profile}", "--virtual-time-budget=7000", *flags, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _beat(db_url: str, cascade_id: int) -> None:
    """The live runner's heartbeat, renewed (a heartbeat older than two beats shows degraded): set
    two minutes ahead, as from a writer whose clock runs ahead, so it stays fresh however long
    headless Chromium takes to render and poll."""
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            lease = s.get(RunLease, cascade_id)
            assert lease is not None
            lease.heartbeat_at = utcnow() + timedelta(minutes=2)
    finally:
        engine.dispose()


def test_dashboard_renders_a_run(chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path) -> None:
    api, db_url, cascade_id = served
    _beat(db_url, cascade_id)
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
    assert '<span id="live" class="live">● live</span>' in dom  # not hidden: a stage is running
    assert "runner gpu-node-1 pid 4242 (since " in dom and "stalled" not in dom
    # The stored config, in its (closed) collapsible section.
    _, stored = api.call("GET", f"/api/cascades/{cascade_id}/config")
    section = re.search(r'<details id="config-section" data-cascade="(\d+)">(.*?)</details>', dom, re.S)
    assert section is not None and section.group(1) == str(cascade_id)
    assert f"training hash {stored['config_hash'][:12]}" in section.group(2)
    assert '"path": "models/tiny"' in section.group(2) and '"max_steps": 60' in section.group(2)
    # One eval curve per domain, each a line through its evals.
    for domain in DOMAINS:
        curve = re.search(rf'<svg[^>]*class="curve" data-domain="{domain}".*?</svg>', dom)
        assert curve is not None, domain
        assert "<polyline" in curve.group(0)
        assert curve.group(0).count("<circle") == 7 + 6 + 4  # start + 6 per finished stage + 4
        assert 'class="ci-band"' in curve.group(0)  # the evals' confidence band
    # The regression table, from the same numbers as the API's.
    _, table = api.call("GET", f"/api/cascades/{cascade_id}/regression")
    for row in table["rows"]:
        cells = re.search(rf'<tr data-domain="{row["domain"]}">(.*?)</tr>', dom)
        assert cells is not None
        low, high = row["start_ci"]  # every score with its interval, the drop with its noise flag
        assert f"<td>{100 * row['start']:.1f}% [{100 * low:.1f}–{100 * high:.1f}]</td>" in cells.group(1)
        noise = "outside noise" if row["drop_outside_noise"] else "within noise"
        drop = f"{100 * row['final_minus_best']:.1f} pp"
        assert (drop + (f", {noise}" if row["final_minus_best"] < 0 else "")) in cells.group(1)
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


def test_a_degraded_run_shows_what_it_rides_out(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    """The runner's outage events: one ridden out (database), one open (redis); and its heartbeat,
    a minute old, is stale."""
    api, db_url, cascade_id = served
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            run = s.query(Run).filter_by(cascade_id=cascade_id).one()
            outage = {"run_id": run.id, "dependency": "database", "outages": 1, "down_s": 2.6, "cause": "x"}
            repo.log_event(s, cascade_id=cascade_id, kind="outage", actor="runner", detail=outage)
            down = {"run_id": run.id, "dependency": "redis", "cause": "ConnectionError: <b>refused</b>"}
            repo.log_event(s, cascade_id=cascade_id, kind="degraded", actor="runner", detail=down)
            # A heartbeat a minute old, the lease still live: stale however fast the test runs.
            lease = s.get(RunLease, cascade_id)
            assert lease is not None
            lease.heartbeat_at = utcnow() - timedelta(seconds=60)
    finally:
        engine.dispose()
    dom = browse(chromium, f"{api.url}/?cascade={cascade_id}", tmp_path / "p", "--dump-dom")
    assert re.search(
        r'<span class="stalled" id="run-degraded"> · degraded: redis unreachable since '
        r"\d\d:\d\d:\d\d UTC \(ConnectionError: &lt;b&gt;refused&lt;/b&gt;\)",
        dom,
    ), dom
    assert "heartbeat no heartbeat for" in dom
    assert (
        '<span class="muted" id="run-outages"> · outages ridden out: database 1x (2.6 s down)</span>' in dom
    )


def test_a_stalled_run_shows_its_last_heartbeat(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    """Runs after the live one above: the runner stops renewing; past the expiry, stalled."""
    api, db_url, cascade_id = served
    beat = utcnow().replace(microsecond=0) - timedelta(minutes=5)
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            lease = s.get(RunLease, cascade_id)
            assert lease is not None
            lease.heartbeat_at, lease.expires_at = beat, beat + timedelta(seconds=30)
    finally:
        engine.dispose()
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    assert detail["runs"][-1]["status"] == "stalled"
    dom = browse(chromium, f"{api.url}/?cascade={cascade_id}", tmp_path / "p", "--dump-dom")
    assert 'data-state="ready"' in dom
    assert f"stalled: last heartbeat {beat:%H:%M:%S} UTC" in dom
    assert '<span id="live" class="stalled">● stalled</span>' in dom


def test_swagger_ui_renders_offline(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    """/docs with every host name but 127.0.0.1 unresolvable and a dead proxy for anything else:
    Swagger UI still draws the operations (its JavaScript and CSS come from the API itself)."""
    api, _, _ = served
    status, html = api.call("GET", "/docs")
    assert status == 200 and "/docs/assets/swagger-ui-bundle.js" in html
    assert not re.findall(r"https?://", html), "the page must not load anything from another host"
    offline = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--proxy-server=127.0.0.1:9",
               "--proxy-bypass-list=127.0.0.1"]  # fmt: skip
    dom = browse(chromium, f"{api.url}/docs", tmp_path / "docs", *offline, "--dump-dom")
    for path in ("/api/cascades/{cascade_id}/abort", "/api/cascades/{cascade_id}/stages/{stage}/pause",
                 "/api/stages/{stage_id}/start"):  # fmt: skip
        assert f'data-path="{path}"' in dom, path
    assert dom.count('class="opblock opblock-') >= 24
    assert "Cascade control plane" in dom
    status, page = api.call("GET", "/redoc")
    assert status == 200 and "/docs/assets/redoc.standalone.js" in page and "fonts.googleapis" not in page
