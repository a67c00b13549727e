"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`).

No client library: Chromium reads JSON commands, each ended by a NUL byte, from its fd 3 and
writes answers and events to its fd 4. One page is opened and attached (flat sessions); clicks
are real mouse events at the element's centre (a disabled or hidden button cannot be clicked),
and typing is `Input.insertText` into the focused field. The browser runs in its own session and
is stopped by its pid.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


class BrowserError(RuntimeError):
    pass


def _above_4(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    def __init__(self, chromium: str, profile: Path, *, width: int = 1400, height: int = 1000) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the browser's ends moved above 4, so that placing them on 3 and 4 cannot close one
        to_chrome_r, from_chrome_w = (_above_4(fd) for fd in (to_chrome_r, from_chrome_w))
        argv = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "--remote-debugging-pipe",
            "about:blank",
        ]  # fmt: skip
        # the pipe ends land on fds 3 and 4 of the browser, where --remote-debugging-pipe expects them
        shell = f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-'
        self.proc = subprocess.Popen(
            ["bash", "-c", shell, "bash", *argv],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # ------------------------------------------------------------------ protocol

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("no answer from chromium in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise BrowserError(f"chromium closed its pipe (exit code {self.proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def command(self, method: str, timeout_s: float = 30, **params: Any) -> dict[str, Any]:
        """Send to the page's session (once attached), wait for the answer; events are kept."""
        wanted = self._send(method, params, self.session)
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]
            if "method" in message:
                self.events.append(message)

    def open(self, url: str) -> None:
        target = self.command("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.command("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.command("Page.enable")
        self.command("Runtime.enable")
        self.command("Page.navigate", url=url)

    def reload(self) -> None:
        self.command("Page.reload")

    # ------------------------------------------------------------------ the page

    def js(self, expression: str, timeout_s: float = 30) -> Any:
        """Evaluate in the page; promises are awaited; the value comes back as JSON."""
        out = self.command(
            "Runtime.evaluate",
            timeout_s=timeout_s,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in out:
            details = out["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"page error in {expression[:80]!r}: {text}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30, what: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.js(expression)
            except BrowserError:  # e.g. the page is between documents while it navigates
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {what or expression}")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A left click with the mouse at the centre of the element (scrolled into view)."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()"
        )
        if box is None:
            raise BrowserError(f"nothing visible to click at {selector}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra: dict[str, Any] = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            self.command("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def type_into(self, selector: str, text: str) -> None:
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.command("Input.insertText", text=text)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.command("Page.captureScreenshot", format="png")["data"]))

    def cookies(self) -> list[dict[str, Any]]:
        return self.command("Network.getAllCookies").get("cookies", [])  # type: ignore[no-any-return]

    def close(self) -> None:
        """Browser.close, else SIGTERM, then SIGKILL to whatever of its process group is left."""
        try:
            self._send("Browser.close", {}, None)
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
