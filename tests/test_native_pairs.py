"""attncoda's compiled pair kernel (attncoda.native.pair_sums) behind head_comparisons' js and
tv: against float64 numpy, on both of its code paths (AVX-512 and portable), over threads and
tiles, and the fallbacks."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attncoda as ac
from attncoda import native

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the numpy code runs")
TINY = np.finfo(np.float32).tiny


def _rows(n: int, f: int, seed: int) -> np.ndarray:
    """Softmax rows of mixed sharpness (flat to peaked), a zero row and values down to 1e-40."""
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.1, 1.0, 4.0, 20.0], size=(n, 1))
    z = rng.standard_normal((n, f)) * scale
    e = np.exp(z - z.max(-1, keepdims=True))
    rows = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    if n > 2:
        rows[1] = 0.0
        rows[2] = (10.0 ** rng.uniform(-40, 0, f)).astype(np.float32)
    return rows


def _oracle(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 sums of the same halved, lifted float32 values the kernel reads."""
    h = np.maximum(a * np.float32(0.5), TINY).astype(np.float64)
    m = h[:, None, :] + h[None, :, :]
    return (m * np.log(m)).sum(-1), 2 * np.abs(h[:, None, :] - h[None, :, :]).sum(-1)


def _assert_matches_oracle(a: np.ndarray, got: tuple) -> None:
    js, l1 = got
    want_js, want_l1 = _oracle(a)
    # float32 terms summed in float32 within a tile: a few ulps of the row sums
    np.testing.assert_allclose(js, want_js, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(l1, want_l1, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(js, js.T)
    np.testing.assert_array_equal(l1, l1.T)
    assert not np.diagonal(l1).any()


@pytest.fixture
def compiled():
    if not HAS_CC:
        pytest.skip("no C compiler on this machine: the numpy code runs")
    assert native.status() == "compiled"


@pytest.fixture
def portable(monkeypatch):
    """The library built without its AVX-512 path (what an ARM or AVX2 machine runs)."""
    if not HAS_CC:
        pytest.skip("no C compiler on this machine")
    lib, status = native._build(("-DATTNCODA_GENERIC",))
    assert status == "compiled"
    monkeypatch.setattr(native, "_state", {"lib": lib, "status": status})


@pytest.mark.parametrize("f", [1, 15, 16, 17, 500, 7000])
@pytest.mark.parametrize("n", [1, 2, 9, 40])
def test_pair_sums_equal_float64_numpy(compiled, n, f):
    a = _rows(n, f, seed=n * 7919 + f)
    _assert_matches_oracle(a, native.pair_sums(a))


@pytest.mark.parametrize("f", [1, 17, 7000])
def test_the_portable_path_equals_float64_numpy_too(portable, f):
    a = _rows(23, f, seed=f)
    _assert_matches_oracle(a, native.pair_sums(a))


def test_tiles_and_threads_change_nothing(compiled, monkeypatch):
    """Many small tiles (a ragged last one) and the pairs dealt over threads give the same sums:
    each pair's tiles are added in the same order whichever thread holds it."""
    a = _rows(30, 1000, seed=3)
    one = native.pair_sums(a, threads=1)
    np.testing.assert_array_equal(native.pair_sums(a, threads=3)[0], one[0])
    np.testing.assert_array_equal(native.pair_sums(a, threads=3)[1], one[1])
    monkeypatch.setattr(native, "_TILE_BYTES", 30 * 4 * 100)  # tiles of 96 columns
    _assert_matches_oracle(a, native.pair_sums(a, threads=2))


def test_each_sum_alone(compiled):
    a = _rows(5, 33, seed=1)
    js, l1 = native.pair_sums(a)
    only_js, none = native.pair_sums(a, l1=False)
    assert none is None
    np.testing.assert_array_equal(only_js, js)
    none, only_l1 = native.pair_sums(a, js=False)
    assert none is None
    np.testing.assert_array_equal(only_l1, l1)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    f=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    peak=st.floats(0.0, 60.0),
)
def test_pair_sums_property(n, f, seed, peak):
    if not HAS_CC:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, f)) * peak
    e = np.exp(z - z.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    got = native.pair_sums(a)
    assert got is not None
    _assert_matches_oracle(a, got)


@pytest.mark.parametrize("kernel", ["compiled", "off"])
def test_pair_sums_refuses_what_it_cannot_read(kernel, monkeypatch):
    """Inputs are checked before anything else, with or without a compiled library."""
    if kernel == "off":
        monkeypatch.setattr(native, "_state", {"lib": None, "status": "turned off"})
    with pytest.raises(ValueError, match="float32"):
        native.pair_sums(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="float32"):
        native.pair_sums(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="contiguous float32"):
        native.softmax_entropy_rows(np.zeros((3, 4)), np.zeros((3, 3), np.float32))


def test_a_pair_kernel_that_disagrees_with_numpy_is_not_used(monkeypatch):
    if not HAS_CC:
        pytest.skip("no C compiler on this machine")
    wrong = native._SOURCE.replace(
        "if (want_l1) l1[at + u] += (double)psum(st[u]);",
        "if (want_l1) l1[at + u] += 1.0001 * (double)psum(st[u]);",
    )
    assert wrong != native._SOURCE
    monkeypatch.setattr(native, "_SOURCE", wrong)
    lib, status = native._build()
    assert lib is None
    assert status.startswith("the compiled kernels disagreed with numpy (pair l1, 1 columns")


def _comparisons(ds, **kw):
    return ac.head_comparisons(ds, ["js", "tv"], progress=False, **kw)


def _float64_oracle(ds):
    """js and tv of float64 rows: the numpy code with no float32 rounding."""
    return _comparisons(ds.assign(log_attn=ds.log_attn.astype(np.float64)))


def test_head_comparisons_run_the_kernel_and_agree_with_numpy(compiled, monkeypatch):
    """head_comparisons' js and tv: the kernel (backend="auto") and numpy (backend="numpy")
    agree to float32 rounding, and the kernel is at least as close to float64 as numpy is."""
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=4, length=40, seed=5)
    calls = []
    real = native.pair_sums
    monkeypatch.setattr(
        native, "pair_sums", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    )
    kernel = _comparisons(ds)
    # per sample: the kept and dropped views' cells, then the sink view's two-part rows
    assert len(calls) == 2 * 3 and all(shape[0] == 8 for shape in calls)
    numpy_route = _comparisons(ds, backend="numpy")
    assert len(calls) == 6  # backend="numpy" keeps to numpy
    exact = _float64_oracle(ds)
    for m in ("js", "tv"):
        k, n, e = kernel[m].values, numpy_route[m].values, exact[m].values
        np.testing.assert_allclose(k, n, rtol=1e-4, atol=2e-6)
        assert np.abs(k - e).max() <= np.abs(n - e).max() + 1e-9
    xr_equal = kernel.drop_vars(["js", "tv"]).equals(numpy_route.drop_vars(["js", "tv"]))
    assert xr_equal


def test_head_comparisons_without_the_kernel(monkeypatch):
    """ATTNCODA_NATIVE=0: nothing is compiled, pair_sums says so, and head comparisons run
    numpy with the same results as backend="numpy"."""
    monkeypatch.setenv("ATTNCODA_NATIVE", "0")
    monkeypatch.setattr(native, "_state", {})
    assert native.status() == "turned off (ATTNCODA_NATIVE=0)"
    assert native.pair_sums(np.ones((2, 2), np.float32)) is None
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=3, length=12, seed=2)
    assert _comparisons(ds).equals(_comparisons(ds, backend="numpy"))


def test_float64_rows_keep_to_numpy(compiled, monkeypatch):
    calls = []
    monkeypatch.setattr(native, "pair_sums", lambda *a, **k: calls.append(1))
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=3, length=12, seed=2)
    got = _comparisons(ds.assign(log_attn=ds.log_attn.astype(np.float64)))
    assert calls == []
    assert got.js.notnull().all()
