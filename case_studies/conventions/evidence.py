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

from .._study import fixed, stratified_draws, two_stage_draws

METRICS = ac.METRICS
PAIRS = (("kept", "dropped"), ("kept", "sink"))
CLUSTER_METRICS = ("js", "aitchison")
#: The metrics the paper's abstract names (its flip range is quoted for these).
CLAIM_METRICS = ("cosine", "js", "entropy")
PUBLISHED_FLIPS = (0.17, 0.47)
#: The paper's entropy-collapse split across training (models of 70M, 1B and 1.4B parameters,
#: not named by the abstract; Pythia is our guess from the sizes): sink share of the drop.
PUBLISHED_ENTROPY = {"70M": 0.30, "1B": 0.95, "1.4B": 0.79}
#: The clustering artifact: the kept-view MDS-1 follows the sink share (|rho| >= RHO) and the
#: kept and dropped top-level partitions disagree (ARI at k=2 < ARI).
ARTIFACT_RHO = 0.5
ARTIFACT_ARI = 0.5


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


# ------------------------------------------------------------------------------------ claims
#
# The claim table's numbers come from the committed per-text cells (``results/cells/``), so
# every one of them, intervals included, can be recomputed from the repository alone. Units:
#
# - flip rates and the clustering artifact: **texts** (cluster bootstrap; the four texts drawn
#   with replacement, every one of the 35 distinct draws weighted by its multinomial
#   probability, so the interval is exact for that bootstrap and has no seed). Windows within
#   a text are not redrawn: their own bootstrap (``flip_rates.csv``) moves a rate by about one
#   point, the texts by several;
# - entropy shares and changes: **texts, then windows within each drawn text** (two-stage), from
#   the per-window sink and total parts stored beside the matrices.

#: The views the claim cells keep (the flip claim compares these two).
CLAIM_VIEWS = ("kept", "dropped")
#: How the claim table names each interval's resampling unit.
UNITS = {
    "texts": "texts (cluster bootstrap: every draw of the texts, exact)",
    "two-stage": "texts, then windows within each text (two-stage bootstrap)",
    "pair runs": "runs of consecutive pairs (one text)",
}
#: Two-stage bootstrap replicates of the entropy claims (scalars per window: cheap).
N_BOOT_TWO_STAGE = 2000


def text_cells(cells: xr.Dataset, attrs: dict[str, Any] | None = None) -> xr.Dataset:
    """What the claim table needs of one ``(model, sink)``, small enough to commit: per text,
    the row-weighted mean head-vs-head matrices of :data:`CLAIM_METRICS` under ``kept`` and
    ``dropped`` (exact merges of the per-window means) with their row counts and each head's
    sink share; per window, the row-weighted sink part and total of the entropy change (first
    -> last and consecutive layers) and its rows.

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_samples=4, n_layers=2, n_heads=2, length=6)
    >>> cmp = ac.head_comparisons(ds, ["cosine", "js", "entropy"], per_sample=True)
    >>> from case_studies.conventions.protocol import window_attribution
    >>> cells = xr.merge([cmp, window_attribution(ds, None)])
    >>> cells = cells.assign_coords(text=("sample", ["a", "a", "b", "b"]))
    >>> tc = text_cells(cells)
    >>> tc.sample.values.tolist(), tc.sizes["window"]
    (['a', 'b'], 4)
    """
    from .sinks import merge_samples

    texts = np.asarray(cells["text"].values)
    names = list(dict.fromkeys(texts.tolist()))
    parent = np.array([names.index(t) for t in texts])
    slim = cells[[*CLAIM_METRICS, "n_rows", "sink_share"]].sel(view=list(CLAIM_VIEWS))
    out = merge_samples(slim, parent, np.array(names))
    out = out.drop_vars([c for c in ("text",) if c in out.coords])
    for scope, prefix in (("ends", "ends"), ("att", "att")):
        s, t = _sums(_attribution(cells, prefix))
        out[f"{scope}_sink"] = ("window", s)
        out[f"{scope}_total"] = ("window", t)
    rows = cells["att_n_rows"].isel(att_transition=0).sum("head").transpose("sample").values
    out["window_rows"] = ("window", np.asarray(rows, np.float64))
    out = out.assign_coords(
        window=np.asarray(cells["sample"].values), window_text=("window", texts)
    )
    out.attrs = {"attncoda_kind": cells.attrs.get("attncoda_kind", "attncoda.head_comparisons")}
    out.attrs.update(attrs or {})
    return out


