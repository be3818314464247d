"""Screenshots of the report, the head view and the explorer for the docs (headless chromium).

Run from the repository root, after ``attncoda fetch smollm2-135m austen`` and with Debian's
chromium installed (``apt-get install chromium``; another binary: ``ATTNCODA_CHROMIUM=PATH``)::

    python docs/images/screenshots.py            # all four images
    python docs/images/screenshots.py explorer   # only the explorer's two (no demo run)

It runs the quick demo (SmolLM2-135M on *Emma*) into a temporary folder, draws one head of its
rows with ``ds.coda.view``, and writes ``docs/images/report.png`` (the top of the report) and
``docs/images/head_view.png``. For the explorer it captures the rows of every head over one
256-token passage of *Emma*, saves ``ac.explore`` of them, drives the page over the DevTools
protocol (``tests/browser.py``: a hovered cell, then two heads compared) and writes
``docs/images/explorer.png``, ``docs/images/explorer_tokens.png`` (the hovered cell clicked:
its query's row over the passage's tokens) and ``docs/images/explorer_compare.png``. Each
screenshot is taken
into the temporary folder and moved into place, so an interrupted run leaves the previous images
as they were.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import attncoda as ac

HERE = Path(__file__).resolve().parent
#: the query whose row the explorer's screenshot hovers
QUERY = 18
sys.path.insert(0, str(HERE.parents[1] / "tests"))  # browser.py: chromium over DevTools
#: the top of the report: title, the findings in plain words, the passages, the sink grid
REPORT_SIZE = (1100, 2000)


def chromium() -> str:
    for name in (os.environ.get("ATTNCODA_CHROMIUM"), "chromium", "chromium-browser"):
        found = shutil.which(name) if name else None
        if found:
            return found
    sys.exit("needs Debian's chromium (apt-get install chromium) or ATTNCODA_CHROMIUM=PATH")


def screenshot(page: Path, png: Path, size: tuple[int, int]) -> None:
    """A PNG of the top ``size`` pixels of ``page``, written beside ``png`` and moved into place."""
    tmp = page.with_suffix(".png")
    subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={tmp}",
            page.resolve().as_uri(),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    if not tmp.is_file() or tmp.stat().st_size < 10_000:
        sys.exit(f"chromium wrote no screenshot of {page}")
    shutil.move(tmp, png)


def _explorer_rows() -> tuple[ac.Explorer, tuple[int, int], tuple[int, int], int]:
    """The explorer of every head of SmolLM2-135M over one 256-token passage of Emma, its
    sharpest previous-token head and its most diffuse head (layer, head), and the key that
    query 18 of the head shown first attends to most, after its sink."""
    from attncoda.hooks.demo import passage_rows  # SmolLM2, 256 tokens of Emma

    ds = passage_rows()
    prof = ds.coda.head_profiles(max_offset=1)
    prev = prof["content_clr"].sel(offset=-1).transpose("layer", "head").values
    diffuse = prof["content_entropy"].transpose("layer", "head").values
    a = tuple(int(v) for v in np.unravel_index(np.nanargmax(prev), prev.shape))
    b = tuple(int(v) for v in np.unravel_index(np.nanargmax(diffuse), diffuse.shape))
    # open on a middle layer's most sink-heavy head
    share = prof["sink_share"].sel(layer=14)
    head = int(share["head"].values[int(np.nanargmax(share.values))])
    key = 1 + int(ds["log_attn"].sel(layer=14, head=head).values[0, QUERY, 1:QUERY].argmax())
    title = "attention explorer: SmolLM2-135M on Emma"
    return ac.explore(ds, layer=14, head=head, title=title), a, b, key  # type: ignore[return-value]


def _shot(tab, png: Path, selector: str | None = None) -> None:
    """A PNG of the page (or of one element), written beside ``png`` and moved into place."""
    import base64
    import json

    tmp = png.with_name(f".{png.name}.tmp")
    if selector is None:
        tab.screenshot(tmp)
    else:
        box = tab.evaluate(
            f"(() => {{ const b = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [b.x + window.scrollX, b.y + window.scrollY,"
            " b.width, b.height]; })()"
        )
        clip = dict(zip(("x", "y", "width", "height"), box, strict=True), scale=1)
        shot = tab.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        tmp.write_bytes(base64.b64decode(shot["data"]))
    if tmp.stat().st_size < 10_000:
        sys.exit(f"chromium wrote no screenshot for {png.name}")
    shutil.move(tmp, png)


def _ready(tab) -> None:
    """Wait until the explorer has drawn itself."""
    import time

    for _ in range(400):
        if tab.evaluate("document.documentElement.dataset.ready"):
            return
        time.sleep(0.05)
    sys.exit("the explorer did not draw itself within 20 s")


def explorer_screenshots(folder: Path) -> None:
    """``explorer.png`` (a hovered cell), ``explorer_tokens.png`` (that cell locked: the
    token view) and ``explorer_compare.png`` (two heads, dropped)."""
    from browser import open_page

    explorer, prev, diffuse, key = _explorer_rows()
    page = explorer.save(folder / "explorer.html")
    with open_page(page, folder / "profile", 1300, 1700) as tab:
        _ready(tab)
        geo = tab.evaluate("window.acxGeometry(0)")
        row, col = geo["rows"].index(QUERY), next(c for c in geo["cols"] if c["k"] == key)
        x0, y0 = tab.evaluate(
            "(() => { const b = document.querySelector('#acx-pa .acx-over')"
            ".getBoundingClientRect(); return [b.x, b.y]; })()"
        )
        x, y = x0 + col["x"] + geo["cs"] / 2, y0 + geo["top"] + (row + 0.5) * geo["cs"]
        tab.hover(x, y)
        if not tab.evaluate("document.getElementById('acx-pa').dataset.hoverQuery"):
            sys.exit("the explorer's screenshot missed its cell")
        _shot(tab, HERE / "explorer.png")
        # a click locks the cell: the token view colours the passage by that query's row
        for kind in ("mousePressed", "mouseReleased"):
            tab.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )
        if tab.evaluate("document.getElementById('acx-tokens').dataset.query") != str(QUERY):
            sys.exit("the explorer's click did not lock its cell")
        _shot(tab, HERE / "explorer_tokens.png", "#acx-tokens")
    # compare mode stacks the two views, each at full width (tokens stay readable); the
    # views' column scrolls within the window, so the window is tall enough for both
    with open_page(page, folder / "profile2", 1560, 2300) as tab:
        _ready(tab)
        # two heads under the dropped convention: the sharpest previous-token head above the
        # most diffuse one (the selects take layer and head indices)
        tab.evaluate(
            "(() => { const set = (sel, v) => { sel.value = String(v);"
            " sel.dispatchEvent(new Event('change')); };"
            " document.getElementById('acx-compare').click();"
            " set(document.querySelector('#acx-win'), 32);"
            f" set(document.querySelector('#acx-pa .acx-layer'), {prev[0]});"
            f" set(document.querySelector('#acx-pa .acx-head'), {prev[1]});"
            f" set(document.querySelector('#acx-pb .acx-layer'), {diffuse[0]});"
            f" set(document.querySelector('#acx-pb .acx-head'), {diffuse[1]});"
            " document.querySelector('input[value=\"dropped\"]').click(); })()"
        )
        _shot(tab, HERE / "explorer_compare.png", "#acx-main")


def main() -> None:
    chromium()  # refuse before the demo runs
    if sys.argv[1:] == ["explorer"]:
        with tempfile.TemporaryDirectory() as tmp:
            explorer_screenshots(Path(tmp))
        print(f"wrote {HERE / 'explorer.png'}, explorer_tokens.png and explorer_compare.png")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "demo"
        subprocess.run(
            [sys.executable, "-m", "attncoda", "demo", "--quick", "--out", str(folder), "-q"],
            check=True,
        )
        screenshot(folder / "report.html", HERE / "report.png", REPORT_SIZE)
        rows = ac.load(folder / "rows.nc")
        # a middle layer's most sink-heavy head, on the first 40 tokens of the first passage
        layer = int(rows["layer"].values[len(rows["layer"]) // 2])
        share = rows.coda.head_profiles(max_offset=None)["sink_share"].sel(layer=layer)
        head = int(share["head"].values[int(np.nanargmax(share.values))])
        view = rows.coda.view(layer=layer, head=head, sample=0, max_tokens=40)
        page = view.save(Path(tmp) / "head_view.html")
        width, height = (int(v) for v in re.findall(r'width="(\d+)" height="(\d+)"', view.svg)[0])
        screenshot(page, HERE / "head_view.png", (width + 24, height + 24))
        explorer_screenshots(Path(tmp))
    print(f"wrote {HERE / 'report.png'}, {HERE / 'head_view.png'} and the explorer's two images")


if __name__ == "__main__":
    main()
