"""Analysis under named conventions: metrics, verdict flips, clustering, entropy attribution.

Every metric is checked against a direct per-row, per-pair computation (scipy where it has the
metric) on small float64 inputs; flip counting against hand-built cases and a brute-force loop;
attribution for exact additivity; clustering agreement for the case where the conventions
coincide (no sink mass).
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import xarray as xr
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy as scipy_entropy

import attncoda as ac
from attncoda._profiles import _row_summaries
from conftest import has_torch

_needs_torch = pytest.mark.skipif(not has_torch, reason="torch")
# numpy; torch matrix products; and device= (products and the js/tv passes in torch)
BACKENDS = [
    pytest.param({"backend": "auto"}, id="auto"),
    pytest.param({"backend": "numpy"}, id="numpy"),
    pytest.param({"backend": "torch"}, id="torch", marks=_needs_torch),
    pytest.param({"device": "cpu"}, id="device", marks=_needs_torch),
]


# ------------------------------------------------------------------------------------ helpers


def rows_dataset(z: np.ndarray, sink_index=None, layers=None, heads=None) -> xr.Dataset:
    """A rows dataset in the capture schema, keeping ``z``'s dtype (float64 for tight checks)."""
    n_s, n_l, n_h, n_q, n_k = z.shape
    return xr.Dataset(
        {"log_attn": (ac.DIMS, z)},
        coords={
            "sample": np.arange(n_s),
            "layer": np.arange(n_l) if layers is None else layers,
            "head": np.arange(n_h) if heads is None else heads,
            "query": np.arange(n_q),
            "key": np.arange(n_k),
            "sink_index": ("sample", np.zeros(n_s, int) if sink_index is None else sink_index),
        },
        attrs={"model_id": "test"},
    )


def log_softmax(z: np.ndarray) -> np.ndarray:
    m = np.max(z, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        lse = np.log(np.exp(z - m).sum(-1, keepdims=True)) + m
    return np.where(np.isfinite(z), z - np.where(np.isfinite(lse), lse, 0.0), -np.inf)


def causal_rows(rng, n_s=2, n_l=2, n_h=3, t=7, pad=(0, 2), sink_scale=3.0) -> xr.Dataset:
    """Causal float64 rows; sample ``i`` is left-padded by ``pad[i]`` keys (its sink moves)."""
    z = rng.standard_normal((n_s, n_l, n_h, t, t)) * 1.5
    q = np.arange(t)[:, None]
    k = np.arange(t)[None, :]
    sink = np.array(pad[:n_s])
    for s in range(n_s):
        z[s, ..., sink[s]] += sink_scale * rng.standard_normal((n_l, n_h, 1))
        vis = (k <= q) & (k >= sink[s])
        z[s] = np.where(vis, z[s], -np.inf)
    return rows_dataset(log_softmax(z), sink_index=sink)


def reference(ds: xr.Dataset, sink=None) -> tuple[dict, int]:
    """Mean per-row dissimilarities by explicit loops over rows and pairs."""
    la = ds.log_attn.transpose(*ac.DIMS).values.astype(np.float64)
    n_s, n_l, n_h, n_q, n_k = la.shape
    n = n_l * n_h
    sinks = ds.sink_index.values if sink is None else np.broadcast_to(sink, (n_s,))
    acc: dict = {}
    rows = 0
    for s, q in itertools.product(range(n_s), range(n_q)):
        z = la[s, :, :, q].reshape(n, n_k)
        vis = np.isfinite(z[0])
        si = int(sinks[s])
        if not vis[si] or vis.sum() < 2:
            continue
        rows += 1
        x = np.exp(z[:, vis])
        x /= x.sum(1, keepdims=True)
        j = list(np.flatnonzero(vis)).index(si)
        share = x[:, j]
        c = np.delete(x, j, axis=1)
        c = c / c.sum(1, keepdims=True)
        lx = np.log(x)
        clr = lx - lx.mean(1, keepdims=True)
        lc = np.log(c)
        clrc = lc - lc.mean(1, keepdims=True)
        nc = c.shape[1]
        bal = np.sqrt(nc / (nc + 1)) * (np.log(share) - np.log(np.delete(x, j, axis=1)).mean(1))
        v = np.stack([share, 1 - share], 1)
        for a, b in itertools.product(range(n), range(n)):

            def add(metric, view, val, a=a, b=b):
                acc.setdefault((metric, view), np.zeros((n, n)))[a, b] += val

            add("aitchison", "kept", ((clr[a] - clr[b]) ** 2).sum())
            add("aitchison", "dropped", ((clrc[a] - clrc[b]) ** 2).sum())
            add("aitchison", "sink", (bal[a] - bal[b]) ** 2)
            for view, rows_ in (("kept", x), ("dropped", c), ("sink", v)):
                xa, xb = rows_[a], rows_[b]
                add("cosine", view, 1 - xa @ xb / np.linalg.norm(xa) / np.linalg.norm(xb))
                add("js", view, jensenshannon(xa, xb) ** 2)
                add("tv", view, 0.5 * np.abs(xa - xb).sum())
                add("kl", view, scipy_entropy(xa, xb))
                add("entropy", view, abs(scipy_entropy(xa) - scipy_entropy(xb)))
    return {key: val / rows for key, val in acc.items()}, rows


@pytest.fixture(scope="module")
def causal():
    return causal_rows(np.random.default_rng(7))


# ------------------------------------------------------------------------------------ metrics


@pytest.mark.parametrize("options", BACKENDS)
def test_every_metric_and_view_matches_a_direct_computation(causal, options):
    ref, n_rows = reference(causal)
    cmp = ac.head_comparisons(causal, block_elements=64, **options)
    assert int(cmp.n_rows) == n_rows
    for (metric, view), want in ref.items():
        got = cmp[metric].sel(view=view).values
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=f"{metric}/{view}")


