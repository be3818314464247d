"""What keeps ``capture(what="rows")`` lean: one write of every row into the buffer the dataset
holds, no float64 anywhere, ``dtype=`` for stored rows, and ``stream_to=`` in bounded memory.

Memory is measured with tracemalloc, which sees numpy's allocations (where kept rows live) and
not torch's (the chunk-sized temporaries); never with timings.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attncoda as ac
from attncoda.hooks import CaptureError, capture, zoo
from conftest import signals_as_in_a_terminal

# numpy bytes a capture may hold beside the rows it keeps: the summaries, token ids and
# coordinates of a small twin, and xarray's bookkeeping
SMALL = 2 << 20


@pytest.fixture(scope="module")
def llama():
    return zoo.tiny_twin("llama")


def _batch(model, length, batch=2):
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _kept(model, batch, length, itemsize=4):
    c = model.config
    return batch * c.num_hidden_layers * c.num_attention_heads * length * length * itemsize


def _peak(fn):
    """``(result, peak traced bytes above the start)`` of ``fn()``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak - start


def _rows(model, batch, **kwargs):
    with torch.no_grad(), capture(model, what="rows", **kwargs) as cap:
        model(**batch)
    return cap.dataset


@pytest.mark.parametrize("what", ["rows", "both"])
def test_rows_allocate_at_most_the_kept_bytes_plus_a_small_working_set(llama, what):
    batch = _batch(llama, 384)
    run = (lambda: _rows(llama, batch)) if what == "rows" else (lambda: _both(llama, batch))
    run()  # imports and one-time caches are not the path's
    kept = _kept(llama, 2, 384)
    ds, peak = _peak(run)
    assert ds.log_attn.nbytes == kept
    assert peak >= kept  # the buffer itself is seen (a mapping of its own, traced as numpy's)
    # one layer's rows as float64 would be kept / 2 more: a float64 intermediate of that size,
    # a concatenation or a copy of the buffer all fail this
    assert peak <= 1.2 * kept + SMALL, f"{peak / kept:.2f}x the kept bytes"


def _both(model, batch):
    with torch.no_grad(), capture(model, what="both") as cap:
        model(**batch)
    return cap.dataset


