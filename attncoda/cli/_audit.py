"""``attncoda audit TARGET``: audits of attention methods (``rpa``: an RPA training run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import (
    add_device,
    add_dtype,
    add_force,
    add_out,
    add_quiet,
    add_threads,
    check_device,
    check_out_folder,
    fail,
    set_threads,
    usage,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="audits of attention methods with attncoda's sink/content decomposition (rpa)",
        description=(
            "Audit an attention method's effect on attention rows with attncoda's sink/content "
            "decomposition. Each method is a TARGET. (The ARACH paired evaluation is a case "
            "study: python -m case_studies.arach.run.)"
        ),
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    for register in _AUDIT_TARGETS:
        register(targets)


def register_audit_rpa(targets: Any) -> None:
    """Register ``attncoda audit rpa`` under the ``audit`` subcommand's targets."""
    p = targets.add_parser(
        "rpa",
        help="RPA prior: entropy trajectory of a training run, split into sink and content",
        description=(
            "Audit a training run folder of the RPA case study (python -m case_studies.rpa.run): "
            "the entropy of every layer and head along the run's checkpoints, each change split "
            "exactly into the part due to the sink share and the part due to the content "
            "entropy, with and without each layer's prior; and the final prior read as a "
            "perturbation of the rows. Writes trajectory.nc (perturbation.nc, "
            "baseline_trajectory.nc) and audit.md to --out."
        ),
    )
    p.add_argument(
        "run", metavar="RUN_DIR", help="a run folder written by the RPA trainer (its checkpoints)"
    )
    p.add_argument("--baseline", metavar="RUN_DIR", help="a baseline run to put side by side")
    add_out(p, "output folder", shown="RUN_DIR/audit")
    add_device(p)
    add_dtype(p)
    add_force(p)
    add_threads(p)
    add_quiet(p)
    p.set_defaults(func=_cmd_audit_rpa, _parser=p)


def _cmd_audit_rpa(args: argparse.Namespace) -> int:
    device = check_device(args.device)  # before any checkpoint loads
    for flag, value in (("RUN_DIR", args.run), ("--baseline", args.baseline)):
        if value is not None and not Path(value).is_dir():
            raise usage(f"{flag}: no such run folder: {value}")
    out = Path(args.out) if args.out else Path(args.run) / "audit"
    check_out_folder(out, args.force)
    set_threads(args.threads)
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks.rpa import RPAError
    from attncoda.hooks.rpa_audit import audit_markdown, audit_rpa

    try:
        result = audit_rpa(
            args.run,
            baseline_dir=args.baseline,
            out=out,
            overwrite=args.force,
            device=device,
            dtype=args.dtype,
        )
    except FileNotFoundError as exc:
        raise usage(str(exc)) from exc
    except RPAError as exc:
        raise fail(str(exc)) from exc
    if not args.quiet:
        print(audit_markdown(result))
    print(f"wrote {out}/audit.md")
    return 0


_AUDIT_TARGETS: tuple[Callable[[Any], None], ...] = (register_audit_rpa,)
