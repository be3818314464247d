"""The analysis folder and the self-contained HTML report.

The browser test drives Debian's chromium headless over the DevTools protocol (a pipe, no extra
package): it loads the report from ``file://``, records every request the page makes, and reads
each image's natural size. It skips with a reason where chromium is absent
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import attncoda as ac
from attncoda._report import (
    CSP,
    MANIFEST,
    REPORT,
    Analysis,
    ReportError,
    analyze,
    load_analysis,
    render_html,
    write_report,
)

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("analysis")
    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=8)
    ds.attrs["model_id"] = "synthetic <model> & co"  # must be escaped in the page
    analyze(ds, out, n_boot=10, progress=False, meta={"command": "attncoda test"})
    write_report(out)
    return out


def test_folder_holds_tables_figures_and_manifest(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    for stem in ("sink_grid", "sink_vs_content", "entropy_attribution", "flip_rates"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    assert {"head_profiles.csv", "layers.csv", "flip_rates.csv", "clustering.csv"} <= names
    assert {MANIFEST, REPORT} <= names
    res = load_analysis(folder)
    assert res.numbers["n_layers"] == 2 and res.numbers["n_heads"] == 3
    assert res.numbers["entropy_identity_max_error"] < 1e-5
    assert res.meta["command"] == "attncoda test"
    assert any("verdict flips" in line for line in res.summary)
    figures = [f.stem for s in res.sections for f in s.figures]
    assert all((folder / f"{stem}.png").is_file() for stem in figures)


def test_manifest_round_trips(folder: Path) -> None:
    res = load_analysis(folder)
    again = Analysis.from_json(res.to_json())
    assert again == res


def test_page_is_self_contained(folder: Path) -> None:
    page = (folder / REPORT).read_text(encoding="utf-8")
    res = load_analysis(folder)
    n_figures = sum(len(s.figures) for s in res.sections)
    assert page.count('src="data:image/png;base64,') == n_figures >= 6
    assert CSP in page
    assert "<script" not in page.lower()
    # nothing is loaded from anywhere: every src/href is a data: URI, an anchor or a local file
    for url in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert url.startswith(("data:", "#")) or "/" not in url, url
    assert "http://" not in page and "https://" not in page
    assert "synthetic &lt;model&gt; &amp; co" in page
    assert "<table>" in page and "<th>flip_rate</th>" in page


def test_summaries_only_and_rows_only(tmp_path: Path) -> None:
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=2, length=6)
    summaries = ds.drop_vars("log_attn")
    res = analyze(summaries, tmp_path / "s", progress=False, figures=False)
    assert "flip_rate_kept_dropped_js" not in res.numbers
    assert not (tmp_path / "s" / "flip_rates.csv").exists()
    rows_only = ds.drop_vars(list(ac.SUMMARY_VARIABLES))
    res = analyze(rows_only, tmp_path / "r", n_boot=0, progress=False, figures=False)
    assert "flip_rate_kept_dropped_js" in res.numbers
    assert res.numbers["entropy_identity_max_error"] < 1e-5
    html = render_html(res, tmp_path / "r")
    assert "<img" not in html


def test_errors_are_report_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="not an analysis folder"):
        write_report(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ReportError, match="not a valid analysis manifest"):
        load_analysis(tmp_path)
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=4)
    with pytest.raises(ReportError, match="neither summaries"):
        analyze(
            ds[["token_id"]] if "token_id" in ds else ds.drop_vars(list(ds.data_vars)), tmp_path
        )


# --------------------------------------------------------------------------------------------
# a real headless browser


def _chromium() -> str | None:
    for name in (os.environ.get("ATTNCODA_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class _DevTools:
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


def _load_in_browser(page: Path, profile: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Open ``page``; return the URLs it requested and each image's load state."""
    binary = _chromium()
    assert binary is not None
    dt = _DevTools(binary, profile)
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Network", "Page", "Runtime"):
            dt.call(f"{domain}.enable", session=session)
        dt.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        dt.wait_for("Page.loadEventFired")
        images = json.loads(
            dt.call(
                "Runtime.evaluate",
                {
                    "expression": "JSON.stringify(Array.from(document.images).map(i => ({"
                    "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight, "
                    "scheme: i.currentSrc.split(':')[0]})))",
                    "returnByValue": True,
                },
                session=session,
            )["result"]["value"]
        )
        urls = [
            ev["params"]["request"]["url"]
            for ev in dt.events
            if ev.get("method") == "Network.requestWillBeSent"
        ]
    finally:
        dt.close()
    return urls, images


needs_chromium = pytest.mark.skipif(
    _chromium() is None,
    reason="needs Debian's chromium for the headless-browser check (apt-get install -y chromium)",
)


@pytest.mark.real
@needs_chromium
def test_report_renders_offline_in_chromium(folder: Path, tmp_path: Path) -> None:
    page = folder / REPORT
    urls, images = _load_in_browser(page, tmp_path / "profile")
    external = [u for u in urls if not u.startswith("data:") and u != page.resolve().as_uri()]
    assert external == [], f"the report made network requests: {external}"
    res = load_analysis(folder)
    assert len(images) == sum(len(s.figures) for s in res.sections)
    for img in images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
        assert img["scheme"] == "data"


@pytest.mark.real
@needs_chromium
def test_browser_check_sees_requests(tmp_path: Path) -> None:
    """The check above would notice a request: a page with a remote image is caught."""
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    urls, images = _load_in_browser(page, tmp_path / "profile")
    assert "http://127.0.0.1:9/x.png" in urls
    assert images and images[0]["width"] == 0
