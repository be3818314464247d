"""The one attention function attncoda registers with transformers, and who may use it.

Captures (``capture``), head gates (``gates``) and attention plug-ins (priors, biases) all work
through the same registered function. This module owns the switch:

- :func:`activated` switches a model to ``"attncoda"`` and restores its previous implementation
  when the last user leaves, also after an exception. It is reference-counted, so a capture
  inside a gate block (or the other way round) shares one switch.
- Every layer's output is computed by the implementation the model had before (SDPA by default,
  the model's own eager function when it needs one), so an active switch changes nothing by
  itself.
- :class:`AttentionPlugin` objects, pushed with :func:`plugged`, may adjust a layer's mask
  (e.g. add a pre-softmax bias) or its per-head output (e.g. zero a head). They only apply to
  the modules of the model they were created for.
"""

from __future__ import annotations

import contextvars
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from attncoda import AttncodaError

__all__ = [
    "ATTENTION_NAME",
    "AttentionPlugin",
    "RegistryError",
    "activated",
    "attention_modules",
    "call_is_causal",
    "layer_index",
    "n_layers_heads",
    "plugged",
    "text_config",
]

#: The name under which attncoda registers its attention function with transformers (a model
#: being captured has ``config._attn_implementation == ATTENTION_NAME``). Neutral on purpose:
#: names containing "sdpa", "flash" or "flex" trigger transformers' own checks.
ATTENTION_NAME = "attncoda"


class RegistryError(AttncodaError, RuntimeError):
    """The model cannot be switched to attncoda's attention function."""


def attention_modules(model: Any) -> list[Any]:
    """The model's leaf attention modules, in layer order.

    A leaf attention module is one whose class name contains ``"Attention"`` and that has no
    child of that kind (BERT's ``BertSelfAttention``, not its wrapper ``BertAttention``).
    """
    found = []
    for module in model.modules():
        if "Attention" not in type(module).__name__:
            continue
        if any("Attention" in type(c).__name__ for c in module.children()):
            continue
        found.append(module)
    return found


@dataclass
class _Activation:
    previous: str
    modules: dict[int, int]  # id(attention module) -> layer index
    configs: set[int] = field(default_factory=set)  # ids of configs whose masks are built in full
    users: int = 0


_ACTIVATIONS: dict[int, _Activation] = {}  # id(model) -> activation
_MODULE_MODEL: dict[int, int] = {}  # id(attention module) -> id(model)
#: ids of the configs of activated models that ran eager attention before: their masks are
#: built in full, as eager builds them, never skipped for an ``is_causal`` flag
_EAGER_CONFIGS: dict[int, int] = {}  # id(config) -> users


def _mask_fn(*args: Any, config: Any = None, **kwargs: Any) -> Any:
    """transformers' SDPA mask, built in full for a model that ran eager attention.

    SDPA's mask may be skipped ("causal, no mask needed") where the attention call then decides
    causality by ``is_causal``; eager always builds the mask. A model whose attention modules
    say ``is_causal = False`` in a causal stack (NLLB-MoE's decoder) is causal under eager only
    through its mask, so a capture of it must keep the mask its own eager path would see.
    """
    from transformers.masking_utils import sdpa_mask

    if config is not None and id(config) in _EAGER_CONFIGS:
        kwargs["allow_is_causal_skip"] = False
        kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, config=config, **kwargs)


def _configs_of(model: Any) -> set[int]:
    """ids of the configs of ``model`` and of its submodules (a composite's sub-configs)."""
    return {id(m.config) for m in model.modules() if getattr(m, "config", None) is not None}


def layer_index(module: Any) -> int:
    """Layer index of an attention module of an activated model."""
    idx = getattr(module, "layer_idx", None)
    if idx is not None:
        return int(idx)
    act = _ACTIVATIONS.get(_MODULE_MODEL.get(id(module), -1))
    if act is None or id(module) not in act.modules:
        raise RegistryError(f"{type(module).__name__} is not part of an activated model")
    return act.modules[id(module)]


