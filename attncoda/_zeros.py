"""Zero replacement: multiplicative replacement of zero parts (``multi_replace``).

Structural zeros (keys hidden by ``mask``) are never replaced; only observed zeros are. The input
rules shared by every maths function are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._array import (
    MIN_BLOCKED_BYTES,
    Array,
    Spec,
    labelled,
    log_composition,
    normalize_axis,
    torch_module,
    torch_views,
)
from ._closure import closable, closure
from ._errors import (
    CompositionError,
    NonFiniteError,
)

__all__ = [
    "multi_replace",
]


@labelled(Spec())
def multi_replace(
    x: Array,
    delta: float | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
) -> Array:
    """Multiplicative replacement of rounding zeros (Martín-Fernández et al., 2003).

    Only for user data with *rounding* zeros (e.g. probabilities that underflowed in fp16).
    Never apply it to structural zeros (causal or padding masks): mark those with ``mask=``.

    Each visible zero becomes ``delta`` and the non-zero parts are shrunk by ``1 - k * delta``
    (``k`` zeros in the row), so ratios among non-zero parts are preserved. Rows are closed first.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Non-negative parts.
    delta : float, optional
        Replacement value, a real number in ``(0, 1)``; default ``1 / D**2`` with ``D`` the
        number of visible parts.
    axis : int, default -1
    validate : bool, default True
    mask : array_like of bool, optional

    Returns
    -------
    Array of closed rows without visible zeros.

    Raises
    ------
    NonFiniteError
        ``delta`` is NaN or infinite (or ``x`` holds NaN/inf, as in :func:`closure`).
    CompositionError
        ``delta`` is not a real number in ``(0, 1)``, or a row has ``k`` zeros with
        ``k * delta >= 1`` (no room left for its non-zero parts).

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.multi_replace([0.5, 0.5, 0.0]).round(4)
    array([0.4444, 0.4444, 0.1111])
    """
    delta_f = None if delta is None else _real_scalar(delta, "delta")
    if delta_f is not None and not 0 < delta_f < 1:
        raise CompositionError(
            f"delta={delta!r} must lie in (0, 1): it is the value given to each zero of a "
            "closed row; leave it unset for the default 1/D**2"
        )
    if mask is None and isinstance(x, np.ndarray):
        fused = _replace_blocks(x, axis, delta_f, validate)
        if fused is not None:
            return fused
    closed = closure(x, axis, validate, mask=mask)
    if mask is None and isinstance(closed, np.ndarray) and closed.ndim >= 1:
        ax = normalize_axis(axis, closed.ndim)
        n = int(closed.shape[ax])
        if n >= 1:  # every part visible: in place on the closed rows (ours), no logs
            delta_n = 1.0 / n**2 if delta_f is None else delta_f
            zero = closed == 0
            k = np.count_nonzero(zero, axis=ax, keepdims=True)
            if bool((k * delta_n >= 1).any()):
                raise _too_large(delta)
            closed *= 1 - k * delta_n
            np.copyto(closed, delta_n, where=zero)
            return closed
    lc = log_composition(closed, axis, mask=mask, validate=False, allow_zeros=True)
    xp = lc.xp
    data = xp.exp(lc.log)
    n_visible = lc.count()
    d = 1.0 / n_visible**2 if delta_f is None else xp.full_like(n_visible, delta_f)
    zero = (data == 0) & lc.visible_full()
    k = xp.sum(xp.astype(zero, data.dtype), axis=-1, keepdims=True)
    if bool(xp.any(k * d >= 1)):
        raise _too_large(delta)
    out = xp.where(zero, d * xp.ones_like(data), data * (1 - k * d))
    return lc.restore(lc.zero_invisible(out))


#: multi_replace's blocks of rows: 2 MB (its nine steps a block make fewer, larger blocks pay:
#: 25,000 x 512 in 1 MB blocks took ~10% longer)
REPLACE_BLOCK_BYTES = 2 << 20


def _replace_blocks(x: np.ndarray, axis: int, delta: float | None, validate: bool) -> Any:
    """:func:`multi_replace` of a large C-contiguous float array with parts last, fused.

    Each block of rows is summed (through torch's kernels where installed), its zeros counted,
    its non-zero parts closed and shrunk by one multiplication per row and its zeros replaced
    while it is in cache: one pass over memory, where closing and then replacing took five.
    The checks (closure's, and ``k * delta < 1``) are made once, on the row sums, the zero
    counts and the blocks' smallest parts gathered on the way. ``None`` for other input, or
    when closure's check fails (the general path then diagnoses the whole input).
    """
    if x.dtype not in (np.float32, np.float64) or x.ndim < 2 or not x.flags.c_contiguous:
        return None
    if x.nbytes < MIN_BLOCKED_BYTES or normalize_axis(axis, x.ndim) != x.ndim - 1:
        return None
    n = int(x.shape[-1])
    d = 1.0 / n**2 if delta is None else delta
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    total = np.empty((rows.shape[0], 1), dtype=rows.dtype)
    scale = np.empty_like(total)
    zeros = np.empty((rows.shape[0], 1), dtype=np.uint16 if n < 1 << 16 else np.int64)
    views = torch_views(rows, out, total, scale)
    torch = torch_module()
    step = max(1, REPLACE_BLOCK_BYTES // (n * rows.itemsize))
    lowest = math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        for start in range(0, rows.shape[0], step):
            part = slice(start, start + step)
            block, dest = rows[part], out[part]
            if views is None:
                np.sum(block, axis=-1, keepdims=True, out=total[part])
            else:
                torch.sum(views[0][part], -1, keepdim=True, out=views[2][part])
            if validate:
                lowest = min(lowest, float(np.min(block)))
            # the zeros of the closed rows are the input's: one scale per row, closing and
            # shrinking the non-zero parts in one multiplication, then the zeros set to d
            zero = block == 0
            # the zeros per row: a sum of the mask's bytes (3x faster than count_nonzero)
            np.add.reduce(zero.view(np.uint8), -1, zeros.dtype, zeros[part], keepdims=True)
            np.multiply(zeros[part], -d, out=scale[part])
            scale[part] += 1
            scale[part] /= total[part]
            if views is None:
                np.multiply(block, scale[part], out=dest)
            else:
                torch.mul(views[0][part], views[3][part], out=views[1][part])
            np.putmask(dest, zero, d)  # (faster than copyto(where=) and masked_fill_)
    if validate and not closable(np, rows, total, smallest=lowest):
        return None
    if bool(zeros.max() * d >= 1):
        raise _too_large(delta)
    return out.reshape(x.shape)


def _too_large(delta: float | None) -> CompositionError:
    return CompositionError(
        f"delta={delta} is too large: a row has k zeros with k * delta >= 1; pick a smaller "
        "delta (the default is 1/D**2)"
    )


def _real_scalar(value: object, what: str) -> float:
    """``value`` as a finite Python float, or a refusal (bools and strings are not numbers)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    if not ok and getattr(value, "ndim", None) == 0:  # a 0-d array or tensor
        name = str(getattr(value, "dtype", ""))
        ok = "float" in name or ("int" in name and "bool" not in name)
    if not ok:
        raise CompositionError(f"{what} must be a real number, got {value!r}")
    out = float(value)  # type: ignore[arg-type]
    if not math.isfinite(out):
        raise NonFiniteError(f"{what} is {out}; give a finite number")
    return out