def test_bidirectional_rows_with_a_custom_sink(rng):
    z = log_softmax(rng.standard_normal((2, 1, 4, 5, 5)) * 2)  # every key visible
    ds = rows_dataset(z)
    ref, n_rows = reference(ds, sink=4)  # e.g. [SEP] at the last position
    cmp = ac.head_comparisons(ds, sink=4, backend="numpy")
    assert int(cmp.n_rows) == n_rows == 10
    for (metric, view), want in ref.items():
        np.testing.assert_allclose(cmp[metric].sel(view=view), want, rtol=1e-9, atol=1e-11)


def test_float32_captures_match_to_float32_precision(causal):
    ds32 = causal.assign(log_attn=causal.log_attn.astype(np.float32))
    ref, _ = reference(ds32)
    cmp = ac.head_comparisons(ds32)
    for (metric, view), want in ref.items():
        np.testing.assert_allclose(cmp[metric].sel(view=view), want, rtol=2e-4, atol=2e-5)


@_needs_torch
def test_the_device_path_steps_over_anchors_like_the_numpy_kernel(monkeypatch):
    from attncoda import _backend

    monkeypatch.setattr(_backend, "_DEVICE_MIN_BUDGET", 1)  # a few anchors per step
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=5, length=12, seed=3)  # float32
    on_device = ac.head_comparisons(ds, ["js", "tv"], device="cpu", block_elements=200)
    in_numpy = ac.head_comparisons(ds, ["js", "tv"], backend="numpy", block_elements=200)
    for metric in ("js", "tv"):
        np.testing.assert_allclose(on_device[metric], in_numpy[metric], rtol=1e-5, atol=1e-7)


def test_device_errors_say_what_to_do():
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=4)
    with pytest.raises(ac.AnalysisError, match="needs backend='torch'"):
        ac.head_comparisons(ds, "js", backend="numpy", device="cpu")
    if has_torch:
        with pytest.raises(ac.AnalysisError, match="not a torch device"):
            ac.head_comparisons(ds, "js", device="gpu0")
        with pytest.raises(ac.AnalysisError, match="holds no data"):
            ac.head_comparisons(ds, "js", device="meta")
        import torch

        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            with pytest.raises(ac.AnalysisError, match="cannot be used here"):
                ac.head_comparisons(ds, "js", device="xpu")

        if not torch.cuda.is_available():
            with pytest.raises(ac.AnalysisError, match="no CUDA device; leave device unset"):
                ac.head_comparisons(ds, "js", device="cuda")


@pytest.mark.gpu
def test_comparisons_on_a_gpu_match_numpy():
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=3, n_heads=6, length=64, seed=5)  # float32
    on_gpu = ac.head_comparisons(ds, device="cuda")
    in_numpy = ac.head_comparisons(ds, backend="numpy")
    for metric in ac.METRICS:
        np.testing.assert_allclose(on_gpu[metric], in_numpy[metric], rtol=2e-4, atol=2e-6)


def test_float32_probabilities_that_underflow_to_zero_keep_js_finite(causal):
    # keys 1e-52 likely (exp(-120)) are exactly 0.0 in float32; JS must treat 0 log 0 as 0
    z = causal.log_attn.values.copy()
    z[..., 1] = np.where(np.isfinite(z[..., 1]), -120.0, -np.inf)
    ds32 = causal.assign(log_attn=(ac.DIMS, log_softmax(z).astype(np.float32)))
    ref, _ = reference(ds32)
    cmp = ac.head_comparisons(ds32, ["js", "tv"])
    assert np.isfinite(cmp.js.values).all()
    for metric, view in itertools.product(("js", "tv"), ac.VIEWS):
        want = ref[metric, view]
        np.testing.assert_allclose(cmp[metric].sel(view=view), want, rtol=2e-4, atol=2e-5)


