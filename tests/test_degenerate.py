"""One ``degenerate=`` policy on every maths function that can meet a row with too few parts.

Causal attention's first query sees only itself (a one-part row: no clr, no content). Each
function below raises on it by default with the same advice, and with ``degenerate="nan"`` gives
NaN in exactly those rows and, elsewhere, the numbers it gives for the good rows alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attncoda as ac
from attncoda._array import DEGENERATE_HINT

T = 5


def causal_logits(seed: int = 0, heads: int = 3) -> np.ndarray:
    """(head, query, key) logits, -inf above the diagonal: query 0 sees one key."""
    z = np.random.default_rng(seed).normal(size=(heads, T, T))
    return np.where(np.tril(np.ones((T, T), bool)), z, -np.inf)


# name -> (call on logits with **kw, minimum visible parts a row needs)
def _rows(fn):
    return lambda z, **kw: fn(z, from_logits=True, **kw)


PER_ROW = {
    "clr": (_rows(ac.clr), 2),
    "alr": (_rows(ac.alr), 2),
    "ilr": (_rows(ac.ilr), 2),
    "aitchison_norm": (_rows(ac.aitchison_norm), 2),
    "aitchison_distance": (
        lambda z, **kw: ac.aitchison_distance(z, z + 1.0, from_logits=True, **kw),
        2,
    ),
    "paired_inner": (lambda z, **kw: ac.paired_inner(z, z, from_logits=True, **kw), 2),
    "entropy": (_rows(ac.entropy), 1),
    "clr_inv": (lambda z, **kw: ac.clr_inv(z, **kw), 1),
    "power": (lambda z, **kw: ac.power(np.exp(z), 2.0, mask=np.isfinite(z), **kw), 1),
    "decompose": (lambda z, **kw: ac.decompose(z, from_logits=True, **kw).balance, 2),
    "aitchison_split": (
        lambda z, **kw: ac.aitchison_split(z, z * 0.5, from_logits=True, **kw).total,
        2,
    ),
    "entropy_change": (
        lambda z, **kw: ac.entropy_change(z, z * 0.5, from_logits=True, **kw).total,
        2,
    ),
}


def _good_rows(minimum: int) -> np.ndarray:
    """Queries whose rows have at least ``minimum`` visible keys (query q sees q + 1)."""
    return np.arange(T) + 1 >= minimum


@pytest.mark.parametrize("name", sorted(PER_ROW))
def test_raise_by_default_with_one_advice(name):
    fn, minimum = PER_ROW[name]
    z = causal_logits()
    if minimum == 1:  # every causal row has a part: hide one whole row to meet the case
        z[:, 2, :] = -np.inf
    with pytest.raises(ac.TooFewPartsError) as info:
        fn(z)
    assert str(info.value).endswith(DEGENERATE_HINT) or DEGENERATE_HINT in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", sorted(PER_ROW))
def test_nan_marks_exactly_the_degenerate_rows(name):
    fn, minimum = PER_ROW[name]
    z = causal_logits()
    bad = ~_good_rows(minimum)
    if minimum == 1:
        z[:, 2, :] = -np.inf
        bad = np.arange(T) == 2
    out = np.asarray(fn(z, degenerate="nan"))
    row_nan = np.isnan(out).reshape(*z.shape[:2], -1)
    assert row_nan[:, bad].all()
    assert not row_nan[:, ~bad].any()
    good = fn(z[:, ~bad])  # the good rows alone, default policy
    np.testing.assert_allclose(out[:, ~bad], good, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(PER_ROW))
def test_unknown_policy_is_refused_the_same_way(name):
    fn, _ = PER_ROW[name]
    with pytest.raises(
        ac.CompositionError, match="degenerate must be 'raise' or 'nan', got 'skip'"
    ):
        fn(causal_logits(), degenerate="skip")


def test_nan_rows_are_nan_in_every_pairwise_distance_to_them():
    z = causal_logits()  # (head, query, key): compare heads at each query
    d = ac.pairwise_aitchison(z.transpose(1, 0, 2), from_logits=True, degenerate="nan")
    assert np.isnan(d[0]).all()
    assert not np.isnan(d[1:]).any()
    np.testing.assert_allclose(
        d[1:], ac.pairwise_aitchison(z.transpose(1, 0, 2)[1:], from_logits=True), atol=1e-12
    )
    with pytest.raises(ac.TooFewPartsError, match="degenerate='nan'"):
        ac.pairwise_aitchison(z.transpose(1, 0, 2), from_logits=True)


def test_summed_pairwise_is_nan_only_for_items_with_a_degenerate_row():
    z = causal_logits(heads=4)
    z[2, 3] = -np.inf  # head 2 has a row without any key at query 3
    z[2, 3, 0] = 0.0  # ... a one-part row
    zq = z[:, 1:].transpose(1, 0, 2)  # (query >= 1, head, key): only head 2 is degenerate
    d = ac.pairwise_aitchison(zq, from_logits=True, sum_over=0, degenerate="nan")
    assert np.isnan(d[2]).all() and np.isnan(d[:, 2]).all()
    keep = [0, 1, 3]
    np.testing.assert_allclose(
        d[np.ix_(keep, keep)],
        ac.pairwise_aitchison(zq[:, keep], from_logits=True, sum_over=0),
        atol=1e-12,
    )


def test_pairwise_split_nan():
    z = causal_logits().transpose(1, 0, 2)  # (query, head, key)
    sp = ac.pairwise_aitchison_split(z, from_logits=True, degenerate="nan")
    assert np.isnan(sp.total[0]).all() and not np.isnan(sp.total[1:]).any()
    ref = ac.pairwise_aitchison_split(z[1:], from_logits=True)
    np.testing.assert_allclose(sp.content[1:], ref.content, atol=1e-12)


def test_group_decompose_rows_without_a_grouped_part():
    z = causal_logits()
    z[:, 2, :] = -np.inf
    groups = [[0], [1, 2, 3, 4]]
    with pytest.raises(ac.TooFewPartsError, match="degenerate='nan'"):
        ac.group_decompose(z, groups, from_logits=True)
    g = ac.group_decompose(z, groups, from_logits=True, degenerate="nan")
    assert np.isnan(g.entropy[:, 2]).all() and not np.isnan(g.entropy[:, [0, 1, 3, 4]]).any()


@given(st.integers(0, 2**31 - 1), st.integers(2, 6))
@settings(max_examples=25, deadline=None)
def test_torch_and_numpy_agree_on_nan_rows(seed, n_keys):
    torch = pytest.importorskip("torch")
    z = np.random.default_rng(seed).normal(size=(3, n_keys))
    z[1, 1:] = -np.inf  # one part
    for fn in (ac.clr, ac.ilr, ac.aitchison_norm):
        a = fn(z, from_logits=True, degenerate="nan")
        b = fn(torch.as_tensor(z), from_logits=True, degenerate="nan").numpy()
        np.testing.assert_allclose(a, b, atol=1e-12)
        assert np.isnan(a[1]).all() and not np.isnan(a[[0, 2]]).any()
