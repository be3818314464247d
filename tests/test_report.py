"""The analysis folder and the self-contained HTML report.

The browser test drives Debian's chromium headless over the DevTools protocol (a pipe, no extra
package): it loads the report from ``file://``, records every request the page makes, and reads
each image's natural size. It skips with a reason where chromium is absent
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser import load_in_browser, needs_chromium

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


@pytest.mark.real
@needs_chromium
def test_report_renders_offline_in_chromium(folder: Path, tmp_path: Path) -> None:
    page = folder / REPORT
    urls, images = load_in_browser(page, tmp_path / "profile")
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
    urls, images = load_in_browser(page, tmp_path / "profile")
    assert "http://127.0.0.1:9/x.png" in urls
    assert images and images[0]["width"] == 0
