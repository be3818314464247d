r"""ARACH: a training-free hub-token plug-in for HuggingFace causal LMs, and its paired evaluation.

ARACH ("Attention Reallocation via an Adaptive Context Hub", arXiv 2603.11067) runs a parallel
stream of *hub* tokens beside the ordinary (*verbal*) tokens. Only the paper's abstract and
third-party summaries are known; the mask below is our reconstruction (see
``reference/papers.md``, section 1.2). With verbal tokens ``v_0..v_{T-1}`` and hubs
``h_0..h_{T-1}`` laid out as one sequence ``[v ; h]`` of length ``2T``, every layer and head uses
the additive mask

============  =====================  ==================
query \ key   verbal ``v_j``          hub ``h_j``
============  =====================  ==================
``v_i``       ``0`` iff ``j <= i``    ``b`` iff ``j == i``
``h_i``       ``0`` iff ``j <= i``    ``b`` iff ``j == i``
============  =====================  ==================

(``finfo.min`` elsewhere): verbal->verbal and hub->verbal are causal, verbal->hub and hub->hub are
diagonal, and the logit offset ``b`` (default ``-0.5``) is added where the key is a hub. The LM
head reads verbal positions only. ``v_i`` sees ``h_i``, which sees ``v_{<=i}``, so no verbal token
can see a future token through any path; with ``b = -inf`` the plug-in is the plain model.

Choices the papers leave open are options (:class:`ArachConfig`): the hub input embedding, hub
position ids and the layers in which hubs are visible.

Two implementations give the same numbers:

``mode="fast"`` (default)
    Each hub key is visible to exactly two queries (its own verbal token and its own hub), so a
    row is a causal row over verbal keys plus one extra logit. A registered attention function
    runs causal attention over the verbal keys for the ``2T`` queries (fused kernel, returning
    the log-sum-exp ``lse``), and merges the diagonal hub logit ``s`` exactly:
    ``out = (1 - w) o + w v_hub`` with ``w = sigmoid(s + b - lse)``. No ``2T x 2T`` mask exists.
``mode="dense"``
    The input ``[v ; h]`` with the ``2T x 2T`` additive float mask above, run by the model's own
    attention (SDPA or eager). Simple, slower (most of the mask is empty); attention captures
    (:func:`attncoda.hooks.capture`) see its rows, so the audit uses it.

Besides the plug-in, this module holds the paired evaluation used by ``case_studies/arach`` and
``attncoda audit arach``: sliding-window perplexity (:func:`score_tokens`), a deterministic
LAMBADA-style cloze task from the Austen novels (:func:`cloze_items`, :func:`cloze_accuracy`),
paired bootstrap intervals (:func:`paired_bootstrap`), the attention audit with the core's
three-group decomposition (:func:`audit`), figures (:func:`plot_audit`) and the runner
(:func:`run_evaluation`).

Examples
--------
>>> from attncoda.hooks import arach, zoo
>>> model = zoo.tiny_twin("llama")
>>> ids = zoo.tiny_batch(model, batch=1, length=8)["input_ids"]
>>> with arach.enabled(model, offset=-0.5):
...     logits = model(input_ids=ids).logits  # ARACH on: hubs run beside the 8 tokens
>>> tuple(logits.shape)
(1, 8, 128)
>>> plain = arach.Arach(model, offset=float("-inf"))(input_ids=ids).logits
>>> bool(torch.allclose(plain, model(input_ids=ids).logits, atol=1e-5))
True
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from attncoda import AttncodaError, InputError, require_int, require_real

from ._registry import ATTENTION_NAME, AttentionPlugin, can_switch, plugged, register_attention

__all__ = [
    "FAST_ATTENTION_NAME",
    "OFFSETS",
    "Arach",
    "ArachConfig",
    "ArachError",
    "ClozeItem",
    "ClozeResult",
    "EvalPlan",
    "PairedInterval",
    "TokenScores",
    "audit",
    "audit_findings",
    "cloze_accuracy",
    "cloze_items",
    "dense_mask",
    "enabled",
    "paired_bootstrap",
    "perplexity_interval",
    "plot_audit",
    "run_evaluation",
    "score_tokens",
]

#: Name under which the fast path's attention function is registered with transformers
#: (neutral: names containing "sdpa", "flash" or "flex" trigger transformers' own checks).
FAST_ATTENTION_NAME = "attncoda_arach"

HubEmbedding = Literal["token", "mean", "zeros"]
HubPositions = Literal["same", "none"]
Mode = Literal["fast", "dense"]


class ArachError(AttncodaError, RuntimeError):
    """ARACH cannot run on this model or in this situation (the message says why and what to do)."""


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class ArachConfig:
    """The options of the plug-in. Defaults follow the (unconfirmed) paper summary.

    Parameters
    ----------
    offset : float, default -0.5
        The logit offset ``b`` added where the key is a hub. ``-inf`` switches hubs off (the
        plug-in then reproduces the plain model).
    hub_embedding : {"token", "mean", "zeros"}, default "token"
        Hub input embedding: the embedding of a fixed special token (``hub_token_id``); the mean
        of the verbal input embeddings of the causal prefix ``v_0..v_i``; or zeros.
    hub_token_id : int, optional
        Token of ``hub_embedding="token"``. Default: the model's BOS id, else its EOS id, else 0.
    hub_positions : {"same", "none"}, default "same"
        ``"same"``: hub ``h_i`` gets the position id of ``v_i``. ``"none"``: no positional
        encoding (rotary models: position 0, whose rotation is the identity; absolute
        position embeddings such as GPT-2's ``wpe``: the position-0 vector is cancelled).
    layers : iterable of int, optional
        Layers in which hubs are visible (negative indices count from the end). In the other
        layers no query sees a hub key, and hubs attend to the verbal prefix only. Default: all.
    mode : {"fast", "dense"}, default "fast"
        Implementation (see the module docstring). Both give the same outputs.

    Examples
    --------
    >>> ArachConfig(offset=-1.0, layers=(0, 1)).offset
    -1.0
    >>> ArachConfig(hub_embedding="mean").hub_embedding
    'mean'
    """

    offset: float = -0.5
    hub_embedding: HubEmbedding = "token"
    hub_token_id: int | None = None
    hub_positions: HubPositions = "same"
    layers: tuple[int, ...] | None = None
    mode: Mode = "fast"

    def __post_init__(self) -> None:
        off = self.offset
        if isinstance(off, bool) or not isinstance(off, (int, float, np.floating, np.integer)):
            raise TypeError(f"offset must be a real number, got {off!r}")
        if math.isnan(float(off)) or float(off) == math.inf:
            raise InputError(f"offset must be finite or -inf, got {off!r}")
        object.__setattr__(self, "offset", float(off))
        _choice("hub_embedding", self.hub_embedding, ("token", "mean", "zeros"))
        _choice("hub_positions", self.hub_positions, ("same", "none"))
        _choice("mode", self.mode, ("fast", "dense"))
        if self.hub_token_id is not None and (
            isinstance(self.hub_token_id, bool)
            or not isinstance(self.hub_token_id, (int, np.integer))
        ):
            raise TypeError(f"hub_token_id must be an int, got {self.hub_token_id!r}")
        if self.hub_token_id is not None and self.hub_embedding != "token":
            raise InputError("hub_token_id is only used with hub_embedding='token'")
        if self.layers is not None:
            if isinstance(self.layers, (str, bytes)) or not isinstance(self.layers, Iterable):
                raise TypeError(f"layers must be None or an iterable of ints, got {self.layers!r}")
            items = tuple(self.layers)
            if not items:
                raise InputError("layers= is empty; use offset=float('-inf') to switch hubs off")
            if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in items):
                raise TypeError(f"layers must hold ints, got {self.layers!r}")
            object.__setattr__(self, "layers", tuple(int(i) for i in items))

    @property
    def hubs_off(self) -> bool:
        """Whether no query can see a hub (``offset == -inf``)."""
        return self.offset == -math.inf


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


# --------------------------------------------------------------------------------------------
# the dense mask


def dense_mask(
    length: int,
    offset: float = -0.5,
    *,
    key_valid: torch.Tensor | None = None,
    hub_visible: bool = True,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``2T x 2T`` additive ARACH mask over ``[verbal ; hub]``.

    Parameters
    ----------
    length : int
        ``T``, the number of verbal tokens.
    offset : float, default -0.5
        ``b``, added at the visible hub keys (verbal->hub and hub->hub diagonals). ``-inf``
        makes hub keys invisible.
    key_valid : bool tensor (batch, T), optional
        Padding: invalid verbal keys are invisible (each query still sees itself, so no row is
        empty). Hub keys are only ever seen on the diagonal.
    hub_visible : bool, default True
        False: no query sees a hub key (layers where hubs are switched off).
    window : int, optional
        Sliding window ``W`` of the layer: verbal keys ``j`` are visible iff ``i - W < j <= i``.
    dtype, device
        Of the returned mask; invisible entries hold ``finfo(dtype).min``.

    Returns
    -------
    torch.Tensor, shape (batch or 1, 1, 2T, 2T)

    Examples
    --------
    >>> m = dense_mask(2, -0.5)
    >>> (m[0, 0] > -1).int().tolist()  # rows: v0 v1 h0 h1, columns: v0 v1 h0 h1
    [[1, 0, 1, 0], [1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 0, 1]]
    >>> float(m[0, 0, 1, 3]), float(m[0, 0, 1, 0])
    (-0.5, 0.0)
    """
    if not isinstance(length, int) or length < 1:
        raise InputError(f"length must be a positive int, got {length!r}")
    neg = torch.finfo(dtype).min
    i = torch.arange(length, device=device)
    vis = i[None, :] <= i[:, None]
    if window is not None:
        vis &= i[None, :] > i[:, None] - int(window)
    vis = vis[None]  # (1, T, T)
    if key_valid is not None:
        vis = (vis & key_valid.to(device=vis.device, dtype=torch.bool)[:, None, :]) | torch.eye(
            length, dtype=torch.bool, device=vis.device
        )
    verbal = torch.where(vis, torch.zeros((), dtype=dtype, device=vis.device), neg)
    eye = torch.eye(length, dtype=torch.bool, device=vis.device)
    if hub_visible and offset > -math.inf:
        hub = torch.where(eye, torch.tensor(offset, dtype=dtype, device=vis.device), neg)
    else:
        hub = torch.full((length, length), neg, dtype=dtype, device=vis.device)
    hub = hub[None].expand(verbal.shape[0], -1, -1)
    half = torch.cat([verbal, hub], dim=-1)  # the same for verbal and hub queries
    return torch.cat([half, half], dim=-2)[:, None]


# --------------------------------------------------------------------------------------------
# the fast attention function


@dataclass
class _FastState:
    """What the fast attention function needs during one ARACH forward."""

    model_id: int
    length: int
    offset: float
    hub_layers: frozenset[int] | None
    key_valid: torch.Tensor | None  # (batch, T) bool, None when every key is valid
    masks: dict[tuple[Any, ...], torch.Tensor | None] = field(default_factory=dict)

    def hub_visible(self, layer: int) -> bool:
        if self.offset == -math.inf:
            return False
        return self.hub_layers is None or layer in self.hub_layers

    def verbal_mask(
        self, window: int | None, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        """Additive (batch|1, 1, T, T) mask over verbal keys; None for plain causal."""
        if window is not None and window >= self.length:
            window = None
        if window is None and self.key_valid is None:
            return None
        key = (window, dtype, device)
        if key not in self.masks:
            full = dense_mask(
                self.length,
                key_valid=self.key_valid,
                hub_visible=False,
                window=window,
                dtype=dtype,
                device=device,
            )
            self.masks[key] = full[..., : self.length, : self.length].contiguous()
        return self.masks[key]


_FAST: contextvars.ContextVar[_FastState | None] = contextvars.ContextVar(
    "attncoda_arach_fast", default=None
)


def _module_layer(module: Any) -> int:
    idx = getattr(module, "layer_idx", None)
    if idx is None:
        raise ArachError(
            f"{type(module).__name__} has no layer_idx; ARACH's fast path cannot tell its layer "
            "(use mode='dense')"
        )
    return int(idx)


def _fast_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Registered attention function of the fast path; ``query`` holds ``[verbal ; hub]`` rows.

    Verbal and hub queries both see the causal verbal prefix plus their own hub key, so both
    sets go through one causal attention over the verbal keys (with its log-sum-exp), and the
    single hub logit of each row is merged exactly: ``out = o + w (v_hub - o)``,
    ``w = sigmoid(s_hub + b - lse)``.
    """
    state = _FAST.get()
    if state is None:
        raise ArachError(
            f"the {FAST_ATTENTION_NAME!r} attention implementation only runs inside an ARACH "
            "forward; switch the model back with model.set_attn_implementation('sdpa')"
        )
    if dropout and getattr(module, "training", False):
        raise ArachError("ARACH is an inference-time plug-in; call model.eval() first")
    t = state.length
    b, n_heads, q_len, d = query.shape
    if q_len != 2 * t or key.shape[-2] != 2 * t:
        raise ArachError(
            f"ARACH's fast path expected {2 * t} queries and keys, got {q_len} and "
            f"{key.shape[-2]} (a KV cache is not supported; score with full forward passes)"
        )
    rep = n_heads // key.shape[1]
    if rep > 1:
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    scale = float(scaling) if scaling is not None else d**-0.5
    softcap = kwargs.get("softcap")
    window = kwargs.get("sliding_window")
    # verbal and hub queries stacked along the batch: both see the same verbal keys
    q2 = torch.cat([query[:, :, :t], query[:, :, t:]], dim=0)
    k_verbal = key[:, :, :t]
    v_verbal = value[:, :, :t]
    k2 = torch.cat([k_verbal, k_verbal], dim=0)
    v2 = torch.cat([v_verbal, v_verbal], dim=0)
    mask = state.verbal_mask(window, query.dtype, query.device)
    if mask is not None:
        mask = mask.expand(b, -1, -1, -1).repeat(2, 1, 1, 1)
    out, lse = _attend(q2, k2, v2, scale, mask, softcap)
    if state.hub_visible(_module_layer(module)):
        k_hub = key[:, :, t:].float()
        v_hub = value[:, :, t:].float()
        k_hub2 = torch.cat([k_hub, k_hub], dim=0)
        v_hub2 = torch.cat([v_hub, v_hub], dim=0)
        s = torch.linalg.vecdot(q2.float(), k_hub2) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        w = torch.sigmoid(s + state.offset - lse.float())
        o = out.float()
        out = (o + w[..., None] * (v_hub2 - o)).to(query.dtype)
    merged = torch.cat([out[:b], out[b:]], dim=2)  # (b, H, 2T, d)
    return merged.transpose(1, 2), None


_KERNEL_FAILED: set[str] = set()


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention (``mask`` is None) or masked attention, with the fp32 log-sum-exp.

    Uses PyTorch's fused kernels that return the log-sum-exp (CPU flash; CUDA flash or
    memory-efficient) and falls back to a chunked fp32 computation (softcapped logits, other
    devices, or a kernel that refuses the inputs).
    """
    if softcap is None:
        kind = q.device.type
        try:
            if kind == "cpu" and "cpu" not in _KERNEL_FAILED:
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale
                )
                return out, lse
            if kind == "cuda" and "cuda" not in _KERNEL_FAILED:
                if mask is None and q.dtype in (torch.float16, torch.bfloat16):
                    res = torch.ops.aten._scaled_dot_product_flash_attention(
                        q, k, v, 0.0, True, False, scale=scale
                    )
                    return res[0], res[1]
                res = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, mask, True, 0.0, mask is None, scale=scale
                )
                return res[0], res[1][..., : q.shape[-2]]
        except (RuntimeError, NotImplementedError):
            _KERNEL_FAILED.add(kind)
    return _attend_reference(q, k, v, scale, mask, softcap)


