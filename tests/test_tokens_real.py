"""Token strings and the sink warning on the real offline models and their own tokenizers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attncoda as ac
from conftest import need

torch = pytest.importorskip("torch")
from attncoda.hooks import SinkTokenWarning, assets, capture  # noqa: E402

pytestmark = pytest.mark.real

TEXT = "Emma Woodhouse, handsome, clever, and rich — naïve café 🙂"


def run(name, text, **kwargs):
    need(name)
    model, tok = assets.load_model(name)
    enc = tok(text, return_tensors="pt")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok, **kwargs) as cap:
            model(**enc)
    sinks = [w for w in record if issubclass(w.category, SinkTokenWarning)]
    return cap.dataset, tok, enc["input_ids"][0].tolist(), sinks


def test_smollm2_tokens_read_as_text_and_its_first_word_is_flagged():
    ds, _, _, sinks = run("smollm2-135m", TEXT)
    tokens = ds.token.values[0].tolist()
    assert tokens[:4] == ["Em", "ma", " Wood", "house"]  # readable, not 'ĠWood'
    assert "".join(tokens) == TEXT  # every piece decodes, so the text is whole again
    assert len(sinks) == 1 and "'Em'" in str(sinks[0].message)
    assert sinks[0].filename == __file__


def test_a_slice_starting_mid_word_names_the_piece_that_became_the_sink():
    need("smollm2-135m")
    model, tok = assets.load_model("smollm2-135m")
    ids = tok("The quick brown fox", return_tensors="pt")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids[0].tolist())
    assert "Ġquick" in pieces
    sub = tok(" quick brown fox", return_tensors="pt")["input_ids"]
    with pytest.warns(SinkTokenWarning, match="' quick'"):
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok) as cap:
            model(input_ids=sub)
    # choosing the sink silences it: the user said which key is the sink
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkTokenWarning)
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok, sink=0):
            model(input_ids=sub)
    assert cap.dataset.token.values[0, 0] == " quick"


@pytest.mark.parametrize(("name", "sink"), [("gemma3-270m", "<bos>"), ("minilm-l6", "[CLS]")])
def test_no_warning_when_the_sink_is_bos_or_cls(name, sink):
    ds, tok, ids, sinks = run(name, TEXT)
    assert sinks == []
    assert ds.token.values[0, int(ds.sink_index.values[0])] == sink
    assert ds.token.values[0].tolist() == [tok.decode([i]) for i in ids]


def test_qwen_byte_pieces_stay_identifiable_and_survive_netcdf(tmp_path):
    # Qwen2.5 splits 'ï' of 'naïve' across tokens: one id alone is not text
    ds, tok, ids, sinks = run("qwen2.5-coder-0.5b", TEXT + " 𝔘𝔫𝔦𝔠𝔬𝔡𝔢")
    tokens = ds.token.values[0].tolist()
    raw = tok.convert_ids_to_tokens(ids)
    for t, r, i in zip(tokens, raw, ids, strict=True):
        assert t == (r if "\ufffd" in tok.decode([i]) else tok.decode([i]))
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # the fallback was exercised
    assert len(sinks) == 1  # no BOS either
    back = ac.load(ac.save(ds, tmp_path / "q.nc"))
    np.testing.assert_array_equal(back.token.values, ds.token.values)
