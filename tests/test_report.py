"""The analysis folder and the self-contained HTML report.

The browser test drives Debian's chromium headless over the DevTools protocol (a pipe, no extra
package): it loads the report from ``file://``, records every request the page makes, and reads
each image's natural size. It skips with a reason where chromium is absent
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
from browser import load_in_browser, needs_chromium, open_page

import attncoda as ac
from attncoda._report import (
    CSP,
    MANIFEST,
    REPORT,
    Analysis,
    ReportError,
    _model_name,
    analyze,
    load_analysis,
    render_html,
    write_report,
)

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

# one worker runs this module under pytest-xdist, so the report of the module-scoped `folder`
# fixture (2.1 CPU-s) is written once, not once on each worker that draws one of its tests
pytestmark = pytest.mark.xdist_group("test_report")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("analysis")
    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=8)
    ds.attrs["model_id"] = "synthetic <model> & co"  # must be escaped in the page
    words = [[f"{'<Em>' if p == 0 else ' w'}{s}{p}" for p in range(8)] for s in range(3)]
    ds = ds.assign_coords(token=(("sample", "position"), np.array(words)))
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
    n_views = sum(1 for s in res.sections for f in s.figures if f.view)
    assert n_views >= 6  # sink grid, scatter, flips, dendrograms, two heads' rows
    assert page.count('src="data:image/png;base64,') + page.count("<svg ") == n_figures >= 7
    assert page.count("<title>") > 100  # hover tooltips
    assert CSP in page
    assert "<script" not in page.lower()
    # nothing is loaded from anywhere: every src/href is a data: URI, an anchor or a local file
    for url in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert url.startswith(("data:", "#")) or "/" not in url, url
    assert "http://" not in page and "https://" not in page
    assert "synthetic &lt;model&gt; &amp; co" in page
    assert "<table>" in page and "<th>flip_rate</th>" in page


def test_page_is_readable(folder: Path) -> None:
    page = (folder / REPORT).read_text(encoding="utf-8")
    res = load_analysis(folder)
    # the passages and their sink tokens
    assert "What the model read" in page
    assert "&lt;Em&gt;00 w01 w02" in page and "sink: &quot;&lt;Em&gt;10&quot; at position 0" in page
    assert "3 passages, all shown." in page
    assert res.numbers["sink_tokens"] == ["<Em>00", "<Em>10", "<Em>20"]
    assert (folder / "passages.csv").read_text().count("\n") == 4
    # plain words, the terms defined where they first appear
    plain = page[page.index("In plain words") : page.index("the summary as the command printed")]
    for term in ("adjusted Rand index (ARI;", "Spearman rho", "kept", "dropped", "split"):
        assert term in plain, term
    # hover texts: a head of the sink grid says its numbers, as the CSV does
    table = {(r["layer"], r["head"]): r for r in csv.DictReader(open(folder / "head_profiles.csv"))}
    share = float(table[("1", "2")]["sink_share"])
    assert f"<title>layer 1, head 2\nmean sink share {share:.3f}" in page
    # the head view of each drawn head, with token labels
    views = [f.view for s in res.sections for f in s.figures if f.view.startswith("view_L")]
    assert len(views) == 2
    assert "&quot;&lt;Em&gt;" in page and "→ key" in page


def test_model_name_not_local_path() -> None:
    assert _model_name("/root/.cache/attncoda/models/smollm2-135m") == "smollm2-135m"
    assert _model_name("~/models/gemma-3-270m/") == "gemma-3-270m"
    assert _model_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"


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


@pytest.mark.real
@needs_chromium
def test_report_renders_offline_in_chromium(folder: Path, tmp_path: Path) -> None:
    page = folder / REPORT
    urls, images = load_in_browser(page, tmp_path / "profile")
    external = [u for u in urls if not u.startswith("data:") and u != page.resolve().as_uri()]
    assert external == [], f"the report made network requests: {external}"
    res = load_analysis(folder)
    assert len(images) == sum(1 for s in res.sections for f in s.figures if not f.view)
    for img in images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
        assert img["scheme"] == "data"


@pytest.mark.real
@needs_chromium
def test_browser_check_sees_requests(tmp_path: Path) -> None:
    """The check above would notice a request: a page with a remote image is caught."""
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    urls, images = load_in_browser(page, tmp_path / "profile")
    assert "http://127.0.0.1:9/x.png" in urls
    assert images and images[0]["width"] == 0


@pytest.mark.real
@needs_chromium
def test_report_figures_answer_hover_in_chromium(folder: Path, tmp_path: Path) -> None:
    """Hovering a head of the sink grid and a cell of a head view shows their values."""
    table = {(r["layer"], r["head"]): r for r in csv.DictReader(open(folder / "head_profiles.csv"))}
    find = (
        "(() => {{ for (const r of document.querySelectorAll('{sel}')) {{"
        " const t = r.querySelector('title').textContent;"
        " if (t.startsWith({start!r})) {{ r.scrollIntoView({{block: 'center'}});"
        " const b = r.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2];"
        " }} }} return null; }})()"
    )
    hovered = (
        "(() => { const h = Array.from(document.querySelectorAll(':hover')).pop();"
        " return h.querySelector('title').textContent; })()"
    )
    with open_page(folder / REPORT, tmp_path / "profile") as tab:
        tab.hover(*tab.evaluate(find.format(sel="rect.acf-c", start="layer 0, head 1\n")))
        grid_tip = tab.evaluate(hovered)
        tab.hover(*tab.evaluate(find.format(sel="rect.acv-c", start="query 5 ")))
        view_tip = tab.evaluate(hovered)
    share = float(table[("0", "1")]["sink_share"])
    assert grid_tip.startswith(f"layer 0, head 1\nmean sink share {share:.3f}")
    assert view_tip.startswith('query 5 " w')
    assert "weight p = " in view_tip and "row sink share s = " in view_tip


def _report_of(tmp_path: Path, n_samples: int, length: int, first: str) -> Path:
    """The report of a synthetic capture whose samples all start with the token ``first``."""
    ds = ac.testing.synthetic_rows(n_samples=n_samples, n_layers=2, n_heads=3, length=length)
    words = [[first if p == 0 else f" w{s}{p}" for p in range(length)] for s in range(n_samples)]
    ds = ds.assign_coords(token=(("sample", "position"), np.array(words)))
    analyze(ds, tmp_path / "a", n_boot=10, progress=False)
    return write_report(tmp_path / "a")


@pytest.mark.slow
def test_passages_counted_honestly_and_a_quote_token_quoted(tmp_path: Path) -> None:
    """Six passages, four shown: the page says both; a sink that is a double quote reads as the
    string literal "\\"" in the page and in the summary the CLI prints (one rule:
    attncoda._view.quote_token), never as a bare quote in quotes."""
    page = _report_of(tmp_path, 6, 8, '"').read_text(encoding="utf-8")
    res = load_analysis(tmp_path / "a")
    assert "6 passages, 4 shown (the first 4)" in page
    assert page.count("<p>Sample ") == 4
    assert "sink: &quot;\\&quot;&quot; at position 0" in page
    assert "“" not in page and "”" not in page
    line = next(s for s in res.summary if s.startswith("sink tokens"))
    assert line == 'sink tokens: "\\"" (6 samples)'


#: Every ``<text>`` of every inline SVG of the page, where it lies outside its SVG's box, and
#: every head view whose box is wider than the report's column (it would scroll).
_LAYOUT = """(() => {
  const cut = [], wide = [];
  for (const svg of document.querySelectorAll('svg')) {
    const vb = svg.viewBox.baseVal;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBBox(), m = t.getCTM(), s = svg.getCTM();
      // the text's box in the svg's own units (rotated labels through their transform)
      const p = [[b.x, b.y], [b.x + b.width, b.y + b.height]].map(([x, y]) => {
        const q = new DOMPoint(x, y).matrixTransform(s.inverse().multiply(m)); return [q.x, q.y]; });
      const [x0, x1] = [Math.min(p[0][0], p[1][0]), Math.max(p[0][0], p[1][0])];
      const [y0, y1] = [Math.min(p[0][1], p[1][1]), Math.max(p[0][1], p[1][1])];
      if (x0 < vb.x - 0.5 || y0 < vb.y - 0.5 || x1 > vb.x + vb.width + 0.5 || y1 > vb.y + vb.height + 0.5)
        cut.push(svg.getAttribute('aria-label') + ': ' + t.textContent.slice(0, 60));
    }
  }
  for (const f of document.querySelectorAll('figure.view .scroll'))
    if (f.scrollWidth > f.clientWidth + 1 || f.getBoundingClientRect().right > document.body.getBoundingClientRect().right)
      wide.push(f.parentElement.id + ' ' + f.scrollWidth + ' > ' + f.clientWidth);
  return {cut, wide, views: document.querySelectorAll('figure.view svg').length};
})()"""


@needs_chromium
@pytest.mark.parametrize(
    # 64 tokens: 4.0 and 5.0 CPU-s in two runs of 6 December 2026; 5 tokens 2.7, over the 2 of `slow`
    "length",
    [pytest.param(5, marks=pytest.mark.slow), pytest.param(64, marks=pytest.mark.slow)],
)
def test_report_figures_fit_their_boxes_and_the_column_in_chromium(
    tmp_path: Path, length: int
) -> None:
    """No heading, legend or label of an inline figure is cut by its SVG's box (a 5-token head
    view is narrower than its notes and legends), and a 64-token head view fits the report's
    column (scaled to it) instead of running past it."""
    report = _report_of(tmp_path, 3, length, "<s>")
    with open_page(report, tmp_path / "profile") as tab:
        found = tab.evaluate(_LAYOUT)
    assert found["views"] >= 4
    assert found["cut"] == []
    assert found["wide"] == []
