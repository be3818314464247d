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
    as_float,
    broadcast_mask,
    broadcast_pair,
    by_row_blocks,
    can_overwrite,
    check_degenerate,
    check_finite_values,
    device_of,
    first_tensor,
    is_tensor,
    labelled,
    log_composition,
    logsumexp,
    namespace,
    nan_rows,
    parts_last,
    sum_where,
    to_kind,
    tolerance,
    too_few_parts,
)
from ._bases import _index_groups
from ._errors import (
    CompositionError,
    NegativePartError,
    NotClosedError,
    ShapeMismatchError,
    TooFewPartsError,
)
from ._pairwise import gram_distances, gram_distances_nan

__all__ = [
    "AitchisonSplit",
    "EntropyChange",
    "GroupDecomposition",
    "GroupedEntropyChange",
    "SinkContent",
    "aitchison_split",
    "attribute_entropy_change",
    "attribute_grouped_entropy_change",
    "binary_entropy",
    "binary_entropy_from_logs",
    "decompose",
    "entropy",
    "entropy_change",
    "group_decompose",
    "pairwise_aitchison_split",
]

SinkSpec = int | Sequence[int] | Array | None


# --------------------------------------------------------------------------------------------
# entropy


def _neg_plogp(xp: Any, logp: Array) -> Array:
    """``-p log p`` with ``0 log 0 = 0`` (``logp = -inf``)."""
    finite = logp > -math.inf
    safe = xp.where(finite, logp, xp.zeros_like(logp))
    return xp.where(finite, -xp.exp(safe) * safe, xp.zeros_like(safe))


