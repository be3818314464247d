"""The rows of a captured dataset, as the analyses read them: units, sinks and blocks.

A *unit* is one ``(layer, head)`` pair; :func:`_sink_positions` gives each sample's sink key;
:func:`_iter_blocks` streams ``log_attn`` one sample and one chunk of queries at a time, with the
visible cells packed, so memory stays bounded by ``block_elements``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xarray as xr

from ._array import _as_numpy, require_integer_sink
from ._conventions import AnalysisError, RowsRequiredError
from ._data import DIMS, SchemaError
from ._errors import ShapeMismatchError

#: Seconds an analysis runs before its progress bar appears (a quick call prints nothing).
PROGRESS_DELAY = 2.0


def _samples(n: int, desc: str, progress: bool) -> Any:
    """``range(n)`` over the samples of an analysis, with a tqdm bar on stderr (the progress bar
    of capture, prune and run_jobs) that appears once the loop has run ``PROGRESS_DELAY``
    seconds; ``progress=False`` silences it."""
    from tqdm.auto import tqdm

    return tqdm(
        range(n), desc=desc, unit="sample", disable=not progress, delay=PROGRESS_DELAY, leave=False
    )


# --------------------------------------------------------------------------------------------
# units (layer, head pairs) and the rows of a dataset


def _require_rows(ds: xr.Dataset) -> xr.DataArray:
    if not isinstance(ds, xr.Dataset):
        raise AnalysisError(f"expected an xarray.Dataset in attncoda's schema, got {type(ds)}")
    if "log_attn" not in ds.data_vars:
        raise RowsRequiredError(
            "this needs attention rows (the log_attn variable), but the dataset only has "
            f"{sorted(map(str, ds.data_vars))}; capture with what='rows' or what='both'"
        )
    la = ds["log_attn"]
    if set(la.dims) != set(DIMS):
        raise SchemaError(f"log_attn must have dims {DIMS}, has {la.dims}")
    return la.transpose(*DIMS)


def _unit_coords(layers: np.ndarray, heads: np.ndarray, suffix: str) -> dict[str, Any]:
    labels = np.array([f"L{int(l_)}.H{int(h)}" for l_, h in zip(layers, heads, strict=True)])
    dim = f"unit_{suffix}"
    return {
        dim: labels,
        f"layer_{suffix}": (dim, np.asarray(layers, np.int64)),
        f"head_{suffix}": (dim, np.asarray(heads, np.int64)),
    }


def _grid(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Layer and head index of each unit, layer-major (the order of ``log_attn``)."""
    layers = np.asarray(ds["layer"].values)
    heads = np.asarray(ds["head"].values)
    return np.repeat(layers, len(heads)), np.tile(heads, len(layers))


def _sink_positions(ds: xr.Dataset, sink: Any) -> np.ndarray:
    """Key *index* of the sink of each sample."""
    n = ds.sizes["sample"]
    if sink is None:
        pos = (
            np.asarray(ds["sink_index"].values, np.int64)
            if "sink_index" in ds.coords or "sink_index" in ds.data_vars
            else np.zeros(n, np.int64)
        )
    elif isinstance(sink, xr.DataArray):
        given = np.asarray(sink.transpose("sample").values)
        require_integer_sink(given, sink)
        pos = given.astype(np.int64)
    else:
        given = _as_numpy(sink, "sink")
        require_integer_sink(given, sink)
        pos = np.broadcast_to(given.astype(np.int64), (n,)).copy()
    if pos.shape != (n,):
        raise ShapeMismatchError(f"sink= needs one key position per sample ({n}), got {pos.shape}")
    keys = np.asarray(ds["key"].values) if "key" in ds.coords else np.arange(ds.sizes["key"])
    if np.array_equal(keys, np.arange(len(keys))):
        idx = pos
    else:
        lookup = {int(k): i for i, k in enumerate(keys)}
        if not all(int(p) in lookup for p in pos):
            raise ShapeMismatchError(f"sink positions {pos.tolist()} are not all key positions")
        idx = np.array([lookup[int(p)] for p in pos], np.int64)
    if ((idx < 0) | (idx >= len(keys))).any():
        raise ShapeMismatchError(f"sink positions {pos.tolist()} are out of range for the keys")
    return idx


