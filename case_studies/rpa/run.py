"""RPA case study: baseline vs RPA vs RPA + Guardian/schedules (+ SWA-select) on Austen.

Commands (run from the repository root)::

    python -m case_studies.rpa.run ablation --seeds 0 1 2     # all stages x seeds, then report
    python -m case_studies.rpa.run train --stage rpa --seed 0  # one run
    python -m case_studies.rpa.run audit                       # CoDa audit of the seed-0 runs
    python -m case_studies.rpa.run report                      # tables + figures from results
    python -m case_studies.rpa.run ablation --size paper --device cuda   # the paper's size (GPU)

Stages (the paper's Table 5 path; every run of a seed starts from the same model
initialisation and draws its batches from the same data with the same token budget):

``baseline``
    The plain HF Llama model, warmup + cosine LR to zero.
``rpa``
    + the RPA prior (memberships, Sinkhorn alignment, bias warm-in, membership-entropy floor)
    + the context-length game (the paper's stage 2 is "+ Context game + Sinkhorn align").
``guardian``
    + the Guardian + late-phase schedules: flat LR prelude then cosine to a 10% floor, label
    smoothing 0.015, chaos warm-in, EMA of the weights (the reported weights). The same run
    also collects SWA-select snapshots (passive: they never feed back into training), whose
    selective average is the fourth stage, ``swa``.
``schedules`` (a control, not on the paper's path; ``--stages schedules``)
    The plain model with the late-phase schedules, EMA and SWA-select but no prior and no
    Guardian: separates what the schedules give from what the Guardian gives.

Outputs go under ``--out`` (default ``case_studies/rpa/results``): ``runs/<stage>_seed<k>/``
(the run folders of :class:`attncoda.hooks.rpa_checkpoints.RunFolder`: checkpoints, final
weights, the training result and the run's summary), ``results.json``, ``ablation.md``,
``audit/`` and ``figures/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import attncoda as ac
from attncoda.hooks import rpa, rpa_audit, rpa_train
from attncoda.hooks.rpa_checkpoints import RunFolder

from .._study import fixed, write_text
from .data import load_austen

STAGES = ("baseline", "rpa", "guardian")
#: control runs outside the paper's path: the late-phase schedules without RPA or Guardian
CONTROLS = ("schedules",)
ALL_STAGES = STAGES + CONTROLS
REPORTED = (
    ("baseline", "baseline", "raw"),
    ("+RPA", "rpa", "raw"),
    ("+Guardian/schedules", "guardian", "ema"),
    ("+SWA-select", "guardian", "swa_select"),
)
PAPER = {"baseline": 5.850, "+RPA": 5.536, "+Guardian/schedules": 5.455, "+SWA-select": 5.246}
CONTROL_ROWS = (
    ("baseline + schedules (EMA)", "schedules", "ema"),
    ("baseline + schedules + SWA-select", "schedules", "swa_select"),
    ("+Guardian/schedules, last weights (no EMA)", "guardian", "raw"),
)


@dataclass(frozen=True)
class Size:
    """Model and budget of one setting."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int | None
    context: int
    game_lengths: tuple[int, ...]
    tokens_per_step: int
    steps: int
    lr: float
    dropout: float = 0.0
    head_dim: int | None = None  # default hidden // heads


SIZES = {
    # two CPU cores, a few minutes per run
    "small": Size(
        hidden=192,
        layers=4,
        heads=4,
        ffn=512,
        vocab=4096,
        context=128,
        game_lengths=(64, 128),
        tokens_per_step=2048,
        steps=300,
        lr=2e-3,
    ),
    # the paper's WT2 model size (d 510, 12 layers, 6 heads; dense FFN instead of its MoE),
    # SmolLM2's full vocabulary, 48 x 512 tokens per step, 8030 steps: a GPU run. Heads of 84
    # dims, not the paper's 85: rotary position embeddings need an even head size
    "paper": Size(
        hidden=510,
        layers=12,
        heads=6,
        ffn=2040,
        vocab=None,
        context=512,
        game_lengths=(384, 512),
        tokens_per_step=24576,
        steps=8030,
        lr=6e-4,
        dropout=0.09,
        head_dim=84,
    ),
    # the test size: seconds
    "tiny": Size(
        hidden=64,
        layers=2,
        heads=2,
        ffn=128,
        vocab=1024,
        context=64,
        game_lengths=(32, 64),
        tokens_per_step=512,
        steps=30,
        lr=2e-3,
    ),
}


