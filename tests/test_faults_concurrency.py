"""Two processes writing one target: appends and replacements take the target's advisory lock
(``.NAME.attncoda.lock`` beside it, :func:`attncoda._atomic.target_lock`), so the second writer
waits for the first and never corrupts the store; a writer that waits too long gets one clear
error. Every test here runs real processes on real files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import attncoda as ac
from attncoda import _atomic

ROOT = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import sys, time
    import attncoda as ac
    target, mode, rounds, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    while time.time() < start_at:  # both children start their writes together
        time.sleep(0.001)
    for i in range(rounds):
        if mode == "append":
            ac.save(ds, target, append=True)
        else:
            ac.save(ds.assign_attrs(tag=f"{sys.argv[5]}-{i}"), target, overwrite=True)
    print("done", flush=True)
    """
)


def _children(target: Path, mode: str, rounds: int) -> list[tuple[int, str, str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start_at = time.time() + 8.0  # time for both interpreters to import attncoda
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(target), mode, str(rounds), str(start_at), tag],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for tag in ("a", "b")
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append((p.returncode, stdout, stderr))
    return out


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".attncoda" in p.name)


@pytest.mark.slow
def test_two_processes_appending_to_one_store_leave_every_sample_once(tmp_path: Path) -> None:
    target = tmp_path / "runs.zarr"
    results = _children(target, "append", 4)
    for code, _, err in results:
        assert code == 0, err
    ds = ac.load(target)  # would refuse repeated sample numbers
    assert ds.sizes["sample"] == 2 * 4 * 2
    assert sorted(ds["sample"].values.tolist()) == list(range(16))
    assert _leftovers(tmp_path) == []  # no lock file, no staging folder left


@pytest.mark.slow
@pytest.mark.parametrize("name", ["runs.zarr", "runs.nc"])
def test_two_processes_replacing_one_target_take_turns(tmp_path: Path, name: str) -> None:
    target = tmp_path / name
    ac.save(ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6), target)
    results = _children(target, "overwrite", 4)
    for code, _, err in results:
        assert code == 0, err  # each replacement waits for the other: no raw error
    assert ac.load(target).attrs["tag"] in {"a-3", "b-3"}
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_processes_creating_one_target_give_one_winner_and_a_clear_error(tmp_path):
    target = tmp_path / "new.nc"
    script = textwrap.dedent(
        """
        import sys, time
        import attncoda as ac
        ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
        while time.time() < float(sys.argv[2]):
            time.sleep(0.001)
        try:
            ac.save(ds, sys.argv[1], overwrite=True)
        except ac.OutputExistsError as exc:
            print("refused:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start_at = str(time.time() + 8.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(target), start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    refused = [o for o, _ in outs if o.startswith("refused:")]
    # both may succeed one after the other (the second found the first's file, which it may
    # replace), or the second is refused in one line: never a raw error, never a torn file
    for line in refused:
        assert "appeared while attncoda was writing it" in line or "exists" in line
    ac.load(target)
    assert _leftovers(tmp_path) == []


def test_a_writer_that_waits_too_long_gets_one_clear_error(tmp_path, monkeypatch) -> None:
    target = tmp_path / "runs.zarr"
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    ac.save(ds, target)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from attncoda import _atomic\n"
            "with _atomic.target_lock(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(target),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(_atomic, "LOCK_WAIT_S", 0.3)
        for kwargs in ({"append": True}, {"overwrite": True}):
            with pytest.raises(
                ac.OutputError, match=rf"another attncoda process \(pid {holder.pid}\)"
            ):
                ac.save(ds, target, **kwargs)
        assert ac.load(target).sizes["sample"] == 2  # nothing appended, nothing replaced
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed while holding it: its lock is free again (flock dies with it)
    ac.save(ds, target, append=True)
    assert ac.load(target).sizes["sample"] == 4
    assert _leftovers(tmp_path) == []


def test_a_lock_file_attncoda_did_not_create_is_refused_and_kept(tmp_path) -> None:
    target = tmp_path / "runs.zarr"
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    ac.save(ds, target)
    mine = tmp_path / ".runs.zarr.attncoda.lock"
    mine.write_text("my notes")
    with pytest.raises(ac.OutputError, match="attncoda did not create it"):
        ac.save(ds, target, append=True)
    assert mine.read_text() == "my notes"
    assert ac.load(target).sizes["sample"] == 2


def test_the_lock_is_reentrant_and_removed_after_use(tmp_path) -> None:
    target = tmp_path / "x.nc"
    with _atomic.target_lock(target), _atomic.target_lock(target):
        assert (tmp_path / ".x.nc.attncoda.lock").read_bytes().startswith(b"attncoda lock ")
    assert not (tmp_path / ".x.nc.attncoda.lock").exists()
    # an append that creates the store takes the lock once and the swap re-enters it
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=3, length=4)
    ac.save(ds, tmp_path / "y.zarr", append=True)
    assert np.array_equal(ac.load(tmp_path / "y.zarr")["sample"].values, [0])


# --------------------------------------------------------------------------------------------
# two streamed captures to one new store (issue #48): the first owns it for its whole block

_STREAMER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from attncoda.hooks import CaptureError, capture, zoo

    store, sync, me, other, seed = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:6]
    model = zoo.tiny_twin("llama")  # 2 layers, 4 heads, no download
    batch = zoo.tiny_batch(model, length=8, seed=int(seed))

    def wait_for(*names):
        end = time.monotonic() + 300
        while time.monotonic() < end:
            for name in names:
                if (sync / name).exists():
                    return name
            time.sleep(0.005)
        raise SystemExit(f"{me}: no {names} after 300 s")

    # a barrier: both processes are set up before either claims the store
    (sync / f"ready-{me}").touch()
    wait_for(f"ready-{other}")
    try:
        with capture(model, stream_to=store) as cap:
            (sync / f"won-{me}").touch()
            # hold the block open until the other has tried (or has entered its own block:
            # the failure this test is for, reported instead of waiting forever)
            both = wait_for(f"tried-{other}", f"won-{other}") == f"won-{other}"
            with torch.no_grad():
                model(**batch)
        data = {name: cap.dataset[name].values.tolist() for name in cap.dataset.data_vars}
        print(json.dumps({"outcome": "won", "both": both, "data": data}))
    except CaptureError as exc:
        (sync / f"tried-{me}").touch()
        print(json.dumps({"outcome": "refused", "message": str(exc)}))
    """
)


