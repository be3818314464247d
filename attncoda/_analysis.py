r"""Questions a researcher asks of captured attention, answered under named conventions.

Every comparison of attention rows has to decide what to do with the sink (the key at
``sink_index`` of each sample, by default the first visible key). Three named conventions:

``kept``
    the sink stays in the row: the row is compared as captured;
``dropped``
    the sink is removed and the rest renormalised: the content subcomposition
    :math:`\hat c = c / (1 - s)` is compared;
``split``
    the sink term and the content term are reported separately. The *sink term* applies the
    metric to the sink channel (the two-part composition :math:`(s, 1 - s)`; for the Aitchison
    geometry the balance :math:`b`), the *content term* applies it to :math:`\hat c` (so it equals
    the ``dropped`` comparison). For the Aitchison distance the two terms add up exactly to the
    ``kept`` one, :math:`d_A^2 = (b_x - b_y)^2 + d_A^2(\hat c_x, \hat c_y)`; for the other metrics
    no such identity exists, which is why their ``kept`` values mix two questions.

Metrics (all reported as dissimilarities, larger = farther apart; rows of two heads are only
compared at the same ``(sample, query)``, i.e. over the same visible keys):

============  ================================================================================
``aitchison`` squared Aitchison distance :math:`\|\mathrm{clr}\,x - \mathrm{clr}\,y\|^2`
``cosine``    cosine distance :math:`1 - x\cdot y / (\|x\| \|y\|)` of the probability vectors
``js``        Jensen-Shannon divergence (nats) :math:`H((x+y)/2) - (H(x) + H(y))/2`
``tv``        total variation :math:`\tfrac12 \sum_k |x_k - y_k|`
``kl``        Kullback-Leibler divergence :math:`KL(x_a \| x_b)` (not symmetric: row ``a``
              against column ``b``)
``entropy``   absolute entropy difference :math:`|H(x) - H(y)|`
============  ================================================================================

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
pass over the cells per pair of heads for ``js`` and ``tv`` (they have no matrix-product form;
the pairs are spread over a few threads). Matrix products run through torch when it is
installed (MKL), everything else in numpy; results are float64. With ``device="cuda"`` the
products and the ``js``/``tv`` passes run on the GPU. Cost: the matrix-product metrics for all
270 heads of SmolLM2-135M cost less than the forward that captured the rows; ``js`` and ``tv``
on a CPU cost a few times more (see ``benchmarks/results.md``). The per-row sink/content
channels are computed in this fused, packed form for speed; the tests check them against
:func:`attncoda.decompose` and :func:`attncoda.pairwise_aitchison_split`.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import xarray as xr

from ._data import DIMS, SUMMARY_VARIABLES, SchemaError
from ._decompose import attribute_entropy_change, binary_entropy, decompose
from ._errors import EXIT_USAGE, AttncodaError, ShapeMismatchError
from ._pairwise import row_gram

__all__ = [
    "CONVENTIONS",
    "METRICS",
    "VIEWS",
    "AnalysisError",
    "DatasetMismatchError",
    "FlipCount",
    "RowsRequiredError",
    "UnknownConventionError",
    "UnknownMetricError",
    "attribute_entropy",
    "cluster_heads",
    "flip_rates",
    "head_comparisons",
    "head_distances",
    "head_profiles",
    "sink_rate",
    "verdict_flips",
]

METRICS = ("aitchison", "cosine", "js", "tv", "kl", "entropy")
CONVENTIONS = ("kept", "dropped", "split")
#: What :func:`head_comparisons` stores per metric: the ``kept`` and ``dropped`` comparisons and
#: the sink term of ``split`` (the content term of ``split`` *is* the ``dropped`` comparison).
VIEWS = ("kept", "dropped", "sink")

_ALIASES = {
    "jensen-shannon": "js",
    "jensen_shannon": "js",
    "jsd": "js",
    "total_variation": "tv",
    "total-variation": "tv",
    "cos": "cosine",
    "entropy_difference": "entropy",
    "entropy-difference": "entropy",
    "aitchison2": "aitchison",
}
_LONG_NAMES = {
    "aitchison": "mean squared Aitchison distance over compared rows",
    "cosine": "mean cosine distance (1 - cosine similarity) over compared rows",
    "js": "mean Jensen-Shannon divergence (nats) over compared rows",
    "tv": "mean total variation distance over compared rows",
    "kl": "mean KL(row of unit_a || row of unit_b) (nats) over compared rows",
    "entropy": "mean absolute entropy difference (nats) over compared rows",
}
_KIND = "attncoda.head_comparisons"


# --------------------------------------------------------------------------------------------
# errors


class AnalysisError(AttncodaError, ValueError):
    """Base class of the input errors raised by attncoda's analysis functions."""

    exit_code: ClassVar[int] = EXIT_USAGE


class UnknownMetricError(AnalysisError):
    """A metric name is not one of :data:`METRICS`."""


class UnknownConventionError(AnalysisError):
    """A convention is not ``kept``, ``dropped`` or ``split`` (or a view is not known)."""


class RowsRequiredError(AnalysisError):
    """The operation needs attention rows (``log_attn``), but the dataset only has summaries."""


class DatasetMismatchError(AnalysisError):
    """Two datasets that must describe the same rows (same dims and coordinates) do not."""


def _metric(name: str) -> str:
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in METRICS:
        raise UnknownMetricError(f"unknown metric {name!r}; choose one of {METRICS}")
    return key


def _metrics(names: str | Sequence[str] | None) -> tuple[str, ...]:
    if names is None:
        return METRICS
    if isinstance(names, str):
        names = [names]
    out = tuple(dict.fromkeys(_metric(n) for n in names))
    if not out:
        raise UnknownMetricError("no metric given")
    return out


