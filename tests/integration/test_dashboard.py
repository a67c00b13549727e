"""The dashboard in headless Chromium (Debian's `chromium`) against a real server with data.

The page is loaded twice with `--dump-dom` (scripts run; virtual time lets its 2 s polling
fire a few times) and once with `--screenshot`, kept as `test-artifacts/dashboard.png`. Checked:
the page reached its ready state with no error shown; the stage timeline, one eval curve per
domain, the training curves, the regression table and the reward-reason bars are drawn from the
run's rows; the run's latest completions are shown, their text escaped; the cascade's stored
config is in its collapsible section; the page polls; a second load shows steps the run recorded
in between (live data); and once the runner's lease expires the run shows as stalled with its
last heartbeat. `/docs` (Swagger UI) renders its operations with every host
but the API's unresolvable (its assets are served locally).
"""

from __future__ import annotations

import json
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


def _log_completions(api: ApiServer) -> None:
    """The seeded run's `completions.jsonl` (its run directory is `runs/demo` from the API's base
    dir): two per step for the last three steps, one completion trying to inject markup."""
    run_dir = api.base_dir / "runs" / "demo"
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "global_step": g,
            "stage": "if",
            "domain": "if",
            "problem": f"if-{g}",
            "prompt": f"Write {g} words.\nNo commas.",
            "completion": COMPLETION if best else "one, two",
            "reward": 1.0 if best else 0.0,
            "reason": "ok" if best else "rule_failed",
            "detail": "",
            "finish": "stop",
            "tokens": 12,
        }  # fmt: skip
        for g in (158, 159, 160)
        for best in (True, False)
    ]
    (run_dir / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


COMPLETION = 'one two <script>alert("x")</script> <b>three</b>'


def test_dashboard_renders_a_run(chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path) -> None:
    api, db_url, cascade_id = served
    _beat(db_url, cascade_id)
    _log_completions(api)
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
    # The training curves: one chart per step metric recorded (the seed records the reward), a
    # line per stage, by global step.
    assert re.findall(r'<svg[^>]*class="train-curve" data-metric="(\w+)"', dom) == ["reward_mean"]
    reward = re.search(r'<svg[^>]*class="train-curve" data-metric="reward_mean".*?</svg>', dom)
    assert reward is not None
    assert re.findall(r'<polyline[^>]*data-stage="(\w+)"', reward.group(0)) == ["math", "code", "if"]
    # The latest completions, newest first, their text escaped (never parsed as markup).
    items = re.findall(r'<article class="completion" data-step="(\d+)" data-domain="if">', dom)
    assert items == ["160", "160", "159", "159", "158", "158"]
    assert "<script>alert" not in dom and "<b>three" not in dom
    assert 'one two &lt;script&gt;alert("x")&lt;/script&gt; &lt;b&gt;three&lt;/b&gt;</pre>' in dom
    assert '<pre class="prompt">Write 160 words.\nNo commas.</pre>' in dom
    assert "reward 1.00</span> · ok" in dom and "reward 0.00</span> · rule_failed" in dom
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


def _seed_agent_cascade(db_url: str) -> int:
    """math -> agent, the agent stage two steps in: its steps carry the turn loop's `turns/...`
    metrics, each eval the agent's calls per task and tool-error rate beside task success."""
    cfg = {
        "name": "agent-demo",
        "model": {"path": "models/tiny-agent"},
        "domains": [{"name": "math"}, {"name": "agent"}],
        "stages": [
            {"domain": d, "advance": {"max_steps": 4}, "eval": {"every": 2}} for d in ("math", "agent")
        ],
    }
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            cascade = repo.create_cascade(s, name="agent-demo", config=cfg)
            stages = repo.create_stages(
                s, cascade_id=cascade.id, stages=[("math", "math"), ("agent", "agent")]
            )
            run = repo.start_run(s, cascade_id=cascade.id, seed=0, distill=True, output_dir="runs/agent-demo")
            repo.set_cascade_status(s, cascade_id=cascade.id, status="running", actor="runner")
            repo.transition_stage(s, stage_id=stages[0].id, to_state="running", actor="runner")
            for step in (1, 2):
                repo.record_step(
                    s, run_id=run.id, stage_id=stages[0].id, step=step, global_step=step,
                    metrics={"reward_mean": 0.5, "completion_tokens_mean": 12.0, "reasons": {"ok": 2}},
                )  # fmt: skip
            repo.transition_stage(s, stage_id=stages[0].id, to_state="completed", actor="runner")
            repo.transition_stage(s, stage_id=stages[1].id, to_state="running", actor="runner")
            for step, turns, calls in ((1, 1.5, 1.25), (2, 2.5, 1.75)):
                repo.record_step(
                    s, run_id=run.id, stage_id=stages[1].id, step=step, global_step=2 + step,
                    metrics={
                        "reward_mean": 0.25, "turns/turns_per_episode": turns,
                        "turns/calls_per_episode": calls, "turns/tool_error_rate": 0.1 * step,
                        "model_tokens_mean": 40.0 + step,
                        "completion_tokens_mean": 90.0, "reasons": {"ok": 1, "wrong_answer": 3},
                    },
                )  # fmt: skip
            for stage, g, calls, errors in ((0, 2, 0.0, 0.0), (1, 4, 1.5, 0.125)):
                for domain in ("math", "agent"):
                    metrics = {"greedy": {"value": 0.5, "low": 0.2, "high": 0.8, "n": 8, "method": "wilson"}}
                    if domain == "agent":
                        metrics["calls_per_task"] = {
                            "value": calls, "low": calls - 0.5 if calls else 0.0, "high": calls + 0.5,
                            "n": 8, "method": "bootstrap",
                        }  # fmt: skip
                        metrics["tool_error_rate"] = {
                            "value": errors, "low": 0.0, "high": 0.25, "n": 8, "method": "bootstrap",
                        }  # fmt: skip
                    repo.record_eval(
                        s, run_id=run.id, stage_id=stages[stage].id, step=2, global_step=g, domain=domain,
                        score=0.5, n=8, reasons={"ok": 4, "wrong_answer": 4}, metrics=metrics,
                    )  # fmt: skip
            return cascade.id
    finally:
        engine.dispose()


def test_an_agent_stage_shows_its_tool_use(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    """The agent eval's metrics beside task success (calls per task as a count, the tool-error
    rate as a share, each with its interval, per stage) and the agent stage's turn metrics
    (last step and mean); a cascade without either says so."""
    api, db_url, demo_id = served
    cascade_id = _seed_agent_cascade(db_url)
    dom = browse(chromium, f"{api.url}/?cascade={cascade_id}", tmp_path / "p", "--dump-dom")
    assert 'data-state="ready"' in dom and f'data-cascade="{cascade_id}"' in dom, dom[:3000]
    assert '<p id="error" class="error" hidden="">' in dom
    table = re.search(r'<table id="eval-metrics-table">(.*?)</table>', dom, re.S)
    assert table is not None, dom
    assert "<th>latest in math</th><th>latest in agent</th>" in table.group(1)
    calls = re.search(r'<tr data-domain="agent" data-metric="calls_per_task">(.*?)</tr>', table.group(1))
    assert calls is not None
    assert ">0.00 [0.00–0.50]</td>" in calls.group(1) and ">1.50 [1.00–2.00]</td>" in calls.group(1)
    assert 'title="bootstrap interval over 8 tasks"' in calls.group(1)
    errors = re.search(r'<tr data-domain="agent" data-metric="tool_error_rate">(.*?)</tr>', table.group(1))
    assert errors is not None and ">12.5% [0.0–25.0]</td>" in errors.group(1)
    assert 'data-metric="greedy"' not in table.group(1)  # the primary score: the curves show it
    assert 'data-domain="math"' not in table.group(1)  # no metric beside its score
    steps = re.search(r'<table id="step-metrics-table">(.*?)</table>', dom, re.S)
    assert steps is not None, dom
    rows = re.findall(r'<tr data-stage="(\w+)" data-metric="([\w/]+)">(.*?)</tr>', steps.group(1))
    assert [(st, m) for st, m, _ in rows] == [
        ("agent", "turns/calls_per_episode"), ("agent", "turns/tool_error_rate"),
        ("agent", "turns/turns_per_episode"), ("agent", "model_tokens_mean"),
        ("agent", "completion_tokens_mean"),
    ]  # fmt: skip
    cells = {m: re.findall(r"<td[^>]*>([^<]*)</td>", body) for _, m, body in rows}
    assert cells["turns/turns_per_episode"] == ["agent", "turns/turns_per_episode", "2.50", "2.00"]
    assert cells["turns/tool_error_rate"][2:] == ["20.0%", "15.0%"]
    assert cells["model_tokens_mean"][2:] == ["42.00", "41.50"]

    # Its training curves (reward and completion length, a line per stage) and no completions log.
    assert re.findall(r'<svg[^>]*class="train-curve" data-metric="(\w+)"', dom) == [
        "reward_mean", "completion_tokens_mean",
    ]  # fmt: skip
    assert re.search(r'<p class="muted" id="completions-empty">no completions logged yet \(', dom), dom

    demo = browse(chromium, f"{api.url}/?cascade={demo_id}", tmp_path / "demo", "--dump-dom")
    assert 'data-state="ready"' in demo
    assert "no stage records turn metrics" in demo and "no eval metrics beside the primary scores" in demo


def test_the_regression_gate_shows_its_decision_and_evidence(
    chromium: str, served: tuple[ApiServer, str, int], tmp_path: Path
) -> None:
    """The gate's events as the runner writes them (`RunStore.gate_event`): the decision with each
    fallen domain's two intervals, then the phase's end."""
    api, db_url, cascade_id = served
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            run = s.query(Run).filter_by(cascade_id=cascade_id).one()
            stage = s.query(Stage).filter_by(cascade_id=cascade_id, index=1).one()
            fallen = {
                "domain": "math",
                "best_step": 40,
                "best": 0.359,
                "best_low": 0.303,
                "best_high": 0.42,
                "now": 0.2,
                "now_low": 0.155,
                "now_high": 0.254,
            }
            opened = {"run_id": run.id, "global_step": 200, "fallen": [fallen], "max_steps": 20}
            repo.log_event(
                s, cascade_id=cascade_id, stage_id=stage.id, kind="gate_opened", actor="runner", detail=opened
            )
            closed = {"run_id": run.id, "global_step": 210, "outcome": "recovered", "steps": 10}
            repo.log_event(
                s, cascade_id=cascade_id, stage_id=stage.id, kind="gate_closed", actor="runner", detail=closed
            )
    finally:
        engine.dispose()
    _beat(db_url, cascade_id)
    dom = browse(chromium, f"{api.url}/?cascade={cascade_id}", tmp_path / "p", "--dump-dom")
    assert (
        "regression gate at step 200: math 20.0% [15.5%-25.4%] below its best 35.9% [30.3%-42.0%] "
        "(step 40): MOPD phase"
    ) in dom, dom[-3000:]
    assert "regression gate: recovered after 10 steps" in dom
