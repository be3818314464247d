"""ARACH plug-in on tiny twins: the mask, no leakage, b -> -inf, eager = SDPA = fast, the API."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import arach, capture  # noqa: E402
from attncoda.hooks._registry import observed  # noqa: E402

FAMILIES = ["llama", "gpt2", "qwen2", "gemma3"]
NEG_INF = float("-inf")


def ids_for(model, batch=2, length=12, seed=0, **kw):
    return zoo.tiny_batch(model, batch=batch, length=length, seed=seed, **kw)


def logits(fn, **inputs):
    with torch.no_grad():
        return fn(**inputs).logits


def expected_mask(t, b, key_valid=None, window=None, hub=True):
    """The four quadrants, written out entry by entry."""
    neg = torch.finfo(torch.float32).min
    n_b = 1 if key_valid is None else key_valid.shape[0]
    m = torch.full((n_b, 1, 2 * t, 2 * t), neg)
    for s in range(n_b):
        for half in (0, t):  # verbal queries, then hub queries
            for i in range(t):
                for j in range(t):
                    ok = j <= i and (window is None or j > i - window)
                    if key_valid is not None:
                        ok = (ok and bool(key_valid[s, j])) or i == j
                    if ok:
                        m[s, 0, half + i, j] = 0.0
                if hub and b > -math.inf:
                    m[s, 0, half + i, t + i] = b
    return m


# ------------------------------------------------------------------------------------------
# the mask


@pytest.mark.parametrize("b", [0.0, -0.5, -4.0, NEG_INF])
def test_dense_mask_is_the_four_quadrants_plus_offset(b):
    t = 5
    got = arach.dense_mask(t, b)
    torch.testing.assert_close(got, expected_mask(t, b), rtol=0, atol=0)
    # the quadrants by name
    neg = torch.finfo(torch.float32).min
    m = got[0, 0]
    vv, vh, hv, hh = m[:t, :t], m[:t, t:], m[t:, :t], m[t:, t:]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    eye = torch.eye(t, dtype=torch.bool)
    for q in (vv, hv):
        assert bool((q[causal] == 0).all()) and bool((q[~causal] == neg).all())
    for q in (vh, hh):
        if b > -math.inf:
            assert bool((q[eye] == b).all())
        assert bool((q[~eye] == neg).all())


def test_dense_mask_padding_window_and_hubs_off():
    t = 6
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    got = arach.dense_mask(t, -0.5, key_valid=valid, window=3)
    torch.testing.assert_close(got, expected_mask(t, -0.5, valid, window=3), rtol=0, atol=0)
    off = arach.dense_mask(t, -0.5, hub_visible=False)
    torch.testing.assert_close(off, expected_mask(t, -0.5, hub=False), rtol=0, atol=0)
    assert arach.dense_mask(3, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_layer_receives_the_arach_mask(family):
    """What the attention of each layer gets in dense mode (gemma3: sliding window 4, T=10)."""
    model = zoo.tiny_twin(family)
    ids = ids_for(model, batch=1, length=10)["input_ids"]
    seen = {}

    def record(module, layer, query, key, mask, scaling, kwargs, value=None):
        seen[layer] = (mask.clone(), kwargs.get("sliding_window"))

    plug = arach.Arach(model, mode="dense", offset=-0.75, layers=[1])
    with observed(model, record), torch.no_grad():
        plug(input_ids=ids)
    assert sorted(seen) == [0, 1]
    for layer, (mask, window) in seen.items():
        want = expected_mask(10, -0.75, window=window, hub=layer == 1)
        torch.testing.assert_close(mask.float(), want, rtol=0, atol=0)
    if family == "gemma3":
        assert seen[0][1] == 4  # the sliding layer kept its window


# ------------------------------------------------------------------------------------------
# no leakage through any path


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["fast", "dense"])
@pytest.mark.parametrize("hub_embedding", ["token", "mean", "zeros"])
def test_no_verbal_token_sees_a_future_token(family, mode, hub_embedding):
    model = zoo.tiny_twin(family)
    plug = arach.Arach(model, mode=mode, hub_embedding=hub_embedding, offset=0.0)
    ids = ids_for(model, batch=1, length=12)["input_ids"]
    base = logits(plug, input_ids=ids)
    cut = 6
    changed = ids.clone()
    gen = torch.Generator().manual_seed(1)
    changed[:, cut:] = torch.randint(4, 100, (1, 12 - cut), generator=gen)
    assert not torch.equal(changed, ids)
    after = logits(plug, input_ids=changed)
    torch.testing.assert_close(after[:, :cut], base[:, :cut], rtol=0, atol=1e-5)
    assert (after[:, cut:] - base[:, cut:]).abs().max() > 1e-3  # the future did change


# ------------------------------------------------------------------------------------------
# b -> -inf is the plain model; fast = dense; eager = sdpa


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["fast", "dense"])
def test_minus_inf_offset_reproduces_the_plain_model(family, mode):
    model = zoo.tiny_twin(family)
    batch = ids_for(model, length=12)
    plain = logits(model, **batch)
    for hub_embedding in ("token", "mean"):
        plug = arach.Arach(model, mode=mode, offset=NEG_INF, hub_embedding=hub_embedding)
        torch.testing.assert_close(logits(plug, **batch), plain, rtol=0, atol=2e-5)
    # a very negative finite offset converges to the same logits
    plug = arach.Arach(model, mode=mode, offset=-60.0)
    torch.testing.assert_close(logits(plug, **batch), plain, rtol=0, atol=2e-5)


@pytest.mark.parametrize("mode", ["fast", "dense"])
def test_minus_inf_with_left_and_right_padding(mode):
    model = zoo.tiny_twin("llama")
    batch = ids_for(model, batch=3, length=10, left_padding=True)
    am = batch["attention_mask"]
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    plain = logits(model, **batch, position_ids=pos)
    got = logits(arach.Arach(model, mode=mode, offset=NEG_INF), **batch)
    valid = am.bool()
    torch.testing.assert_close(got[valid], plain[valid], rtol=0, atol=2e-5)
    # right padding: positions are the plain arange
    right = {"input_ids": batch["input_ids"].flip(-1), "attention_mask": am.flip(-1)}
    plain_r = logits(model, **right)
    got_r = logits(arach.Arach(model, mode=mode, offset=NEG_INF), **right)
    valid_r = right["attention_mask"].bool()
    torch.testing.assert_close(got_r[valid_r], plain_r[valid_r], rtol=0, atol=2e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_sdpa_and_fast_agree(family):
    results = {}
    for impl in ("eager", "sdpa"):
        model = zoo.tiny_twin(family, attn_implementation=impl)
        batch = ids_for(model, length=12)
        for mode in ("dense", "fast"):
            results[impl, mode] = logits(arach.Arach(model, mode=mode), **batch)
    ref = results["sdpa", "dense"]
    assert (ref - logits(model, **batch)).abs().max() > 1e-3  # ARACH changes the output
    for key, val in results.items():
        torch.testing.assert_close(val, ref, rtol=0, atol=2e-5, msg=f"{key}")


@pytest.mark.parametrize(
    "options",
    [
        {"layers": [1]},
        {"layers": [-2]},
        {"layers": "first_half"},
        {"layers": "last_half"},
        {"hub_positions": "none"},
        {"hub_embedding": "mean", "offset": 1.0},
        {"hub_embedding": "zeros", "offset": -2.0},
        {"hub_token_id": 7},
    ],
)
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_fast_equals_dense_for_every_option(family, options):
    model = zoo.tiny_twin(family)
    batch = ids_for(model, batch=2, length=11, left_padding=True)
    fast = logits(arach.Arach(model, **options), **batch)
    dense = logits(arach.Arach(model, mode="dense", **options), **batch)
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(fast[valid], dense[valid], rtol=0, atol=2e-5)


def test_named_layer_sets_are_the_halves():
    """``layers="first_half"``/``"last_half"`` resolve to the model's halves and give exactly
    the outputs of the explicit layer lists; the two halves differ from each other and from
    all layers (so the option reaches the attention)."""
    model = zoo.tiny_twin("llama")
    n = len(model.model.layers)
    batch = ids_for(model, length=9)
    first = arach.Arach(model, layers="first_half")
    last = arach.Arach(model, layers="last_half")
    assert first.hub_layers == frozenset(range(n // 2))
    assert last.hub_layers == frozenset(range(n // 2, n))
    out = {k: logits(w, **batch) for k, w in (("first", first), ("last", last))}
    explicit = logits(arach.Arach(model, layers=list(range(n // 2))), **batch)
    torch.testing.assert_close(out["first"], explicit, rtol=0, atol=0)
    every = logits(arach.Arach(model), **batch)
    assert (out["first"] - out["last"]).abs().max() > 1e-4
    assert (out["first"] - every).abs().max() > 1e-4


def test_softcapped_attention_fast_equals_dense():
    model = zoo.tiny_twin("gemma2")  # attention softcap, eager only
    batch = ids_for(model, length=10)
    fast = logits(arach.Arach(model), **batch)
    dense = logits(arach.Arach(model, mode="dense"), **batch)
    torch.testing.assert_close(fast, dense, rtol=0, atol=2e-5)


def test_options_change_the_output():
    model = zoo.tiny_twin("llama")
    batch = ids_for(model, length=10)
    outs = [
        logits(arach.Arach(model, **o), **batch)
        for o in ({}, {"offset": -2.0}, {"hub_embedding": "mean"}, {"hub_positions": "none"})
    ]
    for a in outs[1:]:
        assert (a - outs[0]).abs().max() > 1e-4


def test_gpt2_hub_positions_none_cancels_wpe():
    model = zoo.tiny_twin("gpt2")
    plug = arach.Arach(model, hub_positions="none", hub_embedding="zeros")
    inp = plug.build(torch.tensor([[5, 6, 7]]))
    t = 3
    hub_in = inp["inputs_embeds"][:, t:] + model.transformer.wpe(inp["position_ids"][:, t:])
    torch.testing.assert_close(hub_in, torch.zeros_like(hub_in), rtol=0, atol=1e-6)


def test_loss_and_logits_to_keep():
    model = zoo.tiny_twin("llama")
    ids = ids_for(model, length=10)["input_ids"]
    plug = arach.Arach(model)
    with torch.no_grad():
        out = plug(input_ids=ids, labels=ids)
        lg = out.logits
        ref = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
        torch.testing.assert_close(out.loss, ref)
        last = plug(input_ids=ids, logits_to_keep=3).logits
        torch.testing.assert_close(last, lg[:, -3:], rtol=0, atol=1e-5)
        two_d = plug(input_ids=ids, logits_to_keep=torch.tensor([[0, 4], [2, 9]])).logits
        torch.testing.assert_close(two_d[1, 1], lg[1, 9], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------
# context manager, wrapper, generation, errors


def test_context_manager_patches_and_restores():
    model = zoo.tiny_twin("llama")
    batch = ids_for(model, length=8)
    plain = logits(model, **batch)
    want = logits(arach.Arach(model, offset=-1.0), **batch)
    with arach.enabled(model, offset=-1.0):
        inside = logits(model, **batch)
        with pytest.raises(arach.ArachError, match="generate"):
            model.generate(batch["input_ids"], max_new_tokens=2)
        with pytest.raises(arach.ArachError, match="already enabled"):
            arach.enabled(model).__enter__()
    torch.testing.assert_close(inside, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits(model, **batch), plain, rtol=0, atol=0)
    assert "forward" not in model.__dict__ and "generate" not in model.__dict__
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), arach.enabled(model):
        raise RuntimeError("boom")
    assert "forward" not in model.__dict__
    torch.testing.assert_close(logits(model, **batch), plain, rtol=0, atol=0)


def test_wrapper_inside_a_block_does_not_apply_twice():
    model = zoo.tiny_twin("llama")
    batch = ids_for(model, length=8)
    want = logits(arach.Arach(model, offset=-2.0), **batch)
    with arach.enabled(model, offset=-0.5):
        got = logits(arach.Arach(model, offset=-2.0), **batch)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_generate_greedy_matches_plain_at_minus_inf():
    model = zoo.tiny_twin("llama")
    ids = ids_for(model, batch=1, length=6)["input_ids"]
    out = arach.Arach(model, offset=NEG_INF).generate(ids, max_new_tokens=5)
    ref = ids
    with torch.no_grad():
        for _ in range(5):
            nxt = model(input_ids=ref).logits[:, -1].argmax(-1, keepdim=True)
            ref = torch.cat([ref, nxt], dim=1)
    assert torch.equal(out, ref)
    on = arach.Arach(model).generate(ids, max_new_tokens=5)
    assert on.shape == (1, 11) and torch.equal(on[:, :6], ids)


@pytest.mark.parametrize(
    ("options", "exc", "match"),
    [
        ({"offset": float("nan")}, ValueError, "offset"),
        ({"offset": float("inf")}, ValueError, "offset"),
        ({"offset": "big"}, TypeError, "offset"),
        ({"hub_embedding": "first"}, ValueError, "hub_embedding"),
        ({"hub_positions": "zero"}, ValueError, "hub_positions"),
        ({"mode": "sparse"}, ValueError, "mode"),
        ({"layers": []}, ValueError, "empty"),
        ({"layers": [5]}, ValueError, "out of range"),
        ({"layers": "all"}, ValueError, "first_half"),
        ({"layers": b"first_half"}, TypeError, "layers"),
        ({"hub_embedding": "mean", "hub_token_id": 3}, ValueError, "hub_token_id"),
        ({"hub_token_id": 10_000}, ValueError, "vocabulary"),
    ],
)
def test_bad_options(options, exc, match):
    model = zoo.tiny_twin("llama")
    with pytest.raises(exc, match=match):
        arach.Arach(model, **options)


def test_unsupported_models_and_situations():
    with pytest.raises(arach.ArachError, match="causal LM"):
        arach.Arach(zoo.tiny_twin("bert"))
    model = zoo.tiny_twin("llama")
    ids = ids_for(model, length=6)["input_ids"]
    plug = arach.Arach(model)
    with pytest.raises(arach.ArachError, match="cache"):
        plug(input_ids=ids, use_cache=True)
    with pytest.raises(ValueError, match="2-D padding mask"):
        plug(input_ids=ids, attention_mask=torch.ones(2, 1, 6, 6))
    with pytest.raises(arach.ArachError, match="capture"), capture(model):
        plug(input_ids=ids)
    with pytest.raises(arach.ArachError, match="only runs inside"):
        model.set_attn_implementation(arach.FAST_ATTENTION_NAME)
        try:
            model(input_ids=ids)
        finally:
            model.set_attn_implementation("sdpa")


# ------------------------------------------------------------------------------------------
# ARACH rows through the core


def test_grouped_decomposition_of_one_arach_row_matches_core():
    """A captured ARACH row regrouped by hand equals ac.group_decompose's shares."""
    model = zoo.tiny_twin("llama")
    ids = ids_for(model, batch=1, length=8)["input_ids"]
    with capture(model, what="rows", queries=list(range(8))) as cap, torch.no_grad():
        with arach.enabled(model, mode="dense"):
            model(input_ids=ids)
    rows = cap.dataset.log_attn.values[0]  # (layer, head, 8, 16)
    p = np.exp(rows[0, 0, 5])
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-5)
    assert np.all(p[6:8] == 0) and np.all(p[8:13] == 0) and p[13] > 0 and np.all(p[14:] == 0)
    g = ac.group_decompose(
        rows[0, 0, 5].astype(np.float64), [[0], [13], [1, 2, 3, 4, 5]], from_logits=True
    )
    np.testing.assert_allclose(g.shares, [p[0], p[13], p[1:6].sum()], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_equals_dense_on_cuda(dtype):
    model = zoo.tiny_twin("llama", dtype=dtype).to("cuda")
    batch = ids_for(model, length=40)
    tol = 2e-5 if dtype == "float32" else 5e-2
    for options in ({}, {"layers": [0]}):
        fast = logits(arach.Arach(model, **options), **batch).float()
        dense = logits(arach.Arach(model, mode="dense", **options), **batch).float()
        torch.testing.assert_close(fast, dense, rtol=0, atol=tol)
    padded = ids_for(model, length=40, left_padding=True)
    fast = logits(arach.Arach(model), **padded).float()
    dense = logits(arach.Arach(model, mode="dense"), **padded).float()
    valid = padded["attention_mask"].bool()
    torch.testing.assert_close(fast[valid], dense[valid], rtol=0, atol=tol)
