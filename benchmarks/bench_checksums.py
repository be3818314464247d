"""What the per-chunk checksums cost: save and load of a ~100 MB capture, with and without them.

With: :func:`attncoda.save` as it is (CRC32C per zarr chunk, fletcher32 per HDF5 chunk; a
zarr :func:`attncoda.load` decodes every chunk once more to check it). Without: the same
calls with the checksum encoding switched off. Runs are interleaved (with, without, with, ...);
medians of wall and process CPU time; the load average is printed (the machine is shared).

Run: ``python benchmarks/bench_checksums.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import attncoda as ac
from attncoda import _data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import clock


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, cpu) seconds of one call, by ``benchmarks/_measure.py``'s clock."""
    cpu, wall = clock(fn)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ds = ac.testing.synthetic_rows(n_samples=20, n_layers=4, n_heads=8, length=200)
    print(f"dataset: {ds.nbytes / 1e6:.0f} MB; load average {os.getloadavg()[0]:.1f}")
    root = Path(tempfile.mkdtemp())
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.repeats):
            for mode in ("with", "without"):
                off = mock.patch.object(_data, "_checksum_encoding", lambda ds, fmt: {})
                for fmt in ("zarr", "nc"):
                    path = root / f"c.{fmt}"
                    shutil.rmtree(path, ignore_errors=True)
                    path.unlink(missing_ok=True)
                    if mode == "without":
                        off.start()
                    try:
                        results.setdefault((fmt, mode, "save"), []).append(
                            _timed(lambda p=path: ac.save(ds, p))
                        )
                        results.setdefault((fmt, mode, "load"), []).append(
                            _timed(lambda p=path: ac.load(p)["log_attn"].values)
                        )
                    finally:
                        if mode == "without":
                            off.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("format  step  without: wall / cpu s   with: wall / cpu s   ratio (wall)")
    for fmt in ("zarr", "nc"):
        for step in ("save", "load"):
            a = results[(fmt, "without", step)]
            b = results[(fmt, "with", step)]
            aw, ac_ = statistics.median(x[0] for x in a), statistics.median(x[1] for x in a)
            bw, bc = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
            print(
                f"{fmt:6}  {step}  {aw:6.2f} / {ac_:6.2f}          {bw:6.2f} / {bc:6.2f}"
                f"         {bw / aw:5.2f}"
            )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
