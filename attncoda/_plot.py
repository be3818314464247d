"""Figures of attention analyses (matplotlib, headless).

Every function returns a :class:`matplotlib.figure.Figure` built without :mod:`matplotlib.pyplot`
(so no GUI backend is ever selected and nothing is shown); :func:`save_figure` writes it as PNG
and SVG through the Agg/SVG canvases. matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import _analysis as an

__all__ = [
    "plot_dendrograms",
    "plot_entropy_attribution",
    "plot_flip_table",
    "plot_rows",
    "plot_sink_grid",
    "plot_sink_vs_content",
    "save_figure",
]


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _profiles(data: xr.Dataset) -> xr.Dataset:
    if "n_rows" in data.data_vars and "sample" not in data.dims and "sink_share" in data:
        return data
    return an.head_profiles(data, max_offset=None)


def save_figure(
    fig: Any, path: str | os.PathLike[str], formats: Sequence[str] = ("png", "svg"), dpi: int = 150
) -> list[Path]:
    """Write ``fig`` once per format, as ``path`` with each suffix; return the paths.

    Examples
    --------
    >>> import tempfile, pathlib, attncoda as ac
    >>> fig = ac.plot_sink_grid(ac.testing.synthetic_rows())
    >>> [p.suffix for p in ac.save_figure(fig, pathlib.Path(tempfile.mkdtemp()) / "grid")]
    ['.png', '.svg']
    """
    stem = Path(path)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        target = stem.with_suffix("." + fmt.lstrip("."))
        fig.savefig(target, dpi=dpi, format=fmt.lstrip("."))
        out.append(target)
    return out


def plot_sink_grid(
    data: xr.Dataset, *, title: str | None = None, vmax: float = 1.0, annotate: bool | None = None
) -> Any:
    """Layer x head grid of each head's mean sink share.

    Parameters
    ----------
    data : xarray.Dataset
        A capture (summaries or rows) or :func:`attncoda.head_profiles` output.
    title : str, optional
    vmax : float, default 1
    annotate : bool, optional
        Write the values in the cells (default: when there are at most 150 heads).

    Examples
    --------
    >>> import attncoda as ac
    >>> fig = ac.plot_sink_grid(ac.testing.synthetic_rows(n_layers=2, n_heads=3))
    >>> len(fig.axes)
    2
    """
    prof = _profiles(data)
    share = prof["sink_share"].transpose("layer", "head")
    fig = _figure(1.2 + 0.45 * share.sizes["head"], 1.0 + 0.28 * share.sizes["layer"])
    ax = fig.add_subplot()
    im = ax.imshow(share.values, vmin=0, vmax=vmax, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(share.sizes["head"]), [str(h) for h in share["head"].values])
    step = max(1, share.sizes["layer"] // 15)
    ticks = list(range(0, share.sizes["layer"], step))
    ax.set_yticks(ticks, [str(share["layer"].values[i]) for i in ticks])
    if annotate if annotate is not None else share.size <= 150:
        for (i, j), v in np.ndenumerate(share.values):
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="black" if v > 0.6 * vmax else "white",
            )
    fig.colorbar(im, ax=ax, label="mean sink share")
    ax.set_title(title or f"sink share {prof.attrs.get('model_id', '')}".strip(), fontsize=9)
    return fig


def plot_sink_vs_content(data: xr.Dataset, *, title: str | None = None) -> Any:
    """Scatter of each head's mean sink share against its mean content entropy, by layer.

    Examples
    --------
    >>> import attncoda as ac
    >>> fig = ac.plot_sink_vs_content(ac.testing.synthetic_rows())
    """
    prof = _profiles(data)
    s = prof["sink_share"].transpose("layer", "head")
    h = prof["content_entropy"].transpose("layer", "head")
    layer = np.broadcast_to(np.asarray(s["layer"].values)[:, None], s.shape)
    fig = _figure(4.8, 3.6)
    ax = fig.add_subplot()
    sc = ax.scatter(s.values.ravel(), h.values.ravel(), c=layer.ravel(), cmap="viridis", s=14)
    fig.colorbar(sc, ax=ax, label="layer")
    ax.set_xlabel("mean sink share")
    ax.set_ylabel("mean content entropy (nats)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(title or "sink channel vs content channel, per head", fontsize=9)
    return fig


def plot_dendrograms(
    clustering: xr.Dataset, conventions: Sequence[str] | None = None, *, title: str | None = None
) -> Any:
    """Dendrograms of :func:`attncoda.cluster_heads` side by side, one per convention.

    Leaves are coloured by the head's mean sink share (yellow = sink-heavy), so a top split
    that separates sink-heavy from sink-light heads is visible at a glance.

    Examples
    --------
    >>> import attncoda as ac
    >>> cl = ac.cluster_heads(ac.testing.synthetic_rows(n_layers=2, n_heads=3), "js", ks=(2,))
    >>> len(ac.plot_dendrograms(cl).axes)
    2
    """
    from matplotlib import colormaps
    from scipy.cluster.hierarchy import dendrogram

    convs = list(conventions) if conventions is not None else list(clustering.convention.values)
    n = len(convs)
    units = clustering["unit"].values
    share = clustering["sink_share"].values
    fig = _figure(3.2 * n, 3.6)
    cmap = colormaps["viridis"]
    for i, conv in enumerate(convs):
        ax = fig.add_subplot(1, n, i + 1)
        z = clustering["linkage"].sel(convention=conv).values
        dn = dendrogram(z, ax=ax, no_labels=True, color_threshold=0, above_threshold_color="0.3")
        leaves = dn["leaves"]
        xs = 5 + 10 * np.arange(len(leaves))
        ax.scatter(xs, np.zeros(len(leaves)), c=cmap(share[leaves]), s=10, zorder=3, clip_on=False)
        rho = clustering["axis_sink_rho"].sel(convention=conv).values[0]
        ax.set_title(f"{conv}  (MDS-1 vs sink share: rho={rho:.2f})", fontsize=8)
        ax.set_ylabel("merge height" if i == 0 else "")
        if len(units) <= 40:
            ax.set_xticks(xs, [str(units[j]) for j in leaves], rotation=90, fontsize=5)
    fig.suptitle(title or f"{clustering.attrs.get('metric', '')} head clustering", fontsize=9)
    return fig


def plot_flip_table(
    flips: xr.Dataset | Mapping[str, xr.Dataset],
    *,
    pair: str | None = None,
    scope: str = "all",
    title: str | None = None,
) -> Any:
    """Flip rates as an annotated table (metric x model, or metric x scope for one model).

    Parameters
    ----------
    flips : Dataset or mapping of name -> Dataset
        :func:`attncoda.flip_rates` output(s).
    pair : str, optional
        The convention pair (default the first).
    scope : str, default "all"
        Used for a mapping of models; with one dataset every scope is a column.

    Examples
    --------
    >>> import attncoda as ac
    >>> fr = ac.flip_rates(ac.testing.synthetic_rows(n_samples=3), n_boot=0)
    >>> fig = ac.plot_flip_table(fr)
    """
    if isinstance(flips, xr.Dataset):
        p = pair or str(flips.pair.values[0])
        table = flips["flip_rate"].sel(pair=p).transpose("metric", "scope")
        cols = [str(c) for c in table.scope.values]
        low = flips["ci_low"].sel(pair=p).transpose("metric", "scope").values
        high = flips["ci_high"].sel(pair=p).transpose("metric", "scope").values
        rows = [str(m) for m in table.metric.values]
        values = table.values
    else:
        names = list(flips)
        first = flips[names[0]]
        p = pair or str(first.pair.values[0])
        rows = [str(m) for m in first.metric.values]
        values = np.array(
            [
                [float(flips[n]["flip_rate"].sel(pair=p, scope=scope, metric=m)) for n in names]
                for m in rows
            ]
        )
        low = np.array(
            [
                [float(flips[n]["ci_low"].sel(pair=p, scope=scope, metric=m)) for n in names]
                for m in rows
            ]
        )
        high = np.array(
            [
                [float(flips[n]["ci_high"].sel(pair=p, scope=scope, metric=m)) for n in names]
                for m in rows
            ]
        )
        cols = names
    fig = _figure(
        1.6 + 1.1 * len(cols) if len(cols) < 12 else 1.6 + 0.5 * len(cols), 1.0 + 0.42 * len(rows)
    )
    ax = fig.add_subplot()
    im = ax.imshow(values * 100, cmap="magma_r", vmin=0, vmax=50, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        text = f"{100 * v:.0f}%"
        if len(cols) < 12 and np.isfinite(low[i, j]):
            text += f"\n[{100 * low[i, j]:.0f}, {100 * high[i, j]:.0f}]"
        ax.text(
            j,
            i,
            text,
            ha="center",
            va="center",
            fontsize=6 if len(cols) < 12 else 4,
            color="white" if v > 0.3 else "black",
        )
    ax.set_xticks(range(len(cols)), cols, rotation=0 if len(cols) < 12 else 90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    fig.colorbar(im, ax=ax, label="verdicts flipped (%)")
    ax.set_title(title or f"verdict flips {p}", fontsize=9)
    return fig


def plot_entropy_attribution(
    attribution: xr.Dataset, *, dim: str | None = None, title: str | None = None
) -> Any:
    """Bars of the sink part and the content part of an entropy change (total as a marker).

    Parameters
    ----------
    attribution : xarray.Dataset
        :func:`attncoda.attribute_entropy` output.
    dim : str, optional
        The dim along the x axis (default ``transition`` if present, else ``layer``, else
        ``head``); every other dim is averaged (weighted by rows).

    Examples
    --------
    >>> import attncoda as ac
    >>> att = ac.attribute_entropy(ac.testing.synthetic_rows(n_layers=3), along="layer")
    >>> fig = ac.plot_entropy_attribution(att)
    """
    if dim is None:
        dim = next((d for d in ("transition", "layer", "head") if d in attribution.dims), None)
    w = attribution["n_rows"].astype(np.float64)
    others = [d for d in attribution["sink"].dims if d != dim]

    def mean(name: str) -> np.ndarray:
        v = (attribution[name].fillna(0) * w).sum(others) / w.sum(others)
        return np.atleast_1d(v.values)

    sink, content, total = mean("sink"), mean("content"), mean("total")
    labels = [str(v) for v in attribution[dim].values] if dim is not None else ["all"]
    x = np.arange(len(labels))
    fig = _figure(max(4.0, 0.35 * len(labels) + 1.5), 3.4)
    ax = fig.add_subplot()
    ax.bar(x, sink, color="tab:orange", label="sink part")
    base = np.where(np.sign(content) == np.sign(sink), sink, 0.0)
    ax.bar(x, content, bottom=base, color="tab:blue", label="content part")
    ax.scatter(x, total, color="black", marker="_", s=120, zorder=3, label="total change")
    ax.axhline(0, color="0.5", lw=0.6)
    ax.set_xticks(x, labels, rotation=90 if len(labels) > 8 else 0, fontsize=7)
    ax.set_ylabel("entropy change (nats)")
    frac = attribution.attrs.get("sink_fraction", np.nan)
    ax.set_title(title or f"entropy attribution (sink share of change: {frac:.0%})", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def plot_rows(
    ds: xr.Dataset,
    *,
    sample: int = 0,
    layer: int | None = None,
    head: int | None = None,
    sink: Any = None,
    title: str | None = None,
) -> Any:
    """Two panels for the rows of one head: the sink share of each query (bars) and the
    renormalised content ``c / (1 - s)`` of each row (heatmap, query x key).

    Examples
    --------
    >>> import attncoda as ac
    >>> fig = ac.plot_rows(ac.testing.synthetic_rows(), layer=1, head=2)
    >>> len(fig.axes)
    3
    """
    from ._analysis import _require_rows, _sink_positions

    la = _require_rows(ds)
    layer = int(ds["layer"].values[-1]) if layer is None else layer
    head = int(ds["head"].values[0]) if head is None else head
    z = la.sel(layer=layer, head=head).isel(sample=sample).values.astype(np.float64)  # (Q, K)
    s_idx = int(_sink_positions(ds, sink)[sample])
    vis = np.isfinite(z)
    m = np.where(vis, z, -np.inf).max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(vis, np.exp(z - m), 0.0)
    total = p.sum(axis=1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    share = p[:, s_idx]
    content = p.copy()
    content[:, s_idx] = 0.0
    csum = content.sum(axis=1, keepdims=True)
    content = np.divide(content, csum, out=np.full_like(content, np.nan), where=csum > 0)
    content[~vis] = np.nan
    content[:, s_idx] = np.nan
    queries = la["query"].values
    fig = _figure(7.0, 3.8)
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 4])
    ax0 = fig.add_subplot(grid[0])
    ax0.barh(np.arange(len(queries)), share, color="tab:orange")
    ax0.set_ylim(len(queries) - 0.5, -0.5)
    ax0.set_xlim(0, 1)
    ax0.set_xlabel("sink share")
    ax0.set_ylabel("query")
    step = max(1, len(queries) // 12)
    ax0.set_yticks(range(0, len(queries), step), [str(q) for q in queries[::step]])
    ax1 = fig.add_subplot(grid[1], sharey=ax0)
    im = ax1.imshow(content, aspect="auto", cmap="viridis", interpolation="nearest")
    ax1.set_xlabel("key (sink column blank)")
    ax1.tick_params(labelleft=False)
    fig.colorbar(im, ax=ax1, label="content share c / (1 - s)")
    fig.suptitle(title or f"layer {layer}, head {head}, sample {sample}", fontsize=9)
    return fig
