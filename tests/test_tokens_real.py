"""Token strings, the default sink and its one warning on the real offline models and their own
tokenizers, and the measurement of the default against a special first token."""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest

import attncoda as ac
from conftest import need

torch = pytest.importorskip("torch")
from attncoda.hooks import SinkTokenWarning, assets, capture  # noqa: E402

# one worker runs this module under pytest-xdist, and each model loads once in it (_model):
# Gemma-3's load alone took ~4 CPU-s, in three of the tests
pytestmark = [pytest.mark.real, pytest.mark.xdist_group("test_tokens_real")]


@functools.cache
def _model(name: str):
    """``assets.load_model(name)``, once per process: the tests only run the model (capture
    removes its hooks on leaving), so they can share it."""
    need(name)
    return assets.load_model(name)


TEXT = "Emma Woodhouse, handsome, clever, and rich — naïve café 🙂"


def run(name, text, **kwargs):
    need(name)
    model, tok = _model(name)
    enc = tok(text, return_tensors="pt")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok, **kwargs) as cap:
            model(**enc)
    sinks = [w for w in record if issubclass(w.category, SinkTokenWarning)]
    return cap.dataset, tok, enc["input_ids"][0].tolist(), sinks


def test_smollm2_tokens_read_as_text_and_its_first_word_is_the_sink_without_a_warning():
    ds, _, _, sinks = run("smollm2-135m", TEXT)
    tokens = ds.token.values[0].tolist()
    assert tokens[:4] == ["Em", "ma", " Wood", "house"]  # readable, not 'ĠWood'
    assert "".join(tokens) == TEXT  # every piece decodes, so the text is whole again
    assert sinks == []  # the tokenizer adds no BOS: its first token is the sink, as in training
    assert ds.token.values[0, int(ds.sink_index.values[0])] == "Em"


def test_a_slice_starting_mid_word_makes_the_piece_the_sink_without_a_warning():
    need("smollm2-135m")
    model, tok = _model("smollm2-135m")
    ids = tok("The quick brown fox", return_tensors="pt")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids[0].tolist())
    assert "Ġquick" in pieces
    sub = tok(" quick brown fox", return_tensors="pt")["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkTokenWarning)
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok) as cap:
            model(input_ids=sub)
    assert cap.dataset.token.values[0, 0] == " quick"


def test_gemma_without_its_bos_is_warned_about():
    """The one risky case: the input lost the BOS Gemma's tokenizer adds (its sink collapses)."""
    need("gemma3-270m")
    model, tok = _model("gemma3-270m")
    enc = tok(TEXT, return_tensors="pt", add_special_tokens=False)
    with pytest.warns(SinkTokenWarning, match="'<bos>'") as record:
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok):
            model(**enc)
    assert len([w for w in record if w.category is SinkTokenWarning]) == 1


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
    assert sinks == []  # no BOS either: the first token is the sink, no warning
    back = ac.load(ac.save(ds, tmp_path / "q.nc"))
    np.testing.assert_array_equal(back.token.values, ds.token.values)


# ------------------------------------------------------------------------------------------------
# The default sink: the first token as the tokenizer gives it, with and without a special token
# ------------------------------------------------------------------------------------------------

BOS_TOKENS = 256
BOS_MODELS = ["smollm2-135m", "gemma3-270m", "minilm-l6", "qwen2.5-coder-0.5b"]


def _special_first(tok) -> int:
    """The special token a sink-aware user would put first: BOS, CLS, else end-of-text."""
    for value in (tok.bos_token_id, tok.cls_token_id, tok.eos_token_id):
        if isinstance(value, int):
            return value
    raise AssertionError("the tokenizer has no special token")


def _layer_shares(model, ids) -> np.ndarray:
    """The sink's share per layer: mean over heads and queries 1..T-1 (summaries capture)."""
    with torch.no_grad(), capture(model) as cap:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return cap.dataset.sink_share.values[0, :, :, 1:].astype(np.float64).mean(axis=(1, 2))


def bos_row(name: str, text: str) -> str:
    """One row of the docs' sink-bos table: the default (the tokenizer's own first token) against
    the other choice (a special token prepended where the tokenizer adds none; removed where it
    adds one), on the first ``BOS_TOKENS`` tokens of ``text``."""
    need(name)
    model, tok = _model(name)
    ids = tok(text, return_tensors="pt")["input_ids"][:, :BOS_TOKENS]
    special = _special_first(tok)
    adds = int(ids[0, 0]) in {special, *tok.all_special_ids}
    if adds:  # the tokenizer prepends it: the other choice starts at the text
        other = ids[:, 1:]
        ids = ids[:, : BOS_TOKENS - 1]  # same number of text tokens after the first
    else:
        other = torch.cat([torch.tensor([[special]]), ids[:, : BOS_TOKENS - 1]], dim=1)
    default, changed = _layer_shares(model, ids), _layer_shares(model, other)
    first = tok.decode([int(ids[0, 0])])
    second = tok.decode([int(other[0, 0])])
    cells = [
        f"`{name}`",
        "yes" if adds else "no",
        f"`{first.strip() or repr(first)}`",
        f"{default.mean():.2f} / {default.max():.2f}",
        f"`{second.strip() or repr(second)}`",
        f"{changed.mean():.2f} / {changed.max():.2f}",
        f"{np.abs(changed - default).max():.2f}",
    ]
    del model
    return "| " + " | ".join(cells) + " |"


def test_sink_with_and_without_a_special_first_token_table():
    """docs/capture.md's sink-bos table is this measurement (ATTNCODA_UPDATE_TABLES=1 writes it)."""
    from pathlib import Path

    from conftest import UPDATE_TABLES, table_block

    need("austen")
    emma = " ".join(assets.paragraphs(assets.load_text("austen", "emma"), min_words=40)[:12])
    header = (
        "| model | tokenizer adds BOS | default first token | sink share, default (mean / max "
        "over layers) | other first token | sink share, other | largest layer change |\n"
        "|---|---|---|---|---|---|---|"
    )
    rows = [bos_row(name, emma) for name in BOS_MODELS]
    want = header + "\n" + "\n".join(rows) + "\n"
    path = Path(__file__).resolve().parents[1] / "docs" / "capture.md"
    text, start, end = table_block(path, "sink-bos")
    if UPDATE_TABLES:
        path.write_text(text[:start] + want + text[end:], encoding="utf-8")
        return
    found = text[start:end]
    # a rerun may round the last digit differently
    number = re.compile(r"\b\d\.\d\d\b")
    assert number.sub("#", found) == number.sub("#", want), want
    pairs = zip(number.findall(found), number.findall(want), strict=True)
    assert all(abs(float(a) - float(b)) <= 0.011 for a, b in pairs), want