@dataclass
class _Block:
    """Compared rows of one sample and one chunk of queries, all units, visible keys cropped."""

    sample: int
    z: np.ndarray  # (N, R, K) log-attention, -inf at invisible keys
    vis: np.ndarray  # (R, K) visibility, shared by every unit
    sink: int  # key index of the sink
    query: np.ndarray  # (R,) query coordinate of each row
    key: np.ndarray  # (K,) key coordinate of each key


def _iter_blocks(
    ds: xr.Dataset,
    *,
    sink: Any = None,
    block_elements: int = 1 << 22,
    mismatched: Literal["raise", "drop"] = "raise",
    progress: bool = False,
    desc: str = "rows",
) -> Iterator[_Block]:
    """Yield the comparable rows of ``ds`` block by block (one sample, a chunk of queries).

    A row is compared when its sink key is visible and it has at least one visible content key.
    Every unit must see the same keys in a row (rows of one ``(sample, query)``); rows where they
    differ (sliding-window layers mixed with global ones) raise, or are dropped with
    ``mismatched="drop"``. ``progress``: a bar over the samples, named ``desc``.
    """
    if mismatched not in ("raise", "drop"):
        raise AnalysisError(f"mismatched= must be 'raise' or 'drop', got {mismatched!r}")
    la = _require_rows(ds)
    data = la.data
    n_s, n_l, n_h, n_q, n_k = (int(v) for v in la.shape)
    n_units = n_l * n_h
    sinks = _sink_positions(ds, sink)
    queries = np.asarray(ds["query"].values)
    keys = np.asarray(ds["key"].values) if "key" in ds.coords else np.arange(n_k)
    chunk = max(1, int(block_elements) // max(1, n_units * n_k))
    for s in _samples(n_s, desc, progress):
        for q0 in range(0, n_q, chunk):
            q1 = min(n_q, q0 + chunk)
            raw = np.asarray(data[s, :, :, q0:q1, :])
            if raw.dtype.kind != "f":
                raise SchemaError(f"log_attn must be floating point, got {raw.dtype}")
            if raw.dtype == np.float16:
                raw = raw.astype(np.float32)
            # NaN or +inf anywhere makes the maximum NaN or +inf (one reduction, no masks)
            if raw.size and not float(raw.max()) < math.inf:
                raise SchemaError("log_attn holds NaN or +inf; only -inf marks an invisible key")
            finite = np.isfinite(raw)
            vis_any = finite.any(axis=(0, 1, 2))
            if not vis_any.any():
                continue
            k1 = int(np.flatnonzero(vis_any)[-1]) + 1
            k1 = max(k1, int(sinks[s]) + 1)
            z = raw[..., :k1].reshape(n_units, q1 - q0, k1)
            fin = finite[..., :k1].reshape(n_units, q1 - q0, k1)
            vis = fin[0]
            same = (fin == vis[None]).all(axis=(0, 2))
            if not same.all():
                bad = queries[q0:q1][~same]
                if mismatched == "raise":
                    raise ShapeMismatchError(
                        f"sample {s}: units see different keys at queries {bad[:5].tolist()} "
                        "(e.g. sliding-window and global layers); rows are only compared over "
                        "the same visible keys. Select layers that share a mask, or pass "
                        "mismatched='drop' to leave those rows out"
                    )
            sink_i = int(sinks[s])
            has_sink = vis[:, sink_i]
            n_vis = vis.sum(axis=1)
            keep = same & has_sink & (n_vis >= 2)
            if not keep.any():
                continue
            if not keep.all():
                z, vis = z[:, keep], vis[keep]
            yield _Block(s, z, vis, sink_i, queries[q0:q1][keep], keys[:k1])
