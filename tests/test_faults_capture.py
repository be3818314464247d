"""Capture never returns silently wrong data: hostile arguments, positions a forward pass does not
have, fixed sinks that are not keys, and a dataset that must follow the forwards of its block.

Every refusal is a one-line CaptureError naming the argument and the bad value, raised before the
work (the model is restored and nothing ran), or, for positions only a later cached step could
have, when the pass ends.
"""

from __future__ import annotations

import math

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
# misuse: what is not a model, a block used twice, empty batches, non-finite weights/attention


class Wrapper:
    """What a transformers pipeline looks like to capture(): an object holding the model."""

    def __init__(self, model):
        self.model = model


def meta_twin(model):
    with torch.device("meta"):
        return type(model)(model.config)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m: None, "needs a transformers model.*None"),
        (lambda m: "smollm2-135m", "needs a loaded model, got the name 'smollm2-135m'"),
        (lambda m: __import__("pathlib").Path("models/x"), "needs a loaded model"),
        (lambda m: torch.nn.Linear(2, 2), "torch module without a .config \\(Linear\\)"),
        (lambda m: torch.nn.Sequential(m), "torch module without a .config"),
        (lambda m: Wrapper(m), "pass its .model"),
        (lambda m: {"model": m}, "needs a transformers model"),
        (lambda m: m.state_dict(), "needs a transformers model"),
        (meta_twin, "on the meta device"),
    ],
    ids=["None", "name", "path", "module", "sequential", "pipeline", "dict", "state_dict", "meta"],
)
def test_what_is_not_a_loaded_model_is_refused_in_one_line(llama, make, match):
    target = make(llama)
    with pytest.raises(CaptureError, match=match) as info:
        with capture(target):
            pytest.fail("the block ran")
    assert "\n" not in str(info.value)
    assert_clean(llama)


def test_the_base_model_inside_a_model_is_a_model(llama, batch):
    with capture(llama.model, layers=[0]) as cap:
        llama.model(**batch)
    assert cap.dataset.sizes["sample"] == 2
    assert_clean(llama.model)


def test_a_capture_block_is_used_once(llama, batch):
    block = capture(llama, layers=[0])
    with block as cap:
        forward(llama, batch)
    with pytest.raises(CaptureError, match="already used: its with-block has ended"):
        with block:
            pytest.fail("the block ran twice")
    assert cap.dataset.sizes["sample"] == 2  # the first block's data is untouched
    assert_clean(llama)
    block = capture(llama, layers=[0])
    with pytest.raises(CaptureError, match="already used: its with-block is open"):
        with block:
            forward(llama, batch)
            with block:  # reentered inside itself
                pytest.fail("reentered")
    assert_clean(llama)


def test_a_refused_block_cannot_be_retried(llama):
    block = capture(llama, layers=[99])
    with pytest.raises(CaptureError, match="layers"):
        with block:
            pass
    with pytest.raises(CaptureError, match="already used"):
        with block:
            pass
    assert_clean(llama)


def test_the_handle_is_not_a_block(llama, batch):
    with pytest.raises(CaptureError, match="not a block of its own") as info:
        with capture(llama, layers=[0]) as cap:
            with cap:
                pytest.fail("the handle opened a block")
    assert "\n" not in str(info.value)
    assert_clean(llama)


@pytest.mark.parametrize("outer_is_base", [False, True])
def test_nested_captures_of_a_model_and_its_submodel_are_refused(llama, batch, outer_is_base):
    outer, inner = (llama.model, llama) if outer_is_base else (llama, llama.model)
    with capture(outer, layers=[0]) as cap:
        with pytest.raises(CaptureError, match="cannot be nested"):
            with capture(inner):
                pytest.fail("nested")
        outer(**batch)  # the outer block still works
    assert cap.dataset.sizes["sample"] == 2
    assert_clean(llama)
    with capture(inner, layers=[0]) as again:  # and the inner model can be captured after
        inner(**batch)
    assert again.dataset.sizes["sample"] == 2


def test_a_learned_sink_capture_marks_and_releases_its_modules():
    """sink='learned' looks up the attention modules: the capture's record of which modules it
    holds (for the nesting check) must stay their ids, and be released after the block."""
    model = zoo.tiny_twin("gpt_oss")
    b = zoo.tiny_batch(model, length=8)
    before = set(capture_module._CAPTURING)
    with capture(model, sink="learned", layers=[0]) as cap:
        assert all(isinstance(i, int) for i in capture_module._CAPTURING)
        with pytest.raises(CaptureError, match="cannot be nested"):
            with capture(model.model):
                pass
        forward(model, b)
    assert capture_module._CAPTURING == before
    assert cap.dataset.sizes["sample"] == 2


@pytest.mark.parametrize(
    "inputs",
    [
        {"input_ids": torch.zeros(2, 0, dtype=torch.long)},
        {"input_ids": torch.zeros(0, 8, dtype=torch.long)},
        {"input_ids": torch.zeros(0, 0, dtype=torch.long)},
        {
            "input_ids": torch.zeros(2, 0, dtype=torch.long),
            "attention_mask": torch.zeros(2, 0, dtype=torch.long),
        },
        {"inputs_embeds": torch.zeros(2, 0, 64)},
        {"inputs_embeds": torch.zeros(0, 8, 64)},
    ],
    ids=["no-tokens", "no-samples", "nothing", "no-tokens-masked", "embeds-no-tokens", "embeds-0"],
)
@pytest.mark.parametrize("what", ["summaries", "rows"])
def test_an_empty_batch_is_refused_before_the_work_and_the_block_goes_on(
    llama, batch, inputs, what
):
    with capture(llama, what=what) as cap:
        with LayerCalls(llama) as calls, pytest.raises(CaptureError, match="empty batch") as info:
            forward(llama, inputs)
        assert calls.n == 0 and "\n" not in str(info.value)
        forward(llama, batch)  # a good pass after the refused one is captured whole
    assert_clean(llama)
    values = cap.dataset["sink_share" if what == "summaries" else "log_attn"]
    assert cap.dataset.sizes["sample"] == 2 and not values.isnull().any()


