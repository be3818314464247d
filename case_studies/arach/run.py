"""One ARACH paired evaluation from the command line: ``python -m case_studies.arach.run run MODEL``.

Run from the repository root::

    python -m case_studies.arach.run run smollm2-135m --quick --out /tmp/arach  # one model
    python -m case_studies.arach.run run gemma3-270m --offsets 0,-1 --cloze-items 40 --out DIR

``run MODEL`` is one paired evaluation (:func:`case_studies.arach.study.run_evaluation`; its
options size the plan and choose the hub). The whole study (both models, the README's results,
the manifest and the README tables) is ``python -m case_studies.arach run|table|quick``, which
replaced this module's former ``study`` and ``table`` commands. Errors are one line
(``... error: ...``) with exit code 2 for bad usage and 1 for a failed run, before any model
loads where they can be.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attncoda import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, AttncodaError, InputError

from . import study

MODELS = ("smollm2-135m", "gemma3-270m")
RESULTS = Path(__file__).resolve().parent / "results"
PROG = "python -m case_studies.arach.run"


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the paired evaluation of one model")
    _add_run_options(r)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return run_one(args)
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except AttncodaError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return int(exc.exit_code)


if __name__ == "__main__":
    sys.exit(main())
