r"""The Aitchison distance split into a sink term and a content term.

:math:`d_A^2(x, y) = (b_x - b_y)^2 + d_A^2(\hat c_x, \hat c_y)`, for matched rows
(:func:`aitchison_split`) and for all pairs of rows (:func:`pairwise_aitchison_split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import (
    DEGENERATE_HINT,
    Array,
    Degenerate,
    Spec,
    broadcast_pair,
    check_degenerate,
    first_tensor,
    labelled,
    log_composition,
    namespace,
    nan_rows,
    to_kind,
)
from ._decompose import SinkSpec, _sink_mask
from ._errors import (
    ShapeMismatchError,
    TooFewPartsError,
)
from ._pairwise import gram_distances, gram_distances_nan

__all__ = [
    "AitchisonSplit",
    "aitchison_split",
    "pairwise_aitchison_split",
]


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