def build_model(size: Size, vocab_size: int, seed: int, device: str) -> Any:
    """A Llama-style causal LM from a config; the same seed gives the same weights."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden,
        intermediate_size=size.ffn,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        head_dim=size.head_dim or size.hidden // size.heads,
        max_position_embeddings=size.context,
        tie_word_embeddings=True,
        attention_dropout=size.dropout,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device)


def stage_config(
    stage: str, size: Size, seed: int, args: argparse.Namespace
) -> rpa_train.TrainConfig:
    """The TrainConfig of a stage (see the module docstring)."""
    steps = args.steps or size.steps
    base = rpa_train.TrainConfig(
        steps=steps,
        context=size.context,
        tokens_per_step=size.tokens_per_step,
        lr=size.lr,
        schedule="cosine",
        control_every=max(1, steps // 40),
        checkpoints=args.checkpoints,
        checkpoint_spacing="log",
        seed=seed,
    )
    if stage == "baseline":
        return base
    late = {
        "schedule": "floor",
        "flat_frac": 0.2,
        "lr_floor": 0.1,
        "label_smoothing": 0.015,
        "chaos": not args.no_chaos,
        "ema": True,
        "swa_select": rpa_train.SWASelectConfig(),
    }
    if stage == "schedules":  # control: the late-phase schedules on the plain model
        return replace(base, **late)  # type: ignore[arg-type]
    game = None
    if not args.no_context_game:
        game = rpa_train.ContextGameConfig(lengths=size.game_lengths, every=max(1, steps // 8))
    cfg = replace(base, context_game=game, warm_frac=0.15)
    if stage == "rpa":
        return cfg
    if stage != "guardian":
        raise SystemExit(f"unknown stage {stage!r}; choose from {', '.join(ALL_STAGES)}")
    return replace(cfg, guardian=rpa_train.GuardianConfig(), **late)  # type: ignore[arg-type]


def run_dir(out: Path, stage: str, seed: int) -> RunFolder:
    return RunFolder(out / "runs" / f"{stage}_seed{seed}")


def train_one(stage: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    size = SIZES[args.size]
    if args.tokens_per_step:
        size = replace(size, tokens_per_step=args.tokens_per_step)
    out = Path(args.out)
    run = run_dir(out, stage, seed)
    # before any work: a rerun replaces a run folder attncoda wrote, never a folder of the user's
    ac.check_output(run.path, overwrite=True, kind="folder", what="run folder")
    austen = load_austen(context=size.context, vocab=size.vocab, cache_dir=out / "data")
    data = austen.data
    if args.eval_chunks:  # smoke runs: fewer control / validation chunks (numbers not comparable)
        data = rpa_train.TokenData(
            data.train, data.control[: args.eval_chunks], data.validation[: args.eval_chunks]
        )
    model = build_model(size, austen.vocab_size, seed, args.device)
    prior = None
    if stage not in ("baseline", "schedules"):
        prior = rpa.RPAPrior.for_model(model, rpa.RPAConfig(), seed=seed + 10_000)
    cfg = stage_config(stage, size, seed, args)
    summary: dict[str, Any] = {}

    def write_summary(staged: RunFolder, res: rpa_train.TrainResult) -> None:
        # into the staged run folder: the summary arrives with the run, or neither does
        n_params = sum(p.numel() for p in model.parameters())
        summary.update(
            {
                "stage": stage,
                "seed": seed,
                "size": args.size,
                "val_ce": res.val_ce,
                "seconds": res.seconds,
                "tokens": res.tokens,
                "model_parameters": n_params,
                "prior_parameters": sum(p.numel() for p in prior.parameters()) if prior else 0,
                "final_tau": float(prior.tau[0]) if prior is not None else None,
                "swa_used": res.swa_used,
                "swa_accepted": len(res.swa_accepted),
                "context_mixture": {str(k): v for k, v in res.context_mixture.items()},
                "data": austen.describe(),
                "eval_chunks": args.eval_chunks,
                "tf32": args.tf32,
                "train_config": cfg.to_json(),
                "size_config": asdict(size),
            }
        )
        staged.summary.write_text(json.dumps(summary, indent=2))

    res = rpa_train.train(
        model,
        prior,
        data,
        cfg,
        out_dir=run.path,
        overwrite=True,
        on_complete=write_summary,
        progress=not args.quiet,
        desc=f"{stage} seed {seed}",
    )
    if not args.quiet:
        ce = ", ".join(f"{k} {v:.4f}" for k, v in res.val_ce.items())
        print(f"{stage} seed {seed}: validation CE {ce} ({res.seconds / 60:.1f} min)", flush=True)
    return summary


def collect(out: Path) -> list[dict[str, Any]]:
    """The summaries of the finished runs under ``out/runs``, in folder order."""
    folders = sorted(p for p in (out / "runs").glob("*") if p.is_dir())
    runs = [RunFolder(p) for p in folders]
    return [json.loads(r.summary.read_text()) for r in runs if r.summary.is_file()]


def report(args: argparse.Namespace) -> str:
    """Write results.json, ablation.md and the training-curve figure; return the markdown."""
    out = Path(args.out)
    runs = collect(out)
    if not runs:
        raise SystemExit(f"no runs under {out / 'runs'}; run `ablation` or `train` first")
    write_text(out / "results.json", json.dumps(runs, indent=2))
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["stage"], r["seed"]): r for r in runs}
    lines = [
        "| stage | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | Δ vs baseline | Δ from prev | paper (WT2) |",
        "|---|" + "---|" * (len(seeds) + 4),
    ]
    prev_mean = base_mean = None
    for label, stage, key in REPORTED:
        vals = [by[(stage, s)]["val_ce"].get(key) if (stage, s) in by else None for s in seeds]
        got = [v for v in vals if v is not None]
        mean = statistics.fmean(got) if got else None
        if label == "baseline":
            base_mean = mean
        cells = [fixed(v, 4) if v is not None else "–" for v in vals]
        d_base = (
            fixed(mean - base_mean, 4, plus=True)
            if mean is not None and base_mean is not None
            else "–"
        )
        d_prev = (
            fixed(mean - prev_mean, 4, plus=True)
            if mean is not None and prev_mean is not None
            else "–"
        )
        mtxt = fixed(mean, 4) if mean is not None else "–"
        if len(got) > 1:
            mtxt += f" ± {fixed(statistics.stdev(got), 4)}"
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {mtxt} | {d_base} | {d_prev} "
            f"| {fixed(PAPER[label], 3)} |"
        )
        prev_mean = mean if mean is not None else prev_mean
    controls = []
    for label, stage, key in CONTROL_ROWS:
        vals = [by[(stage, s)]["val_ce"].get(key) if (stage, s) in by else None for s in seeds]
        got = [v for v in vals if v is not None]
        if not got:
            continue
        mean = statistics.fmean(got)
        mtxt = fixed(mean, 4) + (f" ± {fixed(statistics.stdev(got), 4)}" if len(got) > 1 else "")
        cells = [fixed(v, 4) if v is not None else "–" for v in vals]
        d_base = fixed(mean - base_mean, 4, plus=True) if base_mean is not None else "–"
        controls.append(f"| {label} | " + " | ".join(cells) + f" | {mtxt} | {d_base} |")
    if controls:
        controls = [
            "",
            "Controls (not on the paper's path):",
            "",
            "| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | Δ vs baseline |",
            "|---|" + "---|" * (len(seeds) + 2),
            *controls,
        ]
    extra = [
        *controls,
        "",
        "| run | minutes | tokens | final tau | SWA snapshots (used) | context mix |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        tau = fixed(r["final_tau"], 3) if r["final_tau"] is not None else "–"
        swa = (
            f"{r['swa_accepted']} ({'yes' if r['swa_used'] else 'no'})"
            if r["stage"] in ("guardian", "schedules")
            else "–"
        )
        mix = ", ".join(f"{k}:{fixed(v, 2)}" for k, v in r["context_mixture"].items()) or "–"
        extra.append(
            f"| {r['stage']} seed {r['seed']} | {fixed(r['seconds'] / 60, 1)} | {r['tokens']} "
            f"| {tau} | {swa} | {mix} |"
        )
    md = "\n".join(
        ["## Validation cross-entropy (nats/token, held-out Persuasion)", "", *lines, *extra, ""]
    )
    write_text(out / "ablation.md", md)
    _figure_curves(out, runs)
    write_runs_table(out)
    write_control_curves(out)
    return md


def _figure_curves(out: Path, runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {
        "baseline": "tab:grey",
        "rpa": "tab:blue",
        "guardian": "tab:red",
        "schedules": "tab:green",
    }
    for r in runs:
        path = run_dir(out, r["stage"], r["seed"]).result
        hist = json.loads(path.read_text())["history"]
        ctl = [(h["step"], h["control_ce"]) for h in hist if "control_ce" in h]
        if ctl:
            xs, ys = zip(*ctl, strict=True)
            axes[0].plot(
                xs,
                ys,
                color=colours[r["stage"]],
                alpha=0.7,
                label=r["stage"] if r["seed"] == 0 else None,
            )
        taus = [(h["step"], h["tau"]) for h in hist if "tau" in h]
        if taus and r["stage"] == "guardian":
            xs, ys = zip(*taus, strict=True)
            axes[1].plot(xs, ys, color="tab:red", alpha=0.7)
    axes[0].set(xlabel="step", ylabel="control CE (nats)", title="training (control set)")
    axes[0].legend()
    axes[1].set(xlabel="step", ylabel="tau_att", title="Guardian temperature")
    fig.tight_layout()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    ac.save_figure(fig, out / "figures" / "training_curves.png", formats=["png"], dpi=120)
    plt.close(fig)


def audit(args: argparse.Namespace) -> str:
    """CoDa audit of one seed: entropy trajectories side by side and the prior's perturbation
    (:func:`audit_seed`); the markdown."""
    return audit_seed(Path(args.out), args.seed)[1]


def _figure_audit(out: Path, result: dict[str, Any], seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(result)
    fig, axes = plt.subplots(2, len(stages), figsize=(4.2 * len(stages), 7), squeeze=False)
    for j, stage in enumerate(stages):
        tr = result[stage]["trajectory"]
        final = tr.isel(checkpoint=-1)
        ax = axes[0, j]
        im = ax.imshow(final.sink_share.values, vmin=0, vmax=1, cmap="viridis")
        ax.set(title=f"{stage}: sink share (final)", xlabel="head", ylabel="layer")
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax = axes[1, j]
        labels = [str(c).replace("step", "") for c in tr.checkpoint.values]
        s = tr.delta_sink_path.mean(("layer", "head")).values
        c = tr.delta_content_path.mean(("layer", "head")).values
        ax.plot(labels, s, "o-", label="sink part")
        ax.plot(labels, c, "s-", label="content part")
        ax.plot(labels, s + c, "k--", label="total ΔH")
        ax.set(title=f"{stage}: entropy change split", xlabel="step", ylabel="ΔH (nats)")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=8)
    fig.tight_layout()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    ac.save_figure(fig, out / "figures" / f"audit_seed{seed}.png", formats=["png"], dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m case_studies.rpa.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", default="case_studies/rpa/results", help="output folder")
        p.add_argument("--size", choices=tuple(SIZES), default="small")
        p.add_argument("--steps", type=int, default=None, help="override the size's steps")
        p.add_argument(
            "--tokens-per-step",
            type=int,
            default=None,
            help="override the size's tokens per step (e.g. for a smaller GPU)",
        )
        p.add_argument(
            "--eval-chunks",
            type=int,
            default=None,
            help="use only the first N control and validation chunks (smoke runs only)",
        )
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        p.add_argument(
            "--tf32",
            action="store_true",
            help="allow TF32 matrix products on CUDA: several times faster than fp32 on Ampere "
            "and later GPUs, results differ from fp32 in the 3rd-4th digit (recorded in "
            "each run's summary)",
        )
        p.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch CPU threads (1 is fastest on shared cores; default 1)",
        )
        p.add_argument("--checkpoints", type=int, default=7, help="log-spaced checkpoints per run")
        p.add_argument("--no-context-game", action="store_true", help="ablate the context game")
        p.add_argument("--no-chaos", action="store_true", help="ablate the chaos warm-in")
        p.add_argument("-q", "--quiet", action="store_true")

    p = sub.add_parser("train", help="one run")
    common(p)
    p.add_argument("--stage", choices=ALL_STAGES, required=True)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("ablation", help="every stage for every seed, then the report")
    common(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--stages", nargs="+", choices=ALL_STAGES, default=list(STAGES))
    p.add_argument("--skip-existing", action="store_true", help="keep runs that finished")
    p = sub.add_parser("report", help="tables and figures from finished runs")
    common(p)
    p = sub.add_parser("audit", help="CoDa audit of one seed's runs")
    common(p)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tf32 and not str(args.device).startswith("cuda"):
        parser.error(f"--tf32 applies to CUDA devices only, not --device {args.device}")
    torch.set_num_threads(args.threads)
    with _matmul_tf32(args.tf32):
        return _run(args)


@contextmanager
def _matmul_tf32(enabled: bool) -> Iterator[None]:
    """Allow TF32 CUDA matrix products inside the block (a process-wide switch), then restore."""
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if enabled:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.command == "train":
        train_one(args.stage, args.seed, args)
    elif args.command == "ablation":
        for seed in args.seeds:
            for stage in args.stages:
                if args.skip_existing and run_dir(Path(args.out), stage, seed).summary.is_file():
                    continue
                train_one(stage, seed, args)
        print(report(args))
    elif args.command == "report":
        print(report(args))
    elif args.command == "audit":
        print(audit(args))
    if not args.quiet:
        print(f"done in {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def write_runs_table(out: Path) -> pd.DataFrame:
    """``runs.csv``: one row per run, from ``results.json`` (flat, for tables and golden)."""
    runs = json.loads((out / "results.json").read_text())
    rows = []
    for r in runs:
        rows.append(
            {
                "stage": r["stage"],
                "seed": r["seed"],
                "val_ce_raw": r["val_ce"].get("raw"),
                "val_ce_ema": r["val_ce"].get("ema"),
                "val_ce_swa_select": r["val_ce"].get("swa_select"),
                "final_tau": r["final_tau"],
                "swa_accepted": r["swa_accepted"],
                "swa_used": r["swa_used"],
                "context_mixture": ", ".join(
                    f"{k}:{v:.6f}" for k, v in r["context_mixture"].items()
                ),
                "tokens": r["tokens"],
                "model_parameters": r["model_parameters"],
                "prior_parameters": r["prior_parameters"],
                "seconds": r["seconds"],
            }
        )
    df = pd.DataFrame(rows)
    ac.write_table(df, out / "runs.csv")
    return df


def write_control_curves(out: Path) -> pd.DataFrame:
    """``control_curves.csv``: every run's control-set evaluations during training (step,
    control CE, learning rate, training CE; for runs with a prior also tau_att and the
    normalised membership entropy), from the run folders' ``result.json``."""
    keep = ("step", "control_ce", "lr", "train_ce", "tau", "mu_entropy", "sat_frac")
    rows = []
    for r in collect(out):
        hist = json.loads(run_dir(out, r["stage"], r["seed"]).result.read_text())["history"]
        for h in hist:
            if "control_ce" in h:
                rows.append({"stage": r["stage"], "seed": r["seed"], **{k: h.get(k) for k in keep}})
    df = pd.DataFrame(rows)
    ac.write_table(df, out / "control_curves.csv")
    return df


