"""``attncoda analyze`` and ``attncoda report``: analysis folders and their HTML page."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import attncoda as ac

from ._common import (
    add_device,
    add_force,
    add_n_boot,
    add_out,
    add_quiet,
    analysis_folder,
    check_device,
    check_out_folder,
    command_line,
    fail,
    load_dataset,
    usage,
)


def register_analyze(subparsers: Any) -> None:
    """Register ``attncoda analyze``."""
    p = subparsers.add_parser(
        "analyze",
        help="analyse a saved capture: tables, figures and a summary",
        description=(
            "Read a dataset written by `attncoda capture` (or ac.save) and write into --out: "
            "per-head profiles and the sink rate, the exact entropy split H = H_b(s) + "
            "(1 - s) H(c), the entropy attribution across layers and, when the dataset (or "
            "--rows) holds rows of at least 3 heads, verdict flips between the kept and dropped "
            "conventions and head clustering with and without the sink. CSV tables, PNG + SVG "
            "figures and analysis.json; `attncoda report DIR` renders them as one HTML page."
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="a .nc or .zarr capture")
    p.add_argument(
        "--rows", metavar="DATASET", help="a second capture with rows (e.g. of a few layers)"
    )
    add_out(p, "output folder", shown="beside DATASET, its name without suffix")
    p.add_argument(
        "--metrics",
        default="cosine,js,tv,aitchison",
        metavar="LIST",
        help="metrics of the verdict flips (default: %(default)s; also kl, entropy)",
    )
    add_n_boot(p, 200)
    p.add_argument(
        "--threshold",
        type=float,
        default=0.3,
        metavar="T",
        help="sink-rate threshold on a head's mean sink share (default: %(default)s)",
    )
    add_device(p, shown="numpy on the CPU")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--report", action="store_true", help="also write report.html")
    add_force(p)
    add_quiet(p)
    p.set_defaults(func=_cmd_analyze, _parser=p)


def _run_analysis(args: argparse.Namespace, folder: Path) -> Any:
    """Analyse ``args.dataset`` into ``folder``, print the summary; return the analysis."""
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        raise usage(f"--metrics is empty; choose from {', '.join(ac.METRICS)}")
    for m in metrics:
        if m.lower() not in ac.METRICS:
            raise usage(f"unknown metric {m!r} in --metrics; choose from {', '.join(ac.METRICS)}")
    if not 0 < args.threshold < 1:
        raise usage(f"--threshold must lie in (0, 1), got {args.threshold}")
    force = getattr(args, "force", False)
    device = getattr(args, "device", None)
    if device is not None:
        check_device(device)
    check_out_folder(folder, force, "analysis folder")
    ds = load_dataset(args.dataset)
    rows = load_dataset(args.rows) if getattr(args, "rows", None) else None
    try:
        result = ac.analyze(
            ds,
            folder,
            rows=rows,
            metrics=metrics,
            n_boot=args.n_boot,
            threshold=args.threshold,
            figures=not args.no_figures,
            progress=not args.quiet,
            meta={"command": command_line(args), "dataset": str(args.dataset)},
            device=device,
            overwrite=force,
        )
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("matplotlib", "sklearn"):
            raise fail(
                f"{exc.name} is not installed; pip install 'attncoda[analysis]' "
                "(or use --no-figures)"
            ) from exc
        raise
    for line in result.summary:
        print(line)
    return result


def _cmd_analyze(args: argparse.Namespace) -> int:
    folder = Path(args.out) if args.out else analysis_folder(args.dataset)
    _run_analysis(args, folder)
    if args.report:
        print(f"report: {ac.write_report(folder)}")
    elif not args.quiet:
        print(f"wrote {folder}/ ; next: attncoda report {shlex.quote(str(folder))}")
    return 0


def register_report(subparsers: Any) -> None:
    """Register ``attncoda report``."""
    p = subparsers.add_parser(
        "report",
        help="render an analysis folder (or a capture) as a self-contained HTML page",
        description=(
            "Write report.html for PATH: a folder written by `attncoda analyze` or "
            "`attncoda demo`, or a capture (.nc/.zarr), which is analysed first into its "
            "analysis folder, the folder `attncoda analyze` writes (beside the capture, its "
            "name without suffix: emma.nc -> emma/). The page embeds every figure and table, has no script and loads "
            "nothing from the network, so it opens offline and can be sent as one file."
        ),
    )
    p.add_argument("path", metavar="PATH", help="an analysis folder or a .nc/.zarr capture")
    add_out(p, "the HTML file", metavar="FILE", shown="report.html in the analysis folder")
    p.add_argument("--rows", metavar="DATASET", help="with a capture: a second capture of rows")
    add_n_boot(p, 200)  # used when PATH is a capture, analysed first
    add_force(p)
    add_quiet(p)
    p.set_defaults(func=_cmd_report, _parser=p)


def _cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise usage(f"no such folder or dataset: {args.path}")
    is_capture = path.suffix in (".nc", ".zarr") and not _is_analysis_folder(path)
    if args.out is not None:
        ac.check_report(args.out, overwrite=args.force)
    if is_capture:
        folder = analysis_folder(args.path)
        ns = argparse.Namespace(
            dataset=args.path,
            rows=args.rows,
            metrics="cosine,js,tv,aitchison",
            n_boot=args.n_boot,
            threshold=0.3,
            no_figures=False,
            quiet=args.quiet,
            force=args.force,
        )
        _run_analysis(ns, folder)
    else:
        if args.rows:
            raise usage("--rows only applies to a capture, not to an analysis folder")
        folder = path
    target = ac.write_report(folder, args.out, overwrite=args.force)
    print(f"report: {target}")
    return 0


def _is_analysis_folder(path: Path) -> bool:
    try:
        ac.load_analysis(path)
    except ac.ReportError:
        return False
    return True
