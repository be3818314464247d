"""Attribution of an entropy change to the sink and to the content (two- and m-group Shapley values)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    namespace,
    nan_rows,
    to_kind,
    tolerance,
)
from ._decompose import SinkSpec, decompose
from ._entropy import _check_shares, _neg_plogp, binary_entropy
from ._errors import (
    CompositionError,
    NegativePartError,
    NotClosedError,
    ShapeMismatchError,
)

__all__ = [
    "EntropyChange",
    "GroupedEntropyChange",
    "attribute_entropy_change",
    "attribute_grouped_entropy_change",
    "entropy_change",
]


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
        tol = tolerance(v.dtype, v.shape[-1])
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