def _attend_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    softcap: float | None,
    chunk: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked fp32 attention returning ``(out, lse)``; the causal mask is built when None."""
    t = q.shape[-2]
    kf, vf = k.float(), v.float()
    outs, lses = [], []
    keys = torch.arange(k.shape[-2], device=q.device)
    for start in range(0, t, chunk):
        stop = min(start + chunk, t)
        s = torch.matmul(q[:, :, start:stop].float(), kf.transpose(-1, -2)) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if mask is None:
            rows = torch.arange(start, stop, device=q.device)
            s = s.masked_fill(keys[None, :] > rows[:, None], -math.inf)
        else:
            s = s + mask[..., start:stop, :].float()
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.matmul(torch.exp(s - lse[..., None]), vf))
        lses.append(lse)
    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)


@contextmanager
def _fast_switched(model: Any) -> Iterator[None]:
    """Switch the model to the fast attention function for one forward."""
    # no mask function under this name: transformers then builds no mask at all
    register_attention(FAST_ATTENTION_NAME, _fast_attention)
    previous = str(model.config._attn_implementation)
    if previous == ATTENTION_NAME:
        raise ArachError(
            "ARACH's fast path cannot run inside an attncoda capture (the capture would see "
            "no hub rows); use Arach(model, mode='dense') for captures"
        )
    if previous == FAST_ATTENTION_NAME:
        yield
        return
    model.set_attn_implementation(FAST_ATTENTION_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


# --------------------------------------------------------------------------------------------
# the dense path's per-layer masks


class _DensePlugin(AttentionPlugin):
    """Gives each layer its ARACH mask (hubs switched off in some layers, sliding windows)."""

    def __init__(
        self, model: Any, length: int, config: ArachConfig, key_valid: torch.Tensor | None
    ) -> None:
        super().__init__(model)
        self.length = length
        self.config = config
        self.key_valid = key_valid
        self.hub_layers = _hub_layers(model, config)
        self.cache: dict[tuple[Any, ...], torch.Tensor] = {}

    def adjust_mask(
        self,
        module: Any,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        kwargs: dict[str, Any],
    ) -> torch.Tensor | None:
        window = kwargs.get("sliding_window")
        if window is not None and window >= self.length:
            window = None
        hub = self.hub_layers is None or layer in self.hub_layers
        k = (window, hub, query.dtype, query.device)
        if k not in self.cache:
            self.cache[k] = dense_mask(
                self.length,
                self.config.offset,
                key_valid=self.key_valid,
                hub_visible=hub,
                window=window,
                dtype=query.dtype,
                device=query.device,
            )
        return self.cache[k]


def _hub_layers(model: Any, config: ArachConfig) -> frozenset[int] | None:
    if config.layers is None:
        return None
    n = _n_layers(model)
    out = set()
    for i in config.layers:
        if not -n <= i < n:
            raise InputError(f"layer {i} is out of range: the model has {n} layers")
        out.add(i % n)
    return frozenset(out)


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _n_layers(model: Any) -> int:
    text = _text_config(model)
    n = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    if n is None:
        raise ArachError(f"cannot read the number of layers from {type(text).__name__}")
    return int(n)


def _min_window(model: Any) -> int | None:
    """The smallest sliding window any layer of the model may use, None when there is none."""
    text = _text_config(model)
    window = getattr(text, "sliding_window", None)
    if not window:
        return None
    types = getattr(text, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    if types is None and getattr(text, "use_sliding_window", True) is False:
        return None
    return int(window)


# --------------------------------------------------------------------------------------------
# the plug-in


def _forward_accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class Arach:
    """The ARACH plug-in on one model: a callable wrapper and a context manager.

    ``Arach(model, ...)(input_ids=...)`` runs one ARACH forward and returns the model's usual
    output (``logits`` at verbal positions, ``loss`` when ``labels`` are given). Inside
    ``with Arach(model, ...):`` (or :func:`enabled`), ``model(...)`` itself runs ARACH, and
    ``model.generate`` raises :class:`ArachError` (use :meth:`generate`). The model's weights
    are never changed; everything is restored on exit, also after an exception.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose attention goes through transformers' attention registry (Llama,
        Qwen2/3, Mistral, Gemma 1-3, GPT-2, ...), i.e. one that accepts additive 4-D masks.
    offset, hub_embedding, hub_token_id, hub_positions, layers, mode
        See :class:`ArachConfig`.
    config : ArachConfig, optional
        Instead of the keyword options.

    Raises
    ------
    ArachError
        The model is not a causal LM, or computes attention in its own code (no 4-D masks).
    ValueError, TypeError
        Bad options.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("qwen2")
    >>> ids = zoo.tiny_batch(model, batch=2, length=10)["input_ids"]
    >>> hub = arach.Arach(model, offset=-1.0, hub_embedding="mean")
    >>> out = hub(input_ids=ids, labels=ids)
    >>> tuple(out.logits.shape), bool(out.loss > 0)
    ((2, 10, 128), True)
    >>> dense = arach.Arach(model, offset=-1.0, hub_embedding="mean", mode="dense")
    >>> bool(torch.allclose(dense(input_ids=ids).logits, out.logits, atol=1e-4))
    True
    """

    def __init__(self, model: Any, *, config: ArachConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("give either config= or keyword options, not both")
        self.config = config if config is not None else ArachConfig(**options)
        self.model = model
        _check_model(model, self.config)
        self.hub_layers = _hub_layers(model, self.config)
        self._hub_token = self._resolve_hub_token()
        self._wpe = self._absolute_positions()
        self._orig_forward: Callable[..., Any] | None = None
        self._saved: dict[str, Any] = {}

    # ---------------------------------------------------------------- setup

    def _resolve_hub_token(self) -> int | None:
        if self.config.hub_embedding != "token":
            return None
        tid = self.config.hub_token_id
        if tid is None:
            text = _text_config(self.model)
            for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
                val = getattr(self.model.config, name, None)
                if val is None:
                    val = getattr(text, name, None)
                if isinstance(val, (list, tuple)):
                    val = val[0] if val else None
                if val is not None:
                    tid = int(val)
                    break
            else:
                tid = 0
        vocab = self.model.get_input_embeddings().weight.shape[0]
        if not 0 <= int(tid) < vocab:
            raise InputError(f"hub_token_id {tid} is outside the vocabulary (0..{vocab - 1})")
        return int(tid)

    def _absolute_positions(self) -> Any:
        """The absolute position embedding to cancel for ``hub_positions='none'`` (or None)."""
        if self.config.hub_positions != "none":
            return None
        base = getattr(self.model, "base_model", self.model)
        wpe = getattr(base, "wpe", None)
        if wpe is not None:
            return wpe
        if getattr(base, "rotary_emb", None) is not None:
            return None  # position 0 is the identity rotation
        raise ArachError(
            f"hub_positions='none' is only defined for rotary models and GPT-2-style absolute "
            f"position embeddings; {type(self.model).__name__} has neither (use 'same')"
        )

    # ---------------------------------------------------------------- inputs

    def build(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The model inputs of one ARACH forward over ``[verbal ; hub]``.

        Returns
        -------
        dict
            ``inputs_embeds (b, 2T, d)``, ``position_ids (b|1, 2T)``, ``key_valid`` (bool
            ``(b, T)`` or None), ``length`` (T) and, in dense mode, ``attention_mask``, the
            ``(b|1, 1, 2T, 2T)`` float mask of :func:`dense_mask`.

        Examples
        --------
        >>> from attncoda.hooks import arach, zoo
        >>> model = zoo.tiny_twin("llama")
        >>> inp = arach.Arach(model, mode="dense").build(torch.tensor([[5, 6, 7]]))
        >>> tuple(inp["inputs_embeds"].shape), inp["position_ids"].tolist()
        ((1, 6, 32), [[0, 1, 2, 0, 1, 2]])
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise InputError("give exactly one of input_ids and inputs_embeds")
        embed = self.model.get_input_embeddings()
        if inputs_embeds is None:
            assert input_ids is not None
            if input_ids.dim() != 2:
                raise InputError(f"input_ids must be (batch, length), got {tuple(input_ids.shape)}")
            verbal = embed(input_ids)
        else:
            if inputs_embeds.dim() != 3:
                raise InputError("inputs_embeds must be (batch, length, hidden)")
            verbal = inputs_embeds
        b, t, _ = verbal.shape
        if t < 1:
            raise InputError("the input is empty")
        device = verbal.device
        key_valid: torch.Tensor | None = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (b, t):
                raise InputError(
                    "attention_mask must be a 2-D padding mask (batch, length) matching the "
                    f"input; got {tuple(attention_mask.shape)} (ARACH builds its own 4-D mask)"
                )
            am = attention_mask.to(device=device, dtype=torch.bool)
            key_valid = None if bool(am.all()) else am
        if position_ids is None:
            if key_valid is not None:
                position_ids = (key_valid.long().cumsum(-1) - 1).clamp(min=0)
            else:
                position_ids = torch.arange(t, device=device)[None]
        elif position_ids.dim() == 1:
            position_ids = position_ids[None]
        position_ids = position_ids.to(device)
        hub = self._hub_inputs(verbal, key_valid, embed)
        if self.config.hub_positions == "none":
            hub_pos = torch.zeros_like(position_ids)
            if self._wpe is not None:
                hub = hub - self._wpe(hub_pos[:, :1]).to(hub.dtype)
        else:
            hub_pos = position_ids
        out: dict[str, Any] = {
            "inputs_embeds": torch.cat([verbal, hub.expand(b, -1, -1)], dim=1),
            "position_ids": torch.cat([position_ids, hub_pos], dim=-1),
            "key_valid": key_valid,
            "length": t,
        }
        if self.config.mode == "dense":
            out["attention_mask"] = dense_mask(
                t, self.config.offset, key_valid=key_valid, dtype=verbal.dtype, device=device
            )
        return out

    def _hub_inputs(
        self, verbal: torch.Tensor, key_valid: torch.Tensor | None, embed: Any
    ) -> torch.Tensor:
        how = self.config.hub_embedding
        if how == "zeros":
            return torch.zeros_like(verbal)
        if how == "token":
            assert self._hub_token is not None
            tok = torch.full((1, 1), self._hub_token, dtype=torch.long, device=verbal.device)
            return embed(tok).to(verbal.dtype).expand(verbal.shape[0], verbal.shape[1], -1)
        weights = (
            key_valid.to(verbal.dtype)[..., None]
            if key_valid is not None
            else torch.ones_like(verbal[..., :1])
        )
        total = (verbal * weights).cumsum(dim=1)
        count = weights.cumsum(dim=1).clamp(min=1)
        return total / count

    # ---------------------------------------------------------------- forward

    def __call__(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> Any:
        """One ARACH forward; returns the model's output with ``logits`` at verbal positions.

        Parameters
        ----------
        input_ids, attention_mask, position_ids, inputs_embeds
            As for the model; ``attention_mask`` is a 2-D padding mask (left or right padding).
            Without ``position_ids``, positions count valid tokens (0 at the first one).
        labels : LongTensor (batch, T), optional
            Next-token loss over verbal positions (shifted inside; ``-100`` is ignored).
        logits_to_keep : int or LongTensor (k,) or (batch, k), default 0
            As in transformers, over verbal positions (0 keeps all).
        **kwargs
            Passed to the model (e.g. ``output_hidden_states=True``; hidden states then cover
            all ``2T`` positions, verbal first). A KV cache is refused.
        """
        for name in ("past_key_values", "cache"):
            if kwargs.get(name) is not None:
                raise ArachError(
                    "ARACH does not run with a KV cache; score with full forward passes or use "
                    "Arach.generate"
                )
            kwargs.pop(name, None)
        if kwargs.pop("use_cache", None):
            raise ArachError("ARACH does not run with use_cache=True (no KV cache support)")
        if labels is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            raise InputError("labels need the logits of every position (logits_to_keep=0)")
        inputs = self.build(
            input_ids, attention_mask, inputs_embeds=inputs_embeds, position_ids=position_ids
        )
        t = inputs["length"]
        device = inputs["inputs_embeds"].device
        if isinstance(logits_to_keep, int):
            if logits_to_keep < 0 or logits_to_keep > t:
                raise InputError(f"logits_to_keep must lie in 0..{t}, got {logits_to_keep}")
            start = t - logits_to_keep if logits_to_keep else 0
            keep = torch.arange(start, t, device=device)
        else:
            keep = logits_to_keep.to(device)
            if keep.dim() not in (1, 2) or keep.dtype == torch.bool:
                raise InputError(
                    "logits_to_keep must be an int, or a 1-D or (batch, k) integer tensor of "
                    "positions"
                )
            keep = keep % t
        active = getattr(self.model, "_attncoda_arach", None)
        # inside an ARACH block model(...) is patched: call what the block saved
        fwd = active._orig_forward if active is not None else self.model
        call_kwargs = dict(
            inputs_embeds=inputs["inputs_embeds"],
            position_ids=inputs["position_ids"],
            use_cache=False,
            **kwargs,
        )
        slice_inside = _forward_accepts(type(self.model).forward, "logits_to_keep")
        if slice_inside:
            call_kwargs["logits_to_keep"] = keep
        with self._attention(t, inputs["key_valid"]):
            if self.config.mode == "dense":
                call_kwargs["attention_mask"] = inputs["attention_mask"]
            out = fwd(**call_kwargs)
        if slice_inside:
            logits = out.logits
        elif keep.dim() == 1:
            logits = out.logits[:, keep]
        else:
            logits = torch.take_along_dim(out.logits, keep[..., None], dim=1)
        out["logits"] = logits
        if labels is not None:
            out["loss"] = _next_token_loss(logits, labels.to(logits.device))
        return out

    @contextmanager
    def _attention(self, length: int, key_valid: torch.Tensor | None) -> Iterator[None]:
        cfg = self.config
        if cfg.mode == "fast":
            state = _FastState(
                model_id=id(self.model),
                length=length,
                offset=cfg.offset,
                hub_layers=self.hub_layers,
                key_valid=key_valid,
            )
            token = _FAST.set(state)
            try:
                with _fast_switched(self.model):
                    yield
            finally:
                _FAST.reset(token)
            return
        window = _min_window(self.model)
        needs_plugin = self.hub_layers is not None or (window is not None and window < length)
        if not needs_plugin:
            yield
            return
        with plugged(self.model, _DensePlugin(self.model, length, cfg, key_valid)):
            yield

    # ---------------------------------------------------------------- context manager

    def __enter__(self) -> Arach:
        model = self.model
        if getattr(model, "_attncoda_arach", None) is not None:
            raise ArachError("ARACH is already enabled on this model; leave the outer block first")
        self._saved = {k: model.__dict__[k] for k in ("forward", "generate") if k in model.__dict__}
        self._orig_forward = model.forward
        model.forward = self._patched_forward
        model.generate = self._refuse_generate
        model._attncoda_arach = self
        return self

    def __exit__(self, *exc: object) -> None:
        model = self.model
        for name in ("forward", "generate", "_attncoda_arach"):
            model.__dict__.pop(name, None)
        model.__dict__.update(self._saved)
        self._orig_forward = None
        self._saved = {}

    def _patched_forward(self, input_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("pass the inputs of an ARACH forward by keyword (attention_mask=...)")
        return self(input_ids, **kwargs)

    def _refuse_generate(self, *args: Any, **kwargs: Any) -> Any:
        raise ArachError(
            "model.generate() is not supported with ARACH (transformers' generation uses a KV "
            "cache, and ARACH adds a hub per step); use Arach.generate(input_ids, ...) for greedy "
            "decoding with full forward passes"
        )

    # ---------------------------------------------------------------- generation

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 20,
        eos_token_id: int | None = None,
    ) -> torch.Tensor:
        """Greedy decoding with ARACH, one full forward per new token (no KV cache).

        Parameters
        ----------
        input_ids : LongTensor (batch, T)
            Prompts; batches must be left-padded (with ``attention_mask``).
        attention_mask : LongTensor (batch, T), optional
        max_new_tokens : int, default 20
        eos_token_id : int, optional
            Stop a sequence once it produced this token (it then repeats it).

        Returns
        -------
        LongTensor (batch, T + n)
            The prompts followed by the generated tokens.

        Examples
        --------
        >>> from attncoda.hooks import arach, zoo
        >>> model = zoo.tiny_twin("llama")
        >>> out = arach.Arach(model).generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
        >>> tuple(out.shape)
        (1, 7)
        """
        if max_new_tokens < 0:
            raise InputError("max_new_tokens must be >= 0")
        ids = input_ids
        mask = attention_mask
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        for _ in range(max_new_tokens):
            logits = self(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits[:, -1]
            nxt = logits.argmax(-1)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done |= nxt == eos_token_id
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if eos_token_id is not None and bool(done.all()):
                break
        return ids


def enabled(model: Any, **options: Any) -> Arach:
    """ARACH on ``model`` inside a ``with`` block: ``model(...)`` then runs with hubs.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    **options
        See :class:`ArachConfig` (``offset=-0.5``, ``hub_embedding``, ``hub_token_id``,
        ``hub_positions``, ``layers``, ``mode``).

    Returns
    -------
    Arach
        Use it as a context manager.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("gpt2")
    >>> ids = zoo.tiny_batch(model, batch=1, length=6)["input_ids"]
    >>> with arach.enabled(model, offset=-2.0, hub_positions="none") as hub:
    ...     out = model(input_ids=ids, labels=ids)
    >>> tuple(out.logits.shape), hub.config.offset
    ((1, 6, 128), -2.0)
    """
    return Arach(model, **options)


def _check_model(model: Any, config: ArachConfig) -> None:
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False) or not hasattr(
        model, "get_output_embeddings"
    ):
        raise ArachError(f"ARACH needs a decoder-only causal LM; {name} is not one")
    if model.get_output_embeddings() is None:
        raise ArachError(f"ARACH needs a causal LM with an LM head; {name} has none")
    mods = [m for m in model.modules() if getattr(m, "is_causal", None) is False]
    if any("Attention" in type(m).__name__ for m in mods):
        raise ArachError(f"{name} has bidirectional attention; ARACH needs a causal LM")
    if not can_switch(model):
        raise ArachError(
            f"{name} computes attention in its own code, not through transformers' attention "
            "registry, so it does not accept the additive 4-D masks ARACH needs"
        )
    fwd = type(model).forward
    for arg in ("inputs_embeds", "position_ids"):
        if not _forward_accepts(fwd, arg):
            raise ArachError(f"{name}.forward takes no {arg}=; ARACH needs both")


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
    )


# --------------------------------------------------------------------------------------------
# scoring long texts


@dataclass(frozen=True)
class TokenScores:
    """Per-token negative log-likelihoods (nats) of a sliding-window evaluation.

    Attributes
    ----------
    nll : ndarray (n,)
        ``-log p(token | context)`` of every scored token, in text order.
    position : ndarray (n,)
        Index of each scored token in the input ids.
    context : ndarray (n,)
        Number of tokens the prediction could see (the position within its window).
    window : ndarray (n,)
        Index of the window each token was scored in.
    """

    nll: np.ndarray
    position: np.ndarray
    context: np.ndarray
    window: np.ndarray

    @property
    def perplexity(self) -> float:
        """``exp(mean nll)``."""
        return float(np.exp(self.nll.mean()))


@torch.no_grad()
def score_tokens(
    model: Any,
    input_ids: torch.Tensor | Sequence[int],
    *,
    context: int = 1024,
    stride: int | None = None,
    prefix: Sequence[int] = (),
    arach: Arach | None = None,
    batch_size: int = 1,
) -> TokenScores:
    """Sliding-window next-token NLLs of a long text, with or without ARACH.

    Each window is ``prefix`` (e.g. Gemma's ``<bos>``, which the model expects first) followed
    by ``context - len(prefix)`` text tokens; windows start every ``stride`` text tokens
    (default: non-overlapping). A window scores the text tokens no earlier window scored; a text
    token can only be scored if something precedes it in its window, so without a prefix each
    non-overlapping window predicts its last ``context - 1`` tokens, exactly as
    ``model(ids, labels=ids)`` does, and with a prefix every text token is predicted once. With
    ``arach`` the same windows run through the plug-in (a paired comparison).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    input_ids : 1-D LongTensor or sequence of int
        The tokenised text without special tokens (a ``(1, n)`` tensor is accepted).
    context : int, default 1024
        Window length in tokens, prefix included.
    stride : int, optional
        Text tokens between window starts (default: ``context - len(prefix)``).
    prefix : sequence of int, default ()
        Tokens put in front of every window and never scored.
    arach : Arach, optional
        The plug-in on ``model``; None scores the plain model.
    batch_size : int, default 1
        Windows per forward (windows of one length are batched together).

    Returns
    -------
    TokenScores
        ``context`` counts the tokens each prediction could see, prefix included.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=1, length=40)["input_ids"][0]
    >>> off = arach.score_tokens(model, ids, context=16)
    >>> on = arach.score_tokens(model, ids, context=16, arach=arach.Arach(model))
    >>> len(off.nll) == len(on.nll) == 37  # 3 windows: 15 + 15 + 7 predicted tokens
    True
    >>> len(arach.score_tokens(model, ids, context=16, prefix=[2]).nll)  # every token
    40
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    pre = torch.as_tensor(list(prefix), dtype=torch.long)
    n_pre = len(pre)
    if ids.dim() != 1 or ids.numel() + n_pre < 2:
        raise InputError("input_ids must be one sequence of at least 2 tokens (prefix included)")
    span = context - n_pre
    if span < (1 if n_pre else 2):
        raise InputError(f"context={context} leaves no room for text after the prefix")
    stride = span if stride is None else stride
    if not 1 <= stride <= span:
        raise InputError(f"stride must lie in 1..{span}, got {stride}")
    if arach is not None and arach.model is not model:
        raise InputError("arach= was built for a different model")
    device = next(model.parameters()).device
    n = ids.numel()
    spans = []  # (start, end, first scored text index)
    start = prev_end = 0
    while True:
        end = min(start + span, n)
        spans.append((start, end, max(prev_end, start + (0 if n_pre else 1))))
        if end == n:
            break
        prev_end = end
        start += stride
    nll_parts, pos_parts, ctx_parts, win_parts = [], [], [], []
    fwd = arach if arach is not None else model
    runs: list[list[int]] = []  # windows of one length run together, batch_size at a time
    for w, (s, e, _) in enumerate(spans):
        first = spans[runs[-1][0]] if runs else None
        if first is not None and len(runs[-1]) < batch_size and e - s == first[1] - first[0]:
            runs[-1].append(w)
        else:
            runs.append([w])
    for run in runs:
        batch = torch.stack([torch.cat([pre, ids[spans[w][0] : spans[w][1]]]) for w in run])
        batch = batch.to(device)
        logits = fwd(input_ids=batch).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        nll = -logp.gather(-1, batch[:, 1:, None])[..., 0]
        for row, w in enumerate(run):
            s, e, lo = spans[w]
            if lo >= e:
                continue
            # text token t sits at window index n_pre + t - s; its logit at one before
            sel = nll[row, n_pre + lo - s - 1 : n_pre + e - s - 1].cpu().numpy()
            positions = np.arange(lo, e)
            nll_parts.append(sel.astype(np.float64))
            pos_parts.append(positions)
            ctx_parts.append(n_pre + positions - s)
            win_parts.append(np.full(len(sel), w))
    return TokenScores(
        nll=np.concatenate(nll_parts),
        position=np.concatenate(pos_parts),
        context=np.concatenate(ctx_parts),
        window=np.concatenate(win_parts),
    )


