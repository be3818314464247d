"""Capture on the real offline models (SmolLM2-135M, Gemma-3-270M, MiniLM) over real Austen text."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_allclose, check_capture_on_text, eager_weights, need

torch = pytest.importorskip("torch")
from attncoda.hooks import assets, capture  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def emma() -> str:
    need("austen")
    return " ".join(assets.paragraphs(assets.load_text("austen", "emma"), min_words=40)[:12])


def check_model(name: str, text: str, length: int):
    need(name)
    model, tokenizer = assets.load_model(name)
    return check_capture_on_text(model, tokenizer, text, length)


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
    assert_allclose(
        np.where(valid, np.exp(cap.dataset.log_attn.values), 0),
        np.where(valid, weights, 0),
        atol=1e-5,
    )
