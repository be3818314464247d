"""Making compositions: closure of rows to sum one, and the learned sink as an explicit part.

The input rules shared by every maths function (array kinds, ``mask=``, ``from_logits=``,
``axis=``, precision) are in :mod:`attncoda._array`.
"""

from __future__ import annotations

from ._array import (
    Array,
    Spec,
    labelled,
    parts_last,
    tolerance,
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
    if validate:
        validate_parts(xp, data, visible, allow_zeros=True)
    if visible is not None:
        data = xp.where(visible, data, xp.zeros_like(data))
    return xp.moveaxis(data / xp.sum(data, axis=-1, keepdims=True), -1, ax)


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
    xp, x, _, ax = parts_last(x, axis)
    if validate:
        validate_parts(xp, x, None, allow_zeros=True)
    total = xp.sum(x, axis=-1, keepdims=True)
    tol = tolerance(x.dtype)
    if validate and bool(xp.any(total > 1 + tol)):
        worst = float(xp.max(total))
        raise NotClosedError(
            f"rows sum above 1 (up to {worst:.6g}); a learned sink can only hold missing mass: "
            "pass the rows as the model returned them (summing to at most 1)"
        )
    sink = xp.clip(1 - total, 0.0, 1.0)
    return xp.moveaxis(xp.concat([sink, x], axis=-1), -1, ax)
