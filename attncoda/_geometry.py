"""The Aitchison geometry of matched rows: perturbation, powering, inner product, norm, distance.

Each function works row by row (``x[i]`` with ``y[i]``, broadcast); all pairs of rows (Gram
matrices, pairwise distances) are in :mod:`attncoda._pairwise`. The input rules shared by every
maths function are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._array import (
    MIN_BLOCKED_BYTES,
    PRODUCT_BLOCK_BYTES,
    Array,
    Degenerate,
    Spec,
    as_float,
    broadcast_pair,
    first_tensor,
    labelled,
    log_composition,
    logsumexp,
    namespace,
    nan_rows,
    normalize_axis,
    pair_shape,
    parts_last,
    sqrt0,
    to_kind,
    torch_module,
    torch_views,
    validate_parts,
)
from ._closure import closed_product, closure
from ._errors import (
    NonFiniteError,
    ShapeMismatchError,
)
from ._logratio import clr

__all__ = [
    "aitchison_distance",
    "aitchison_norm",
    "paired_inner",
    "perturb",
    "perturb_inv",
    "power",
]


# --------------------------------------------------------------------------------------------
# Aitchison geometry


def _pair(x: Array, y: Array, mask: Array | None, axis: int) -> tuple[Any, Array, Array]:
    """``x`` and ``y`` as arrays of one kind (torch on the first tensor's device if any of
    ``x``, ``y``, ``mask`` is a tensor), without changing their dtypes, checked to broadcast.

    They are only broadcast (as views) when a mask must fit both; otherwise each keeps its shape,
    so that e.g. one reference row is transformed once, not once per row it is compared with.
    """
    xp = namespace(x, y, mask)
    like = first_tensor(x, y, mask)
    x, y = to_kind(x, xp, like, "x"), to_kind(y, xp, like, "y")
    if mask is not None:
        return xp, *broadcast_pair(x, y, xp, axis)
    pair_shape(x, y, axis)
    return xp, x, y


@labelled(Spec(parts=("x", "y", "mask")))
def perturb(
    x: Array, y: Array, axis: int = -1, validate: bool = True, *, mask: Array | None = None
) -> Array:
    """Perturbation ``C(x * y)``, the compositional "addition".

    ``x`` and ``y`` broadcast against each other (e.g. one perturbation for every row).

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` do not broadcast.
    NonFiniteError, NegativePartError, ZeroPartError
        With ``validate``: ``x`` or ``y`` has a NaN, infinite or negative part or a row without
        mass, or their product has a row without mass.

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.perturb([0.5, 0.25, 0.25], [0.25, 0.5, 0.25])
    array([0.4, 0.4, 0.2])
    """
    xp, x, y = _pair(x, y, mask, axis)
    like = first_tensor(x, y)
    xf, yf = as_float(x, xp, like), as_float(y, xp, like, what="y")
    if mask is None and normalize_axis(axis, xf.ndim) == xf.ndim - 1:
        fused = closed_product(xf, yf, validate)
        if fused is not None:
            return fused
    xf, yf = broadcast_pair(xf, yf, xp, axis)
    if validate:  # each factor on its own: two negative parts would multiply to a positive one
        for arr, name in ((xf, "x"), (yf, "y")):
            _, a, vis, _ = parts_last(arr, axis, mask, what=name)
            validate_parts(xp, a, vis, allow_zeros=True)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by closure
        product = xf * yf
    return closure(product, axis, validate, mask=mask)


@labelled(Spec(parts=("x", "y", "mask")))
def perturb_inv(
    x: Array, y: Array, axis: int = -1, validate: bool = True, *, mask: Array | None = None
) -> Array:
    """Inverse perturbation ``C(x / y)``, the compositional "difference".

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` do not broadcast.
    ZeroPartError, NegativePartError, NonFiniteError
        With ``validate``: ``y`` has a zero, negative or non-finite visible part (it is
        inverted), or ``x`` is not a composition (as in :func:`perturb`).

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.perturb_inv([0.4, 0.4, 0.2], [0.25, 0.5, 0.25])
    array([0.5 , 0.25, 0.25])
    """
    xp, x, y = _pair(x, y, mask, axis)
    like = first_tensor(x, y)
    x, y = as_float(x, xp, like), as_float(y, xp, like, what="y")
    if mask is None and normalize_axis(axis, x.ndim) == x.ndim - 1:
        fused = closed_product(x, y, validate, divide=True)
        if fused is not None:
            return fused
    x, y = broadcast_pair(x, y, xp, axis)
    lc_y = log_composition(y, axis, mask=mask, validate=validate, what="y")
    with np.errstate(over="ignore"):
        inv = lc_y.restore(lc_y.zero_invisible(lc_y.xp.exp(-lc_y.log)))
    return perturb(x, inv, axis, validate, mask=mask)


@labelled(Spec(rows=("a",)))
def power(
    x: Array,
    a: Array | float,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    degenerate: Degenerate = "raise",
) -> Array:
    """Powering ``C(x ** a)``, the compositional scalar multiplication.

    ``a`` may be an array broadcastable to ``x`` without its parts axis (one power per row).
    ``degenerate="nan"`` gives NaN for rows without any visible part instead of raising (see
    :func:`clr`).

    Raises
    ------
    NonFiniteError
        ``a`` holds NaN or an infinity. (A finite ``a`` never overflows: parts whose share
        falls below the floating range come out as 0, the exact result rounded.)
    CompositionError
        ``a`` is not a real number (booleans, strings, complex numbers).
    ShapeMismatchError
        ``a`` does not broadcast to ``x`` without its parts axis.
    ZeroPartError, NegativePartError, TooFewPartsError
        With ``validate``: as in :func:`clr` (a row needs one visible part).

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.power([0.5, 0.25, 0.25], 2)
    array([0.66666667, 0.16666667, 0.16666667])
    """
    if mask is None and type(x) is np.ndarray and _real_number(a):  # no subclass (np.ma, np.matrix)
        direct = _power_dense(x, float(a), axis, validate)
        if direct is not None:
            return direct
    lc = log_composition(x, axis, mask=mask, validate=validate, others=(a,))
    degenerate_rows = lc.degenerate_rows(1, degenerate, validate)
    xp = lc.xp
    a_arr = as_float(a, xp, first_tensor(lc.log, a), what="the exponent a")
    if not bool(xp.all(xp.isfinite(a_arr))):  # one value per row at most: cheap
        raise NonFiniteError("the exponent a is NaN or infinite; give finite powers")
    if a_arr.ndim > 0:
        a_arr = a_arr[..., None]
        try:
            np.broadcast_shapes(tuple(a_arr.shape), tuple(lc.log.shape))
        except ValueError:
            raise ShapeMismatchError(
                f"the exponent a of shape {tuple(a_arr.shape[:-1])} does not broadcast to the "
                f"rows of x {tuple(lc.log.shape[:-1])} (one power per row, parts axis left out)"
            ) from None
    log = lc.log
    # shift each row so that a * (log x - ref) <= 0 with a 0 at the largest (a >= 0) or
    # smallest (a < 0) part: nothing overflows, whatever |a|, and the row's log-sum-exp lies in
    # [0, log D]; parts beyond the floating range round to 0 (the exact result, rounded)
    top = xp.max(log, axis=-1, keepdims=True)
    if a_arr.ndim == 0 and float(a_arr) >= 0:
        ref = top
    else:
        vis = lc.visible_full()
        low = xp.min(xp.where(vis, log, xp.full_like(log, math.inf)), axis=-1, keepdims=True)
        ref = low if a_arr.ndim == 0 else xp.where(a_arr >= 0, top, low)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (log - ref) * a_arr
        if lc.visible is not None:
            scaled = xp.where(lc.visible, scaled, xp.full_like(scaled, -math.inf))
        powered = xp.exp(scaled - logsumexp(xp, scaled, keepdims=True))
    return lc.restore(nan_rows(xp, powered, degenerate_rows))


def _real_number(a: object) -> bool:
    """Whether ``a`` is one finite real number (not a bool, not an array)."""
    if isinstance(a, bool) or not isinstance(a, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(float(a))


def _power_dense(x: np.ndarray, a: float, axis: int, validate: bool) -> np.ndarray | None:
    """:func:`power` of a float numpy array by one number, without logarithms: ``C((x/m)**a)``.

    ``m`` is each row's largest part for ``a >= 0`` (its smallest for ``a < 0``), so every
    ``(x/m)**a`` lies in ``[0, 1]`` and one of them is 1: nothing overflows, whatever ``|a|``,
    and parts beyond the floating range round to 0 (the exact result, rounded), as in the
    log-space path. With ``validate`` the parts must be positive and finite (the row extremes
    and the smallest part show any that is not). ``None`` for other input, or when a check
    fails: the general path then diagnoses it.
    """
    if x.dtype not in (np.float32, np.float64) or x.ndim < 1 or x.shape[axis] < 1:
        return None
    ax = normalize_axis(axis, x.ndim)
    if ax == x.ndim - 1 and x.flags.c_contiguous and x.nbytes >= MIN_BLOCKED_BYTES:
        return _power_blocks(x, a, validate)
    top = np.max(x, axis=ax, keepdims=True)
    low = np.min(x, axis=ax, keepdims=True) if (validate or a < 0) else top
    if validate and not (np.isfinite(top).all() and np.min(low) > 0):
        return None
    with np.errstate(over="ignore", under="ignore"):
        out = np.divide(x, top if a >= 0 else low)
        np.power(out, a, out=out)
        out /= np.sum(out, axis=ax, keepdims=True)
    return out


def _power_blocks(x: np.ndarray, a: float, validate: bool) -> np.ndarray | None:
    """:func:`_power_dense` of a large C-contiguous array with parts last, block by block of rows.

    Each block's extremes, power, sums and division run while the block is in cache. Through
    torch's kernels (where installed) a block's smallest and largest part come from one pass;
    when every ``x ** a`` of the block and every row sum lie in the normal floating range, the
    block is powered as it is (``C(x ** a)``, as composition-stats does: no scaling pass), and
    otherwise row by row scaled by its extreme part first (see :func:`_power_dense`). The same
    two extremes are the check with ``validate``. ``None`` when a check fails.
    """
    n = int(x.shape[-1])
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    ref = np.empty((rows.shape[0], 1), dtype=rows.dtype)
    step = max(1, PRODUCT_BLOCK_BYTES // (n * rows.itemsize))
    views = torch_views(rows, out, ref)
    torch = torch_module()
    info = np.finfo(rows.dtype)
    # log-range in which a block's powers and row sums need no scaling
    log_low, log_high = math.log(info.tiny), math.log(info.max) - math.log(n)
    low_all, top_ok = math.inf, True
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        for start in range(0, rows.shape[0], step):
            part = slice(start, start + step)
            if views is None:
                block, dest, scale = rows[part], out[part], ref[part]
                top = np.max(block, axis=-1, keepdims=True)
                low = np.min(block, axis=-1, keepdims=True) if a < 0 else top
                np.copyto(scale, top if a >= 0 else low)
                np.divide(block, scale, out=dest)
                np.power(dest, a, out=dest)
                np.divide(dest, np.sum(dest, axis=-1, keepdims=True), out=dest)
                if validate:  # the smallest part of the block (not per row: one reduction)
                    low_all = min(low_all, float(low.min() if a < 0 else np.min(block)))
                    top_ok = top_ok and bool(np.isfinite(float(top.max())))
                continue
            block, dest, scale = (v[part] for v in views)
            smallest, largest = (float(v) for v in torch.aminmax(block))  # NaN shows in both
            low_all = min(low_all, smallest)
            top_ok = top_ok and math.isfinite(largest)
            if validate and not (top_ok and low_all > 0):
                return None
            logs = (a * math.log(smallest), a * math.log(largest)) if smallest > 0 else ()
            if logs and math.isfinite(largest) and min(logs) >= log_low and max(logs) <= log_high:
                torch.pow(block, a, out=dest)
            else:  # scaled row by row: nothing overflows, parts below the range round to 0
                top = torch.amax(block, -1, keepdim=True)  # (aminmax over rows is 13x slower)
                low = torch.amin(block, -1, keepdim=True) if a < 0 else top
                scale.copy_(top if a >= 0 else low)
                torch.div(block, scale, out=dest)
                dest.pow_(a)
            dest.div_(torch.sum(dest, -1, keepdim=True))
    if validate and not (top_ok and low_all > 0):
        return None
    return out.reshape(x.shape)


@labelled(Spec(parts=("x", "y", "mask")))
def paired_inner(
    x: Array,
    y: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    """Aitchison inner product ``<clr(x), clr(y)>`` of matching rows (any leading shape).

    ``degenerate="nan"`` gives NaN for rows with fewer than two visible parts instead of
    raising (see :func:`clr`).

    ``x`` and ``y`` broadcast against each other (e.g. one reference row for every row of
    ``x``); rows are compared over the same parts. The name follows scikit-learn's
    ``paired_distances`` (row ``i`` with row ``i``) beside ``pairwise_distances`` (every row with
    every row), which is what :func:`inner` returns here as in scikit-bio and composition-stats;
    ``paired_inner(x, y)`` is the diagonal of ``inner(x, y)`` for 2-D inputs, without the
    ``N x M`` matrix.

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` do not broadcast (e.g. different numbers of parts).
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    See Also
    --------
    inner : The Gram matrix of every row of ``x`` with every row of ``y``.
    aitchison_distance : The distance between matching rows.

    Examples
    --------
    >>> import attncoda as ac
    >>> round(float(ac.paired_inner([0.5, 0.25, 0.25], [0.5, 0.25, 0.25])), 6)
    0.320302
    """
    xp, x, y = _pair(x, y, mask, axis)
    cx = clr(x, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate)
    cy = clr(y, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate)
    return _row_dot(xp, cx, cy, normalize_axis(axis, max(cx.ndim, cy.ndim)))


@labelled(Spec())
def aitchison_norm(
    x: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    """Aitchison norm ``||clr(x)||``: the distance of each row from the uniform composition.

    ``degenerate="nan"`` gives NaN for rows with fewer than two visible parts instead of
    raising (see :func:`clr`).

    Raises
    ------
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    Examples
    --------
    >>> import attncoda as ac
    >>> float(ac.aitchison_norm([1/3, 1/3, 1/3]))
    0.0
    """
    c = clr(x, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate)
    xp = namespace(c)
    return sqrt0(xp, _row_dot(xp, c, c, normalize_axis(axis, c.ndim)))


@labelled(Spec(parts=("x", "y", "mask")))
def aitchison_distance(
    x: Array,
    y: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    """Aitchison distance ``||clr(x) - clr(y)||`` between matching rows.

    ``degenerate="nan"`` gives NaN for rows with fewer than two visible parts instead of
    raising (see :func:`clr`).

    Rows are compared over the same visible parts (one ``mask`` for both); ``x`` and ``y``
    broadcast against each other.

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` do not broadcast (e.g. different numbers of parts).
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    Examples
    --------
    >>> import attncoda as ac
    >>> round(float(ac.aitchison_distance([0.5, 0.25, 0.25], [0.25, 0.5, 0.25])), 6)
    0.980258
    """
    xp, x, y = _pair(x, y, mask, axis)
    cx = clr(x, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate)
    cy = clr(y, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate)
    if _fresh(cx, cx.shape == np.broadcast_shapes(cx.shape, cy.shape), x, y):
        d = np.subtract(cx, cy, out=cx)  # clr's own result: no second full-size temporary
    else:
        d = cx - cy
    return sqrt0(xp, _row_dot(xp, d, d, normalize_axis(axis, d.ndim)))


def _fresh(c: Array, fits: bool, *inputs: Array) -> bool:
    """Whether ``c``, a result computed from ``inputs``, is a numpy array of the call's own that
    may be overwritten (not sharing memory with any input, of the full broadcast shape)."""
    if not (isinstance(c, np.ndarray) and fits and c.flags.writeable):
        return False
    return not any(isinstance(a, np.ndarray) and np.may_share_memory(c, a) for a in inputs)


def _row_dot(xp: Any, a: Array, b: Array, axis: int) -> Array:
    """``sum(a * b, axis)`` without the ``a * b`` temporary in numpy (one fused pass)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        a, b = (np.moveaxis(v, axis, -1) for v in np.broadcast_arrays(a, b))
        if hasattr(np, "vecdot"):  # numpy >= 2: 1.6x einsum's speed here
            return np.vecdot(a, b)
        return np.einsum("...i,...i->...", a, b)
    return xp.sum(a * b, axis=axis)
