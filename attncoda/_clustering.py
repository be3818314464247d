"""Clustering heads under each convention (hierarchical, MDS, k-means) and how it depends on the sink."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from ._comparisons import _comparisons, _pooled
from ._conventions import (
    _LONG_NAMES,
    AnalysisError,
    UnknownConventionError,
    _metric,
    _view,
    _view_label,
)
from ._data import require_dataset

__all__ = [
    "cluster_heads",
]


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


def _smacof(
    d: np.ndarray, x: np.ndarray, max_iter: int = 300, eps: float = 1e-6
) -> tuple[np.ndarray, float]:
    """Metric SMACOF (Guttman transforms) from the start ``x``: the embedding and its raw
    stress. scikit-learn's ``smacof(metric=True)`` step for step (its Euclidean distances by the
    same Gram formula, the same zero guard and convergence rule), without its input checks on
    each of up to 300 distance computations, which cost 3x the arithmetic at N = 72."""

    def distances(x: np.ndarray) -> np.ndarray:
        sq = np.einsum("ij,ij->i", x, x)[:, None]
        out = -2 * (x @ x.T)
        out += sq
        out += sq.T
        np.maximum(out, 0, out=out)
        np.fill_diagonal(out, 0)
        return np.sqrt(out, out=out)

    n = d.shape[0]
    dist = distances(x)
    old = None
    stress = 0.0
    for _ in range(max_iter):
        dist[dist == 0] = 1e-5
        ratio = d / dist
        b = -ratio
        b[np.arange(n), np.arange(n)] += ratio.sum(axis=1)
        x = 1.0 / n * np.dot(b, x)
        dist = distances(x)
        stress = float(((dist.ravel() - d.ravel()) ** 2).sum() / 2)
        spread = float((dist.ravel() ** 2).sum() / 2)
        # all points at one place (all dissimilarities 0) is a fixed point, where scikit-learn
        # divides 0 by 0 and runs on to max_iter
        if old is not None and (spread == 0 or (old - stress) / spread < eps):
            break
        old = stress
    return x, stress


def _mds(d: np.ndarray, n_components: int) -> tuple[np.ndarray, float]:
    """Metric MDS of the dissimilarities ``d``: SMACOF (:func:`_smacof`) started from classical
    (Torgerson) MDS, as scikit-learn's ``MDS(metric="precomputed", init="classical_mds")``
    (>= 1.8) computes it, on every scikit-learn version; centred, each axis pointing towards
    its largest-magnitude unit. Returns the embedding and its raw stress."""
    from scipy import linalg

    b = d**2
    b -= np.mean(b, axis=0)
    b -= np.mean(b, axis=1, keepdims=True)
    b *= -0.5
    w, u = linalg.eigh(b)
    # an eigenvalue that is zero but for rounding (three heads on a line: the centring's null
    # direction) is zero: its sign is noise, and a NaN start would end in NaN; a truly negative
    # one leaves no Euclidean start, as in scikit-learn
    w[np.abs(w) <= np.abs(w).max(initial=0.0) * len(w) * 8 * np.finfo(w.dtype).eps] = 0.0
    w, u = w[::-1][:n_components], u[:, ::-1][:, :n_components]
    with np.errstate(invalid="ignore"):
        start = np.sqrt(w) * u
    emb, stress = _smacof(d, start)
    emb = emb - emb.mean(axis=0)
    # a deterministic orientation: each axis points towards its largest-magnitude unit
    for j in range(emb.shape[1]):
        if emb[np.argmax(np.abs(emb[:, j])), j] < 0:
            emb[:, j] = -emb[:, j]
    return emb, stress


def _ari(a: np.ndarray, b: np.ndarray) -> float:
    """The adjusted Rand index of two labellings, by scikit-learn's pair-confusion formula in
    exact integers (so the same float), without its sparse contingency table and input checks
    (4 ms a call, ~1,500 calls in a conventions run)."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((int(ai.max()) + 1, int(bi.max()) + 1), dtype=np.int64)
    np.add.at(table, (ai.ravel(), bi.ravel()), 1)
    n = int(ai.size)
    n_c, n_k = table.sum(axis=1), table.sum(axis=0)
    squares = int((table**2).sum())
    tp = squares - n
    fp = int((table @ n_k).sum()) - squares
    fn = int((table.T @ n_c).sum()) - squares
    tn = n * n - fp - fn - squares
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


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
    embedding (SMACOF from the classical-MDS start, as scikit-learn's ``MDS`` computes it);
    k-means (scikit-learn) on the embedding; the cophenetic correlation of the tree with its
    dissimilarities; and how the leading structure relates to the sink channel: Spearman's rho
    of each MDS axis with the heads' mean sink share, and the adjusted Rand index (ARI) of each
    partition with the split "mean sink share above ``sink_threshold``". Between conventions:
    ARI of the partitions, the correlation of the two trees' cophenetic distances, and the
    correlation of the dissimilarities themselves.

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
    require_dataset(data, "cluster_heads")
    import sklearn
    from scipy.cluster.hierarchy import cophenet, fcluster, linkage
    from scipy.spatial.distance import squareform
    from sklearn.cluster import KMeans
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
        emb, st = _mds(d, n_components)
        embs[v], stress[v] = emb, st
        kmlabels[v] = np.stack(
            [KMeans(k, n_init=4, random_state=seed).fit_predict(emb) + 1 for k in ks]
        )

    # tiny problems (N <= a few hundred): one BLAS/OpenMP thread avoids oversubscription, which
    # made k-means and eigh 100x slower on a shared 2-core machine; scikit-learn's checks of
    # its own arguments (fixed here) are skipped, its checks of the data still run
    with threadpool_limits(limits=1), sklearn.config_context(skip_parameter_validation=True):
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
            [[_ari(x, y) for x, y in zip(by_view[a], by_view[b], strict=True)] for a, b in pairs]
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
                [[_ari(heavy, lab) for lab in labels[v]] for v in views],
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
