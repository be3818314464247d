"""ARACH paired evaluation on SmolLM2-135M and Gemma-3-270M: run it, print the README tables.

Commands (run from the repository root)::

    python -m case_studies.arach.run study                 # both models, the README's settings
    python -m case_studies.arach.run study --quick         # a one-minute smoke run per model
    python -m case_studies.arach.run study --models gemma3-270m
    python -m case_studies.arach.run run smollm2-135m --quick --out /tmp/arach  # one model
    python -m case_studies.arach.run table                 # markdown tables from the results

``run MODEL`` is one paired evaluation (:func:`case_studies.arach.study.run_evaluation`; its
options size the plan and choose the hub); ``study`` is ``run MODEL --threads 1 --out
case_studies/arach/results/MODEL --force`` for each model (extra arguments after ``--`` are
passed on); ``table`` reads each ``results.json`` and prints the perplexity, cloze and audit
tables the README quotes. Errors are one line (``... error: ...``) with exit code 2 for bad
usage and 1 for a failed run, before any model loads where they can be.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attncoda import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, AttncodaError, InputError

from . import study

MODELS = ("smollm2-135m", "gemma3-270m")
RESULTS = Path(__file__).resolve().parent / "results"
PROG = "python -m case_studies.arach.run"


def run_study(
    models: Sequence[str] = MODELS, extra: Sequence[str] = (), out: Path = RESULTS
) -> int:
    """``run MODEL --threads 1 --out out/MODEL EXTRA --force`` for each model; the first non-zero
    status.

    The output folder is passed relative to the working directory where it can be (so paths read
    the same on every machine); ``--force``: the study regenerates its own result folders
    (attncoda still refuses a folder it did not write).
    """
    for model in models:
        folder = out / model
        try:
            folder = folder.relative_to(Path.cwd())
        except ValueError:
            pass
        argv = ["run", model, "--threads", "1", "--out", str(folder), *extra, "--force"]
        status = main(argv)
        if status:
            return status
    return 0


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a fetched causal LM: smollm2-135m, gemma3-270m")
    p.add_argument("--out", metavar="DIR", help="output folder (default: ./arach-MODEL)")
    p.add_argument(
        "--quick", action="store_true", help="a one-minute smoke run (tiny sizes, one offset)"
    )
    p.add_argument(
        "--offsets",
        type=_float_list,
        metavar="LIST",
        help="offsets b of the sweep (default: 0,-0.25,-0.5,-1,-2,-4)",
    )
    p.add_argument("--contexts", type=_int_list, metavar="LIST", help="perplexity context lengths")
    p.add_argument("--ppl-tokens", type=int, metavar="N", help="tokens of each perplexity text")
    p.add_argument("--cloze-items", type=int, metavar="N", help="number of cloze items")
    p.add_argument("--audit-samples", type=int, metavar="N", help="passages of the audit")
    p.add_argument(
        "--hub-embedding",
        choices=("token", "mean", "zeros"),
        default="token",
        help="hub input embedding (default: %(default)s)",
    )
    p.add_argument(
        "--hub-positions",
        choices=("same", "none"),
        default="same",
        help="hub position ids (default: %(default)s)",
    )
    p.add_argument("--threads", type=int, metavar="N", help="torch CPU threads for the run")
    p.add_argument(
        "--force", action="store_true", help="replace an output folder that attncoda wrote"
    )
    p.add_argument("--no-figures", action="store_true", help="write tables only")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def run_one(args: argparse.Namespace) -> int:
    """One paired evaluation from the ``run`` options; every size is checked before a model
    loads (:class:`~case_studies.arach.study.EvalPlan` and
    :func:`~case_studies.arach.study.run_evaluation` refuse bad values)."""
    plan = study.EvalPlan.quick() if args.quick else study.EvalPlan()
    changes: dict[str, Any] = {}
    for name, field in (
        ("offsets", "offsets"),
        ("contexts", "contexts"),
        ("ppl_tokens", "ppl_tokens"),
        ("cloze_items", "cloze_n"),
        ("audit_samples", "audit_samples"),
    ):
        value = getattr(args, name)
        if value is not None:
            if isinstance(value, tuple) and not value:
                raise InputError(f"--{name.replace('_', '-')} is empty")
            changes[field] = value
    if "contexts" in changes:
        changes["sweep_ppl_context"] = changes["contexts"][0]
    plan = dataclasses.replace(plan, **changes)  # EvalPlan checks every size (usage errors)
    out = args.out or f"arach-{args.model}"
    options = {"hub_embedding": args.hub_embedding, "hub_positions": args.hub_positions}
    res = study.run_evaluation(
        args.model,
        out,
        plan=plan,
        arach_options=options,
        figures=not args.no_figures,
        threads=args.threads,
        progress=None if args.quiet else print,
        overwrite=args.force,
    )
    if not args.quiet:
        print(f"wrote {out}/results.json ({res['seconds']:.0f} s)")
    return EXIT_OK


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
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("study", help="run the evaluation for each model")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("extra", nargs="*", help="options of `run` for every model (after --)")
    r = sub.add_parser("run", help="the paired evaluation of one model")
    _add_run_options(r)
    t = sub.add_parser("table", help="print the README tables")
    t.add_argument("--models", nargs="+", default=list(MODELS))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "study":
            extra = [*(["--quick"] if args.quick else []), *args.extra]
            return run_study(args.models, extra)
        if args.command == "run":
            return run_one(args)
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except AttncodaError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return int(exc.exit_code)
    print(tables(models=args.models))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
