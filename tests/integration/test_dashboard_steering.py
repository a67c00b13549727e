"""The dashboard steers: pause, resume, advance and abort clicked in headless Chromium.

A real API server over Postgres holds the seeded run (its last stage running, a live runner's
lease held); Chromium is driven over the DevTools protocol (tests/integration/cdp_browser.py)
with real mouse clicks and typing. The runner's side of each request (applying it at a step
boundary) is made through `cascade.store.repo`, as tests/integration/test_api.py does. The
page's 2 s polling is stopped once loaded and `refresh()` is called after each runner move, so
that no redraw races a click.

Checked: without a token, and with a read-only one, every button is disabled with the reason
and a click changes nothing; a wrong token shows the API's refusal and is not kept; with the
write token each button names the state it leads to, a click changes the API's state (abort
only after its confirmation; cancelling changes nothing), every button is disabled while a
request is in flight, and a refused request (409) shows the API's text and the page keeps
working; the token is in sessionStorage only (not localStorage, a cookie, the URL, the field);
text from the API (names) is inserted as text, never HTML.
"""

from __future__ import annotations

import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from api_procs import READ_TOKEN, REPO, WRITE_TOKEN, ApiServer, fresh_schema, running_api, tiny_config
from api_seed import seed
from cdp_browser import Browser
from sqlalchemy import Engine

from cascade.store import leases, repo
from cascade.store.db import make_engine, session_scope
from cascade.store.models import Run, RunLease, utcnow

pytestmark = pytest.mark.postgres
CHROMIUM = shutil.which("chromium")
TOKEN_KEY = "cascade.writeToken"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def chromium() -> str:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make chromium / scripts/ensure-chromium.sh)")
    return CHROMIUM


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Engine]]:
    with fresh_schema() as db_url, running_api(db_url, tmp_path_factory.mktemp("steer")) as server:
        engine = make_engine(db_url)
        try:
            yield server, engine
        finally:
            engine.dispose()


def seeded(api: ApiServer, engine: Engine, name: str) -> tuple[int, int]:
    """A run with its last stage ('if') running and a live runner attached: (cascade, stage) ids."""
    cascade_id = seed(api.db_url, name=name)
    with session_scope(engine) as s:
        run = s.query(Run).filter_by(cascade_id=cascade_id).one()
        holder = leases.Holder(token=uuid.uuid4().hex, host="gpu-node-1", pid=4242)
        leases.acquire(s, cascade_id=cascade_id, run_id=run.id, holder=holder, expiry_s=3600)
    _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
    (running,) = [st["id"] for st in detail["stages"] if st["state"] == "running"]
    return cascade_id, running


def stage_of(api: ApiServer, stage_id: int) -> tuple[str, str | None]:
    status, stage = api.call("GET", f"/api/stages/{stage_id}")
    assert status == 200
    return stage["state"], stage["desired_state"]


def runner_moves(engine: Engine, stage_id: int, state: str) -> None:
    with session_scope(engine) as s:
        repo.transition_stage(s, stage_id=stage_id, to_state=state, actor="runner")


def load(browser: Browser, url: str | None) -> None:
    """Open `url` in a new tab, or reload this tab (same sessionStorage) with None."""
    if url is None:
        browser.reload()
    else:
        browser.open(url)
    ready = "document.body.dataset.state === 'ready' && !!document.body.dataset.steer"
    browser.wait_for(
        ready + " && !document.getElementById('steer-note').textContent.includes('checking')", what="ready"
    )
    browser.js("clearInterval(timer)")  # no redraw races a click; refresh() is called instead


def refresh(browser: Browser) -> None:
    browser.js("refresh()")


def buttons(browser: Browser) -> list[dict[str, Any]]:
    return browser.js(  # type: ignore[no-any-return]
        "[...document.querySelectorAll('#controls button.action')].map((b) => ({"
        "row: b.closest('tr').dataset.stage || 'cascade', command: b.dataset.command, text: b.textContent,"
        "disabled: b.disabled, title: b.title}))"
    )


def offered(browser: Browser) -> list[tuple[str, str, bool]]:
    return [(b["row"], b["text"], b["disabled"]) for b in buttons(browser)]


def note(browser: Browser) -> str:
    return browser.js("document.getElementById('steer-note').textContent")  # type: ignore[no-any-return]


