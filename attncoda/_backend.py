"""Where head comparisons compute: numpy or torch (on a device), and the per-pair passes.

Matrix products go through attncoda's one GEMM backend (:func:`attncoda._pairwise.row_gram`:
one matrix in numpy's BLAS, a stack in torch when installed); the ``js`` and ``tv`` metrics,
which have no matrix-product form, run one pass per pair of units: in attncoda's compiled kernel
(:func:`attncoda.native.pair_sums`, both sums in one sweep over tiles that stay in cache) under
``backend="auto"``, else in numpy spread over a few threads, or on a torch device.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Literal

import numpy as np

from . import native
from ._conventions import AnalysisError
from ._pairwise import row_gram

# --------------------------------------------------------------------------------------------
# backend: matrix products through attncoda's one GEMM backend (:func:`._pairwise.row_gram`: under
# "auto" one matrix through numpy's BLAS, syrk for a matrix with its own transpose, and a stack
# through torch when installed, whose batched GEMM splits it across its threads once),
# elementwise work in numpy; with a torch device (a GPU) both the products and the per-pair
# js/tv passes run there


class _Backend:
    """Where matrix products and per-pair passes run: numpy or torch (on a device)."""

    def __init__(self, name: str, device: Any = None) -> None:
        if name not in ("auto", "torch", "numpy"):
            raise AnalysisError(f"backend must be 'auto', 'torch' or 'numpy', got {name!r}")
        #: as the caller named it: under "auto" :func:`row_gram` picks the engine per product
        #: (and a device runs them all in torch)
        self.name = name
        self.device = None if device is None else _torch_device(device, name)

    @staticmethod
    def resolve(backend: str, device: Any = None) -> _Backend:
        """The backend ``backend`` on ``device``, checked (a bad device fails here)."""
        return _Backend(backend, device)

    def gram(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``a @ b.T`` (``b = a`` by default) as float64."""
        g = row_gram(a, b, backend=self.name, device=self.device)
        return np.asarray(g, dtype=np.float64)

    def pair_sums(
        self, a: np.ndarray, kinds: tuple[Literal["js", "l1"], ...], budget: int
    ) -> dict[str, np.ndarray]:
        """:func:`_pairwise_rows` of each of ``kinds``: on the device when one is set; else,
        under ``"auto"``, in attncoda's compiled kernel (float32 rows, both sums in one sweep)
        where it is available (:func:`attncoda.native.status`); else in numpy."""
        if self.device is not None:
            import torch

            t = torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
            return {kind: _pairwise_rows_torch(t, kind, budget) for kind in kinds}
        if self.name == "auto" and a.dtype == np.float32 and a.ndim == 2:
            both = native.pair_sums(a, js="js" in kinds, l1="l1" in kinds, threads=_workers())
            if both is not None:
                return {k: v for k, v in zip(("js", "l1"), both, strict=True) if v is not None}
        return {kind: _pairwise_rows(a, kind, budget) for kind in kinds}