def poisoned(value, name="model.layers.1.mlp.up_proj.weight", dtype=torch.float32):
    model = zoo.tiny_twin("llama").to(dtype)
    with torch.no_grad():
        dict(model.named_parameters())[name][3, 5] = value
    return model


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "name", ["model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.weight"]
)
def test_a_non_finite_weight_is_refused_before_the_work(batch, value, name):
    model = poisoned(value, name)
    message = refused(model, batch, match="weight " + name.replace(".", r"\.") + " holds NaN")
    assert "reload the weights" in message


def test_a_weight_turned_nan_after_a_capture_is_found_by_the_next(llama, batch):
    model = zoo.tiny_twin("llama")
    with capture(model, layers=[0]):
        forward(model, batch)
    with torch.no_grad():
        model.model.norm.weight[0] = math.nan  # in place: the weights changed since
    refused(model, batch, match="model.norm.weight holds NaN")


def test_large_float16_weights_whose_sum_overflows_are_finite(batch):
    model = zoo.tiny_twin("llama").half()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.fill_(60000.0)  # finite; the sum is inf
    assert not torch.isfinite(model.model.layers[1].mlp.up_proj.weight.sum())
    with capture(model, layers=[0]):  # not refused: every value is finite
        pass


def nan_embeds(model, batch, sample=1, position=3):
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().clone()
    embeds[sample, position] = math.nan
    return {"inputs_embeds": embeds, "attention_mask": batch["attention_mask"]}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"what": "summaries"},  # the fused SDPA path
        {"what": "summaries", "sink": 0},  # the explicit path
        {"what": "summaries", "queries": [2, 5], "chunk_size": 1},
        {"what": "rows"},
        {"what": "both", "dtype": "float16"},
    ],
    ids=["fast", "explicit", "some-queries", "rows", "both-f16"],
)
def test_nan_attention_is_refused_never_stored_as_padding(llama, batch, kwargs):
    with capture(llama, layers=[0], **kwargs) as cap:
        forward(llama, batch)
        with pytest.raises(CaptureError, match="NaN or infinite attention logits") as info:
            forward(llama, nan_embeds(llama, batch))
        assert "\n" not in str(info.value)
    assert_clean(llama)
    ds = cap.dataset  # the refused pass left nothing behind
    assert ds.sizes["sample"] == 2
    for name in ("sink_share", "log_attn"):
        if name in ds:
            assert not ds[name].isnull().any()


def test_nan_at_a_key_hidden_by_the_mask_is_never_read(llama):
    """Left padding: a NaN embedding at a padding position is a key no query sees."""
    b = zoo.tiny_batch(llama, length=8)
    b["attention_mask"][1, :3] = 0
    clean = nan_embeds(llama, b, sample=1, position=1)
    clean["inputs_embeds"][1, 1] = 0.0
    runs = {}
    for name, inputs in (("nan", nan_embeds(llama, b, sample=1, position=1)), ("zero", clean)):
        with capture(llama, layers=[0], what="both") as cap:
            forward(llama, inputs)
        runs[name] = cap.dataset
    for var in ("sink_share", "entropy", "content_entropy", "balance", "log_attn"):
        np.testing.assert_array_equal(runs["nan"][var].values, runs["zero"][var].values)


def test_fallback_refuses_nan_attention_weights(old_style_model):
    model = old_style_model
    ids = torch.randint(0, 50, (1, 8))
    embeds = model.get_input_embeddings()(ids).detach().clone()
    embeds[0, 4] = math.nan
    for what in ("summaries", "rows"):
        with capture(model, what=what) as cap:
            with pytest.raises(CaptureError, match="NaN or infinite attention logits"):
                forward(model, {"inputs_embeds": embeds})
            forward(model, {"input_ids": ids})
        assert cap.fallback and cap.dataset.sizes["sample"] == 1


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


# --------------------------------------------------------------------------------------------
# streamed stores (issue #48)


def test_stream_to_a_folder_that_does_not_exist_yet_is_made_before_the_model_runs(
    llama, batch, tmp_path
):
    store = tmp_path / "new" / "sub" / "s.zarr"
    with capture(llama, stream_to=store):
        assert store.parent.is_dir()  # made at setup, not after the first pass
        forward(llama, batch)
        forward(llama, zoo.tiny_batch(llama, length=8, seed=1))
    assert ac.load(store).sizes["sample"] == 4
    assert [p.name for p in store.parent.iterdir()] == ["s.zarr"]  # no lock file left


def test_a_second_capture_streaming_to_the_same_new_store_is_refused_at_setup(
    llama, batch, tmp_path
):
    other = zoo.tiny_twin("llama")
    store = tmp_path / "s.zarr"
    with capture(llama, stream_to=store):
        message = refused(other, batch, match="another capture is streaming", stream_to=store)
        assert "\n" not in message
        forward(llama, batch)
    assert ac.load(store).sizes["sample"] == 2  # the first capture's samples only
    # once the first is done, the store is its: a new capture is refused, an explicit append not
    refused(other, batch, match="already exists", stream_to=store)
    with capture(other) as cap:
        forward(other, batch)
    ac.save(cap.dataset, store, append=True)
    assert ac.load(store).sizes["sample"] == 4
