"""The pruning study: its protocol, on the library's pruning sweep.

The study is ``attncoda prune MODEL`` with the command's defaults, run on SmolLM2-135M and
Gemma-3-270M, and with the reversed scores on SmolLM2-135M (``python -m case_studies.pruning
run|table|quick``: :data:`STUDY`; the README tables are :func:`render_tables`). Everything it
computes is the library's :mod:`attncoda.hooks.prune` (one implementation, shared with the
command): scores from the first windows of *Emma*, perplexity on *Moby-Dick* and *Pride and
Prejudice*, tables at full precision and the figure. This module names the study's protocol and gives the sweep the study's
names, so that a Python session can rerun one model or reread the results::

    from attncoda.hooks import assets
    from case_studies.pruning import study

    model, tok = assets.load_model("smollm2-135m")
    result = study.pruning_study(model, tok, quick=True)
    study.write_study(result, "/tmp/smollm2-quick")
    study.read_study("case_studies/pruning/results/smollm2-135m").perplexity("gradient", 27)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attncoda.hooks import assets
from attncoda.hooks.evaluate import text_windows
from attncoda.hooks.prune import (
    CALIBRATION_TEXT,
    TEXT_STARTS,
    TEXTS,
    PruneSweep,
    default_windows,
    sweep_pruning,
)
from attncoda.hooks.prune import novel_text as study_text
from attncoda.hooks.prune import plot_sweep as plot_study
from attncoda.hooks.prune import read_sweep as read_study
from attncoda.hooks.prune import write_sweep as write_study

import attncoda as ac

from .._study import Golden, Provenance, Study, markdown_table
from .._study import main as study_main
from .evidence import Cell, Evidence, load_cells, run_cells, window_table

__all__ = [
    "PROTOCOL",
    "QUICK",
    "STUDY",
    "STUDY_TEXTS",
    "Protocol",
    "StudyResult",
    "plot_study",
    "pruning_study",
    "read_study",
    "study_text",
    "write_study",
]

#: The study's result: one pruning sweep per model.
StudyResult = PruneSweep
#: The texts of the study (those of ``attncoda prune``): ``name -> (corpus, document, start)``.
STUDY_TEXTS = TEXTS


@dataclasses.dataclass(frozen=True)
class Protocol:
    """Sizes of one run of the study (the defaults of ``attncoda prune``)."""

    window: int = 512
    calibration_windows: int = 4
    eval_windows: int = 4
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)


#: The protocol of the README's results.
PROTOCOL = Protocol()
#: ``--quick``: the one-minute smoke run.
QUICK = Protocol(window=256, calibration_windows=1, eval_windows=1, fractions=(0.1, 0.3))


def pruning_study(model: Any, tokenizer: Any, *, quick: bool = False, **options: Any) -> PruneSweep:
    """The study on one loaded model: the study texts' windows, then the pruning sweep.

    Parameters
    ----------
    model, tokenizer
        A causal LM and its tokenizer (e.g. ``assets.load_model("smollm2-135m")``).
    quick : bool, default False
        :data:`QUICK` instead of :data:`PROTOCOL`.
    **options
        Passed to :func:`attncoda.hooks.prune.sweep_pruning` (``scores``, ``unit``, ``mode``,
        ``seed``, ``batch_size``, ``progress``).

    Returns
    -------
    StudyResult
    """
    protocol = QUICK if quick else PROTOCOL
    calibration, evaluation = default_windows(
        tokenizer,
        window=protocol.window,
        calibration_windows=protocol.calibration_windows,
        eval_windows=protocol.eval_windows,
    )
    options.setdefault("fractions", protocol.fractions)
    return sweep_pruning(model, calibration, evaluation, **options)


# ------------------------------------------------------------------------------------ the study

# ``python -m case_studies.pruning run|table|quick`` (``case_studies._study``): ``run`` is the
# three ``attncoda prune`` commands of the README's results, ``quick`` the ``--quick`` smoke run
# on SmolLM2-135M compared with ``golden/``.

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELS = ("smollm2-135m", "gemma3-270m")
REVERSED = (
    "content_entropy-reversed",
    "content_aitchison-reversed",
    "content_clr_dispersion-reversed",
    "entropy-reversed",
    "max_attention-reversed",
)
#: The folders of ``results/``: folder -> (model, extra options of ``attncoda prune``).
JOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "smollm2-135m": ("smollm2-135m", ()),
    "gemma3-270m": ("gemma3-270m", ()),
    "smollm2-135m-reversed": ("smollm2-135m", ("--scores", ",".join(REVERSED))),
}
#: Where ``run`` writes the evidence protocol's results (one folder per model).
EVIDENCE_DIR = "evidence"
#: The evidence protocol per model (issue 16): 20 random orders on SmolLM2, 10 on the others.
EVIDENCE: dict[str, Evidence] = {
    "smollm2-135m": Evidence(random_seeds=20),
    "gemma3-270m": Evidence(random_seeds=10),
    "qwen2.5-coder-0.5b": Evidence(random_seeds=10),
}
#: The scores of the README's diagnostic tables.
DIAGNOSED = (
    "sink_share",
    "content_entropy",
    "content_aitchison",
    "entropy",
    "max_attention",
    "gradient",
)


def _prune_into(model: str, folder: Path, extra: Sequence[str], prov: Provenance) -> None:
    """``attncoda prune MODEL --out FOLDER EXTRA --threads 1 --force`` (the output folder relative
    to the working directory where it can be, so that the command its ``meta.json`` records reads
    the same on every machine), and the provenance of its assets and of the token sha256s its
    ``meta.json`` records."""
    from attncoda.cli import main as attncoda_main

    for asset in (model, "austen", "mobydick"):
        prov.asset(asset)
    try:
        rel = folder.relative_to(Path.cwd())
    except ValueError:
        rel = folder
    status = attncoda_main(["prune", model, "--out", str(rel), *extra, "--threads", "1", "--force"])
    if status:
        raise SystemExit(f"attncoda prune {model} failed with status {status}")
    meta = json.loads((folder / "meta.json").read_text())
    prov.token_sha256[f"{folder.name}/calibration (emma)"] = meta["calibration_tokens_sha256"]
    for corpus, ev in meta["evaluation"].items():
        prov.token_sha256[f"{folder.name}/{corpus}"] = ev["tokens_sha256"]


def evidence_windows(tokenizer: Any, protocol: Evidence) -> tuple[Any, dict[str, Any]]:
    """The evidence protocol's tokens: *Emma*'s calibration windows and ``{text: windows}``."""
    calibration = text_windows(
        tokenizer,
        study_text(CALIBRATION_TEXT),
        window=protocol.window,
        n_windows=protocol.calibration_windows,
    )
    evaluation = {
        t: text_windows(
            tokenizer, study_text(t), window=protocol.window, n_windows=protocol.eval_windows
        )
        for t in protocol.texts
    }
    return calibration, evaluation


def run_evidence(
    name: str,
    folder: Path,
    protocol: Evidence,
    prov: Provenance,
    *,
    time_limit_s: float | None = None,
) -> list[Cell]:
    """The evidence protocol on one model into ``folder``: every missing cell
    (:func:`~case_studies.pruning.evidence.run_cells`, resumable), then ``window_nll.csv`` (one
    row per cell and window, the cells done so far) and the folder's ``manifest.json``."""
    import torch  # heavy; only a run needs it

    torch.set_num_threads(1)
    for asset in (name, *sorted({TEXT_STARTS[t][0] for t in (CALIBRATION_TEXT, *protocol.texts)})):
        prov.asset(asset)
    model, tokenizer = assets.load_model(name)
    calibration, evaluation = evidence_windows(tokenizer, protocol)
    prov.tokens(f"{name}/calibration ({CALIBRATION_TEXT})", calibration)
    for t, ids in evaluation.items():
        prov.tokens(f"{name}/{t}", ids)
    done = run_cells(
        model,
        calibration,
        evaluation,
        folder,
        protocol,
        time_limit_s=time_limit_s,
        progress=lambda line: print(f"{name}: {line}", flush=True),
        record={"commit": prov.git["commit"], "dirty": prov.git["dirty"]},
    )
    ac.write_table(window_table(load_cells(folder)), folder / "window_nll.csv")
    planned = json.loads((folder / "meta.json").read_text())["cells"]
    prov.settings.setdefault("evidence", {})[name] = {
        "protocol": dataclasses.asdict(protocol),
        "cells_done": len(done),
        "cells_planned": len(planned),
    }
    prov.write(folder)
    return done


