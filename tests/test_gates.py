"""Head gates on the zoo twins: equal to zeroing output-projection columns, mean ablation,
restoration, bad input, perplexity equal to the model's own loss, scores and the pruning study."""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import _registry, capture  # noqa: E402
from attncoda.hooks import gates as G  # noqa: E402
from attncoda.hooks._perplexity import PerplexityError, text_windows  # noqa: E402

FAMILIES = list(zoo.FAMILIES)


def logits_of(model, batch):
    with torch.no_grad():
        out = model(**batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def output_projections(model):
    """Per layer: (projection module, weight is (in, out) as in GPT-2's Conv1D)."""
    found = []
    for module in _registry.attention_modules(model):
        proj = None
        for name in ("o_proj", "out_proj", "c_proj", "dense"):
            proj = getattr(module, name, None)
            if proj is not None:
                found.append((proj, name == "c_proj"))
                break
        if proj is None:  # BERT: BertAttention.self is the leaf, BertAttention.output.dense
            parent = next(p for p in model.modules() if getattr(p, "self", None) is module)
            found.append((parent.output.dense, False))
    return found


def zero_columns(model, heads):
    """A copy of the model whose gated heads' output-projection inputs are zeroed."""
    twin = copy.deepcopy(model)
    n_heads = G.head_layout(model).n_heads
    projections = output_projections(twin)
    with torch.no_grad():
        for layer, hs in heads.items():
            proj, transposed = projections[layer]
            d = (proj.weight.shape[0] if transposed else proj.weight.shape[1]) // n_heads
            for h in hs:
                if transposed:
                    proj.weight[h * d : (h + 1) * d, :] = 0
                else:
                    proj.weight[:, h * d : (h + 1) * d] = 0
    return twin


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_gate_equals_zeroed_output_projection(family):
    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=10, left_padding=True)
    before = logits_of(model, batch)
    heads = {0: [1], 1: [0, 3]}
    with G.gates(model, heads) as gate:
        gated = logits_of(model, batch)
    assert gate.calls == 2
    reference = logits_of(zero_columns(model, heads), batch)
    np.testing.assert_allclose(gated.numpy(), reference.numpy(), atol=1e-5)
    assert not np.allclose(gated.numpy(), before.numpy(), atol=1e-3)  # the gate did something
    assert model.config._attn_implementation != _registry.ATTENTION_NAME
    np.testing.assert_array_equal(logits_of(model, batch).numpy(), before.numpy())


def test_kv_group_gate_gates_the_groups_query_heads():
    model = zoo.tiny_twin("llama")  # 4 query heads over 2 key/value heads
    batch = zoo.tiny_batch(model, length=9)
    with G.gates(model, {1: [1]}, unit="kv_group") as gate:
        by_group = logits_of(model, batch)
    assert gate.heads == {1: (2, 3)}
    reference = logits_of(zero_columns(model, {1: [2, 3]}), batch)
    np.testing.assert_allclose(by_group.numpy(), reference.numpy(), atol=1e-5)