def click_action(browser: Browser, selector: str) -> None:
    """Click an action (or the confirmation's yes) and wait until the page has redrawn after it."""
    done = int(browser.js("document.body.dataset.actionsDone || '0'"))
    browser.click(selector)
    browser.wait_for(
        f"Number(document.body.dataset.actionsDone || '0') > {done}", what="the request to finish"
    )


def result(browser: Browser) -> tuple[str, str]:
    """The last action's outcome: (kind, text)."""
    kind, text = browser.js(
        "(() => { const r = document.getElementById('action-result');"
        " return [r.dataset.kind, r.textContent]; })()"
    )
    return kind, text


def enter_token(browser: Browser, token: str) -> None:
    browser.type_into("#token-input", token)
    browser.click("#token-use")
    checked = "!document.getElementById('steer-note').textContent.includes('checking')"
    browser.wait_for(checked, what="the token check")


def test_read_only_without_a_write_token(
    chromium: str, served: tuple[ApiServer, Engine], tmp_path: Path
) -> None:
    api, engine = served
    cascade_id, stage_id = seeded(api, engine, "readonly")
    with Browser(chromium, tmp_path / "profile") as browser:
        load(browser, f"{api.url}/?cascade={cascade_id}")
        # What the state offers is shown, but nothing may be sent without a token.
        assert offered(browser) == [
            ("if", "Pause → paused", True), ("if", "Advance → completed", True),
            ("cascade", "Abort → aborted", True),
        ]  # fmt: skip
        reason = "read-only: enter a write token to pause, resume, advance or abort"
        assert note(browser) == reason and {b["title"] for b in buttons(browser)} == {reason}
        assert browser.js("document.body.dataset.steer") == "off"
        posts = api.log().count("POST /api/")
        browser.click("#controls button[data-command=pause]")
        browser.click("#controls button[data-command=abort]")
        assert browser.js("document.getElementById('confirm').open") is False
        assert stage_of(api, stage_id) == ("running", None)
        assert api.log().count("POST /api/") == posts  # no request was even sent

        # A read-only token: named, and still no steering.
        enter_token(browser, READ_TOKEN)
        assert browser.js("document.getElementById('token-status').textContent") == "read-only as viewer"
        assert note(browser) == "read-only: token viewer is read-only (role read)"
        assert all(disabled for _, _, disabled in offered(browser))
        browser.click("#controls button[data-command=advance]")
        assert stage_of(api, stage_id) == ("running", None)
        assert api.log().count("POST /api/") == posts

        # The runner's lease expires: the page says who would (not) apply a request.
        with session_scope(engine) as s:
            lease = s.get(RunLease, cascade_id)
            assert lease is not None
            lease.expires_at = utcnow() - timedelta(seconds=1)
        refresh(browser)
        assert note(browser) == (
            "read-only: token viewer is read-only (role read) · no live runner holds this run: "
            "stage requests wait for it to be resumed; abort ends it at once"
        )


def test_a_wrong_token_shows_the_refusal(
    chromium: str, served: tuple[ApiServer, Engine], tmp_path: Path
) -> None:
    api, engine = served
    cascade_id, stage_id = seeded(api, engine, "wrongtoken")
    with Browser(chromium, tmp_path / "profile") as browser:
        load(browser, f"{api.url}/?cascade={cascade_id}")
        enter_token(browser, "not-the-token-" + uuid.uuid4().hex)
        assert note(browser) == "read-only: token refused: HTTP 401: invalid token"
        assert browser.js(f"sessionStorage.getItem('{TOKEN_KEY}')") is None  # a refused token is not kept
        assert all(disabled for _, _, disabled in offered(browser))
        assert browser.js("document.body.dataset.state") == "ready"  # the page still works
        browser.click("#controls button[data-command=pause]")
        assert stage_of(api, stage_id) == ("running", None)

        # A token that stops being valid while the page holds it (rotated in the API's settings):
        # the click is refused with the API's words, and the page drops to read-only.
        enter_token(browser, WRITE_TOKEN)
        assert browser.js("document.body.dataset.steer") == "on"
        browser.js(f"sessionStorage.setItem('{TOKEN_KEY}', 'rotated-{uuid.uuid4().hex}')")
        click_action(browser, "#controls button[data-command=pause]")
        assert result(browser) == ("refused", "stage if: pause refused: HTTP 401: invalid token")
        assert note(browser) == "read-only: token refused: HTTP 401: invalid token"
        assert browser.js(f"sessionStorage.getItem('{TOKEN_KEY}')") is None
        assert all(disabled for _, _, disabled in offered(browser))
        assert stage_of(api, stage_id) == ("running", None)


