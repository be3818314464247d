"""Making compositions: closure of rows to sum one, and the learned sink as an explicit part.

The input rules shared by every maths function (array kinds, ``mask=``, ``from_logits=``,
``axis=``, precision) are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._array import (
    MIN_BLOCKED_BYTES,
    PRODUCT_BLOCK_BYTES,
    ROW_BLOCK_BYTES,
    TORCH_MIN_BYTES,
    Array,
    Spec,
    labelled,
    parts_last,
    row_sums,
    tolerance,
    torch_module,
    torch_views,
    validate_parts,
)
from ._errors import (
    NotClosedError,
)

__all__ = [
    "add_learned_sink",
    "closure",
]


# --------------------------------------------------------------------------------------------
# closure and zeros


@labelled(Spec())
def closure(x: Array, axis: int = -1, validate: bool = True, *, mask: Array | None = None) -> Array:
    """Scale each row to sum to one over its visible parts.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Non-negative parts; integer counts are accepted (converted to float64).
    axis : int, default -1
        The parts axis.
    validate : bool, default True
        Check for negative, non-finite and all-zero rows.
    mask : array_like of bool, optional
        Visible parts; invisible parts come out as exactly 0.

    Returns
    -------
    Array of the input's shape and kind (float).

    Raises
    ------
    NonFiniteError, NegativePartError, ZeroPartError
        With ``validate``: NaN or infinite parts, negative parts, or a row without mass (all
        zeros, or every part hidden by ``mask``).
    CompositionError
        ``x`` is not numeric (booleans, strings, objects, complex numbers) or ``mask`` is not
        boolean.
    ShapeMismatchError
        ``axis`` is not an integer or out of range, ``x`` is a scalar, or ``mask`` does not
        broadcast to ``x``.

    See Also
    --------
    skbio.stats.composition.closure : The same, without ``mask``.
    composition_stats.closure : 1-D or 2-D input only (it refuses ``ndim > 2``, which attncoda
        accepts: captures are ``sample x layer x head x query x key``), and squeezes its output
        (attncoda keeps the input's shape).

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.closure([2, 1, 1])
    array([0.5 , 0.25, 0.25])
    >>> ac.closure([[2.0, 1.0, 7.0]], mask=[[True, True, False]])
    array([[0.66666667, 0.33333333, 0.        ]])
    """
    xp, data, visible, ax = parts_last(x, axis, mask)
    if visible is not None:
        if validate:
            validate_parts(xp, data, visible, allow_zeros=True)
        data = xp.where(visible, data, xp.zeros_like(data))
        data, total = scaled_sums(xp, data)
        return xp.moveaxis(data / total, -1, ax)
    blocks = _closure_blocks(data, validate)
    if blocks is not None:
        return xp.moveaxis(blocks, -1, ax)
    data, total = scaled_sums(xp, data)
    if validate and not closable(xp, data, total):
        validate_parts(xp, data, None, allow_zeros=True)  # the precise refusal
    return xp.moveaxis(data / total, -1, ax)


def scaled_sums(xp: Any, data: Array) -> tuple[Array, Array]:
    """``data`` and its row sums (keepdims), the rows whose sum overflows scaled down first.

    Finite parts can sum past the dtype's largest number (``[1e308, 1e308]`` in float64,
    ``[3e38] * 3`` in float32 or bfloat16, ``[40000, 40000]`` in float16): ``x / inf`` would
    close them to zeros. Those rows only are multiplied by ``2**-e``, ``e`` the binary exponent
    of their largest part (exact: a power of two), so that their parts are at most 1 and the sum
    at most the number of parts; every other row, and so every result for ordinary input, is the
    same as dividing by the plain sum.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        total = xp.sum(data, axis=-1, keepdims=True)
        over = xp.isinf(total) & xp.all(xp.isfinite(data), axis=-1, keepdims=True)
        if math.prod(data.shape) == 0 or not bool(xp.any(over)):
            return data, total
        top = xp.max(xp.abs(data), axis=-1, keepdims=True)
        if isinstance(data, np.ndarray):
            exponent = np.where(over, np.frexp(top)[1], 0)
            data = np.ldexp(data, -exponent)
        else:
            torch = torch_module()
            exponent = torch.where(over, torch.frexp(top)[1], 0)
            data = data * torch.pow(2.0, -exponent.to(torch.float64)).to(data.dtype)
        return data, xp.sum(data, axis=-1, keepdims=True)


