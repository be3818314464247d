"""RPA inference latency parity: the cached-bias forward vs the plain SDPA forward.

At inference an RPA model adds its cached ``B(T)`` (no membership computation, no controller)
through attncoda's registered attention function, as a float additive mask. The target of the
issue: RPA inference at most 1.05x the baseline forward. Measured in one process by
``benchmarks/_measure.py`` (interleaved, order rotated, process CPU time beside wall time, medians
of ``--repeats``, load stated; the machines are shared and noisy: trust the ratios):

``sdpa``
    the model's plain forward (SDPA with ``is_causal``), no plug-in: the baseline.
``rpa``
    the same model with a calibrated RPA prior attached, eval mode (cached ``B(T)``). A deployed
    model is attached once, so attaching and detaching happen outside the timer (their cost is
    reported separately, ``attach_detach_s``).
``float_mask``
    the plain forward given an explicit float causal mask (0 / finfo.min) as a custom 4-D mask:
    what SDPA costs with *any* float mask, separating the kernel's cost from the plug-in's.

Models: the case study's small Llama (hidden 192, 4 layers, vocabulary 4096; random weights)
at its training shape and at T=512, and SmolLM2-135M (the offline asset, skipped when not
fetched) at ``--length``.

Run: ``python benchmarks/bench_rpa.py [--repeats 7] [--length 512] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
from _measure import Measurement, interleave
from _measure import row as measure_row


def _small_model() -> Any:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=4096,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _paths(model: Any, prior: Any, ids: torch.Tensor) -> dict[str, tuple[Any, Callable[[], None]]]:
    """``name -> (context factory entered outside the timer, timed forward)``."""
    from contextlib import nullcontext

    from attncoda.hooks import rpa

    t = ids.shape[-1]
    neg = torch.finfo(torch.float32).min
    causal = torch.full((t, t), neg).triu(1)[None, None].expand(ids.shape[0], 1, t, t)

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def float_mask() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=causal)

    return {
        "sdpa": (nullcontext, forward),
        # a deployed RPA model is attached once; attaching (switching the attention
        # implementation, hooking the blocks) is timed separately below
        "rpa": (lambda: rpa.attached(model, prior), forward),
        "float_mask": (nullcontext, float_mask),
    }


def _measure(paths: dict[str, tuple[Any, Callable[[], None]]], repeats: int) -> Measurement:
    """The paths interleaved (``benchmarks/_measure.py``), each inside its context (entered and
    left untimed: a deployed RPA model is attached once)."""
    fns = {k: fn for k, (_, fn) in paths.items()}
    return interleave(fns, repeats, around={k: ctx for k, (ctx, _) in paths.items()})


def _attach_cost(model: Any, prior: Any, repeats: int) -> float:
    from attncoda.hooks import rpa

    def attach_detach() -> None:
        with rpa.attached(model, prior):
            pass

    return interleave({"attach": attach_detach}, repeats)["attach"].cpu_median


def _case(label: str, model: Any, ids: torch.Tensor, repeats: int) -> dict[str, Any]:
    from attncoda.hooks import rpa

    prior = rpa.RPAPrior.for_model(model, max_positions=ids.shape[-1])
    prior.calibrate(model, [ids])
    measured = _measure(_paths(model, prior, ids), repeats)
    med = {k: measured[k].cpu_median for k in measured.sides}
    row = {
        "case": label,
        "batch": int(ids.shape[0]),
        "length": int(ids.shape[-1]),
        **{f"{k}_s": v for k, v in med.items()},
        "rpa_ratio": med["rpa"] / med["sdpa"],
        "float_mask_ratio": med["float_mask"] / med["sdpa"],
        "attach_detach_s": _attach_cost(model, prior, repeats),
        **{f"{k}_wall_s": measured[k].wall_median for k in measured.sides},
        "load": measured.load.text(),
    }
    print(
        f"{label:<28} b={row['batch']:<3} T={row['length']:<5} sdpa {med['sdpa'] * 1e3:8.1f} ms  "
        f"rpa {med['rpa'] * 1e3:8.1f} ms ({row['rpa_ratio']:.3f}x)  float mask "
        f"{med['float_mask'] * 1e3:8.1f} ms ({row['float_mask_ratio']:.3f}x)  attach+detach "
        f"{row['attach_detach_s'] * 1e3:.1f} ms",
        flush=True,
    )
    return row, measured


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run``: RPA inference (cached bias) vs the baseline forward."""
    torch.set_num_threads(1)
    repeats = 3 if quick else 7
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "small Llama (case study)",
            _small_model(),
            torch.randint(0, 4096, (16, 128), generator=gen),
        )
    ]
    from attncoda.hooks import assets

    if assets.is_fetched("smollm2-135m") and assets.is_fetched("austen"):
        model, tok = assets.load_model("smollm2-135m")
        length = 256 if quick else 512
        text = assets.load_text("austen", "persuasion")
        ids = tok(text[: length * 8], return_tensors="pt").input_ids[:, :length]
        cases.append(("SmolLM2-135M (Persuasion)", model, ids))
    rows = []
    for label, model, ids in cases:
        r, measured = _case(label, model, ids, repeats)
        name = f"RPA inference, {label}, b={r['batch']} T={r['length']}"
        rows.append(
            measure_row(name, measured, "rpa", "sdpa", 1.05, anchor_label="baseline SDPA forward")
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--length", type=int, default=512, help="SmolLM2 sequence length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), medians of {args.repeats}")
    rows = []
    gen = torch.Generator().manual_seed(0)
    small = _small_model()
    for batch, length in ((16, 128), (1, 512)):
        ids = torch.randint(0, 4096, (batch, length), generator=gen)
        rows.append(_case("small Llama (case study)", small, ids, args.repeats)[0])
    from attncoda.hooks import assets

    if assets.is_fetched("smollm2-135m") and assets.is_fetched("austen"):
        model, tok = assets.load_model("smollm2-135m")
        text = assets.load_text("austen", "persuasion")
        ids = tok(text[: args.length * 8], return_tensors="pt").input_ids[:, : args.length]
        rows.append(_case("SmolLM2-135M (Persuasion)", model, ids, args.repeats)[0])
    else:
        print("SmolLM2-135M or austen not fetched: `attncoda fetch smollm2-135m austen`")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
