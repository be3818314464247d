"""The model registry and the tiny twins (CPU, no download)."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attncoda.hooks import zoo  # noqa: E402

ATOL = 1e-5
FAMILIES = zoo.twin_families()
ENCODERS = ("bert", "mpnet")  # bidirectional twins: every key visible to every query
SLIDING = ("gemma3_text", "gemma2", "gpt_oss")
# twins over token ids; the encoder-decoder over audio (whisper) has its own tests below
TEXT = [f for f in FAMILIES if f != "whisper"]


def main_output(out):
    """Logits for LMs, the last hidden state for encoders."""
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.fixture(scope="module")
def twins():
    """One eager twin per family, built once (each build takes well under a second)."""
    return {f: zoo.tiny_twin(f, attn_implementation="eager") for f in FAMILIES}


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_registry_size_names_and_families():
    entries = zoo.list_models()
    names = [e.name for e in entries]
    assert len(entries) >= 10
    assert len(set(names)) == len(names)
    assert len({e.hub_id for e in entries}) == len(entries)
    assert len({e.family for e in entries}) >= 7
    # every family of the registry has a twin, and every twin a registry entry
    assert {e.family for e in entries} == set(zoo.FAMILIES)
    for e in entries:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", e.name), e.name
        assert re.fullmatch(r"[\w.\-]+/[\w.\-]+", e.hub_id), e.hub_id
        assert e.kv_heads <= e.heads and e.heads % e.kv_heads == 0
        if e.family == "whisper":  # encoder-decoder over audio
            assert e.auto_class == "AutoModelForSpeechSeq2Seq"
        else:
            assert e.auto_class == ("AutoModelForCausalLM" if e.causal else "AutoModel")
        assert e.notes


def test_registry_facts():
    get = zoo.get_entry
    assert [e.name for e in zoo.list_models("pythia")] == ["pythia-70m", "pythia-1b", "pythia-1.4b"]
    assert get("EleutherAI/pythia-70m") is get("pythia-70m")
    assert get("smollm2-135m").hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert get("smollm2-135m").family == "llama" and get("smollm2-135m").gqa
    assert get("gemma3-270m").asset == "gemma3-270m" and get("gemma3-270m").has_sliding_window
    assert get("minilm-l6").asset == "minilm-l6" and not get("minilm-l6").causal
    mpnet = get("sentence-transformers/all-mpnet-base-v2")
    assert mpnet is get("mpnet-base") and mpnet.asset == "mpnet-base" and not mpnet.causal
    assert (mpnet.family, mpnet.layers, mpnet.heads, mpnet.hidden) == ("mpnet", 12, 12, 768)
    assert get("gpt-oss-20b").learned_sinks and get("gpt-oss-20b").family == "gpt_oss"
    assert get("gemma2-2b").has_softcapping
    assert get("opt-125m").bos_sink and not get("gpt2").bos_sink
    assert {e.name for e in zoo.list_models() if e.asset} == {
        "smollm2-135m",
        "gemma3-270m",
        "minilm-l6",
        "mpnet-base",
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
        "whisper-base",
    }
    small, large = get("qwen2.5-coder-0.5b"), get("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert small.family == large.family == "qwen2" and small.gqa and large.gqa
    assert (small.layers, small.heads, small.kv_heads, small.hidden) == (24, 14, 2, 896)
    assert (large.layers, large.heads, large.kv_heads, large.hidden) == (28, 12, 2, 1536)
    assert not small.bos_sink and small.asset == "qwen2.5-coder-0.5b"
    # the provenance of the offline weights: tuning, domain and quantisation types
    for entry, types in ((small, ("Q5_0", "Q8_0", "Q4_K", "Q6_K")), (large, ("Q4_K", "Q6_K"))):
        assert "Instruct" in entry.provenance and "code model" in entry.provenance
        assert all(t in entry.provenance for t in types)
    assert all(e.provenance for e in zoo.list_models() if e.asset)
    assert not any(e.provenance for e in zoo.list_models() if not e.asset)
    with pytest.raises(KeyError, match="pythia-70m"):
        get("pythia-70")


def test_registry_assets_exist_in_assets_module():
    assets = pytest.importorskip("attncoda.hooks.assets")
    known = {a.name for a in assets.list_assets("model")}
    for e in zoo.list_models():
        if e.asset is not None:
            assert e.asset in known


def _asset_folder(tmp_path, family: str, manifest: dict):
    """A saved twin in a folder whose manifest names an offline asset, as the cache holds it."""
    folder = tmp_path / "asset"
    zoo.tiny_twin(family).save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def test_provenance_reaches_the_captured_dataset(tmp_path):
    import attncoda as ac
    from attncoda.hooks import capture

    entry = zoo.get_entry("qwen2.5-coder-0.5b")
    folder = _asset_folder(tmp_path, "qwen2", {"asset": entry.asset, "kind": "model"})
    model, _ = zoo.load(folder)
    assert zoo.provenance_of(model) == entry.provenance
    with torch.no_grad(), capture(model, what="summaries") as cap:
        model(**zoo.tiny_batch(model, length=6))
    ds = cap.dataset
    assert ds.attrs["provenance"] == entry.provenance
    assert ds.attrs["family"] == "qwen2"
    path = ac.save(ds, tmp_path / "qwen.nc")  # a netCDF-safe string attribute
    assert ac.load(path).attrs["provenance"] == entry.provenance


def test_no_provenance_where_the_registry_cannot_vouch(tmp_path):
    from attncoda.hooks import capture

    twin = zoo.tiny_twin("qwen2")
    assert zoo.provenance_of(twin) == ""
    with torch.no_grad(), capture(twin) as cap:
        twin(**zoo.tiny_batch(twin, length=6))
    assert "provenance" not in cap.dataset.attrs
    # a folder whose manifest names a corpus, an unknown asset, or is not JSON
    for i, manifest in enumerate(({"asset": "austen", "kind": "corpus"}, {"asset": "x"})):
        folder = _asset_folder(tmp_path / str(i), "llama", manifest)
        assert zoo.provenance_of(zoo.load(folder)[0]) == ""
    (folder / "manifest.json").write_text("{not json", encoding="utf-8")
    assert zoo.provenance_of(zoo.load(folder)[0]) == ""


def test_model_id_names_an_asset_the_same_wherever_its_cache_lives(tmp_path):
    """A model loaded from an offline asset is recorded by its registry name, not by the
    checkpoint folder of one machine's cache; other models by their name or folder."""
    from attncoda.hooks import capture

    entry = zoo.get_entry("qwen2.5-coder-0.5b")
    for where in ("home", "elsewhere"):  # two caches, e.g. two machines or $ATTNCODA_CACHE
        folder = _asset_folder(tmp_path / where, "qwen2", {"asset": entry.asset, "kind": "model"})
        model, _ = zoo.load(folder)
        assert zoo.model_id(model) == entry.name
    with torch.no_grad(), capture(model, what="summaries") as cap:
        model(**zoo.tiny_batch(model, length=6))
    assert cap.dataset.attrs["model_id"] == entry.name
    assert zoo.model_id(zoo.tiny_twin("llama")) == "tiny-twin-llama-seed0"
    plain = _asset_folder(tmp_path / "plain", "llama", {"asset": "austen", "kind": "corpus"})
    assert zoo.model_id(zoo.load(plain)[0]) == str(plain)  # not a model asset: its folder
    bare = zoo.tiny_twin("llama")
    bare.config._name_or_path = ""
    assert zoo.model_id(bare) == type(bare).__name__


