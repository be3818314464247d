"""All pairs of rows: Aitchison Gram matrices (:func:`inner`) and pairwise distances.

Every all-pairs computation goes through one matrix-product backend, :func:`row_gram` (one
matrix through numpy's BLAS, ``syrk`` for a matrix with its own transpose; a stack through
torch's batched GEMM when installed), and
:func:`gram_distances` turns Gram matrices into distances; :mod:`attncoda._decompose` and
:mod:`attncoda._backend` reuse them. Large inputs are computed in
blocks sized by ``_BLOCK_BYTES`` and ``_SUMMED_BLOCK_BYTES``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _array
from ._array import (
    Array,
    Degenerate,
    Spec,
    can_overwrite,
    check_degenerate,
    device_of,
    first_tensor,
    is_integer,
    is_tensor,
    labelled,
    namespace,
    normalize_axis,
    sqrt0,
    to_kind,
    torch_views,
)
from ._errors import (
    CompositionError,
    ShapeMismatchError,
)
from ._logratio import clr

__all__ = [
    "inner",
    "pairwise_aitchison",
]


def _ndim(a: Array) -> int:
    return int(np.ndim(a)) if not hasattr(a, "ndim") else int(a.ndim)


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
    skbio.stats.composition.inner : The same Gram matrix, for 2-D numpy input only (its ``.T``
        reverses every axis of a 3-D input).
    composition_stats.inner : The same, for 2-D numpy input only.

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

    ``backend="auto"`` runs one matrix (two axes each) in numpy and a stack of matrices in
    torch where it is installed; ``"torch"`` and ``"numpy"`` choose. One matrix is one BLAS
    call either way, and numpy's is the faster one: its product with its own transpose (``b``
    None or ``a``) goes to BLAS's ``syrk``, which computes one triangle, half the work of the
    general product torch runs (on one thread of an AMD EPYC, 270 x 14,336 float64: 22 ms
    against torch's 38; 4,000 x 512: 150 against 305, with torch's MKL on AVX2 or AVX-512
    alike), and its general product took 6-16% less time than torch's on one thread of the AMD
    EPYC with AVX-512 (4,000 x 512 by 4,000 x 512: 254 against 296 ms) and 13-82% on two. A stack
    goes to torch, which shares the numpy memory (no copy) and writes into ``out``: numpy's
    stacked matmul calls BLAS once per matrix of the stack, and each call synchronises the BLAS
    threads, so as soon as other jobs share the cores it collapses (10x slower on a busy 2-core
    machine, benchmarks/bench_coda.py), while torch's batched GEMM splits the whole stack across
    its threads once. Operands torch cannot take as they are (mixed dtypes, which numpy
    promotes; negative strides; integers) stay with numpy, on the CPU. ``device`` (a
    :class:`torch.device`, checked by the caller) runs the product there and brings the result
    back to the CPU.
    """
    if backend == "auto" and device is None and a.ndim == 2 and (b is None or np.ndim(b) == 2):
        return np.matmul(a, (a if b is None else b).T, out=out)
    views = None if backend == "numpy" else torch_views(a, a if b is None else b)
    if views is None:
        bt = np.swapaxes(a if b is None else b, -1, -2)
        return np.matmul(a, bt, out=out)
    import torch

    ta, tb = views
    if device is not None:
        ta = ta.to(device)
        tb = ta if b is None else tb.to(device)
    if out is None and device is None:  # numpy's allocator: huge pages, faulted in ~3x faster
        lead = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(tb.shape[:-2]))
        out = np.empty((*lead, a.shape[-2], tb.shape[-2]), dtype=a.dtype)
    if out is not None and device is None and out.flags.c_contiguous and out.flags.writeable:
        torch.matmul(ta, tb.transpose(-1, -2), out=torch.from_numpy(out))
        return out
    res = torch.matmul(ta, tb.transpose(-1, -2)).cpu().numpy()
    if out is None:
        return res
    out[...] = res
    return out


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
        d2 = row_gram(a, b, out)
    else:
        d2 = a @ xp.matrix_transpose(b)
    if can_overwrite(d2):
        return _distances_from_gram(d2, na, nb, same=same, squared=squared)
    d2 = na + nb - 2 * d2
    d2 = xp.clip(d2, 0.0, None)
    if same:
        n = int(d2.shape[-1])
        d2 = xp.where(xp.eye(n, dtype=xp.bool, device=device_of(d2)), xp.zeros_like(d2), d2)
    return d2 if squared else sqrt0(xp, d2)


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