def _run(out: Path, args: argparse.Namespace, prov: Provenance) -> None:
    for folder in args.folders:
        model, extra = JOBS[folder]
        _prune_into(model, out / folder, extra, prov)
    if args.folders:
        prov.settings.update(protocol=dataclasses.asdict(PROTOCOL), folders=list(args.folders))
    started = time.perf_counter()
    for name in args.models:
        left = None
        if args.time_limit is not None:
            left = args.time_limit * 60 - (time.perf_counter() - started)
            if left <= 0:
                break
        run_evidence(name, out / EVIDENCE_DIR / name, EVIDENCE[name], prov, time_limit_s=left)


def _quick(out: Path, prov: Provenance) -> None:
    """``attncoda prune smollm2-135m --quick --threads 1`` into ``out``."""
    _prune_into("smollm2-135m", out, ("--quick", "-q"), prov)
    prov.settings.update(protocol=dataclasses.asdict(QUICK))


def _minutes(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text!r}")
    return value


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        nargs="*",
        default=list(EVIDENCE),
        choices=list(EVIDENCE),
        help="models to run the evidence protocol on, into results/evidence/MODEL; cells "
        "already done are skipped (default: all three)",
    )
    parser.add_argument(
        "--time-limit",
        type=_minutes,
        metavar="MINUTES",
        help="start no new cell after this many minutes (rerun the same command to continue)",
    )
    parser.add_argument(
        "--folders",
        nargs="*",
        default=[],
        choices=list(JOBS),
        help="also regenerate these earlier result folders (attncoda prune's defaults: 4 "
        "windows of two novels)",
    )


