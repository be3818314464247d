"""Pruning sweeps: prune the k least important heads by each score, measure perplexity.

The tool behind ``attncoda prune``. :func:`sweep_pruning` scores every head on calibration
tokens (:func:`attncoda.hooks.scores.head_scores`), and for each score and each ``k`` gates the
first ``k`` units of the score's order (:func:`attncoda.hooks.scores.prune_plan`, through
:func:`attncoda.hooks.gates.gates`) and measures the token-weighted perplexity of held-out
tokens (:func:`attncoda.hooks.evaluate.perplexity`). The result (:class:`PruneSweep`) is written
as tables and a figure by :func:`write_sweep` and read back by :func:`read_sweep`.

The command's default texts (:data:`TEXTS`): scores from Austen's *Emma*, perplexity on
*Moby-Dick* and *Pride and Prejudice*, each from the first paragraph of the novel proper
(:func:`novel_text`).

Examples
--------
>>> from attncoda.hooks import zoo
>>> from attncoda.hooks.prune import sweep_pruning
>>> model = zoo.tiny_twin("llama")
>>> ids = zoo.tiny_batch(model, batch=3, length=12)["input_ids"]
>>> sweep = sweep_pruning(model, ids[:1], {"text": ids[1:]}, scores=["random"], fractions=[0.5])
>>> sweep.meta["ks"], round(sweep.perplexity("random", 0) / sweep.perplexity("none", 0), 6)
([0, 4], 1.0)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

import attncoda as ac

from . import assets
from .evaluate import Perplexity, perplexity, text_windows, tokens_sha256
from .gates import (
    GateError,
    Mode,
    Unit,
    _check_unit,
    _require_registry,
    gates,
    head_layout,
    head_means,
)
from .scores import (
    ATTENTION_SCORES,
    REVERSED,
    SCORES,
    _bases,
    _check_scores,
    head_scores,
    prune_order,
    prune_plan,
    score_info,
)
from .zoo import model_id

__all__ = [
    "CALIBRATION_TEXT",
    "EVALUATION_TEXTS",
    "TEXTS",
    "TEXT_STARTS",
    "PruneSweep",
    "default_windows",
    "novel_text",
    "plot_sweep",
    "read_sweep",
    "sweep_ks",
    "sweep_pruning",
    "write_sweep",
]

#: Where each text :func:`novel_text` knows starts (a novel at the first paragraph of the novel
#: proper; the Wikipedia sample, every article joined, at its first article, *Anarchism*; the
#: World English Bible's *Genesis* at its first verse): ``name -> (corpus, document, first
#: words)``.
TEXT_STARTS: dict[str, tuple[str, str | None, str]] = {
    "emma": ("austen", "emma", "Emma Woodhouse, handsome, clever, and rich"),
    "mobydick": ("mobydick", None, "Call me Ishmael."),
    "prideprejudice": ("austen", "prideprejudice", "It is a truth universally acknowledged"),
    "wikipedia": ("wikipedia", None, "Anarchism is a political philosophy"),
    "persuasion": ("austen", "persuasion", "Sir Walter Elliot, of Kellynch Hall"),
    "genesis": ("web", "Genesis", "In the beginning, God created the heavens and the earth."),
}
#: The texts of ``attncoda prune`` (of :data:`TEXT_STARTS`).
TEXTS: dict[str, tuple[str, str | None, str]] = {
    name: TEXT_STARTS[name] for name in ("emma", "mobydick", "prideprejudice")
}
#: The text the scores come from.
CALIBRATION_TEXT = "emma"
#: The held-out texts perplexity is measured on.
EVALUATION_TEXTS = ("mobydick", "prideprejudice")


def novel_text(name: str) -> str:
    """One of :data:`TEXT_STARTS`: the text's paragraphs from its first one on.

    Paragraphs are unwrapped (:func:`attncoda.hooks.assets.paragraphs`) and joined by blank
    lines, so the front matter (title pages, transcriber's notes) is left out.

    Raises
    ------
    GateError
        An unknown name.

    Examples
    --------
    >>> novel_text("mobydick")[:30]  # doctest: +SKIP
    'Call me Ishmael. Some years ago'
    """
    if name not in TEXT_STARTS:
        raise GateError(f"unknown study text {name!r}; known: {', '.join(TEXT_STARTS)}")
    corpus, document, start = TEXT_STARTS[name]
    paras = assets.paragraphs(assets.load_text(corpus, document))
    first = next((i for i, p in enumerate(paras) if p.startswith(start)), None)
    if first is None:  # pragma: no cover - the assets are pinned
        raise GateError(f"the {name} text has no paragraph starting {start!r}")
    return "\n\n".join(paras[first:])


def default_windows(
    tokenizer: Any, *, window: int = 512, calibration_windows: int = 4, eval_windows: int = 4
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The tokens of the default texts: calibration windows and ``{text: windows}`` to evaluate.

    Each text is cut by :func:`attncoda.hooks.evaluate.text_windows` into its first windows of
    ``window`` tokens (the tokenizer's prefix, e.g. ``<bos>``, included).

    Examples
    --------
    >>> from attncoda.hooks import assets  # doctest: +SKIP
    >>> _, tok = assets.load_model("smollm2-135m")  # doctest: +SKIP
    >>> calibration, evaluation = default_windows(tok, window=256, eval_windows=1)  # doctest: +SKIP
    >>> tuple(calibration.shape), sorted(evaluation)  # doctest: +SKIP
    ((4, 256), ['mobydick', 'prideprejudice'])
    """
    calibration = text_windows(
        tokenizer, novel_text(CALIBRATION_TEXT), window=window, n_windows=calibration_windows
    )
    evaluation = {
        name: text_windows(tokenizer, novel_text(name), window=window, n_windows=eval_windows)
        for name in EVALUATION_TEXTS
    }
    return calibration, evaluation


@dataclass
class PruneSweep:
    """Output of :func:`sweep_pruning`.

    Attributes
    ----------
    rows : list of dict
        One row per (score, k, corpus): ``score, channel, k, fraction, corpus, perplexity,
        ratio`` (to the unpruned model on the same corpus), ``nll, n_tokens, pruned``.
    scores : xarray.Dataset
        The head statistics (:func:`attncoda.hooks.scores.head_scores`).
    orders : dict of str to list of (int, int)
        Each score's pruning order.
    meta : dict
        Model, unit, mode, token counts and sha256s, timings.
    """

    rows: list[dict[str, Any]]
    scores: xr.Dataset
    orders: dict[str, list[tuple[int, int]]]
    meta: dict[str, Any] = field(default_factory=dict)

    def perplexity(self, score: str, k: int, corpus: str = "all") -> float:
        """One perplexity; ``k=0`` gives the unpruned model whatever the score."""
        want = "none" if k == 0 else score
        for r in self.rows:
            if r["score"] == want and r["k"] == k and r["corpus"] == corpus:
                return float(r["perplexity"])
        raise KeyError(f"no result for score={score!r}, k={k}, corpus={corpus!r}")


def sweep_ks(n_total: int, fractions: Sequence[float], limit: int) -> list[int]:
    """Distinct unit counts ``round(f * n_total)``, capped at ``limit``, ascending, with 0.

    Examples
    --------
    >>> sweep_ks(270, [0.1, 0.3], limit=240)
    [0, 27, 81]
    """
    ks = {0}
    for f in fractions:
        if not 0 <= f <= 1:
            raise GateError(f"fractions must lie in [0, 1], got {f}")
        ks.add(min(round(f * n_total), limit))
    return sorted(ks)


def sweep_pruning(
    model: Any,
    calibration: torch.Tensor,
    evaluation: Mapping[str, torch.Tensor],
    *,
    scores: Sequence[str] = tuple(SCORES),
    fractions: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.5),
    unit: Unit = "head",
    mode: Mode = "zero",
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = False,
) -> PruneSweep:
    """Prune the k least important heads by each score and measure held-out perplexity.

    Scores come from ``calibration`` (:func:`~attncoda.hooks.scores.head_scores`); for each
    score and each ``k`` the first ``k`` units of its order
    (:func:`~attncoda.hooks.scores.prune_plan`: no layer loses all its heads) are gated
    and the token-weighted perplexity of every ``evaluation`` corpus is measured on the same
    tokens. ``k = 0`` (the unpruned model) is evaluated once.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose attention goes through the registry.
    calibration : torch.Tensor
        ``(windows, T)`` tokens the scores (and, for ``mode="mean"``, the means) come from.
    evaluation : mapping of str to torch.Tensor
        ``{corpus: (windows, T)}`` held-out tokens.
    scores : sequence of str
        Names from :data:`attncoda.hooks.scores.SCORES`.
    fractions : sequence of float
        Fractions of all units to prune; ``k = round(f * units)``.
    unit : {"head", "kv_group"}
    mode : {"zero", "mean"}
    seed : int
        Seed of the ``random`` score.
    batch_size : int
        Evaluation windows per forward pass.
    progress : bool
        Show a tqdm progress bar on stderr.

    Returns
    -------
    PruneSweep

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=4, length=12)["input_ids"]
    >>> res = sweep_pruning(model, ids[:2], {"text": ids[2:]}, scores=["random"],
    ...                     fractions=[0.25])
    >>> sorted({(r["score"], r["k"]) for r in res.rows})
    [('none', 0), ('random', 2)]
    """
    names = _check_scores(scores)
    _check_unit(unit)
    if mode not in ("zero", "mean"):
        raise GateError(f"mode must be 'zero' or 'mean', got {mode!r}")
    if not evaluation:
        raise GateError("evaluation= has no corpus")
    _require_registry(model, "sweep_pruning")
    layout = head_layout(model)
    n_units = layout.n_units(unit)
    if n_units < 2:
        raise GateError(
            f"each layer has {n_units} {'key/value group' if unit == 'kv_group' else 'head'}; "
            "pruning one would remove the whole attention block (use unit='head')"
        )
    n_total = layout.n_layers * n_units
    ks = sweep_ks(n_total, fractions, layout.n_layers * (n_units - 1))
    corpora = list(evaluation)
    ids = torch.cat([evaluation[c] for c in corpora])
    bounds = np.cumsum([0] + [len(evaluation[c]) for c in corpora])
    n_calib = len(calibration)
    n_capture = n_calib if _bases(names) & set(ATTENTION_SCORES) else 0
    n_grad = n_calib if "gradient" in _bases(names) else 0
    n_mean = n_calib if mode == "mean" else 0
    n_evals = 1 + len(names) * (len(ks) - 1)
    bar = tqdm(
        total=n_capture + n_grad + n_mean + n_evals * len(ids),
        disable=not progress,
        unit="window",
        desc="scores",
        dynamic_ncols=True,
    )
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        ds = head_scores(
            model, calibration, scores=names, unit=unit, seed=seed, progress=bar.update
        )
        timings["scores_s"] = time.perf_counter() - t0
        means = None
        if mode == "mean":
            bar.set_description("means")
            t0 = time.perf_counter()
            means = head_means(model, calibration, batch_size=batch_size)
            bar.update(n_mean)
            timings["means_s"] = time.perf_counter() - t0
        orders = {n: prune_order(ds, n) for n in names}
        rows: list[dict[str, Any]] = []
        base: dict[str, Perplexity] = {}

        def record(score: str, k: int, plan: dict[int, tuple[int, ...]], res: Perplexity) -> None:
            parts = {c: res.subset(range(bounds[i], bounds[i + 1])) for i, c in enumerate(corpora)}
            parts["all"] = res
            for corpus, p in parts.items():
                if k == 0:
                    base[corpus] = p
                rows.append(
                    {
                        "score": score,
                        "channel": score_info(score).channel if score != "none" else "",
                        "k": k,
                        "fraction": round(k / n_total, 4),
                        "corpus": corpus,
                        "perplexity": p.value,
                        "ratio": p.value / base[corpus].value,
                        "nll": float(p.nll.sum()),
                        "n_tokens": int(p.n_tokens.sum()),
                        "pruned": _format_plan(plan),
                    }
                )

        t0 = time.perf_counter()
        bar.set_description("unpruned")
        record("none", 0, {}, perplexity(model, ids, batch_size=batch_size, progress=bar.update))
        for name in names:
            for k in ks[1:]:
                bar.set_description(f"{name} k={k}")
                plan = prune_plan(orders[name], k, n_units)
                with gates(model, plan, mode=mode, unit=unit, means=means):
                    res = perplexity(model, ids, batch_size=batch_size, progress=bar.update)
                record(name, k, plan, res)
        timings["evaluation_s"] = time.perf_counter() - t0
    finally:
        bar.close()
    meta = {
        "model_id": model_id(model),
        "n_layers": layout.n_layers,
        "n_heads": layout.n_heads,
        "n_kv_heads": layout.n_kv_heads,
        "unit": unit,
        "mode": mode,
        "seed": seed,
        "ks": ks,
        "n_units": n_total,
        "scores": names,
        "calibration_windows": int(n_calib),
        "window": int(ids.shape[1]),
        "calibration_tokens_sha256": tokens_sha256(calibration),
        "evaluation": {
            c: {"windows": len(evaluation[c]), "tokens_sha256": tokens_sha256(evaluation[c])}
            for c in corpora
        },
        "timings": timings,
    }
    return PruneSweep(rows, ds, orders, meta)


