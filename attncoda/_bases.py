"""Orthonormal ilr bases: pivot, sequential-binary-partition and group bases, and their checks.

A basis is a ``(D-1, D)`` table with orthonormal rows orthogonal to the ones vector;
:func:`check_basis` proves that once per basis (large bases are remembered by a digest), and
:func:`attncoda.ilr` / :func:`attncoda.ilr_inv` in :mod:`attncoda._logratio` use them.
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
    LogComposition,
    as_float,
    check_count,
    device_of,
    epsilon,
    first_tensor,
    is_integer,
    is_tensor,
)
from ._errors import (
    CompositionError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPartsError,
)

__all__ = [
    "group_basis",
    "pivot_basis",
    "sbp_basis",
]


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
    """How far an explicit basis of ``dtype`` may be from orthonormal: ``sqrt(eps)``, and at
    least 1e-6 (scikit-bio's absolute tolerance).

    1e-6 in float64: a basis typed or stored to 8 decimals is off by ~2e-8 and must pass
    (well-built ones are orthonormal to ~1e-14); 3.5e-4 in float32 (a pivot basis of 4,096
    parts built in float32 is off by ~1e-5).
    """
    return max(math.sqrt(epsilon(dtype)), 1e-6)


# Bases large enough that their Gram product costs more than hashing them are remembered once
# validated, by a digest of their bytes, so that calls reusing one basis check it in one pass
# instead of O(D^3). One thread of an AMD EPYC: hashing and checking cost the same at D = 256
# (0.38 and 0.45 ms); at D = 512, 1.5 against 6.1 ms.
_CACHED_BASIS_SIZE = 1 << 16
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
