"""A headless chromium driven over the DevTools protocol, for the browser tests.

Debian's chromium (``apt-get install -y chromium``, or ``ATTNCODA_CHROMIUM=/path``) talks the
DevTools protocol over ``--remote-debugging-pipe`` (fds 3 and 4): no extra package, no port.
:func:`open_page` loads a file and hands back a :class:`Page` to evaluate script in, move the
mouse and take screenshots; :func:`load_in_browser` records what a page requested.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def chromium() -> str | None:
    for name in (os.environ.get("ATTNCODA_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class DevTools:
    """A minimal DevTools protocol client over ``--remote-debugging-pipe`` (fds 3 and 4)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child expects commands on fd 3 and writes replies to fd 4; move our ends above 4
        # first so that dup2 cannot clobber one with the other
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 5)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 5)
        os.close(to_child_r)
        os.close(from_child_w)

        def setup() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=setup,
            close_fds=False,
        )
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 60
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


needs_chromium = pytest.mark.skipif(
    chromium() is None,
    reason="needs Debian's chromium for the headless-browser check (apt-get install -y chromium)",
)


class Page:
    """One tab of a :class:`DevTools` browser, with a page loaded."""

    def __init__(self, dt: DevTools, session: str) -> None:
        self.dt = dt
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.dt.call(method, params, session=self.session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a script expression evaluated in the page."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in reply:
            raise RuntimeError(f"script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to ``(x, y)`` (CSS pixels of the viewport), as a user would."""
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def screenshot(self, path: Path | None = None) -> bytes:
        """A PNG of the whole page (written to ``path`` if given)."""
        metrics = self.call("Page.getLayoutMetrics")["cssContentSize"]
        png = base64.b64decode(
            self.call(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {
                        "x": 0,
                        "y": 0,
                        "width": metrics["width"],
                        "height": metrics["height"],
                        "scale": 1,
                    },
                },
            )["data"]
        )
        if path is not None:
            path.write_bytes(png)
        return png

    def requests(self) -> list[str]:
        """URLs the page requested so far."""
        return [
            ev["params"]["request"]["url"]
            for ev in self.dt.events
            if ev.get("method") == "Network.requestWillBeSent"
        ]


@contextlib.contextmanager
def open_page(page: Path, profile: Path, width: int = 1100, height: int = 900) -> Iterator[Page]:
    """Load ``page`` in a fresh headless chromium; yield a :class:`Page`; close the browser."""
    binary = chromium()
    assert binary is not None
    dt = DevTools(binary, profile)
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        tab = Page(dt, session)
        for domain in ("Network", "Page", "Runtime"):
            tab.call(f"{domain}.enable")
        tab.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        tab.call("Page.navigate", {"url": page.resolve().as_uri()})
        dt.wait_for("Page.loadEventFired")
        yield tab
    finally:
        dt.close()


def load_in_browser(page: Path, profile: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Open ``page``; return the URLs it requested and each image's load state."""
    with open_page(page, profile) as tab:
        images = json.loads(
            tab.evaluate(
                "JSON.stringify(Array.from(document.images).map(i => ({"
                "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight, "
                "scheme: i.currentSrc.split(':')[0]})))"
            )
        )
        urls = tab.requests()
    return urls, images