def text_config(model: Any) -> Any:
    """The config of a model's text stack (``config.get_text_config()`` where it exists).

    Multimodal models (Gemma 3 with vision) keep layers and heads in a nested text config; for
    every other model this is ``model.config`` itself.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("gemma3")
    >>> text_config(model).num_attention_heads
    4
    """
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def n_layers_heads(model: Any) -> tuple[int | None, int | None]:
    """Layers and query heads per layer of a model's text stack, None where the config is silent.

    Reads ``num_hidden_layers`` / ``num_attention_heads`` and GPT-2's ``n_layer`` / ``n_head``;
    each caller raises its own error when a count is missing.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> n_layers_heads(zoo.tiny_twin("gpt2"))
    (2, 4)
    """
    text = text_config(model)
    n_layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    n_heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    if isinstance(n_heads, (list, tuple)):  # one count per stage (Swin): one count or none
        n_heads = n_heads[0] if len(set(n_heads)) == 1 else None
    return (
        int(n_layers) if n_layers is not None else None,
        int(n_heads) if n_heads is not None else None,
    )


def can_switch(model: Any) -> bool:
    """Whether the model's attention goes through transformers' attention registry."""
    fn = getattr(type(model), "_can_set_attn_implementation", None)
    return bool(fn()) if fn is not None else False


_REGISTERED_NAMES: set[str] = set()


def register_attention(name: str, fn: Callable[..., Any], mask_fn: Any = None) -> None:
    """Register ``fn`` (and ``mask_fn``) with transformers under ``name``, once per process.

    Without a mask function transformers builds no mask for models switched to ``name``.
    """
    if name in _REGISTERED_NAMES:
        return
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, fn)
    if mask_fn is not None:
        AttentionMaskInterface.register(name, mask_fn)
    _REGISTERED_NAMES.add(name)


@contextmanager
def activated(model: Any) -> Iterator[str]:
    """Switch ``model`` to attncoda's attention function for the block; yields the previous name.

    Raises :class:`RegistryError` for models whose attention does not go through the registry.
    """
    key = id(model)
    act = _ACTIVATIONS.get(key)
    if act is None:
        if not can_switch(model):
            raise RegistryError(
                f"{type(model).__name__} computes attention in its own code, not through "
                "transformers' attention registry, so attncoda cannot switch it"
            )
        register_attention(ATTENTION_NAME, _attention_fn, _mask_fn)
        previous = str(model.config._attn_implementation)
        modules = {id(m): i for i, m in enumerate(attention_modules(model))}
        act = _Activation(previous=previous, modules=modules)
        if previous == "eager":
            act.configs = _configs_of(model)
            for cid in act.configs:
                _EAGER_CONFIGS[cid] = _EAGER_CONFIGS.get(cid, 0) + 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(ATTENTION_NAME)
        _ACTIVATIONS[key] = act
        for mid in modules:
            _MODULE_MODEL[mid] = key
    act.users += 1
    try:
        yield act.previous
    finally:
        act.users -= 1
        if act.users == 0:
            del _ACTIVATIONS[key]
            for mid in act.modules:
                _MODULE_MODEL.pop(mid, None)
            for cid in act.configs:
                _EAGER_CONFIGS[cid] -= 1
                if not _EAGER_CONFIGS[cid]:
                    del _EAGER_CONFIGS[cid]
            model.set_attn_implementation(act.previous)


class AttentionPlugin:
    """Base class of things that adjust attention inside the registered function.

    Subclasses override :meth:`adjust_mask` and/or :meth:`adjust_output`. A plugin applies only
    to the attention modules of the model given to its constructor.
    """

    def __init__(self, model: Any) -> None:
        self.model_id = id(model)

    def applies_to(self, module: Any) -> bool:
        return _MODULE_MODEL.get(id(module)) == self.model_id

    def adjust_mask(
        self,
        module: Any,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        kwargs: dict[str, Any],
    ) -> torch.Tensor | None:
        """Return the mask the layer should use (default: unchanged)."""
        return mask

    def adjust_output(self, module: Any, layer: int, output: torch.Tensor) -> torch.Tensor:
        """Return the layer's attention output ``(batch, query, head, dim)`` (default: unchanged)."""
        return output


