"""What the all-or-nothing append costs: ``ac.save(ds, store, append=True)`` onto a ~100 MB zarr
capture, this tree's code against the commit before the undo was added (issue #48).

Since commit 4cc7be0 an append first keeps what it may change (the store's metadata files and
every array's last chunk along ``sample``, one walk over the store's files) so that a failed
append can be taken back. This script times the append with this tree's ``attncoda`` and with
the code of the commit before it (``--old``, default ``4cc7be0^``), and with the undo's own
commit (``--also``, default ``4cc7be0``: its only change from ``--old`` is the undo; this tree
also holds the other checks of #48, such as the walk that refuses symlinks in a store), each
taken with ``git archive`` into a temporary folder (nothing in the repository changes).

Each timed append runs in a fresh interpreter on a fresh copy of the same store (the copy is
not timed); the sides are interleaved and their order rotates every round. The store
holds 38 samples of 4 layers, 8 heads and 200 tokens with rows (~100 MB on disk, compressed).
Two sizes are appended: one pass of 2 samples (what a streamed capture appends) and 20 samples
(~55 MB on disk). Reported: medians over the rounds of wall and process CPU seconds
(``time.process_time``, all threads), and the load average at the start and the end (the
machine may be shared).

Each round also times the undo's own part alone (``attncoda._data._AppendUndo`` on a fresh
copy, in a fresh interpreter): what it costs whatever the noise of the append around it.

Run: ``python benchmarks/bench_append.py [--rounds 5] [--old REV]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SHAPE = {"n_layers": 4, "n_heads": 8, "length": 200}

# One timed append in a fresh interpreter: the dataset is built before the clock starts.
_CHILD = """
import json, sys, time
import attncoda as ac
store, n = sys.argv[1], int(sys.argv[2])
shape = json.loads(sys.argv[3])
ds = ac.testing.synthetic_rows(n_samples=n, seed=7, **shape)
c0, w0 = time.process_time(), time.perf_counter()
ac.save(ds, store, append=True)
w1, c1 = time.perf_counter(), time.process_time()
print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0, "file": ac.__file__}))
"""


# The undo's own part, alone (this tree's code): what it reads before the append.
_UNDO = """
import json, sys, time
import attncoda as ac
from attncoda import _data
store, n_old = sys.argv[1], int(sys.argv[2])
from pathlib import Path
c0, w0 = time.process_time(), time.perf_counter()
undo = _data._AppendUndo(Path(store), n_old)
w1, c1 = time.perf_counter(), time.process_time()
kept = sum(len(b) for b in undo.saved.values())
print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0, "files": len(undo.saved), "bytes": kept,
                  "file": ac.__file__}))
"""


def _old_tree(rev: str, into: Path) -> str:
    """Extract ``attncoda/`` at ``rev`` into ``into``; return the full commit."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "attncoda"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return commit


def _append(code: Path, store: Path, n: int) -> dict[str, float]:
    return _child(code, [_CHILD, str(store), str(n), json.dumps(SHAPE)])


def _child(code: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run(
        [sys.executable, "-c", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(code),
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(code.resolve()), result["file"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old", default="4cc7be0^", help="the commit before the undo (git rev)")
    ap.add_argument(
        "--also",
        default="4cc7be0",
        help="another commit timed beside them ('' for none): by default the undo's own commit, "
        "whose only change from --old is the undo (this tree also holds other #48 checks)",
    )
    ap.add_argument("--sizes", default="2,20", help="samples appended, comma-separated")
    ap.add_argument("--base", type=int, default=38, help="samples in the store (38: ~100 MB)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    root = Path(tempfile.mkdtemp(prefix="bench_append."))
    try:
        old = root / "old"
        old.mkdir()
        commit = _old_tree(args.old, old)
        sides = {"new": ROOT, "old": old}
        if args.also:
            (root / "also").mkdir()
            also = _old_tree(args.also, root / "also")
            sides[args.also] = root / "also"
            print(f"also timed: {args.also} = {also[:7]}", flush=True)
        sys.path.insert(0, str(ROOT))
        import attncoda as ac

        base = ac.save(
            ac.testing.synthetic_rows(n_samples=args.base, seed=3, **SHAPE), root / "base.zarr"
        )
        mb = sum(p.stat().st_size for p in base.rglob("*") if p.is_file()) / 1e6
        files = sum(1 for p in base.rglob("*") if p.is_file())
        load0 = os.getloadavg()
        print(
            f"store: {mb:.0f} MB on disk, {files} files, {args.base} samples; "
            f"old = {commit[:7]} ({args.old}); load average {load0[0]:.2f} {load0[1]:.2f}",
            flush=True,
        )
        results: dict[tuple[int, str], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for n in sizes:
                names = list(sides)
                order = names[r % len(names) :] + names[: r % len(names)]  # rotates each round
                for side in order:
                    work = root / "work.zarr"
                    shutil.rmtree(work, ignore_errors=True)
                    shutil.copytree(base, work)
                    got = _append(sides[side], work, n)
                    results.setdefault((n, side), []).append(got)
                    print(
                        f"round {r + 1} append {n:2d} {side}: wall {got['wall']:.3f} s, "
                        f"cpu {got['cpu']:.3f} s; load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
            work = root / "work.zarr"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(base, work)
            got = _child(ROOT, [_UNDO, str(work), str(args.base)])
            results.setdefault((0, "undo"), []).append(got)
            print(
                f"round {r + 1} the undo alone: wall {got['wall']:.3f} s, cpu {got['cpu']:.3f} "
                f"s (keeps {got['files']} files, {got['bytes'] / 1e6:.1f} MB)",
                flush=True,
            )
        load1 = os.getloadavg()
        print(f"\nmedians of {args.rounds} rounds (load average {load0[0]:.2f} -> {load1[0]:.2f})")
        print("appended    side      wall s (min-max)          cpu s (min-max)      cpu / old")
        for n in sizes:
            old_cpu = statistics.median(x["cpu"] for x in results[(n, "old")])
            for side in sides:
                walls = [x["wall"] for x in results[(n, side)]]
                cpus = [x["cpu"] for x in results[(n, side)]]
                cpu = statistics.median(cpus)
                print(
                    f"{n:2d} samples  {side:8}  {statistics.median(walls):6.3f} "
                    f"({min(walls):.3f}-{max(walls):.3f})   {cpu:6.3f} "
                    f"({min(cpus):.3f}-{max(cpus):.3f})   {cpu / old_cpu:6.3f}"
                )
        undo = results[(0, "undo")]
        print(
            f"the undo alone (new code, before an append): wall "
            f"{statistics.median(x['wall'] for x in undo):.3f} s, cpu "
            f"{statistics.median(x['cpu'] for x in undo):.3f} s"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