def test_aitchison_split_is_exact_and_equals_the_core(causal):
    cmp = ac.head_comparisons(causal, "aitchison", backend="numpy")
    a = cmp.aitchison
    np.testing.assert_allclose(a.sel(view="kept"), a.sel(view="sink") + a.sel(view="dropped"))
    # the core's pairwise split, row by row over the same keys, averaged
    la = causal.log_attn.values
    sums = np.zeros((2, 6, 6))
    n = 0
    for s, q in itertools.product(range(2), range(7)):
        z = la[s, :, :, q].reshape(6, -1)
        vis = np.isfinite(z[0])
        si = int(causal.sink_index.values[s])
        if not vis[si] or vis.sum() < 2:
            continue
        sp = ac.pairwise_aitchison_split(z[:, vis], sink=int(np.sum(vis[:si])), from_logits=True)
        sums += [sp.sink, sp.content]
        n += 1
    np.testing.assert_allclose(a.sel(view="sink"), sums[0] / n, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(a.sel(view="dropped"), sums[1] / n, rtol=1e-9, atol=1e-10)
    d = ac.head_distances(cmp, "aitchison", "split")
    assert d.term.values.tolist() == ["sink", "content"]
    assert d.name == "aitchison_sq"  # the split terms add up only as squares
    kept_sq = ac.head_distances(cmp, "aitchison", "kept")  # squared unless asked otherwise
    assert kept_sq.name == "aitchison_sq" and "squared" in kept_sq.attrs["long_name"]
    xr.testing.assert_identical(kept_sq, ac.head_distances(cmp, "aitchison", squared=True))
    np.testing.assert_allclose(d.sum("term"), kept_sq)
    # squared=False: the root of the mean squared distance, as cluster_heads uses it
    kept = ac.head_distances(cmp, "aitchison", "kept", squared=False)
    assert kept.name == "aitchison" and "root mean squared" in kept.attrs["long_name"]
    np.testing.assert_allclose(kept, np.sqrt(kept_sq))


def test_blocks_and_per_sample_means_pool_to_the_same_values(causal):
    whole = ac.head_comparisons(causal, ["js", "kl"], block_elements=1 << 22)
    tiny = ac.head_comparisons(causal, ["js", "kl"], block_elements=8, per_sample=True)
    assert tiny.js.dims == ("view", "sample", "unit_a", "unit_b")
    assert tiny.n_rows.values.tolist() == [6, 4]  # query 0 (and the padded rows) have no content
    for metric in ("js", "kl"):
        np.testing.assert_allclose(
            ac.head_distances(tiny, metric, "dropped"), whole[metric].sel(view="dropped")
        )


def test_units_are_layer_head_pairs(causal):
    cmp = ac.head_comparisons(causal, "tv")
    assert cmp.unit_a.values.tolist()[:4] == ["L0.H0", "L0.H1", "L0.H2", "L1.H0"]
    assert cmp.layer_b.values.tolist() == [0, 0, 0, 1, 1, 1]
    # kl is the only asymmetric metric; every matrix has a zero diagonal
    for metric in ("tv",):
        d = cmp[metric].values
        np.testing.assert_allclose(d, np.swapaxes(d, -1, -2))
        assert (np.diagonal(d, axis1=-2, axis2=-1) == 0).all()


def test_pairwise_results_select_units_by_layer_and_head(causal):
    cmp = ac.head_comparisons(causal, ["tv", "aitchison"])
    d = ac.head_distances(cmp, "tv", "dropped")
    assert d.dims == ("unit_a", "unit_b")
    one = d.sel(layer_a=1, head_a=2, layer_b=0, head_b=1)
    assert float(one) == float(cmp.tv.sel(view="dropped", unit_a="L1.H2", unit_b="L0.H1"))
    row = d.sel(layer_a=1, head_a=2)
    assert row.dims == ("unit_b",) and row.label_b.values.tolist()[:2] == ["L0.H0", "L0.H1"]
    assert d.sel(layer_b=1).dims == ("unit_a", "head_b")  # a whole layer
    assert d.label_a.values.tolist() == cmp.unit_a.values.tolist()
    split = ac.head_distances(cmp, "aitchison", "split")
    assert float(split.sel(term="sink", layer_a=0, head_a=0, layer_b=0, head_b=0)) == 0.0
    # the comparisons dataset keeps its file-friendly labels unless asked for the index
    indexed = ac.head_comparisons(causal, ["tv", "aitchison"], units="layer_head")
    assert indexed.tv.sel(view="kept", layer_a=1, head_a=0).dims == ("unit_b",)
    xr.testing.assert_identical(ac.head_distances(indexed, "tv", "dropped"), d)
    back = indexed.reset_index(["unit_a", "unit_b"])
    assert back.layer_a.values.tolist() == cmp.layer_a.values.tolist()
    np.testing.assert_array_equal(back.tv.values, cmp.tv.values)
    # flips and clustering read either layout alike
    flips = ac.flip_rates(cmp, "tv", n_boot=0)
    xr.testing.assert_identical(ac.flip_rates(indexed, "tv", n_boot=0), flips)
    cl = ac.cluster_heads(indexed, "tv", ks=(2,))
    assert cl.unit.values.tolist() == cmp.unit_a.values.tolist()
    with pytest.raises(ac.AnalysisError, match="units must be"):
        ac.head_comparisons(causal, "tv", units="strings")


def test_squared_is_only_for_the_aitchison_distance(causal):
    cmp = ac.head_comparisons(causal, ["tv", "aitchison"])
    with pytest.raises(ac.AnalysisError, match="squared=True is for the Aitchison"):
        ac.head_distances(cmp, "tv", squared=True)
    with pytest.raises(ac.AnalysisError, match="only as squared"):
        ac.head_distances(cmp, "aitchison", "split", squared=False)
    with pytest.raises(ac.AnalysisError, match="squared must be"):
        ac.head_distances(cmp, "aitchison", squared="yes")
    assert ac.head_distances(cmp, "tv", squared=False).name == "tv"


def test_units_seeing_different_keys_raise_or_are_dropped(causal):
    z = causal.log_attn.values.copy()
    z[0, 1, :, 6, 1:3] = -np.inf  # layer 1 sees fewer keys at query 6 (a sliding window)
    ds = causal.assign(log_attn=(ac.DIMS, log_softmax(z)))
    with pytest.raises(ac.ShapeMismatchError, match="same visible keys"):
        ac.head_comparisons(ds, "cosine")
    dropped = ac.head_comparisons(ds, "cosine", mismatched="drop")
    assert int(dropped.n_rows) == int(ac.head_comparisons(causal, "cosine").n_rows) - 1


def test_clear_errors_for_bad_input(causal):
    with pytest.raises(ac.UnknownMetricError, match="unknown metric"):
        ac.head_comparisons(causal, "euclid")
    with pytest.raises(ac.UnknownConventionError, match="unknown convention"):
        ac.head_distances(causal, "js", "renormalised")
    with pytest.raises(ac.UnknownConventionError):
        ac.flip_rates(causal, "js", between=("kept", "nope"), n_boot=0)
    summaries = ac.testing.synthetic_rows().drop_vars("log_attn")
    with pytest.raises(ac.RowsRequiredError, match="what='rows'"):
        ac.head_comparisons(summaries)
    bad = causal.copy(deep=True)
    bad.log_attn[0, 0, 0, 3, 1] = np.nan
    with pytest.raises(ac.SchemaError, match="NaN"):
        ac.head_comparisons(bad, "tv")
    assert issubclass(ac.UnknownMetricError, ValueError)


# ------------------------------------------------------------------------------------ flips


def brute_flips(d1, d2):
    n = len(d1)
    flips = ties = total = 0
    for a in range(n):
        for b, c in itertools.combinations([i for i in range(n) if i != a], 2):
            v1 = np.sign(d1[a, b] - d1[a, c])
            v2 = np.sign(d2[a, b] - d2[a, c])
            total += 1
            flips += v1 * v2 < 0
            ties += v1 * v2 == 0
    return flips, total, ties


def test_flip_counting_on_hand_built_cases():
    d = np.array([[0, 1, 2, 3], [1, 0, 4, 5], [2, 4, 0, 6], [3, 5, 6, 0]], float)
    assert ac.verdict_flips(d, d) == ac.FlipCount(0, 12, 0)
    # reversing every anchor's order flips every verdict
    assert ac.verdict_flips(d, -d) == ac.FlipCount(12, 12, 0)
    # one swap: anchor 0 now finds head 1 farther than head 2, 3 stays last
    d2 = d.copy()
    d2[0, 1], d2[0, 2] = 2.5, 1.5
    assert ac.verdict_flips(d, d2) == ac.FlipCount(1, 12, 0)
    # a tie is never a flip
    d3 = d.copy()
    d3[0, 1] = d3[0, 2] = 2.0
    assert ac.verdict_flips(d, d3) == ac.FlipCount(0, 12, 1)
    # restricting to units = the submatrix
    assert ac.verdict_flips(d, d2, units=[0, 1, 2]) == ac.verdict_flips(d[:3, :3], d2[:3, :3])
    assert ac.verdict_flips(d[:2, :2], d2[:2, :2]).triples == 0


@pytest.mark.parametrize("chunk", [50, 4 * 81, 1 << 20])  # one anchor a block; 4, 4, 1; all
def test_flip_counting_matches_brute_force(rng, chunk):
    d1 = rng.integers(0, 4, (9, 9)).astype(float)  # small integers: plenty of ties
    d2 = rng.integers(0, 4, (9, 9)).astype(float)
    got = ac.verdict_flips(d1, d2, chunk=chunk)
    assert (got.flips, got.triples, got.ties) == brute_flips(d1, d2)
    assert got.rate == got.flips / got.triples


def comparisons_from(kept, dropped, n_rows=(5, 5, 5)):
    """A per-sample comparisons dataset with given (sample, N, N) kept and dropped values."""
    base = ac.head_comparisons(
        ac.testing.synthetic_rows(n_samples=len(n_rows), n_layers=2, n_heads=2),
        "cosine",
        per_sample=True,
    )
    vals = np.stack([kept, dropped, np.zeros_like(kept)])
    return base.assign(cosine=(base.cosine.dims, vals), n_rows=("sample", np.array(n_rows)))


def test_flip_rates_known_answers_and_bootstrap(rng):
    d = rng.random((3, 4, 4))
    d = d + np.swapaxes(d, 1, 2)
    same = ac.flip_rates(comparisons_from(d, d.copy()), n_boot=50)
    fr = same.flip_rate.sel(metric="cosine", pair="kept/dropped")
    assert fr.sel(scope="all").item() == 0.0
    assert same.ci_high.sel(metric="cosine", pair="kept/dropped", scope="all").item() == 0.0
    assert same.scope.values.tolist() == ["all", "L0", "L1"]
    assert same.n_triples.sel(scope="L0").item() == 0  # two heads per layer: no triple
    rev = ac.flip_rates(comparisons_from(d, -d + 10), n_boot=50)
    assert rev.flip_rate.sel(scope="all").item() == 1.0
    assert rev.flips.sel(scope="all").item() == 12
    # the point estimate is the exact count on the pooled matrices; the CI brackets it
    mixed = ac.flip_rates(comparisons_from(d, rng.random((3, 4, 4))), n_boot=200)
    est = mixed.flip_rate.sel(scope="all").item()
    lo, hi = mixed.ci_low.sel(scope="all").item(), mixed.ci_high.sel(scope="all").item()
    assert lo <= est <= hi


def test_flip_rates_from_rows_per_model_and_layer():
    ds = ac.testing.synthetic_rows(n_samples=4, n_layers=2, n_heads=4, length=8)
    fr = ds.coda.flip_rates(
        ["cosine", "aitchison"], between=[("kept", "dropped"), ("kept", "sink")]
    )
    assert fr.flip_rate.dims == ("metric", "pair", "scope")
    assert fr.pair.values.tolist() == ["kept/dropped", "kept/sink"]
    assert fr.n_triples.sel(scope="all").values.ravel().tolist() == [168] * 4  # 8 * C(7, 2)
    assert fr.n_triples.sel(scope="L1").values.ravel().tolist() == [12] * 4
    assert np.isfinite(fr.ci_low.sel(scope="all")).all()
    # the sampled-triples bootstrap agrees with the exhaustive one to Monte-Carlo error
    sampled = ds.coda.flip_rates(["cosine"], max_triples=100, by_layer=False)
    full = ds.coda.flip_rates(["cosine"], by_layer=False)
    np.testing.assert_allclose(sampled.ci_high, full.ci_high, atol=0.15)


# ------------------------------------------------------------------------------------ clustering


def grouped_rows(sink_logit: float, seed: int = 0, n_layers: int = 3) -> xr.Dataset:
    """Heads in three clear content groups (previous token, recency, first content key)."""
    rng = np.random.default_rng(seed)
    t, n_h = 10, 4
    q = np.arange(t)[:, None]
    k = np.arange(t)[None, :]
    patterns = [4.0 * (k == q - 1), -0.8 * (q - k), 4.0 * (k == 1)]
    z = rng.standard_normal((3, n_layers, n_h, t, t)) * 0.2
    for l_, h in itertools.product(range(n_layers), range(n_h)):
        z[:, l_, h] += patterns[(l_ * n_h + h) % 3]
        z[:, l_, h, :, 0] = sink_logit + (6.0 * (h % 2) if sink_logit > -20 else 0.0)
    z = np.where(k <= q, z, -np.inf)
    return rows_dataset(log_softmax(z))


@pytest.mark.parametrize("metric", ["js", "cosine", "tv"])
def test_clustering_agreement_is_one_when_conventions_coincide(metric):
    ds = grouped_rows(sink_logit=-60.0)  # no sink mass: kept == dropped
    cl = ac.cluster_heads(ds, metric, ks=(2, 3))
    assert cl.ari.sel(pair="kept/dropped").values.tolist() == [1.0, 1.0]
    assert cl.ari_kmeans.sel(pair="kept/dropped").values.tolist() == [1.0, 1.0]
    assert cl.cophenetic_corr.item() == pytest.approx(1.0, abs=1e-9)
    assert cl.distance_corr.item() == pytest.approx(1.0, abs=1e-9)
    # and the content groups are found
    truth = [(i % 3) for i in range(12)]
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, cl.labels.sel(convention="dropped", k=3)) == 1.0


