"""The ``token`` coordinate: decoded by capture, kept through save/load/append and selections,
checked by the schema; and the warning when an input lost the BOS its tokenizer adds."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import SinkTokenWarning, capture  # noqa: E402
from attncoda.hooks._tokens import token_strings  # noqa: E402

ODD = ["é", "—", "🙂", "", " the", "\n", "<bos>", "ĠðŁ", 'a "quote"', "日本"]


def summaries(n_samples, length):
    return {k: np.zeros((n_samples, 1, 1, length), np.float32) for k in ac.SUMMARY_VARIABLES}


def dataset(tokens):
    tokens = np.asarray(tokens, dtype=object)
    n, t = tokens.shape
    return ac.make_dataset(
        summaries=summaries(n, t),
        layers=[0],
        heads=[0],
        query_positions=range(t),
        token_ids=np.arange(n * t).reshape(n, t),
        tokens=tokens,
    )


@pytest.mark.parametrize("name", ["cap.nc", "cap.zarr"])
def test_non_ascii_and_empty_tokens_survive_save_and_load(tmp_path, name):
    ds = dataset([ODD, list(reversed(ODD))])
    back = ac.load(ac.save(ds, tmp_path / name))
    assert back.identical(ds)
    assert back.token.dtype == object  # one dtype whatever the format read
    assert back.token.values.tolist() == [ODD, list(reversed(ODD))]


def test_appending_longer_tokens_to_a_zarr_store_keeps_them_whole(tmp_path):
    store = tmp_path / "cap.zarr"
    ac.save(dataset([["a", "b", ""]]), store, append=True)
    long = ["a much longer token than any before", "🙂🙂🙂", ""]
    ac.save(dataset([long]), store, append=True)  # a fixed-width <U1 store would truncate
    assert ac.load(store).token.values.tolist() == [["a", "b", ""], long]


def test_a_zarr_v3_store_with_tokens_loads(tmp_path):
    ds = dataset([ODD])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr may call its v3 string encoding unstable
        ds.to_zarr(tmp_path / "v3.zarr", zarr_format=3, consolidated=True)
    assert ac.load(tmp_path / "v3.zarr").token.values.tolist() == [ODD]


def test_a_dataset_without_tokens_is_valid(tmp_path):
    ds = ac.make_dataset(
        summaries=summaries(1, 3), layers=[0], heads=[0], query_positions=[0, 1, 2]
    )
    assert "token" not in ds.coords
    assert "token" not in ac.load(ac.save(ds, tmp_path / "cap.nc")).coords


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ds: ds.assign_coords(token=("sample", ["x"])), "token must have dims"),
        (
            lambda ds: ds.assign_coords(token=(("sample", "position"), np.zeros((1, 3)))),
            "token must hold strings",
        ),
    ],
)
def test_the_schema_checks_the_token_coordinate(change, message):
    ds = dataset([["a", "b", "c"]])
    with pytest.raises(ac.SchemaError, match=message):
        ac.validate_dataset(change(ds))


def test_make_dataset_refuses_non_strings():
    with pytest.raises(ac.SchemaError, match="tokens must be strings"):
        dataset([["a", None, "c"]])


def test_selections_and_analyses_keep_tokens():
    ds = ac.testing.synthetic_rows(n_samples=2, length=5)
    assert ds.token.shape == (2, 5)
    one = ds.isel(sample=1, layer=0)
    assert one.token.values.tolist() == ds.token.values[1].tolist()
    # dataset operations keep the coordinate, and it labels queries and keys by position
    assert ds.where(ds.sink_share > 0.5).token.identical(ds.token)
    by_query = ds.token.sel(position=ds["query"])
    assert by_query.dims == ("sample", "query")
    assert by_query.values[0, 0] == "<bos>"
    assert ds.isel(query=[2, 4]).token.sel(
        position=ds.isel(query=[2, 4])["query"]
    ).values.tolist() == [
        ds.token.values[0, [2, 4]].tolist(),
        ds.token.values[1, [2, 4]].tolist(),
    ]


class SpellingTokenizer:
    """decode() of single ids as a byte-level BPE tokenizer does: a piece of a character is
    U+FFFD; convert_ids_to_tokens gives the tokenizer's own spelling."""

    def decode(self, ids):
        vocab = {5: " the", 6: "\ufffd", 7: "", 8: "Em"}
        return "".join(vocab.get(i, "?") for i in ids)

    def convert_ids_to_tokens(self, i):
        return {5: "Ġthe", 6: "ĠðŁ", 7: "", 8: "Em"}[i]


