"""Which files the process opened (issue #48): evidence, not just output, that no file outside a
capture or an analysis folder is read while ``ac.load``, ``attncoda explore``, ``attncoda
analyze`` and ``attncoda report`` meet the hostile inputs of ``tests/hostile_inputs.py``.

Each case runs in a fresh interpreter (``tests/opened_files.py``) that records every ``open``
the process asks for through a Python audit hook (``open``, ``io.open``, ``os.open``, also
relative to a directory descriptor), and, where ``strace`` is installed, every ``open``/
``openat`` system call of the process and its threads with the file the kernel opened
(``strace -f -y``): HDF5 opens files in C, unseen by audit hooks. The checks, on both records:

- the outside file's path, its real path, and every path under the folder holding it, are never
  opened (nor tried);
- every path under the test's temporary folder that was opened lies inside the input's own
  folder (where the outputs go too);
- no file written holds the outside file's bytes.

Each evidence check is shown to fail when the protection is switched off in the child (the
``..._sees_...`` tests): with the store check off, the audit hook sees the symlinked chunk's
target opened and strace sees HDF5 open the external storage file; with the report's
``O_NOFOLLOW`` off, both see the outside files opened through the folder's symlinks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import opened_files
import pytest
from hostile_inputs import (
    OUTSIDE,
    SECRET,
    SYMLINK_TOGGLER,
    good_analysis_folder,
    hostile_analysis_folder,
    netcdf_with_external_storage,
    netcdf_with_link,
    outside_file,
    raced_analysis_folder,
    zarr_with_symlink,
)

import attncoda as ac

pytest.importorskip("h5py")
pytest.importorskip("matplotlib")

STRACE_MISSING = opened_files.strace_missing()
needs_strace = pytest.mark.skipif(
    STRACE_MISSING is not None,
    reason=f"the strace record needs strace: {STRACE_MISSING} (the audit-hook record of the "
    "same cases is checked by the tests that do not need strace)",
)

NETCDF_CASES = [
    "nc-storage-absolute-token",
    "nc-storage-relative-token",
    "nc-storage-absolute-log_attn",
    "nc-link-external",
    "nc-link-virtual",
]
ZARR_CASES = ["zarr-chunk", "zarr-metadata", "zarr-folder"]


def _under(path: str | None, root: str | Path) -> bool:
    if path is None:
        return False
    root = os.path.normpath(str(root))
    return path == root or path.startswith(root + os.sep)


def _roots(path: Path) -> list[str]:
    """``path`` as written and as its real path (both are how a process may name it)."""
    return sorted({os.path.normpath(str(path)), os.path.realpath(path)})


def _opened(evidence: dict[str, Any], source: str) -> list[dict[str, Any]]:
    return evidence["events"] if source == "audit" else evidence["strace"]


def assert_confined(
    evidence: dict[str, Any], source: str, *, inside: Path, outside: Path, tmp: Path
) -> None:
    """No path under ``outside`` opened (asked or real), and every path under ``tmp`` that was
    opened lies under ``inside``; ``source`` is ``audit`` or ``strace``."""
    records = _opened(evidence, source)
    assert records, f"the {source} record is empty: it cannot be evidence"
    leaks, strays = [], []
    for record in records:
        for key in ("path", "real"):
            path = record.get(key)
            if any(_under(path, root) for root in _roots(outside)):
                leaks.append((record.get("action"), key, path))
            elif any(_under(path, root) for root in _roots(tmp)) and not any(
                _under(path, root) for root in _roots(inside)
            ):
                strays.append((record.get("action"), key, path))
    assert leaks == [], f"{source}: files outside the input were opened: {leaks[:5]}"
    assert strays == [], f"{source}: paths outside the input's folder were opened: {strays[:5]}"


def assert_nothing_written_holds(tmp: Path, outside: Path, secret: bytes) -> None:
    for path in tmp.rglob("*"):
        if path.is_file() and not path.is_symlink() and not _under(str(path), outside):
            assert secret not in path.read_bytes(), f"{path} holds the outside file's bytes"


@pytest.fixture(scope="module")
def ds():
    return ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)


def hostile_capture(case: str, tmp: Path, ds) -> tuple[Path, Path, Path]:
    """(the hostile capture, inside ``tmp/case/``; the folder outside it holding the secret,
    ``tmp/elsewhere``; the child's working directory)."""
    folder = tmp / "case"
    folder.mkdir()
    secret = outside_file(tmp)
    cwd = folder
    if case.startswith("nc-"):
        src = ac.save(ds, tmp / "src" / "a.nc")
        hostile = folder / "hostile.nc"
        if case.startswith("nc-storage-"):
            _, _, how, variable = case.split("-", 3)
            where = str(secret)
            if how == "relative":  # resolved against the reader's working directory
                cwd = tmp
                where = os.path.relpath(secret, tmp)
            netcdf_with_external_storage(src, hostile, variable, where)
        else:
            link = case.split("-", 2)[2]
            netcdf_with_link(src, hostile, secret.parent / "other.h5", link)
    else:
        hostile = ac.save(ds, folder / "hostile.zarr")
        zarr_with_symlink(hostile, secret, case.split("-", 1)[1])
    return hostile, secret.parent, cwd


def _capture_actions(hostile: Path) -> list[list[Any]]:
    folder = hostile.parent
    return [
        ["load", "load", [str(hostile)]],
        ["explore", "cli", ["explore", str(hostile), "--out", str(folder / "page.html")]],
        [
            "analyze",
            "cli",
            ["analyze", str(hostile), "--out", str(folder / "analysis"), "--n-boot", "0", "-q"],
        ],
        [
            "report",
            "cli",
            ["report", str(hostile), "--out", str(folder / "report.html"), "--n-boot", "0", "-q"],
        ],
    ]


def _assert_refused(results: dict[str, str]) -> None:
    assert results["load"].startswith("SchemaError:") and "is refused" in results["load"], results
    for action in ("explore", "analyze", "report"):
        assert results[action] == "exit 2", results  # one line, a usage error


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The child's own files (its spec, its records, strace's log): beside ``tmp_path``, not in
    it, so that they are not among the paths checked."""
    return tmp_path_factory.mktemp("evidence")


def _capture_case(
    case: str, tmp: Path, work: Path, ds, *, under_strace: bool, bypass: str | None = None
):
    hostile, elsewhere, cwd = hostile_capture(case, tmp, ds)
    spec = {"actions": _capture_actions(hostile), "cwd": str(cwd), "bypass": bypass}
    evidence = opened_files.run(spec, work, under_strace=under_strace)
    return evidence, hostile, elsewhere


# --------------------------------------------------------------------------------------------
# hostile captures: ac.load, explore, analyze, report


@pytest.mark.parametrize("case", [*NETCDF_CASES, *ZARR_CASES])
def test_a_hostile_capture_opens_no_outside_file(tmp_path, work, ds, case):
    evidence, hostile, elsewhere = _capture_case(case, tmp_path, work, ds, under_strace=False)
    assert_confined(evidence, "audit", inside=hostile.parent, outside=elsewhere, tmp=tmp_path)
    _assert_refused(evidence["results"])
    assert_nothing_written_holds(tmp_path, elsewhere, OUTSIDE.encode())


@needs_strace
@pytest.mark.parametrize("case", [*NETCDF_CASES, "zarr-chunk"])
def test_a_hostile_capture_opens_no_outside_file_strace(tmp_path, work, ds, case):
    evidence, hostile, elsewhere = _capture_case(case, tmp_path, work, ds, under_strace=True)
    for source in ("strace", "audit"):
        assert_confined(evidence, source, inside=hostile.parent, outside=elsewhere, tmp=tmp_path)
    _assert_refused(evidence["results"])
    # the record holds the process's own reads of the input (HDF5 opening the file itself)
    assert any(_under(c["real"], os.path.realpath(hostile)) for c in evidence["strace"])
    assert_nothing_written_holds(tmp_path, elsewhere, OUTSIDE.encode())


def test_the_audit_hook_sees_a_chunk_read_through_a_symlink(tmp_path, work, ds):
    """With the store check switched off in the child, the symlinked chunk is read: the audit
    record names the outside file (so the test above can fail)."""
    evidence, hostile, elsewhere = _capture_case(
        "zarr-chunk", tmp_path, work, ds, under_strace=False, bypass="contained"
    )
    with pytest.raises(AssertionError, match="files outside the input were opened"):
        assert_confined(evidence, "audit", inside=hostile.parent, outside=elsewhere, tmp=tmp_path)


@needs_strace
def test_strace_sees_hdf5_read_external_storage(tmp_path, work, ds):
    """With the netCDF check switched off, HDF5 reads the token bytes from the outside file:
    strace's record names it (the audit hook cannot: HDF5 opens it in C)."""
    evidence, hostile, elsewhere = _capture_case(
        "nc-storage-absolute-token", tmp_path, work, ds, under_strace=True, bypass="contained"
    )
    secret = os.path.realpath(elsewhere / "secret.txt")
    assert any(c["real"] == secret for c in evidence["strace"]), evidence["results"]
    with pytest.raises(AssertionError, match="files outside the input were opened"):
        assert_confined(evidence, "strace", inside=hostile.parent, outside=elsewhere, tmp=tmp_path)