def write_audit_tables(out: Path, result: dict[str, Any], seed: int) -> None:
    """``audit_trajectory.csv`` and ``audit_perturbation.csv``: the audit's means at full
    precision (the ``.nc`` datasets under ``audit/`` are not committed)."""
    traj, pert = [], []
    for stage, res in result.items():
        ds = res["trajectory"]
        for i, label in enumerate(ds["checkpoint"].values):
            sel = ds.isel(checkpoint=i)
            traj.append(
                {
                    "stage": stage,
                    "seed": seed,
                    "checkpoint": str(label),
                    "step": int(str(label).removeprefix("step")),
                    "entropy": float(sel.entropy.mean()),
                    "sink_share": float(sel.sink_share.mean()),
                    "content_entropy": float(sel.content_entropy.mean()),
                    "delta_entropy": float(sel.delta_entropy.mean()),
                    "delta_sink": float(sel.delta_sink.mean()),
                    "delta_content": float(sel.delta_content.mean()),
                    "sink_fraction": float(sel.sink_fraction),
                    "sink_fraction_path": float(sel.sink_fraction_path),
                    "entropy_no_prior": float(sel.entropy_no_prior.mean()),
                    "sink_share_no_prior": float(sel.sink_share_no_prior.mean()),
                    "sink_fraction_path_no_prior": float(sel.sink_fraction_path_no_prior),
                }
            )
        p = res.get("perturbation")
        if p is None:
            continue
        for layer in p["layer"].values:
            s = p.sel(layer=layer).mean("head")
            pert.append(
                {
                    "stage": stage,
                    "seed": seed,
                    "layer": int(layer),
                    **{
                        v: float(s[v])
                        for v in (
                            "aitchison_sink",
                            "aitchison_content",
                            "sink_fraction",
                            "entropy_without",
                            "entropy_with",
                            "delta_entropy",
                            "delta_entropy_sink",
                            "delta_entropy_content",
                            "sink_share_without",
                            "sink_share_with",
                        )
                    },
                    "perturbation_max_error": float(p.attrs["perturbation_max_error"]),
                }
            )
    ac.write_table(pd.DataFrame(traj), out / "audit_trajectory.csv")
    ac.write_table(pd.DataFrame(pert), out / "audit_perturbation.csv")


def audit_seed(out: Path, seed: int) -> tuple[dict[str, Any], str]:
    """The audit of every run of ``seed``: ``audit/``, ``audit_seed<k>.md`` and the CSVs; the
    datasets per stage and the markdown."""
    result: dict[str, Any] = {}
    parts = []
    for stage in ALL_STAGES:
        run = run_dir(out, stage, seed)
        if not run.audit_ids.is_file():
            continue
        res = rpa_audit.audit_rpa(
            run.path, out=out / "audit" / f"{stage}_seed{seed}", overwrite=True
        )
        result[stage] = res
        parts += [f"# {stage} (seed {seed})", "", rpa_audit.audit_markdown(res)]
    if not result:
        raise SystemExit(f"no runs for seed {seed} under {out / 'runs'}")
    md = "\n".join(parts)
    write_text(out / "audit" / f"audit_seed{seed}.md", md)
    write_audit_tables(out, result, seed)
    _figure_audit(out, result, seed)
    return result, md
