"""The evidence protocol of the pruning study: CIs, random-order bands, mean ablation and two
layer-position controls, run cell by cell so that a long run resumes where it stopped.

A *cell* is one pruned model evaluated on every evaluation window: ``(control, mode, score,
seed, k)``. ``control`` says how the score's order becomes a plan (:data:`CONTROLS`): the
order itself (``global``), re-ranked within each layer so that every layer loses the same number
of heads (``within_layer``, :func:`attncoda.hooks.scores.order_within_layers`), or with layers
0-2 never pruned (``skip_0_2``, :func:`attncoda.hooks.scores.order_without_layers`). ``mode`` is
zero or mean ablation (:func:`attncoda.hooks.gates.gates`). Each finished cell is written at
once, atomically, as ``cells/<control>/<mode>/<score>/k<k>.json`` with its per-window summed
NLLs, so a killed run loses at most the cell in progress, a rerun skips every cell whose file
is complete and was made on the same tokens, and a damaged file is recomputed.

The statistics (:func:`ratio_interval`, :func:`random_band`) come from the per-window NLLs:
every interval is a paired bootstrap in two stages, the texts drawn with replacement and then
the windows of each drawn text (each window a block of ``window - 1`` consecutive predicted
tokens resampled whole, the same draw for the two arms compared: the unpruned model, or
another score), reported with the interval that holds the texts fixed (windows within each
text only) and the point ratio of each text.

Examples
--------
>>> from attncoda.hooks import zoo
>>> import tempfile
>>> model = zoo.tiny_twin("llama")
>>> ids = zoo.tiny_batch(model, batch=3, length=12)["input_ids"]
>>> protocol = Evidence(fractions=(0.25,), main_scores=("sink_share",), other_scores=(),
...                     random_seeds=1, controls=("global",), mean_scores=())
>>> folder = tempfile.mkdtemp() + "/tiny"
>>> done = run_cells(model, ids[:1], {"text": ids[1:]}, folder, protocol)
>>> sorted(c.label for c in done)
['global/zero/none/k000', 'global/zero/random-s00/k002', 'global/zero/sink_share/k002']
>>> r = ratio_interval(load_cells(folder), Cell("global", "zero", "sink_share", 0, 2))
>>> r.low <= r.ratio <= r.high
True
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

import attncoda as ac
from attncoda.hooks import zoo
from attncoda.hooks.evaluate import perplexity, tokens_sha256
from attncoda.hooks.gates import gates, head_layout, head_means
from attncoda.hooks.prune import sweep_ks
from attncoda.hooks.scores import (
    head_scores,
    order_within_layers,
    order_without_layers,
    prune_order,
    prune_plan,
    score_info,
)

from .._study import (
    Shard,
    fixed,
    significant,
    stratified_draws,
    time_is_up,
    two_stage_draws,
    write_text,
)

__all__ = [
    "CONDITIONAL_UNIT",
    "CONTROLS",
    "EARLY_LAYERS",
    "N_BOOT",
    "RESAMPLING_UNIT",
    "Cell",
    "Evidence",
    "RatioInterval",
    "cell_commits",
    "cell_plan",
    "load_cells",
    "plan_cells",
    "random_band",
    "ratio_interval",
    "read_head_scores",
    "run_cells",
    "window_table",
]

#: How a score's order becomes a plan: the order itself, re-ranked within each layer, or
#: without layers 0-2.
CONTROLS = ("global", "within_layer", "skip_0_2")
#: The layers ``skip_0_2`` never prunes.
EARLY_LAYERS = (0, 1, 2)
#: The file name of a cell (``k`` zero-padded so that files sort by k).
_CELL_FILE = "k{k:03d}.json"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Sizes and cells of one run of the evidence protocol.

    Attributes
    ----------
    window, calibration_windows, eval_windows
        Tokens per window; windows of *Emma* the scores come from; windows of each evaluation
        text.
    texts
        The evaluation texts (names of :data:`attncoda.hooks.prune.TEXTS`).
    fractions
        Fractions of the heads pruned (``k = round(f * heads)``, as ``attncoda prune``).
    main_scores
        Scores run under every control and both ablation modes.
    other_scores
        Scores run only globally with zero ablation.
    mean_scores
        Scores also run with mean ablation (globally).
    random_seeds
        Random orders (seeds ``0 .. random_seeds - 1``), globally with zero ablation.
    controls
        Controls (of :data:`CONTROLS`) the main scores run under.
    batch_size
        Evaluation windows per forward pass.
    """

    window: int = 512
    calibration_windows: int = 4
    eval_windows: int = 8
    texts: tuple[str, ...] = ("mobydick", "prideprejudice", "wikipedia")
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
    main_scores: tuple[str, ...] = (
        "sink_share",
        "entropy",
        "max_attention",
        "content_entropy",
        "gradient",
    )
    other_scores: tuple[str, ...] = ("sink_logodds", "content_aitchison", "content_clr_dispersion")
    mean_scores: tuple[str, ...] = (
        "sink_share",
        "entropy",
        "max_attention",
        "content_entropy",
        "gradient",
    )
    random_seeds: int = 20
    controls: tuple[str, ...] = CONTROLS
    batch_size: int = 1

    @property
    def scores(self) -> tuple[str, ...]:
        """Every non-random score of the protocol (the head statistics to compute)."""
        return tuple(dict.fromkeys((*self.main_scores, *self.other_scores, *self.mean_scores)))


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    """One pruned model: ``score`` (``"none"``: the unpruned model, ``k = 0``) pruned ``k``
    heads under ``control`` with ``mode`` ablation; ``seed`` only for ``"random"``."""

    control: str
    mode: str
    score: str
    seed: int
    k: int

    @property
    def name(self) -> str:
        """The score's name in tables and paths (``random-s03`` for seed 3)."""
        return f"random-s{self.seed:02d}" if self.score == "random" else self.score

    @property
    def label(self) -> str:
        return f"{self.control}/{self.mode}/{self.name}/k{self.k:03d}"

    def path(self, folder: Path) -> Path:
        return folder / "cells" / self.control / self.mode / self.name / _CELL_FILE.format(k=self.k)


