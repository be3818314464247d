"""What the subcommands of ``attncoda`` share: one spelling of each common option, the argument
types, the one-line :class:`CommandError`, and the loaders of models, texts and datasets.

Options shared by the commands are defined here once, each with one spelling, metavar, type and
help text, and every command shows its defaults the same way, ``(default: X)``: ``--out``
(output file or folder), ``--force`` (replace an output attncoda wrote), ``--threads`` (torch
CPU threads), ``-q/--quiet`` (no progress bars), ``--passages``, ``--max-tokens``, ``--n-boot``,
``--layers/--heads/--queries`` (an index list ``0,3,-1``, a slice ``2:10:2`` or ``all``), and on
every command that runs a model ``--device`` and ``--dtype``.

A command that runs a model checks every option against the model's configuration before its
weights load (:func:`check_model_options`): the device, the layer and head selections, and the
token counts against the model's context.

Examples
--------
>>> from attncoda.cli._common import parse_index
>>> parse_index("all"), parse_index("0,3,-1"), parse_index("2:10:2")
(None, [0, 3, -1], slice(2, 10, 2))
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attncoda as ac
from attncoda import EXIT_FAILURE, EXIT_USAGE, AttncodaError

PROG = "attncoda"


class CommandError(AttncodaError):
    """An error of the command line, reported as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return self.code


def print_error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def fail(message: str, code: int = EXIT_FAILURE) -> Exception:
    """A :class:`CommandError` to raise: one line, exit ``code`` (default 1, the run failed)."""
    return CommandError(message, code)


def usage(message: str) -> Exception:
    """A :class:`CommandError` for bad usage (exit 2)."""
    return fail(message, EXIT_USAGE)


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


def _whole(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def positive(text: str) -> int:
    """An option's whole number >= 1."""
    return _whole(text, 1)


def non_negative(text: str) -> int:
    """An option's whole number >= 0."""
    return _whole(text, 0)


def threads(text: str) -> int:
    """``--threads``: a whole number from 1 to the machine's CPU count."""
    value = positive(text)
    cpus = os.cpu_count() or 1
    if value > cpus:
        raise argparse.ArgumentTypeError(
            f"must be at most {cpus} (this machine's CPUs), got {value}"
        )
    return value


def _default(shown: str | None) -> str:
    """The ``(default: X)`` suffix of a help text: ``shown``, else argparse's own default."""
    return f" (default: {shown if shown is not None else '%(default)s'})"


def add_out(
    p: argparse.ArgumentParser,
    what: str,
    *,
    metavar: str = "DIR",
    default: str | None = None,
    shown: str | None = None,
) -> None:
    """``--out``: the output (``what``), refused if it exists unless ``--force``."""
    p.add_argument("--out", metavar=metavar, default=default, help=what + _default(shown))


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=threads,
        metavar="N",
        help="torch CPU threads, 1 to the number of CPUs"
        + _default("1 when the machine is busy, else torch's default"),
    )


def add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output (only one that attncoda wrote; anything else is "
        "never touched)",
    )


def add_quiet(p: argparse.ArgumentParser, help: str = "no progress bars") -> None:
    p.add_argument("-q", "--quiet", action="store_true", help=help)


def add_passages(p: argparse.ArgumentParser, default: int | None, shown: str | None = None) -> None:
    p.add_argument(
        "--passages",
        type=positive,
        default=default,
        metavar="N",
        help="passages of the text, one sample each" + _default(shown),
    )


def add_max_tokens(
    p: argparse.ArgumentParser, default: int | None, shown: str | None = None
) -> None:
    p.add_argument(
        "--max-tokens",
        type=positive,
        default=default,
        metavar="T",
        help="tokens per passage; longer ones are truncated" + _default(shown),
    )


def add_n_boot(p: argparse.ArgumentParser, default: int | None, shown: str | None = None) -> None:
    p.add_argument(
        "--n-boot",
        type=non_negative,
        default=default,
        metavar="N",
        help="bootstrap replicates of the flip-rate intervals" + _default(shown),
    )


