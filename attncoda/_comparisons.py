r"""Head-vs-head comparisons under the conventions: ``head_comparisons`` and ``head_distances``.

The conventions and metrics are defined in :mod:`attncoda._conventions`.

**Aggregation.** A head-vs-head value is the *mean over compared rows* (every ``(sample, query)``
whose sink key is visible and that has at least one visible content key) of the per-row value:
mean squared Aitchison distance (so the split stays additive; its square root is the Euclidean
distance between the heads' stacked clr rows over ``sqrt(n_rows)``), mean cosine distance, mean
JS divergence, and so on. Per-sample means (``per_sample=True``) keep the row counts, so pooled
values and bootstrap replicates over samples are weighted means of them.

**Computation.** Rows are streamed one sample and one chunk of queries at a time (memory is
bounded by ``block_elements``); the visible ``(row, key)`` cells of a chunk are packed so that
structural zeros never enter a sum, and all heads are compared at once: one matrix product per
block for ``aitchison`` (all three conventions from the Gram matrix of content clr vectors plus
the balances), ``cosine`` and ``kl``, L1 distances over per-row entropies for ``entropy``, and a
pass over the cells per pair of heads for ``js`` and ``tv`` (they have no matrix-product form).
That pass runs in attncoda's compiled kernel (:func:`attncoda.native.pair_sums`: both sums in
one sweep over tiles of cells that stay in cache, with its own vectorised log; float32 terms,
float64 across tiles) where it is available and the rows are float32, else in numpy (pairs spread
over a few threads). Matrix products run through numpy's BLAS (a matrix's product with itself
through ``syrk``, half the work) and stacks of them through torch's batched GEMM when it is
installed, everything else in numpy; results are float64. With ``device="cuda"`` the products
and the ``js``/``tv`` passes run on the GPU. Cost: the matrix-product metrics for all 270 heads
of SmolLM2-135M cost less than the forward that captured the rows (0.77x), and ``js`` and
``tv`` on a CPU about as much again (all six: 1.9x; see ``benchmarks/results.md``). The per-row
sink/content channels are computed in this fused, packed form for speed; the tests check them
against :func:`attncoda.decompose` and :func:`attncoda.pairwise_aitchison_split`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from ._backend import _Backend
from ._conventions import (
    _LONG_NAMES,
    CONVENTIONS,
    VIEWS,
    AnalysisError,
    UnknownConventionError,
    UnknownMetricError,
    _metric,
    _metrics,
    _view,
)
from ._data import require_dataset
from ._errors import ShapeMismatchError
from ._rows import _Block, _grid, _iter_blocks, _unit_coords

__all__ = [
    "head_comparisons",
    "head_distances",
]


_KIND = "attncoda.head_comparisons"


# --------------------------------------------------------------------------------------------
# per-block channels of every row, over packed cells


class _Channels:
    """Sink/content channels of the rows of one block, for every unit (computed lazily).

    The block's visible ``(row, key)`` cells are packed into ``(N, F)`` matrices (each row's
    cells contiguous, in key order), so structural zeros never enter a sum or a product:
    ``*v`` matrices hold all visible cells (``kept``), ``*c`` ones the content cells
    (``dropped``). Per-row quantities are ``(N, R)``; per-row reductions use ``reduceat``.
    """

    def __init__(self, block: _Block) -> None:
        z = block.z
        n, r, k = z.shape
        vis = block.vis
        counts = vis.sum(axis=1)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        zv = _select_columns(z.reshape(n, r * k), vis.reshape(-1))
        sink_pos = starts + vis[:, : block.sink].sum(axis=1)
        content_sel = np.ones(zv.shape[1], bool)
        content_sel[sink_pos] = False
        self.n_rows = r
        self.starts_v, self.counts_v = starts, counts
        self.starts_c, self.counts_c = starts - np.arange(r), counts - 1
        self.zv = zv
        self.zc = _select_columns(zv, content_sel)
        self.z_sink = zv[:, sink_pos]  # (N, R)
        self._cache: dict[str, Any] = {}

    def _rows(self, vals: np.ndarray, which: str) -> np.ndarray:
        """Per-row values ``(N, R)`` repeated over each row's cells."""
        return np.repeat(vals, self.counts_c if which == "c" else self.counts_v, axis=1)

    def _reduce(self, ufunc: Any, cells: np.ndarray, which: str) -> np.ndarray:
        return ufunc.reduceat(cells, self.starts_c if which == "c" else self.starts_v, axis=1)

    def get(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        c = self._cache
        if key in ("c", "lse_c"):
            # c_hat = softmax of the content logits, row by row
            mx = self._reduce(np.maximum, self.zc, "c")
            e = self.zc - self._rows(mx, "c")
            np.exp(e, out=e)
            total = self._reduce(np.add, e, "c")
            e /= self._rows(total, "c")
            c["c"], c["lse_c"] = e, mx + np.log(total)
        elif key == "lc":  # log c_hat
            c[key] = self.zc - self._rows(self.get("lse_c"), "c")
        elif key in ("log_s", "log_1ms", "lse_all"):
            lse_c = self.get("lse_c")
            lse_all = np.logaddexp(self.z_sink, lse_c)
            c["lse_all"], c["log_s"], c["log_1ms"] = lse_all, self.z_sink - lse_all, lse_c - lse_all
        elif key == "s":
            c[key] = np.exp(self.get("log_s"))
        elif key == "hc":
            c[key] = -self._reduce(np.add, self.get("c") * self.get("lc"), "c")
        elif key == "hb":
            s, log_s, log_1ms = self.get("s"), self.get("log_s"), self.get("log_1ms")
            c[key] = -(s * log_s + (1 - s) * log_1ms)
        elif key == "h":
            c[key] = self.get("hb") + (1 - self.get("s")) * self.get("hc")
        elif key == "mean_c":
            c[key] = self._reduce(np.add, self.zc, "c") / self.counts_c
        elif key == "balance":
            nc = self.counts_c.astype(self.zc.dtype)
            c[key] = np.sqrt(nc / (nc + 1)) * (self.z_sink - self.get("mean_c"))
        elif key == "u":  # clr of c_hat: the centred content logits
            c[key] = self.zc - self._rows(self.get("mean_c"), "c")
        elif key == "lp":
            c[key] = self.zv - self._rows(self.get("lse_all"), "v")
        elif key == "p":
            c[key] = np.exp(self.get("lp"))
        elif key in ("p_unit", "c_unit"):
            which = key[0] if key == "c_unit" else "v"
            cells = self.get(key[0])
            norm = np.sqrt(self._reduce(np.add, cells * cells, which))
            c[key] = cells / self._rows(norm, which)
        elif key in ("v", "lv", "v_unit"):  # the sink channel as two-part rows (s, 1 - s)
            s = self.get("s")
            one = 1 - s
            norm = np.sqrt(s * s + one * one)
            c["v"] = np.concatenate([s, one], axis=1)
            c["lv"] = np.concatenate([self.get("log_s"), self.get("log_1ms")], axis=1)
            c["v_unit"] = np.concatenate([s / norm, one / norm], axis=1)
        else:  # pragma: no cover - internal
            raise KeyError(key)
        return c[key]


def _select_columns(a: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``a[:, keep]`` for a boolean ``keep``, as copies of its runs of kept columns: a causal
    row's visible keys are one run (numpy's boolean indexing of a 270-row block took 5 ms, the
    runs 0.7 ms); ``np.take`` where the runs are many and short."""
    edges = np.flatnonzero(np.diff(keep.astype(np.int8), prepend=0, append=0))
    starts, stops = edges[::2].tolist(), edges[1::2].tolist()
    width = sum(stops) - sum(starts)
    if len(starts) * 32 > width:
        return np.take(a, np.flatnonzero(keep), axis=1)
    out = np.empty((a.shape[0], width), a.dtype)
    at = 0
    for s0, s1 in zip(starts, stops, strict=True):
        out[:, at : at + s1 - s0] = a[:, s0:s1]
        at += s1 - s0
    return out


def _sq_dists(bk: _Backend, a: np.ndarray) -> np.ndarray:
    """Sum over columns of squared differences between all pairs of rows of ``a (N, F)``."""
    a = a - a.mean(axis=0, keepdims=True)  # distances unchanged, less cancellation
    g = bk.gram(a)
    d = np.diag(g)
    return d[:, None] + d[None, :] - 2 * g


def _l1(a: np.ndarray) -> np.ndarray:
    from scipy.spatial.distance import cdist

    return cdist(a, a, "cityblock")


def _block_sums(
    bk: _Backend, ch: _Channels, metrics: Sequence[str], budget: int
) -> dict[tuple[str, str], np.ndarray]:
    """Per-view sums over the block's rows of the per-row dissimilarities, ``(N, N)`` each."""
    out: dict[tuple[str, str], np.ndarray] = {}
    r = ch.n_rows
    g = ch.get
    # js and tv of the kept and dropped views: both sums from one sweep over each view's cells
    kinds: tuple[Literal["js", "l1"], ...] = ()
    if "js" in metrics:
        kinds += ("js",)
    if "tv" in metrics:
        kinds += ("l1",)
    pairs = {}
    if kinds:
        for view, cells in (("kept", "p"), ("dropped", "c")):
            pairs[view] = bk.pair_sums(g(cells), kinds, budget)
    for m in metrics:
        if m == "aitchison":
            content = _sq_dists(bk, g("u"))
            sink = _sq_dists(bk, g("balance"))
            out[m, "kept"], out[m, "dropped"], out[m, "sink"] = sink + content, content, sink
        elif m == "cosine":
            for view, unit in (("kept", "p_unit"), ("dropped", "c_unit"), ("sink", "v_unit")):
                out[m, view] = r - bk.gram(g(unit))
        elif m == "kl":
            for view, cells, logs, ent in (
                ("kept", "p", "lp", "h"),
                ("dropped", "c", "lc", "hc"),
                ("sink", "v", "lv", "hb"),
            ):
                h = g(ent).sum(axis=1, dtype=np.float64)
                out[m, view] = -h[:, None] - bk.gram(g(cells), g(logs))
        elif m == "js":
            for view, ent in (("kept", "h"), ("dropped", "hc"), ("sink", "hb")):
                h = g(ent).sum(axis=1, dtype=np.float64)
                if view == "sink":  # two-part rows (s, 1 - s): small
                    t = bk.pair_sums(g("v"), ("js",), budget)["js"]
                else:
                    t = pairs[view]["js"]
                out[m, view] = -t - (h[:, None] + h[None, :]) / 2
        elif m == "tv":
            out[m, "kept"] = pairs["kept"]["l1"] / 2
            out[m, "dropped"] = pairs["dropped"]["l1"] / 2
            out[m, "sink"] = _l1(g("s"))
        elif m == "entropy":
            out[m, "kept"] = _l1(g("h"))
            out[m, "dropped"] = _l1(g("hc"))
            out[m, "sink"] = _l1(g("hb"))
    return out


# --------------------------------------------------------------------------------------------
# head comparisons


def head_comparisons(
    ds: xr.Dataset,
    metrics: str | Sequence[str] | None = None,
    *,
    per_sample: bool = False,
    sink: Any = None,
    mismatched: Literal["raise", "drop"] = "raise",
    units: Literal["label", "layer_head"] = "label",
    block_elements: int = 1 << 22,
    backend: str = "auto",
    device: Any = None,
    progress: bool = True,
) -> xr.Dataset:
    """Compare every head with every head under every convention, in one pass over the rows.

    Parameters
    ----------
    ds : xarray.Dataset
        Rows (``log_attn``, dims ``sample, layer, head, query, key``; fp32 log-probabilities or
        logits with ``-inf`` at invisible keys), as captured with ``what="rows"``.
    metrics : str or sequence of str, optional
        Any of :data:`METRICS` (default: all).
    per_sample : bool, default False
        Keep one mean per sample (a ``sample`` dim) so that :func:`flip_rates` can bootstrap
        over samples; otherwise pool all compared rows.
    sink : int, sequence of int or DataArray over ``sample``, optional
        Key position of each sample's sink; default the ``sink_index`` coordinate.
    mismatched : {"raise", "drop"}, default "raise"
        Rows where units see different keys (sliding-window layers next to global ones) cannot
        be compared: raise :class:`attncoda.ShapeMismatchError`, or leave them out.
    units : {"label", "layer_head"}, default "label"
        How the unit dims are indexed. ``"label"``: by strings such as ``"L3.H5"``, with
        ``layer_a``, ``head_a`` (and ``_b``) coordinates beside them, a layout that netCDF
        files hold (studies store comparisons so). ``"layer_head"``: by ``(layer, head)`` on
        both sides, so ``.sel(layer_a=3, head_a=5)`` works (the strings become ``label_a`` /
        ``label_b``), as :func:`head_distances` returns them; before writing such a dataset to
        netCDF, ``.reset_index(["unit_a", "unit_b"])``.
    block_elements : int, default 2**22
        Upper bound on ``units x rows x keys`` held per block (memory is a small multiple).
    backend : {"auto", "torch", "numpy"}, default "auto"
        ``"auto"``: matrix products through torch when installed (faster BLAS) and the ``js`` /
        ``tv`` passes in attncoda's compiled kernel (:mod:`attncoda.native`) where it is
        available, elementwise work in numpy. ``"torch"``: every product through torch, the rest
        in numpy. ``"numpy"``: everything in numpy (the reference: the same results to float32
        rounding).
    device : str or torch.device, optional
        Run the matrix products and the per-pair ``js``/``tv`` passes with torch on this device
        (e.g. ``"cuda"``); per-row channels are still computed on the CPU and streamed over block
        by block. On a CPU the default is several times faster. Use a GPU when ``js`` or ``tv``
        is wanted for hundreds of heads: they cost one elementwise pass over every visible cell
        per pair of heads, which on a CPU costs about as much as the forward that captured the
        rows.
    progress : bool, default True
        A progress bar over the samples on stderr, shown once the pass has run two seconds (a
        quick call prints nothing); False: silent. :func:`flip_rates`, :func:`cluster_heads`
        and :func:`head_distances` pass it on here.

    Returns
    -------
    xarray.Dataset
        One float64 variable per metric with dims ``(view, [sample,] unit_a, unit_b)``, where
        ``view`` is ``kept``, ``dropped`` or ``sink`` (split's sink term; split's content term is
        ``dropped``). Units are ``(layer, head)`` pairs labelled ``"L3.H5"`` with ``layer_a``,
        ``head_a`` (and ``_b``) coordinates. ``n_rows`` counts the compared rows; ``sink_share``
        and ``content_entropy`` hold each unit's mean over the same rows.

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=3, length=6)
    >>> cmp = ac.head_comparisons(ds, ["aitchison", "js"])
    >>> cmp.aitchison.sizes["unit_a"], cmp.view.values.tolist()
    (3, ['kept', 'dropped', 'sink'])
    >>> a = cmp.aitchison
    >>> bool(abs(a.sel(view="kept") - a.sel(view="sink") - a.sel(view="dropped")).max() < 1e-4)
    True
    >>> by_head = ac.head_comparisons(ds, "js", units="layer_head")
    >>> by_head.js.sel(view="kept", layer_a=0, head_a=2).dims
    ('unit_b',)
    """
    require_dataset(ds, "head_comparisons")
    if units not in ("label", "layer_head"):
        raise AnalysisError(f"units must be 'label' or 'layer_head', got {units!r}")
    mets = _metrics(metrics)
    bk = _Backend.resolve(backend, device)
    layers, heads = _grid(ds)
    n_units = len(layers)
    n_samples = ds.sizes["sample"]
    rows = np.zeros(n_samples, np.int64)
    sums = {
        (m, v): np.zeros((n_samples if per_sample else 1, n_units, n_units))
        for m in mets
        for v in VIEWS
    }
    s_sum = np.zeros((n_samples, n_units))
    hc_sum = np.zeros((n_samples, n_units))
    blocks = _iter_blocks(
        ds,
        sink=sink,
        block_elements=block_elements,
        mismatched=mismatched,
        progress=progress,
        desc="head_comparisons",
    )
    for block in blocks:
        ch = _Channels(block)
        rows[block.sample] += ch.n_rows
        s_sum[block.sample] += ch.get("s").sum(axis=1, dtype=np.float64)
        hc_sum[block.sample] += ch.get("hc").sum(axis=1, dtype=np.float64)
        i = block.sample if per_sample else 0
        for mv, val in _block_sums(bk, ch, mets, block_elements).items():
            sums[mv][i] += val
    if rows.sum() == 0:
        raise AnalysisError(
            "no row can be compared: every row lacks a visible sink or a content key "
            "(check sink= and the query selection)"
        )
    counts = rows if per_sample else rows.sum(keepdims=True)
    safe = np.where(counts > 0, counts, 1).astype(np.float64)
    coords: dict[str, Any] = {"view": list(VIEWS)}
    coords.update(_unit_coords(layers, heads, "a"))
    coords.update(_unit_coords(layers, heads, "b"))
    dims: tuple[str, ...] = ("view", "sample", "unit_a", "unit_b")
    if per_sample:
        coords["sample"] = ds["sample"].values
    data_vars: dict[str, Any] = {}
    eye = np.eye(n_units, dtype=bool)
    for m in mets:
        stack = np.stack([sums[m, v] for v in VIEWS]) / safe[None, :, None, None]
        stack[..., eye] = 0.0
        np.maximum(stack, 0.0, out=stack)
        if per_sample:
            stack[:, counts == 0] = np.nan
            data_vars[m] = (dims, stack, {"long_name": _LONG_NAMES[m]})
        else:
            data_vars[m] = (
                ("view", "unit_a", "unit_b"),
                stack[:, 0],
                {"long_name": _LONG_NAMES[m]},
            )
    if per_sample:
        data_vars["n_rows"] = (("sample",), rows, {"long_name": "compared rows"})
        with np.errstate(invalid="ignore", divide="ignore"):
            data_vars["sink_share"] = (("sample", "unit_a"), s_sum / rows[:, None])
            data_vars["content_entropy"] = (("sample", "unit_a"), hc_sum / rows[:, None])
    else:
        total = float(rows.sum())
        data_vars["n_rows"] = ((), int(rows.sum()), {"long_name": "compared rows"})
        data_vars["sink_share"] = (("unit_a",), s_sum.sum(0) / total)
        data_vars["content_entropy"] = (("unit_a",), hc_sum.sum(0) / total)
    attrs: dict[str, Any] = {
        "attncoda_kind": _KIND,
        "aggregation": "mean over compared (sample, query) rows of the per-row dissimilarity",
        "split": "split = (sink view, dropped view); for aitchison kept = sink + dropped exactly",
    }
    for key in ("model_id", "family"):
        if key in ds.attrs:
            attrs[key] = ds.attrs[key]
    out = xr.Dataset(data_vars, coords=coords, attrs=attrs)
    return _index_units(out) if units == "layer_head" else out


def _is_comparisons(data: Any) -> bool:
    return isinstance(data, xr.Dataset) and data.attrs.get("attncoda_kind") == _KIND


def _pooled(cmp: xr.Dataset) -> xr.Dataset:
    """Pool per-sample comparisons into row-weighted means (no-op without a sample dim).

    On the variables, not the DataArrays: the weights and every metric share the dataset's
    coordinates, so aligning them (the ``(unit_a, unit_b)`` MultiIndexes, at every arithmetic
    step) only checked what holds by construction, and took most of the time of pooling.
    """
    if "sample" not in cmp.dims:
        return cmp
    w = cmp["n_rows"].variable.astype(np.float64)
    total = w.sum()
    out = {}
    for name, var in cmp.data_vars.items():
        if name == "n_rows":
            continue
        mean = (var.variable.fillna(0) * w).sum("sample") / total
        like = var.isel(sample=0, drop=True) if "sample" in var.dims else var
        out[name] = like.copy(data=mean.transpose(*like.dims).data)
        out[name].attrs = var.attrs
    res = xr.Dataset(out, attrs=cmp.attrs)
    res["n_rows"] = cmp["n_rows"].sum()
    return res


def _comparisons(data: xr.Dataset, metrics: Sequence[str], per_sample: bool, **kw: Any) -> Any:
    if _is_comparisons(data):
        missing = [m for m in metrics if m not in data.data_vars]
        if missing:
            raise UnknownMetricError(f"the comparisons dataset has no {missing}; recompute them")
        return data
    return head_comparisons(data, metrics, per_sample=per_sample, **kw)


def _index_units(data: Any) -> Any:
    """``data`` with its ``unit_a`` / ``unit_b`` dims indexed by ``(layer, head)``.

    Each unit dim becomes a :class:`pandas.MultiIndex` of ``(layer_<side>, head_<side>)``, so
    ``.sel(layer_a=3, head_a=5)`` (or a whole layer, ``.sel(layer_a=3)``) works; the ``"L3.H5"``
    strings stay as ``label_a`` / ``label_b`` coordinates. Dims already indexed so are left.
    """
    out = data
    for side in ("a", "b"):
        dim = f"unit_{side}"
        if dim not in out.dims or isinstance(out.indexes.get(dim), pd.MultiIndex):
            continue
        layer, head = f"layer_{side}", f"head_{side}"
        if layer not in out.coords or head not in out.coords:
            raise ShapeMismatchError(
                f"{dim} has no {layer} / {head} coordinates to index by; pass a result of "
                "head_comparisons or head_distances"
            )
        index = pd.MultiIndex.from_arrays(
            [np.asarray(out[layer].values, np.int64), np.asarray(out[head].values, np.int64)],
            names=[layer, head],
        )
        labels = np.asarray(out[dim].values)
        out = out.drop_vars([dim, layer, head])
        out = out.assign_coords(xr.Coordinates.from_pandas_multiindex(index, dim))
        out = out.assign_coords({f"label_{side}": (dim, labels)})
    return out


def head_distances(
    data: xr.Dataset,
    metric: str = "aitchison",
    convention: str = "kept",
    *,
    squared: bool | None = None,
    **kwargs: Any,
) -> xr.DataArray:
    r"""Head-vs-head dissimilarities for one metric under one convention.

    Parameters
    ----------
    data : xarray.Dataset
        Rows (as for :func:`head_comparisons`) or the output of :func:`head_comparisons`.
    metric : str, default "aitchison"
        One of :data:`METRICS`.
    convention : {"kept", "dropped", "split"} or "sink" / "content", default "kept"
        ``split`` returns both terms along a ``term`` dim (``sink``, ``content``).
    squared : bool, optional
        Aitchison only; the name of the result says which it is. Unset or ``True``: the mean
        squared Aitchison distance :math:`\overline{d_A^2}` over the compared rows, named
        ``"aitchison_sq"``: additive, so the ``split`` terms add up to ``kept`` exactly (and
        only squares do: ``split`` takes nothing else). ``False``: the root mean squared
        distance :math:`\sqrt{\overline{d_A^2}}`, named ``"aitchison"``, a distance between
        heads (their stacked clr rows over ``sqrt(n_rows)``) as :func:`cluster_heads` uses it.
        The other metrics are means of their per-row values and have no squared form.
    **kwargs
        Passed to :func:`head_comparisons` when ``data`` holds rows.

    Returns
    -------
    xarray.DataArray
        ``(unit_a, unit_b)``, or ``(term, unit_a, unit_b)`` for ``split``; row-weighted means
        over samples. Both unit dims are indexed by ``(layer, head)``:
        ``d.sel(layer_a=3, head_a=4)`` is head 4 of layer 3 against every head; the ``"L3.H4"``
        strings are the ``label_a`` / ``label_b`` coordinates. The name says what the values are
        (``"aitchison"`` or ``"aitchison_sq"``, else the metric), and so does ``long_name``.

    Raises
    ------
    AnalysisError
        ``squared=True`` for a metric other than ``aitchison``, or ``squared=False`` with
        ``split`` (its terms do not add up as roots).

    See Also
    --------
    head_comparisons : Every metric and view at once (the values are the per-row means:
        squared for ``aitchison``); ``units="layer_head"`` indexes it as here.
    attncoda.pairwise_aitchison : Distances between rows; ``squared=`` there as here.

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=3, length=6)
    >>> d = ac.head_distances(ds, "aitchison", "split")
    >>> d.name, d.term.values.tolist(), d.shape
    ('aitchison_sq', ['sink', 'content'], (2, 3, 3))
    >>> kept = ac.head_distances(ds, "aitchison", "kept")
    >>> kept.name, bool(abs(d.sum("term") - kept).max() < 1e-9)
    ('aitchison_sq', True)
    >>> root = ac.head_distances(ds, "aitchison", squared=False)
    >>> root.name, float(root.sel(layer_a=0, head_a=1, layer_b=0, head_b=1))
    ('aitchison', 0.0)
    """
    require_dataset(data, "head_distances")
    m = _metric(metric)
    conv = str(convention).lower()
    if conv not in (*CONVENTIONS, "sink", "content"):
        raise UnknownConventionError(
            f"unknown convention {convention!r}; choose one of {CONVENTIONS} (or a split term "
            "'sink' / 'content')"
        )
    if squared is not None and not isinstance(squared, (bool, np.bool_)):
        raise AnalysisError(f"squared must be True, False or None, got {squared!r}")
    if m != "aitchison" and squared:
        raise AnalysisError(
            f"squared=True is for the Aitchison distance; {m} values are means of the per-row "
            f"{m} (leave squared unset)"
        )
    if m == "aitchison" and conv == "split" and squared is False:
        raise AnalysisError(
            "the split terms add up to the kept distance only as squared Aitchison distances; "
            "leave squared unset (or True) for split, or take 'sink' / 'content' one at a time"
        )
    root = m == "aitchison" and squared is False
    cmp = _pooled(_comparisons(data, [m], False, **kwargs))
    da = cmp[m]
    if conv == "split":
        out = xr.concat(
            [da.sel(view="sink", drop=True), da.sel(view="dropped", drop=True)],
            dim=xr.DataArray(["sink", "content"], dims="term", name="term"),
        )
    else:
        out = da.sel(view=_view(conv), drop=True)
    attrs = {**da.attrs, "convention": conv}
    if root:
        out = out.copy(data=np.sqrt(out.values))
        attrs["long_name"] = "root mean squared Aitchison distance over compared rows"
    out = _index_units(out)
    out.name = "aitchison_sq" if m == "aitchison" and not root else m
    out.attrs = attrs
    return out