# --------------------------------------------------------------------------------------------
# paired statistics


@dataclass(frozen=True)
class PairedInterval:
    """A paired difference ``on - off`` with a percentile bootstrap interval."""

    off: float
    on: float
    diff: float
    low: float
    high: float
    level: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def paired_bootstrap(
    off: np.ndarray,
    on: np.ndarray,
    *,
    statistic: Callable[[np.ndarray], float] | None = None,
    clusters: np.ndarray | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedInterval:
    """Percentile bootstrap interval of ``statistic(on) - statistic(off)`` over paired items.

    Items (or whole clusters of items, e.g. blocks of consecutive tokens) are resampled with
    replacement, the same draw for both arms.

    Parameters
    ----------
    off, on : array (n,)
        Per-item values of the two arms (accuracy 0/1, token NLL, ...), paired by index.
    statistic : callable, default mean
        Maps the values of a resample to a number (e.g. ``lambda x: np.exp(x.mean())`` for
        perplexity from NLLs).
    clusters : int array (n,), optional
        Cluster label of each item; clusters are resampled whole.
    n_boot, level, seed
        Resamples, interval level, seed of the draw (deterministic).

    Returns
    -------
    PairedInterval

    Examples
    --------
    >>> import numpy as np
    >>> off = np.array([0, 1, 0, 1, 1, 0, 0, 1.0]); on = np.array([1, 1, 0, 1, 1, 1, 0, 1.0])
    >>> r = paired_bootstrap(off, on, n_boot=500)
    >>> round(r.diff, 3), r.low <= r.diff <= r.high
    (0.25, True)
    """
    a = np.asarray(off, dtype=np.float64)
    b = np.asarray(on, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError("off and on must be 1-D arrays of the same, non-zero length")
    if not 0 < level < 1:
        raise InputError("level must lie in (0, 1)")
    stat = statistic if statistic is not None else (lambda x: float(np.mean(x)))
    rng = np.random.default_rng(seed)
    if clusters is None:
        groups = [np.array([i]) for i in range(len(a))]
        index_sets = None
    else:
        labels = np.asarray(clusters)
        if labels.shape != a.shape:
            raise InputError("clusters must have one label per item")
        uniq = np.unique(labels)
        groups = [np.flatnonzero(labels == u) for u in uniq]
        index_sets = groups
    diffs = np.empty(n_boot)
    k = len(groups)
    for r in range(n_boot):
        pick = rng.integers(0, k, size=k)
        if index_sets is None:
            idx = pick
        else:
            idx = np.concatenate([index_sets[i] for i in pick])
        diffs[r] = stat(b[idx]) - stat(a[idx])
    alpha = (1 - level) / 2
    lo, hi = np.quantile(diffs, [alpha, 1 - alpha])
    s_off, s_on = stat(a), stat(b)
    return PairedInterval(
        off=float(s_off),
        on=float(s_on),
        diff=float(s_on - s_off),
        low=float(lo),
        high=float(hi),
        level=level,
        n=len(a),
    )


def perplexity_interval(
    off: TokenScores, on: TokenScores, *, block: int = 128, n_boot: int = 2000, seed: int = 0
) -> PairedInterval:
    """Perplexity off vs on with a block-bootstrap interval of the difference ``ppl_on - ppl_off``.

    Tokens are resampled in blocks of ``block`` consecutive scored tokens (neighbouring tokens'
    losses are correlated).

    Examples
    --------
    >>> import numpy as np
    >>> z = np.zeros(256, dtype=int)
    >>> a = TokenScores(np.full(256, 2.0), np.arange(256), z, z)
    >>> b = TokenScores(np.full(256, 1.9), np.arange(256), z, z)
    >>> r = perplexity_interval(a, b, n_boot=100)
    >>> round(r.off, 3), round(r.on, 3)
    (7.389, 6.686)
    """
    if not np.array_equal(off.position, on.position):
        raise InputError("the two scorings must cover the same tokens (same windows)")
    clusters = np.arange(len(off.nll)) // block
    return paired_bootstrap(
        off.nll,
        on.nll,
        statistic=lambda x: float(np.exp(x.mean())),
        clusters=clusters,
        n_boot=n_boot,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------
# cloze (LAMBADA-style last word) from the Austen novels

_STOP = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each either else
    ever every few for from further had has have having he her here hers herself him himself his
    how however i if in into is it its itself just least less let like made make many may me might
    mine more most much must my myself neither never no nor not now of off often on once one only
    or other others otherwise ought our ours ourselves out over own perhaps quite rather really
    said same say says shall she should since so some still such than that the their theirs them
    themselves then there these they this those though through thus till to too under until up
    upon us very was we well were what whatever when where whether which while who whom whose why
    will with within without would yet you your yours yourself yourselves indeed sure think
    thing things nothing something anything everything always again away back even ever going
    know known much mrs miss sir""".split()
)

_FINAL = re.compile(r"^([A-Za-z]+)[.!?]['\"\u2019\u201d)]*$")
_BARE = re.compile(r"[^a-z]")


@dataclass(frozen=True)
class ClozeItem:
    """One last-word item: predict ``target`` (one word) after ``context``."""

    context: str
    target: str
    source: str
    index: int  # word index of the target in its source text


def cloze_items(
    texts: Mapping[str, str],
    n: int = 150,
    *,
    window: int = 80,
    min_letters: int = 4,
    seed: int = 0,
) -> list[ClozeItem]:
    """A deterministic LAMBADA-style last-word task from raw texts.

    A candidate is a word that ends a sentence (it is followed by ``.``, ``!`` or ``?`` and
    optionally closing quotes), has at least ``min_letters`` letters only, is not a stop word,
    and occurs (case-insensitively) among the ``window`` words before it; its context is those
    ``window`` words. ``n`` candidates are drawn without replacement with ``seed`` from all texts
    and returned in text order. Paragraphs are unwrapped first (:func:`assets.paragraphs`).

    Parameters
    ----------
    texts : mapping of str to str
        Source name -> text (e.g. ``assets.load_corpus("austen")``).
    n : int, default 150
    window : int, default 80
    min_letters : int, default 4
    seed : int, default 0

    Returns
    -------
    list of ClozeItem

    Examples
    --------
    >>> text = ("The garden was quiet and the garden was green. " * 3) + "She loved the garden."
    >>> items = cloze_items({"t": text}, n=1, window=12)
    >>> items[0].target, items[0].context.split()[-3:]
    ('garden', ['She', 'loved', 'the'])
    """
    from .assets import paragraphs

    if n < 1 or window < 1:
        raise InputError("n and window must be positive")
    candidates: list[ClozeItem] = []
    for source, text in texts.items():
        words = " ".join(paragraphs(text)).split()
        bare = [_BARE.sub("", w.lower()) for w in words]
        for k in range(window, len(words)):
            m = _FINAL.match(words[k])
            if m is None:
                continue
            target = m.group(1)
            low = target.lower()
            if len(low) < min_letters or low in _STOP:
                continue
            if low not in bare[k - window : k]:
                continue
            candidates.append(ClozeItem(" ".join(words[k - window : k]), target, source, k))
    if len(candidates) < n:
        raise InputError(f"only {len(candidates)} candidate items; ask for fewer")
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(candidates), size=n, replace=False).tolist())
    return [candidates[i] for i in chosen]


@dataclass(frozen=True)
class ClozeResult:
    """Per-item greedy exact-match results (1.0 / 0.0) and the target's log-probability."""

    correct: np.ndarray
    target_logprob: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())


@torch.no_grad()
def cloze_accuracy(
    model: Any,
    tokenizer: Any,
    items: Sequence[ClozeItem],
    *,
    arach: Arach | None = None,
    batch_size: int = 16,
) -> ClozeResult:
    """Greedy exact match of the last word: every sub-token of ``" " + target`` is the argmax.

    The context is tokenised as the tokenizer does by default (special tokens included, e.g.
    Gemma's BOS) and the target without special tokens; items are batched with right padding.

    Examples
    --------
    >>> from attncoda.hooks import arach  # doctest: +SKIP
    >>> res = arach.cloze_accuracy(model, tok, items, arach=arach.Arach(model))  # doctest: +SKIP
    """
    if arach is not None and arach.model is not model:
        raise InputError("arach= was built for a different model")
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = []
    for it in items:
        ctx = tokenizer(it.context).input_ids
        tgt = tokenizer(" " + it.target, add_special_tokens=False).input_ids
        encoded.append((ctx, tgt))
    correct = np.zeros(len(items))
    logprob = np.zeros(len(items))
    order = np.argsort([len(c) + len(t) for c, t in encoded], kind="stable")
    for b0 in range(0, len(order), batch_size):
        idx = order[b0 : b0 + batch_size]
        seqs = [encoded[i][0] + encoded[i][1] for i in idx]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        # only the logits that predict target tokens (the LM head dominates small models)
        n_tgt = max(len(encoded[i][1]) for i in idx)
        keep = torch.zeros((len(seqs), n_tgt), dtype=torch.long)
        for r, i in enumerate(idx):
            n_ctx, n_t = len(encoded[i][0]), len(encoded[i][1])
            keep[r] = torch.arange(n_ctx - 1, n_ctx - 1 + n_tgt).clamp(max=n_ctx + n_t - 2)
        ids, mask, keep = ids.to(device), mask.to(device), keep.to(device)
        fwd = arach if arach is not None else model
        logits = fwd(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits.float()
        for r, i in enumerate(idx):
            tgt = encoded[i][1]
            rows = logits[r, : len(tgt)]
            target = torch.tensor(tgt, device=rows.device)
            correct[i] = float(bool((rows.argmax(-1) == target).all()))
            lp = torch.log_softmax(rows, dim=-1).gather(-1, target[:, None]).sum()
            logprob[i] = float(lp)
    return ClozeResult(correct=correct, target_logprob=logprob)


# --------------------------------------------------------------------------------------------
# the attention audit


def _audit_rows(log_attn: np.ndarray, length: int, arach_on: bool) -> dict[str, np.ndarray]:
    """Three-group (sink / hub / content) quantities of verbal rows, per (layer, head, query)."""
    import attncoda as ac

    q = np.arange(length)
    n_keys = log_attn.shape[-1]
    labels = np.full((length, n_keys), 2, dtype=np.int64)
    labels[:, 0] = 0
    if arach_on:
        labels[q, length + q] = 1
    dec = ac.group_decompose(log_attn.astype(np.float64), labels, from_logits=True)
    return {"shares": dec.shares, "within": dec.within_entropy, "entropy": dec.entropy}


def audit(
    model: Any,
    samples: Sequence[torch.Tensor],
    *,
    arach: Arach,
    first_query: int = 1,
) -> Any:
    """Attention with ARACH off vs on, per layer and head, through the core's decomposition.

    For each sample the plain model and the plug-in (dense mode, so that
    :func:`attncoda.hooks.capture` sees the hub rows) run once; every verbal row is split into
    three groups, sink (the first token), hub (``h_i``, for ARACH) and content (the other verbal
    keys) with :func:`attncoda.group_decompose`, and the entropy change off -> on is attributed
    with :func:`attncoda.attribute_grouped_entropy_change` (between-group part plus one
    within-group part per group, summing exactly to the change). Rows are averaged over queries
    ``>= first_query`` and samples.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    samples : sequence of LongTensor (T,) or (1, T)
        Token ids; each is one forward pass.
    arach : Arach
        The plug-in; a copy with ``mode="dense"`` is used.
    first_query : int, default 1
        Queries before it are skipped (query 0 has no content key).

    Returns
    -------
    xarray.Dataset
        Over ``layer, head`` (and ``group = sink, hub, content``): ``sink_off``, ``sink_on``,
        ``hub_on``, ``content_entropy_off``, ``content_entropy_on``, ``entropy_off``,
        ``entropy_on``, ``shares_off``, ``shares_on``, ``within_off``, ``within_on``, and the
        attribution ``dH_between``, ``dH_within`` (by group) and ``dH_total``.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=1, length=12)["input_ids"]
    >>> ds = arach.audit(model, [ids], arach=arach.Arach(model))
    >>> sorted(ds.sizes.items())
    [('group', 3), ('head', 4), ('layer', 2)]
    """
    import xarray as xr

    import attncoda as ac

    from ._capture import capture

    dense = Arach(model, config=dataclasses.replace(arach.config, mode="dense"))
    sums: dict[str, np.ndarray] = {}
    count = 0
    layers = heads = None
    for sample in samples:
        ids = torch.as_tensor(sample).reshape(1, -1).to(next(model.parameters()).device)
        t = ids.shape[1]
        if t <= first_query:
            raise InputError(f"a sample of {t} tokens has no query >= first_query={first_query}")
        with torch.no_grad():
            with capture(model, what="rows") as cap_off:
                model(input_ids=ids)
            # through the patched model(...): the capture then records the user's inputs
            # (ids, no mask) rather than the 2T-long embeddings and the 4-D mask
            with capture(model, what="rows", queries=list(range(t))) as cap_on, dense:
                model(input_ids=ids)
        ds_off, ds_on = cap_off.dataset, cap_on.dataset
        layers, heads = ds_off["layer"].values, ds_off["head"].values
        off = _audit_rows(ds_off.log_attn.values[0], t, arach_on=False)
        on = _audit_rows(ds_on.log_attn.values[0], t, arach_on=True)
        ch = ac.attribute_grouped_entropy_change(
            off["shares"], off["within"], on["shares"], on["within"]
        )
        per_row = {
            "shares_off": off["shares"],
            "shares_on": on["shares"],
            "within_off": off["within"],
            "within_on": on["within"],
            "entropy_off": off["entropy"],
            "entropy_on": on["entropy"],
            "dH_between": ch.between,
            "dH_within": ch.within,
            "dH_total": ch.total,
        }
        for name, val in per_row.items():
            # (layer, head, query[, group]) -> mean over queries >= first_query
            m = np.asarray(val)[:, :, first_query:].mean(axis=2)
            sums[name] = sums.get(name, 0) + m
        count += 1
    if count == 0:
        raise InputError("audit() needs at least one sample")
    mean = {k: v / count for k, v in sums.items()}
    lh = ("layer", "head")
    lhg = ("layer", "head", "group")
    ds = xr.Dataset(
        {
            "sink_off": (lh, mean["shares_off"][..., 0]),
            "sink_on": (lh, mean["shares_on"][..., 0]),
            "hub_on": (lh, mean["shares_on"][..., 1]),
            "content_entropy_off": (lh, mean["within_off"][..., 2]),
            "content_entropy_on": (lh, mean["within_on"][..., 2]),
            "entropy_off": (lh, mean["entropy_off"]),
            "entropy_on": (lh, mean["entropy_on"]),
            "shares_off": (lhg, mean["shares_off"]),
            "shares_on": (lhg, mean["shares_on"]),
            "within_off": (lhg, mean["within_off"]),
            "within_on": (lhg, mean["within_on"]),
            "dH_between": (lh, mean["dH_between"]),
            "dH_within": (lhg, mean["dH_within"]),
            "dH_total": (lh, mean["dH_total"]),
        },
        coords={"layer": layers, "head": heads, "group": ["sink", "hub", "content"]},
        attrs={
            "arach_config": json.dumps(dataclasses.asdict(arach.config)),
            "n_samples": count,
            "first_query": first_query,
        },
    )
    return ds


def audit_findings(ds: Any) -> dict[str, Any]:
    """Headline numbers of an :func:`audit` dataset (per-layer means over heads).

    Returns the layer with the strongest sink (off), its sink share off/on and hub share, the
    layer where the sink drops most, and the correlation across layers between the sink share
    off and the drop.
    """
    sink_off = ds.sink_off.mean("head").values
    sink_on = ds.sink_on.mean("head").values
    hub_on = ds.hub_on.mean("head").values
    drop = sink_off - sink_on
    strongest = int(np.argmax(sink_off))
    biggest = int(np.argmax(drop))
    corr = float(np.corrcoef(sink_off, drop)[0, 1]) if len(sink_off) > 2 else float("nan")
    layers = ds.layer.values
    return {
        "strongest_sink_layer": int(layers[strongest]),
        "strongest_sink_off": float(sink_off[strongest]),
        "strongest_sink_on": float(sink_on[strongest]),
        "strongest_hub_on": float(hub_on[strongest]),
        "largest_drop_layer": int(layers[biggest]),
        "largest_drop": float(drop[biggest]),
        "mean_sink_off": float(sink_off.mean()),
        "mean_sink_on": float(sink_on.mean()),
        "mean_hub_on": float(hub_on.mean()),
        "mean_content_entropy_off": float(ds.content_entropy_off.mean()),
        "mean_content_entropy_on": float(ds.content_entropy_on.mean()),
        "mean_dH_total": float(ds.dH_total.mean()),
        "mean_dH_between": float(ds.dH_between.mean()),
        "mean_dH_within_content": float(ds.dH_within.sel(group="content").mean()),
        "corr_sink_off_vs_drop": corr,
        "hub_share_from_sink": float(drop.mean() / hub_on.mean()) if hub_on.mean() > 0 else 0.0,
    }


def plot_audit(ds: Any, out_dir: str | Path, *, title: str = "") -> list[Path]:
    """Figures of where attention mass moves with ARACH (needs matplotlib).

    Writes ``audit_layers.png`` (per layer: sink off/on and hub share, mean over heads),
    ``audit_heads.png`` (layer x head maps of the sink change and the hub share),
    ``audit_groups.png`` (stacked sink/hub/content shares per layer, off vs on) and
    ``audit_entropy.png`` (the entropy attribution per layer).

    Returns
    -------
    list of Path
        The files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layers = ds.layer.values
    files = []

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(layers, ds.sink_off.mean("head"), "o-", label="sink share, ARACH off")
    ax.plot(layers, ds.sink_on.mean("head"), "o-", label="sink share, ARACH on")
    ax.plot(layers, ds.hub_on.mean("head"), "s--", label="hub share, ARACH on")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention mass (mean over heads, queries)")
    ax.set_title(f"{title} where attention mass moves".strip())
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    files.append(out / "audit_layers.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    d_sink = (ds.sink_on - ds.sink_off).values
    lim = float(np.abs(d_sink).max()) or 1.0
    im0 = axes[0].imshow(d_sink, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    axes[0].set_title("sink share on - off")
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    fig.colorbar(im0, ax=axes[0])
    im1 = axes[1].imshow(ds.hub_on.values, aspect="auto", cmap="viridis")
    axes[1].set_title("hub share (on)")
    axes[1].set_xlabel("head")
    fig.colorbar(im1, ax=axes[1])
    fig.suptitle(title)
    fig.tight_layout()
    files.append(out / "audit_heads.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4.0))
    width = 0.4
    colors = {"sink": "#c44e52", "hub": "#55a868", "content": "#4c72b0"}
    for k, (name, shift) in enumerate((("shares_off", -width / 2), ("shares_on", width / 2))):
        bottom = np.zeros(len(layers))
        sh = ds[name].mean("head")
        for g in ("sink", "hub", "content"):
            v = sh.sel(group=g).values
            ax.bar(
                layers + shift,
                v,
                width,
                bottom=bottom,
                color=colors[g],
                alpha=0.55 if k == 0 else 1.0,
                label=f"{g} ({'off' if k == 0 else 'on'})",
            )
            bottom += v
    ax.set_xlabel("layer (left bar: off, right bar: on)")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1)
    ax.legend(ncol=6, fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_title(f"{title} sink / hub / content shares".strip())
    fig.tight_layout()
    files.append(out / "audit_groups.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(layers, ds.dH_total.mean("head"), "k-o", label="total entropy change")
    ax.plot(layers, ds.dH_between.mean("head"), "-o", label="between groups")
    for g in ("sink", "hub", "content"):
        ax.plot(layers, ds.dH_within.sel(group=g).mean("head"), "--", label=f"within {g}")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_ylabel("nats")
    ax.set_title(f"{title} entropy change off -> on, attributed".strip())
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    files.append(out / "audit_entropy.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    return files


# --------------------------------------------------------------------------------------------
# the paired evaluation runner

#: Offsets of the sweep (the issue's list).
OFFSETS: tuple[float, ...] = (0.0, -0.25, -0.5, -1.0, -2.0, -4.0)


@dataclass(frozen=True)
class EvalPlan:
    """Sizes of one paired evaluation (see :func:`run_evaluation`).

    The default takes roughly 10-20 minutes per model on 2 CPU cores (one torch thread);
    :meth:`quick` about a minute.

    Attributes
    ----------
    contexts : tuple of int
        Perplexity window lengths; each is scored off and at the default offset.
    ppl_tokens : int
        Text tokens of each perplexity text (Moby-Dick, Emma).
    offsets : tuple of float
        The offset sweep (cloze, and perplexity at ``sweep_ppl_context``).
    sweep_ppl_context : int
    ablations : tuple of str
        ``"option=value"`` variants of the hub (e.g. ``"hub_embedding=mean"``) scored for
        perplexity at ``sweep_ppl_context`` with the default offset.
    cloze_n, cloze_batch : int
        Cloze items and items per forward.
    audit_samples, audit_length : int
        Emma paragraphs (of at least ``audit_length`` tokens) in the audit, and their length.
    n_boot, seed : int
        Bootstrap resamples; seed of items and resamples.
    """

    contexts: tuple[int, ...] = (256, 1024)
    ppl_tokens: int = 2048
    offsets: tuple[float, ...] = OFFSETS
    sweep_ppl_context: int = 256
    ablations: tuple[str, ...] = ("hub_embedding=mean", "hub_embedding=zeros", "hub_positions=none")
    cloze_n: int = 120
    cloze_batch: int = 16
    audit_samples: int = 4
    audit_length: int = 128
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        """Every size is checked here, so a bad plan fails before a model loads."""
        if not isinstance(self.contexts, tuple) or not self.contexts:
            raise InputError(f"contexts must be a non-empty tuple of ints, got {self.contexts!r}")
        for ctx in self.contexts:
            require_int(ctx, "contexts", low=8)
        require_int(self.ppl_tokens, "ppl_tokens", low=2)
        if self.ppl_tokens < max(self.contexts):
            raise InputError(
                f"ppl_tokens ({self.ppl_tokens}) must be at least the longest context "
                f"({max(self.contexts)}): no window would fit"
            )
        if not isinstance(self.offsets, tuple) or not self.offsets:
            raise InputError(f"offsets must be a non-empty tuple, got {self.offsets!r}")
        for b in self.offsets:
            if require_real(b, "offsets", finite=False) == math.inf:
                raise InputError("offsets must be finite or -inf, got inf")
        require_int(self.sweep_ppl_context, "sweep_ppl_context", low=8)
        if self.sweep_ppl_context not in self.contexts:
            raise InputError(
                f"sweep_ppl_context ({self.sweep_ppl_context}) must be one of contexts "
                f"{self.contexts}"
            )
        for ab in self.ablations:
            _parse_ablation(ab)
        require_int(self.cloze_n, "cloze_n", low=1)
        require_int(self.cloze_batch, "cloze_batch", low=1)
        require_int(self.audit_samples, "audit_samples", low=1)
        require_int(self.audit_length, "audit_length", low=4)
        require_int(self.n_boot, "n_boot", low=0)
        require_int(self.seed, "seed", low=0)

    @classmethod
    def quick(cls) -> EvalPlan:
        """A smoke-test plan (about a minute for SmolLM2 on one CPU thread)."""
        return cls(
            contexts=(128,),
            ppl_tokens=256,
            offsets=(-0.5,),
            sweep_ppl_context=128,
            ablations=(),
            cloze_n=12,
            audit_samples=1,
            audit_length=32,
            n_boot=200,
        )


def _text(corpus: str) -> str:
    from .assets import load_text

    if corpus == "mobydick":
        text = load_text("mobydick")
        return text[text.find("Call me Ishmael") :]
    if corpus == "austen":
        text = load_text("austen", "emma")
        return text[text.find("Emma Woodhouse") :]
    raise InputError(f"unknown corpus {corpus!r}")


def _corpus_ids(tokenizer: Any, corpus: str, n_tokens: int) -> torch.Tensor:
    """The first ``n_tokens`` tokens (no special tokens) of a perplexity text."""
    from .assets import paragraphs

    paras = paragraphs(_text(corpus)[: n_tokens * 8])
    ids = tokenizer("\n\n".join(paras), add_special_tokens=False).input_ids[:n_tokens]
    if len(ids) < n_tokens:
        raise InputError(f"not enough {corpus} text for {n_tokens} tokens")
    return torch.tensor(ids)


def _special_prefix(tokenizer: Any) -> list[int]:
    """What the tokenizer puts before a text (Gemma: ``[<bos>]``; SmolLM2: nothing)."""
    with_special = tokenizer("a").input_ids
    plain = tokenizer("a", add_special_tokens=False).input_ids
    if with_special[len(with_special) - len(plain) :] == plain:
        return list(with_special[: len(with_special) - len(plain)])
    return []


def _audit_samples(tokenizer: Any, n: int, length: int) -> list[torch.Tensor]:
    """``n`` Emma paragraphs cut to ``length`` tokens, each tokenised as its own text."""
    from .assets import paragraphs

    out = []
    for para in paragraphs(_text("austen"), min_words=length):
        ids = tokenizer(para).input_ids
        if len(ids) >= length:
            out.append(torch.tensor(ids[:length]))
        if len(out) == n:
            return out
    raise InputError(f"fewer than {n} Emma paragraphs of {length} tokens")


def _parse_ablation(text: str) -> dict[str, Any]:
    key, _, value = str(text).partition("=")
    if not value:
        raise InputError(f"an ablation is 'option=value', got {text!r}")
    val: Any = value
    if key == "hub_token_id":
        val = int(value)
    return {key.strip(): val}


def run_evaluation(
    model_name: str,
    out_dir: str | Path,
    *,
    plan: EvalPlan | None = None,
    arach_options: Mapping[str, Any] | None = None,
    figures: bool = True,
    threads: int | None = None,
    progress: Callable[[str], None] | None = print,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The paired ARACH evaluation of one offline model: same weights, ARACH off vs on.

    1. Perplexity on Moby-Dick (from "Call me Ishmael") and Emma (from "Emma Woodhouse"): the
       first ``plan.ppl_tokens`` tokens in non-overlapping windows of each ``plan.contexts``
       length (each window starts with the tokenizer's prefix, e.g. Gemma's BOS), off and at
       the default offset, with block-bootstrap intervals of ``ppl_on - ppl_off``; the offset
       sweep and the hub ablations at ``plan.sweep_ppl_context``.
    2. Cloze accuracy on :func:`cloze_items` from the six Austen novels, off and at every
       offset of ``plan.offsets``, with paired bootstrap intervals of the accuracy difference.
    3. The attention audit (:func:`audit`) on Emma paragraphs, and its figures.

    Writes ``results.json``, ``ppl.csv``, ``cloze.csv``, ``audit.nc`` and figures to
    ``out_dir``; returns the results dictionary.

    Parameters
    ----------
    model_name : str
        An offline asset: ``"smollm2-135m"`` or ``"gemma3-270m"``.
    out_dir : path-like
    plan : EvalPlan, optional
        Sizes; default :class:`EvalPlan`; ``EvalPlan.quick()`` for a smoke run.
    arach_options : mapping, optional
        Options of :class:`ArachConfig` other than ``offset`` (e.g. ``hub_embedding``).
    figures : bool, default True
    threads : int, optional
        ``torch.set_num_threads`` for the run (restored afterwards). On a shared, loaded machine
        one thread can be many times faster than two.
    progress : callable, optional
        Receives one line per step (default ``print``).
    overwrite : bool, default False
        Replace an existing output folder (only one attncoda wrote). The folder is written
        beside its place and swapped in when complete.

    Raises
    ------
    InputError, UnknownAssetError, OutputExistsError
        Before anything loads: a bad option, an unknown or non-causal model, an output folder
        that may not be written.

    Examples
    --------
    >>> res = run_evaluation("smollm2-135m", "out", plan=EvalPlan.quick())  # doctest: +SKIP
    >>> sorted(res)[:3]  # doctest: +SKIP
    ['ablations', 'arach', 'audit']
    """
    import attncoda as ac

    from .assets import get_asset, load_corpus, load_model

    plan = plan or EvalPlan()
    opts = dict(arach_options or {})
    if "offset" in opts:
        raise InputError("the offset is swept; give the other options in arach_options")
    try:
        base = ArachConfig(**opts)
        ablations = [_parse_ablation(a) for a in plan.ablations]
        for ab in ablations:
            dataclasses.replace(base, **ab)  # bad ablations fail before any work
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AttncodaError):
            raise
        raise InputError(f"bad ARACH option: {exc}") from exc
    asset = get_asset(model_name)
    if asset.kind != "model" or model_name == "minilm-l6":
        raise InputError(f"{model_name!r} is not a causal LM; use smollm2-135m or gemma3-270m")
    if threads is not None:
        require_int(threads, "threads", low=1, high=os.cpu_count() or 1)
    say = progress or (lambda _msg: None)
    ac.check_output(out_dir, overwrite=overwrite, kind="folder")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with ac.atomic_output(out_dir, overwrite=overwrite, kind="folder", stamp="arach") as out:
            return _run(
                model_name, out, plan, base, ablations, figures, say, load_model, load_corpus
            )
    finally:
        torch.set_num_threads(previous_threads)


def _run(
    model_name: str,
    out: Path,
    plan: EvalPlan,
    base: ArachConfig,
    ablations: list[dict[str, Any]],
    figures: bool,
    say: Callable[[str], None],
    load_model: Callable[..., Any],
    load_corpus: Callable[..., Any],
) -> dict[str, Any]:
    t0 = time.perf_counter()
    model, tokenizer = load_model(model_name)
    prefix = _special_prefix(tokenizer)
    results: dict[str, Any] = {
        "model": model_name,
        "arach": dataclasses.asdict(base),
        "hub_token_id": Arach(model, config=base)._hub_token,
        "plan": dataclasses.asdict(plan),
        "window_prefix": prefix,
        "torch_threads": torch.get_num_threads(),
    }

    def hub(offset: float, **changes: Any) -> Arach:
        return Arach(model, config=dataclasses.replace(base, offset=offset, **changes))

    def stamp() -> str:
        return f"[{time.perf_counter() - t0:6.0f}s]"

    # 1. perplexity
    ppl_rows: list[dict[str, Any]] = []
    ablation_rows: list[dict[str, Any]] = []
    for corpus in ("mobydick", "austen"):
        ids = _corpus_ids(tokenizer, corpus, plan.ppl_tokens)
        for ctx in plan.contexts:
            off = score_tokens(model, ids, context=ctx, prefix=prefix)
            offsets = plan.offsets if ctx == plan.sweep_ppl_context else (base.offset,)
            if base.offset not in offsets:
                offsets = (*offsets, base.offset)
            for b in offsets:
                on = score_tokens(model, ids, context=ctx, prefix=prefix, arach=hub(b))
                r = perplexity_interval(off, on, n_boot=plan.n_boot, seed=plan.seed)
                ppl_rows.append({"corpus": corpus, "context": ctx, "offset": b, **r.as_dict()})
                say(
                    f"{stamp()} ppl {corpus} T={ctx} b={b:+.2f}: {r.off:.2f} -> {r.on:.2f} "
                    f"(diff {r.diff:+.2f} [{r.low:+.2f}, {r.high:+.2f}])"
                )
            if ctx != plan.sweep_ppl_context:
                continue
            for ab in ablations:
                on = score_tokens(
                    model, ids, context=ctx, prefix=prefix, arach=hub(base.offset, **ab)
                )
                r = perplexity_interval(off, on, n_boot=plan.n_boot, seed=plan.seed)
                name = ",".join(f"{k}={v}" for k, v in ab.items())
                ablation_rows.append(
                    {"corpus": corpus, "context": ctx, "offset": base.offset, "variant": name}
                    | r.as_dict()
                )
                say(f"{stamp()} ppl {corpus} T={ctx} {name}: {r.off:.2f} -> {r.on:.2f}")
    results["perplexity"] = ppl_rows
    results["ablations"] = ablation_rows

    # 2. cloze
    items = cloze_items(load_corpus("austen"), n=plan.cloze_n, seed=plan.seed)
    off_c = cloze_accuracy(model, tokenizer, items, batch_size=plan.cloze_batch)
    cloze_rows = []
    say(f"{stamp()} cloze off: {off_c.accuracy:.3f} (n={len(items)})")
    for b in plan.offsets:
        on_c = cloze_accuracy(model, tokenizer, items, arach=hub(b), batch_size=plan.cloze_batch)
        r = paired_bootstrap(off_c.correct, on_c.correct, n_boot=plan.n_boot, seed=plan.seed)
        lp = float(np.mean(on_c.target_logprob - off_c.target_logprob))
        cloze_rows.append({"offset": b, **r.as_dict(), "mean_dlogprob": lp})
        say(
            f"{stamp()} cloze b={b:+.2f}: {r.off:.3f} -> {r.on:.3f} "
            f"(diff {r.diff:+.3f} [{r.low:+.3f}, {r.high:+.3f}])"
        )
    results["cloze"] = cloze_rows
    results["cloze_items"] = [
        {"source": it.source, "index": it.index, "target": it.target} for it in items
    ]

    # 3. audit
    samples = _audit_samples(tokenizer, plan.audit_samples, plan.audit_length)
    ds = audit(model, samples, arach=hub(base.offset))
    ds.attrs["model"] = model_name
    ds.to_netcdf(out / "audit.nc")
    results["audit"] = audit_findings(ds)
    results["audit_per_layer"] = {
        name: ds[name].mean("head").values.round(4).tolist()
        for name in ("sink_off", "sink_on", "hub_on", "content_entropy_off", "content_entropy_on")
    }
    results["audit_per_layer"]["dH_total"] = ds.dH_total.mean("head").values.round(4).tolist()
    results["audit_per_layer"]["dH_between"] = ds.dH_between.mean("head").values.round(4).tolist()
    results["audit_per_layer"]["dH_within_content"] = (
        ds.dH_within.sel(group="content").mean("head").values.round(4).tolist()
    )
    say(f"{stamp()} audit: {json.dumps(results['audit'])}")
    if figures:
        files = plot_audit(ds, out, title=model_name)
        files.append(_plot_sweep(cloze_rows, ppl_rows, plan, out, model_name))
        results["figures"] = [f.name for f in files]
    results["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    _write_csv(out / "ppl.csv", ppl_rows + ablation_rows)
    _write_csv(out / "cloze.csv", cloze_rows)
    return results


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))

    def cell(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = [",".join(cols)]
    lines += [",".join(cell(r.get(c)) for c in cols) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def _plot_sweep(
    cloze_rows: list[dict[str, Any]],
    ppl_rows: list[dict[str, Any]],
    plan: EvalPlan,
    out: Path,
    title: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    b = np.array([r["offset"] for r in cloze_rows])
    d = np.array([r["diff"] for r in cloze_rows])
    lo = np.array([r["low"] for r in cloze_rows])
    hi = np.array([r["high"] for r in cloze_rows])
    axes[0].errorbar(b, d, yerr=[d - lo, hi - d], fmt="o-", capsize=3)
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].set_xlabel("offset b")
    axes[0].set_ylabel("cloze accuracy on - off")
    for corpus in ("mobydick", "austen"):
        rows = [
            r for r in ppl_rows if r["corpus"] == corpus and r["context"] == plan.sweep_ppl_context
        ]
        if len(rows) > 1:
            bb = np.array([r["offset"] for r in rows])
            dd = np.array([r["diff"] for r in rows])
            ll = np.array([r["low"] for r in rows])
            hh = np.array([r["high"] for r in rows])
            axes[1].errorbar(bb, dd, yerr=[dd - ll, hh - dd], fmt="o-", capsize=3, label=corpus)
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_xlabel("offset b")
    axes[1].set_ylabel(f"perplexity on - off (T={plan.sweep_ppl_context})")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(frameon=False)
    fig.suptitle(f"{title}: paired differences, 95% bootstrap intervals")
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
