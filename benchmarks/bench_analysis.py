"""Analysis benchmark: all pairwise head comparisons of SmolLM2-135M vs the capture that made them.

The target: every head-vs-head comparison for SmolLM2-135M (30 layers x 9 heads = 270 heads,
36,315 pairs) over 64 samples x 512 queries, under every convention, costs less than the capture
forward pass that produced the rows.

What is measured (one process, the same rows): the real capture of fp32 rows of all 270 heads
(``attncoda.hooks.capture(what="rows")``, Austen text, the anchor) and
``attncoda.head_comparisons`` on those rows, for ``--samples`` samples of 512 tokens (2 by
default). Rows of 64 x 512 x 270 heads would take 18 GB, more than this machine holds, and both
costs are linear in the number of samples at a fixed length (each sample is one capture forward
and one pass of comparisons), so the 64-sample figures are the measured ones times 64 / samples;
the ratio is measured directly. The capture forward and each metric set are timed against each
other by ``benchmarks/_measure.py`` (one thread each side, sides interleaved and rotated after a
warm-up, process CPU seconds beside wall, re-measured when the two disagree: multi-threaded BLAS
on a shared machine spends CPU time waiting, which made the ratios move with the load).

Rows: ``pairwise_<set>_64x512`` for the metric sets ``aitchison`` (the exact sink/content split:
kept, dropped and split from one Gram matrix), ``gram`` (aitchison, cosine, kl, entropy: the
metrics with a matrix-product form) and ``all`` (plus js and tv, which need an elementwise pass
per pair of heads, in attncoda's compiled kernel where a C compiler is present), and ``all`` again
with ``backend="numpy"`` (js and tv in numpy, as without a compiler); ``project_s`` and
``anchor_s`` are extrapolated to 64 samples, ``measured_s`` holds what was timed.

A last row repeats the ``all`` set with ``device="cuda"`` (products and the js/tv passes on the
GPU) when torch sees one, against the same CPU capture.

Run: ``python benchmarks/bench_analysis.py [--quick] [--samples 2]``; ``--quick`` uses one sample
and skips the ``all`` set (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

import attncoda as ac

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import clocked, interleave_reliable, one_thread, row

MODEL = "smollm2-135m"
TARGET_SAMPLES = 64
SETS = {
    "aitchison": ("aitchison",),
    "gram": ("aitchison", "cosine", "kl", "entropy"),
    "all": ac.METRICS,
}
# the ``all`` set again with backend="numpy": js and tv in numpy, without attncoda's compiled
# pair kernel (what a machine without a C compiler runs)
NUMPY_ALL = "all_numpy"


def _capture(samples: int, length: int) -> Any:
    """A function that captures rows of every head of SmolLM2 over ``samples`` windows of
    ``length`` tokens of Austen and returns the dataset."""
    import torch

    from attncoda.hooks import assets, capture

    model, tokenizer = assets.load_model(MODEL)
    text = assets.load_text("austen", "prideprejudice")
    ids = tokenizer(text[: samples * length * 8], return_tensors="pt").input_ids
    ids = ids[:, : samples * length].reshape(samples, length)

    def rows() -> Any:
        with torch.no_grad(), capture(model, what="rows") as cap:
            model(input_ids=ids)
        return cap.dataset

    return rows


def run(quick: bool = False, samples: int | None = None) -> list[dict[str, Any]]:
    """Time the comparisons against the capture; one row per metric set."""
    length = 512
    n = samples or (1 if quick else 2)
    scale = TARGET_SAMPLES / n
    rows = _capture(n, length)
    with one_thread():
        ds = rows()
        sides: dict[str, Any] = {"capture": rows}
        for name, metrics in SETS.items():
            if not (quick and name == "all"):
                sides[name] = lambda metrics=metrics: ac.head_comparisons(
                    ds, metrics, progress=False
                )
        if not quick:
            sides[NUMPY_ALL] = lambda: ac.head_comparisons(
                ds, ac.METRICS, backend="numpy", progress=False
            )
        pairs = [(name, "capture", 1.0) for name in sides if name != "capture"]
        m = interleave_reliable(sides, 1 if quick else 3, pairs)
    n_rows = int(ac.head_comparisons(ds, "entropy", progress=False).n_rows)
    out = []
    for name in sides:
        if name == "capture":
            continue
        label = (
            "pairwise_all_64x512 with backend='numpy' (js and tv without the compiled kernel)"
            if name == NUMPY_ALL
            else f"pairwise_{name}_64x512"
        )
        metrics = SETS["all"] if name == NUMPY_ALL else SETS[name]
        r = row(
            label,
            m,
            name,
            "capture",
            1.0,
            anchor_label="capture(what='rows') forward of SmolLM2-135M, all 270 heads, "
            f"{TARGET_SAMPLES}x512 tokens",
        )
        # seconds for 64 samples (both sides are linear in the samples; the ratio is measured)
        r.update(
            project_s=r["project_s"] * scale,
            anchor_s=r["anchor_s"] * scale,
            metrics=",".join(metrics),
            target="ratio < 1 (cheaper than the capture forward that produced the rows)",
            measured_s={"comparisons": m[name].cpu_median, "capture": m["capture"].cpu_median},
            measured_size=f"{n} samples x {length} tokens, 270 heads, {n_rows} compared rows",
        )
        out.append(r)
    out.append(_on_gpu(ds, m["capture"].cpu_median, scale))
    return out


def _on_gpu(ds: Any, capture_s: float, scale: float) -> dict[str, Any]:
    """All six metrics with ``device="cuda"`` (products and js/tv passes on the GPU)."""
    import torch

    result: dict[str, Any] = {
        "benchmark": "pairwise_all_64x512 with device='cuda'",
        "anchor": "capture(what='rows') forward of SmolLM2-135M on the CPU, as above",
        "anchor_s": round(capture_s * scale, 2),
        "target": "(reported: js and tv on a GPU)",
    }
    if not torch.cuda.is_available():
        result["benchmark"] += " (skipped: no CUDA device)"
        return result
    ac.head_comparisons(ds.isel(sample=[0], query=slice(0, 64)), device="cuda")  # warm-up
    _, project_s, _ = clocked(lambda: ac.head_comparisons(ds, ac.METRICS, device="cuda"))
    result.update(
        project_s=round(project_s * scale, 2),
        ratio=round(project_s / capture_s, 3),
        measured_s={"comparisons": round(project_s, 2), "capture": round(capture_s, 2)},
        device=torch.cuda.get_device_name(),
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=None)
    args = parser.parse_args()
    print(f"# {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}")
    for result in run(args.quick, args.samples):
        print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
