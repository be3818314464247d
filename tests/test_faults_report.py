"""A hostile analysis folder against the report: every field of ``analysis.json`` and every file
of the folder (and its stamp) is under an attacker's control.

``write_report`` / ``attncoda report`` must read nothing outside the folder (absolute paths,
``../``, symlinks, even when the attacker forges the stamp's hashes), read no file attncoda did
not write (not in the stamp, or changed since), and paste no markup: SVG views are rebuilt from
attncoda's own vocabulary or not shown. The page is then opened in headless chromium: no element
of the hostile markup exists, the page does not navigate and requests nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import needs_chromium, open_page
from hostile_inputs import (
    HOSTILE_SVG,
    SECRET,
    SYMLINK_TOGGLER,
    forge_stamp,
    good_analysis_folder,
    hostile_analysis_folder,
)

import attncoda as ac
from attncoda import _atomic
from attncoda._errors import ForeignFileError
from attncoda._report import MANIFEST, REPORT

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return good_analysis_folder(tmp_path_factory.mktemp("good"))


@pytest.fixture
def hostile(good: Path, tmp_path: Path) -> Path:
    """A copy of a real analysis folder, every field and file turned hostile."""
    return hostile_analysis_folder(good, tmp_path)


def _check_page(page: str) -> None:
    assert SECRET not in page
    for markup in HOSTILE_SVG.values():
        assert markup not in page
    assert 'data-hostile="' not in page and "<script" not in page.lower()
    assert 'href="javascript' not in page and "<meta http-equiv=refresh" not in page.lower()


def test_a_hostile_folder_gives_a_page_without_the_secret_or_the_markup(hostile: Path) -> None:
    page = ac.write_report(hostile).read_text(encoding="utf-8")
    _check_page(page)
    # the refusals are said in the page, one line each
    assert page.count("is not shown") >= len(HOSTILE_SVG) + 10
    # what is attncoda's still renders: the real views and tables
    assert page.count('<svg class="acf"') >= 3 and "<table>" in page


def test_the_cli_report_on_a_hostile_folder(hostile: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "attncoda", "report", str(hostile), "--force"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert SECRET not in run.stdout + run.stderr
    _check_page((hostile / REPORT).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "field, value",
    [
        ("title", 3),
        ("sections", {"a": 1}),
        ("sections", [{"heading": ["x"]}]),
        (
            "sections",
            [{"heading": "h", "tables": [{"file": "a", "caption": "c", "max_rows": "9"}]}],
        ),
        ("sections", [{"heading": "h", "figures": [{"stem": 1, "caption": "c"}]}]),
        ("numbers", {"n": {"nested": 1}}),
        ("summary", "not a list"),
        ("files", [1]),
    ],
)
def test_a_manifest_of_the_wrong_types_is_refused_in_one_line(good, tmp_path, field, value):
    folder = tmp_path / "a"
    shutil.copytree(good, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest[field] = value
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ac.ReportError, match="not a valid analysis manifest"):
        ac.write_report(folder)
    assert not (folder / REPORT).exists()


def test_read_own_file_refuses_each_way_out(good: Path, tmp_path: Path) -> None:
    folder = tmp_path / "a"
    shutil.copytree(good, folder)
    (tmp_path / "s.csv").write_text(SECRET)
    os.symlink(tmp_path / "s.csv", folder / "l.csv")
    forge_stamp(folder, ["l.csv"])
    for name in (str(tmp_path / "s.csv"), "../s.csv", "l.csv", "./layers.csv", "a//b", "", None):
        with pytest.raises(ac.InputError):
            _atomic.read_own_file(folder, name)
    assert _atomic.read_own_file(folder, "layers.csv").startswith(b"layer,")
    with open(folder / "layers.csv", "a") as fh:  # changed after attncoda wrote it
        fh.write("9,9,9,9,9\n")
    with pytest.raises(ac.InputError, match="changed after attncoda wrote it"):
        _atomic.read_own_file(folder, "layers.csv")
    (folder / "mine.csv").write_text("a\n")  # never stamped
    with pytest.raises(ac.InputError, match="not listed"):
        _atomic.read_own_file(folder, "mine.csv")


def test_an_old_folder_without_hashes_shows_its_text_not_its_files(good, tmp_path) -> None:
    folder = tmp_path / "a"
    shutil.copytree(good, folder)
    stamp = json.loads((folder / _atomic.STAMP).read_text())
    del stamp["sha256"]
    (folder / _atomic.STAMP).write_text(json.dumps(stamp))
    page = ac.write_report(folder).read_text()
    assert "<svg" not in page and "re-run the analysis" in page


@pytest.mark.real
@needs_chromium
def test_the_hostile_page_in_chromium_has_no_hostile_element_navigation_or_request(
    hostile: Path, tmp_path: Path
) -> None:
    page = ac.write_report(hostile)
    uri = page.resolve().as_uri()
    with open_page(page, tmp_path / "profile") as tab:
        time.sleep(1.5)  # a meta refresh of 0 s, or a script, would have run by now
        found = tab.evaluate(
            "JSON.stringify({"
            "hostile: document.querySelectorAll('[data-hostile]').length,"
            "bad: document.querySelectorAll('script, iframe, object, embed, foreignObject, use,"
            ' image, set, animate, a[href^="javascript"], meta[http-equiv=refresh]\').length,'
            "on: Array.from(document.querySelectorAll('*')).filter(e => Array.from(e.attributes)"
            ".some(a => a.name.startsWith('on'))).length,"
            "svgs: document.querySelectorAll('svg').length,"
            "title: document.title, href: location.href})"
        )
        urls = tab.requests()
    state = json.loads(found)
    assert state["hostile"] == 0 and state["bad"] == 0 and state["on"] == 0, state
    assert state["svgs"] >= 3 and state["title"] != "HOSTILE"
    assert state["href"] == uri
    assert [u for u in urls if u != uri and not u.startswith("data:")] == []


@pytest.mark.real
@needs_chromium
def test_the_browser_check_sees_a_navigation(tmp_path: Path) -> None:
    """The navigation check above can fail: a page with a meta refresh is seen to move."""
    (tmp_path / "other.html").write_text("<!DOCTYPE html><p>moved</p>")
    page = tmp_path / "refresh.html"
    page.write_text('<!DOCTYPE html><meta http-equiv="refresh" content="0;url=other.html">')
    with open_page(page, tmp_path / "profile") as tab:
        time.sleep(1.5)
        href = tab.evaluate("location.href")
    assert href.endswith("/other.html")


# --------------------------------------------------------------------------------------------
# a page is replaced only if attncoda wrote the whole of it (file_is_ours)


def _user_pages(tmp_path: Path) -> dict[str, Path]:
    view = ac.head_view(ac.testing.synthetic_rows(length=6))
    ours = view.save(tmp_path / "ours.html").read_text()
    pages = {
        # a user's page that embeds a view (the old check looked for this in the first 4 KB)
        "embeds_a_view": f"<html><body><h1>my notes</h1>{view.svg}</body></html>",
        "copies_the_head": ours.split("<body")[0] + "<body>my page</body></html>",
        # attncoda's page with one line a user added: its signature no longer matches
        "edited": ours.replace("<body", "<p>my line</p><body", 1),
        # a user's page with a signature line copied from attncoda's
        "copied_signature": "<p>mine</p>\n" + ours.splitlines()[-1] + "\n",
        "empty": "",
    }
    out = {}
    for name, text in pages.items():
        out[name] = tmp_path / f"{name}.html"
        out[name].write_text(text)
    return out


@pytest.mark.parametrize(
    "name", ["embeds_a_view", "copies_the_head", "edited", "copied_signature", "empty"]
)
def test_a_users_page_is_never_replaced_by_a_view_or_report(tmp_path, good, name) -> None:
    page = _user_pages(tmp_path)[name]
    before = page.read_bytes()
    view = ac.head_view(ac.testing.synthetic_rows(length=6))
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        view.save(page, overwrite=True)
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        ac.write_report(good, page, overwrite=True)
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        ac.check_report(page, overwrite=True)
    assert page.read_bytes() == before


def test_attncodas_own_pages_are_replaced_with_overwrite(tmp_path, good) -> None:
    view = ac.head_view(ac.testing.synthetic_rows(length=6))
    for suffix in ("html", "svg"):
        page = view.save(tmp_path / f"v.{suffix}")
        assert _atomic.file_is_ours(page) is None
        view.save(page, overwrite=True)
    report = ac.write_report(good, tmp_path / "r.html")
    assert _atomic.file_is_ours(report) is None
    ac.write_report(good, report, overwrite=True)
    # a view page and a report are both attncoda's pages: either may replace the other
    view.save(report, overwrite=True)
    assert _atomic.file_is_ours(report) is None


# --------------------------------------------------------------------------------------------
# issue #48: reads that cannot be raced, temp files that cannot be planted


def test_a_symlink_swapped_in_mid_read_never_yields_the_outside_file(tmp_path):
    folder, outside = tmp_path / "analysis", tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "t.csv").write_text(SECRET)
    _atomic.record_files(folder, "analysis")
    stamp = json.loads((folder / _atomic.STAMP).read_text())
    stamp["files"].append("sub/t.csv")  # forged: it lists the secret with its hash
    stamp["sha256"]["sub/t.csv"] = hashlib.sha256(SECRET.encode()).hexdigest()
    (folder / _atomic.STAMP).write_text(json.dumps(stamp))
    proc = subprocess.Popen(
        [sys.executable, "-c", SYMLINK_TOGGLER, str(folder), str(outside), "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    leaked = reads = 0
    try:
        while proc.poll() is None:
            reads += 1
            try:
                data = _atomic.read_own_file(folder, "sub/t.csv")
            except ForeignFileError:
                continue
            leaked += SECRET.encode() in data
    finally:
        proc.wait(timeout=60)
    assert reads > 100
    assert leaked == 0, f"{leaked} of {reads} reads returned the outside file"


def test_no_writer_uses_a_guessable_temporary_name():
    source = "\n".join(p.read_text() for p in (ROOT / "attncoda").rglob("*.py"))
    assert "tmp{os.getpid()}" not in source
    assert 'f".{name}.tmp"' not in source


def test_a_symlink_planted_at_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=3, length=6)
    folder = tmp_path / "analysis"
    ac.analyze(rows, folder, n_boot=0, progress=False, figures=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    pid = os.getpid()
    names = [f".{_atomic.STAMP}.tmp{pid}", f".{MANIFEST}.tmp{pid}", f".{REPORT}.tmp{pid}"]
    names += [f".{p.name}.tmp{pid}" for p in folder.glob("*.csv")]
    for name in names:  # every name the old writers used
        (folder / name).symlink_to(victim)
    ac.write_report(folder, overwrite=True)
    ac.write_table([{"a": 1}], folder / "t.csv")
    ac.Analysis(title="x").write(folder)
    assert victim.read_text() == "the user's file"
    assert all((folder / n).is_symlink() for n in names)  # never touched either
    assert not [p for p in folder.iterdir() if p.name.endswith(".attncoda-tmp")]
