"""Per-head profiles: summaries of every head's rows (sink share, entropies) and the sink rate."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from ._conventions import RowsRequiredError
from ._data import DIMS, SUMMARY_VARIABLES, require_dataset
from ._decompose import decompose
from ._rows import _iter_blocks, _require_rows, _samples, _sink_positions

__all__ = [
    "head_profiles",
    "sink_rate",
]


# --------------------------------------------------------------------------------------------
# per-head profiles


def _row_summaries(ds: xr.Dataset, sink: Any, progress: bool = False) -> xr.Dataset:
    """Summaries (sample, layer, head, query) computed from rows with :func:`decompose`.

    Rows without a visible sink key or without a content key get NaN everywhere.
    """
    la = _require_rows(ds)
    n_s, n_l, n_h, n_q, n_k = (int(v) for v in la.shape)
    sinks = _sink_positions(ds, sink)
    out = {name: np.full((n_s, n_l, n_h, n_q), np.nan) for name in SUMMARY_VARIABLES}
    keys = np.arange(n_k)
    for s in _samples(n_s, "head_profiles", progress):
        is_sink = keys == sinks[s]
        for layer in range(n_l):
            z = np.asarray(la.data[s, layer], dtype=np.float64)  # (H, Q, K)
            vis = np.isfinite(z)
            ok = vis[..., sinks[s]] & (vis.sum(-1) >= 2)
            # rows that cannot be decomposed become a harmless uniform row, masked below
            z = np.where(ok[..., None], z, 0.0)
            d = decompose(z, sink=np.broadcast_to(is_sink, z.shape), from_logits=True)
            for name in SUMMARY_VARIABLES:
                out[name][s, layer] = np.where(ok, np.asarray(getattr(d, name)), np.nan)
    return xr.Dataset(
        {name: (DIMS[:4], val) for name, val in out.items()},
        coords={d_: ds[d_].values for d_ in DIMS[:4] if d_ in ds.coords},
    )


def _summaries(ds: xr.Dataset, sink: Any, progress: bool = False) -> xr.Dataset:
    """The dataset's summary variables, or ones computed from its rows (custom ``sink=``)."""
    if sink is None and all(v in ds.data_vars for v in ("sink_share", "content_entropy")):
        return ds
    if "log_attn" not in ds.data_vars:
        if sink is not None:
            raise RowsRequiredError("a custom sink= needs rows (log_attn) to recompute summaries")
        raise RowsRequiredError(
            "the dataset has neither summaries (sink_share, content_entropy) nor rows (log_attn)"
        )
    return _row_summaries(ds, sink, progress)


