r"""ARACH: a training-free hub-token plug-in for HuggingFace causal LMs.

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

Evaluating the plug-in is not this module's business: paired token scores, cloze accuracy and
bootstrap intervals are in :mod:`attncoda.hooks.evaluate` (pass an :class:`Arach` as
``wrapper=``), the attention audit in :mod:`attncoda.hooks.arach_audit`, and the paired study on
the real models in ``case_studies/arach``.

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
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from attncoda import AttncodaError, InputError

from ._kernels import aligned_bias, kernel_head_size, note_direct_call, pad_head
from ._registry import (
    ATTENTION_NAME,
    AttentionPlugin,
    can_switch,
    n_layers_heads,
    plugged,
    register_attention,
    text_config,
)
from .evaluate import next_token_loss

__all__ = [
    "FAST_ATTENTION_NAME",
    "Arach",
    "ArachConfig",
    "ArachError",
    "dense_mask",
    "enabled",
]

#: Name under which the fast path's attention function is registered with transformers
#: (neutral: names containing "sdpa", "flash" or "flex" trigger transformers' own checks).
FAST_ATTENTION_NAME = "attncoda_arach"

HubEmbedding = Literal["token", "mean", "zeros"]
HubPositions = Literal["same", "none"]
Mode = Literal["fast", "dense"]
#: Named layer sets of ``ArachConfig.layers``: the first or the last ``n // 2`` of ``n`` layers
#: (the middle layer of an odd count goes to the last half).
LAYER_SETS: tuple[str, ...] = ("first_half", "last_half")


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
    layers : iterable of int, or {"first_half", "last_half"}, optional
        Layers in which hubs are visible (negative indices count from the end). In the other
        layers no query sees a hub key, and hubs attend to the verbal prefix only. Default: all.
        ``"first_half"`` is layers ``0 .. n//2 - 1`` of a model with ``n`` layers,
        ``"last_half"`` the rest (:data:`LAYER_SETS`; resolved when the plug-in meets a model).
    mode : {"fast", "dense"}, default "fast"
        Implementation (see the module docstring). Both give the same outputs.

    Examples
    --------
    >>> ArachConfig(offset=-1.0, layers=(0, 1)).offset
    -1.0
    >>> ArachConfig(hub_embedding="mean").hub_embedding
    'mean'
    >>> ArachConfig(layers="last_half").layers
    'last_half'
    """

    offset: float = -0.5
    hub_embedding: HubEmbedding = "token"
    hub_token_id: int | None = None
    hub_positions: HubPositions = "same"
    layers: tuple[int, ...] | str | None = None
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
        if isinstance(self.layers, str):
            _choice("layers", self.layers, LAYER_SETS)
        elif self.layers is not None:
            if isinstance(self.layers, bytes) or not isinstance(self.layers, Iterable):
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

    def kernel_mask(
        self, window: int | None, dtype: torch.dtype, device: torch.device, batch: int
    ) -> torch.Tensor | None:
        """The verbal mask of the stacked ``[verbal ; hub]`` query batch, ready for the kernels.

        ``(2 * batch | 1, 1, T, T)`` in ``dtype``, rows stored at a stride the direct
        memory-efficient kernel accepts (:func:`~attncoda.hooks._kernels.aligned_bias`); made
        once per forward and layer kind, and expanded over heads at each call (no copy).
        """
        key = ("kernel", window, dtype, device, batch)
        if key not in self.masks:
            mask = self.verbal_mask(window, dtype, device)
            if mask is not None:
                if mask.shape[0] > 1:  # per-sample padding: the hub half repeats the verbal half
                    mask = mask.expand(batch, -1, -1, -1).repeat(2, 1, 1, 1)
                mask = aligned_bias(mask, mask.shape)
            self.masks[key] = mask
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
    mask = state.kernel_mask(window, query.dtype, query.device, b)
    if mask is not None:  # the full (B, H, Q, K) shape the direct kernel reads; a view
        mask = mask.expand(2 * b, n_heads, t, t)
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


