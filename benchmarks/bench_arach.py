"""ARACH benchmark: the fast hub path and the naive dense-mask path vs the plain forward.

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on real Austen tokens. Three paths, timed
in one process by ``benchmarks/_measure.py`` (interleaved, order rotated, process CPU time beside
wall time, medians of ``--repeats``, load stated):

- ``plain``: the model's own forward (SDPA, causal), ARACH off;
- ``fast``: :class:`attncoda.hooks.arach.Arach` (mode ``"fast"``): causal attention over the verbal
  keys for the 2T queries plus one exact log-sum-exp merge of the diagonal hub logit;
- ``dense``: the naive version, the ``[verbal ; hub]`` input with a 2T x 2T additive float mask
  run by SDPA (mode ``"dense"``).

The hub stream doubles the projection and MLP work, so about 2x plain is the floor of any exact
ARACH forward; the target is fast <= 2.3x plain at T=1024. The LM head runs on verbal positions
only in both ARACH paths. The script also checks that fast and dense logits agree.

Run: ``python benchmarks/bench_arach.py [--length 1024] [--repeats 3] [--threads 1] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from typing import Any

from _measure import interleave, one_thread, row
from bench_capture import _tokens  # the same Austen tokens as the capture benchmark

MODEL = "smollm2-135m"


def measure(
    length: int, repeats: int, model_name: str = MODEL, threads: int | None = None
) -> dict[str, Any]:
    import torch

    from attncoda.hooks import arach, assets

    if threads is not None:
        torch.set_num_threads(threads)

    model, tokenizer = assets.load_model(model_name)
    ids = _tokens(tokenizer, length)
    fast = arach.Arach(model, mode="fast")
    dense = arach.Arach(model, mode="dense")
    paths = {
        "plain": lambda: model(input_ids=ids),
        "fast": lambda: fast(input_ids=ids),
        "dense": lambda: dense(input_ids=ids),
    }
    with torch.no_grad():
        check = (fast(input_ids=ids).logits - dense(input_ids=ids).logits).abs().max().item()
        with one_thread() if threads == 1 else nullcontext():
            measured = interleave(paths, repeats)
    med = {k: measured[k].cpu_median for k in paths}
    return {
        "model": model_name,
        "length": length,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "seconds": med,
        "wall_seconds": {k: measured[k].wall_median for k in paths},
        "all_seconds": {k: list(measured[k].cpu) for k in paths},
        "load": measured.load.text(),
        "measured": measured,
        "fast_over_plain": med["fast"] / med["plain"],
        "dense_over_plain": med["dense"] / med["plain"],
        "dense_over_fast": med["dense"] / med["fast"],
        "max_abs_logit_diff_fast_vs_dense": check,
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run``: fast and dense ARACH vs the plain forward."""
    length = 256 if quick else 1024
    r = measure(length, 1 if quick else 3, threads=1)
    m = r["measured"]
    return [
        row(
            f"ARACH fast forward, SmolLM2, T={length}",
            m,
            "fast",
            "plain",
            2.3,
            anchor_label="plain forward",
        ),
        row(
            f"ARACH naive dense 2T x 2T mask, T={length} (reference)",
            m,
            "dense",
            "plain",
            None,
            anchor_label="plain forward",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument(
        "--threads", type=int, help="torch threads (1 is steadier on a shared, loaded machine)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = []
    for length in args.length:
        r = measure(length, args.repeats, args.model, args.threads)
        results.append(r)
        s = r["seconds"]
        print(
            f"T={length}: plain {s['plain']:.2f} s | fast {s['fast']:.2f} s "
            f"({r['fast_over_plain']:.2f}x) | dense {s['dense']:.2f} s "
            f"({r['dense_over_plain']:.2f}x) | dense/fast {r['dense_over_fast']:.2f}x | "
            f"max |fast - dense| logit {r['max_abs_logit_diff_fast_vs_dense']:.1e}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                [{k: v for k, v in r.items() if k != "measured"} for r in results], fh, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
