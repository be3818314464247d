"""Where a forward pass's rows go: written once, chunk by chunk, into the array they stay in.

A capture of ``what="rows"`` keeps ``batch x layers x heads x queries x keys`` values (4.5 GB
for SmolLM2's 30 x 9 heads at T=2048). :class:`_RowsBuffer` allocates that array once per
forward pass, before the first captured layer runs, and every layer writes its rows into its
slot of it, a chunk of queries at a time, through a torch view of the same memory: no per-layer
array, no concatenation, and the dataset is built around the buffer itself.

With ``stream_to=`` the buffer is an uncompressed zarr array in a staging folder beside the
store instead (chunks of ``(1, 1, heads, chunk_size, keys)``): each chunk of rows is written to
disk as soon as it is computed, from one reused chunk-sized array, so memory stays bounded by
one chunk whatever the length. When the pass ends its dataset, whose rows are read lazily (dask)
from the staging array, is appended to the store, and the staging folder is removed. The staging
folder is :func:`attncoda.staging_folder`'s: marked as attncoda's, removed also at exit and when
the process is ended by SIGTERM/SIGHUP, and found and removed by the next capture beside the same
store if the process was killed outright (SIGKILL, power loss).
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attncoda

#: ``madvise`` advice (Linux): map every page of a range for writing now (5.14+)
_MADV_POPULATE_WRITE = 23


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # musl has none
        return None
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim


#: rows buffers from this size release the free heap when full (smaller passes are quick, and
#: a trim costs milliseconds)
TRIM_MIN_BYTES = 64 << 20


def release_free_heap() -> None:
    """Give the free pages of the C heap back to the system (glibc's ``malloc_trim``).

    Called once per forward pass: right before the model's output head (the logits) where it
    has one, otherwise when the last captured layer has written its rows. glibc
    keeps freed blocks in its heap once its mmap threshold has risen to their size (it rises
    to the largest block freed, up to 32 MB): the layers' temporaries (attention scores,
    activations, a chunk of rows) stay resident after they are freed, and the output head's
    logits, allocated after them (0.1 GB for SmolLM2 at T=512), come on top. A process's peak
    then moved by 3-5% from run to run with what happened to stay in the heap (T=1024, seven
    fresh processes: 1.39-1.46 GB over 1.13 GB of rows); trimmed, four gave 1.38-1.39 GB.
    Released when the last layer had written its rows, the last layer's MLP still grew the heap
    again before the logits: at T=2048 attncoda's peak read 5.02-5.09 GB (rows 4.53) against
    HF eager's 5.04-5.06 or 5.19-5.28; released right before the output head, 5.006 GB in
    three fresh processes and 5.01 in bench_rows' three.
    The call took 1.4-2.6 ms, so only a pass buffer of :data:`TRIM_MIN_BYTES` or more asks
    for it. Elsewhere than glibc it does nothing.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: rows buffers from this size get a memory mapping of their own (base pages, mapped up front)
MAPPED_MIN_BYTES = 4 << 20
#: numpy's tracemalloc domain: a mapped buffer is traced as numpy's arrays are
_NUMPY_TRACE_DOMAIN = 389047
#: the freed rows buffer kept for the next capture (at most one; see :func:`empty_cache`)
_spare: list[mmap.mmap] = []