BASE = Cell("global", "zero", "none", 0, 0)


def plan_cells(protocol: Evidence, ks: Sequence[int]) -> list[Cell]:
    """Every cell of a protocol, in the order a run computes them (the answers first).

    The unpruned model; then, k by k from the second k (20% of the heads: where the full-row
    scores first pass 100x on SmolLM2) to the first, the third and the rest: each main score
    under every control (sink share and full-row entropy first: the channel-vs-layer
    comparison); then the random orders, mean ablation, and the other scores. A run cut short
    has the main comparison at the middle ks first.
    """
    pruned = [k for k in ks if k > 0]
    by_priority = pruned[1:2] + pruned[:1] + pruned[2:]
    first = [s for s in ("sink_share", "entropy") if s in protocol.main_scores]
    main = [*first, *(s for s in protocol.main_scores if s not in first)]
    cells = [BASE]
    for k in by_priority:
        cells += [Cell(c, "zero", s, 0, k) for s in main for c in protocol.controls]
    half = (protocol.random_seeds + 1) // 2
    cells += [Cell("global", "zero", "random", s, k) for s in range(half) for k in by_priority]
    cells += [Cell("global", "mean", s, 0, k) for k in by_priority for s in protocol.mean_scores]
    cells += [
        Cell("global", "zero", "random", s, k)
        for s in range(half, protocol.random_seeds)
        for k in by_priority
    ]
    cells += [Cell("global", "zero", s, 0, k) for k in by_priority for s in protocol.other_scores]
    return list(dict.fromkeys(cells))


