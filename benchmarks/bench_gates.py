"""Gates benchmark: perplexity evaluation with head gates active vs the plain forward.

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on real Moby-Dick windows. Paths, timed
in one process by ``benchmarks/_measure.py`` (interleaved, order rotated, process CPU time beside
wall time, medians of ``--repeats``, load stated):

``forward``
    ``model(input_ids=w)`` for every window (SDPA, no loss): the anchor.
``perplexity``
    :func:`attncoda.hooks.evaluate.perplexity` without gates (forward + the model's own loss).
``gated-zero`` / ``gated-mean``
    the same evaluation inside ``gates(...)`` zero- or mean-ablating ``--fraction`` of all heads
    (spread over every layer), through attncoda's registered attention function.

The target of the issue is ``gated-* / forward <= 1.1``.

Run: ``python benchmarks/bench_gates.py [--window 512] [--windows 1] [--repeats 9] [--threads 1]``.
On a shared machine use ``--threads 1``: with more threads than free cores, OpenMP stalls make
single timings scatter by 2x and more.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from _measure import interleave, one_thread, row

MODEL = "smollm2-135m"


def _setup(window: int, windows: int, fraction: float) -> tuple[Any, dict[str, Callable[[], Any]]]:
    import torch

    from attncoda.hooks import assets
    from attncoda.hooks import gates as G
    from attncoda.hooks.evaluate import perplexity, text_windows
    from attncoda.hooks.prune import novel_text

    torch.manual_seed(0)
    model, tokenizer = assets.load_model(MODEL)
    ids = text_windows(tokenizer, novel_text("mobydick"), window=window, n_windows=windows)
    layout = G.head_layout(model)
    n = round(fraction * layout.n_layers * layout.n_heads)
    # spread over layers: head h of layer l for the first n (l, h) in round-robin order
    pairs = [(layer, h) for h in range(layout.n_heads - 1) for layer in range(layout.n_layers)]
    heads = pairs[:n]
    means = G.head_means(model, ids[:1])

    def forward() -> None:
        with torch.no_grad():
            for w in ids:
                model(input_ids=w[None])

    def plain() -> float:
        return perplexity(model, ids).value

    def zero() -> float:
        with G.gates(model, heads):
            return perplexity(model, ids).value

    def mean() -> float:
        with G.gates(model, heads, mode="mean", means=means):
            return perplexity(model, ids).value

    info = {"heads_gated": n, "n_heads": layout.n_layers * layout.n_heads, "tokens": ids.numel()}
    return info, {"forward": forward, "perplexity": plain, "gated-zero": zero, "gated-mean": mean}


def measure(
    window: int = 512,
    windows: int = 1,
    repeats: int = 9,
    threads: int | None = None,
    fraction: float = 0.3,
) -> dict[str, Any]:
    """Medians (CPU time) of the four paths, interleaved after one warm-up each."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    info, paths = _setup(window, windows, fraction)
    with one_thread() if threads == 1 else nullcontext():
        measured = interleave(paths, repeats)
    med = {name: measured[name].cpu_median for name in paths}
    return {
        **info,
        "window": window,
        "windows": windows,
        "repeats": repeats,
        "threads": threads,
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "ratio_to_forward": {k: round(v / med["forward"], 3) for k, v in med.items()},
        "ratio_to_perplexity": {k: round(v / med["perplexity"], 3) for k, v in med.items()},
        "wall_s": {k: round(measured[k].wall_median, 4) for k in paths},
        "load": measured.load.text(),
        "measured": measured,
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run``: gated perplexity evaluation vs the plain forward."""
    r = measure(window=256 if quick else 512, repeats=3 if quick else 9, threads=1)
    return [
        row(
            f"perplexity with {path} gates on {r['heads_gated']} of {r['n_heads']} heads, "
            f"T={r['window']}",
            r["measured"],
            path,
            "forward",
            1.1,
            anchor_label="plain forward",
        )
        for path in ("gated-zero", "gated-mean")
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--fraction", type=float, default=0.3)
    args = parser.parse_args(argv)
    result = measure(args.window, args.windows, args.repeats, args.threads, args.fraction)
    print(json.dumps({k: v for k, v in result.items() if k != "measured"}, indent=2))
    return result


if __name__ == "__main__":
    main()
