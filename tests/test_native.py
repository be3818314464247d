"""attncoda's compiled row kernel (attncoda.native, through attncoda.hooks._native): results,
fallbacks, no debris. The pair kernel of head comparisons: tests/test_native_pairs.py."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda import native  # noqa: E402
from attncoda.hooks import _capture, _native, capture  # noqa: E402
from conftest import assert_one_pass_runs_agree  # noqa: E402

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def forward(model, batch):
    with torch.no_grad():
        out = model(**batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _kernel():
    """The compiled kernel; where a C compiler is on the PATH it must have compiled."""
    if not HAS_CC:
        pytest.skip("no C compiler on this machine: the one pass runs its torch ops")
    assert _native.native_status() == "compiled"
    fn = _native.softmax_entropy_rows()
    assert fn is not None
    return fn


def _reference(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = logits.double()
    m = x.amax(-1, keepdim=True)
    p = torch.softmax(x - m, -1)
    return p, m[..., 0], p.amax(-1), (p * (x - m)).sum(-1)


@pytest.mark.parametrize("n", [1, 5, 8, 9, 16, 17, 64, 301, 4099])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("normalize", [True, False])
def test_kernel_equals_the_float64_softmax_and_its_entropy_terms(n, threads, normalize):
    """The rows become p (or exp(l - m) = p Z, with normalize=False: p once times 1 / Z)."""
    kernel = _kernel()
    gen = torch.Generator().manual_seed(n)
    logits = torch.randn(2, 3, 40, n, generator=gen) * 6
    logits[0, 1] *= 400  # Qwen2.5's first layers: logits in the thousands
    logits[1, 0, :, : n // 2] = _capture._HIDDEN  # keys a row cannot see
    logits[1, 2, 5] = _capture._HIDDEN  # a row that sees nothing: uniform, as torch's softmax
    p, m, p_top, a = _reference(logits)
    stats = torch.empty(3, 2 * 3 * 40)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = logits.clone()
        kernel(x, stats, normalize=normalize)
    finally:
        torch.set_num_threads(before)
    got = stats.view(3, 2, 3, 40).double()
    if not normalize:
        x = x * got[1, ..., None].float()
    np.testing.assert_allclose(x.numpy(), p.numpy(), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(got[0].numpy(), m.float().numpy())  # the maximum is exact
    np.testing.assert_allclose(got[1].numpy(), p_top.numpy(), rtol=2e-6)
    # sum p (l - m): fp32 terms of size |l - m| <= 64 where p is not negligible
    np.testing.assert_allclose(got[2].numpy(), a.numpy(), rtol=1e-5, atol=2e-6)


def _split_over_two_threads(kernel) -> bool:
    """The kernel on a block it splits over two threads, against numpy's softmax (no torch op:
    torch's OpenMP regions are not fork-safe, which is torch's matter, not the kernel's)."""
    torch.set_num_threads(2)
    values = np.random.default_rng(0).normal(size=(64, 4099)).astype(np.float32)
    shifted = np.exp(values - values.max(-1, keepdims=True))
    want = shifted / shifted.sum(-1, keepdims=True)
    x = torch.from_numpy(values.copy())
    kernel(x, torch.empty(3, 64))
    return bool(np.allclose(x.numpy(), want, rtol=2e-6, atol=1e-7))