@dataclass
class _Observer:
    """Receives each layer's inputs (used by capture).

    A plain observer is called after the layer's output is computed. One that ``computes`` is
    called before, with the layer's values too, and may return the output itself
    (``(batch, query, head, dim)``, as the attention functions do) from what it computed anyway:
    the delegate then does not run.
    """

    model_id: int
    fn: Callable[..., Any]
    computes: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_PLUGINS: contextvars.ContextVar[tuple[AttentionPlugin, ...]] = contextvars.ContextVar(
    "attncoda_plugins", default=()
)
_OBSERVERS: contextvars.ContextVar[tuple[_Observer, ...]] = contextvars.ContextVar(
    "attncoda_observers", default=()
)


@contextmanager
def plugged(model: Any, plugin: AttentionPlugin) -> Iterator[AttentionPlugin]:
    """Activate ``model`` and apply ``plugin`` inside the block."""
    with activated(model):
        token = _PLUGINS.set((*_PLUGINS.get(), plugin))
        try:
            yield plugin
        finally:
            _PLUGINS.reset(token)


@contextmanager
def observed(model: Any, fn: Callable[..., Any], *, computes: bool = False) -> Iterator[None]:
    """Activate ``model`` and call ``fn(module, layer, query, key, mask, scaling, kwargs,
    value=value)`` (``value`` is ``None`` under dropout).

    A plain observer is called after the layer's output is computed; with ``computes=True``
    it is called before, and returns that output or ``None`` (then the delegate computes it).
    """
    with activated(model):
        token = _OBSERVERS.set((*_OBSERVERS.get(), _Observer(id(model), fn, computes)))
        try:
            yield
        finally:
            _OBSERVERS.reset(token)


