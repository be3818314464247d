"""The registry of real models: one :class:`ModelEntry` per model, lookups and provenance.

Each entry records what attention analysis needs to know before loading: hub id, family, causal
or not, the BOS-like sink token, learned sinks, sliding windows, softcapping, and the offline
asset that provides it. The Pythia entries accept the training-checkpoint revisions of
:func:`pythia_revisions`.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._families import _ALIASES, _TWINS, FAMILIES, AutoClassName

__all__ = [
    "MODELS",
    "PYTHIA_REVISIONS",
    "ModelEntry",
    "get_entry",
    "list_models",
    "provenance_of",
    "pythia_revisions",
    "resolve_family",
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
    9
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
    where = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    if not where:
        return ""
    try:
        manifest = json.loads((Path(where) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(manifest, dict) or manifest.get("kind") != "model":
        return ""
    asset = manifest.get("asset")
    entry = next((e for e in MODELS if e.asset is not None and e.asset == asset), None)
    return entry.provenance if entry is not None else ""


def _unknown_message(name: str, what: str) -> str:
    known = list(_BY_NAME)
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {what} {name!r}.{hint} Known models: {', '.join(known)}."


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
