"""Capture never returns silently wrong data: hostile arguments, positions a forward pass does not
have, fixed sinks that are not keys, and a dataset that must follow the forwards of its block.

Every refusal is a one-line CaptureError naming the argument and the bad value, raised before the
work (the model is restored and nothing ran), or, for positions only a later cached step could
have, when the pass ends.
"""

from __future__ import annotations

import numpy as np
import pytest

import attncoda as ac
from conftest import need

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import CaptureError, capture  # noqa: E402
from attncoda.hooks import _capture as capture_module  # noqa: E402
from attncoda.hooks._registry import attention_modules  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return zoo.tiny_twin("llama")  # 2 layers, 4 heads


@pytest.fixture(scope="module")
def batch(llama):
    return zoo.tiny_batch(llama, length=8)


def forward(model, batch, **kw):
    with torch.no_grad():
        out = model(**batch, **kw)
    return out.logits


class LayerCalls:
    """Counts calls of the model's first attention module (did any work happen?)."""

    def __init__(self, model):
        self.n = 0
        self.handle = attention_modules(model)[0].register_forward_pre_hook(self.count)

    def count(self, *_):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def assert_clean(model, previous="sdpa"):
    """The model is back as it was: implementation, no hooks left, no capture marked."""
    assert model.config._attn_implementation == previous
    assert len(model._forward_pre_hooks) == 0 and len(model._forward_hooks) == 0
    assert id(model) not in capture_module._CAPTURING


def refused(model, batch=None, match=None, **kwargs):
    """Run ``capture(model, **kwargs)`` around one forward; return the one-line error message."""
    with LayerCalls(model) as calls, pytest.raises(CaptureError, match=match) as info:
        with capture(model, **kwargs):
            if batch is not None:
                forward(model, batch)
    message = str(info.value)
    assert "\n" not in message
    assert calls.n == 0, "refused after the attention work had started"
    assert_clean(model)
    return message


# --------------------------------------------------------------------------------------------
# types: an int is an int


BAD_SELECTIONS = [
    (True, "a bool"),
    (np.bool_(False), "a bool"),
    (1.0, "a float"),
    (1.7, "a float"),
    (np.float64(1), "a float"),
    ([1.7], "a float"),
    ([0, True], "a bool"),
    ([[0, 1]], "nested"),
    ("first", "not a selection"),
    ("ALL", "not a selection"),
    ({0, 1}, "set"),
    (np.array([0.0, 1.0]), "float64 array"),
    (np.array([[0, 1]]), "2-D"),
    (slice(0, 2, 0), "step 0"),
    (slice(0.0, 2), "a float"),
    (slice(0, True), "a bool"),
]


@pytest.mark.parametrize("name", ["layers", "heads", "queries"])
@pytest.mark.parametrize(("value", "why"), BAD_SELECTIONS, ids=repr)
def test_selections_refuse_non_ints(llama, name, value, why):
    message = refused(llama, **{name: value})
    assert message.startswith(f"{name}=") and why in message
    assert "pass" in message or "use" in message