def test_gates_accept_pairs_and_negative_indices_and_an_empty_spec():
    model = zoo.tiny_twin("qwen2")
    batch = zoo.tiny_batch(model, length=8)
    with G.gates(model, [(-1, -1), (0, 2)]) as gate:
        pairs = logits_of(model, batch)
    assert gate.heads == {0: (2,), 1: (3,)}
    with G.gates(model, {0: 2, 1: [3]}):
        mapping = logits_of(model, batch)
    np.testing.assert_array_equal(pairs.numpy(), mapping.numpy())
    with G.gates(model, {}) as empty:
        same = logits_of(model, batch)
    assert empty.calls == 0
    np.testing.assert_allclose(same.numpy(), logits_of(model, batch).numpy(), atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
def test_mean_gate_equals_mean_at_the_output_projection(family):
    model = zoo.tiny_twin(family)
    reference = zoo.tiny_batch(model, length=10, left_padding=True, seed=3)
    batch = zoo.tiny_batch(model, length=8, seed=4)
    n_heads = G.head_layout(model).n_heads
    projections = output_projections(model)

    # the means equal the average input of the output projection over valid tokens
    inputs: dict[int, torch.Tensor] = {}
    hooks = []
    for layer, (proj, _) in enumerate(projections):

        def grab(module, args, layer=layer):
            inputs[layer] = args[0].detach().clone()

        hooks.append(proj.register_forward_pre_hook(grab))
    logits_of(model, reference)
    for h in hooks:
        h.remove()
    means = G.head_means(model, [reference])
    valid = reference["attention_mask"].bool()
    assert means.n_tokens == int(valid.sum())
    for layer, x in inputs.items():
        want = x[valid].view(-1, n_heads, x.shape[-1] // n_heads).double().mean(0)
        np.testing.assert_allclose(means.means[layer].numpy(), want.numpy(), atol=1e-6)

    # mean ablation equals putting the mean into the projection's input
    heads = {0: [0, 2], 1: [1]}
    hooks = []
    for layer, hs in heads.items():
        proj, _ = projections[layer]

        def put_mean(module, args, layer=layer, hs=hs):
            x = args[0].clone()
            d = x.shape[-1] // n_heads
            for h in hs:
                x[..., h * d : (h + 1) * d] = means.means[layer][h]
            return (x,)

        hooks.append(proj.register_forward_pre_hook(put_mean))
    want = logits_of(model, batch)
    for h in hooks:
        h.remove()
    with G.gates(model, heads, mode="mean", means=means):
        got = logits_of(model, batch)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_restored_after_an_exception():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=7)
    previous = model.config._attn_implementation
    before = logits_of(model, batch)
    with pytest.raises(RuntimeError, match="boom"):
        with G.gates(model, {0: [0, 1]}):
            logits_of(model, batch)
            raise RuntimeError("boom")
    assert model.config._attn_implementation == previous
    assert _registry._PLUGINS.get() == ()
    assert not _registry._ACTIVATIONS
    np.testing.assert_array_equal(logits_of(model, batch).numpy(), before.numpy())
    # an error raised inside the forward pass (a head count the config does not announce)
    with pytest.raises(G.GateError, match="returned 4 heads"):
        with G.gates(model, {0: [0]}) as gate:
            gate.layout = G.HeadLayout(2, 8, 2)
            logits_of(model, batch)
    assert model.config._attn_implementation == previous
    np.testing.assert_array_equal(logits_of(model, batch).numpy(), before.numpy())


def test_gates_compose_with_capture_and_stay_per_model():
    a, b = zoo.tiny_twin("llama", seed=0), zoo.tiny_twin("llama", seed=1)
    batch = zoo.tiny_batch(a, length=8)
    b_before = logits_of(b, batch)
    with G.gates(a, {1: [0]}), capture(a, layers=[1], what="rows") as cap:
        gated = logits_of(a, batch)
        np.testing.assert_array_equal(logits_of(b, batch).numpy(), b_before.numpy())
    np.testing.assert_allclose(
        gated.numpy(), logits_of(zero_columns(a, {1: [0]}), batch).numpy(), atol=1e-5
    )
    # gating a head's output leaves that layer's attention pattern alone
    with capture(a, layers=[1], what="rows") as plain:
        logits_of(a, batch)
    np.testing.assert_allclose(cap.dataset.log_attn.values, plain.dataset.log_attn.values)
    assert a.config._attn_implementation == "sdpa"


def test_bad_input_gives_clear_errors():
    model = zoo.tiny_twin("llama")
    with pytest.raises(G.GateError, match="layer 2 does not exist: the model has 2 layers"):
        G.gates(model, {2: [0]}).__enter__()
    with pytest.raises(G.GateError, match="head 4 does not exist in layer 0"):
        G.gates(model, {0: [4]}).__enter__()
    with pytest.raises(G.GateError, match="key/value group 2 does not exist"):
        G.gates(model, {0: [2]}, unit="kv_group").__enter__()
    with pytest.raises(G.GateError, match="all 4 heads of layer 1 would be gated"):
        G.gates(model, {1: [0, 1, 2, 3]}).__enter__()
    with pytest.raises(G.GateError, match="all 2 key/value groups of layer 0"):
        G.gates(model, [(0, 0), (0, 1)], unit="kv_group").__enter__()
    with pytest.raises(G.GateError, match="indices must be ints"):
        G.gates(model, {0: ["1"]}).__enter__()
    with pytest.raises(G.GateError, match=r"\(layer, head\) pairs"):
        G.gates(model, [(0, 1, 2)]).__enter__()
    with pytest.raises(G.GateError, match="mode must be"):
        G.gates(model, {0: [0]}, mode="drop").__enter__()  # type: ignore[arg-type]
    with pytest.raises(G.GateError, match="unit must be"):
        G.gates(model, {0: [0]}, unit="layer").__enter__()  # type: ignore[arg-type]
    with pytest.raises(G.GateError, match="needs the heads' mean outputs"):
        G.gates(model, {0: [0]}, mode="mean").__enter__()
    gemma = zoo.tiny_twin("gemma3")  # one key/value head per layer
    with pytest.raises(G.GateError, match="use unit='head'"):
        G.gates(gemma, {0: [0]}, unit="kv_group").__enter__()
    assert model.config._attn_implementation == "sdpa"
    assert _registry._PLUGINS.get() == ()


def test_model_without_the_registry_path_is_refused(old_style_model):
    model = old_style_model
    ids = torch.randint(0, 50, (1, 8))
    for call in (
        lambda: G.gates(model, {0: [1]}).__enter__(),
        lambda: G.head_means(model, ids),
        lambda: G.gradient_importance(model, ids),
    ):
        with pytest.raises(_registry.RegistryError, match="attention registry"):
            call()


# --------------------------------------------------------------------------------------------
# perplexity


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2"])
def test_perplexity_equals_the_models_own_loss(family):
    model = zoo.tiny_twin(family)
    ids = zoo.tiny_batch(model, batch=3, length=16, seed=5)["input_ids"]
    one = G.perplexity(model, ids[:1])
    with torch.no_grad():
        loss = model(input_ids=ids[:1], labels=ids[:1]).loss
    assert one.n_tokens.tolist() == [15]
    assert abs(one.loss - float(loss)) < 1e-5
    assert math.isclose(one.value, math.exp(float(loss)), rel_tol=1e-5)
    # several windows: token-weighted, so the mean of equal-length window losses
    many = G.perplexity(model, ids, batch_size=2)
    with torch.no_grad():
        losses = [float(model(input_ids=w[None], labels=w[None]).loss) for w in ids]
    assert abs(many.loss - float(np.mean(losses))) < 1e-5
    np.testing.assert_allclose(many.nll.numpy() / 15, losses, atol=1e-5)
    assert abs(many.subset([1]).loss - losses[1]) < 1e-5
    # with gates active: the loss of the model with zeroed output-projection columns
    heads = {1: [2]}
    with G.gates(model, heads):
        gated = G.perplexity(model, ids)
    twin = zero_columns(model, heads)
    with torch.no_grad():
        want = np.mean([float(twin(input_ids=w[None], labels=w[None]).loss) for w in ids])
    assert abs(gated.loss - want) < 1e-5


def test_perplexity_bad_input():
    model = zoo.tiny_twin("llama")
    with pytest.raises(PerplexityError, match="T >= 2"):
        G.perplexity(model, torch.tensor([[5]]))
    with pytest.raises(PerplexityError, match="batch_size"):
        G.perplexity(model, torch.tensor([[5, 6]]), batch_size=0)


class _Tok:
    """A word-level stand-in for a HuggingFace tokenizer, optionally with a BOS."""

    def __init__(self, bos: int | None) -> None:
        self.bos = bos

    def __call__(self, text, add_special_tokens=True):
        ids = [10 + len(w) for w in text.split()]
        if add_special_tokens and self.bos is not None:
            ids = [self.bos, *ids]

        class Out:
            input_ids = ids

        return Out()


def test_text_windows_cut_the_same_tokens_with_the_prefix():
    text = " ".join(["a", "bb", "ccc", "dddd"] * 10)  # 40 words
    plain = text_windows(_Tok(None), text, window=8)
    assert plain.shape == (5, 8)
    assert plain[0].tolist() == [11, 12, 13, 14] * 2
    bos = text_windows(_Tok(2), text, window=5, n_windows=3)
    assert bos[:, 0].tolist() == [2, 2, 2]
    assert bos[:, 1:].flatten().tolist() == plain.flatten()[:12].tolist()
    assert text_windows(_Tok(None), text, window=8, n_tokens=9).shape == (2, 8)
    with pytest.raises(PerplexityError, match="5 windows of 8, 6 were asked for"):
        text_windows(_Tok(None), text, window=8, n_windows=6)
    with pytest.raises(PerplexityError, match="at least one token"):
        text_windows(_Tok(2), text, window=1)
    with pytest.raises(PerplexityError, match="not both"):
        text_windows(_Tok(2), text, n_windows=1, n_tokens=3)


# --------------------------------------------------------------------------------------------
# scores


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
    grad = G.gradient_importance(model, ids)
    assert grad.shape == (2, 4)
    assert all(p.requires_grad for p in model.parameters())  # flags restored
    eps = 1e-3  # the twin's forward is not float64-exact everywhere: smaller steps get noisy
    for layer, head in [(0, 1), (1, 3)]:
        per_window = []
        for w in ids:
            losses = []
            for f in (1 + eps, 1 - eps):
                with _registry.plugged(model, _Scale(model, layer, head, f)):
                    losses.append(G.perplexity(model, w).loss)
            per_window.append(abs(losses[0] - losses[1]) / (2 * eps))
        assert abs(float(grad[layer, head]) - np.mean(per_window)) < 1e-3 * np.mean(per_window)
    group = G.gradient_importance(model, ids, unit="kv_group")
    assert group.shape == (2, 2)
    assert (group <= grad.view(2, 2, 2).sum(-1) + 1e-12).all()  # |a + b| <= |a| + |b|


def test_capture_scores_equal_the_core_on_captured_rows():
    model = zoo.tiny_twin("llama")
    ids = zoo.tiny_batch(model, batch=2, length=12, seed=8)["input_ids"]
    ds = G.head_scores(model, ids, scores=list(G.SCORES), seed=3)
    assert set(ds.data_vars) == set(G.SCORES)
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
    np.testing.assert_allclose(ds.gradient.values, G.gradient_importance(model, ids).numpy())
    np.testing.assert_array_equal(ds.random.values, np.random.default_rng(3).random((2, 4)))
    groups = G.head_scores(model, ids, scores=["sink_share"], unit="kv_group")
    np.testing.assert_allclose(
        groups.sink_share.values, ds.sink_share.values.reshape(2, 2, 2).mean(-1), rtol=1e-6
    )
    with pytest.raises(G.GateError, match="unknown score 'sink_shar'"):
        G.head_scores(model, ids, scores=["sink_shar"])
    # a reversed score: the same statistic, the other end pruned first
    rev = G.head_scores(model, ids, scores=["content_entropy-reversed", "content_entropy"])
    np.testing.assert_array_equal(
        rev["content_entropy-reversed"].values, rev["content_entropy"].values
    )
    assert rev["content_entropy-reversed"].attrs["prune_first"] == "low"
    assert (
        G.prune_order(rev, "content_entropy-reversed")
        == G.prune_order(rev, "content_entropy")[::-1]
    )


def test_prune_order_and_plan():
    import xarray as xr

    vals = np.array([[0.9, 0.8, 0.1], [0.7, 0.2, 0.3]])
    ds = xr.Dataset(
        {"sink_share": (("layer", "head"), vals), "gradient": (("layer", "head"), vals)}
    )
    ds.sink_share.attrs["prune_first"] = "high"
    ds.gradient.attrs["prune_first"] = "low"
    order = G.prune_order(ds, "sink_share")
    assert order == [(0, 0), (0, 1), (1, 0), (1, 2), (1, 1), (0, 2)]
    assert G.prune_order(ds, "gradient") == order[::-1]
    # (0, 1) is skipped: layer 0 would lose its last two heads... it keeps one
    assert G.prune_plan(order, 3, n_units=3) == {0: (0, 1), 1: (0,)}
    plans = [G.prune_plan(order, k, n_units=3) for k in range(5)]
    assert plans[4] == {0: (0, 1), 1: (0, 2)}
    for small, big in itertools.pairwise(plans):  # nested
        assert all(set(hs) <= set(big.get(layer, ())) for layer, hs in small.items())
    with pytest.raises(G.GateError, match="at most 4 can go"):
        G.prune_plan(order, 5, n_units=3)
    with pytest.raises(G.GateError, match="not in the dataset"):
        G.prune_order(ds, "entropy")


def test_pruning_study_end_to_end(tmp_path):
    model = zoo.tiny_twin("llama")
    calib = zoo.tiny_batch(model, batch=2, length=12, seed=1)["input_ids"]
    evaluation = {
        "a": zoo.tiny_batch(model, batch=2, length=12, seed=2)["input_ids"],
        "b": zoo.tiny_batch(model, batch=1, length=12, seed=3)["input_ids"],
    }
    res = G.pruning_study(
        model,
        calib,
        evaluation,
        scores=["sink_share", "gradient", "random", "sink_share-reversed"],
        fractions=[0.25, 0.5],
        mode="mean",
    )
    assert res.meta["ks"] == [0, 2, 4]
    assert {(r["score"], r["k"]) for r in res.rows} == {
        ("none", 0),
        *(
            (s, k)
            for s in ("sink_share", "gradient", "random", "sink_share-reversed")
            for k in (2, 4)
        ),
    }
    assert res.orders["sink_share-reversed"] == res.orders["sink_share"][::-1]
    base = G.perplexity(model, torch.cat([evaluation["a"], evaluation["b"]]))
    assert math.isclose(res.perplexity("none", 0), base.value, rel_tol=1e-9)
    assert math.isclose(res.perplexity("none", 0, "b"), base.subset([2]).value, rel_tol=1e-9)
    # a row is reproducible with gates directly
    order = res.orders["gradient"]
    plan = G.prune_plan(order, 4, n_units=4)
    means = G.head_means(model, calib)
    with G.gates(model, plan, mode="mean", means=means):
        again = G.perplexity(model, torch.cat([evaluation["a"], evaluation["b"]]))
    assert math.isclose(res.perplexity("gradient", 4), again.value, rel_tol=1e-6)
    paths = G.write_study(res, tmp_path / "out")
    with open(paths["perplexity"]) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * (1 + 4 * 2)
    assert json.loads(paths["meta"].read_text())["mode"] == "mean"
    assert paths["figure"].stat().st_size > 1000
    back = G.read_study(tmp_path / "out")
    assert back.orders == res.orders and back.meta == json.loads(json.dumps(res.meta))
    assert back.perplexity("gradient", 4) == pytest.approx(res.perplexity("gradient", 4), 1e-6)
    np.testing.assert_allclose(back.scores.gradient.values, res.scores.gradient.values, 1e-5)
    with pytest.raises(G.GateError, match="unit='head'"):
        G.pruning_study(zoo.tiny_twin("gemma3"), calib, evaluation, unit="kv_group")
    with pytest.raises(G.GateError, match=r"fractions must lie in \[0, 1\]"):
        G.pruning_study(model, calib, evaluation, fractions=[1.5])


def test_cli_prune_rejects_bad_input(capsys):
    from attncoda.cli import main

    assert main(["prune", "no-such-model"]) == 2
    assert "unknown asset" in capsys.readouterr().err
    assert main(["prune", "austen"]) == 2
    assert "is a corpus" in capsys.readouterr().err
    assert main(["prune", "smollm2-135m", "--fractions", "a,b"]) == 2
    assert "--fractions" in capsys.readouterr().err
    assert main(["prune", "smollm2-135m", "--window", "2"]) == 2
    assert main(["prune", "smollm2-135m", "--unit", "layer"]) == 2