def cell_plan(
    cell: Cell, scores: Any, n_units: int, *, random_scores: Callable[[int], Any] | None = None
) -> dict[int, tuple[int, ...]]:
    """The heads a cell prunes: its score's order under its control, first ``k`` kept by
    :func:`attncoda.hooks.scores.prune_plan` (no layer loses all its heads).

    Parameters
    ----------
    cell : Cell
    scores : xarray.Dataset
        Head statistics (:func:`attncoda.hooks.scores.head_scores`).
    n_units : int
        Heads per layer.
    random_scores : callable, optional
        ``seed -> Dataset`` with the ``random`` variable (for random cells).
    """
    if cell.k == 0:
        return {}
    ds = random_scores(cell.seed) if cell.score == "random" and random_scores else scores
    order = prune_order(ds, cell.score)
    if cell.control == "within_layer":
        order = order_within_layers(order)
    elif cell.control == "skip_0_2":
        order = order_without_layers(order, EARLY_LAYERS)
    elif cell.control != "global":
        raise ValueError(f"unknown control {cell.control!r}; known: {', '.join(CONTROLS)}")
    return prune_plan(order, cell.k, n_units)


def _format_plan(plan: Mapping[int, Sequence[int]]) -> str:
    return ";".join(f"L{layer}:{','.join(map(str, us))}" for layer, us in plan.items())


def _read_cell(path: Path, tokens: str, n_windows: int) -> dict[str, Any] | None:
    """A finished cell's record, or None when the file is missing, damaged, partial or made on
    other tokens (then the cell is computed again)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("tokens_sha256") != tokens:
        return None
    nll, n = rec.get("nll"), rec.get("n_tokens")
    if not (isinstance(nll, list) and isinstance(n, list) and len(nll) == len(n) == n_windows):
        return None
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in nll):
        return None
    return rec


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``path`` crash-safely (staged beside it, swapped in whole); a file already there
    is one this protocol wrote (a damaged cell, the run's own ``meta.json``)."""
    write_text(path, json.dumps(data, indent=1) + "\n")


def write_head_scores(scores: Any, path: Path) -> None:
    """The head statistics as ``layer, head, <score>...`` at full precision (atomic)."""
    names = [str(n) for n in scores.data_vars]
    ac.write_table(
        [
            {
                "layer": int(layer),
                "head": int(h),
                **{n: float(scores[n].values[layer, h]) for n in names},
            }
            for layer in scores["layer"].values
            for h in scores["head"].values
        ],
        path,
        columns=["layer", "head", *names],
    )


def read_head_scores(path: Path) -> Any:
    """The Dataset :func:`write_head_scores` wrote (each variable's ``prune_first`` restored)."""
    table = ac.read_table(path)
    layers = np.unique(table["layer"].to_numpy()).astype(int)
    heads = np.unique(table["head"].to_numpy()).astype(int)
    shape = (len(layers), len(heads))
    table = table.sort_values(["layer", "head"])
    return xr.Dataset(
        {
            str(n): xr.Variable(
                ("layer", "head"),
                table[n].to_numpy(np.float64).reshape(shape),
                attrs={"prune_first": score_info(str(n)).prune_first},
            )
            for n in table.columns[2:]
        },
        coords={"layer": layers, "head": heads},
    )