def test_clustering_structure_from_the_sink_disappears_when_it_is_dropped():
    ds = grouped_rows(sink_logit=-1.5)  # odd heads are sink-heavy, orthogonal to content groups
    cl = ac.cluster_heads(ds, "js", ["kept", "dropped", "sink", "content"], ks=(2, 3))
    heavy = (cl.sink_share.values > 0.3).astype(int)
    assert heavy.sum() == 6
    # with the sink kept, the leading MDS axis is the sink share and a partition tracks it ...
    assert abs(cl.axis_sink_rho.sel(convention="kept", component=1).item()) > 0.9
    assert cl.ari_sink_split.sel(convention="kept").max().item() >= 0.7
    assert cl.ari_sink_split.sel(convention="sink", k=2).item() == 1.0
    # ... and without it that structure is gone
    assert abs(cl.axis_sink_rho.sel(convention="dropped", component=1).item()) < 0.3
    assert cl.ari_sink_split.sel(convention="dropped").max().item() < 0.2
    assert cl.ari.sel(pair="dropped/content").values.tolist() == [1.0, 1.0]
    assert cl.linkage.sizes == {"convention": 4, "merge": 11, "field": 4}
    assert cl.mds.sizes["component"] == 2


@pytest.mark.parametrize("metric", ["js", "aitchison"])
def test_the_mds_embedding_is_scikit_learns_metric_mds_from_the_classical_start(metric):
    """attncoda's SMACOF (no per-iteration input checks) computes what scikit-learn's
    ``MDS(metric="precomputed", init="classical_mds")`` computes, on the same dissimilarities."""
    from sklearn.manifold import MDS

    ds = grouped_rows(sink_logit=-1.5)
    cl = ac.cluster_heads(ds, metric, ["kept", "dropped"], ks=(2,))
    cmp = ac.head_comparisons(ds, metric)
    for conv in ("kept", "dropped"):
        d = cmp[metric].sel(view=conv).values.astype(np.float64)
        d = np.maximum((d + d.T) / 2, 0)
        if metric == "aitchison":
            d = np.sqrt(d)
        np.fill_diagonal(d, 0)
        try:
            mds = MDS(2, metric="precomputed", init="classical_mds", normalized_stress="auto")
        except TypeError:
            pytest.skip("scikit-learn < 1.8 has no classical-MDS start")
        want = mds.fit_transform(d)
        want = want - want.mean(axis=0)
        want *= np.sign(want[np.argmax(np.abs(want), axis=0), [0, 1]])  # attncoda's orientation
        np.testing.assert_allclose(cl.mds.sel(convention=conv).values, want, rtol=0, atol=1e-9)
        assert cl.stress.sel(convention=conv).item() == pytest.approx(mds.stress_, rel=1e-9)