@pytest.mark.slow
def test_two_processes_streaming_to_one_new_store_give_one_owner(tmp_path: Path) -> None:
    """Two real processes start ``capture(model, stream_to=SAME)`` together (a file barrier);
    the one that claims the store holds its block open until the other has tried: exactly one
    captures, the other is refused at setup in one line, and the store holds only the
    winner's samples. (They used to merge silently, both exiting 0.)"""
    pytest.importorskip("transformers")
    store, sync = tmp_path / "out" / "s.zarr", tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {
        me: subprocess.Popen(
            [sys.executable, "-c", _STREAMER, str(store), str(sync), me, other, seed],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for me, other, seed in (("a", "b", "1"), ("b", "a", "2"))
    }
    results = {}
    for me, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        results[me] = json.loads(out.strip().splitlines()[-1])
    outcomes = sorted(r["outcome"] for r in results.values())
    brief = {me: {k: v for k, v in r.items() if k != "data"} for me, r in results.items()}
    assert outcomes == ["refused", "won"], brief
    winner = next(r for r in results.values() if r["outcome"] == "won")
    loser = next(me for me, r in results.items() if r["outcome"] == "refused")
    assert not winner["both"], "both processes were inside a capture of the store at once"
    message = results[loser]["message"]
    assert "another capture is streaming" in message and "\n" not in message
    assert not (sync / f"won-{loser}").exists()  # refused at setup: its block never ran
    stored = ac.load(store)
    assert stored.sizes["sample"] == 2  # the winner's samples only, value for value
    assert sorted(stored.data_vars) == sorted(winner["data"])
    for name, values in winner["data"].items():
        assert json.dumps(stored[name].values.tolist()) == json.dumps(values), name
    assert _leftovers(store.parent) == [] and sorted(os.listdir(store.parent)) == ["s.zarr"]
