"""CTranslate2 model files (``model.bin``) read with numpy, and Whisper's turned into transformers names.

The format (CTranslate2's ``ModelSpec._serialize``, binary version 6), little-endian: a uint32
binary version, the spec name and a uint32 spec revision, a uint32 count of variables, then for
each variable its name, a uint8 rank, one uint32 per dimension, a uint8 dtype id (0 float32, 1
int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), a uint32 byte count and the bytes; then a uint32
count of aliases, each an alias name and the name of the variable it stands for. A string is a
uint16 length (counting a closing NUL) and the bytes with that NUL.

Whisper's spec fuses the self-attention projections (``linear_0`` is q, k and v stacked) and the
cross-attention key and value (``linear_1``); CTranslate2 stores a zero bias for the keys, which
transformers' Whisper does not have (``k_proj`` has no bias): a non-zero one is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import AssetBuildError

#: CTranslate2 dtype ids and the numpy dtypes they read as (bfloat16 is not read here).
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}

#: The binary versions this reader understands.
_VERSIONS = (5, 6)


@dataclass(frozen=True)
class CT2Model:
    """What a CTranslate2 ``model.bin`` holds."""

    version: int
    spec: str
    revision: int
    variables: Mapping[str, np.ndarray]
    aliases: Mapping[str, str]

    def get(self, name: str) -> np.ndarray:
        """The variable ``name``, following an alias."""
        try:
            return self.variables[self.aliases.get(name, name)]
        except KeyError:
            raise AssetBuildError(f"the CTranslate2 {self.spec} has no variable {name!r}") from None


class _Reader:
    def __init__(self, data: bytes | memoryview, where: str) -> None:
        self.data, self.offset, self.where = data, 0, where

    def take(self, n: int) -> bytes | memoryview:
        if self.offset + n > len(self.data):
            raise AssetBuildError(
                f"{self.where} ends early (at byte {self.offset:,} of {len(self.data):,}, "
                f"{n:,} more wanted): not a complete CTranslate2 model"
            )
        out = self.data[self.offset : self.offset + n]
        self.offset += n
        return out

    def uint(self, fmt: str) -> int:
        size = struct.calcsize("<" + fmt)
        return int(struct.unpack("<" + fmt, self.take(size))[0])

    def string(self) -> str:
        n = self.uint("H")
        raw = bytes(self.take(n))
        if n == 0 or raw[-1] != 0:
            raise AssetBuildError(
                f"{self.where}: a string at byte {self.offset - n:,} lacks its NUL"
            )
        return raw[:-1].decode("utf-8")


def read_ctranslate2(data: bytes | memoryview, where: str = "model.bin") -> CT2Model:
    """Parse the bytes of a CTranslate2 ``model.bin`` (arrays are views of ``data``).

    Examples
    --------
    >>> import struct, numpy as np
    >>> def s(t): return struct.pack("<H", len(t) + 1) + t.encode() + b"\\0"
    >>> w = np.arange(6, dtype=np.float16).reshape(2, 3)
    >>> blob = (struct.pack("<I", 6) + s("TinySpec") + struct.pack("<II", 1, 1) + s("a/weight")
    ...         + struct.pack("<BII", 2, 2, 3) + struct.pack("<BI", 4, w.nbytes) + w.tobytes()
    ...         + struct.pack("<I", 1) + s("b/weight") + s("a/weight"))
    >>> m = read_ctranslate2(blob)
    >>> m.spec, m.get("b/weight").tolist()
    ('TinySpec', [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    """
    r = _Reader(data, where)
    version = r.uint("I")
    if version not in _VERSIONS:
        raise AssetBuildError(
            f"{where} has CTranslate2 binary version {version}, this reader knows {_VERSIONS}"
        )
    spec = r.string()
    revision = r.uint("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(r.uint("I")):
        name = r.string()
        shape = tuple(r.uint("I") for _ in range(r.uint("B")))
        dtype_id = r.uint("B")
        nbytes = r.uint("I")
        if dtype_id not in _DTYPES:
            raise AssetBuildError(f"{where}: {name} has dtype id {dtype_id}, not read here")
        dtype = np.dtype(_DTYPES[dtype_id])
        if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise AssetBuildError(f"{where}: {name} has {nbytes:,} bytes for shape {shape}")
        variables[name] = np.frombuffer(r.take(nbytes), dtype=dtype).reshape(shape)
    aliases: dict[str, str] = {}
    for _ in range(r.uint("I")):
        alias = r.string()
        aliases[alias] = r.string()
    if r.offset != len(data):
        raise AssetBuildError(f"{where} has {len(data) - r.offset:,} bytes after its aliases")
    missing = sorted(set(aliases.values()) - set(variables))
    if missing:
        raise AssetBuildError(f"{where}: aliases point to missing variables {missing}")
    return CT2Model(version, spec, revision, variables, aliases)


def read_ctranslate2_file(path: Path) -> CT2Model:
    """:func:`read_ctranslate2` of a file (read once into memory)."""
    return read_ctranslate2(path.read_bytes(), path.name)


def _scalar(model: CT2Model, name: str) -> int:
    return int(model.get(name).reshape(-1)[0]) if name in model.variables else -1


def _layers(model: CT2Model, stack: str) -> int:
    n = 0
    while f"{stack}/layer_{n}/ffn/linear_0/weight" in model.variables:
        n += 1
    return n


def whisper_dimensions(model: CT2Model) -> dict[str, int]:
    """The sizes of a CTranslate2 ``WhisperSpec``, as ``WhisperConfig`` names them."""
    if model.spec != "WhisperSpec":
        raise AssetBuildError(f"the CTranslate2 model is a {model.spec}, not a WhisperSpec")
    emb = model.get("decoder/embeddings/weight")
    return {
        "vocab_size": int(emb.shape[0]),
        "d_model": int(emb.shape[1]),
        "num_mel_bins": int(model.get("encoder/conv1/weight").shape[1]),
        "encoder_layers": _layers(model, "encoder"),
        "decoder_layers": _layers(model, "decoder"),
        "encoder_attention_heads": _scalar(model, "encoder/num_heads"),
        "decoder_attention_heads": _scalar(model, "decoder/num_heads"),
        "encoder_ffn_dim": int(model.get("encoder/layer_0/ffn/linear_0/weight").shape[0]),
        "decoder_ffn_dim": int(model.get("decoder/layer_0/ffn/linear_0/weight").shape[0]),
        "max_source_positions": int(model.get("encoder/position_encodings/encodings").shape[0]),
        "max_target_positions": int(model.get("decoder/position_encodings/encodings").shape[0]),
    }


def _split(w: np.ndarray, parts: int, name: str) -> list[np.ndarray]:
    if w.shape[0] % parts:
        raise AssetBuildError(f"{name} has {w.shape[0]} rows, not {parts} equal parts")
    return list(np.split(w, parts, axis=0))


def whisper_state_dict(model: CT2Model) -> dict[str, np.ndarray]:
    """The weights of a CTranslate2 ``WhisperSpec`` under ``WhisperForConditionalGeneration``'s
    names, as float32 arrays (``proj_out.weight`` is left out: it is tied to the embeddings).

    Every variable that holds weights is used exactly once; one left over is an error.
    """
    dims = whisper_dimensions(model)
    used: set[str] = set()
    out: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        used.add(name)
        return np.asarray(model.get(name), dtype=np.float32)

    def put(key: str, value: np.ndarray) -> None:
        out[key] = np.ascontiguousarray(value, dtype=np.float32)

    def norm(src: str, dst: str) -> None:
        put(f"{dst}.weight", get(f"{src}/gamma"))
        put(f"{dst}.bias", get(f"{src}/beta"))

    def linear(src: str, dst: str, bias: bool = True) -> None:
        put(f"{dst}.weight", get(f"{src}/weight"))
        if bias:
            put(f"{dst}.bias", get(f"{src}/bias"))

    def fused(src: str, dst: str, names: tuple[str, ...]) -> None:
        weights = _split(get(f"{src}/weight"), len(names), src)
        biases = _split(get(f"{src}/bias"), len(names), src)
        for n, w, b in zip(names, weights, biases, strict=True):
            put(f"{dst}.{n}_proj.weight", w)
            if n == "k":  # transformers' Whisper has no key bias; CTranslate2 stores zeros
                if np.any(b != 0):
                    raise AssetBuildError(f"{src} has a non-zero key bias: not a Whisper model")
            else:
                put(f"{dst}.{n}_proj.bias", b)

    for stack in ("encoder", "decoder"):
        pre = f"model.{stack}"
        put(f"{pre}.embed_positions.weight", get(f"{stack}/position_encodings/encodings"))
        norm(f"{stack}/layer_norm", f"{pre}.layer_norm")
        for i in range(dims[f"{stack}_layers"]):
            src, dst = f"{stack}/layer_{i}", f"{pre}.layers.{i}"
            norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            fused(f"{src}/self_attention/linear_0", f"{dst}.self_attn", ("q", "k", "v"))
            linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
            if stack == "decoder":
                norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
                linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
                fused(f"{src}/attention/linear_1", f"{dst}.encoder_attn", ("k", "v"))
                linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
            norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
            linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
            linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    put("model.decoder.embed_tokens.weight", get("decoder/embeddings/weight"))
    left = sorted(
        n for n, v in model.variables.items() if n not in used and v.ndim > 0 and v.size > 1
    )
    if left:
        raise AssetBuildError(f"the CTranslate2 Whisper model has unmapped weights: {left[:5]}")
    return out


def whisper_config_kwargs(model: CT2Model, ct2_config: Mapping[str, Any]) -> dict[str, Any]:
    """``WhisperConfig`` arguments of a CTranslate2 Whisper model and its ``config.json``.

    The special token ids are those of every multilingual Whisper vocabulary (51,865 tokens):
    ``<|endoftext|>`` 50257 (BOS, EOS, padding) and ``<|startoftranscript|>`` 50258.
    """
    dims = whisper_dimensions(model)
    if dims["vocab_size"] != 51865:
        raise AssetBuildError(
            f"the CTranslate2 Whisper model has {dims['vocab_size']} tokens; only multilingual "
            "Whisper (51,865) is converted here"
        )
    return {
        **dims,
        "bos_token_id": 50257,
        "eos_token_id": 50257,
        "pad_token_id": 50257,
        "decoder_start_token_id": 50258,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [])),
        "tie_word_embeddings": True,
    }
