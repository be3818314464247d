r"""The sink/content decomposition of attention rows and the identities it guarantees.

A row ``x`` over its visible keys is split into ordered groups: by default the *sink* (the first
visible key) and the *content* (the rest). With sink share :math:`s`, :math:`n` content parts
``c``, their geometric mean :math:`g(c)` and the content subcomposition :math:`\hat c = C(c)`:

- sink log-odds :math:`\log(s / (1 - s))`;
- balance :math:`b = \sqrt{n/(n+1)}\,\log(s / g(c))` (the first pivot ilr coordinate);
- :math:`d_A^2(x, y) = (b_x - b_y)^2 + d_A^2(\hat c_x, \hat c_y)` for rows over the same keys;
- :math:`H(x) = H_b(s) + (1 - s) H(\hat c)`, and for ``m`` groups with shares ``p``:
  :math:`H(x) = H(p) + \sum_g p_g H(\hat x_g)`;
- :math:`\hat c` does not depend on the sink logit.

Several sink keys are allowed (``sink=[0, 1]`` or a boolean array); the sink channel then also
carries the spread *within* the sinks. Entropies are in nats.

The entropies themselves are in :mod:`attncoda._entropy`, m groups in :mod:`attncoda._groups`,
the split distance in :mod:`attncoda._aitchison_split` and the attribution of an entropy change
in :mod:`attncoda._entropy_change`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import (
    DEGENERATE_HINT,
    Array,
    Degenerate,
    LogComposition,
    Spec,
    _as_numpy,
    all_finite,
    as_bool,
    broadcast_mask,
    by_row_blocks,
    by_rows_into,
    can_overwrite,
    check_degenerate,
    device_of,
    exp_into,
    is_tensor,
    labelled,
    log_composition,
    parts_last,
    require_integer_sink,
    row_sums,
    sum_where,
    too_few_parts,
)
from ._entropy import _binary_from_logs
from ._errors import (
    ShapeMismatchError,
    TooFewPartsError,
)

__all__ = [
    "SinkContent",
    "decompose",
]


SinkSpec = int | Sequence[int] | Array | None


# --------------------------------------------------------------------------------------------
# sink / content


@dataclass(frozen=True)
class SinkContent:
    """Per-row sink/content decomposition (see :func:`decompose`). Arrays drop the parts axis.

    Attributes
    ----------
    sink_share : Array
        ``s``, attention mass on the sink key(s).
    sink_logodds : Array
        ``log(s / (1 - s))``; ``+inf`` for a row whose only visible key is the sink.
    balance : Array
        ``sqrt(n_s n_c / (n_s + n_c)) * (mean log sink - mean log content)``; for one sink,
        ``sqrt(n/(n+1)) log(s / g(c))``.
    content : Array
        The closed content subcomposition, with the input's shape: 0 at sink and invisible keys.
    entropy : Array
        Entropy of the whole row, ``H(x)``.
    content_entropy : Array
        ``H(c / (1 - s))``.
    sink_entropy : Array
        Entropy within the sink keys (0 for a single sink).
    binary_entropy : Array
        ``H_b(s)``.
    n_content : Array
        Number of visible content keys.
    """

    sink_share: Array
    sink_logodds: Array
    balance: Array
    content: Array
    entropy: Array
    content_entropy: Array
    sink_entropy: Array
    binary_entropy: Array
    n_content: Array


def _sink_mask(
    lc: LogComposition, sink: SinkSpec, validate: bool, allow_missing: bool = False
) -> Array:
    """Boolean (last-axis) array of sink parts, a subset of the visible parts.

    ``allow_missing``: rows whose sink key is invisible (a sliding window that moved past it)
    are allowed; they have no sink part.
    """
    xp = lc.xp
    vis = lc.visible_full()
    n = lc.n_parts
    positions = xp.arange(n, device=device_of(lc.log))
    if sink is None:
        first = xp.argmax(xp.astype(vis, xp.int8), axis=-1, keepdims=True)
        return (positions == first) & vis
    spec: Any = sink if is_tensor(sink) else _as_numpy(sink, "sink")
    kind = str(spec.dtype).replace("torch.", "")
    if spec.ndim == 0 and kind == "bool":
        raise ShapeMismatchError(
            f"sink={sink!r} is not a key index; give an integer index, a list of them, or a "
            "boolean array marking the sink keys"
        )
    if kind == "bool":
        s = as_bool(spec, xp, lc.log, what="sink")
        if s.ndim == lc.log.ndim:
            s = xp.moveaxis(s, lc.axis, -1)
        s = broadcast_mask(s, tuple(lc.log.shape), lc.axis, xp, what="sink")
    else:
        if int(np.prod(spec.shape)) == 0:
            raise TooFewPartsError("sink= names no key; give at least one index")
        require_integer_sink(spec, sink)
        if spec.ndim > 1:
            raise ShapeMismatchError(
                f"sink must be an integer key index, a 1-d list of them, or a boolean array "
                f"marking the sink keys (per row), got {sink!r}"
            )
        idx = [int(i) for i in spec.reshape(-1).tolist()]
        bad = [i for i in idx if not -n <= i < n]
        if bad:
            raise ShapeMismatchError(f"sink index {bad} out of range for rows of {n} parts")
        idx_t = xp.asarray([i % n for i in idx], device=device_of(lc.log))
        s = xp.any(positions[:, None] == idx_t[None, :], axis=-1)
        s = xp.broadcast_to(s, tuple(lc.log.shape))
    if validate and not allow_missing and bool(xp.any(s & ~vis)):
        raise ShapeMismatchError(
            "a sink key is invisible in some rows (e.g. index 0 under left padding); use "
            "sink=None for the first visible key of each row"
        )
    s = s & vis
    if not allow_missing and bool(xp.any(~xp.any(s, axis=-1))):
        raise TooFewPartsError(
            "some rows have no visible sink key (e.g. a sliding window moved past it); drop "
            f"those rows, {DEGENERATE_HINT} (their sink share is then 0)"
        )
    return s


def _masked_mean(xp: Any, log: Array, keep: Array, count: Array) -> Array:
    total = xp.sum(xp.where(keep, log, xp.zeros_like(log)), axis=-1)
    return total / xp.where(count > 0, count, xp.ones_like(count))


def _channel(xp: Any, log: Array, keep: Array) -> tuple[Array, Array, Array]:
    """One channel of each row, the parts in ``keep``: its log-sum-exp, its closed composition
    (0 outside ``keep``) and that composition's entropy, from one exponential.

    Shifted by the channel's own maximum ``m``: ``e = exp(log - m)`` sums to ``t`` in ``[1, n]``,
    so a channel far below the other (content under a dominant sink) keeps its precision; the
    composition is ``e / t``, the log-sum-exp ``m + log t`` and the entropy ``log t - sum c w``
    (``w = log - m <= 0``: two non-negative terms, no cancellation). A row without a part in
    ``keep`` gets ``-inf``, zeros and 0.
    """
    w = xp.where(keep, log, xp.full_like(log, -math.inf))
    m = _row_max(xp, w)
    m = xp.where(m > -math.inf, m, xp.zeros_like(m))
    numpy = isinstance(w, np.ndarray)
    w = np.subtract(w, m, out=w) if numpy else w - m
    e = _exp(xp, w, None)
    total = xp.sum(e, axis=-1, keepdims=True)
    has = total > 0
    safe = xp.where(has, total, xp.ones_like(total))
    comp = np.divide(e, safe, out=e) if numpy else e / safe
    log_t = xp.log(safe)
    # c w is 0 x (-inf) outside ``keep`` and at a zero part: those terms are 0. ``w`` is made
    # finite there before the product (the double ``where``): the masked branch's gradient
    # (0 x -inf = NaN) would otherwise leak into every part's gradient through autograd
    finite = w > -math.inf
    w_safe = xp.where(finite, w, xp.zeros_like(w))
    cw = xp.where(finite, comp * w_safe, xp.zeros_like(w))
    entropy = log_t[..., 0] - xp.sum(cw, axis=-1)
    lse = xp.where(has[..., 0], log_t[..., 0] + m[..., 0], xp.full_like(entropy, -math.inf))
    return lse, comp, entropy


@labelled(Spec(parts=("x", "mask", "sink")))
def decompose(
    x: Array,
    sink: SinkSpec = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> SinkContent:
    """Split each row into its sink channel and its content channel.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Compositions (strictly positive over visible keys; any scale) or logits with
        ``from_logits=True``.
    sink : int, sequence of int, or bool array, optional
        The sink key(s). Default: the first visible key of each row (BOS, or under left padding
        the first valid token). A boolean array broadcastable to ``x`` marks sinks per row.
    axis : int, default -1
    validate : bool, default True
    mask : array_like of bool, optional
        Visible keys.
    from_logits : bool, default False
    degenerate : {"raise", "nan"}, default "raise"
        Rows whose only visible keys are sinks (the first query of a causal model) have no
        content: raise :class:`TooFewPartsError`, or return NaN for the content quantities
        (and ``+inf`` log-odds, share 1). With ``"nan"``, rows whose sink key is invisible (a
        sliding window past it) have sink share 0, log-odds ``-inf`` and a NaN balance, and
        rows with no visible key at all are NaN throughout.

    Returns
    -------
    SinkContent

    Raises
    ------
    TooFewPartsError
        With ``degenerate="raise"``: a row has no visible content key (or no visible key), or
        no visible sink key; ``sink`` is an empty list.
    ShapeMismatchError
        ``sink`` is not an integer index, a 1-d list of them or a boolean array (bools, floats
        and strings are refused), an index is out of range (negative indices count from the
        end), a boolean ``sink`` does not broadcast to ``x``, or (with ``validate``) a sink key
        is invisible.
    CompositionError
        ``degenerate`` is neither ``"raise"`` nor ``"nan"``.
    ZeroPartError, NegativePartError, NonFiniteError
        With ``validate``: as in :func:`attncoda.clr`.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> d = ac.decompose([0.7, 0.2, 0.1])
    >>> round(float(d.sink_share), 6), d.content.round(3).tolist()
    (0.7, [0.0, 0.667, 0.333])
    >>> h = ac.binary_entropy(d.sink_share) + (1 - d.sink_share) * d.content_entropy
    >>> bool(np.isclose(h, d.entropy))
    True
    """
    check_degenerate(degenerate)
    # large inputs go through blocks of rows (temporaries in cache, no full-size ones to fault
    # in), with a boolean sink or mask array too: each block gets its rows of them
    row_args = {
        name: arr
        for name, arr in (("sink", sink), ("mask", mask))
        if isinstance(arr, np.ndarray) and arr.dtype == np.bool_ and arr.ndim >= 1
    }
    index_sink = sink is None or isinstance(sink, (int, np.integer, list, tuple))
    if (mask is None or "mask" in row_args) and (index_sink or "sink" in row_args):
        blocks = by_row_blocks(
            _decompose,
            x,
            axis,
            out_field="content",
            row_args=row_args,
            **({} if "sink" in row_args else {"sink": sink}),
            validate=validate,
            from_logits=from_logits,
            degenerate=degenerate,
        )
        if blocks is not None:
            return blocks
    return _decompose(
        x, sink, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate
    )


def _decompose(
    x: Array,
    sink: SinkSpec = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
    content_out: np.ndarray | None = None,
) -> SinkContent:
    """:func:`decompose` in one go; ``content_out`` may receive the content (fused path)."""
    probs = None
    if mask is None and not from_logits:
        # keep the (float, parts-last) probabilities: the fused path can use them directly
        _, probs, _, ax = parts_last(x, axis, None, others=(sink,))
        lc = log_composition(probs, -1, validate=validate)
        lc.axis = ax
    else:
        lc = log_composition(
            x, axis, mask=mask, from_logits=from_logits, validate=validate, others=(sink,)
        )
    if _is_first_part(sink) and (validate or from_logits):
        # the common case (one sink, the first visible key) has a fused path
        fast = _decompose_first_sink(lc, sink, degenerate, probs, content_out)
        if fast is not None:
            return fast
    xp = lc.xp
    vis = lc.visible_full()
    s_mask = _sink_mask(lc, sink, validate, allow_missing=degenerate == "nan")
    c_mask = vis & ~s_mask
    dtype = lc.log.dtype
    n_s = xp.sum(xp.astype(s_mask, dtype), axis=-1)
    n_c = xp.sum(xp.astype(c_mask, dtype), axis=-1)
    no_sink = n_s == 0
    empty = n_c == 0
    no_key = empty & no_sink
    if bool(xp.any(empty)) and degenerate == "raise":
        if bool(xp.any(no_key)):
            raise too_few_parts(int(xp.sum(xp.astype(no_key, xp.int64))), 1)
        raise TooFewPartsError(
            f"{int(xp.sum(xp.astype(empty, xp.int64)))} row(s) have no visible content key (only "
            "the sink is visible, as for the first query of a causal model); drop those rows "
            f"(select queries >= 1), {DEGENERATE_HINT}"
        )

    # each channel from one exponential; the shares from the two channels' log-sum-exps and the
    # entropy by the grouping rule H = H_b(s) + s H(sink) + (1 - s) H(content), as in the
    # first-sink path (rows without any visible key: NaN, set below)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse_s, _, h_sink = _channel(xp, lc.log, s_mask)
        lse_c, content, h_content = _channel(xp, lc.log, c_mask)
        lse_all = xp.logaddexp(lse_s, lse_c)
        log_s = lse_s - lse_all
        log_1ms = lse_c - lse_all
        h_binary = _binary_from_logs(xp, log_s, log_1ms)
        h_total = h_binary + xp.exp(log_s) * h_sink + xp.exp(log_1ms) * h_content

    mean_s = _masked_mean(xp, lc.log, s_mask, n_s)
    mean_c = _masked_mean(xp, lc.log, c_mask, n_c)
    safe_nc = xp.where(empty, xp.ones_like(n_c), n_c)
    balance = xp.sqrt(n_s * safe_nc / (n_s + safe_nc)) * (mean_s - mean_c)
    empty = empty | no_sink  # the balance needs both channels
    nan = xp.full_like(balance, math.nan)

    def defined(values: Array) -> Array:  # NaN for rows without any visible key
        return xp.where(no_key, nan, values)

    with np.errstate(invalid="ignore"):
        return SinkContent(
            sink_share=xp.exp(log_s),
            sink_logodds=log_s - log_1ms,
            balance=xp.where(empty, nan, balance),
            content=lc.restore(content),
            entropy=defined(h_total),
            content_entropy=xp.where(n_c == 0, nan, h_content),
            sink_entropy=defined(h_sink),
            binary_entropy=defined(h_binary),
            n_content=n_c,
        )


def _is_first_part(sink: SinkSpec) -> bool:
    """Whether ``sink`` names the default sink (part 0) of rows whose parts are all visible."""
    if sink is None:
        return True
    return isinstance(sink, (int, np.integer)) and not isinstance(sink, bool) and int(sink) == 0


def _row_max(xp: Any, a: Array) -> Array:
    """Max over the last axis (keepdims) of finite values (numpy's ``fmax`` reduction is several
    times faster than ``max``, which also tracks NaN)."""
    if isinstance(a, np.ndarray):
        return np.fmax.reduce(a, axis=-1, keepdims=True)
    return xp.max(a, axis=-1, keepdims=True)


def _by_rows(name: str, x: Array, by: Array, out: Array | None, is_np: bool) -> Array:
    """``x - by`` (``name`` ``"subtract"``) or ``x / by`` (``"divide"``), ``by`` one value a
    row (keepdims), into ``out`` (``x`` itself, another array, or ``None``: a new one); numpy
    through :func:`by_rows_into`'s faster kernels, torch through its own."""
    if is_np:
        return by_rows_into(name, x, by, out)
    import torch

    op = torch.sub if name == "subtract" else torch.div
    return op(x, by) if out is None else op(x, by, out=out)


