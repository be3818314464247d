"""Hypothesis strategies for attention-like rows: logits with visibility masks."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

finite_logits = st.floats(-30.0, 30.0, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def logit_rows(draw: st.DrawFn, min_parts: int = 2, max_parts: int = 12, max_rows: int = 6):
    """(logits, mask): float64 rows with at least ``min_parts`` visible parts each."""
    n_rows = draw(st.integers(1, max_rows))
    n_parts = draw(st.integers(min_parts, max_parts))
    z = draw(hnp.arrays(np.float64, (n_rows, n_parts), elements=finite_logits))
    mask = draw(hnp.arrays(np.bool_, (n_rows, n_parts)))
    # guarantee enough visible parts per row
    for i in range(n_rows):
        hidden = np.flatnonzero(~mask[i])
        need = min_parts - int(mask[i].sum())
        if need > 0:
            mask[i, hidden[:need]] = True
    return z, mask


@st.composite
def logit_pairs(draw: st.DrawFn, min_parts: int = 3, max_parts: int = 12):
    """Two logit arrays over the same visible keys, plus that mask."""
    z, mask = draw(logit_rows(min_parts=min_parts, max_parts=max_parts))
    w = draw(hnp.arrays(np.float64, z.shape, elements=finite_logits))
    return z, w, mask


def softmax_masked(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    zz = np.where(mask, z, -np.inf)
    zz = zz - zz.max(axis=-1, keepdims=True)
    e = np.exp(zz)
    return e / e.sum(axis=-1, keepdims=True)


@st.composite
def sbp_matrices(draw: st.DrawFn, min_parts: int = 2, max_parts: int = 10) -> np.ndarray:
    """A random sequential binary partition, shape (D-1, D) of +1/-1/0 signs.

    A random binary tree over a random order of the parts: each internal node splits its group
    into a +1 side and a -1 side (D leaves give D-1 splits).
    """
    n = draw(st.integers(min_parts, max_parts))
    order = draw(st.permutations(range(n)))
    rows, stack = [], [list(order)]
    while stack:
        group = stack.pop()
        if len(group) < 2:
            continue
        cut = draw(st.integers(1, len(group) - 1))
        row = np.zeros(n, dtype=np.int64)
        row[group[:cut]] = 1
        row[group[cut:]] = -1
        rows.append(row)
        stack += [group[:cut], group[cut:]]
    return np.array(rows)


@st.composite
def ilr_bases(
    draw: st.DrawFn, min_parts: int = 2, max_parts: int = 10, dtype: type = np.float64
) -> np.ndarray:
    """An orthonormal ilr basis built in ``dtype``: ``sbp_basis`` of a random SBP, optionally
    rotated by a random orthogonal matrix (still an orthonormal basis of the clr space)."""
    import attncoda as ac

    basis = ac.sbp_basis(draw(sbp_matrices(min_parts, max_parts))).astype(dtype)
    if draw(st.booleans()):
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        q, _ = np.linalg.qr(rng.normal(size=(basis.shape[0], basis.shape[0])))
        basis = q.astype(dtype) @ basis  # the rotation is applied in ``dtype``
    return basis
