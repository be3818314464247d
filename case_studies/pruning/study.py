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
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import attncoda as ac
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
from attncoda.hooks.scores import ATTENTION_SCORES

from .._study import (
    Golden,
    Provenance,
    Shard,
    Study,
    add_shard,
    add_time_limit,
    fixed,
    markdown_table,
    provenance_table,
    scientific,
    seconds_left,
    significant,
)
from .._study import main as study_main
from .evidence import (
    BASE,
    CONDITIONAL_UNIT,
    CONTROLS,
    N_BOOT,
    RESAMPLING_UNIT,
    Cell,
    Evidence,
    RatioInterval,
    cell_commits,
    load_cells,
    plot_evidence,
    random_band,
    ratio_interval,
    run_cells,
    score_ratios,
    window_table,
)

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
#: ``quick``: the evidence protocol in miniature on one 64-token window per text: every kind of
#: cell (two main scores under every control, both ablations, two random orders, the other
#: scores globally) at two ks, 27 cells (every score of the protocol computed), about half a
#: minute on SmolLM2-135M.
QUICK_EVIDENCE = Evidence(
    window=64,
    calibration_windows=1,
    eval_windows=1,
    fractions=(0.1, 0.3),
    main_scores=("sink_share", "entropy"),
    other_scores=("max_attention", "content_entropy", "gradient"),
    mean_scores=("sink_share", "entropy"),
    random_seeds=2,
)
#: More texts for the claims whose per-text values straddle their threshold (issue 28): the
#: cells such a row compares, evaluated on the same number of windows of each of these texts,
#: beside the three texts every cell has (``run --wider``, into ``evidence/<model>/wider-texts``).
WIDER_TEXTS = ("persuasion", "genesis")
WIDER = "wider-texts"
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


def _loaded_windows(
    name: str, protocol: Evidence, prov: Provenance, label: str = ""
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, calibration, evaluation)`` of ``protocol`` on ``name`` (one torch thread), with
    the assets and the token sha256s recorded in ``prov`` (evaluation texts under
    ``name/label/text``)."""
    import torch  # heavy; only a run needs it

    torch.set_num_threads(1)
    for asset in (name, *sorted({TEXT_STARTS[t][0] for t in (CALIBRATION_TEXT, *protocol.texts)})):
        prov.asset(asset)
    model, tokenizer = assets.load_model(name)
    calibration, evaluation = evidence_windows(tokenizer, protocol)
    prov.tokens(f"{name}/calibration ({CALIBRATION_TEXT})", calibration)
    for t, ids in evaluation.items():
        prov.tokens(f"{name}/{label}{'/' if label else ''}{t}", ids)
    return model, calibration, evaluation


def run_evidence(
    name: str,
    folder: Path,
    protocol: Evidence,
    prov: Provenance,
    *,
    shard: Shard | None = None,
    time_limit_s: float | None = None,
) -> list[Cell]:
    """The evidence protocol on one model into ``folder``: every missing cell (of ``shard``)
    (:func:`~case_studies.pruning.evidence.run_cells`, resumable), then ``window_nll.csv`` (one
    row per cell and window, the cells done so far) and the folder's ``manifest.json``."""
    model, calibration, evaluation = _loaded_windows(name, protocol, prov)
    done = run_cells(
        model,
        calibration,
        evaluation,
        folder,
        protocol,
        shard=shard,
        time_limit_s=time_limit_s,
        progress=lambda line: print(f"{name}: {line}", flush=True),
        record={"commit": prov.git["commit"], "dirty": prov.git["dirty"]},
    )
    cells = load_cells(folder)
    ac.write_table(window_table(cells), folder / "window_nll.csv")
    meta = json.loads((folder / "meta.json").read_text())
    planned = meta["cells"]
    plot_evidence(
        cells,
        meta["ks"],
        meta["n_units"],
        protocol.main_scores,
        f"{name}: perplexity after pruning k heads, over the unpruned model's "
        f"({len(cells)} of {len(planned)} cells)",
        folder / "evidence.png",
    )
    prov.settings.setdefault("evidence", {})[name] = {
        "protocol": dataclasses.asdict(protocol),
        "cells_done": len(done),
        "cells_planned": len(planned),
    }
    # the manifest's commit is this command's; the cells may come from earlier runs and trees
    prov.settings.setdefault("cell_commits", {})[name] = cell_commits(cells)
    prov.write(folder)
    return done


def _run(out: Path, args: argparse.Namespace, prov: Provenance) -> None:
    if args.wider and args.shard is not None:  # before any model loads
        raise SystemExit(
            "--wider computes a few cells in one process and takes no --shard; drop --shard"
        )
    for folder in args.folders:
        model, extra = JOBS[folder]
        _prune_into(model, out / folder, extra, prov)
    if args.folders:
        prov.settings.update(protocol=dataclasses.asdict(PROTOCOL), folders=list(args.folders))
    started = time.perf_counter()
    if args.wider:
        for name in args.models:
            run_wider(name, out, prov, time_limit_s=seconds_left(args, started))
        return
    for name in args.models:
        left = seconds_left(args, started)
        if left == 0 and not (out / EVIDENCE_DIR / name / "meta.json").is_file():
            continue  # out of time, and nothing of this model to rewrite
        run_evidence(
            name,
            out / EVIDENCE_DIR / name,
            EVIDENCE[name],
            prov,
            shard=args.shard,
            time_limit_s=left,
        )