def _first_true(xp: Any, a: Array) -> Array:
    """Index (keepdims) of the first True along the last axis."""
    if isinstance(a, np.ndarray):
        return np.argmax(a, axis=-1, keepdims=True)
    return xp.argmax(xp.astype(a, xp.uint8), axis=-1, keepdims=True)


def _exp(xp: Any, a: Array, out: np.ndarray | None) -> Array:
    """``exp(a)``, into ``out`` when given (numpy; through torch's kernel, see :func:`exp_into`)."""
    if isinstance(a, np.ndarray):
        return exp_into(a, out)
    return xp.exp(a)


def _content_exp(xp: Any, w: Array, out: np.ndarray | None) -> tuple[Array, Array]:
    """``exp(w)`` with the sink part (first) zeroed, and its row sums."""
    with np.errstate(over="ignore"):  # the sink part may overflow: it is zeroed
        e = _exp(xp, w, out)
    e[..., 0] = 0.0
    return e, row_sums(xp, e)[..., 0]


def _decompose_first_sink(
    lc: LogComposition,
    sink: SinkSpec,
    degenerate: str,
    probs: Array | None = None,
    content_out: np.ndarray | None = None,
) -> SinkContent | None:
    """:func:`decompose` with one sink, the first visible key, in a few fused passes.

    Applies when every row has a sink and at least one content key (otherwise returns ``None``
    before touching anything, and the general path handles the degenerate rows). Working on
    ``w``, the log parts with the sink set to ``-inf`` and shifted by the content maximum:
    ``e = exp(w)`` is the content up to its sum ``s_c`` (in ``[1, n]``, so nothing under- or
    overflows), ``c = e / s_c``, ``H(c) = -sum c (w - log s_c)``, the shares come from
    ``logaddexp`` of the two channels' logs, and ``H = H_b(s) + (1 - s) H(c)`` (the grouping
    rule). ``w`` is ``lc.log`` itself when that is a temporary we own, updated in place; the
    caller's arrays are never written, and tensors that autograd tracks take the general path.
    ``probs`` (probabilities with every part visible, parts last) spares the exponentials: the
    content is then ``x / sum(x content)`` directly, when that sum is a normal number.
    ``content_out`` (numpy, parts last, the input's shape and dtype) receives the content.
    """
    xp = lc.xp
    log = lc.log
    is_np = isinstance(log, np.ndarray)
    if not is_np and bool(getattr(log, "requires_grad", False)):
        return None
    if content_out is not None and (
        not is_np or content_out.shape != log.shape or content_out.dtype != log.dtype
    ):
        content_out = None
    vis = lc.visible
    own = lc.owned and can_overwrite(log)
    if vis is None:
        if lc.n_parts < 2 or lc.rowsum is None:
            return None
        n_c: Any = float(lc.n_parts - 1)
        l0 = xp.asarray(log[..., 0], copy=True) if own else log[..., 0]
        sum_c = lc.rowsum[..., 0] - l0
    else:
        counts = xp.sum(vis, axis=-1)
        if not bool(xp.all(counts >= 2)):
            return None
        if sink is not None and not bool(xp.all(vis[..., 0])):
            return None
        idx = _first_true(xp, vis)
        l0 = xp.take_along_axis(log, idx, axis=-1)[..., 0]
        sum_c = sum_where(xp, log, vis) - l0
        n_c = xp.astype(counts - 1, log.dtype)
    direct = probs is not None and vis is None and own
    if direct:
        assert probs is not None
        s_c = row_sums(xp, probs[..., 1:])[..., 0]
        with np.errstate(divide="ignore"):
            log_sc = xp.log(s_c)
        tiny = float(np.finfo(np.float32 if "float32" in str(s_c.dtype) else np.float64).tiny)
        direct = all_finite(xp, log_sc) and bool(xp.all(s_c >= tiny))
    check_degenerate(degenerate)

    # from here on, temporaries are updated in place (no fallback past this point)
    if direct:
        assert probs is not None
        l0s = l0
        e = xp.empty_like(probs) if content_out is None else content_out
        # whole rows, then the sink's part set: a pass over contiguous rows costs less than
        # one over the strided content columns
        _by_rows("divide", probs, s_c[..., None], e, is_np)
        e[..., 0] = 0.0
        w = log  # ours: log x on the content (shifted to log c below); 0 * (finite) at the sink
    elif vis is None:
        # shift by the content mean, known from the row sums (no pass for a maximum): the
        # largest content part then has exp(w) >= 1, so the content sum cannot underflow
        m_c = (sum_c / n_c)[..., None]
        w = _by_rows("subtract", log, m_c, log if own else None, is_np)
        e, s_c = _content_exp(xp, w, content_out)
        if not all_finite(xp, s_c):
            # a content spread beyond the floating range (~700 nats in float64, ~85 in
            # float32): shift by the content maximum instead
            if own:  # ``log`` was shifted in place
                top = _row_max(xp, w[..., 1:])
                w -= top
                m_c = m_c + top
            else:
                m_c = _row_max(xp, log[..., 1:])
                w = log - m_c
            e, s_c = _content_exp(xp, w, content_out)
        # ``w`` stays finite at the sink unless the logits span more than the floating range
        # (then it is cleared like an invisible key)
        clamp = not all_finite(xp, w[..., 0])
        if clamp:
            w[..., 0] = -math.inf
    else:
        w = log if own else xp.asarray(log, copy=True)
        if is_np:
            np.put_along_axis(w, idx, -math.inf, axis=-1)
        else:
            w.scatter_(-1, idx, -math.inf)
        m_c = _row_max(xp, w)
        w -= m_c
        clamp = True  # invisible keys hold -inf
        e = _exp(xp, w, content_out)  # 0 at the sink and at invisible keys
        s_c = xp.sum(e, axis=-1)
    if not direct:
        l0s = l0 - m_c[..., 0]  # sink log relative to the shift
        log_sc = xp.log(s_c)
        _by_rows("divide", e, s_c[..., None], e, is_np)  # the content subcomposition
        if clamp:  # log c = w - log s_c: clamp -inf (where c = 0) so that 0 * log c = 0
            if is_np:
                np.maximum(w, np.finfo(w.dtype).min, out=w)
            else:
                import torch

                w.clamp_(min=torch.finfo(w.dtype).min)
    _by_rows("subtract", w, log_sc[..., None], w, is_np)  # log c = w - log s_c
    # H(c) = -sum c log c, from log c itself: log s_c - sum c w (a pass fewer) sums terms far
    # larger than H where the content is peaked, 4-6x the error in float32
    if is_np:
        h_content = -np.einsum("...i,...i->...", e, w)
    else:
        w *= e
        h_content = -xp.sum(w, axis=-1)
    log_total = xp.logaddexp(l0s, log_sc)
    log_s = l0s - log_total
    log_1ms = log_sc - log_total
    if isinstance(n_c, float):
        balance = math.sqrt(n_c / (n_c + 1)) * (l0 - sum_c / n_c)
        n_content = xp.full_like(balance, n_c)
    else:
        balance = xp.sqrt(n_c / (n_c + 1)) * (l0 - sum_c / n_c)
        n_content = n_c
    share = xp.exp(log_s)
    rest = xp.exp(log_1ms)
    h_binary = -(share * log_s + rest * log_1ms)  # both logs are finite here
    return SinkContent(
        sink_share=share,
        sink_logodds=log_s - log_1ms,
        balance=balance,
        content=lc.restore(e),
        entropy=h_binary + rest * h_content,
        content_entropy=h_content,
        sink_entropy=xp.zeros_like(balance),
        binary_entropy=h_binary,
        n_content=n_content,
    )