@labelled(Spec())
def entropy(
    x: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    """Shannon entropy (nats) of each row over its visible parts.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Probability rows (zeros allowed; rows must sum to one over visible parts) or, with
        ``from_logits=True``, logits / log-probabilities with ``-inf`` at invisible keys.
    axis : int, default -1
    validate : bool, default True
        Check non-negativity, finiteness and closure (:class:`NotClosedError`).
    mask : array_like of bool, optional
    from_logits : bool, default False
    degenerate : {"raise", "nan"}, default "raise"
        Rows without any visible part: raise, or NaN there (a one-part row has entropy 0); the
        policy of :func:`attncoda.clr`.

    Returns
    -------
    Array with the parts axis removed.

    Raises
    ------
    NotClosedError
        With ``validate``: probability rows do not sum to one over their visible parts (close
        them with :func:`closure`, or add a learned sink back with :func:`add_learned_sink`).
    NonFiniteError, NegativePartError, ZeroPartError, TooFewPartsError
        With ``validate``: NaN/infinite or negative parts, or a row without any visible part.
    CompositionError, ShapeMismatchError
        Bad dtypes, ``axis`` or ``mask`` (see :func:`closure`).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> bool(np.isclose(ac.entropy([0.25, 0.25, 0.25, 0.25]), np.log(4)))
    True
    >>> bool(np.isclose(ac.entropy([0.0, 0.0], from_logits=True), np.log(2)))
    True
    """
    lc = log_composition(
        x,
        axis,
        mask=mask,
        from_logits=from_logits,
        validate=validate,
        allow_zeros=True,
        require_closed=not from_logits,
    )
    low = lc.degenerate_rows(1, degenerate, validate)
    with np.errstate(invalid="ignore"):  # rows without any part: NaN, as asked
        h = lc.xp.sum(_neg_plogp(lc.xp, lc.log_closed()), axis=-1)
    return h if low is None else nan_rows(lc.xp, h, low[..., 0])


@labelled(Spec(parts=(), rows=("s",)))
def binary_entropy(s: Array) -> Array:
    """Binary entropy ``H_b(s) = -s log s - (1 - s) log(1 - s)`` in nats, with ``H_b(0) = H_b(1) = 0``.

    Raises
    ------
    NonFiniteError
        ``s`` holds NaN or an infinity.
    CompositionError
        ``s`` lies outside ``[0, 1]``, or is not numeric (booleans are refused).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> bool(np.isclose(ac.binary_entropy(0.5), np.log(2)))
    True
    """
    xp = namespace(s)
    s = as_float(s, xp, first_tensor(s), what="the share s")
    _check_shares(xp, s, "the share s")
    with np.errstate(divide="ignore"):
        return _binary_from_logs(xp, xp.log(s), xp.log1p(-s))


def _check_shares(xp: Any, s: Array, what: str) -> None:
    """Refuse shares that are not finite or lie outside ``[0, 1]``."""
    check_finite_values(xp, s, what)
    if bool(xp.any((s < 0) | (s > 1))):
        raise CompositionError(
            f"{what} must lie in [0, 1] (a share of the attention mass), got values from "
            f"{float(xp.min(s)):.6g} to {float(xp.max(s)):.6g}"
        )


def _binary_from_logs(xp: Any, log_s: Array, log_1ms: Array) -> Array:
    return _neg_plogp(xp, log_s) + _neg_plogp(xp, log_1ms)


@labelled(Spec(parts=(), rows=("log_s", "log_1ms")))
def binary_entropy_from_logs(log_s: Array, log_1ms: Array) -> Array:
    """Binary entropy ``H_b(s)`` from ``log s`` and ``log(1 - s)`` (nats; ``0 log 0 = 0``).

    For shares known only in log space (a sink share from its log-odds, ``log s =
    -softplus(-z)``, ``log(1 - s) = -softplus(z)``): no cancellation where ``s`` is near 0 or
    1, and no check of the inputs (callers hold log-probabilities they computed).

    See Also
    --------
    binary_entropy

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> bool(np.isclose(ac.binary_entropy_from_logs(np.log(0.25), np.log(0.75)),
    ...                 ac.binary_entropy(0.25)))
    True
    """
    return _binary_from_logs(namespace(log_s, log_1ms), log_s, log_1ms)


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
        if not kind.startswith(("int", "uint")) or spec.ndim > 1:
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


def _masked(xp: Any, log: Array, keep: Array) -> Array:
    return xp.where(keep, log, xp.full_like(log, -math.inf))


def _masked_mean(xp: Any, log: Array, keep: Array, count: Array) -> Array:
    total = xp.sum(xp.where(keep, log, xp.zeros_like(log)), axis=-1)
    return total / xp.where(count > 0, count, xp.ones_like(count))


def _sub_entropy(xp: Any, log: Array, keep: Array) -> tuple[Array, Array]:
    """(log-sum-exp, entropy) of the parts in ``keep``."""
    sub = _masked(xp, log, keep)
    lse = logsumexp(xp, sub, keepdims=True)
    safe_lse = xp.where(lse > -math.inf, lse, xp.zeros_like(lse))
    return lse[..., 0], xp.sum(_neg_plogp(xp, sub - safe_lse), axis=-1)


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
    if mask is None and (sink is None or isinstance(sink, (int, np.integer, list, tuple))):
        blocks = by_row_blocks(
            _decompose,
            x,
            axis,
            out_field="content",
            sink=sink,
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

    with np.errstate(invalid="ignore"):  # rows without any visible key: NaN, set below
        lse_all = logsumexp(xp, lc.log, keepdims=True)
        lse_s, h_sink = _sub_entropy(xp, lc.log, s_mask)
        lse_c, h_content = _sub_entropy(xp, lc.log, c_mask)
        log_s = lse_s - lse_all[..., 0]
        log_1ms = lse_c - lse_all[..., 0]
        h_total = xp.sum(_neg_plogp(xp, lc.log - lse_all), axis=-1)

    mean_s = _masked_mean(xp, lc.log, s_mask, n_s)
    mean_c = _masked_mean(xp, lc.log, c_mask, n_c)
    safe_nc = xp.where(empty, xp.ones_like(n_c), n_c)
    balance = xp.sqrt(n_s * safe_nc / (n_s + safe_nc)) * (mean_s - mean_c)
    empty = empty | no_sink  # the balance needs both channels

    safe_lse_c = xp.where(empty, xp.zeros_like(lse_c), lse_c)
    content = xp.exp(_masked(xp, lc.log, c_mask) - safe_lse_c[..., None])
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
            binary_entropy=defined(_binary_from_logs(xp, log_s, log_1ms)),
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


def _first_true(xp: Any, a: Array) -> Array:
    """Index (keepdims) of the first True along the last axis."""
    if isinstance(a, np.ndarray):
        return np.argmax(a, axis=-1, keepdims=True)
    return xp.argmax(xp.astype(a, xp.uint8), axis=-1, keepdims=True)


def _exp(xp: Any, a: Array, out: np.ndarray | None) -> Array:
    """``exp(a)``, into ``out`` when given (numpy)."""
    return xp.exp(a) if out is None else np.exp(a, out=out)


def _content_exp(xp: Any, w: Array, out: np.ndarray | None) -> tuple[Array, Array]:
    """``exp(w)`` with the sink part (first) zeroed, and its row sums."""
    with np.errstate(over="ignore"):  # the sink part may overflow: it is zeroed
        e = _exp(xp, w, out)
    e[..., 0] = 0.0
    return e, xp.sum(e, axis=-1)


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
        s_c = xp.sum(probs[..., 1:], axis=-1)
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
        if is_np:
            np.divide(probs[..., 1:], s_c[..., None], out=e[..., 1:])
        else:
            e[..., 1:] = probs[..., 1:] / s_c[..., None]
        e[..., 0] = 0.0
        w = log  # ours: log c = log x - log s_c on the content; 0 * log x0 at the sink
        w[..., 1:] -= log_sc[..., None]
    elif vis is None:
        # shift by the content mean, known from the row sums (no pass for a maximum): the
        # largest content part then has exp(w) >= 1, so the content sum cannot underflow
        m_c = (sum_c / n_c)[..., None]
        if own:
            w = log
            w -= m_c
        else:
            w = log - m_c
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
        e /= s_c[..., None]  # the content subcomposition
        if clamp:  # log c = w - log s_c: clamp -inf (where c = 0) so that 0 * log c = 0
            if is_np:
                np.maximum(w, np.finfo(w.dtype).min, out=w)
            else:
                import torch

                w.clamp_(min=torch.finfo(w.dtype).min)
        w -= log_sc[..., None]
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


# --------------------------------------------------------------------------------------------
# m groups


@dataclass(frozen=True)
class GroupDecomposition:
    """Per-row decomposition over ``m`` ordered groups (see :func:`group_decompose`).

    Attributes
    ----------
    shares : Array, shape (..., m)
        Mass of each group (sums to one).
    within_entropy : Array, shape (..., m)
        Entropy of each group's closed subcomposition (0 for empty or one-key groups).
    between_entropy : Array
        ``H(shares)``.
    entropy : Array
        ``H(x) = H(shares) + sum_g shares_g * within_entropy_g``.
    """

    shares: Array
    within_entropy: Array
    between_entropy: Array
    entropy: Array


def _labels(groups: Any, lc: LogComposition) -> tuple[Array, int, np.ndarray | None]:
    """Integer group label per part (last axis), -1 for parts in no group.

    Returns the labels broadcast to the data, the number of groups, and for the list form the
    ``(D,)`` labels (``None`` for the label-array form).
    """
    xp = lc.xp
    n = lc.n_parts
    if isinstance(groups, (list, tuple)) and all(
        isinstance(g, (list, tuple, range)) or (hasattr(g, "ndim") and g.ndim == 1) for g in groups
    ):
        lab = np.full(n, -1, dtype=np.int64)
        for gi, g in enumerate(_index_groups(groups, "groups")):
            for i in g:
                if not -n <= i < n:
                    raise ShapeMismatchError(f"group index {i} out of range for {n} parts")
                if lab[i] != -1:
                    raise ShapeMismatchError(
                        f"part {i} is listed more than once in groups; each part belongs to one "
                        "group"
                    )
                lab[i] = gi
        listed: np.ndarray | None = lab
        labels = xp.asarray(lab, device=device_of(lc.log))
        m = len(groups)
    else:
        listed = None
        labels = to_kind(groups, xp, first_tensor(lc.log, groups), "groups")
        kind = str(labels.dtype).replace("torch.", "")
        if not kind.startswith(("int", "uint")) or labels.ndim == 0:
            raise ShapeMismatchError(
                "groups must be index lists such as [[0], [1], [2, 3]] or an integer label per "
                f"part (0..m-1, -1 for no group), got {kind} of shape {tuple(labels.shape)}"
            )
        if labels.ndim == lc.log.ndim:
            labels = xp.moveaxis(labels, lc.axis, -1)
        if int(np.prod(labels.shape)) == 0:
            raise TooFewPartsError("groups= defines no group")
        if bool(xp.any(labels < -1)):
            raise ShapeMismatchError(
                "group labels must be 0..m-1, or -1 for a part in no group; got a label below -1"
            )
        m = int(xp.max(labels)) + 1
    labels = broadcast_mask(labels, tuple(lc.log.shape), lc.axis, xp, what="groups")
    if m < 1:
        raise TooFewPartsError("groups= defines no group")
    return labels, m, listed


@labelled(Spec(parts=("x", "mask", "groups"), resized="group"))
def group_decompose(
    x: Array,
    groups: Sequence[Sequence[int]] | Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> GroupDecomposition:
    """Decompose rows over ordered groups, e.g. sink / hub / content for ARACH rows.

    Parameters
    ----------
    x : array_like or torch.Tensor
    groups : list of index lists, or int array
        Either ``[[0], [1], [2, 3, ...]]`` (the same groups for every row) or an integer label per
        part broadcastable to ``x`` (``g`` in ``0..m-1``; ``-1`` for a part in no group, which
        is then treated as invisible).
    axis, validate, mask, from_logits
        As in :func:`decompose`. Probability rows may have any scale (each row is closed over
        its grouped visible parts, as in :func:`decompose`); zeros are allowed.
    degenerate : {"raise", "nan"}, default "raise"
        Rows without any visible grouped part: raise, or NaN there (the policy of
        :func:`attncoda.clr`; a one-part row is fine: one group holds everything).

    Returns
    -------
    GroupDecomposition

    Raises
    ------
    ShapeMismatchError
        With index lists: an index that is not an integer (bools and floats are refused), out of
        range or listed twice, or a part with mass (visible, non-zero) in no group (list it,
        hide it with ``mask=``, or pass integer labels with -1 for parts to leave out). With labels: a non-integer
        dtype, a label below -1, or labels that do not broadcast to ``x``.
    TooFewPartsError
        ``groups`` defines no group, or (with ``validate`` and ``degenerate="raise"``) a row has
        no visible grouped part.
    ZeroPartError, NegativePartError, NonFiniteError
        With ``validate``: as in :func:`decompose` (zeros are allowed).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> g = ac.group_decompose([0.5, 0.2, 0.2, 0.1], [[0], [1], [2, 3]])
    >>> g.shares.round(2).tolist()
    [0.5, 0.2, 0.3]
    >>> bool(np.isclose(g.between_entropy + (g.shares * g.within_entropy).sum(), g.entropy))
    True
    """
    lc = log_composition(
        x,
        axis,
        mask=mask,
        from_logits=from_logits,
        validate=validate,
        allow_zeros=not from_logits,
        others=(groups,),
    )
    xp = lc.xp
    labels, m, listed = _labels(groups, lc)
    if listed is not None and bool((listed < 0).any()):
        left_out = np.flatnonzero(listed < 0)
        # a part with mass in no group would silently drop out of the shares (parts that are
        # hidden, or zero, change nothing)
        cols = lc.log[..., xp.asarray(left_out, device=device_of(lc.log))]
        if bool(xp.any(cols > -math.inf)):
            raise ShapeMismatchError(
                f"parts {left_out.tolist()} carry mass but are in no group; list them in a "
                "group, hide them with mask=, or pass an integer label per part with -1 for "
                "parts to leave out"
            )
    check_degenerate(degenerate)
    vis = lc.visible_full() & (labels >= 0)
    if validate and degenerate == "raise" and not bool(xp.all(xp.any(vis, axis=-1))):
        n_low = int(xp.sum(xp.astype(~xp.any(vis, axis=-1), xp.int64)))
        raise TooFewPartsError(
            f"{n_low} row(s) have no visible part in any group (mask=, -inf or -1 labels hide "
            f"them all); drop those rows, {DEGENERATE_HINT}"
        )
    log = _masked(xp, lc.log, vis)
    with np.errstate(invalid="ignore"):  # rows without a grouped part (validate=False): NaN
        lse_all = logsumexp(xp, log, keepdims=True)
        logp = log - lse_all
        shares_log, within = [], []
        for g in range(m):
            lse_g, h_g = _sub_entropy(xp, logp, vis & (labels == g))
            shares_log.append(lse_g)
            within.append(h_g)
        log_shares = xp.stack(shares_log, axis=-1)
        out = GroupDecomposition(
            shares=xp.exp(log_shares),
            within_entropy=xp.stack(within, axis=-1),
            between_entropy=xp.sum(_neg_plogp(xp, log_shares), axis=-1),
            entropy=xp.sum(_neg_plogp(xp, logp), axis=-1),
        )
    if degenerate == "raise":
        return out
    low = ~xp.any(vis, axis=-1)
    return GroupDecomposition(
        shares=nan_rows(xp, out.shares, low[..., None]),
        within_entropy=nan_rows(xp, out.within_entropy, low[..., None]),
        between_entropy=nan_rows(xp, out.between_entropy, low),
        entropy=nan_rows(xp, out.entropy, low),
    )


# --------------------------------------------------------------------------------------------
# Aitchison distance split


def _pair(x: Array, y: Array, mask: Array | None, sink: Any, axis: int) -> tuple[Array, Array]:
    """``x`` and ``y`` as arrays of the call's kind (see :mod:`attncoda._array`), broadcast
    (views) in the caller's layout, with the same parts on ``axis``."""
    xp = namespace(x, y, mask, sink)
    like = first_tensor(x, y, mask, sink)
    return broadcast_pair(to_kind(x, xp, like, "x"), to_kind(y, xp, like, "y"), xp, axis)


@dataclass(frozen=True)
class AitchisonSplit:
    """Squared Aitchison distance split into its sink and content channels.

    ``sink`` is ``(b_x - b_y)^2`` plus, for several sink keys, the distance within the sinks;
    ``content`` is ``d_A^2(c_x, c_y)`` of the content subcompositions; ``total = sink + content``.
    """

    sink: Array
    content: Array

    @property
    def total(self) -> Array:
        return self.sink + self.content


def _channels(
    x: Array,
    sink: SinkSpec,
    axis: int,
    validate: bool,
    mask: Array | None,
    from_logits: bool,
    degenerate: Degenerate = "raise",
) -> tuple[Any, Array, Array, Array, Array]:
    """(xp, balance, clr within sinks, clr within content, visible) with parts last.

    With ``degenerate="nan"``, rows without a visible sink or content key are NaN in all three.
    """
    check_degenerate(degenerate)
    nan = degenerate == "nan"
    lc = log_composition(
        x, axis, mask=mask, from_logits=from_logits, validate=validate, others=(sink,)
    )
    xp = lc.xp
    vis = lc.visible_full()
    s_mask = _sink_mask(lc, sink, validate, allow_missing=nan)
    c_mask = vis & ~s_mask
    dtype = lc.log.dtype
    n_s = xp.sum(xp.astype(s_mask, dtype), axis=-1, keepdims=True)
    n_c = xp.sum(xp.astype(c_mask, dtype), axis=-1, keepdims=True)
    if validate and not nan and bool(xp.any(n_c == 0)):
        raise TooFewPartsError(
            f"{int(xp.sum(xp.astype(n_c == 0, xp.int64)))} row(s) have no visible content key "
            "(only the sink is visible, as for the first query of a causal model); drop those "
            f"rows (select queries >= 1), {DEGENERATE_HINT}"
        )
    zero = xp.zeros_like(lc.log)
    with np.errstate(invalid="ignore", divide="ignore"):  # no content (validate=False): NaN
        mean_s = xp.sum(xp.where(s_mask, lc.log, zero), axis=-1, keepdims=True) / n_s
        mean_c = xp.sum(xp.where(c_mask, lc.log, zero), axis=-1, keepdims=True) / n_c
        balance = (xp.sqrt(n_s * n_c / (n_s + n_c)) * (mean_s - mean_c))[..., 0]
        clr_s = xp.where(s_mask, lc.log - mean_s, zero)
        clr_c = xp.where(c_mask, lc.log - mean_c, zero)
    if nan:
        low = (n_s == 0) | (n_c == 0)
        balance = nan_rows(xp, balance, low[..., 0])
        clr_s, clr_c = nan_rows(xp, clr_s, low), nan_rows(xp, clr_c, low)
    return xp, balance, clr_s, clr_c, vis


@labelled(Spec(parts=("x", "y", "mask", "sink")))
def aitchison_split(
    x: Array,
    y: Array,
    sink: SinkSpec = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> AitchisonSplit:
    """Split ``d_A^2(x, y)`` exactly into a sink term and a content term.

    Rows must be over the same visible keys (one ``mask``, or matching ``-inf`` logits);
    ``x`` and ``y`` broadcast against each other. ``degenerate="nan"`` gives NaN for rows
    without a visible sink or content key instead of raising (the policy of
    :func:`attncoda.clr`).

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` do not broadcast, or differ in visibility; a bad ``sink`` (as in
        :func:`decompose`).
    TooFewPartsError
        With ``degenerate="raise"``: a row has no visible sink key, or (with ``validate``) no
        visible content key.
    ZeroPartError, NegativePartError, NonFiniteError
        With ``validate``: as in :func:`attncoda.clr`.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> x, y = ac.closure([6.0, 1, 2, 1]), ac.closure([2.0, 3, 1, 1])
    >>> sp = ac.aitchison_split(x, y)
    >>> bool(np.isclose(sp.total, ac.aitchison_distance(x, y) ** 2))
    True
    """
    x, y = _pair(x, y, mask, sink, axis)
    xp, bx, sx, cx, vx = _channels(x, sink, axis, validate, mask, from_logits, degenerate)
    _, by, sy, cy, vy = _channels(y, sink, axis, validate, mask, from_logits, degenerate)
    if not bool(xp.all(vx == vy)):
        raise ShapeMismatchError(
            "rows are only compared over the same visible keys; x and y differ in visibility "
            "(compare rows of the same sample and query)"
        )
    ds = sx - sy
    dc = cx - cy
    return AitchisonSplit(
        sink=(bx - by) ** 2 + xp.sum(ds * ds, axis=-1),
        content=xp.sum(dc * dc, axis=-1),
    )


@labelled(Spec(parts=("x", "mask", "sink"), pairwise=True))
def pairwise_aitchison_split(
    x: Array,
    sink: SinkSpec = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> AitchisonSplit:
    """All-pairs :func:`aitchison_split` between items of ``x (..., N, D)``, via Gram matrices.

    Items (for example the heads at one query) share the same visible keys.
    ``degenerate="nan"`` gives NaN for every pair with an item without a visible sink or
    content key instead of raising (the policy of :func:`attncoda.clr`).

    Returns
    -------
    AitchisonSplit with ``(..., N, N)`` arrays of squared distances.

    Raises
    ------
    ShapeMismatchError
        ``x`` has no items axis, or visibility differs between items; a bad ``sink``.
    TooFewPartsError, ZeroPartError, NegativePartError, NonFiniteError
        As in :func:`aitchison_split`.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> x = ac.closure(np.random.default_rng(1).random((4, 6)))
    >>> sp = ac.pairwise_aitchison_split(x)
    >>> bool(np.allclose(sp.total, ac.pairwise_aitchison(x, squared=True)))
    True
    """
    xp, b, cs, cc, vis = _channels(x, sink, axis, validate, mask, from_logits, degenerate)
    if vis.ndim < 2:
        raise ShapeMismatchError("pairwise distances need items on an axis before the parts axis")
    if not bool(xp.all(vis == vis[..., :1, :])):
        raise ShapeMismatchError(
            "rows are only compared over the same visible keys: visibility must be identical "
            "for every item (e.g. heads at one query)"
        )
    db = b[..., :, None] - b[..., None, :]
    if degenerate == "nan":
        return AitchisonSplit(
            sink=db * db + gram_distances_nan(cs, None, xp, True),
            content=gram_distances_nan(cc, None, xp, True),
        )
    return AitchisonSplit(
        sink=db * db + gram_distances(cs, None, xp, squared=True, overwrite=True),
        content=gram_distances(cc, None, xp, squared=True, overwrite=True),
    )


# --------------------------------------------------------------------------------------------
# entropy-change attribution


@dataclass(frozen=True)
class EntropyChange:
    """An entropy change ``H_b - H_a`` split into a sink part and a content part.

    ``sink + content == total`` exactly (up to rounding).
    """

    sink: Array
    content: Array
    total: Array


@labelled(
    Spec(parts=(), rows=("sink_share_a", "content_entropy_a", "sink_share_b", "content_entropy_b"))
)
def attribute_entropy_change(
    sink_share_a: Array, content_entropy_a: Array, sink_share_b: Array, content_entropy_b: Array
) -> EntropyChange:
    r"""Shapley split of ``H(b) - H(a)`` with ``H = H_b(s) + (1 - s) H_c``.

    The sink part is the change caused by the sink share with the content entropy held at its
    mean, the content part the change of the content entropy weighted by the mean content mass:

    .. math::

        \Delta_{sink} = \Delta H_b(s) - \Delta s\,\bar H_c, \qquad
        \Delta_{content} = (1 - \bar s)\,\Delta H_c,

    which is the two-player Shapley value and sums exactly to the total change. Inputs are
    summaries (e.g. the ``sink_share`` and ``content_entropy`` variables of a capture), any
    matching shape; averages over heads or samples of the parts equal the parts of the averages.

    Raises
    ------
    NonFiniteError
        A summary holds NaN or an infinity (drop undefined rows first).
    CompositionError
        A sink share lies outside ``[0, 1]``, a content entropy is negative, or a summary is not
        numeric.
    ShapeMismatchError
        The four summaries do not broadcast together.

    Examples
    --------
    >>> import attncoda as ac
    >>> ch = ac.attribute_entropy_change(0.2, 3.0, 0.8, 2.5)
    >>> round(float(ch.sink + ch.content - ch.total), 12)
    0.0
    """
    names = ("sink_share_a", "content_entropy_a", "sink_share_b", "content_entropy_b")
    sa, ha, sb, hb = _summaries(
        (sink_share_a, content_entropy_a, sink_share_b, content_entropy_b), names
    )
    xp = namespace(sa)
    for v, name in ((sa, names[0]), (sb, names[2])):
        _check_shares(xp, v, name)
    for v, name in ((ha, names[1]), (hb, names[3])):
        _check_entropies(xp, v, name)
    total = (binary_entropy(sb) + (1 - sb) * hb) - (binary_entropy(sa) + (1 - sa) * ha)
    sink = binary_entropy(sb) - binary_entropy(sa) - (sb - sa) * (ha + hb) / 2
    content = (1 - (sa + sb) / 2) * (hb - ha)
    return EntropyChange(sink=sink, content=content, total=total)


def _summaries(values: Sequence[Any], names: Sequence[str]) -> list[Array]:
    """Summaries as finite float arrays of one kind whose shapes broadcast together."""
    xp = namespace(*values)
    like = first_tensor(*values)
    out = [as_float(v, xp, like, what=name) for v, name in zip(values, names, strict=True)]
    for v, name in zip(out, names, strict=True):
        check_finite_values(xp, v, name)
    try:
        np.broadcast_shapes(*(tuple(v.shape) for v in out))
    except ValueError:
        shapes = ", ".join(f"{n} {tuple(v.shape)}" for n, v in zip(names, out, strict=True))
        raise ShapeMismatchError(
            f"the summaries do not broadcast together ({shapes}); give them matching shapes"
        ) from None
    return out


#: How far below 0 an entropy may round: float32 captures (often cast to float64 before they
#: get here) give entropies near 0 at about -1e-6; the check exists to catch changes or other
#: quantities passed as entropies, which are off by far more.
_ENTROPY_SLACK = 1e-4


def _check_entropies(xp: Any, h: Array, what: str) -> None:
    """Refuse negative entropies (beyond the rounding of float32 summaries)."""
    if bool(xp.any(h < -_ENTROPY_SLACK)):
        raise CompositionError(
            f"{what} has negative values (down to {float(xp.min(h)):.6g}); an entropy is >= 0: "
            "pass the content entropies of decompose (or group entropies), not changes"
        )


@labelled(Spec(parts=("x_a", "x_b", "mask", "sink"), strict=("x_a", "x_b", "mask")))
def entropy_change(
    x_a: Array,
    x_b: Array,
    sink: SinkSpec = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> EntropyChange:
    """Split the entropy change from rows ``x_a`` to rows ``x_b`` into sink and content parts.

    The two states need not have the same keys (entropies compare across key sets); their
    rows' leading shapes must broadcast. ``degenerate="nan"`` gives NaN for rows that
    :func:`decompose` cannot split in either state, instead of raising.

    Raises
    ------
    ShapeMismatchError
        The leading shapes of ``x_a`` and ``x_b`` do not broadcast; a bad ``sink``.
    TooFewPartsError, ZeroPartError, NegativePartError, NonFiniteError
        As in :func:`decompose`.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> a, b = ac.closure([1.0, 1, 1, 1]), ac.closure([6.0, 1, 1, 1])
    >>> ch = ac.entropy_change(a, b)
    >>> bool(np.isclose(ch.total, ac.entropy(b) - ac.entropy(a))), round(float(ch.content), 12)
    (True, 0.0)
    """
    xp = namespace(x_a, x_b, mask, sink)
    like = first_tensor(x_a, x_b, mask, sink)
    x_a, x_b = to_kind(x_a, xp, like, "x_a"), to_kind(x_b, xp, like, "x_b")
    kw: dict[str, Any] = {"mask": mask, "from_logits": from_logits, "degenerate": degenerate}
    da = decompose(x_a, sink, axis, validate, **kw)
    db = decompose(x_b, sink, axis, validate, **kw)
    summaries = [da.sink_share, da.content_entropy, db.sink_share, db.content_entropy]
    if degenerate == "raise":
        return attribute_entropy_change(*summaries)
    low = xp.zeros_like(summaries[0], dtype=xp.bool)
    for v in summaries:
        low = low | xp.isnan(v)
    # rows that cannot be split are attributed as a harmless row, then set to NaN
    fill = (0.5, 0.0, 0.5, 0.0)
    safe = [xp.where(low, xp.full_like(v, f), v) for v, f in zip(summaries, fill, strict=True)]
    ch = attribute_entropy_change(*safe)
    return EntropyChange(
        sink=nan_rows(xp, ch.sink, low),
        content=nan_rows(xp, ch.content, low),
        total=nan_rows(xp, ch.total, low),
    )


@dataclass(frozen=True)
class GroupedEntropyChange:
    """An entropy change split into a between-groups part and one within part per group."""

    between: Array
    within: Array
    total: Array


@labelled(
    Spec(
        parts=("shares_a", "within_a", "shares_b", "within_b"),
        strict=("shares_a", "within_a", "shares_b", "within_b"),
        default_dim=("group",),
    )
)
def attribute_grouped_entropy_change(
    shares_a: Array, within_a: Array, shares_b: Array, within_b: Array
) -> GroupedEntropyChange:
    r"""Shapley split of an entropy change over ``m`` groups (the grouping rule).

    With :math:`H = H(p) + \sum_g p_g H_g`:
    :math:`\Delta_{between} = \Delta H(p) + \sum_g \Delta p_g \bar H_g` and
    :math:`\Delta_{within,g} = \bar p_g \Delta H_g`, which sum exactly to the total. Inputs have
    the groups on the last axis (as :class:`GroupDecomposition` gives them).

    Raises
    ------
    NonFiniteError
        An input holds NaN or an infinity.
    NegativePartError, NotClosedError
        Shares are negative, or do not sum to one over the groups.
    CompositionError
        A within entropy is negative, or an input is not numeric.
    ShapeMismatchError
        An input is a scalar, the numbers of groups differ, or the shapes do not broadcast.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> a = ac.group_decompose([0.6, 0.1, 0.2, 0.1], [[0], [1], [2, 3]])
    >>> b = ac.group_decompose([0.3, 0.3, 0.3, 0.1], [[0], [1], [2, 3]])
    >>> ch = ac.attribute_grouped_entropy_change(a.shares, a.within_entropy,
    ...                                         b.shares, b.within_entropy)
    >>> bool(np.isclose(ch.between + ch.within.sum(), b.entropy - a.entropy))
    True
    """
    names = ("shares_a", "within_a", "shares_b", "within_b")
    pa, ha, pb, hb = _summaries((shares_a, within_a, shares_b, within_b), names)
    xp = namespace(pa)
    for v, name in zip((pa, ha, pb, hb), names, strict=True):
        if v.ndim == 0:
            raise ShapeMismatchError(f"{name} is a scalar; the groups must be on the last axis")
    m = {int(v.shape[-1]) for v in (pa, ha, pb, hb)}
    if len(m) > 1:
        raise ShapeMismatchError(
            f"the four inputs have different numbers of groups on their last axis {sorted(m)}; "
            "pass the shares and within entropies of group decompositions over the same groups"
        )
    for v, name in ((pa, "shares_a"), (pb, "shares_b")):
        if bool(xp.any(v < 0)):
            raise NegativePartError(f"{name} has negative group shares; shares are masses >= 0")
        err = xp.abs(xp.sum(v, axis=-1) - 1)
        tol = tolerance(v.dtype)
        if bool(xp.any(err > tol)):
            raise NotClosedError(
                f"{name} must sum to 1 over the groups (worst deviation {float(xp.max(err)):.3g}"
                f" > {tol:g}); pass GroupDecomposition.shares, or close them with ac.closure"
            )
    for v, name in ((ha, "within_a"), (hb, "within_b")):
        _check_entropies(xp, v, name)
    with np.errstate(divide="ignore"):
        h_pa = xp.sum(_neg_plogp(xp, xp.log(pa)), axis=-1)
        h_pb = xp.sum(_neg_plogp(xp, xp.log(pb)), axis=-1)
    within = (pa + pb) / 2 * (hb - ha)
    between = h_pb - h_pa + xp.sum((pb - pa) * (ha + hb) / 2, axis=-1)
    total = (h_pb + xp.sum(pb * hb, axis=-1)) - (h_pa + xp.sum(pa * ha, axis=-1))
    return GroupedEntropyChange(between=between, within=within, total=total)
