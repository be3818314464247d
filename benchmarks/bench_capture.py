"""Capture benchmark: summaries capture vs the plain SDPA forward vs HF eager attentions.

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on real Austen text, and Qwen2.5-Coder-1.5B
(28 layers x 12 heads over 2 KV heads, fp32) at T = 1024 and 2048 when it is fetched
(``attncoda fetch qwen2.5-coder-1.5b``; one timed repeat each, after a short warm-up: a 1.5B
forward at 2048 tokens takes about a minute on 2 cores). Time ratios are
measured in one process, alternating the paths, medians of ``--repeats``; peak memory is the
peak extra RSS of one forward in a fresh subprocess per path (so one path's allocator state
cannot hide another's): after a warm-up forward on 64 tokens and ``gc.collect()``, a background
thread samples ``/proc/self/statm`` (resident pages x page size) every ~2 ms during the forward,
and the peak minus the RSS just before the forward is reported, in GB (10^9 bytes).
(``ru_maxrss`` cannot be used: loading the model already set a higher peak than most forwards
reach, so its growth read 0.) For scale: HF eager attentions at T=2048 hold
30 x 9 x 2048^2 x 4 B = 4.5 GB.

Run: ``python benchmarks/bench_capture.py [--length 2048] [--repeats 3] [--long 8192]``;
``--quick`` is ``--length 512 --repeats 1`` (a smoke run, as ``benchmarks/run --quick``).
On a GPU, ``benchmarks/gpu_check`` measures time and GPU memory at realistic sizes. Every
layer's full rows against HF eager, nnsight and TransformerLens: ``bench_rows.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import clocked, interleave, interleave_reliable, one_thread, row

MODEL = "smollm2-135m"
QWEN = "qwen2.5-coder-1.5b"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """Resident set size of this process now (``/proc/self/statm``), or None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return None


class PeakRSS:
    """Peak RSS growth during a ``with`` block, sampled by a background thread (no dependencies).

    On entry: ``gc.collect()``, then ``before`` = RSS. A daemon thread samples RSS every
    ``interval`` seconds (torch kernels release the GIL, so it runs during the forward); the block
    may call :meth:`sample` itself, and exit samples once more (while the block's results are
    still alive). ``growth_gb`` = (peak - before) / 1e9, or None where ``/proc`` is missing.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.before: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        now = rss_bytes()
        if now is not None and self.peak is not None:
            self.peak = max(self.peak, now)

    def _loop(self) -> None:
        with open("/proc/self/statm", "rb", buffering=0) as f:
            while not self._stop.wait(self.interval):
                f.seek(0)
                now = int(f.read().split()[1]) * _PAGE
                if self.peak is not None and now > self.peak:
                    self.peak = now

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.before = self.peak = rss_bytes()
        if self.before is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def growth_gb(self) -> float | None:
        if self.before is None or self.peak is None:
            return None
        return (self.peak - self.before) / 1e9


def _tokens(tokenizer: Any, length: int) -> Any:
    from attncoda.hooks import assets

    text = assets.load_text("austen", "prideprejudice")
    ids = tokenizer(text[: length * 8], return_tensors="pt").input_ids[:, :length]
    if ids.shape[1] < length:
        raise SystemExit(f"not enough text for {length} tokens")
    return ids


def _paths(model: Any, ids: Any) -> dict[str, Any]:
    import torch

    from attncoda.hooks import capture

    # each path returns what it computed, so a memory measurement can sample while it is alive
    def sdpa() -> Any:
        with torch.no_grad():
            return model(input_ids=ids)

    def summaries() -> Any:
        with torch.no_grad(), capture(model, what="summaries") as cap:
            out = model(input_ids=ids)
        return out, cap.dataset

    def eager() -> Any:
        model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                return model(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation("sdpa")

    return {"sdpa": sdpa, "summaries": summaries, "eager_output_attentions": eager}


def _load(name: str = MODEL) -> tuple[Any, Any]:
    import torch

    from attncoda.hooks import zoo

    torch.manual_seed(0)
    return zoo.load(name)


def time_paths(
    length: int,
    repeats: int,
    include_eager: bool = True,
    model_name: str = MODEL,
    warmup_length: int | None = None,
) -> dict[str, float]:
    """Median CPU seconds per path, interleaved in one process (``benchmarks/_measure.py``).

    The warm-up runs every path once at ``warmup_length`` tokens (default: ``length``).
    """
    model, tokenizer = _load(model_name)
    ids = _tokens(tokenizer, length)
    paths = _paths(model, ids)
    if not include_eager:
        paths.pop("eager_output_attentions")
    warm = _paths(model, ids[:, :warmup_length]) if warmup_length else paths
    measured = interleave(paths, repeats, warmups={name: warm[name] for name in paths})
    return {name: measured[name].cpu_median for name in paths}


def _peak_child(path: str, length: int) -> None:
    """Run in a subprocess: print the peak RSS growth (GB) of one forward along ``path``."""
    model, tokenizer = _load()
    ids = _tokens(tokenizer, length)
    _paths(model, ids[:, :64])[path]()  # warm-up: one-time costs are not the path's
    fn = _paths(model, ids)[path]
    with PeakRSS() as mem:
        out, _, elapsed = clocked(fn)
    del out
    print(
        json.dumps(
            {"path": path, "length": length, "rss_growth_gb": mem.growth_gb, "seconds": elapsed}
        )
    )


def peak_memory(path: str, length: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", path, "--length", str(length)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
    )
    if out.returncode != 0:
        return {"path": path, "length": length, "error": out.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


#: the lengths of the summaries-vs-SDPA rows (#51: at most 1.1x the plain forward at each)
LENGTHS = (512, 1024, 2048, 4096, 8192)
#: HF eager's weights of every layer at T=4096 take 30 x 9 x 4096^2 x 4 B = 18 GB: not run above
EAGER_MAX = 2048
SUMMARIES_TARGET = 1.1


def _summaries_exact(model: Any, ids: Any) -> Any:
    """Summaries with ``exact_outputs=True``: the model's own SDPA kernel for every layer plus
    the summaries' own fused SDPA call (the route before summaries came in one pass)."""
    import torch

    from attncoda.hooks import capture

    with torch.no_grad(), capture(model, what="summaries", exact_outputs=True) as cap:
        out = model(input_ids=ids)
    return out, cap.dataset