def run_wider(
    name: str, results: Path, prov: Provenance, *, time_limit_s: float | None = None
) -> list[Cell]:
    """The cells of ``name``'s borderline claims (:func:`borderline_cells`) on
    :data:`WIDER_TEXTS`, into ``evidence/<name>/wider-texts`` (resumable; the unpruned model
    always). The head statistics are the model folder's (the same calibration windows), copied
    in first so that only the pruned models run."""
    import shutil

    folder = results / EVIDENCE_DIR / name
    cells = borderline_cells(read_evidence(results)).get(name, set())
    if not cells:
        print(f"{name}: no borderline claim, nothing to widen", flush=True)
        return []
    protocol = dataclasses.replace(EVIDENCE[name], texts=WIDER_TEXTS)
    model, calibration, evaluation = _loaded_windows(name, protocol, prov, WIDER)
    (folder / WIDER).mkdir(parents=True, exist_ok=True)
    for scores in ("head_scores.csv", "head_scores.json"):
        if not (folder / WIDER / scores).is_file():
            shutil.copy2(folder / scores, folder / WIDER / scores)
    done = run_cells(
        model,
        calibration,
        evaluation,
        folder / WIDER,
        protocol,
        only=cells,
        time_limit_s=time_limit_s,
        progress=lambda line: print(f"{name} ({WIDER}): {line}", flush=True),
        record={"commit": prov.git["commit"], "dirty": prov.git["dirty"]},
    )
    prov.settings.setdefault(WIDER, {})[name] = {
        "texts": list(WIDER_TEXTS),
        "cells": sorted(c.label for c in cells),
        "cell_commits": cell_commits(load_cells(folder / WIDER)),
    }
    return done


def _quick(out: Path, prov: Provenance) -> None:
    """The evidence protocol at :data:`QUICK_EVIDENCE`'s sizes on SmolLM2-135M, into ``out``."""
    run_evidence("smollm2-135m", out, QUICK_EVIDENCE, prov)


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
        "--wider",
        action="store_true",
        help=f"instead of the protocol: evaluate the cells of the claims whose per-text values "
        f"straddle their threshold on {len(WIDER_TEXTS)} more texts ({', '.join(WIDER_TEXTS)}), "
        f"into results/evidence/MODEL/{WIDER}",
    )
    add_time_limit(parser)
    add_shard(parser)
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
    return "k=0" if k == 0 else f"k={k} ({fixed(100 * k / n, 0)}%)"


def _read(folder: Path) -> tuple[Any, dict[str, Any]]:
    import attncoda as ac

    rows = ac.read_table(folder / "perplexity.csv")
    return rows[rows.corpus == "all"], json.loads((folder / "meta.json").read_text())


def _ppl(row: Any) -> float:
    """``exp(nll / tokens)``: the perplexity at full precision (the CSV's column has four
    decimals)."""

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
            out.append([score, sub.channel.iloc[0], *(fixed(cells[k], 2) for k in ks)])
    return markdown_table(["score", "channel", *(_k_label(k, n) for k in ks)], out)


def ratio_table(folder: Path) -> str:
    """Each pruned perplexity over the unpruned one, ``exp((nll_k - nll_0) / tokens)`` from
    ``perplexity.csv``'s summed NLLs (the CSV's perplexity and ratio columns are rounded to four
    decimals, too coarse for the second decimal of some ratios)."""

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
            cells.append(
                f"{fixed(math.exp((float(r.nll) - float(base.nll)) / int(r.n_tokens)), 2)}x"
            )
        out.append([score, *cells])
    return markdown_table(["score", *(_k_label(k, n) for k in ks)], out)


def diagnostics_table(folder: Path, scores: Sequence[str] = DIAGNOSED) -> str:
    """Per score: Spearman's rho, over all heads, of the score's importance (its statistic
    oriented so that higher means pruned later) with the gradient importance; rho of the raw
    statistic with the sink share; and the layers of the heads pruned at the smallest k > 0
    (``layer x heads``), from ``head_scores.csv`` and ``perplexity.csv``."""
    from scipy.stats import spearmanr

    import attncoda as ac
    from attncoda.hooks.scores import score_info

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
        picked = {
            (int(part.split(":")[0][1:]), int(h))
            for part in pruned.split(";")
            for h in part.split(":")[1].split(",")
        }
        chosen = [
            (int(la), int(h)) in picked for la, h in zip(heads["layer"], heads["head"], strict=True)
        ]
        share = float(heads.sink_share[chosen].mean())
        out.append(
            [
                score,
                fixed(rho_g, 2, plus=True),
                fixed(rho_s, 2, plus=True),
                layers,
                significant(share, 2),
            ]
        )
    return markdown_table(
        [
            "score",
            "rho(importance, gradient)",
            "rho(statistic, sink share)",
            f"layers of the first {k1} pruned (layer x heads)",
            f"their mean sink share (all heads: {significant(float(heads.sink_share.mean()), 2)})",
        ],
        out,
    )


# ------------------------------------------------------------------------- evidence tables

#: The sink-blind full-row scores: the "wrong channel" of the >100x claim.
FULL_ROW = ("entropy", "max_attention")
#: The content-channel scores: is the >100x specific to the full-row ones?
CONTENT = ("content_entropy", "content_aitchison", "content_clr_dispersion")
_CONTROL_NAMES = {
    "global": "own order",
    "within_layer": "same number per layer",
    "skip_0_2": "layers 0-2 kept",
}


