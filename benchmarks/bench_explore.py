"""Explorer benchmark: file size and time to first paint, against the static head view it replaces.

The target (issue 26): the explorer of a 30-layer x 9-head x 256-token capture of SmolLM2-135M
(every head, one sample) opens in a second or two and its file stays under 10 MB.

What is measured, in one process on the same rows (``capture(what="rows", tokenizer=...)`` of
SmolLM2-135M over one 256-token passage of *Emma*):

- the explorer, ``ac.explore(ds)``: its file size, the process CPU time and wall time to build
  it, and, in headless chromium, the time from navigation start to the mark ``acx-first-draw``
  that the page sets after it has inflated its data and drawn the overview and the large view
  the first time (read through DevTools: ``performance.getEntriesByName``);
- the static head view it replaces, ``ac.head_view`` of one head (no script, inline SVG), at its
  64-token default and at all 256 tokens: file size, build time, and its first contentful paint
  (the browser's own ``first-contentful-paint`` entry: the SVG is the page).

Each page is opened in a fresh headless chromium (``tests/browser.py``), the pages alternating,
``repeats`` times; medians. The browser's timings are wall time of a loaded, shared machine:
read them with the load average the runner prints.

Run: ``python benchmarks/bench_explore.py [--quick]`` (``--quick``: one repeat). Needs
``attncoda fetch smollm2-135m austen`` and Debian's chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attncoda as ac

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from _measure import clocked  # noqa: E402

MODEL = "smollm2-135m"
LENGTH = 256


def rows() -> Any:
    """fp32 rows of every head of SmolLM2-135M over one 256-token passage of Emma (the sample
    data of :func:`attncoda.hooks.demo.passage_rows`)."""
    from attncoda.hooks.demo import passage_rows

    return passage_rows(MODEL, LENGTH)


def paint_ms(page: Path, mark: str | None) -> float:
    """Milliseconds from navigation start to ``mark`` (or to the first contentful paint)."""
    from browser import open_page

    with tempfile.TemporaryDirectory() as profile, open_page(page, Path(profile)) as tab:
        expr = (
            f"JSON.stringify(performance.getEntriesByName({json.dumps(mark)}).map(e => e.startTime))"
            if mark
            else "JSON.stringify(performance.getEntriesByType('paint')"
            ".filter(e => e.name === 'first-contentful-paint').map(e => e.startTime))"
        )
        for _ in range(600):
            found = json.loads(tab.evaluate(expr))
            if found:
                return float(found[0])
            time.sleep(0.05)
    raise RuntimeError(f"{page.name}: no {mark or 'first-contentful-paint'} within 30 s")


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Size and first paint of the explorer and of the head view, measured alternately."""
    ds = rows()
    layer, head = int(ds["layer"].values[-1]), int(ds["head"].values[0])
    repeats = 1 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases: dict[str, dict[str, Any]] = {}
        makers = {
            "explorer": lambda: ac.explore(ds),
            "head_view_64": lambda: ac.head_view(ds, layer=layer, head=head),
            "head_view_256": lambda: ac.head_view(ds, layer=layer, head=head, max_tokens=LENGTH),
        }
        for name, make in makers.items():
            obj, cpu, wall = clocked(make)
            page = obj.save(folder / f"{name}.html")
            cases[name] = {"page": page, "cpu": cpu, "wall": wall, "paint": []}
            cases[name]["mb"] = page.stat().st_size / 1e6
        for _ in range(repeats):
            for name, case in cases.items():
                mark = "acx-first-draw" if name == "explorer" else None
                case["paint"].append(paint_ms(case["page"], mark) / 1e3)
    ex = cases["explorer"]
    load = os.getloadavg()[0]
    out = []
    for name, what in (("head_view_64", "64-token default"), ("head_view_256", "all 256 tokens")):
        hv = cases[name]
        paint = statistics.median(ex["paint"])
        anchor = statistics.median(hv["paint"])
        out.append(
            {
                "benchmark": f"explorer first draw, SmolLM2 30x9 heads x {LENGTH} tokens "
                f"(all 270 heads, {ex['mb']:.2f} MB)",
                "project_s": paint,
                "anchor": f"static head view first contentful paint, 1 head, {what} "
                f"({hv['mb']:.2f} MB)",
                "anchor_s": anchor,
                "ratio": paint / anchor,
                "target": "explorer <= 2 s (opens in a second or two)",
                "holds": paint <= 2.0,
            }
        )
    for name, what in (("head_view_64", "64-token default"), ("head_view_256", "all 256 tokens")):
        hv = cases[name]
        out.append(
            {
                "benchmark": f"file size in MB (not s): explorer, all 270 heads x {LENGTH} tokens",
                "project_s": ex["mb"],
                "anchor": f"static head view, 1 head, {what} (MB)",
                "anchor_s": hv["mb"],
                "ratio": ex["mb"] / hv["mb"],
                "target": "explorer < 10 MB",
                "holds": ex["mb"] < 10,
            }
        )
    out.append(
        {
            "benchmark": "build in Python, process CPU s: ac.explore, all 270 heads "
            f"(wall {ex['wall']:.1f} s)",
            "project_s": ex["cpu"],
            "anchor": "ac.head_view, 1 head, all 256 tokens (process CPU s; wall "
            f"{cases['head_view_256']['wall']:.1f} s)",
            "anchor_s": cases["head_view_256"]["cpu"],
            "ratio": ex["cpu"] / cases["head_view_256"]["cpu"],
            "target": f"(reported; load average {load:.1f})",
            "holds": None,
        }
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for row in run(quick=args.quick):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