def _format_plan(plan: Mapping[int, Sequence[int]]) -> str:
    """``"L0:1,2;L3:0"``: the pruned units per layer."""
    return ";".join(f"L{layer}:{','.join(map(str, us))}" for layer, us in plan.items())


_COLOURS = {
    "sink_share": "#b2182b",
    "sink_logodds": "#ef8a62",
    "content_entropy": "#2166ac",
    "content_aitchison": "#4393c3",
    "content_clr_dispersion": "#92c5de",
    "entropy": "#7f7f7f",
    "max_attention": "#bf9b30",
    "random": "#000000",
    "gradient": "#1b7837",
}


def plot_sweep(result: PruneSweep, path: str | Path | None = None) -> Any:
    """Figure of perplexity (log scale) against units pruned, one line per score, one panel per
    corpus.

    Built on :class:`matplotlib.figure.Figure` directly: no pyplot, no backend switched.

    Parameters
    ----------
    result : PruneSweep
    path : str or Path, optional
        Where to save the figure (format from the suffix, PNG without an image suffix; written
        crash-safely by :func:`attncoda.save_figure`); the figure is returned either way.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure  # optional dependency (attncoda[analysis])

    corpora = list(dict.fromkeys(r["corpus"] for r in result.rows))
    scores = [s for s in result.meta.get("scores", []) if s != "none"]
    fig = Figure(figsize=(4.6 * len(corpora), 4.2))
    axes = fig.subplots(1, len(corpora), squeeze=False)
    unit = result.meta.get("unit", "head")
    base = {r["corpus"]: r["perplexity"] for r in result.rows if r["k"] == 0}
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for s in scores:
            pts = sorted(
                (r["k"], r["perplexity"])
                for r in result.rows
                if r["corpus"] == corpus and r["score"] == s
            )
            xs = [0, *(k for k, _ in pts)]
            ys = [base[corpus], *(p for _, p in pts)]
            reversed_ = s.endswith(REVERSED)
            style = {"content": "-", "sink": "--", "full row": ":", "baseline": "-."}
            ax.plot(
                xs,
                ys,
                linestyle=(0, (1, 2)) if reversed_ else style.get(score_info(s).channel, "-"),
                marker="x" if reversed_ else "o",
                ms=4 if reversed_ else 3,
                color=_COLOURS.get(s.removesuffix(REVERSED)),
                label=s,
            )
        ax.set_yscale("log")
        ax.set_title(corpus)
        ax.set_xlabel(
            f"{'heads' if unit == 'head' else 'KV groups'} pruned ({result.meta.get('mode', 'zero')} ablation)"
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("perplexity")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    title = f"{result.meta.get('model_id', '')}: perplexity after pruning the k least important"
    fig.suptitle(f"{title} {'heads' if unit == 'head' else 'KV groups'} by each score", fontsize=10)
    fig.tight_layout()
    if path is not None:  # crash-safe, like every attncoda figure
        suffix = Path(path).suffix.lstrip(".").lower()
        fmt = suffix if suffix in fig.canvas.get_supported_filetypes() else "png"
        ac.save_figure(fig, path, formats=[fmt], dpi=130)
    return fig


#: The columns of ``perplexity.csv``.
_ROW_COLUMNS = (
    "score",
    "channel",
    "k",
    "fraction",
    "corpus",
    "perplexity",
    "ratio",
    "nll",
    "n_tokens",
    "pruned",
)


def read_sweep(folder: str | Path) -> PruneSweep:
    """Read a sweep written by :func:`write_sweep` (e.g. to plot it again).

    Examples
    --------
    >>> res = read_sweep("case_studies/pruning/results/smollm2-135m")  # doctest: +SKIP
    >>> res.perplexity("gradient", 27)  # doctest: +SKIP
    38.67...
    """
    folder = Path(folder)
    paths = _sweep_paths(folder)
    meta = json.loads(paths["meta"].read_text())
    table = ac.read_table(paths["perplexity"])
    rows: list[dict[str, Any]] = []
    for r in table.to_dict("records"):
        text = {
            c: "" if _missing(r[c]) else str(r[c]) for c in ("score", "channel", "corpus", "pruned")
        }
        rows.append(
            {
                **text,
                "k": int(r["k"]),
                "fraction": float(r["fraction"]),
                "perplexity": float(r["perplexity"]),
                "ratio": float(r["ratio"]),
                "nll": float(r["nll"]),
                "n_tokens": int(r["n_tokens"]),
            }
        )
    rows = [{c: row[c] for c in _ROW_COLUMNS} for row in rows]
    heads = ac.read_table(paths["head_scores"])
    layer_col, dim, *names = list(heads.columns)
    body = heads.to_numpy(dtype=np.float64)
    layers = np.unique(body[:, 0]).astype(int)
    units = np.unique(body[:, 1]).astype(int)
    shape = (len(layers), len(units))
    scores = xr.Dataset(
        {
            n: xr.Variable(
                (layer_col, dim),
                body[:, 2 + i].reshape(shape),
                attrs={"prune_first": score_info(n).prune_first},
            )
            for i, n in enumerate(names)
        },
        coords={layer_col: layers, dim: units},
    )
    orders: dict[str, list[tuple[int, int]]] = {}
    for r in ac.read_table(paths["prune_order"]).to_dict("records"):
        orders.setdefault(str(r["score"]), []).append((int(r["layer"]), int(r[dim])))
    return PruneSweep(rows, scores, orders, meta)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def write_sweep(result: PruneSweep, out: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write a sweep's tables and figure into a folder.

    Files: ``perplexity.csv`` (the rows), ``head_scores.csv`` (every head statistic),
    ``prune_order.csv`` (each score's order), all at full precision
    (:func:`attncoda.write_table`), ``meta.json`` and ``perplexity_vs_heads.png``. The folder is
    new, empty, or (``overwrite=True``) one attncoda wrote; it is written beside its place and
    swapped in when complete.

    Returns
    -------
    dict of str to Path
        The written files by kind (at their final place).

    Examples
    --------
    >>> import tempfile
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=2, length=12)["input_ids"]
    >>> sweep = sweep_pruning(model, ids[:1], {"t": ids[1:]}, scores=["random"], fractions=[0.5])
    >>> paths = write_sweep(sweep, tempfile.mkdtemp() + "/sweep")
    >>> read_sweep(paths["meta"].parent).orders == sweep.orders
    True
    """
    with ac.atomic_output(out, overwrite=overwrite, kind="folder", stamp="prune") as folder:
        _write_sweep_into(result, folder)
    return _sweep_paths(Path(out))


