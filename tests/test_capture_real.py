"""Capture on the real offline models (SmolLM2-135M, Gemma-3-270M, MiniLM) over real Austen text."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import need

import attncoda as ac

torch = pytest.importorskip("torch")
from attncoda.hooks import assets, capture  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def emma() -> str:
    need("austen")
    return " ".join(assets.paragraphs(assets.load_text("austen", "emma"), min_words=40)[:12])


def eager_weights(model, batch):
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    return torch.stack(out.attentions, dim=1).numpy()


def check_model(name: str, text: str, length: int) -> None:
    need(name)
    model, tokenizer = assets.load_model(name)
    batch = tokenizer(text, return_tensors="pt")
    batch = {k: v[:, :length] for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    assert batch["input_ids"].shape[1] == length
    with torch.no_grad():
        before = model(**batch).logits
        with capture(model, what="both") as cap:
            during = model(**batch).logits
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
    ds = cap.dataset
    weights = eager_weights(model, batch)
    np.testing.assert_allclose(np.exp(ds.log_attn.values), weights, atol=1e-5)
    # the fast summaries path equals the core applied to the captured rows
    with torch.no_grad(), capture(model, what="summaries") as fast:
        model(**batch)
    la = ds.log_attn.values.astype(np.float64)
    sink = np.arange(la.shape[-1]) == int(ds.sink_index.values[0])  # the sample's first valid key
    d = ac.decompose(la, sink=np.broadcast_to(sink, la.shape), from_logits=True, degenerate="nan")
    for var in ac.SUMMARY_VARIABLES:
        got, want = fast.dataset[var].values, getattr(d, var)
        finite = np.isfinite(want)
        assert (np.isfinite(got) == finite).all(), var
        np.testing.assert_allclose(got[finite], want[finite], atol=1e-4, rtol=1e-4, err_msg=var)
    return ds


def test_smollm2_rows_and_summaries_on_austen(emma):
    ds = check_model("smollm2-135m", emma, 256)
    # trained models have strong sinks in late layers (the doc measured 0.35-0.75 from layer 12)
    late = ds.sink_share.sel(layer=slice(12, None)).isel(query=slice(1, None)).mean()
    assert 0.3 < float(late) < 0.9


def test_gemma3_rows_and_summaries_past_the_sliding_window(emma):
    ds = check_model("gemma3-270m", emma, 600)  # window 512: sliding layers lose the BOS sink
    assert int(ds.sink_index.values[0]) == 0  # Gemma prepends <bos>
    last = ds.sink_share.isel(query=-1)
    assert (last.values == 0).any() and (last.values > 0).any()


def test_minilm_bidirectional_rows(emma):
    need("minilm-l6")
    model, tokenizer = assets.load_model("minilm-l6")
    batch = tokenizer([emma[:300], emma[300:500]], return_tensors="pt", padding=True)
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad(), capture(model, what="rows") as cap:
        model(**batch)
    weights = eager_weights(model, batch)
    valid = batch["attention_mask"].numpy().astype(bool)[:, None, None, :, None]
    np.testing.assert_allclose(
        np.where(valid, np.exp(cap.dataset.log_attn.values), 0),
        np.where(valid, weights, 0),
        atol=1e-5,
    )