def text_draws(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every distinct bootstrap draw of ``n`` clusters (counts per cluster) and its probability.

    Examples
    --------
    >>> counts, p = text_draws(4)
    >>> counts.shape, round(float(p.sum()), 12), counts.sum(axis=1).tolist() == [4] * 35
    ((35, 4), 1.0, True)
    """
    from itertools import combinations_with_replacement
    from math import factorial, prod

    rows = []
    for combo in combinations_with_replacement(range(n), n):
        rows.append(np.bincount(combo, minlength=n))
    counts = np.array(rows, np.int64)
    p = np.array([factorial(n) / prod(factorial(int(c)) for c in r) / n**n for r in counts])
    return counts, p


def weighted_interval(values: np.ndarray, p: np.ndarray, ci: float = 0.95) -> tuple[float, float]:
    """Percentile interval of a discrete distribution (``values`` with probabilities ``p``).

    Examples
    --------
    >>> weighted_interval(np.array([3.0, 1.0, 2.0]), np.array([0.01, 0.01, 0.98]))
    (2.0, 2.0)
    >>> weighted_interval(np.array([3.0, 1.0, 2.0]), np.array([0.03, 0.03, 0.94]))
    (1.0, 3.0)
    >>> weighted_interval(np.array([3.0, 1.0, 2.0]), np.array([0.1, 0.0, 0.9]))
    (2.0, 3.0)
    """
    v = np.asarray(values, float)
    w = np.asarray(p, float)
    ok = np.isfinite(v)
    v, w = v[ok], w[ok] / w[ok].sum()
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    lo = v[np.searchsorted(cum, (1 - ci) / 2 - 1e-12, side="right")]
    hi = v[min(np.searchsorted(cum, (1 + ci) / 2 - 1e-12, side="left"), len(v) - 1)]
    return float(lo), float(hi)


def _by_counts(tc: xr.Dataset, counts: np.ndarray) -> xr.Dataset:
    """The per-text cells with text ``i`` repeated ``counts[i]`` times (a bootstrap draw): the
    core pools samples by their row counts, so this is the draw's pooled comparison."""
    idx = np.repeat(np.arange(len(counts)), counts)
    return tc.isel(sample=idx)


def claim_evidence(tc: xr.Dataset, key: dict[str, Any]) -> pd.DataFrame:
    """The claim statistics of one ``(model, sink)`` from its per-text cells: pooled value, one
    value per text and a 95% interval whose resampling unit is named in ``unit``.

    Rows: ``flips`` (one per :data:`CLAIM_METRICS`, kept vs dropped), ``artifact`` (|rho| of the
    kept MDS-1 with the sink share, ARI of the kept and dropped k=2 partitions), ``entropy``
    (sink share of the change, and the mean change, first -> last and consecutive layers)."""
    texts = [str(t) for t in tc["sample"].values]
    counts, p = text_draws(len(texts))
    pooled = tc.isel(sample=np.arange(len(texts)))
    single = [tc.isel(sample=[i]) for i in range(len(texts))]
    rows: list[dict[str, Any]] = []

    def add(
        claim: str,
        stat: str,
        value: float,
        per_text: list[float],
        lo: float,
        hi: float,
        unit: str,
        n_boot: int,
    ) -> None:
        rows.append(
            {
                **key,
                "claim": claim,
                "stat": stat,
                "value": value,
                **{f"text_{t}": v for t, v in zip(texts, per_text, strict=True)},
                "ci_low": lo,
                "ci_high": hi,
                "unit": unit,
                "n_boot": n_boot,
            }
        )

    def rate(ds: xr.Dataset, metric: str) -> float:
        fr = ac.flip_rates(ds, [metric], by_layer=False, n_boot=0)
        return float(fr.flip_rate.sel(metric=metric, pair="kept/dropped", scope="all"))

    for metric in CLAIM_METRICS:
        one = tc[[metric, "n_rows"]]  # resample just what the rate reads
        reps = np.array([rate(_by_counts(one, c), metric) for c in counts])
        lo, hi = weighted_interval(reps, p)
        add(
            "flips",
            metric,
            rate(pooled, metric),
            [rate(s, metric) for s in single],
            lo,
            hi,
            "texts",
            len(counts),
        )
    slim = _slim(tc, "js")
    point = _artifact_stats(slim)
    per = [_artifact_stats(_slim(s, "js")) for s in single]
    reps_a = [_artifact_stats(_by_counts(slim, c)) for c in counts]
    for stat in ("rho_kept", "ari_k2"):
        lo, hi = weighted_interval(np.array([r[stat] for r in reps_a]), p)
        add("artifact", stat, point[stat], [r[stat] for r in per], lo, hi, "texts", len(counts))
    wtext = np.asarray(tc["window_text"].values)
    draws = two_stage_draws(wtext, N_BOOT_TWO_STAGE)
    rows_w = tc["window_rows"].values
    for scope, prefix in (("first->last", "ends"), ("consecutive, pooled", "att")):
        s, t = tc[f"{prefix}_sink"].values, tc[f"{prefix}_total"].values
        frac = np.array([s[i].sum() / t[i].sum() for i in draws])
        lo, hi = _ci(frac)
        per_f = [float(s[wtext == x].sum() / t[wtext == x].sum()) for x in texts]
        add(
            "entropy",
            f"sink share, {scope}",
            float(s.sum() / t.sum()),
            per_f,
            lo,
            hi,
            "two-stage",
            N_BOOT_TWO_STAGE,
        )
        if prefix == "ends":
            change = np.array([t[i].sum() / rows_w[i].sum() for i in draws])
            lo, hi = _ci(change)
            per_c = [float(t[wtext == x].sum() / rows_w[wtext == x].sum()) for x in texts]
            add(
                "entropy",
                "mean change",
                float(t.sum() / rows_w.sum()),
                per_c,
                lo,
                hi,
                "two-stage",
                N_BOOT_TWO_STAGE,
            )
            rows[-1]["seeds_holding_0"] = seeds_holding_0(t, rows_w, wtext)
            rows[-1]["n_seeds"] = N_SEEDS
    return pd.DataFrame(rows)


#: Bootstrap seeds over which a verdict on whether an interval holds 0 is checked: an interval
#: whose end lies at 0 within resampling error holds 0 under some seeds and not others.
N_SEEDS = 40


def seeds_holding_0(total: np.ndarray, rows: np.ndarray, wtext: np.ndarray) -> int:
    """Of :data:`N_SEEDS` two-stage bootstraps (seeds ``4 .. 4 + N_SEEDS - 1``; seed 4 is the
    claim table's), how many give a mean-change interval that holds 0.

    Examples
    --------
    >>> wt = np.array(["a"] * 4 + ["b"] * 4)
    >>> seeds_holding_0(np.array([1.0, -1, 2, -2, 1, -1, 2, -2]), np.ones(8), wt)
    40
    >>> seeds_holding_0(np.arange(1.0, 9.0), np.ones(8), wt)
    0
    """
    n = 0
    for seed in range(4, 4 + N_SEEDS):
        draws = two_stage_draws(wtext, N_BOOT_TWO_STAGE, seed=seed)
        lo, hi = _ci(np.array([total[i].sum() / rows[i].sum() for i in draws]))
        n += bool(lo <= 0 <= hi)
    return n


def scale_evidence(small: xr.Dataset, large: xr.Dataset, key: dict[str, Any]) -> pd.DataFrame:
    """Difference large - small of the entropy sink shares of two models measured on the same
    texts and windows; the two-stage draws are the same for both (paired)."""
    wtext = np.asarray(small["window_text"].values)
    if wtext.tolist() != np.asarray(large["window_text"].values).tolist():
        raise ac.InputError("the two models' cells hold different windows; rerun both")
    texts = list(dict.fromkeys(wtext.tolist()))
    draws = two_stage_draws(wtext, N_BOOT_TWO_STAGE)
    rows = []
    for scope, prefix in (("first->last", "ends"), ("consecutive, pooled", "att")):
        ss, ts = small[f"{prefix}_sink"].values, small[f"{prefix}_total"].values
        sl, tl = large[f"{prefix}_sink"].values, large[f"{prefix}_total"].values
        diff = np.array([sl[i].sum() / tl[i].sum() - ss[i].sum() / ts[i].sum() for i in draws])
        lo, hi = _ci(diff)
        per = [
            float(
                sl[wtext == x].sum() / tl[wtext == x].sum()
                - ss[wtext == x].sum() / ts[wtext == x].sum()
            )
            for x in texts
        ]
        rows.append(
            {
                **key,
                "claim": "scale",
                "stat": f"sink share difference, {scope}",
                "value": float(sl.sum() / tl.sum() - ss.sum() / ts.sum()),
                **{f"text_{t}": v for t, v in zip(texts, per, strict=True)},
                "ci_low": lo,
                "ci_high": hi,
                "unit": "two-stage",
                "n_boot": N_BOOT_TWO_STAGE,
            }
        )
    return pd.DataFrame(rows)


def flip_verdict(value: float, per_text: Sequence[float], lo: float, hi: float) -> tuple[str, str]:
    """Where a flip rate sits against the paper's range, which spans ten unnamed models: inside
    it with every text and the interval inside is *consistent with* it (not a reproduction of
    any one model's number); every text and the interval outside on one side is *outside the
    published range*; texts or interval on both sides of an edge is *borderline*.

    Examples
    --------
    >>> flip_verdict(0.27, [0.26, 0.29], 0.25, 0.3)[0]
    'consistent with'
    >>> flip_verdict(0.16, [0.15, 0.18], 0.15, 0.18)[0]
    'borderline'
    >>> flip_verdict(0.10, [0.09, 0.11], 0.08, 0.12)[0]
    'outside the published range'
    """
    a, b = PUBLISHED_FLIPS
    points = [value, *per_text, lo, hi]
    inside = [a <= x <= b for x in points]
    if all(inside):
        return "consistent with", "the rate, every text and the interval lie inside the range"
    if not any(inside) and (all(x < a for x in points) or all(x > b for x in points)):
        return "outside the published range", "the rate, every text and the interval lie outside"
    edge = a if min(points) < a else b
    return "borderline", f"texts or interval straddle the range's edge at {fixed(100 * edge, 0)}%"
