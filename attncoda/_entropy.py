"""Shannon entropy of rows (with ``mask=`` and ``from_logits=``) and the binary entropy of a share.

The input rules shared by every maths function are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._array import (
    Array,
    Degenerate,
    Spec,
    as_float,
    check_finite_values,
    first_tensor,
    labelled,
    log_composition,
    namespace,
    nan_rows,
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
    binary_entropy : The same from the share ``s`` (less precise where ``s`` is near 0 or 1).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> bool(np.isclose(ac.binary_entropy_from_logs(np.log(0.25), np.log(0.75)),
    ...                 ac.binary_entropy(0.25)))
    True
    """
    return _binary_from_logs(namespace(log_s, log_1ms), log_s, log_1ms)
