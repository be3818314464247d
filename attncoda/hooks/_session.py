"""The state of one capture block, shared by both capture paths (registered attention and the
eager fallback): the records of each forward pass, the per-call position checks, the sink keys,
and the per-row reductions of fp32 logits into summaries.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import attncoda as ac

from ._spec import CaptureError, CaptureSpec, _fixed_sinks, _show, _show_sel

NONFINITE_ATTENTION = (
    "the model gave NaN or infinite attention logits (NaN weights or inputs, or activations "
    "that overflowed, e.g. in float16); nothing was stored: check the weights with "
    "torch.isfinite, or capture a float32 or bfloat16 copy of the model"
)


def check_finite_rows(bad: torch.Tensor) -> None:
    """Refuse a forward pass whose attention rows hold NaN or +inf (``bad`` marks such rows)."""
    if bool(bad.any()):
        raise CaptureError(NONFINITE_ATTENTION)


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
    bad = torch.isnan(lse_s) | (lse_s == math.inf)
    n_s = sink_vis.sum(-1)
    sum_s = torch.where(sink_vis, logits, 0.0).sum(-1)
    del sink_logits
    # content channel, on logits shifted by their maximum: the entropy is then
    # log(sum e) - sum e (l - m) / sum e, two non-negative terms, so no cancellation even where
    # logits are in the thousands (lse_c - sum e l / sum e lost 1e-4 nats to fp32 rounding there)
    logits.masked_fill_(~content, -math.inf)
    m_c = logits.amax(-1, keepdim=True)
    # a NaN or +inf logit at a visible key makes its row's maximum (or the sink's log-sum-exp)
    # NaN or +inf: refused, so that a NaN row is never stored (it would read as padding)
    check_finite_rows(bad | torch.isnan(m_c[..., 0]) | (m_c[..., 0] == math.inf))
    m_c = torch.where(torch.isfinite(m_c), m_c, torch.zeros_like(m_c))
    logits.sub_(m_c)
    e = logits.exp()
    logits.masked_fill_(~content, 0.0)
    z_c = e.sum(-1)
    el = torch.linalg.vecdot(e, logits)  # sum e (l - m): <= 0
    sum_c_shifted = logits.sum(-1)
    del e
    n_c = content.sum(-1).to(logits.dtype)
    log_z = torch.log(z_c)
    lse_c = m_c[..., 0] + log_z
    h_c = torch.where(n_c > 0, log_z - el / z_c, torch.full_like(z_c, math.nan))
    logodds = lse_s - lse_c  # +inf without content, -inf without a visible sink
    log_s = -torch.nn.functional.softplus(-logodds)
    log_1ms = -torch.nn.functional.softplus(logodds)
    share = torch.exp(log_s)
    hb = ac.binary_entropy_from_logs(log_s, log_1ms)
    entropy = hb + torch.exp(log_1ms) * torch.nan_to_num(h_c, nan=0.0)
    n_sf = n_s.to(logits.dtype)
    ok = (n_c > 0) & (n_sf > 0)
    safe_c = torch.where(ok, n_c, torch.ones_like(n_c))
    safe_s = torch.where(ok, n_sf, torch.ones_like(n_sf))
    mean_s = sum_s / safe_s - m_c[..., 0]  # the means of the sink and content logits, both
    mean_c = sum_c_shifted / safe_c  # shifted by the content maximum
    balance = torch.sqrt(safe_s * safe_c / (safe_s + safe_c)) * (mean_s - mean_c)
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


@dataclass
class _Record:
    layer: int
    call: int
    query_pos: np.ndarray  # positions of the captured queries in the kv sequence
    kv_len: int
    summaries: dict[str, np.ndarray] | None  # (batch, heads, queries)
    rows: np.ndarray | None  # (batch, heads, queries, kv); None when in the segment's buffer
    learned_sink_rows: np.ndarray | None = None  # (batch, heads, queries)
    in_buffer: bool = False  # the rows lie in the segment's rows buffer (its first call)


# (queries, keys, independent forward, cache object given): what decides a call's positions
_CallKey = tuple[int, int, bool, bool]


@dataclass
class _Segment:
    """One independent forward pass, continued by cached generate() steps (appended on query)."""

    number: int = 0  # 0, 1, ...: the independent forward passes of the block, in order
    records: list[_Record] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # layer -> calls so far
    inputs: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    sink_index: torch.Tensor | None = None  # (batch,)
    keys: set[_CallKey] = field(default_factory=set)  # the calls captured layers saw
    rows_buf: Any = None  # the pass's rows (a _RowsBuffer), written once where they stay
    query_ids: list[torch.Tensor | None] = field(default_factory=list)  # cross: decoder ids


@dataclass
class _Forward:
    """What the model's forward pre-hook learnt about the forward pass now running."""

    independent: bool  # not continuing a cache that holds earlier positions
    cache_given: bool  # a cache object was passed: later cached steps may continue this pass
    past: int | None  # positions already in the cache (None: unknown)
    tokens: int | None = None  # input positions the pass was given (None: unknown)
    layers: set[int] = field(default_factory=set)  # layers whose attention ran in this pass


