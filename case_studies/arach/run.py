"""ARACH paired evaluation on SmolLM2-135M and Gemma-3-270M: run it, print the README tables.

Commands (run from the repository root)::

    python -m case_studies.arach.run study                 # both models, the README's settings
    python -m case_studies.arach.run study --quick         # a one-minute smoke run per model
    python -m case_studies.arach.run study --models gemma3-270m
    python -m case_studies.arach.run table                 # markdown tables from the results

``study`` is ``attncoda audit arach MODEL --threads 1 --out case_studies/arach/results/MODEL``
for each model (extra arguments after ``--`` are passed on); ``table`` reads each
``results.json`` and prints the perplexity, cloze and audit tables the README quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from case_studies import run_per_model

MODELS = ("smollm2-135m", "gemma3-270m")
RESULTS = Path(__file__).resolve().parent / "results"


def run_study(
    models: Sequence[str] = MODELS, extra: Sequence[str] = (), out: Path = RESULTS
) -> int:
    """``attncoda audit arach`` for each model into ``out/MODEL``; the first non-zero status."""
    return run_per_model(["audit", "arach"], models, ["--threads", "1", *extra], out)


def _ci(r: dict[str, Any], digits: int = 2) -> str:
    f = f"{{:+.{digits}f}}"
    return f"{f.format(r['diff'])} [{f.format(r['low'])}, {f.format(r['high'])}]"


def tables(out: Path = RESULTS, models: Sequence[str] = MODELS) -> str:
    """Markdown tables (perplexity, offset sweep, ablations, cloze, audit) from the results."""
    lines: list[str] = []
    found = [(m, out / m / "results.json") for m in models if (out / m / "results.json").exists()]
    if not found:
        raise SystemExit(f"no results under {out}; run `python -m case_studies.arach.run study`")
    res = {m: json.loads(p.read_text()) for m, p in found}

    lines += [
        "Perplexity, ARACH off vs on (b = -0.5), paired difference on - off with a 95% "
        "block-bootstrap interval:",
        "",
        "| model | text | context | ppl off | ppl on | on - off [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for m, r in res.items():
        default = r["arach"]["offset"]
        for row in r["perplexity"]:
            if row["offset"] == default:
                lines.append(
                    f"| {m} | {row['corpus']} | {row['context']} | {row['off']:.2f} | "
                    f"{row['on']:.2f} | {_ci(row)} |"
                )
    lines += ["", "Perplexity over the offset sweep (context = sweep context):", ""]
    offsets = sorted({row["offset"] for r in res.values() for row in r["perplexity"]}, reverse=True)
    lines.append("| model | text | off | " + " | ".join(f"b={b:g}" for b in offsets) + " |")
    lines.append("|---" * (3 + len(offsets)) + "|")
    for m, r in res.items():
        ctx = r["plan"]["sweep_ppl_context"]
        for corpus in ("mobydick", "austen"):
            rows = {
                row["offset"]: row
                for row in r["perplexity"]
                if row["corpus"] == corpus and row["context"] == ctx
            }
            if not rows:
                continue
            off = next(iter(rows.values()))["off"]
            cells = [f"{rows[b]['on']:.2f}" if b in rows else "" for b in offsets]
            lines.append(f"| {m} | {corpus} (T={ctx}) | {off:.2f} | " + " | ".join(cells) + " |")
    if any(r.get("ablations") for r in res.values()):
        lines += [
            "",
            "Hub variants at b = -0.5 (the other options at their defaults):",
            "",
            "| model | text | variant | ppl off | ppl on | on - off [95% CI] |",
            "|---|---|---|---|---|---|",
        ]
        for m, r in res.items():
            for row in r.get("ablations", []):
                lines.append(
                    f"| {m} | {row['corpus']} (T={row['context']}) | {row['variant']} | "
                    f"{row['off']:.2f} | {row['on']:.2f} | {_ci(row)} |"
                )
    lines += [
        "",
        "Cloze (last word, greedy exact match), ARACH off vs on per offset, paired bootstrap:",
        "",
        "| model | n | b | acc off | acc on | on - off [95% CI] | mean Δ log p(target) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, r in res.items():
        for row in r["cloze"]:
            lines.append(
                f"| {m} | {row['n']:.0f} | {row['offset']:g} | {row['off']:.3f} | "
                f"{row['on']:.3f} | {_ci(row, 3)} | {row['mean_dlogprob']:+.3f} |"
            )
    lines += [
        "",
        "Attention audit (b = -0.5; means over heads, queries >= 1, Emma paragraphs):",
        "",
        "| model | strongest-sink layer: sink off -> on, hub | largest sink drop (layer) | "
        "mean sink off -> on | mean hub | content entropy off -> on | ΔH total = between + "
        "within content (+ other) | corr(sink off, drop) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in res.items():
        a = r["audit"]
        lines.append(
            f"| {m} | L{a['strongest_sink_layer']}: {a['strongest_sink_off']:.3f} -> "
            f"{a['strongest_sink_on']:.3f}, {a['strongest_hub_on']:.3f} | "
            f"{a['largest_drop']:.3f} (L{a['largest_drop_layer']}) | {a['mean_sink_off']:.3f} -> "
            f"{a['mean_sink_on']:.3f} | {a['mean_hub_on']:.3f} | "
            f"{a['mean_content_entropy_off']:.3f} -> {a['mean_content_entropy_on']:.3f} | "
            f"{a['mean_dH_total']:+.3f} = {a['mean_dH_between']:+.3f} + "
            f"{a['mean_dH_within_content']:+.3f} | {a['corr_sink_off_vs_drop']:+.2f} |"
        )
    lines.append("")
    lines.append(
        "Run times: "
        + ", ".join(
            f"{m} {r['seconds'] / 60:.1f} min ({r['torch_threads']} thread)" for m, r in res.items()
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("study", help="run the evaluation for each model")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("extra", nargs="*", help="passed to `attncoda audit arach` (after --)")
    t = sub.add_parser("table", help="print the README tables")
    t.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args(argv)
    if args.command == "study":
        extra = [*(["--quick"] if args.quick else []), *args.extra]
        return run_study(args.models, extra)
    print(tables(models=args.models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
