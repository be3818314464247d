"""The analysing half of the conventions study: from the stored cells to result tables.

Every number here is computed from the cells of :mod:`.protocol` (per-window comparisons and
entropy attributions), so a table can be rebuilt at any time from whatever cells are complete.

Intervals (all 95%, percentile):

- **flip rates**: :func:`attncoda.flip_rates`'s bootstrap over windows, pooled across the texts
  (the core resamples all windows together; it has no strata), plus per-text rates and intervals
  to show the spread between texts;
- **clustering statistics** and **entropy fractions**: bootstrap over windows *stratified by
  text* (each replicate resamples each text's windows within that text), so every replicate
  keeps the texts' mix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

import attncoda as ac

METRICS = ac.METRICS
PAIRS = (("kept", "dropped"), ("kept", "sink"))
CLUSTER_METRICS = ("js", "aitchison")
#: The metrics the paper's abstract names (its flip range is quoted for these).
CLAIM_METRICS = ("cosine", "js", "entropy")
PUBLISHED_FLIPS = (0.17, 0.47)
#: The paper's entropy-collapse split across training (Pythia 70M, 1B, 1.4B): sink share of the drop.
PUBLISHED_ENTROPY = {"70M": 0.30, "1B": 0.95, "1.4B": 0.79}
#: The clustering artifact: the kept-view MDS-1 follows the sink share (|rho| >= RHO) and the
#: kept and dropped top-level partitions disagree (ARI at k=2 < ARI).
ARTIFACT_RHO = 0.5
ARTIFACT_ARI = 0.5


def stratified_draws(strata: Sequence[str], n_boot: int, seed: int = 0) -> np.ndarray:
    """Bootstrap index draws ``(n_boot, n)``, each resampling every stratum within itself.

    Examples
    --------
    >>> d = stratified_draws(["a", "a", "b"], 4)
    >>> d.shape, bool(((d[:, :2] < 2) & (d[:, 2:] == 2)).all())
    ((4, 3), True)
    """
    labels = np.asarray(strata)
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(labels)), np.int64)
    for s in dict.fromkeys(labels.tolist()):
        idx = np.flatnonzero(labels == s)
        cols = idx  # the stratum keeps its positions, so each replicate keeps the texts' mix
        out[:, cols] = idx[rng.integers(0, len(idx), (n_boot, len(idx)))]
    return out


def _ci(values: np.ndarray) -> tuple[float, float]:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not len(v):
        return (np.nan, np.nan)
    lo, hi = np.quantile(v, [0.025, 0.975])
    return float(lo), float(hi)


# ------------------------------------------------------------------------------------ flips


def flips(cmp: xr.Dataset, n_boot: int, key: dict[str, Any]) -> pd.DataFrame:
    """Flip rates over all windows (pooled texts, per layer too) and per text."""
    out = []
    fr = ac.flip_rates(cmp, METRICS, between=PAIRS, n_boot=n_boot, seed=0)
    cols = ["flip_rate", "ci_low", "ci_high", "flips", "n_triples"]
    out.append(fr[cols].to_dataframe().reset_index().assign(**key, text="all"))
    texts = np.asarray(cmp["text"].values)
    if len(set(texts.tolist())) > 1:
        for text in dict.fromkeys(texts.tolist()):
            sub = cmp.isel(sample=np.flatnonzero(texts == text))
            ft = ac.flip_rates(
                sub, METRICS, between=(("kept", "dropped"),), by_layer=False, n_boot=n_boot
            )
            out.append(ft[cols].to_dataframe().reset_index().assign(**key, text=text))
    return pd.concat(out, ignore_index=True)


# ------------------------------------------------------------------------------------ clustering


def _slim(cmp: xr.Dataset, metric: str) -> xr.Dataset:
    keep = [metric, "n_rows", "sink_share", "content_entropy"]
    return cmp[[v for v in keep if v in cmp.data_vars]]


def clustering(
    cmp: xr.Dataset, key: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, xr.Dataset]]:
    """Agreement and structure tables of the point estimates (all windows pooled)."""
    clus, struct, fits = [], [], {}
    for m in CLUSTER_METRICS:
        cl = ac.cluster_heads(_slim(cmp, m), m, ["kept", "dropped", "sink"], ks=(2, 3, 4))
        fits[m] = cl
        for pair in cl.pair.values:
            for k in cl.k.values:
                clus.append(
                    {
                        **key,
                        "metric": m,
                        "pair": str(pair),
                        "k": int(k),
                        "ari": float(cl.ari.sel(pair=pair, k=k)),
                        "ari_kmeans": float(cl.ari_kmeans.sel(pair=pair, k=k)),
                        "cophenetic_corr": float(cl.cophenetic_corr.sel(pair=pair)),
                        "distance_corr": float(cl.distance_corr.sel(pair=pair)),
                    }
                )
        for conv in cl.convention.values:
            struct.append(
                {
                    **key,
                    "metric": m,
                    "convention": str(conv),
                    "mds1_sink_rho": float(cl.axis_sink_rho.sel(convention=conv, component=1)),
                    "mds2_sink_rho": float(cl.axis_sink_rho.sel(convention=conv, component=2)),
                    "ari_sink_split_k2": float(cl.ari_sink_split.sel(convention=conv, k=2)),
                    "cophenet_fit": float(cl.cophenet.sel(convention=conv)),
                    "mds_stress": float(cl.stress.sel(convention=conv)),
                }
            )
    return pd.DataFrame(clus), pd.DataFrame(struct), fits


def _artifact_stats(cmp: xr.Dataset, with_dropped: bool = True) -> dict[str, float]:
    conventions = ["kept", "dropped"]
    cl = ac.cluster_heads(cmp, "js", conventions, ks=(2, 4))
    out = {"rho_kept": abs(float(cl.axis_sink_rho.sel(convention="kept", component=1)))}
    if with_dropped:
        out["rho_dropped"] = abs(float(cl.axis_sink_rho.sel(convention="dropped", component=1)))
        out["ari_k2"] = float(cl.ari.sel(pair="kept/dropped", k=2))
        out["ari_k4"] = float(cl.ari.sel(pair="kept/dropped", k=4))
        out["cophenetic_corr"] = float(cl.cophenetic_corr.sel(pair="kept/dropped"))
    return out


def artifact(
    cmp: xr.Dataset, n_boot: int, key: dict[str, Any], *, with_dropped: bool = True
) -> pd.DataFrame:
    """The clustering-artifact statistics of Jensen-Shannon + MDS (Clark et al.'s pipeline), with
    bootstrap intervals over windows stratified by text: |rho(MDS-1, sink share)| under ``kept``
    and ``dropped``, ARI of the kept and dropped partitions (k = 2, 4), cophenetic correlation."""
    slim = _slim(cmp, "js")
    point = _artifact_stats(slim, with_dropped)
    draws = stratified_draws(np.asarray(cmp["text"].values), n_boot, seed=1)
    boots: dict[str, list[float]] = {k: [] for k in point}
    for idx in draws:
        b = _artifact_stats(slim.isel(sample=idx), with_dropped)
        for k in point:
            boots[k].append(b[k])
    rows = []
    for stat, value in point.items():
        lo, hi = _ci(np.asarray(boots[stat]))
        rows.append(
            {**key, "metric": "js", "stat": stat, "value": value, "ci_low": lo, "ci_high": hi}
        )
    return pd.DataFrame(rows).assign(n_boot=n_boot, windows=cmp.sizes["sample"])


def artifact_verdict(a: pd.DataFrame) -> tuple[str, str]:
    """Does the clustering artifact appear? From one ``artifact`` table (one model and sink)."""
    s = a.set_index("stat")
    rho = s.loc["rho_kept"]
    if "ari_k2" not in s.index:
        if rho.ci_low >= ARTIFACT_RHO:
            return "MDS-1 follows the sink share", f"|rho| CI above {ARTIFACT_RHO}"
        if rho.ci_high < ARTIFACT_RHO:
            return "MDS-1 does not follow the sink share", f"|rho| CI below {ARTIFACT_RHO}"
        return "unclear", f"|rho| CI straddles {ARTIFACT_RHO}"
    ari = s.loc["ari_k2"]
    if rho.ci_low >= ARTIFACT_RHO and ari.ci_high < ARTIFACT_ARI:
        return "appears", (
            f"kept MDS-1 follows the sink share (|rho| CI >= {ARTIFACT_RHO}) and dropping the "
            f"sink changes the top split (ARI k=2 CI < {ARTIFACT_ARI})"
        )
    if rho.ci_high < ARTIFACT_RHO or ari.ci_low >= ARTIFACT_ARI:
        return "does not appear", (
            f"|rho| CI < {ARTIFACT_RHO}"
            if rho.ci_high < ARTIFACT_RHO
            else f"the top split survives dropping the sink (ARI k=2 CI >= {ARTIFACT_ARI})"
        )
    return "unclear", "an interval straddles its threshold"


# ------------------------------------------------------------------------------------ entropy


def _attribution(cells: xr.Dataset, prefix: str) -> xr.Dataset:
    names = ("sink", "content", "total", "entropy_a", "entropy_b", "n_rows")
    ds = xr.Dataset({v: cells[f"{prefix}_{v}"] for v in names})
    return ds.rename({f"{prefix}_transition": "transition"})


def _sums(att: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per-window row-weighted sums of the sink part and of the total, over transitions, heads."""
    w = att["n_rows"].astype(float)
    dims = [d for d in att["sink"].dims if d != "sample"]
    sink = (att["sink"].fillna(0) * w).sum(dims).transpose("sample").values
    total = (att["total"].fillna(0) * w).sum(dims).transpose("sample").values
    return np.asarray(sink, float), np.asarray(total, float)


def entropy(
    cells: xr.Dataset, n_boot: int, key: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """Sink fractions of the entropy change across depth, first -> last and pooled over
    consecutive layers, with intervals stratified by text; and the per-transition table."""
    texts = np.asarray(cells["text"].values)
    draws = stratified_draws(texts, n_boot, seed=2)
    frac_rows, trans_rows, boots = [], [], {}
    for scope, prefix in (("first->last", "ends"), ("consecutive, pooled", "att")):
        att = _attribution(cells, prefix)
        s, t = _sums(att)
        reps = np.array([s[i].sum() / t[i].sum() for i in draws])
        boots[scope] = reps
        # rows of each window (over heads) in one transition: t / rows is the window's mean
        # change summed over transitions, the denominator of the fraction; when its interval
        # holds 0 the fraction is a ratio to noise and the claim table says so
        rows_w = att["n_rows"].isel(transition=0).sum("head").transpose("sample").values
        rows_w = np.asarray(rows_w, float)
        n_rows = int(rows_w.sum())
        t_lo, t_hi = _ci(np.array([t[i].sum() / rows_w[i].sum() for i in draws]))
        for text in ["all", *dict.fromkeys(texts.tolist())]:
            sel = np.ones(len(texts), bool) if text == "all" else texts == text
            frac = float(s[sel].sum() / t[sel].sum())
            if text == "all":
                lo, hi = _ci(reps)
            else:
                sub = stratified_draws(texts[sel], n_boot, seed=3)
                ss, tt = s[sel], t[sel]
                lo, hi = _ci(np.array([ss[i].sum() / tt[i].sum() for i in sub]))
            sub = att.isel(sample=np.flatnonzero(sel))
            w = sub["n_rows"].astype(float)
            other = [d for d in sub["total"].dims if d != "transition"]
            # mean change per transition, summed over transitions (telescopes to first -> last)
            mean_total = float(((sub["total"].fillna(0) * w).sum(other) / w.sum(other)).sum())
            frac_rows.append(
                {
                    **key,
                    "scope": scope,
                    "text": text,
                    "sink_fraction": frac,
                    "ci_low": lo,
                    "ci_high": hi,
                    "mean_total_change": mean_total,
                    "total_ci_low": t_lo if text == "all" else np.nan,
                    "total_ci_high": t_hi if text == "all" else np.nan,
                    "windows": int(sel.sum()),
                    "rows_per_transition": n_rows
                    if text == "all"
                    else int(w.isel(transition=0).sum()),
                }
            )
        w = att["n_rows"].astype(float)
        dims = [d for d in att["sink"].dims if d != "transition"]
        mean = {
            v: (att[v].fillna(0) * w).sum(dims) / w.sum(dims)
            for v in ("sink", "content", "total", "entropy_a", "entropy_b")
        }
        for i, lab in enumerate(att["transition"].values):
            row = {v: float(np.atleast_1d(mean[v].values)[i]) for v in mean}
            row["sink_fraction"] = row["sink"] / row["total"] if row["total"] else np.nan
            trans_rows.append(
                {
                    **key,
                    "scope": "first->last" if prefix == "ends" else "consecutive",
                    "transition": str(lab),
                    **row,
                }
            )
    return pd.DataFrame(frac_rows), pd.DataFrame(trans_rows), boots


def scale_difference(
    small: np.ndarray, large: np.ndarray, small_point: float, large_point: float
) -> tuple[float, float, float]:
    """Difference large - small of two sink fractions; the interval pairs the two models'
    replicates drawn with the same seed (the same window indices of each text; the windows'
    tokens differ between tokenizers only at their cuts)."""
    n = min(len(small), len(large))
    lo, hi = _ci(large[:n] - small[:n])
    return large_point - small_point, lo, hi
