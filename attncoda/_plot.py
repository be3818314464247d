"""Figures of attention analyses (matplotlib, headless).

Every function draws into ``ax=`` when given (a matplotlib Axes of your figure, e.g. from
``plt.subplots()``), else into a new :class:`matplotlib.figure.Figure`: through pyplot in a
Jupyter kernel or once you imported pyplot with a backend that shows figures (so
matplotlib's idioms hold: ``ax = ...; ax.set_title(...)`` shows at the cell's end under the
inline backend, ``plt.show()`` shows it), and without pyplot anywhere else (a script, the CLI,
a file-only backend such as Agg: no GUI backend is ever selected and nothing pops up). What they return, as pandas and seaborn do:

- single-panel figures (:func:`plot_sink_grid`, :func:`plot_sink_vs_content`,
  :func:`plot_flip_table`, :func:`plot_entropy_attribution`) return the **Axes** drawn on (its
  figure is ``ax.figure``);
- multi-panel figures (:func:`plot_rows`, :func:`plot_dendrograms`) return the **Figure**; their
  ``ax=`` takes one Axes per panel.

In Jupyter each figure shows once, with no ``%matplotlib`` line: pyplot's inline backend shows
the figures it holds, and a figure made outside pyplot shows through its ``_repr_png_``.
Heatmaps take ``norm=``: ``"linear"`` (default), ``"log"`` (attention weights and shares span
orders of magnitude) or any :class:`matplotlib.colors.Normalize`. Token axes are labelled with
the dataset's ``token`` coordinate when it has one (``tokens=`` overrides it).
:func:`save_figure` writes a Figure or an Axes' figure as PNG and SVG through the Agg/SVG
canvases. matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ._atomic import atomic_output, check_output
from ._data import require_dataset
from ._errors import InputError
from ._profiles import head_profiles
from ._view import _show, token_labels

__all__ = [
    "plot_dendrograms",
    "plot_entropy_attribution",
    "plot_flip_table",
    "plot_rows",
    "plot_sink_grid",
    "plot_sink_vs_content",
    "save_figure",
]


#: matplotlib's backends that only write files: with one of them pyplot shows nothing, so
#: attncoda keeps its figures out of pyplot (sphinx-gallery, CI, ``MPLBACKEND=Agg`` scripts).
_FILE_BACKENDS = frozenset({"agg", "cairo", "pdf", "pgf", "ps", "svg", "template"})


def _pyplot_shows() -> bool:
    """Whether pyplot should own new figures: in a Jupyter kernel (its inline backend shows
    every figure of a cell, so ``ax = plot(); ax.set_title(...)`` and ``plt.show()`` work) or
    where the user imported pyplot with a backend that shows (its ``plt.show()`` is theirs to
    call)."""
    import sys

    if "matplotlib.pyplot" in sys.modules:  # and it can show: not a file-only backend (Agg, ...)
        import matplotlib

        return matplotlib.get_backend().lower() not in _FILE_BACKENDS
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _figure(width: float, height: float) -> Any:
    """A new figure that Jupyter shows inline (see :mod:`attncoda._figures`): through pyplot
    where pyplot shows figures (:func:`_pyplot_shows`), else without it (a script or the CLI:
    no GUI backend is chosen, nothing pops up)."""
    from ._figures import Figure

    if _pyplot_shows():
        import matplotlib.pyplot as plt

        from ._figures import show_once_in_ipython

        show_once_in_ipython()
        return plt.figure(FigureClass=Figure, figsize=(width, height), layout="constrained")
    return Figure(figsize=(width, height), layout="constrained")


def _release(fig: Any) -> None:
    """Hand a figure made only to be saved back from pyplot (if pyplot holds it), so that a
    notebook does not show it and pyplot does not keep it."""
    import sys

    fig = getattr(fig, "figure", fig)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and getattr(fig.canvas, "manager", None) is not None:
        plt.close(fig)


def _title(where: Any, text: str, size: float = 9) -> None:
    """Set an Axes' title (or a Figure's suptitle), wrapped to the width it has, so that a long
    title (the report's "layer 15, head 6 (most sink-heavy ...)") is never cut at the edge."""
    import textwrap

    fig = where if hasattr(where, "suptitle") and not hasattr(where, "set_title") else None
    if fig is not None:
        inches = fig.get_figwidth()
    else:
        inches = where.get_position().width * where.figure.get_figwidth()
    chars = max(20, int(inches * 72 / (size * 0.6)))
    wrapped = "\n".join(textwrap.wrap(text, chars)) or text
    if fig is not None:
        fig.suptitle(wrapped, fontsize=size)
    else:
        where.set_title(wrapped, fontsize=size)


def _check_axes(ax: Any, n: int, name: str) -> list[Any]:
    """``ax=`` as a list of ``n`` Axes of one figure (one Axes is a list of one)."""
    from matplotlib.axes import Axes

    axes = list(ax) if _is_sequence(ax) else [ax]
    if len(axes) != n or not all(isinstance(a, Axes) for a in axes):
        want = "a matplotlib Axes" if n == 1 else f"a sequence of {n} matplotlib Axes"
        raise InputError(f"{name}: ax= must be {want}, got {_describe(ax)}")
    if len({id(a.figure) for a in axes}) != 1:
        raise InputError(f"{name}: the {n} Axes of ax= must belong to one figure")
    return axes


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _describe(value: Any) -> str:
    if _is_sequence(value):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a sequence of {len(value)} ({', '.join(kinds) or 'empty'})"
    return f"{type(value).__name__}"


def _axes(ax: Any, width: float, height: float, name: str) -> Any:
    """The Axes to draw on: ``ax`` (checked), or the one Axes of a new figure."""
    if ax is not None:
        return _check_axes(ax, 1, name)[0]
    from ._figures import Axes

    return _figure(width, height).add_subplot(axes_class=Axes)


def _norm(norm: Any, values: np.ndarray, vmin: float | None, vmax: float | None) -> Any:
    """A matplotlib Normalize from ``norm=`` ("linear", "log" or a Normalize instance)."""
    from matplotlib.colors import LogNorm, Normalize

    if isinstance(norm, Normalize):
        return norm
    if norm is None or norm == "linear":
        return Normalize(vmin=vmin, vmax=vmax)
    if norm == "log":
        data = np.asarray(values, np.float64)
        positive = data[np.isfinite(data) & (data > 0)]
        if positive.size == 0:
            raise InputError("norm='log' needs positive values, and this figure has none")
        low = float(positive.min()) if vmin is None or vmin <= 0 else vmin
        high = float(positive.max()) if vmax is None else vmax
        return LogNorm(vmin=low, vmax=max(high, low))
    raise InputError(
        f"norm={norm!r} is not a colour scale; pass 'linear', 'log' or a "
        "matplotlib.colors.Normalize"
    )


def _label(token: str) -> str:
    """A token as an axis label, as the head view shows it (whitespace visible, long tokens
    cut), with ``$`` escaped: matplotlib would read ``$...$`` as mathtext."""
    return _show(token, 16).replace("$", r"\$")


def _token_labels(
    ds: xr.Dataset, tokens: Any, sample: int, positions: np.ndarray
) -> list[str] | None:
    """Labels of ``positions`` of one sample, or None for plain position numbers: ``tokens=``
    as :func:`attncoda.head_view` reads it (one string per position), by default the dataset's
    ``token`` coordinate when it has one; ``False``: numbers."""
    if tokens is False or (tokens is None and "token" not in ds.coords):
        return None
    if tokens is not None and not _is_sequence(tokens) and not isinstance(tokens, str):
        raise InputError(
            f"tokens= needs one string per position, False or None; got {type(tokens).__name__}"
        )
    by_position = token_labels(ds, sample, tokens)
    if not all(int(p) in by_position for p in positions):
        return None
    return [_label(by_position[int(p)]) for p in positions]


def _set_ticks(ax: Any, axis: str, labels: list[str], *, rotate: bool = False) -> None:
    """Ticks at every position (at most about 64 labels; thinned evenly beyond)."""
    step = max(1, -(-len(labels) // 64))
    ticks = list(range(0, len(labels), step))
    text = [labels[i] for i in ticks]
    size = 7 if len(ticks) <= 24 else 5
    if axis == "x":
        ax.set_xticks(ticks, text, rotation=90 if rotate else 0, fontsize=size)
    else:
        ax.set_yticks(ticks, text, fontsize=size)


def _profiles(data: xr.Dataset) -> xr.Dataset:
    if "n_rows" in data.data_vars and "sample" not in data.dims and "sink_share" in data:
        return data
    return head_profiles(data, max_offset=None)


def save_figure(
    fig: Any, path: str | os.PathLike[str], formats: Sequence[str] = ("png", "svg"), dpi: int = 150
) -> list[Path]:
    """Write ``fig`` (a Figure, or an Axes: its figure) once per format, as ``path`` with each
    suffix; return the paths.

    Each file is written crash-safely (an interrupted save leaves the previous file, if any,
    whole); a file of the same name is replaced, as :meth:`matplotlib.figure.Figure.savefig`
    would. A suffix of ``path`` is dropped only if it is an image format (``grid.png`` and
    ``grid`` give the same files); any other dot stays in the name
    (``qwen2.5-coder-0.5b_heads`` gives ``qwen2.5-coder-0.5b_heads.png``).

    Examples
    --------
    >>> import tempfile, pathlib, attncoda as ac
    >>> ax = ac.plot_sink_grid(ac.testing.synthetic_rows())
    >>> [p.suffix for p in ac.save_figure(ax, pathlib.Path(tempfile.mkdtemp()) / "grid")]
    ['.png', '.svg']
    """
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

    if isinstance(fig, (Axes, SubFigure)):
        fig = fig.figure
        while isinstance(fig, SubFigure):
            fig = fig.figure
    if not isinstance(fig, Figure):
        raise InputError(f"save_figure takes a matplotlib Figure or Axes, got {_describe(fig)}")
    if isinstance(formats, str) or not all(isinstance(f, str) and f.strip(".") for f in formats):
        raise InputError(
            f"formats must be a list of format names like ['png', 'svg'], got {formats!r}"
        )
    names = [f.strip(".").lower() for f in formats]
    supported = fig.canvas.get_supported_filetypes()
    unknown = sorted(set(names) - set(supported))
    if unknown:
        raise InputError(f"save_figure cannot write {unknown}; use some of {sorted(supported)}")
    stem = Path(path).expanduser()
    if stem.suffix.lstrip(".").lower() in supported:
        stem = stem.with_suffix("")
    # checked before anything is written: one format refused leaves no other one written
    targets = [stem.with_name(f"{stem.name}.{fmt}") for fmt in names]
    for target in targets:
        check_output(target, overwrite=True, is_ours=_replaceable, what="figure")
    for fmt, target in zip(names, targets, strict=True):
        with atomic_output(target, overwrite=True, is_ours=_replaceable, what="figure") as tmp:
            fig.savefig(tmp, dpi=dpi, format=fmt)
    return targets


def _replaceable(_path: Path) -> str | None:
    """A figure replaces a file of its own name (as savefig does); a folder is refused."""
    return None


def plot_sink_grid(
    data: xr.Dataset,
    *,
    title: str | None = None,
    vmax: float = 1.0,
    annotate: bool | None = None,
    norm: Any = None,
    ax: Any = None,
) -> Any:
    """Layer x head grid of each head's mean sink share.

    Parameters
    ----------
    data : xarray.Dataset
        A capture (summaries or rows) or :func:`attncoda.head_profiles` output.
    title : str, optional
    vmax : float, default 1
        Top of the colour scale.
    annotate : bool, optional
        Write the values in the cells (default: when there are at most 150 heads).
    norm : {"linear", "log"} or matplotlib.colors.Normalize, optional
        Colour scale; ``"log"`` separates heads with shares of 0.001 and 0.01.
    ax : matplotlib.axes.Axes, optional
        Draw here (a colour bar is added beside it); default a new figure.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import attncoda as ac
    >>> ax = ac.plot_sink_grid(ac.testing.synthetic_rows(n_layers=2, n_heads=3), norm="log")
    >>> ax.get_xlabel(), len(ax.figure.axes)  # the grid and its colour bar
    ('head', 2)
    """
    require_dataset(data, "plot_sink_grid")
    prof = _profiles(data)
    share = prof["sink_share"].transpose("layer", "head")
    ax = _axes(
        ax, 1.2 + 0.45 * share.sizes["head"], 1.0 + 0.28 * share.sizes["layer"], "plot_sink_grid"
    )
    scale = _norm(norm, share.values, 0.0, vmax)
    im = ax.imshow(share.values, norm=scale, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(share.sizes["head"]), [str(h) for h in share["head"].values])
    step = max(1, share.sizes["layer"] // 15)
    ticks = list(range(0, share.sizes["layer"], step))
    ax.set_yticks(ticks, [str(share["layer"].values[i]) for i in ticks])
    if annotate if annotate is not None else share.size <= 150:
        for (i, j), v in np.ndenumerate(share.values):
            bright = np.isfinite(v) and scale(v) > 0.6
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="black" if bright else "white",
            )
    ax.figure.colorbar(im, ax=ax, label="mean sink share")
    model = str(prof.attrs.get("model_id", ""))
    model = Path(model).name if Path(model).is_absolute() else model  # a local checkpoint
    _title(ax, title or f"sink share {model}".strip(), 9)
    return ax


def plot_sink_vs_content(data: xr.Dataset, *, title: str | None = None, ax: Any = None) -> Any:
    """Scatter of each head's mean sink share against its mean content entropy, by layer.

    Parameters
    ----------
    data : xarray.Dataset
        A capture or :func:`attncoda.head_profiles` output.
    title : str, optional
    ax : matplotlib.axes.Axes, optional
        Draw here (a colour bar is added beside it); default a new figure.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import attncoda as ac
    >>> ax = ac.plot_sink_vs_content(ac.testing.synthetic_rows())
    >>> ax.get_xlabel()
    'mean sink share'
    """
    require_dataset(data, "plot_sink_vs_content")
    prof = _profiles(data)
    s = prof["sink_share"].transpose("layer", "head")
    h = prof["content_entropy"].transpose("layer", "head")
    layer = np.broadcast_to(np.asarray(s["layer"].values)[:, None], s.shape)
    ax = _axes(ax, 4.8, 3.6, "plot_sink_vs_content")
    sc = ax.scatter(s.values.ravel(), h.values.ravel(), c=layer.ravel(), cmap="viridis", s=14)
    ax.figure.colorbar(sc, ax=ax, label="layer")
    ax.set_xlabel("mean sink share")
    ax.set_ylabel("mean content entropy (nats)")
    ax.set_xlim(-0.02, 1.02)
    _title(ax, title or "sink channel vs content channel, per head", 9)
    return ax


def plot_dendrograms(
    clustering: xr.Dataset,
    conventions: Sequence[str] | None = None,
    *,
    title: str | None = None,
    ax: Any = None,
) -> Any:
    """Dendrograms of :func:`attncoda.cluster_heads` side by side, one per convention.

    Leaves are coloured by the head's mean sink share (yellow = sink-heavy), so a top split
    that separates sink-heavy from sink-light heads is visible at a glance.

    Parameters
    ----------
    clustering : xarray.Dataset
        :func:`attncoda.cluster_heads` output.
    conventions : sequence of str, optional
        Which conventions, in order (default all).
    title : str, optional
        The figure's title (default the metric); with ``ax=`` only an explicit title is set.
    ax : matplotlib Axes or sequence of them, optional
        One Axes per convention (all of one figure); default a new figure.

    Returns
    -------
    matplotlib.figure.Figure

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
    if ax is None:
        fig = _figure(3.2 * n, 3.6)
        axes = [fig.add_subplot(1, n, i + 1) for i in range(n)]
    else:
        axes = _check_axes(ax, n, "plot_dendrograms")
        fig = axes[0].figure
    cmap = colormaps["viridis"]
    for i, (conv, panel) in enumerate(zip(convs, axes, strict=True)):
        z = clustering["linkage"].sel(convention=conv).values
        dn = dendrogram(z, ax=panel, no_labels=True, color_threshold=0, above_threshold_color="0.3")
        leaves = dn["leaves"]
        xs = 5 + 10 * np.arange(len(leaves))
        panel.scatter(
            xs, np.zeros(len(leaves)), c=cmap(share[leaves]), s=10, zorder=3, clip_on=False
        )
        rho = clustering["axis_sink_rho"].sel(convention=conv).values[0]
        _title(panel, f"{conv}  (MDS-1 vs sink share: rho={rho:.2f})", 8)
        panel.set_ylabel("merge height" if i == 0 else "")
        if len(units) <= 40:
            panel.set_xticks(xs, [str(units[j]) for j in leaves], rotation=90, fontsize=5)
    if ax is None or title is not None:
        _title(fig, title or f"{clustering.attrs.get('metric', '')} head clustering", 9)
    return fig


def plot_flip_table(
    flips: xr.Dataset | Mapping[str, xr.Dataset],
    *,
    pair: str | None = None,
    scope: str = "all",
    title: str | None = None,
    norm: Any = None,
    ax: Any = None,
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
    title : str, optional
    norm : {"linear", "log"} or matplotlib.colors.Normalize, optional
        Colour scale of the rates in percent (default linear, 0 to 50%).
    ax : matplotlib.axes.Axes, optional
        Draw here (a colour bar is added beside it); default a new figure.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import attncoda as ac
    >>> fr = ac.flip_rates(ac.testing.synthetic_rows(n_samples=3), n_boot=0)
    >>> ax = ac.plot_flip_table(fr)
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

        def cell(name: str, var: str, metric: str) -> float:
            return float(flips[name][var].sel(pair=p, scope=scope, metric=metric))

        values = np.array([[cell(n, "flip_rate", m) for n in names] for m in rows])
        low = np.array([[cell(n, "ci_low", m) for n in names] for m in rows])
        high = np.array([[cell(n, "ci_high", m) for n in names] for m in rows])
        cols = names
    ax = _axes(
        ax,
        1.6 + 1.1 * len(cols) if len(cols) < 12 else 1.6 + 0.5 * len(cols),
        max(2.4, 1.0 + 0.42 * len(rows)),  # room for the colour bar's label and a title
        "plot_flip_table",
    )
    scale = _norm(norm, values * 100, 0.0, 50.0)
    im = ax.imshow(values * 100, cmap="magma_r", norm=scale, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        text = f"{100 * v:.0f}%"
        if len(cols) < 12 and np.isfinite(low[i, j]):
            text += f"\n[{100 * low[i, j]:.0f}, {100 * high[i, j]:.0f}]"
        dark = np.isfinite(v) and v > 0 and scale(100 * v) > 0.6
        ax.text(
            j,
            i,
            text,
            ha="center",
            va="center",
            fontsize=6 if len(cols) < 12 else 4,
            color="white" if dark else "black",
        )
    ax.set_xticks(range(len(cols)), cols, rotation=0 if len(cols) < 12 else 90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.figure.colorbar(im, ax=ax, label="verdicts flipped (%)")
    _title(ax, title or f"verdict flips {p}", 9)
    return ax


def plot_entropy_attribution(
    attribution: xr.Dataset, *, dim: str | None = None, title: str | None = None, ax: Any = None
) -> Any:
    """Bars of the sink part and the content part of an entropy change (total as a marker).

    Parameters
    ----------
    attribution : xarray.Dataset
        :func:`attncoda.attribute_entropy` output.
    dim : str, optional
        The dim along the x axis (default ``transition`` if present, else ``layer``, else
        ``head``); every other dim is averaged (weighted by rows).
    title : str, optional
    ax : matplotlib.axes.Axes, optional
        Draw here; default a new figure.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import attncoda as ac
    >>> att = ac.attribute_entropy(ac.testing.synthetic_rows(n_layers=3), along="layer")
    >>> ax = ac.plot_entropy_attribution(att)
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
    ax = _axes(ax, max(4.0, 0.35 * len(labels) + 1.5), 3.4, "plot_entropy_attribution")
    ax.bar(x, sink, color="tab:orange", label="sink part")
    base = np.where(np.sign(content) == np.sign(sink), sink, 0.0)
    ax.bar(x, content, bottom=base, color="tab:blue", label="content part")
    ax.scatter(x, total, color="black", marker="_", s=120, zorder=3, label="total change")
    ax.axhline(0, color="0.5", lw=0.6)
    ax.set_xticks(x, labels, rotation=90 if len(labels) > 8 else 0, fontsize=7)
    ax.set_ylabel("entropy change (nats)")
    frac = attribution.attrs.get("sink_fraction", np.nan)
    _title(ax, title or f"entropy attribution (sink share of change: {frac:.0%})", 9)
    ax.legend(fontsize=7)
    return ax


def plot_rows(
    ds: xr.Dataset,
    *,
    sample: int = 0,
    layer: int | None = None,
    head: int | None = None,
    sink: Any = None,
    title: str | None = None,
    tokens: Any = None,
    norm: Any = None,
    window: Any = None,
    max_tokens: int = 64,
    ax: Any = None,
) -> Any:
    """Two panels for the rows of one head: the sink share of each query (bars) and the
    renormalised content ``c / (1 - s)`` of each row (heatmap, query x key).

    Only the sample's real tokens are drawn (padding, the keys no query sees and the queries
    that see no key, is left out), and at most ``max_tokens`` of them: a longer sample is
    windowed (its first ``max_tokens`` real tokens, or ``window=``) and the title says which
    positions are shown.

    Parameters
    ----------
    ds : xarray.Dataset
        A capture with rows (``log_attn``).
    sample : int, default 0
        Index along ``sample``.
    layer, head : int, optional
        Coordinate values (default the last layer and the first head).
    sink : int or array of int, optional
        The sink key of each sample (default the ``sink_index`` coordinate).
    title : str, optional
        The figure's title; with ``ax=`` only an explicit title is set.
    tokens : sequence of str or False, optional
        Labels of the positions of ``sample`` (one string per position). Default: the
        dataset's ``token`` coordinate, when it has one; False or none: positions as numbers.
        The sink's label is marked ``[sink]``.
    norm : {"linear", "log"} or matplotlib.colors.Normalize, optional
        Colour scale of the heatmap; ``"log"`` shows content shares spanning orders of
        magnitude.
    window : (int, int), optional
        Key positions ``[start, stop)`` to show (their queries too, in self-attention).
        Default: the first ``max_tokens`` real tokens.
    max_tokens : int, default 64
        The most tokens drawn when ``window`` is not given (labels stay readable).
    ax : pair of matplotlib Axes, optional
        ``(bars, heatmap)`` of one figure (a colour bar is added beside the heatmap); default a
        new figure.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import attncoda as ac
    >>> fig = ac.plot_rows(ac.testing.synthetic_rows(), layer=1, head=2, norm="log")
    >>> len(fig.axes)  # bars, heatmap, colour bar
    3
    >>> fig.axes[1].get_xticklabels()[0].get_text()  # the dataset's tokens label the keys
    '<bos> [sink]'
    """
    from ._rows import _require_rows, _sink_positions

    la = _require_rows(ds)
    layer = int(ds["layer"].values[-1]) if layer is None else layer
    head = int(ds["head"].values[0]) if head is None else head
    if ax is not None:
        bars_ax, heat_ax = _check_axes(ax, 2, "plot_rows")
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
    queries = np.asarray(la["query"].values)
    keys = np.asarray(la["key"].values) if "key" in la.coords else np.arange(la.sizes["key"])
    query_labels = _token_labels(ds, tokens, sample, queries)
    key_labels = _token_labels(ds, tokens, sample, keys)
    ks, qs, note = _rows_window(vis, queries, keys, window, max_tokens)
    content, share = content[np.ix_(qs, ks)], share[qs]
    s_col = int(np.flatnonzero(ks == s_idx)[0]) if s_idx in ks else None
    queries, keys = queries[qs], keys[ks]
    if query_labels is not None:
        query_labels = [query_labels[i] for i in qs]
    if key_labels is not None:
        key_labels = [key_labels[i] for i in ks]
    if ax is None:
        fig = _figure(7.0, 3.8 if query_labels is None else 4.6)
        grid = fig.add_gridspec(1, 2, width_ratios=[1, 4])
        bars_ax = fig.add_subplot(grid[0])
        heat_ax = fig.add_subplot(grid[1], sharey=bars_ax)
    else:
        fig = bars_ax.figure
    bars_ax.barh(np.arange(len(queries)), share, color="tab:orange")
    bars_ax.set_ylim(len(queries) - 0.5, -0.5)
    bars_ax.set_xlim(0, 1)
    bars_ax.set_xlabel("sink share")
    bars_ax.set_ylabel("query")
    if query_labels is None:
        step = max(1, len(queries) // 12)
        bars_ax.set_yticks(range(0, len(queries), step), [str(q) for q in queries[::step]])
    else:
        _set_ticks(bars_ax, "y", query_labels)
    im = heat_ax.imshow(
        content,
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        norm=_norm(norm, content, None, None),
    )
    heat_ax.set_ylim(len(queries) - 0.5, -0.5)
    if key_labels is None:
        heat_ax.set_xlabel("key (sink column blank)")
    else:
        if s_col is not None:
            key_labels[s_col] = f"{key_labels[s_col]} [sink]"
        _set_ticks(heat_ax, "x", key_labels, rotate=True)
        heat_ax.set_xlabel("key (sink column blank)")
    heat_ax.tick_params(labelleft=False)
    fig.colorbar(im, ax=heat_ax, label="content share c / (1 - s)")
    if ax is None or title is not None:
        heading = title or f"layer {layer}, head {head}, sample {sample}"
        _title(fig, f"{heading}: {note}" if note else heading, 9)
    return fig


def _rows_window(
    vis: np.ndarray, queries: np.ndarray, keys: np.ndarray, window: Any, max_tokens: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """Indices of the keys and queries :func:`plot_rows` draws, and what the title says of
    them ("" when every real token is drawn)."""
    from ._errors import require_int

    max_tokens = require_int(max_tokens, "max_tokens", low=2)
    real_k, real_q = np.flatnonzero(vis.any(0)), np.flatnonzero(vis.any(1))
    if real_k.size == 0:
        raise InputError("this head sees no key in this sample (every key is padding)")
    n, padding = real_k.size, vis.shape[1] - real_k.size
    if window is None:
        ks = real_k[:max_tokens]
    else:
        if isinstance(window, (str, bytes)) or np.ndim(window) != 1 or len(window) != 2:
            raise InputError(f"window must be (start, stop) key positions, got {window!r}")
        a, b = (require_int(w, "window") for w in window)
        ks = real_k[(keys[real_k] >= a) & (keys[real_k] < b)]
        if ks.size == 0:
            raise InputError(
                f"window={window!r} holds no real token; this sample's are positions "
                f"{keys[real_k[0]]}-{keys[real_k[-1]]}"
            )
    self_attention = queries.shape == keys.shape and np.array_equal(queries, keys)
    if self_attention:
        qs = real_q[np.isin(queries[real_q], keys[ks])]
    else:
        qs = real_q[:max_tokens] if window is None else real_q
    parts = []
    if ks.size < n:
        parts.append(
            f"positions {keys[ks[0]]}-{keys[ks[-1]]} of its {n} tokens (window= shows others)"
        )
    if qs.size < real_q.size and not self_attention:
        parts.append(f"the first {qs.size} of {real_q.size} queries")
    if padding:
        parts.append(f"{padding} padding keys left out")
    return ks, qs, "; ".join(parts)
