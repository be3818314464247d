"""Capture attention rows, or per-row summaries, from any HuggingFace model without giving up SDPA.

One attention function is registered with transformers under the neutral name ``"attncoda"``
(plus the matching mask function). Inside :func:`capture` the model is switched to it; every
layer's output is computed by the implementation the model had before (SDPA by default, or the
model's own eager function), so the model's outputs do not change. For the layers, heads and
queries asked for, fp32 logits are recomputed from the model's own q and k, chunk by chunk over
queries and only over the keys that can be visible, and reduced at once to what was asked for:

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

import dataclasses
import hashlib
import json
import math
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import xarray as xr

import attncoda
from attncoda import EXIT_USAGE, AttncodaError
from attncoda._array import namespace
from attncoda._data import SUMMARY_VARIABLES, load, make_dataset, save
from attncoda._decompose import _binary_from_logs

from ._registry import ATTENTION_NAME, can_switch, observed, visible_mask

__all__ = [
    "ATTENTION_NAME",
    "Capture",
    "CaptureError",
    "CaptureSpec",
    "capture",
]


What = Literal["summaries", "rows", "both"]
SinkChoice = Literal["first", "learned"] | int | Sequence[int]


class CaptureError(AttncodaError, RuntimeError):
    """A capture cannot be set up, or would return nothing."""

    exit_code: ClassVar[int] = EXIT_USAGE


# --------------------------------------------------------------------------------------------
# the capture specification


def _selection(value: Any, name: str) -> tuple[int, ...] | slice | None:
    if value is None or value == "all":
        return None
    if isinstance(value, slice):
        return value
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    try:
        items = tuple(int(v) for v in value)
    except TypeError as exc:
        raise CaptureError(
            f"{name}= must be None/'all', an int, a slice or a list of ints, got {value!r}"
        ) from exc
    if not items:
        raise CaptureError(f"{name}= is empty; nothing would be captured")
    return items


def _resolve(sel: tuple[int, ...] | slice | None, n: int, name: str) -> list[int]:
    if sel is None:
        return list(range(n))
    if isinstance(sel, slice):
        return list(range(n))[sel]
    out = []
    for i in sel:
        if not -n <= i < n:
            raise CaptureError(f"{name} index {i} is out of range: the model has {n} {name}s")
        out.append(i % n)
    return sorted(set(out))


@dataclass(frozen=True)
class CaptureSpec:
    """What to capture. Serialised as JSON into the dataset's ``capture_spec`` attribute.

    Parameters
    ----------
    layers, heads, queries
        ``None`` (all), an int, a list of ints or a slice. ``queries`` are token positions;
        negative values count from the end of each forward call (``-1`` is the last token).
    what : {"summaries", "rows", "both"}
    sink : "first", "learned", int or list of ints
        ``"first"``: the first valid key of each sample (BOS, or the first token without BOS,
        the first non-padding token under left padding). ``"learned"``: the learned sink logit
        of GPT-OSS style models, added back as an extra part. An int or list: fixed key
        positions.
    chunk_size : int
        Query rows per chunk when recomputing logits (memory ~ chunk x keys x heads x 4 bytes).
    """

    layers: tuple[int, ...] | slice | None = None
    heads: tuple[int, ...] | slice | None = None
    queries: tuple[int, ...] | slice | None = None
    what: What = "summaries"
    sink: Any = "first"
    chunk_size: int = 256

    def to_json(self) -> str:
        def enc(v: Any) -> Any:
            if isinstance(v, slice):
                return {"slice": [v.start, v.stop, v.step]}
            if isinstance(v, tuple):
                return list(v)
            return v

        return json.dumps({f.name: enc(getattr(self, f.name)) for f in dataclasses.fields(self)})


# --------------------------------------------------------------------------------------------
# per-row reductions (fp32, chunked)


def _summaries_from_logits(
    logits: torch.Tensor, visible: torch.Tensor, sink: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Sink/content summaries of rows of fp32 logits; works in place on ``logits``.

    ``visible`` marks visible keys, ``sink`` the sink keys (a subset, broadcastable). Uses the
    grouping rule so the full-row softmax is never formed: only content logits are exponentiated.
    """
    sink_vis = sink & visible
    content = visible & ~sink_vis
    neg_inf = torch.tensor(-math.inf, dtype=logits.dtype, device=logits.device)
    # sink channel: log-sum-exp over (usually one) sink key(s)
    sink_logits = torch.where(sink_vis, logits, neg_inf)
    lse_s = torch.logsumexp(sink_logits, dim=-1)
    n_s = sink_vis.sum(-1)
    sum_s = torch.where(sink_vis, logits, 0.0).sum(-1)
    del sink_logits
    # content channel
    logits.masked_fill_(~content, -math.inf)
    m_c = logits.amax(-1, keepdim=True)
    m_c = torch.where(torch.isfinite(m_c), m_c, torch.zeros_like(m_c))
    e = (logits - m_c).exp_()
    logits.masked_fill_(~content, 0.0)
    z_c = e.sum(-1)
    el = torch.linalg.vecdot(e, logits)
    sum_c = logits.sum(-1)
    del e
    n_c = content.sum(-1).to(logits.dtype)
    lse_c = m_c[..., 0] + torch.log(z_c)
    h_c = torch.where(n_c > 0, lse_c - el / z_c, torch.full_like(z_c, math.nan))
    logodds = lse_s - lse_c  # +inf without content, -inf without a visible sink
    log_s = -torch.nn.functional.softplus(-logodds)
    log_1ms = -torch.nn.functional.softplus(logodds)
    share = torch.exp(log_s)
    hb = binary_entropy_from_logs(log_s, log_1ms)
    entropy = hb + torch.exp(log_1ms) * torch.nan_to_num(h_c, nan=0.0)
    n_sf = n_s.to(logits.dtype)
    ok = (n_c > 0) & (n_sf > 0)
    safe_c = torch.where(ok, n_c, torch.ones_like(n_c))
    safe_s = torch.where(ok, n_sf, torch.ones_like(n_sf))
    balance = torch.sqrt(safe_s * safe_c / (safe_s + safe_c)) * (sum_s / safe_s - sum_c / safe_c)
    balance = torch.where(ok, balance, torch.full_like(balance, math.nan))
    empty = ~visible.any(-1).expand_as(share)  # padding queries: no row at all
    nan = torch.full_like(share, math.nan)
    out = {
        "sink_share": share,
        "sink_logodds": logodds,
        "balance": balance,
        "entropy": entropy,
        "content_entropy": h_c,
    }
    return {k: torch.where(empty, nan, v) for k, v in out.items()}


