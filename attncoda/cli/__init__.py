"""The ``attncoda`` command: the application layer, above ``attncoda`` and ``attncoda.hooks``.

One module per command group registers its subcommands (``register(subparsers)``) and runs them
(``_cmd_*``); :mod:`._common` holds what they share (option spellings, argument types, loaders,
the one-line :class:`CommandError`). ``attncoda.hooks`` imports torch, so commands import it when
they run, never at module import: ``attncoda --help`` stays fast.

Errors a user can fix print one line, ``attncoda: error: ...``, on stderr, and no traceback. Every
such error is an :class:`attncoda.AttncodaError`, and its class says the exit code
(``exit_code``): 2 for bad usage (an option, argument or input the user can correct), 1 for a run
that could not complete (a corrupted file, a failed download, a full disk). Anything else is a bug:
its traceback is printed and the exit code is 70. An interrupt (Ctrl-C) exits with 130; SIGTERM
(``kill``) and SIGHUP (the terminal closed) are handled as an interrupt (outputs being written are
left as they were, staging folders removed) and exit with 143 and 129.

Examples
--------
>>> from attncoda.cli import main
>>> main(["fetch", "--list"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
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

from . import _analyze, _audit, _capture, _demo, _explore, _fetch, _prune
from ._common import PROG, CommandError, print_error

__all__ = ["EXIT_CODES", "PROG", "CommandError", "build_parser", "main"]

#: Killed with SIGTERM (``kill``), handled as an interrupt: 128 + 15.
EXIT_TERMINATED = 128 + 15
#: The terminal closed (SIGHUP), handled as an interrupt: 128 + 1.
EXIT_HANGUP = 128 + 1

#: Exit codes (documented in ``attncoda --help``).

EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_FAILURE, "the run failed (a corrupted file, a failed download, a full disk, ...)"),
    (EXIT_USAGE, "bad usage: an option, argument or input file to correct"),
    (EXIT_INTERNAL, "internal error: a bug in attncoda (traceback printed; please report it)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_HANGUP, "hung up (SIGHUP: the terminal closed), handled as an interrupt"),
    (EXIT_TERMINATED, "terminated (SIGTERM), handled as an interrupt"),
)


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C would raise ``KeyboardInterrupt``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`_Terminated` (a ``KeyboardInterrupt``) while the
    command runs, so every write cleans up as after Ctrl-C (and defers them during a swap)."""

    def raise_terminated(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    previous = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, raise_terminated)
        except (ValueError, OSError):  # not the main thread: leave the defaults
            pass
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


_REGISTER: tuple[Callable[[Any], None], ...] = (
    _demo.register,
    _fetch.register,
    _capture.register,
    _analyze.register_analyze,
    _analyze.register_report,
    _explore.register,
    _prune.register,
    _audit.register,
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``attncoda: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        where = f"{command}: " if command else ""
        hint = f"; see `{self.prog} --help`"
        print_error(f"{where}{' '.join(message.split())}{hint}")
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


def _not_utf8(args: argparse.Namespace) -> str | None:
    """The refusal of an argument that is not UTF-8 text, or None.

    Python hands bytes that are not UTF-8 (``--title $'\\xff'``) to the program as lone
    surrogates (``surrogateescape``); no page, file or store attncoda writes can hold them.
    """
    for name, value in vars(args).items():
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                option = "--" + name.replace("_", "-")
                return (
                    f"{option} holds bytes that are not UTF-8 text ({text!a}); pass it in UTF-8 "
                    "(a file name too: rename the file)"
                )
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
        (a bug), 130 when interrupted, 143 on SIGTERM, 129 on SIGHUP (:data:`EXIT_CODES`).

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
    undecodable = _not_utf8(args)
    if undecodable is not None:
        print_error(undecodable)
        return EXIT_USAGE
    try:
        with warnings.catch_warnings(), _terminate_as_interrupt():
            warnings.showwarning = _show_warning  # restored with the caller's display
            return int(args.func(args))
    except _Terminated as exc:
        name = "SIGTERM" if exc.signum == getattr(signal, "SIGTERM", 15) else "SIGHUP"
        print_error(f"{name}: stopped; outputs being written were left as they were before")
        return EXIT_TERMINATED if name == "SIGTERM" else EXIT_HANGUP
    except KeyboardInterrupt:
        print_error("interrupted; outputs being written were left as they were before")
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in {"torch", "transformers", "rdata", "gguf"}:
            print_error(
                f"{exc.name} is not installed; install the extra: pip install 'attncoda[hooks]'"
            )
            return EXIT_FAILURE
        return _internal(exc)
    except Exception as exc:
        code = _error_code(exc)
        if code is None:
            return _internal(exc)
        print_error(_cli_spelling(_one_line(str(exc) or type(exc).__name__)))
        return code


def _show_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    """A warning during a command: one line on stderr, like an error, without a source line;
    above the progress bars, not inside one (``tqdm.write`` moves an active bar below it)."""
    from tqdm import tqdm

    tqdm.write(f"{PROG}: warning: {_one_line(str(message))}", file=sys.stderr)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _cli_spelling(message: str) -> str:
    """A library message as the command line says it: the library's errors name both spellings
    of an option (``overwrite=True (--force)``); a command names only its own (``--force``).

    Examples
    --------
    >>> _cli_spelling("'x.nc' exists; pass overwrite=True (--force) to replace it")
    "'x.nc' exists; pass --force to replace it"
    """
    return message.replace("overwrite=True (--force)", "--force")


def _internal(exc: BaseException) -> int:
    """A bug: print the traceback and a last line that says so; exit 70."""
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    print_error(
        f"internal error ({type(exc).__name__}); this is a bug in attncoda {__version__}, "
        "please report it with the traceback above"
    )
    return EXIT_INTERNAL