def test_steering_with_a_write_token(chromium: str, served: tuple[ApiServer, Engine], tmp_path: Path) -> None:
    api, engine = served
    cascade_id, stage_id = seeded(api, engine, "steered")
    page = f"{api.url}/?cascade={cascade_id}"
    with Browser(chromium, tmp_path / "profile") as browser:
        load(browser, page)
        enter_token(browser, WRITE_TOKEN)
        assert browser.js("document.body.dataset.steer") == "on" and note(browser) == ""
        assert browser.js("document.getElementById('token-status').textContent") == "steering as alice"
        # Kept in this tab's sessionStorage only.
        assert browser.js(f"sessionStorage.getItem('{TOKEN_KEY}')") == WRITE_TOKEN
        assert browser.js("JSON.stringify({...localStorage})") == "{}"
        assert browser.js("document.cookie") == "" and browser.cookies() == []
        assert WRITE_TOKEN not in browser.js("location.href")
        assert browser.js("document.getElementById('token-input').value") == ""
        assert browser.js("document.getElementById('token-input').hidden") is True

        # Every action button is disabled while a request is in flight.
        browser.js(
            "window.seen = []; new MutationObserver(() => { if (!document.body.dataset.inflight) return;"
            " const all = document.querySelectorAll('#controls button.action');"
            " window.seen.push([...all].map((b) => b.disabled)); })"
            ".observe(document.body, {attributes: true, childList: true, subtree: true});"
        )
        assert offered(browser) == [
            ("if", "Pause → paused", False), ("if", "Advance → completed", False),
            ("cascade", "Abort → aborted", False),
        ]  # fmt: skip
        ARTIFACTS.mkdir(exist_ok=True)
        browser.screenshot(ARTIFACTS / "dashboard-steering.png")
        click_action(browser, "#controls button[data-command=pause]")
        kind, text = result(browser)
        assert kind == "ok" and text.startswith("stage if: pause accepted → paused"), text
        assert stage_of(api, stage_id) == ("running", "paused")
        seen = browser.js("window.seen")
        assert seen and all(all(state) for state in seen), seen

        # Not applied yet: resume withdraws the pause.
        assert [t for r, t, _ in offered(browser) if r == "if"] == ["Resume → running", "Advance → completed"]
        click_action(browser, "#controls button[data-command=resume]")
        assert result(browser)[0] == "ok" and stage_of(api, stage_id) == ("running", None)
        click_action(browser, "#controls button[data-command=pause]")
        assert result(browser)[0] == "ok"

        # The runner pauses at its step boundary; the page then offers resume only.
        runner_moves(engine, stage_id, "paused")
        refresh(browser)
        assert [t for r, t, _ in offered(browser) if r == "if"] == ["Resume → running"]
        click_action(browser, "#controls button[data-command=resume]")
        kind, text = result(browser)
        assert kind == "ok" and "resume accepted → running" in text
        assert stage_of(api, stage_id) == ("paused", "running")
        runner_moves(engine, stage_id, "running")
        refresh(browser)

        # A refusal: another operator's pause was applied after this page drew its buttons.
        assert api.call("POST", f"/api/stages/{stage_id}/pause", token=WRITE_TOKEN)[0] == 200
        runner_moves(engine, stage_id, "paused")
        click_action(browser, "#controls button[data-command=advance]")  # drawn while running
        kind, text = result(browser)
        assert kind == "refused", text
        assert text == "stage if: advance refused: HTTP 409: illegal transition paused -> completed"
        assert stage_of(api, stage_id) == ("paused", None)
        assert browser.js("document.body.dataset.state") == "ready"  # the page redrew the new state
        assert [t for r, t, _ in offered(browser) if r == "if"] == ["Resume → running"]
        click_action(browser, "#controls button[data-command=resume]")
        assert result(browser)[0] == "ok"
        runner_moves(engine, stage_id, "running")
        refresh(browser)

        click_action(browser, "#controls button[data-command=advance]")
        kind, text = result(browser)
        assert kind == "ok" and "advance accepted → completed" in text
        assert stage_of(api, stage_id) == ("running", "completed")

        # Abort asks first; cancelling sends nothing.
        posts = api.log().count("POST /api/cascades/")
        browser.click("#controls button[data-command=abort]")
        assert browser.js("document.getElementById('confirm').open") is True
        question = browser.js("document.getElementById('confirm-text').textContent")
        assert question.startswith(f"Abort cascade #{cascade_id} steered?"), question
        browser.click("#confirm-no")
        assert browser.js("document.getElementById('confirm').open") is False
        _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
        assert detail["status"] == "running" and api.log().count("POST /api/cascades/") == posts
        browser.click("#controls button[data-command=abort]")
        click_action(browser, "#confirm-yes")
        kind, text = result(browser)
        assert kind == "ok" and text.startswith("cascade steered: abort accepted → aborted"), text
        _, detail = api.call("GET", f"/api/cascades/{cascade_id}")
        assert detail["status"] == "aborted"
        assert stage_of(api, stage_id) == ("running", "aborted")  # the live runner stops at its next step
        # Nothing is left to steer (an abort cannot be replaced; the runner applies it).
        assert offered(browser) == []
        assert note(browser) == "nothing to steer: the cascade is aborted"

        # The token stays for this tab's session (a reload keeps it), until forgotten.
        load(browser, None)
        assert browser.js("document.body.dataset.steer") == "on"
        browser.click("#token-forget")
        assert browser.js(f"sessionStorage.getItem('{TOKEN_KEY}')") is None
        assert browser.js("document.body.dataset.steer") == "off"
    assert WRITE_TOKEN not in api.log()


