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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import attncoda as ac

from .._study import Golden, Provenance, Study, fixed, markdown_table, scientific, significant
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
    control, validation = d.control, d.validation
    if ns.eval_chunks:  # the runs evaluate only the first chunks (train_one)
        control, validation = control[: ns.eval_chunks], validation[: ns.eval_chunks]
    prov.tokens("austen/train", d.train)
    prov.tokens("austen/control (persuasion)", control)
    prov.tokens("austen/validation (persuasion)", validation)
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


def _signs_agree(d_rpa: float, d_guardian: float, rpa_seeds: Sequence[float] = ()) -> str:
    """Which of our two stage changes have the paper's sign (both of the paper's are falls):
    the words of the bottom line, from the numbers; ``rpa_seeds`` are the RPA step's per-seed
    changes (when they straddle 0, the sign of their mean is said to be the seeds' noise)."""
    paper = [REPORTED[i + 1][3] - REPORTED[i][3] for i in range(2)]
    names = ("the RPA step's", "the Guardian/schedules step's")
    same = [n for n, d, p in zip(names, (d_rpa, d_guardian), paper, strict=True) if d * p > 0]
    if not same:
        return "neither stage's sign agrees"
    noise = (
        " (the RPA step's only on average: its seeds disagree in sign)"
        if len(rpa_seeds) and min(rpa_seeds) < 0 < max(rpa_seeds) and names[0] in same
        else ""
    )
    if len(same) == 2:
        return "both stages' signs agree" + noise
    return f"only {same[0]} sign agrees" + noise


REPORTED = (
    ("baseline", "baseline", "val_ce_raw", 5.850),
    ("+RPA (prior + context game)", "rpa", "val_ce_raw", 5.536),
    ("+Guardian/schedules (EMA weights)", "guardian", "val_ce_ema", 5.455),
    ("+SWA-select", "guardian", "val_ce_swa_select", 5.246),
)
MINUS = "\u2212"
DASH = "\u2013"
#: The paper's scale (Atri, arXiv 2603.09253; `reference/papers.md` §2): about 90M parameters
#: (its Table 6), 8030 steps of 48 x 512 tokens.
PAPER_PARAMETERS = 90e6
PAPER_STEPS = 8030
PAPER_TOKENS = 8030 * 48 * 512
#: The entropy-collapse split the compositional-attention paper's abstract gives (arXiv
#: 2608.14712): the share of the entropy drop from sink growth at 70M, 1B and 1.4B parameters.
#: Which models these are, the abstract does not say; Pythia is the notes' guess.
PUBLISHED_SINK_SHARE_OF_COLLAPSE = {70e6: 0.30, 1e9: 0.95, 1.4e9: 0.79}
#: Training tokens of each Pythia model (the Pile, about 300B): only if the guess is right.
PYTHIA_TOKENS = 300e9
#: The latency target of the RPA plug-in: at most this ratio to the plain SDPA forward.
LATENCY_TARGET = 1.05


def _signed(x: float, digits: int) -> str:
    """``−0.0074`` / ``0.0000`` / ``+0.0147``: differences as the README writes them."""
    text = fixed(x, digits)
    if text.strip("0.") == "":
        return text
    return text.replace("-", MINUS) if text.startswith("-") else "+" + text


def _bench_name(case: str) -> str:
    """A benchmark case as the README names it."""
    return "case-study Llama" if case.startswith("small Llama") else case


def _values(runs: pd.DataFrame, stage: str, column: str, seeds: Sequence[int]) -> list[float]:
    return [float(runs[(runs.stage == stage) & (runs.seed == s)][column].iloc[0]) for s in seeds]


