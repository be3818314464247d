"""The attention stacks of a model: which attention module computes which layer of what.

A decoder-only or encoder-only model has one stack, ``"self"``. An encoder-decoder (T5, BART,
Marian, Pegasus, Whisper, ...) has three: ``"encoder"`` (the encoder's self-attention),
``"decoder"`` (the decoder's causal self-attention) and ``"cross"`` (the decoder's queries over
the encoder's positions). Each stack is captured into a dataset of its own, since a cross
attention row has source positions as keys and target positions as queries.

Layers are numbered within their stack. A module applied once per forward pass is the layer of
its ``layer_idx`` (or of its order in the stack); a module applied several times per pass
(ALBERT shares one layer among all of them) is a new layer at each application, numbered by the
order of the calls in the pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._registry import attention_modules, n_layers_heads, text_config
from ._spec import CaptureError

__all__ = ["STACKS", "Stack", "stacks_of"]

#: the stacks in the order datasets are listed: encoder-decoders have the last three
STACKS = ("self", "encoder", "decoder", "cross")

# attribute names under which encoder-decoders keep their cross-attention modules
_CROSS_NAMES = frozenset(
    {"encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "cross_attention"}
)


@dataclass
class Stack:
    """One attention stack of a model.

    ``entry`` is the module whose forward pass is one pass of the stack (the model itself, or
    its encoder / decoder); ``static`` maps ``id(module)`` to its layer when every module is
    applied once per pass, and is ``None`` where modules are shared (layers then count calls).
    """

    name: str
    modules: list[Any]
    n_layers: int
    n_heads: int
    entry: Any
    static: dict[int, int] | None = field(default=None)

    @property
    def shared(self) -> bool:
        return self.static is None


def _static_layers(modules: list[Any], n_layers: int) -> dict[int, int] | None:
    """``id(module) -> layer`` where each module is one layer; ``None`` for shared modules."""
    raw = [getattr(m, "layer_idx", None) for m in modules]
    idx = [int(i) for i in raw if i is not None] if all(i is not None for i in raw) else None
    if len(modules) != n_layers:
        if idx is not None and len(set(idx)) == len(idx) and max(idx, default=0) < n_layers:
            return {id(m): i for m, i in zip(modules, idx, strict=True)}  # hybrids
        return None
    if idx is not None and sorted(idx) == list(range(n_layers)):
        return {id(m): i for m, i in zip(modules, idx, strict=True)}
    return {id(m): i for i, m in enumerate(modules)}


def _first_int(config: Any, *names: str) -> int | None:
    for name in names:
        val = getattr(config, name, None)
        if isinstance(val, int) and not isinstance(val, bool) and val > 0:
            return val
    return None


def stacks_of(model: Any) -> dict[str, Stack]:
    """The model's attention stacks by name, in :data:`STACKS` order.

    Raises :class:`CaptureError` (one line) for a model with no attention module, or an
    encoder-decoder whose encoder or decoder cannot be found.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> list(stacks_of(zoo.tiny_twin("llama")))
    ['self']
    """
    config = getattr(model, "config", None)
    if getattr(config, "attention_window", None) is not None:  # Longformer, LED
        raise CaptureError(
            f"{type(model).__name__} computes attention by its own sliding-chunk route "
            "(attention_window, with global tokens); attncoda cannot rebuild its rows"
        )
    if not getattr(config, "is_encoder_decoder", False):
        modules = attention_modules(model)
        if not modules:
            raise CaptureError(
                f"{type(model).__name__} has no attention module (no softmax attention, e.g. a "
                "state-space or recurrent model); attncoda captures attention rows only"
            )
        n_layers, n_heads = n_layers_heads(model)
        text = text_config(model)
        if n_heads is None and not any(
            hasattr(text, name) for name in ("num_attention_heads", "n_head", "num_heads")
        ):
            raise CaptureError(
                f"{type(model).__name__} has no softmax attention ({type(modules[0]).__name__} "
                "is a recurrent mixer and its config names no attention heads); attncoda "
                "captures attention rows only"
            )
        per_stage = getattr(text, "num_heads", None)
        if n_heads is None and isinstance(per_stage, (list, tuple)):
            raise CaptureError(
                f"{type(model).__name__}'s stages have different head counts (num_heads="
                f"{list(per_stage)}); attncoda's datasets hold one head count per stack"
            )
        if n_layers is None or n_heads is None:
            raise CaptureError(
                f"cannot read the number of layers/heads from {type(config).__name__}; this "
                "model family is not supported yet"
            )
        static = _static_layers(modules, n_layers)
        return {"self": Stack("self", modules, n_layers, n_heads, model, static)}
    encoder = _part(model, "get_encoder")
    decoder = _part(model, "get_decoder")
    enc_ids = {id(m) for m in encoder.modules()}
    dec_ids = {id(m) for m in decoder.modules()}
    names = {id(m): n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    parts: dict[str, list[Any]] = {"encoder": [], "decoder": [], "cross": []}
    for m in attention_modules(model):
        if id(m) in enc_ids:
            parts["encoder"].append(m)
        elif id(m) in dec_ids:
            cross = names.get(id(m)) in _CROSS_NAMES
            parts["cross" if cross else "decoder"].append(m)
    for name, modules in parts.items():
        if not modules:
            raise CaptureError(
                f"{type(model).__name__} is an encoder-decoder, but attncoda found no {name} "
                "attention module in it; this model family is not supported yet"
            )
    text = text_config(model)
    heads = {
        "encoder": _first_int(text, "encoder_attention_heads", "num_heads", "num_attention_heads"),
        "decoder": _first_int(
            text, "decoder_attention_heads", "num_decoder_heads", "num_heads", "num_attention_heads"
        ),
    }
    heads["cross"] = heads["decoder"]
    out: dict[str, Stack] = {}
    for name, modules in parts.items():
        n_heads = heads[name]
        if n_heads is None:
            raise CaptureError(
                f"cannot read the number of {name} attention heads from "
                f"{type(config).__name__}; this model family is not supported yet"
            )
        entry = encoder if name == "encoder" else decoder
        n_layers = len(modules)
        out[name] = Stack(
            name, modules, n_layers, n_heads, entry, _static_layers(modules, n_layers)
        )
    return out


def _part(model: Any, getter: str) -> Any:
    get = getattr(model, getter, None)
    part = None
    try:
        part = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        part = None
    if part is None or part is model:
        raise CaptureError(
            f"{type(model).__name__} is an encoder-decoder without a {getter}(); attncoda "
            "cannot tell its encoder from its decoder"
        )
    return part