def analysis_folder(dataset: str | Path) -> Path:
    """The default analysis folder of a capture, for ``analyze`` and ``report`` alike: beside
    the dataset, its name without suffix (``runs/emma.nc`` -> ``runs/emma``).

    Examples
    --------
    >>> str(analysis_folder("runs/emma.nc")), str(analysis_folder("emma.zarr/"))
    ('runs/emma', 'emma')
    >>> str(analysis_folder(".emma.nc"))
    '.emma'
    """
    p = Path(str(dataset).rstrip("/"))
    hidden = p.name[: len(p.name) - len(p.name.lstrip("."))]  # ``.emma.nc`` -> ``.emma``
    stem = hidden + p.name[len(hidden) :].split(".")[0]
    if stem.strip(".") == "" or stem == p.name:
        raise ac.InputError(
            f"{str(dataset)!a} has no name to give its analysis folder once its suffix is "
            "removed: name one with --out DIR"
        )
    return p.with_name(stem)


def check_out_folder(path: str | Path, force: bool, what: str = "--out") -> Path:
    """Refuse, before any work, an output folder that may not or cannot be written."""
    return ac.check_output(path, overwrite=force, kind="folder", what=what)


#: ``--dtype`` choices: ``attncoda.hooks.zoo.DTYPES`` (spelt here too: the parser is built
#: without importing torch; a test keeps the two equal).
DTYPES = ("float32", "bfloat16", "float16", "auto")


def add_device(p: argparse.ArgumentParser, shown: str = "cpu") -> None:
    """``--device``: the torch device to compute on; checked before anything loads."""
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="torch device to compute on: cpu, cuda, cuda:N or mps" + _default(shown),
    )