_KERNEL_WARNED: set[tuple[str, str]] = set()


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention (``mask`` is None) or masked attention, with the fp32 log-sum-exp.

    Uses PyTorch's fused kernels that return the log-sum-exp (CPU flash; CUDA flash for fp16
    and bf16 without a mask, else memory-efficient), called directly because the SDPA function
    does not return it. Their inputs are prepared as the direct entry points need (they skip
    the SDPA function's own padding): head sizes padded with zero columns to a multiple of 8
    (logits unchanged, ``scale`` explicit, output columns sliced off), contiguous q, k, v, and
    the mask in the query dtype, expanded to ``(B, H, Q, K)`` with aligned rows
    (:meth:`_FastState.kernel_mask`).

    Softcapped logits (Gemma 2) and devices without these kernels take the chunked fp32
    computation of :func:`_attend_reference`. So does a call a fused kernel refuses, with a
    warning naming the reason, unless PyTorch's math attention backend is switched off (as
    inside ``torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION])``): then the refusal raises :class:`ArachError`, since the
    reference computation is that math path.
    """
    kind = q.device.type
    if softcap is not None or kind not in ("cpu", "cuda"):
        return _attend_reference(q, k, v, scale, mask, softcap)
    d = q.shape[-1]
    size = kernel_head_size(d)
    qp, kp, vp = pad_head(q, size), pad_head(k, size), pad_head(v, size)
    try:
        out, lse = _fused_with_lse(qp, kp, vp, scale, mask)
        return out[..., :d], lse
    except (RuntimeError, NotImplementedError) as exc:
        if isinstance(exc, torch.cuda.OutOfMemoryError):  # not a refusal: never hide it
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not torch.backends.cuda.math_sdp_enabled():
            raise ArachError(
                f"the fused attention kernel refused ARACH's fast path on {kind} ({reason}) "
                "and the math attention backend is switched off; run outside "
                "sdpa_kernel([...]) to use the chunked fp32 reference, or mode='dense'"
            ) from exc
        if (kind, reason) not in _KERNEL_WARNED:
            _KERNEL_WARNED.add((kind, reason))
            warnings.warn(
                f"ARACH's fast path fell back to its chunked fp32 reference on {kind}: the fused "
                f"kernel refused the call ({reason})",
                RuntimeWarning,
                stacklevel=2,
            )
    return _attend_reference(q, k, v, scale, mask, softcap)


def _fused_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One direct fused-kernel call returning ``(out, lse)``; raises when the kernel refuses.

    The call is reported to active kernel recorders as the CUDA entry point it uses there (on a
    CPU the CPU flash kernel runs on the same inputs), so CPU tests check what CUDA would get.
    """
    causal = mask is None
    flash = causal and q.dtype in (torch.float16, torch.bfloat16)
    note_direct_call(
        "flash" if flash else "efficient", q, k, v, mask, is_causal=causal, site=__name__
    )
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale
        )
        return out, lse
    if flash:
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale
        )
        return res[0], res[1]
    res = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, mask, True, 0.0, causal, scale=scale
    )
    return res[0], res[1][..., : q.shape[-2]]


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
    if isinstance(config.layers, str):  # a named set (LAYER_SETS), checked by ArachConfig
        if n < 2:
            raise InputError(f"layers={config.layers!r} needs at least 2 layers; the model has {n}")
        half = range(n // 2) if config.layers == "first_half" else range(n // 2, n)
        return frozenset(half)
    out = set()
    for i in config.layers:
        if not -n <= i < n:
            raise InputError(f"layer {i} is out of range: the model has {n} layers")
        out.add(i % n)
    return frozenset(out)


def _n_layers(model: Any) -> int:
    n, _ = n_layers_heads(model)
    if n is None:
        raise ArachError(
            f"cannot read the number of layers from {type(text_config(model)).__name__}"
        )
    return n


def _min_window(model: Any) -> int | None:
    """The smallest sliding window any layer of the model may use, None when there is none."""
    text = text_config(model)
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
            text = text_config(self.model)
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
            out["loss"] = next_token_loss(logits, labels.to(logits.device))
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