def test_resolve_family():
    assert zoo.resolve_family("gemma3") == "gemma3_text"
    assert zoo.resolve_family("GPT-OSS") == "gpt_oss"
    assert zoo.resolve_family("pythia-1.4b") == "gpt_neox"
    assert zoo.resolve_family("Qwen/Qwen2.5-0.5B") == "qwen2"
    with pytest.raises(KeyError, match="families"):
        zoo.resolve_family("mamba")


def test_pythia_revisions_well_formed():
    revs = zoo.pythia_revisions()
    assert len(revs) == 154 == len(set(revs))
    assert revs[:11] == ["step0"] + [f"step{2**i}" for i in range(10)]
    assert revs[11:] == [f"step{k}" for k in range(1000, 143001, 1000)]
    assert revs[0] == "step0" and revs[-1] == "step143000"
    steps = [int(r.removeprefix("step")) for r in revs]
    assert steps == sorted(steps)
    assert all(re.fullmatch(r"step\d+", r) for r in revs)
    assert zoo.get_entry("pythia-1b").revisions == tuple(revs)
    assert zoo.get_entry("gpt2").revisions == ()


# ---------------------------------------------------------------------------------------------
# Tiny twins
# ---------------------------------------------------------------------------------------------


def test_all_families_have_twins():
    # transformers 5.x has every family, GPT-OSS included
    assert set(FAMILIES) == set(zoo.FAMILIES)