def test_token_text_is_readable_and_identifiable():
    got = token_strings(SpellingTokenizer(), np.array([[5, 6, 7, 8, -1]]))
    # readable where decode gives text, the tokenizer's spelling for a piece of a character,
    # the id where neither names it, "" where there is no token
    assert got.tolist() == [[" the", "ĠðŁ", "<7>", "Em", ""]]


def test_capture_decodes_tokens_with_padding_and_keeps_the_numbers():
    model = zoo.tiny_twin("gemma3_text")  # its batches start with <bos>: no sink warning
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    batch = zoo.tiny_batch(model, length=8, left_padding=True)
    with torch.no_grad(), capture(model, what="both") as cap:
        model(**batch)
    plain = cap.dataset
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkTokenWarning)
        with torch.no_grad(), capture(model, what="both", tokenizer=tok) as cap:
            model(**batch)
    ds = cap.dataset
    # the coordinate is all that changed
    assert ds.drop_vars("token").identical(plain)
    mask = batch["attention_mask"].numpy().astype(bool)
    ids = batch["input_ids"].numpy()
    assert (ds.token.values[~mask] == "").all()  # padding
    want = [tok.decode([i]) or f"<{i}>" for i in ids[mask]]
    assert ds.token.values[mask].tolist() == want
    assert set(ds.token.values[np.arange(len(ids)), ds.sink_index.values]) == {"<2>"}  # <bos>


def test_generate_and_independent_passes_get_tokens():
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkTokenWarning)  # no BOS from this tokenizer: default
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok) as cap:
            model.generate(**tok("Hi", return_tensors="pt"), max_new_tokens=3, do_sample=False)
            model(**tok("Words!", return_tensors="pt"))
    ds = cap.dataset
    ids = ds.token_id.values
    assert ds.token.values[0, :2].tolist() == ["H", "i"]  # prompt, then generated tokens
    generated = ids[0][ids[0] >= 0]
    assert len(generated) == 4  # 2 prompt tokens + 2 forwarded steps of generate()
    assert ds.token.values[0, :4].tolist() == [tok.decode([i]) or f"<{i}>" for i in generated]
    assert ds.token.values[0, 4:].tolist() == ["", ""]  # a shorter sample: no token there
    assert ds.token.values[1].tolist() == list("Words!")
    assert ids.shape == ds.token.shape


def test_streamed_captures_keep_tokens(tmp_path):
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    store = tmp_path / "run.zarr"
    with torch.no_grad(), capture(model, layers=[0], tokenizer=tok, sink=0, stream_to=store) as cap:
        for text in ("abcd", "wxyz", "éé"):
            model(**tok(text, return_tensors="pt"))
            # inside the block: the store's passes and the one in memory, combined
            inside = cap.dataset.token.values.tolist()
        assert inside[:2] == [list("abcd"), list("wxyz")]
    tokens = cap.dataset.token.values.tolist()
    assert tokens[:2] == [list("abcd"), list("wxyz")]
    assert ac.load(store).token.values.tolist() == tokens


class BosByteTokenizer(zoo.ByteTokenizer):
    """A twin's byte tokenizer that starts every text with a BOS (id 2), as Gemma's does."""

    def __init__(self, vocab_size):
        super().__init__(vocab_size)
        self.bos_token_id = 2
        self.all_special_ids = [2]

    def __call__(self, text, *, add_special_tokens=True, **kwargs):
        enc = super().__call__(text, **kwargs)
        if add_special_tokens:
            ids = enc["input_ids"]
            if torch.is_tensor(ids):
                enc["input_ids"] = torch.cat([torch.tensor([[2]]), ids], dim=1)
            else:
                enc["input_ids"] = [2, *ids]
        return enc

    def decode(self, ids, **kwargs):
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return "<bos>" if values == [2] else super().decode(values, **kwargs)