@dataclass
class _Snapshot:
    """A segment's state before a forward pass, to drop what a failed pass left behind."""

    segment: _Segment
    records: int
    inputs: int
    query_ids: int
    calls: dict[int, int]
    keys: set[_CallKey]
    sink_index: torch.Tensor | None
    rows_buf: Any = None


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
    info: dict[str, Any] = field(default_factory=dict)  # provenance attributes
    fallback: bool = False
    generation: int = 0  # bumped whenever the captured data changes
    closed: bool = False  # the capture block has ended
    forward: _Forward | None = None  # the model's forward pass now running
    pending: _Snapshot | None = None  # set while a forward runs; cleared when it returns
    positions: dict[_CallKey, list[int]] = field(default_factory=dict)  # validated calls
    tokenizer: Any = None  # decodes token ids into the ``token`` coordinate
    special_ids: set[int] = field(default_factory=set)  # sinks that need no warning
    sink_warned: bool = False  # SinkTokenWarning is given once per capture
    head_hooked: bool = False  # the output head releases the free heap before the logits
    stack: str = "self"  # which attention of the model: self, encoder, decoder or cross
    ordinal: int = 0  # calls of a shared-layer stack so far in the pass (the next layer)
    shared: bool = False  # one module serves several layers (ALBERT): layers by call order
    source: _Session | None = None  # cross attention: the encoder's session (its tokens)
    probed: set[int] = field(default_factory=set)  # layers checked against eager weights

    def current(self) -> _Segment:
        if not self.segments:
            self.segments.append(_Segment())
        return self.segments[-1]

    def add(self, record: _Record) -> None:
        self.current().records.append(record)
        self.generation += 1

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


def check_call_shape(
    session: _Session, module: Any, layer: int, n_heads: int, q_len: int, kv_len: int
) -> None:
    """Refuse, at a layer's call, the attention attncoda could not label: more or fewer heads
    than the config says (ConvBERT's reduced heads), a layer whose attention runs twice in one
    pass (differential attention), or positions the model adds to the input's (CPM-Ant's
    prompt tokens)."""
    name = f"{type(module).__name__} (layer {layer}{stack_note(session)})"
    if n_heads != session.n_heads:
        raise CaptureError(
            f"{name} attends with {n_heads} heads where the model's config gives "
            f"{session.n_heads}, so attncoda cannot label its heads (please report the model class)"
        )
    fwd = session.forward
    if fwd is None:
        return
    if not session.shared and layer in fwd.layers:
        raise CaptureError(
            f"{name} computed attention twice in one forward pass (e.g. differential "
            "attention, two softmaxes a layer); attncoda captures one softmax per layer and "
            "cannot say which is the layer's"
        )
    fwd.layers.add(layer)
    if (  # the fallback reads weights alone (the registered path also sees plug-ins' keys)
        session.fallback
        and session.stack != "cross"
        and fwd.tokens is not None
        and fwd.past == 0
        and q_len == kv_len
        and kv_len != fwd.tokens
    ):
        raise CaptureError(
            f"{name} attends over {kv_len} positions for {fwd.tokens} input tokens: the model "
            "adds positions of its own (prompt or memory tokens), which attncoda cannot label"
        )


def stack_note(session: _Session) -> str:
    """`` of the cross attention`` (etc.) for a message about a layer of a named stack."""
    return "" if session.stack == "self" else f" of the {session.stack} attention"


def _call_positions(session: _Session, layer: int, q_len: int, kv_len: int) -> list[int]:
    """Captured query positions (in kv coordinates) of one layer call; validated once per call.

    The checks run the first time a (queries, keys) shape is seen, i.e. once per forward pass
    (the model's pre-hook usually did them before any layer ran), never per layer or chunk.
    """
    fwd = session.forward
    if fwd is None:  # a layer called outside the model's own forward (e.g. its inner model)
        fwd = _Forward(independent=q_len == kv_len, cache_given=q_len != kv_len, past=None)
    if fwd.past is not None and kv_len != fwd.past + q_len:
        raise CaptureError(
            f"layer {layer} holds {kv_len} keys for {fwd.past + q_len} positions (a static or "
            "sliding-window KV cache), so captured positions would be wrong; capture one forward "
            "over the whole sequence, or only layers whose cache keeps every position"
        )
    key = (q_len, kv_len, fwd.independent, fwd.cache_given)
    positions = session.positions.get(key)
    if positions is None:
        positions = _check_call(session.spec, *key)
        session.positions[key] = positions
    session.current().keys.add(key)
    return positions


