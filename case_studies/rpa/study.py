"""The RPA study on the case-study machinery: ``python -m case_studies.rpa run|table|quick``.

``run`` is the whole study in one command, with the protocol of the README's results:

1. the ablation (``baseline``, ``rpa``, ``guardian``) and the ``schedules`` control, each for
   seeds 0, 1, 2, at the ``small`` size, one torch thread (:func:`case_studies.rpa.run.train_one`);
2. the report: ``results.json``, ``runs.csv``, ``control_curves.csv``, ``ablation.md``,
   ``figures/training_curves.png``;
3. the CoDa audit of seed 0 (``audit/``, ``audit_trajectory.csv``, ``audit_perturbation.csv``,
   ``figures/audit_seed0.png``);
4. the membership statistics of every run with a prior (``memberships.csv``): how far the
   learned memberships are from uniform, their entropy, sigma_r and the inference bias;
5. the inference-latency benchmark (``benchmarks/bench_rpa.py --repeats 11 --threads 1``,
   ``bench_rpa.json``).

Run folders (checkpoints, weights) and the token cache go to ``results/runs/`` and
``results/data/`` (git-ignored); everything else is committed, with ``results/manifest.json``.
``quick`` is the ``tiny`` size (the size of the tests: seconds per run) with the same steps 1-4.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import attncoda as ac

from .._study import Golden, Provenance, Study, markdown_table
from .._study import main as study_main
from .data import load_austen
from .run import (
    ALL_STAGES,
    SIZES,
    audit_seed,
    report,
    run_dir,
    train_one,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parents[1]
SEEDS = (0, 1, 2)
AUDIT_SEED = 0
BENCH = ("--repeats", "11", "--threads", "1")


def log(msg: str) -> None:
    print(f"[rpa] {msg}", file=sys.stderr, flush=True)


def run_args(out: Path, size: str = "small", **over: Any) -> argparse.Namespace:
    """The options of ``python -m case_studies.rpa.run`` with its defaults (CPU, no TF32)."""
    ns = argparse.Namespace(
        out=str(out),
        size=size,
        steps=None,
        tokens_per_step=None,
        eval_chunks=None,
        device="cpu",
        tf32=False,
        threads=1,
        checkpoints=7,
        no_context_game=False,
        no_chaos=False,
        quiet=True,
        seed=AUDIT_SEED,
    )
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


# ------------------------------------------------------------------------------------ steps


def record_tokens(out: Path, ns: argparse.Namespace, prov: Provenance) -> None:
    """The assets and the sha256 of every token tensor the runs train and evaluate on."""
    prov.asset("austen")
    prov.asset("smollm2-135m")  # the tokenizer
    size = SIZES[ns.size]
    austen = load_austen(context=size.context, vocab=size.vocab, cache_dir=out / "data")
    d = austen.data
    prov.tokens("austen/train", d.train)
    prov.tokens("austen/control (persuasion)", d.control)
    prov.tokens("austen/validation (persuasion)", d.validation)
    prov.tokens("austen/audit ids (validation[:8])", d.validation[:8])


def train_all(
    out: Path,
    ns: argparse.Namespace,
    seeds: Sequence[int],
    stages: Sequence[str],
    skip_existing: bool = False,
) -> None:
    for seed in seeds:
        for stage in stages:
            if skip_existing and run_dir(out, stage, seed).summary.is_file():
                log(f"{stage} seed {seed}: kept (--skip-existing)")
                continue
            t0 = time.perf_counter()
            s = train_one(stage, seed, ns)
            ce = ", ".join(f"{k} {v:.4f}" for k, v in s["val_ce"].items())
            log(f"{stage} seed {seed}: validation CE {ce} ({time.perf_counter() - t0:.0f} s)")


def membership_stats(out: Path, seeds: Sequence[int]) -> pd.DataFrame:
    """``memberships.csv``: what the prior of every run learned, per layer.

    From the reported weights (``final.pt``) on the run's audit ids (8 validation chunks), in
    eval mode (cached bias, memberships tracked): the normalised membership entropy
    ``H(mu) / log R`` (mean and minimum over tokens), the range of the per-token memberships and
    of the batch-mean memberships per position, the cached per-position statistics behind
    ``B(T)`` and their largest deviation from uniform ``1/R``, the range of sigma_r, and the row of
    ``B(T)`` of the last query (first key, last key, minimum, maximum).
    """
    import torch

    from attncoda.hooks import rpa
    from attncoda.hooks.rpa_checkpoints import load_checkpoint

    rows = []
    for seed in seeds:
        for stage in ALL_STAGES:
            run = run_dir(out, stage, seed)
            if not run.final().is_file():
                continue
            ck = load_checkpoint(run.final())
            prior = ck.prior
            if prior is None:
                continue
            ids = torch.load(run.audit_ids, weights_only=True)
            length = int(ids.shape[-1])
            regimes = prior.config.regimes
            with torch.no_grad(), rpa.attached(ck.model, prior, mode="cached", track=True):
                ck.model(input_ids=ids)
            for layer in range(prior.n_layers):
                mu = prior.last_memberships[layer].double()
                h = -(mu * torch.log(mu.clamp_min(1e-300))).sum(-1) / math.log(regimes)
                batch_mean = mu.mean(0)
                w = prior.mu_stat_weight[layer, :length].double()
                cached = prior.mu_stat[layer, :length].double() / w[:, None]
                sigma = prior.fuzzy[layer].log_sigma.detach().double().exp()
                b = prior.inference_bias(layer, length)[-1].double()
                rows.append(
                    {
                        "stage": stage,
                        "seed": seed,
                        "layer": layer,
                        "regimes": regimes,
                        "entropy_norm_mean": float(h.mean()),
                        "entropy_norm_min": float(h.min()),
                        "mu_min": float(mu.min()),
                        "mu_max": float(mu.max()),
                        "batch_mean_min": float(batch_mean.min()),
                        "batch_mean_max": float(batch_mean.max()),
                        "cached_min": float(cached.min()),
                        "cached_max": float(cached.max()),
                        "cached_max_dev_uniform": float((cached - 1.0 / regimes).abs().max()),
                        "batch_mean_max_dev_uniform": float(
                            (batch_mean - 1.0 / regimes).abs().max()
                        ),
                        "sigma_min": float(sigma.min()),
                        "sigma_max": float(sigma.max()),
                        "tau": float(prior.tau[layer]),
                        "bias_last_query_first_key": float(b[0]),
                        "bias_last_query_last_key": float(b[-1]),
                        "bias_last_query_min": float(b.min()),
                        "bias_last_query_max": float(b.max()),
                    }
                )
    df = pd.DataFrame(rows)
    ac.write_table(df, out / "memberships.csv")
    return df


def benchmark(out: Path, prov: Provenance) -> None:
    """``benchmarks/bench_rpa.py`` into ``bench_rpa.json`` (and the token hash of its text)."""
    import transformers

    from attncoda.hooks import assets

    tok = transformers.AutoTokenizer.from_pretrained(
        str(assets.asset_path("smollm2-135m")), local_files_only=True
    )
    text = assets.load_text("austen", "persuasion")
    ids = tok(text[: 512 * 8], return_tensors="pt").input_ids[:, :512]
    prov.tokens("smollm2-135m/persuasion (bench_rpa, 1 x 512)", ids)
    cmd = [sys.executable, "benchmarks/bench_rpa.py", *BENCH, "--json", str(out / "bench_rpa.json")]
    subprocess.run(cmd, check=True, cwd=ROOT)


def full_run(
    out: Path,
    prov: Provenance,
    *,
    size: str = "small",
    seeds: Sequence[int] = SEEDS,
    threads: int = 1,
    skip_existing: bool = False,
    bench: bool = True,
    **over: Any,
) -> None:
    """Train every stage and control for ``seeds``, then the report, audit, memberships and
    (``bench``) the latency benchmark, into ``out``."""
    import torch

    torch.set_num_threads(threads)
    ns = run_args(out, size=size, threads=threads, **over)
    out.mkdir(parents=True, exist_ok=True)
    record_tokens(out, ns, prov)
    t0 = time.perf_counter()
    train_all(out, ns, seeds, ALL_STAGES, skip_existing)
    log(f"training done in {(time.perf_counter() - t0) / 60:.1f} min")
    report(ns)  # results.json, runs.csv, control_curves.csv, ablation.md, the training curves
    audit_seed(out, AUDIT_SEED)
    membership_stats(out, seeds)
    if bench:
        benchmark(out, prov)
    prov.settings.update(
        size=size,
        seeds=list(seeds),
        stages=list(ALL_STAGES),
        threads=threads,
        audit_seed=AUDIT_SEED,
        benchmark=f"benchmarks/bench_rpa.py {' '.join(BENCH)}" if bench else None,
        **{k: v for k, v in over.items()},
    )


# ------------------------------------------------------------------------------------ tables

REPORTED = (
    ("baseline", "baseline", "val_ce_raw", 5.850),
    ("+RPA (prior + context game)", "rpa", "val_ce_raw", 5.536),
    ("+Guardian/schedules (EMA weights)", "guardian", "val_ce_ema", 5.455),
    ("+SWA-select", "guardian", "val_ce_swa_select", 5.246),
)
MINUS = "\u2212"
DASH = "\u2013"


def _signed(x: float, digits: int) -> str:
    """``−0.0074`` / ``0.0000`` / ``+0.0147``: differences as the README writes them."""
    text = f"{x:+.{digits}f}"
    if text[1:].strip("0.") == "":
        return text[1:]
    return text.replace("-", MINUS)


def _values(runs: pd.DataFrame, stage: str, column: str, seeds: Sequence[int]) -> list[float]:
    return [float(runs[(runs.stage == stage) & (runs.seed == s)][column].iloc[0]) for s in seeds]


def _mean_sd(vals: Sequence[float]) -> str:
    mean = f"{statistics.fmean(vals):.4f}"
    return f"{mean} ± {statistics.stdev(vals):.4f}" if len(vals) > 1 else mean


def render_tables(results: Path) -> dict[str, str]:
    """The README tables, from the result files in ``results`` (``table`` renders them)."""
    runs = ac.read_table(results / "runs.csv")
    seeds = sorted(int(s) for s in runs.seed.unique())
    seed_cols = [f"seed {s}" for s in seeds]

    rows, prev, base, prev_paper = [], None, None, None
    for label, stage, column, paper in REPORTED:
        vals = _values(runs, stage, column, seeds)
        mean = statistics.fmean(vals)
        base = mean if base is None else base
        rows.append(
            [
                label,
                *(f"{v:.4f}" for v in vals),
                _mean_sd(vals),
                DASH if prev is None else _signed(mean - base, 4),
                DASH if prev is None else _signed(mean - prev, 4),
                f"{paper:.3f}",
                DASH if prev_paper is None else _signed(paper - prev_paper, 2),
            ]
        )
        prev, prev_paper = mean, paper
    ablation = markdown_table(
        [
            "stage",
            *seed_cols,
            "mean",
            "Δ vs baseline",
            "Δ from prev",
            "paper (WT2)",
            "paper Δ from prev",
        ],
        rows,
    )

    base_mean = statistics.fmean(_values(runs, "baseline", "val_ce_raw", seeds))
    controls = []
    ema = _values(runs, "schedules", "val_ce_ema", seeds)
    swa = _values(runs, "schedules", "val_ce_swa_select", seeds)
    if ema == swa:
        ctl = [("baseline + schedules, EMA, SWA-select (no prior, no Guardian)", ema)]
    else:
        ctl = [
            ("baseline + schedules, EMA (no prior, no Guardian)", ema),
            ("baseline + schedules, SWA-select (no prior, no Guardian)", swa),
        ]
    ctl.append(
        (
            "+Guardian/schedules, last weights instead of EMA",
            _values(runs, "guardian", "val_ce_raw", seeds),
        )
    )
    for label, vals in ctl:
        controls.append(
            [
                label,
                *(f"{v:.4f}" for v in vals),
                _mean_sd(vals),
                _signed(statistics.fmean(vals) - base_mean, 4),
            ]
        )
    control_table = markdown_table(["run", *seed_cols, "mean", "Δ vs baseline"], controls)

    order = {"baseline": 0, "rpa": 1, "guardian": 2, "schedules": 3}
    per_run = []
    for _, r in sorted(runs.iterrows(), key=lambda kv: (order[kv[1].stage], kv[1].seed)):
        mix = str(r.context_mixture) if isinstance(r.context_mixture, str) else ""
        mix_txt = (
            ", ".join(f"{p.split(':')[0]}:{float(p.split(':')[1]):.2f}" for p in mix.split(", "))
            if mix
            else DASH
        )
        per_run.append(
            [
                f"{r.stage} seed {r.seed}",
                f"{r.seconds / 60:.1f}",
                f"{r.final_tau:.3f}" if pd.notna(r.final_tau) else DASH,
                (
                    f"{int(r.swa_accepted)} ({'yes' if bool(r.swa_used) else 'no'})"
                    if r.stage in ("guardian", "schedules")
                    else DASH
                ),
                mix_txt,
            ]
        )
    runs_table = markdown_table(
        ["run", "minutes", "final τ_att", "SWA snapshots accepted (used)", "context mix"],
        per_run,
    )

    mem = ac.read_table(results / "memberships.csv")
    mrows = []
    for (stage, seed), g in sorted(
        mem.groupby(["stage", "seed"]), key=lambda kv: (order[kv[0][0]], kv[0][1])
    ):
        mrows.append(
            [
                f"{stage} seed {seed}",
                f"{g.entropy_norm_mean.min():.3f}",
                f"{g.entropy_norm_min.min():.3f}",
                f"[{g.cached_min.min():.4f}, {g.cached_max.max():.4f}]",
                f"{g.cached_max_dev_uniform.max():.4f}",
                f"[{g.mu_min.min():.2f}, {g.mu_max.max():.2f}]",
                f"[{g.sigma_min.min():.3f}, {g.sigma_max.max():.3f}]",
                f"{_signed(g.bias_last_query_first_key.min(), 2)} / "
                f"{_signed(g.bias_last_query_last_key.max(), 2)}",
            ]
        )
    memberships = markdown_table(
        [
            "run",
            "H(μ) / log R: mean over tokens, lowest layer",
            "lowest token",
            "cached μ̄ (behind B(T)): range",
            "max |μ̄ − 1/R|",
            "per-token μ: range",
            "σ_r: range",
            "B(T), last query: first key / last key",
        ],
        mrows,
    )

    pert = ac.read_table(results / "audit_perturbation.csv")
    prows = []
    for _, r in pert.iterrows():
        prows.append(
            [
                r.stage,
                int(r.layer),
                f"{r.aitchison_sink:.2f}",
                f"{r.aitchison_content:.2f}",
                f"{r.sink_fraction:.3f}",
                _signed(r.delta_entropy, 3),
                _signed(r.delta_entropy_sink, 3),
                _signed(r.delta_entropy_content, 3),
            ]
        )
    perturbation = markdown_table(
        [
            "run",
            "layer",
            "Aitchison: sink part",
            "content part",
            "sink fraction",
            "ΔH",
            "ΔH sink",
            "ΔH content",
        ],
        prows,
    )

    tr = ac.read_table(results / "audit_trajectory.csv")
    steps = sorted(int(s) for s in tr.step.unique())
    shown = (steps[0], *steps[-3:])  # the first checkpoint and the last three
    trows = []
    labels = {"schedules": "schedules (control)"}
    for stage in ("baseline", "rpa", "guardian", "schedules"):
        t = tr[tr.stage == stage].set_index("step")
        if t.empty:
            continue
        last = t.iloc[-1]
        first = t.iloc[0]
        trows.append(
            [
                labels.get(stage, stage),
                *(f"{t.loc[s].entropy:.3f}" for s in shown if s in t.index),
                _signed(last.delta_entropy, 3),
                _signed(last.delta_sink, 3),
                _signed(last.delta_content, 3),
                f"{last.sink_fraction_path:.2f}",
                f"{first.sink_share:.3f} → {last.sink_share:.3f}",
            ]
        )
    trajectory = markdown_table(
        [
            "run",
            *(f"H step {s}" for s in shown),
            "ΔH",
            "sink part",
            "content part",
            "sink fraction",
            f"sink share {shown[0]} → {shown[-1]}",
        ],
        trows,
    )

    bench = json.loads((results / "bench_rpa.json").read_text())
    brows = []
    for b in bench:
        name = "case-study Llama" if b["case"].startswith("small Llama") else b["case"]
        brows.append(
            [
                name,
                f"{b['batch']} × {b['length']}",
                f"{1e3 * b['sdpa_s']:.1f} ms",
                f"{1e3 * b['rpa_s']:.1f} ms",
                f"**{b['rpa_ratio']:.3f}x**",
                f"{b['float_mask_ratio']:.3f}x",
            ]
        )
    latency = markdown_table(
        ["model", "batch × T", "SDPA", "RPA", "ratio", "float mask ratio"], brows
    )
    return {
        "ablation": ablation,
        "controls": control_table,
        "runs": runs_table,
        "memberships": memberships,
        "perturbation": perturbation,
        "trajectory": trajectory,
        "latency": latency,
    }


# ------------------------------------------------------------------------------------ main


def _run(out: Path, args: argparse.Namespace, prov: Provenance) -> None:
    full_run(
        out,
        prov,
        seeds=args.seeds,
        threads=args.threads,
        skip_existing=args.skip_existing,
        bench=not args.no_bench,
    )


def _quick(out: Path, prov: Provenance) -> None:
    """The ``tiny`` size (hidden 64, 2 layers, 30 steps of 512 tokens), seed 0, every stage and
    the control, with the report, audit and memberships; no benchmark."""
    full_run(out, prov, size="tiny", seeds=(0,), threads=1, bench=False)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: fastest on shared cores)"
    )
    parser.add_argument(
        "--skip-existing",
        action="store_true",
        help="keep the runs under OUT/runs that finished (resume an interrupted study)",
    )
    parser.add_argument("--no-bench", action="store_true", help="skip the latency benchmark")


#: The quick mode's files CI compares with ``golden/``: training is seeded and runs on one
#: thread, so a rerun on this machine repeats the numbers; rtol 1e-4 leaves room for another
#: CPU's float rounding over 30 training steps. Timings are not results.
GOLDEN = (
    Golden("runs.csv", rtol=1e-4, atol=1e-6, ignore=("seconds",)),
    Golden("audit_trajectory.csv", rtol=1e-4, atol=1e-6),
    Golden("audit_perturbation.csv", rtol=1e-4, atol=1e-6, ignore=("perturbation_max_error",)),
    Golden("memberships.csv", rtol=1e-4, atol=1e-6),
)

STUDY = Study(
    name="rpa",
    description="RPA + Guardian on Austen: the ablation (3 stages x 3 seeds), the schedules "
    "control, the CoDa audit of seed 0, the learned memberships and the inference latency.",
    run=_run,
    quick=_quick,
    tables=render_tables,
    golden=GOLDEN,
    assets=("austen", "smollm2-135m"),
    add_arguments=_arguments,
)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(STUDY, argv)