def closable(xp: Any, data: Array, total: Array, smallest: float | None = None) -> bool:
    """Whether rows ``data`` with sums ``total`` are valid compositions, in one host sync.

    The sums are finite when no part is NaN or infinite (unless they overflowed: then the
    caller's precise check decides), and the smallest part is non-negative and every row has
    mass: one reduction (the minimum) beyond the sums that closure needs anyway, or none where
    the caller gathered ``smallest`` (the minimum of ``data``) on its way through the blocks.
    """
    if math.prod(data.shape) == 0:
        return False
    with np.errstate(invalid="ignore"):
        low = xp.min(data) if smallest is None else smallest
        ok = xp.all(xp.isfinite(total)) & xp.all(total > 0) & (low >= 0)
    return bool(ok)


def _closure_blocks(x: Array, validate: bool) -> Array | None:
    """:func:`closure` of a large C-contiguous float numpy array, block by block of rows.

    Each block's sums, check and division run while the block is in cache: one pass over
    memory. ``None`` (nothing written that the caller sees) for other input, or as soon as a
    block fails the check: the one-shot path then diagnoses the whole input.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim < 2:
        return None
    if not x.flags.c_contiguous or x.nbytes < MIN_BLOCKED_BYTES or x.shape[-1] < 1:
        return None
    n = int(x.shape[-1])
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    step = max(1, ROW_BLOCK_BYTES // (n * x.itemsize))
    # the sums and the division through torch's kernels where installed (numpy's sum along a
    # last axis of a few hundred parts is 2-3x slower)
    views = torch_views(rows, out)
    for start in range(0, rows.shape[0], step):
        part = slice(start, start + step)
        total = row_sums(np, rows[part])
        # (the smallest part through numpy: its minimum of a whole block is faster than torch's)
        if validate and not closable(np, rows[part], total):
            return None
        if not validate and not np.isfinite(total).all():
            return None  # an overflowing sum (or NaN): the general path scales those rows
        if views is None:
            np.divide(rows[part], total, out=out[part])
        else:
            torch = torch_module()
            torch.div(views[0][part], torch.from_numpy(total), out=views[1][part])
    return out.reshape(x.shape)


@labelled(Spec(resized="same"))
def add_learned_sink(x: Array, axis: int = -1, validate: bool = True) -> Array:
    """Prepend the missing mass of rows that sum below one as an explicit sink part.

    GPT-OSS style models add a learned per-head sink logit to the softmax and then drop that
    column, so their returned rows sum to less than one. The missing mass *is* the sink; closing
    the rows again would silently delete it. The result has one more part, at index 0, so the
    default sink (the first visible part) is the learned sink.

    Raises
    ------
    NotClosedError
        With ``validate``: a row sums above one (beyond the closure tolerance of its dtype,
        1e-6 in float64 and 1e-4 in float32), so it has no missing mass to hold.
    NonFiniteError, NegativePartError, ZeroPartError
        With ``validate``: as in :func:`closure`.

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.add_learned_sink([0.3, 0.2, 0.1])
    array([0.4, 0.3, 0.2, 0.1])
    """
    source = getattr(x, "dtype", None)
    xp, x, _, ax = parts_last(x, axis)
    if validate:
        validate_parts(xp, x, None, allow_zeros=True)
    total = xp.sum(x, axis=-1, keepdims=True)
    tol = tolerance(x.dtype, x.shape[-1] if x.ndim else 1, source=source)
    if validate and bool(xp.any(total > 1 + tol)):
        worst = float(xp.max(total))
        raise NotClosedError(
            f"rows sum above 1 (up to {worst:.6g}); a learned sink can only hold missing mass: "
            "pass the rows as the model returned them (summing to at most 1)"
        )
    sink = xp.clip(1 - total, 0.0, 1.0)
    return xp.moveaxis(xp.concat([sink, x], axis=-1), -1, ax)


def closed_product(x: Array, y: Array, validate: bool, *, divide: bool = False) -> Array | None:
    """``closure(x * y)`` (or ``closure(x / y)``) of two numpy arrays of one shape, fused.

    Row blocks of the product, their sums and the division run while the block is in cache
    (through torch's kernels where installed: its row sums and in-place division by them are
    1.6x and 1.5x numpy's speed here, bit for bit the same division). With ``validate`` the
    factors must be non-negative (a divisor positive and finite) and every product row must
    have finite, positive mass: a NaN or an infinity in a factor shows in the product's sums
    (``inf * 0`` is NaN, and so is ``0 / 0``; ``x / 0`` is infinite). What is left to look at
    is the signs, and a divisor's ``+inf`` (its quotients are zeros): one factor is read right
    after the product has read it, while it is still in cache (of a product ``x``, which must
    have no sign bit; of a quotient the divisor, the largest of its bit patterns read as
    unsigned integers, below ``+inf``'s only when every part is ``+0`` or more, finite and not
    NaN), and the block of results, just written, must have no sign bit either. Once one factor
    has no sign bit, a negative part of the other shows in the result's sign (``-0.0`` where
    the first is ``+0``), so the other factor is never read again. On 25,000 x 512 float64
    (Zen 5, one thread) a checked ``perturb`` took 15.1-15.4 ms so, against 15.6-16.4 reading
    both factors again in blocks half as large (a core's 1 MB L2 held them) and 18.7 ms with the
    checks before the product; the unchecked call takes 12.5-12.7 ms. All is checked once at
    the end. Returns ``None`` for other input (masks, broadcasting, tensors, other dtypes) and
    when a check fails (a ``-0.0`` anywhere too, which the general path may accept): the
    caller's general path then diagnoses the input precisely.
    """
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return None
    if x.shape != y.shape or x.dtype != y.dtype or x.dtype not in (np.float32, np.float64):
        return None
    if x.ndim < 1 or x.shape[-1] < 1 or not (x.flags.c_contiguous and y.flags.c_contiguous):
        return None
    n = int(x.shape[-1])
    xr, yr = x.reshape(-1, n), y.reshape(-1, n)
    out = np.empty_like(xr)
    total = np.empty((xr.shape[0], 1), dtype=xr.dtype)
    step = xr.shape[0] if x.nbytes < MIN_BLOCKED_BYTES else max(1, PRODUCT_BLOCK_BYTES // (n * 8))
    views = torch_views(xr, yr, out, total) if x.nbytes >= TORCH_MIN_BYTES else None
    bits, signed = np.dtype(f"u{x.itemsize}"), np.dtype(f"i{x.itemsize}")
    inf_bits = int(np.array(np.inf, x.dtype).view(bits))
    # the one factor read again: a divisor's bit patterns as unsigned integers (+inf's is the
    # first refused), or x's as signed ones, like the results': a sign bit (-0.0 too) is negative
    factor = yr.view(bits) if divide else xr.view(signed)
    results = out.view(signed)
    factor_worst = 0  # the divisor's largest bit pattern, or x's smallest as a signed integer
    result_low = 0  # the results' smallest as a signed integer
    smallest, largest = np.minimum.reduce, np.maximum.reduce
    with np.errstate(all="ignore"):  # whatever a bad value does here, the checks refuse it
        for start in range(0, xr.shape[0], step):
            rows = slice(start, start + step)
            if views is None:
                dest, sums = out[rows], total[rows]
                (np.divide if divide else np.multiply)(xr[rows], yr[rows], out=dest)
            else:
                xt, yt, dest_t, sums_t = (v[rows] for v in views)
                (torch_module().div if divide else torch_module().mul)(xt, yt, out=dest_t)
            if validate:  # the factor is in cache: the product has just read it
                if divide:
                    factor_worst = max(factor_worst, int(largest(factor[rows], axis=None)))
                else:
                    factor_worst = min(factor_worst, int(smallest(factor[rows], axis=None)))
            if views is None:
                np.sum(dest, axis=-1, keepdims=True, out=sums)
                np.divide(dest, sums, out=dest)
            else:
                torch_module().sum(dest_t, -1, keepdim=True, out=sums_t)
                dest_t.div_(sums_t)
            if validate:  # (dividing by positive sums keeps every sign; others are refused)
                result_low = min(result_low, int(smallest(results[rows], axis=None)))
    if validate:
        ok = result_low >= 0 and (factor_worst < inf_bits if divide else factor_worst >= 0)
        if not (ok and bool(np.all((total > 0) & (total < math.inf)))):
            return None
    elif not bool(np.all(total < math.inf)):
        return None  # a product row whose sum overflowed: closure scales it (or NaN there)
    return out.reshape(x.shape)