def test_three_heads_off_a_triangle_embed_without_nan():
    """Three heads whose dissimilarities break the triangle inequality: the classical start's
    second eigenvalue is the centring's null direction, zero but for rounding, and its sign is
    noise; it must not turn the whole embedding into NaN (it did for 1 in 3 such matrices)."""
    from attncoda._clustering import _mds

    rng = np.random.default_rng(0)
    for _ in range(60):
        a, b = rng.uniform(0.1, 0.3, 2)
        c = (a + b) * rng.uniform(1.01, 1.2)
        d = np.array([[0, a, c], [a, 0, b], [c, b, 0]])
        emb, stress = _mds(d, 2)
        assert np.isfinite(emb).all() and np.isfinite(stress)
    # the matrix that showed it: js of a synthetic analysis
    d = np.array([[0, 0.25678, 0.52472059], [0.25678, 0, 0.22817676], [0.52472059, 0.22817676, 0]])
    assert np.isfinite(_mds(d, 2)[0]).all()


# no sink mass (-60): the sink view's dissimilarities are all 0, so its partitions are single
# clusters (k-means and scipy's cophenet say so in warnings of their own)
@pytest.mark.filterwarnings("ignore:Number of distinct clusters")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning:scipy")
@pytest.mark.parametrize("sink_logit", [-1.5, -60.0])
def test_the_adjusted_rand_indices_are_scikit_learns(sink_logit):
    """Every ARI cluster_heads reports equals scikit-learn's ``adjusted_rand_score`` of the
    labels it reports, to the last bit (attncoda computes the same integer formula without
    scikit-learn's sparse table)."""
    from sklearn.metrics import adjusted_rand_score

    ds = grouped_rows(sink_logit=sink_logit)
    views = ["kept", "dropped", "sink", "content"]
    cl = ac.cluster_heads(ds, "js", views, ks=(2, 3, 5))
    heavy = (cl.sink_share.values > 0.3).astype(int)
    for pair in cl.pair.values:
        a, b = str(pair).split("/")
        for k in cl.k.values:
            for labels, ari in (("labels", "ari"), ("kmeans", "ari_kmeans")):
                want = adjusted_rand_score(
                    cl[labels].sel(convention=a, k=k), cl[labels].sel(convention=b, k=k)
                )
                assert cl[ari].sel(pair=pair, k=k).item() == want
    for v in views:
        for k in cl.k.values:
            want = adjusted_rand_score(heavy, cl.labels.sel(convention=v, k=k))
            assert cl.ari_sink_split.sel(convention=v, k=k).item() == want


