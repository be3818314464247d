"""Every layer's full attention rows: attncoda against the tools a user would pick (issue #31).

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on *Pride and Prejudice*, every layer and
head (30 x 9), four sides that each hand back every head's ``T x T`` attention:

- ``attncoda rows``: ``capture(model, what="rows")`` around a plain SDPA forward (the model's
  outputs stay SDPA's); the dataset's ``log_attn`` is built before the clock stops;
- ``HF eager``: ``output_attentions=True`` with the eager attention implementation;
- ``nnsight`` (0.8.1): ``NNsight(model).trace`` of the eager model, every layer's
  ``self_attn.output[1]`` (the attention weights) saved;
- ``TransformerLens`` (4.3): ``TransformerBridge.boot_transformers(path, hf_model=...)`` over
  the same local weights, ``run_with_cache`` keeping every ``blocks.*.attn.hook_pattern``.

Each peer gets its own copy of the model, so no side's hooks or wrappers touch another's.

Time: one process, one thread (``_measure.one_thread``), every side warmed up on 64 tokens, then
interleaved with the order rotated every repeat (``_measure.interleave``), process CPU time
beside wall time, medians with min-max of :data:`REPEATS` samples (11 at T=512, 5 at 1024);
ratios are CPU-time ratios, flagged unreliable where
the wall-clock ratio disagrees by more than 20%. At T=2048 the first full-length call of each
side counts as a sample (3 in all), the shorter lengths have an untimed full-length warm-up.

Every timed call starts from the heap its own side leaves: glibc's free pages are given back
(``malloc_trim``) and, below T=2048, one untimed call of the same side runs first. A call
reuses the pages the call before it freed; which side ran before decided how many: HF eager at
T=512 took 1.57 CPU-s after its own call and 1.70 after a call that trimmed the heap (attncoda's
rows do, after their last layer), and its 30 arrays of 9.4 MB come from the heap, while at
T=2048 every side's large arrays are fresh mappings whatever ran before (glibc maps blocks
over 32 MB at most afresh), so the trim alone levels them there. attncoda's rows buffer is a
mapping of its own, which the trim leaves alone: a freed one is kept, mapped, for the next
capture (``attncoda.hooks.empty_cache``), as glibc keeps eager's arrays, so below T=2048 the
untimed call leaves it to the timed one, and at T=2048 (4.5 GB, over the 1 GiB kept at most)
every call maps its own.

Memory: peak extra RSS of one forward per side in a fresh process (``--child``), after a
64-token warm-up, sampled every 2 ms by ``bench_capture.PeakRSS``; the median of
:data:`MEMORY_REPEATS` processes per side and length (min-max beside it), the sides interleaved with their
order rotated every repeat: one process per side moved by 3-4% from run to run (glibc keeps
freed temporaries after its mmap threshold rises; at T=2048 one side gave 5.05 and 5.27 GB back
to back), more than the differences read. What is kept is 30 x 9 x T x T x 4 bytes. Every
memory child and the streamed T=4096 capture (``stream_to=``, rows larger than the machine's
memory: 18.1 GB) run after the timing, one at a time: on two cores a child beside the timing
process shares its caches and memory bandwidth, which moved a CPU-time ratio by 8% (T=512 gave
1.04x with three processes running and 0.961x in a run with fewer).

Same attention: before timing, every side's weights at T=512 are compared with HF eager's
(``exp(log_attn)`` for attncoda), the largest absolute difference reported.

Run: ``python benchmarks/bench_rows.py [--quick]`` or ``benchmarks/run --only bench_rows``;
``--quick`` is T=128, two repeats, no memory children and no streamed capture.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _measure import interleave, one_thread, row  # noqa: E402
from bench_capture import MODEL, PeakRSS, _tokens  # noqa: E402

SIDES = ("attncoda rows", "HF eager", "nnsight", "TransformerLens")
LENGTHS = (512, 1024, 2048)
#: timed samples per side and length: the shorter the call, the more samples (a T=512 call is
#: ~2.7 s, 72% of it the model's linear layers, which both sides share; five samples left the
#: median ratio within +-8% of parity from run to run: 0.954x, 1.05x, 1.076x)
REPEATS = {512: 11, 1024: 5, 2048: 3}
LONG = 4096
#: processes per side and length: one process at T=512 moves by 5-8% (on 2026-12-05, eight
#: each: attncoda 0.409-0.442 GB, HF eager 0.422-0.451), as much as the sides differ, so the
#: short lengths, whose processes take seconds, get more of them
MEMORY_REPEATS = {512: 9, 1024: 5, 2048: 3}


def _kept_gb(length: int) -> float:
    return 30 * 9 * length * length * 4 / 1e9


def _models(sides: tuple[str, ...]) -> dict[str, Any]:
    """One model (and the tokenizer) per side that needs its own: no side wraps another's."""
    import torch

    from attncoda.hooks import zoo

    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for side in sides:
        model, tokenizer = zoo.load(MODEL)
        out["tokenizer"] = tokenizer
        if side in ("HF eager", "nnsight"):
            model.set_attn_implementation("eager")
        if side == "nnsight":
            from nnsight import NNsight

            out[side] = NNsight(model)
        elif side == "TransformerLens":
            from transformer_lens.model_bridge import TransformerBridge

            # the local weights, not a hub download: the bridge wraps the loaded model
            out[side] = TransformerBridge.boot_transformers(
                model.name_or_path, hf_model=model, tokenizer=tokenizer
            )
        else:
            out[side] = model
    return out