# ------------------------------------------------------------------------------------ tables


def _k_label(k: int, n: int) -> str:
    return "k=0" if k == 0 else f"k={k} ({100 * k / n:.0f}%)"


def _read(folder: Path) -> tuple[Any, dict[str, Any]]:
    import attncoda as ac

    rows = ac.read_table(folder / "perplexity.csv")
    return rows[rows.corpus == "all"], json.loads((folder / "meta.json").read_text())


def _ppl(row: Any) -> float:
    """``exp(nll / tokens)``: the perplexity at full precision (the CSV's column has four
    decimals)."""
    import math

    return math.exp(float(row.nll) / int(row.n_tokens))


def perplexity_table(folders: Sequence[Path]) -> str:
    """Perplexity on all evaluation tokens per score (rows, in each folder's order) and k."""
    rows, meta = _read(folders[0])
    ks, n = meta["ks"], meta["n_units"]
    out = []
    for folder in folders:
        rows, meta = _read(folder)
        assert meta["ks"] == ks, folder
        base = _ppl(rows[rows.score == "none"].iloc[0])
        for score in meta["scores"]:
            sub = rows[rows.score == score]
            cells = {int(r.k): _ppl(r) for r in sub.itertuples()}
            cells[0] = base
            out.append([score, sub.channel.iloc[0], *(f"{cells[k]:.2f}" for k in ks)])
    return markdown_table(["score", "channel", *(_k_label(k, n) for k in ks)], out)