def _check_call(
    spec: CaptureSpec, q_len: int, kv_len: int, independent: bool, cache_given: bool
) -> list[int]:
    """Validate the spec against one call of ``q_len`` queries over ``kv_len`` keys.

    Returns the captured positions among the call's queries (the last ``q_len`` of the
    ``kv_len`` positions). Raises when a fixed sink is not a key of the call, a query value lies
    outside ``[-kv_len, kv_len)`` (never wrapped), or, for a forward that no cached step can
    continue (no cache object given), a requested position or slice does not occur in it.
    """
    fixed = _fixed_sinks(spec)
    if fixed is not None and max(fixed) >= kv_len:
        beyond = [s for s in fixed if s >= kv_len]
        raise CaptureError(
            f"sink={_show_sel(spec.sink)}: key position(s) {_show(beyond)} do not exist in a "
            f"forward call over {kv_len} keys (0..{kv_len - 1}); pass sink positions below {kv_len}"
        )
    first = kv_len - q_len
    if spec.queries is None:
        return list(range(first, kv_len))
    if isinstance(spec.queries, slice):
        out = [p for p in sorted(set(range(kv_len)[spec.queries])) if p >= first]
        if not out and independent and not cache_given:
            raise CaptureError(
                f"queries={_show_sel(spec.queries)} selects no position of a forward pass of "
                f"{kv_len} tokens (0..{kv_len - 1}); pass a slice that selects some"
            )
        return out
    low = [q for q in spec.queries if q < -kv_len]
    if low:
        listed = ", ".join(map(str, low[:8])) + (" ..." if len(low) > 8 else "")
        raise CaptureError(
            f"queries={_show_sel(spec.queries)}: {listed} lie(s) outside "
            f"{-kv_len}..{kv_len - 1} for a forward call of {kv_len} tokens (negative positions "
            f"count from the end and are never wrapped); pass positions in {-kv_len}..{kv_len - 1}"
        )
    high = [q for q in spec.queries if q >= kv_len]
    if high and not cache_given:
        raise CaptureError(
            f"queries={_show_sel(spec.queries)}: position(s) {_show(high)} do not exist in a "
            f"forward pass of {kv_len} tokens (0..{kv_len - 1}); pass positions below {kv_len}, "
            "or a KV cache (as generate() does) to capture positions of later cached steps"
        )
    resolved = [q + kv_len if q < 0 else q for q in spec.queries if q < kv_len]
    if independent and len(set(resolved)) < len(resolved):
        counts = Counter(resolved)
        twice = sorted(p for p, c in counts.items() if c > 1)
        names = [q for q in spec.queries if q < kv_len and (q + kv_len if q < 0 else q) in twice]
        raise CaptureError(
            f"queries={_show_sel(spec.queries)}: {_show(names)} all name position(s) "
            f"{_show(twice)} in a forward pass of {kv_len} tokens; name each position once"
        )
    return sorted({p for p in resolved if p >= first})


def _finish(session: _Session, seg: _Segment) -> None:
    """Refuse a forward pass (with its cached steps) that missed requested query positions."""
    if not seg.keys:
        return
    spec = session.spec
    seen: set[int] = set()
    for key in seg.keys:
        seen.update(session.positions[key])
    tokens = max(key[1] for key in seg.keys)
    if isinstance(spec.queries, tuple):
        missing = sorted({q for q in spec.queries if q >= 0} - seen)
        if missing:
            raise CaptureError(
                f"queries={_show_sel(spec.queries)}: position(s) {_show(missing)} never "
                f"occurred in forward pass {seg.number} of the block (it reached {tokens} "
                f"tokens); pass positions below {tokens}, or generate further"
            )
    if not seen:
        raise CaptureError(
            f"queries={_show_sel(spec.queries)} selected no position of forward pass "
            f"{seg.number} of the block ({tokens} tokens); pass queries that occur in every "
            "forward pass"
        )


def _rollback(session: _Session) -> None:
    """Drop what a forward pass that started but never returned left in the session."""
    snap = session.pending
    if snap is None:
        return
    session.pending = None
    seg = snap.segment
    del seg.records[snap.records :]
    del seg.inputs[snap.inputs :]
    del seg.query_ids[snap.query_ids :]
    seg.calls = snap.calls
    seg.keys = snap.keys
    seg.sink_index = snap.sink_index
    if seg.rows_buf is not snap.rows_buf and seg.rows_buf is not None:
        seg.rows_buf.discard()
    seg.rows_buf = snap.rows_buf
    session.generation += 1


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
