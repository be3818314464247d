"""Capture beyond one stack of self-attention: encoder-decoders (encoder, decoder and cross
attention), shared layers (ALBERT), models that decide causality by their own route (CLIP's
text model) and relative position biases (T5). Each is compared with the model's own eager
attention weights, and the model's outputs must not move."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from attncoda.hooks import CaptureError, capture  # noqa: E402


def _pair(cls, config):
    """The same random weights twice: as built (SDPA) and switched to eager attention."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config).eval()
        eager = cls(config).eval()
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")
    return model, eager


def bart():
    return _pair(
        transformers.BartForConditionalGeneration,
        transformers.BartConfig(
            vocab_size=99,
            d_model=32,
            encoder_layers=2,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=2,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        ),
    )


def t5():
    return _pair(
        transformers.T5ForConditionalGeneration,
        transformers.T5Config(
            vocab_size=99,
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
        ),
    )


def whisper():
    return _pair(
        transformers.WhisperForConditionalGeneration,
        transformers.WhisperConfig(
            vocab_size=120,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            num_mel_bins=8,
            max_source_positions=16,
            max_target_positions=32,
            pad_token_id=100,
            bos_token_id=101,
            eos_token_id=102,
            decoder_start_token_id=103,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        ),
    )


ENCODER_DECODERS = {"bart": bart, "t5": t5, "whisper": whisper}


