"""Capture on every zoo twin: rows equal eager weights, outputs unchanged, cleanup, padding, summaries."""

from __future__ import annotations

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import CaptureError, capture  # noqa: E402
from conftest import assert_one_pass_runs_agree, eager_weights  # noqa: E402

# the encoder-decoder twin (whisper) reads audio: tests/test_capture_stacks.py covers it
FAMILIES = [f for f in zoo.FAMILIES if f != "whisper"]


def forward(model, batch, **kw):
    with torch.no_grad():
        out = model(**batch, **kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def valid_queries(batch):
    return batch["attention_mask"].numpy().astype(bool)[:, None, None, :, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_equal_eager_and_outputs_unchanged(family):
    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=10, left_padding=True)
    before = forward(model, batch)
    sink = "learned" if family == "gpt_oss" else "first"
    with capture(model, what="both", sink=sink) as cap:
        during = forward(model, batch)
    assert model.config._attn_implementation != "attncoda"
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-6)
    ds = cap.dataset
    weights = eager_weights(model, batch)
    rows = np.exp(ds.log_attn.values)
    valid = valid_queries(batch)
    np.testing.assert_allclose(np.where(valid, rows, 0), np.where(valid, weights, 0), atol=1e-5)
    # summaries agree with the core applied to the captured rows
    la = ds.log_attn.values
    if family == "gpt_oss":
        la = np.concatenate([ds.learned_sink_log_attn.values[..., None], la], axis=-1)
        sink = None
    else:
        keys = np.arange(la.shape[-1])
        sink = (keys[None, :] == ds.sink_index.values[:, None])[:, None, None, None, :]
        sink = np.broadcast_to(sink, la.shape)
    la = np.where(valid, la, 0.0)  # padding queries have no row; compare the real ones
    if family == "gpt_oss":
        la[..., 0] = np.where(valid[..., 0], la[..., 0], 0.0)
    d = ac.decompose(la.astype(np.float64), sink=sink, from_logits=True, degenerate="nan")
    v = valid[..., 0]
    for name in ac.SUMMARY_VARIABLES:
        got = np.where(v, ds[name].values, np.nan)
        want = np.where(v, getattr(d, name), np.nan)
        finite = np.isfinite(want)
        assert (np.isfinite(got) == finite).all(), name
        np.testing.assert_allclose(got[finite], want[finite], atol=2e-5, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_summaries_equal_explicit(family):
    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=12, left_padding=True)
    with capture(model, what="both") as both:
        forward(model, batch)
    with capture(model, what="summaries") as fast:
        forward(model, batch)
    for name in ac.SUMMARY_VARIABLES:
        np.testing.assert_allclose(
            fast.dataset[name].values, both.dataset[name].values, atol=2e-5, rtol=1e-5, err_msg=name
        )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_summaries_in_one_pass_equal_eager_rows_and_keep_outputs(family, padding, monkeypatch):
    """Summaries and the layer's output from one pass over the logits (the model's kernel not
    run): summaries equal the float64 decomposition of HF eager's weights, outputs stay as
    close to the SDPA forward's as eager's own are (plus fp32 rounding)."""
    from attncoda.hooks import _capture

    model = zoo.tiny_twin(family)
    if padding is None:
        batch = zoo.tiny_batch(model, length=11)
    else:
        batch = zoo.tiny_batch(model, length=11, left_padding=padding == "left")
        if padding == "right":  # the first sample's last 3 tokens are padding
            batch["attention_mask"][0, -3:] = 0
    used = []
    real = _capture._one_pass_summaries
    monkeypatch.setattr(_capture, "_one_pass_summaries", lambda *a: used.append(1) or real(*a))
    before = forward(model, batch)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        eager = forward(model, batch)
    finally:
        model.set_attn_implementation(previous)
    sink = "learned" if family == "gpt_oss" else "first"
    with capture(model, what="summaries", sink=sink) as cap:
        during = forward(model, batch)
    valid = batch["attention_mask"].numpy().astype(bool)
    # without padding every query sees a key: the one pass runs but for learned sinks
    # (GPT-OSS), soft-capped logits (Gemma 2) and a relative position bias (MPNet: a float mask)
    if padding is None:
        assert bool(used) == (family not in ("gpt_oss", "gemma2", "mpnet")), used
    tol = float(np.abs(eager.numpy() - before.numpy()).max()) + 1e-5
    np.testing.assert_array_less(
        np.abs(during.numpy() - before.numpy())[valid], tol, err_msg="outputs moved"
    )
    weights = eager_weights(model, batch).astype(np.float64)
    ds = cap.dataset
    v = valid[:, None, None, :]
    if family == "gpt_oss":
        return  # learned sinks: the rows test above compares them
    keys = np.arange(weights.shape[-1])
    sink_keys = keys[None, :] == ds.sink_index.values[:, None]
    sink_keys = np.broadcast_to(sink_keys[:, None, None, None, :], weights.shape)
    with np.errstate(divide="ignore"):
        logits = np.where(v[..., None], np.log(weights), 0.0)  # -inf at invisible keys
    d = ac.decompose(logits, sink=sink_keys, from_logits=True, degenerate="nan")
    for name in ac.SUMMARY_VARIABLES:
        if name == "balance":  # from the logits, which eager's weights do not give
            continue
        got = np.where(v, ds[name].values, np.nan)
        want = np.where(v, getattr(d, name), np.nan)
        finite = np.isfinite(want)
        assert (np.isfinite(got) == finite).all(), name
        np.testing.assert_allclose(got[finite], want[finite], atol=3e-5, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("family", ["llama", "qwen2", "bert"])
@pytest.mark.parametrize("padding", [None, "right"])
@pytest.mark.parametrize(
    "blocks",
    [(4, None), (4, 3), (1, 1)],
    ids=["4-queries-all-heads", "4-queries-3+1-heads", "1-query-1-head"],
)
def test_one_pass_blocks_of_a_few_queries_give_what_one_block_gives(
    family, padding, blocks, monkeypatch
):
    """The one pass walks the queries in blocks (96 by default, more than a tiny twin's 11) and
    the heads in groups whose block fits its byte budget (every head here): blocks of 4 queries
    (4 + 4 + 3, a ragged last one, keys that grow per block), of every head or in groups of 3
    + 1 (a ragged last group), and blocks of one query of one head give the same summaries and
    outputs, to fp32 rounding, as one block of every head. (Left padding leaves queries that
    see no key: the one pass does not apply there.)"""
    from attncoda.hooks import _capture

    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=11)
    if padding == "right":  # the first sample's last 3 tokens are padding
        batch["attention_mask"][0, -3:] = 0
    n_batch, length = batch["input_ids"].shape
    heads = model.config.num_attention_heads
    used = []
    real = _capture._one_pass_summaries
    monkeypatch.setattr(_capture, "_one_pass_summaries", lambda *a: used.append(1) or real(*a))
    rows, group = blocks
    head_row = 4 * n_batch * length  # one head's logits for one query, in bytes
    budget = 1 << 30 if group is None else head_row * rows * group
    got = {}
    for name, (n_rows, n_bytes) in {"few": (rows, budget), "one": (96, 1 << 30)}.items():
        monkeypatch.setattr(_capture, "_ONE_PASS_ROWS", n_rows)
        monkeypatch.setattr(_capture, "_ONE_PASS_BYTES", n_bytes)
        want = (rows, heads if group is None else group) if name == "few" else (96, heads)
        assert _capture._one_pass_blocks(n_batch, heads, length, 256) == want
        used.clear()
        with capture(model, what="summaries") as cap:
            out = forward(model, batch)
        assert used, f"{name}: the one pass did not run"
        got[name] = (out.numpy(), cap.dataset)
    # the products' shapes change their summation order: fp32 rounding, grown over the layers
    assert_one_pass_runs_agree(got["few"], got["one"], batch["attention_mask"].numpy() == 1)


