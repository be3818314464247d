"""The sink/content identities, checked to 1e-10 in float64, and entropy attribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import logit_pairs, logit_rows, softmax_masked

import attncoda as ac

TIGHT = 1e-10


def first_visible(mask):
    return mask.argmax(-1)


@given(logit_pairs())
@settings(max_examples=80, deadline=None)
def test_aitchison_distance_splits_into_sink_and_content(zwm):
    z, w, mask = zwm
    d2 = ac.aitchison_distance(z, w, mask=mask, from_logits=True) ** 2
    split = ac.aitchison_split(z, w, mask=mask, from_logits=True)
    np.testing.assert_allclose(split.total, d2, atol=TIGHT, rtol=1e-10)
    # the sink term is the squared balance difference, the content term the content distance
    bz = ac.decompose(z, mask=mask, from_logits=True).balance
    bw = ac.decompose(w, mask=mask, from_logits=True).balance
    np.testing.assert_allclose(split.sink, (bz - bw) ** 2, atol=TIGHT, rtol=1e-10)
    content_mask = mask.copy()
    content_mask[np.arange(len(mask)), first_visible(mask)] = False
    if (content_mask.sum(-1) >= 2).all():
        dc = ac.aitchison_distance(z, w, mask=content_mask, from_logits=True) ** 2
        np.testing.assert_allclose(split.content, dc, atol=TIGHT, rtol=1e-10)


@given(logit_rows())
@settings(max_examples=80, deadline=None)
def test_entropy_grouping_rule(zm):
    z, mask = zm
    d = ac.decompose(z, mask=mask, from_logits=True)
    h = ac.entropy(z, mask=mask, from_logits=True)
    np.testing.assert_allclose(d.entropy, h, atol=TIGHT)
    rebuilt = ac.binary_entropy(d.sink_share) + (1 - d.sink_share) * d.content_entropy
    np.testing.assert_allclose(rebuilt, h, atol=TIGHT)
    np.testing.assert_allclose(d.binary_entropy, ac.binary_entropy(d.sink_share), atol=TIGHT)
    # entropy from probabilities equals entropy from logits
    x = softmax_masked(z, mask)
    np.testing.assert_allclose(ac.entropy(x, mask=mask), h, atol=1e-9)


@given(logit_rows(min_parts=4), st.data())
@settings(max_examples=60, deadline=None)
def test_multi_group_entropy_rule(zm, data):
    z, mask = zm
    d = z.shape[1]
    cut1 = data.draw(st.integers(1, d - 2))
    cut2 = data.draw(st.integers(cut1 + 1, d - 1))
    groups = [list(range(cut1)), list(range(cut1, cut2)), list(range(cut2, d))]
    g = ac.group_decompose(z, groups, mask=mask, from_logits=True)
    np.testing.assert_allclose(g.shares.sum(-1), 1, atol=TIGHT)
    rebuilt = g.between_entropy + (g.shares * g.within_entropy).sum(-1)
    np.testing.assert_allclose(rebuilt, g.entropy, atol=TIGHT)
    np.testing.assert_allclose(g.entropy, ac.entropy(z, mask=mask, from_logits=True), atol=TIGHT)


@given(logit_rows(min_parts=3), st.floats(-25, 25))
@settings(max_examples=60, deadline=None)
def test_content_is_invariant_to_the_sink_logit(zm, shift):
    z, mask = zm
    moved = z.copy()
    rows = np.arange(len(z))
    moved[rows, first_visible(mask)] += shift
    a = ac.decompose(z, mask=mask, from_logits=True)
    b = ac.decompose(moved, mask=mask, from_logits=True)
    np.testing.assert_allclose(a.content, b.content, atol=TIGHT)
    np.testing.assert_allclose(a.content_entropy, b.content_entropy, atol=TIGHT)
    # and the balance moves by exactly sqrt(n/(n+1)) * shift
    n = a.n_content
    np.testing.assert_allclose(b.balance - a.balance, np.sqrt(n / (n + 1)) * shift, atol=1e-9)


@given(logit_rows())
@settings(max_examples=60, deadline=None)
def test_sink_share_and_logodds(zm):
    z, mask = zm
    x = softmax_masked(z, mask)
    d = ac.decompose(z, mask=mask, from_logits=True)
    s = x[np.arange(len(x)), first_visible(mask)]
    np.testing.assert_allclose(d.sink_share, s, atol=TIGHT)
    # exact reference in log space: z_sink - logsumexp(z_content)
    rows = np.arange(len(z))
    content = np.where(mask, z, -np.inf)
    content[rows, first_visible(mask)] = -np.inf
    top = content.max(-1)
    expected = z[rows, first_visible(mask)] - (top + np.log(np.exp(content - top[:, None]).sum(-1)))
    np.testing.assert_allclose(d.sink_logodds, expected, atol=1e-10)


def test_decompose_from_probabilities_matches_logits(rng):
    z = rng.normal(scale=2, size=(5, 7))
    x = softmax_masked(z, np.ones_like(z, bool))
    a, b = ac.decompose(x), ac.decompose(z, from_logits=True)
    for field in ("sink_share", "sink_logodds", "balance", "entropy", "content_entropy"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), atol=1e-12)
    np.testing.assert_allclose(a.content, b.content, atol=1e-12)


def test_several_sinks_and_explicit_sink(rng):
    z = rng.normal(size=(4, 8))
    two = ac.decompose(z, sink=[0, 1], from_logits=True)
    x = softmax_masked(z, np.ones_like(z, bool))
    np.testing.assert_allclose(two.sink_share, x[:, :2].sum(-1), atol=TIGHT)
    s = two.sink_share
    rebuilt = ac.binary_entropy(s) + s * two.sink_entropy + (1 - s) * two.content_entropy
    np.testing.assert_allclose(rebuilt, ac.entropy(x), atol=TIGHT)
    w = rng.normal(size=(4, 8))
    sp = ac.aitchison_split(z, w, sink=[0, 1], from_logits=True)
    np.testing.assert_allclose(
        sp.total, ac.aitchison_distance(z, w, from_logits=True) ** 2, atol=TIGHT
    )
    # a boolean per-row sink (e.g. a BOS token at different positions)
    sink = np.zeros((4, 8), bool)
    sink[np.arange(4), [0, 2, 5, 7]] = True
    d = ac.decompose(z, sink=sink, from_logits=True)
    np.testing.assert_allclose(d.sink_share, x[np.arange(4), [0, 2, 5, 7]], atol=TIGHT)


def test_left_padding_sink_is_first_valid_key():
    z = np.array([[-np.inf, -np.inf, 2.0, 0.5, 0.1]])
    d = ac.decompose(z, from_logits=True)
    x = softmax_masked(np.nan_to_num(z, neginf=0), np.isfinite(z))
    assert float(d.sink_share[0]) == pytest.approx(x[0, 2])
    with pytest.raises(ac.ShapeMismatchError, match="left padding"):
        ac.decompose(z, sink=0, from_logits=True)


def test_degenerate_rows():
    z = np.array([[1.0, -np.inf, -np.inf], [1.0, 2.0, -np.inf]])
    with pytest.raises(ac.TooFewPartsError, match="degenerate='nan'"):
        ac.decompose(z, from_logits=True)
    d = ac.decompose(z, from_logits=True, degenerate="nan")
    assert d.sink_share[0] == 1 and np.isinf(d.sink_logodds[0]) and np.isnan(d.content_entropy[0])
    assert np.isfinite(d.content_entropy[1]) and d.content_entropy[1] == 0.0
    assert d.entropy[0] == 0.0


def test_pairwise_split_matches_pairwise_distances(rng):
    z = rng.normal(scale=3, size=(6, 9, 12))  # queries x heads x keys
    sp = ac.pairwise_aitchison_split(z, from_logits=True)
    np.testing.assert_allclose(
        sp.total, ac.pairwise_aitchison(z, from_logits=True, squared=True), atol=1e-9
    )
    direct = ac.aitchison_split(z[2, 1], z[2, 4], from_logits=True)
    assert sp.sink[2, 1, 4] == pytest.approx(direct.sink, abs=1e-9)
    assert sp.content[2, 1, 4] == pytest.approx(direct.content, abs=1e-9)


# ---------------------------------------------------------------------------- attribution


@given(
    st.floats(0, 1),
    st.floats(0, 8),
    st.floats(0, 1),
    st.floats(0, 8),
)
@settings(max_examples=200, deadline=None)
def test_attribution_sums_exactly(sa, ha, sb, hb):
    ch = ac.attribute_entropy_change(sa, ha, sb, hb)
    assert float(ch.sink + ch.content) == pytest.approx(float(ch.total), abs=1e-12)


def test_attribution_on_rows_and_pure_cases(rng):
    za, zb = rng.normal(size=(2, 10, 16))
    ch = ac.entropy_change(za, zb, from_logits=True)
    np.testing.assert_allclose(
        ch.total, ac.entropy(zb, from_logits=True) - ac.entropy(za, from_logits=True), atol=TIGHT
    )
    np.testing.assert_allclose(ch.sink + ch.content, ch.total, atol=TIGHT)
    # moving only the sink logit changes only the sink part
    moved = za.copy()
    moved[:, 0] += 3
    pure = ac.entropy_change(za, moved, from_logits=True)
    np.testing.assert_allclose(pure.content, 0, atol=TIGHT)
    np.testing.assert_allclose(pure.sink, pure.total, atol=TIGHT)
    # sharpening only content at fixed sink share changes only the content part
    sharpened = za.copy()
    sharpened[:, 1:] *= 2
    sh = ac.decompose(sharpened, from_logits=True)
    a = ac.decompose(za, from_logits=True)
    fixed = sharpened.copy()
    # re-tune the sink logit so the sink share matches state a exactly
    lse_c = np.log(np.exp(sharpened[:, 1:]).sum(-1))
    fixed[:, 0] = a.sink_logodds + lse_c
    ch2 = ac.entropy_change(za, fixed, from_logits=True)
    np.testing.assert_allclose(ch2.sink, 0, atol=1e-10)
    assert not np.allclose(sh.content_entropy, a.content_entropy)


def test_attribution_aggregates_linearly(rng):
    sa, sb = rng.random((2, 30))
    ha, hb = rng.random((2, 30)) * 4
    parts = ac.attribute_entropy_change(sa, ha, sb, hb)
    # mean of per-head parts equals the mean total change: aggregation keeps the split exact
    assert parts.sink.mean() + parts.content.mean() == pytest.approx(parts.total.mean(), abs=1e-12)


def test_grouped_attribution_reduces_to_two_groups(rng):
    za, zb = rng.normal(size=(2, 5, 9))
    groups = [[0], list(range(1, 9))]
    ga = ac.group_decompose(za, groups, from_logits=True)
    gb = ac.group_decompose(zb, groups, from_logits=True)
    g = ac.attribute_grouped_entropy_change(
        ga.shares, ga.within_entropy, gb.shares, gb.within_entropy
    )
    two = ac.entropy_change(za, zb, from_logits=True)
    np.testing.assert_allclose(g.between, two.sink, atol=TIGHT)
    np.testing.assert_allclose(g.within[..., 1], two.content, atol=TIGHT)
    np.testing.assert_allclose(g.between + g.within.sum(-1), g.total, atol=TIGHT)


def test_three_group_arach_rows(rng):
    z = rng.normal(size=(3, 10))
    labels = np.array([0, 1] + [2] * 8)
    g = ac.group_decompose(z, labels, from_logits=True)
    g2 = ac.group_decompose(z, [[0], [1], list(range(2, 10))], from_logits=True)
    np.testing.assert_allclose(g.shares, g2.shares, atol=TIGHT)
    x = softmax_masked(z, np.ones_like(z, bool))
    np.testing.assert_allclose(g.shares[:, 1], x[:, 1], atol=TIGHT)


def test_attribution_rejects_bad_shares():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ac.attribute_entropy_change(1.5, 1.0, 0.5, 1.0)
    with pytest.raises(ac.NonFiniteError):
        ac.attribute_entropy_change(0.5, np.nan, 0.5, 1.0)


def test_torch_decomposition_matches_numpy(rng):
    torch = pytest.importorskip("torch")
    z = rng.normal(size=(3, 4, 11))
    mask = rng.random((3, 4, 11)) > 0.3
    mask[..., :3] = True
    a = ac.decompose(z, mask=mask, from_logits=True)
    b = ac.decompose(torch.tensor(z), mask=torch.tensor(mask), from_logits=True)
    for field in ("sink_share", "sink_logodds", "balance", "entropy", "content_entropy"):
        np.testing.assert_allclose(getattr(b, field).numpy(), getattr(a, field), atol=TIGHT)
    g = ac.group_decompose(torch.tensor(z), [[0], [1], list(range(2, 11))], from_logits=True)
    assert isinstance(g.shares, torch.Tensor)


def _sliding_causal_rows(rng, n_rows, keys, window):
    """log-attention rows of causal queries (row i sees keys up to i % keys) under a sliding
    window (keys older than ``window`` invisible): -inf where invisible."""
    q = np.arange(n_rows)[:, None] % keys
    k = np.arange(keys)[None, :]
    visible = (k <= q) & (k > q - window)
    z = np.where(visible, rng.standard_normal((n_rows, keys)), -np.inf)
    return z, visible


def _row_by_row(z: np.ndarray, sink: np.ndarray) -> dict[str, np.ndarray]:
    """The decomposition's quantities of each row of logits, one row at a time from their
    definitions (softmax over the visible keys; ``sink`` marks the sink keys)."""
    out: dict[str, list] = {k: [] for k in ("share", "content", "h", "h_c", "h_s", "balance")}
    for zi, si in zip(z, sink, strict=True):
        vis = np.isfinite(zi)
        s_keys, c_keys = vis & si, vis & ~si
        p = np.where(vis, np.exp(zi - zi[vis].max()), 0.0)
        p /= p.sum()
        share = p[s_keys].sum()
        content = np.where(c_keys, p, 0.0) / p[c_keys].sum()
        sink_part = p[s_keys] / share if share > 0 else np.zeros(0)
        out["share"].append(share)
        out["content"].append(content)
        out["h"].append(-(p[vis] * np.log(p[vis])).sum())
        out["h_c"].append(-(content[c_keys] * np.log(content[c_keys])).sum())
        out["h_s"].append(-(sink_part * np.log(sink_part)).sum())
        n_s, n_c = s_keys.sum(), c_keys.sum()
        gap = zi[s_keys].mean() - zi[c_keys].mean() if n_s else np.nan
        out["balance"].append(np.sqrt(n_s * n_c / (n_s + n_c)) * gap)
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_sink_array_gives_each_rows_own_numbers(rng, backend):
    """The general path (a boolean sink array: one or two sinks per row, some invisible past a
    sliding window) gives each row's quantities from their definitions, rows without a visible
    sink included (degenerate="nan": share 0, the content is the closure of every visible key,
    no balance)."""
    z, visible = _sliding_causal_rows(rng, 48, 12, 5)
    z = z * 3.0  # sharper rows, some content far below the sink
    sink = np.zeros(z.shape, dtype=bool)
    sink[:, 0] = True  # invisible in the rows past the window
    sink[::4, 2] = True
    has_content = (visible & ~sink).any(axis=-1)  # rows of only sinks have their own test
    z, sink = z[has_content], sink[has_content]
    want = _row_by_row(z, sink)
    assert (want["share"] == 0).any() and (want["share"] > 0).any()  # both kinds of rows
    x, s = z, sink
    if backend == "torch":
        torch = pytest.importorskip("torch")
        x, s = torch.from_numpy(z), torch.from_numpy(sink)
    d = ac.decompose(x, s, from_logits=True, degenerate="nan")
    got = {k: np.asarray(getattr(d, k)) for k in vars(d)}
    tol = {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(got["sink_share"], want["share"], **tol)
    np.testing.assert_allclose(got["content"], want["content"], **tol)
    np.testing.assert_allclose(got["entropy"], want["h"], **tol)
    np.testing.assert_allclose(got["content_entropy"], want["h_c"], **tol)
    np.testing.assert_allclose(got["sink_entropy"], want["h_s"], **tol)
    np.testing.assert_allclose(got["balance"], want["balance"], **tol)
    h_b = ac.binary_entropy(want["share"])
    np.testing.assert_allclose(got["binary_entropy"], h_b, **tol)


def test_blocks_with_a_sink_mask_or_a_key_mask_equal_the_one_shot_path(rng, monkeypatch):
    """A large input with a boolean sink array or mask goes through blocks of rows (no
    full-size temporaries): the same numbers as in one go, degenerate rows included (the first
    query: only the sink; past the window: no sink; a row with no visible key)."""
    from attncoda import _array
    from attncoda import _decompose as module

    calls = []
    one_go = module._decompose
    monkeypatch.setattr(module, "_decompose", lambda *a, **k: calls.append(1) or one_go(*a, **k))
    monkeypatch.setattr(_array, "MIN_BLOCKED_BYTES", 1)
    monkeypatch.setattr(_array, "ROW_BLOCK_BYTES", 7 * 12 * 8)  # blocks of 7 rows
    z, visible = _sliding_causal_rows(rng, 60, 12, 5)
    z[59] = -np.inf  # no visible key at all
    sink = np.zeros(z.shape, dtype=bool)
    sink[:, 0] = True  # the BOS sink, invisible once it leaves the window
    sink[::3, 1] = True  # and a second sink key in every third row
    padded = np.ones((5, 1, 12), dtype=bool)  # keys of 5 samples of 12 queries, broadcast
    padded[1, :, :3] = False  # a left-padded sample
    for x, kwargs in (
        (z, {"sink": sink}),
        (z, {"sink": sink & visible, "mask": visible}),
        (z.reshape(5, 12, 12), {"mask": padded}),
    ):
        calls.clear()
        blocked = ac.decompose(x, from_logits=True, degenerate="nan", **kwargs)
        assert len(calls) == 9  # 60 rows in blocks of 7
        one_shot = ac.decompose(x.tolist(), from_logits=True, degenerate="nan", **kwargs)
        for field in vars(one_shot):
            np.testing.assert_allclose(
                getattr(blocked, field),
                getattr(one_shot, field),
                rtol=1e-12,
                atol=1e-15,
                err_msg=field,
            )
    # without degenerate="nan", the input is refused as in one go (the rows past the window
    # have an invisible sink): the blocks give way to the one-shot path and its message
    with pytest.raises(ac.ShapeMismatchError) as blocked_error:
        ac.decompose(z[:58], from_logits=True, sink=sink[:58])
    with pytest.raises(ac.ShapeMismatchError) as one_shot_error:
        ac.decompose(z[:58].tolist(), from_logits=True, sink=sink[:58])
    assert str(blocked_error.value) == str(one_shot_error.value)
    # and the first query's rows (only the sink visible)
    early = np.repeat(z[:5], 12, axis=0)  # 60 rows, degenerate ones in every block
    bos = np.zeros(early.shape, dtype=bool)
    bos[:, 0] = True
    with pytest.raises(ac.TooFewPartsError) as blocked_error:
        ac.decompose(early, from_logits=True, sink=bos)
    with pytest.raises(ac.TooFewPartsError) as one_shot_error:
        ac.decompose(early.tolist(), from_logits=True, sink=bos)
    assert str(blocked_error.value) == str(one_shot_error.value)


@pytest.mark.parametrize("parts", [64, 2048])
@pytest.mark.parametrize("sink_logit", [0.0, 30.0])
def test_content_entropy_of_probabilities_is_accurate_when_the_sink_dominates(
    rng, parts, sink_logit
):
    """The probabilities' fast path takes the content's logs as ``log x - log s_c``, where the
    content mass ``s_c`` may be e^-30 of the row. Checked against the same entropy in extended
    precision (where numpy has it) to 1e-13 nats. (``log s_c - sum c log x`` saves a pass,
    17% of the call, but errs up to 6x more, 5.8e-14 at 2,048 parts, and gives the same
    content a different entropy in the last bits for another sink share: not taken.)"""
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("numpy's longdouble is float64 on this platform: no reference")
    z = rng.standard_normal((200, parts)) * 3
    z[:, 0] += sink_logit + np.log(parts)
    x = np.exp(z - z.max(-1, keepdims=True))
    x /= x.sum(-1, keepdims=True)
    wide = x.astype(np.longdouble)[:, 1:]
    c = wide / wide.sum(-1, keepdims=True)
    want = -(c * np.log(c)).sum(-1)
    d = ac.decompose(x)
    np.testing.assert_allclose(d.content_entropy, want.astype(np.float64), rtol=0, atol=1e-13)
    # and the grouping rule ties it to the whole row's entropy
    h = ac.binary_entropy(d.sink_share) + (1 - d.sink_share) * d.content_entropy
    np.testing.assert_allclose(h, ac.entropy(x), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("from_logits", [False, True])
def test_fast_path_on_torchs_kernels_equals_the_general_path(rng, from_logits):
    """Rows large enough for torch's kernels (the row sums, the shift and the division of the
    first-sink fast path, :func:`attncoda._array.by_rows_into`) give the numbers of the general
    path (a boolean sink array, numpy throughout)."""
    from attncoda import _array

    z = rng.standard_normal((2000, 64)) * 3
    z[:, 0] += rng.uniform(0, 8, size=2000)
    assert z.nbytes >= _array.TORCH_MIN_BYTES
    x = z if from_logits else ac.clr_inv(z)
    sink = np.zeros(z.shape, dtype=bool)
    sink[:, 0] = True
    fast = ac.decompose(x, from_logits=from_logits)
    general = ac.decompose(x, sink, from_logits=from_logits)
    for field in vars(fast):
        np.testing.assert_allclose(
            getattr(fast, field), getattr(general, field), rtol=1e-12, atol=1e-14, err_msg=field
        )


@pytest.mark.parametrize("name", ["subtract", "divide"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_by_rows_into_is_numpys_arithmetic_bit_for_bit(rng, name, dtype):
    from attncoda import _array

    x = rng.standard_normal((3000, 48)).astype(dtype)
    per_row = rng.uniform(0.5, 2.0, size=(3000, 1)).astype(dtype)
    want = getattr(np, name)(x, per_row)
    np.testing.assert_array_equal(_array.by_rows_into(name, x, per_row), want)
    _array.by_rows_into(name, x, per_row, x)  # in place
    np.testing.assert_array_equal(x, want)