def _side(side: str, model: Any, ids: Any, store: str | None = None) -> Callable[[], Any]:
    """A call that returns every layer's attention of ``ids`` along ``side`` (kept alive)."""
    import torch

    if side == "attncoda rows":
        from attncoda.hooks import capture

        def rows() -> Any:
            with torch.no_grad(), capture(model, what="rows", stream_to=store) as cap:
                model(input_ids=ids)
            return cap.dataset

        return rows
    if side == "HF eager":

        def eager() -> Any:
            with torch.no_grad():
                return model(input_ids=ids, output_attentions=True).attentions

        return eager
    if side == "nnsight":

        def nnsight() -> Any:
            saved: list[Any] = []
            with torch.no_grad():
                with model.trace(ids):
                    for layer in model.model.layers:
                        saved.append(layer.self_attn.output[1].save())
            return saved

        return nnsight
    if side == "TransformerLens":

        def lens() -> Any:
            with torch.no_grad():
                _, cache = model.run_with_cache(
                    ids, names_filter=lambda name: name.endswith("hook_pattern")
                )
            return cache

        return lens
    raise ValueError(side)


def _weights(side: str, got: Any) -> Any:
    """``(layer, head, query, key)`` attention probabilities of one side's result."""
    import numpy as np
    import torch

    if side == "attncoda rows":
        return np.exp(got.log_attn.values[0])
    if side == "TransformerLens":
        return torch.stack([got[f"blocks.{i}.attn.hook_pattern"][0] for i in range(30)]).numpy()
    return torch.stack([w[0] for w in got]).numpy()


def same_attention(models: dict[str, Any], length: int) -> dict[str, float]:
    """Largest ``|p - p_HF eager|`` of every side at ``length`` tokens."""
    import numpy as np

    ids = _tokens(models["tokenizer"], length)
    ref = _weights("HF eager", _side("HF eager", models["HF eager"], ids)())
    out = {}
    for side in SIDES:
        if side in models and side != "HF eager":
            got = _weights(side, _side(side, models[side], ids)())
            out[side] = float(np.abs(got - ref).max())
    return out


def time_sides(models: dict[str, Any], length: int, repeats: int | None = None) -> Any:
    """Interleaved CPU/wall times of every side at ``length`` tokens (after a 64-token
    warm-up), ``repeats`` samples each (default :data:`REPEATS` of the length, else 5)."""
    repeats = REPEATS.get(length, 5) if repeats is None else repeats
    ids = _tokens(models["tokenizer"], length)
    sides = [s for s in SIDES if s in models]
    for side in sides:  # one-time costs (imports, nnsight's tracing set-up) are not the sides'
        _side(side, models[side], ids[:, :64])()
    fns = {side: _side(side, models[side], ids) for side in sides}
    with one_thread():  # every call from its own side's heap (see the module's docstring)
        if length >= 2048:  # the first full-length call counts: 3 samples each in all
            return interleave(fns, min(repeats, 3), slow_s=0.0, before=_trim_heap)
        own = {side: functools.partial(_after_one_call, fn) for side, fn in fns.items()}
        return interleave(fns, repeats, before=_trim_heap, around=own)


def _trim_heap() -> None:
    """Give glibc's free pages back (nothing elsewhere): no call inherits another's heap."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform == "linux" else None
    if trim is not None:
        trim(0)


@contextlib.contextmanager
def _after_one_call(fn: Callable[[], Any]) -> Iterator[None]:
    """Untimed: one call of the same side first, so the timed call finds its own side's heap."""
    fn()
    yield


def _child(side: str, length: int, store: str | None) -> None:
    """In a fresh process: peak RSS growth (GB) and CPU/wall seconds of one call of ``side``."""
    import torch

    torch.set_num_threads(1)
    models = _models((side,))
    ids = _tokens(models["tokenizer"], length)
    warm = None if store is None else store.replace(".zarr", "-warm.zarr")
    _side(side, models[side], ids[:, :64], warm)()  # one-time costs are not the call's
    fn = _side(side, models[side], ids, store)
    with PeakRSS() as mem:
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        if store is not None:
            out = out.sizes  # a streamed capture is appended to its store when read
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    del out
    print(
        json.dumps({"side": side, "length": length, "gb": mem.growth_gb, "cpu": cpu, "wall": wall})
    )