@pytest.mark.parametrize(
    ("batch", "keys", "chunk", "want"),
    [
        (1, 1024, 256, (96, 9)),  # one group of every head: 9 x 96 x 1024 x 4 B = 3.5 MB
        (1, 2048, 256, (96, 5)),  # groups of 5 + 4 heads under 4 MB
        (1, 4096, 256, (256, 2)),  # long contexts: taller blocks under 8 MB
        (1, 8192, 256, (256, 1)),  # 8 MB: one head
        (4, 8192, 256, (64, 1)),  # a batch of 4: the byte cap shortens the block
        (1, 8192, 100, (100, 2)),  # never more than the chunk (then two heads fit)
        (1, 200_000, 256, (10, 1)),  # a block never exceeds the cap, down to one query
    ],
)
def test_one_pass_block_sizes(batch, keys, chunk, want):
    from attncoda.hooks import _capture

    assert _capture._one_pass_blocks(batch, 9, keys, chunk) == want


def test_padding_and_batching_match_single_samples():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=10, left_padding=True)
    with capture(model, what="rows") as cap:
        forward(model, batch)
    batched = cap.dataset.log_attn.values
    for i in range(batch["input_ids"].shape[0]):
        keep = batch["attention_mask"][i].bool()
        single = {
            "input_ids": batch["input_ids"][i : i + 1, keep],
            "attention_mask": batch["attention_mask"][i : i + 1, keep],
        }
        with capture(model, what="rows") as one:
            forward(model, single)
        n = int(keep.sum())
        ours = batched[i][..., -n:, -n:]
        np.testing.assert_allclose(np.exp(ours), np.exp(one.dataset.log_attn.values[0]), atol=1e-5)