def test_clustering_input_checks():
    ds = ac.testing.synthetic_rows(n_layers=1, n_heads=3)
    with pytest.raises(ac.AnalysisError, match="k must"):
        ac.cluster_heads(ds, "js", ks=(5,))
    with pytest.raises(ac.UnknownConventionError):
        ac.cluster_heads(ds, "js", ["kept", "kept"])


# ------------------------------------------------------------------------------------ attribution


def test_attribution_parts_sum_to_the_total_exactly():
    a = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=9, seed=1)
    b = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=9, seed=2)
    att = ac.attribute_entropy(a, b)
    assert att.sink.dims == ("layer", "head")
    np.testing.assert_allclose(att.sink + att.content, att.total, rtol=0, atol=1e-12)
    np.testing.assert_allclose(att.entropy_b - att.entropy_a, att.total, atol=1e-12)
    # direct computation for one head: mean over valid rows of the row entropy change
    sa, sb = a.isel(layer=1, head=2), b.isel(layer=1, head=2)
    valid = np.isfinite(sa.content_entropy) & np.isfinite(sb.content_entropy)
    want = float((sb.entropy - sa.entropy).where(valid).mean())
    assert att.total.sel(layer=1, head=2).item() == pytest.approx(want, abs=1e-6)
    ch = ac.attribute_entropy_change(
        sa.sink_share.values[valid.values].astype(float),
        sa.content_entropy.values[valid.values].astype(float),
        sb.sink_share.values[valid.values].astype(float),
        sb.content_entropy.values[valid.values].astype(float),
    )
    assert att.sink.sel(layer=1, head=2).item() == pytest.approx(ch.sink.mean(), abs=1e-12)
    pooled = (att.sink * att.n_rows).sum() / (att.total * att.n_rows).sum()
    assert att.attrs["sink_fraction"] == pytest.approx(float(pooled))
    agg = att.attrs
    assert agg["sink_mean"] + agg["content_mean"] == pytest.approx(agg["total_mean"], abs=1e-12)


