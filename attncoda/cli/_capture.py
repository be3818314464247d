"""``attncoda capture``: attention summaries or rows of a model over text passages."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

import attncoda as ac

from ._common import (
    MODEL_HELP,
    add_device,
    add_dtype,
    add_force,
    add_max_tokens,
    add_out,
    add_passages,
    add_quiet,
    add_threads,
    analysis_folder,
    check_device,
    check_model_options,
    command_line,
    load_model,
    parse_index,
    positive,
    read_texts,
    set_threads,
    usage,
)

#: Tokens per passage when --max-tokens is not given (fewer if the model has fewer positions).
MAX_TOKENS = 128


def register(subparsers: Any) -> None:
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
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="UTF-8 text files ('-': stdin)")
    p.add_argument(
        "--corpus",
        metavar="NAME[:DOC]",
        help="an offline corpus (austen, mobydick, wikipedia, web: see 'attncoda fetch --list') and "
        "optionally one document, e.g. austen:emma or web:Genesis",
    )
    add_passages(p, 16)
    p.add_argument(
        "--min-words",
        type=positive,
        default=40,
        metavar="N",
        help="shortest paragraph used, in words (default: %(default)s)",
    )
    add_max_tokens(p, None, shown=f"{MAX_TOKENS}, or the model's positions if fewer")
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
        help="first (the first valid key), learned (GPT-OSS style learned sinks), or key "
        "positions 0 or 0,1 (default: %(default)s)",
    )
    add_out(p, "output dataset, .nc or .zarr", metavar="PATH", default="capture.nc")
    add_force(p)
    add_device(p)
    add_dtype(p)
    add_threads(p)
    add_quiet(p)
    p.set_defaults(func=_cmd_capture, _parser=p)


def _parse_sink(text: str, max_tokens: int) -> Any:
    if text in ("first", "learned"):
        return text
    try:
        items = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise usage(f"--sink must be first, learned or key positions, got {text!r}") from None
    if not items:
        raise usage("--sink is empty")
    if min(items) < 0:
        raise usage(f"--sink positions count from 0, got {min(items)}")
    if max(items) >= max_tokens:
        raise usage(
            f"--sink position {max(items)} is beyond --max-tokens {max_tokens}: no passage has it"
        )
    if len(set(items)) != len(items):
        raise usage(f"--sink lists a position twice: {text!r}")
    return items[0] if len(items) == 1 else items


def _check_queries(queries: Any, max_tokens: int) -> None:
    """Query positions that no passage of at most ``max_tokens`` tokens can have."""
    if not isinstance(queries, list):
        return  # None (all) or a slice: clipped to each passage, as Python slices are
    bad = [q for q in queries if not -max_tokens <= q < max_tokens]
    if bad:
        raise usage(
            f"--queries {bad[0]} is outside the passages (at most --max-tokens {max_tokens} "
            f"tokens: positions {-max_tokens}..{max_tokens - 1})"
        )
    if len(set(queries)) != len(queries):
        raise usage("--queries lists a position twice")


def _refuse_speech(model: str) -> None:
    """Speech models read audio, which this command does not feed: one line, exit code 2."""
    from attncoda.hooks import zoo  # the registry imports neither torch nor transformers

    name = model.split(":", 1)[1] if model.startswith("twin:") else model
    try:
        family = zoo.resolve_family(name)
    except KeyError:
        return
    if family == "whisper":
        raise usage(
            f"{model} is a speech model and `attncoda capture` feeds text; capture it in Python "
            "over the speech corpus (attncoda.hooks.capture with assets.load_speech"
            "('austen-speech'), see docs/whisper.md)"
        )


def _cmd_capture(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in (".nc", ".zarr"):
        raise usage(f"--out must end in .nc or .zarr, got {args.out!r}")
    _refuse_speech(args.model)
    ac.check_save(out, overwrite=args.force)  # before any work: exists? writable?
    device = check_device(args.device)
    # the model's config, not its weights: layers, heads and tokens are checked before the load
    shape = check_model_options(
        args.model,
        layers=args.layers,
        heads=args.heads,
        tokens={"--max-tokens": args.max_tokens},
    )
    max_tokens = args.max_tokens or min(MAX_TOKENS, shape.context or MAX_TOKENS)
    sink = _parse_sink(args.sink, max_tokens)
    _check_queries(args.queries, max_tokens)
    texts = read_texts(args.texts, args.corpus)
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import CaptureError
    from attncoda.hooks.demo import capture_passages, encode_passages, select_passages

    passages: list[str] = []
    per_text = max(1, -(-args.passages // len(texts)))
    for label, text in texts:
        try:
            passages += select_passages(text, per_text, min_words=args.min_words)
        except ValueError as exc:
            raise usage(f"{label}: {exc} (lower --min-words)") from exc
    passages = passages[: args.passages]
    set_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = load_model(args.model, device, args.dtype)
    encoded = encode_passages(tokenizer, passages, max_tokens)
    try:
        ds = capture_passages(
            model,
            encoded,
            what=args.what,
            layers=args.layers,
            heads=args.heads,
            queries=args.queries,
            sink=sink,
            tokenizer=tokenizer,  # the token coordinate, and the warning for a non-special sink
            progress=not args.quiet,
            desc=f"capture {args.what}",
        )
    except CaptureError as exc:
        raise usage(str(exc)) from exc
    ds.attrs["command"] = command_line(args)
    ds.attrs["texts"] = ", ".join(label for label, _ in texts)
    path = ac.save(ds, out, overwrite=args.force)
    sizes = ", ".join(f"{k} {v}" for k, v in ds.sizes.items())
    print(f"wrote {path} ({sizes}; {time.perf_counter() - started:.0f} s)")
    if not args.quiet:
        print(
            f"next: attncoda analyze {shlex.quote(str(path))} (writes "
            f"{shlex.quote(str(analysis_folder(path)))}/), or attncoda report "
            f"{shlex.quote(str(path))} (the analysis and its HTML page)"
        )
    return 0