def test_selection_of_layers_heads_queries():
    model = zoo.tiny_twin("qwen2")
    batch = zoo.tiny_batch(model, length=9)
    with capture(model, what="both") as full:
        forward(model, batch)
    with capture(model, layers=[1], heads=[0, 3], queries=[2, -1], what="both") as part:
        forward(model, batch)
    ds = part.dataset
    assert ds.sizes["layer"] == 1 and ds.sizes["head"] == 2 and list(ds["query"].values) == [2, 8]
    ref = full.dataset.sel(layer=[1], head=[0, 3], query=[2, 8])
    for name in (*ac.SUMMARY_VARIABLES, "log_attn"):
        np.testing.assert_allclose(ds[name].values, ref[name].values, atol=1e-6)


def test_restored_after_exception_and_nothing_leaks():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=6)
    previous = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with capture(model) as cap:
            forward(model, batch)
            raise RuntimeError("boom")
    assert model.config._attn_implementation == previous
    assert len(model._forward_pre_hooks) == 0
    # the next capture starts empty and works
    with capture(model, layers=[0]) as cap2:
        forward(model, zoo.tiny_batch(model, length=4, batch=1))
    assert cap2.dataset.sizes["query"] == 4 and cap2.dataset.sizes["sample"] == 1
    assert cap.dataset.sizes["sample"] == 2  # the first capture kept what it saw


def test_capture_during_generate_appends_queries():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=5, batch=1)
    with capture(model, what="both") as cap, torch.no_grad():
        out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=2)
    ds = cap.dataset
    total = out.shape[1]
    assert list(ds["query"].values) == list(range(total - 1))
    assert ds.sizes["key"] == total - 1
    # each generated step's row equals a fresh forward over the same prefix
    with capture(model, what="rows") as ref:
        forward(model, {"input_ids": out[:, :-1], "attention_mask": torch.ones_like(out[:, :-1])})
    np.testing.assert_allclose(
        np.exp(ds.log_attn.values), np.exp(ref.dataset.log_attn.values), atol=1e-5
    )


def test_sliding_window_rows_without_visible_sink():
    model = zoo.tiny_twin("gemma3")  # window 4 < length
    batch = zoo.tiny_batch(model, length=12)
    with capture(model, what="both") as cap:
        forward(model, batch)
    ds = cap.dataset
    sliding = [i for i, t in enumerate(model.config.layer_types) if t == "sliding_attention"]
    late = ds.sel(layer=sliding[0], query=11)
    assert float(late.sink_share.max()) == 0.0  # the sink is outside the window: no sink mass
    np.testing.assert_allclose(late.content_entropy.values, late.entropy.values, atol=1e-6)


def test_save_load_round_trip(tmp_path):
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=6)
    with capture(model, what="both") as cap:
        forward(model, batch)
    ds = cap.dataset
    for name in ("cap.nc", "cap.zarr"):
        path = ac.save(ds, tmp_path / name)
        back = ac.load(path)
        assert back.identical(ds) if name.endswith(".nc") else back.load().equals(ds)
        spec = back.attrs["capture_spec"]
        assert '"what": "both"' in spec
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap.nc", "cap.zarr"]  # no temp leftovers
    appended = ac.save(ds, tmp_path / "cap.zarr", append=True)
    assert ac.load(appended).sizes["sample"] == 2 * ds.sizes["sample"]
    with pytest.raises(ValueError, match="suffix"):
        ac.save(ds, tmp_path / "cap.bin")


def test_bad_requests_give_clear_errors():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=4)
    with pytest.raises(CaptureError, match="out of range"):
        with capture(model, layers=[7]):
            pass
    with pytest.raises(CaptureError, match="what="):
        with capture(model, what="everything"):
            pass
    with pytest.raises(CaptureError, match="empty"):
        with capture(model, heads=[]):
            pass
    with capture(model) as cap:
        pass
    with pytest.raises(CaptureError, match="recorded nothing"):
        _ = cap.dataset
    with capture(model):
        with pytest.raises(CaptureError, match="nested"):
            with capture(model):
                pass
        forward(model, batch)
    with pytest.raises(CaptureError, match="learned"):
        with capture(model, sink="learned"):
            forward(model, batch)
    assert model.config._attn_implementation == "sdpa"


