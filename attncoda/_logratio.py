"""Log-ratio transforms and their inverses: clr, alr (reference part = the sink) and ilr.

The ilr bases themselves (pivot, sequential binary partition, groups) and their checks are in
:mod:`attncoda._bases`. The input rules shared by every maths function (array kinds, ``mask=``,
``from_logits=``, ``ref=``/``sink=``, precision) are in :mod:`attncoda._array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _array
from ._array import (
    Array,
    Degenerate,
    LogComposition,
    Spec,
    all_finite,
    by_row_blocks,
    check_degenerate,
    check_index,
    device_of,
    exp_into,
    is_tensor,
    labelled,
    log_composition,
    log_into,
    nan_rows,
    normalize_axis,
    parts_last,
)
from ._bases import _basis_like, _pivot_basis_t
from ._errors import (
    CompositionError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPartsError,
)

__all__ = [
    "alr",
    "alr_inv",
    "clr",
    "clr_inv",
    "ilr",
    "ilr_inv",
]


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


def _dense_blocks_apply(x: Array, axis: int) -> bool:
    """Whether :func:`_clr_dense_blocks` takes ``x``: a large, C-contiguous float numpy array
    with at least two parts on its last axis."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64) or x.ndim < 2:
        return False
    if not x.flags.c_contiguous or x.nbytes < _array.MIN_BLOCKED_BYTES:
        return False
    return normalize_axis(axis, x.ndim) == x.ndim - 1 and x.shape[-1] >= 2