def add_dtype(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the weight dtype of the model."""
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weight dtype; attention statistics are computed in float32 whatever it is "
        "(auto: the checkpoint's own)" + _default(None),
    )


def check_device(device: str | None) -> str:
    """Refuse, before anything loads, a ``--device`` this machine does not have."""
    if device is None:
        return "cpu"
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import zoo

    try:
        return zoo.check_device(device)
    except zoo.DeviceError as exc:
        raise usage("--" + str(exc)) from exc


def check_model(name: str) -> str:
    """Refuse, before anything loads, a MODEL that is none of the accepted forms."""
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import zoo

    return zoo.check_model(name)


def check_model_options(
    name: str,
    *,
    layers: list[int] | slice | None = None,
    heads: list[int] | slice | None = None,
    tokens: dict[str, int | None] | None = None,
) -> Any:
    """Check MODEL and the options that depend on it against its configuration, which is read
    without the weights (:func:`attncoda.hooks.zoo.load_config`); return its ``ModelShape``.

    ``tokens`` maps an option (``"--max-tokens"``, ``"--window"``) to its value, each refused
    when it exceeds the model's positions. A hub id that can be neither reached nor found in the
    local hub cache is refused here, at once.
    """
    check_model(name)
    from attncoda.hooks import zoo

    shape = zoo.model_shape(zoo.load_config(name))
    for flag, sel, n in (("--layers", layers, shape.layers), ("--heads", heads, shape.heads)):
        check_selection(flag, sel, n, name)
    for flag, value in (tokens or {}).items():
        if value is not None and shape.context is not None and value > shape.context:
            raise usage(
                f"{flag} {value} is beyond the {shape.context} positions of {name} "
                f"(max_position_embeddings); use at most {shape.context}"
            )
    return shape


def check_selection(
    flag: str, sel: list[int] | slice | None, n: int, name: str, what: str | None = None
) -> list[int] | None:
    """Refuse a ``--layers/--heads/--sample`` selection that ``n`` items cannot satisfy: an empty
    slice, an index out of range, an item named twice; return the indices picked (None: all).

    ``what`` names the items in messages (default: the flag's name, ``--heads`` -> heads).

    Examples
    --------
    >>> check_selection("--sample", slice(1, None), 3, "rows.nc", "samples")
    [1, 2]
    """
    what = what or flag.removeprefix("--")
    if isinstance(sel, slice):
        picked = list(range(n)[sel])
        if not picked:
            raise usage(f"{flag} {unparse(sel)} selects none of the {n} {what} of {name}")
        return picked
    for i in sel or ():
        if not -n <= i < n:
            raise usage(
                f"{flag} {i} is out of range: {name} has {n} {what} (indices {-n}..{n - 1})"
            )
    if sel is not None and len({i % n for i in sel}) != len(sel):
        raise usage(f"{flag} {unparse(sel)} names one of the {what} twice")
    return None if sel is None else [i % n for i in sel]


def set_threads(threads: int | None) -> int | None:
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks.demo import auto_threads

    n = threads if threads is not None else auto_threads()
    if n is not None:
        import torch

        torch.set_num_threads(n)
    return n


def unparse(value: Any) -> str:
    if isinstance(value, slice):
        parts = (value.start, value.stop) + ((value.step,) if value.step is not None else ())
        return ":".join("" if v is None else str(v) for v in parts)
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def command_line(args: argparse.Namespace) -> str:
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
                [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, unparse(value)]
            )
    return shlex.join(parts)


MODEL_HELP = (
    "a zoo name (smollm2-135m, gemma3-270m, minilm-l6 load offline after `attncoda fetch`; "
    "`attncoda fetch --list`), a local checkpoint directory, a hub id org/name (needs a "
    "reachable hub), or twin:FAMILY for a tiny random twin (tests)"
)


def load_model(name: str, device: str | None = None, dtype: str = "float32") -> tuple[Any, Any]:
    """The model and tokenizer of a MODEL argument, through the one loader (``zoo.load``)."""
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import zoo

    model, tokenizer = zoo.load(name, device=device or "cpu", dtype=dtype)
    if tokenizer is None:
        raise usage(
            f"{name!r} has no tokenizer files; save the tokenizer next to the checkpoint "
            "(tokenizer.save_pretrained(DIR))"
        )
    return model, tokenizer


def read_texts(files: Sequence[str], corpus: str | None) -> list[tuple[str, str]]:
    """``(label, text)`` of each text file (``-`` is stdin) and of the corpus ``NAME[:DOC]``."""
    texts: list[tuple[str, str]] = []
    for f in files:
        if f == "-":
            texts.append(("stdin", sys.stdin.read()))
            continue
        path = Path(f)
        if not path.is_file():
            raise usage(f"no such text file: {f}")
        try:
            texts.append((path.name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            raise usage(f"{f} is not UTF-8 text ({exc.reason})") from exc
    if corpus:
        # attncoda.hooks imports torch: loaded when the command runs, not for --help
        from attncoda.hooks import assets

        name, _, doc = corpus.partition(":")
        asset = assets.get_asset(name)  # UnknownAssetError -> usage error
        if asset.kind != "corpus":
            corpora = ", ".join(a.name for a in assets.list_assets("corpus"))
            raise usage(f"{name!r} is a model, not a corpus; corpora: {corpora}")
        try:
            texts.append((corpus, assets.load_text(name, doc or None)))
        except KeyError as exc:
            raise usage(str(exc.args[0]) if exc.args else str(exc)) from exc
    if not texts:
        raise usage("give text files (or - for stdin) and/or --corpus NAME[:DOCUMENT]")
    return texts


def load_dataset(path: str) -> Any:
    p = Path(path)
    if not p.exists():
        raise usage(f"no such dataset: {path}")
    try:
        return ac.load(p)
    except (ValueError, OSError) as exc:
        raise usage(f"cannot read {path} as an attncoda dataset: {exc}") from exc