def ratio_table(folder: Path) -> str:
    """Each pruned perplexity over the unpruned one, ``exp((nll_k - nll_0) / tokens)`` from
    ``perplexity.csv``'s summed NLLs (the CSV's perplexity and ratio columns are rounded to four
    decimals, too coarse for the second decimal of some ratios)."""
    import math

    rows, meta = _read(folder)
    ks, n = meta["ks"][1:], meta["n_units"]
    base = rows[rows.score == "none"].iloc[0]
    out = []
    for score in meta["scores"]:
        sub = rows[rows.score == score].set_index("k")
        cells = []
        for k in ks:
            r = sub.loc[k]
            assert int(r.n_tokens) == int(base.n_tokens), (folder, score, k)
            cells.append(f"{math.exp((float(r.nll) - float(base.nll)) / int(r.n_tokens)):.2f}x")
        out.append([score, *cells])
    return markdown_table(["score", *(_k_label(k, n) for k in ks)], out)


def diagnostics_table(folder: Path, scores: Sequence[str] = DIAGNOSED) -> str:
    """Per score: Spearman's rho, over all heads, of the score's importance (its statistic
    oriented so that higher means pruned later) with the gradient importance; rho of the raw
    statistic with the sink share; and the layers of the heads pruned at the smallest k > 0
    (``layer x heads``), from ``head_scores.csv`` and ``perplexity.csv``."""
    from attncoda.hooks.scores import score_info
    from scipy.stats import spearmanr

    import attncoda as ac

    heads = ac.read_table(folder / "head_scores.csv")
    rows, meta = _read(folder)
    k1 = meta["ks"][1]
    out = []
    for score in scores:
        base = score.removesuffix("-reversed")
        sign = -1.0 if score_info(score).prune_first == "high" else 1.0
        rho_g = sign * spearmanr(heads[base], heads["gradient"]).statistic
        rho_s = spearmanr(heads[base], heads["sink_share"]).statistic
        (pruned,) = rows[(rows.score == score) & (rows.k == k1)].pruned
        layers = ", ".join(
            f"{part.split(':')[0][1:]}x{len(part.split(':')[1].split(','))}"
            for part in pruned.split(";")
        )
        out.append([score, f"{rho_g:+.2f}", f"{rho_s:+.2f}", layers])
    return markdown_table(
        [
            "score",
            "rho(importance, gradient)",
            "rho(statistic, sink share)",
            f"layers of the first {k1} pruned (layer x heads)",
        ],
        out,
    )


def render_tables(results: Path) -> dict[str, str]:
    """The README tables, from the result files in ``results`` (``table`` renders them)."""
    smol, gemma = results / "smollm2-135m", results / "gemma3-270m"
    return {
        "smollm2-perplexity": perplexity_table([smol, results / "smollm2-135m-reversed"]),
        "smollm2-ratio": ratio_table(smol),
        "smollm2-diagnostics": diagnostics_table(smol),
        "gemma3-perplexity": perplexity_table([gemma]),
        "gemma3-ratio": ratio_table(gemma),
        "gemma3-diagnostics": diagnostics_table(gemma),
    }


#: The quick mode's files CI compares with ``golden/``. Scores and perplexities are computed in
#: fp32 on fixed tokens without sampling, so a rerun on this machine repeats them; rtol 1e-4
#: leaves room for another CPU's float rounding (a near-tie in a score that reorders heads would
#: still show, as it should). The command (it names the output folder) and timings are not
#: results.
GOLDEN = (
    Golden("perplexity.csv", rtol=1e-4, atol=1e-6),
    Golden("head_scores.csv", rtol=1e-4, atol=1e-6),
    Golden("prune_order.csv", rtol=1e-4, atol=1e-6),
    Golden("meta.json", rtol=1e-4, atol=1e-6, ignore=("timings", "wall_s", "command")),
)

STUDY = Study(
    name="pruning",
    description="Sink-aware head pruning on SmolLM2-135M and Gemma-3-270M: perplexity after "
    "pruning the k least important heads by each score (attncoda prune).",
    run=_run,
    quick=_quick,
    tables=render_tables,
    golden=GOLDEN,
    assets=("smollm2-135m", "gemma3-270m", "austen", "mobydick"),
    add_arguments=_arguments,
)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(STUDY, argv)