def run_cells(
    model: Any,
    calibration: Any,
    evaluation: Mapping[str, Any],
    folder: str | Path,
    protocol: Evidence,
    *,
    only: Iterable[Cell] | None = None,
    shard: Shard | None = None,
    time_limit_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    record: Mapping[str, Any] | None = None,
) -> list[Cell]:
    """Compute every missing cell of ``protocol`` into ``folder``; return the cells done.

    The head statistics are computed once (``head_scores.csv``, reused on a rerun made on the
    same calibration tokens), the unpruned model first, then :func:`plan_cells`' order. Each
    cell's file is written as soon as it is done; a complete file made on the same evaluation
    tokens is never recomputed.

    Parameters
    ----------
    model
        A causal LM whose attention goes through the registry.
    calibration : torch.Tensor
        ``(windows, T)`` tokens of the scores (and of the means for mean ablation).
    evaluation : mapping of str to torch.Tensor
        ``{text: (windows, T)}``; every cell evaluates all of them, in this order.
    folder : path
        The model's results folder (created if missing).
    protocol : Evidence
    only : iterable of Cell, optional
        Compute only these cells (the unpruned one always).
    shard : Shard, optional
        Compute only this shard's part of the plan (another process computes the rest).
    time_limit_s : float, optional
        Start no new cell after this many seconds (the run is continued by calling again).
    progress : callable, optional
        Called with one line per cell.
    record : mapping, optional
        Extra fields stored in each cell's file (e.g. the commit).

    Returns
    -------
    list of Cell
        Every cell with a complete file, whether computed now or before.
    """
    started = time.perf_counter()
    folder = Path(folder)
    texts = list(evaluation)
    ids = torch.cat([evaluation[t] for t in texts])
    tokens = tokens_sha256(ids)
    calib_sha = tokens_sha256(calibration)
    layout = head_layout(model)
    n_units = layout.n_heads
    n_total = layout.n_layers * n_units
    ks = sweep_ks(n_total, protocol.fractions, layout.n_layers * (n_units - 1))
    cells = plan_cells(protocol, ks)
    if only is not None:
        wanted = set(only) | {BASE}
        cells = [c for c in cells if c in wanted]
    meta = {
        "model_id": zoo.model_id(model),
        "n_layers": layout.n_layers,
        "n_heads": layout.n_heads,
        "n_kv_heads": layout.n_kv_heads,
        "n_units": n_total,
        "ks": ks,
        "protocol": dataclasses.asdict(protocol),
        "texts": {t: {"windows": len(evaluation[t])} for t in texts},
        "window": int(ids.shape[1]),
        "calibration_tokens_sha256": calib_sha,
        "evaluation_tokens_sha256": tokens,
        "text_tokens_sha256": {t: tokens_sha256(evaluation[t]) for t in texts},
        "cells": sorted(c.label for c in plan_cells(protocol, ks)),
    }
    _write_json(folder / "meta.json", meta)
    done: list[Cell] = []
    todo: list[Cell] = []
    for i, c in enumerate(cells):
        if _read_cell(c.path(folder), tokens, len(ids)):
            done.append(c)
        elif shard is None or shard.owns(i):
            todo.append(c)
    if not todo:
        return done
    scores_path = folder / "head_scores.csv"
    scores = None
    if scores_path.is_file() and (folder / "head_scores.json").is_file():
        stamp = json.loads((folder / "head_scores.json").read_text(encoding="utf-8"))
        if stamp.get("calibration_tokens_sha256") == calib_sha:
            scores = read_head_scores(scores_path)
            if set(protocol.scores) - set(scores.data_vars):
                scores = None
    if scores is None:
        t0 = time.perf_counter()
        scores = head_scores(model, calibration, scores=list(protocol.scores))
        write_head_scores(scores, scores_path)
        _write_json(
            folder / "head_scores.json",
            {"calibration_tokens_sha256": calib_sha, "seconds": round(time.perf_counter() - t0, 1)},
        )
    means = None

    def random_scores(seed: int) -> Any:
        return head_scores(model, calibration[:1], scores=["random"], seed=seed)

    for cell in todo:
        if time_is_up(started, time_limit_s):
            break
        t0 = time.perf_counter()
        plan = cell_plan(cell, scores, n_units, random_scores=random_scores)
        if cell.mode == "mean" and means is None:
            means = head_means(model, calibration, batch_size=protocol.batch_size)
        with gates(model, plan, mode=cell.mode, means=means if cell.mode == "mean" else None):  # type: ignore[arg-type]
            res = perplexity(model, ids, batch_size=protocol.batch_size)
        seconds = time.perf_counter() - t0
        _write_json(
            cell.path(folder),
            {
                "cell": dataclasses.asdict(cell),
                "tokens_sha256": tokens,
                "calibration_tokens_sha256": calib_sha,
                "texts": [t for t in texts for _ in range(len(evaluation[t]))],
                "nll": [float(v) for v in res.nll],
                "n_tokens": [int(v) for v in res.n_tokens],
                "pruned": _format_plan(plan),
                "seconds": round(seconds, 2),
                **(record or {}),
            },
        )
        done.append(cell)
        if progress is not None:
            progress(f"{cell.label}: ppl {res.value:.3f} ({seconds:.0f} s)")
    return done