def test_api_text_is_never_html(chromium: str, served: tuple[ApiServer, Engine], tmp_path: Path) -> None:
    """A stage name is free text (a cascade name is not): it reaches the rows, the buttons'
    outcome and the events as text."""
    api, _ = served
    hostile = '<img src=x onerror="window.pwned=1"><b id="injected">bold</b>'
    cfg = tiny_config(name="hostile", stages=("math",))
    cfg["stages"][0]["name"] = hostile
    status, body = api.call("POST", "/api/cascades", token=WRITE_TOKEN, json_body=cfg)
    assert status == 201, body
    cascade_id, stage_id = body["id"], body["stages"][0]["id"]
    assert api.call("POST", f"/api/stages/{stage_id}/start", token=WRITE_TOKEN)[0] == 200
    with Browser(chromium, tmp_path / "profile") as browser:
        load(browser, f"{api.url}/?cascade={cascade_id}")
        enter_token(browser, WRITE_TOKEN)
        click_action(browser, "#controls button[data-command=pause]")
        kind, text = result(browser)
        assert kind == "ok" and text.startswith(f"stage {hostile}: pause accepted"), text
        assert browser.js("document.querySelector('#controls tr[data-stage]').dataset.stage") == hostile
        assert (
            browser.js("document.querySelector('#controls tr[data-stage] td').textContent")
            == f"stage {hostile}"
        )
        assert hostile in browser.js("document.getElementById('events').textContent")
        assert browser.js("window.pwned") is None
        assert browser.js("document.getElementById('injected')") is None
        assert browser.js("document.querySelectorAll('img').length") == 0
        # Defence in depth: the page's Content-Security-Policy blocks inline handlers even if
        # markup were ever injected (here on purpose, by the test itself).
        blocked = browser.js(
            "(() => { const box = document.createElement('div');"
            " box.innerHTML = '<img id=probe src=/no-such-image onerror=\"window.viaInline=1\">';"
            " document.body.append(box); const probe = document.getElementById('probe');"
            " return new Promise((done) => probe.addEventListener('error',"
            " () => setTimeout(() => done(window.viaInline === undefined), 100))); })()"
        )
        assert blocked is True
    with urllib.request.urlopen(f"{api.url}/", timeout=30) as page:
        csp = page.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
        assert page.headers["X-Frame-Options"] == "DENY" and page.headers["Referrer-Policy"] == "no-referrer"