def _clr_dense_blocks(x: Array, axis: int, validate: bool, from_logits: bool) -> Array | None:
    """:func:`clr` of a large float numpy array whose rows are finite, block by block.

    Each block of rows is transformed inside its slice of the result (log, row sums, centring
    while the slice is in cache): the same arithmetic as the one-shot path, with one pass over
    memory. Returns ``None`` (having written nothing the caller sees) when ``x`` is small or not
    C-contiguous with parts last, or as soon as a block has a non-finite row sum (a masked key,
    a bad value): the general path then handles, or diagnoses, the whole input.
    """
    if not _dense_blocks_apply(x, axis):
        return None
    n = int(x.shape[-1])
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    step = max(1, _array.ROW_BLOCK_BYTES // (n * x.itemsize))
    # the row sums and the centring through torch's kernels where installed: on rows of a few
    # dozen parts numpy's sum along the last axis and its broadcast subtraction are 4x and 2.5x
    # slower (one thread, 4 MB blocks); the same arithmetic, summed in another order
    views = _array.torch_views(rows, out)
    for start in range(0, rows.shape[0], step):
        block, dest = rows[start : start + step], out[start : start + step]
        if not from_logits:
            log_into(block, dest)
        source = block if from_logits else dest
        if views is None:
            with np.errstate(invalid="ignore", over="ignore"):
                centre = np.sum(source, axis=-1, keepdims=True) / n
        else:
            source_t = views[0 if from_logits else 1][start : start + step]
            centre_t = _array.torch_module().sum(source_t, -1, keepdim=True).div_(n)
            centre = centre_t.numpy()
        if (validate or from_logits) and not all_finite(np, centre):  # finite iff the sum is
            return None
        if views is None:
            np.subtract(source, centre, out=dest)
        else:
            _array.torch_module().sub(source_t, centre_t, out=views[1][start : start + step])
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
    # (checked above: NaN and +inf are refused; rows without any part come out NaN, as asked)
    closed = _softmax_checked(lc.xp, lc.log, False, "z", owned=lc.owned)
    return lc.restore(nan_rows(lc.xp, closed, low))


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
        return lc.restore(nan_rows(xp, _drop_minus(xp, lc.log, r), low))
    if ref is None:
        ref_log = xp.take_along_axis(lc.log, _sink_index(lc), axis=-1)
    with np.errstate(invalid="ignore"):  # rows without any part: -inf - -inf, NaN as asked
        return lc.restore(nan_rows(xp, lc.zero_invisible(lc.log - ref_log), low))


def _drop_minus(xp: Any, log: Array, r: int) -> Array:
    """``log - log[..., r]`` without column ``r``: one subtraction written straight into the
    ``D - 1`` columns of the result (no full-width difference, no gather of the kept columns)."""
    ref = log[..., r : r + 1]
    if isinstance(log, np.ndarray):
        out = np.empty((*log.shape[:-1], log.shape[-1] - 1), dtype=log.dtype)
        np.subtract(log[..., :r], ref, out=out[..., :r])
        np.subtract(log[..., r + 1 :], ref, out=out[..., r:])
        return out
    return xp.concat([log[..., :r] - ref, log[..., r + 1 :] - ref], axis=-1)


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
    return xp.moveaxis(_softmax_checked(xp, log, validate, "alr coordinates", owned=True), -1, ax)


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


def _softmax_checked(xp: Any, log: Array, validate: bool, what: str, owned: bool = False) -> Array:
    """``softmax`` over the last axis; with ``validate``, NaN or ``+inf`` inputs are refused.

    ``exp(log - max) / sum``: one exponential per part (a log-sum-exp would take a second). The
    check is free: a row's maximum is finite exactly when the row has no NaN, no ``+inf`` and at
    least one finite value, and that maximum is computed anyway. With ``owned``, ``log`` is a
    temporary of the caller's (never user input) and numpy writes the result into it.
    """
    if isinstance(log, np.ndarray):
        blocked = _softmax_blocks(log, validate, what, owned)
        if blocked is not None:
            return blocked
    top = xp.max(log, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        if not all_finite(xp, top):
            if validate:
                raise _not_finite(what)
            top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
        if isinstance(log, np.ndarray):
            out = log if owned and log.flags.writeable else np.empty_like(log)
            np.subtract(log, top, out=out)
            exp_into(out, out)
            out /= np.sum(out, axis=-1, keepdims=True)
            return out
        e = xp.exp(log - top)
        return e / xp.sum(e, axis=-1, keepdims=True)


def _not_finite(what: str) -> NonFiniteError:
    return NonFiniteError(
        f"{what} contain NaN or infinite values (or a row has no finite value); "
        "attncoda never propagates them silently. Fix those rows first"
    )


def _softmax_blocks(log: np.ndarray, validate: bool, what: str, owned: bool) -> np.ndarray | None:
    """:func:`_softmax_checked` of a large C-contiguous float array, block by block of rows.

    Each block's row maxima, shift, exponential, row sums and division run while the block is in
    cache, through torch's kernels (numpy's maximum and sum along a last axis of a few hundred
    parts are 2-4x slower); the exponential is :func:`exp_into`'s, so the numbers are the
    one-shot path's. ``None`` (nothing written) for small or other input, or without torch.
    """
    if log.dtype not in (np.float32, np.float64) or log.ndim < 2 or log.shape[-1] < 1:
        return None
    if not log.flags.c_contiguous or log.nbytes < _array.MIN_BLOCKED_BYTES:
        return None
    n = int(log.shape[-1])
    rows = log.reshape(-1, n)
    out = rows if owned and log.flags.writeable else np.empty_like(rows)
    views = _array.torch_views(rows, out)
    if views is None:
        return None
    torch = _array.torch_module()
    step = max(1, _array.ROW_BLOCK_BYTES // (n * log.itemsize))
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, rows.shape[0], step):
            part = slice(start, start + step)
            source, dest = views[0][part], views[1][part]
            top = torch.amax(source, -1, keepdim=True)  # NaN propagates, as numpy's max
            finite = torch.isfinite(top)
            if not bool(finite.all()):
                if validate:
                    raise _not_finite(what)
                top = torch.where(finite, top, torch.zeros_like(top))
            torch.sub(source, top, out=dest)
            exp_into(out[part], out[part])
            dest.div_(torch.sum(dest, -1, keepdim=True))
    return out.reshape(log.shape)


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


def _pivot_weights(n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """For ``D = n`` parts: ``r_i = D - 1 - i`` (parts after part ``i``) and ``sqrt(r/(r+1))``."""
    r = np.arange(n - 1, 0, -1, dtype=np.float64)
    return r.astype(dtype), np.sqrt(r / (r + 1)).astype(dtype)


def _reversed_cumsum(a: np.ndarray) -> np.ndarray:
    """``numpy.cumsum(a[..., ::-1], axis=-1)``, through torch's kernel for arrays of
    :data:`_array.TORCH_MIN_BYTES` or more where it is installed (numpy's cumulative sum along a
    short last axis is 6-7x slower: one thread, rows of 64 parts); the same sums in the same
    order, so the same numbers. Small arrays stay in numpy: no torch import for a few rows."""
    rev = np.empty(a.shape, dtype=a.dtype)
    np.copyto(rev, a[..., ::-1])
    out = np.empty_like(rev)
    views = _array.torch_views(rev, out) if a.nbytes >= _array.TORCH_MIN_BYTES else None
    if views is None:
        return np.cumsum(rev, axis=-1, out=out)
    _array.torch_module().cumsum(views[0], -1, out=views[1])
    return out


def _pivot_dense(log: np.ndarray) -> np.ndarray:
    """Pivot coordinates of rows whose parts are all visible, from their logs: O(D) per row.

    ``z_i = sqrt(r/(r+1)) * (log x_i - mean of the r logs after i)``, the means from one
    cumulative sum over the reversed row: the same numbers as ``clr(x) @ pivot_basis(D).T``
    (to rounding) without the ``D x D`` product.
    """
    n = int(log.shape[-1])
    r, scale = _pivot_weights(n, log.dtype)
    suffix = _reversed_cumsum(log)  # suffix[..., j]: sum of the last j + 1 logs
    out = np.divide(suffix[..., n - 2 :: -1], r)  # mean of the logs after part i
    np.subtract(log[..., :-1], out, out=out)
    out *= scale
    return out


def _pivot_inverse_dense(z: np.ndarray) -> np.ndarray:
    """clr of rows with every part visible from their pivot coordinates (inverse of
    :func:`_pivot_dense`): ``clr_j = z_j sqrt(r_j/(r_j+1)) - sum_{i<j} z_i / sqrt(r_i(r_i+1))``."""
    n = int(z.shape[-1]) + 1
    out = np.empty((*z.shape[:-1], n), dtype=z.dtype)
    if n == 1:
        out[...] = 0.0
        return out
    r, scale = _pivot_weights(n, z.dtype)
    w = z / np.sqrt(r * (r + 1))
    before = np.cumsum(w, axis=-1)  # before[..., j]: sum of w over i <= j
    np.multiply(z, scale, out=out[..., :-1])
    out[..., :-1] += w
    out[..., :-1] -= before
    out[..., -1] = -before[..., -1]
    return out


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
    ilr_inv : The inverse.
    skbio.stats.composition.ilr : The same transform; refuses a basis that is not orthonormal.
    composition_stats.ilr : The same transform, 1-D or 2-D numpy input.

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
    if basis is None and mask is None:  # large numpy input: blocks of rows that stay in cache
        blocks = by_row_blocks(
            ilr, x, axis, validate=validate, from_logits=from_logits, degenerate=degenerate
        )
        if blocks is not None:
            return blocks
    if basis is not None and mask is None:
        dense = _ilr_dense_given(x, basis, axis, validate, from_logits)
        if dense is not None:
            return dense
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
        if isinstance(lc.log, np.ndarray):  # O(D) per row: suffix sums, no D x D matmul
            return lc.restore(_pivot_dense(lc.log))
        # a tensor: one matmul of the centred logs (fast on an accelerator)
        return lc.restore(lc.clr(consume=True) @ _pivot_basis_t(lc))
    log, _, counts = _compact(lc)
    with np.errstate(invalid="ignore", divide="ignore"):  # rows without any part: NaN, as asked
        return lc.restore(nan_rows(xp, _pivot_coordinates(log, counts, xp), low))


def _ilr_dense_given(
    x: Array, basis: Array, axis: int, validate: bool, from_logits: bool
) -> Array | None:
    """:func:`ilr` with an explicit basis of a large float numpy array whose rows are finite:
    the clr by :func:`_clr_dense_blocks` (one pass over memory, its validation included), then
    one product with the basis, checked first. ``None`` where those blocks do not apply (the
    caller's general path then handles, or diagnoses, the whole input).

    (The product stays one BLAS call, not one per block: every call synchronises the BLAS
    threads, which costs more than blocks save when other jobs share the cores.)
    """
    if not _dense_blocks_apply(x, axis) or is_tensor(basis):
        return None
    b = _basis_like(basis, np, x, int(x.shape[-1]), validate)
    c = _clr_dense_blocks(x, axis, validate, from_logits)
    return None if c is None else c @ b.T


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
        return xp.moveaxis(
            _softmax_checked(xp, clr_vals, validate, "ilr coordinates", owned=True), -1, ax
        )
    if mask is None and isinstance(zl, np.ndarray):
        blocks = by_row_blocks(ilr_inv, z, axis, validate=validate)
        if blocks is not None:
            return blocks
        with np.errstate(invalid="ignore", over="ignore"):
            clr_vals = _pivot_inverse_dense(zl)
        return xp.moveaxis(
            _softmax_checked(xp, clr_vals, validate, "ilr coordinates", owned=True), -1, ax
        )
    if mask is None:
        counts = xp.full((*zl.shape[:-1], 1), float(n), dtype=zl.dtype, device=device_of(zl))
        with np.errstate(invalid="ignore"):
            clr_vals = _pivot_inverse(zl, counts, xp)
        return xp.moveaxis(
            _softmax_checked(xp, clr_vals, validate, "ilr coordinates", owned=True), -1, ax
        )
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
    return xp.moveaxis(
        _softmax_checked(xp, compact, validate, "ilr coordinates", owned=True), -1, ax
    )