def length_rows(length: int, repeats: int, model: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Summaries (one pass), summaries with ``exact_outputs=True`` (two attention calls a
    layer) and, up to :data:`EAGER_MAX`, HF eager's weights, each against the plain SDPA
    forward at ``length`` tokens: interleaved, one thread, CPU time beside wall (``_measure``);
    warm-ups on 256 tokens."""
    ids = _tokens(tokenizer, length)
    paths = _paths(model, ids)
    paths["summaries_exact_outputs"] = lambda: _summaries_exact(model, ids)
    if length > EAGER_MAX:
        paths.pop("eager_output_attentions")
    short = _paths(model, ids[:, :256])
    short["summaries_exact_outputs"] = lambda: _summaries_exact(model, ids[:, :256])
    pairs = [(name, "sdpa", 1.0) for name in paths if name != "sdpa"]
    with one_thread():
        m = interleave_reliable(paths, repeats, pairs, warmups={n: short[n] for n in paths})
    rows = [
        row(
            f"capture summaries (one pass), all 30x9 heads, T={length}",
            m,
            "summaries",
            "sdpa",
            SUMMARIES_TARGET,
            anchor_label="plain SDPA forward",
        ),
        row(
            f"capture summaries, exact_outputs=True (model's kernel + SDPA summaries), T={length}",
            m,
            "summaries_exact_outputs",
            "sdpa",
            None,
            anchor_label="plain SDPA forward",
        ),
    ]
    if "eager_output_attentions" in paths:
        rows.append(
            row(
                f"HF eager output_attentions=True, T={length} (reference)",
                m,
                "eager_output_attentions",
                "sdpa",
                None,
                anchor_label="plain SDPA forward",
            )
        )
    return rows


def _one_pass_without_kernel(capture_mod: Any, native_mod: Any, ctx: Any, pos: Any, v: Any) -> Any:
    """The one pass on torch's ops, as without a C compiler (``ATTNCODA_NATIVE=0``)."""
    kernel = native_mod.softmax_entropy_rows
    native_mod.softmax_entropy_rows = lambda: None
    try:
        return capture_mod._one_pass_summaries(ctx, pos, 256, v)
    finally:
        native_mod.softmax_entropy_rows = kernel


def attention_rows(length: int, repeats: int) -> list[dict[str, Any]]:
    """One layer's attention alone, SmolLM2's shape (9 heads over 3 KV heads expanded, head
    size 64, causal, batch 1, random q/k/v): the summaries in one pass (output included) and the
    route of ``exact_outputs=True`` (the model's SDPA call plus the summaries' own), each against
    the plain SDPA call. With the forward rows above, this says how far each route can be from
    the plain forward: the attention's share of the forward times its ratio here."""
    import torch

    from attncoda.hooks import _capture, _native

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 9, length, 64) for _ in range(3))
    ctx = _capture._LayerContext(
        q=q,
        k=k,
        mask=None,
        offset=0,
        scale=0.125,
        softcap=None,
        sliding=None,
        causal=True,
        sinks_logit=None,
        sink_index=torch.zeros(1, dtype=torch.long),
    )
    pos = torch.arange(length)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sides = {
        "sdpa": lambda: sdpa(q, k, v, is_causal=True),
        "one_pass": lambda: _capture._one_pass_summaries(ctx, pos, 256, v),
        "one_pass_torch_ops": lambda: _one_pass_without_kernel(_capture, _native, ctx, pos, v),
        "two_calls": lambda: (
            sdpa(q, k, v, is_causal=True),
            _capture._fast_summaries(ctx, pos, 256),
        ),
    }
    with one_thread():
        m = interleave_reliable(
            sides,
            repeats,
            [
                ("one_pass", "sdpa", 1.0),
                ("one_pass_torch_ops", "sdpa", 1.0),
                ("two_calls", "sdpa", 1.0),
            ],
        )
    label = "plain SDPA call, one layer (9 heads, d=64, causal)"
    return [
        row(
            f"one layer's attention: summaries in one pass, T={length}",
            m,
            "one_pass",
            "sdpa",
            None,
            anchor_label=label,
        ),
        row(
            f"one layer's attention: one pass with torch's ops (no compiled kernel), T={length}",
            m,
            "one_pass_torch_ops",
            "sdpa",
            None,
            anchor_label=label,
        ),
        row(
            f"one layer's attention: SDPA + the summaries' SDPA call, T={length}",
            m,
            "two_calls",
            "sdpa",
            None,
            anchor_label=label,
        ),
    ]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for the benchmark table (keys: benchmark, project_s, anchor, anchor_s, ratio, target, holds)."""
    model, tokenizer = _load()
    rows: list[dict[str, Any]] = []
    for length in (512,) if quick else LENGTHS:
        rows += length_rows(length, 1 if quick else (3 if length <= 2048 else 2), model, tokenizer)
    del model
    for length in (512,) if quick else LENGTHS:
        rows += attention_rows(length, 3 if quick or length <= 2048 else 5)
    if not quick:
        rows += qwen_rows()
        length = 2048
        for path in ("sdpa", "summaries", "eager_output_attentions"):
            mem = peak_memory(path, length)
            rows.append(
                {
                    "benchmark": f"peak extra RSS during the forward, {path}, T={length}",
                    "project_s": mem.get("seconds"),
                    "anchor": "GB",
                    "anchor_s": mem.get("rss_growth_gb"),
                    "ratio": None,
                    "target": "summaries ~ sdpa",
                    "holds": None,
                }
            )
    return rows


def qwen_rows(lengths: tuple[int, ...] = (1024, 2048)) -> list[dict[str, Any]]:
    """Summaries capture and HF eager vs SDPA on Qwen2.5-Coder-1.5B (skipped if not fetched)."""
    from attncoda.hooks import assets

    if not assets.is_fetched(QWEN):
        return [
            {
                "benchmark": f"capture summaries, Qwen2.5-1.5B: skipped (`attncoda fetch {QWEN}`)",
                "project_s": None,
                "anchor": "plain SDPA forward",
                "anchor_s": None,
                "ratio": None,
                "target": "<= 1.5x at T=2048",
                "holds": None,
            }
        ]
    rows: list[dict[str, Any]] = []
    for length in lengths:
        t = time_paths(length, repeats=1, model_name=QWEN, warmup_length=64)
        ratio = t["summaries"] / t["sdpa"]
        rows += [
            {
                "benchmark": f"capture summaries, Qwen2.5-1.5B all 28x12 heads, T={length}",
                "project_s": t["summaries"],
                "anchor": "plain SDPA forward",
                "anchor_s": t["sdpa"],
                "ratio": ratio,
                "target": "<= 1.5x" if length == 2048 else "(reported)",
                "holds": ratio <= 1.5 if length == 2048 else None,
            },
            {
                "benchmark": f"HF eager output_attentions=True, Qwen2.5-1.5B, T={length} (reference)",
                "project_s": t["eager_output_attentions"],
                "anchor": "plain SDPA forward",
                "anchor_s": t["sdpa"],
                "ratio": t["eager_output_attentions"] / t["sdpa"],
                "target": "(reference)",
                "holds": None,
            },
        ]
    return rows


def dtype_error(length: int = 512) -> dict[str, Any]:
    """Summaries recomputed from float16 rows vs from float32 rows, on Emma (SmolLM2, all heads).

    Both captures store the same fp32 computation; each row is decomposed in float64
    (``ac.decompose(..., from_logits=True)``, sink = first key) from the stored values. Returns
    the median and maximum absolute differences per summary over every row with content
    (queries >= 1), the bytes of each dataset's rows and the CPU seconds of each capture.
    """
    import numpy as np
    import torch

    import attncoda as ac
    from attncoda.hooks import assets, capture

    torch.set_num_threads(1)
    model, tokenizer = _load()
    text = assets.load_text("austen", "emma")
    ids = tokenizer(text[: length * 8], return_tensors="pt").input_ids[:, :length]
    out: dict[str, Any] = {"length": length}
    sets = {}
    for dtype in ("float32", "float16"):
        with torch.no_grad(), capture(model, what="rows", dtype=dtype):
            model(input_ids=ids)  # warm-up

        def kept_rows(dtype: str = dtype) -> Any:
            with torch.no_grad(), capture(model, what="rows", dtype=dtype) as cap:
                model(input_ids=ids)
            return cap.dataset

        sets[dtype], out[f"{dtype}_cpu_s"], _ = clocked(kept_rows)
        out[f"{dtype}_gb"] = sets[dtype].log_attn.nbytes / 1e9
    names = ("sink_share", "entropy", "content_entropy")
    diffs: dict[str, list[Any]] = {n: [] for n in names}
    for layer in range(sets["float32"].sizes["layer"]):
        got = {}
        for dtype, ds in sets.items():
            z = ds.log_attn.values[0, layer, :, 1:].astype(np.float64)  # (head, query, key)
            d = ac.decompose(z, sink=0, mask=np.isfinite(z), from_logits=True)
            got[dtype] = {n: np.asarray(getattr(d, n)) for n in names}
        for n in names:
            diffs[n].append(np.abs(got["float16"][n] - got["float32"][n]).ravel())
    for n in names:
        allv = np.concatenate(diffs[n])
        out[n] = {
            "median": float(np.median(allv)),
            "p99": float(np.quantile(allv, 0.99)),
            "max": float(allv.max()),
        }
    return out


def _memory_row(m: dict[str, Any]) -> str:
    gb, sec = m.get("rss_growth_gb"), m.get("seconds")
    return (
        f"| {m['path']} | {m['length']} | "
        f"{m.get('error') if gb is None else f'{gb:.2f}'} | "
        f"{'' if sec is None else f'{sec:.2f}'} |"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, default=None, help="tokens (2048; --quick: 512)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="T=512, one repeat")
    parser.add_argument("--long", type=int, default=0, help="also run summaries at this length")
    parser.add_argument("--memory", action="store_true", help="peak RSS per path")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--dtype-error", action="store_true", help="summaries from float16 vs float32 rows"
    )
    parser.add_argument(
        "--qwen", action="store_true", help=f"only the {QWEN} rows (T=1024 and 2048)"
    )
    args = parser.parse_args(argv)
    if args.qwen:
        for row in qwen_rows():
            print(row)
        return []
    if args.length is None:
        args.length = 512 if args.quick else 2048
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.child:
        _peak_child(args.child, args.length)
        return []
    if args.dtype_error:
        print(json.dumps(dtype_error(args.length or 512)))
        return []
    t = time_paths(args.length, args.repeats)
    print("| path | median s | ratio to SDPA |\n|---|---|---|")
    for name, sec in t.items():
        print(f"| {name} (T={args.length}) | {sec:.2f} | {sec / t['sdpa']:.2f}x |")
    if args.memory:
        print("\n| path | T | peak extra RSS GB | seconds |\n|---|---|---|---|")
        for path in ("sdpa", "summaries", "eager_output_attentions"):
            print(_memory_row(peak_memory(path, args.length)))
    if args.long:
        for path in ("sdpa", "summaries"):
            print(_memory_row(peak_memory(path, args.long)))
    return []


if __name__ == "__main__":
    main()