def binary_entropy_from_logs(log_s: torch.Tensor, log_1ms: torch.Tensor) -> torch.Tensor:
    """``H_b(s)`` from ``log s`` and ``log(1 - s)``: the core's definition (0 log 0 = 0)."""
    return _binary_from_logs(namespace(log_s), log_s, log_1ms)


# --------------------------------------------------------------------------------------------
# the session: collects records from the attention function


@dataclass
class _Record:
    layer: int
    call: int
    query_pos: np.ndarray  # positions of the captured queries in the kv sequence
    kv_len: int
    summaries: dict[str, np.ndarray] | None  # (batch, heads, queries)
    rows: np.ndarray | None  # (batch, heads, queries, kv)
    learned_sink_rows: np.ndarray | None = None  # (batch, heads, queries)


@dataclass
class _Segment:
    """One independent forward pass, continued by cached generate() steps (appended on query)."""

    records: list[_Record] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # layer -> calls so far
    inputs: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    sink_index: torch.Tensor | None = None  # (batch,)


@dataclass
class _Session:
    model: Any
    spec: CaptureSpec
    layers: list[int]
    heads: list[int]
    n_heads: int
    segments: list[_Segment] = field(default_factory=list)
    layer_of: dict[int, int] = field(default_factory=dict)  # id(module) -> layer (fallback)
    store: Any = None  # a zarr path to stream finished segments to

    def current(self) -> _Segment:
        if not self.segments:
            self.segments.append(_Segment())
        return self.segments[-1]

    @property
    def records(self) -> list[_Record]:
        return self.current().records

    @property
    def calls(self) -> dict[int, int]:
        return self.current().calls

    @property
    def inputs(self) -> list[dict[str, torch.Tensor | None]]:
        return self.current().inputs

    @property
    def sink_index(self) -> torch.Tensor | None:
        return self.current().sink_index

    @sink_index.setter
    def sink_index(self, value: torch.Tensor | None) -> None:
        self.current().sink_index = value