def test_attribution_between_layers_and_from_rows():
    ds = ac.testing.synthetic_rows(n_layers=3, n_heads=2)
    att = ds.coda.attribute_entropy(along="layer")
    assert att.transition.values.tolist() == ["0->1", "1->2"]
    np.testing.assert_allclose(att.sink + att.content, att.total, atol=1e-12)
    manual = ac.attribute_entropy(ds.sel(layer=0), ds.sel(layer=1))
    np.testing.assert_allclose(att.total.sel(transition="0->1"), manual.total)
    rows_only = ds.drop_vars(list(ac.SUMMARY_VARIABLES))
    np.testing.assert_allclose(
        ac.attribute_entropy(rows_only, along="layer").sink, att.sink, rtol=1e-5, atol=1e-6
    )


def test_attribution_needs_paired_rows():
    a = ac.testing.synthetic_rows(n_samples=2, n_heads=3)
    with pytest.raises(ac.DatasetMismatchError, match="same rows"):
        ac.attribute_entropy(a, ac.testing.synthetic_rows(n_samples=2, n_heads=4))
    with pytest.raises(ac.DatasetMismatchError, match="same dims"):
        ac.attribute_entropy(a, a.isel(layer=0, drop=True))
    with pytest.raises(ac.AnalysisError, match="along="):
        ac.attribute_entropy(a)


# ------------------------------------------------------------------------------------ profiles


def test_profiles_are_means_over_rows_with_content():
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    prof = ds.coda.head_profiles()
    s = ds.sink_share.values[:, :, :, 1:]  # query 0 only sees the sink
    np.testing.assert_allclose(prof.sink_share, s.mean(axis=(0, 3)), rtol=1e-6)
    assert (prof.n_rows == 10).all()
    # summaries recomputed from the rows agree with the stored ones
    again = _row_summaries(ds, None)
    for name in ac.SUMMARY_VARIABLES:
        np.testing.assert_allclose(
            again[name].isel(query=slice(1, None)),
            ds[name].isel(query=slice(1, None)),
            rtol=1e-4,
            atol=1e-5,
        )


def test_content_clr_by_relative_offset():
    # one head whose content logits are -|offset| exactly: clr is known in closed form
    t = 5
    q = np.arange(t)[:, None]
    k = np.arange(t)[None, :]
    z = np.where(k <= q, -(q - k).astype(float), -np.inf)
    z[:, 0] = np.where(np.arange(t) >= 0, 1.0, 0.0)
    ds = rows_dataset(log_softmax(z[None, None, None]))
    prof = ac.head_profiles(ds.assign_coords(), max_offset=3)
    want = {}
    for qq in range(1, t):  # rows with >= 1 content key
        off = -(qq - np.arange(1, qq + 1))
        clr = off - off.mean()
        for o, val in zip(off, clr, strict=True):
            want.setdefault(int(o), []).append(val)
    got = prof.content_clr.sel(layer=0, head=0)
    for o in (-3, -2, -1, 0):
        assert got.sel(offset=o).item() == pytest.approx(np.mean(want[o]))
    assert np.isnan(got.sel(offset=1).item())  # causal: no future keys


def test_sink_rate_counts_heads_above_the_threshold():
    prof = xr.Dataset(
        {
            "sink_share": (("layer", "head"), [[0.1, 0.5], [0.31, 0.9]]),
            "n_rows": (("layer", "head"), [[4, 4], [4, 4]]),
        },
        coords={"layer": [0, 1], "head": [0, 1]},
    )
    assert ac.sink_rate(prof, 0.3).item() == 0.75
    assert ac.sink_rate(prof, 0.3, per_layer=True).values.tolist() == [0.5, 1.0]
    assert ac.sink_rate(prof, 0.95).item() == 0.0


