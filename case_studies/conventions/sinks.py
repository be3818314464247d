"""Sink choices the core's ``sink=`` cannot express, built from its public API.

The core analyses take one sink key per sample (``sink=`` an int or a ``sample`` vector). The
paper's BERT pipeline runs on ``[CLS] A [SEP] B [SEP]`` pairs, where a row's sink may depend on
the query (the ``[SEP]`` closing the query's segment) or on the row itself (its most-attended
key). :func:`comparisons_by_row_sink` handles any per-row sink: each sample's rows are grouped by
their sink key, each group becomes one pseudo-sample in which the other rows are invisible
(``-inf`` everywhere, which the core skips), :func:`attncoda.head_comparisons` runs once with one
sink per pseudo-sample, and the groups are merged back into their sample by compared-row counts
(the core's per-sample outputs are row means, so the merge is exact).

A sink per *head* cannot be put on one simplex with the other heads' rows (their ``dropped`` rows
would live on different key sets), so :func:`head_argmax_share` only gives each head's share on
its own most-attended key, used for the structure question (does the first MDS axis follow it?).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

import attncoda as ac

#: The sink choices of the two-segment pipeline, in report order.
PAIR_SINKS = ("cls", "own-sep", "row-argmax", "head-argmax")
PAIR_SINK_LABELS = {
    "cls": "`[CLS]`",
    "own-sep": "`[SEP]` closing the query's segment",
    "row-argmax": "most-attended key of the row (mean over heads)",
    "head-argmax": "each head's most-attended key",
}


def segment_sep_sinks(token_type_ids: np.ndarray, input_ids: np.ndarray, sep_id: int) -> np.ndarray:
    """The key of the ``[SEP]`` closing each query's segment, shape ``(sample, query)``.

    Segment A is ``[CLS] A [SEP]`` (token type 0), segment B is ``B [SEP]`` (type 1): a query's
    sink is the last ``[SEP]`` of its own token type, so ``[CLS]`` and segment A map to the
    first ``[SEP]``, segment B and the final ``[SEP]`` to the second.

    Examples
    --------
    >>> ids = np.array([[101, 7, 102, 8, 9, 102]])
    >>> types = np.array([[0, 0, 0, 1, 1, 1]])
    >>> segment_sep_sinks(types, ids, 102).tolist()
    [[2, 2, 2, 5, 5, 5]]
    """
    types = np.asarray(token_type_ids)
    ids = np.asarray(input_ids)
    if types.shape != ids.shape or types.ndim != 2:
        raise ac.InputError(
            f"token_type_ids {types.shape} and input_ids {ids.shape} must be the same 2-d shape"
        )
    out = np.empty(ids.shape, np.int64)
    for s in range(ids.shape[0]):
        for t in np.unique(types[s]):
            seps = np.flatnonzero((ids[s] == sep_id) & (types[s] == t))
            if len(seps) == 0:
                raise ac.InputError(f"sample {s}: segment {int(t)} has no [SEP] (id {sep_id})")
            out[s, types[s] == t] = seps[-1]
    return out


def row_argmax_sinks(ds: xr.Dataset) -> np.ndarray:
    """Per ``(sample, query)`` row, the key with the highest attention averaged over all heads
    of all layers: one shared sink per row, so every head is still compared on one simplex."""
    la = ds["log_attn"].transpose("sample", "layer", "head", "query", "key")
    mean = np.exp(la.values.astype(np.float64)).mean(axis=(1, 2))  # (sample, query, key)
    return np.asarray(mean.argmax(axis=-1), np.int64)


def head_argmax_share(ds: xr.Dataset) -> xr.DataArray:
    """Each head's mean attention on its own most-attended key, per sample.

    The key is the argmax over keys of the head's attention averaged over the sample's rows; the
    value is that average, i.e. the head's mean sink share with that key as its sink (rows see
    every key in a bidirectional encoder). Dims ``(sample, unit_a)`` with the core's unit labels.
    """
    la = ds["log_attn"].transpose("sample", "layer", "head", "query", "key")
    mean = np.exp(la.values.astype(np.float64)).mean(axis=3)  # (sample, layer, head, key)
    best = mean.max(axis=-1)  # (sample, layer, head)
    n_s, n_l, n_h = best.shape
    layers = np.repeat(ds["layer"].values, n_h)
    heads = np.tile(ds["head"].values, n_l)
    units = [f"L{int(layer)}.H{int(head)}" for layer, head in zip(layers, heads, strict=True)]
    return xr.DataArray(
        best.reshape(n_s, n_l * n_h),
        dims=("sample", "unit_a"),
        coords={"sample": ds["sample"].values, "unit_a": units},
        name="sink_share",
    )


def merge_samples(cmp: xr.Dataset, parent: np.ndarray, samples: np.ndarray) -> xr.Dataset:
    """Merge per-sample comparisons into groups (sample ``i`` into ``samples[parent[i]]``),
    weighting the row means by row counts: exact, as the core's per-sample values are means."""
    n = np.asarray(cmp["n_rows"].values, np.float64)
    onehot = (parent[None, :] == np.arange(len(samples))[:, None]).astype(np.float64)  # (S, G)
    total = onehot @ n
    safe = np.where(total > 0, total, np.nan)
    merged = cmp.isel(sample=np.zeros(len(samples), int)).copy(deep=True)
    merged = merged.assign_coords(sample=samples)
    for name, var in cmp.data_vars.items():
        if name == "n_rows":
            merged[name].values[...] = (onehot @ n).astype(var.dtype)
            continue
        axis = var.dims.index("sample")
        vals = np.moveaxis(np.nan_to_num(var.values) * _along(n, axis, var.ndim), axis, -1)
        summed = np.moveaxis(vals @ onehot.T / safe, -1, axis)
        merged[name].values[...] = summed
    return merged


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = len(v)
    return v.reshape(shape)


