"""Shannon entropy of rows (with ``mask=`` and ``from_logits=``) and the binary entropy of a share.

The input rules shared by every maths function are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _array
from ._array import (
    Array,
    Degenerate,
    Spec,
    all_finite,
    as_float,
    check_finite_values,
    first_tensor,
    labelled,
    log_composition,
    namespace,
    nan_rows,
    normalize_axis,
    tolerance,
)
from ._errors import (
    CompositionError,
)

__all__ = [
    "binary_entropy",
    "binary_entropy_from_logs",
    "entropy",
]


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
    if mask is None and isinstance(x, np.ndarray):
        blocked = _entropy_blocks(x, axis, from_logits)
        if blocked is not None:
            return blocked
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


def _entropy_blocks(x: np.ndarray, axis: int, from_logits: bool) -> np.ndarray | None:
    """:func:`entropy` of a large C-contiguous float array, parts last, block by block of rows.

    Probability rows: ``H(C(x)) = log S + sum(entr(x)) / S`` with ``S`` the row sum and
    ``entr(p) = -p log p`` (``entr(0) = 0``); logits: ``H = log S - sum(e w) / S`` with ``w``
    the logits less their row maximum, ``e = exp(w)`` and ``S = sum(e)``, the entropy of
    ``softmax(x)``. A few passes a block, in cache, through torch's kernels where installed
    (:func:`_torch_block_entropy`, :func:`_torch_block_logit_entropy`; scipy's ``entr``
    otherwise, probabilities only), where the general path takes the logarithms, their
    log-sum-exp and the products as separate full-size passes (2.6x scipy.stats.entropy's time on
    25,000 x 512 float64, and 2x ``torch.distributions.Categorical``'s from logits).

    ``None`` (the general path then decides, and diagnoses) for other input, or unless every
    entropy is finite and every probability row sums to 1 within closure's tolerance (every
    logit row has a finite maximum): validation's checks, made on the results (``entr`` is
    ``-inf`` at a negative or infinite part and NaN at NaN; a NaN or ``+inf`` logit makes the
    maximum non-finite, and so does a row without a visible part).
    """
    if x.dtype not in (np.float32, np.float64) or x.ndim < 1 or not x.flags.c_contiguous:
        return None
    # from the size where a torch kernel pays for its call (the fewer passes pay at any size)
    if x.nbytes < _array.TORCH_MIN_BYTES or normalize_axis(axis, x.ndim) != x.ndim - 1:
        return None
    n = int(x.shape[-1])
    if n < 1:
        return None
    rows = x.reshape(-1, n)
    total = np.empty(rows.shape[0], dtype=x.dtype)  # row sums, or each logit row's maximum
    h = np.empty_like(total)
    step = max(1, _array.ROW_BLOCK_BYTES // (n * x.itemsize))
    scratch = np.empty((min(step, rows.shape[0]), n), dtype=x.dtype)
    views = _array.torch_views(rows, total, h, scratch)
    if views is None and from_logits:
        return None
    kernel = _torch_block_logit_entropy if from_logits else _torch_block_entropy
    if views is None:
        from scipy.special import entr
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for start in range(0, rows.shape[0], step):
            part = slice(start, start + step)
            m = min(step, rows.shape[0] - start)
            if views is None:
                np.sum(rows[part], axis=-1, out=total[part])
                entr(rows[part], out=scratch[:m])
                np.sum(scratch[:m], axis=-1, out=h[part])
            else:
                kernel(views[0][part], views[1][part], views[2][part], views[3][:m])
        if from_logits:
            ok = all_finite(np, total)
        else:
            ok = bool((np.abs(total - 1) <= tolerance(x.dtype, n)).all())  # False for NaN
        if not (ok and all_finite(np, h)):
            return None
        if not from_logits:
            h /= total
            h += np.log(total)
    return h.reshape(x.shape[:-1])[()]  # one row: a scalar, as the general path gives


def _torch_block_entropy(block: Any, total: Any, h: Any, scratch: Any) -> None:
    """Row sums and ``sum(entr(block))`` of one block into ``total`` and ``h`` (torch tensors).

    ``p log p`` as a vectorised logarithm and a product (1.6x faster than torch's ``entr``, 2.6x
    in float32); rows where that is NaN (an exact zero: ``0 log 0``; a negative or NaN part)
    are computed again with ``entr`` (0 at a zero, ``-inf`` at a negative part).
    """
    torch = _array.torch_module()
    torch.sum(block, -1, out=total)
    _array.log_into(block.numpy(), scratch.numpy())  # this CPU's faster log kernel
    scratch.mul_(block)
    torch.sum(scratch, -1, out=h)
    h.neg_()
    again = torch.isnan(h)
    if bool(again.any()):
        rows = again.nonzero()[:, 0]
        h[rows] = torch.special.entr(block[rows]).sum(-1)


def _torch_block_logit_entropy(block: Any, top: Any, h: Any, scratch: Any) -> None:
    """Each logit row's maximum into ``top`` and the entropy of its softmax into ``h``.

    ``w = z - max``, ``e = exp(w)``, ``H = log sum(e) - sum(e w) / sum(e)``; rows where ``e w``
    is NaN (an invisible key: ``0 x -inf``) are computed again with those terms set to 0. Rows
    whose maximum is not finite come out NaN; the caller refuses them.
    """
    torch = _array.torch_module()
    torch.amax(block, -1, out=top)
    torch.sub(block, top[:, None], out=scratch)
    w = scratch
    e = torch.from_numpy(_array.exp_into(w.numpy()))  # this CPU's faster exp kernel
    total = e.sum(-1)
    e.mul_(w)
    weighted = e.sum(-1)
    again = torch.isnan(weighted)
    if bool(again.any()):
        rows = again.nonzero()[:, 0]
        ew = torch.exp(w[rows]) * w[rows]
        weighted[rows] = torch.where(w[rows] > -math.inf, ew, torch.zeros_like(ew)).sum(-1)
    torch.sub(torch.log(total), weighted.div_(total), out=h)


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
    binary_entropy : The same from the share ``s`` (less precise where ``s`` is near 0 or 1).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> bool(np.isclose(ac.binary_entropy_from_logs(np.log(0.25), np.log(0.75)),
    ...                 ac.binary_entropy(0.25)))
    True
    """
    return _binary_from_logs(namespace(log_s, log_1ms), log_s, log_1ms)
