"""Decomposition of rows into m ordered groups of parts (e.g. sink / hub / content).

:func:`group_decompose` generalises :func:`attncoda.decompose` from two groups to m: the
between-group composition, the subcomposition within each group and the entropy chain rule.
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
    broadcast_mask,
    check_degenerate,
    device_of,
    first_tensor,
    labelled,
    log_composition,
    logsumexp,
    nan_rows,
    to_kind,
)
from ._bases import _index_groups
from ._decompose import _channel
from ._entropy import _neg_plogp
from ._errors import (
    ShapeMismatchError,
    TooFewPartsError,
)

__all__ = [
    "GroupDecomposition",
    "group_decompose",
]


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
    log = xp.where(vis, lc.log, xp.full_like(lc.log, -math.inf))
    with np.errstate(invalid="ignore"):  # rows without a grouped part (validate=False): NaN
        lse_all = logsumexp(xp, log, keepdims=True)
        logp = log - lse_all
        shares_log, within = [], []
        for g in range(m):
            lse_g, _, h_g = _channel(xp, logp, vis & (labels == g))
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
