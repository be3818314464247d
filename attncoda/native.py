"""attncoda's own compiled kernels: two loops that numpy and torch cannot fuse.

* :func:`softmax_entropy_rows` - the summaries' one pass (:func:`attncoda.hooks.capture`): each
  row of a block of logits becomes its softmax, with its maximum, ``1 / Z`` and ``sum p (l - m)``
  accumulated in the same sweep while the row is in the core's cache (six passes in torch).
* :func:`pair_sums` - :func:`attncoda.head_comparisons`' ``js`` and ``tv``: for every pair of
  rows of a matrix, ``sum xlogx((a_i + a_j) / 2)`` and ``sum |a_i - a_j|`` in one sweep over
  tiles of columns that stay in cache (numpy takes a temporary per pair and a trip through
  memory for each of add, log, product and sum).

Both are compiled together, once per process, at first use, with the machine's C compiler (``$CC``,
else ``cc``, ``gcc`` or ``clang`` on the ``PATH``; about a quarter of a second), in a private
temporary folder that is removed at once (the loaded library stays mapped): nothing is cached on
disk and no file attncoda did not just write is ever loaded. Before any use both kernels are
checked against numpy in float64 on test inputs. Without a compiler, when compiling or that check
fails, or with ``ATTNCODA_NATIVE=0`` in the environment, callers run their numpy or torch code
instead (the same results to float32 rounding, slower); :func:`status` says which and why.

The kernels compute their own ``exp`` and ``log`` rather than calling the C library's, in
GCC/Clang vector extensions so that they vectorise on any x86-64 or ARM CPU, without
``-ffast-math`` (which would let the compiler reorder every sum and, linked into a program, flush
denormals to zero):

* ``exp``: Cephes' ``expf`` (range reduction to ``|r| <= ln 2 / 2``, a degree-7 polynomial, about
  1 ulp). glibc's vector ``expf`` falls to a scalar path for every lane group holding an argument
  below about -87, which hidden keys' logits always are. Terms with ``l - m < -64`` are 0
  (``e^-64 = 1.6e-28``: no float32 sum of terms ``<= 1`` can hold them).
* ``log``: with AVX-512, in bits: the exponent and mantissa by ``vgetexpps`` / ``vgetmantps``, a
  32-entry table of ``1 / c`` and ``log2 c`` over the mantissa's top five bits, and
  ``log2(1 + r)`` of the remainder (``|r| <= 1/64``) as ``r q(r)``, ``q`` a degree-2 minimax
  polynomial (error below ``4e-9``); each pair's sum is turned into nats once per tile of
  columns. Elsewhere Cephes' ``logf`` (a degree-9 polynomial, about 1 ulp). Each pair's sums
  are float32 over a tile of columns and float64 across tiles; four pairs share each load of
  their common row.

Examples
--------
>>> import numpy as np
>>> from attncoda import native
>>> native.status()  # doctest: +SKIP
'compiled'
>>> a = np.array([[0.5, 0.5], [0.9, 0.1]], np.float32)
>>> js, l1 = native.pair_sums(a)  # doctest: +SKIP
>>> round(float(l1[0, 1]), 6)  # doctest: +SKIP
0.8
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["NATIVE_ENV", "pair_sums", "softmax_entropy_rows", "status"]

#: set to ``0`` to keep every caller on its numpy/torch code (nothing is compiled), ``1`` or unset
#: to use the kernels; any other value keeps them off and :func:`status` names the value
NATIVE_ENV = "ATTNCODA_NATIVE"

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

/* one vector of W floats: a zmm register where the compiler may use AVX-512, else 256 bits
   (AVX2, or two NEON registers) */
#if defined(__AVX512F__) && !defined(ATTNCODA_GENERIC)
#define W 16
#else
#define W 8
#endif
typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
static const int32_t LANES[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* ---- softmax_entropy_rows ------------------------------------------------------------- */

/* exp(d) for d <= 0 as Cephes' expf: d = k ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial
   for e^r, times 2^k; 0 below -64. k = d / ln2 rounded to nearest by adding 1.5 2^23 (the
   float's own rounding; |k| <= 93 fits in its low bits) */
static inline vf vexp(vf d) {
    vi small = d < -64.f;
    vf x = (vf)(((vi)d & ~small) | ((vi)((vf){0} - 64.f) & small));
    vf t = x * 1.44269504088896341f + 12582912.f;
    vi k = (vi)t - (vi)((vf){0} + 12582912.f);
    vf kf = t - 12582912.f;
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

/* each of `rows` rows of n logits (contiguous) becomes its softmax p = exp(l - m) / Z (with
   normalize; else exp(l - m), one sweep fewer, for callers that can scale later); out gets m,
   1 / Z and sum p (l - m) of row r at r, rows + r and 2 rows + r. With period > 0 the rows
   come in runs of `period` consecutive causal queries whose last sees all n keys: row r (the
   row0 + r-th of the whole array) sees its first n - period + (row0 + r) % period + 1 keys,
   and the keys after them become 0 without being read. */
void softmax_entropy_rows(float *restrict x, int64_t rows, int64_t n, float *restrict out,
                          int64_t out_rows, int normalize, int64_t period, int64_t row0) {
    for (int64_t r = 0; r < rows; r++) {
        float *restrict l = x + r * n;
        int64_t len = n;
        if (period > 0) {
            int64_t sees = n - period + (row0 + r) % period + 1;
            len = sees < 1 ? 1 : sees < n ? sees : n;
            memset(l + len, 0, (size_t)(n - len) * sizeof(float));
        }
        float m = l[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < len; j++) m = l[j] > m ? l[j] : m;
        vf z = {0}, s = {0};
        int64_t j = 0;
        for (; j + W <= len; j += W) {
            vf v;
            memcpy(&v, l + j, sizeof v);
            vf d = v - m;
            vf e = vexp(d);
            memcpy(l + j, &e, sizeof e);
            z += e;
            s += e * d;
        }
        if (j < len) { /* the last few keys: the lanes past the row add 0 */
            vf v = {0};
            vi lane;
            memcpy(&v, l + j, (size_t)(len - j) * sizeof(float));
            memcpy(&lane, LANES, sizeof lane);
            vf d = v - m;
            vf e = (vf)((vi)vexp(d) & (lane < (int32_t)(len - j)));
            memcpy(l + j, &e, (size_t)(len - j) * sizeof(float));
            z += e;
            s += e * d;
        }
        float zs = 0.f, ss = 0.f;
        for (int i = 0; i < W; i++) {
            zs += z[i];
            ss += s[i];
        }
        float inv = 1.f / zs;
        if (normalize) {
#pragma omp simd
            for (int64_t i = 0; i < len; i++) l[i] *= inv;
        }
        out[r] = m;
        out[out_rows + r] = inv;
        out[2 * out_rows + r] = ss * inv;
    }
}

/* ---- pair_sums ------------------------------------------------------------------------ */

#if defined(__AVX512F__) && !defined(ATTNCODA_GENERIC)
#include <immintrin.h>
#define PW 16
typedef __m512 pv;
static inline pv pload(const float *p) { return _mm512_loadu_ps(p); }
/* the last k < 16 columns; the lanes past them read 0.5 on both sides: m = 1, m log m = 0 and
   |x - y| = 0 */
static inline pv ptail(const float *p, int64_t k) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(0.5f), (__mmask16)((1u << k) - 1u), p);
}
static inline pv pabsdiff(pv x, pv y) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(x, y)),
                                                _mm512_set1_epi32(0x7fffffff)));
}
static inline float psum(pv x) { return _mm512_reduce_add_ps(x); }
/* log2 m: m = 2^e c (1 + r), c the centre of the mantissa's 32nd-part, from a table; log2(1 + r)
   as r q(r), q of degree 2, minimax on |r| <= 1/64 (error below 4e-9). In bits, so that e and
   log2 c add without a product: the sums are turned to nats once per tile (LOG_UNIT). */
static inline pv plog(pv m, const pv *tab) {
    pv e = _mm512_getexp_ps(m);
    pv mt = _mm512_getmant_ps(m, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
    __m512i idx = _mm512_srli_epi32(_mm512_castps_si512(mt), 18);
    pv lc = _mm512_permutex2var_ps(tab[0], idx, tab[1]);
    pv ic = _mm512_permutex2var_ps(tab[2], idx, tab[3]);
    pv r = _mm512_fmsub_ps(mt, ic, _mm512_set1_ps(1.f));
    pv q = _mm512_fmadd_ps(_mm512_set1_ps(0.48099798f), r, _mm512_set1_ps(-0.72142047f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.44269502f));
    return _mm512_fmadd_ps(q, r, _mm512_add_ps(e, lc));
}
#define LOG_UNIT 0.6931471805599453 /* plog is in bits */
static void ptables(pv *tab, const float *table) {
    for (int i = 0; i < 4; i++) tab[i] = _mm512_loadu_ps(table + 16 * i);
}
#define PADD _mm512_add_ps
#define PFMA _mm512_fmadd_ps /* a b + c */
#define PZERO _mm512_setzero_ps()
#else
#define PW W
typedef vf pv;
static inline pv pload(const float *p) {
    pv v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline pv ptail(const float *p, int64_t k) {
    pv v = (pv){0} + 0.5f;
    memcpy(&v, p, (size_t)k * sizeof(float));
    return v;
}
static inline pv pabsdiff(pv x, pv y) { return (pv)((vi)(x - y) & 0x7fffffff); }
static inline float psum(pv x) {
    float s = 0.f;
    for (int i = 0; i < W; i++) s += x[i];
    return s;
}
/* log m with Cephes' logf: m = 2^e x, x in [sqrt(1/2), sqrt(2)), a degree-9 polynomial */
static inline pv plog(pv m, const pv *tab) {
    (void)tab;
    vi bits = (vi)m;
    vi e = ((bits >> 23) & 0xff) - 126;
    pv x = (pv)((bits & 0x807fffff) | 0x3f000000); /* in [0.5, 1) */
    vi low = x < 0.707106781186547524f;
    e -= low & 1;
    x = x + (pv)((vi)x & low) - 1.f;
    pv ef = __builtin_convertvector(e, pv);
    pv z = x * x;
    pv y = x * 7.0376836292e-2f - 1.1514610310e-1f;
    y = y * x + 1.1676998740e-1f;
    y = y * x - 1.2420140846e-1f;
    y = y * x + 1.4249322787e-1f;
    y = y * x - 1.6668057665e-1f;
    y = y * x + 2.0000714765e-1f;
    y = y * x - 2.4999993993e-1f;
    y = y * x + 3.3333331174e-1f;
    y = y * x * z;
    y += ef * -2.12194440e-4f;
    y += z * -0.5f;
    return x + y + ef * 0.693359375f;
}
static void ptables(pv *tab, const float *table) { (void)tab; (void)table; }
#define LOG_UNIT 1.0 /* plog is in nats */
#define PADD(a, b) ((a) + (b))
#define PFMA(a, b, c) ((a) * (b) + (c))
#define PZERO ((pv){0})
#endif

/* One row i against rows j .. j + nj - 1 (nj <= 4; a constant where this is inlined) over w
   columns: row i's vector is loaded once for the nj pairs. */
static inline __attribute__((always_inline)) void pairs_of(
    const float *restrict ri, const float *restrict rj, int64_t f, int nj, int64_t w,
    int want_js, int want_l1, double *restrict js, double *restrict l1, int64_t at,
    const pv *tab) {
    pv sj[4], st[4];
    for (int u = 0; u < nj; u++) sj[u] = st[u] = PZERO;
    int64_t wv = w - w % PW, k = 0;
    for (; k < wv; k += PW) {
        pv x = pload(ri + k);
        for (int u = 0; u < nj; u++) {
            pv y = pload(rj + u * f + k);
            if (want_l1) st[u] = PADD(st[u], pabsdiff(x, y));
            if (want_js) {
                pv m = PADD(x, y);
                sj[u] = PFMA(m, plog(m, tab), sj[u]);
            }
        }
    }
    if (k < w) {
        pv x = ptail(ri + k, w - k);
        for (int u = 0; u < nj; u++) {
            pv y = ptail(rj + u * f + k, w - k);
            if (want_l1) st[u] = PADD(st[u], pabsdiff(x, y));
            if (want_js) {
                pv m = PADD(x, y);
                sj[u] = PFMA(m, plog(m, tab), sj[u]);
            }
        }
    }
    for (int u = 0; u < nj; u++) {
        if (want_js) js[at + u] += LOG_UNIT * (double)psum(sj[u]);
        if (want_l1) l1[at + u] += (double)psum(st[u]);
    }
}

/* For rows i = first, first + step, ... < n of a (n rows of f columns, each value in (0, 1],
   no zero) and every row j >= i: js[i n + j] += sum_k m log m with m = a_ik + a_jk, and
   l1[i n + j] += sum_k |a_ik - a_jk| (either may be skipped). Columns go in tiles of `tile`
   so that the tile of every row stays in cache while the pairs sweep it, four rows j at a time
   against row i; each pair's sums are float32 within a tile and float64 across tiles. table:
   log2 c and 1 / c of the mantissas' 32 centres (AVX-512 only). */
void pair_sums(const float *restrict a, int64_t n, int64_t f, int64_t first, int64_t step,
               int64_t tile, int want_js, int want_l1, double *restrict js,
               double *restrict l1, const float *restrict table) {
    pv tab[4];
    ptables(tab, table);
    for (int64_t c0 = 0; c0 < f; c0 += tile) {
        int64_t w = f - c0 < tile ? f - c0 : tile;
        for (int64_t i = first; i < n; i += step) {
            const float *ri = a + i * f + c0;
            int64_t j = i;
            for (; j + 4 <= n; j += 4)
                pairs_of(ri, a + j * f + c0, f, 4, w, want_js, want_l1, js, l1, i * n + j, tab);
            for (; j < n; j++)
                pairs_of(ri, a + j * f + c0, f, 1, w, want_js, want_l1, js, l1, i * n + j, tab);
        }
    }
}
"""

_FLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-std=gnu11", "-w")
_NATIVE_ARCH = "-march=native"

_lock = threading.Lock()
_state: dict[str, Any] = {}
_pool: tuple[ThreadPoolExecutor, int] | None = None  # the pool and its number of threads


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing pool) inherits the pool but not
    its threads, and maybe a lock some other thread held: both start afresh there (the loaded
    kernels are mapped memory and stay usable)."""
    global _lock, _pool
    _lock = threading.Lock()
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# softmax_entropy_rows: rows a thread takes at least (below it the pool's hand-off costs more
# than it saves)
_ROWS_PER_THREAD = 16
_CELLS_PER_THREAD = 1 << 16
# pair_sums: the tile of columns of every row is kept under this many bytes (a core's L2)
_TILE_BYTES = 512 << 10
# the mantissa table of pair_sums' log2 (AVX-512): centres c_k = 1 + (k + 1/2) / 32
_INV_C = (1.0 / (1.0 + (np.arange(32) + 0.5) / 32)).astype(np.float32)
_TABLE = np.concatenate([-np.log2(_INV_C.astype(np.float64)), _INV_C]).astype(np.float32)


def status() -> str:
    """Whether attncoda's compiled kernels run, and if not, why.

    They are compiled on first use, once per process (about a quarter of a second, in a temporary
    folder removed at once). Without them the summaries' one pass runs torch's ops and
    :func:`attncoda.head_comparisons` runs numpy for ``js`` and ``tv``: the same results to
    float32 rounding, slower (see ``benchmarks/results.md``).

    Returns
    -------
    str
        ``"compiled"``, or the reason they are not used: ``"turned off (ATTNCODA_NATIVE=0)"``,
        ``"ATTNCODA_NATIVE='...' is neither 0 nor 1; ..."``,
        ``"no C compiler (set CC, or install gcc or clang)"``, ``"compiling failed (...)"``,
        ``"loading the compiled kernels failed (...)"`` or ``"the compiled kernels disagreed
        with numpy (...)"`` (checked on test inputs before any use).

    See Also
    --------
    attncoda.hooks.native_status : the same, from the model side.

    Examples
    --------
    >>> from attncoda import native
    >>> native.status()  # doctest: +SKIP
    'compiled'
    """
    _library()
    return str(_state["status"])


def softmax_entropy_rows(
    logits: np.ndarray,
    stats: np.ndarray,
    threads: int = 1,
    normalize: bool = True,
    causal: bool = False,
) -> bool:
    """Each row of ``logits`` becomes its softmax, in place, with its statistics in ``stats``.

    Parameters
    ----------
    logits : numpy.ndarray
        C-contiguous float32, the rows along the last axis (at least one key; finite, keys a row
        cannot see at a large negative value such as -1e37).
    stats : numpy.ndarray
        float32 of shape ``(3, rows)``, each of its three rows contiguous (a view into a larger
        array will do): receives each row's maximum ``m``, ``1 / Z``
        and ``sum p (l - m)``.
    threads : int, default 1
        Rows are split over up to this many threads when the block is large enough to pay.
    normalize : bool, default True
        False leaves each row at ``exp(l - m)``, its softmax times ``Z``, and saves a sweep over
        it: for a caller that scales something smaller afterwards (the summaries' one pass
        scales each query's output row by ``1 / Z``, not its ``T`` probabilities).
    causal : bool, default False
        The last two axes are ``m`` consecutive causal queries by ``n >= m`` keys, the last
        query seeing every key: query ``i`` sees the first ``n - m + i + 1`` keys, and the keys
        after them are set to 0 without being read (as if they held a large negative value;
        the caller need not fill them).

    Returns
    -------
    bool
        True where the kernel ran; False where it is not available (:func:`status` says why),
        and nothing was written.
    """
    n = int(logits.shape[-1]) if logits.ndim else 0
    rows = logits.size // max(n, 1)
    if not (
        logits.dtype == np.float32
        and stats.dtype == np.float32
        and logits.flags.c_contiguous
        and logits.flags.writeable
        and stats.ndim == 2
        and stats.strides[1] == 4
        and stats.strides[0] % 4 == 0
        and stats.strides[0] >= 4 * rows
        and stats.flags.writeable
        and stats.shape == (3, rows)
        and n >= 1
        and (not causal or (logits.ndim >= 2 and n >= logits.shape[-2]))
    ):
        raise ValueError(
            "softmax_entropy_rows takes contiguous float32 CPU logits (rows, n >= 1; causal: "
            f"(..., m, n >= m)) and stats (3, rows); got {tuple(logits.shape)} {logits.dtype} "
            f"and {tuple(stats.shape)} {stats.dtype}"
        )
    lib = _library()
    if lib is None:
        return False
    fn = lib.softmax_entropy_rows
    x, out, norm = logits.ctypes.data, stats.ctypes.data, int(bool(normalize))
    out_rows = stats.strides[0] // 4
    period = int(logits.shape[-2]) if causal else 0
    threads = min(int(threads), rows // _ROWS_PER_THREAD, rows * n // _CELLS_PER_THREAD)
    if threads <= 1:
        fn(x, rows, n, out, out_rows, norm, period, 0)
        return True
    step = -(-rows // threads)
    parts = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
    # ctypes releases the GIL for the call: the parts run at once
    _map(
        lambda p: fn(
            x + 4 * p[0] * n, p[1] - p[0], n, out + 4 * p[0], out_rows, norm, period, p[0]
        ),
        parts,
    )
    return True


def pair_sums(
    a: np.ndarray, js: bool = True, l1: bool = True, threads: int = 1
) -> tuple[np.ndarray | None, np.ndarray | None] | None:
    """For every pair of rows of ``a (N, F)``: ``sum_f xlogx((a_i + a_j) / 2)`` and
    ``sum_f |a_i - a_j|``, as symmetric float64 ``(N, N)`` matrices.

    These are the elementwise parts of the Jensen-Shannon divergence and of the total variation
    distance between rows of probabilities. Values are halved and lifted to the smallest normal
    float32 first (so that no pair needs a guard before its log; the lift changes a term by
    less than ``1e-37``); each pair's sums run in float32 over tiles of columns and float64
    across them.

    Parameters
    ----------
    a : numpy.ndarray
        float32 ``(N, F)``, values in ``[0, 1]``.
    js, l1 : bool, default True
        Which of the two sums to compute (both share one sweep over the rows).
    threads : int, default 1
        The pairs are spread over up to this many threads.

    Returns
    -------
    tuple of (numpy.ndarray or None), or None
        ``(js, l1)`` (``None`` for a sum not asked for); ``None`` where the kernel is not
        available (:func:`status` says why).
    """
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2):
        raise ValueError(f"pair_sums takes a float32 (N, F) array; got {getattr(a, 'shape', a)}")
    lib = _library()
    if lib is None:
        return None
    n, f = a.shape
    out_js = np.zeros((n, n)) if js else None
    out_l1 = np.zeros((n, n)) if l1 else None
    if n == 0 or f == 0 or not (js or l1):
        return out_js, out_l1
    half = np.multiply(a, 0.5)
    np.maximum(half, np.finfo(np.float32).tiny, out=half)
    tile = int(max(64, min(4096, _TILE_BYTES // (4 * n)))) // 16 * 16
    workers = max(1, min(int(threads), n // 8))
    fn = lib.pair_sums
    js_ptr = out_js.ctypes.data if out_js is not None else None
    l1_ptr = out_l1.ctypes.data if out_l1 is not None else None
    args = (half.ctypes.data, n, f)
    tail = (tile, int(js), int(l1), js_ptr, l1_ptr, _TABLE.ctypes.data)
    if workers == 1:
        fn(*args, 0, 1, *tail)
    else:  # anchors dealt round-robin: every thread gets long and short rows of the triangle
        _map(lambda first: fn(*args, first, workers, *tail), range(workers))
    iu = np.triu_indices(n, 1)
    for out in (out_js, out_l1):
        if out is not None:
            out[iu[1], iu[0]] = out[iu]
    if out_l1 is not None:
        out_l1 *= 2.0  # sum |a_i - a_j| of the halved values, doubled
    return out_js, out_l1


def _map(fn: Callable[[Any], Any], items: list[Any] | range) -> None:
    """``fn`` over ``items`` on attncoda's thread pool (grown to ``len(items)`` threads)."""
    global _pool
    items = list(items)
    with _lock:
        if _pool is None or _pool[1] < len(items):
            if _pool is not None:
                _pool[0].shutdown(wait=False)
            _pool = (
                ThreadPoolExecutor(len(items), thread_name_prefix="attncoda-native"),
                len(items),
            )
        pool = _pool[0]
    list(pool.map(fn, items))


def _library() -> Any:
    with _lock:
        if "status" not in _state:
            lib, why = _build()
            _state["lib"], _state["status"] = lib, why
        return _state["lib"]


def _build(extra_flags: tuple[str, ...] = ()) -> tuple[Any, str]:
    """Compile, load and check the kernels: ``(library, "compiled")`` or ``(None, why)``."""
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
        src, lib_path = Path(tmp) / "kernels.c", Path(tmp) / "kernels.so"
        src.write_text(_SOURCE, encoding="utf-8")
        error = ""
        for arch in ((_NATIVE_ARCH,), ()):  # some compilers (Apple's clang on arm64) refuse it
            cmd = [*cc.split(), *_FLAGS, *arch, *extra_flags, "-o", str(lib_path), str(src)]
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
            return None, f"loading the compiled kernels failed ({err})"
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.softmax_entropy_rows.argtypes = [ptr, i64, i64, ptr, i64, ctypes.c_int, i64, i64]
    lib.softmax_entropy_rows.restype = None
    lib.pair_sums.argtypes = [
        ptr,
        i64,
        i64,
        i64,
        i64,
        i64,
        ctypes.c_int,
        ctypes.c_int,
        ptr,
        ptr,
        ptr,
    ]
    lib.pair_sums.restype = None
    problem = _check(lib)
    if problem:
        return None, f"the compiled kernels disagreed with numpy ({problem})"
    return lib, "compiled"


def _check(lib: Any) -> str | None:
    """Run both kernels on test inputs and compare with numpy in float64: for the softmax,
    ragged row lengths, hidden keys, a row of hidden keys only and logits in the thousands; for
    the pairs, ragged widths, peaked and flat rows, zeros and values across the float range."""
    rng = np.random.default_rng(0)
    problems = []
    for n, normalize, period in itertools.product((1, 7, 8, 15, 16, 17, 37, 300), (1, 0), (0, 3)):
        if period > n:
            continue
        logits = rng.standard_normal((6, n)) * 4
        logits[1] *= 500  # Qwen2.5's first layers: logits in the thousands
        logits[2, : n // 2] = -1e37  # hidden keys
        logits[3] = -1e37  # a row that sees nothing: uniform, as torch's softmax
        x = logits.astype(np.float32)
        if period:  # what the kernel must not read: keys past each causal row's last
            x[np.arange(n)[None, :] > n - period + np.arange(6)[:, None] % period] = np.nan
        logits = x.astype(np.float64)  # the same inputs on both sides
        stats = np.empty((3, 6), np.float32)
        lib.softmax_entropy_rows(x.ctypes.data, 6, n, stats.ctypes.data, 6, normalize, period, 0)
        p, want = np.zeros_like(logits), np.empty((3, 6))
        for r in range(6):  # a row's softmax over the keys it sees; 0 after them
            sees = n - period + r % period + 1 if period else n
            row = logits[r, :sees]
            e = np.exp(row - row.max())
            p[r, :sees] = e / e.sum()
            # hidden keys: 0 times a finite number
            want[:, r] = row.max(), p[r].max(), (p[r, :sees] * (row - row.max())).sum()
        got_p = x if normalize else x * stats[1][:, None]
        what = (
            f"{n} keys" + ("" if normalize else ", not normalised") + (", causal" if period else "")
        )
        if not np.allclose(got_p, p, rtol=1e-5, atol=1e-7):
            problems.append(f"softmax, {what}")
        for name, got, ref in zip(("max", "1/Z", "sum p(l-m)"), stats, want, strict=True):
            if not np.allclose(got, ref, rtol=1e-5, atol=1e-6):
                problems.append(f"{name}, {what}")
    for f in (1, 15, 16, 17, 600):
        z = rng.standard_normal((9, f)) * np.array([0.1, 1, 3, 8, 20, 40, 1, 1, 1])[:, None]
        e = np.exp(z - z.max(-1, keepdims=True))
        rows = e / e.sum(-1, keepdims=True)
        rows[6] = 0.0  # a row of zeros, and values across the range
        rows[7] = 10.0 ** rng.uniform(-40, 0, f)
        half = np.maximum(rows.astype(np.float32) * 0.5, np.finfo(np.float32).tiny)
        js, l1 = np.zeros((9, 9)), np.zeros((9, 9))
        args = (9, f, 0, 1, 64, 1, 1, js.ctypes.data, l1.ctypes.data, _TABLE.ctypes.data)
        lib.pair_sums(half.ctypes.data, *args)
        h = half.astype(np.float64)
        m = h[:, None, :] + h[None, :, :]
        want_js = (m * np.log(m)).sum(-1)
        want_l1 = np.abs(h[:, None, :] - h[None, :, :]).sum(-1)
        iu = np.triu_indices(9)
        if not np.allclose(js[iu], want_js[iu], rtol=2e-6, atol=1e-7):
            problems.append(f"pair js, {f} columns")
        if not np.allclose(l1[iu], want_l1[iu], rtol=2e-6, atol=1e-7):
            problems.append(f"pair l1, {f} columns")
        if np.any(np.tril(js, -1)) or np.any(np.tril(l1, -1)):
            problems.append(f"pairs below the diagonal, {f} columns")
    return "; ".join(dict.fromkeys(problems)) or None