def _in_child(queue) -> None:
    queue.put(_split_over_two_threads(_native.softmax_entropy_rows()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_splits_rows_over_threads_too():
    """The thread pool is made afresh in a forked child (a DataLoader worker): the parent's
    pool has no threads there, and a child that used it would wait for ever."""
    kernel = _kernel()
    before = torch.get_num_threads()
    try:
        assert _split_over_two_threads(kernel)  # the parent's pool exists now
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_in_child, args=(queue,))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child hung on the parent's thread pool")
        assert child.exitcode == 0
        assert queue.get(timeout=5) is True
    finally:
        torch.set_num_threads(before)


def test_kernel_refuses_what_it_cannot_read():
    kernel = _kernel()
    with pytest.raises(ValueError, match="contiguous float32"):
        kernel(torch.zeros(4, 6).t(), torch.empty(3, 6))
    with pytest.raises(ValueError, match="contiguous float32"):
        kernel(torch.zeros(4, 6, dtype=torch.float64), torch.empty(3, 4))
    with pytest.raises(ValueError, match=r"stats \(3, rows\)"):
        kernel(torch.zeros(4, 6), torch.empty(3, 5))


def test_compiling_leaves_no_files_behind(tmp_path, monkeypatch):
    if not HAS_CC:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lib, status = native._build()
    assert status == "compiled" and lib is not None
    assert list(tmp_path.iterdir()) == []  # the source and the library are gone; it stays loaded
    x, stats = torch.tensor([[0.0, 0.0]]), torch.empty(3)
    lib.softmax_entropy_rows(x.data_ptr(), 1, 2, stats.data_ptr(), 1, 1, 0, 0)
    assert x.tolist() == [[0.5, 0.5]]
    assert stats.tolist() == [0.0, 0.5, 0.0]


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"ATTNCODA_NATIVE": "0"}, "turned off (ATTNCODA_NATIVE=0)"),
        (
            {"ATTNCODA_NATIVE": "off"},
            "ATTNCODA_NATIVE='off' is neither 0 nor 1; set one of them (kept off until then)",
        ),
        ({"CC": "/nonexistent/cc"}, "no C compiler (set CC, or install gcc or clang)"),
        ({"CC": "false"}, "compiling failed (no message)"),
    ],
)
def test_without_a_kernel_the_status_says_why(env, why, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert native._build() == (None, why)


def test_a_kernel_that_disagrees_with_numpy_is_not_used(monkeypatch):
    if not HAS_CC:
        pytest.skip("no C compiler on this machine")
    wrong = native._SOURCE.replace("float inv = 1.f / zs;", "float inv = 1.001f / zs;")
    assert wrong != native._SOURCE
    monkeypatch.setattr(native, "_SOURCE", wrong)
    lib, status = native._build()
    assert lib is None
    assert status.startswith("the compiled kernels disagreed with numpy (softmax, 1 keys; 1/Z")


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("padding", [None, "right"])
@pytest.mark.parametrize("samples", [1, 2])
def test_one_pass_gives_the_same_with_the_kernel_and_with_torch_ops(
    family, padding, samples, monkeypatch
):
    """The compiled kernel and the torch ops it replaces give the same summaries and outputs
    to fp32 rounding, in blocks of 4 queries and groups of 3 + 1 heads (ragged rows and
    groups). Causal blocks without a mask (llama, no padding) leave each query's later keys to
    the kernel, unfilled. One sample: the kernel writes the statistics of a block of one head
    where they belong, not through a scratch copy."""
    _kernel()
    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=11)
    batch = {name: t[:samples] for name, t in batch.items()}
    if padding == "right":
        batch["attention_mask"][0, -3:] = 0
    n_batch, length = batch["input_ids"].shape
    monkeypatch.setattr(_capture, "_ONE_PASS_ROWS", 4)
    monkeypatch.setattr(_capture, "_ONE_PASS_BYTES", 4 * n_batch * length * 4 * 3)
    routes = []
    real = _native.softmax_entropy_rows
    got = {}
    for route in ("kernel", "torch"):
        monkeypatch.setattr(
            _native,
            "softmax_entropy_rows",
            lambda route=route: routes.append(route) or (real() if route == "kernel" else None),
        )
        with capture(model, what="summaries") as cap:
            out = forward(model, batch)
        got[route] = (out.numpy(), cap.dataset)
    assert set(routes) == {"kernel", "torch"}  # the one pass ran both ways
    assert_one_pass_runs_agree(got["kernel"], got["torch"], batch["attention_mask"].numpy() == 1)