def test_fallback_for_models_that_cannot_switch(old_style_model):
    model = old_style_model
    batch = {
        "input_ids": torch.randint(0, 50, (1, 8)),
        "attention_mask": torch.ones(1, 8, dtype=torch.long),
    }
    with capture(model, what="both") as cap:
        forward(model, batch)
    assert cap.fallback
    weights = eager_weights(model, batch)
    np.testing.assert_allclose(np.exp(cap.dataset.log_attn.values), weights, atol=1e-6)


def test_independent_forwards_become_samples_padded():
    model = zoo.tiny_twin("llama")
    a = zoo.tiny_batch(model, length=6, batch=1, seed=1)
    b = zoo.tiny_batch(model, length=9, batch=2, seed=2)
    with capture(model, what="both") as cap:
        forward(model, a)
        forward(model, b)
    ds = cap.dataset
    assert ds.sizes["sample"] == 3 and ds.sizes["query"] == 9 and ds.sizes["key"] == 9
    assert np.isnan(ds.sink_share.sel(sample=0, query=8)).all()  # padded: no such query
    assert np.isneginf(ds.log_attn.sel(sample=0, query=3, key=7)).all()
    with capture(model, what="both") as alone:
        forward(model, a)
    np.testing.assert_allclose(
        ds.sink_share.isel(sample=0, query=slice(0, 6)).values, alone.dataset.sink_share.values[0]
    )


def test_stream_rows_to_zarr(tmp_path):
    model = zoo.tiny_twin("qwen2")
    store = tmp_path / "rows.zarr"
    batches = [zoo.tiny_batch(model, length=7, batch=2, seed=s) for s in range(3)]
    with capture(model, what="rows", layers=[1], stream_to=store) as cap:
        for batch in batches:
            forward(model, batch)
    ds = cap.dataset
    assert ds.sizes["sample"] == 6
    with capture(model, what="rows", layers=[1]) as ref:
        forward(model, batches[2])
    np.testing.assert_array_equal(
        ds.log_attn.isel(sample=slice(4, 6)).values, ref.dataset.log_attn.values
    )
    with pytest.raises(CaptureError, match="already exists"):
        with capture(model, stream_to=store):
            pass


def test_plugin_bias_is_captured():
    from attncoda.hooks._registry import AttentionPlugin, plugged

    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=6, batch=1)

    class SinkBoost(AttentionPlugin):
        """Adds +2 to every row's logit on key 0, per head (a per-head float mask)."""

        def adjust_mask(self, module, layer, query, key, mask, kwargs):
            q_len, kv_len = query.shape[-2], key.shape[-2]
            causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
            bias = torch.where(causal, 0.0, torch.finfo(query.dtype).min)
            bias = bias.expand(query.shape[0], query.shape[1], q_len, kv_len).clone()
            bias[..., 0] += 2.0
            return bias

    with capture(model, what="rows") as plain:
        forward(model, batch)
    with plugged(model, SinkBoost(model)), capture(model, what="rows") as boosted:
        forward(model, batch)
    assert model.config._attn_implementation == "sdpa"
    p0, p1 = np.exp(plain.dataset.log_attn.values), np.exp(boosted.dataset.log_attn.values)
    # perturbation by the bias: ratios to key 0 change by exactly e^2 in layer 0 (same inputs)
    ratio = (p1[0, 0, :, 1:, 0] / p1[0, 0, :, 1:, 1]) / (p0[0, 0, :, 1:, 0] / p0[0, 0, :, 1:, 1])
    np.testing.assert_allclose(ratio, np.e**2, rtol=1e-4)


def test_half_precision_model_captures_in_fp32():
    model = zoo.tiny_twin("llama", dtype="bfloat16")
    batch = zoo.tiny_batch(model, length=8)
    with capture(model, what="both") as cap:
        forward(model, batch)
    ds = cap.dataset
    assert ds.sink_share.dtype == np.float32 and ds.attrs["dtype"] == "bfloat16"
    sums = np.exp(ds.log_attn.values).sum(-1)
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)  # fp32 rows, no bf16 rounding zeros


@pytest.mark.gpu
def test_capture_on_cuda_matches_cpu():
    model = zoo.tiny_twin("llama")
    batch = zoo.tiny_batch(model, length=16, left_padding=True)
    with capture(model, what="both") as cpu:
        forward(model, batch)
    gpu_model = model.to("cuda", dtype=torch.bfloat16)
    with capture(gpu_model, what="both") as gpu:
        forward(gpu_model, {k: v.cuda() for k, v in batch.items()})
    np.testing.assert_allclose(
        gpu.dataset.sink_share.values, cpu.dataset.sink_share.values, atol=2e-2
    )