# ------------------------------------------------------------------------------------ analysis


def load_cells(folder: str | Path) -> dict[Cell, dict[str, Any]]:
    """Every complete cell file of a model's folder (made on the tokens its ``meta.json``
    names), by cell."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return {}
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    tokens = meta["evaluation_tokens_sha256"]
    n_windows = sum(t["windows"] for t in meta["texts"].values())
    out: dict[Cell, dict[str, Any]] = {}
    for path in sorted((folder / "cells").glob("*/*/*/k*.json")):
        rec = _read_cell(path, tokens, n_windows)
        if rec is not None:
            out[Cell(**rec["cell"])] = rec
    return out


def cell_commits(cells: Mapping[Cell, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Which commit, and which tree state, made the cells: one group per ``(commit, dirty)``
    each cell recorded, with its count and, for a modified (or unrecorded) tree, the labels of
    its cells, so a manifest can say exactly which cells did not come from a clean tree."""
    groups: dict[tuple[str, Any], list[str]] = {}
    for cell in sorted(cells):
        rec = cells[cell]
        groups.setdefault((str(rec.get("commit", "unknown")), rec.get("dirty")), []).append(
            cell.label
        )
    return [
        {
            "commit": commit,
            "dirty": dirty,
            "n": len(labels),
            **({"cells": labels} if dirty is not False else {}),
        }
        for (commit, dirty), labels in sorted(groups.items(), key=lambda g: -len(g[1]))
    ]