@functools.cache
def spare_max_bytes() -> int:
    """The largest freed rows buffer kept for the next capture: 1 GiB, or 1/16 of the memory."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        memory = 16 << 30
    return min(1 << 30, memory // 16)


def empty_cache() -> int:
    """Give back the freed rows buffer attncoda keeps for the next capture; its bytes, or 0.

    A capture of ``what="rows"`` whose buffer takes 4 MiB or more holds its rows in a memory
    mapping of its own, every page mapped before the layers write (Linux). When the dataset
    holding them is freed, the mapping is kept, mapped, for the next capture (one, of at most
    1 GiB or 1/16 of the machine's memory), which then writes into pages that need no mapping
    again: 283 MB of rows (SmolLM2 at T=512) took 82-85 ms to map, 5% of that capture, every
    time. HF eager's attention arrays get the same from glibc's heap, which keeps blocks up to
    32 MB. This is like ``torch.cuda.empty_cache``: call it to give the memory back now (after
    the last capture of a loop, say); a capture that needs more than the kept buffer gives it
    back before it maps its own.

    Returns
    -------
    int
        Bytes given back to the system.

    Examples
    --------
    >>> from attncoda.hooks import empty_cache
    >>> empty_cache() >= 0
    True
    """
    freed = 0
    while _spare:
        mm = _spare.pop()
        freed += len(mm)
        mm.close()
    return freed


def _traced(address: int, nbytes: int, on: bool) -> None:
    """Tell tracemalloc about a mapped buffer (it sees numpy's own allocations, not mmap's)."""
    if on:
        ctypes.pythonapi.PyTraceMalloc_Track(
            ctypes.c_uint(_NUMPY_TRACE_DOMAIN), ctypes.c_size_t(address), ctypes.c_size_t(nbytes)
        )
    else:
        ctypes.pythonapi.PyTraceMalloc_Untrack(
            ctypes.c_uint(_NUMPY_TRACE_DOMAIN), ctypes.c_size_t(address)
        )


def _kept_for_next(mm: mmap.mmap, address: int) -> None:
    """A mapped buffer's last array is gone: keep it for the next capture, or unmap it."""
    _traced(address, len(mm), on=False)
    if len(mm) > spare_max_bytes():
        mm.close()
        return
    _spare.append(mm)
    while len(_spare) > 1:  # the newest stays
        _spare.pop(0).close()


def _mapping(nbytes: int) -> mmap.mmap:
    """``nbytes`` of mapped memory: the kept buffer if it is large enough (shrunk to size)."""
    try:
        mm = _spare.pop()
    except IndexError:
        mm = None
    if mm is not None:
        if len(mm) >= nbytes:
            try:
                if len(mm) > nbytes:
                    mm.resize(nbytes)  # the tail goes back to the system
                return mm
            except OSError:  # no mremap here: a mapping of the right size instead
                pass
        mm.close()  # too small (or not shrinkable): given back before another is mapped
    mm = mmap.mmap(-1, nbytes)
    try:
        mm.madvise(getattr(mmap, "MADV_NOHUGEPAGE", 15))  # 15: Linux's value
        mm.madvise(_MADV_POPULATE_WRITE)
    except OSError:  # a kernel without huge pages or before 5.14: pages map as written
        pass
    return mm


def _buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array for a pass's rows; from :data:`MAPPED_MIN_BYTES`, a mapping of its
    own, every page mapped, in base pages, before it is written (Linux).

    numpy advises transparent huge pages for arrays of 4 MiB and more (``MADV_HUGEPAGE``). A huge
    page is taken from the kernel's largest free blocks, and on a virtual machine those are the
    memory the guest gave back to its host (free page reporting, ballooning), whose first write
    waits for the host to provide it again; where THP ``defrag`` is ``madvise`` the kernel may
    also compact memory first. On the shared 2-core VM, writing 1.1 GB (SmolLM2's rows at
    T=1024) took 1.3-3.5 CPU-s in a fresh process with huge pages and 0.6-0.7 s in base pages,
    and a whole T=1024 capture 9.4-10.4 against 5.9-7.0 CPU-s (issue #31). The rows are written
    once, a chunk of queries at a time, so base pages cost nothing in TLB misses here.

    The pages are mapped in one call (``MADV_POPULATE_WRITE``) rather than one fault per 4 KiB
    page as the layers first write them: mapping and filling 283 MB (the rows at T=512) took
    0.13 CPU-s against 0.16-0.22 s fault by fault; and when the array is freed the mapping is
    kept for the next capture (:func:`empty_cache`), which maps nothing. Every value is written
    by the capture, so neither the kept buffer's old rows nor anything else shows through.
    Elsewhere than Linux, and below the size, numpy's ``empty``.
    """
    count = math.prod(shape)
    if count * dtype.itemsize < MAPPED_MIN_BYTES or not sys.platform.startswith("linux"):
        return np.empty(shape, dtype)
    mm = _mapping(count * dtype.itemsize)
    flat = np.frombuffer(mm, dtype, count)
    # numpy's own memoryview of the mapping, every array over it its base: holds the mapping
    # open (``close`` refuses) while any of them lives, and dies with the last
    base = flat.base
    assert isinstance(base, memoryview) and base.obj is mm
    _traced(flat.ctypes.data, len(mm), on=True)
    weakref.finalize(base, _kept_for_next, mm, flat.ctypes.data).atexit = False
    return flat.reshape(shape)


class _RowsBuffer:
    """One forward pass's rows, ``(batch, layers, heads, queries, keys)`` in ``dtype``."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: str,
        chunk: int,
        staging_beside: Path | None,
        *,
        release_when_full: bool = False,
        release_later: bool = False,
    ) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.folder: Path | None = None
        self.memory: np.ndarray | None = None
        self.disk: Any = None
        self.layers_written = 0  # layer slots whose every query is written
        #: a forward pass's buffer of every captured layer: release the free heap when full
        self.release_when_full = release_when_full and math.prod(shape) * self.dtype.itemsize >= (
            TRIM_MIN_BYTES
        )
        #: the caller releases the heap itself, later in the pass (:meth:`release_if_due`):
        #: right before the output head, after the last layer's own temporaries are freed too
        self.release_later = release_later
        self._release_due = False
        if staging_beside is None:
            # every value is written exactly once, by the layers
            self.memory = _buffer(shape, self.dtype)
            return
        import zarr

        b, _, h, nq, kv = shape
        # marked as attncoda's and locked while this process lives: removed on discard, at
        # exit and on SIGTERM/SIGHUP; a SIGKILLed writer's folder goes when the next one is
        # made beside the same store, and nothing without attncoda's marker is touched
        self._staging = attncoda.staging_folder(staging_beside, "rows")
        self.folder = self._staging.path
        self.disk = zarr.create_array(
            store=str(self.folder / "log_attn.zarr"),
            shape=shape,
            chunks=(1, 1, h, min(chunk, nq), kv),
            dtype=self.dtype,
            compressors=None,
            zarr_format=2,
            fill_value=None,
        )
        self._chunk = np.empty((b, h, min(chunk, nq), kv), self.dtype)

    def release_if_due(self) -> None:
        """Release the free heap once, if every layer is written and the release was left to
        the caller (``release_later``)."""
        if self._release_due:
            self._release_due = False
            release_free_heap()

    def writer(self, li: int) -> _LayerWriter:
        """Where layer slot ``li`` writes its rows."""
        return _LayerWriter(self, li)

    def read(self, li: int) -> np.ndarray:
        """Layer slot ``li``'s rows ``(batch, heads, queries, keys)`` (a view in memory)."""
        if self.memory is not None:
            return self.memory[:, li]
        return np.asarray(self.disk[:, li])

    def full(self) -> Any:
        """Every layer's rows: the numpy buffer, or a dask array over the staging array."""
        if self.memory is not None:
            return self.memory
        import dask.array as da

        return da.from_zarr(self.disk)

    def discard(self) -> None:
        """Drop the rows; remove the staging folder (attncoda made it)."""
        self.memory = None
        self.disk = None
        if self.folder is not None:
            self._staging.remove()
            self.folder = None


class _LayerWriter:
    """Destinations of one layer's rows, a chunk of queries at a time."""

    def __init__(self, buf: _RowsBuffer, li: int) -> None:
        self.buf, self.li = buf, li
        self.queries_written = 0

    def chunk(self, start: int, n: int) -> torch.Tensor:
        """``(batch, heads, n, keys)``: the buffer's own memory for queries ``start:start+n``."""
        if self.buf.memory is not None:
            return torch.from_numpy(self.buf.memory[:, self.li, :, start : start + n])
        return torch.from_numpy(self.buf._chunk[:, :, :n])

    def written(self, start: int, n: int) -> None:
        """Queries ``start:start+n`` are written (on disk now, with ``stream_to=``)."""
        if self.buf.disk is not None:
            self.buf.disk[:, self.li, :, start : start + n] = self.buf._chunk[:, :, :n]
        self.queries_written += n
        if self.queries_written == self.buf.shape[3]:
            self.buf.layers_written += 1
            if self.buf.layers_written == self.buf.shape[1] and self.buf.release_when_full:
                if self.buf.release_later:
                    self.buf._release_due = True
                else:
                    release_free_heap()  # the pass's last layer: its temporaries are freed