def peak_memory(side: str, length: int, store: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--length", str(length)]
    if store:
        cmd += ["--store", store]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return {"side": side, "length": length, "error": tail}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _rotated(lengths: list[int]) -> list[tuple[str, int, str | None]]:
    """Memory jobs: every side :data:`MEMORY_REPEATS` times per length, the order rotated."""
    jobs: list[tuple[str, int, str | None]] = []
    for length in lengths:
        for rep in range(MEMORY_REPEATS.get(length, 3)):
            k = rep % len(SIDES)
            jobs += [(side, length, None) for side in SIDES[k:] + SIDES[:k]]
    return jobs


def _median_memory(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side at one length: the median growth of its processes, their min-max and count."""
    import statistics

    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    gbs = [r["gb"] for r in runs]
    return {**runs[0], "gb": statistics.median(gbs), "lo": min(gbs), "hi": max(gbs), "n": len(gbs)}


def _memory_rows(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows: each side's peak extra RSS (median of its processes) against HF eager's."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for m in found:
        runs.setdefault((m["side"], m["length"]), []).append(m)
    by = {key: _median_memory(group) for key, group in runs.items()}
    rows = []
    for (side, length), m in sorted(by.items(), key=lambda kv: (kv[0][1], SIDES.index(kv[0][0]))):
        if side == "HF eager" and not m.get("stream"):
            continue
        ref = by.get(("HF eager", length), {})
        gb, ref_gb = m.get("gb"), ref.get("gb")
        what = f"peak extra RSS, {side}, T={length} (kept {_kept_gb(length):.2f} GB)"
        if "n" in m and "n" in ref:
            what += (
                f", median of {m['n']} processes [{m['lo']:.3g}, {m['hi']:.3g}]; "
                f"HF eager [{ref['lo']:.3g}, {ref['hi']:.3g}]"
            )
        if m.get("stream"):
            what = (
                f"peak extra RSS, attncoda rows with stream_to=, T={length} "
                f"({_kept_gb(length):.1f} GB of rows on disk; {m.get('cpu', 0):.0f} CPU s)"
            )
            rows.append(
                {
                    "benchmark": what,
                    "project_s": gb,
                    "anchor": "GB; the rows it streamed (GB)",
                    "anchor_s": _kept_gb(length),
                    "ratio": None if gb is None else gb / _kept_gb(length),
                    "target": "bounded (<< the rows)",
                    "holds": None if gb is None else gb < 0.2 * _kept_gb(length),
                }
            )
            continue
        if "error" in m or "error" in ref:
            rows.append({"benchmark": f"{what}: failed: {m.get('error') or ref.get('error')}"})
            continue
        target = side == "attncoda rows"
        rows.append(
            {
                "benchmark": what,
                "project_s": gb,
                "anchor": "HF eager output_attentions=True, peak extra RSS (GB)",
                "anchor_s": ref_gb,
                "ratio": gb / ref_gb,
                "target": "<= 1x" if target else "(reported)",
                "holds": bool(gb <= ref_gb) if target else None,
            }
        )
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run``: time ratios of every side to HF eager, peak memory, the
    same-attention check and (full run) the streamed T=4096 capture."""
    lengths = (128,) if quick else LENGTHS
    repeats = 2 if quick else None
    found: list[dict[str, Any]] = []

    def memory(jobs: list[tuple[str, int, str | None]]) -> None:
        for side, length, store in jobs:
            m = peak_memory(side, length, store)
            m["stream"] = store is not None
            print(f"bench_rows memory: {json.dumps(m)}", file=sys.stderr, flush=True)
            found.append(m)

    tmp = tempfile.TemporaryDirectory(dir=os.path.expanduser("~"))
    out: list[dict[str, Any]] = []
    try:
        models = _models(SIDES)
        check = same_attention(models, 128 if quick else 512)
        for side, diff in check.items():
            print(f"bench_rows same attention: {side} {diff:.3g}", file=sys.stderr, flush=True)
            out.append(
                {
                    "benchmark": f"same attention: {side} vs HF eager, max |p - p_eager|, "
                    f"T={128 if quick else 512}, all 30x9 heads",
                    "project_s": diff,
                    "anchor": "(absolute probability)",
                    "anchor_s": None,
                    "ratio": None,
                    "target": "<= 1e-5",
                    "holds": diff <= 1e-5,
                }
            )
        for length in lengths:
            m = time_sides(models, length, repeats)
            for side in SIDES[1:] + SIDES[:1]:
                if side == "HF eager":
                    continue
                r = row(
                    f"{side}, every layer's attention, all 30x9 heads, T={length}",
                    m,
                    side,
                    "HF eager",
                    1.0 if side == "attncoda rows" else None,
                    anchor_label="HF eager output_attentions=True",
                )
                print(f"bench_rows time: {json.dumps(r, default=str)}", file=sys.stderr, flush=True)
                out.append(r)
        del models
        if not quick:  # alone, after the timing: see the module's docstring
            memory(_rotated(list(lengths)))
            memory([("attncoda rows", LONG, os.path.join(tmp.name, "rows.zarr"))])
    finally:
        tmp.cleanup()
    return out + _memory_rows(found)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="T=128, two repeats, no memory")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.length, args.store)
        return
    print(f"load at start {os.getloadavg()[0]:.1f}", file=sys.stderr)
    for r in run(args.quick):
        print(json.dumps(r, default=str))
    print(f"load at end {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
