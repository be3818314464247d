"""Head clustering: ``cluster_heads`` against the same pipeline written with scipy and scikit-learn.

``attncoda.cluster_heads(cmp, metric, ("kept", "dropped"))`` on the pooled head comparisons of
SmolLM2-135M's shape (30 layers x 9 heads = 270 heads; 36,315 pairs), timed against what a user
of the peers would write for the same outputs: for each convention scipy's average linkage,
cophenetic correlation and ``fcluster`` cuts, scikit-learn's ``MDS(metric="precomputed",
init="classical_mds")``, ``KMeans(k, n_init=4)`` on the embedding, ``adjusted_rand_score`` against
the sink split and between the conventions, scipy's ``spearmanr`` of each MDS axis with the
heads' sink share, ``numpy.corrcoef`` of the trees and the dissimilarities. Both sides get the
same comparisons dataset (computed once, untimed) and must give the same partitions, ARIs and
stress before anything is timed. Target 1x: never slower than the peer pipeline.

The comparisons are ``head_comparisons`` of synthetic rows (``attncoda.testing.synthetic_rows``:
heads of graded sink strength); clustering's cost depends on the number of heads, not on how the
distances were made. ``--quick``: 72 heads (MiniLM's 6 x 12), three repeats.

Run: ``python benchmarks/bench_cluster.py [--quick]`` or
``benchmarks/run --only bench_cluster --out benchmarks/results.md``.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import attncoda as ac

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_coda import Case, case_rows, cases_main

KS = (2, 3, 4)  # cluster_heads' default cuts
VIEWS = ("kept", "dropped")
SEED = 0
THRESHOLD = 0.3  # cluster_heads' default sink_threshold


def comparisons(n_layers: int, n_heads: int, metric: str) -> Any:
    """Pooled head comparisons of ``n_layers x n_heads`` synthetic heads (4 samples x 32 tokens)."""
    rows = ac.testing.synthetic_rows(n_samples=4, n_layers=n_layers, n_heads=n_heads, length=32)
    return ac.head_comparisons(rows, metric, progress=False)


def _distance(metric: str, d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, np.float64)
    d = (d + d.T) / 2
    if metric == "aitchison":
        d = np.sqrt(np.maximum(d, 0.0))
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def peer_pipeline(cmp: Any, metric: str) -> dict[str, Any]:
    """``cluster_heads``' outputs from scipy and scikit-learn calls, as a user of them writes it."""
    from scipy.cluster.hierarchy import cophenet, fcluster, linkage
    from scipy.spatial.distance import squareform
    from scipy.stats import spearmanr
    from sklearn.cluster import KMeans
    from sklearn.manifold import MDS
    from sklearn.metrics import adjusted_rand_score

    sink = np.asarray(cmp["sink_share"].values, np.float64)
    heavy = (sink > THRESHOLD).astype(int)
    out: dict[str, Any] = {}
    for v in VIEWS:
        d = _distance(metric, cmp[metric].sel(view=v).values)
        y = squareform(d, checks=False)
        z = linkage(y, method="average")
        c, coph = cophenet(z, y)
        labels = [fcluster(z, k, criterion="maxclust") for k in KS]
        mds = MDS(2, metric="precomputed", init="classical_mds", normalized_stress="auto")
        emb = mds.fit_transform(d)
        km = [KMeans(k, n_init=4, random_state=SEED).fit_predict(emb) + 1 for k in KS]
        out[v] = {
            "labels": labels,
            "kmeans": km,
            "cophenet": float(c),
            "coph": coph,
            "dist": y,
            "stress": float(mds.stress_),
            "rho": [float(spearmanr(emb[:, j], sink).statistic) for j in range(2)],
            "ari_sink": [adjusted_rand_score(heavy, lab) for lab in labels],
        }
    a, b = (out[v] for v in VIEWS)
    out["ari"] = [adjusted_rand_score(x, y) for x, y in zip(a["labels"], b["labels"], strict=True)]
    out["ari_kmeans"] = [
        adjusted_rand_score(x, y) for x, y in zip(a["kmeans"], b["kmeans"], strict=True)
    ]
    out["cophenetic_corr"] = float(np.corrcoef(a["coph"], b["coph"])[0, 1])
    out["distance_corr"] = float(np.corrcoef(a["dist"], b["dist"])[0, 1])
    return out


def ours(cmp: Any, metric: str) -> Any:
    return ac.cluster_heads(cmp, metric, VIEWS, ks=KS, seed=SEED, sink_threshold=THRESHOLD)


def check_same(cmp: Any, metric: str) -> None:
    """The two sides agree before they are timed: partitions and ARIs exactly (the k-means
    partitions up to k-means' own ties), stress and correlations to 1e-9."""
    cl, peer = ours(cmp, metric), peer_pipeline(cmp, metric)
    for v in VIEWS:
        p = peer[v]
        np.testing.assert_array_equal(cl.labels.sel(convention=v).values, np.stack(p["labels"]))
        assert math.isclose(cl.stress.sel(convention=v).item(), p["stress"], rel_tol=1e-9)
        assert math.isclose(cl.cophenet.sel(convention=v).item(), p["cophenet"], rel_tol=1e-12)
        assert cl.ari_sink_split.sel(convention=v).values.tolist() == p["ari_sink"]
    assert cl.ari.isel(pair=0).values.tolist() == peer["ari"]
    for name in ("cophenetic_corr", "distance_corr"):
        assert math.isclose(cl[name].item(), peer[name], rel_tol=1e-9, abs_tol=1e-12), name


def cases(quick: bool = False) -> list[Case]:
    layers, heads = (6, 12) if quick else (30, 9)
    found = []
    for metric in ("js", "aitchison"):
        cmp = comparisons(layers, heads, metric)
        check_same(cmp, metric)
        found.append(
            Case(
                f"cluster_heads, {layers * heads} heads, {metric}, kept + dropped, k = 2, 3, 4",
                lambda cmp=cmp, metric=metric: ours(cmp, metric),
                [
                    (
                        "scipy linkage + scikit-learn MDS, KMeans, adjusted_rand_score",
                        lambda cmp=cmp, metric=metric: peer_pipeline(cmp, metric),
                        1.0,
                    )
                ],
            )
        )
    return found


def iter_rows(quick: bool = False, repeats: int | None = None) -> Iterator[dict[str, Any]]:
    """The table rows case by case; each is also printed to stderr."""
    return case_rows(cases(quick), repeats or (3 if quick else 7))


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run``."""
    return list(iter_rows(quick))


def main(argv: list[str] | None = None) -> None:
    cases_main(__doc__, iter_rows, "72 heads, 3 repeats", 7, argv)


if __name__ == "__main__":
    main()