def _content_clr_by_offset(
    ds: xr.Dataset, sink: Any, max_offset: int, progress: bool = False
) -> xr.DataArray:
    la = _require_rows(ds)
    n_l, n_h = ds.sizes["layer"], ds.sizes["head"]
    offsets = np.arange(-max_offset, max_offset + 1)
    total = np.zeros((n_l * n_h, len(offsets)))
    count = np.zeros(len(offsets))
    blocks = _iter_blocks(ds, sink=sink, mismatched="drop", progress=progress, desc="content_clr")
    for block in blocks:
        z = block.z.astype(np.float64)
        content = block.vis.copy()
        content[:, block.sink] = False
        n_c = content.sum(1)
        mean_c = np.where(content[None], z, 0.0).sum(-1) / n_c
        clr = np.where(content[None], z - mean_c[..., None], 0.0)
        off = block.key[None, :] - block.query[:, None]  # (R, K)
        onehot = (off[..., None] == offsets) & content[..., None]  # (R, K, O)
        total += np.einsum("nrk,rko->no", clr, onehot.astype(np.float64))
        count += onehot.sum(axis=(0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    del la
    return xr.DataArray(
        mean.reshape(n_l, n_h, len(offsets)),
        dims=("layer", "head", "offset"),
        coords={"layer": ds["layer"].values, "head": ds["head"].values, "offset": offsets},
        attrs={"long_name": "mean clr of the content subcomposition at key - query = offset"},
    )


def head_profiles(
    ds: xr.Dataset, *, sink: Any = None, max_offset: int | None = None, progress: bool = True
) -> xr.Dataset:
    """Per-head profiles over samples and queries.

    Means over the rows that have a sink and content (the first query of a causal model, whose
    only key is the sink, is left out) of the sink share, sink log-odds, balance, entropy and
    content entropy, from the summaries when present (else computed from the rows with
    :func:`attncoda.decompose`). Every variable is a layer x head table; print one as a table
    with ``.round(2).to_pandas()`` (Jupyter shows the DataFrame as an HTML table).

    With rows and ``max_offset=k``, also ``content_clr``: where in the sequence a head's content
    attention goes, as the mean clr of the content subcomposition at each relative key position
    ``offset = key - query`` from ``-k`` to ``k`` (a previous-token head peaks at ``-1``). An
    offset no row has is NaN: in a causal model every positive offset.

    Parameters
    ----------
    ds : xarray.Dataset
        Summaries and/or rows.
    sink : optional
        Key position of each sample's sink (needs rows); default the ``sink_index`` coordinate.
    max_offset : int, optional
        Add ``content_clr`` over offsets ``-max_offset..max_offset`` (needs rows); default none.
    progress : bool, default True
        A progress bar over the samples on stderr, shown when the rows take more than two
        seconds (summaries take none); False: silent.

    Returns
    -------
    xarray.Dataset
        Dims ``layer, head``: the summary variables and ``n_rows`` (rows averaged); with
        ``max_offset``, ``content_clr`` over ``layer, head, offset``.

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_layers=2, n_heads=3)
    >>> p = ac.head_profiles(ds)
    >>> sorted(p.sizes.items())
    [('head', 3), ('layer', 2)]
    >>> print(p.sink_share.round(2).to_pandas())  # doctest: +NORMALIZE_WHITESPACE
    head      0     1     2
    layer
    0      0.01  0.29  0.85
    1      0.01  0.35  0.75
    >>> ac.head_profiles(ds, max_offset=2).content_clr.dims
    ('layer', 'head', 'offset')
    """
    require_dataset(ds, "head_profiles")
    summ = _summaries(ds, sink, progress)
    valid = summ["content_entropy"].notnull() & summ["sink_share"].notnull()
    out: dict[str, Any] = {}
    for name in SUMMARY_VARIABLES:
        if name not in summ.data_vars:
            continue
        v = summ[name].where(valid & summ[name].notnull() & (abs(summ[name]) < np.inf))
        out[name] = v.mean(("sample", "query"))
        out[name].attrs = dict(summ[name].attrs)
    out["n_rows"] = valid.sum(("sample", "query"))
    prof = xr.Dataset(out)
    if max_offset is not None and "log_attn" in ds.data_vars:
        prof["content_clr"] = _content_clr_by_offset(ds, sink, int(max_offset), progress)
    prof.attrs = {k: ds.attrs[k] for k in ("model_id", "family") if k in ds.attrs}
    return prof


def sink_rate(
    data: xr.Dataset, threshold: float = 0.3, *, per_layer: bool = False, sink: Any = None
) -> xr.DataArray:
    """The sink rate of the attention-sink literature: the share of heads whose mean sink share
    exceeds ``threshold``.

    Parameters
    ----------
    data : xarray.Dataset
        A capture (summaries or rows) or the output of :func:`head_profiles`.
    threshold : float, default 0.3
    per_layer : bool, default False
        One rate per layer instead of one over all heads.
    sink : optional
        As in :func:`head_profiles`.

    Returns
    -------
    xarray.DataArray
        A scalar, or a ``layer`` vector.

    Examples
    --------
    >>> import attncoda as ac
    >>> float(ac.sink_rate(ac.testing.synthetic_rows(n_layers=2, n_heads=4), 0.3))
    0.5
    """
    require_dataset(data, "sink_rate")
    prof = data if "n_rows" in data.data_vars and "sample" not in data.dims else None
    if prof is None:
        prof = head_profiles(data, sink=sink, max_offset=None)
    heavy = (prof["sink_share"] > threshold).astype(np.float64)
    out = heavy.mean("head") if per_layer else heavy.mean(("layer", "head"))
    out.name = "sink_rate"
    out.attrs = {"threshold": threshold, "long_name": "share of heads with mean sink share > t"}
    return out
