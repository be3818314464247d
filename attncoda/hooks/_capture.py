"""Capture attention rows, or per-row summaries, from any HuggingFace model without giving up SDPA.

One attention function is registered with transformers under the neutral name ``"attncoda"``
(plus the matching mask function). Inside :func:`capture` the model is switched to it; every
layer's output is computed by the implementation the model had before (SDPA by default, or the
model's own eager function), so the model's outputs do not change. For the layers, heads and
queries asked for, fp32 logits are recomputed from the model's own q and k, chunk by chunk over
queries and only over the keys that can be visible, and reduced at once to what was asked for.
One exception: where rows (or summaries) of every head and query of a layer are captured, that
layer's output is computed from the same logits (``exp(log_attn) @ value`` in fp32, as eager
attention computes it from its weights; for summaries, by the grouping rule in one pass)
instead of running the model's kernel as well; it equals the model's output to fp32 rounding,
as eager and SDPA equal each other (``exact_outputs=True`` keeps the model's kernel).

``what="summaries"``
    sink share, sink log-odds, balance, entropy and content entropy per
    ``(sample, layer, head, query)``: O(T) memory per head, never a T x T tensor.
``what="rows"``
    fp32 log-attention of the requested layers/heads/queries (``-inf`` at invisible keys),
    optionally streamed to a zarr store.

Models that cannot switch their attention implementation fall back to eager attention plus
forward hooks on the attention modules. The model is always restored on exit, also after an
exception.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import math
import os
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

import attncoda
from attncoda import SUMMARY_VARIABLES, load, make_dataset, save

from . import _native
from ._fallback import fallback_capture
from ._kernels import kernel_head_size, pad_head
from ._registry import (
    ATTENTION_NAME,
    attention_modules,
    call_is_causal,
    can_switch,
    observed,
    visible_mask,
)
from ._rows import _LayerWriter, _RowsBuffer
from ._session import (
    _call_positions,
    _check_call,
    _finish,
    _Forward,
    _Record,
    _rollback,
    _Segment,
    _Session,
    _sink_index,
    _sink_mask,
    _Snapshot,
    _summaries_from_logits,
    check_call_shape,
    check_finite_rows,
    stack_note,
)
from ._spec import (
    CaptureError,
    CaptureSpec,
    SinkTokenWarning,
    What,
    _fixed_sinks,
    _is_int,
    _kind,
    _resolve,
    _rows_dtype,
    _selection,
    _show,
    _show_sel,
    _sink_choice,
)
from ._stacks import stacks_of
from ._tokens import special_token_ids, token_strings, warn_if_sink_not_special
from .zoo import _name_or_path, model_id, provenance_of

__all__ = [
    "ATTENTION_NAME",
    "Capture",
    "CaptureError",
    "CaptureSpec",
    "SinkTokenWarning",
    "capture",
]


def _capture_layer(
    session: _Session,
    module: Any,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    kwargs: dict[str, Any],
    value: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Capture one layer call; with ``value``, also return the layer's attention output
    ``(batch, query, head, dim)`` where it comes out of the rows for free (see
    :func:`_own_output_applies`), else ``None``."""
    spec = session.spec
    call = session.calls.get(layer, 0)
    session.calls[layer] = call + 1
    batch, n_heads, q_len, head_dim = query.shape
    kv_len = key.shape[-2]
    check_call_shape(session, module, layer, n_heads, q_len, kv_len)
    shift = 0  # from a query's position in its stack to its place in the call's coordinates
    if session.stack == "cross":  # queries are decoder positions, keys the encoder's
        fwd = session.forward
        past = fwd.past if fwd is not None and fwd.past is not None else 0
        positions = _call_positions(session, layer, q_len, past + q_len)
        shift = kv_len - q_len - past
        fixed = _fixed_sinks(spec)
        if fixed is not None and max(fixed) >= kv_len:
            raise CaptureError(
                f"sink={_show_sel(spec.sink)}: a cross-attention sink is a source position, and "
                f"the encoder gave {kv_len} (0..{kv_len - 1}); pass sink positions below {kv_len}"
            )
    else:
        positions = _call_positions(session, layer, q_len, kv_len)
    if not positions:
        return None
    call_positions = [p + shift for p in positions]
    if spec.sink == "learned" and getattr(module, "sinks", None) is None:
        raise CaptureError("sink='learned' needs a model with learned sinks (GPT-OSS style)")
    rep = n_heads // key.shape[1]
    head_idx = torch.tensor(session.heads, device=query.device)
    ctx = _LayerContext(
        q=query.index_select(1, head_idx).float(),  # (b, h, q, d)
        k=key.index_select(1, head_idx // rep).float(),  # (b, h, kv, d)
        mask=(  # per-head masks (a plug-in's per-head bias): keep the captured heads only
            attention_mask.index_select(1, head_idx)
            if attention_mask is not None and attention_mask.shape[1] > 1
            else attention_mask
        ),
        offset=kv_len - q_len,
        scale=scaling if scaling is not None else head_dim**-0.5,
        softcap=kwargs.get("softcap"),
        sliding=kwargs.get("sliding_window"),
        causal=call_is_causal(module, kwargs),
        sinks_logit=(
            module.sinks.detach().float()[session.heads] if spec.sink == "learned" else None
        ),
        sink_index=_sink_index(session, spec, attention_mask, batch, kv_len, q_len, query.device),
    )
    if layer not in session.probed and _check_against_eager(
        session, module, layer, ctx, query, key, value, attention_mask, kwargs
    ):
        session.probed.add(layer)
    pos = torch.tensor(call_positions, device=query.device)
    rows = learned = output = None
    in_buffer = False
    if value is not None and _one_pass_applies(session, ctx, call_positions, n_heads, kwargs):
        v = value.index_select(1, head_idx // rep).float()
        one, computed, redo = _one_pass_summaries(ctx, pos, spec.chunk_size, v)
        output = computed.transpose(1, 2).contiguous().to(query.dtype)
        if bool(redo.any()):
            redone, _ = _explicit(spec, ctx, pos[redo], None)
            for name, val in redone.items():
                one[name][..., redo] = val
        result = {name: val.cpu().numpy() for name, val in one.items()}
    elif spec.what == "summaries" and _fast_path_applies(spec, ctx):
        summaries, redo = _fast_summaries(ctx, pos, spec.chunk_size)
        if bool(redo.any()):
            redone, _ = _explicit(spec, ctx, pos[redo], None)
            for name, val in redone.items():
                summaries[name][..., redo] = val
        result = {k: v.cpu().numpy() for k, v in summaries.items()}
    else:
        writer = None
        if spec.what in ("rows", "both"):
            shape = (batch, len(session.heads), len(positions), kv_len)
            writer, in_buffer = _rows_writer(session, layer, call, shape)
        if (
            value is not None
            and writer is not None
            and _own_output_applies(session, ctx, writer, call_positions, n_heads, kwargs)
        ):
            v = value.index_select(1, head_idx // rep).float()
            from_rows = _rows_fast(ctx, pos, writer, spec.chunk_size, value=v)
            assert from_rows is not None  # given values, the rows path returns the output
            output = from_rows.transpose(1, 2).contiguous().to(query.dtype)
            summ: dict[str, torch.Tensor] = {}
            learned_t: torch.Tensor | None = None
        else:
            summ, learned_t = _explicit(spec, ctx, pos, writer)
        result = {k: v.cpu().numpy() for k, v in summ.items()}
        if writer is not None and not in_buffer:
            rows = writer.buf.read(0)
        learned = learned_t.numpy() if learned_t is not None else None
    session.add(
        _Record(
            layer=layer,
            call=call,
            query_pos=np.asarray(positions),
            kv_len=kv_len,
            summaries=result or None,
            rows=rows,
            learned_sink_rows=learned,
            in_buffer=in_buffer,
        )
    )
    return output


#: queries of a layer's first call whose rows are checked against the model's eager weights
_PROBE_QUERIES = 4


def _check_against_eager(
    session: _Session,
    module: Any,
    layer: int,
    ctx: _LayerContext,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> bool:
    """Refuse a layer whose attention the model computes by a route attncoda does not rebuild.

    The first call of every captured layer runs the model's own ``eager_attention_forward``
    on a few of its queries (the first and the last :data:`_PROBE_QUERIES`, all heads, every
    key: O(T) per head) with exactly what the layer received (mask, keywords: soft-capping,
    windows, learned sinks, biases), and compares its weights with the rows attncoda forms
    from the same q and k. A model with a twist of its own (another causality rule, a bias
    passed by a keyword attncoda does not know, a different score) then fails here, before
    any row is stored, instead of giving rows of another model. Skipped where the model has
    no eager function or the layer runs dropout (training mode). Rows that eager cannot form
    (a NaN at a key the mask hides spoils eager's whole row, never attncoda's) are left out;
    returns whether any row was compared, so a call with none is probed again next time.
    """
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None or value is None or getattr(module, "training", False):
        return True
    q_len, kv_len = query.shape[-2], key.shape[-2]
    picks = sorted({0, *range(max(q_len - _PROBE_QUERIES, 0), q_len)})
    qpos = torch.tensor(picks, device=query.device) + ctx.offset
    vis, bias = visible_mask(
        mask, qpos, kv_len, causal=ctx.causal, sliding_window=ctx.sliding, device=query.device
    )
    neg = torch.finfo(query.dtype).min
    additive = torch.where(vis, torch.zeros((), device=query.device), neg)
    if bias is not None:
        additive = torch.where(vis, bias, neg)
    extra = {k: v for k, v in kwargs.items() if k != "is_causal"}
    with torch.no_grad():
        _, weights = eager(
            module,
            query[:, :, picks],
            key,
            value,
            additive.to(query.dtype),
            dropout=0.0,
            scaling=ctx.scale,
            **extra,
        )
    if not torch.is_tensor(weights) or weights.shape[-1] != kv_len:
        return True
    heads = torch.tensor(session.heads, device=query.device)
    want = weights.index_select(1, heads).float()
    logits, seen = ctx.logits(qpos, kv_len)
    if ctx.sinks_logit is not None or getattr(module, "sinks", None) is not None:
        # learned sinks: compare the rows closed over the keys (eager's sum below 1)
        want = want / want.sum(-1, keepdim=True).clamp_min(1e-30)
    got = torch.softmax(logits, dim=-1)
    live = seen.any(-1, keepdim=True) & want.isfinite().all(-1, keepdim=True)
    if not bool(live.any()):  # queries that see no key have no row
        return False
    diff = float(torch.where(live, (got - want).abs(), torch.zeros_like(got)).amax())
    tol = 1e-4 + 4 * torch.finfo(query.dtype).eps
    if not diff <= tol:  # NaN too
        raise CaptureError(
            f"{type(module).__name__} (layer {layer}{stack_note(session)}) computes attention "
            f"by a route attncoda does not rebuild: its eager weights differ from the captured "
            f"rows by {diff:.2g}; attncoda refuses rather than return rows of another model "
            "(please report the model class)"
        )
    return True


def _own_output_applies(
    session: _Session,
    ctx: _LayerContext,
    writer: _LayerWriter,
    positions: list[int],
    n_heads: int,
    kwargs: dict[str, Any],
) -> bool:
    """Whether a layer's output is computed from the rows captured of it, as eager attention
    computes it from its weights (``softmax(logits) @ value``): rows alone, of every head and
    every query of the call, on the fast rows path, with no learned sink and no query that
    sees no key (whose output the model's own kernel defines). Then the model's own attention
    kernel does not run as well: the rows cost about what HF eager's weights cost."""
    if session.spec.what != "rows" or kwargs.get("s_aux") is not None:
        return False
    return _whole_call(session, ctx, positions, n_heads) and _rows_fast_applies(ctx, writer)


def _whole_call(session: _Session, ctx: _LayerContext, positions: list[int], n_heads: int) -> bool:
    """Whether every head and every query of a layer call are captured, each query seeing a
    key (padding queries may see none): then its output can come from the captured logits."""
    q_len = ctx.q.shape[-2]
    if session.heads != list(range(n_heads)) or len(positions) != q_len:
        return False
    if positions[0] != ctx.offset or positions[-1] != ctx.offset + q_len - 1:
        return False
    if ctx.mask is not None:
        kv_len = ctx.k.shape[-2]
        return bool(ctx.mask[..., :kv_len].any(dim=-1).all())
    return True


def _rows_writer(
    session: _Session, layer: int, call: int, shape: tuple[int, int, int, int]
) -> tuple[_LayerWriter, bool]:
    """Where a layer call writes its rows, and whether that is the pass's shared buffer.

    The first call of every layer in a forward pass writes into the pass's buffer (allocated
    for all captured layers when the first of them runs; on disk with ``stream_to=``); later
    cached steps of ``generate()``, which append a few queries each, get an array of their own.
    """
    seg = session.current()
    b, h, nq, kv = shape
    full = (b, len(session.layers), h, nq, kv)
    if call == 0:
        if seg.rows_buf is None:
            seg.rows_buf = _RowsBuffer(
                full,
                session.spec.dtype,
                session.spec.chunk_size,
                session.store,
                release_when_full=True,
                release_later=session.head_hooked,
            )
        if seg.rows_buf.shape == full:
            return seg.rows_buf.writer(session.layers.index(layer)), True
    own = _RowsBuffer((b, 1, h, nq, kv), session.spec.dtype, session.spec.chunk_size, None)
    return own.writer(0), False


@dataclass
class _LayerContext:
    """fp32 q/k of the captured heads and everything needed to rebuild their logits."""

    q: torch.Tensor
    k: torch.Tensor
    mask: torch.Tensor | None
    offset: int
    scale: float
    softcap: float | None
    sliding: int | None
    causal: bool
    sinks_logit: torch.Tensor | None
    sink_index: torch.Tensor

    def visible(self, qpos: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        vis, bias = visible_mask(
            self.mask,
            qpos,
            self.k.shape[-2],
            causal=self.causal,
            sliding_window=self.sliding,
            device=self.q.device,
        )
        vis = vis[..., :kv_len]
        return vis, None if bias is None else bias[..., :kv_len]

    def logits(
        self, qpos: torch.Tensor, kv_len: int, kt: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 logits ``(b, h, len(qpos), kv_len)`` of the queries at ``qpos`` over the first
        ``kv_len`` keys, exactly as the model forms them (scale, soft-capping, bias), ``-inf``
        at invisible keys; and the visibility ``(b, h, len(qpos), kv_len)``."""
        b, h = self.k.shape[:2]
        kt = self.k.transpose(-1, -2) if kt is None else kt
        qc = self.q.index_select(2, qpos - self.offset)
        logits = torch.matmul(qc, kt[..., :kv_len]).mul_(self.scale)
        if self.softcap is not None:
            logits.div_(self.softcap).tanh_().mul_(self.softcap)
        vis, bias = self.visible(qpos, kv_len)
        if bias is not None:
            logits.add_(bias)
        vis = vis.expand(b, h, len(qpos), kv_len)
        logits.masked_fill_(~vis, -math.inf)
        return logits, vis


def _fast_path_applies(spec: CaptureSpec, ctx: _LayerContext) -> bool:
    """Summaries through SDPA need plain masks, plain logits and one sink key per sample."""
    return (
        spec.sink == "first"
        and ctx.softcap is None
        and (ctx.mask is None or ctx.mask.dtype == torch.bool)
        and (ctx.mask is None or ctx.mask.shape[1] == 1)
    )


def _fast_summaries(
    ctx: _LayerContext, pos: torch.Tensor, chunk: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Summaries from one fused SDPA call per layer, never forming a query x key tensor.

    With values ``V = [K (sink row zeroed), onehot(sink), 1 - onehot(sink)]`` SDPA returns, per
    row, ``sum_c p_k k_k``, ``s`` and ``1 - s`` (each a sum of positive terms, so no
    cancellation). Then ``lse_c = z_s - log(s / (1 - s))`` and the content entropy is
    ``lse_c - scale * q . sum_c p_k k_k / (1 - s)``. Rows where this is ill-conditioned (sink
    not visible, ``s`` or ``1 - s`` below 1e-30, padding queries, and logits so large that the
    difference above could lose more than 1e-4 nats to fp32 rounding) are returned in ``redo``
    for the explicit path.

    The call is built for CUDA's fused kernels (``_kernels`` lists their rules), so that it
    never falls back to the math kernel, which would form the T x T weights of every head:

    - q, k and v all have the head size ``D = kernel_head_size(d + 2)``, a multiple of 8: q and
      k get ``D - d`` zero columns (the logits do not change; ``scale`` is passed explicitly),
      v holds the two indicator columns and zeros after them. All three are contiguous.
    - masks: ``is_causal=True`` when every query of a causal call is captured, no mask for
      bidirectional calls, else the boolean visibility rows ``(b | 1, 1, nq, kv)`` with a
      contiguous last dimension (the memory-efficient kernel takes them; flash takes none).
    - dtype: fp32, whatever the model's dtype. q and k are upcast before the call (exact for
      fp16/bf16 values), so on CUDA the call runs on the memory-efficient kernel (flash takes
      only fp16/bf16). This is deliberate: the kernel's outputs are the statistics themselves,
      and a 16-bit kernel rounds the probabilities to the input dtype before multiplying them
      with V and returns its outputs in that dtype (8 significant bits in bf16). ``s`` and
      ``1 - s`` would then carry 0.4% relative error each, so the sink log-odds would be off by
      up to ~0.01 and shares near 0 or 1 would lose their small side; and the content entropy
      is the difference ``lse_c - scale * q . sum_c p_k k_k / (1 - s)`` of two numbers of the
      size of the logits, so the rounded numerator would shift it by ~|logit| / 256 (0.05 nats
      for logits of 10). The other reductions stay in fp32 for the same reason: ``z_s``, the
      prefix sums of the keys behind the balance (a running bf16 sum over T keys gathers up to
      T x 2^-8 relative error), the log-odds, entropies and balance.
    """
    q, k = ctx.q, ctx.k
    b, _, kv, d = k.shape
    qsel = q.index_select(2, pos - ctx.offset)
    bidx = torch.arange(b, device=q.device)
    k_sink = k[bidx, :, ctx.sink_index]  # (b, h, d)
    size = kernel_head_size(d + 2)
    keys = pad_head(k, size)
    values = keys.clone()
    values[..., d + 1] = 1.0
    values[bidx, :, ctx.sink_index] = 0.0
    values[bidx, :, ctx.sink_index, d] = 1.0
    f = torch.nn.functional.scaled_dot_product_attention
    if _no_mask_needed(ctx, pos):
        kwargs: dict[str, Any] = {"is_causal": ctx.causal}
        vis_rows = None
    else:
        vis_rows, _ = ctx.visible(pos, kv)
        if vis_rows.stride(-1) != 1:  # e.g. a mask broadcast along the keys
            vis_rows = vis_rows.contiguous()
        kwargs = {"attn_mask": vis_rows}
    fused = f(pad_head(qsel, size), keys, values, scale=ctx.scale, **kwargs)
    del values, keys
    out_a, s, c = fused[..., :d], fused[..., d], fused[..., d + 1]
    z_s = ctx.scale * torch.einsum("bhqd,bhd->bhq", qsel, k_sink)
    key_sums = _content_key_sums(ctx, pos, vis_rows, chunk, k_sink)
    _, n_c, sink_vis = key_sums
    tiny = 1e-30
    redo = (~sink_vis) | (s <= tiny) | (c <= tiny) | (n_c < 1) | ~torch.isfinite(s)
    logodds = torch.log(s) - torch.log(c)
    lse_c = z_s - logodds
    mean_pl = ctx.scale * torch.einsum("bhqd,bhqd->bhq", qsel, out_a) / c
    h_c = lse_c - mean_pl
    # the entropy is a difference of two logit-sized numbers: where logits reach the hundreds
    # (Qwen2.5's first layers reach thousands) fp32 rounding could cost more than 1e-4 nats, so
    # those rows are recomputed on the explicit path (max-shifted, no cancellation)
    cancel = 8 * torch.finfo(torch.float32).eps * (lse_c.abs() + mean_pl.abs())
    # a NaN or +inf visible logit makes s NaN (redo above); a NaN at a key the row cannot see
    # still reaches out_a (0 * NaN): such rows go to the explicit path, which masks those keys
    # and refuses the rows whose visible logits are not finite
    redo = redo | (cancel > 1e-4) | ~torch.isfinite(h_c)
    h_c = h_c.clamp_min(0.0)  # an entropy is >= 0: rounding below 0 is moved to the bound
    out, cancel_balance = _sink_summaries(ctx, qsel, z_s, logodds, h_c, c, key_sums)
    redo = redo | cancel_balance | ~torch.isfinite(out["balance"])
    return out, redo.any(dim=(0, 1))


def _rows_at(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x.index_select(2, idx)``, as a view where ``idx`` is a run of consecutive positions
    (the usual case: every query of a call), which saves a copy of the rows."""
    n = len(idx)
    if n and int(idx[-1]) - int(idx[0]) == n - 1:
        first = int(idx[0])
        if bool((idx == torch.arange(first, first + n, device=idx.device)).all()):
            return x.narrow(2, first, n)
    return x.index_select(2, idx)


def _no_mask_needed(ctx: _LayerContext, pos: torch.Tensor) -> bool:
    """Whether the queries at ``pos`` see keys by a rule alone, no mask: a bidirectional call
    without one (every key), or a causal one without one or a window whose every query is
    captured from the first (each sees the keys up to itself): then SDPA takes ``is_causal``
    and the sums of visible keys are prefix sums (:func:`_content_key_sums`)."""
    if ctx.mask is not None or ctx.sliding:
        return False
    if not ctx.causal:
        return True
    kv = ctx.k.shape[-2]
    return (
        len(pos) == kv
        and ctx.offset == 0
        and bool((pos == torch.arange(kv, device=pos.device)).all())
    )


def _content_key_sums(
    ctx: _LayerContext,
    pos: torch.Tensor,
    vis_rows: torch.Tensor | None,
    chunk: int,
    k_sink: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sum ``(b, h, nq, d)`` and number ``(b, h, nq)`` of the content keys each query at
    ``pos`` sees (the visible keys but its sink, whose key is ``k_sink (b, h, d)``), and whether
    it sees its sink ``(b, h, nq)``: by prefix sums for plain causal calls (``vis_rows=None``,
    every query sees its sink: the sink's key is taken off the sums in their own memory), else a
    masked matmul over ``vis_rows`` (boolean ``(b|1, 1, nq, kv)``) a chunk of queries at a time,
    so that no float copy of the query x key mask is formed."""
    k = ctx.k
    b, h, kv, d = k.shape
    nq = len(pos)
    bidx = torch.arange(b, device=k.device)
    if vis_rows is None:  # every query sees every key up to itself, the sink among them
        if ctx.causal:
            content_sum = _rows_at(k.cumsum(dim=2), pos).sub_(k_sink[:, :, None, :])
            count = (pos + 1).to(k.dtype).expand(b, h, nq)
        else:
            total = k.sum(dim=2, keepdim=True).sub_(k_sink[:, :, None, :])
            content_sum = total.expand(b, h, nq, d)
            count = torch.full((b, h, nq), float(kv), device=k.device)
        return content_sum, count - 1.0, torch.ones(b, h, nq, dtype=torch.bool, device=k.device)
    sums, counts = [], []
    for i in range(0, nq, chunk):
        vf = vis_rows[:, :, i : i + chunk].to(k.dtype)
        sums.append(vf @ k)
        counts.append(vf.sum(-1))
    count = torch.cat(counts, dim=-1).expand(b, h, nq)
    sink_vis = vis_rows.expand(b, -1, -1, -1)[bidx, :, :, ctx.sink_index].expand(b, h, nq)
    in_sum = sink_vis[..., None].to(k.dtype)
    content_sum = torch.cat(sums, dim=2) - k_sink[:, :, None, :] * in_sum
    return content_sum, count - sink_vis.to(k.dtype), sink_vis


def _sink_summaries(
    ctx: _LayerContext,
    qsel: torch.Tensor,
    z_s: torch.Tensor,
    logodds: torch.Tensor,
    h_c: torch.Tensor,
    content_share: torch.Tensor,
    key_sums: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The five summaries of one sink key from the sink's logit ``z_s``, the log-odds, the
    content entropy and share, and the sums of the content keys (:func:`_content_key_sums`):
    ``entropy = h(s) + (1 - s) H_c`` (no content: ``H_c`` NaN, the entropy ``h(s)``) and the
    balance ``sqrt(n_c / (n_c + 1)) (z_s - mean content logit)`` (NaN without content or a
    visible sink), as :func:`_summaries_from_logits` defines them; and the rows whose balance
    fp32 rounding may have moved by more than 1e-4 (to be recomputed from max-shifted logits)."""
    content_sum, n_c, sink_vis = key_sums
    log_s = -torch.nn.functional.softplus(-logodds)
    log_1ms = -torch.nn.functional.softplus(logodds)
    entropy = attncoda.binary_entropy_from_logs(log_s, log_1ms) + content_share * torch.nan_to_num(
        h_c, nan=0.0
    )
    safe_nc = n_c.clamp_min(1.0)
    mean_c = ctx.scale * torch.einsum("bhqd,bhqd->bhq", qsel, content_sum) / safe_nc
    factor = torch.sqrt(safe_nc / (safe_nc + 1))
    balance = factor * (z_s - mean_c)
    # a difference of two logit-sized numbers: where logits reach the hundreds (Qwen2.5's first
    # layers: thousands) fp32 rounding can cost more than 1e-4; those rows are marked
    cancel = 8 * torch.finfo(torch.float32).eps * factor * (z_s.abs() + mean_c.abs()) > 1e-4
    balance = torch.where(sink_vis & (n_c >= 1), balance, torch.full_like(balance, math.nan))
    return {
        "sink_share": torch.exp(log_s),
        "sink_logodds": logodds,
        "balance": balance,
        "entropy": entropy,
        "content_entropy": h_c,
    }, cancel


#: the logit given to keys a row cannot see in :func:`_one_pass_summaries`: finite, so that
#: ``exp`` gives exactly 0 and ``0 * logit`` stays 0 (``-inf`` would make it NaN), and far below
#: any logit that pass accepts (:func:`_logits_bounded`: ``|logit| < 1e30``)
_HIDDEN = -1e37


def _one_pass_applies(
    session: _Session,
    ctx: _LayerContext,
    positions: list[int],
    n_heads: int,
    kwargs: dict[str, Any],
) -> bool:
    """Whether a layer's summaries and its output come from one pass over its logits
    (:func:`_one_pass_summaries`) instead of the model's kernel plus the summaries' own SDPA
    call: summaries alone, not ``exact_outputs``, every head and every query of the call, the
    conditions of the SDPA summaries (:func:`_fast_path_applies`: the first key as the sink, no
    soft-capping, a boolean mask or none), every query seeing a key, and logits that cannot
    reach NaN or +-inf. On CPU only: on CUDA the model's fused kernel and the summaries' own
    (flash or memory-efficient) SDPA call never form a block of logits in memory, and cost
    less than a loop of blocks would."""
    spec = session.spec
    if spec.what != "summaries" or spec.exact_outputs or kwargs.get("s_aux") is not None:
        return False
    if not _one_pass_pays_off(ctx.q.device):
        return False
    if not _fast_path_applies(spec, ctx) or ctx.sinks_logit is not None:
        return False
    return _whole_call(session, ctx, positions, n_heads) and _logits_bounded(ctx)


def _one_pass_pays_off(device: torch.device) -> bool:
    """Whether a loop over blocks of logits costs less than the two fused attention calls it
    replaces: on CPU (see :data:`_ONE_PASS_ROWS`), not on CUDA."""
    return device.type == "cpu"


@dataclass
class _LogitBlock:
    """A block of a layer's logits from :func:`_logit_blocks`: queries ``start + r0 ..
    start + r0 + m - 1`` of ``pos`` (in a chunk of ``n`` from ``start``), the heads ``heads``
    (every head unless the caller asked for groups), over the first ``seen`` keys, ``(b,
    heads, m, seen)`` in the caller's scratch; ``hidden`` marks the keys those queries cannot
    see, for the block's heads (``None``: consecutive causal queries, of which only the
    triangle after the block's first query is hidden). ``open_triangle``: that triangle still
    holds logits (the caller asked for it, and has those keys ignored)."""

    start: int
    n: int
    r0: int
    m: int
    seen: int
    logits: torch.Tensor
    hidden: torch.Tensor | None
    heads: slice
    open_triangle: bool = False


def _logit_blocks(
    ctx: _LayerContext,
    pos: torch.Tensor,
    chunk: int,
    block: int,
    scratch: torch.Tensor,
    fill: float,
    heads: int | None = None,
    fill_triangle: bool = True,
) -> Iterator[_LogitBlock]:
    """The logits ``(scale q) k^T`` of the queries at ``pos``, a block of ``block`` queries at a
    time (all heads, or groups of ``heads``), each over the keys it can see, soft-capped as the
    model does, with ``fill`` at the keys its queries cannot see, written into ``scratch``
    (``b * heads * block * keys`` floats, reused: a block is gone once the next is asked for).
    With ``heads`` the heads of a chunk come in groups of that many, each group's blocks in turn
    (smaller blocks that stay in cache for every head, not taller ones for a few). Chunks of
    ``chunk`` queries share one visibility mask; for consecutive causal queries only the
    triangle after the block's first query is filled (the keys before it are all visible; with
    ``fill_triangle=False`` it is left to the caller, ``open_triangle``) and a block sees keys up
    to its last query. The scale is folded into q (a ``d``-wide multiply instead of a
    ``T``-wide one)."""
    q, k = ctx.q, ctx.k
    b, h, kv, _ = k.shape
    kt = k.transpose(-1, -2)
    plain_causal = ctx.causal and ctx.mask is None and not ctx.sliding
    group = h if heads is None else max(1, min(h, heads))
    upper = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
    for start in range(0, len(pos), chunk):
        qp = pos[start : start + chunk]
        n = len(qp)
        first = int(qp[0])
        visible_len = int(qp.max()) + 1 if ctx.causal else kv
        consecutive = (
            plain_causal
            and visible_len == first + n
            and bool((qp == torch.arange(first, first + n, device=qp.device)).all())
        )
        hidden = None
        if not consecutive:
            vis, _ = ctx.visible(qp, visible_len)  # (b|1, h|1, n, visible_len), boolean
            hidden = ~vis
        qc = _rows_at(q, qp - ctx.offset).mul(ctx.scale)
        for h0 in range(0, h, group):
            hs = slice(h0, min(h, h0 + group))
            g = hs.stop - h0
            # a mask shared by every head (size 1 on that axis) serves each group as it is
            hid = None if hidden is None else hidden[:, hs] if hidden.shape[1] > 1 else hidden
            for r0 in range(0, n, block):
                m = min(block, n - r0)
                seen = first + r0 + m if hid is None else visible_len
                logits = torch.matmul(
                    qc[:, hs, r0 : r0 + m],
                    kt[:, hs, :, :seen],
                    out=scratch[: b * g * m * seen].view(b, g, m, seen),
                )
                if ctx.softcap is not None:
                    logits.div_(ctx.softcap).tanh_().mul_(ctx.softcap)
                if hid is None:  # query first + r0 + i sees keys up to first + r0 + i
                    if fill_triangle:
                        logits[..., first + r0 :].masked_fill_(upper[:m, :m], fill)
                    yield _LogitBlock(
                        start, n, r0, m, seen, logits, None, hs, open_triangle=not fill_triangle
                    )
                else:
                    block_hidden = hid[:, :, r0 : r0 + m]
                    logits.masked_fill_(block_hidden, fill)
                    yield _LogitBlock(start, n, r0, m, seen, logits, block_hidden, hs)


def _one_pass_summaries(
    ctx: _LayerContext, pos: torch.Tensor, chunk: int, value: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A layer's summaries and its attention output from one pass over blocks of its logits.

    The attention output of the summaries path otherwise costs two attention passes: the
    model's own kernel, then the summaries' SDPA call (:func:`_fast_summaries`). Here, per
    block of queries (every key the block can see; the heads in groups, :func:`_one_pass_blocks`)
    the logits ``(scale q) k^T`` are formed once and reduced at once: the sink's logit ``z_s``
    is read off and its key hidden, then over the content keys their maximum ``m``, their
    softmax ``p`` and ``sum p (l - m)`` (a sweep for the maximum and one for the rest in
    attncoda's compiled kernel, :mod:`._native`, which leaves ``exp(l - m) = p Z`` for the
    product with the values, each output row then scaled by ``1 / Z``; torch's softmax and
    reductions where it is not available) give
    ``Z = 1 / max p`` (the top key's ``p``; its shifted logit is 0), ``lse_c = m + log Z``, the
    content entropy ``log Z - sum p (l - m)`` (two terms >= 0: no cancellation, however large
    the logits) and the sink's log-odds ``z_s - lse_c``; the output is ``s v_sink + (1 - s) p
    @ v`` with ``s = sigmoid(z_s - lse_c)``, the softmax of the full row split by the grouping
    rule (a query that sees only its sink gets ``v_sink``; one that cannot see its sink, the
    content part). The balance comes from the sums of the visible keys as on the
    SDPA path. ``value``: fp32 ``(batch, heads, keys, dim)``; every query of the call is in
    ``pos`` and sees a key (:func:`_one_pass_applies`).

    Returns the summaries ``(b, h, nq)``, the output ``(b, h, nq, dim)`` (fp32) and the queries
    whose balance is to be recomputed from max-shifted logits (:func:`_sink_summaries`).
    """
    q, k = ctx.q, ctx.k
    b, h, kv, _ = k.shape
    nq = len(pos)
    bidx = torch.arange(b, device=q.device)
    sink = ctx.sink_index
    shared_sink = int(sink[0]) if bool((sink == sink[0]).all()) else None
    v_sink = value[bidx, :, sink]  # (b, h, dv)
    output = torch.empty(b, h, nq, value.shape[-1], dtype=torch.float32, device=q.device)
    z_s = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    row_stats = torch.empty(3, b, h, nq, dtype=torch.float32, device=q.device)
    # the content logits' maximum m, the top key's p (1 / Z) and sum p (l - m)
    top, p_top, a = row_stats.unbind(0)
    block, group = _one_pass_blocks(b, h, kv, chunk)
    # attncoda's compiled kernel takes the six torch ops below in one sweep per row (_native)
    kernel = _native.softmax_entropy_rows() if q.device.type == "cpu" else None
    scratch = torch.empty(
        1 if kernel is not None else 2, b * group * block * kv, dtype=torch.float32, device=q.device
    )
    if kernel is not None:  # each block's m, 1 / Z and sum p (l - m), from the kernel
        stats = torch.empty(3 * b * group * block, dtype=torch.float32, device=q.device)
    # per block only what needs the block (a dozen ops, each writing its rows of the results in
    # place); the per-row arithmetic and the sink's share of the output run once, after it
    # the kernel ignores the keys after each causal query itself (no fill, no exp there) where
    # the sink is key 0, which every query sees (a later sink must read as hidden to the
    # queries before it, so the triangle is filled first)
    blocks = _logit_blocks(
        ctx,
        pos,
        chunk,
        block,
        scratch[0],
        _HIDDEN,
        heads=group,
        fill_triangle=kernel is None or shared_sink != 0,
    )
    for blk in blocks:
        logits, seen = blk.logits, blk.seen
        rows = (slice(None), blk.heads, slice(blk.start + blk.r0, blk.start + blk.r0 + blk.m))
        if shared_sink is not None:  # one sink key for the batch: two ops, not eight
            if shared_sink < seen:
                z_s[rows] = logits[..., shared_sink]
                logits[..., shared_sink] = _HIDDEN
            else:
                z_s[rows] = _HIDDEN
        else:
            in_view = sink < seen  # the sink is a key this block can see (else it is hidden)
            at = sink.clamp(max=seen - 1)
            zs = logits[bidx, :, :, at]  # (b, heads, m): a copy
            z_s[rows] = torch.where(in_view[:, None, None], zs, torch.full_like(zs, _HIDDEN))
            logits[bidx, :, :, at] = torch.where(
                in_view[:, None, None], torch.full_like(zs, _HIDDEN), zs
            )
        if kernel is not None:
            # the logits become exp(l - m), p times Z: the output rows are scaled by 1 / Z below
            if b == 1 and blk.heads.stop - blk.heads.start == 1:  # the kernel writes in place
                kernel(logits, row_stats[:, 0, blk.heads.start, rows[2]], False, blk.open_triangle)
            else:
                block_stats = stats[: 3 * logits.numel() // seen].view(3, *logits.shape[:-1])
                kernel(logits, block_stats.view(3, -1), False, blk.open_triangle)
                row_stats[(slice(None), *rows)] = block_stats
            p = logits
        else:
            block_top = torch.amax(logits, dim=-1, out=top[rows])
            logits.sub_(block_top[..., None])
            p = torch.softmax(logits, -1, out=scratch[1, : logits.numel()].view(logits.shape))
            torch.amax(p, dim=-1, out=p_top[rows])
            torch.sum(logits.mul_(p), dim=-1, out=a[rows])  # <= 0; hidden keys add 0
        torch.matmul(p, value[:, blk.heads, :seen], out=output[rows])  # the content part
    if kernel is not None:  # the content part from exp(l - m): times 1 / Z, a d-wide multiply
        output.mul_(p_top[..., None])
    log_z = torch.log(p_top).neg_()
    lse_c = top + log_z
    h_c = log_z - a
    # the output is s v_sink + (1 - s) p @ v: a query that sees only its sink gets v_sink (s is
    # 1), one that cannot see it the content part (s is 0)
    output.lerp_(v_sink[:, :, None, :], torch.sigmoid(z_s - lse_c)[..., None])
    sink_seen = z_s > _HIDDEN / 2
    has_content = lse_c > _HIDDEN / 2
    z_s = torch.where(sink_seen, z_s, torch.full_like(z_s, -math.inf))
    logodds = torch.where(has_content, z_s - lse_c, torch.full_like(z_s, math.inf))
    h_c = torch.where(has_content, h_c.clamp_min(0.0), torch.full_like(h_c, math.nan))
    vis_rows = None if _no_mask_needed(ctx, pos) else ctx.visible(pos, kv)[0]
    k_sink = k[bidx, :, sink]
    key_sums = _content_key_sums(ctx, pos, vis_rows, chunk, k_sink)
    qsel = _rows_at(q, pos - ctx.offset)
    content_share = torch.sigmoid(-logodds)
    # the balance is a difference of two logit-sized numbers: the sink's logit for it is formed
    # as the mean content logit is (scale q . k), not from the blocks' prescaled q, so that
    # their roundings match (Qwen2.5's logits in the thousands: 2.4e-4 apart otherwise)
    z_bal = ctx.scale * torch.einsum("bhqd,bhd->bhq", qsel, k_sink)
    out, cancel = _sink_summaries(ctx, qsel, z_bal, logodds, h_c, content_share, key_sums)
    return out, output, (cancel & sink_seen & has_content).any(dim=(0, 1))


def _explicit(
    spec: CaptureSpec, ctx: _LayerContext, pos: torch.Tensor, rows: _LayerWriter | None
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Chunked fp32 logits over the keys that can be visible; summaries and/or rows.

    Rows are written straight into ``rows`` (their final buffer), a chunk of queries at a time;
    returns the summaries and the learned sink's log-attention (GPT-OSS sinks).
    """
    q, k = ctx.q, ctx.k
    b, _, kv, _ = k.shape
    kt = k.transpose(-1, -2)
    learned = ctx.sinks_logit is not None
    if rows is not None and spec.what == "rows" and _rows_fast_applies(ctx, rows):
        _rows_fast(ctx, pos, rows, spec.chunk_size)
        return {}, None
    summaries: dict[str, list[torch.Tensor]] = {}
    learned_rows: list[torch.Tensor] = []
    for start in range(0, len(pos), spec.chunk_size):
        qp = pos[start : start + spec.chunk_size]
        visible_len = int(qp.max()) + 1 if ctx.causal and not _has_future_keys(ctx.mask) else kv
        logits, vis = ctx.logits(qp, visible_len, kt)
        if learned:
            assert ctx.sinks_logit is not None
            extra = ctx.sinks_logit.view(1, -1, 1, 1).expand(b, -1, len(qp), 1)
            logits = torch.cat([extra, logits], dim=-1)
            vis = torch.cat([torch.ones_like(vis[..., :1]), vis], dim=-1)
            sink_mask = torch.zeros_like(vis)
            sink_mask[..., 0] = True
        else:
            sink_mask = _sink_mask(spec, ctx.sink_index, visible_len, q.device)
        if rows is not None:
            dest = rows.chunk(start, len(qp))
            lp = _log_softmax_into(logits, dest, offset=int(learned))
            if lp is not None:
                learned_rows.append(lp)
            if visible_len < kv:
                dest[..., visible_len:] = -math.inf
            rows.written(start, len(qp))
        if spec.what in ("summaries", "both"):
            # the rows were written out of place: the logits are still there, used up here
            for name, val in _summaries_from_logits(logits, vis, sink_mask).items():
                summaries.setdefault(name, []).append(val)
        del logits
    return (
        {k_: torch.cat(v, dim=-1) for k_, v in summaries.items()},
        torch.cat(learned_rows, dim=2) if learned_rows else None,
    )


_F16_MIN = float(torch.finfo(torch.float16).min)

# rows of a chunk are reduced a block of queries at a time, every head at once, the block sized
# so that its logits and their log-softmax (2 x batch x heads x rows x T x 4 bytes: 2 MB) stay
# in the core's cache between the matmul that writes them and the copy into the rows' buffer;
# but at least _BLOCK_ROWS queries while that stays under _BLOCK_MAX_BYTES: for long rows a
# block of a dozen queries makes the q k^T and p v matmuls too thin to run at speed (SmolLM2,
# T=2048: 14 queries a block took 7% more CPU time than 64)
_BLOCK_BYTES = 1 << 20
_BLOCK_ROWS = 64
_BLOCK_MAX_BYTES = 16 << 20
# summaries in one pass take blocks of _ONE_PASS_ROWS queries (every key the block sees), fewer
# where one head's block would exceed _ONE_PASS_BYTES of logits (long contexts, large batches).
# With the softmax form (torch.softmax, sum p (l - m) in place) SmolLM2's attention
# alone, one thread, median of 9 in each of 8 processes, took 1.52-1.66x / 1.50-1.72x /
# 1.70-1.77x SDPA's CPU time at T=512 / 2048 / 4096 with blocks of 96 queries against
# 1.69-1.71x / 1.76-1.92x / 1.97-2.00x with 32 (96 ahead in every process; 64 and 128 between
# them and noisier): the q k^T and p v products run faster on taller blocks
_ONE_PASS_ROWS = 96
# ... and they take the heads in groups whose block of logits stays under _ONE_PASS_BYTES, so
# that the passes over it (the q k^T product, the row reductions, the p v product) find it in
# the core's cache: at long contexts a block of every head is tens of MB (SmolLM2, T=8192:
# 27 MB). One layer alone, one thread, all heads vs groups under 4 MB in alternating processes:
# 1.73/1.75x -> 1.44/1.45x SDPA at T=8192, 1.59x -> 1.40x at 4096 (2 MB: no better, noisier)
_ONE_PASS_BYTES = 4 << 20
# From _ONE_PASS_LONG_KEYS keys on, taller blocks of one head win instead: each product packs
# the block's keys and values (64 x T each) again, and a taller block shares that over more
# queries. One layer alone, one thread, interleaved, blocks of 96 under 4 MB vs 256 under 8 MB:
# 1.31-1.33x -> 1.22-1.24x SDPA at T=8192 (three runs), 1.31x -> 1.27-1.29x at 4096; at 1024
# and 2048 the 96-query blocks stay ahead (1.22x vs 1.39x, 1.39x vs 1.45x)
_ONE_PASS_LONG_KEYS = 4096
_ONE_PASS_LONG_ROWS = 256
_ONE_PASS_LONG_BYTES = 8 << 20


def _one_pass_blocks(batch: int, heads: int, keys: int, chunk: int) -> tuple[int, int]:
    """Queries per block and heads per group of :func:`_one_pass_summaries`: blocks of
    :data:`_ONE_PASS_ROWS` queries (fewer in a short chunk, or where one head's block would
    exceed :data:`_ONE_PASS_BYTES`), as many heads at once as keep a block under it (at least
    one); from :data:`_ONE_PASS_LONG_KEYS` keys, blocks of :data:`_ONE_PASS_LONG_ROWS` under
    :data:`_ONE_PASS_LONG_BYTES`."""
    head_row = 4 * batch * max(keys, 1)  # one head's logits for one query, in bytes
    rows, cap = _ONE_PASS_ROWS, _ONE_PASS_BYTES
    if keys >= _ONE_PASS_LONG_KEYS:
        rows, cap = _ONE_PASS_LONG_ROWS, _ONE_PASS_LONG_BYTES
    block = max(1, min(chunk, rows, cap // head_row))
    group = max(1, min(heads, cap // (head_row * block)))
    return block, group


def _rows_fast_applies(ctx: _LayerContext, rows: _LayerWriter) -> bool:
    """Rows alone (no summaries, no learned sink), stored as float16/32, under a boolean mask or
    none, from q and k whose logits cannot reach NaN or +-inf (so no row needs a check).

    The bound: ``|q . k| * scale <= d * max|q| * max|k| * scale``; q and k are the model's
    own (fp32-upcast) values, small tensors next to the rows, checked in one pass each.
    """
    if ctx.sinks_logit is not None or rows.buf.dtype not in (np.float32, np.float16):
        return False
    if ctx.mask is not None and ctx.mask.dtype != torch.bool:
        return False  # a float bias may hold +inf or NaN: the per-row check stays
    return _logits_bounded(ctx)


def _logits_bounded(ctx: _LayerContext) -> bool:
    """Whether every logit is finite and below 1e30 in size, by the bound
    ``|q . k| * scale <= d * max|q| * max|k| * scale`` (one pass over q and k each)."""
    qmax = float(ctx.q.abs().amax()) if ctx.q.numel() else 0.0
    kmax = float(ctx.k.abs().amax()) if ctx.k.numel() else 0.0
    bound = ctx.q.shape[-1] * qmax * kmax * abs(ctx.scale)
    return math.isfinite(bound) and bound < 1e30  # NaN compares False too


def _rows_fast(
    ctx: _LayerContext,
    pos: torch.Tensor,
    rows: _LayerWriter,
    chunk: int,
    value: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Log-attention rows written straight into ``rows``, with as few passes as it takes.

    Per chunk of queries, blocks of queries (:data:`_BLOCK_BYTES` of logits, all heads, or
    :data:`_BLOCK_ROWS` queries if more): the logits over the keys the block can see, ``-inf``
    at those it cannot (:func:`_logit_blocks`, into one reused scratch array), then torch's
    fused log-softmax
    (max-shifted: ``(l - m) - log sum exp(l - m)``) goes into a second scratch array and is
    copied once into the rows' buffer, whose keys after the block's last visible one are set
    to ``-inf``. Rows with no visible key (padding queries) are ``-inf`` throughout, as on the
    general path (:func:`_log_softmax_into`, equal to fp32 rounding; both are compared with
    HF's eager weights by the tests).

    With ``value`` (fp32 ``(batch, heads, keys, dim)``), every block's probabilities
    ``exp(log_attn)`` go into the logits' scratch array once their log-softmax is taken and are
    multiplied by the values the block sees: the attention output ``(batch, heads, queries,
    dim)`` is returned (every query of the call must be in ``pos``, each seeing a key).
    """
    q, k = ctx.q, ctx.k
    b, h, kv, _ = k.shape
    output = None
    if value is not None:
        output = torch.empty(b, h, len(pos), value.shape[-1], dtype=torch.float32, device=q.device)
    row_bytes = 4 * b * h * max(kv, 1)
    wide = min(_BLOCK_ROWS, _BLOCK_MAX_BYTES // row_bytes)
    block = max(1, min(chunk, max(_BLOCK_BYTES // row_bytes, wide)))
    scratch = torch.empty(2, b * h * block * kv, dtype=torch.float32, device=q.device)
    dest: torch.Tensor | None = None
    for blk in _logit_blocks(ctx, pos, chunk, block, scratch[0], -math.inf):
        logits, r0, m, seen = blk.logits, blk.r0, blk.m, blk.seen
        if r0 == 0:
            dest = rows.chunk(blk.start, blk.n)  # (b, h, n, kv)
        assert dest is not None
        out = dest[:, :, r0 : r0 + m, :seen]
        direct = out.dtype == torch.float32 and out.is_contiguous()
        lp = out if direct else scratch[1, : logits.numel()].view(logits.shape)
        torch.log_softmax(logits, dim=-1, out=lp)
        if output is not None:
            assert value is not None
            probs = torch.exp(lp, out=logits)  # the logits are used up
            i = blk.start + r0
            output[:, :, i : i + m] = torch.matmul(probs, value[:, :, :seen])
        if blk.hidden is not None:  # rows with no visible key (padding queries): -inf, not NaN
            dead = blk.hidden.all(dim=-1, keepdim=True)
            if bool(dead.any()):
                lp.masked_fill_(dead, -math.inf)
        if not direct:
            if out.dtype == torch.float16:  # visible keys stay finite (see above)
                lp = torch.where(torch.isneginf(lp), lp, lp.clamp(min=_F16_MIN))
            out.copy_(lp)
        if seen < kv:
            dest[:, :, r0 : r0 + m, seen:] = -math.inf
        if r0 + m == blk.n:
            rows.written(blk.start, blk.n)
    return output


def _log_softmax_into(
    logits: torch.Tensor, dest: torch.Tensor, *, offset: int
) -> torch.Tensor | None:
    """Write ``log_softmax(logits)[..., offset:]`` into ``dest[..., :n]``; ``logits`` unchanged.

    From max-shifted logits: with logits in the thousands (Qwen2.5's first layers)
    ``logits - logsumexp(logits)`` loses the small term of ``m + log(sum)`` to fp32 rounding
    (5e-4 in probability near 1); ``(l - m) - log(sum exp(l - m))`` does not. Rows with no
    visible key (padding queries) stay all ``-inf``, not NaN. For float32 rows the result is
    computed in ``dest`` itself (one chunk-sized temporary: the exponentials); for float16 in
    fp32 first, then rounded once, with visible keys below float16's range kept at its
    minimum (-65504) so that ``-inf`` still means "invisible". With a learned sink
    (``offset=1``) its column is returned, not written. Every row so written closes and is
    ``<= 0`` by construction; a row with a NaN or ``+inf`` logit raises :class:`CaptureError`.
    """
    m = logits.amax(dim=-1, keepdim=True)
    finite = torch.isfinite(m)
    # a NaN or +inf logit makes the row's maximum NaN or +inf (amax propagates NaN): such
    # rows are refused here, per row, so the finished rows need no pass over every value
    check_finite_rows(~(finite | (m == -math.inf)))
    m = torch.where(finite, m, torch.zeros_like(m))
    n = logits.shape[-1] - offset
    direct = offset == 0 and dest.dtype == torch.float32
    out = dest[..., :n] if direct else torch.empty_like(logits)
    torch.sub(logits, m, out=out)
    lse = out.exp().sum(dim=-1, keepdim=True).log_()
    out.sub_(torch.where(finite, lse, torch.zeros_like(lse)))
    if direct:
        return None
    body = out[..., offset:]
    if dest.dtype == torch.float16:
        body = torch.where(torch.isneginf(body), body, body.clamp(min=_F16_MIN))
    dest[..., :n].copy_(body)
    return out[..., 0].clone() if offset else None


def _has_future_keys(mask: torch.Tensor | None) -> bool:
    """A float custom mask may make keys after the query visible (e.g. ARACH hubs)."""
    return mask is not None and mask.dtype != torch.bool


# --------------------------------------------------------------------------------------------
# registration


class Capture:
    """Handle returned by :func:`capture`: ``cap.dataset`` holds what the block captured, and
    ``cap.datasets`` each attention stack's dataset (encoder-decoders have three)."""

    def __init__(
        self, sessions: dict[str, _Session], model_info: dict[str, Any], fallback: bool
    ) -> None:
        self._sessions = sessions
        self._info = model_info
        self.fallback = fallback
        self._made: dict[str, tuple[tuple[int, bool], xr.Dataset]] = {}

    def __enter__(self) -> Capture:
        raise CaptureError(
            "cap (what `with capture(model) as cap` gives) is not a block of its own; run the "
            "model inside the capture(...) block and read cap.dataset, or open a new "
            "capture(model, ...) block"
        )

    def __exit__(self, *exc: Any) -> None:  # pragma: no cover - __enter__ always raises
        return None

    @property
    def stacks(self) -> tuple[str, ...]:
        """The captured attention stacks: ``("self",)``, or some of ``("encoder", "decoder",
        "cross")`` for an encoder-decoder."""
        return tuple(self._sessions)

    @property
    def dataset(self) -> xr.Dataset:
        """The captured data as an :class:`xarray.Dataset` (schema: :mod:`attncoda`'s data model).

        Every forward pass run inside the block is in it: each independent pass is a group of
        samples, continued by its cached steps (generate()). Read inside the block, it holds the
        passes so far; later passes are included the next time it is read, also after the
        block (the assembled dataset is reused only while nothing new was captured). A pass
        that raised is left out. With ``stream_to=`` finished passes live in the zarr store,
        opened lazily; inside the block the pass still running is added from memory.

        An encoder-decoder has several stacks of attention: read :attr:`datasets` (this
        property then refuses, naming them), or capture one stack alone with e.g.
        ``layers={"cross": "all"}``.

        Raises
        ------
        CaptureError
            Nothing was captured, requested query positions never occurred in a pass, or the
            capture holds several stacks.
        """
        if len(self._sessions) > 1:
            names = ", ".join(f"cap.datasets[{n!r}]" for n in self._sessions)
            raise CaptureError(
                f"this capture holds {len(self._sessions)} attention stacks; read {names} (or "
                "capture one stack, e.g. layers={'cross': 'all'})"
            )
        return self._dataset_of(next(iter(self._sessions)))

    @property
    def datasets(self) -> dict[str, xr.Dataset]:
        """Each captured attention stack's dataset, by name (see :attr:`stacks`).

        ``"self"`` for decoder-only and encoder-only models; ``"encoder"`` (the encoder's
        self-attention), ``"decoder"`` (the decoder's causal self-attention) and ``"cross"``
        (decoder queries over encoder positions: ``key`` and the ``token`` coordinate are the
        source positions, ``query_token`` the target tokens) for encoder-decoders. Each
        dataset's ``attention_stack`` attribute names its stack.
        """
        return {name: self._dataset_of(name) for name in self._sessions}

    def _dataset_of(self, name: str) -> xr.Dataset:
        s = self._sessions[name]
        _rollback(s)
        made_at = (s.generation, s.closed)
        cached = self._made.get(name)
        if cached is not None and cached[0] == made_at:
            return cached[1]
        for seg in s.segments:
            _finish(s, seg)
        if s.store is not None:
            _flush(s, everything=s.closed)
            parts = [load(s.store)] if Path(s.store).exists() else []
            current = s.segments[-1] if s.segments and not s.closed else None
            if current is not None and current.records:
                parts.append(_assemble(s, current, s.info, fallback=self.fallback))
            if not parts:
                raise CaptureError(_nothing(s))
            dataset = _combine(parts)
        else:
            segments = [seg for seg in s.segments if seg.records]
            if not segments:
                raise CaptureError(_nothing(s))
            dataset = _combine(
                [_assemble(s, seg, s.info, fallback=self.fallback) for seg in segments]
            )
        self._made[name] = (made_at, dataset)
        return dataset


_NOTHING = (
    "the capture recorded nothing: no forward pass ran inside the block, or the selected "
    "layers/queries were never computed (check layers=, queries=)"
)


def _nothing(s: _Session) -> str:
    """Why a capture holds nothing: no pass ran, or passes ran whose attention never reached
    attncoda (a model that computes it by its own code in this configuration)."""
    passes = sum(len(seg.inputs) for seg in s.segments)
    if passes and not any(seg.calls for seg in s.segments):
        stack = "" if s.stack == "self" else f" {s.stack}"
        return (
            f"{type(s.model).__name__} ran {passes} forward pass{'es' if passes > 1 else ''} but "
            f"none of its{stack} attention calls reached attncoda: in this configuration it "
            "computes attention by its own code (local, block-sparse or another route), which "
            "attncoda cannot capture"
        )
    return _NOTHING


def _flush(s: _Session, *, everything: bool) -> None:
    """Append finished segments (all of them with ``everything``) to the zarr store, in order,
    and drop their records from memory; the last segment object stays the current one."""
    done = s.segments if everything else s.segments[:-1]
    for seg in done:
        if seg.records:
            save(_assemble(s, seg, s.info, fallback=s.fallback), s.store, append=True)
            seg.records.clear()
            seg.inputs.clear()
        if seg.rows_buf is not None:
            seg.rows_buf.discard()
            seg.rows_buf = None
    del s.segments[:-1]


def _combine(parts: list[xr.Dataset]) -> xr.Dataset:
    """Independent forward passes become samples; differing lengths are padded (NaN / -inf)."""
    if len(parts) == 1:
        return parts[0]
    for name in ("token_id", "token"):
        if not all(name in p.coords for p in parts):
            parts = [p.drop_vars(name, errors="ignore") for p in parts]
    out = xr.concat(
        parts,
        dim="sample",
        join="outer",
        combine_attrs="override",
        data_vars="minimal",
        coords="minimal",
        fill_value=_FILL,
    )
    out = out.assign_coords(sample=np.arange(out.sizes["sample"]))
    return out


_FILL = {
    "log_attn": -np.inf,
    "learned_sink_log_attn": -np.inf,
    "token_id": -1,
    "token": "",
    "sink_index": 0,
}


def _assemble(s: _Session, seg: _Segment, info: dict[str, Any], *, fallback: bool) -> xr.Dataset:
    """Turn one segment's records into a dataset: calls of a layer are appended along ``query``."""
    by_layer: dict[int, list[_Record]] = {}
    for r in seg.records:
        by_layer.setdefault(r.layer, []).append(r)
    layers = sorted(by_layer)
    first = by_layer[layers[0]]
    query_pos = np.concatenate([r.query_pos for r in sorted(first, key=lambda r: r.call)])
    kv_max = max(r.kv_len for r in seg.records)
    summaries: dict[str, np.ndarray] = {}
    rows_layers: list[tuple[int, int, list[_Record]]] = []
    learned = None
    for li, layer in enumerate(layers):
        recs = sorted(by_layer[layer], key=lambda r: r.call)
        pos = np.concatenate([r.query_pos for r in recs])
        if not np.array_equal(pos, query_pos):
            raise CaptureError(
                f"layer {layer} saw different query positions than layer {layers[0]}"
            )
        if recs[0].summaries is not None:
            for name in SUMMARY_VARIABLES:
                val = np.concatenate([r.summaries[name] for r in recs if r.summaries], axis=-1)
                if name not in summaries:
                    shape = (val.shape[0], len(layers), *val.shape[1:])
                    summaries[name] = np.empty(shape, np.float32)
                summaries[name][:, li] = val
        if recs[0].rows is not None or recs[0].in_buffer:
            rows_layers.append((li, layer, recs))
        if recs[0].learned_sink_rows is not None:
            val = np.concatenate(
                [r.learned_sink_rows for r in recs if r.learned_sink_rows is not None], axis=-1
            )
            if learned is None:
                learned = np.empty((val.shape[0], len(layers), *val.shape[1:]), np.float32)
            learned[:, li] = val
    rows = _rows_of(s, seg, rows_layers, len(query_pos), kv_max) if rows_layers else None
    attrs = dict(info)
    attrs.update(
        capture_spec=s.spec.to_json(),
        capture_path="eager+hooks" if fallback else "registered-attention",
    )
    n_samples = next(iter(summaries.values())).shape[0] if summaries else len(rows)  # type: ignore[arg-type]
    sink_index = (
        seg.sink_index.cpu().numpy()
        if seg.sink_index is not None
        else np.zeros(n_samples, np.int64)
    )
    token_ids = _tokens(seg, kv_max)
    tokens = (
        token_strings(s.tokenizer, token_ids, _valid_positions(seg, token_ids.shape))
        if token_ids is not None and s.tokenizer is not None
        else None
    )
    ds = make_dataset(
        summaries=summaries or None,
        log_attn=rows,
        learned_sink_log_attn=learned,
        layers=layers,
        heads=s.heads,
        query_positions=query_pos,
        n_keys=kv_max,
        token_ids=token_ids,
        tokens=tokens,
        sink_index=sink_index,
        attrs=attrs,
        # rows computed here close by construction (non-finite logits were refused per row):
        # a check of every value would cost as much as computing them; the eager fallback's
        # rows are checked, and save() checks any rows it writes (stream_to= included)
        check_values=rows is None or fallback,
    )
    if rows is not None and not fallback and summaries:
        attncoda.validate_dataset(ds.drop_vars(["log_attn"]))
    if s.stack == "cross":
        ds = _with_query_tokens(s, seg, ds, query_pos)
    return ds


def _with_query_tokens(
    s: _Session, seg: _Segment, ds: xr.Dataset, query_pos: np.ndarray
) -> xr.Dataset:
    """Cross attention: the target (decoder) tokens of the queries, as ``query_token_id`` and
    ``query_token`` ``(sample, query)``; the keys keep the source tokens (``token``)."""
    parts = [i.detach().cpu().numpy() for i in seg.query_ids if torch.is_tensor(i)]
    if not parts or len(parts) != len(seg.query_ids) or len({p.shape[0] for p in parts}) != 1:
        return ds
    ids = np.concatenate(parts, axis=1)
    if ids.shape[0] != ds.sizes["sample"] or int(query_pos.max()) >= ids.shape[1]:
        return ds
    picked = ids[:, query_pos]
    coords: dict[str, Any] = {"query_token_id": (("sample", "query"), picked.astype(np.int64))}
    if s.tokenizer is not None:
        coords["query_token"] = (("sample", "query"), token_strings(s.tokenizer, picked, None))
    return ds.assign_coords(coords)


def _rows_of(
    s: _Session,
    seg: _Segment,
    rows_layers: list[tuple[int, int, list[_Record]]],
    n_queries: int,
    kv_max: int,
) -> Any:
    """The segment's rows ``(sample, layer, head, query, key)``: its buffer itself when every
    captured layer ran once (one forward pass), else one array filled once, record by record
    (cached generate() steps add queries, and keys, to a layer)."""
    buf = seg.rows_buf
    if (
        buf is not None
        and [layer for _, layer, _ in rows_layers] == s.layers
        and all(len(recs) == 1 and recs[0].in_buffer for _, _, recs in rows_layers)
        and buf.shape[-2:] == (n_queries, kv_max)
    ):
        return buf.full()
    first = rows_layers[0][2][0].rows
    b = buf.shape[0] if buf is not None else first.shape[0] if first is not None else 0
    shape = (b, len(rows_layers), len(s.heads), n_queries, kv_max)
    out = np.full(shape, -np.inf, np.dtype(s.spec.dtype))
    for li, layer, recs in rows_layers:
        start = 0
        for r in recs:
            val = r.rows
            if r.in_buffer:
                assert buf is not None
                val = buf.read(s.layers.index(layer))
            assert val is not None
            out[:, li, :, start : start + val.shape[2], : val.shape[3]] = val
            start += val.shape[2]
    return out


def _tokens(seg: _Segment, kv_len: int) -> np.ndarray | None:
    """Token ids per (sample, position) from the recorded model inputs (generate: concatenated)."""
    ids = [inp.get("input_ids") for inp in seg.inputs]
    if not ids or any(i is None for i in ids):
        return None
    parts = [i.detach().cpu().numpy() for i in ids if i is not None]
    if len({p.shape[0] for p in parts}) != 1:
        return None
    full = np.concatenate(parts, axis=1)
    if full.shape[1] != kv_len:
        return None
    return full


def _valid_positions(seg: _Segment, shape: tuple[int, ...]) -> np.ndarray | None:
    """False at padding: the last 2-D attention mask covering every position (generate() passes
    the whole mask at each step), else None (no padding known)."""
    for inp in reversed(seg.inputs):
        mask = inp.get("attention_mask")
        if mask is not None and mask.dim() == 2 and tuple(mask.shape) == tuple(shape):
            return mask.detach().cpu().numpy().astype(bool)
    return None


def _model_info(model: Any) -> dict[str, Any]:
    config = getattr(model, "config", None)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    info = {
        "model_id": model_id(model),
        "family": str(getattr(config, "model_type", "")),
        "dtype": str(dtype).replace("torch.", ""),
        "weights_sha256": weights_sha256(model),
        "attncoda_version": attncoda.__version__,
        "transformers_version": _version("transformers"),
        "torch_version": str(torch.__version__),
    }
    # instruction-tuned or base, code model, quantisation: what the zoo knows of offline assets
    provenance = provenance_of(model)
    if provenance:
        info["provenance"] = provenance
    return info


_WEIGHTS_SHA: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def weights_sha256(model: Any) -> str:
    """sha256 identifying the model's weights, for provenance.

    For a checkpoint folder with a manifest (attncoda's offline assets) or a single
    ``model.safetensors`` listed there, that file's recorded sha256; otherwise a sha256 of the
    in-memory state dict (tensor names, dtypes, shapes and bytes, in name order), computed once
    per model object.
    """
    if model in _WEIGHTS_SHA:
        return _WEIGHTS_SHA[model]
    folder = Path(_name_or_path(model) or ".")
    manifest = folder / "manifest.json"
    digest = ""
    if folder.is_dir() and manifest.is_file():
        files = json.loads(manifest.read_text()).get("files", [])
        digest = next((f["sha256"] for f in files if f.get("path") == "model.safetensors"), "")
    if not digest:
        h = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cpu().contiguous().reshape(-1)  # 0-dim: view() needs a dim
            h.update(f"{name}:{t.dtype}:{tuple(tensor.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        digest = "state_dict:" + h.hexdigest()
    _WEIGHTS_SHA[model] = digest
    return digest


@functools.cache
def _version(name: str) -> str:
    """An installed package's version, read once per process (its metadata parse imports and
    allocates megabytes: not once per capture)."""
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:  # pragma: no cover
        return ""


class _SingleUse:
    """The context manager :func:`capture` returns: one ``with`` block per call.

    A second ``with`` on it (after its block, or inside it) is refused with a
    :class:`CaptureError` instead of contextlib's ``AttributeError``.
    """

    def __init__(self, block: AbstractContextManager[Capture]) -> None:
        self._block = block
        self._state = "new"

    def __enter__(self) -> Capture:
        if self._state != "new":
            where = "is open" if self._state == "open" else "has ended"
            raise CaptureError(
                f"this capture(...) was already used: its with-block {where}; each "
                "`with capture(model, ...) as cap:` block needs its own capture(...) call"
            )
        self._state = "open"
        try:
            return self._block.__enter__()
        except BaseException:
            self._state = "ended"
            raise

    def __exit__(self, *exc: Any) -> bool | None:
        self._state = "ended"
        return self._block.__exit__(*exc)


def _single_use(
    fn: Callable[..., AbstractContextManager[Capture]],
) -> Callable[..., _SingleUse]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _SingleUse:
        return _SingleUse(fn(*args, **kwargs))

    return wrapper


def _check_model(model: Any) -> None:
    """Refuse, in one line, what is not a loaded transformers model before anything touches it."""
    if isinstance(model, (str, os.PathLike)):
        raise CaptureError(
            f"capture() needs a loaded model, got the name {_show(str(model))}; load it first "
            "(model, tokenizer = attncoda.hooks.zoo.load(name), or "
            "transformers.AutoModelForCausalLM.from_pretrained(name))"
        )
    if not isinstance(model, torch.nn.Module):
        inner = getattr(model, "model", None)
        if isinstance(inner, torch.nn.Module):  # a transformers pipeline, or a wrapper
            raise CaptureError(
                f"capture() needs the model itself, got a {type(model).__name__} that holds "
                "one; pass its .model (capture(pipe.model))"
            )
        raise CaptureError(
            f"capture() needs a transformers model (a torch.nn.Module with a .config), got "
            f"{_show(model)} ({_kind(model)})"
        )
    if getattr(model, "config", None) is None:
        raise CaptureError(
            f"capture() needs a transformers model, got a torch module without a .config "
            f"({type(model).__name__}); attncoda captures the attention of HuggingFace models"
        )
    if any(p.is_meta for p in model.parameters()):
        raise CaptureError(
            f"{type(model).__name__}'s weights are on the meta device (not loaded); load them "
            "(from_pretrained without device_map='meta' or init_empty_weights) before capturing"
        )


#: models whose parameters were found finite, with the parameters' version counters then
_FINITE_WEIGHTS: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


def _check_weights_finite(model: Any) -> None:
    """Refuse a model with a NaN or infinite weight before any work (its attention would be
    NaN). One reduction per parameter in its own dtype (a float16 sum that overflows is
    confirmed value by value); remembered per model until a parameter changes in place."""
    params = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    versions = tuple(p._version for _, p in params)
    if _FINITE_WEIGHTS.get(model) == versions:
        return
    with torch.no_grad():
        for name, p in params:
            if not bool(torch.isfinite(p.sum())) and not bool(torch.isfinite(p).all()):
                raise CaptureError(
                    f"the model's weight {name} holds NaN or infinite values, so its attention "
                    "would be NaN; reload the weights (or load them in float32 if they "
                    "overflowed)"
                )
    _FINITE_WEIGHTS[model] = versions


def _modules_of(model: Any) -> set[int]:
    return {id(m) for m in model.modules()}


@_single_use
@contextmanager
def capture(
    model: Any,
    *,
    layers: Any = None,
    heads: Any = None,
    queries: Any = None,
    what: What = "summaries",
    sink: Any = "first",
    chunk_size: int = 256,
    stream_to: str | os.PathLike[str] | None = None,
    tokenizer: Any = None,
    dtype: Any = "float32",
    exact_outputs: bool = False,
) -> Iterator[Capture]:
    """Capture attention of a HuggingFace model during the ``with`` block.

    Every argument is checked before any work: ints are Python or numpy integers (never bools
    or floats), explicit lists name each index once, and every problem raises a one-line
    :class:`CaptureError`.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any model; it is not reloaded. Its attention implementation is switched to
        ``"attncoda"`` inside the block and restored afterwards, also after an exception.
    layers, heads : None, "all", int, list/tuple/range of int, or slice
        Which layers and heads to capture (default: all); negative indices count from the end
        and must lie in ``[-n, n)``. Layers not captured run exactly as before (SDPA by
        default).
    queries : None, "all", int, list/tuple/range of int, or slice
        Query token positions (default: all). Negative values count from the end of each
        forward call and must lie in ``[-T, T)`` for a call of ``T`` tokens: they are never
        wrapped. A position a forward pass does not have is refused during that pass, before
        its work, unless the pass was given a KV cache object (as ``generate()`` does): then it
        may occur in a later cached step, and a position that never occurred is refused when
        the next independent pass begins or when ``cap.dataset`` is read. Slices follow Python
        semantics per call, but one that selects nothing of a pass is refused.
    what : {"summaries", "rows", "both"}, default "summaries"
        Per-row sink/content summaries (O(T) memory per head) or fp32 log-attention rows.
        Rows take ``samples x layers x heads x queries x keys x 4`` bytes (2 with
        ``dtype="float16"``), written once into the array the dataset holds: a capture keeps
        no second copy of them.
    sink : "first", "learned", int >= 0 or list of int >= 0, default "first"
        Which key(s) form the sink (see :class:`CaptureSpec`). Fixed positions count from the
        first key and must be real (non-padding) keys of every forward pass.
    chunk_size : int, default 256
        Query rows recomputed at once.
    stream_to : path-like, optional
        A new ``.zarr`` store: each finished forward pass is appended to it along ``sample`` and
        dropped from memory (for long runs over many batches; every batch must have the same
        length); the last pass is appended when the block ends. ``cap.dataset`` then opens the
        store lazily. Rows never stay in memory: each chunk of queries goes to an uncompressed
        staging array beside the store (``.NAME.attncoda-rows-*``, removed when its pass is
        appended) as soon as it is computed, so a capture whose rows exceed memory runs in
        memory bounded by one chunk (``chunk_size x keys x heads``) plus the model's forward.
        Needs dask with rows (``pip install 'attncoda[distributed]'``) and disk space for the
        rows twice while a pass is appended.
    tokenizer : transformers tokenizer, optional
        The model's tokenizer (anything with ``decode``). With it the dataset gets the
        ``token`` coordinate ``(sample, position)``: each token's text as
        ``tokenizer.decode([id])`` shows it (``" the"``; the tokenizer's own spelling, e.g.
        ``"Ġâ"``, where one id alone is not valid text), ``""`` at padding. And when
        ``sink="first"`` lands on a token that is neither BOS nor special (a tokenizer that
        prepends no BOS, such as SmolLM2's, or a slice starting mid-word), a
        :class:`SinkTokenWarning` says which token became the sink, once per capture. Without
        it, ``token_id`` alone is stored and nothing is checked. Captured numbers are the same
        either way.
    dtype : {"float32", "float16"}, default "float32"
        The dtype rows are stored in (also a numpy or torch dtype). Rows are computed in fp32
        either way; ``"float16"`` halves their bytes and is lossy: each log-probability is
        rounded to 11 significant bits (about 3e-4 relative; visible keys below -65504 are
        kept at -65504), and summaries recomputed from float16 rows differ from fp32 ones by
        the amounts docs/capture.md lists. bfloat16 is refused (numpy, netCDF and zarr cannot
        store it). Summaries are always float32.
    exact_outputs : bool, default False
        Where rows of every head and every query of a layer are captured (``what="rows"``,
        ``heads`` and ``queries`` left at all), that layer's output is computed from the rows
        just captured, ``exp(log_attn) @ value`` in fp32, as eager attention computes it from
        its weights, instead of running the model's own attention kernel as well: all-layer
        rows then cost no more than HF eager's ``output_attentions=True``. The outputs equal the
        model's to fp32 rounding, about as closely as its SDPA and eager implementations equal
        each other; a model with large activations amplifies it (Qwen2.5-Coder-0.5B, 128
        tokens: logits move by 5.5e-4, by 2.7e-4 when switched to eager), and it can, rarely,
        tip a near-tie downstream. Summaries of every head and query (``what="summaries"``)
        likewise give the layer's output from the same pass over the logits, the model's kernel
        not run (docs/capture.md, "How it works"). ``True`` runs the model's own kernel for
        every layer, so its outputs are exactly those without capture, at the cost of that
        kernel (``bench_rows``:
        all-layer rows took 1.09x HF eager's CPU time at 512 tokens in the run before outputs
        came from the rows, 0.96x since); the case studies use it, to measure the model as
        deployed.

    Yields
    ------
    Capture
        ``cap.dataset`` is an :class:`xarray.Dataset` with dims
        ``sample, layer, head, query(, key)``. It holds every forward pass run inside the block
        so far: reading it inside the block and running more passes does not freeze it.

    Raises
    ------
    CaptureError
        For any invalid argument (also during a forward pass, for positions that pass does not
        have); the model is restored either way.

    Examples
    --------
    >>> from attncoda.hooks import capture, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> batch = zoo.tiny_batch(model, length=8)
    >>> with capture(model, layers=[0], what="summaries") as cap:
    ...     _ = model(**batch)
    >>> sorted(cap.dataset.sizes.items())
    [('head', 4), ('layer', 1), ('position', 8), ('query', 8), ('sample', 2)]

    With a tokenizer, tokens label the positions:

    >>> tok = zoo.ByteTokenizer(model.config.vocab_size)
    >>> with capture(model, layers=[0], tokenizer=tok, sink=0) as cap:
    ...     _ = model(**tok("Hello", return_tensors="pt"))
    >>> cap.dataset.token.values.tolist()
    [['H', 'e', 'l', 'l', 'o']]

    Rows in half the bytes (lossy):

    >>> with capture(model, layers=[0], what="rows", dtype="float16") as cap:
    ...     _ = model(**batch)
    >>> cap.dataset.log_attn.dtype
    dtype('float16')
    """
    _check_model(model)
    if not (isinstance(what, str) and what in ("summaries", "rows", "both")):
        raise CaptureError(
            f"what={_show(what)} is not a choice; pass 'summaries', 'rows' or 'both'"
        )
    if not (_is_int(chunk_size) and chunk_size > 0):
        raise CaptureError(
            f"chunk_size={_show(chunk_size)} is not a positive int; pass an int >= 1 (e.g. 256)"
        )
    if tokenizer is not None and not callable(getattr(tokenizer, "decode", None)):
        raise CaptureError(
            f"tokenizer={_show(tokenizer)} has no decode(); pass the model's tokenizer "
            "(e.g. from transformers.AutoTokenizer or attncoda.hooks.zoo.load) or None"
        )
    if not isinstance(exact_outputs, (bool, np.bool_)):
        raise CaptureError(
            f"exact_outputs={_show(exact_outputs)} is not a bool; pass True (the model's own "
            "attention kernel for every layer) or False (the default)"
        )
    if _modules_of(model) & _CAPTURING:  # the model, a part of it, or a model it is part of
        raise CaptureError(
            "captures of one model cannot be nested (also not of a model and its submodel, "
            "e.g. model and model.model); finish the outer capture first"
        )
    rows_dtype = _rows_dtype(dtype, what)
    stacks = stacks_of(model)
    picks = {
        arg: _per_stack(value, arg, stacks)
        for arg, value in (("layers", layers), ("heads", heads), ("queries", queries))
    }
    wanted = [n for n in stacks if all(n in picks[a] for a in picks)]
    if not wanted:
        raise CaptureError(
            "layers=/heads=/queries= given per stack name no stack in all three; name each "
            f"stack to capture ({', '.join(stacks)}) in every dict given"
        )
    specs: dict[str, CaptureSpec] = {}
    selected: dict[str, tuple[list[int], list[int]]] = {}
    for name in wanted:
        st = stacks[name]
        specs[name] = CaptureSpec(
            layers=picks["layers"][name],
            heads=picks["heads"][name],
            queries=picks["queries"][name],
            what=what,
            sink=_sink_choice(sink),
            chunk_size=int(chunk_size),
            dtype=rows_dtype,
            exact_outputs=bool(exact_outputs),
        )
        try:
            selected[name] = (
                _resolve(specs[name].layers, st.n_layers, "layer"),
                _resolve(specs[name].heads, st.n_heads, "head"),
            )
        except CaptureError as err:
            if name == "self":
                raise
            raise CaptureError(f"{name} attention: {err}") from None
    switch = can_switch(model)
    several = list(stacks) != ["self"]
    if several and not switch:
        raise CaptureError(
            f"{type(model).__name__} is an encoder-decoder whose attention does not go through "
            "transformers' attention registry; attncoda cannot capture it"
        )
    if several and stream_to is not None:
        raise CaptureError(
            "stream_to= takes one dataset; an encoder-decoder gives one per stack (encoder, "
            "decoder, cross): capture without stream_to= and save each of cap.datasets"
        )
    if specs[wanted[0]].sink == "learned":
        modules = attention_modules(model) if switch else []
        if not any(getattr(m, "sinks", None) is not None for m in modules):
            raise CaptureError(
                "sink='learned' needs a model with learned sinks (GPT-OSS style) whose attention "
                "attncoda can switch; pass sink='first' or fixed key positions"
            )
    store = _stream_target(stream_to, what) if stream_to is not None else None
    _check_weights_finite(model)
    info = _model_info(model)
    info["attention_implementation"] = str(model.config._attn_implementation)
    sessions: dict[str, _Session] = {}
    for name in wanted:
        layer_list, head_list = selected[name]
        session = _Session(model, specs[name], layer_list, head_list, stacks[name].n_heads)
        session.store, session.fallback = store, not switch
        session.info = dict(info, attention_stack=name) if several else info
        session.stack, session.shared = name, stacks[name].shared
        if tokenizer is not None:
            session.tokenizer = tokenizer
            session.special_ids = special_token_ids(tokenizer, model)
        sessions[name] = session
    if "cross" in sessions:
        sessions["cross"].source = sessions.get("encoder") or _Session(
            model, specs["cross"], [], [], 0, stack="encoder"
        )
    stack_of = {id(m): st for st in stacks.values() for m in st.modules}

    def observe(
        module: Any,
        layer: int,
        query: Any,
        key: Any,
        mask: Any,
        scaling: Any,
        kwargs: dict[str, Any],
        value: Any = None,
    ) -> Any:
        st = stack_of.get(id(module))
        if st is None:
            return None
        session = sessions.get(st.name)
        if session is None:
            return None
        if st.static is not None:
            layer = st.static[id(module)]
        else:  # a shared module: each application is the next layer of the pass
            layer = session.ordinal % st.n_layers
            session.ordinal += 1
        if layer in session.layers:
            return _capture_layer(session, module, layer, query, key, mask, scaling, kwargs, value)
        return None

    module_ids = _modules_of(model)
    _CAPTURING.update(module_ids)
    hooks = []
    for name, session in sessions.items():
        entry = stacks[name].entry
        hooks.append(entry.register_forward_pre_hook(_before_forward(session), with_kwargs=True))
        hooks.append(entry.register_forward_hook(_after_forward(session)))
    if "cross" in sessions and "encoder" not in sessions:
        source = sessions["cross"].source
        assert source is not None
        hooks.append(
            stacks["encoder"].entry.register_forward_pre_hook(
                _remember_source(source), with_kwargs=True
            )
        )
    head = _output_head(model) if not several else None
    if head is not None:
        only = sessions[wanted[0]]
        hooks.append(head.register_forward_pre_hook(_before_head(only)))
        only.head_hooked = True
    claim = None
    try:
        if store is not None:  # before the model runs; released in ``finally``
            claim = _claim_stream(store)
        if switch:
            own = what in ("rows", "summaries") and not exact_outputs
            with observed(model, observe, computes=own):
                cap = Capture(sessions, info, fallback=False)
                yield cap
        else:
            only = sessions[wanted[0]]
            with fallback_capture(model, only):
                cap = Capture(sessions, info, fallback=True)
                yield cap
        for session in sessions.values():
            _rollback(session)
            session.closed = True
        if store is not None:  # the last pass goes to the store now, not when first read
            only = sessions[wanted[0]]
            for seg in only.segments:
                _finish(only, seg)
            _flush(only, everything=True)
    finally:
        for h in hooks:
            h.remove()
        for session in sessions.values():
            _rollback(session)
            session.closed = True
            session.forward = None
        _CAPTURING.difference_update(module_ids)
        if claim is not None:
            claim.release()


def _per_stack(value: Any, name: str, stacks: dict[str, Any]) -> dict[str, Any]:
    """A layers/heads/queries argument as ``{stack: selection}``: one selection for every
    stack, or a dict naming stacks (the stacks it leaves out are not captured)."""
    if not isinstance(value, dict):
        sel = _selection(value, name)
        return dict.fromkeys(stacks, sel)
    unknown = [k for k in value if k not in stacks]
    if unknown:
        raise CaptureError(
            f"{name}= names the stack {_show(unknown[0])}, which this model does not have; its "
            f"stacks are {', '.join(stacks)}"
        )
    return {k: _selection(v, name) for k, v in value.items()}


def _remember_source(source: _Session) -> Callable[..., None]:
    """The encoder's pre-hook where only cross attention is captured: its tokens label keys."""

    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids, _ = _tokens_of(args, kwargs)
        source.segments = [_Segment()]
        source.inputs.append({"input_ids": ids, "attention_mask": kwargs.get("attention_mask")})

    return pre_hook


_CAPTURING: set[int] = set()  # ids of the modules of models inside a capture block


def _stream_target(stream_to: Any, what: str) -> Path:
    """Check ``stream_to=`` before any work: a new ``.zarr`` path in a writable place (and
    dask, which appends streamed rows to the store without reading them into memory)."""
    if not isinstance(stream_to, (str, os.PathLike)) or isinstance(stream_to, bytes):
        raise CaptureError(
            f"stream_to={_show(stream_to)} is {_kind(stream_to)}; pass a path (str or "
            "pathlib.Path) ending in .zarr"
        )
    path = Path(stream_to).expanduser()
    if path.suffix != ".zarr":
        raise CaptureError(f"stream_to= must be a .zarr store path, got {str(stream_to)!r}")
    if path.exists():
        raise CaptureError(
            f"{str(stream_to)!r} already exists; choose a new store (attncoda never appends a "
            "capture to an unrelated store)"
        )
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise CaptureError(
            f"stream_to={str(stream_to)!r} cannot be created: {str(parent)!r} is not a writable "
            "folder; choose a path in one"
        )
    if what != "summaries" and importlib.util.find_spec("dask") is None:
        raise CaptureError(
            "stream_to= with rows needs dask to append them without reading them into memory; "
            "pip install 'attncoda[distributed]', or capture what='summaries'"
        )
    return path


class _StreamClaim:
    """The first capture streaming to a new store owns it for its whole block: an exclusive
    ``fcntl.flock`` on a lock file named by the store's real path (in the system's temporary
    folder), taken before the model
    runs and released (the file removed) when the block ends. A second capture given the same
    ``stream_to=`` is refused at setup, instead of both appending into one store. The lock is
    the kernel's: a killed capture leaves no claim (its file is taken over by the next one)."""

    def __init__(self, store: Path) -> None:
        # the store's folder is made now, before the model runs: its first append would fail
        # there after the first pass (the parent was checked writable by _stream_target)
        store.parent.mkdir(parents=True, exist_ok=True)
        # the lock file lives in the system's temporary folder, named by the store's real path:
        # a capture killed mid-pass (SIGTERM ends it before any cleanup) leaves nothing in the
        # user's folder, and the next capture takes the file over (the lock is the kernel's)
        key = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:24]
        self.path = Path(tempfile.gettempdir()) / f"attncoda-stream-{key}.lock"
        self.fh: Any = open(self.path, "a+b")  # held for the block
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no claim
            return
        try:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            self.fh = None
            raise CaptureError(
                f"another capture is streaming to {str(store)!r}; give this one its own "
                "stream_to= (or, to add to that store once it is done, ac.save(ds, path, "
                "append=True))"
            ) from None
        if store.exists():  # a capture that finished before this claim wrote it
            self.release()
            raise CaptureError(
                f"{str(store)!r} already exists; choose a new store (attncoda never appends a "
                "capture to an unrelated store)"
            )

    def release(self) -> None:
        if self.fh is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.fh.close()  # closing drops the lock
        self.fh = None


def _claim_stream(store: Path) -> _StreamClaim:
    return _StreamClaim(store)


def _tokens_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, int | None]:
    """``(input_ids or None, number of new tokens or None)`` of a model call."""
    ids = kwargs.get("input_ids", args[0] if args and torch.is_tensor(args[0]) else None)
    if torch.is_tensor(ids) and ids.is_floating_point():  # audio features or pixels: no ids
        return None, None
    if torch.is_tensor(ids) and ids.dim() >= 1:
        return ids, int(ids.shape[-1])
    embeds = kwargs.get("inputs_embeds")
    if torch.is_tensor(embeds) and embeds.dim() >= 2:
        return ids, int(embeds.shape[-2])
    return ids, None


def _check_not_empty(args: tuple[Any, ...], kwargs: dict[str, Any], tokens: int | None) -> None:
    """Refuse a forward pass of no samples or no tokens before the model runs (the model would
    fail deep inside, or give a dataset without rows)."""
    given = kwargs.get("input_ids", args[0] if args and torch.is_tensor(args[0]) else None)
    if not torch.is_tensor(given):
        given = kwargs.get("inputs_embeds")
    if torch.is_tensor(given) and given.dim() >= 1 and (tokens == 0 or given.shape[0] == 0):
        raise CaptureError(
            f"the forward pass got an empty batch (input of shape {tuple(given.shape)}); give "
            "at least one sample of at least one token"
        )


def _before_forward(session: _Session) -> Callable[..., None]:
    """The model's forward pre-hook: segments, and every check that can run before the work."""

    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _rollback(session)  # an earlier pass raised inside the block and was caught
        ids, tokens = _tokens_of(args, kwargs)
        _check_not_empty(args, kwargs, tokens)
        past = next(
            (kwargs[n] for n in ("cache", "past_key_values") if kwargs.get(n) is not None), None
        )  # renamed in transformers 5
        past_len = (
            (int(past.get_seq_length()) if hasattr(past, "get_seq_length") else None)
            if past is not None
            else 0
        )
        continued = bool(past_len)
        current = session.current()
        if not continued and (current.keys or current.records):
            _finish(session, current)  # the previous pass is over: did it see every position?
            session.segments.append(_Segment(number=current.number + 1))
            if session.store is not None:
                _flush(session, everything=False)
        am = kwargs.get("attention_mask")
        cross = session.stack == "cross"
        if not continued and tokens is not None:  # the layers will find it validated
            key = (tokens, tokens, True, past is not None)
            if key not in session.positions:
                session.positions[key] = _check_call(session.spec, *key)
            if not cross:  # a cross-attention sink is a source position (checked per call)
                _check_padding_sinks(session.spec, am, tokens)
                _check_sink_token(session, ids, am)
        session.ordinal = 0
        seg = session.current()
        session.pending = _Snapshot(
            seg,
            len(seg.records),
            len(seg.inputs),
            len(seg.query_ids),
            dict(seg.calls),
            set(seg.keys),
            seg.sink_index,
            seg.rows_buf,
        )
        session.forward = _Forward(
            independent=not continued, cache_given=past is not None, past=past_len, tokens=tokens
        )
        if cross:  # keys are the encoder's positions: its tokens and its padding
            seg.query_ids.append(ids)
            if not continued:
                src = session.source.inputs[-1] if session.source and session.source.inputs else {}
                am = kwargs.get("encoder_attention_mask", src.get("attention_mask"))
                session.inputs.append({"input_ids": src.get("input_ids"), "attention_mask": am})
        else:
            session.inputs.append({"input_ids": ids, "attention_mask": am})
        if session.sink_index is None and am is not None and am.dim() == 2:
            session.sink_index = am.to(torch.int8).argmax(-1)

    return pre_hook


def _output_head(model: Any) -> Any:
    """The model's output head (``lm_head``) as a module, or ``None`` where it has none."""
    get = getattr(model, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None
    return head if isinstance(head, torch.nn.Module) else None


def _before_head(session: _Session) -> Callable[..., None]:
    """The output head's forward pre-hook: the pass's rows are written, and every layer's
    temporaries freed; give the free heap back before the logits are allocated on top."""

    def pre_hook(module: Any, args: Any) -> None:
        buf = session.segments[-1].rows_buf if session.segments else None
        if buf is not None:
            buf.release_if_due()

    return pre_hook


def _after_forward(session: _Session) -> Callable[..., None]:
    def post_hook(module: Any, args: Any, output: Any) -> None:
        session.pending = None  # the pass returned: its records stay
        session.forward = None

    return post_hook


def _check_sink_token(session: _Session, ids: Any, mask: Any) -> None:
    """Warn once per capture when sink='first' lands on an ordinary token (tokenizer given)."""
    if (
        session.tokenizer is None
        or session.sink_warned
        or session.spec.sink != "first"
        or not torch.is_tensor(ids)
        or ids.dim() != 2
    ):
        return
    ids_np = ids.detach().cpu().numpy()
    if torch.is_tensor(mask) and mask.dim() == 2 and tuple(mask.shape) == tuple(ids.shape):
        first = mask.detach().cpu().to(torch.int8).argmax(-1).numpy()
    else:
        first = np.zeros(ids_np.shape[0], np.int64)
    session.sink_warned = warn_if_sink_not_special(
        session.tokenizer, session.special_ids, ids_np, first, stacklevel=_caller_level()
    )


def _caller_level() -> int:
    """The stacklevel of the first frame outside torch, transformers and attncoda.hooks (the
    user's ``model(...)`` or ``generate(...)`` line), for warnings given inside a forward."""
    files = (getattr(sys.modules.get(n), "__file__", None) for n in ("torch", "transformers"))
    skip = tuple(str(Path(f).parent) for f in (*files, __file__) if f)
    # frame 1 is the caller (_check_sink_token), stacklevel 2 of the warning function it calls
    frame: Any = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


def _check_padding_sinks(spec: CaptureSpec, mask: Any, tokens: int) -> None:
    """Fixed sinks must be real tokens of every sample, not padding (checked per pass)."""
    fixed = _fixed_sinks(spec)
    if fixed is None or not torch.is_tensor(mask) or mask.dim() != 2 or mask.shape[1] != tokens:
        return
    valid = mask[:, list(fixed)].bool()
    if bool(valid.all()):
        return
    sample, which = (int(i) for i in (~valid).nonzero()[0])
    row = mask[sample].bool()
    first = int(row.to(torch.int8).argmax()) if bool(row.any()) else None
    raise CaptureError(
        f"sink={_show_sel(spec.sink)}: key {fixed[which]} is padding in sample {sample} (its first "
        f"real token is at {first}); fixed sinks must be real tokens of every sample, so pass "
        "sink='first' under padding"
    )