def _sweep_paths(folder: Path) -> dict[str, Path]:
    return {
        "perplexity": folder / "perplexity.csv",
        "head_scores": folder / "head_scores.csv",
        "prune_order": folder / "prune_order.csv",
        "meta": folder / "meta.json",
        "figure": folder / "perplexity_vs_heads.png",
    }


def _write_sweep_into(result: PruneSweep, folder: Path) -> None:
    paths = _sweep_paths(folder)
    ac.write_table(result.rows, paths["perplexity"], columns=_ROW_COLUMNS)
    ds = result.scores
    dim = next(str(d) for d in ds.dims if d != "layer")
    names = [str(n) for n in ds.data_vars]
    ac.write_table(
        [
            {
                "layer": int(layer),
                dim: int(u),
                **{n: float(ds[n].values[layer, u]) for n in names},
            }
            for layer in ds.layer.values
            for u in ds[dim].values
        ],
        paths["head_scores"],
        columns=["layer", dim, *names],
    )
    ac.write_table(
        [
            {"score": s, "rank": rank, "layer": layer, dim: u}
            for s, order in result.orders.items()
            for rank, (layer, u) in enumerate(order)
        ],
        paths["prune_order"],
        columns=["score", "rank", "layer", dim],
    )
    paths["meta"].write_text(json.dumps(result.meta, indent=2) + "\n")
    plot_sweep(result, paths["figure"])
