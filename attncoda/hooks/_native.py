"""attncoda's own compiled kernel for the summaries' one pass: softmax and entropy in one sweep.

The one pass (:func:`attncoda.hooks._capture._one_pass_summaries`) reduces each block of a
layer's logits to the content softmax ``p`` (for ``p @ v``), the content maximum ``m``, ``1 / Z``
and ``sum p (l - m)``. In torch that takes six passes over the block (its maximum, the shift,
the softmax, the maximum of ``p``, the product ``p (l - m)`` and its sum), each a trip through
memory at long contexts; PyTorch's CPU kernels give no fused attention that returns these. This
module compiles, once per process, a small C kernel that does it per row while the row is in
the core's cache: the maximum, then ``e = exp(l - m)`` written in place with ``Z = sum e`` and
``sum e (l - m)`` accumulated beside it, then ``p = e / Z``.

Compilation needs a C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the ``PATH``) and
takes about a quarter of a second. It happens in a private temporary folder that is removed at
once (the loaded library stays mapped), so nothing is cached on disk and no file attncoda did
not just write is ever loaded. The compiled kernel is checked against torch on a test block
before it is used. Without a compiler, when compilation or that check fails, or with
``ATTNCODA_NATIVE=0`` in the environment, the one pass runs its torch ops instead (same
results to fp32 rounding, slower); :func:`native_status` says which and why.

``exp`` is computed by the kernel itself (Cephes' ``expf``: range reduction to ``|r| <= ln 2 /
2``, a degree-7 polynomial, about 1 ulp), in GCC/Clang vector extensions so that it vectorises
on any x86-64 or ARM CPU without ``-ffast-math`` (which would let the compiler reorder every
sum and, linked into a program, flush denormals to zero); glibc's vector ``expf`` falls to a
scalar path for every lane group holding an argument below about -87, which the hidden keys'
logits always are. Terms with ``l - m < -64`` are 0 (``e^-64 = 1.6e-28``: no fp32 sum of terms
``<= 1`` can hold them).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

#: set to ``0`` to keep the one pass on torch's ops (no compilation), ``1`` or unset to use the
#: kernel; any other value keeps it off and :func:`native_status` names the value
NATIVE_ENV = "ATTNCODA_NATIVE"

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
#define W 8

/* exp(d) for d <= 0 as Cephes' expf: d = k ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial
   for e^r, times 2^k; 0 below -64 */
static inline vf vexp(vf d) {
    vi small = d < -64.f;
    vf x = (vf)(((vi)d & ~small) | ((vi)((vf){0} - 64.f) & small));
    vf t = x * 1.44269504088896341f + 0.5f;
    vi k = __builtin_convertvector(t, vi);
    vf kf = __builtin_convertvector(k, vf);
    k += (vi)(kf > t); /* conversion truncates toward 0: this makes it floor */
    kf = __builtin_convertvector(k, vf);
    vf r = x - kf * 0.693359375f;
    r = r + kf * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vf e = p * (vf)((k + 127) << 23);
    return (vf)((vi)e & ~small);
}

/* each of `rows` rows of n logits (contiguous) becomes its softmax p = exp(l - m) / Z; out
   gets m, 1 / Z and sum p (l - m) of row r at r, rows + r and 2 rows + r */
void softmax_entropy_rows(float *restrict x, int64_t rows, int64_t n, float *restrict out,
                          int64_t out_rows) {
    for (int64_t r = 0; r < rows; r++) {
        float *restrict l = x + r * n;
        float m = l[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < n; j++) m = l[j] > m ? l[j] : m;
        vf z = {0}, s = {0};
        int64_t j = 0;
        for (; j + W <= n; j += W) {
            vf v;
            memcpy(&v, l + j, sizeof v);
            vf d = v - m;
            vf e = vexp(d);
            memcpy(l + j, &e, sizeof e);
            z += e;
            s += e * d;
        }
        if (j < n) { /* the last few keys: the lanes past the row add 0 */
            vf v = {0};
            memcpy(&v, l + j, (size_t)(n - j) * sizeof(float));
            vf d = v - m;
            const vi lane = {0, 1, 2, 3, 4, 5, 6, 7};
            vf e = (vf)((vi)vexp(d) & (lane < (int32_t)(n - j)));
            memcpy(l + j, &e, (size_t)(n - j) * sizeof(float));
            z += e;
            s += e * d;
        }
        float zs = 0.f, ss = 0.f;
        for (int i = 0; i < W; i++) {
            zs += z[i];
            ss += s[i];
        }
        float inv = 1.f / zs;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) l[i] *= inv;
        out[r] = m;
        out[out_rows + r] = inv;
        out[2 * out_rows + r] = ss * inv;
    }
}
"""

_FLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-std=gnu11", "-w")
_NATIVE_ARCH = "-march=native"

_lock = threading.Lock()
_state: dict[str, object] = {}
_pool: tuple[ThreadPoolExecutor, int] | None = None  # the pool and its number of threads


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing pool) inherits the pool but not
    its threads, and maybe a lock some other thread held: both start afresh there (the loaded
    kernel is mapped memory and stays usable)."""
    global _lock, _pool
    _lock = threading.Lock()
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# rows a thread takes at least: below it the pool's hand-off costs more than it saves
_ROWS_PER_THREAD = 16
_CELLS_PER_THREAD = 1 << 16


def native_status() -> str:
    """Whether the summaries' one pass runs attncoda's compiled kernel, and if not, why.

    The kernel is compiled on first use, once per process (about a quarter of a second, in a
    temporary folder removed at once). Without it the one pass runs torch's ops instead:
    the same summaries and outputs to fp32 rounding, 1-26% slower per layer in
    ``bench_capture`` (most at long contexts).

    Returns
    -------
    str
        ``"compiled"``, or the reason it is not used: ``"turned off (ATTNCODA_NATIVE=0)"``,
        ``"ATTNCODA_NATIVE='...' is neither 0 nor 1; ..."``,
        ``"no C compiler (set CC, or install gcc or clang)"``, ``"compiling failed (...)"``,
        ``"loading the compiled kernel failed (...)"`` or ``"the compiled kernel disagreed
        with torch (...)"`` (checked on a test block before any use).

    See Also
    --------
    capture : the summaries' one pass is where the kernel runs.

    Examples
    --------
    >>> from attncoda.hooks import native_status
    >>> native_status()  # doctest: +SKIP
    'compiled'
    """
    _kernel()
    return str(_state.get("status", "not tried"))


def softmax_entropy_rows() -> Callable[[torch.Tensor, torch.Tensor], None] | None:
    """The compiled kernel as ``kernel(logits, stats)``, or ``None`` where it is not available.

    ``logits``: a contiguous float32 CPU tensor whose last axis holds each row's logits (at
    least one key; finite, hidden keys at a large negative value such as -1e37); it is
    overwritten with the rows' softmax. ``stats``: a contiguous float32 ``(3, rows)`` tensor that
    receives each row's maximum ``m``, ``1 / Z`` and ``sum p (l - m)``. Rows are split over
    ``torch.get_num_threads()`` threads when the block is large enough to pay for it.
    """
    fn = _kernel()
    if fn is None:
        return None

    def run(logits: torch.Tensor, stats: torch.Tensor) -> None:
        n = int(logits.shape[-1])
        rows = logits.numel() // max(n, 1)
        if not (
            logits.dtype == torch.float32
            and stats.dtype == torch.float32
            and logits.is_contiguous()
            and stats.is_contiguous()
            and logits.device.type == "cpu"
            and stats.shape == (3, rows)
            and n >= 1
        ):
            raise ValueError(
                "softmax_entropy_rows takes contiguous float32 CPU logits (rows, n >= 1) and "
                f"stats (3, rows); got {tuple(logits.shape)} {logits.dtype} and "
                f"{tuple(stats.shape)} {stats.dtype}"
            )
        x, out = logits.data_ptr(), stats.data_ptr()
        threads = min(
            torch.get_num_threads(),
            rows // _ROWS_PER_THREAD,
            rows * n // _CELLS_PER_THREAD,
        )
        if threads <= 1:
            fn(x, rows, n, out, rows)
            return
        step = -(-rows // threads)
        parts = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
        pool = _thread_pool(len(parts))
        # ctypes releases the GIL for the call: the parts run at once
        list(pool.map(lambda p: fn(x + 4 * p[0] * n, p[1] - p[0], n, out + 4 * p[0], rows), parts))

    return run


def _thread_pool(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[1] < workers:
            if _pool is not None:
                _pool[0].shutdown(wait=False)
            _pool = (ThreadPoolExecutor(workers, thread_name_prefix="attncoda-native"), workers)
        return _pool[0]


def _kernel() -> Callable[..., None] | None:
    with _lock:
        if "status" not in _state:
            fn, status = _build()
            _state["fn"], _state["status"] = fn, status
        return _state["fn"]  # type: ignore[return-value]


def _build() -> tuple[Callable[..., None] | None, str]:
    switch = os.environ.get(NATIVE_ENV, "").strip()
    if switch == "0":
        return None, f"turned off ({NATIVE_ENV}=0)"
    if switch not in ("", "1"):
        return (
            None,
            f"{NATIVE_ENV}={switch!r} is neither 0 nor 1; set one of them (kept off until then)",
        )
    cc = os.environ.get("CC", "").strip() or next(
        (c for c in ("cc", "gcc", "clang") if shutil.which(c)), ""
    )
    if not cc or not shutil.which(cc.split()[0]):
        return None, "no C compiler (set CC, or install gcc or clang)"
    with tempfile.TemporaryDirectory(prefix="attncoda-native-") as tmp:
        src, lib_path = Path(tmp) / "rows.c", Path(tmp) / "rows.so"
        src.write_text(_SOURCE, encoding="utf-8")
        error = ""
        for arch in ((_NATIVE_ARCH,), ()):  # some compilers (Apple's clang on arm64) refuse it
            cmd = [*cc.split(), *_FLAGS, *arch, "-o", str(lib_path), str(src)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                return None, f"compiling failed ({type(err).__name__}: {err})"
            if done.returncode == 0:
                break
            error = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        else:
            return None, f"compiling failed ({error})"
        try:
            lib = ctypes.CDLL(str(lib_path))
        except OSError as err:
            return None, f"loading the compiled kernel failed ({err})"
    fn = lib.softmax_entropy_rows
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    problem = _check(fn)
    if problem:
        return None, f"the compiled kernel disagreed with torch ({problem})"
    return fn, "compiled"


def _check(fn: Callable[..., None]) -> str | None:
    """Run the kernel on a test block (ragged row lengths, hidden keys, a row of hidden keys
    only, logits in the thousands) and compare with torch's float64 result."""
    gen = torch.Generator().manual_seed(0)
    problems = []
    for n in (1, 7, 8, 37, 300):
        logits = torch.randn(6, n, generator=gen, dtype=torch.float64) * 4
        logits[1] *= 500  # Qwen2.5's first layers: logits in the thousands
        logits[2, : n // 2] = -1e37  # hidden keys
        logits[3] = -1e37  # a row that sees nothing: uniform, as torch's softmax
        x = logits.float().contiguous()
        logits = x.double()  # the same inputs on both sides
        stats = torch.empty(3, 6)
        fn(x.data_ptr(), 6, n, stats.data_ptr(), 6)
        m = logits.amax(-1, keepdim=True)
        p = torch.softmax(logits - m, -1)
        a = (p * (logits - m)).sum(-1)  # hidden keys: 0 times a finite number
        want = (m[:, 0], p.amax(-1), a)
        if not torch.allclose(x.double(), p, rtol=1e-5, atol=1e-7):
            problems.append(f"softmax, {n} keys")
        for name, got, ref in zip(("max", "1/Z", "sum p(l-m)"), stats.double(), want, strict=True):
            if not torch.allclose(got, ref, rtol=1e-5, atol=1e-6):
                problems.append(f"{name}, {n} keys")
    return "; ".join(problems) or None