def test_sink_warning_once_per_capture_when_the_input_lost_its_bos():
    model = zoo.tiny_twin("llama")
    tok = BosByteTokenizer(model.config.vocab_size)  # it adds a BOS; these inputs lack it
    with pytest.warns(SinkTokenWarning, match=r"'q' \(id \d+, position 0\)") as record:
        with torch.no_grad(), capture(model, layers=[0], tokenizer=tok) as cap:
            model(**tok("quick", add_special_tokens=False, return_tensors="pt"))
            model(**tok("brown", add_special_tokens=False, return_tensors="pt"))
    assert len([w for w in record if w.category is SinkTokenWarning]) == 1
    assert record[0].filename == __file__  # points at the user's forward call
    message = str(record[0].message)
    assert "sink=" in message and "'<bos>'" in message and "add_special_tokens" in message
    assert cap.dataset.sizes["sample"] == 2
    assert issubclass(SinkTokenWarning, UserWarning)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"sink": 0}, {"tokenizer": "bos"}, {"tokenizer": "no-bos"}],
    ids=["no-tokenizer", "fixed-sink", "bos", "tokenizer-adds-none"],
)
def test_no_sink_warning_on_the_default_paths(kwargs):
    """No warning without a tokenizer, for a fixed sink, with the BOS the tokenizer adds, and
    (the default of SmolLM2 and Qwen2.5) an ordinary first token from a tokenizer adding none."""
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    ids = tok("quick", return_tensors="pt")["input_ids"]
    if kwargs.get("tokenizer") == "bos":  # the tokenizer's own BOS, as it encodes
        kwargs = {"tokenizer": BosByteTokenizer(model.config.vocab_size)}
        ids = kwargs["tokenizer"]("quick", return_tensors="pt")["input_ids"]
    elif kwargs.get("tokenizer") == "no-bos":
        kwargs = {"tokenizer": tok}
    elif "sink" in kwargs:
        kwargs = {**kwargs, "tokenizer": BosByteTokenizer(model.config.vocab_size)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkTokenWarning)
        with torch.no_grad(), capture(model, layers=[0], **kwargs):
            model(input_ids=ids)


def test_a_tokenizer_without_decode_is_refused_before_any_work():
    model = zoo.tiny_twin("llama")
    with pytest.raises(ac.AttncodaError, match=r"tokenizer=.*has no decode"):
        with capture(model, tokenizer="gpt2"):
            pass


def test_the_eager_fallback_gets_tokens_and_the_warning(old_style_model):
    model = old_style_model  # GPT-Neo: its own attention code, captured by hooks
    tok = BosByteTokenizer(model.config.vocab_size)  # 50 ids: bytes wrap around
    ids = tok("abc", add_special_tokens=False, return_tensors="pt")["input_ids"]
    want = [tok.decode([i]) for i in ids[0].tolist()]
    with pytest.warns(
        SinkTokenWarning, match=re.escape(f"token {want[0]!r} (id {int(ids[0, 0])},")
    ):
        with torch.no_grad(), capture(model, what="rows", tokenizer=tok) as cap:
            model(input_ids=ids)
    assert cap.fallback
    assert cap.dataset.token.values.tolist() == [want]


@pytest.mark.parametrize("name", ["cap.nc", "cap.zarr"])
def test_a_chunked_dataset_saves_its_tokens_without_a_warning(tmp_path, name):
    ds = ac.testing.synthetic_rows(n_samples=2, length=5).chunk({"sample": 1})
    assert ds.token.chunks is not None  # dask chunks the coordinate too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = ac.load(ac.save(ds, tmp_path / name))
    assert back.token.values.tolist() == ds.token.values.tolist()