def _torch_device(device: Any, backend: str) -> Any:
    """``device`` as a usable torch device, or a clear error."""
    if backend == "numpy":
        raise AnalysisError(f"device={device!r} needs backend='torch' (or 'auto'), not {backend!r}")
    try:
        import torch
    except ImportError:
        raise AnalysisError(
            f"device={device!r} needs torch; install it, or leave device unset (numpy on the CPU)"
        ) from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise AnalysisError(f"device={device!r} is not a torch device ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AnalysisError(
            f"device={device!r} but torch sees no CUDA device; leave device unset to compute "
            "on the CPU"
        )
    if dev.type == "meta":
        raise AnalysisError("device='meta' holds no data; pick a CPU or GPU device")
    try:  # a probe, so that "cuda:7" on one GPU or "mps" off a Mac fail here, not mid-analysis
        torch.zeros(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as err:
        reason = str(err).split(". ")[0][:160]
        raise AnalysisError(
            f"device={device!r} cannot be used here ({reason}); pick an available device or "
            "leave device unset to compute on the CPU"
        ) from None
    return dev


def _workers() -> int:
    """Threads for the pairwise JS / TV loops: at most 4, the CPUs this process may run on,
    and, where torch is loaded, ``torch.get_num_threads()``, so that one setting
    (``torch.set_num_threads``, the CLI's ``--threads``, its one thread on a busy machine)
    governs attncoda's own pool as it does torch's."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        cpus = min(cpus, int(torch.get_num_threads()))
    return max(1, min(4, cpus))


def _pairwise_rows(a: np.ndarray, kind: Literal["js", "l1"], budget: int) -> np.ndarray:
    """All pairs of rows of ``a (N, F)``: ``sum_f xlogx((a_i + a_j) / 2)`` (``js``) or
    ``sum_f |a_i - a_j|`` (``l1``). Only ``j >= i`` is computed (then mirrored), anchors are
    spread over a few threads (numpy releases the GIL), temporaries are bounded by ``budget``.
    """
    n, f = a.shape
    out = np.zeros((n, n))
    if n == 0 or f == 0:
        return out
    # js: halve once and lift zeros to the smallest normal float once, so that no pair needs a
    # guard pass before its log (the lift changes xlogx by < 1e-36 per cell)
    src = np.maximum(a * 0.5, np.finfo(a.dtype).tiny) if kind == "js" else a
    n_workers = _workers() if n * n * f > (1 << 22) else 1
    cols = max(1, min(f, budget // max(1, n)))

    def work(first: int) -> None:
        buf = np.empty((n, cols), a.dtype)
        tmp = np.empty((n, cols), a.dtype) if kind == "js" else buf
        for i in range(first, n, n_workers):
            acc = np.zeros(n - i)
            for c0 in range(0, f, cols):
                c1 = min(f, c0 + cols)
                b = buf[: n - i, : c1 - c0]
                if kind == "js":
                    np.add(src[i, c0:c1], src[i:, c0:c1], out=b)
                    t = tmp[: n - i, : c1 - c0]
                    np.log(b, out=t)
                    acc += np.einsum("jk,jk->j", b, t)
                else:
                    np.subtract(src[i, c0:c1], src[i:, c0:c1], out=b)
                    np.abs(b, out=b)
                    acc += b.sum(axis=1)
            out[i, i:] = acc

    if n_workers == 1:
        work(0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(n_workers) as pool:
            list(pool.map(work, range(n_workers)))
    iu = np.triu_indices(n, 1)
    out[iu[1], iu[0]] = out[iu]
    return out


_DEVICE_MIN_BUDGET = 1 << 24  # elements per step on a device: fewer, larger kernel launches


def _pairwise_rows_torch(t: Any, kind: Literal["js", "l1"], budget: int) -> np.ndarray:
    """:func:`_pairwise_rows` for a torch tensor on its device: a few anchors against all
    later rows per step (``anchors x rows x columns <= max(budget, _DEVICE_MIN_BUDGET)``)."""
    import torch

    n, f = t.shape
    out = torch.zeros((n, n), dtype=torch.float64, device=t.device)
    if n == 0 or f == 0:
        return out.cpu().numpy()
    if kind == "js":  # as in the numpy kernel: halve, lift zeros to the smallest normal float
        t = torch.clamp(t * 0.5, min=torch.finfo(t.dtype).tiny)
    step = max(1, max(budget, _DEVICE_MIN_BUDGET) // (n * f))
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        if kind == "js":
            m = t[i0:i1, None, :] + t[None, i0:, :]
            cells = m.mul_(torch.log(m))
        else:
            cells = (t[i0:i1, None, :] - t[None, i0:, :]).abs_()
        out[i0:i1, i0:] = cells.sum(-1).double()
    upper = torch.triu(out, 1)  # steps also filled some j < i: keep j >= i and mirror it
    return (torch.diag(torch.diagonal(out)) + upper + upper.T).cpu().numpy()