@pytest.mark.parametrize("family", TEXT)
def test_twin_forward_and_eager_attentions(twins, family):
    model = twins[family]
    cfg = model.config
    assert not model.training
    assert cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4
    assert 32 <= getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0)) <= 64
    batch = zoo.tiny_batch(model, batch=2, length=12)
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    y = main_output(out)
    assert y.shape[:2] == (2, 12) and torch.isfinite(y).all()
    att = out.attentions
    assert len(att) == 2
    for a in att:
        assert a.shape == (2, 4, 12, 12)
        assert torch.isfinite(a).all() and (a >= 0).all()
        sums = a.sum(-1)
        if family == "gpt_oss":  # learned sinks take part of the mass
            assert (sums < 1 - 1e-4).all() and (sums > 0).all()
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
        if cfg.is_encoder_decoder or family in ENCODERS:
            assert (a > 0).all()  # bidirectional: every key visible
        else:
            assert (a.triu(1) == 0).all()  # causal


@pytest.mark.parametrize("family", TEXT)
@pytest.mark.parametrize("left_padding", [False, True])
def test_twin_sdpa_matches_eager(family, left_padding):
    if not zoo.supports_sdpa(family):
        assert family in ("gemma2", "gpt_oss", "mpnet")
        with pytest.raises(ValueError, match="scaled_dot_product_attention"):
            zoo.tiny_twin(family, attn_implementation="sdpa")
        pytest.skip(f"{family} has no sdpa in transformers")
    sdpa = zoo.tiny_twin(family, attn_implementation="sdpa")
    eager = zoo.tiny_twin(family, attn_implementation="eager")
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    batch = zoo.tiny_batch(sdpa, batch=3, length=12, left_padding=left_padding)
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        ys = main_output(sdpa(**batch))
        ye = main_output(eager(**batch))
        # switching at run time gives the same as building with eager
        sdpa.set_attn_implementation("eager")
        yr = main_output(sdpa(**batch))
    # compare at valid positions only: causal rows of left-padding queries see no key at all,
    # and sdpa and eager fill such rows differently (both are ignored downstream)
    torch.testing.assert_close(ys[valid], ye[valid], atol=ATOL, rtol=0)
    torch.testing.assert_close(yr, ye, atol=0, rtol=0)


def test_twin_default_implementation():
    for family in FAMILIES:
        model = zoo.tiny_twin(family)
        expected = "sdpa" if zoo.supports_sdpa(family) else "eager"
        assert model.config._attn_implementation == expected, family


def test_twin_deterministic_from_seed():
    state = torch.random.get_rng_state()
    a = zoo.tiny_twin("llama", seed=3).state_dict()
    b = zoo.tiny_twin("smollm2-135m", seed=3).state_dict()
    c = zoo.tiny_twin("llama", seed=4).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_twin_gqa_has_fewer_kv_heads(twins):
    expected = {"llama": 2, "qwen2": 2, "gemma3_text": 1, "gemma2": 2, "gpt_oss": 2}
    for family, n_kv in expected.items():
        if family not in twins:
            continue
        model = twins[family]
        assert model.config.num_key_value_heads == n_kv < model.config.num_attention_heads
        attn = model.model.layers[0].self_attn
        head_dim = attn.head_dim
        assert attn.k_proj.out_features == n_kv * head_dim
        assert attn.v_proj.out_features == n_kv * head_dim
        assert attn.q_proj.out_features == 4 * head_dim
        assert attn.num_key_value_groups == 4 // n_kv
        assert zoo.resolve_family(family) in {
            e.family for e in zoo.list_models() if e.gqa
        }  # the real family uses GQA too
    for family in ("gpt2", "gpt_neox", "opt", *ENCODERS):
        assert getattr(twins[family].config, "num_key_value_heads", 4) == 4


