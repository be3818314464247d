"""``attncoda prune``: score every head, prune the least important by each score, and measure
held-out perplexity (the tool of :mod:`attncoda.hooks.prune`)."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

from attncoda import EXIT_OK, EXIT_USAGE

from ._common import (
    MODEL_HELP,
    CommandError,
    add_device,
    add_dtype,
    add_force,
    add_out,
    add_quiet,
    add_threads,
    check_device,
    check_model_options,
    check_out_folder,
    load_model,
    non_negative,
    positive,
)

#: --fractions' default
_FRACTIONS = "0.1,0.2,0.3,0.5"
#: what --quick sets (its fractions only where --fractions was left at its default)
_QUICK: dict[str, object] = {
    "--window": 128,
    "--calibration-windows": 1,
    "--eval-windows": 1,
    "--fractions": "0.1,0.3",
}


def register(subparsers: Any) -> None:
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
    p.add_argument("model", metavar="MODEL", help="a causal LM: " + MODEL_HELP)
    add_out(p, "output folder", shown="./prune-MODEL")
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
        default=_FRACTIONS,
        help="fractions of all heads to prune (default: %(default)s; 0 is always included)",
    )
    p.add_argument(
        "--unit",
        choices=("head", "kv_group"),
        default="head",
        help="pruning unit: a query head, or a whole key/value group (default: %(default)s)",
    )
    p.add_argument(
        "--mode",
        choices=("zero", "mean"),
        default="zero",
        help="ablation: zero the head's output, or replace it by its mean over the calibration "
        "text (default: %(default)s)",
    )
    p.add_argument(
        "--window",
        type=positive,
        default=512,
        metavar="T",
        help="tokens per window, at least 3 (default: %(default)s)",
    )
    p.add_argument(
        "--calibration-windows",
        type=positive,
        default=4,
        metavar="N",
        help="windows of Emma the scores come from (default: %(default)s)",
    )
    p.add_argument(
        "--eval-windows",
        type=positive,
        default=4,
        metavar="N",
        help="windows of each evaluation text, Moby-Dick and Pride and Prejudice "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=non_negative,
        default=0,
        metavar="N",
        help="seed of the random score (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=1,
        metavar="N",
        help="windows per forward pass (default: %(default)s)",
    )
    add_device(p)
    add_dtype(p)
    add_threads(p)
    add_force(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: windows of 128 tokens, 1 calibration and 1 evaluation window per "
        "text, fractions 0.1,0.3",
    )
    add_quiet(p, "no progress bars, no table")
    p.set_defaults(func=_cmd_prune)


def _cmd_prune(args: argparse.Namespace) -> int:
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import prune
    from attncoda.hooks.evaluate import PerplexityError
    from attncoda.hooks.gates import GateError
    from attncoda.hooks.scores import SCORES, score_info

    if args.quick:
        args.window = _QUICK["--window"]
        args.calibration_windows = _QUICK["--calibration-windows"]
        args.eval_windows = _QUICK["--eval-windows"]
        if args.fractions == _FRACTIONS:
            args.fractions = _QUICK["--fractions"]
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
    device = check_device(args.device)
    out = args.out or f"prune-{Path(args.model).name.replace(':', '-')}"
    check_out_folder(out, args.force)
    # the model's config, not its weights: the window must fit its positions
    check_model_options(args.model, tokens={"--window": args.window})
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = load_model(args.model, device, args.dtype)
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
        ("--fractions", args.fractions, _FRACTIONS),
        ("--unit", args.unit, "head"),
        ("--mode", args.mode, "zero"),
        ("--window", args.window, 512),
        ("--calibration-windows", args.calibration_windows, 4),
        ("--eval-windows", args.eval_windows, 4),
        ("--seed", args.seed, 0),
        ("--batch-size", args.batch_size, 1),
        ("--threads", args.threads, None),
        ("--device", args.device, None),
        ("--dtype", args.dtype, "float32"),
    ):
        # under --quick a flag at the value --quick gives it is implied; one the user set
        # otherwise (e.g. --quick --fractions 0.1) is recorded, so the command reproduces the run
        implied = _QUICK.get(flag, default) if args.quick else default
        if value != implied:
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