# ------------------------------------------------------------------------------------ accessor


# every method of ds.coda, with arguments that exercise its own parameters
ACCESSOR_CALLS = {
    "head_profiles": ((), {"max_offset": 4}),
    "sink_rate": ((0.4,), {"per_layer": True}),
    "head_comparisons": (("tv",), {"per_sample": True}),
    "head_distances": (("kl", "split"), {}),
    "flip_rates": (("cosine",), {"n_boot": 5}),
    "cluster_heads": (("cosine",), {"ks": (2,)}),
    "attribute_entropy": ((), {"along": "layer"}),
}


def _accessor_methods(cls):
    return sorted(name for name in vars(cls) if not name.startswith("_") and name != "plot")


# methods of ds.coda that are not a function of the same name (tests/test_accessor.py has them),
# or that return a page rather than a dataset (explore: tests/test_explore.py)
ACCESSOR_OWN = {"decompose", "explore", "view"}


def test_the_accessor_covers_exactly_the_listed_methods():
    assert _accessor_methods(ac.CodaAccessor) == sorted({*ACCESSOR_CALLS, *ACCESSOR_OWN})


@pytest.mark.parametrize("name", sorted(ACCESSOR_CALLS))
def test_accessor_methods_have_the_functions_name_signature_doc_and_result(name):
    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3)
    assert isinstance(ds.coda, ac.CodaAccessor)
    fn, method = getattr(ac, name), getattr(ds.coda, name)
    want = inspect.signature(fn)
    want = want.replace(parameters=list(want.parameters.values())[1:])
    assert inspect.signature(method) == want
    assert method.__doc__ == fn.__doc__ and method.__name__ == name
    args, kwargs = ACCESSOR_CALLS[name]
    got, expected = method(*args, **kwargs), fn(ds, *args, **kwargs)
    xr.testing.assert_identical(got, expected)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("head_comparisons", lambda ds, **kw: ac.head_comparisons(ds, "js", **kw)),
        ("head_comparisons", lambda ds, **kw: ac.flip_rates(ds, n_boot=0, **kw)),
        ("head_comparisons", lambda ds, **kw: ac.cluster_heads(ds, "js", **kw)),
        ("head_profiles", lambda ds, **kw: ac.head_profiles(ds.drop_vars("sink_share"), **kw)),
        ("content_clr", lambda ds, **kw: ac.head_profiles(ds, max_offset=1, **kw)),
    ],
)
def test_analyses_over_rows_show_progress_unless_told_not_to(
    name, call, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A per-function analysis that walks the rows sample by sample draws a tqdm bar on stderr
    (after two seconds; here at once), and ``progress=False`` draws none."""
    from attncoda import _rows

    monkeypatch.setattr(_rows, "PROGRESS_DELAY", 0.0)
    ds = ac.testing.synthetic_rows(n_samples=5, n_layers=2, n_heads=3, length=8)
    call(ds, progress=False)
    assert capsys.readouterr().err == ""
    call(ds)
    err = capsys.readouterr().err
    assert f"{name}: " in err and "/5 [" in err and "sample/s" in err


def test_the_js_and_tv_pool_follows_torchs_thread_count(monkeypatch):
    """One setting (``torch.set_num_threads``, the CLI's ``--threads``) limits attncoda's own
    pool of the pairwise JS / TV loops too, and the numbers do not depend on it."""
    torch = pytest.importorskip("torch")
    from attncoda import _backend

    rows = ac.closure(np.random.default_rng(3).gamma(0.5, size=(40, 3000)) + 1e-6)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _backend._workers() == 1
        one = [_backend._pairwise_rows(rows, kind, 1 << 16) for kind in ("js", "l1")]
        torch.set_num_threads(2)
        monkeypatch.setattr(_backend.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
        assert _backend._workers() == 2
        two = [_backend._pairwise_rows(rows, kind, 1 << 16) for kind in ("js", "l1")]
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", range(40))
def test_column_runs_select_what_boolean_indexing_selects(seed):
    """The packed cells of head comparisons are copied as runs of visible keys; any mask (one
    run, many short runs, none, all) gives what ``a[:, keep]`` gives, in order."""
    from attncoda._comparisons import _select_columns

    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 5)), int(rng.integers(0, 300))
    a = rng.standard_normal((n, m)).astype(np.float32)
    kind = seed % 4
    if kind == 0:  # causal rows: one run per row of 20 keys
        keep = (np.arange(m) % 20) <= rng.integers(0, 20)
    elif kind == 1:  # scattered keys: many short runs
        keep = rng.random(m) < 0.5
    else:
        keep = np.full(m, kind == 2)
    got = _select_columns(a, keep)
    assert got.dtype == a.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, a[:, keep])