@pytest.mark.parametrize("family", [f for f in SLIDING if f in FAMILIES])
def test_twin_sliding_window_layers(twins, family):
    model = twins[family]
    cfg = model.config
    length = 12
    assert cfg.layer_types == ["sliding_attention", "full_attention"]
    assert cfg.sliding_window < length
    batch = zoo.tiny_batch(model, batch=1, length=length)
    with torch.no_grad():
        att = model(**batch, output_attentions=True).attentions
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    in_window = (k <= q) & (k > q - cfg.sliding_window)
    local, full = att
    assert (local[..., ~in_window] == 0).all()
    assert (local[..., in_window] > 0).all()
    assert (full[..., (k <= q) & ~in_window] > 0).all()  # the global layer sees beyond


def test_gemma3_twin_mirrors_real_gemma3(twins):
    if "gemma3_text" not in twins:
        pytest.skip("no Gemma 3 in this transformers")
    model = twins["gemma3_text"]
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.config.model_type == zoo.get_entry("gemma3-270m").family


def test_gemma2_twin_softcap_changes_outputs(twins):
    if "gemma2" not in twins:
        pytest.skip("no Gemma 2 in this transformers")
    model = twins["gemma2"]
    assert model.config.attn_logit_softcapping is not None
    uncapped = zoo.tiny_twin("gemma2", attn_implementation="eager", attn_logit_softcapping=None)
    batch = zoo.tiny_batch(model)
    with torch.no_grad():
        a = model(**batch, output_attentions=True).attentions[1]
        b = uncapped(**batch, output_attentions=True).attentions[1]
    assert (a - b).abs().max() > 1e-3


def test_gpt_oss_twin_has_learned_sinks(twins):
    if "gpt_oss" not in twins:
        pytest.skip("no GPT-OSS in this transformers")
    attn = twins["gpt_oss"].model.layers[0].self_attn
    assert attn.sinks.shape == (4,)