# --------------------------------------------------------------------------------------------
# hostile analysis folders: attncoda report, write_report


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return good_analysis_folder(tmp_path_factory.mktemp("good"))


def _report_case(
    good: Path, tmp: Path, work: Path, *, under_strace: bool, bypass: str | None = None
):
    folder = hostile_analysis_folder(good, tmp)
    spec = {
        "actions": [
            ["report", "cli", ["report", str(folder), "--force", "-q"]],
            ["write_report", "write_report", [str(folder)]],
        ],
        "cwd": str(folder),
        "bypass": bypass,
    }
    return opened_files.run(spec, work, under_strace=under_strace), folder


def test_a_hostile_analysis_folder_opens_no_outside_file(good, tmp_path, work):
    evidence, folder = _report_case(good, tmp_path, work, under_strace=False)
    assert evidence["results"]["report"] == "exit 0", evidence
    outside = tmp_path / "outside"
    assert_confined(evidence, "audit", inside=folder, outside=outside, tmp=tmp_path)
    assert_nothing_written_holds(tmp_path, outside, SECRET.encode())
    # the record is not empty of the folder: the report read its own files through it
    assert any(_under(e["real"], folder / "layers.csv") for e in evidence["events"])


@needs_strace
def test_a_hostile_analysis_folder_opens_no_outside_file_strace(good, tmp_path, work):
    evidence, folder = _report_case(good, tmp_path, work, under_strace=True)
    assert evidence["results"]["report"] == "exit 0", evidence
    outside = tmp_path / "outside"
    for source in ("strace", "audit"):
        assert_confined(evidence, source, inside=folder, outside=outside, tmp=tmp_path)
    assert any(_under(c["real"], folder / "layers.csv") for c in evidence["strace"])
    assert_nothing_written_holds(tmp_path, outside, SECRET.encode())


