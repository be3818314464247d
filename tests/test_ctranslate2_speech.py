"""The CTranslate2 reader and the Whisper conversion on a tiny synthetic model.bin written with
numpy: the converted weights give exactly the transformers model they were taken from."""

from __future__ import annotations

import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from attncoda.hooks import zoo  # noqa: E402
from attncoda.hooks.assets import AssetBuildError  # noqa: E402
from attncoda.hooks.assets._ctranslate2 import (  # noqa: E402
    read_ctranslate2,
    whisper_config_kwargs,
    whisper_dimensions,
    whisper_state_dict,
)
from attncoda.hooks.evaluate import word_error_rate  # noqa: E402


def _s(text: str) -> bytes:
    return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"


def _var(name: str, value: np.ndarray) -> bytes:
    ids = {np.dtype(np.float16): 4, np.dtype(np.float32): 0, np.dtype(np.int32): 3}
    out = (
        _s(name)
        + struct.pack("<B", value.ndim)
        + b"".join(struct.pack("<I", d) for d in value.shape)
    )
    return out + struct.pack("<BI", ids[value.dtype], value.nbytes) + value.tobytes()


def _ct2_of(model) -> bytes:
    """model.bin of a transformers Whisper, laid out as CTranslate2's WhisperSpec (fp16)."""
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    h = lambda a: np.ascontiguousarray(a, dtype=np.float16)  # noqa: E731
    v: dict[str, np.ndarray] = {}
    cfg = model.config
    for stack in ("encoder", "decoder"):
        pre = f"model.{stack}"
        v[f"{stack}/num_heads"] = np.array(cfg.encoder_attention_heads, dtype=np.int32)
        v[f"{stack}/position_encodings/encodings"] = h(sd[f"{pre}.embed_positions.weight"])
        v[f"{stack}/layer_norm/gamma"] = h(sd[f"{pre}.layer_norm.weight"])
        v[f"{stack}/layer_norm/beta"] = h(sd[f"{pre}.layer_norm.bias"])
        for i in range(cfg.encoder_layers):
            s, d = f"{stack}/layer_{i}", f"{pre}.layers.{i}"
            zero = np.zeros_like(sd[f"{d}.self_attn.q_proj.bias"])
            for part, mod in (("self_attention", "self_attn"), ("attention", "encoder_attn")):
                if stack == "encoder" and part == "attention":
                    continue
                ln = (
                    "self_attn_layer_norm"
                    if part == "self_attention"
                    else "encoder_attn_layer_norm"
                )
                v[f"{s}/{part}/layer_norm/gamma"] = h(sd[f"{d}.{ln}.weight"])
                v[f"{s}/{part}/layer_norm/beta"] = h(sd[f"{d}.{ln}.bias"])
                qkv = [sd[f"{d}.{mod}.{n}_proj.weight"] for n in "qkv"]
                b = [sd[f"{d}.{mod}.q_proj.bias"], zero, sd[f"{d}.{mod}.v_proj.bias"]]
                if part == "self_attention":
                    v[f"{s}/{part}/linear_0/weight"] = h(np.concatenate(qkv))
                    v[f"{s}/{part}/linear_0/bias"] = h(np.concatenate(b))
                    out = "linear_1"
                else:
                    v[f"{s}/{part}/linear_0/weight"] = h(qkv[0])
                    v[f"{s}/{part}/linear_0/bias"] = h(b[0])
                    v[f"{s}/{part}/linear_1/weight"] = h(np.concatenate(qkv[1:]))
                    v[f"{s}/{part}/linear_1/bias"] = h(np.concatenate(b[1:]))
                    out = "linear_2"
                v[f"{s}/{part}/{out}/weight"] = h(sd[f"{d}.{mod}.out_proj.weight"])
                v[f"{s}/{part}/{out}/bias"] = h(sd[f"{d}.{mod}.out_proj.bias"])
            v[f"{s}/ffn/layer_norm/gamma"] = h(sd[f"{d}.final_layer_norm.weight"])
            v[f"{s}/ffn/layer_norm/beta"] = h(sd[f"{d}.final_layer_norm.bias"])
            for j, fc in enumerate(("fc1", "fc2")):
                v[f"{s}/ffn/linear_{j}/weight"] = h(sd[f"{d}.{fc}.weight"])
                v[f"{s}/ffn/linear_{j}/bias"] = h(sd[f"{d}.{fc}.bias"])
    for conv in ("conv1", "conv2"):
        v[f"encoder/{conv}/weight"] = h(sd[f"model.encoder.{conv}.weight"])
        v[f"encoder/{conv}/bias"] = h(sd[f"model.encoder.{conv}.bias"])
    v["decoder/embeddings/weight"] = h(sd["model.decoder.embed_tokens.weight"])
    blob = struct.pack("<I", 6) + _s("WhisperSpec") + struct.pack("<II", 3, len(v))
    blob += b"".join(_var(k, a) for k, a in sorted(v.items()))
    return (
        blob
        + struct.pack("<I", 1)
        + _s("decoder/projection/weight")
        + _s("decoder/embeddings/weight")
    )


def test_a_synthetic_ctranslate2_whisper_converts_back_to_the_same_model():
    twin = zoo.tiny_twin("whisper", attn_implementation="eager")
    with torch.no_grad():  # fp16-representable weights: the round trip is exact
        for p in twin.parameters():
            p.copy_(p.half().float())
    ct2 = read_ctranslate2(_ct2_of(twin))
    assert ct2.spec == "WhisperSpec" and ct2.version == 6
    assert ct2.get("decoder/projection/weight") is ct2.variables["decoder/embeddings/weight"]
    dims = whisper_dimensions(ct2)
    assert (dims["encoder_layers"], dims["d_model"], dims["num_mel_bins"]) == (2, 32, 8)
    state = whisper_state_dict(ct2)
    back = transformers.WhisperForConditionalGeneration(twin.config).eval()
    missing, unexpected = back.load_state_dict(
        {k: torch.from_numpy(a) for k, a in state.items()}, strict=False
    )
    assert set(missing) == {"proj_out.weight"} and not unexpected
    back.tie_weights()
    batch = zoo.tiny_batch(twin, length=5)
    with torch.no_grad():
        torch.testing.assert_close(back(**batch).logits, twin(**batch).logits, atol=0, rtol=0)


def test_bad_files_are_refused_in_one_line():
    with pytest.raises(AssetBuildError, match="binary version 9"):
        read_ctranslate2(struct.pack("<I", 9))
    blob = struct.pack("<I", 6) + _s("WhisperSpec") + struct.pack("<II", 3, 1)
    with pytest.raises(AssetBuildError, match="ends early"):
        read_ctranslate2(blob + _s("a") + struct.pack("<BI", 1, 4))
    ok = read_ctranslate2(blob + _var("a", np.zeros(2, np.float16)) + struct.pack("<I", 0))
    with pytest.raises(AssetBuildError):
        whisper_config_kwargs(ok, {})


def test_word_error_rate():
    assert word_error_rate("It is a truth.", "it is a truth") == 0
    assert word_error_rate("twenty-one years", "21 years") == 2 / 3
    assert word_error_rate("a b", "a b c d") == 1.0
