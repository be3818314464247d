"""The compositional transforms: inverses, oracles, torch parity, masks and bad input."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from strategies import logit_rows, softmax_masked

import attncoda as ac
from conftest import requires_composition_stats, requires_skbio

torch = pytest.importorskip("torch")

TIGHT = 1e-10


def random_compositions(rng, shape):
    return ac.closure(rng.gamma(0.5, size=shape) + 1e-3)


# ---------------------------------------------------------------------------- inverses (property)


@given(logit_rows())
@settings(max_examples=60, deadline=None)
def test_clr_of_softmax_is_centred_logits(zm):
    z, mask = zm
    x = softmax_masked(z, mask)
    centred = np.where(
        mask, z - (np.where(mask, z, 0).sum(-1, keepdims=True) / mask.sum(-1, keepdims=True)), 0
    )
    np.testing.assert_allclose(ac.clr(z, mask=mask, from_logits=True), centred, atol=TIGHT)
    # from probabilities too, where they did not underflow
    ok = (x[mask] > 1e-250).all()
    if ok:
        np.testing.assert_allclose(ac.clr(x, mask=mask), centred, atol=1e-8)


@given(logit_rows())
@settings(max_examples=60, deadline=None)
def test_clr_inverse_pair(zm):
    z, mask = zm
    x = softmax_masked(z, mask)
    np.testing.assert_allclose(
        ac.clr_inv(ac.clr(z, mask=mask, from_logits=True), mask=mask), x, atol=TIGHT
    )


@given(logit_rows())
@settings(max_examples=60, deadline=None)
def test_alr_inverse_pair_and_sink_reference(zm):
    z, mask = zm
    x = softmax_masked(z, mask)
    y = ac.alr(z, mask=mask, from_logits=True)
    first = mask.argmax(-1)
    expected = np.where(mask, z - z[np.arange(len(z)), first][:, None], 0)
    np.testing.assert_allclose(y, expected, atol=TIGHT)
    np.testing.assert_allclose(ac.alr_inv(y, mask=mask), x, atol=TIGHT)


@given(logit_rows())
@settings(max_examples=60, deadline=None)
def test_ilr_inverse_pair_and_isometry(zm):
    z, mask = zm
    x = softmax_masked(z, mask)
    coords = ac.ilr(z, mask=mask, from_logits=True)
    assert coords.shape == (z.shape[0], z.shape[1] - 1)
    np.testing.assert_allclose(ac.ilr_inv(coords, mask=mask), x, atol=TIGHT)
    # isometry: ilr norms equal Aitchison norms
    np.testing.assert_allclose(
        np.linalg.norm(coords, axis=-1),
        ac.aitchison_norm(z, mask=mask, from_logits=True),
        atol=1e-9,
    )


@given(logit_rows(min_parts=3))
@settings(max_examples=60, deadline=None)
def test_first_ilr_coordinate_is_sink_vs_content_balance(zm):
    z, mask = zm
    coords = ac.ilr(z, mask=mask, from_logits=True)
    d = ac.decompose(z, mask=mask, from_logits=True)
    np.testing.assert_allclose(coords[:, 0], d.balance, atol=TIGHT)


def test_unmasked_inverses(rng):
    x = random_compositions(rng, (7, 9))
    np.testing.assert_allclose(ac.clr_inv(ac.clr(x)), x, atol=TIGHT)
    np.testing.assert_allclose(ac.alr_inv(ac.alr(x)), x, atol=TIGHT)
    np.testing.assert_allclose(ac.alr_inv(ac.alr(x, ref=4), ref=4), x, atol=TIGHT)
    np.testing.assert_allclose(ac.ilr_inv(ac.ilr(x)), x, atol=TIGHT)
    basis = ac.group_basis([[0], [1, 2], list(range(3, 9))])
    np.testing.assert_allclose(ac.ilr_inv(ac.ilr(x, basis), basis), x, atol=TIGHT)


def test_alr_reference_aliases_of_scikit_bio_and_composition_stats(rng):
    x = random_compositions(rng, (7, 9))
    mask = np.ones((7, 9), bool)
    mask[:, 0] = False
    for kw in ({"ref_idx": 4}, {"denominator_idx": 4}):
        np.testing.assert_array_equal(ac.alr(x, **kw), ac.alr(x, ref=4))
        np.testing.assert_array_equal(ac.alr(x, mask=mask, **kw), ac.alr(x, 4, mask=mask))
        y = ac.alr(x, ref=4)
        np.testing.assert_array_equal(ac.alr_inv(y, **kw), ac.alr_inv(y, 4))
        ym = ac.alr(x, ref=4, mask=mask)
        np.testing.assert_array_equal(ac.alr_inv(ym, mask=mask, **kw), ac.alr_inv(ym, 4, mask=mask))
    for fn, arg in ((ac.alr, x), (ac.alr_inv, x[:, 1:])):
        with pytest.raises(ac.CompositionError, match=r"ref=4 and ref_idx=4 .*give it once"):
            fn(arg, 4, ref_idx=4)
        with pytest.raises(ac.CompositionError, match="ref_idx=1 and denominator_idx=2"):
            fn(arg, ref_idx=1, denominator_idx=2)
        with pytest.raises(ac.ShapeMismatchError, match="denominator_idx=99 is out of range"):
            fn(arg, denominator_idx=99)


def test_any_axis_and_leading_shape(rng):
    x = random_compositions(rng, (2, 3, 5, 4))  # parts last
    moved = np.moveaxis(x, -1, 1)
    np.testing.assert_allclose(np.moveaxis(ac.clr(moved, axis=1), 1, -1), ac.clr(x), atol=TIGHT)
    np.testing.assert_allclose(np.moveaxis(ac.ilr(moved, axis=1), 1, -1), ac.ilr(x), atol=TIGHT)
    np.testing.assert_allclose(np.moveaxis(ac.alr(moved, axis=1), 1, -1), ac.alr(x), atol=TIGHT)
    assert ac.aitchison_norm(moved, axis=1).shape == (2, 3, 5)


def test_pivot_basis_is_orthonormal_and_matches_default_ilr(rng):
    for n in (2, 3, 10):
        v = ac.pivot_basis(n)
        np.testing.assert_allclose(v @ v.T, np.eye(n - 1), atol=1e-12)
        np.testing.assert_allclose(v.sum(axis=1), 0, atol=1e-12)
    x = random_compositions(rng, (5, 6))
    np.testing.assert_allclose(ac.ilr(x), ac.ilr(x, ac.pivot_basis(6)), atol=TIGHT)


def test_group_basis_first_balance_is_sink_vs_rest():
    b = ac.group_basis([[0], [1], [2, 3, 4]])
    assert b[0, 0] > 0 and (b[0, 1:] < 0).all()
    assert b[1, 0] == 0 and b[1, 1] > 0 and (b[1, 2:] < 0).all()
    with pytest.raises(ac.ShapeMismatchError, match="exactly once"):
        ac.group_basis([[0], [0, 1]])
    with pytest.raises(ac.ShapeMismatchError, match="orthogonal"):
        ac.sbp_basis([[1, -1, 0], [1, 0, -1]])


# ---------------------------------------------------------------------------- Aitchison geometry


def test_perturbation_power_inner_are_a_vector_space(rng):
    x, y = random_compositions(rng, (2, 4, 6))
    np.testing.assert_allclose(ac.clr(ac.perturb(x, y)), ac.clr(x) + ac.clr(y), atol=TIGHT)
    np.testing.assert_allclose(ac.clr(ac.perturb_inv(x, y)), ac.clr(x) - ac.clr(y), atol=TIGHT)
    np.testing.assert_allclose(ac.clr(ac.power(x, 2.5)), 2.5 * ac.clr(x), atol=TIGHT)
    a = rng.normal(size=4)
    np.testing.assert_allclose(ac.clr(ac.power(x, a)), a[:, None] * ac.clr(x), atol=TIGHT)
    np.testing.assert_allclose(ac.paired_inner(x, y), (ac.clr(x) * ac.clr(y)).sum(-1), atol=TIGHT)
    np.testing.assert_allclose(
        ac.aitchison_distance(x, y) ** 2,
        ac.paired_inner(x, x) + ac.paired_inner(y, y) - 2 * ac.paired_inner(x, y),
        atol=1e-9,
    )


def test_inner_is_the_gram_matrix_of_all_row_pairs(rng):
    x, y = random_compositions(rng, (4, 6)), random_compositions(rng, (3, 6))
    g = ac.inner(x, y)
    assert g.shape == (4, 3)
    np.testing.assert_allclose(g, ac.clr(x) @ ac.clr(y).T, atol=TIGHT)
    for i, j in itertools.product(range(4), range(3)):
        np.testing.assert_allclose(g[i, j], ac.paired_inner(x[i], y[j]), atol=TIGHT)
    # its diagonal is the paired product; distances follow from the Gram matrices
    np.testing.assert_allclose(np.diag(ac.inner(x, x[::-1])), ac.paired_inner(x, x[::-1]))
    gxx, gyy = ac.inner(x, x), ac.inner(y, y)
    np.testing.assert_allclose(
        np.diag(gxx)[:, None] + np.diag(gyy)[None, :] - 2 * g,
        ac.pairwise_aitchison(x, y, squared=True),
        atol=1e-9,
    )
    # 1-D inputs drop their row axis, as numpy's matmul and scikit-bio's inner do
    assert ac.inner(x[0], y).shape == (3,) and ac.inner(x, y[0]).shape == (4,)
    assert np.ndim(ac.inner(x[0], y[0])) == 0
    np.testing.assert_allclose(ac.inner(x[0], y[1]), g[0, 1], atol=TIGHT)
    np.testing.assert_allclose(ac.inner(x[0], y), g[0], atol=TIGHT)
    np.testing.assert_allclose(ac.inner(x, y[2]), g[:, 2], atol=TIGHT)
    # stacks: one Gram matrix per leading index; leading axes broadcast; parts on any axis
    xs, ys = random_compositions(rng, (5, 4, 6)), random_compositions(rng, (5, 3, 6))
    np.testing.assert_allclose(
        ac.inner(xs, ys),
        np.stack([ac.inner(a, b) for a, b in zip(xs, ys, strict=True)]),
        atol=TIGHT,
    )
    np.testing.assert_allclose(ac.inner(xs, y), np.stack([ac.inner(a, y) for a in xs]), atol=TIGHT)
    np.testing.assert_allclose(
        ac.inner(np.swapaxes(xs, 1, 2), np.swapaxes(ys, 1, 2), axis=1), ac.inner(xs, ys), atol=TIGHT
    )
    # logits, masks shared by every row, torch
    z = np.log(x)
    np.testing.assert_allclose(ac.inner(z, z, from_logits=True), ac.inner(x, x), atol=TIGHT)
    mask = np.array([True, True, False, True, True, True])
    np.testing.assert_allclose(
        ac.inner(x, y, mask=mask), ac.inner(x[:, mask], y[:, mask]), atol=TIGHT
    )
    got = ac.inner(torch.tensor(xs), torch.tensor(ys))
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), ac.inner(xs, ys), atol=TIGHT)
    assert ac.inner(torch.tensor(x[0]), torch.tensor(y)).shape == (3,)


def test_inner_refuses_mismatched_parts_leading_axes_and_masks(rng):
    x = random_compositions(rng, (4, 6))
    with pytest.raises(ac.ShapeMismatchError, match="same parts"):
        ac.inner(x, x[:, :5])
    with pytest.raises(ac.ShapeMismatchError, match="do not broadcast"):
        ac.inner(random_compositions(rng, (2, 4, 6)), random_compositions(rng, (3, 4, 6)))
    varying = np.ones((4, 6), bool)
    varying[1, 2] = False
    with pytest.raises(ac.ShapeMismatchError, match="same visible keys"):
        ac.inner(x, x, mask=varying)


def test_pairwise_matches_loop(rng):
    x = random_compositions(rng, (3, 7, 10))  # 3 queries, 7 heads, 10 keys
    d = ac.pairwise_aitchison(x)
    assert d.shape == (3, 7, 7)
    d2 = ac.pairwise_aitchison(x, squared=True)
    for q in range(3):
        for i in range(7):
            assert d[q, i, i] == 0.0
            for j in range(7):
                direct = ac.aitchison_distance(x[q, i], x[q, j])
                assert d2[q, i, j] == pytest.approx(direct**2, abs=1e-10)
                assert d[q, i, j] == pytest.approx(direct, abs=1e-7)
    y = random_compositions(rng, (3, 2, 10))
    assert ac.pairwise_aitchison(x, y).shape == (3, 7, 2)


def test_pairwise_requires_shared_visibility(rng):
    x = random_compositions(rng, (4, 6))
    same = np.tile([True, True, True, False, True, True], (4, 1))
    d = ac.pairwise_aitchison(x, mask=same)
    np.testing.assert_allclose(d[0, 1], ac.aitchison_distance(x[0], x[1], mask=same[0]), atol=1e-9)
    differ = same.copy()
    differ[2, 0] = False
    with pytest.raises(ac.ShapeMismatchError, match="same visible keys"):
        ac.pairwise_aitchison(x, mask=differ)


def test_pairwise_summed_over_queries_matches_per_pair_loop(rng):
    x = random_compositions(rng, (9, 5, 8))  # 9 queries, 5 heads, 8 keys
    mask = np.ones((9, 1, 8), dtype=bool)  # causal: query q sees keys 0..q (at least two)
    for q in range(9):
        mask[q, 0, min(8, q + 2) :] = False
    for m in (None, mask):
        got = ac.pairwise_aitchison(x, mask=m, sum_over=0)
        for i in range(5):
            for j in range(5):
                direct = sum(
                    ac.aitchison_distance(x[q, i], x[q, j], mask=None if m is None else m[q, 0])
                    ** 2
                    for q in range(9)
                )
                assert got[i, j] == pytest.approx(np.sqrt(direct), abs=1e-9)
        np.testing.assert_allclose(
            ac.pairwise_aitchison(
                torch.tensor(x),
                mask=None if m is None else torch.tensor(m),
                sum_over=(0,),
                squared=True,
            ).numpy(),
            ac.pairwise_aitchison(x, mask=m, squared=True).sum(0),
            atol=1e-9,
        )
    # against y, and over two leading axes (samples x queries)
    y = random_compositions(rng, (9, 2, 8))
    np.testing.assert_allclose(
        ac.pairwise_aitchison(x, y, sum_over=0, squared=True),
        ac.pairwise_aitchison(x, y, squared=True).sum(0),
        atol=1e-9,
    )
    xs = random_compositions(rng, (2, 3, 4, 6))
    np.testing.assert_allclose(
        ac.pairwise_aitchison(xs, sum_over=(0, 1), squared=True),
        ac.pairwise_aitchison(xs, squared=True).sum((0, 1)),
        atol=1e-9,
    )
    for bad in (1, 2, -1, 5):
        with pytest.raises(ac.ShapeMismatchError, match="sum_over"):
            ac.pairwise_aitchison(x, sum_over=bad)


def test_pairwise_summed_block_by_block_equals_one_shot(rng, monkeypatch):
    from attncoda import _pairwise

    x = random_compositions(rng, (30, 6, 8))
    y = random_compositions(rng, (30, 4, 8))
    whole = {
        "xx": ac.pairwise_aitchison(x, sum_over=0),
        "xy": ac.pairwise_aitchison(x, y, sum_over=0),
    }
    masked = ac.pairwise_aitchison(x, sum_over=0, mask=np.ones((1, 1, 8), bool))  # general path
    np.testing.assert_allclose(whole["xx"], masked, atol=1e-10)
    # parts first: the items are still the last axis before the parts
    np.testing.assert_allclose(
        ac.pairwise_aitchison(x.transpose(2, 0, 1), axis=0, sum_over=1), whole["xx"], atol=1e-10
    )
    monkeypatch.setattr(_pairwise, "_SUMMED_BLOCK_BYTES", (6 + 4) * 8 * 8 * 4)  # 4 queries a block
    np.testing.assert_allclose(ac.pairwise_aitchison(x, sum_over=0), whole["xx"], atol=1e-10)
    np.testing.assert_allclose(ac.pairwise_aitchison(x, y, sum_over=0), whole["xy"], atol=1e-10)
    bad = x.copy()
    bad[25, 1, 3] = np.nan  # in a late block: the block's clr raises the precise error
    with pytest.raises(ac.NonFiniteError):
        ac.pairwise_aitchison(bad, sum_over=0)


def test_pairwise_block_path_equals_one_shot_and_full_mask(rng, monkeypatch):
    from attncoda import _pairwise

    x = random_compositions(rng, (40, 12, 6))
    one_shot = ac.pairwise_aitchison(x, mask=np.ones((1, 6), dtype=bool))  # masks skip blocks
    monkeypatch.setattr(_pairwise, "_BLOCK_BYTES", 12 * 12 * 8 * 3)  # 3 queries a block, 14 blocks
    blocked = ac.pairwise_aitchison(x)
    assert _pairwise._pairwise_blocks(x, -1, True, False, False) is not None  # the block path ran
    np.testing.assert_allclose(blocked, one_shot, atol=1e-12)
    np.testing.assert_allclose(
        ac.pairwise_aitchison(np.log(x), from_logits=True, squared=True), one_shot**2, atol=1e-9
    )
    bad = x.copy()
    bad[30, 2, 1] = -0.1  # a failing block falls back to the one-shot path and its exact error
    with pytest.raises(ac.NegativePartError):
        ac.pairwise_aitchison(bad)


def test_closure_counts_and_masks_do_not_modify_input():
    counts = np.array([[3, 1, 0, 4]])
    original = counts.copy()
    out = ac.closure(counts)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [[3 / 8, 1 / 8, 0, 4 / 8]])
    np.testing.assert_array_equal(counts, original)
    np.testing.assert_allclose(
        ac.closure(counts, mask=[[True, True, False, False]]), [[0.75, 0.25, 0, 0]]
    )


def test_multi_replace_keeps_ratios_and_closure():
    x = np.array([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.4, 0.6]])
    r = ac.multi_replace(x)
    np.testing.assert_allclose(r.sum(-1), 1)
    assert (r > 0).all()
    np.testing.assert_allclose(r[0, 0] / r[0, 1], 0.5 / 0.3)
    np.testing.assert_allclose(r[1, :2], 1 / 16)
    masked = ac.multi_replace(x, mask=[[True, True, True, False], [True, True, True, True]])
    assert masked[0, 3] == 0  # structural zero left alone
    np.testing.assert_allclose(masked[0], x[0])
    with pytest.raises(ValueError, match="too large"):
        ac.multi_replace(x, delta=0.6)


def test_add_learned_sink():
    rows = np.array([[0.3, 0.2, 0.1], [0.5, 0.25, 0.25]])
    out = ac.add_learned_sink(rows)
    np.testing.assert_allclose(out[:, 0], [0.4, 0.0], atol=1e-15)
    np.testing.assert_allclose(out.sum(-1), 1)
    with pytest.raises(ac.NotClosedError, match="add_learned_sink"):
        ac.entropy(rows)


# ---------------------------------------------------------------------------- oracles


@requires_skbio
def test_oracle_scikit_bio(rng):
    from skbio.stats import composition as skc

    x = random_compositions(rng, (50, 12))
    np.testing.assert_allclose(ac.closure(x * 7), skc.closure(x * 7), atol=TIGHT)
    np.testing.assert_allclose(ac.clr(x), skc.clr(x), atol=TIGHT)
    np.testing.assert_allclose(ac.clr_inv(ac.clr(x)), skc.clr_inv(skc.clr(x)), atol=TIGHT)
    # scikit-bio's alr reference is positional ref_idx (default 0 = our sink without padding)
    np.testing.assert_allclose(ac.alr(x), skc.alr(x), atol=TIGHT)
    np.testing.assert_allclose(ac.alr(x, ref=5), skc.alr(x, ref_idx=5), atol=TIGHT)
    np.testing.assert_allclose(ac.alr(x, ref_idx=5), skc.alr(x, ref_idx=5), atol=TIGHT)
    np.testing.assert_allclose(
        ac.alr_inv(skc.alr(x, ref_idx=5), ref_idx=5),
        skc.alr_inv(skc.alr(x, ref_idx=5), ref_idx=5),
        atol=TIGHT,
    )
    np.testing.assert_allclose(
        ac.alr_inv(ac.alr(x, ref=5), ref=5),
        skc.alr_inv(skc.alr(x, ref_idx=5), ref_idx=5),
        atol=TIGHT,
    )
    sbp = np.array([[1, -1, -1, -1], [0, 1, -1, -1], [0, 0, 1, -1]])
    np.testing.assert_allclose(ac.sbp_basis(sbp), skc.sbp_basis(sbp), atol=TIGHT)
    basis = ac.sbp_basis(sbp)
    x4 = random_compositions(rng, (20, 4))
    np.testing.assert_allclose(ac.ilr(x4, basis), skc.ilr(x4, basis), atol=TIGHT)
    np.testing.assert_allclose(
        ac.ilr_inv(ac.ilr(x4), basis), skc.ilr_inv(ac.ilr(x4), basis), atol=TIGHT
    )
    y = random_compositions(rng, (50, 12))
    np.testing.assert_allclose(ac.perturb(x, y), skc.perturb(x, y), atol=TIGHT)
    np.testing.assert_allclose(ac.perturb_inv(x, y), skc.perturb_inv(x, y), atol=TIGHT)
    np.testing.assert_allclose(ac.power(x, 1.7), skc.power(x, 1.7), atol=TIGHT)
    np.testing.assert_allclose(ac.inner(x, y), skc.inner(x, y), atol=1e-9)
    np.testing.assert_allclose(ac.inner(x[0], y[1]), skc.inner(x[0], y[1]), atol=1e-9)
    np.testing.assert_allclose(ac.inner(x[0], y), skc.inner(x[0], y), atol=1e-9)
    np.testing.assert_allclose(ac.paired_inner(x, y), np.diag(skc.inner(x, y)), atol=1e-9)
    # multiplicative replacement: same default delta 1/D^2
    z = x.copy()
    z[:, [1, 4]] = 0
    np.testing.assert_allclose(ac.multi_replace(z), skc.multi_replace(z), atol=TIGHT)
    # scikit-bio refuses zeros in clr; we raise a typed error that names the two remedies
    with pytest.raises(ValueError):
        skc.clr(z)
    with pytest.raises(ac.ZeroPartError, match=r"mask=.*multi_replace"):
        ac.clr(z)


@requires_skbio
def test_oracle_scikit_bio_torch_any_axis(rng):
    from skbio.stats import composition as skc

    x = torch.tensor(random_compositions(rng, (3, 5, 8)))
    np.testing.assert_allclose(ac.clr(x, axis=1).numpy(), skc.clr(x, axis=1).numpy(), atol=TIGHT)


@requires_composition_stats
def test_oracle_composition_stats(rng):
    import composition_stats as cs

    x = random_compositions(rng, (40, 9))
    np.testing.assert_allclose(ac.closure(x * 3), cs.closure(x * 3), atol=TIGHT)
    np.testing.assert_allclose(ac.clr(x), cs.clr(x), atol=TIGHT)
    np.testing.assert_allclose(ac.alr(x), cs.alr(x), atol=TIGHT)  # denominator_idx=0 as ours
    np.testing.assert_allclose(
        ac.alr(x, denominator_idx=4), cs.alr(x, denominator_idx=4), atol=TIGHT
    )
    np.testing.assert_allclose(
        ac.alr_inv(cs.alr(x, denominator_idx=4), denominator_idx=4),
        cs.alr_inv(cs.alr(x, denominator_idx=4), denominator_idx=4),
        atol=TIGHT,
    )
    np.testing.assert_allclose(ac.inner(x, x[:5]), cs.inner(x, x[:5]), atol=1e-9)
    np.testing.assert_allclose(ac.ilr_inv(ac.ilr(x)), cs.ilr_inv(cs.ilr(x)), atol=TIGHT)
    # composition-stats' default ilr basis (Egozcue's) differs from our pivot basis, but both are
    # isometric: distances agree
    np.testing.assert_allclose(
        np.linalg.norm(cs.ilr(x[:1]) - cs.ilr(x[1:2])), ac.aitchison_distance(x[0], x[1]), atol=1e-9
    )
    z = x.copy()
    z[:, 2] = 0
    z = ac.closure(z)  # composition-stats expects closed rows; attncoda closes them itself
    np.testing.assert_allclose(ac.multi_replace(z), cs.multiplicative_replacement(z), atol=TIGHT)
    with np.errstate(divide="ignore", invalid="ignore"):
        assert not np.isfinite(cs.clr(z)).all()  # silently inf/nan there; we raise instead
    with pytest.raises(ac.ZeroPartError):
        ac.clr(z)


# ---------------------------------------------------------------------------- torch parity, float32


def test_torch_matches_numpy(rng):
    z = rng.normal(scale=4, size=(3, 4, 9))
    mask = rng.random((3, 4, 9)) > 0.3
    mask[..., :2] = True
    tz, tm = torch.tensor(z), torch.tensor(mask)
    for fn in (ac.clr, ac.ilr, ac.alr, ac.aitchison_norm):
        out = fn(tz, mask=tm, from_logits=True)
        assert isinstance(out, torch.Tensor)
        np.testing.assert_allclose(out.numpy(), fn(z, mask=mask, from_logits=True), atol=TIGHT)
    x = softmax_masked(z, mask)
    np.testing.assert_allclose(
        ac.ilr_inv(ac.ilr(tz, mask=tm, from_logits=True), mask=tm).numpy(), x, atol=TIGHT
    )
    shared = np.broadcast_to(mask[0, :1], (4, 9))  # the heads of one query share visibility
    heads = softmax_masked(z[0], shared)
    np.testing.assert_allclose(
        ac.pairwise_aitchison(torch.tensor(heads), mask=torch.tensor(shared), squared=True).numpy(),
        ac.pairwise_aitchison(heads, mask=shared, squared=True),
        atol=1e-9,
    )


def test_float32_within_documented_tolerance(rng):
    z = rng.normal(scale=3, size=(200, 64))
    z32 = z.astype(np.float32)
    out = ac.ilr(z32, from_logits=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(
        out, ac.ilr(z32.astype(np.float64), from_logits=True), rtol=1e-5, atol=1e-5
    )
    t16 = torch.tensor(z, dtype=torch.bfloat16)
    assert ac.clr(t16, from_logits=True).dtype == torch.float32


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ([0.5, np.nan, 0.5], ac.NonFiniteError, "NaN"),
        ([0.5, np.inf, 0.5], ac.NonFiniteError, "infinite"),
        ([0.5, -0.1, 0.6], ac.NegativePartError, "from_logits"),
        ([0.5, 0.0, 0.5], ac.ZeroPartError, "structural"),
        ([1.0], ac.TooFewPartsError, "at least 2"),
    ],
)
def test_bad_compositions_raise_typed_errors(data, error, match):
    with pytest.raises(error, match=match):
        ac.clr(np.array(data))
    assert issubclass(error, ValueError)


def test_bad_logits_and_masks():
    with pytest.raises(ac.NonFiniteError, match=r"\+inf"):
        ac.clr([1.0, np.inf], from_logits=True)
    with pytest.raises(ac.TooFewPartsError, match="visible"):
        ac.clr([[0.0, -np.inf, -np.inf]], from_logits=True)
    with pytest.raises(ac.ShapeMismatchError, match="broadcast"):
        ac.clr(np.ones((2, 3)) / 3, mask=np.ones((2, 4), bool))
    with pytest.raises(ac.CompositionError, match="boolean"):
        ac.clr(np.ones((2, 3)) / 3, mask=np.ones((2, 3)))
    with pytest.raises(ac.ShapeMismatchError, match="out of range"):
        ac.clr(np.ones(3) / 3, axis=2)
    with pytest.raises(ac.ShapeMismatchError, match=r"\(D-1, D\)"):
        ac.ilr(np.ones(4) / 4, basis=np.eye(4))
    with pytest.raises(ac.ShapeMismatchError, match="every part visible"):
        ac.ilr(np.ones(4) / 4, basis=ac.pivot_basis(4), mask=[True, True, True, False])
    with pytest.raises(ac.NotClosedError, match="closure"):
        ac.entropy([0.5, 0.6])
    with pytest.raises(ac.CompositionError, match="real numbers"):
        ac.clr(np.array([1 + 1j, 2]))


def test_mixed_devices_raise():
    meta = torch.ones(3, device="meta")
    for fn in (ac.inner, ac.paired_inner):
        with pytest.raises(ac.DeviceMismatchError, match="different devices"):
            fn(torch.ones(3) / 3, meta / 3)


def test_inputs_never_modified(rng):
    z = rng.normal(size=(4, 6))
    mask = rng.random((4, 6)) > 0.2
    mask[:, :2] = True
    z0, m0 = z.copy(), mask.copy()
    for fn in (ac.clr, ac.ilr, ac.alr):
        fn(z, mask=mask, from_logits=True)
    ac.decompose(z, mask=mask, from_logits=True)
    np.testing.assert_array_equal(z, z0)
    np.testing.assert_array_equal(mask, m0)


# ---------------------------------------------------------------------------- fast paths
# The speed paths (blocks of rows, fused checks, O(D) pivot coordinates, numpy views of CPU
# tensors on one thread) must give the general paths' numbers and refusals.

BLOCKED_ROWS = 20_000  # 20,000 x 512 float64 = 82 MB: above the 64 MB where blocks start


@pytest.fixture(scope="module")
def big():
    rng = np.random.default_rng(7)
    x = ac.closure(rng.gamma(0.5, size=(BLOCKED_ROWS, 512)) + 1e-3)
    y = ac.closure(rng.gamma(0.5, size=(BLOCKED_ROWS, 512)) + 1e-3)
    return x, y


@pytest.mark.slow
def test_blocked_paths_match_the_formulas(big):
    x, y = big
    basis = ac.pivot_basis(512)
    assert np.abs(ac.closure(x * 3.0) - x).max() < TIGHT
    z = ac.ilr(x)
    assert np.abs(z - ac.clr(x) @ basis.T).max() < TIGHT
    assert np.abs(ac.ilr_inv(z) - x).max() < TIGHT
    assert np.abs(ac.ilr_inv(z, basis) - x).max() < TIGHT
    xy = x * y
    assert np.abs(ac.perturb(x, y) - xy / xy.sum(-1, keepdims=True)).max() < TIGHT
    assert np.abs(ac.perturb_inv(ac.perturb(x, y), y) - x).max() < TIGHT
    x2 = x**2
    assert np.abs(ac.power(x, 2.0) - x2 / x2.sum(-1, keepdims=True)).max() < TIGHT
    assert np.abs(ac.alr_inv(ac.alr(x)) - x).max() < TIGHT


@pytest.mark.parametrize("parts", range(2, 13))
def test_pivot_paths_agree_at_every_width(rng, parts):
    """The O(D) pivot coordinates against the basis matmul, at small widths too (numpy 2.4's
    strided ``np.negative`` once broke the last part at 9 parts)."""
    x = random_compositions(rng, (5, parts))
    z = ac.ilr(x)
    np.testing.assert_allclose(z, ac.clr(x) @ ac.pivot_basis(parts).T, atol=TIGHT)
    np.testing.assert_allclose(ac.ilr_inv(z), x, atol=TIGHT)


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        (lambda x, y: ac.closure(x), ac.NegativePartError),
        (lambda x, y: ac.perturb(x, y), ac.NegativePartError),
        (lambda x, y: ac.perturb(y, x), ac.NegativePartError),
        (lambda x, y: ac.power(x, 2.0), ac.NegativePartError),
        (lambda x, y: ac.perturb_inv(y, x), ac.NegativePartError),
    ],
)
def test_fused_checks_still_refuse_a_bad_part_in_a_late_block(big, fn, error):
    x, y = big
    bad = x.copy()
    bad[-3, 100] = -0.5
    with pytest.raises(error):
        fn(bad, y)


def test_perturb_refuses_two_negative_factors_whose_product_is_positive(big):
    x, y = big
    xb, yb = x.copy(), y.copy()
    xb[5, 7] = yb[5, 7] = -0.1
    with pytest.raises(ac.NegativePartError):
        ac.perturb(xb, yb)


def test_closure_and_power_refuse_nan_inf_and_zero_fast(big):
    x, _ = big
    for value, error in ((np.nan, ac.NonFiniteError), (np.inf, ac.NonFiniteError)):
        bad = x.copy()
        bad[-1, -1] = value
        with pytest.raises(error):
            ac.closure(bad)
        with pytest.raises(error):
            ac.power(bad, 0.5)
    bad = x.copy()
    bad[0, 0] = 0.0
    with pytest.raises(ac.ZeroPartError):
        ac.power(bad, 2.0)
    with pytest.raises(ac.ZeroPartError):
        ac.perturb_inv(x, bad)


@pytest.mark.parametrize("a", [2.0, 0.5, -1.5, 0.0, 400.0, -400.0])
def test_power_without_logs_matches_the_log_space_path(rng, a):
    x = random_compositions(rng, (6, 9))
    general = ac.power(x.tolist(), a)  # lists take the log-space path
    np.testing.assert_allclose(ac.power(x, a), general, atol=TIGHT)


def test_multi_replace_in_place_matches_the_definition(rng):
    x = random_compositions(rng, (6, 9))
    x[x < np.quantile(x, 0.2)] = 0.0
    closed = x / x.sum(-1, keepdims=True)
    k = (closed == 0).sum(-1, keepdims=True)
    d = 1 / 81
    expected = np.where(closed == 0, d, closed * (1 - k * d))
    np.testing.assert_allclose(ac.multi_replace(x), expected, atol=1e-15)


FUSED_CALLS = {
    "closure": lambda x, y, z: ac.closure(z),
    "entropy": lambda x, y, z: ac.entropy(ac.closure(z)),  # zeros: entr(0) = 0
    "entropy of logits": lambda x, y, z: ac.entropy(_log(z), from_logits=True),  # -inf at zeros
    "alr": lambda x, y, z: ac.alr(x),
    "perturb": lambda x, y, z: ac.perturb(x, y),
    "perturb_inv": lambda x, y, z: ac.perturb_inv(x, y),
    "power 2": lambda x, y, z: ac.power(x, 2.0),
    "power -1.5": lambda x, y, z: ac.power(x, -1.5),
    "power 400": lambda x, y, z: ac.power(x, 400.0),  # every block scaled row by row
    "multi_replace": lambda x, y, z: ac.multi_replace(z),
    "clr": lambda x, y, z: ac.clr(x),
    "ilr given basis": lambda x, y, z: ac.ilr(x, ac.pivot_basis(x.shape[-1])),
    "clr_inv": lambda x, y, z: ac.clr_inv(np.log(x)),
    "aitchison_distance": lambda x, y, z: ac.aitchison_distance(x, y),
}


def _log(z):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(z))


@pytest.fixture(params=["torch log/exp", "numpy log/exp"])
def small_blocks(request, monkeypatch):
    """The fused block paths for small arrays: many blocks of a few rows, torch kernels on for
    sums and divisions, and each engine in turn for log and exp (this CPU picks one of them:
    numpy's where it runs AVX-512, torch's elsewhere)."""
    from attncoda import _array, _closure, _geometry, _zeros

    numpy_engine = request.param.startswith("numpy")
    monkeypatch.setattr(_array, "numpy_kernel_is_avx512", lambda name, dtype: numpy_engine)

    for module in (_array, _closure, _geometry, _zeros):
        for name, value in (
            ("MIN_BLOCKED_BYTES", 1),
            ("PRODUCT_BLOCK_BYTES", 3 * 8 * 13),
            ("REPLACE_BLOCK_BYTES", 3 * 8 * 13),
            ("ROW_BLOCK_BYTES", 3 * 8 * 13),
            ("TORCH_MIN_BYTES", 1),
        ):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)


def _with_zeros(x):
    z = x.copy()
    z[x < np.quantile(x, 0.1)] = 0.0
    return z


@pytest.mark.parametrize("parts", [2, 3, 9, 64, 513])
@pytest.mark.parametrize("name", sorted(FUSED_CALLS))
def test_fused_blocks_match_the_general_path_and_leave_inputs_alone(
    rng, small_blocks, monkeypatch, name, parts
):
    """Blocks of 13 rows or fewer (odd widths, a last block cut short), torch's kernels and
    numpy's: the one-shot general path's numbers (Fortran-ordered copies take it), inputs
    untouched."""
    from attncoda import _array

    x = random_compositions(rng, (40, parts))
    y = random_compositions(rng, (40, parts))
    z = _with_zeros(x)
    copies = [a.copy() for a in (x, y, z)]
    call = FUSED_CALLS[name]
    fused = call(x, y, z)
    general = np.asarray(call(*(np.asfortranarray(a) for a in (x, y, z))))
    for arr, before in zip((x, y, z), copies, strict=True):
        np.testing.assert_array_equal(arr, before)
    np.testing.assert_allclose(fused, general, atol=TIGHT, rtol=1e-12)
    monkeypatch.setattr(_array, "torch_module", lambda: None)  # as without torch installed
    np.testing.assert_allclose(call(x, y, z), fused, atol=TIGHT, rtol=1e-12)


def test_the_log_engine_question_never_raises_and_says_no_where_numpy_cannot_tell(monkeypatch):
    from attncoda import _array

    assert _array.numpy_kernel_is_avx512("no_such_ufunc", np.dtype("float64")) is False
    assert isinstance(_array.numpy_kernel_is_avx512("log", np.dtype("float32")), bool)
    _array.numpy_kernel_is_avx512.cache_clear()
    monkeypatch.setitem(sys.modules, "numpy.lib.introspect", None)  # numpy < 2.0: no module
    try:
        assert _array.numpy_kernel_is_avx512("log", np.dtype("float64")) is False
    finally:
        _array.numpy_kernel_is_avx512.cache_clear()


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        (lambda x, y: ac.perturb_inv(x, y), ac.NonFiniteError),
        (lambda x, y: ac.perturb(x, y), ac.NonFiniteError),
        (lambda x, y: ac.power(y, 2.0), ac.NonFiniteError),
        (lambda x, y: ac.multi_replace(y), ac.NonFiniteError),
    ],
)
def test_fused_blocks_refuse_an_infinite_part_in_a_late_block(rng, small_blocks, fn, error):
    x = random_compositions(rng, (40, 9))
    y = random_compositions(rng, (40, 9))
    y[-2, 4] = np.inf  # x / inf is 0: only the divisor's own check sees it
    with pytest.raises(error):
        fn(x, y)


def _outcome(fn):
    try:
        return fn()
    except ac.CompositionError as err:
        return type(err)


@pytest.mark.parametrize("divide", [False, True], ids=["perturb", "perturb_inv"])
@pytest.mark.parametrize(
    "where", ["x", "y", "both", "y where x is 0", "y where x is -0", "x where y is 0"]
)
@pytest.mark.parametrize("value", [-0.5, -0.0, 0.0, np.nan, np.inf, -np.inf, 1e308])
def test_fused_products_decide_every_bad_part_as_the_general_path(
    rng, small_blocks, divide, where, value
):
    """The fused product checks one factor after the product has read it (the sign of ``x``,
    a divisor's sign and ``+inf``) and the sign of the results (NaN and infinities show in the
    row sums): whatever one part of a late block holds, it refuses with the general path's
    error or gives its result."""
    x = random_compositions(rng, (40, 9))
    y = random_compositions(rng, (40, 9))
    if where in ("x", "both"):
        x[-3, 4] = value
    if where in ("y", "both"):
        y[-3, 4] = value
    if where.startswith("y where"):
        x[-3, 4], y[-3, 4] = (-0.0 if where.endswith("-0") else 0.0), value
    if where == "x where y is 0":
        x[-3, 4], y[-3, 4] = value, 0.0
    fn = ac.perturb_inv if divide else ac.perturb
    general = _outcome(lambda: fn(np.asfortranarray(x), np.asfortranarray(y)))  # not fused
    fused = _outcome(lambda: fn(x, y))
    if isinstance(general, type):
        assert fused is general
    else:
        np.testing.assert_allclose(fused, general, atol=TIGHT, rtol=1e-12)


@pytest.mark.parametrize("value", [-0.5, -0.0, 0.0, np.nan, np.inf, -np.inf, 1e308])
def test_ilr_with_a_given_basis_in_blocks_decides_every_bad_part_as_the_general_path(
    rng, small_blocks, value
):
    x = random_compositions(rng, (40, 9))
    x[-3, 4] = value
    basis = ac.pivot_basis(9)
    general = _outcome(lambda: ac.ilr(np.asfortranarray(x), basis))  # not in blocks
    fused = _outcome(lambda: ac.ilr(x, basis))
    if isinstance(general, type):
        assert fused is general
    else:
        np.testing.assert_allclose(fused, general, atol=TIGHT, rtol=1e-12)


def test_ilr_in_blocks_refuses_a_bad_basis_before_it_reads_the_data(small_blocks, monkeypatch):
    from attncoda import _logratio

    def no_data_pass(*args, **kwargs):
        raise AssertionError("the data was read before the basis was checked")

    monkeypatch.setattr(_logratio, "_clr_dense_blocks", no_data_pass)
    x = np.full((40, 9), 1 / 9)
    with pytest.raises(ac.CompositionError, match="not orthonormal"):
        ac.ilr(x, 2 * ac.pivot_basis(9))


@pytest.mark.parametrize(
    ("value", "error"),
    [(-0.01, ac.NegativePartError), (np.nan, ac.NonFiniteError), (0.3, ac.NotClosedError)],
)
def test_blocked_entropy_refuses_a_bad_late_row_as_the_general_path(
    rng, small_blocks, value, error
):
    x = random_compositions(rng, (40, 9))
    if error is ac.NotClosedError:
        x[-3, 2] += value
    else:  # the row still sums to 1 where it can
        x[-3, 3] += x[-3, 2] - (0.0 if np.isnan(value) else value)
        x[-3, 2] = value
    with pytest.raises(error):
        ac.entropy(x)
    with pytest.raises(error):
        ac.entropy(x.tolist())


@pytest.mark.parametrize(
    ("value", "error"),
    [(np.nan, ac.NonFiniteError), (np.inf, ac.NonFiniteError), ("row", ac.TooFewPartsError)],
)
def test_blocked_entropy_of_logits_refuses_a_bad_late_row_as_the_general_path(
    rng, small_blocks, value, error
):
    z = np.log(random_compositions(rng, (40, 9)))
    z[-5, :3] = -np.inf  # invisible keys are allowed
    if value == "row":
        z[-3] = -np.inf  # no visible key
    else:
        z[-3, 2] = value
    with pytest.raises(error):
        ac.entropy(z, from_logits=True)
    with pytest.raises(error):
        ac.entropy(z.tolist(), from_logits=True)
    if value == "row":
        got = ac.entropy(z, from_logits=True, degenerate="nan")
        expected = ac.entropy(z.tolist(), from_logits=True, degenerate="nan")
        np.testing.assert_allclose(got, expected, atol=TIGHT)
        assert np.isnan(got[-3]) and np.isfinite(np.delete(got, -3)).all()


def test_blocked_entropy_of_unclosed_rows_unvalidated_is_the_general_paths(rng, small_blocks):
    x = random_compositions(rng, (40, 9)) * 3.0  # rows summing to 3: the entropy of C(x)
    np.testing.assert_allclose(
        ac.entropy(x, validate=False), ac.entropy(x.tolist(), validate=False), atol=TIGHT
    )
    np.testing.assert_allclose(ac.entropy(ac.closure(x)), ac.entropy(x.tolist(), validate=False))


def test_blocked_clr_inv_refuses_a_bad_late_row_and_unvalidated_matches_the_general_path(
    rng, small_blocks
):
    z = np.log(random_compositions(rng, (40, 9)))
    z[-3, 2] = np.nan
    with pytest.raises(ac.NonFiniteError):
        ac.clr_inv(z)
    z[-5] = -np.inf  # unvalidated: as the one-shot path (a row without a visible part is NaN)
    z[-7, 1] = np.inf
    with np.errstate(invalid="ignore"):
        general = np.asarray(ac.clr_inv(z.tolist(), validate=False))
        blocked = ac.clr_inv(z, validate=False)
    assert np.isnan(blocked[-5]).all() and np.isnan(blocked[-7, 1])
    np.testing.assert_allclose(blocked, general, atol=TIGHT, rtol=1e-12)


@pytest.mark.parametrize("a", [2.0, -2.0])
def test_fused_power_scales_only_the_blocks_whose_powers_leave_the_range(rng, small_blocks, a):
    """A part of 1e-200 squared underflows (and to the -2 overflows): its block is powered
    row by row scaled by the row's extreme, the other blocks as they are; all as the
    log-space path."""
    x = random_compositions(rng, (40, 9))
    x[20, 3] = 1e-200
    x[20] /= x[20].sum()
    np.testing.assert_allclose(ac.power(x, a), ac.power(x.tolist(), a), atol=TIGHT, rtol=1e-12)


def test_fused_multi_replace_counts_hundreds_of_zeros_in_a_row(rng, small_blocks):
    """More zeros in a row than a byte counts (the counts are summed from the mask's bytes)."""
    x = random_compositions(rng, (20, 700))
    x[:, :300] = 0.0
    x[3, 300:699] = 0.0  # one row: 699 zeros, one part left
    closed = x / x.sum(-1, keepdims=True)
    d = 1e-4
    k = (closed == 0).sum(-1, keepdims=True)
    expected = np.where(closed == 0, d, closed * (1 - k * d))
    np.testing.assert_allclose(ac.multi_replace(x, delta=d), expected, atol=1e-15, rtol=1e-12)


def test_fused_multi_replace_refuses_a_large_delta_and_a_negative_part(rng, small_blocks):
    x = _with_zeros(random_compositions(rng, (40, 9)))
    with pytest.raises(ac.CompositionError, match="too large"):
        ac.multi_replace(x, delta=0.6)
    bad = x.copy()
    bad[-1, 3] = -0.1
    with pytest.raises(ac.NegativePartError):
        ac.multi_replace(bad, delta=0.6)  # the data's refusal comes first, as unfused


def test_distance_and_inner_products_leave_their_inputs_alone(rng, small_blocks):
    """aitchison_distance subtracts into clr's own result: never into the caller's arrays, also
    when clr of logits is nearly the input itself, and with a broadcast reference row."""
    x, y = random_compositions(rng, (30, 7)), random_compositions(rng, (30, 7))
    zx, zy = np.log(x), np.log(y)
    for a, b, kw in ((x, y, {}), (zx, zy, {"from_logits": True}), (x, y[0], {})):
        before = (a.copy(), b.copy())
        d = ac.aitchison_distance(a, b, **kw)
        p = ac.paired_inner(a, b, **kw)
        ca, cb = ac.clr(a, **kw), ac.clr(np.broadcast_to(b, a.shape), **kw)
        np.testing.assert_allclose(d, np.linalg.norm(ca - cb, axis=-1), atol=TIGHT)
        np.testing.assert_allclose(p, (ca * cb).sum(-1), atol=TIGHT)
        np.testing.assert_array_equal(a, before[0])
        np.testing.assert_array_equal(b, before[1])


CPU_CALLS = {
    "closure": lambda x, y: ac.closure(x),
    "clr": lambda x, y: ac.clr(x),
    "clr_inv": lambda x, y: ac.clr_inv(ac.clr(x)),
    "alr": lambda x, y: ac.alr(x),
    "ilr": lambda x, y: ac.ilr(x),
    "ilr_inv": lambda x, y: ac.ilr_inv(ac.ilr(x)),
    "perturb": lambda x, y: ac.perturb(x, y),
    "power": lambda x, y: ac.power(x, 2.0),
    "aitchison_distance": lambda x, y: ac.aitchison_distance(x, y),
    "decompose": lambda x, y: ac.decompose(x).balance,
}


@pytest.mark.parametrize("name", sorted(CPU_CALLS))
def test_cpu_tensors_on_one_thread_give_torch_results(rng, name):
    """On one torch thread numpy computes CPU tensors on views; the results are tensors with
    torch's own numbers, and a tensor that autograd tracks stays in torch."""
    x = torch.from_numpy(random_compositions(rng, (6, 9)))
    y = torch.from_numpy(random_compositions(rng, (6, 9)))
    call = CPU_CALLS[name]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        in_torch = call(x, y)
        torch.set_num_threads(1)
        via_numpy = call(x, y)
        tracked = call(x.clone().requires_grad_(True), y)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(via_numpy, torch.Tensor) and via_numpy.dtype == in_torch.dtype
    torch.testing.assert_close(via_numpy, in_torch, atol=TIGHT, rtol=0)
    assert tracked.requires_grad


def test_small_inputs_leave_torch_unimported():
    """The core's maths on a few rows of numpy input stays in numpy: torch (1.5 s to import) is
    used for large arrays only, where its kernels pay for themselves."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, attncoda as ac\n"
        "x = ac.closure(np.random.default_rng(0).random((20, 6)))\n"
        "z = np.log(x)\n"
        "sink = np.zeros(z.shape, dtype=bool)\n"
        "sink[:, 0] = True\n"
        "ac.clr(x); ac.clr(z, from_logits=True); ac.ilr_inv(ac.ilr(x)); ac.alr(x)\n"
        "ac.perturb(x, x); ac.power(x, 2); ac.entropy(x); ac.aitchison_distance(x, x[::-1])\n"
        "ac.decompose(x); ac.decompose(z, sink, from_logits=True)\n"
        "ac.clr_inv(z); ac.alr_inv(ac.alr(x)); ac.multi_replace(x); ac.pairwise_aitchison(x)\n"
        "print('torch' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False", res.stdout + res.stderr


def test_a_gram_of_one_matrix_is_symmetric_and_an_explicit_torch_backend_stays_in_torch(rng):
    """``row_gram(a)`` under ``"auto"`` goes to BLAS's syrk through numpy (one triangle, half
    the work): exactly symmetric, equal to the general product; ``backend="torch"`` keeps
    torch's product, bit for bit."""
    from attncoda._pairwise import row_gram

    a = rng.standard_normal((37, 301))
    g = row_gram(a)
    np.testing.assert_array_equal(g, g.T)
    np.testing.assert_allclose(g, a @ a.copy().T, rtol=1e-12, atol=1e-12 * np.abs(g).max())
    assert row_gram(a, a).tolist() == g.tolist()  # the same array as b: the same product
    ta = torch.from_numpy(a)
    assert row_gram(a, backend="torch").tolist() == torch.matmul(ta, ta.T).numpy().tolist()
    out = np.empty((37, 37))
    assert row_gram(a, out=out) is out and out.tolist() == g.tolist()


def test_auto_runs_one_matrix_in_numpy_and_a_stack_in_torch(rng):
    """Under ``"auto"`` a general product of two matrices is numpy's (one BLAS call, the faster
    one here), bit for bit, and a stack of them is torch's batched GEMM, bit for bit."""
    from attncoda._pairwise import row_gram

    a, b = rng.standard_normal((37, 301)), rng.standard_normal((23, 301))
    assert row_gram(a, b).tolist() == np.matmul(a, b.T).tolist()
    sa, sb = rng.standard_normal((3, 37, 301)), rng.standard_normal((3, 23, 301))
    want = torch.matmul(torch.from_numpy(sa), torch.from_numpy(sb).transpose(-1, -2)).numpy()
    assert row_gram(sa, sb).tolist() == want.tolist()