def _query_positions(spec: CaptureSpec, q_len: int, kv_len: int) -> list[int]:
    """Captured query positions (in kv coordinates) among this call's queries."""
    offset = kv_len - q_len
    all_pos = list(range(offset, kv_len))
    if spec.queries is None:
        return all_pos
    if isinstance(spec.queries, slice):
        return [p for p in all_pos if p in set(range(kv_len)[spec.queries])]
    wanted = {q % kv_len if q < 0 else q for q in spec.queries}
    return [p for p in all_pos if p in wanted]


def _capture_layer(
    session: _Session,
    module: Any,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    kwargs: dict[str, Any],
) -> None:
    spec = session.spec
    call = session.calls.get(layer, 0)
    session.calls[layer] = call + 1
    batch, n_heads, q_len, head_dim = query.shape
    kv_len = key.shape[-2]
    positions = _query_positions(spec, q_len, kv_len)
    if not positions:
        return
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
        causal=bool(getattr(module, "is_causal", True)),
        sinks_logit=(
            module.sinks.detach().float()[session.heads] if spec.sink == "learned" else None
        ),
        sink_index=_sink_index(session, spec, attention_mask, batch, kv_len, q_len, query.device),
    )
    pos = torch.tensor(positions, device=query.device)
    if spec.what == "summaries" and _fast_path_applies(spec, ctx):
        summaries, redo = _fast_summaries(ctx, pos, spec.chunk_size)
        if bool(redo.any()):
            fixed, _, _ = _explicit(spec, ctx, pos[redo])
            for name, val in fixed.items():
                summaries[name][..., redo] = val
        result = {k: v.cpu().numpy() for k, v in summaries.items()}
        rows = learned = None
    else:
        summ, rows_t, learned_t = _explicit(spec, ctx, pos)
        result = {k: v.cpu().numpy() for k, v in summ.items()}
        rows = rows_t.numpy() if rows_t is not None else None
        learned = learned_t.numpy() if learned_t is not None else None
    session.records.append(
        _Record(
            layer=layer,
            call=call,
            query_pos=np.asarray(positions),
            kv_len=kv_len,
            summaries=result or None,
            rows=rows,
            learned_sink_rows=learned,
        )
    )


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
    cancellation). Fused kernels want the same head size for queries, keys and values, so q and k
    get two zero columns (the logits do not change). Then ``lse_c = z_s - log(s / (1 - s))`` and
    the content entropy is ``lse_c - scale * q . sum_c p_k k_k / (1 - s)``. Rows where this is
    ill-conditioned (sink not visible, ``s`` or ``1 - s`` below 1e-30, padding queries) are
    returned in ``redo`` for the explicit path.
    """
    q, k = ctx.q, ctx.k
    b, h, kv, d = k.shape
    qsel = q.index_select(2, pos - ctx.offset)
    nq = len(pos)
    bidx = torch.arange(b, device=q.device)
    k_sink = k[bidx, :, ctx.sink_index]  # (b, h, d)
    pad = torch.nn.functional.pad
    values = pad(k, (0, 2))
    values[..., d + 1] = 1.0
    values[bidx, :, ctx.sink_index] = 0.0
    values[bidx, :, ctx.sink_index, d] = 1.0
    all_queries = (
        nq == kv and ctx.offset == 0 and bool((pos == torch.arange(kv, device=pos.device)).all())
    )
    f = torch.nn.functional.scaled_dot_product_attention
    if ctx.mask is None and (not ctx.causal or all_queries):
        kwargs: dict[str, Any] = {"is_causal": ctx.causal}
        vis_rows = None
    else:
        vis_rows, _ = ctx.visible(pos, kv)
        kwargs = {"attn_mask": vis_rows}
    fused = f(pad(qsel, (0, 2)), pad(k, (0, 2)), values, scale=ctx.scale, **kwargs)
    del values
    out_a, s, c = fused[..., :d], fused[..., d], fused[..., d + 1]
    z_s = ctx.scale * torch.einsum("bhqd,bhd->bhq", qsel, k_sink)
    # sums of visible keys for the balance, by prefix sums (causal) or a masked matmul
    if vis_rows is None:
        if ctx.causal:
            csum = k.cumsum(dim=2).index_select(2, pos)
            count = (pos + 1).to(k.dtype).expand(b, h, nq)
            sink_vis = torch.ones(b, 1, nq, dtype=torch.bool, device=k.device)
        else:
            csum = k.sum(dim=2, keepdim=True).expand(b, h, nq, d)
            count = torch.full((b, h, nq), float(kv), device=k.device)
            sink_vis = torch.ones(b, 1, nq, dtype=torch.bool, device=k.device)
    else:
        # chunked so that no float copy of the query x key mask is ever formed
        sums, counts = [], []
        for i in range(0, nq, chunk):
            vf = vis_rows[:, :, i : i + chunk].to(k.dtype)
            sums.append(vf @ k)
            counts.append(vf.sum(-1))
        csum = torch.cat(sums, dim=2)
        count = torch.cat(counts, dim=-1).expand(b, h, nq)
        sink_vis = vis_rows.expand(b, -1, -1, -1)[bidx, :, :, ctx.sink_index]  # (b, 1, nq)
    sink_vis = sink_vis.expand(b, h, nq)
    content_sum = csum - k_sink[:, :, None, :] * sink_vis[..., None].to(k.dtype)
    n_c = count - sink_vis.to(k.dtype)
    tiny = 1e-30
    redo = (~sink_vis) | (s <= tiny) | (c <= tiny) | (n_c < 1) | ~torch.isfinite(s)
    logodds = torch.log(s) - torch.log(c)
    lse_c = z_s - logodds
    mean_pl = ctx.scale * torch.einsum("bhqd,bhqd->bhq", qsel, out_a) / c
    h_c = lse_c - mean_pl
    log_s = -torch.nn.functional.softplus(-logodds)
    log_1ms = -torch.nn.functional.softplus(logodds)
    entropy = binary_entropy_from_logs(log_s, log_1ms) + c * h_c
    safe_nc = n_c.clamp_min(1.0)
    mean_c = ctx.scale * torch.einsum("bhqd,bhqd->bhq", qsel, content_sum) / safe_nc
    balance = torch.sqrt(safe_nc / (safe_nc + 1)) * (z_s - mean_c)
    out = {
        "sink_share": s,
        "sink_logodds": logodds,
        "balance": balance,
        "entropy": entropy,
        "content_entropy": h_c,
    }
    return out, redo.any(dim=(0, 1))


def _explicit(
    spec: CaptureSpec, ctx: _LayerContext, pos: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
    """Chunked fp32 logits over the keys that can be visible; summaries and/or rows."""
    q, k = ctx.q, ctx.k
    b, h, kv, _ = k.shape
    kt = k.transpose(-1, -2)
    learned = ctx.sinks_logit is not None
    summaries: dict[str, list[torch.Tensor]] = {}
    rows: list[torch.Tensor] = []
    learned_rows: list[torch.Tensor] = []
    for start in range(0, len(pos), spec.chunk_size):
        qp = pos[start : start + spec.chunk_size]
        visible_len = int(qp.max()) + 1 if ctx.causal and not _has_future_keys(ctx.mask) else kv
        qc = q.index_select(2, qp - ctx.offset)
        logits = torch.matmul(qc, kt[..., :visible_len]).mul_(ctx.scale)
        if ctx.softcap is not None:
            logits.div_(ctx.softcap).tanh_().mul_(ctx.softcap)
        vis, bias = ctx.visible(qp, visible_len)
        if bias is not None:
            logits.add_(bias)
        vis = vis.expand(b, h, len(qp), visible_len)
        logits.masked_fill_(~vis, -math.inf)
        if learned:
            assert ctx.sinks_logit is not None
            extra = ctx.sinks_logit.view(1, -1, 1, 1).expand(b, -1, len(qp), 1)
            logits = torch.cat([extra, logits], dim=-1)
            vis = torch.cat([torch.ones_like(vis[..., :1]), vis], dim=-1)
            sink_mask = torch.zeros_like(vis)
            sink_mask[..., 0] = True
        else:
            sink_mask = _sink_mask(spec, ctx.sink_index, visible_len, q.device)
        if spec.what in ("rows", "both"):
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            # query rows with no visible key (padding queries) stay all -inf, not NaN
            logp = torch.where(torch.isfinite(lse), logits - lse, -math.inf)
            if learned:
                learned_rows.append(logp[..., 0].cpu())
                logp = logp[..., 1:]
            full = torch.full((b, h, len(qp), kv), -math.inf, device=q.device)
            full[..., : logp.shape[-1]] = logp
            rows.append(full.cpu())
        if spec.what in ("summaries", "both"):
            work = logits if spec.what == "summaries" else logits.clone()
            for name, val in _summaries_from_logits(work, vis, sink_mask).items():
                summaries.setdefault(name, []).append(val)
        del logits
    return (
        {k_: torch.cat(v, dim=-1) for k_, v in summaries.items()},
        torch.cat(rows, dim=2) if rows else None,
        torch.cat(learned_rows, dim=2) if learned_rows else None,
    )


def _has_future_keys(mask: torch.Tensor | None) -> bool:
    """A float custom mask may make keys after the query visible (e.g. ARACH hubs)."""
    return mask is not None and mask.dtype != torch.bool


def _sink_index(
    session: _Session,
    spec: CaptureSpec,
    attention_mask: torch.Tensor | None,
    batch: int,
    kv_len: int,
    q_len: int,
    device: torch.device,
) -> torch.Tensor:
    """First valid key per sample, taken once per capture from the model inputs or the mask."""
    if session.sink_index is not None and len(session.sink_index) == batch:
        return session.sink_index.to(device)
    first: torch.Tensor | None = None
    recorded = session.inputs[-1].get("attention_mask") if session.inputs else None
    if recorded is not None and recorded.dim() == 2:  # a custom 4-D mask is not per-token
        first = recorded.to(torch.int8).argmax(-1)
    elif attention_mask is not None:
        vis = (
            attention_mask
            if attention_mask.dtype == torch.bool
            else (attention_mask > torch.finfo(attention_mask.dtype).min / 2)
        )
        first = vis[:, 0].any(dim=-2).to(torch.int8).argmax(-1)
    if first is None:
        first = torch.zeros(batch, dtype=torch.long, device=device)
    if len(first) != batch:
        first = first.expand(batch)
    session.sink_index = first.to(device)
    return session.sink_index


def _sink_mask(
    spec: CaptureSpec, sink_index: torch.Tensor, kv_len: int, device: torch.device
) -> torch.Tensor:
    keys = torch.arange(kv_len, device=device)
    if spec.sink == "first":
        return (keys[None, :] == sink_index[:, None])[:, None, None, :]
    fixed = [spec.sink] if isinstance(spec.sink, int) else list(spec.sink)
    return torch.isin(keys, torch.tensor(fixed, device=device))[None, None, None, :]


# --------------------------------------------------------------------------------------------
# registration


class Capture:
    """Handle returned by :func:`capture`; ``cap.dataset`` holds the result after the block."""

    def __init__(self, session: _Session, model_info: dict[str, Any], fallback: bool) -> None:
        self._session = session
        self._info = model_info
        self.fallback = fallback
        self._dataset: xr.Dataset | None = None

    @property
    def dataset(self) -> xr.Dataset:
        """The captured data as an :class:`xarray.Dataset` (schema: :mod:`attncoda`'s data model).

        With ``stream_to=`` the dataset is opened lazily from the zarr store.
        """
        if self._dataset is None:
            s = self._session
            if s.store is not None:
                _flush(s, self._info, fallback=self.fallback)
                if not Path(s.store).exists():
                    raise CaptureError(_NOTHING)
                self._dataset = load(s.store)
            else:
                segments = [seg for seg in s.segments if seg.records]
                if not segments:
                    raise CaptureError(_NOTHING)
                self._dataset = _combine(
                    [_assemble(s, seg, self._info, fallback=self.fallback) for seg in segments]
                )
        return self._dataset


_NOTHING = (
    "the capture recorded nothing: no forward pass ran inside the block, or the selected "
    "layers/queries were never computed (check layers=, queries=)"
)


def _flush(s: _Session, info: dict[str, Any], *, fallback: bool) -> None:
    """Append finished segments to the zarr store and drop them from memory."""
    for seg in s.segments:
        if seg.records:
            save(_assemble(s, seg, info, fallback=fallback), s.store, append=True)
            seg.records.clear()
    del s.segments[:-1]


def _combine(parts: list[xr.Dataset]) -> xr.Dataset:
    """Independent forward passes become samples; differing lengths are padded (NaN / -inf)."""
    if len(parts) == 1:
        return parts[0]
    if not all("token_id" in p.coords for p in parts):
        parts = [p.drop_vars("token_id", errors="ignore") for p in parts]
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


_FILL = {"log_attn": -np.inf, "learned_sink_log_attn": -np.inf, "token_id": -1, "sink_index": 0}


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
    rows = None
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
        if recs[0].rows is not None:
            parts = []
            for r in recs:
                assert r.rows is not None
                pad = np.full((*r.rows.shape[:-1], kv_max - r.rows.shape[-1]), -np.inf, np.float32)
                parts.append(np.concatenate([r.rows, pad], axis=-1))
            val = np.concatenate(parts, axis=2)
            if rows is None:
                rows = np.empty((val.shape[0], len(layers), *val.shape[1:]), np.float32)
            rows[:, li] = val
        if recs[0].learned_sink_rows is not None:
            val = np.concatenate(
                [r.learned_sink_rows for r in recs if r.learned_sink_rows is not None], axis=-1
            )
            if learned is None:
                learned = np.empty((val.shape[0], len(layers), *val.shape[1:]), np.float32)
            learned[:, li] = val
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
    return make_dataset(
        summaries=summaries or None,
        log_attn=rows,
        learned_sink_log_attn=learned,
        layers=layers,
        heads=s.heads,
        query_positions=query_pos,
        n_keys=kv_max,
        token_ids=_tokens(seg, kv_max),
        sink_index=sink_index,
        attrs=attrs,
    )


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


def _model_info(model: Any) -> dict[str, Any]:
    config = getattr(model, "config", None)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    return {
        "model_id": str(getattr(config, "_name_or_path", "") or type(model).__name__),
        "family": str(getattr(config, "model_type", "")),
        "dtype": str(dtype).replace("torch.", ""),
        "weights_sha256": weights_sha256(model),
        "attncoda_version": attncoda.__version__,
        "transformers_version": _version("transformers"),
        "torch_version": str(torch.__version__),
    }


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
    folder = Path(str(getattr(getattr(model, "config", None), "_name_or_path", "") or "."))
    manifest = folder / "manifest.json"
    digest = ""
    if folder.is_dir() and manifest.is_file():
        files = json.loads(manifest.read_text()).get("files", [])
        digest = next((f["sha256"] for f in files if f.get("path") == "model.safetensors"), "")
    if not digest:
        h = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        digest = "state_dict:" + h.hexdigest()
    _WEIGHTS_SHA[model] = digest
    return digest


def _version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:  # pragma: no cover
        return ""


def _n_layers_heads(model: Any) -> tuple[int, int]:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    n_heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    if n_layers is None or n_heads is None:
        raise CaptureError(
            f"cannot read the number of layers/heads from {type(config).__name__}; this model "
            "family is not supported yet"
        )
    return int(n_layers), int(n_heads)


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
) -> Iterator[Capture]:
    """Capture attention of a HuggingFace model during the ``with`` block.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any model; it is not reloaded. Its attention implementation is switched to
        ``"attncoda"`` inside the block and restored afterwards, also after an exception.
    layers, heads, queries : None, int, list of int or slice
        Which layers, heads and query positions to capture (default: all). Layers not captured
        run exactly as before (SDPA by default).
    what : {"summaries", "rows", "both"}, default "summaries"
        Per-row sink/content summaries (O(T) memory per head) or fp32 log-attention rows.
    sink : "first", "learned", int or list of int, default "first"
        Which key(s) form the sink (see :class:`CaptureSpec`).
    chunk_size : int, default 256
        Query rows recomputed at once.
    stream_to : path-like, optional
        A ``.zarr`` store: each finished forward pass is appended to it along ``sample`` and
        dropped from memory (for long runs over many batches; every batch must have the same
        length). ``cap.dataset`` then opens the store lazily.

    Yields
    ------
    Capture
        ``cap.dataset`` is an :class:`xarray.Dataset` with dims
        ``sample, layer, head, query(, key)``.

    Examples
    --------
    >>> from attncoda.hooks import capture, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> batch = zoo.tiny_batch(model, length=8)
    >>> with capture(model, layers=[0], what="summaries") as cap:
    ...     _ = model(**batch)
    >>> sorted(cap.dataset.sizes.items())
    [('head', 4), ('layer', 1), ('position', 8), ('query', 8), ('sample', 2)]
    """
    if what not in ("summaries", "rows", "both"):
        raise CaptureError(f"what= must be 'summaries', 'rows' or 'both', got {what!r}")
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise CaptureError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not (
        sink in ("first", "learned")
        or isinstance(sink, int)
        or (isinstance(sink, (list, tuple)) and sink and all(isinstance(i, int) for i in sink))
    ):
        raise CaptureError(
            f"sink= must be 'first', 'learned', an int or a list of ints, got {sink!r}"
        )
    if id(model) in _CAPTURING:
        raise CaptureError("captures of one model cannot be nested; finish the outer capture first")
    n_layers, n_heads = _n_layers_heads(model)
    spec = CaptureSpec(
        layers=_selection(layers, "layers"),
        heads=_selection(heads, "heads"),
        queries=_selection(queries, "queries"),
        what=what,
        sink=tuple(sink) if isinstance(sink, list) else sink,
        chunk_size=chunk_size,
    )
    layer_list = _resolve(spec.layers, n_layers, "layer")
    head_list = _resolve(spec.heads, n_heads, "head")
    if not layer_list or not head_list:
        raise CaptureError("the layer/head selection is empty; nothing would be captured")
    info = _model_info(model)
    info["attention_implementation"] = str(model.config._attn_implementation)
    session = _Session(model, spec, layer_list, head_list, n_heads)
    if stream_to is not None:
        if Path(stream_to).suffix != ".zarr":
            raise CaptureError(f"stream_to= must be a .zarr store path, got {str(stream_to)!r}")
        if Path(stream_to).exists():
            raise CaptureError(
                f"{str(stream_to)!r} already exists; choose a new store (attncoda never appends a "
                "capture to an unrelated store)"
            )
        session.store = Path(stream_to)

    def observe(
        module: Any,
        layer: int,
        query: Any,
        key: Any,
        mask: Any,
        scaling: Any,
        kwargs: dict[str, Any],
    ) -> None:
        if layer in session.layers:
            _capture_layer(session, module, layer, query, key, mask, scaling, kwargs)

    _CAPTURING.add(id(model))
    hook = model.register_forward_pre_hook(
        _record_inputs(session, info, not can_switch(model)), with_kwargs=True
    )
    try:
        if can_switch(model):
            with observed(model, observe):
                yield Capture(session, info, fallback=False)
        else:
            from ._fallback import fallback_capture

            with fallback_capture(model, session):
                yield Capture(session, info, fallback=True)
    finally:
        hook.remove()
        _CAPTURING.discard(id(model))


_CAPTURING: set[int] = set()  # ids of models inside a capture block


def _record_inputs(session: _Session, info: dict[str, Any], fallback: bool) -> Callable[..., None]:
    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args and torch.is_tensor(args[0]) else None)
        past = kwargs.get("cache", kwargs.get("past_key_values"))  # renamed in transformers 5
        continued = (
            past is not None and hasattr(past, "get_seq_length") and past.get_seq_length() > 0
        )
        if not continued and session.segments and session.current().records:
            session.segments.append(_Segment())
            if session.store is not None:
                _flush(session, info, fallback=fallback)
        am = kwargs.get("attention_mask")
        session.inputs.append({"input_ids": ids, "attention_mask": am})
        if session.sink_index is None and am is not None and am.dim() == 2:
            session.sink_index = am.to(torch.int8).argmax(-1)

    return pre_hook