@dataclasses.dataclass
class ModelEvidence:
    """The evidence results of one model folder: its ``meta.json`` and the cells done."""

    name: str
    meta: dict[str, Any]
    cells: dict[Cell, dict[str, Any]]
    #: cells evaluated on :data:`WIDER_TEXTS` too (only those of borderline claims)
    wider: dict[Cell, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: read every interval with the texts held fixed (the conditional one): what the verdicts
    #: would say without the spread between texts (:func:`side_changes`)
    conditional: bool = False

    def interval(self, on: Cell, off: Cell = BASE) -> RatioInterval:
        """``on`` over ``off`` on this model's windows (:func:`ratio_interval`)."""
        r = ratio_interval(self.cells, on, off)
        return r.conditional() if self.conditional else r

    @property
    def ks(self) -> list[int]:
        return [k for k in self.meta["ks"] if k > 0]

    @property
    def n_units(self) -> int:
        return int(self.meta["n_units"])

    def k_label(self, k: int) -> str:
        return _k_label(k, self.n_units)

    def has(self, *cells: Cell) -> bool:
        return all(c in self.cells for c in (BASE, *cells))

    def design(self) -> str:
        """``3 texts x 8 windows``: how the windows are grouped (what the interval holds fixed)."""
        texts = self.meta.get("texts", {})
        windows = "/".join(sorted({str(t["windows"]) for t in texts.values()}))
        return f"{len(texts)} texts x {windows} windows" if texts else "one pool of windows"

    def sample(self) -> str:
        """``24 windows, 12,264 tokens``: the sample behind every interval."""
        rec = self.cells[BASE]
        return f"{len(rec['nll'])} windows, {sum(rec['n_tokens']):,} tokens"


def read_evidence(results: Path) -> dict[str, ModelEvidence]:
    """Every model folder of ``results/evidence`` that has a ``meta.json``, in
    :data:`EVIDENCE`'s order."""
    out = {}
    for name in EVIDENCE:
        folder = results / EVIDENCE_DIR / name
        if (folder / "meta.json").is_file():
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            out[name] = ModelEvidence(name, meta, load_cells(folder), load_cells(folder / WIDER))
    return out


def _joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One cell's windows on the first texts and on :data:`WIDER_TEXTS`, as one record."""
    return {key: [*a[key], *b[key]] for key in ("nll", "n_tokens", "texts")}


def wider_interval(m: ModelEvidence, r: RatioInterval) -> RatioInterval | None:
    """``r``'s comparison over every text, the first ones and :data:`WIDER_TEXTS` (the same
    two-stage interval as every interval here), or ``None`` if not computed."""
    if r.cells is None or not all(c in m.wider and c in m.cells for c in r.cells):
        return None
    joined = {c: _joined(m.cells[c], m.wider[c]) for c in r.cells}
    r = ratio_interval(joined, *r.cells)
    return r.conditional() if m.conditional else r


def widest(m: ModelEvidence, r: RatioInterval) -> RatioInterval:
    """The widest evidence the study has for ``r``'s comparison: over every text where it was
    also run on :data:`WIDER_TEXTS`, else ``r`` itself. Every verdict reads this one."""
    return wider_interval(m, r) or r


def _wider_words(label: str, wide: RatioInterval, threshold: float) -> str:
    """What the wider evaluation says of one borderline comparison: the added texts' own
    ratios, how many lie above the line, and the interval over every text."""
    added = [(t, v) for t, v in wide.per_text if t in WIDER_TEXTS]
    above = sum(v > threshold for _, v in added)
    ci = (
        f"the interval lies above {threshold:g}x"
        if wide.low > threshold
        else f"the interval lies below {threshold:g}x"
        if wide.high < threshold
        else f"the interval spans {threshold:g}x"
    )
    texts = f"{above} of the {len(added)} added texts above {threshold:g}x; {ci}"
    return (
        f"{label} on {len(added)} more texts ({' / '.join(t for t, _ in added)}: "
        f"{dataclasses.replace(wide, per_text=tuple(added)).texts()}), over all "
        f"{len(wide.per_text)} texts {wide} ({wide.n_windows} windows): {texts}"
    )


def coverage_table(models: dict[str, ModelEvidence], results: Path) -> str:
    """Per model: cells done of those planned, the sample, random orders done, compute time."""
    rows = []
    for name in EVIDENCE:
        m = models.get(name)
        if m is None or BASE not in m.cells:
            rows.append([name, "not run", "", "", "", ""])
            continue
        planned = len(m.meta["cells"])
        seeds = {c.seed for c in m.cells if c.score == "random"}
        state = "complete" if len(m.cells) == planned else "**partial**"
        secs = sum(float(r.get("seconds", 0)) for r in m.cells.values())
        texts = ", ".join(f"{t} x {v['windows']}" for t, v in m.meta["texts"].items())
        made_by = "; ".join(
            f"`{g['commit'][:12]}` x {g['n']}"
            + {False: "", True: " (**modified tree**)"}.get(g["dirty"], " (tree state unknown)")
            for g in cell_commits(m.cells)
        )
        rows.append(
            [
                name,
                f"{len(m.cells)} of {planned} ({state})",
                f"{m.sample()} ({texts})",
                f"{len(seeds)} of {m.meta['protocol']['random_seeds']}",
                f"{fixed(secs / 3600, 1)} h",
                made_by,
            ]
        )
    return markdown_table(
        [
            "model",
            "cells done",
            "evaluation sample",
            "random orders",
            "compute (cells)",
            "cells made at (commit x cells)",
        ],
        rows,
    )


def _ci(models: ModelEvidence, on: Cell, off: Cell = BASE) -> str:
    return str(models.interval(on, off)) if models.has(on, off) else "—"


def evidence_table(m: ModelEvidence | None) -> str:
    """Every pruned cell of one model: perplexity over the unpruned model's, 95% CI."""
    if m is None or BASE not in m.cells:
        return "not run yet (see the coverage table)"
    protocol = m.meta["protocol"]
    rows = []
    for control in CONTROLS:
        for score in protocol["main_scores"]:
            cells = [Cell(control, "zero", score, 0, k) for k in m.ks]
            rows.append([score, _CONTROL_NAMES[control], "zero", *(_ci(m, c) for c in cells)])
    for score in protocol["mean_scores"]:
        cells = [Cell("global", "mean", score, 0, k) for k in m.ks]
        rows.append([score, _CONTROL_NAMES["global"], "mean", *(_ci(m, c) for c in cells)])
    for score in protocol["other_scores"]:
        cells = [Cell("global", "zero", score, 0, k) for k in m.ks]
        rows.append([score, _CONTROL_NAMES["global"], "zero", *(_ci(m, c) for c in cells)])
    band = []
    for k in m.ks:
        med, p5, p95, n = random_band(m.cells, k)
        band.append(
            f"{significant(med, 3)}x [{significant(p5, 3)}, {significant(p95, 3)}] (n={n})"
            if n
            else "—"
        )
    rows.append(["random (median [5%, 95%])", _CONTROL_NAMES["global"], "zero", *band])
    return markdown_table(["score", "order", "ablation", *(m.k_label(k) for k in m.ks)], rows)


def _worst_full_row(m: ModelEvidence) -> tuple[str, int] | None:
    """The full-row score and k (of the first three) with the largest global ratio."""
    best: tuple[float, str, int] | None = None
    for k in m.ks[:3]:
        for s, r in score_ratios(m.cells, k, FULL_ROW).items():
            if best is None or r > best[0]:
                best = (r, s, k)
    return None if best is None else (best[1], best[2])


@dataclasses.dataclass
class ChannelLayer:
    """The channel-vs-layer comparison of one model at the worst full-row cell."""

    score: str
    k: int
    ratio: dict[str, RatioInterval]  # control -> the score's ratio to the unpruned model
    gap: dict[str, RatioInterval]  # control -> the score's perplexity over sink share's
    layer: dict[str, RatioInterval]  # control -> own order over this control (same score)

    @property
    def channel_effect(self) -> bool:
        return all(
            self.gap[c].low > 1 for c in ("within_layer", "skip_0_2") if c in self.gap
        ) and bool({"within_layer", "skip_0_2"} & set(self.gap))

    @property
    def reversed(self) -> bool:
        """The full-row score's own order costs *less* than the sink share's (CI below 1)."""
        own = self.gap.get("global")
        return own is not None and own.high < 1

    @property
    def layer_effect(self) -> bool:
        return any(r.low > 1 for r in self.layer.values())

    @property
    def effect(self) -> str:
        """``"reversed"``, ``"both"``, ``"channel"``, ``"layer"`` or ``"neither resolved"``:
        what the gaps under the layer controls say (the claim row and the answer word it)."""
        if self.reversed:
            return "reversed"
        if self.channel_effect and self.layer_effect:
            return "both"
        if self.channel_effect:
            return "channel"
        return "layer" if self.layer_effect else "neither resolved"

    def layer_shares(self) -> dict[str, float]:
        """Per layer control, how much of the own-order gap's log it removes: ``1 -
        log(controlled gap) / log(own gap)``, 0 where the control keeps the whole gap or widens
        it, 1 where it removes all of it (a controlled gap below 1); empty without a gap."""
        own = self.gap.get("global")
        if own is None or own.ratio <= 1:
            return {}
        return {
            c: min(1.0, max(0.0, 1 - math.log(max(v.ratio, 1.0)) / math.log(own.ratio)))
            for c, v in self.gap.items()
            if c != "global"
        }

    def layer_share(self) -> str:
        """The layer share of the gap's log as a range over the controls, each named, e.g.
        ``"67% (same number per layer) to 94% (layers 0-2 kept)"``; ``"n/a"`` without a gap or
        a control. Neither control alone is *the* share, and that they bound it was not
        shown: the range is the two controls' answers."""
        shares = self.layer_shares()
        if not shares:
            return "n/a"
        parts = [
            f"{fixed(100 * (v), 0)}% ({_CONTROL_NAMES[c]})"
            for c, v in sorted(shares.items(), key=lambda x: x[1])
        ]
        return (
            " to ".join(parts)
            if len({f"{fixed(100 * (v), 0)}%" for v in shares.values()}) > 1
            else (
                f"{fixed(100 * (next(iter(shares.values()))), 0)}% ({' and '.join(_CONTROL_NAMES[c] for c in shares)})"
            )
        )


def channel_layer(m: ModelEvidence) -> ChannelLayer | None:
    """At the full-row score and k with the largest global ratio: its ratio under each control,
    its gap to the sink share under each control, and own order over each control."""
    worst = _worst_full_row(m)
    if worst is None:
        return None
    score, k = worst
    ratio, gap, layer = {}, {}, {}
    for control in CONTROLS:
        on = Cell(control, "zero", score, 0, k)
        sink = Cell(control, "zero", "sink_share", 0, k)
        if m.has(on):
            ratio[control] = m.interval(on)
        if m.has(on, sink):
            gap[control] = m.interval(on, sink)
        if control != "global" and m.has(on, Cell("global", "zero", score, 0, k)):
            layer[control] = m.interval(Cell("global", "zero", score, 0, k), on)
    return ChannelLayer(score, k, ratio, gap, layer)


def channel_layer_table(models: dict[str, ModelEvidence]) -> str:
    """Per model and k: each scored order's gap to the sink share (perplexity over perplexity,
    paired CI) under each control, and the full-row scores' own order over each control."""
    rows = []
    for name, m in models.items():
        for k in m.ks[:3]:
            for control in CONTROLS:
                sink = Cell(control, "zero", "sink_share", 0, k)
                gaps = [
                    _ci(m, Cell(control, "zero", s, 0, k), sink)
                    for s in ("entropy", "max_attention", "content_entropy", "gradient")
                ]
                own = [
                    _ci(m, Cell("global", "zero", s, 0, k), Cell(control, "zero", s, 0, k))
                    if control != "global"
                    else ""
                    for s in ("entropy", "max_attention", "content_entropy")
                ]
                if all(g == "—" for g in gaps):
                    continue
                rows.append([name, m.k_label(k), _CONTROL_NAMES[control], *gaps, *own])
    return markdown_table(
        [
            "model",
            "k",
            "order",
            "entropy / sink share",
            "max attention / sink share",
            "content entropy / sink share",
            "gradient / sink share",
            "entropy: own order / this",
            "max attention: own order / this",
            "content entropy: own order / this",
        ],
        rows,
    )


def gradient_table(models: dict[str, ModelEvidence]) -> str:
    """Per model and k: the attention statistic with the lowest perplexity (own order, zero
    ablation), its ratio, the gradient's, and the two's paired ratio."""
    rows = []
    for name, m in models.items():
        for k in m.ks:
            grad = Cell("global", "zero", "gradient", 0, k)
            ratios = score_ratios(m.cells, k, ATTENTION_SCORES)
            if not ratios or not m.has(grad):
                continue
            best = min(ratios, key=lambda s: ratios[s])
            cell = Cell("global", "zero", best, 0, k)
            sink = Cell("global", "zero", "sink_share", 0, k)
            rows.append(
                [
                    name,
                    m.k_label(k),
                    f"{best} ({len(ratios)} compared)",
                    _ci(m, cell),
                    _ci(m, grad),
                    _ci(m, cell, grad),
                    _ci(m, sink, grad),
                ]
            )
    return markdown_table(
        [
            "model",
            "k",
            "closest attention statistic",
            "its ratio",
            "gradient's ratio",
            "statistic / gradient",
            "sink share / gradient",
        ],
        rows,
    )


def _verdict_100x(r: RatioInterval) -> str:
    if r.low > 100:
        return "holds on our protocol (CI above 100x)"
    if r.high < 100:
        return "does not hold on our protocol (CI below 100x)"
    return "inconclusive (CI spans 100x)"


def _texts(m: ModelEvidence) -> str:
    """The texts behind the per-text values, in their order (``mobydick / ... / wikipedia``)."""
    return " / ".join(m.meta.get("texts", {}))


@dataclasses.dataclass
class _Claims:
    """The claim rows and every interval they show (counted for the multiplicity note)."""

    rows: list[list[str]] = dataclasses.field(default_factory=list)
    intervals: int = 0
    #: per model, the cells of every comparison whose per-text values straddle its threshold
    borderline: dict[str, set[Cell]] = dataclasses.field(default_factory=dict)
    #: the comparisons also evaluated on :data:`WIDER_TEXTS`
    widened: int = 0

    def add(
        self,
        m: ModelEvidence,
        question: str,
        ablation: str,
        paper: str,
        shown: Sequence[tuple[str, RatioInterval]],
        verdict: str,
        extra: str = "",
        threshold: float | None = None,
    ) -> None:
        """One row: ``shown`` are ``(label, interval)`` pairs, each with its per-text values.
        Where the per-text values of a shown interval straddle ``threshold`` (the verdict's
        line: 100x, or 1 for a comparison), the verdict says so: the pooled interval, conditional
        on these texts, does not settle it for text in general."""
        self.intervals += len(shown)
        if threshold is not None:
            split = [
                (label or "it", r)
                for label, r in shown
                if r.per_text
                and min(v for _, v in r.per_text) < threshold < max(v for _, v in r.per_text)
            ]
            if split:
                verdict += (
                    f"; **borderline**: per-text values straddle {threshold:g}x "
                    f"({', '.join(label for label, _ in split)})"
                )
            for label, r in split:
                if r.cells is not None:
                    self.borderline.setdefault(m.name, set()).update(r.cells)
                wide = wider_interval(m, r)
                if wide is not None:
                    self.intervals += 1
                    self.widened += 1
                    verdict += "; " + _wider_words(label, wide, threshold)
        ours = "; ".join(
            f"{label}{': ' if label else ''}{r}"
            + ("" if m.conditional else f" (texts fixed: {r.conditional_text()})")
            for label, r in shown
        )
        texts = "; ".join(f"{label}{': ' if label else ''}{r.texts()}" for label, r in shown)
        self.rows.append(
            [
                m.name,
                question,
                ablation,
                paper,
                ours + (f"; {extra}" if extra else ""),
                texts,
                f"{m.sample()}; {m.design()}, CI over texts then windows",
                verdict,
            ]
        )


def _claims(models: dict[str, ModelEvidence]) -> _Claims:
    out = _Claims()
    for name, m in models.items():
        if BASE not in m.cells:
            continue
        cl = channel_layer(m)
        if cl is not None and "global" in cl.ratio:
            r = cl.ratio["global"]
            where = f"{cl.score}, {m.k_label(cl.k)}"
            mean = Cell("global", "mean", cl.score, 0, cl.k)
            out.add(
                m,
                "Pruning by the wrong (sink-blind, full-row) channel costs >100x perplexity",
                "zero",
                ">100x",
                [(where, r)],
                f"zero ablation: {_verdict_100x(widest(m, r))}",
                threshold=100,
            )
            if m.has(mean):
                rm = m.interval(mean)
                rw, rmw = widest(m, r), widest(m, rm)
                out.add(
                    m,
                    "... the same cell with mean ablation (each pruned head's calibration mean)",
                    "mean",
                    ">100x",
                    [(where, rm)],
                    f"mean ablation: {_verdict_100x(rmw)}"
                    + (
                        "; the >100x holds under zero ablation only"
                        if rw.low > 100 and rmw.high < 100
                        else ""
                    ),
                    threshold=100,
                )
            content = [
                (s, m.interval(Cell("global", "zero", s, 0, cl.k)))
                for s in CONTENT
                if m.has(Cell("global", "zero", s, 0, cl.k))
            ]
            if content:
                values = [widest(m, v) for _, v in content]
                rw = widest(m, r)
                out.add(
                    m,
                    "... specific to the full-row scores? The content scores, same k, own order",
                    "zero",
                    "—",
                    content,
                    "not specific: a content score also costs >100x"
                    if any(v.low > 100 for v in values)
                    else "no >100x in either channel"
                    if rw.high < 100 and all(v.high < 100 for v in values)
                    else "specific: every content score below 100x"
                    if all(v.high < 100 for v in values)
                    else "inconclusive",
                    threshold=100,
                )
            kept = [(_CONTROL_NAMES[c], v) for c, v in cl.ratio.items() if c != "global"]
            if kept:
                still = [widest(m, v) for _, v in kept]
                rw = widest(m, r)
                out.add(
                    m,
                    "... the same score and k with layer position controlled",
                    "zero",
                    "—",
                    kept,
                    "no >100x to explain: below 100x in its own order"
                    if rw.high < 100
                    else "the >100x needs the early-layer order"
                    if all(v.high < 100 for v in still)
                    else "the >100x survives a layer control"
                    if any(v.low > 100 for v in still)
                    else "inconclusive",
                    threshold=100,
                )
            if cl.gap:
                verdict = {
                    "reversed": f"contradicted: {cl.score} prunes better than the sink share "
                    "in its own order",
                    "both": f"both: layer position is {cl.layer_share()} of the gap's log "
                    "(the two controls' shares: a range, not bounds; which control, if "
                    "either, isolates layer position was not tested); the rest survives both "
                    "controls (channel)",
                    "channel": "supported: a channel effect",
                    "layer": "contradicted: a layer-position effect",
                    "neither resolved": "inconclusive",
                }[cl.effect]
                out.add(
                    m,
                    f"The gap is the channel: {cl.score} over sink share, same k, each order",
                    "zero",
                    "— (attributed to the channel)",
                    [(_CONTROL_NAMES[c], v) for c, v in cl.gap.items()],
                    verdict,
                    threshold=1,
                )
        for k in m.ks[1:2]:
            grad = Cell("global", "zero", "gradient", 0, k)
            sink = Cell("global", "zero", "sink_share", 0, k)
            ratios = score_ratios(m.cells, k, ATTENTION_SCORES)
            if ratios and m.has(grad, sink):
                best = min(ratios, key=lambda s: ratios[s])
                r = m.interval(Cell("global", "zero", best, 0, k), grad)
                rs = m.interval(sink, grad)
                rw = widest(m, r)
                versus = (
                    "as good as the gradient (CI includes 1)"
                    if rw.low <= 1 <= rw.high
                    else "better than the gradient"
                    if rw.high < 1
                    else "worse than the gradient"
                )
                verdict = (
                    f"on {name}, yes: the sink share is the closest, {versus}"
                    if best == "sink_share"
                    else f"on {name}, no: {best} is the closest, {versus}; the sink share costs "
                    f"{significant(rs.ratio, 2)}x the gradient's perplexity"
                )
                shown = [(f"{best} / gradient", r)]
                if best != "sink_share":
                    shown.append(("sink_share / gradient", rs))
                out.add(
                    m,
                    f"Is the sink share the attention statistic closest to the gradient baseline "
                    f"({m.k_label(k)}; {len(ratios)} statistics compared)?",
                    "zero",
                    "— (ours; Michel et al. 2019 baseline)",
                    shown,
                    verdict,
                    threshold=1,
                )
            med, p5, p95, n_orders = random_band(m.cells, k)
            if n_orders and m.has(sink):
                r = m.interval(sink)
                rw = widest(m, r)
                where = "below" if rw.high < p5 else "above" if rw.low > p95 else "within"
                out.add(
                    m,
                    f"Sink-channel pruning beats random orders ({m.k_label(k)})",
                    "zero",
                    "—",
                    [("sink share", r)],
                    f"{where} the random band",
                    extra=f"random median {significant(med, 3)}x, 5-95% [{significant(p5, 3)}, {significant(p95, 3)}] over "
                    f"{n_orders} orders (a band over orders, not an interval)",
                )
    return out


def claims_table(models: dict[str, ModelEvidence]) -> str:
    """The study's claim table: question, ablation, the paper's number, ours with a 95% CI,
    the per-text values, the sample and what the interval resamples, a verdict; one block of
    rows per model with results."""
    claims = _claims(models)
    if not claims.rows:
        return "no evidence results yet"
    texts = {_texts(m) for m in models.values() if BASE in m.cells}
    return markdown_table(
        [
            "model",
            "question",
            "ablation",
            "paper",
            "ours (95% CI; in brackets, the CI with the texts fixed)",
            f"per text ({' | '.join(sorted(texts))})",
            "sample; interval",
            "verdict",
        ],
        claims.rows,
    )


def claims_note(models: dict[str, ModelEvidence]) -> str:
    """The sentences that read the claim table: what an interval resamples, how many there are
    and that none is corrected for multiplicity (rendered, so its numbers cannot drift)."""
    claims = _claims(models)
    if not claims.rows:
        return "No evidence results yet."
    n_texts = sorted({len(m.meta.get("texts", {})) for m in models.values() if BASE in m.cells})
    windows = sorted(
        {
            w["windows"]
            for m in models.values()
            if BASE in m.cells
            for w in m.meta.get("texts", {}).values()
        }
    )
    draws_of = [*n_texts, *([n_texts[-1] + len(WIDER_TEXTS)] if claims.widened else [])]
    return (
        f"The claim table holds {claims.intervals} intervals (95% each). **None is corrected "
        "for multiplicity**: each answers its own row, and about one in twenty of them would "
        "miss its target by chance alone; a Bonferroni correction over all of them would widen "
        f"each to a {fixed(100 * (1 - 0.05 / claims.intervals), 2)}% interval. Every interval is a paired "
        f"bootstrap ({N_BOOT:,} resamples) over {RESAMPLING_UNIT}: the windows come in runs of "
        f"{' or '.join(map(str, windows))} contiguous windows from each of "
        f"{' or '.join(map(str, n_texts))} texts, and each replicate draws the texts with "
        "replacement and then the windows of each drawn text, so the interval carries the spread "
        f"between texts (with so few texts it is coarse: {_text_draws(draws_of)}). Beside it, in "
        "brackets, is the interval over "
        f"{CONDITIONAL_UNIT}, which is narrower and holds only for these texts. Each row also "
        "shows the per-text point ratios: where they straddle a threshold, the row says so. "
        "Every verdict reads the widest evidence the study has: the two-stage interval, over all "
        "texts where a comparison was widened. "
        + side_changes(models)
        + (
            f" Where they straddle, the comparison was also run on {len(WIDER_TEXTS)} more texts "
            f"({', '.join(WIDER_TEXTS)}; the same windows each; `run --wider`): "
            f"{claims.widened} of the intervals above are over all "
            f"{n_texts[-1] + len(WIDER_TEXTS)} texts, and the verdict says whether the added texts "
            "fall on one side."
            if claims.widened
            else ""
        )
    )


def _text_draws(counts: Sequence[int]) -> str:
    """How many different sets of texts a two-stage replicate can draw, for each number of texts
    an interval resamples (n texts drawn n times with replacement: C(2n - 1, n) multisets).

    Examples
    --------
    >>> _text_draws([3, 5])
    'a bootstrap over 3 texts has 10 distinct draws of them, over 5 texts 126'
    """
    first, *rest = (f"{n} texts {math.comb(2 * n - 1, n):,}" for n in counts)
    n, draws = first.split(" texts ")
    return f"a bootstrap over {n} texts has {draws} distinct draws of them" + "".join(
        f", over {p}" for p in rest
    )


def side_changes(models: dict[str, ModelEvidence]) -> str:
    """The sentence that says which verdicts change side when the texts are held fixed (the
    conditional interval in place of the two-stage one), rendered from the two claim tables."""
    two = _claims(models).rows
    fixed = _claims({n: dataclasses.replace(m, conditional=True) for n, m in models.items()}).rows
    changed = [
        f"{a[0]}, '{a[1]}' ({b[7].split('; ')[0]} with the texts fixed; "
        f"{a[7].split('; ')[0]} over texts and windows)"
        for a, b in zip(two, fixed, strict=True)
        if a[7].split("; ")[0] != b[7].split("; ")[0]
    ]
    if not changed:
        return "No verdict changes side when the texts are held fixed."
    return (
        f"{len(changed)} verdict{'s change' if len(changed) > 1 else ' changes'} side when the "
        f"texts are held fixed: {'; '.join(changed)}."
    )


def borderline_cells(models: dict[str, ModelEvidence]) -> dict[str, set[Cell]]:
    """Per model, the cells of the claim rows whose per-text values straddle their threshold:
    what ``run --wider`` evaluates on :data:`WIDER_TEXTS`."""
    return _claims(models).borderline


def channel_layer_answer(models: dict[str, ModelEvidence]) -> str:
    """The README's answer to "channel effect or layer effect?", one sentence per model, with
    the numbers of the claim table."""
    lines = []
    for name, m in models.items():
        cl = channel_layer(m) if BASE in m.cells else None
        if cl is None or "global" not in cl.ratio:
            continue
        parts = [
            f"- **{name}** ({m.sample()}; cells {len(m.cells)} of {len(m.meta['cells'])}): "
            f"{cl.score} at {m.k_label(cl.k)} costs {cl.ratio['global']} in its own order"
        ]
        for c in ("skip_0_2", "within_layer"):
            if c in cl.ratio:
                parts.append(f"{cl.ratio[c]} with {_CONTROL_NAMES[c]}")
        text = ", ".join(parts) + "."
        if cl.gap:
            text += (
                " Over the sink share's order at the same k: "
                + "; ".join(f"{_CONTROL_NAMES[c]} {v}" for c, v in cl.gap.items())
                + "."
            )
        effect = {
            "reversed": f"no channel penalty: {cl.score} prunes better than the sink share in "
            "its own order",
            "both": f"both a layer effect and a channel effect ({cl.layer_share()} of the log gap "
            "to the sink share is layer position)",
            "channel": "a channel effect (the gap survives both layer controls)",
            "layer": "a layer effect (the gap to the sink share does not survive the layer "
            "controls)",
            "neither resolved": "not resolved by this sample",
        }[cl.effect]
        lines.append(f"{text} Answer: **{effect}**.")
    return "\n".join(lines) if lines else "No evidence results yet."


def mean_ablation_answer(models: dict[str, ModelEvidence]) -> str:
    """Per model, at 20% of the heads in each score's own order: mean ablation (each pruned
    head's output replaced by its calibration mean) beside zero ablation, paired CIs."""
    lines = []
    for name, m in models.items():
        if BASE not in m.cells or len(m.ks) < 2:
            continue
        k = m.ks[1]
        pairs = []
        for score in m.meta["protocol"]["mean_scores"]:
            mean, zero = Cell("global", "mean", score, 0, k), Cell("global", "zero", score, 0, k)
            if m.has(mean, zero):
                rm, rz = m.interval(mean), m.interval(zero)
                pairs.append(
                    f"{score} {rm}{f' (per text {rm.texts()})' if rm.per_text else ''} mean vs "
                    f"{rz}{f' (per text {rz.texts()})' if rz.per_text else ''} zero"
                )
        if pairs:
            texts = f"; per text: {_texts(m)}" if _texts(m) else ""
            lines.append(
                f"- **{name}** ({m.k_label(k)}, own order{texts}): " + "; ".join(pairs) + "."
            )
    return "\n".join(lines) if lines else "No mean-ablation cells yet."


#: Cells recomputed later at a clean commit, beside a model's cells, to check those that came
#: from a modified tree (``evidence/<model>/clean-rerun/``: cells and ``meta.json``).
CLEAN_RERUN = "clean-rerun"


def _tree_state(dirty: Any) -> str:
    """A cell's recorded ``dirty`` flag in words."""
    return "modified tree" if dirty is True else "clean tree" if dirty is False else "unknown"


def clean_rerun_note(results: Path, models: dict[str, ModelEvidence]) -> str:
    """Per model with a ``clean-rerun`` folder: a summary (how many of its modified-tree cells
    were recomputed at a clean commit, and the largest difference), then which cells were
    recomputed, at which commit, and how far their per-window NLLs are from the committed
    cells' (relative)."""
    lines = []
    for name, m in models.items():
        folder = results / EVIDENCE_DIR / name / CLEAN_RERUN
        rerun = load_cells(folder) if (folder / "meta.json").is_file() else {}
        rows, worst_all = [], 0.0
        for cell, rec in sorted(rerun.items()):
            if cell not in m.cells:
                continue
            old = m.cells[cell]
            a, b = np.asarray(old["nll"], float), np.asarray(rec["nll"], float)
            worst = float(np.max(np.abs(a - b) / np.abs(a)))
            worst_all = max(worst_all, worst)
            ppl = [math.exp(x.sum() / sum(r["n_tokens"])) for x, r in ((a, old), (b, rec))]
            state, was = (_tree_state(r.get("dirty")) for r in (rec, old))
            rows.append(
                f"- **{name}** `{cell.label}`: made at `{str(old.get('commit'))[:12]}` ({was}), "
                f"recomputed at `{str(rec.get('commit'))[:12]}` ({state}): per-window NLLs "
                f"agree to {scientific(worst, 1)} (largest relative difference), perplexity "
                f"{fixed(ppl[0], 4)} then, {fixed(ppl[1], 4)} now."
            )
        if not rows:
            continue
        dirty = {c for c, r in m.cells.items() if r.get("dirty") is not False}
        clean = {c for c, r in rerun.items() if r.get("dirty") is False and c in m.cells}
        left = sorted(c.label for c in dirty - clean)
        lines.append(
            f"**{name}: {len(dirty & clean)} of its {len(dirty)} cells from a modified (or "
            f"unrecorded) tree recomputed at a clean commit**; per-window NLLs agree to "
            f"{scientific(worst_all, 1)} at most (largest relative difference)"
            + (f"; not yet recomputed: {', '.join(left)}." if left else ".")
        )
        lines.extend(rows)
    return "\n".join(lines) if lines else "No cell has been recomputed at a clean commit yet."


def compute_note(models: dict[str, ModelEvidence]) -> str:
    """What the cells cost, from their own ``seconds``: per model, cells x windows forward
    passes, the median and range of a cell and of a window (one torch thread, on the shared
    machine: the spread is its load, not the model)."""
    lines = []
    for name, m in models.items():
        if BASE not in m.cells:
            continue
        secs = np.array([float(r.get("seconds", math.nan)) for r in m.cells.values()])
        secs = secs[np.isfinite(secs)]
        windows = len(m.cells[BASE]["nll"])
        if not len(secs):
            continue
        lines.append(
            f"- **{name}**: {len(m.cells)} cells x {windows} windows = "
            f"{len(m.cells) * windows:,} forward passes, {fixed(secs.sum() / 3600, 1)} h of one thread; "
            f"a cell took {fixed(np.median(secs), 0)} s (median; {fixed(secs.min(), 0)}-{fixed(secs.max(), 0)} s), "
            f"a window {fixed(np.median(secs) / windows, 1)} s "
            f"({fixed(secs.min() / windows, 1)}-{fixed(secs.max() / windows, 1)} s)."
        )
    return "\n".join(lines) if lines else "No cells yet."


def earlier_wall(folders: Sequence[Path]) -> str:
    """The earlier run's wall time per folder (``wall_s`` of its ``meta.json``)."""
    parts = []
    for folder in folders:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        parts.append(f"{fixed(meta['wall_s'] / 60, 0)} min (`{folder.name}`)")
    return (
        "Wall time of the earlier run (the `wall_s` of each `meta.json`): " + ", ".join(parts) + "."
    )


def sink_by_layer(folder: Path) -> str:
    """Mean sink share per layer over the calibration text (``head_scores.csv``), and the
    most sink-dominated heads: where the dispensable, sink-heavy heads sit."""
    table = ac.read_table(folder / "head_scores.csv")
    per_layer = table.groupby("layer")["sink_share"].mean()
    top = table.sort_values("sink_share", ascending=False).head(3)
    return (
        f"Mean sink share per layer on the calibration text (`{folder.name}/head_scores.csv`, "
        "column `sink_share`), layer: share: "
        + ", ".join(f"{int(layer)}: {fixed(v, 2)}" for layer, v in per_layer.items())
        + ". The three most sink-dominated heads: "
        + ", ".join(
            f"layer {int(r.layer)} head {int(r.head)} ({significant(r.sink_share, 5)})"
            for r in top.itertuples()
        )
        + "."
    )


def render_tables(results: Path) -> dict[str, str]:
    """The README tables, from the result files in ``results`` (``table`` renders them)."""
    smol, gemma = results / "smollm2-135m", results / "gemma3-270m"
    models = read_evidence(results)
    evidence = {f"evidence-{name}": evidence_table(models.get(name)) for name in EVIDENCE}
    return {
        "provenance-earlier": provenance_table(smol),
        "claims": claims_table(models),
        "claims-note": claims_note(models),
        "channel-layer-answer": channel_layer_answer(models),
        "mean-ablation": mean_ablation_answer(models),
        "evidence-coverage": coverage_table(models, results),
        "evidence-compute": compute_note(models),
        "clean-rerun": clean_rerun_note(results, models),
        "earlier-wall": earlier_wall([smol, gemma, results / "smollm2-135m-reversed"]),
        "smollm2-sink-layers": sink_by_layer(smol),
        "channel-layer": channel_layer_table(models),
        "closest-to-gradient": gradient_table(models),
        **evidence,
        "smollm2-perplexity": perplexity_table([smol, results / "smollm2-135m-reversed"]),
        "smollm2-ratio": ratio_table(smol),
        "smollm2-diagnostics": diagnostics_table(smol),
        "gemma3-perplexity": perplexity_table([gemma]),
        "gemma3-ratio": ratio_table(gemma),
        "gemma3-diagnostics": diagnostics_table(gemma),
    }


#: The quick mode's files CI compares with ``golden/``. Scores and perplexities are computed in
#: fp32 on fixed tokens without sampling, so a rerun on the same CPU repeats them bit for bit;
#: rtol 1e-4 leaves room for another CPU's float rounding (a near-tie in a score that reorders
#: heads would still show, as it should). The gradient score is a sum of terms of both signs
#: through a backward pass: its rounding error follows the column's largest values, not each
#: value's (the golden's AVX2 kernels against AVX-512 ones, measured: 9.8e-5 of the column's
#: largest value, 4.5e-2 relative on a value near zero; 2e-6 relative on every other score and
#: perplexity), so it is compared to 1e-3 of its largest value. The command (it names the
#: output folder) and timings are not results.
GOLDEN = (
    Golden("window_nll.csv", rtol=1e-4, atol=1e-6),
    Golden("head_scores.csv", rtol=1e-4, atol=1e-6, scaled=(("gradient", 1e-3),)),
    Golden("meta.json", rtol=1e-4, atol=1e-6),
)

STUDY = Study(
    name="pruning",
    description="Sink-aware head pruning on SmolLM2-135M and Gemma-3-270M: perplexity after "
    "pruning the k least important heads by each score (attncoda prune).",
    run=_run,
    quick=_quick,
    tables=render_tables,
    golden=GOLDEN,
    assets=("smollm2-135m", "austen", "mobydick", "wikipedia"),
    add_arguments=_arguments,
    # the numbers in these phrases name the protocol (a control, an interval's level), not results
    definitions=("layers 0-2", "95% paired", "[95% CI", "5-95% band", "one 64-token window"),
    docs=("docs/case-studies/pruning.md",),
)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(STUDY, argv)