@pytest.mark.parametrize(
    ("value", "layers", "heads"),
    [
        (np.int64(1), [1], [1]),
        (np.int32(-1), [1], [3]),
        (range(2), [0, 1], [0, 1]),
        ((1, 0), [0, 1], [0, 1]),
        (np.array([1]), [1], [1]),
        (slice(np.int64(1), None), [1], [1, 2, 3]),
        ("all", [0, 1], [0, 1, 2, 3]),
        (None, [0, 1], [0, 1, 2, 3]),
    ],
    ids=repr,
)
def test_selections_accept_python_and_numpy_ints(llama, batch, value, layers, heads):
    with capture(llama, layers=value, heads=value) as cap:
        forward(llama, batch)
    assert list(cap.dataset["layer"].values) == layers
    assert list(cap.dataset["head"].values) == heads


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": [1, 1]}, r"layers=\[1, 1\] names 1 more than once"),
        ({"layers": [1, -1]}, r"names layer 1 twice \(1 and -1\)"),
        ({"heads": [0, -4]}, r"names head 0 twice"),
        ({"queries": [3, 3]}, r"queries=\[3, 3\] names 3 more than once"),
        ({"sink": [0, 0]}, r"sink=\[0, 0\] names 0 more than once"),
        ({"queries": []}, r"queries=\[\] is empty"),
        ({"layers": range(0)}, r"layers=range\(0, 0\) is empty"),
        ({"sink": []}, r"sink=\[\] is empty"),
        ({"heads": slice(5, None)}, r"selection is empty"),
        ({"layers": [2]}, r"out of range.*-2\.\.1"),
        ({"layers": -3}, r"out of range"),
    ],
    ids=str,
)
def test_duplicates_empty_and_out_of_range_are_refused(llama, kwargs, match):
    refused(llama, match=match, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sink": True}, r"sink=True is a bool"),
        ({"sink": 1.0}, r"sink=1\.0 is a float"),
        ({"sink": np.float64(0)}, r"is a float"),
        ({"sink": "last"}, r"sink='last' is not a sink"),
        ({"sink": None}, r"sink=None"),
        ({"sink": [0, 1.0]}, r"holds 1\.0, a float"),
        ({"sink": slice(0, 1)}, r"sink=slice"),
        ({"sink": -1}, r"sink=-1.*negative.*>= 0"),
        ({"sink": [0, -2]}, r"negative"),
        ({"chunk_size": True}, r"chunk_size=True is not a positive int"),
        ({"chunk_size": 0}, r"chunk_size=0"),
        ({"chunk_size": 2.0}, r"chunk_size=2\.0"),
        ({"chunk_size": "8"}, r"chunk_size='8'"),
        ({"what": "ROWS"}, r"what='ROWS' is not a choice"),
        ({"what": ["rows"]}, r"what=\['rows'\]"),
        ({"what": None}, r"what=None"),
        ({"stream_to": 3}, r"stream_to=3 is of type int"),
        ({"stream_to": b"x.zarr"}, r"stream_to=b'x.zarr'"),
        ({"stream_to": "x.nc"}, r"\.zarr"),
    ],
    ids=str,
)
def test_other_arguments_refuse_bad_values(llama, kwargs, match):
    refused(llama, match=match, **kwargs)