def _mean_sd(vals: Sequence[float]) -> str:
    mean = fixed(statistics.fmean(vals), 4)
    return f"{mean} ± {fixed(statistics.stdev(vals), 4)}" if len(vals) > 1 else mean


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
                *(fixed(v, 4) for v in vals),
                _mean_sd(vals),
                DASH if prev is None else _signed(mean - base, 4),
                DASH if prev is None else _signed(mean - prev, 4),
                fixed(paper, 3),
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
                *(fixed(v, 4) for v in vals),
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
            ", ".join(
                f"{p.split(':')[0]}:{fixed(float(p.split(':')[1]), 2)}" for p in mix.split(", ")
            )
            if mix
            else DASH
        )
        per_run.append(
            [
                f"{r.stage} seed {r.seed}",
                fixed(r.seconds / 60, 1),
                fixed(r.final_tau, 3) if pd.notna(r.final_tau) else DASH,
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
                fixed(g.entropy_norm_mean.min(), 3),
                fixed(g.entropy_norm_min.min(), 3),
                f"[{fixed(g.cached_min.min(), 4)}, {fixed(g.cached_max.max(), 4)}]",
                fixed(g.cached_max_dev_uniform.max(), 4),
                f"[{fixed(g.mu_min.min(), 2)}, {fixed(g.mu_max.max(), 2)}]",
                f"[{fixed(g.sigma_min.min(), 3)}, {fixed(g.sigma_max.max(), 3)}]",
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
                fixed(r.aitchison_sink, 2),
                fixed(r.aitchison_content, 2),
                fixed(r.sink_fraction, 3),
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
                *(fixed(t.loc[s].entropy, 3) for s in shown if s in t.index),
                _signed(last.delta_entropy, 3),
                _signed(last.delta_sink, 3),
                _signed(last.delta_content, 3),
                fixed(last.sink_fraction_path, 2),
                f"{fixed(first.sink_share, 3)} → {fixed(last.sink_share, 3)}",
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
        name = _bench_name(b["case"])
        brows.append(
            [
                name,
                f"{b['batch']} × {b['length']}",
                f"{fixed(1e3 * b['sdpa_s'], 1)} ms",
                f"{fixed(1e3 * b['rpa_s'], 1)} ms",
                f"**{fixed(b['rpa_ratio'], 3)}x**",
                f"{fixed(b['float_mask_ratio'], 3)}x",
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
        **prose(results),
    }


def _size(x: float) -> str:
    """``2.6M``, ``0.6M``, ``1.4B``: a parameter or token count as prose writes it."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= div or (unit == "M" and x >= 1e5):
            return f"{_two_digits(x / div)}{unit}"
    return fixed(x, 0)


def _two_digits(x: float) -> str:
    """``27``, ``550``, ``490,000``: a ratio rounded to two significant digits."""
    two = significant(x, 2)
    return fixed(float(two), 0, thousands=True) if x >= 10 else two


def _percent(x: float) -> str:
    """``42%``: a fraction as a whole percentage."""
    return f"{fixed(100 * x, 0)}%"


def _span(
    values: Sequence[float], fmt: Callable[[float], str] = lambda v: fixed(v, 2), unit: str = ""
) -> str:
    """``1.00-1.13x``: the range of some values (one value when they agree)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def size_ratio(model_parameters: float) -> str:
    """How many times larger the published entropy-split models are than ours, e.g. ``27-550``
    (the one spelling of that ratio, in the summary and the body)."""
    ratios = [size / model_parameters for size in PUBLISHED_SINK_SHARE_OF_COLLAPSE]
    return f"{_two_digits(min(ratios))}-{_two_digits(max(ratios))}"


def prose(results: Path) -> dict[str, str]:
    """The README's sentences with numbers, rendered from the result files like the tables (so
    that no number typed into prose can drift from its file)."""
    runs = ac.read_table(results / "runs.csv")
    seeds = sorted(int(s) for s in runs.seed.unique())

    def ce(stage: str, column: str = "val_ce_raw") -> list[float]:
        return _values(runs, stage, column, seeds)

    base, rpa = ce("baseline"), ce("rpa")
    guardian = ce("guardian", "val_ce_ema")
    sched = ce("schedules", "val_ce_ema")
    mean = statistics.fmean
    reported = [*base, *rpa, *guardian, *sched]
    d_rpa = [r - b for r, b in zip(rpa, base, strict=True)]
    params = float(runs.model_parameters.iloc[0])
    tokens = float(runs.tokens.iloc[0])
    swa_used = bool(runs[runs.stage.isin(["guardian", "schedules"])].swa_used.any())
    mem = ac.read_table(results / "memberships.csv")
    pert = ac.read_table(results / "audit_perturbation.csv")
    tr = ac.read_table(results / "audit_trajectory.csv")
    last = tr.sort_values("step").groupby("stage").tail(1).set_index("stage")
    sink_frac = [float(v) for v in last.sink_fraction_path]
    bench = json.loads((results / "bench_rpa.json").read_text())
    for b in bench:  # the latency table's names
        b["case"] = _bench_name(b["case"])
    ratios = [float(b["rpa_ratio"]) for b in bench]
    worst = max(bench, key=lambda b: b["rpa_ratio"])
    content_share_size = 1 - float(pert.sink_fraction.mean())
    content_share_dh = float((pert.delta_entropy_content / pert.delta_entropy).mean())
    published = "/".join(f"{fixed(100 * v, 0)}%" for v in PUBLISHED_SINK_SHARE_OF_COLLAPSE.values())
    sizes = " / ".join(_size(v) for v in PUBLISHED_SINK_SHARE_OF_COLLAPSE)
    paper_ce = " → ".join(fixed(paper, 3) for *_, paper in REPORTED)
    signed = [_signed(v, 3) for v in d_rpa]
    out = {}
    out["summary"] = (
        f"**Bottom line.** With about {_size(tokens)} training tokens per run and a "
        f"{_size(params)}-parameter Llama: the RPA prior alone changes validation CE by "
        f"{_signed(mean(rpa) - mean(base), 3)} nats (per seed {' / '.join(signed)}: no effect "
        "at this scale; the ablation table, `results/runs.csv`). +Guardian/schedules is "
        f"{_signed(mean(guardian) - mean(base), 3)} from the baseline, but a control with the "
        "same schedules and *no* prior or Guardian does better "
        f"({_signed(mean(sched) - mean(base), 3)}). SWA-select "
        f"{'was used in some run' if swa_used else 'never beat the EMA weights'}. Compare "
        f"directions, not values, with the paper's {paper_ce} on WikiText-2 at about "
        f"{_size(PAPER_PARAMETERS)} parameters: {_signs_agree(mean(rpa) - mean(base), mean(guardian) - mean(rpa), d_rpa)}. The memberships "
        "stayed uniform in every run (`results/memberships.csv`), so the learned prior is a "
        f"purely positional recency bias. {fixed(100 * content_share_size, 0)}% of its Aitchison size, and "
        f"{fixed(100 * content_share_dh, 0)}% of the entropy it removes, reshapes content rather than moving "
        "the sink balance (`results/audit_perturbation.csv`). Entropy collapse during training "
        f"is {fixed(100 * (1 - max(sink_frac)), 0)}% content sharpening and {fixed(100 * max(sink_frac), 0)}% sink "
        "(`results/audit_trajectory.csv`); the published "
        f"{published} (sink share of the collapse, at {sizes} parameters) is **not comparable**: "
        f"those models are {size_ratio(params)} times larger and trained far longer (which models "
        "they are, the abstract does not say). RPA inference costs "
        f"{_span(ratios, unit='x')} the plain SDPA forward (`results/bench_rpa.json`: "
        f"{fixed(worst['rpa_ratio'], 2)}x for the {worst['case']} at {worst['batch']} × {worst['length']}, "
        f"{'above' if worst['rpa_ratio'] > LATENCY_TARGET else 'within'} the "
        f"{fixed(LATENCY_TARGET, 2)}x target, in this run). Each number points to the table or "
        "committed file it comes from below."
    )
    first_run = json.loads((results / "results.json").read_text())[0]
    data = first_run["data"]
    out["setup-data"] = (
        f"Train: {len(data['train_books'])} Austen novels, {data['train_tokens']:,} tokens. "
        f"Held out: *{data['held_out'].capitalize()}*: its first {data['control_tokens']:,} "
        f"tokens are the **control** set, the other {data['validation_tokens']:,} the "
        f"**validation** set. Vocabulary {data['vocab_size']:,} (the most frequent training "
        f"ids plus UNK); UNK is {fixed(100 * data['unk_rate_train'], 1)}% of training tokens and "
        f"{fixed(100 * data['unk_rate_validation'], 1)}% of validation tokens. The model has {fixed(params, 0, thousands=True)} "
        f"parameters (`model_parameters` in `results/runs.csv`), the prior "
        f"{fixed(float(runs.prior_parameters.max()), 0, thousands=True)} training-only ones (`prior_parameters`); "
        f"every run trains on {fixed(tokens, 0, thousands=True)} tokens."
    )
    g = runs[runs.stage == "guardian"].sort_values("seed")
    accepted = runs[runs.stage.isin(["guardian", "schedules"])].swa_accepted
    out["runs-notes"] = (
        f"SWA-select accepted {_span(accepted.tolist(), lambda v: fixed(v, 0))} snapshots per run and "
        f"{'used some' if swa_used else 'used none of them: their average never beat the EMA weights on the control set'}. "
        "Guardian's final τ_att: "
        + ", ".join(fixed(t, 3) for t in g.final_tau)
        + f" (seeds {', '.join(str(s) for s in g.seed)})."
    )
    steps = int(first_run["train_config"]["steps"])
    curves = ac.read_table(results / "control_curves.csv")
    worst_seed = int(g.seed.iloc[int(np.argmax(guardian))])
    b2 = curves[(curves.stage == "baseline") & (curves.seed == worst_seed)].set_index("step")
    g2 = curves[(curves.stage == "guardian") & (curves.seed == worst_seed)].set_index("step")
    gap = (g2.control_ce - b2.control_ce).dropna().sort_index()
    # the first control step from which the guardian run stays behind the baseline to the end
    ahead = gap.index[gap <= 0]
    later = gap.index[gap.index > ahead.max()] if len(ahead) else gap.index
    first_behind = int(later.min()) if len(later) else None
    tau_then = g2.tau[g2.index <= (first_behind or 0)].dropna()
    swa_start = curves[curves.stage == "guardian"].step.max() * 0.55
    lr_zone = curves[(curves.stage == "guardian") & (curves.step >= swa_start)].lr
    peak = curves[curves.stage == "guardian"].lr.max()
    out["reading"] = "\n".join(
        [
            f"- **+RPA: no effect at this scale** ({_signed(mean(rpa) - mean(base), 3)} on "
            f"average; per seed {' / '.join(signed)}; the paper: "
            f"{_signed(REPORTED[1][3] - REPORTED[0][3], 2)}).",
            "- **+Guardian/schedules: same sign as the paper on average** "
            f"({_signed(mean(guardian) - mean(rpa), 3)} from the previous stage), but with a "
            f"seed spread of {fixed(statistics.stdev(guardian), 2)}. The `schedules` control suggests "
            "that the gain comes from the schedules (flat prelude, LR floor, label smoothing, "
            f"EMA): they give {_signed(mean(sched) - mean(base), 3)} without RPA or the Guardian, "
            f"over {len(sched)} seeds and with no test of the difference. "
            f"Seed {worst_seed}'s Guardian run was the worst of "
            + (
                f"all {len(reported)} runs"
                if max(guardian) >= max(reported)
                else "the guardian runs"
            )
            + (
                f"; its control CE fell behind the baseline's from step {first_behind} on "
                f"(`results/control_curves.csv`), while τ_att was still "
                f"{_span(tau_then.tolist())}, so the Guardian is not clearly the cause."
                if first_behind is not None and len(tau_then)
                else "."
            ),
            f"- **SWA-select: {'no gain' if not swa_used else 'used'}** (the paper: "
            f"{_signed(REPORTED[3][3] - REPORTED[2][3], 2)}, its largest single step after RPA; "
            "but that step is **confounded**: the paper's SWA-select row equals its run at "
            "context 768 and the row before it its run at 512, so the step also changes the "
            "context length, `reference/papers.md` §2). In the collection window the LR was "
            f"still at {_span((lr_zone / peak).tolist(), _percent)} of its peak (`lr` in "
            "`results/control_curves.csv`), and averaged snapshots lagged the EMA weights.",
            f"- Nothing here tests the paper's claims at its scale: {steps} "
            f"steps, {_size(tokens)} tokens and {_size(params)} parameters against its "
            f"{PAPER_STEPS} steps, {_size(PAPER_TOKENS)} tokens and about "
            f"{_size(PAPER_PARAMETERS)} parameters. The seed spread of the baseline alone "
            f"({fixed(statistics.stdev(base), 2)}) is as large as the RPA effect.",
        ]
    )
    out["memberships-notes"] = (
        "The mean membership entropy is "
        f"{_span(mem.entropy_norm_mean.tolist())} of log R at every layer, the batch-mean "
        f"memberships behind the inference bias lie in [{fixed(mem.cached_min.min(), 3)}, "
        f"{fixed(mem.cached_max.max(), 3)}] (at most {fixed(mem.cached_max_dev_uniform.max(), 3)} from 1/R), "
        f"and σ_r stayed at {_span([mem.sigma_min.min(), mem.sigma_max.max()])}. Layer 0 "
        "spreads individual tokens' memberships, and those spreads average out over the batch. "
        "During training the normalised membership entropy at the control steps stayed at "
        f"{_span(curves.mu_entropy.dropna().tolist())} (`mu_entropy` in "
        "`results/control_curves.csv`)."
    )
    rp = pert[pert.stage == "rpa"]
    gp = pert[pert.stage == "guardian"]
    out["perturbation-notes"] = (
        "The identity holds against the captured rows to "
        f"{scientific(pert.perturbation_max_error.max(), 1)} (float32; `perturbation_max_error`). So "
        f"**{fixed(100 * pert.sink_fraction.mean(), 0)}% of the prior moves the sink balance and "
        f"{fixed(100 * content_share_size, 0)}% reshapes content**. It sharpens rows by "
        f"{_span((-pert.delta_entropy).tolist())} nats, "
        f"{_span((pert.delta_entropy_content / pert.delta_entropy).tolist(), _percent)} of that "
        "within the content. The guardian model's prior is smaller "
        f"({fixed(gp.aitchison_content.mean(), 1)} vs {fixed(rp.aitchison_content.mean(), 1)} content part) "
        f"because its τ_att ended at {fixed(g.final_tau.iloc[0], 3)} (seed "
        f"{int(g.seed.iloc[0])}) instead of the rpa stage's "
        f"{fixed(runs[runs.stage == 'rpa'].final_tau.iloc[0], 2)}."
    )
    tl = last
    published_pairs = ", ".join(
        f"{fixed(100 * v, 0)}% at {_size(k)}" for k, v in PUBLISHED_SINK_SHARE_OF_COLLAPSE.items()
    )
    out["trajectory-notes"] = (
        "Without each layer's bias, at the same hidden states, the RPA models' rows end at "
        f"{fixed(tl.loc['rpa'].entropy_no_prior, 3)} (rpa) and "
        f"{fixed(tl.loc['guardian'].entropy_no_prior, 3)} (guardian) nats instead of "
        f"{fixed(tl.loc['rpa'].entropy, 3)} and {fixed(tl.loc['guardian'].entropy, 3)}, with a sink "
        f"fraction of {_span(tl.loc[['rpa', 'guardian']].sink_fraction_path_no_prior.tolist())} "
        "(`entropy_no_prior` and `sink_fraction_path_no_prior`).\n\n"
        f"**Entropy collapse here is {fixed(100 * (1 - max(sink_frac)), 0)}% content sharpening and "
        f"{fixed(100 * max(sink_frac), 0)}% sink growth, and the sink share falls** rather than grows. The "
        f"published claim ({published_pairs} of the entropy drop from sink growth) is about "
        f"trained models {size_ratio(params)} times larger than this {_size(params)}-parameter "
        f"one trained on {_size(tokens)} tokens: **not comparable**, so this neither confirms "
        "nor contradicts it. Which models the abstract measured is not stated; the notes guess "
        f"Pythia, which would mean about {_two_digits(PYTHIA_TOKENS / tokens)} times more training tokens "
        "(`reference/papers.md` §3.2). RPA and baseline differ in two ways: the prior's rows "
        f"are sharper ({fixed(tl.loc['rpa'].entropy, 2)} vs {fixed(tl.loc['baseline'].entropy, 2)} nats at "
        "the end), and its anti-sink recency bias lowers the sink share further "
        f"({fixed(tl.loc['rpa'].sink_share, 3)} vs {fixed(tl.loc['baseline'].sink_share, 3)})."
    )
    attach = [float(b["attach_detach_s"]) * 1e3 for b in bench]
    out["latency-notes"] = (
        f"Attach + detach costs {_span(attach, lambda v: fixed(v, 1), ' ms')} outside the timer "
        f"(`attach_detach_s`). In this run the {worst['case']} at {worst['batch']} × "
        f"{worst['length']} took {fixed(worst['rpa_ratio'], 3)}x the SDPA forward, "
        f"{'above' if worst['rpa_ratio'] > LATENCY_TARGET else 'within'} the "
        f"{fixed(LATENCY_TARGET, 2)}x target; the other cases are "
        + ", ".join(f"{fixed(b['rpa_ratio'], 3)}x" for b in bench if b is not worst)
        + "."
    )
    out["multiplicity"] = (
        f"These tables hold **no confidence interval** (0 intervals, so none to correct for "
        f"multiplicity): each mean ± sd is over {len(seeds)} seeds, and a difference is read "
        "against the seed spread, not tested. A careful reader takes every Δ smaller than the "
        "baseline's seed sd as no effect."
    )
    return out


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


#: Validation (and control) chunks of the quick mode: the first 64 of 64 tokens, not the whole
#: held-out novel, whose evaluations took a third of the quick run.
QUICK_EVAL_CHUNKS = 64


def _quick(out: Path, prov: Provenance) -> None:
    """The ``tiny`` size (hidden 64, 2 layers, 30 steps of 512 tokens), seed 0, every stage and
    the control, evaluated on the first :data:`QUICK_EVAL_CHUNKS` validation chunks, with the
    report, audit and memberships; no benchmark."""
    full_run(
        out, prov, size="tiny", seeds=(0,), threads=1, bench=False, eval_chunks=QUICK_EVAL_CHUNKS
    )


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
#: thread, so a rerun on the same CPU repeats the numbers bit for bit; rtol 1e-4 leaves room for
#: another CPU's float rounding over 30 training steps. The trajectory's sink fractions are
#: ratios of entropy changes from the first checkpoint, which after one step are 2e-5 of entropies
#: of 3.3 and keep fewer digits: the golden's AVX2 kernels against AVX-512 ones differ there by
#: 3.3e-4 relative (2e-5 at most elsewhere), so that file is compared to 1e-3. Timings are not
#: results.
GOLDEN = (
    Golden("runs.csv", rtol=1e-4, atol=1e-6, ignore=("seconds",)),
    Golden("audit_trajectory.csv", rtol=1e-3, atol=1e-6),
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
    # the numbers in these phrases are sizes chosen before a run (definitions, not results)
    definitions=(
        "hidden 64, 2 layers, 30 steps of 512 tokens",
        "first 64 validation chunks",
        "head size (85)",
        "have 84 dimensions",
    ),
    docs=("docs/case-studies/rpa.md",),
)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(STUDY, argv)
