"""Capture benchmark: summaries capture vs the plain SDPA forward vs HF eager attentions.

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on real Austen text. Time ratios are
measured in one process, alternating the paths, medians of ``--repeats``; peak memory is the
RSS growth of one forward in a fresh subprocess per path (so one path's allocator state cannot
hide another's).

Run: ``python benchmarks/bench_capture.py [--length 2048] [--repeats 3] [--long 8192]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

MODEL = "smollm2-135m"


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

    def sdpa() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def summaries() -> None:
        with torch.no_grad(), capture(model, what="summaries") as cap:
            model(input_ids=ids)
        _ = cap.dataset

    def eager() -> None:
        model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                model(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation("sdpa")

    return {"sdpa": sdpa, "summaries": summaries, "eager_output_attentions": eager}


def _load() -> tuple[Any, Any]:
    import torch
    from attncoda.hooks import assets

    torch.manual_seed(0)
    return assets.load_model(MODEL)


def time_paths(length: int, repeats: int, include_eager: bool = True) -> dict[str, float]:
    """Median seconds per path, alternating paths in one process."""
    model, tokenizer = _load()
    ids = _tokens(tokenizer, length)
    paths = _paths(model, ids)
    if not include_eager:
        paths.pop("eager_output_attentions")
    for fn in paths.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in times.items()}


def _peak_child(path: str, length: int) -> None:
    """Run in a subprocess: print the RSS growth (GB) of one forward along ``path``."""
    model, tokenizer = _load()
    ids = _tokens(tokenizer, length)
    fn = _paths(model, ids)[path]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"path": path, "length": length, "rss_growth_gb": (after - before) / 1e6,
                      "seconds": elapsed}))


def peak_memory(path: str, length: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", path, "--length", str(length)],
        capture_output=True, text=True, check=False, env=dict(os.environ),
    )
    if out.returncode != 0:
        return {"path": path, "length": length, "error": out.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for the benchmark table (keys: benchmark, project_s, anchor, anchor_s, ratio, target, holds)."""
    length = 512 if quick else 2048
    t = time_paths(length, repeats=1 if quick else 3)
    ratio = t["summaries"] / t["sdpa"]
    rows = [
        {
            "benchmark": f"capture summaries, all 30x9 heads, T={length}",
            "project_s": t["summaries"],
            "anchor": "plain SDPA forward",
            "anchor_s": t["sdpa"],
            "ratio": ratio,
            "target": "<= 1.5x",
            "holds": ratio <= 1.5,
        },
        {
            "benchmark": f"HF eager output_attentions=True, T={length} (reference)",
            "project_s": t["eager_output_attentions"],
            "anchor": "plain SDPA forward",
            "anchor_s": t["sdpa"],
            "ratio": t["eager_output_attentions"] / t["sdpa"],
            "target": "(3.7x measured before)",
            "holds": None,
        },
    ]
    if not quick:
        for path in ("sdpa", "summaries", "eager_output_attentions"):
            mem = peak_memory(path, length)
            rows.append({
                "benchmark": f"peak RSS growth, {path}, T={length}",
                "project_s": mem.get("seconds"),
                "anchor": "GB",
                "anchor_s": mem.get("rss_growth_gb"),
                "ratio": None,
                "target": "summaries ~ sdpa",
                "holds": None,
            })
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--long", type=int, default=0, help="also run summaries at this length")
    parser.add_argument("--memory", action="store_true", help="peak RSS per path")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _peak_child(args.child, args.length)
        return []
    t = time_paths(args.length, args.repeats)
    print("| path | median s | ratio to SDPA |\n|---|---|---|")
    for name, sec in t.items():
        print(f"| {name} (T={args.length}) | {sec:.2f} | {sec / t['sdpa']:.2f}x |")
    if args.memory:
        print("\n| path | T | peak RSS growth GB | seconds |\n|---|---|---|---|")
        for path in ("sdpa", "summaries", "eager_output_attentions"):
            m = peak_memory(path, args.length)
            print(f"| {path} | {args.length} | {m.get('rss_growth_gb', m.get('error'))} | "
                  f"{m.get('seconds', '')} |")
    if args.long:
        for path in ("sdpa", "summaries"):
            m = peak_memory(path, args.long)
            print(f"| {path} | {args.long} | {m.get('rss_growth_gb', m.get('error'))} | "
                  f"{m.get('seconds', '')} |")
    return []


if __name__ == "__main__":
    main()