def _vm_flags(address: int) -> set[str]:
    """The kernel's flags of the mapping holding ``address`` (``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_NOHUGEPAGE is Linux's")
def test_the_rows_buffer_is_kept_out_of_huge_pages(llama):
    # numpy advises huge pages for large arrays; their first write is what made a fresh
    # process's T=1024 capture 1.5x slower on a VM (attncoda.hooks._rows._buffer)
    ds = _rows(llama, _batch(llama, 384))
    rows = ds.log_attn.values
    assert rows.nbytes > 4 << 20
    flags = _vm_flags(rows.ctypes.data + rows.nbytes // 2)
    assert "nh" in flags and "hg" not in flags, flags


@pytest.fixture
def one_spare():
    """No kept buffer to start with, and none arriving from elsewhere: garbage of other tests
    (a traceback holding a capture's frame, say) is collected first, and the cyclic collector
    waits until the test ends (the captures here are freed by their reference counts)."""
    from attncoda.hooks import empty_cache

    gc.collect()
    empty_cache()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _spoiled_spare():
    """Fill the kept buffer with NaN: a capture that reuses it must write over every value."""
    from attncoda.hooks import _rows as rows_module

    (mm,) = rows_module._spare
    view = memoryview(mm)
    np.frombuffer(view, np.uint8)[:] = 0xFF  # NaN in any float dtype
    view.release()
    return mm


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapped buffer is Linux's")
def test_a_freed_rows_buffer_is_kept_for_the_next_capture_and_written_over_in_full(
    llama, one_spare
):
    from attncoda.hooks import empty_cache

    batch = _batch(llama, 384)
    want = _rows(llama, batch).log_attn.values.copy()  # its buffer is freed with the dataset
    spare = _spoiled_spare()
    ds = _rows(llama, batch)
    got = ds.log_attn.values
    assert got.ctypes.data == ctypes.addressof(ctypes.c_char.from_buffer(spare))
    np.testing.assert_array_equal(got, want)  # no NaN of the old contents is left
    other = _rows(llama, batch)  # the first is alive: a mapping of its own
    assert other.log_attn.values.ctypes.data != got.ctypes.data
    np.testing.assert_array_equal(other.log_attn.values, want)
    del ds, got, other
    assert empty_cache() == want.nbytes  # one kept (the newest), given back on request
    assert empty_cache() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapped buffer is Linux's")
def test_the_kept_buffer_is_shrunk_for_a_smaller_capture_and_never_kept_above_its_limit(
    llama, monkeypatch, one_spare
):
    from attncoda.hooks import _rows as rows_module
    from attncoda.hooks import empty_cache

    long, short = _batch(llama, 384), _batch(llama, 320)
    want = _rows(llama, short).log_attn.values.copy()
    _rows(llama, long)
    spare = _spoiled_spare()
    got = _rows(llama, short).log_attn.values
    np.testing.assert_array_equal(got, want)
    assert got.ctypes.data == ctypes.addressof(ctypes.c_char.from_buffer(spare))
    assert len(spare) == want.nbytes  # the tail went back when it was shrunk
    del got
    assert empty_cache() == want.nbytes
    monkeypatch.setattr(rows_module, "spare_max_bytes", lambda: want.nbytes - 1)
    _rows(llama, short)
    assert rows_module._spare == []  # over the limit: unmapped when freed


class _Unshrinkable:
    """A kept buffer on a system without ``mremap``: its ``resize`` fails."""

    def __init__(self, nbytes):
        self.nbytes, self.closed = nbytes, False

    def __len__(self):
        return self.nbytes

    def resize(self, nbytes):
        raise OSError("mremap is not available")

    def close(self):
        self.closed = True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapped buffer is Linux's")
def test_a_kept_buffer_that_cannot_shrink_is_given_back_and_a_fresh_one_mapped(llama, one_spare):
    from attncoda.hooks import _rows as rows_module
    from attncoda.hooks import empty_cache

    batch = _batch(llama, 320)
    want = _rows(llama, batch).log_attn.values.copy()
    empty_cache()
    spare = _Unshrinkable(want.nbytes * 2)
    rows_module._spare.append(spare)
    np.testing.assert_array_equal(_rows(llama, batch).log_attn.values, want)
    assert spare.closed
    assert empty_cache() == want.nbytes  # the fresh one, kept when its dataset went


def test_a_pass_releases_the_free_heap_once_when_its_last_layer_is_written(llama, monkeypatch):
    """glibc keeps the layers' freed temporaries resident, under the logits that come after
    them: a pass whose rows buffer is large trims the heap once, after its last layer;
    ``generate()``'s cached steps (a few queries each, arrays of their own) and small
    buffers do not."""
    from attncoda.hooks import _rows as rows_module

    calls = []
    monkeypatch.setattr(rows_module, "release_free_heap", lambda: calls.append(len(calls)))
    batch = _batch(llama, 24)
    monkeypatch.setattr(rows_module, "TRIM_MIN_BYTES", _kept(llama, 2, 24) + 1)
    _rows(llama, batch)
    assert calls == []  # one byte below the size
    monkeypatch.setattr(rows_module, "TRIM_MIN_BYTES", _kept(llama, 2, 24))
    _rows(llama, batch)
    assert calls == [0]
    with torch.no_grad(), capture(llama, what="rows"):
        llama.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert calls == [0, 1]  # the prompt's pass; the cached steps none


@pytest.mark.parametrize("head", [True, False], ids=["causal LM", "base model"])
def test_the_free_heap_is_released_after_the_last_layer_and_before_the_output_head(
    llama, monkeypatch, head
):
    """The last layer's MLP still frees temporaries after its attention has written the rows:
    a model with an output head releases the heap right before the head allocates the logits
    (after every layer has run); a model without one, when its last layer's rows are written.
    Whatever the capture hooked on the head is gone after the block."""
    from attncoda.hooks import _rows as rows_module

    model = llama if head else llama.model
    events: list[str] = []
    monkeypatch.setattr(rows_module, "release_free_heap", lambda: events.append("release"))
    monkeypatch.setattr(rows_module, "TRIM_MIN_BYTES", 1)
    handles = [  # the head runs only when the causal LM is called
        llama.model.layers[-1].register_forward_hook(lambda *a: events.append("last layer done")),
        llama.lm_head.register_forward_hook(lambda *a: events.append("head done")),
    ]
    try:
        hooks_before = dict(llama.lm_head._forward_pre_hooks)
        _rows(model, _batch(llama, 24))
        assert dict(llama.lm_head._forward_pre_hooks) == hooks_before
    finally:
        for h in handles:
            h.remove()
    if head:
        assert events == ["last layer done", "release", "head done"]
    else:
        assert events == ["release", "last layer done"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc is Linux's")
def test_the_free_heap_is_released_through_glibc_where_it_is_there():
    import ctypes.util

    from attncoda.hooks import _rows as rows_module

    if "musl" in (ctypes.util.find_library("c") or ""):
        pytest.skip("musl has no malloc_trim")
    assert rows_module._malloc_trim() is not None
    rows_module.release_free_heap()  # gives back what it can: nothing to check but that it runs


class _Dtypes(TorchDispatchMode):
    """Records the dtype of every tensor any torch op returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.seen.add((t.dtype, str(func)))
        return out


@pytest.mark.parametrize("what", ["rows", "both"])
def test_no_float64_on_the_float32_rows_path(llama, what):
    batch = _batch(llama, 64)
    with _Dtypes() as rec, torch.no_grad(), capture(llama, what=what) as cap:
        llama(**batch)
    ds = cap.dataset
    f64 = sorted(op for dtype, op in rec.seen if dtype == torch.float64)
    assert not f64, f"float64 tensors from {f64}"
    assert {d for d, _ in rec.seen} >= {torch.float32}
    assert all(ds[v].dtype == np.float32 for v in ds.data_vars)


def _count_kernel_calls(monkeypatch):
    """How often the model's own attention implementation (the delegate) runs."""
    from attncoda.hooks import _registry

    calls = []
    original = _registry.delegate_for

    def counted(module, name, kwargs):
        fn = original(module, name, kwargs)

        def call(*args, **kw):
            calls.append(1)
            return fn(*args, **kw)

        call.__name__ = fn.__name__  # the eager mask rule reads the function's name
        return call

    monkeypatch.setattr(_registry, "delegate_for", counted)
    return calls


# the encoder-decoder twin (whisper) reads audio: tests/test_capture_stacks.py covers it
@pytest.mark.parametrize("family", [f for f in zoo.FAMILIES if f != "whisper"])
@pytest.mark.parametrize("left_padding", [False, True])
def test_rows_of_every_head_and_query_give_the_layer_output_without_the_models_kernel(
    family, left_padding, monkeypatch
):
    """All rows of a layer: its output is ``exp(rows) @ v``, the model's kernel does not run as
    well, and the outputs equal the plain model's to fp32 rounding. Rows of some heads or some
    queries, a learned sink (GPT-OSS) or queries that see no key keep the model's kernel."""
    model = zoo.tiny_twin(family)
    batch = zoo.tiny_batch(model, length=10, left_padding=left_padding)
    with torch.no_grad():
        out = model(**batch)
    plain = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
    calls = _count_kernel_calls(monkeypatch)
    sink = "learned" if family == "gpt_oss" else "first"
    with torch.no_grad(), capture(model, what="rows", sink=sink) as cap:
        out = model(**batch)
    during = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
    np.testing.assert_allclose(during, plain, atol=2e-6, rtol=1e-6)
    if cap.fallback:
        return  # eager attention with hooks: the model computes its output itself
    n_layers = cap.dataset.sizes["layer"]
    if family == "gpt_oss":
        assert len(calls) == n_layers
    elif not left_padding:
        assert calls == [], f"{family}: the model's kernel ran {len(calls)} times"
    calls.clear()
    with torch.no_grad(), capture(model, what="rows", sink=sink, exact_outputs=True) as exact:
        out = model(**batch)
    assert len(calls) == n_layers  # the model's own kernel for every layer: its outputs
    exact_out = out.logits if hasattr(out, "logits") else out.last_hidden_state
    np.testing.assert_array_equal(exact_out.numpy(), plain)
    np.testing.assert_array_equal(exact.dataset.log_attn.values[:, 0], cap.dataset.log_attn[:, 0])
    calls.clear()
    with torch.no_grad(), capture(model, what="rows", heads=[0], sink=sink):
        model(**batch)
    assert len(calls) == n_layers
    calls.clear()
    with torch.no_grad(), capture(model, what="rows", queries=[-1], sink=sink):
        model(**batch)
    assert len(calls) == n_layers


@pytest.mark.parametrize("value", ["yes", 1, None, np.array([True])])
def test_exact_outputs_is_a_bool(llama, value):
    with pytest.raises(CaptureError, match=r"^exact_outputs=.* is not a bool; pass True"):
        with capture(llama, what="rows", exact_outputs=value):
            pytest.fail("the block ran")


def test_rows_equal_a_reference_log_softmax(llama):
    """The buffer written chunk by chunk holds the log-softmax of the eager weights."""
    batch = _batch(llama, 40)
    ds = _rows(llama, batch, chunk_size=16)
    llama.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            weights = llama(**batch, output_attentions=True).attentions
    finally:
        llama.set_attn_implementation("sdpa")
    ref = torch.stack(weights, dim=1).log().numpy()  # (sample, layer, head, query, key)
    np.testing.assert_allclose(ds.log_attn.values, ref, atol=2e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# dtype=


@pytest.mark.parametrize(
    ("dtype", "what", "match"),
    [
        ("bfloat16", "rows", r"^dtype='bfloat16' cannot be stored: numpy, netCDF and zarr"),
        (torch.bfloat16, "rows", r"^dtype=torch.bfloat16 cannot be stored"),
        ("float64", "rows", r"^dtype='float64' is not a dtype rows can be stored in"),
        (np.int8, "rows", r"is not a dtype rows can be stored in; pass 'float32'"),
        (3, "rows", r"^dtype=3 is not a dtype"),
        (None, "rows", r"^dtype=None is not a dtype"),
        ("float16", "summaries", r"what='summaries' stores none"),
    ],
)
def test_dtype_is_refused_in_one_line_before_any_work(llama, dtype, what, match):
    before = llama.config._attn_implementation
    with pytest.raises(CaptureError, match=match) as err:
        with capture(llama, what=what, dtype=dtype):
            pytest.fail("the block ran")
    assert "\n" not in str(err.value)
    assert llama.config._attn_implementation == before


@pytest.mark.parametrize("dtype", ["float16", np.float16, torch.float16, "float32", np.float32])
def test_dtype_spellings(llama, dtype):
    ds = _rows(llama, _batch(llama, 8), layers=[0], dtype=dtype)
    name = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype
    assert ds.log_attn.dtype == np.dtype(name)
    assert '"dtype": "float' in ds.attrs["capture_spec"]


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_float16_rows_round_trip(llama, tmp_path, suffix):
    batch = _batch(llama, 48)
    ds32 = _rows(llama, batch)
    ds16 = _rows(llama, batch, dtype="float16")
    assert ds16.log_attn.dtype == np.float16
    assert ds16.log_attn.nbytes == ds32.log_attn.nbytes // 2
    # rounded once from the same fp32 rows; -inf (invisible keys) exactly where it was
    np.testing.assert_array_equal(ds16.log_attn.values, ds32.log_attn.values.astype(np.float16))
    back = ac.load(ac.save(ds16, tmp_path / f"rows{suffix}"))
    assert back.log_attn.dtype == np.float16
    np.testing.assert_array_equal(back.log_attn.values, ds16.log_attn.values)
    # the lossy storage shows in the variable's description
    assert "float16" in back.log_attn.attrs["long_name"]


def test_float16_keeps_visible_keys_finite():
    """A visible key below float16's range is kept at its minimum, not turned into -inf."""
    from attncoda.hooks._capture import _log_softmax_into

    logits = torch.tensor([[[[0.0, -1e5, -math_inf(), 1.0]]]])
    dest = torch.empty(1, 1, 1, 4, dtype=torch.float16)
    _log_softmax_into(logits, dest, offset=0)
    got = dest.float().numpy().ravel()
    assert np.isfinite(got[[0, 1, 3]]).all() and got[1] == np.finfo(np.float16).min
    assert got[2] == -np.inf


def math_inf():
    return float("inf")


def test_nan_logits_are_refused_per_row(llama):
    from attncoda.hooks._capture import _log_softmax_into

    logits = torch.tensor([[[[0.0, float("nan")], [0.0, 1.0]]]])
    with pytest.raises(CaptureError, match="NaN or infinite attention logits"):
        _log_softmax_into(logits, torch.empty(1, 1, 2, 2), offset=0)
    # a padding query (no visible key) is not a fault: its row stays -inf
    dest = torch.empty(1, 1, 1, 2)
    _log_softmax_into(torch.full((1, 1, 1, 2), -float("inf")), dest, offset=0)
    assert torch.isneginf(dest).all()


# ---------------------------------------------------------------------------------------------
# stream_to=


def test_stream_to_with_rows_needs_dask(llama, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "dask" else real(name, *a)
    )
    with pytest.raises(CaptureError, match=r"^stream_to= with rows needs dask"):
        with capture(llama, what="rows", stream_to=tmp_path / "s.zarr"):
            pytest.fail("the block ran")
    assert not (tmp_path / "s.zarr").exists()
    with capture(llama, what="summaries", stream_to=tmp_path / "t.zarr"):  # no rows: no dask
        pass


@pytest.mark.slow
def test_stream_to_holds_rows_larger_than_the_budget_in_bounded_memory(
    llama, tmp_path, monkeypatch
):
    """Rows of 2 x 2 layers x 4 heads x 1024^2 (67 MB) through a budget of 16 MB."""
    monkeypatch.setattr("attncoda._data._BLOCK_BYTES", 1 << 20)  # the value check's blocks
    length, budget = 1024, 16 << 20
    batch = _batch(llama, length)
    kept = _kept(llama, 2, length)
    assert kept >= 4 * budget
    store = tmp_path / "rows.zarr"
    # imports (dask, zarr's codecs) are not the path's: one small streamed capture first
    with torch.no_grad(), capture(llama, what="rows", stream_to=tmp_path / "warm" / "w.zarr"):
        llama(**_batch(llama, 16))

    def run():
        with torch.no_grad(), capture(llama, what="rows", stream_to=store, chunk_size=64):
            llama(**batch)

    _, peak = _peak(run)
    assert peak < budget, f"{peak / 2**20:.1f} MB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.zarr", "warm"], "staging left"
    streamed = ac.load(store)
    # the same rows as an in-memory capture, spot-checked on the last queries of each layer:
    # exactly in the first layer; later layers' inputs differ by fp32 rounding, since a capture
    # of every query computes each layer's output from its rows, one of 4 queries by SDPA
    small = _rows(llama, batch, queries=slice(-4, None))
    got = streamed.log_attn.isel(query=slice(-4, None)).values
    np.testing.assert_array_equal(got[:, 0], small.log_attn.values[:, 0])
    np.testing.assert_allclose(got, small.log_attn.values, rtol=1e-5, atol=1e-5)


def test_stream_to_staging_is_removed_after_an_exception(llama, tmp_path):
    store = tmp_path / "s.zarr"
    with pytest.raises(RuntimeError, match="boom"):
        with torch.no_grad(), capture(llama, what="rows", stream_to=store) as cap:
            llama(**_batch(llama, 32))
            raise RuntimeError("boom")
    ds = cap.dataset  # the finished pass is still appended when read
    assert ds.sizes["sample"] == 2
    del cap, ds
    import gc

    gc.collect()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


# ---------------------------------------------------------------------------------------------
# stream_to= in a process that is killed mid-pass: real processes, real signals

_MID_PASS = """
import sys, time, torch
from attncoda.hooks import capture, zoo
model = zoo.tiny_twin("llama")
def pause(module, args, out):  # layers 0 and 1 have written their rows to the staging array
    print("mid-pass", flush=True)
    time.sleep(300)
model.model.layers[1].register_forward_hook(pause)
torch.manual_seed(0)
ids = torch.randint(3, model.config.vocab_size, (1, 96))
with torch.no_grad(), capture(model, what="rows", stream_to=sys.argv[1]):
    model(input_ids=ids)
"""


def _killed_mid_pass(store, signum):
    """Run a streamed capture in a fresh interpreter, send ``signum`` mid-pass; its exit code."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", _MID_PASS, str(store)],
        preexec_fn=signals_as_in_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "mid-pass", proc.stderr.read()
        staged = [p for p in store.parent.iterdir() if p.name.startswith(".s.zarr.attncoda-rows-")]
        assert len(staged) == 1 and (staged[0] / "STAGING").is_file()  # mid-pass for real
        proc.send_signal(signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, staged[0]


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_process_ended_mid_pass_leaves_no_staging_folder(tmp_path, name):
    import signal

    signum = getattr(signal, name)
    code, staged = _killed_mid_pass(tmp_path / "s.zarr", signum)
    # SIGTERM/SIGHUP still end the process by that signal; SIGINT unwinds (KeyboardInterrupt)
    assert code == -signum if name != "SIGINT" else code != 0
    assert not staged.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_a_killed_writers_staging_is_removed_by_the_next_capture_and_nothing_else(llama, tmp_path):
    import signal

    store = tmp_path / "s.zarr"
    code, staged = _killed_mid_pass(store, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert staged.is_dir()  # SIGKILL cannot be handled: the folder is left, marked
    # folders that look alike but are not attncoda's (no marker), and a user's own folder
    lookalike = tmp_path / ".s.zarr.attncoda-rows-mine"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    other = tmp_path / "other"
    other.mkdir()
    (other / "STAGING").write_text("not a staging folder")
    with torch.no_grad(), capture(llama, what="rows", stream_to=store):
        llama(**_batch(llama, 16))
    assert not staged.exists()
    assert (lookalike / "notes.txt").read_text() == "mine"
    assert (other / "STAGING").read_text() == "not a staging folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == [lookalike.name, "other", "s.zarr"]
    assert ac.load(store).sizes["sample"] == 2


def test_a_live_writers_staging_is_never_removed(llama, tmp_path):
    """A staging folder whose writer is alive (its marker locked) is left to its writer."""
    live = ac.staging_folder(tmp_path / "s.zarr", "rows")
    try:
        with torch.no_grad(), capture(llama, what="rows", stream_to=tmp_path / "s.zarr"):
            llama(**_batch(llama, 16))
        assert (live.path / "STAGING").is_file()
    finally:
        live.remove()
    assert not live.path.exists()