def _inputs(family):
    gen = torch.Generator().manual_seed(1)
    dec = torch.randint(4, 90, (2, 5), generator=gen)
    if family == "whisper":
        return {"input_features": torch.randn(2, 8, 32, generator=gen), "decoder_input_ids": dec}
    ids = torch.randint(4, 90, (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding in the source of sample 1
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}


def _stacked(weights):
    return np.stack([w.numpy() for w in weights], axis=1)  # (sample, layer, head, q, k)


def _assert_rows(ds, eager, valid_queries=None):
    rows = np.exp(ds.log_attn.values.astype(np.float64))
    assert rows.shape == eager.shape
    if valid_queries is not None:  # padding queries have no row; eager's there are undefined
        keep = valid_queries[:, None, None, :, None]
        rows, eager = np.where(keep, rows, 0.0), np.where(keep, eager, 0.0)
    np.testing.assert_allclose(rows, eager, atol=1e-5)


@pytest.mark.parametrize("family", sorted(ENCODER_DECODERS))
def test_encoder_decoder_gives_three_stacks_equal_to_eager(family):
    model, eager = ENCODER_DECODERS[family]()
    batch = _inputs(family)
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
        before = model(**batch).logits
        with capture(model, what="rows") as cap:
            during = model(**batch).logits
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
    assert cap.stacks == ("encoder", "decoder", "cross")
    got = cap.datasets
    assert {k: v.attrs["attention_stack"] for k, v in got.items()} == {
        "encoder": "encoder",
        "decoder": "decoder",
        "cross": "cross",
    }
    source = batch.get("attention_mask")
    src_valid = source.numpy().astype(bool) if source is not None else None
    _assert_rows(got["encoder"], _stacked(ref.encoder_attentions), src_valid)
    _assert_rows(got["decoder"], _stacked(ref.decoder_attentions))
    _assert_rows(got["cross"], _stacked(ref.cross_attentions))
    cross = got["cross"]
    n_src = ref.cross_attentions[0].shape[-1]
    assert cross.sizes["key"] == n_src and cross.sizes["query"] == 5
    np.testing.assert_array_equal(cross.query_token_id.values, batch["decoder_input_ids"].numpy())
    if src_valid is not None:  # the cross sink is the first real source position
        np.testing.assert_array_equal(cross.sink_index.values, [0, 2])
        np.testing.assert_array_equal(cross.token_id.values, batch["input_ids"].numpy())


@pytest.mark.parametrize("family", sorted(ENCODER_DECODERS))
def test_encoder_decoder_summaries_equal_those_of_the_rows(family):
    model, _ = ENCODER_DECODERS[family]()
    batch = _inputs(family)
    with torch.no_grad(), capture(model, what="both") as cap:
        model(**batch)
    for name, ds in cap.datasets.items():
        la = ds.log_attn.values.astype(np.float64)
        keys = np.arange(la.shape[-1])
        sink = np.broadcast_to(
            (keys[None, :] == ds.sink_index.values[:, None])[:, None, None, None, :], la.shape
        )
        live = np.isfinite(la).any(-1)  # padding queries have no row
        la = np.where(live[..., None], la, 0.0)
        d = ac.decompose(la, sink=sink, from_logits=True, degenerate="nan")
        for var in ac.SUMMARY_VARIABLES:
            got = np.where(live, ds[var].values, np.nan)
            want = np.where(live, getattr(d, var), np.nan)
            finite = np.isfinite(want)
            assert (np.isfinite(got) == finite).all(), (name, var)
            np.testing.assert_allclose(
                got[finite], want[finite], atol=2e-5, rtol=1e-5, err_msg=f"{name} {var}"
            )


def test_generate_captures_cross_attention_of_every_step_once_keyed_by_source():
    model, eager = whisper()
    feats = _inputs("whisper")["input_features"]
    with torch.no_grad():
        plain = model.generate(input_features=feats, max_new_tokens=4, do_sample=False)
        ref = eager.generate(
            input_features=feats,
            max_new_tokens=4,
            do_sample=False,
            output_attentions=True,
            return_dict_in_generate=True,
        )
        with capture(model, what="rows") as cap:
            out = model.generate(input_features=feats, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, plain)
    got = cap.datasets
    # one step a query: the cross keys (the encoder's 16 positions) come once per step
    steps = [_stacked(step) for step in ref.cross_attentions]
    np.testing.assert_allclose(
        np.exp(got["cross"].log_attn.values), np.concatenate(steps, axis=3), atol=1e-5
    )
    assert got["encoder"].sizes["sample"] == 2 and got["encoder"].sizes["query"] == 16
    last = _stacked(ref.decoder_attentions[-1])[:, :, :, 0]
    np.testing.assert_allclose(np.exp(got["decoder"].log_attn.values[:, :, :, -1]), last, atol=1e-5)


def test_one_stack_by_name_and_per_stack_selections():
    model, eager = bart()
    batch = _inputs("bart")
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
        with capture(model, what="rows", layers={"cross": [-1]}, heads={"cross": [1]}) as cap:
            model(**batch)
    assert cap.stacks == ("cross",)
    ds = cap.dataset  # one stack: the plain property works
    assert ds["layer"].values.tolist() == [2] and ds["head"].values.tolist() == [1]
    want = ref.cross_attentions[2][:, 1].numpy()
    np.testing.assert_allclose(np.exp(ds.log_attn.values[:, 0, 0]), want, atol=1e-5)
    np.testing.assert_array_equal(ds.token_id.values, batch["input_ids"].numpy())


def test_several_stacks_refuse_the_single_dataset_and_bad_stack_names_in_one_line():
    model, _ = t5()
    batch = _inputs("t5")
    with torch.no_grad(), capture(model) as cap:
        model(**batch)
    with pytest.raises(CaptureError, match=r"3 attention stacks; read cap\.datasets\['encoder'\]"):
        _ = cap.dataset
    with pytest.raises(CaptureError, match=r"names the stack 'encdoer'.*encoder, decoder, cross"):
        with capture(model, layers={"encdoer": [0]}):
            pass
    with pytest.raises(
        CaptureError, match=r"^decoder attention: layers=\[5\]: .* the model has 2 layers"
    ):
        with capture(model, layers={"decoder": [5]}):
            pass
    with pytest.raises(CaptureError, match="stream_to= takes one dataset"):
        with capture(model, stream_to="x.zarr"):
            pass


def test_a_capture_of_a_stack_saves_and_loads(tmp_path):
    model, _ = bart()
    with torch.no_grad(), capture(model, what="both") as cap:
        model(**_inputs("bart"))
    for name, ds in cap.datasets.items():
        path = tmp_path / f"{name}.nc"
        ac.save(ds, path)
        back = ac.load(path)
        assert back.attrs["attention_stack"] == name
        np.testing.assert_array_equal(back.log_attn.values, ds.log_attn.values)
        if name == "cross":
            np.testing.assert_array_equal(back.query_token_id.values, ds.query_token_id.values)


def test_shared_layers_are_one_layer_per_application():
    model, eager = _pair(
        transformers.AlbertModel,
        transformers.AlbertConfig(
            vocab_size=99,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=37,
        ),
    )
    ids = torch.randint(4, 90, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        before = model(input_ids=ids, attention_mask=mask).last_hidden_state
        with capture(model, what="rows") as cap:
            during = model(input_ids=ids, attention_mask=mask).last_hidden_state
            model(input_ids=ids, attention_mask=mask)  # a second pass starts at layer 0 again
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
    ds = cap.dataset
    assert ds.layer.values.tolist() == [0, 1, 2] and ds.sizes["sample"] == 4
    first = ds.isel(sample=slice(0, 2))
    _assert_rows(first, _stacked(ref.attentions), mask.numpy().astype(bool))
    # the three applications of the one module differ: they are three layers, not copies
    assert not np.allclose(ds.log_attn.values[:, 0], ds.log_attn.values[:, 2])


@pytest.mark.parametrize("padded", [False, True])
def test_clip_text_rows_are_causal_and_its_outputs_do_not_move(padded):
    """CLIP's attention modules say is_causal=False; its text model passes is_causal=True
    with the call and a mask function that answers "causal, no mask needed"."""
    model, eager = _pair(
        transformers.CLIPTextModel,
        transformers.CLIPTextConfig(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=32,
            bos_token_id=0,
            eos_token_id=2,
        ),
    )
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids}
    if padded:
        batch["attention_mask"] = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
        before = model(**batch).last_hidden_state
        for what in ("rows", "both"):
            with capture(model, what=what) as cap:
                during = model(**batch).last_hidden_state
            np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
            rows = np.exp(cap.dataset.log_attn.values)
            assert (np.triu(np.ones((7, 7)), 1)[None, None, None] * rows == 0).all()
            valid = batch.get("attention_mask", torch.ones(2, 7)).numpy().astype(bool)
            _assert_rows(cap.dataset, _stacked(ref.attentions), valid)


def test_relative_position_bias_reaches_rows_and_summaries():
    """T5 passes its bias as a keyword beside the mask: without it the rows would be those
    of another model, and the outputs computed from them would move."""
    model, eager = t5()
    enc = model.get_encoder()
    ids = torch.randint(4, 90, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = eager.get_encoder()(input_ids=ids, output_attentions=True)
        before = enc(input_ids=ids).last_hidden_state
        with capture(model, what="rows", layers={"encoder": "all"}) as cap:
            during = enc(input_ids=ids).last_hidden_state
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
    _assert_rows(cap.dataset, _stacked(ref.attentions))


def test_a_model_without_attention_is_refused_in_one_line():
    config = transformers.MambaConfig(
        vocab_size=99, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2
    )
    model = transformers.MambaModel(config)
    with pytest.raises(CaptureError, match="has no attention module") as err:
        with capture(model):
            pass
    assert "\n" not in str(err.value)


def test_a_layer_whose_attention_has_a_twist_attncoda_does_not_rebuild_is_refused(monkeypatch):
    """A model whose eager attention adds something attncoda does not know of (here a bias on
    the first key, passed by no keyword) is refused at its first layer, before rows exist."""
    from attncoda.hooks import zoo

    llama = __import__("transformers.models.llama.modeling_llama", fromlist=["_"])
    plain = llama.eager_attention_forward

    def twisted(module, query, key, value, attention_mask, **kw):
        bias = torch.zeros(key.shape[-2], dtype=query.dtype)
        bias[0] = 3.0
        mask = bias if attention_mask is None else attention_mask + bias
        return plain(module, query, key, value, mask, **kw)

    model = zoo.tiny_twin("llama")
    model.set_attn_implementation("eager")
    batch = zoo.tiny_batch(model, length=8)
    with torch.no_grad(), capture(model, what="rows") as cap:
        model(**batch)  # the plain model captures
    assert cap.dataset.sizes["layer"] == model.config.num_hidden_layers
    monkeypatch.setattr(llama, "eager_attention_forward", twisted)
    with pytest.raises(CaptureError, match=r"layer 0\) computes attention by a route") as err:
        with torch.no_grad(), capture(model, what="summaries") as cap:
            model(**batch)
    assert "\n" not in str(err.value)
    with pytest.raises(CaptureError, match=r"nothing was captured|recorded nothing"):
        _ = cap.dataset


def test_padding_on_both_sides_of_an_encoder_decoder():
    """Left padding in the source and right padding in the target (BART): every real query's
    rows equal eager's in all three stacks, and no query sees a padded target key."""
    model, eager = bart()
    batch = _inputs("bart")
    target = torch.ones(2, 5, dtype=torch.long)
    target[1, 3:] = 0  # the last two target tokens of sample 1 are padding
    batch["decoder_attention_mask"] = target
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
        before = model(**batch).logits
        with capture(model, what="rows") as cap:
            during = model(**batch).logits
    real_q = target.numpy().astype(bool)
    keep = real_q[:, None, :, None]
    np.testing.assert_allclose(
        np.where(keep, during.numpy()[:, None], 0), np.where(keep, before.numpy()[:, None], 0),
        atol=1e-5,
    )  # fmt: skip
    src_valid = batch["attention_mask"].numpy().astype(bool)
    _assert_rows(cap.datasets["encoder"], _stacked(ref.encoder_attentions), src_valid)
    _assert_rows(cap.datasets["decoder"], _stacked(ref.decoder_attentions), real_q)
    _assert_rows(cap.datasets["cross"], _stacked(ref.cross_attentions), real_q)
    hidden = cap.datasets["decoder"].log_attn.values[1, ..., 3:]  # padded target keys
    assert np.isneginf(hidden).all()


@pytest.mark.slow
def test_the_cli_analyses_and_reports_a_cross_attention_capture(tmp_path):
    from attncoda.cli import main

    model, _ = bart()
    with torch.no_grad(), capture(model, layers={"cross": None}, what="rows") as cap:
        model(**_inputs("bart"))
    path = tmp_path / "cross.nc"
    ac.save(cap.dataset, path)
    out = tmp_path / "cross-analysis"
    assert main(["analyze", str(path), "--out", str(out), "-q"]) == 0
    assert main(["report", str(out)]) == 0
    analysis = (out / "analysis.json").read_text(encoding="utf-8")
    assert "cross" in analysis  # the stack travels with the results
    assert (out / "report.html").is_file()
