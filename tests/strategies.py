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
