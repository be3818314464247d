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
    check_model,
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
    p.add_argument(
        "--stack",
        choices=("all", "encoder", "decoder", "cross"),
        default="all",
        help="an encoder-decoder's attention to capture: its encoder, decoder or cross "
        "attention, or all three, each into a file of its own (OUT's name with .encoder, "
        ".decoder, .cross before the suffix) (default: %(default)s)",
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


#: The corpus a speech model is captured over (teacher-forced: assets.teacher_forced_batch).
SPEECH_CORPUS = "austen-speech"
STACKS = ("encoder", "decoder", "cross")


def _kind_of(model: str) -> str:
    """``"speech"`` (Whisper: audio in, three stacks), ``"encoder-decoder"`` (text in, three
    stacks) or ``"text"``, from the model's config (read without its weights)."""
    from attncoda.hooks import zoo  # the registry imports neither torch nor transformers

    check_model(model)  # an unknown name in one line, before its config is looked for
    config = zoo.load_config(model)
    if getattr(config, "model_type", None) == "whisper":
        return "speech"
    return "encoder-decoder" if getattr(config, "is_encoder_decoder", False) else "text"


def stack_paths(out: Path, stack: str) -> dict[str, Path]:
    """The file of each stack an encoder-decoder capture writes: ``OUT`` with ``.encoder``,
    ``.decoder``, ``.cross`` before its suffix (one file for one stack named).

    Examples
    --------
    >>> {k: str(v) for k, v in stack_paths(Path("w.nc"), "all").items()}
    {'encoder': 'w.encoder.nc', 'decoder': 'w.decoder.nc', 'cross': 'w.cross.nc'}
    """
    names = STACKS if stack == "all" else (stack,)
    return {n: out.with_name(f"{out.stem}.{n}{out.suffix}") for n in names}


def _check_speech_options(args: argparse.Namespace, kind: str) -> None:
    if kind == "encoder-decoder":
        raise usage(
            f"{args.model} is a text encoder-decoder: `attncoda capture` feeds one text to "
            "decoder-only and encoder models; capture it in Python (attncoda.hooks.capture gives "
            "encoder, decoder and cross attention, see docs/capture.md)"
        )
    if kind == "text" and args.stack != "all":
        raise usage(f"--stack is for encoder-decoders; {args.model} has one stack of attention")
    if kind != "speech":
        return
    if args.texts or (args.corpus or "").split(":", 1)[0] != SPEECH_CORPUS:
        raise usage(
            f"{args.model} is a speech model: it reads audio, so pass --corpus {SPEECH_CORPUS} "
            "(passages of Austen spoken by espeak-ng; `attncoda fetch austen-speech`) and no "
            "text files"
        )
    if args.queries is not None:
        raise usage("--queries is not taken for a speech model: every stack keeps its queries")


def _cmd_capture(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in (".nc", ".zarr"):
        raise usage(f"--out must end in .nc or .zarr, got {args.out!r}")
    kind = _kind_of(args.model)
    _check_speech_options(args, kind)
    if kind == "speech":
        return _capture_speech(args, out)
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


def _capture_speech(args: argparse.Namespace, out: Path) -> int:
    """Whisper over the speech corpus: each clip's audio in the encoder, its text (after the
    transcription prompt) in the decoder, teacher-forced; one dataset per stack."""
    paths = stack_paths(out, args.stack)
    for path in paths.values():
        ac.check_save(path, overwrite=args.force)  # before any work: exists? writable?
    device = check_device(args.device)
    check_model_options(args.model, layers=args.layers, heads=args.heads)
    sink = _parse_sink(args.sink, 1500)  # a cross-attention sink is one of the 1500 frames
    from attncoda.hooks import CaptureError, assets, capture

    clips = assets.load_speech(SPEECH_CORPUS)
    wanted = (args.corpus or "").split(":", 1)[1:] or None
    names = [n for n in clips if wanted is None or n == wanted[0]]
    if not names:
        raise usage(f"--corpus {args.corpus}: no such clip; clips: {', '.join(clips)}")
    names = names[: args.passages]
    set_threads(args.threads)
    started = time.perf_counter()
    model, processor = load_model(args.model, device, args.dtype)
    import torch

    layers = {n: args.layers for n in paths}
    heads = {n: args.heads for n in paths}
    max_tokens = args.max_tokens or MAX_TOKENS
    try:
        with torch.no_grad(), capture(
            model, what=args.what, layers=layers, heads=heads, sink=sink,
            tokenizer=processor.tokenizer,
        ) as cap:  # fmt: skip
            for name in names:
                audio, text = clips[name]
                model(
                    **assets.teacher_forced_batch(
                        processor, audio, text, max_tokens=max_tokens, device=device
                    )
                )
        datasets = cap.datasets
    except CaptureError as exc:
        raise usage(str(exc)) from exc
    for stack, path in paths.items():
        ds = datasets[stack]
        if stack != "decoder":  # the keys are audio frames: label each by its time
            ds = _frame_labels(ds)
        ds.attrs["command"] = command_line(args)
        ds.attrs["texts"] = ", ".join(names)
        written = ac.save(ds, path, overwrite=args.force)
        sizes = ", ".join(f"{k} {v}" for k, v in ds.sizes.items())
        print(f"wrote {written} ({stack} attention; {sizes})")
    print(
        f"{len(names)} clip{'s' if len(names) > 1 else ''} in {time.perf_counter() - started:.0f} s"
    )
    if not args.quiet:
        first = next(iter(paths.values()))
        print(
            f"next: attncoda explore {shlex.quote(str(first))} (with --what rows), or attncoda "
            f"analyze {shlex.quote(str(first))}"
        )
    return 0


#: Seconds of audio a Whisper encoder position covers (30 s in 1500 positions).
FRAME_SECONDS = 0.02


def _frame_labels(ds: Any) -> Any:
    """``token`` labels ``"1.24s"`` for the audio frames along ``position``: what the explorer,
    the head view and the report show for a key that is a moment of the clip, not a token."""
    import numpy as np

    times = [f"{int(p) * FRAME_SECONDS:.2f}s" for p in ds["position"].values]
    labels = np.array([times] * ds.sizes["sample"], dtype=str)
    return ds.assign_coords(token=(("sample", "position"), labels))
