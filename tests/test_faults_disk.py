"""A full disk, on a real small filesystem: a 2 MB tmpfs mounted for the test (root only; the
tests skip with that reason elsewhere). Each save runs in a child process, so that a crash
(HDF5 on ENOSPC used to end the process with SIGSEGV, exit 139) fails the test instead of
ending the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs needs root (the full-disk tests run as root in CI)")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``synthetic_rows`` of 1 and of 8 samples (4 layers, 4 heads, 64 tokens), made once in
    this process and pickled for the children: a child that made them itself imported torch
    for the core's kernels (2 of its 3.5 CPU-s; ten children in this file)."""
    import pickle

    import attncoda as ac

    folder = tmp_path_factory.mktemp("rows")
    paths = {}
    for n in ("1", "8"):
        ds = ac.testing.synthetic_rows(n_samples=int(n), n_layers=4, n_heads=4, length=64)
        paths[n] = str(folder / f"rows{n}.pickle")
        with open(paths[n], "wb") as fh:
            pickle.dump(ds, fh)
    return paths


_SAVE = """
    import gc, pickle, sys
    import attncoda as ac
    from attncoda import _atomic
    from attncoda import _data
    target, rows, bypass = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if bypass:  # the disk fills after the check: what HDF5 met before it crashed
        _atomic.check_free_space = lambda *a, **k: None
    if len(sys.argv) > 4 and sys.argv[4] == "large":  # files above the in-memory budget:
        _data._memory_budget = lambda: 0  # HDF5 writes to the disk itself
    with open(rows, "rb") as fh:
        ds = pickle.load(fh)
    try:
        ac.save(ds.assign_attrs(tag="new"), target, overwrite=True)
        print("saved")
        back = ac.load(target)
        print("same" if back.identical(ds.assign_attrs(tag="new")) else "differs")
    except ac.OutputError as exc:
        print("refused:", exc)
    except OSError as exc:
        print("oserror:", exc.errno)
    gc.collect()  # the half-closed HDF5 file crashed here
    print("alive")
"""


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".attncoda" in p.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x.nc", "x.zarr"])
def test_a_save_larger_than_the_disk_is_refused_or_fails_cleanly(small_disk, rows, name) -> None:
    target = small_disk / name
    run = _child(_SAVE, str(target), rows["8"], "0")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "alive" in run.stdout
    if name.endswith(".nc"):  # checked before the write: nothing was written
        assert "refused:" in run.stdout and "MB free" in run.stdout, run.stdout
    else:  # zarr compresses: it may fit; if not, its error is a plain OSError
        assert "saved" in run.stdout or "oserror: 28" in run.stdout, run.stdout
    assert _leftovers(small_disk) == []


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_a_disk_that_fills_during_an_nc_write_is_a_clean_oserror(small_disk, rows) -> None:
    target = small_disk / "x.nc"
    first = _child(_SAVE, str(target), rows["1"], "0")
    assert "saved" in first.stdout, first.stderr[-2000:]
    before = target.read_bytes()
    run = _child(_SAVE, str(target), rows["8"], "1")  # the check is skipped: the disk fills
    assert run.returncode == 0, f"the process crashed (exit {run.returncode}): {run.stderr[-800:]}"
    assert "oserror: 28" in run.stdout and "alive" in run.stdout, run.stdout
    assert target.read_bytes() == before  # the old file, untouched
    assert _leftovers(small_disk) == []


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
@pytest.mark.parametrize("path", ["memory", "large"])
def test_both_nc_write_paths_survive_a_disk_that_fills(small_disk, rows, path) -> None:
    """Files above half the available memory are written by HDF5 itself (``large``; forced
    here with a budget of 0): through a file object whose failed write HDF5 never sees, so a
    full disk is the same clean OSError as on the in-memory path, the old file kept."""
    target = small_disk / "x.nc"
    first = _child(_SAVE, str(target), rows["1"], "0", path)
    assert "saved" in first.stdout and "same" in first.stdout, first.stderr[-2000:]
    before = target.read_bytes()
    run = _child(_SAVE, str(target), rows["8"], "1", path)  # the check is skipped: the disk fills
    assert run.returncode == 0, f"the process crashed (exit {run.returncode}): {run.stderr[-800:]}"
    assert "oserror: 28" in run.stdout and "alive" in run.stdout, run.stdout
    assert target.read_bytes() == before
    assert _leftovers(small_disk) == []
    refused = _child(_SAVE, str(target), rows["8"], "0", path)  # with the check: refused before
    assert "refused:" in refused.stdout and "MB free" in refused.stdout, refused.stdout
    assert target.read_bytes() == before and _leftovers(small_disk) == []


def test_the_large_nc_path_writes_the_same_file_content(tmp_path) -> None:
    """The file-object write gives a file that loads identical to the in-memory path's."""
    import attncoda as ac
    from attncoda import _data

    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=4, length=32)
    ac.save(ds, tmp_path / "memory.nc")
    budget = _data._memory_budget
    try:
        _data._memory_budget = lambda: 0
        ac.save(ds, tmp_path / "large.nc")
    finally:
        _data._memory_budget = budget
    assert ac.load(tmp_path / "large.nc").identical(ac.load(tmp_path / "memory.nc"))
    assert ac.load(tmp_path / "large.nc").identical(ds)


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_the_cli_on_a_full_disk_exits_1_in_one_line(small_disk, tmp_path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the river ran past the old mill and the miller sang. " * 40)
    # leave about 40 KB free: the capture's file cannot fit
    filler = small_disk / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * (2 * 1024 * 1024 - 40 * 1024))
    out = small_disk / "cap.nc"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attncoda",
            "capture",
            "twin:llama",
            str(text),
            "--what",
            "rows",
            "--passages",
            "4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    errors = [x for x in run.stderr.splitlines() if x.startswith("attncoda: error: ")]
    assert run.returncode == 2, (run.returncode, run.stderr[-1500:])  # an output error
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-1500:]
    assert "MB free" in errors[0]
    assert not out.exists() and _leftovers(small_disk) == []