def test_bert_twin_is_bidirectional(twins):
    model = twins["bert"]
    assert type(model).__name__ == "BertModel"
    assert not model.config.is_decoder
    batch = zoo.tiny_batch(model)
    ids = batch["input_ids"]
    assert (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()


def test_mpnet_twin_is_bidirectional_with_position_bias(twins):
    model = twins["mpnet"]
    assert type(model).__name__ == "MPNetModel"
    ids = zoo.tiny_batch(model)["input_ids"]
    assert (ids[:, 0] == 0).all() and (ids[:, -1] == 2).all()  # <s> ... </s>
    # the relative position bias is part of every layer's attention logits, so the rows of a
    # twin differ when the bias changes
    batch = zoo.tiny_batch(model, batch=1)
    with torch.no_grad():
        before = model(**batch, output_attentions=True).attentions[0]
        model.encoder.relative_attention_bias.weight.add_(1.0 * torch.arange(32)[:, None])
        after = model(**batch, output_attentions=True).attentions[0]
        model.encoder.relative_attention_bias.weight.sub_(1.0 * torch.arange(32)[:, None])
    assert not torch.allclose(before, after, atol=1e-3)
    # transformers runs MPNet's attention in its own code: no registry, no sdpa
    assert not model._can_set_attn_implementation() and not zoo.supports_sdpa("mpnet")


def test_twin_dtype_and_overrides():
    model = zoo.tiny_twin("qwen2", dtype=torch.bfloat16, num_hidden_layers=3)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 3
    assert model.config.name_or_path == "tiny-twin-qwen2-seed0"
    with torch.no_grad():
        assert torch.isfinite(model(**zoo.tiny_batch(model)).logits.float()).all()


def test_twin_runtime_switch_to_registered_function():
    """Every twin can switch implementation at run time, also to a custom registered name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    def plain_eager(module, query, key, value, attention_mask, **kwargs):
        import sys

        return sys.modules[type(module).__module__].eager_attention_forward(
            module, query, key, value, attention_mask, **kwargs
        )

    AttentionInterface.register("zoo_test_eager", plain_eager)
    AttentionMaskInterface.register("zoo_test_eager", eager_mask)
    for family in TEXT:
        model = zoo.tiny_twin(family, attn_implementation="eager")
        if family == "mpnet":  # its attention never reaches the registry (capture's fallback)
            assert not model._can_set_attn_implementation()
            continue
        assert model._can_set_attn_implementation(), family
        batch = zoo.tiny_batch(model, left_padding=True)
        with torch.no_grad():
            ref = main_output(model(**batch))
            model.set_attn_implementation("zoo_test_eager")
            got = main_output(model(**batch))
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0, msg=family)


# ---------------------------------------------------------------------------------------------
# tiny_batch
# ---------------------------------------------------------------------------------------------


def test_whisper_twin_reads_audio_and_has_three_attention_stacks(twins):
    model = twins["whisper"]
    assert model.config.is_encoder_decoder and type(model).__name__.startswith("Whisper")
    batch = zoo.tiny_batch(model, batch=2, length=5)
    assert batch["input_features"].shape == (2, 8, 32)
    assert (batch["decoder_input_ids"][:, 0] == model.config.decoder_start_token_id).all()
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    assert out.logits.shape == (2, 5, 128)
    for name, shape in (
        ("encoder_attentions", (2, 4, 16, 16)),
        ("decoder_attentions", (2, 4, 5, 5)),
        ("cross_attentions", (2, 4, 5, 16)),
    ):
        att = getattr(out, name)
        assert len(att) == 2 and all(a.shape == shape for a in att), name
    assert (out.decoder_attentions[0].triu(1) == 0).all()  # the decoder is causal
    with pytest.raises(ValueError, match="no padding"):
        zoo.tiny_batch(model, left_padding=True)


@pytest.mark.parametrize("family", ["llama", "opt", "gemma3_text", "bert", "mpnet"])
def test_tiny_batch_left_padding(twins, family):
    model = twins[family]
    plain = zoo.tiny_batch(model, batch=4, length=12, seed=1)
    assert plain["input_ids"].shape == (4, 12) and plain["input_ids"].dtype == torch.long
    assert (plain["attention_mask"] == 1).all()
    padded = zoo.tiny_batch(model, batch=4, length=12, seed=1, left_padding=True)
    mask = padded["attention_mask"]
    lengths = mask.sum(-1)
    assert lengths[0] == 12 and (lengths[1:] < 12).all() and (lengths > 6).all()
    # left padding: zeros then ones, pad ids under the zeros
    assert (mask.diff(dim=-1) >= 0).all()
    pad = model.config.pad_token_id
    assert (padded["input_ids"][mask == 0] == pad).all()
    assert (padded["input_ids"][mask == 1] != pad).all()
    first = (mask == 0).sum(-1)
    bos = {"opt": 2, "gemma3_text": 2, "bert": 101, "mpnet": 0}.get(family)
    if bos is not None:  # the first valid token is the BOS-like sink, as with the tokenizer
        assert (padded["input_ids"][torch.arange(4), first] == bos).all()
    with torch.no_grad():
        assert torch.isfinite(main_output(model(**padded))[mask.bool()]).all()
    # deterministic
    again = zoo.tiny_batch(model, batch=4, length=12, seed=1, left_padding=True)
    assert torch.equal(again["input_ids"], padded["input_ids"])


def test_tiny_batch_ids_in_vocab(twins):
    for family, model in twins.items():
        if family == "whisper":
            continue  # no input_ids (decoder ids: test_whisper_twin_reads_audio...)
        ids = zoo.tiny_batch(model, batch=3, length=20, left_padding=True)["input_ids"]
        assert 0 <= ids.min() and ids.max() < model.config.vocab_size, family


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------


def test_load_unknown_name_is_clear():
    with pytest.raises(ValueError, match=r"unknown model 'pythia-7m'.*pythia-70m"):
        zoo.load("pythia-7m")
    with pytest.raises(ValueError, match="hub id") as err:
        zoo.load("no-such-model")
    # said once, offline names apart from the hub-only ones
    text = str(err.value)
    offline, hub = text.split("Offline (attncoda fetch NAME): ")[1].split(" From the hub only")
    assert "smollm2-135m" in offline and "gpt2" not in offline and "gpt2" in hub
    assert text.count("smollm2-135m") == 1 and text.count("hub id") == 1


def test_load_rejects_unpublished_pythia_revision():
    with pytest.raises(ValueError, match="step1500"):
        zoo.load("pythia-70m", revision="step1500")
    with pytest.raises(ValueError, match="no offline asset"):
        zoo.load("gpt2", source="asset")
    with pytest.raises(ValueError, match="revision"):
        zoo.load("smollm2-135m", source="asset", revision="main")


@pytest.fixture
def hub_offline(monkeypatch):
    """Make every hub access fail at once, as on a machine without a hub."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_load_without_hub_says_what_is_needed(hub_offline, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    with pytest.raises(zoo.ModelUnavailableError, match="not in the local hub cache") as info:
        zoo.load("pythia-70m", revision="step1000")  # at once: no retries in transformers
    assert "HF_HUB_OFFLINE is set" in str(info.value)
    assert "EleutherAI/pythia-70m" in str(info.value) and "step1000" in str(info.value)
    assert isinstance(info.value, OSError)
    with pytest.raises(zoo.ModelUnavailableError, match="attncoda fetch"):
        zoo.load("some-org/some-model")


def test_load_missing_asset_names_fetch(tmp_path):
    assets = pytest.importorskip("attncoda.hooks.assets")
    if not hasattr(assets, "AssetNotFoundError"):
        pytest.skip("assets module without AssetNotFoundError")
    with pytest.raises(zoo.ModelUnavailableError, match="attncoda fetch minilm-l6"):
        zoo.load("minilm-l6", cache_dir=tmp_path)


def test_load_local_directory(tmp_path):
    model = zoo.tiny_twin("llama", seed=7)
    model.save_pretrained(tmp_path / "ckpt")
    for where in (tmp_path / "ckpt", str(tmp_path / "ckpt")):
        loaded, tokenizer = zoo.load(where, attn_implementation="eager")
        assert tokenizer is None  # a bare checkpoint has no tokenizer files
        assert type(loaded) is type(model) and not loaded.training
        assert loaded.config._attn_implementation == "eager"
        batch = zoo.tiny_batch(model)
        with torch.no_grad():
            torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)
    encoder = zoo.tiny_twin("bert")
    encoder.save_pretrained(tmp_path / "enc")
    loaded, _ = zoo.load(tmp_path / "enc")
    assert type(loaded).__name__ == "BertModel"
    with pytest.raises(FileNotFoundError):
        zoo.load(tmp_path / "missing")