def _view(name: str) -> str:
    """A comparison view: ``kept``, ``dropped``, ``sink`` (split's sink term) or ``content``."""
    key = str(name).lower()
    if key in ("content", "split_content", "split:content"):
        return "dropped"
    if key in ("split_sink", "split:sink"):
        return "sink"
    if key not in VIEWS:
        raise UnknownConventionError(
            f"unknown convention/view {name!r}; choose 'kept', 'dropped', or split's terms "
            "'sink' and 'content'"
        )
    return key


def _view_label(name: str) -> str:
    key = str(name).lower()
    return "content" if key in ("content", "split_content", "split:content") else _view(key)


# --------------------------------------------------------------------------------------------
# backend: matrix products through attncoda's one GEMM backend (:func:`._pairwise.row_gram`: torch
# when installed, whose MKL is several times faster than the BLAS numpy wheels ship), elementwise
# work in numpy (its SIMD log/exp are the fastest here); with a torch device (a GPU) both the
# products and the per-pair js/tv passes run there


class _Backend:
    """Where matrix products and per-pair passes run: numpy or torch (on a device)."""

    def __init__(self, name: str, device: Any = None) -> None:
        if name not in ("torch", "numpy"):
            raise AnalysisError(f"backend must be 'auto', 'torch' or 'numpy', got {name!r}")
        self.name = name
        self.device = None if device is None else _torch_device(device, name)

    @staticmethod
    def resolve(backend: str, device: Any = None) -> _Backend:
        if backend == "auto":
            torch_found = importlib.util.find_spec("torch") is not None
            backend = "torch" if torch_found or device is not None else "numpy"
        return _Backend(backend, device)

    def gram(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``a @ b.T`` (``b = a`` by default) as float64."""
        g = row_gram(a, b, backend=self.name, device=self.device)
        return np.asarray(g, dtype=np.float64)

    def pairwise_rows(self, a: np.ndarray, kind: Literal["js", "l1"], budget: int) -> np.ndarray:
        """:func:`_pairwise_rows` on the device when one is set, else in numpy."""
        if self.device is None:
            return _pairwise_rows(a, kind, budget)
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
        return _pairwise_rows_torch(t, kind, budget)


def _torch_device(device: Any, backend: str) -> Any:
    """``device`` as a usable torch device, or a clear error."""
    if backend != "torch":
        raise AnalysisError(f"device={device!r} needs backend='torch' (or 'auto'), not {backend!r}")
    try:
        import torch
    except ImportError:
        raise AnalysisError(
            f"device={device!r} needs torch; install it, or leave device unset (numpy on the CPU)"
        ) from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise AnalysisError(f"device={device!r} is not a torch device ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AnalysisError(
            f"device={device!r} but torch sees no CUDA device; leave device unset to compute "
            "on the CPU"
        )
    if dev.type == "meta":
        raise AnalysisError("device='meta' holds no data; pick a CPU or GPU device")
    try:  # a probe, so that "cuda:7" on one GPU or "mps" off a Mac fail here, not mid-analysis
        torch.zeros(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as err:
        reason = str(err).split(". ")[0][:160]
        raise AnalysisError(
            f"device={device!r} cannot be used here ({reason}); pick an available device or "
            "leave device unset to compute on the CPU"
        ) from None
    return dev


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _pairwise_rows(a: np.ndarray, kind: Literal["js", "l1"], budget: int) -> np.ndarray:
    """All pairs of rows of ``a (N, F)``: ``sum_f xlogx((a_i + a_j) / 2)`` (``js``) or
    ``sum_f |a_i - a_j|`` (``l1``). Only ``j >= i`` is computed (then mirrored), anchors are
    spread over a few threads (numpy releases the GIL), temporaries are bounded by ``budget``.
    """
    n, f = a.shape
    out = np.zeros((n, n))
    if n == 0 or f == 0:
        return out
    # js: halve once and lift zeros to the smallest normal float once, so that no pair needs a
    # guard pass before its log (the lift changes xlogx by < 1e-36 per cell)
    src = np.maximum(a * 0.5, np.finfo(a.dtype).tiny) if kind == "js" else a
    n_workers = _workers() if n * n * f > (1 << 22) else 1
    cols = max(1, min(f, budget // max(1, n)))

    def work(first: int) -> None:
        buf = np.empty((n, cols), a.dtype)
        tmp = np.empty((n, cols), a.dtype) if kind == "js" else buf
        for i in range(first, n, n_workers):
            acc = np.zeros(n - i)
            for c0 in range(0, f, cols):
                c1 = min(f, c0 + cols)
                b = buf[: n - i, : c1 - c0]
                if kind == "js":
                    np.add(src[i, c0:c1], src[i:, c0:c1], out=b)
                    t = tmp[: n - i, : c1 - c0]
                    np.log(b, out=t)
                    acc += np.einsum("jk,jk->j", b, t)
                else:
                    np.subtract(src[i, c0:c1], src[i:, c0:c1], out=b)
                    np.abs(b, out=b)
                    acc += b.sum(axis=1)
            out[i, i:] = acc

    if n_workers == 1:
        work(0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(n_workers) as pool:
            list(pool.map(work, range(n_workers)))
    iu = np.triu_indices(n, 1)
    out[iu[1], iu[0]] = out[iu]
    return out


_DEVICE_MIN_BUDGET = 1 << 24  # elements per step on a device: fewer, larger kernel launches


def _pairwise_rows_torch(t: Any, kind: Literal["js", "l1"], budget: int) -> np.ndarray:
    """:func:`_pairwise_rows` for a torch tensor on its device: a few anchors against all
    later rows per step (``anchors x rows x columns <= max(budget, _DEVICE_MIN_BUDGET)``)."""
    import torch

    n, f = t.shape
    out = torch.zeros((n, n), dtype=torch.float64, device=t.device)
    if n == 0 or f == 0:
        return out.cpu().numpy()
    if kind == "js":  # as in the numpy kernel: halve, lift zeros to the smallest normal float
        t = torch.clamp(t * 0.5, min=torch.finfo(t.dtype).tiny)
    step = max(1, max(budget, _DEVICE_MIN_BUDGET) // (n * f))
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        if kind == "js":
            m = t[i0:i1, None, :] + t[None, i0:, :]
            cells = m.mul_(torch.log(m))
        else:
            cells = (t[i0:i1, None, :] - t[None, i0:, :]).abs_()
        out[i0:i1, i0:] = cells.sum(-1).double()
    upper = torch.triu(out, 1)  # steps also filled some j < i: keep j >= i and mirror it
    return (torch.diag(torch.diagonal(out)) + upper + upper.T).cpu().numpy()


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
        pos = np.asarray(sink.transpose("sample").values, np.int64)
    else:
        pos = np.broadcast_to(np.asarray(sink, np.int64), (n,)).copy()
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
) -> Iterator[_Block]:
    """Yield the comparable rows of ``ds`` block by block (one sample, a chunk of queries).

    A row is compared when its sink key is visible and it has at least one visible content key.
    Every unit must see the same keys in a row (rows of one ``(sample, query)``); rows where they
    differ (sliding-window layers mixed with global ones) raise, or are dropped with
    ``mismatched="drop"``.
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
    for s in range(n_s):
        for q0 in range(0, n_q, chunk):
            q1 = min(n_q, q0 + chunk)
            raw = np.asarray(data[s, :, :, q0:q1, :])
            if raw.dtype.kind != "f":
                raise SchemaError(f"log_attn must be floating point, got {raw.dtype}")
            if raw.dtype == np.float16:
                raw = raw.astype(np.float32)
            finite = np.isfinite(raw)
            if int(finite.sum()) + int(np.isneginf(raw).sum()) != raw.size:
                raise SchemaError("log_attn holds NaN or +inf; only -inf marks an invisible key")
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
        zv = z.reshape(n, r * k)[:, vis.reshape(-1)]
        sink_pos = starts + vis[:, : block.sink].sum(axis=1)
        content_sel = np.ones(zv.shape[1], bool)
        content_sel[sink_pos] = False
        self.n_rows = r
        self.starts_v, self.counts_v = starts, counts
        self.starts_c, self.counts_c = starts - np.arange(r), counts - 1
        self.zv = zv
        self.zc = zv[:, content_sel]
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
            for view, cells, ent in (
                ("kept", "p", "h"),
                ("dropped", "c", "hc"),
                ("sink", "v", "hb"),
            ):
                h = g(ent).sum(axis=1, dtype=np.float64)
                t = bk.pairwise_rows(g(cells), "js", budget)
                out[m, view] = -t - (h[:, None] + h[None, :]) / 2
        elif m == "tv":
            out[m, "kept"] = bk.pairwise_rows(g("p"), "l1", budget) / 2
            out[m, "dropped"] = bk.pairwise_rows(g("c"), "l1", budget) / 2
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
        Matrix products through torch when installed (faster BLAS), elementwise work in numpy.
    device : str or torch.device, optional
        Run the matrix products and the per-pair ``js``/``tv`` passes with torch on this device
        (e.g. ``"cuda"``); per-row channels are still computed on the CPU and streamed over block
        by block. On a CPU the default (numpy) is several times faster. Use a GPU when ``js`` or
        ``tv`` is wanted for hundreds of heads: they cost one elementwise pass over every visible
        cell per pair of heads, which on a CPU costs more than the forward that captured the rows.

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
    for block in _iter_blocks(ds, sink=sink, block_elements=block_elements, mismatched=mismatched):
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
    """Pool per-sample comparisons into row-weighted means (no-op without a sample dim)."""
    if "sample" not in cmp.dims:
        return cmp
    w = cmp["n_rows"].astype(np.float64)
    out = {}
    for name, var in cmp.data_vars.items():
        if name == "n_rows":
            continue
        out[name] = (var.fillna(0) * w).sum("sample") / w.sum()
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


# --------------------------------------------------------------------------------------------
# verdict flips


@dataclass(frozen=True)
class FlipCount:
    """Verdict flips over (anchor, B, C) triples (see :func:`verdict_flips`).

    Attributes
    ----------
    flips : int
        Triples whose verdict "is B closer to the anchor than C?" is strictly reversed.
    triples : int
        All triples: anchors times unordered pairs of other units.
    ties : int
        Triples with a tie under at least one convention (never counted as flips).
    """

    flips: int
    triples: int
    ties: int

    @property
    def rate(self) -> float:
        """``flips / triples`` (NaN without triples)."""
        return self.flips / self.triples if self.triples else math.nan


def _square(d: Any, name: str) -> np.ndarray:
    a = np.asarray(d.values if isinstance(d, xr.DataArray) else d, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ShapeMismatchError(f"{name} must be a square (units x units) matrix, got {a.shape}")
    if not np.isfinite(a).all():
        raise AnalysisError(f"{name} holds NaN or infinite values")
    return a


def verdict_flips(
    d1: Any, d2: Any, units: Sequence[int] | np.ndarray | None = None, *, chunk: int = 1 << 22
) -> FlipCount:
    """Count the verdicts that flip between two dissimilarity matrices.

    For every anchor ``A`` and every unordered pair ``{B, C}`` of other units, the verdict is
    the sign of ``d[A, B] - d[A, C]`` (is B closer to A than C?). A *flip* is a triple whose
    verdicts under ``d1`` and ``d2`` have opposite strict signs; a tie (equal dissimilarities)
    under either matrix is not a flip. Vectorised over anchors and pairs (``O(N^3)`` work,
    chunked over anchors).

    Parameters
    ----------
    d1, d2 : array_like (N, N)
        Dissimilarities (row = anchor); need not be symmetric.
    units : sequence of int, optional
        Restrict anchors and candidates to these indices (e.g. the heads of one layer).
    chunk : int
        Upper bound on the elements of one temporary.

    Returns
    -------
    FlipCount

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> d1 = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], float)
    >>> d2 = np.array([[0, 2, 1], [2, 0, 1], [1, 3, 0]], float)
    >>> ac.verdict_flips(d1, d2)
    FlipCount(flips=2, triples=3, ties=1)
    """
    a1, a2 = _square(d1, "d1"), _square(d2, "d2")
    if a1.shape != a2.shape:
        raise ShapeMismatchError(f"d1 {a1.shape} and d2 {a2.shape} differ in shape")
    if units is not None:
        idx = np.asarray(units, dtype=np.int64)
        a1, a2 = a1[np.ix_(idx, idx)], a2[np.ix_(idx, idx)]
    n = a1.shape[0]
    if n < 3:
        return FlipCount(0, 0, 0)
    # Over ordered pairs (b, c): a flip is d1[a,b] > d1[a,c] while d2[a,b] < d2[a,c]; counting
    # it for every ordered pair counts each unordered strict flip exactly once. Booleans only.
    step = max(1, chunk // (n * n))
    flips = strict = 0
    for a0 in range(0, n, step):
        anchors = np.arange(a0, min(n, a0 + step))
        rows = np.arange(len(anchors))
        g1 = a1[anchors, :, None] > a1[anchors, None, :]
        g2 = a2[anchors, :, None] > a2[anchors, None, :]
        for g in (g1, g2):  # the anchor is never a candidate
            g[rows, anchors, :] = False
            g[rows, :, anchors] = False
        g2t = g2.transpose(0, 2, 1)
        flips += int(np.count_nonzero(g1 & g2t))
        # triples strict under both: (g1 | g1^T) & (g2 | g2^T), over ordered pairs = 2x
        strict += int(np.count_nonzero((g1 | g1.transpose(0, 2, 1)) & (g2 | g2t)))
    triples = n * (n - 1) * (n - 2) // 2
    ties = triples - strict // 2
    return FlipCount(flips, triples, ties)


def _triples(n: int, max_triples: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """All (anchor, B, C) triples with B < C, or a uniform sample of ``max_triples`` of them."""
    total = n * (n - 1) * (n - 2) // 2
    if total <= max_triples:
        a, b, c = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
        keep = (b < c) & (a != b) & (a != c)
        return a[keep], b[keep], c[keep]
    a = rng.integers(0, n, max_triples)
    b = rng.integers(0, n - 1, max_triples)
    b = b + (b >= a)  # b != a
    c = rng.integers(0, n - 2, max_triples)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    c = c + (c >= lo)
    c = c + (c >= hi)  # c != a, b
    return a, np.minimum(b, c), np.maximum(b, c)


def _bootstrap_rates(
    sums1: np.ndarray,
    sums2: np.ndarray,
    trip: tuple[np.ndarray, ...],
    weights: np.ndarray,
) -> np.ndarray:
    """Flip rate of each bootstrap replicate; ``sums`` are per-sample sums ``(S, N, N)``."""
    a, b, c = trip
    delta1 = sums1[:, a, b] - sums1[:, a, c]  # (S, T): the sign of a weighted sum is the verdict
    delta2 = sums2[:, a, b] - sums2[:, a, c]
    out = np.empty(len(weights))
    step = max(1, (1 << 23) // max(1, delta1.shape[1]))
    for i in range(0, len(weights), step):
        w = weights[i : i + step]
        prod = np.sign(w @ delta1) * np.sign(w @ delta2)
        out[i : i + step] = (prod < 0).mean(axis=1)
    return out


def flip_rates(
    data: xr.Dataset,
    metrics: str | Sequence[str] | None = None,
    *,
    between: Sequence[tuple[str, str]] | tuple[str, str] = (("kept", "dropped"),),
    by_layer: bool = True,
    n_boot: int = 200,
    ci: float = 0.95,
    seed: int = 0,
    max_triples: int = 200_000,
    **kwargs: Any,
) -> xr.Dataset:
    """Share of "is B closer to the anchor than C?" verdicts that flip between conventions.

    Over all (anchor, B, C) triples of units (B, C unordered, all three distinct) the verdict
    is taken under two conventions from the same head-vs-head dissimilarities (see
    :func:`verdict_flips`). The point estimate uses every triple. Confidence intervals are
    percentile bootstraps over samples: each replicate resamples samples with replacement and
    re-weights their per-sample sums (where a scope has more than ``max_triples`` triples, the
    replicates are evaluated on a fixed uniform sample of that many triples).

    Parameters
    ----------
    data : xarray.Dataset
        Rows, or per-sample comparisons from ``head_comparisons(..., per_sample=True)``.
    metrics : str or sequence, optional
        Default: all metrics in ``data`` (or :data:`METRICS` for rows).
    between : pair or sequence of pairs of views, default ``(("kept", "dropped"),)``
        Views: ``kept``, ``dropped``, and split's terms ``sink`` / ``content``. For example
        ``("kept", "sink")`` asks how often the kept verdict disagrees with the sink channel.
    by_layer : bool, default True
        Also report each layer separately (triples within the layer).
    n_boot : int, default 200
        Bootstrap replicates (0: no intervals).
    ci : float, default 0.95
    seed : int, default 0
    max_triples : int, default 200000
    **kwargs
        Passed to :func:`head_comparisons` when ``data`` holds rows.

    Returns
    -------
    xarray.Dataset
        ``flip_rate``, ``ci_low``, ``ci_high``, ``flips``, ``n_triples`` over
        ``(metric, pair, scope)``; ``scope`` is ``"all"`` then ``"L0"``, ``"L1"``...

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_samples=3, n_layers=1, n_heads=4, length=6)
    >>> fr = ac.flip_rates(ds, ["cosine"], n_boot=20)
    >>> fr.flip_rate.sel(metric="cosine", pair="kept/dropped", scope="all").item() <= 1
    True
    """
    spec: Any = between
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        spec = (spec,)
    pairs = [(_view_label(p[0]), _view_label(p[1])) for p in spec]
    if _is_comparisons(data):
        cmp = data
        mets = (
            _metrics(metrics)
            if metrics is not None
            else tuple(m for m in METRICS if m in cmp.data_vars)
        )
        for m in mets:
            if m not in cmp.data_vars:
                raise UnknownMetricError(f"the comparisons dataset has no {m!r}")
    else:
        mets = _metrics(metrics)
        cmp = head_comparisons(data, mets, per_sample=True, **kwargs)
    if not 0 < ci < 1:
        raise AnalysisError(f"ci must lie in (0, 1), got {ci}")
    has_samples = "sample" in cmp.dims
    pooled = _pooled(cmp)
    layers = np.asarray(cmp["layer_a"].values)
    scopes: list[tuple[str, np.ndarray]] = [("all", np.arange(len(layers)))]
    if by_layer:
        scopes += [(f"L{int(l_)}", np.flatnonzero(layers == l_)) for l_ in np.unique(layers)]
    rng = np.random.default_rng(seed)
    weights = None
    if has_samples and n_boot > 0:
        n_rows = np.asarray(cmp["n_rows"].values, np.float64)
        n_s = len(n_rows)
        weights = rng.multinomial(n_s, np.full(n_s, 1.0 / n_s), size=n_boot).astype(np.float64)
    shape = (len(mets), len(pairs), len(scopes))
    rate = np.full(shape, np.nan)
    low = np.full(shape, np.nan)
    high = np.full(shape, np.nan)
    flips = np.zeros(shape, np.int64)
    n_trip = np.zeros(shape, np.int64)
    for i, m in enumerate(mets):
        for j, (v1, v2) in enumerate(pairs):
            d1 = pooled[m].sel(view=_view(v1)).values
            d2 = pooled[m].sel(view=_view(v2)).values
            if has_samples and weights is not None:
                w = np.asarray(cmp["n_rows"].values, np.float64)[:, None, None]
                s1 = np.nan_to_num(cmp[m].sel(view=_view(v1)).values) * w
                s2 = np.nan_to_num(cmp[m].sel(view=_view(v2)).values) * w
            for k, (_, idx) in enumerate(scopes):
                fc = verdict_flips(d1, d2, idx)
                flips[i, j, k], n_trip[i, j, k] = fc.flips, fc.triples
                rate[i, j, k] = fc.rate
                if weights is None or fc.triples == 0:
                    continue
                trip = _triples(len(idx), max_triples, rng)
                trip = tuple(idx[t] for t in trip)
                boots = _bootstrap_rates(s1, s2, trip, weights)
                low[i, j, k], high[i, j, k] = np.quantile(boots, [(1 - ci) / 2, (1 + ci) / 2])
    dims = ("metric", "pair", "scope")
    coords = {
        "metric": list(mets),
        "pair": [f"{a}/{b}" for a, b in pairs],
        "scope": [s for s, _ in scopes],
    }
    attrs = {
        "definition": "share of (anchor, B, C) triples whose verdict 'd(A,B) < d(A,C)' is "
        "strictly reversed between the two views; ties are not flips",
        "ci": ci,
        "n_boot": int(n_boot if weights is not None else 0),
        "bootstrap": "percentile, resampling samples with replacement",
    }
    for key in ("model_id", "family"):
        if key in cmp.attrs:
            attrs[key] = cmp.attrs[key]
    return xr.Dataset(
        {
            "flip_rate": (dims, rate),
            "ci_low": (dims, low),
            "ci_high": (dims, high),
            "flips": (dims, flips),
            "n_triples": (dims, n_trip),
        },
        coords=coords,
        attrs=attrs,
    )


# --------------------------------------------------------------------------------------------
# clustering


def _as_distance(metric: str, d: np.ndarray) -> np.ndarray:
    """A symmetric dissimilarity with zero diagonal for clustering and MDS."""
    d = np.asarray(d, np.float64)
    d = (d + d.T) / 2  # KL is not symmetric; the others already are
    if metric == "aitchison":
        d = np.sqrt(np.maximum(d, 0.0))  # the Euclidean distance of stacked clr rows
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def _mds(d: np.ndarray, n_components: int, seed: int) -> tuple[np.ndarray, float]:
    from sklearn.manifold import MDS

    try:
        mds = MDS(
            n_components=n_components,
            metric="precomputed",
            init="classical_mds",
            random_state=seed,
            normalized_stress="auto",
        )
    except TypeError:  # scikit-learn < 1.8
        mds = MDS(n_components=n_components, dissimilarity="precomputed", random_state=seed)
    emb = mds.fit_transform(d)
    emb = emb - emb.mean(axis=0)
    # a deterministic orientation: each axis points towards its largest-magnitude unit
    for j in range(emb.shape[1]):
        if emb[np.argmax(np.abs(emb[:, j])), j] < 0:
            emb[:, j] = -emb[:, j]
    return emb, float(mds.stress_)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def cluster_heads(
    data: xr.Dataset,
    metric: str = "js",
    conventions: Sequence[str] = ("kept", "dropped"),
    *,
    method: str = "average",
    ks: Sequence[int] = (2, 3, 4),
    n_components: int = 2,
    sink_threshold: float = 0.3,
    seed: int = 0,
    **kwargs: Any,
) -> xr.Dataset:
    """Cluster heads under each convention and measure how much the structure depends on it.

    With ``metric="js"`` and ``conventions=("kept", "dropped")`` this is the standard BERT
    head-clustering pipeline (Clark et al., 2019: Jensen-Shannon divergences between heads'
    attention over the same tokens, embedded with MDS) run once with and once without the sink.

    For each convention: average-linkage (``method``) hierarchical clustering of the
    dissimilarities (scipy), cut into ``k`` clusters for each ``k`` in ``ks``; a metric MDS
    embedding (scikit-learn, classical-MDS start); k-means on the embedding; the cophenetic
    correlation of the tree with its dissimilarities; and how the leading structure relates to
    the sink channel: Spearman's rho of each MDS axis with the heads' mean sink share, and the
    adjusted Rand index (ARI) of each partition with the split "mean sink share above
    ``sink_threshold``". Between conventions: ARI of the partitions, the correlation of the two
    trees' cophenetic distances, and the correlation of the dissimilarities themselves.

    Dissimilarities are symmetrised (``kl``) and, for ``aitchison``, square-rooted (so they are
    Euclidean distances of the heads' stacked clr rows).

    Parameters
    ----------
    data : xarray.Dataset
        Rows or the output of :func:`head_comparisons`.
    metric : str, default "js"
    conventions : sequence of views, default ("kept", "dropped")
        ``kept``, ``dropped``, ``sink`` and ``content`` (split's terms).
    method : str, default "average"
        scipy linkage method.
    ks : sequence of int, default (2, 3, 4)
    n_components : int, default 2
    sink_threshold : float, default 0.3
    seed : int, default 0
    **kwargs
        Passed to :func:`head_comparisons` when ``data`` holds rows.

    Returns
    -------
    xarray.Dataset
        Per convention: ``labels`` and ``kmeans`` (``convention, k, unit``), ``mds``
        (``convention, unit, component``), ``linkage`` (``convention, merge, field``),
        ``cophenet``, ``stress``, ``axis_sink_rho`` (``convention, component``),
        ``ari_sink_split`` (``convention, k``). Per pair of conventions: ``ari``,
        ``ari_kmeans`` (``pair, k``), ``cophenetic_corr``, ``distance_corr`` (``pair``).

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=8)
    >>> cl = ac.cluster_heads(ds, "js", ks=(2,))
    >>> cl.labels.dims, cl.ari.sel(pair="kept/dropped", k=2).item() <= 1
    (('convention', 'k', 'unit'), True)
    """
    from scipy.cluster.hierarchy import cophenet, fcluster, linkage
    from scipy.spatial.distance import squareform
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score
    from threadpoolctl import threadpool_limits

    m = _metric(metric)
    views = [_view_label(c) for c in conventions]
    if len(set(views)) != len(views):
        raise UnknownConventionError(f"conventions {list(conventions)} repeat a view")
    ks = [int(k) for k in ks]
    cmp = _pooled(_comparisons(data, [m], False, **kwargs))
    n = cmp.sizes["unit_a"]
    if n < 3:
        raise AnalysisError(f"clustering needs at least 3 heads, got {n}")
    if any(k < 2 or k > n for k in ks):
        raise AnalysisError(f"every k must lie in [2, {n}], got {ks}")
    sink_share = np.asarray(cmp["sink_share"].values, np.float64)
    heavy = (sink_share > sink_threshold).astype(int)
    dist, trees, cophs, labels, kmlabels, embs, stress, fit = {}, {}, {}, {}, {}, {}, {}, {}

    def _cluster_one(v: str) -> None:
        d = _as_distance(m, cmp[m].sel(view=_view(v)).values)
        y = squareform(d, checks=False)
        z = linkage(y, method=method)
        c, coph = cophenet(z, y)
        dist[v], trees[v], cophs[v], fit[v] = y, z, coph, float(c)
        labels[v] = np.stack([fcluster(z, k, criterion="maxclust") for k in ks])
        emb, st = _mds(d, n_components, seed)
        embs[v], stress[v] = emb, st
        kmlabels[v] = np.stack(
            [KMeans(k, n_init=4, random_state=seed).fit_predict(emb) + 1 for k in ks]
        )

    # tiny problems (N <= a few hundred): one BLAS/OpenMP thread avoids oversubscription, which
    # made k-means and eigh 100x slower on a shared 2-core machine
    with threadpool_limits(limits=1):
        for v in views:
            _cluster_one(v)
    pairs = [(a, b) for i, a in enumerate(views) for b in views[i + 1 :]]

    def corr(x: np.ndarray, y: np.ndarray) -> float:
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            return 1.0 if np.allclose(x, y) else math.nan
        return float(np.corrcoef(x, y)[0, 1])

    def pair_ari(by_view: dict[str, np.ndarray]) -> np.ndarray:
        """ARI between the labels of every pair of conventions, per k: ``(pair, k)``."""
        return np.array(
            [
                [adjusted_rand_score(x, y) for x, y in zip(by_view[a], by_view[b], strict=True)]
                for a, b in pairs
            ]
        ).reshape(len(pairs), len(ks))

    unit = cmp["label_a"].values if "label_a" in cmp.coords else cmp["unit_a"].values
    ds = xr.Dataset(
        {
            "labels": (("convention", "k", "unit"), np.stack([labels[v] for v in views])),
            "kmeans": (("convention", "k", "unit"), np.stack([kmlabels[v] for v in views])),
            "mds": (("convention", "unit", "component"), np.stack([embs[v] for v in views])),
            "linkage": (("convention", "merge", "field"), np.stack([trees[v] for v in views])),
            "cophenet": (("convention",), [fit[v] for v in views]),
            "stress": (("convention",), [stress[v] for v in views]),
            "axis_sink_rho": (
                ("convention", "component"),
                [
                    [_spearman(embs[v][:, j], sink_share) for j in range(n_components)]
                    for v in views
                ],
            ),
            "ari_sink_split": (
                ("convention", "k"),
                [[adjusted_rand_score(heavy, lab) for lab in labels[v]] for v in views],
            ),
            "ari": (("pair", "k"), pair_ari(labels)),
            "ari_kmeans": (("pair", "k"), pair_ari(kmlabels)),
            "cophenetic_corr": (("pair",), [corr(cophs[a], cophs[b]) for a, b in pairs]),
            "distance_corr": (("pair",), [corr(dist[a], dist[b]) for a, b in pairs]),
        },
        coords={
            "convention": views,
            "k": ks,
            "unit": unit,
            "layer": ("unit", cmp["layer_a"].values),
            "head": ("unit", cmp["head_a"].values),
            "sink_share": ("unit", sink_share),
            "component": np.arange(1, n_components + 1),
            "field": ["left", "right", "height", "size"],
            "pair": [f"{a}/{b}" for a, b in pairs],
        },
        attrs={
            "metric": m,
            "method": method,
            "sink_threshold": sink_threshold,
            "distance": "sqrt(mean squared Aitchison)" if m == "aitchison" else _LONG_NAMES[m],
            **{k: cmp.attrs[k] for k in ("model_id", "family") if k in cmp.attrs},
        },
    )
    return ds


# --------------------------------------------------------------------------------------------
# per-head profiles


def _row_summaries(ds: xr.Dataset, sink: Any) -> xr.Dataset:
    """Summaries (sample, layer, head, query) computed from rows with :func:`decompose`.

    Rows without a visible sink key or without a content key get NaN everywhere.
    """
    la = _require_rows(ds)
    n_s, n_l, n_h, n_q, n_k = (int(v) for v in la.shape)
    sinks = _sink_positions(ds, sink)
    out = {name: np.full((n_s, n_l, n_h, n_q), np.nan) for name in SUMMARY_VARIABLES}
    keys = np.arange(n_k)
    for s in range(n_s):
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


def _summaries(ds: xr.Dataset, sink: Any) -> xr.Dataset:
    """The dataset's summary variables, or ones computed from its rows (custom ``sink=``)."""
    if sink is None and all(v in ds.data_vars for v in ("sink_share", "content_entropy")):
        return ds
    if "log_attn" not in ds.data_vars:
        if sink is not None:
            raise RowsRequiredError("a custom sink= needs rows (log_attn) to recompute summaries")
        raise RowsRequiredError(
            "the dataset has neither summaries (sink_share, content_entropy) nor rows (log_attn)"
        )
    return _row_summaries(ds, sink)


def _content_clr_by_offset(ds: xr.Dataset, sink: Any, max_offset: int) -> xr.DataArray:
    la = _require_rows(ds)
    n_l, n_h = ds.sizes["layer"], ds.sizes["head"]
    offsets = np.arange(-max_offset, max_offset + 1)
    total = np.zeros((n_l * n_h, len(offsets)))
    count = np.zeros(len(offsets))
    for block in _iter_blocks(ds, sink=sink, mismatched="drop"):
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


def head_profiles(ds: xr.Dataset, *, sink: Any = None, max_offset: int | None = 8) -> xr.Dataset:
    """Per-head profiles over samples and queries.

    Means over the rows that have a sink and content (the first query of a causal model, whose
    only key is the sink, is left out) of the sink share, sink log-odds, balance, entropy and
    content entropy, from the summaries when present (else computed from the rows with
    :func:`attncoda.decompose`); with rows, also the mean clr of the content subcomposition by
    relative position ``offset = key - query`` (a previous-token head peaks at ``-1``).

    Parameters
    ----------
    ds : xarray.Dataset
        Summaries and/or rows.
    sink : optional
        Key position of each sample's sink (needs rows); default the ``sink_index`` coordinate.
    max_offset : int or None, default 8
        Offsets ``-max_offset..max_offset`` for ``content_clr``; None skips it.

    Returns
    -------
    xarray.Dataset
        Dims ``layer, head`` (``offset`` for ``content_clr``); ``n_rows``.

    Examples
    --------
    >>> import attncoda as ac
    >>> p = ac.head_profiles(ac.testing.synthetic_rows(n_layers=2, n_heads=3))
    >>> sorted(p.sizes.items())
    [('head', 3), ('layer', 2), ('offset', 17)]
    """
    summ = _summaries(ds, sink)
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
        prof["content_clr"] = _content_clr_by_offset(ds, sink, int(max_offset))
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
    prof = data if "n_rows" in data.data_vars and "sample" not in data.dims else None
    if prof is None:
        prof = head_profiles(data, sink=sink, max_offset=None)
    heavy = (prof["sink_share"] > threshold).astype(np.float64)
    out = heavy.mean("head") if per_layer else heavy.mean(("layer", "head"))
    out.name = "sink_rate"
    out.attrs = {"threshold": threshold, "long_name": "share of heads with mean sink share > t"}
    return out


# --------------------------------------------------------------------------------------------
# entropy attribution


def _strip(ds: xr.Dataset, keep: Sequence[str]) -> xr.Dataset:
    """Only the variables in ``keep``, without non-index coordinates."""
    out = ds[list(keep)]
    drop = [c for c in out.coords if c not in out.dims]
    return out.drop_vars(drop)


def attribute_entropy(
    a: xr.Dataset,
    b: xr.Dataset | None = None,
    *,
    along: str | None = None,
    dims: Sequence[str] = ("sample", "query"),
    sink: Any = None,
) -> xr.Dataset:
    r"""Split the change of row entropy from ``a`` to ``b`` into sink growth and content sharpening.

    Per row, :math:`H = H_b(s) + (1 - s) H(\hat c)`, and the change from ``a`` to ``b`` is split
    by :func:`attncoda.attribute_entropy_change` (the two-player Shapley value): a *sink* part
    (the change of the sink share) and a *content* part (the change of the content entropy),
    which add up exactly to the total. Rows are paired: ``a`` and ``b`` must have the same dims
    and coordinates (two checkpoints or plug-in on/off on the same tokens, two layers after
    selecting them). The parts are then averaged over ``dims`` (default samples and queries) on
    the rows defined in both, per head; means of parts add up to means of totals exactly.

    Parameters
    ----------
    a, b : xarray.Dataset
        Summaries (``sink_share``, ``content_entropy``) or rows.
    along : str, optional
        Without ``b``: attribute the change between consecutive coordinates of this dim of
        ``a`` (e.g. ``along="layer"``: layer 0 -> 1, 1 -> 2, ...), over a ``transition`` dim.
    dims : sequence of str, default ("sample", "query")
        Dims averaged over.
    sink : optional
        As in :func:`head_profiles`.

    Returns
    -------
    xarray.Dataset
        ``sink``, ``content``, ``total`` (mean changes, nats), ``entropy_a``, ``entropy_b`` and
        ``n_rows`` over the remaining dims. Attrs aggregate over all heads (row-weighted):
        ``sink_mean``, ``content_mean``, ``total_mean`` and ``sink_fraction`` (sink part over
        total, the share of the change due to the sink).

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_layers=3, n_heads=2)
    >>> att = ac.attribute_entropy(ds, along="layer")
    >>> att.sizes["transition"], bool(abs(att.sink + att.content - att.total).max() < 1e-12)
    (2, True)
    """
    if b is None:
        if along is None:
            raise AnalysisError("give a second dataset b, or along= a dim of a (e.g. 'layer')")
        summ = _summaries(a, sink)
        if along not in summ.dims or summ.sizes[along] < 2:
            raise AnalysisError(f"along={along!r} needs a dim of at least 2 coordinates")
        coords = summ[along].values
        labels = [f"{coords[i]}->{coords[i + 1]}" for i in range(len(coords) - 1)]
        parts = []
        for i, label in enumerate(labels):
            sa = summ.isel({along: i}, drop=True)
            sb = summ.isel({along: i + 1}, drop=True)
            parts.append(attribute_entropy(sa, sb, dims=dims).expand_dims(transition=[label]))
        out = xr.concat(parts, dim="transition", combine_attrs="drop")
        return _with_fraction(out, a.attrs)
    if along is not None:
        raise AnalysisError("along= is only used without a second dataset")
    need = ["sink_share", "content_entropy"]
    sa = _strip(_summaries(a, sink), need)
    sb = _strip(_summaries(b, sink), need)
    if set(sa.dims) != set(sb.dims):
        raise DatasetMismatchError(
            f"rows are paired, so a and b need the same dims; got {dict(sa.sizes)} and "
            f"{dict(sb.sizes)}"
        )
    try:
        sa, sb = xr.align(sa, sb, join="exact")
    except ValueError as exc:
        raise DatasetMismatchError(
            "a and b must describe the same rows (same coordinates on every dim: samples, "
            f"heads, query positions); {exc}"
        ) from exc
    dims = [d for d in dims if d in sa.dims]
    sa = sa.transpose(*sb["sink_share"].dims)
    valid = (
        sa["sink_share"].notnull()
        & sa["content_entropy"].notnull()
        & sb["sink_share"].notnull()
        & sb["content_entropy"].notnull()
    )
    fill = {"sink_share": 0.5, "content_entropy": 0.0}
    va = {k: sa[k].where(valid, fill[k]).transpose(*valid.dims).values for k in need}
    vb = {k: sb[k].where(valid, fill[k]).transpose(*valid.dims).values for k in need}
    ch = attribute_entropy_change(
        va["sink_share"].astype(np.float64),
        va["content_entropy"].astype(np.float64),
        vb["sink_share"].astype(np.float64),
        vb["content_entropy"].astype(np.float64),
    )
    h_a = binary_entropy(va["sink_share"].astype(np.float64)) + (
        1 - va["sink_share"].astype(np.float64)
    ) * va["content_entropy"].astype(np.float64)
    n = valid.sum(dims)
    res: dict[str, Any] = {}
    safe_n = n.where(n > 0)
    for name, arr in (
        ("sink", ch.sink),
        ("content", ch.content),
        ("total", ch.total),
        ("entropy_a", h_a),
        ("entropy_b", h_a + ch.total),
    ):
        da = xr.DataArray(np.where(valid.values, arr, 0.0), dims=valid.dims, coords=valid.coords)
        res[name] = da.sum(dims) / safe_n
    res["n_rows"] = n
    out = xr.Dataset(res)
    for name, text in (
        ("sink", "entropy change due to the sink share (Shapley part)"),
        ("content", "entropy change due to the content entropy (Shapley part)"),
        ("total", "mean entropy change from a to b"),
    ):
        out[name].attrs["long_name"] = text
    return _with_fraction(out, a.attrs)


def _with_fraction(out: xr.Dataset, attrs: Mapping[Hashable, Any]) -> xr.Dataset:
    w = out["n_rows"].astype(np.float64)
    total = float((out["total"].fillna(0) * w).sum())
    sink = float((out["sink"].fillna(0) * w).sum())
    rows = float(w.sum())
    content = float((out["content"].fillna(0) * w).sum())
    out.attrs = {k: attrs[k] for k in ("model_id", "family") if k in attrs}
    out.attrs["sink_mean"] = sink / rows if rows else math.nan
    out.attrs["content_mean"] = content / rows if rows else math.nan
    out.attrs["total_mean"] = total / rows if rows else math.nan
    out.attrs["sink_fraction"] = sink / total if total != 0 else math.nan
    out.attrs["definition"] = "Shapley split of H = H_b(s) + (1 - s) H(c_hat), row by row"
    return out