@pytest.mark.parametrize("under_strace", [False, pytest.param(True, marks=needs_strace)])
def test_the_evidence_sees_a_report_that_follows_symlinks(good, tmp_path, work, under_strace):
    """With ``O_NOFOLLOW`` switched off in the child, the report reads the outside files
    through the folder's symlinks: both records name them, and the page holds the secret."""
    evidence, folder = _report_case(
        good, tmp_path, work, under_strace=under_strace, bypass="nofollow"
    )
    outside = tmp_path / "outside"
    for source in ("audit", "strace") if under_strace else ("audit",):
        with pytest.raises(AssertionError, match="files outside the input were opened"):
            assert_confined(evidence, source, inside=folder, outside=outside, tmp=tmp_path)
    assert SECRET in (folder / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("under_strace", [False, pytest.param(True, marks=needs_strace)])
def test_a_symlink_swapped_for_a_folder_during_the_report_opens_no_outside_file(
    good, tmp_path, work, under_strace
):
    """A process swaps the folder ``sub`` with a symlink to the outside folder as fast as it
    can while the report reads ``sub/t.csv`` (listed 1000 times, its stamp forged)."""
    folder = raced_analysis_folder(good, tmp_path, reads=1000)
    outside = tmp_path / "outside"
    spec = {"actions": [["report", "cli", ["report", str(folder), "--force", "-q"]]]}
    toggler = subprocess.Popen(
        [sys.executable, "-c", SYMLINK_TOGGLER, str(folder), str(outside), "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert toggler.stdout is not None and toggler.stdout.readline().strip() == "go"
        evidence = opened_files.run({**spec, "cwd": str(tmp_path)}, work, under_strace=under_strace)
    finally:
        toggler.kill()
        toggler.wait(timeout=60)
    if not (folder / "sub").is_dir():  # killed mid-swap: put the folder back for the checks
        (folder / "sub").unlink(missing_ok=True)
        (folder / "sub.real").rename(folder / "sub")
    assert evidence["results"]["report"] == "exit 0", evidence
    # the report tried sub/t.csv while the swap ran: opens of sub are in the record
    tried = [e for e in evidence["events"] if e["path"].endswith(f"{os.sep}sub")]
    assert len(tried) >= 100, len(tried)
    for source in ("audit", "strace") if under_strace else ("audit",):
        assert_confined(evidence, source, inside=folder, outside=outside, tmp=tmp_path)
    assert SECRET not in (folder / "report.html").read_text(encoding="utf-8")