def test_stream_to_must_be_new_and_writable(llama, tmp_path):
    (tmp_path / "taken.zarr").mkdir()
    refused(llama, match="already exists", stream_to=tmp_path / "taken.zarr")
    (tmp_path / "file").write_text("")
    refused(llama, match="not a writable folder", stream_to=tmp_path / "file" / "x.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "taken.zarr"]


def test_numpy_sinks_and_chunk_sizes_are_ints(llama, batch):
    with capture(llama, what="both", sink=1, chunk_size=3) as plain:
        forward(llama, batch)
    with capture(llama, what="both", sink=np.int64(1), chunk_size=np.int64(3)) as numpy:
        forward(llama, batch)
    assert '"sink": 1' in numpy.dataset.attrs["capture_spec"]
    np.testing.assert_array_equal(numpy.dataset.sink_share.values, plain.dataset.sink_share.values)
    # the sink share of a fixed sink is the row's mass on that key, where the key is visible
    ds = plain.dataset.sel(query=slice(1, None))
    np.testing.assert_allclose(
        ds.sink_share.values, np.exp(ds.log_attn.sel(key=1).values), atol=1e-6
    )
    with capture(llama, what="summaries", sink=np.array([0, 2])) as two:
        forward(llama, batch)
    assert '"sink": [0, 2]' in two.dataset.attrs["capture_spec"]


# --------------------------------------------------------------------------------------------
# query positions: no silent wraparound, no silent drops


@pytest.mark.parametrize(
    ("queries", "match"),
    [
        (-100, r"queries=\[-100\]: -100 lie\(s\) outside -8\.\.7 for a forward call of 8 tokens"),
        (-9, r"outside -8\.\.7"),
        ([3, 100], r"queries=\[3, 100\]: position\(s\) \[100\] do not exist .* 8 tokens"),
        ([100], r"\[100\] do not exist"),
        (8, r"\[8\] do not exist"),
        ([7, -1], r"\[7, -1\] all name position\(s\) \[7\]"),
        (slice(20, None), r"selects no position of a forward pass of 8 tokens"),
        (range(6, 10), r"\[8, 9\] do not exist"),
    ],
    ids=str,
)
def test_queries_a_forward_does_not_have_are_refused_before_the_work(llama, batch, queries, match):
    before = forward(llama, batch)
    refused(llama, batch, match=match, queries=queries)
    np.testing.assert_array_equal(forward(llama, batch).numpy(), before.numpy())


def test_queries_at_the_edges_are_accepted(llama, batch):
    with capture(llama, queries=[-8, 7], what="rows") as cap:
        forward(llama, batch)
    assert list(cap.dataset["query"].values) == [0, 7]
    with capture(llama, queries=slice(-100, 2)) as cap:  # a slice keeps Python's semantics
        forward(llama, batch)
    assert list(cap.dataset["query"].values) == [0, 1]


def test_independent_forwards_of_different_lengths_each_checked(llama):
    short, long = zoo.tiny_batch(llama, length=4), zoo.tiny_batch(llama, length=8)
    with LayerCalls(llama) as calls, pytest.raises(CaptureError, match="4 tokens"):
        with capture(llama, queries=[5]):
            forward(llama, long)
            assert calls.n == 1
            forward(llama, short)
    assert calls.n == 1  # the short pass did no work
    assert_clean(llama)


def test_generate_positions_that_appear_later_are_accepted(llama):
    prompt = zoo.tiny_batch(llama, length=5, batch=1)
    with torch.no_grad(), capture(llama, queries=[2, 6], what="both") as cap:
        out = llama.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert out.shape[1] == 8  # positions 0..6 are forwarded; 7 is only sampled
    ds = cap.dataset
    assert list(ds["query"].values) == [2, 6]
    with capture(llama, what="rows") as ref:
        forward(llama, {"input_ids": out[:, :-1], "attention_mask": torch.ones_like(out[:, :-1])})
    np.testing.assert_allclose(
        np.exp(ds.log_attn.values), np.exp(ref.dataset.log_attn.sel(query=[2, 6]).values), atol=1e-5
    )


def test_generate_positions_that_never_appear_are_refused_at_the_dataset(llama):
    prompt = zoo.tiny_batch(llama, length=5, batch=1)
    with torch.no_grad(), capture(llama, queries=[2, 7, 9]) as cap:
        llama.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert_clean(llama)
    with pytest.raises(CaptureError, match=r"position\(s\) \[7, 9\] never occurred.*7 tokens"):
        _ = cap.dataset
    # ... and when the next independent forward pass begins, before its work
    with LayerCalls(llama) as calls, pytest.raises(CaptureError, match=r"\[7\] never occurred"):
        with torch.no_grad(), capture(llama, queries=[7]):
            llama.generate(**prompt, max_new_tokens=2, do_sample=False, pad_token_id=2)
            n = calls.n
            forward(llama, zoo.tiny_batch(llama, length=8))
    assert calls.n == n
    assert_clean(llama)


def test_negative_queries_beyond_the_prompt_refused_in_generate(llama):
    prompt = zoo.tiny_batch(llama, length=5, batch=1)
    with pytest.raises(CaptureError, match=r"outside -5\.\.4"), torch.no_grad():
        with capture(llama, queries=-6):
            llama.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert_clean(llama)


def test_an_explicit_cache_object_lets_a_later_step_supply_the_position(llama, batch):
    from transformers import DynamicCache

    with torch.no_grad(), capture(llama, queries=[8], what="rows") as cap:
        cache = DynamicCache()
        out = llama(**batch, cache=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([batch["attention_mask"], torch.ones_like(nxt)], dim=1)
        llama(input_ids=nxt, attention_mask=mask, cache=cache, use_cache=True)
    ds = cap.dataset
    assert list(ds["query"].values) == [8] and ds.sizes["key"] == 9
    assert np.isfinite(ds.log_attn.values).all()  # position 8 sees all 9 keys


def test_static_or_sliding_caches_are_refused_not_misplaced():
    model = zoo.tiny_twin("gemma3")  # layer 0 slides over 4 keys; layer 1 is full
    prompt = zoo.tiny_batch(model, length=6, batch=1)
    with torch.no_grad(), capture(model, what="rows") as cap:
        with pytest.raises(CaptureError, match="layer 0 holds 4 keys for 7 positions"):
            model.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert_clean(model, previous=model.config._attn_implementation)
    # the prompt's pass completed and is kept; the failed step left nothing behind
    assert list(cap.dataset["query"].values) == list(range(6))
    assert list(cap.dataset["layer"].values) == [0, 1]
    with torch.no_grad(), capture(model, layers=[1], queries=[6, 7]) as full:
        model.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert list(full.dataset["query"].values) == [6, 7]


# --------------------------------------------------------------------------------------------
# fixed sinks


@pytest.mark.parametrize("sink", [8, 99, [0, 8]], ids=str)
def test_sinks_beyond_the_keys_are_refused_before_the_work(llama, batch, sink):
    refused(llama, batch, match=r"do not exist in a forward call over 8 keys", sink=sink)


def test_sink_on_a_padding_key_is_refused(llama):
    batch = zoo.tiny_batch(llama, length=8, left_padding=True)
    first = batch["attention_mask"].int().argmax(-1)
    assert int(first.max()) > 0  # some sample is padded
    message = refused(llama, batch, sink=0)
    padded = int((first > 0).nonzero()[0])
    assert f"key 0 is padding in sample {padded}" in message and "sink='first'" in message


def test_sink_beyond_a_samples_first_valid_token_is_a_real_key(llama):
    batch = zoo.tiny_batch(llama, length=8, left_padding=True)
    sink = int(batch["attention_mask"].int().argmax(-1).max()) + 1  # real in every sample
    with capture(llama, what="both", sink=sink) as cap:
        forward(llama, batch)
    ds = cap.dataset
    valid = batch["attention_mask"].numpy().astype(bool)
    share = ds.sink_share.values  # (sample, layer, head, query)
    for i in range(len(valid)):
        q = np.flatnonzero(valid[i])
        before, after = q[q < sink], q[q >= sink]
        assert (share[i][..., before] == 0).all()  # causal: the sink is not visible yet
        np.testing.assert_allclose(
            share[i][..., after], np.exp(ds.log_attn.values[i][..., after, sink]), atol=1e-6
        )


# --------------------------------------------------------------------------------------------
# the dataset follows the block


def test_dataset_read_mid_block_does_not_freeze(llama, batch):
    with capture(llama) as cap:
        forward(llama, batch)
        first = cap.dataset
        assert cap.dataset is first  # nothing new: assembled once
        forward(llama, zoo.tiny_batch(llama, length=8, seed=1))
        second = cap.dataset
        forward(llama, batch)
    assert first.sizes["sample"] == 2 and second.sizes["sample"] == 4
    after = cap.dataset
    assert after.sizes["sample"] == 6
    np.testing.assert_array_equal(after.sink_share.values[:4], second.sink_share.values)
    np.testing.assert_array_equal(after.sink_share.values[4:], first.sink_share.values)


def test_streamed_dataset_follows_the_block(llama, batch, tmp_path):
    store = tmp_path / "s.zarr"
    batches = [zoo.tiny_batch(llama, length=8, seed=s) for s in range(3)]
    with capture(llama, what="rows", stream_to=store) as cap:
        forward(llama, batches[0])
        assert cap.dataset.sizes["sample"] == 2
        forward(llama, batches[1])
        assert cap.dataset.sizes["sample"] == 4
        forward(llama, batches[2])
    assert ac.load(store).sizes["sample"] == 6  # the last pass was written when the block ended
    with capture(llama, what="rows") as ref:
        for b in batches:
            forward(llama, b)
    np.testing.assert_array_equal(cap.dataset.log_attn.values, ref.dataset.log_attn.values)


def test_failed_forward_inside_the_block_leaves_model_and_data_as_before(llama, batch):
    before = forward(llama, batch)

    def boom(module, args):
        raise RuntimeError("boom")

    with capture(llama, what="both") as cap:
        forward(llama, batch)
        handle = attention_modules(llama)[1].register_forward_pre_hook(boom)
        try:
            with pytest.raises(RuntimeError, match="boom"):  # layer 0 was captured, then boom
                forward(llama, zoo.tiny_batch(llama, length=6))
        finally:
            handle.remove()
        assert cap.dataset.sizes["sample"] == 2  # the half-done pass is not in it
        forward(llama, batch)
    assert_clean(llama)
    np.testing.assert_array_equal(forward(llama, batch).numpy(), before.numpy())
    ds = cap.dataset
    assert ds.sizes["sample"] == 4 and ds.sizes["query"] == 8 and not ds.sink_share.isnull().any()


def test_failed_capture_error_mid_block_then_more_forwards(llama, batch):
    before = forward(llama, batch)
    with capture(llama, queries=[6]) as cap:
        with pytest.raises(CaptureError, match="do not exist"):
            forward(llama, zoo.tiny_batch(llama, length=4))
        forward(llama, batch)
    assert_clean(llama)
    assert list(cap.dataset["query"].values) == [6] and cap.dataset.sizes["sample"] == 2
    np.testing.assert_array_equal(forward(llama, batch).numpy(), before.numpy())


def test_validation_runs_once_per_forward_not_per_chunk(llama, batch, monkeypatch):
    checks = []
    real = capture_module._check_call
    monkeypatch.setattr(capture_module, "_check_call", lambda *a: checks.append(a[1:3]) or real(*a))
    with capture(llama, chunk_size=1) as cap:  # 8 chunks per layer, 2 layers
        forward(llama, batch)
    assert cap.dataset.sizes["query"] == 8
    assert checks == [(8, 8)]  # in the pre-hook, before any layer ran


# --------------------------------------------------------------------------------------------
# the fallback path (eager + hooks) behaves the same


def test_fallback_refuses_the_same(old_style_model):
    model = old_style_model
    previous = model.config._attn_implementation
    batch = {
        "input_ids": torch.randint(0, 50, (1, 8)),
        "attention_mask": torch.ones(1, 8, dtype=torch.long),
    }
    for kwargs, match in [
        ({"queries": -100}, r"outside -8\.\.7"),
        ({"queries": [3, 100]}, r"\[100\] do not exist"),
        ({"sink": 99}, "do not exist in a forward call over 8 keys"),
        ({"sink": True}, "is a bool"),
        ({"layers": [1.0]}, "a float"),
        ({"sink": "learned"}, "learned sinks"),
    ]:
        with LayerCalls(model) as calls, pytest.raises(CaptureError, match=match):
            with capture(model, **kwargs):
                forward(model, batch)
        assert calls.n == 0, kwargs
        assert_clean(model, previous)
    with capture(model, queries=[2, -1], what="both") as cap:
        forward(model, batch)
        assert cap.fallback and cap.dataset.sizes["sample"] == 1
        forward(model, batch)
    assert list(cap.dataset["query"].values) == [2, 7] and cap.dataset.sizes["sample"] == 2
    prompt = {k: v[:, :5] for k, v in batch.items()}
    with torch.no_grad(), capture(model, queries=[6]) as later:
        model.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert list(later.dataset["query"].values) == [6]
    with torch.no_grad(), capture(model, queries=[7]) as never:
        model.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    with pytest.raises(CaptureError, match=r"\[7\] never occurred"):
        _ = never.dataset
    assert_clean(model, previous)


# --------------------------------------------------------------------------------------------
# a real model


@pytest.mark.real
def test_smollm2_refuses_positions_beyond_the_text_and_keeps_outputs():
    need("smollm2-135m")
    from attncoda.hooks import assets

    model, tokenizer = assets.load_model("smollm2-135m")
    batch = tokenizer(
        "It is a truth universally acknowledged, that a single man", return_tensors="pt"
    )
    batch = {k: batch[k] for k in ("input_ids", "attention_mask")}
    t = batch["input_ids"].shape[1]
    before = forward(model, batch)
    with LayerCalls(model) as calls, pytest.raises(CaptureError, match=f"{t} tokens"):
        with capture(model, queries=[0, t]):
            forward(model, batch)
    assert calls.n == 0
    assert_clean(model)
    with capture(model, layers=[-1], queries=[-1], sink=np.int64(0)) as cap:
        np.testing.assert_allclose(forward(model, batch).numpy(), before.numpy(), atol=1e-5)
    assert list(cap.dataset["query"].values) == [t - 1]
    assert list(cap.dataset["layer"].values) == [model.config.num_hidden_layers - 1]
