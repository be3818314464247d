"""Tiny twins: a random model of each family built from its spec in well under a second, with no
download, the batches to run it on, and its byte-level tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._entries import resolve_family
from ._errors import UnknownModelError
from ._families import _TOKEN_HIGH, _TOKEN_LOW, _TWINS

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "ByteTokenizer",
    "supports_sdpa",
    "tiny_batch",
    "tiny_twin",
    "twin_config",
    "twin_families",
]


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
        raise ValueError(f"not a torch dtype: {dtype!r}")
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