def comparisons_by_row_sink(
    ds: xr.Dataset, row_sink: np.ndarray, metrics: Any = None
) -> xr.Dataset:
    """:func:`attncoda.head_comparisons` (``per_sample=True``) with one sink key per row.

    Parameters
    ----------
    ds : xarray.Dataset
        Rows (``log_attn``) of every unit.
    row_sink : ndarray of int, shape ``(sample, query)``
        Key index of each row's sink.
    metrics : optional
        As in :func:`attncoda.head_comparisons`.

    Returns
    -------
    xarray.Dataset
        Per-sample comparisons with the core's layout; each sample's values are means over all
        its compared rows, whatever their sink.

    Examples
    --------
    >>> ds = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=3, length=6)
    >>> same = comparisons_by_row_sink(ds, np.zeros((2, 6), int), ["js"])
    >>> core = ac.head_comparisons(ds, ["js"], per_sample=True)
    >>> bool(abs(same.js - core.js).max() < 1e-9)
    True
    """
    sinks = np.asarray(row_sink, np.int64)
    n_s, n_q = ds.sizes["sample"], ds.sizes["query"]
    if sinks.shape != (n_s, n_q):
        raise ac.InputError(
            f"row_sink needs shape (sample, query) = {(n_s, n_q)}, got {sinks.shape}"
        )
    la = ds["log_attn"].transpose("sample", "layer", "head", "query", "key")
    parts, keys, parent = [], [], []
    for s in range(n_s):
        for k in np.unique(sinks[s]):
            rows = la.isel(sample=[s]).copy()
            rows.values[..., sinks[s] != k, :] = -np.inf  # other rows: nothing visible, skipped
            parts.append(rows)
            keys.append(int(k))
            parent.append(s)
    grouped = xr.concat(parts, dim="sample").to_dataset(name="log_attn")
    grouped = grouped.assign_coords(sample=np.arange(len(parts)))
    grouped.attrs = ds.attrs
    sink = xr.DataArray(np.asarray(keys, np.int64), dims="sample")
    cmp = ac.head_comparisons(grouped, metrics, per_sample=True, sink=sink)
    return merge_samples(cmp, np.asarray(parent), np.asarray(ds["sample"].values))
