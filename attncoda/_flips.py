"""Verdict flips: how often two conventions disagree on "is head B closer to anchor A than C?".

:func:`verdict_flips` counts the flipped triples between two dissimilarity matrices;
:func:`flip_rates` gives their share per metric and layer, with bootstrap intervals over samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from ._comparisons import _is_comparisons, _pooled, head_comparisons
from ._conventions import METRICS, AnalysisError, UnknownMetricError, _metrics, _view, _view_label
from ._data import require_dataset
from ._errors import ShapeMismatchError

__all__ = [
    "FlipCount",
    "flip_rates",
    "verdict_flips",
]


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


def _row_ranks(a: np.ndarray) -> np.ndarray:
    """Each row's values replaced by their rank within the row (``rankdata``'s ``"min"``: ties
    share the lowest), in the smallest unsigned integer type that holds them: every comparison
    within a row gives the same answer, on 1 or 2 bytes instead of float64's 8."""
    from scipy.stats import rankdata

    ranks = rankdata(a, method="min", axis=1) - 1
    return ranks.astype(np.min_scalar_type(a.shape[1] - 1))


def _ordered_pairs(
    x1: np.ndarray,
    x2: np.ndarray,
    anchors: np.ndarray,
    op1: np.ufunc,
    op2: np.ufunc,
    g: np.ndarray,
    h: np.ndarray,
) -> int:
    """Ordered pairs ``(b, c)`` of units other than each row's anchor with
    ``op1(x1[r, b], x1[r, c])`` and ``op2(x2[r, b], x2[r, c])``, summed over the rows ``r``;
    ``g`` and ``h`` are boolean buffers ``(rows, N, N)`` it overwrites."""
    rows = np.arange(len(anchors))
    op1(x1[:, :, None], x1[:, None, :], out=g)
    g[rows, anchors, :] = False  # the anchor is never a candidate
    g[rows, :, anchors] = False
    op2(x2[:, :, None], x2[:, None, :], out=h)
    np.logical_and(g, h, out=g)
    return int(np.count_nonzero(g))


def verdict_flips(
    d1: Any, d2: Any, units: Sequence[int] | np.ndarray | None = None, *, chunk: int = 1 << 20
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
    # it for every ordered pair counts each unordered strict flip exactly once; a triple strict
    # under both (d1[a,b] != d1[a,c] and d2[a,b] != d2[a,c]) is counted twice. Booleans only,
    # in two buffers reused by every block of anchors: fresh temporaries of this size cost more
    # in page faults than the comparisons themselves (they took 1.8x the time at N = 270).
    step = max(1, min(n, chunk // (n * n)))
    buffers = np.empty((2, step, n, n), dtype=bool)
    r1, r2 = _row_ranks(a1), _row_ranks(a2)  # same verdicts, compared 2.5-5x faster than floats
    flips = strict = 0
    for a0 in range(0, n, step):
        anchors = np.arange(a0, min(n, a0 + step))
        g, h = buffers[:, : len(anchors)]
        x1, x2 = r1[anchors], r2[anchors]
        flips += _ordered_pairs(x1, x2, anchors, np.greater, np.less, g, h)
        strict += _ordered_pairs(x1, x2, anchors, np.not_equal, np.not_equal, g, h)
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
    n = sums1.shape[-1]
    ab, ac = a * n + b, a * n + c  # flat indices: np.take gathers them 2-3x faster than [:, a, b]

    def delta(sums: np.ndarray) -> np.ndarray:
        """``sums[:, a, b] - sums[:, a, c]`` (S, T): the sign of a weighted sum is the verdict."""
        flat = sums.reshape(len(sums), -1)
        out = np.take(flat, ab, axis=1)
        out -= np.take(flat, ac, axis=1)
        return out

    delta1, delta2 = delta(sums1), delta(sums2)
    n_boot, n_trip = len(weights), delta1.shape[1]
    flips = np.zeros(n_boot, dtype=np.int64)
    # triples in slices whose (replicate, triple) temporaries (~256 KB each) stay in cache: the
    # passes over them cost half of what they cost at full width
    cols = max(1, (1 << 15) // max(1, n_boot))
    x, y = np.empty((n_boot, cols)), np.empty((n_boot, cols))
    for j in range(0, n_trip, cols):
        width = min(cols, n_trip - j)
        xs, ys = x[:, :width], y[:, :width]
        np.matmul(weights, delta1[:, j : j + width], out=xs)
        np.matmul(weights, delta2[:, j : j + width], out=ys)
        np.multiply(np.sign(xs, out=xs), np.sign(ys, out=ys), out=xs)
        flips += np.count_nonzero(xs < 0, axis=1)
    return flips / max(n_trip, 1)


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
    require_dataset(data, "flip_rates")
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
    cmp = cmp[[*mets, *(["n_rows"] if "n_rows" in cmp.data_vars else [])]]  # pool just these
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
