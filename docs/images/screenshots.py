"""Screenshots of the report and of the head view for the docs landing page (headless chromium).

Run from the repository root, after ``attncoda fetch smollm2-135m austen`` and with Debian's
chromium installed (``apt-get install chromium``; another binary: ``ATTNCODA_CHROMIUM=PATH``)::

    python docs/images/screenshots.py

It runs the quick demo (SmolLM2-135M on *Emma*) into a temporary folder, draws one head of its
rows with ``ds.coda.view``, and writes ``docs/images/report.png`` (the top of the report) and
``docs/images/head_view.png``. Each screenshot is taken into the temporary folder and moved into
place, so an interrupted run leaves the previous images as they were.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attncoda as ac

HERE = Path(__file__).resolve().parent
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


def main() -> None:
    chromium()  # refuse before the demo runs
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
        head = int(share["head"].values[int(share.argmax())])
        view = rows.coda.view(layer=layer, head=head, sample=0, max_tokens=40)
        page = view.save(Path(tmp) / "head_view.html")
        width, height = (int(v) for v in re.findall(r'width="(\d+)" height="(\d+)"', view.svg)[0])
        screenshot(page, HERE / "head_view.png", (width + 24, height + 24))
    print(f"wrote {HERE / 'report.png'} and {HERE / 'head_view.png'}")


if __name__ == "__main__":
    main()