def window_table(cells: Mapping[Cell, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell and window: ``control, mode, score, seed, k, text, window, nll,
    n_tokens, pruned`` (the long table of ``window_nll.csv``)."""
    rows = []
    for cell in sorted(cells):
        rec = cells[cell]
        seen: dict[str, int] = {}
        for text, nll, n in zip(rec["texts"], rec["nll"], rec["n_tokens"], strict=True):
            w = seen.get(text, 0)
            seen[text] = w + 1
            rows.append(
                {
                    **dataclasses.asdict(cell),
                    "text": text,
                    "window": w,
                    "nll": nll,
                    "n_tokens": n,
                    "pruned": rec["pruned"],
                }
            )
    return rows


def _losses(rec: Mapping[str, Any], text: str | None = None) -> np.ndarray:
    """Per-window mean NLL (nats per token), optionally of one text's windows."""
    nll = np.asarray(rec["nll"], dtype=np.float64)
    n = np.asarray(rec["n_tokens"], dtype=np.float64)
    if text is not None:
        keep = np.asarray([t == text for t in rec["texts"]])
        nll, n = nll[keep], n[keep]
    return nll / n


#: Bootstrap resamples of every interval (:func:`ratio_interval`).
N_BOOT = 2000
#: What the headline interval resamples (the claim table names it in each row).
RESAMPLING_UNIT = "texts, then windows within each drawn text (a paired, two-stage bootstrap)"
#: What the conditional interval beside it resamples.
CONDITIONAL_UNIT = (
    "windows within each text (texts fixed: conditional on these texts; a paired, stratified "
    "bootstrap)"
)


@dataclasses.dataclass(frozen=True)
class RatioInterval:
    """Perplexity of ``on`` over that of ``off`` (on the same windows), its bootstrap CI over
    texts then windows (``low``, ``high``: the headline), the CI with the texts held fixed
    (``cond_low``, ``cond_high``: windows within each text only), and the point ratio on each
    text's windows alone (``per_text``; empty for one text)."""

    ratio: float
    low: float
    high: float
    n_windows: int
    n_tokens: int
    per_text: tuple[tuple[str, float], ...] = ()
    #: ``(on, off)``: the cells compared, where the interval came from :func:`ratio_interval`
    cells: tuple[Cell, Cell] | None = None
    #: the interval conditional on these texts (windows resampled within each text only)
    cond_low: float = math.nan
    cond_high: float = math.nan

    def __str__(self) -> str:
        return f"{_num(self.ratio)}x [{_num(self.low)}, {_num(self.high)}]"

    def conditional_text(self) -> str:
        """The interval with the texts held fixed, e.g. ``"[929, 1045]"``."""
        return f"[{_num(self.cond_low)}, {_num(self.cond_high)}]"

    def conditional(self) -> RatioInterval:
        """This comparison with the conditional interval as its interval (what a verdict would
        say if the texts were held fixed)."""
        return dataclasses.replace(self, low=self.cond_low, high=self.cond_high)

    def texts(self) -> str:
        """The per-text point ratios, e.g. ``"223x / 354x / 406x"`` (in the texts' order)."""
        return " / ".join(f"{_num(v)}x" for _, v in self.per_text) or "—"


def _num(x: float) -> str:
    """Three significant digits, whole numbers from 100 on (:func:`case_studies._study.fixed`'s
    rounding rule)."""
    return significant(x, 3) if x < 100 else fixed(x, 0)


def ratio_interval(
    cells: Mapping[Cell, Mapping[str, Any]],
    on: Cell,
    off: Cell = BASE,
    *,
    text: str | None = None,
    n_boot: int = N_BOOT,
) -> RatioInterval:
    """Perplexity ratio ``on / off`` with a 95% paired two-stage bootstrap CI (texts, then
    windows within each drawn text), the CI with the texts held fixed, and the point ratio of
    each text.

    Every window has the same number of predicted tokens, so the mean of the per-window mean
    NLLs is the token-weighted loss and ``exp`` of the bootstrap difference of means is the
    perplexity ratio. Windows (blocks of consecutive tokens) are resampled whole, the same
    draw for both cells. The headline interval (``low``, ``high``, :data:`RESAMPLING_UNIT`)
    draws the texts with replacement and then each drawn text's windows
    (:func:`case_studies._study.two_stage_draws`), so it carries the spread between texts; the
    conditional one (``cond_low``, ``cond_high``, :data:`CONDITIONAL_UNIT`) resamples each
    text's windows among themselves (:func:`case_studies._study.stratified_draws`) and holds
    the texts fixed. With one text the two coincide.

    Raises
    ------
    KeyError
        A cell that is not done.
    """

    a, b = _losses(cells[off], text), _losses(cells[on], text)
    if len(set(np.asarray(cells[on]["n_tokens"]).tolist())) != 1:
        raise ValueError("windows of unequal length: the mean of window losses is not the loss")
    labels = [t for t in cells[on].get("texts", ["all"] * len(b)) if text is None or t == text]
    d = b - a
    cond = stratified_draws(labels, n_boot, seed=0)
    c_low, c_high = np.quantile(d[cond].mean(axis=1), [0.025, 0.975])
    two = _two_stage(tuple(labels), n_boot)
    diffs = (
        d[two].mean(axis=1) if isinstance(two, np.ndarray) else np.array([d[i].mean() for i in two])
    )
    low, high = np.quantile(diffs, [0.025, 0.975])
    diff = float(b.mean() - a.mean())
    names = list(dict.fromkeys(labels))
    per_text = (
        tuple(
            (
                t,
                math.exp(
                    float(b[np.asarray(labels) == t].mean() - a[np.asarray(labels) == t].mean())
                ),
            )
            for t in names
        )
        if len(names) > 1
        else ()
    )
    n_tok = int(len(b) * cells[on]["n_tokens"][0])
    return RatioInterval(
        math.exp(diff),
        math.exp(float(low)),
        math.exp(float(high)),
        len(b),
        n_tok,
        per_text,
        (on, off),
        math.exp(float(c_low)),
        math.exp(float(c_high)),
    )


@functools.lru_cache(maxsize=16)
def _two_stage(labels: tuple[str, ...], n_boot: int) -> np.ndarray | list[np.ndarray]:
    """The two-stage draws of one window layout (cached: every cell of a model shares them);
    one array when every replicate has as many windows as the sample (equal texts)."""
    draws = two_stage_draws(labels, n_boot, seed=0)
    return np.stack(draws) if len({len(x) for x in draws}) == 1 else draws


def random_band(
    cells: Mapping[Cell, Mapping[str, Any]], k: int, *, text: str | None = None
) -> tuple[float, float, float, int]:
    """Median and 5-95% band of the perplexity ratio over the random orders done at ``k``:
    ``(median, p5, p95, n_orders)`` (NaNs when none is done)."""
    ratios = [
        math.exp(float(np.mean(_losses(rec, text)) - np.mean(_losses(cells[BASE], text))))
        for cell, rec in cells.items()
        if cell.score == "random"
        and cell.k == k
        and cell.mode == "zero"
        and cell.control == "global"
    ]
    if not ratios:
        return (math.nan, math.nan, math.nan, 0)
    p5, med, p95 = np.quantile(ratios, [0.05, 0.5, 0.95])
    return (float(med), float(p5), float(p95), len(ratios))


def score_ratios(
    cells: Mapping[Cell, Mapping[str, Any]],
    k: int,
    scores: Sequence[str],
    *,
    control: str = "global",
) -> dict[str, float]:
    """Point ratios (pruned over unpruned perplexity) of the done cells ``(control, zero, score,
    k)`` by score."""
    out = {}
    for s in scores:
        cell = Cell(control, "zero", s, 0, k)
        if cell in cells and BASE in cells:
            out[s] = math.exp(
                float(np.mean(_losses(cells[cell]))) - float(np.mean(_losses(cells[BASE])))
            )
    return out


def plot_evidence(
    cells: Mapping[Cell, Mapping[str, Any]],
    ks: Sequence[int],
    n_units: int,
    scores: Sequence[str],
    title: str,
    path: str | Path | None = None,
) -> Any:
    """Perplexity ratio (log scale, 95% CI bars) against heads pruned: one panel per control,
    one line per score, the random orders' 5-95% band and median in the ``global`` panel.

    Built on :class:`matplotlib.figure.Figure` directly (no pyplot, no backend switched).
    """
    from matplotlib.figure import Figure  # optional dependency (attncoda[analysis])

    colours = {
        "sink_share": "#b2182b",
        "content_entropy": "#2166ac",
        "entropy": "#7f7f7f",
        "max_attention": "#bf9b30",
        "gradient": "#1b7837",
    }
    fig = Figure(figsize=(13.5, 4.2))
    axes = fig.subplots(1, len(CONTROLS), sharey=True)
    pruned = [k for k in ks if k > 0]
    for ax, control in zip(axes, CONTROLS, strict=True):
        if control == "global":
            band = [random_band(cells, k) for k in pruned]
            got = [(k, b) for k, b in zip(pruned, band, strict=True) if b[3] > 0]
            if got:
                xs = [k for k, _ in got]
                ax.fill_between(
                    xs,
                    [b[1] for _, b in got],
                    [b[2] for _, b in got],
                    color="#000000",
                    alpha=0.12,
                    label="random 5-95%",
                )
                ax.plot(xs, [b[0] for _, b in got], color="#000000", lw=1, label="random median")
        for i, s in enumerate(scores):
            pts = []
            for k in pruned:
                cell = Cell(control, "zero", s, 0, k)
                if cell in cells and BASE in cells:
                    r = ratio_interval(cells, cell, n_boot=500)
                    pts.append((k, r.ratio, r.low, r.high))
            if not pts:
                continue
            xs = np.array([p[0] for p in pts], dtype=float) + (i - len(scores) / 2) * 0.15
            ys = np.array([p[1] for p in pts])
            err = np.array([[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]])
            ax.errorbar(
                xs, ys, yerr=err, marker="o", ms=3, capsize=2, color=colours.get(s), label=s
            )
        ax.axhline(100, color="#444444", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_title(
            {
                "global": "score's own order",
                "within_layer": "same number per layer",
                "skip_0_2": "layers 0-2 kept",
            }[control]
        )
        ax.set_xlabel(f"heads pruned (of {n_units}; zero ablation)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("perplexity / unpruned (95% CI)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        ac.save_figure(fig, path, formats=["png"], dpi=120)
    return fig
