"""Head-importance scores (attncoda.hooks.scores): the gradient importance against finite
differences, the capture-based statistics against the core on captured rows, prune orders and
plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import _registry, capture  # noqa: E402
from attncoda.hooks import scores as S  # noqa: E402
from attncoda.hooks.evaluate import perplexity  # noqa: E402
from attncoda.hooks.gates import GateError  # noqa: E402


class _Scale(_registry.AttentionPlugin):
    def __init__(self, model, layer, head, factor):
        super().__init__(model)
        self.layer, self.head, self.factor = layer, head, factor

    def adjust_output(self, module, layer, output):
        if layer != self.layer:
            return output
        scale = torch.ones(output.shape[2], dtype=output.dtype)
        scale[self.head] = self.factor
        return output * scale[None, None, :, None]


def test_gradient_importance_matches_finite_differences():
    model = zoo.tiny_twin("llama", dtype="float64")
    ids = zoo.tiny_batch(model, batch=2, length=10, seed=7)["input_ids"]
    grad = S.gradient_importance(model, ids)
    assert grad.shape == (2, 4)
    assert all(p.requires_grad for p in model.parameters())  # flags restored
    eps = 1e-3  # the twin's forward is not float64-exact everywhere: smaller steps get noisy
    for layer, head in [(0, 1), (1, 3)]:
        per_window = []
        for w in ids:
            losses = []
            for f in (1 + eps, 1 - eps):
                with _registry.plugged(model, _Scale(model, layer, head, f)):
                    losses.append(perplexity(model, w).loss)
            per_window.append(abs(losses[0] - losses[1]) / (2 * eps))
        assert abs(float(grad[layer, head]) - np.mean(per_window)) < 1e-3 * np.mean(per_window)
    group = S.gradient_importance(model, ids, unit="kv_group")
    assert group.shape == (2, 2)
    assert (group <= grad.view(2, 2, 2).sum(-1) + 1e-12).all()  # |a + b| <= |a| + |b|


def test_capture_scores_equal_the_core_on_captured_rows():
    model = zoo.tiny_twin("llama")
    ids = zoo.tiny_batch(model, batch=2, length=12, seed=8)["input_ids"]
    ds = S.head_scores(model, ids, scores=list(S.SCORES), seed=3)
    assert set(ds.data_vars) == set(S.SCORES)
    assert ds.sink_share.attrs["prune_first"] == "high"
    with torch.no_grad(), capture(model, what="rows") as cap:
        model(input_ids=ids)
    la = cap.dataset.log_attn.values.astype(np.float64)[:, :, :, 1:]  # queries >= 1
    vis = np.isfinite(la)
    sink = np.zeros(la.shape[-1], bool)
    sink[0] = True
    d = ac.decompose(la, sink=np.broadcast_to(sink, la.shape), mask=vis, from_logits=True)
    content = vis & ~sink
    n = content.sum(-1)
    norm = np.zeros(la.shape[:-1])  # query 1 has one content key: at the uniform point
    norm[..., 1:] = ac.aitchison_norm(la[..., 1:, :], mask=content[..., 1:, :], from_logits=True)
    want = {
        "sink_share": d.sink_share,
        "sink_logodds": d.sink_logodds,
        "entropy": d.entropy,
        "content_entropy": d.content_entropy,
        "content_aitchison": norm,
        "content_clr_dispersion": norm / np.sqrt(n),
        "max_attention": np.exp(np.where(vis, la, -np.inf).max(-1)),
    }
    for name, val in want.items():
        np.testing.assert_allclose(
            ds[name].values, val.mean(axis=(0, 3)), rtol=1e-4, atol=1e-5, err_msg=name
        )
    np.testing.assert_allclose(ds.gradient.values, S.gradient_importance(model, ids).numpy())
    np.testing.assert_array_equal(ds.random.values, np.random.default_rng(3).random((2, 4)))
    groups = S.head_scores(model, ids, scores=["sink_share"], unit="kv_group")
    np.testing.assert_allclose(
        groups.sink_share.values, ds.sink_share.values.reshape(2, 2, 2).mean(-1), rtol=1e-6
    )
    with pytest.raises(GateError, match="unknown score 'sink_shar'"):
        S.head_scores(model, ids, scores=["sink_shar"])
    # a reversed score: the same statistic, the other end pruned first
    rev = S.head_scores(model, ids, scores=["content_entropy-reversed", "content_entropy"])
    np.testing.assert_array_equal(
        rev["content_entropy-reversed"].values, rev["content_entropy"].values
    )
    assert rev["content_entropy-reversed"].attrs["prune_first"] == "low"
    assert (
        S.prune_order(rev, "content_entropy-reversed")
        == S.prune_order(rev, "content_entropy")[::-1]
    )


def test_prune_order_and_plan():
    import xarray as xr

    vals = np.array([[0.9, 0.8, 0.1], [0.7, 0.2, 0.3]])
    ds = xr.Dataset(
        {"sink_share": (("layer", "head"), vals), "gradient": (("layer", "head"), vals)}
    )
    ds.sink_share.attrs["prune_first"] = "high"
    ds.gradient.attrs["prune_first"] = "low"
    order = S.prune_order(ds, "sink_share")
    assert order == [(0, 0), (0, 1), (1, 0), (1, 2), (1, 1), (0, 2)]
    assert S.prune_order(ds, "gradient") == order[::-1]
    # (0, 1) is skipped: layer 0 would lose its last two heads... it keeps one
    assert S.prune_plan(order, 3, n_units=3) == {0: (0, 1), 1: (0,)}
    plans = [S.prune_plan(order, k, n_units=3) for k in range(5)]
    assert plans[4] == {0: (0, 1), 1: (0, 2)}
    for small, big in itertools.pairwise(plans):  # nested
        assert all(set(hs) <= set(big.get(layer, ())) for layer, hs in small.items())
    with pytest.raises(GateError, match="at most 4 can go"):
        S.prune_plan(order, 5, n_units=3)
    with pytest.raises(GateError, match="not in the dataset"):
        S.prune_order(ds, "entropy")