# ------------------------------------------------------------------ configs before weights, devices


def test_load_config_reads_no_weights_and_gives_the_shape(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    model = zoo.tiny_twin("gpt2")
    model.save_pretrained(tmp_path / "ckpt")
    monkeypatch.setattr(zoo, "tiny_twin", refuse)
    for name in ("twin:gpt2", tmp_path / "ckpt"):
        assert zoo.model_shape(zoo.load_config(name)) == zoo.ModelShape(2, 4, 64)
    gemma = zoo.model_shape(zoo.load_config("twin:gemma3"))  # multimodal: its text model
    assert gemma.layers == 2 and gemma.heads == 4


@pytest.mark.real
def test_load_config_of_a_fetched_asset():
    from conftest import need

    need("smollm2-135m")
    assert zoo.model_shape(zoo.load_config("smollm2-135m")) == zoo.ModelShape(30, 9, 8192)


def test_device_and_dtype_are_refused_before_anything_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(zoo, "tiny_twin", refuse)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(zoo.DeviceError, match="this machine has no CUDA device"):
        zoo.load("twin:llama", device="cuda")
    with pytest.raises(zoo.DeviceError, match="not a torch device"):
        zoo.load("twin:llama", device="gpu")
    with pytest.raises(zoo.DtypeError, match="choose from float32, bfloat16, float16, auto"):
        zoo.load("twin:llama", dtype="fp8")
    assert zoo.DeviceError.exit_code == zoo.DtypeError.exit_code == 2


def test_the_command_line_offers_the_zoo_dtypes():
    from attncoda.cli._common import DTYPES

    assert DTYPES == zoo.DTYPES


def test_an_unreachable_hub_id_is_refused_before_transformers_retries(monkeypatch):
    import huggingface_hub.constants
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("transformers was asked (and would retry for a minute)")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_hub)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_hub)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(zoo, "_hub_reachable", lambda timeout=3.0: False)
    for call in (zoo.load, zoo.load_config):
        with pytest.raises(zoo.ModelUnavailableError, match="cannot be reached"):
            call("someorg/no-such-model")
