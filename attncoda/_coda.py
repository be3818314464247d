"""Compositional data analysis on attention rows: closure, log-ratio transforms, the Aitchison geometry.

All functions accept numpy arrays and torch tensors of any leading shape, with the parts on
``axis`` (default ``-1``), and return the same kind of array on the same device; given
:class:`xarray.DataArray` input they return DataArrays with the dims and coordinates kept (the
parts dim is ``dim=``, else ``"key"``; the maths page has the rules), and every function
that can meet a row with too few visible parts takes ``degenerate="raise" | "nan"``. Names and
argument order follow :mod:`skbio.stats.composition` (``clr(x, axis=-1, validate=True)``), with
three additions:

``mask=``
    Boolean visibility broadcastable to ``x``. Invisible parts (keys hidden by causality or
    padding) are *structural zeros*: they are excluded from every computation, never replaced.
    Log-ratio outputs hold ``0`` there; compositions hold ``0``.
``from_logits=True``
    ``x`` holds logits or log-probabilities (any additive constant per row), with ``-inf`` at
    invisible parts. This is what capture produces: ``clr(softmax(z)) = z - mean(z)``, so no zero
    ever needs replacing and nothing underflows.
``ref=`` / ``sink=``
    The reference part defaults to the *sink*, the first visible part of each row (under left
    padding that is not index 0). :func:`alr` and :func:`alr_inv` also take scikit-bio's
    ``ref_idx=`` and composition-stats' ``denominator_idx=`` for it. R's ``compositions::alr``
    uses the *last* part instead.

:func:`inner` is the Gram matrix of all pairs of rows, as in scikit-bio and composition-stats;
:func:`paired_inner` is the product of matching rows.

Precision: float64 inputs are exact to rounding (identities hold to 1e-10); float32 inputs are
computed in float32 and hold to about 1e-5 relative; float16/bfloat16 are computed in float32.

Input rules (the same for every function here and in the decomposition): any argument may be a
numpy array, a torch tensor or a nested list; if any is a tensor the call computes in torch on
its device and returns tensors, otherwise in numpy. Data must be real numbers (integer counts
are accepted and become float64; booleans, complex numbers, strings and objects are refused);
masks must be boolean; ``axis``, ``ref`` and other indices must be integers (not bools). Every
refusal is a one-line :class:`~attncoda.CompositionError` (a ``ValueError``) saying what to do.
``validate=False`` skips the checks that read the data (and an explicit basis), never the cheap
checks of arguments.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _array
from ._array import (
    Array,
    Degenerate,
    LogComposition,
    Spec,
    all_finite,
    as_float,
    broadcast_pair,
    by_row_blocks,
    can_overwrite,
    check_count,
    check_degenerate,
    check_index,
    device_of,
    first_tensor,
    is_integer,
    is_tensor,
    labelled,
    log_composition,
    logsumexp,
    namespace,
    nan_rows,
    normalize_axis,
    pair_shape,
    parts_last,
    to_kind,
    tolerance,
    validate_parts,
)
from ._errors import (
    CompositionError,
    NonFiniteError,
    NotClosedError,
    ShapeMismatchError,
    TooFewPartsError,
)

__all__ = [
    "add_learned_sink",
    "aitchison_distance",
    "aitchison_norm",
    "alr",
    "alr_inv",
    "closure",
    "clr",
    "clr_inv",
    "group_basis",
    "ilr",
    "ilr_inv",
    "inner",
    "multi_replace",
    "paired_inner",
    "pairwise_aitchison",
    "perturb",
    "perturb_inv",
    "pivot_basis",
    "power",
    "sbp_basis",
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
    closed = closure(x, axis, validate, mask=mask)
    lc = log_composition(closed, axis, mask=mask, validate=False, allow_zeros=True)
    xp = lc.xp
    data = xp.exp(lc.log)
    n_visible = lc.count()
    d = 1.0 / n_visible**2 if delta_f is None else xp.full_like(n_visible, delta_f)
    zero = (data == 0) & lc.visible_full()
    k = xp.sum(xp.astype(zero, data.dtype), axis=-1, keepdims=True)
    if bool(xp.any(k * d >= 1)):
        raise CompositionError(
            f"delta={delta} is too large: a row has k zeros with k * delta >= 1; pick a smaller "
            "delta (the default is 1/D**2)"
        )
    out = xp.where(zero, d * xp.ones_like(data), data * (1 - k * d))
    return lc.restore(lc.zero_invisible(out))


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


# --------------------------------------------------------------------------------------------
# log-ratio transforms


@labelled(Spec())
def clr(
    x: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    r"""Centred log-ratio transform, :math:`\mathrm{clr}(x)_i = \log x_i - \overline{\log x}`.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Strictly positive parts over the visible keys, or logits with ``from_logits=True``.
    axis : int, default -1
    validate : bool, default True
        Raise on zero, negative or non-finite parts (zeros: see :class:`ZeroPartError`).
    mask : array_like of bool, optional
        Visible parts; invisible parts get coordinate 0 and are left out of the mean.
    from_logits : bool, default False
        ``x`` holds logits or log-probabilities; the result is the centred logits.
    degenerate : {"raise", "nan"}, default "raise"
        Rows with fewer than two visible parts (the first query of a causal model): raise
        :class:`TooFewPartsError`, or return NaN in those rows. The same policy, default and
        wording as every function here that can meet such a row (:func:`decompose` included).

    Returns
    -------
    Array of the input's shape; each row sums to 0.

    Raises
    ------
    ZeroPartError, NegativePartError, NonFiniteError
        With ``validate``: a visible part is zero, negative, NaN or infinite (with
        ``from_logits``: NaN or ``+inf``).
    TooFewPartsError
        With ``validate`` and ``degenerate="raise"``: a row has fewer than two visible parts.
    CompositionError, ShapeMismatchError
        Bad dtypes, ``axis`` or ``mask`` (see :func:`closure`), or a ``degenerate`` other than
        ``"raise"`` or ``"nan"``.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> ac.clr([1.0, 1.0, 4.0]).round(4)
    array([-0.4621, -0.4621,  0.9242])
    >>> z = np.array([2.0, 0.0, -1.0])
    >>> np.allclose(ac.clr(z, from_logits=True), z - z.mean())
    True
    """
    check_degenerate(degenerate)
    if mask is None:
        blocks = _clr_dense_blocks(x, axis, validate, from_logits)
        if blocks is None:  # e.g. -inf logits (masked keys): blocks of the general path
            blocks = by_row_blocks(
                clr, x, axis, validate=validate, from_logits=from_logits, degenerate=degenerate
            )
        if blocks is not None:
            return blocks
    lc = log_composition(x, axis, mask=mask, from_logits=from_logits, validate=validate)
    low = lc.degenerate_rows(2, degenerate, validate)
    if low is None:
        return lc.restore(lc.clr(consume=True))
    with np.errstate(invalid="ignore", divide="ignore"):  # rows without any part: 0/0, NaN
        return lc.restore(nan_rows(lc.xp, lc.clr(consume=True), low))


def _clr_dense_blocks(x: Array, axis: int, validate: bool, from_logits: bool) -> Array | None:
    """:func:`clr` of a large float numpy array whose rows are finite, block by block.

    Each block of rows is transformed inside its slice of the result (log, row sums, centring
    while the slice is in cache): the same arithmetic as the one-shot path, with one pass over
    memory. Returns ``None`` (having written nothing the caller sees) when ``x`` is small or not
    C-contiguous with parts last, or as soon as a block has a non-finite row sum (a masked key,
    a bad value): the general path then handles, or diagnoses, the whole input.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim < 2:
        return None
    if not x.flags.c_contiguous or x.nbytes < _array.MIN_BLOCKED_BYTES:
        return None
    if normalize_axis(axis, x.ndim) != x.ndim - 1 or x.shape[-1] < 2:
        return None
    n = int(x.shape[-1])
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    step = max(1, _array.ROW_BLOCK_BYTES // (n * x.itemsize))
    for start in range(0, rows.shape[0], step):
        block, dest = rows[start : start + step], out[start : start + step]
        if from_logits:
            with np.errstate(invalid="ignore", over="ignore"):
                total = np.sum(block, axis=-1, keepdims=True)
            if not all_finite(np, total):
                return None
            np.subtract(block, total / n, out=dest)
            continue
        if validate:
            with np.errstate(divide="ignore", invalid="ignore"):
                np.log(block, out=dest)
                total = np.sum(dest, axis=-1, keepdims=True)
            if not all_finite(np, total):
                return None
        else:
            np.log(block, out=dest)
            total = np.sum(dest, axis=-1, keepdims=True)
        dest -= total / n
    return out.reshape(x.shape)


@labelled(Spec(parts=("z", "mask")))
def clr_inv(
    z: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    degenerate: Degenerate = "raise",
) -> Array:
    """Inverse of :func:`clr`: the closed composition ``softmax(z)`` over visible parts.

    ``-inf`` marks an invisible part (as with ``from_logits``); a row with one visible part is
    the one-part composition ``[1]``. ``degenerate="nan"`` gives NaN for rows without any
    visible part instead of raising (see :func:`clr`).

    Raises
    ------
    NonFiniteError
        With ``validate``: ``z`` holds NaN or ``+inf``.
    TooFewPartsError
        With ``validate`` and ``degenerate="raise"``: a row has no visible part at all.

    Examples
    --------
    >>> import attncoda as ac
    >>> x = ac.closure([1.0, 2.0, 5.0])
    >>> bool(abs(ac.clr_inv(ac.clr(x)) - x).max() < 1e-12)
    True
    """
    lc = log_composition(z, axis, mask=mask, from_logits=True, validate=validate, what="z")
    low = lc.degenerate_rows(1, degenerate, validate)
    with np.errstate(invalid="ignore"):  # rows without any part: NaN, as asked
        return lc.restore(nan_rows(lc.xp, lc.xp.exp(lc.log_closed()), low))


def _sink_index(lc: LogComposition) -> Array:
    """Index of the first visible part of each row (keepdims), as an integer array."""
    xp = lc.xp
    vis = lc.visible_full()
    return xp.argmax(xp.astype(vis, xp.int8), axis=-1, keepdims=True)


@labelled(Spec(resized="alr"))
def alr(
    x: Array,
    ref: int | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    ref_idx: int | None = None,
    denominator_idx: int | None = None,
    degenerate: Degenerate = "raise",
) -> Array:
    r"""Additive log-ratio transform against a reference part, :math:`\log(x_j / x_{ref})`.

    The reference defaults to the **sink**: the first *visible* part of each row. Where every
    part is visible that is position 0, the default of scikit-bio (``ref_idx=0``) and
    composition-stats (``denominator_idx=0``), with the same ``D - 1`` coordinates. The two
    deliberate differences (see :doc:`gotchas`):

    - with hidden parts (``mask=``, or ``-inf`` logits with ``from_logits``), position 0 may be
      padding, so the default reference is each row's first *visible* part, and the parts axis
      keeps its ``D`` positions (rows have their reference at different places);
    - R's ``compositions::alr`` (``ivar``) and ``coda.base`` use the *last* part by default.

    Parameters
    ----------
    x : array_like or torch.Tensor
        Any leading shape (composition-stats takes 1-D or 2-D input only).
    ref : int, optional
        Index of the reference part along ``axis``; default: first visible part per row.
    axis : int, default -1
    validate : bool, default True
    mask : array_like of bool, optional
    from_logits : bool, default False
        With logits ``z`` the result is ``z_j - z_ref``.
    ref_idx, denominator_idx : int, optional
        Aliases of ``ref``: scikit-bio's name (since 0.7) and composition-stats' (and older
        scikit-bio's). Give the reference under one name only.
    degenerate : {"raise", "nan"}, default "raise"
        Rows with fewer than two visible parts: raise, or NaN in those rows (see :func:`clr`).

    Returns
    -------
    Array
        Without ``mask``: the reference column is removed (``D - 1`` coordinates, as in
        scikit-bio). With ``mask`` rows may have different reference positions, so the parts axis
        keeps its length ``D``; the reference coordinate and invisible parts are 0.

    Raises
    ------
    ShapeMismatchError
        ``ref`` is not an integer (bools are refused) or out of range, or (with ``validate``)
        the reference part is invisible in some rows.
    CompositionError
        The reference is given under two names (e.g. ``ref`` and ``ref_idx``).
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    See Also
    --------
    alr_inv : The inverse.
    skbio.stats.composition.alr : ``alr(mat, ref_idx=0, axis=-1, validate=True)``.
    composition_stats.alr : ``alr(mat, denominator_idx=0)``, 1-D or 2-D numpy input.

    References
    ----------
    J. Aitchison, *The Statistical Analysis of Compositional Data*, Chapman & Hall, 1986.

    scikit-bio, ``skbio.stats.composition.alr``,
    https://scikit.bio/docs/latest/generated/skbio.stats.composition.alr.html

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.alr([0.5, 0.25, 0.25]).round(4)
    array([-0.6931, -0.6931])
    >>> ac.alr([0.5, 0.25, 0.25], ref_idx=1).round(4)  # scikit-bio's name for ref
    array([0.6931, 0.    ])
    >>> ac.alr([[0.0, 0.5, 0.5]], mask=[[False, True, True]])
    array([[0., 0., 0.]])
    """
    ref, ref_name = _reference(ref, ref_idx, denominator_idx)
    lc = log_composition(x, axis, mask=mask, from_logits=from_logits, validate=validate)
    low = lc.degenerate_rows(2, degenerate, validate)
    xp = lc.xp
    n = lc.n_parts
    if ref is not None:
        ref = check_index(ref, n, ref_name)
        ref_log = lc.log[..., ref : ref + 1]
        if validate and lc.visible is not None and not bool(xp.all(lc.visible[..., ref])):
            raise ShapeMismatchError(f"the reference part {ref} is invisible in some rows")
    if lc.visible is None and mask is None:
        r = 0 if ref is None else ref
        out = lc.log - lc.log[..., r : r + 1]
        keep = [j for j in range(n) if j != r]
        return lc.restore(nan_rows(xp, out[..., keep], low))
    if ref is None:
        ref_log = xp.take_along_axis(lc.log, _sink_index(lc), axis=-1)
    with np.errstate(invalid="ignore"):  # rows without any part: -inf - -inf, NaN as asked
        return lc.restore(nan_rows(xp, lc.zero_invisible(lc.log - ref_log), low))


@labelled(Spec(parts=("y", "mask"), resized="inverse", default_dim=("key_alr", "key")))
def alr_inv(
    y: Array,
    ref: int | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    ref_idx: int | None = None,
    denominator_idx: int | None = None,
) -> Array:
    """Inverse of :func:`alr`.

    Without ``mask``, ``y`` has ``D - 1`` coordinates and a zero is inserted at ``ref``
    (default 0, as in scikit-bio and composition-stats). With ``mask``, ``y`` keeps all ``D``
    positions (as :func:`alr` returns them) and the reference (default: first visible part) is
    taken to be 0 whatever ``y`` holds there. A ``-inf`` coordinate is a zero part.

    Parameters
    ----------
    y : array_like or torch.Tensor
        alr coordinates, any leading shape.
    ref : int, optional
        Position of the reference part in the result.
    axis : int, default -1
    validate : bool, default True
    mask : array_like of bool, optional
        Visible parts of the result (then ``y`` has ``D`` positions).
    ref_idx, denominator_idx : int, optional
        Aliases of ``ref`` (scikit-bio's and composition-stats' names); give one name only.

    Raises
    ------
    NonFiniteError
        With ``validate``: a visible coordinate is NaN or ``+inf``.
    ShapeMismatchError
        ``ref`` is not an integer or out of range (``0 <= ref < D``, negative counting from the
        end), or (with ``mask`` and ``validate``) the reference part is invisible in some rows.
    TooFewPartsError
        With ``mask`` and ``validate``: a row has no visible part.
    CompositionError
        The reference is given under two names.

    See Also
    --------
    alr : The transform.
    skbio.stats.composition.alr_inv : ``alr_inv(mat, ref_idx=0, axis=-1)``.
    composition_stats.alr_inv : ``alr_inv(mat, denominator_idx=0)``, 1-D or 2-D numpy input.

    References
    ----------
    J. Aitchison, *The Statistical Analysis of Compositional Data*, Chapman & Hall, 1986.

    Examples
    --------
    >>> import attncoda as ac
    >>> x = ac.closure([3.0, 1.0, 4.0, 1.0])
    >>> bool(abs(ac.alr_inv(ac.alr(x)) - x).max() < 1e-12)
    True
    >>> bool(abs(ac.alr_inv(ac.alr(x, denominator_idx=2), denominator_idx=2) - x).max() < 1e-12)
    True
    """
    ref, ref_name = _reference(ref, ref_idx, denominator_idx)
    xp, y_last, visible, ax = parts_last(y, axis, mask, what="y")
    if mask is None:
        n = int(y_last.shape[-1]) + 1
        r = 0 if ref is None else check_index(ref, n, ref_name)
        zero = xp.zeros((*y_last.shape[:-1], 1), dtype=y_last.dtype, device=device_of(y_last))
        log = xp.concat([y_last[..., :r], zero, y_last[..., r:]], axis=-1)
    else:
        assert visible is not None
        n = int(y_last.shape[-1])
        positions = xp.arange(n, device=device_of(y_last))
        if validate and not bool(xp.all(xp.any(visible, axis=-1))):
            raise TooFewPartsError(
                "some rows have no visible part (mask= hides them all); drop those rows"
            )
        if ref is None:
            is_ref = positions == xp.argmax(xp.astype(visible, xp.int8), axis=-1, keepdims=True)
        else:
            r = check_index(ref, n, ref_name)
            if validate and not bool(xp.all(visible[..., r])):
                raise ShapeMismatchError(
                    f"the reference part {r} is invisible in some rows; use {ref_name}=None for "
                    "the first visible part of each row"
                )
            is_ref = xp.broadcast_to(positions == r, tuple(y_last.shape))
        neg_inf = xp.full((), -math.inf, dtype=y_last.dtype, device=device_of(y_last))
        log = xp.where(is_ref, xp.zeros_like(y_last), xp.where(visible, y_last, neg_inf))
    return xp.moveaxis(_softmax_checked(xp, log, validate, "alr coordinates"), -1, ax)


def _reference(
    ref: int | None, ref_idx: int | None, denominator_idx: int | None
) -> tuple[int | None, str]:
    """The reference part of :func:`alr` / :func:`alr_inv` given under one of its three names
    (ours, scikit-bio's, composition-stats'), and that name (for error messages)."""
    given = [
        (name, value)
        for name, value in (
            ("ref", ref),
            ("ref_idx", ref_idx),
            ("denominator_idx", denominator_idx),
        )
        if value is not None
    ]
    if len(given) > 1:
        names = " and ".join(f"{name}={value!r}" for name, value in given)
        raise CompositionError(
            f"{names} name the same reference part (ref_idx and denominator_idx are aliases of "
            "ref, for scikit-bio and composition-stats code); give it once"
        )
    return (given[0][1], given[0][0]) if given else (None, "ref")


def _softmax_checked(xp: Any, log: Array, validate: bool, what: str) -> Array:
    """``softmax`` over the last axis; with ``validate``, NaN or ``+inf`` inputs are refused.

    The check is free: a row's log-sum-exp is finite exactly when the row has no NaN, no
    ``+inf`` and at least one finite value.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        lse = logsumexp(xp, log, keepdims=True)
        if validate and not all_finite(xp, lse):
            raise NonFiniteError(
                f"{what} contain NaN or infinite values (or a row has no finite value); "
                "attncoda never propagates them silently. Fix those rows first"
            )
        return xp.exp(log - lse)


# --------------------------------------------------------------------------------------------
# isometric log-ratios


def pivot_basis(n_parts: int) -> np.ndarray:
    """Orthonormal ilr basis of pivot (sequential binary partition) coordinates, ``(D-1, D)``.

    Balance ``i`` contrasts part ``i`` with all later parts, so the first balance is
    *first part (the sink) vs the rest (content)*:
    ``z_1 = sqrt((D-1)/D) * log(x_1 / g(x_2..x_D))``.

    Raises
    ------
    ShapeMismatchError
        ``n_parts`` is not an integer (bools and floats are refused).
    TooFewPartsError
        ``n_parts < 2``.

    Examples
    --------
    >>> import attncoda as ac
    >>> V = ac.pivot_basis(3)
    >>> bool(abs(V @ V.T - np.eye(2)).max() < 1e-12)
    True
    """
    n = check_count(n_parts, "n_parts (an ilr basis's number of parts)", 2)
    return group_basis([[0], list(range(1, n))], n)


def sbp_basis(sbp: Array) -> np.ndarray:
    """Orthonormal ilr basis from a sequential-binary-partition sign matrix, as in scikit-bio.

    Parameters
    ----------
    sbp : array_like, shape (D-1, D)
        Row ``i`` has ``+1`` for the parts in the numerator group of balance ``i``, ``-1`` for the
        denominator group and ``0`` for parts not involved.

    Returns
    -------
    numpy.ndarray, shape (D-1, D)
        Rows are orthonormal clr vectors (numpy even for a tensor ``sbp``: a basis is a small
        table, which :func:`ilr` moves to the data's device), as scikit-bio returns them;
        composition-stats returns ``clr_inv`` of these rows (compositions) instead.

    Raises
    ------
    ShapeMismatchError
        ``sbp`` is not of shape ``(D-1, D)`` with ``D >= 2``, holds entries other than
        ``+1``, ``-1`` and ``0`` (NaN, booleans, strings, fractions), has a row without a ``+1``
        or a ``-1`` part, or its rows are not a *sequential* partition (the balances would not
        be orthogonal).

    Examples
    --------
    >>> import attncoda as ac
    >>> ac.sbp_basis([[1, -1, -1], [0, 1, -1]]).round(4)
    array([[ 0.8165, -0.4082, -0.4082],
           [ 0.    ,  0.7071, -0.7071]])
    """
    if is_tensor(sbp):
        sbp = sbp.detach().cpu().numpy()  # a small sign table: the basis is a numpy array
    s = _array._as_numpy(sbp, "sbp")
    if s.ndim != 2 or s.shape[0] != s.shape[1] - 1 or s.shape[1] < 2:
        raise ShapeMismatchError(
            f"an SBP must have shape (D-1, D) with D >= 2, got {s.shape}; row i marks balance "
            "i's numerator parts +1 and denominator parts -1"
        )
    if s.dtype.kind not in "iuf" or not np.isin(s, (-1, 0, 1)).all():
        raise ShapeMismatchError(
            f"SBP entries must be +1, -1 or 0 (numbers, not {s.dtype}), e.g. "
            "[[1, -1, -1], [0, 1, -1]]"
        )
    r = (s == 1).sum(axis=1, keepdims=True).astype(float)
    q = (s == -1).sum(axis=1, keepdims=True).astype(float)
    if (r == 0).any() or (q == 0).any():
        raise ShapeMismatchError("every SBP row needs at least one +1 and one -1 part")
    pos = np.sqrt(q / (r * (r + q)))
    neg = -np.sqrt(r / (q * (r + q)))
    basis = np.where(s == 1, pos, np.where(s == -1, neg, 0.0))
    if not np.allclose(basis @ basis.T, np.eye(s.shape[0]), atol=1e-10):
        raise ShapeMismatchError(
            "the SBP rows are not a sequential binary partition (balances are not orthogonal): "
            "each row must split one group of an earlier row (the first row splits all parts)"
        )
    return basis


def group_basis(groups: Sequence[Sequence[int]], n_parts: int | None = None) -> np.ndarray:
    """ilr basis for ordered groups of parts, e.g. sink / hub / content.

    The balances are: group 1 vs groups 2..m, group 2 vs groups 3..m, ..., then within each group
    (in order) part 1 vs the rest of the group, part 2 vs the rest, ... Every group must be
    non-empty and together the groups must cover ``0..D-1`` exactly once.

    Raises
    ------
    TooFewPartsError
        A group is empty, or there are fewer than 2 parts.
    ShapeMismatchError
        A part index is not an integer (bools and floats are refused), the groups do not cover
        ``0..D-1`` exactly once (an overlap, a gap, an index out of range), or ``n_parts`` is
        not an integer that matches the groups.

    Examples
    --------
    >>> import attncoda as ac
    >>> B = ac.group_basis([[0], [1], [2, 3, 4]])   # sink, hub, content
    >>> B.shape
    (4, 5)
    """
    groups = _index_groups(groups, "groups")
    if any(len(g) == 0 for g in groups):
        raise TooFewPartsError("every group needs at least one part")
    flat = [i for g in groups for i in g]
    n = len(flat) if n_parts is None else check_count(n_parts, "n_parts", 2)
    if sorted(flat) != list(range(n)):
        raise ShapeMismatchError(
            f"groups must cover each of the {n} parts 0..{n - 1} exactly once, got {groups}"
        )
    if n < 2:
        raise TooFewPartsError("an ilr basis needs at least 2 parts")
    rows = []
    for gi in range(len(groups) - 1):
        row = np.zeros(n)
        row[groups[gi]] = 1
        row[[i for g in groups[gi + 1 :] for i in g]] = -1
        rows.append(row)
    for g in groups:
        for j in range(len(g) - 1):
            row = np.zeros(n)
            row[g[j]] = 1
            row[g[j + 1 :]] = -1
            rows.append(row)
    return sbp_basis(np.array(rows))


def _index_groups(groups: Any, what: str) -> list[list[int]]:
    """``groups`` as lists of Python ints, refusing bools, floats and non-sequences."""
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise ShapeMismatchError(f"{what} must be a list of index lists, got {groups!r}")
    out = []
    for g in groups:
        if isinstance(g, (str, bytes)) or not hasattr(g, "__iter__"):
            raise ShapeMismatchError(
                f"{what} must be a list of index lists such as [[0], [1, 2]], got {groups!r}"
            )
        items = g.tolist() if hasattr(g, "tolist") else list(g)
        if any(not is_integer(i) for i in items):
            raise ShapeMismatchError(
                f"{what} must hold integer part indices (not bools or floats), got {list(items)}"
            )
        out.append([int(i) for i in items])
    return out


def _compact(lc: LogComposition) -> tuple[Array, Array | None, Array]:
    """Move visible parts to the front of each row, keeping their order.

    Returns the compacted log parts, the permutation used (``None`` without a mask) and the
    visible counts (keepdims, float).
    """
    xp = lc.xp
    if lc.visible is None:
        return lc.log, None, lc.count()
    order = xp.argsort(xp.astype(~lc.visible, xp.int8), axis=-1, stable=True)
    return xp.take_along_axis(lc.log, order, axis=-1), order, lc.count()


def _pivot_coordinates(log: Array, counts: Array, xp: Any) -> Array:
    """Pivot coordinates of compacted rows (visible parts first, ``counts`` of them)."""
    n = int(log.shape[-1])
    idx = xp.astype(xp.arange(n, device=device_of(log)), log.dtype)
    visible = idx < counts
    safe = xp.where(visible, log, xp.zeros_like(log))
    suffix = xp.flip(xp.cumulative_sum(xp.flip(safe, axis=-1), axis=-1), axis=-1)
    after = suffix[..., 1:]  # sum of parts after i
    r = counts - 1 - idx[:-1]  # number of parts after i
    rs = xp.where(r > 0, r, xp.ones_like(r))
    coord = xp.sqrt(rs / (rs + 1)) * (safe[..., :-1] - after / rs)
    return xp.where(r > 0, coord, xp.zeros_like(coord))


def _pivot_inverse(z: Array, counts: Array, xp: Any) -> Array:
    """clr of compacted rows from pivot coordinates (0 beyond each row's count)."""
    n = int(z.shape[-1]) + 1
    if n == 1:  # no coordinates: the one-part composition, whose clr is 0
        return xp.zeros((*z.shape[:-1], 1), dtype=z.dtype, device=device_of(z))
    idx = xp.astype(xp.arange(n - 1, device=device_of(z)), z.dtype)
    r = counts - 1 - idx
    rs = xp.where(r > 0, r, xp.ones_like(r))
    z = xp.where(r > 0, z, xp.zeros_like(z))
    own = z * xp.sqrt(rs / (rs + 1))
    w = z / xp.sqrt(rs * (rs + 1))
    before = xp.cumulative_sum(w, axis=-1) - w  # sum over i < j
    zero = xp.zeros_like(z[..., :1])
    own = xp.concat([own, zero], axis=-1)
    before = xp.concat([before, before[..., -1:] + w[..., -1:]], axis=-1)
    return own - before


@labelled(Spec(resized="ilr"))
def ilr(
    x: Array,
    basis: Array | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    r"""Isometric log-ratio transform, ``clr(x) @ basis.T``.

    The default basis is :func:`pivot_basis` over each row's visible parts: the first coordinate
    is the sink-vs-content balance :math:`\sqrt{n/(n+1)}\,\log(s / g(c))`.

    Parameters
    ----------
    x : array_like or torch.Tensor
    basis : array_like, shape (D-1, D), optional
        Orthonormal clr basis (e.g. from :func:`sbp_basis`, :func:`group_basis` or
        :func:`pivot_basis`): finite, with orthonormal rows (``B B^T = I``) that are orthogonal
        to the ones vector (``B 1 = 0``, so each row is a clr vector). Not allowed together with
        a mask that hides parts.
    axis : int, default -1
    validate : bool, default True
        Check the data as :func:`clr` does, and an explicit basis as described under Raises
        (the basis check costs one ``(D-1) x D`` Gram product, whatever the number of rows).
    mask : array_like of bool, optional
        With the default basis, a row with ``n`` visible parts fills its first ``n - 1``
        coordinates (in the order of the visible parts) and holds 0 in the rest, so norms and
        inner products stay those of the visible sub-composition.
    from_logits : bool, default False
    degenerate : {"raise", "nan"}, default "raise"
        Rows with fewer than two visible parts: raise, or NaN in those rows (see :func:`clr`).

    Returns
    -------
    Array with ``D - 1`` coordinates along ``axis``.

    Raises
    ------
    ShapeMismatchError
        ``basis`` is not of shape ``(D-1, D)``, or it is given with a mask that hides parts.
    NonFiniteError
        With ``validate``: ``basis`` holds NaN or infinite values (or the data does, as in
        :func:`clr`).
    CompositionError
        With ``validate``: ``basis`` is not orthonormal or its rows do not sum to zero, beyond
        the tolerance of its dtype (the square root of its machine epsilon: 1.5e-8 in float64,
        3.5e-4 in float32, measured as the largest entry of ``|B B^T - I|`` and of
        ``|B 1| / sqrt(D)``); or ``basis`` is not numeric.
    ZeroPartError, NegativePartError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    See Also
    --------
    skbio.stats.composition.ilr, composition_stats.ilr

    Notes
    -----
    These are scikit-bio's basis checks (``skbio.stats.composition.ilr`` refuses a basis that is
    not orthonormal), plus ``B 1 = 0``, without which ``B`` is not an isometry of the clr
    space; a basis given in float32 limits the result to float32 precision.

    Two deliberate differences from composition-stats (and the first from scikit-bio): the
    default basis is the pivot basis, whose first coordinate is the sink-vs-content balance,
    not Gram-Schmidt's (both are orthonormal, so norms and distances agree); and a basis is
    given as clr vectors, as scikit-bio takes it, not as compositions (composition-stats applies
    clr to the basis rows itself).

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> x = ac.closure([6.0, 1.0, 2.0, 1.0])
    >>> z = ac.ilr(x)
    >>> bool(np.isclose(z[0], np.sqrt(3 / 4) * np.log(x[0] / np.exp(np.log(x[1:]).mean()))))
    True
    """
    # (no blocks of rows here: each block would be a matmul, and every BLAS call synchronises
    # its threads, which costs more than the blocks save as soon as other jobs share the cores)
    lc = log_composition(
        x, axis, mask=mask, from_logits=from_logits, validate=validate, others=(basis,)
    )
    low = lc.degenerate_rows(2, degenerate, validate)
    xp = lc.xp
    if basis is not None:
        b = _basis_like(basis, xp, lc.log, lc.n_parts, validate)
        if lc.visible is not None and not bool(xp.all(lc.visible)):
            raise ShapeMismatchError(
                "an explicit ilr basis needs every part visible; rows with hidden parts use the "
                "default pivot basis (basis=None)"
            )
        return lc.restore(nan_rows(xp, lc.clr(consume=True) @ b.T, low))
    if lc.visible is None and lc.n_parts >= 2:
        # every part visible: the pivot coordinates are one matmul of the centred logs
        return lc.restore(lc.clr(consume=True) @ _pivot_basis_t(lc))
    log, _, counts = _compact(lc)
    with np.errstate(invalid="ignore", divide="ignore"):  # rows without any part: NaN, as asked
        return lc.restore(nan_rows(xp, _pivot_coordinates(log, counts, xp), low))


@functools.lru_cache(maxsize=32)
def _pivot_basis_t_numpy(n_parts: int, dtype: str) -> np.ndarray:
    out = np.ascontiguousarray(pivot_basis(n_parts).T, dtype=dtype)
    out.flags.writeable = False
    return out


def _pivot_basis_t(lc: LogComposition) -> Array:
    """The transposed pivot basis ``(D, D-1)`` in ``lc``'s dtype and on its device."""
    dtype = lc.log.dtype
    if isinstance(lc.log, np.ndarray):
        return _pivot_basis_t_numpy(lc.n_parts, np.dtype(dtype).name)
    import torch

    # torch.tensor copies (the cached array is read-only)
    return torch.tensor(
        _pivot_basis_t_numpy(lc.n_parts, "float64"), dtype=dtype, device=lc.log.device
    )


def basis_tolerance(dtype: Any) -> float:
    """How far an explicit basis of ``dtype`` may be from orthonormal: ``sqrt(eps)``.

    1.5e-8 in float64 (well-built bases are orthonormal to ~1e-14) and 3.5e-4 in float32 (a
    pivot basis of 4,096 parts built in float32 is off by ~1e-5).
    """
    name = str(dtype).replace("torch.", "")
    eps = float(np.finfo(np.dtype(name)).eps) if name != "bfloat16" else 2.0**-7
    return math.sqrt(eps)


# Bases large enough that their Gram product costs more than hashing them (D >= ~512) are
# remembered once validated, by a digest of their bytes, so that calls reusing one basis check
# it in one pass instead of O(D^3).
_CACHED_BASIS_SIZE = 1 << 18
_VALID_BASES: dict[bytes, None] = {}


def _basis_digest(b: Array) -> bytes | None:
    if not isinstance(b, np.ndarray) or b.size < _CACHED_BASIS_SIZE:
        return None
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(f"{b.shape}{b.dtype}".encode())
    h.update(np.ascontiguousarray(b).data)
    return h.digest()


def check_basis(b: Array, xp: Any, what: str = "basis") -> None:
    """Refuse an ilr basis ``(D-1, D)`` that is not finite, orthonormal and orthogonal to ``1``.

    Checked in the basis's own dtype, to :func:`basis_tolerance`. Costs one Gram product of the
    basis (never a pass over the data); large bases that passed are remembered by digest.
    """
    digest = _basis_digest(b)
    if digest is not None and digest in _VALID_BASES:
        return
    fix = (
        "build it with ac.sbp_basis, ac.group_basis or ac.pivot_basis (or pass validate=False "
        "if you know it is right)"
    )
    if not bool(xp.all(xp.isfinite(b))):
        raise NonFiniteError(f"{what} contains NaN or infinite values; {fix}")
    n_rows, n = (int(v) for v in b.shape)
    tol = basis_tolerance(b.dtype)
    dev = device_of(b)
    ones_err = float(xp.max(xp.abs(xp.sum(b, axis=-1)))) / math.sqrt(n) if n_rows else 0.0
    if ones_err > tol:
        raise CompositionError(
            f"{what} rows are not clr vectors: they must sum to 0 (B 1 = 0), but "
            f"max |B 1|/sqrt(D) = {ones_err:.3g} > {tol:.2g} ({b.dtype}); {fix}"
        )
    gram = b @ xp.matrix_transpose(b)
    eye = xp.eye(n_rows, dtype=b.dtype, device=dev)
    gram_err = float(xp.max(xp.abs(gram - eye))) if n_rows else 0.0
    if not gram_err <= tol:
        raise CompositionError(
            f"{what} is not orthonormal: max |B B^T - I| = {gram_err:.3g} > {tol:.2g} "
            f"({b.dtype}); {fix}"
        )
    if digest is not None:
        if len(_VALID_BASES) >= 8:
            _VALID_BASES.pop(next(iter(_VALID_BASES)))
        _VALID_BASES[digest] = None


def _basis_like(basis: Array, xp: Any, like: Array, n_parts: int, validate: bool) -> Array:
    """``basis`` checked (shape always; values with ``validate``) and cast to ``like``'s dtype
    and device."""
    b = as_float(basis, xp, first_tensor(like, basis), what="basis")
    if b.ndim != 2 or tuple(b.shape) != (n_parts - 1, n_parts):
        raise ShapeMismatchError(
            f"basis must have shape (D-1, D) = ({n_parts - 1}, {n_parts}), got "
            f"{tuple(b.shape)}; build one with ac.sbp_basis, ac.group_basis or ac.pivot_basis"
        )
    if validate:
        check_basis(b, xp)
    if b.dtype != like.dtype:
        b = xp.astype(b, like.dtype)
    return b


@labelled(Spec(parts=("z", "mask"), resized="inverse", default_dim=("key_ilr",)))
def ilr_inv(
    z: Array,
    basis: Array | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
) -> Array:
    """Inverse of :func:`ilr`; returns closed compositions with ``D = z.shape[axis] + 1`` parts.

    With ``mask`` (shape of the *composition*, ``D`` parts) the default pivot coordinates are
    mapped back onto the visible parts; invisible parts come out as 0. A row with ``n`` visible
    parts uses its first ``n - 1`` coordinates; the rest must be 0, as :func:`ilr` writes them.

    Raises
    ------
    NonFiniteError
        With ``validate``: ``z`` holds NaN or infinite values, or ``basis`` does.
    ShapeMismatchError
        ``basis`` has the wrong shape or is combined with ``mask``; with ``validate``, ``z``
        has a non-zero coordinate beyond a row's ``n - 1`` visible parts (the mask does not
        match the one ``ilr`` used).
    TooFewPartsError
        With ``validate``: ``mask`` hides every part of a row.
    CompositionError
        With ``validate``: ``basis`` is not orthonormal with rows summing to zero (see
        :func:`ilr`).

    Examples
    --------
    >>> import attncoda as ac
    >>> x = ac.closure([3.0, 1.0, 4.0, 1.0])
    >>> bool(abs(ac.ilr_inv(ac.ilr(x)) - x).max() < 1e-12)
    True
    """
    if basis is not None and mask is not None:
        raise ShapeMismatchError("an explicit ilr basis cannot be combined with mask=")
    xp, zl, _, ax = parts_last(z, axis, None, others=(mask, basis), what="z")
    n = int(zl.shape[-1]) + 1
    if basis is not None:
        b = _basis_like(basis, xp, zl, n, validate)
        clr_vals = zl @ b
        return xp.moveaxis(_softmax_checked(xp, clr_vals, validate, "ilr coordinates"), -1, ax)
    if mask is None:
        counts = xp.full((*zl.shape[:-1], 1), float(n), dtype=zl.dtype, device=device_of(zl))
        with np.errstate(invalid="ignore"):
            clr_vals = _pivot_inverse(zl, counts, xp)
        return xp.moveaxis(_softmax_checked(xp, clr_vals, validate, "ilr coordinates"), -1, ax)
    lead = [int(v) for v in zl.shape[:-1]]
    caller_shape = [*lead[:ax], n, *lead[ax:]]  # the composition's shape, parts on ``axis``
    _, template, visible, _ = parts_last(
        xp.zeros(tuple(caller_shape), dtype=zl.dtype, device=device_of(zl)), ax, mask
    )
    lc = LogComposition(xp, template, visible, ax)
    _, order, counts = _compact(lc)
    if validate:
        if bool(xp.any(counts < 1)):
            raise TooFewPartsError(
                "some rows have no visible part (mask= hides them all); drop those rows"
            )
        idx_z = xp.astype(xp.arange(n - 1, device=device_of(zl)), zl.dtype)
        unused = idx_z >= counts - 1
        if bool(xp.any(unused & (zl != 0))):
            raise ShapeMismatchError(
                "z has non-zero coordinates beyond some rows' visible parts (a row with n "
                "visible parts has n - 1 coordinates, then zeros); pass the mask that ilr used"
            )
    with np.errstate(invalid="ignore"):
        compact = _pivot_inverse(zl, counts, xp)
    idx = xp.astype(xp.arange(n, device=device_of(zl)), zl.dtype)
    compact = xp.where(idx < counts, compact, xp.full_like(compact, -math.inf))
    if order is not None:
        inverse = xp.argsort(order, axis=-1, stable=True)
        compact = xp.take_along_axis(compact, inverse, axis=-1)
    return xp.moveaxis(_softmax_checked(xp, compact, validate, "ilr coordinates"), -1, ax)


def _ndim(a: Array) -> int:
    return int(np.ndim(a)) if not hasattr(a, "ndim") else int(a.ndim)


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
    x, y = broadcast_pair(as_float(x, xp, like), as_float(y, xp, like, what="y"), xp, axis)
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


@labelled(Spec(parts=("x", "y", "mask"), pairwise=True))
def inner(
    x: Array,
    y: Array,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    degenerate: Degenerate = "raise",
) -> Array:
    r"""Aitchison inner products of every row of ``x`` with every row of ``y`` (the Gram matrix).

    :math:`\langle x, y \rangle_a = \langle \mathrm{clr}\,x, \mathrm{clr}\,y \rangle =
    \frac{1}{2D} \sum_{i,j} \ln\frac{x_i}{x_j} \ln\frac{y_i}{y_j}`, for all pairs of rows, as
    ``skbio.stats.composition.inner`` and ``composition_stats.inner`` return it:
    ``clr(x) @ clr(y).T``. The product of *matching* rows is :func:`paired_inner`.

    Parameters
    ----------
    x : array_like or torch.Tensor, shape (..., N, D) or (D,)
        Rows on the second-to-last axis once the parts ``axis`` is moved last; a 1-D ``x`` is one
        row, and its axis is dropped from the result (as :func:`numpy.matmul` does).
    y : array_like or torch.Tensor, shape (..., M, D) or (D,)
        The same number of parts ``D``; leading axes broadcast against ``x``'s.
    axis : int, default -1
        The parts axis of each of ``x`` and ``y``.
    validate : bool, default True
    mask : array_like of bool, optional
        Visible parts, the same for every row (e.g. shape ``(D,)``): compositions are only
        compared over the same parts.
    from_logits : bool, default False
        ``x`` and ``y`` hold logits or log-probabilities.
    degenerate : {"raise", "nan"}, default "raise"
        Rows with fewer than two visible parts: raise, or NaN in their products (see
        :func:`clr`).

    Returns
    -------
    Array of shape (..., N, M): ``(N,)`` or ``(M,)`` when one input is 1-D, a 0-d value when
    both are.

    Raises
    ------
    ShapeMismatchError
        ``x`` and ``y`` have different numbers of parts, leading axes that do not broadcast, or
        a mask that differs between rows.
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    See Also
    --------
    paired_inner : The inner product of matching rows (``x[i]`` with ``y[i]``).
    pairwise_aitchison : All-pairs Aitchison distances, through the same Gram matrices.
    skbio.stats.composition.inner, composition_stats.inner : The same Gram matrix, for 2-D numpy
        input only (their ``.T`` reverses every axis of a 3-D input).

    Notes
    -----
    ``inner`` used to return the products of matching rows; that function is now
    :func:`paired_inner`, and ``inner`` means what it means in scikit-bio and composition-stats.

    References
    ----------
    J. Aitchison, *The Statistical Analysis of Compositional Data*, Chapman & Hall, 1986.

    scikit-bio, ``skbio.stats.composition.inner``,
    https://scikit.bio/docs/latest/generated/skbio.stats.composition.inner.html

    Examples
    --------
    >>> import attncoda as ac
    >>> x = ac.closure([[2.0, 2.0, 6.0], [4.0, 4.0, 2.0]])
    >>> ac.inner(x, x).round(6)
    array([[ 0.804633, -0.507667],
           [-0.507667,  0.320302]])
    >>> ac.inner(x, x[1]).round(6)  # a 1-D y: one column
    array([-0.507667,  0.320302])
    """
    xp = namespace(x, y, mask)
    like = first_tensor(x, y, mask)
    x, y = to_kind(x, xp, like, "x"), to_kind(y, xp, like, "y")
    x_1d, y_1d = _ndim(x) == 1, _ndim(y) == 1
    ax_x, ax_y = normalize_axis(axis, _ndim(x)), normalize_axis(axis, _ndim(y))
    nx, ny = int(x.shape[ax_x]), int(y.shape[ax_y])
    if nx != ny:
        raise ShapeMismatchError(
            f"x {tuple(x.shape)} and y {tuple(y.shape)} must have the same parts on axis={axis} "
            f"({nx} != {ny}): compositions are only compared over the same parts"
        )
    if mask is not None:
        for arr in (x, y):
            _check_shared_mask(mask, arr, axis)
    cx = xp.moveaxis(
        clr(x, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate), ax_x, -1
    )
    cy = xp.moveaxis(
        clr(y, axis, validate, mask=mask, from_logits=from_logits, degenerate=degenerate), ax_y, -1
    )
    a, b = (cx[None] if x_1d else cx), (cy[None] if y_1d else cy)
    try:
        np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ShapeMismatchError(
            f"x {tuple(x.shape)} and y {tuple(y.shape)} have leading axes (before the rows and "
            "parts) that do not broadcast"
        ) from None
    if isinstance(a, np.ndarray):
        g = row_gram(a, b)
    else:
        g = a @ xp.matrix_transpose(b)
    if y_1d:
        g = g[..., 0]
    if x_1d:
        g = g[..., 0, :] if not y_1d else g[..., 0]
    return g


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
    return xp.sum(cx * cy, axis=normalize_axis(axis, cx.ndim))


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
    return xp.sqrt(xp.sum(c * c, axis=normalize_axis(axis, c.ndim)))


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
    d = cx - cy
    return xp.sqrt(xp.sum(d * d, axis=normalize_axis(axis, d.ndim)))


def _row_norms2(xp: Any, a: Array) -> Array:
    """Squared norms of the rows of ``a`` over its last axis, without an ``a * a`` temporary."""
    if isinstance(a, np.ndarray):
        return np.einsum("...i,...i->...", a, a)
    return xp.sum(a * a, axis=-1)


def row_gram(
    a: np.ndarray,
    b: np.ndarray | None = None,
    out: np.ndarray | None = None,
    *,
    backend: str = "auto",
    device: Any = None,
) -> np.ndarray:
    """``a @ b^T`` over the last two axes of numpy arrays (``b = a`` by default), as numpy.

    The one matrix-product backend behind every all-pairs computation of attncoda
    (:func:`pairwise_aitchison` and :func:`inner` here, the head comparisons of the analysis).
    Stacks of matrices broadcast as in :func:`numpy.matmul`; ``out`` receives the result.

    ``backend="auto"`` uses torch where it is installed, numpy otherwise; ``"torch"`` and
    ``"numpy"`` choose. torch shares the numpy memory (no copy) and writes into ``out``: numpy's
    stacked matmul calls BLAS once per matrix of the stack, and each call synchronises the BLAS
    threads, so as soon as other jobs share the cores it collapses (10x slower on a busy 2-core
    machine, benchmarks/bench_coda.py), while torch's batched GEMM splits the whole stack across
    its threads once (and its MKL is several times faster than the BLAS numpy wheels ship).
    Operands torch cannot take as they are (mixed dtypes, which numpy promotes; negative
    strides; integers) stay with numpy, on the CPU. ``device`` (a :class:`torch.device`, checked
    by the caller) runs the product there and brings the result back to the CPU.
    """
    views = None if backend == "numpy" else _torch_views(a, a if b is None else b)
    if views is None:
        bt = np.swapaxes(a if b is None else b, -1, -2)
        return np.matmul(a, bt, out=out)
    import torch

    ta, tb = views
    if device is not None:
        ta = ta.to(device)
        tb = ta if b is None else tb.to(device)
    if out is not None and device is None and out.flags.c_contiguous and out.flags.writeable:
        torch.matmul(ta, tb.transpose(-1, -2), out=torch.from_numpy(out))
        return out
    res = torch.matmul(ta, tb.transpose(-1, -2)).cpu().numpy()
    if out is None:
        return res
    out[...] = res
    return out


def _torch_views(a: np.ndarray, b: np.ndarray) -> tuple[Any, Any] | None:
    """``a`` and ``b`` as torch tensors sharing their memory, or None where torch is missing or
    cannot take them as they are (mixed dtypes, which numpy promotes; negative strides)."""
    try:
        import torch
    except ImportError:  # the core works without torch
        return None
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return None
    try:
        return torch.from_numpy(a), torch.from_numpy(b)
    except ValueError:  # negative strides
        return None


def gram_distances(
    a: Array,
    b: Array | None,
    xp: Any,
    *,
    squared: bool,
    overwrite: bool = False,
    out: np.ndarray | None = None,
) -> Array:
    """All-pairs Euclidean distances between the rows of ``a (..., N, D)`` and ``b (..., M, D)``.

    Uses ``|a|^2 + |b|^2 - 2 a.b`` with one matmul; tiny negative rounding is clipped to 0.
    ``b=None`` means ``b = a`` (then the diagonal is exactly 0). ``overwrite=True`` lets the
    centring reuse ``a``'s memory (only for a temporary the caller owns); ``out`` (numpy only)
    receives the result.
    """
    same = b is None
    if b is None and int(a.shape[-2]) > 0:
        # centring over items leaves distances unchanged and shrinks the norms that cancel
        mean = xp.mean(a, axis=-2, keepdims=True)
        if overwrite and can_overwrite(a):
            a -= mean
        else:
            a = a - mean
    if b is None:
        b = a
    na = _row_norms2(xp, a)[..., :, None]
    nb = na[..., 0][..., None, :] if same else _row_norms2(xp, b)[..., None, :]
    # d2 = na + nb - 2 a.b, built inside the matmul's result (the only full-size array)
    if isinstance(a, np.ndarray):
        # stacks through torch's batched GEMM; one matrix is one BLAS call in numpy either way
        d2 = row_gram(a, b, out, backend="auto" if a.ndim > 2 else "numpy")
    else:
        d2 = a @ xp.matrix_transpose(b)
    if can_overwrite(d2):
        return _distances_from_gram(d2, na, nb, same=same, squared=squared)
    d2 = na + nb - 2 * d2
    d2 = xp.clip(d2, 0.0, None)
    if same:
        n = int(d2.shape[-1])
        d2 = xp.where(xp.eye(n, dtype=xp.bool, device=device_of(d2)), xp.zeros_like(d2), d2)
    return d2 if squared else xp.sqrt(d2)


def _distances_from_gram(d2: Array, na: Array, nb: Array, *, same: bool, squared: bool) -> Array:
    """Turn the Gram matrix ``d2 = a.b`` into (squared) distances in place: ``na + nb - 2 a.b``.

    Tiny negative rounding is clipped to 0; with ``same`` the diagonal is exactly 0.
    """
    d2 *= -2
    d2 += na
    d2 += nb
    if isinstance(d2, np.ndarray):
        np.maximum(d2, 0.0, out=d2)
    else:
        d2.clamp_(min=0.0)
    if same:  # self-distances are exactly zero, not sqrt(rounding)
        if isinstance(d2, np.ndarray):
            idx = np.arange(d2.shape[-1])
            d2[..., idx, idx] = 0.0
        else:
            d2.diagonal(dim1=-2, dim2=-1).zero_()
    if squared:
        return d2
    if isinstance(d2, np.ndarray):
        return np.sqrt(d2, out=d2)
    return d2.sqrt_()


@labelled(Spec(parts=("x", "y", "mask"), pairwise=True))
def pairwise_aitchison(
    x: Array,
    y: Array | None = None,
    axis: int = -1,
    validate: bool = True,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    squared: bool = False,
    sum_over: int | tuple[int, ...] | None = None,
    degenerate: Degenerate = "raise",
) -> Array:
    """All-pairs Aitchison distances between the rows of ``x`` (and ``y``), via Gram matrices.

    Parameters
    ----------
    x : array, shape (..., N, D)
        Items on the second-to-last axis (after moving ``axis`` last), parts on ``axis``.
    y : array, shape (..., M, D), optional
        Defaults to ``x``.
    mask : array_like of bool, optional
        Must be the same for every item (rows are only compared over the same visible keys),
        i.e. broadcastable to ``(..., 1, D)``.
    squared : bool, default False
        Return squared distances (additive over queries, which is what head comparisons sum).
    sum_over : int or tuple of int, optional
        Axes of ``x`` (neither ``axis`` nor the item axis) whose squared distances are summed
        before the root, e.g. the query axis for head-vs-head distances over a whole sequence:
        ``sqrt(sum_q d(x[q, i], x[q, j])**2)``. The per-query matrices are never built: the clr
        rows of every summed index are laid end to end and go through one Gram matrix.
    degenerate : {"raise", "nan"}, default "raise"
        Rows with fewer than two visible parts: raise, or NaN in every distance to them (with
        ``sum_over``: to an item with such a row at any summed index); see :func:`clr`.

    Returns
    -------
    Array of shape (..., N, M), without the ``sum_over`` axes.

    Raises
    ------
    ShapeMismatchError
        ``x`` has no items axis, ``y``'s parts (or, with ``sum_over``, its other axes) differ
        from ``x``'s, the mask differs between items, or ``sum_over`` does not name leading
        axes (integers, not the part or item axis).
    ZeroPartError, NegativePartError, NonFiniteError, TooFewPartsError
        With ``validate``: as in :func:`clr`.

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> rng = np.random.default_rng(0)
    >>> x = ac.closure(rng.random((5, 8)))
    >>> D = ac.pairwise_aitchison(x)
    >>> bool(np.isclose(D[1, 3], ac.aitchison_distance(x[1], x[3])))
    True

    Head-vs-head distances summed over queries (queries x heads x keys):

    >>> att = ac.closure(rng.random((7, 3, 8)))
    >>> H = ac.pairwise_aitchison(att, sum_over=0)
    >>> bool(np.allclose(H, np.sqrt(ac.pairwise_aitchison(att, squared=True).sum(0))))
    True
    """
    check_degenerate(degenerate)
    xp = namespace(x, y, mask)
    like = first_tensor(x, y, mask)
    x = to_kind(x, xp, like, "x")
    y = None if y is None else to_kind(y, xp, like, "y")
    if y is not None:
        _check_pair_shapes(tuple(x.shape), tuple(y.shape), axis, exact=sum_over is not None)
    if mask is not None:
        _check_shared_mask(mask, x, axis)
    if sum_over is not None:
        return _pairwise_summed(
            x, y, axis, validate, mask, from_logits, squared, sum_over, degenerate
        )
    if y is None and mask is None and isinstance(x, np.ndarray) and degenerate == "raise":
        blocks = _pairwise_blocks(x, axis, validate, from_logits, squared)
        if blocks is not None:
            return blocks
    kw: dict[str, Any] = {"mask": mask, "from_logits": from_logits, "degenerate": degenerate}
    cx = clr(x, axis, validate, **kw)
    cy = cx if y is None else clr(y, axis, validate, **kw)
    xp = namespace(cx, cy)
    ax = normalize_axis(axis, cx.ndim)
    a = xp.moveaxis(cx, ax, -1)
    b = None if y is None else xp.moveaxis(cy, ax, -1)
    if a.ndim < 2:
        raise ShapeMismatchError("pairwise distances need items on an axis before the parts axis")
    if degenerate == "nan":
        return gram_distances_nan(a, b, xp, squared)
    # ``cx`` is our own clr result, so the centring inside may reuse its memory
    return gram_distances(a, b, xp, squared=squared, overwrite=True)


def gram_distances_nan(a: Array, b: Array | None, xp: Any, squared: bool) -> Array:
    """:func:`gram_distances` of clr rows where NaN rows (``degenerate="nan"``) give NaN pairs.

    Such rows are compared as zeros (one NaN would reach every pair through the centring and
    the norms), then every pair that involves one is set to NaN.
    """
    bad_a = xp.any(xp.isnan(a), axis=-1)
    a = xp.where(xp.isnan(a), xp.zeros_like(a), a)
    bad_b = bad_a
    if b is not None:
        bad_b = xp.any(xp.isnan(b), axis=-1)
        b = xp.where(xp.isnan(b), xp.zeros_like(b), b)
    d = gram_distances(a, b, xp, squared=squared, overwrite=True)
    bad = bad_a[..., :, None] | bad_b[..., None, :]
    return xp.where(bad, xp.full_like(d, math.nan), d)


def _check_pair_shapes(xs: tuple[int, ...], ys: tuple[int, ...], axis: int, exact: bool) -> None:
    """``x`` and ``y`` of :func:`pairwise_aitchison` must have the same parts and leading axes
    that broadcast (``exact``: equal), only their item counts may differ."""
    nd = len(xs)
    ax = normalize_axis(axis, nd)
    item = max((i for i in range(nd) if i != ax), default=None)
    ok = len(ys) == nd and item is not None and xs[ax] == ys[ax]
    if ok:
        lead_x = tuple(v for i, v in enumerate(xs) if i not in (ax, item))
        lead_y = tuple(v for i, v in enumerate(ys) if i not in (ax, item))
        if lead_x != lead_y:
            ok = not exact
            try:
                np.broadcast_shapes(lead_x, lead_y)
            except ValueError:
                ok = False
    if not ok:
        raise ShapeMismatchError(
            f"x {xs} and y {ys} must have the same parts and the same leading axes (only the "
            "item axis, the last one before the parts, may differ)"
        )


def _pairwise_summed(
    x: Array,
    y: Array | None,
    axis: int,
    validate: bool,
    mask: Array | None,
    from_logits: bool,
    squared: bool,
    sum_over: int | tuple[int, ...],
    degenerate: Degenerate = "raise",
) -> Array:
    """:func:`pairwise_aitchison` with squared distances summed over the ``sum_over`` axes.

    Squared Euclidean distances add over concatenated coordinates, so the clr rows of every summed
    index are laid end to end and one Gram matrix of the long rows gives the sums.
    """
    ndim = len(x.shape)
    ax = normalize_axis(axis, ndim)
    summed = (sum_over,) if not isinstance(sum_over, (tuple, list)) else tuple(sum_over)
    if not all(is_integer(s) for s in summed):
        raise ShapeMismatchError(
            f"sum_over={sum_over!r} must be an integer axis or a tuple of them"
        )
    try:
        summed = tuple(sorted({normalize_axis(int(s), ndim) for s in summed}))
    except ShapeMismatchError as err:
        raise ShapeMismatchError(
            f"sum_over={sum_over!r} is not an axis of x {tuple(x.shape)}"
        ) from err
    # the item axis is the last one that is not the part axis
    item = max(i for i in range(ndim) if i != ax) if ndim > 1 else None
    if not summed or ax in summed or item is None or item in summed:
        raise ShapeMismatchError(
            f"sum_over={sum_over!r} must name leading axes of x {tuple(x.shape)}: not the part "
            f"axis ({ax}) and not the item axis ({item}); the items are compared, the parts and "
            "summed axes make up each item's coordinates"
        )
    if (
        mask is None
        and ndim == 3
        and degenerate == "raise"
        and isinstance(x, np.ndarray)
        and (y is None or isinstance(y, np.ndarray))
    ):
        return _pairwise_summed_blocks(x, y, item, summed[0], ax, validate, from_logits, squared)
    kw: dict[str, Any] = {"mask": mask, "from_logits": from_logits, "degenerate": degenerate}
    cx = clr(x, axis, validate, **kw)
    cy = None if y is None else clr(y, axis, validate, **kw)
    xp = namespace(cx) if cy is None else namespace(cx, cy)

    def long_rows(c: Array) -> Array:
        # (..., summed..., ..., N, D) -> (..., N, prod(summed) * D)
        kept = [i for i in range(ndim) if i not in summed and i != ax]
        moved = xp.permute_dims(c, (*kept, *summed, ax))
        return xp.reshape(moved, (*moved.shape[: len(kept)], -1))

    a = long_rows(cx)
    b = None if cy is None else long_rows(cy)
    if degenerate == "nan":
        return gram_distances_nan(a, b, xp, squared)
    return gram_distances(a, b, xp, squared=squared, overwrite=True)


def _pairwise_summed_blocks(
    x: np.ndarray,
    y: np.ndarray | None,
    item: int,
    summed: int,
    ax: int,
    validate: bool,
    from_logits: bool,
    squared: bool,
) -> np.ndarray:
    """:func:`_pairwise_summed` of numpy ``(items, summed, parts)`` data, block by block.

    Each block of summed indices goes through clr, centring over items and one Gram update while
    it is in cache, so no full-size intermediate (clr rows, their transposed copy) is ever made.
    Centring each block over items centres every coordinate, as the one-shot path does.
    """
    xt = np.moveaxis(x, (item, summed, ax), (0, 1, 2))
    yt = None if y is None else np.moveaxis(y, (item, summed, ax), (0, 1, 2))
    n, s_len, d = xt.shape
    if yt is not None and yt.shape[1:] != (s_len, d):
        raise ShapeMismatchError(
            f"x and y must agree on the summed and part axes, got {tuple(x.shape)} and "
            f"{tuple(y.shape)}"  # type: ignore[union-attr]
        )
    m = n if yt is None else int(yt.shape[0])
    step = max(1, _SUMMED_BLOCK_BYTES // max(1, (n + m) * d * 8))
    gram = norms_a = norms_b = None
    for s0 in range(0, s_len, step):
        s1 = min(s_len, s0 + step)
        a = clr(np.ascontiguousarray(xt[:, s0:s1]), -1, validate, from_logits=from_logits)
        a = a.reshape(n, -1)
        if yt is None:
            a -= a.mean(axis=0, keepdims=True)
            b = a
        else:
            b = clr(np.ascontiguousarray(yt[:, s0:s1]), -1, validate, from_logits=from_logits)
            b = b.reshape(m, -1)
        g = row_gram(a, b)
        na, nb = np.einsum("ij,ij->i", a, a), np.einsum("ij,ij->i", b, b)
        if gram is None:
            gram, norms_a, norms_b = g, na, nb
        else:
            gram += g
            norms_a += na
            norms_b += nb
    assert gram is not None and norms_a is not None and norms_b is not None
    return _distances_from_gram(
        gram, norms_a[:, None], norms_b[None, :], same=yt is None, squared=squared
    )


# Blocks of the summed path hold clr rows of a slab of queries. Each block ends in one GEMM that
# synchronises the BLAS threads, so few large blocks beat many cache-sized ones: 128 MB took
# 0.68 s for 10^6 rows on a quiet 2-core machine (8 MB: 0.75 s) and 1.15 s under load (2.1 s).
_SUMMED_BLOCK_BYTES = 128 << 20
_BLOCK_BYTES = 8 << 20  # output bytes per block: the block's temporaries stay in cache


def _pairwise_blocks(
    x: np.ndarray, axis: int, validate: bool, from_logits: bool, squared: bool
) -> np.ndarray | None:
    """:func:`pairwise_aitchison` of a large numpy ``x`` (no ``y``, no mask), block by block.

    Blocks of leading indices (e.g. queries) go through clr, centring and the Gram matrix while
    they are in cache, and write straight into the result, so the only full-size array is the
    result itself. Returns ``None`` when ``x`` is small or any block fails validation (then the
    one-shot path runs and raises its precise error).
    """
    if x.ndim < 3:
        return None
    ax = normalize_axis(axis, x.ndim)
    xl = x if ax == x.ndim - 1 else np.moveaxis(x, ax, -1)
    lead, n_items, n_parts = xl.shape[:-2], int(xl.shape[-2]), int(xl.shape[-1])
    n_blocks = math.prod(lead)
    per_block = n_items * n_items * 8
    if n_parts < 2 or per_block == 0 or n_blocks * per_block < 8 * _BLOCK_BYTES:
        return None
    step = max(1, _BLOCK_BYTES // per_block)
    x3 = xl.reshape(n_blocks, n_items, n_parts)
    result: np.ndarray | None = None
    try:
        for start in range(0, n_blocks, step):
            cx = clr(x3[start : start + step], -1, validate, from_logits=from_logits)
            if result is None:
                result = np.empty((n_blocks, n_items, n_items), dtype=cx.dtype)
            gram_distances(
                cx, None, np, squared=squared, overwrite=True, out=result[start : start + step]
            )
    except CompositionError:
        return None
    assert result is not None
    return result.reshape(*lead, n_items, n_items)


def _check_shared_mask(mask: Array, x: Array, axis: int) -> None:
    """Pairwise comparisons are only defined over the same visible keys for every item."""
    m = _array._as_numpy(mask.detach().cpu() if is_tensor(mask) else mask, "mask")
    nd = _ndim(x)
    ax = normalize_axis(axis, nd)
    if m.ndim == nd:
        m = np.moveaxis(m, ax, -1)
    if m.ndim >= 2 and m.shape[-2] > 1 and not (m == m[..., :1, :]).all():
        raise ShapeMismatchError(
            "rows are only compared over the same visible keys: the mask must be identical for "
            "every item on the items axis (e.g. heads at one query). Compare per query instead"
        )
