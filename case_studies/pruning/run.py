"""Sink-aware head pruning on SmolLM2-135M and Gemma-3-270M: run the study, print the tables.

Commands (run from the repository root)::

    python -m case_studies.pruning.run study            # both models, the README's settings
    python -m case_studies.pruning.run study --quick    # a one-minute smoke run per model
    python -m case_studies.pruning.run table            # markdown tables from the results

``study`` is ``attncoda prune MODEL --out case_studies/pruning/results/MODEL`` for each model
(extra arguments are passed on); ``table`` reads each ``perplexity.csv`` and prints perplexity
per score and k, and the ratio to the unpruned model, as the README quotes them.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from case_studies import run_per_model

MODELS = ("smollm2-135m", "gemma3-270m")
RESULTS = Path(__file__).resolve().parent / "results"


def run_study(
    models: Sequence[str] = MODELS, extra: Sequence[str] = (), out: Path = RESULTS
) -> int:
    """``attncoda prune`` for each model into ``out/MODEL``; the first non-zero status, or 0."""
    return run_per_model(["prune"], models, extra, out)


def markdown_table(folder: Path, corpus: str = "all", ratio: bool = False) -> str:
    """Perplexity (or its ratio to the unpruned model) per score (rows) and k (columns)."""
    with open(folder / "perplexity.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["corpus"] == corpus]
    meta = json.loads((folder / "meta.json").read_text())
    ks = meta["ks"]
    base = next(float(r["perplexity"]) for r in rows if r["score"] == "none")
    n = meta["n_units"]
    head = ["score", "channel", *(f"k={k} ({100 * k / n:.0f}%)" for k in ks)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for score in meta["scores"]:
        cells = {int(r["k"]): float(r["perplexity"]) for r in rows if r["score"] == score}
        cells[0] = base
        channel = next(r["channel"] for r in rows if r["score"] == score)
        vals = [cells[k] / base if ratio else cells[k] for k in ks]
        fmt = (lambda v: f"{v:.2f}x") if ratio else (lambda v: f"{v:.2f}")
        lines.append("| " + " | ".join([score, channel, *map(fmt, vals)]) + " |")
    return "\n".join(lines)


def diagnostics(folder: Path) -> str:
    """Which heads each score prunes first, and how its ranking agrees with the baselines.

    Per score: Spearman's rho, over all heads, of the score's importance (its statistic oriented
    so that higher means pruned later) with the gradient importance; rho of the raw statistic
    with the sink share (how much of the statistic is the sink channel); and the layers of the
    heads pruned at the smallest k > 0 (``layer x heads``).
    """
    from attncoda.hooks.scores import score_info
    from scipy.stats import spearmanr

    with open(folder / "head_scores.csv") as fh:
        heads = list(csv.DictReader(fh))
    with open(folder / "perplexity.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["corpus"] == "all"]
    meta = json.loads((folder / "meta.json").read_text())
    k1 = meta["ks"][1]
    stats = {n: [float(h[n]) for h in heads] for n in heads[0] if n not in ("layer", "head")}
    lines = [
        "| score | rho(importance, gradient) | rho(statistic, sink share) "
        f"| layers of the first {k1} pruned |",
        "|---|---|---|---|",
    ]
    for score in meta["scores"]:
        base = score.removesuffix("-reversed")
        sign = -1.0 if score_info(score).prune_first == "high" else 1.0
        rho_g = rho_s = float("nan")
        if "gradient" in stats:
            rho_g = sign * spearmanr(stats[base], stats["gradient"]).statistic
        if "sink_share" in stats:
            rho_s = spearmanr(stats[base], stats["sink_share"]).statistic
        (row,) = [r for r in rows if r["score"] == score and int(r["k"]) == k1]
        layers = ", ".join(
            f"{part.split(':')[0][1:]}x{len(part.split(':')[1].split(','))}"
            for part in row["pruned"].split(";")
        )
        lines.append(f"| {score} | {rho_g:+.2f} | {rho_s:+.2f} | {layers} |")
    return "\n".join(lines)


def print_tables(out: Path = RESULTS) -> int:
    for folder in sorted(p for p in out.iterdir() if (p / "perplexity.csv").exists()):
        meta = json.loads((folder / "meta.json").read_text())
        print(f"## {folder.name}\n\n`{meta['command']}` ({meta.get('wall_s', '?')} s)\n")
        for corpus in ("all", "mobydick", "prideprejudice"):
            print(f"perplexity, {corpus}:\n\n{markdown_table(folder, corpus)}\n")
        print(f"ratio to unpruned, all:\n\n{markdown_table(folder, 'all', ratio=True)}\n")
        if "gradient" in meta["scores"] or "sink_share" in meta["scores"]:
            print(f"diagnostics (layer x heads):\n\n{diagnostics(folder)}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m case_studies.pruning.run")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("study", help="run attncoda prune on both models")
    s.add_argument("--models", nargs="+", default=list(MODELS))
    t = sub.add_parser("table", help="print the markdown tables")
    t.add_argument("--out", type=Path, default=RESULTS)
    args, extra = parser.parse_known_args(argv)
    if args.command == "study":
        return run_study(args.models, extra)
    if extra:
        parser.error(f"unknown arguments {extra}")
    return print_tables(args.out)


if __name__ == "__main__":
    sys.exit(main())