def _attention_fn(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: plug-ins, the previous implementation, observers."""
    model_id = _MODULE_MODEL.get(id(module))
    act = _ACTIVATIONS.get(model_id) if model_id is not None else None
    layer = layer_index(module) if act is not None else getattr(module, "layer_idx", 0) or 0
    kwargs.pop("output_attentions", None)
    attention_mask = fold_position_bias(module, query, key, attention_mask, kwargs)
    plugins = [p for p in _PLUGINS.get() if p.model_id == model_id]
    for p in plugins:
        attention_mask = p.adjust_mask(module, layer, query, key, attention_mask, kwargs)
    delegate = delegate_for(module, act.previous if act else "sdpa", kwargs)
    observers = [obs for obs in _OBSERVERS.get() if obs.model_id == model_id]
    out = None

    def notify(obs: _Observer) -> Any:
        with torch.no_grad():
            return obs.fn(
                module,
                layer,
                query,
                key,
                attention_mask,
                scaling,
                kwargs,
                value=value if not dropout else None,
            )

    for obs in observers:
        if obs.computes:
            got = notify(obs)
            out = got if out is None else out
    if out is None:
        out, _ = delegate(
            module,
            query,
            key,
            value,
            eager_mask_for(delegate, attention_mask, query, key, module, kwargs),
            dropout=dropout,
            scaling=scaling,
            **kwargs,
        )
    for obs in observers:
        if not obs.computes:
            notify(obs)
    for p in plugins:
        out = p.adjust_output(module, layer, out)
    return out, None


def fold_position_bias(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> torch.Tensor | None:
    """The layer's mask with a relative ``position_bias`` keyword (T5, MPNet, ...) folded in.

    Such models pass their per-head bias beside the mask; every attention function adds it to
    the logits. Folded into one additive float mask (as transformers' SDPA path does itself,
    causality included), it reaches the layer's output, the captured rows and the plug-ins
    alike; the keyword is removed from ``kwargs``.
    """
    bias = kwargs.pop("position_bias", None)
    if bias is None:
        return mask
    from transformers.integrations.sdpa_attention import create_position_bias_mask

    causal = query.shape[-2] > 1 and mask is None and call_is_causal(module, kwargs)
    return create_position_bias_mask(bias, mask, causal, query, key)


def delegate_for(module: Any, name: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The implementation that computes the layer's output: what the model ran before."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    needs_eager = kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None
    if name == "eager" or needs_eager:
        if eager is None:
            raise RegistryError(
                f"{type(module).__name__} has no eager_attention_forward; attncoda cannot compute "
                "its output exactly"
            )
        return eager
    if name == "sdpa" or name not in ALL_ATTENTION_FUNCTIONS:
        return sdpa_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def call_is_causal(module: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a call of ``module`` without a mask is causal, decided as transformers' own
    attention functions decide it: the ``is_causal`` keyword of the call where the model
    passes one, else the module's ``is_causal`` attribute (default ``True``).

    CLIP's text model is the case in point: its attention modules say ``is_causal = False``
    (they serve the vision tower too) while the text model passes ``is_causal=True`` with the
    call, and its mask function answers "causal, no mask needed".

    Examples
    --------
    >>> class Module:
    ...     is_causal = False
    >>> call_is_causal(Module(), {"is_causal": True}), call_is_causal(Module(), {})
    (True, False)
    """
    given = kwargs.get("is_causal")
    if given is not None:
        return bool(given)
    return bool(getattr(module, "is_causal", True))


def visible_mask(
    attention_mask: torch.Tensor | None,
    q_pos: torch.Tensor,
    kv_len: int,
    *,
    causal: bool,
    sliding_window: int | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(visible bool (b|1, h|1, q, kv), additive float bias or None)`` for query positions.

    ``attention_mask`` is what the registered mask function produced: ``None`` (pure causal, or
    bidirectional without padding), a boolean mask, or a float additive mask (custom 4-D masks,
    a plug-in's bias) where values near ``finfo.min`` mean invisible.
    """
    if attention_mask is None:
        k = torch.arange(kv_len, device=device)
        if causal:
            vis = k[None, :] <= q_pos[:, None]
            if sliding_window:
                vis &= k[None, :] > q_pos[:, None] - sliding_window
        else:
            vis = torch.ones(len(q_pos), kv_len, dtype=torch.bool, device=device)
        return vis[None, None], None
    first = int(q_pos[0]) - (kv_len - attention_mask.shape[-2])
    contiguous = len(q_pos) == int(q_pos[-1]) - int(q_pos[0]) + 1
    if contiguous:  # a view of the model's own mask, not a copy
        rows = attention_mask[:, :, first : first + len(q_pos), :kv_len]
    else:
        rows = attention_mask[:, :, q_pos - (kv_len - attention_mask.shape[-2]), :kv_len]
    if rows.dtype == torch.bool:
        return rows, None
    vis = rows > torch.finfo(rows.dtype).min / 2
    return vis, rows.float()


def eager_mask_for(
    fn: Callable[..., Any],
    mask: torch.Tensor | None,
    query: torch.Tensor,
    key: torch.Tensor,
    module: Any,
    kwargs: dict[str, Any],
) -> torch.Tensor | None:
    """Our mask function produces SDPA masks (bool or None); eager functions *add* masks."""
    if getattr(fn, "__name__", "") != "eager_attention_forward":
        return mask
    if mask is not None and mask.dtype != torch.bool:
        return mask
    q_len, kv_len = query.shape[-2], key.shape[-2]
    q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)
    vis, _ = visible_mask(
        mask,
        q_pos,
        kv_len,
        causal=call_is_causal(module, kwargs),
        sliding_window=kwargs.get("sliding_window"),
        device=query.device,
    )
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(vis, zero, torch.finfo(query.dtype).min)
