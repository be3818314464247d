"""Shared timing for the benchmarks: one thread, interleaved sides, CPU time beside wall time.

Every benchmark that times attncoda against a peer uses this module, so that all of them hold on
a shared, noisy machine in the same way:

- each side runs on **one thread** (:func:`one_thread`: ``torch.set_num_threads(1)`` and
  threadpoolctl's limit for every BLAS/OpenMP pool), so process CPU time measures the work and a
  multi-threaded kernel cannot stall on a core another job holds;
- every call is timed by **process CPU time** (``time.process_time``) and wall time
  (``time.perf_counter``) together (:func:`clock`);
- the sides are **interleaved** and their order **rotates** every repeat (:func:`interleave`),
  after one untimed warm-up each, with the garbage collector off (as ``timeit`` does);
- the maths cases keep **freed memory for reuse** (:func:`reused_memory`), so a call's
  system time is its own work, not a virtual machine's host faults drawn by chance;
- results are **medians with min-max** (:class:`Samples`);
- the machine's **load** is recorded at the start and the end (:class:`Load`);
- a ratio is the CPU-time ratio of the medians; where the wall-clock ratio disagrees with it by
  more than :data:`MARGIN` the ratio is **unreliable**: the case is measured again
  (:func:`interleave_reliable`, up to :data:`ATTEMPTS` times); if it stays so, :func:`row`
  reports both and marks the row, and no result (ratio, holds) is printed for it
  (:class:`Ratio`).

Example (the sides, their rows)::

    with one_thread():
        m = interleave({"attncoda": lambda: ac.clr(x), "scikit-bio": lambda: skc.clr(x)}, 5)
    rows = [row("clr", m, "attncoda", "scikit-bio", target=1.0)]

``rows`` are the dicts ``benchmarks/run`` tabulates (keys: benchmark, project_s, anchor,
anchor_s, ratio, target, holds, and the extra keys documented at :func:`row`).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

MARGIN = 0.2
"""Largest relative disagreement between a wall-clock ratio and its CPU-time ratio (either way,
``max(w/c, c/w) <= 1 + MARGIN``) for the ratio to count as a result."""


def touch_free_memory(spare_gb: float = 1.5, block_gb: float = 1.0) -> tuple[float, float]:
    """Write one byte per page of the machine's available memory once, block by block (each
    block freed before the next), leaving ``spare_gb``; returns (GB touched, wall seconds).

    On a virtual machine whose memory the host backs lazily, the guest's first write to a page
    it has never used costs a fault in the host as well: on the 2-core VM these benchmarks ran
    on, 3.2 s per GB, against 0.2 s per GB once a page had been used. Which side of a
    comparison happens to get never-used pages is chance (a 1.1 GB rows buffer took 0.2, 2.1
    or 4.4 CPU-s to fill in three calls in a row), so the time ratios moved by 20% from run to
    run. After this, every page the sides get has been used before, and only their own work
    is measured (a machine that has run for a while is in this state anyway).
    """
    import numpy as np

    try:
        with open("/proc/meminfo") as fh:
            info = {line.split(":")[0]: int(line.split()[1]) for line in fh}
        available = info["MemAvailable"] / 2**20
    except (OSError, KeyError, ValueError, IndexError):  # not Linux: nothing to do
        return 0.0, 0.0
    t0 = time.perf_counter()
    left = available - spare_gb
    touched = 0.0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    while left > 0:
        gb = min(block_gb, left)
        block = np.empty(int(gb * 2**30), np.uint8)
        block[::page] = 1
        del block
        touched += gb
        left -= gb
    return touched, time.perf_counter() - t0


#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's defaults for them, restored after :func:`reused_memory`
_DEFAULT_THRESHOLD = 128 * 1024


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)))
    except (OSError, AttributeError):
        return False


@contextmanager
def reused_memory() -> Iterator[bool]:
    """Keep the memory that calls free inside the process, so the next call reuses pages that
    are already mapped (glibc's malloc: blocks under 2 GB from the heap, never trimmed);
    yields whether that took effect (False without glibc: nothing changes).

    On a virtual machine whose host takes freed pages back, each call that allocates fresh
    memory otherwise pays host faults by chance: on the 2-core VM of 5 December 2026 a 256 MB
    result cost from 0.02 to 2.2 s of system time from one call to the next, and medians of
    10^6-row cases moved by up to 9x (a 0.65 s call timed at 5.65 s); with the memory kept,
    0.00-0.01 s in every timed call. Both sides of a comparison run under it, and the untimed
    warm-up call of each grows the heap to what it needs. It makes the peers' full-size
    temporaries cheaper too (they no longer fault in fresh pages), so it can only narrow
    attncoda's lead. Memory benchmarks (peak RSS) must not run under it.
    """
    limit = 2**31 - 1  # mallopt takes an int
    done = _mallopt(_M_MMAP_THRESHOLD, limit) and _mallopt(_M_TRIM_THRESHOLD, limit)
    try:
        yield done
    finally:
        if done:
            _mallopt(_M_MMAP_THRESHOLD, _DEFAULT_THRESHOLD)
            _mallopt(_M_TRIM_THRESHOLD, _DEFAULT_THRESHOLD)


@dataclass(frozen=True)
class Load:
    """The 1-minute load average at the start and at the end of a measurement."""

    start: float
    end: float

    @classmethod
    def now(cls) -> Load:
        """A load with both ends set to the current 1-minute load average (``end`` set later)."""
        one = os.getloadavg()[0]
        return cls(one, one)

    def ended(self) -> Load:
        """This load with ``end`` set to the current 1-minute load average."""
        return Load(self.start, os.getloadavg()[0])

    def text(self) -> str:
        return f"load {self.start:.1f}-{self.end:.1f}"


@dataclass(frozen=True)
class Samples:
    """Seconds of one side's timed calls: process CPU time and wall time, call by call."""

    cpu: tuple[float, ...]
    wall: tuple[float, ...]

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    def cpu_range(self, scale: float = 1.0) -> str:
        """``"min-max"`` of the CPU seconds (times ``scale``), 3 significant digits."""
        return f"{min(self.cpu) * scale:.3g}-{max(self.cpu) * scale:.3g}"


@dataclass(frozen=True)
class Measurement:
    """What :func:`interleave` measured: every side's samples and the load around them;
    ``attempts``: how many measurements :func:`interleave_reliable` took to get it."""

    sides: dict[str, Samples]
    load: Load
    attempts: int = 1

    def __getitem__(self, name: str) -> Samples:
        return self.sides[name]


@dataclass(frozen=True)
class Ratio:
    """``project / anchor`` of the medians, by CPU time and by wall time."""

    cpu: float
    wall: float
    margin: float = MARGIN

    @property
    def reliable(self) -> bool:
        """Whether the wall-clock ratio agrees with the CPU-time ratio within ``margin``."""
        if not (self.cpu > 0 and self.wall > 0):
            return False
        return abs(math.log(self.wall / self.cpu)) <= math.log1p(self.margin)


def clock(fn: Callable[[], Any]) -> tuple[float, float]:
    """Call ``fn()`` once: ``(cpu_seconds, wall_seconds)``; the result is dropped untimed."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    w1, c1 = time.perf_counter(), time.process_time()
    del out
    return c1 - c0, w1 - w0


def clocked(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """Call ``fn()`` once: ``(result, cpu_seconds, wall_seconds)``, for a single costly step whose
    result is needed afterwards (a capture, a page); repeated comparisons use :func:`interleave`."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    w1, c1 = time.perf_counter(), time.process_time()
    return out, c1 - c0, w1 - w0


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one thread in torch (if installed) and in every BLAS/OpenMP pool."""
    with ExitStack() as stack:
        try:
            threadpoolctl = importlib.import_module("threadpoolctl")
        except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
            threadpoolctl = None
        if threadpoolctl is not None:
            stack.enter_context(threadpoolctl.threadpool_limits(limits=1))
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            torch = None
        if torch is not None:
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, before)
        yield


def interleave(
    fns: Mapping[str, Callable[[], Any]],
    repeats: int,
    *,
    slow_s: float = math.inf,
    before: Callable[[], None] | None = None,
    around: Mapping[str, Callable[[], AbstractContextManager[Any]]] | None = None,
    warmups: Mapping[str, Callable[[], Any]] | None = None,
) -> Measurement:
    """Time the sides ``fns`` against each other: ``repeats`` samples each, interleaved.

    Every side runs once untimed first (warm-up). Then each round calls every side once, the
    order rotated by one each round, so no side always follows the same one (the cache and
    allocator state a predecessor leaves is spread over all). A side whose warm-up took more
    than ``slow_s`` wall seconds keeps its warm-up as a sample and stops at 3 samples.
    ``before`` runs untimed before every call (e.g. touching memory); ``around`` maps a side to
    a context (e.g. attaching hooks to a model) entered and left untimed around each of its
    calls; ``warmups`` replaces a side's untimed warm-up call (e.g. the same path on a short
    input, where a full call costs minutes). The garbage collector is off while timing. Call inside :func:`one_thread` for one
    thread each side.
    """
    names = list(fns)
    contexts = dict(around or {})

    def timed(name: str) -> tuple[float, float]:
        if before is not None:
            before()
        with contexts.get(name, nullcontext)():
            return clock(fns[name])

    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    wanted = dict.fromkeys(names, repeats)
    load = Load.now()
    gc.collect()
    gc.disable()
    try:
        for name in names:
            if warmups is not None and name in warmups:
                with contexts.get(name, nullcontext)():
                    warmups[name]()
                continue
            c, w = timed(name)
            if w > slow_s:
                cpu[name].append(c)
                wall[name].append(w)
                wanted[name] = min(repeats, 3)
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                if len(cpu[name]) < wanted[name]:
                    c, w = timed(name)
                    cpu[name].append(c)
                    wall[name].append(w)
    finally:
        gc.enable()
    sides = {n: Samples(tuple(cpu[n]), tuple(wall[n])) for n in names}
    return Measurement(sides, load.ended())


ATTEMPTS = 3
"""How many times :func:`interleave_reliable` measures a case whose ratios stay unreliable."""


def interleave_reliable(
    fns: Mapping[str, Callable[[], Any]],
    repeats: int,
    pairs: list[tuple[str, str, float]],
    *,
    attempts: int = ATTEMPTS,
    **kwargs: Any,
) -> Measurement:
    """:func:`interleave`, measured again (up to ``attempts`` times in all) while any ratio of
    ``pairs`` (``(project, anchor, scale)`` side names) is unreliable.

    A ratio whose wall clock disagrees with its CPU time was taken while another job held the
    core; it is re-measured rather than printed. The first measurement whose ratios are all
    reliable is returned, else the last (its rows then read "unreliable"); ``attempts`` on the
    result says how many were taken.
    """
    measured = interleave(fns, repeats, **kwargs)
    for attempt in range(2, attempts + 1):
        if all(compare(measured[p], measured[a], s).reliable for p, a, s in pairs):
            break
        measured = dataclasses.replace(interleave(fns, repeats, **kwargs), attempts=attempt)
    return measured


def compare(project: Samples, anchor: Samples, scale: float = 1.0) -> Ratio:
    """``project / (anchor x scale)`` of the medians, by CPU and by wall time."""
    return Ratio(
        project.cpu_median / (anchor.cpu_median * scale),
        project.wall_median / (anchor.wall_median * scale),
    )


def target_text(target: float | None) -> str:
    """How a target ratio reads in a table (``None``: a row reported without a target)."""
    if target is None:
        return "(reported)"
    if target < 1:
        return f"<= {target:g}x ({1 / target:g}x faster)"
    return f"<= {target:g}x"


def row(
    benchmark: str,
    measured: Measurement,
    project: str,
    anchor: str,
    target: float | None,
    *,
    anchor_label: str | None = None,
    scale: float = 1.0,
) -> dict[str, Any]:
    """One table row: side ``project`` against side ``anchor`` of ``measured``.

    ``scale`` multiplies the anchor's times (an anchor timed on part of the work and scaled to
    all of it). The keys ``benchmark/run`` tabulates: benchmark, project_s and anchor_s (median
    CPU seconds), anchor (``anchor_label`` or the side's name), ratio (the CPU-time ratio, or
    ``None`` when unreliable), target, holds (``None`` without a target or when unreliable);
    and beside them project_range, anchor_range (min-max CPU seconds), cpu_ratio, wall_ratio,
    reliable, load (text) and attempts (measurements taken, see :func:`interleave_reliable`).
    """
    p, a = measured[project], measured[anchor]
    r = compare(p, a, scale)
    ok = r.reliable
    return {
        "benchmark": benchmark,
        "project_s": p.cpu_median,
        "anchor": anchor_label or anchor,
        "anchor_s": a.cpu_median * scale,
        "ratio": r.cpu if ok else None,
        "target": target_text(target),
        "holds": None if target is None or not ok else bool(r.cpu <= target),
        "project_range": p.cpu_range(),
        "anchor_range": a.cpu_range(scale),
        "cpu_ratio": r.cpu,
        "wall_ratio": r.wall,
        "reliable": ok,
        "load": measured.load.text(),
        "attempts": measured.attempts,
    }


TABLE_HEAD = (
    "| benchmark | this project (s) | anchor | anchor (s) | ratio | target | holds |\n"
    "|---|---|---|---|---|---|---|"
)
"""The head of the table :func:`markdown_row` fills."""


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown_row(r: Mapping[str, Any]) -> str:
    """One row dict as a markdown table row under :data:`TABLE_HEAD`.

    Rows made by :func:`row` show CPU seconds with their min-max, the CPU-time ratio with the
    wall-clock ratio beside it, and, when the two disagree by more than the margin, the word
    *unreliable* instead of a result. Rows of other shapes (keys benchmark ... holds) show as
    they are.
    """

    def seconds(key: str) -> str:
        text = _number(r.get(key))
        spread = r.get(key.replace("_s", "_range"))
        return f"{text} ({spread})" if text and spread else text

    if "cpu_ratio" in r:
        pair = f"CPU {r['cpu_ratio']:.3g}x, wall {r['wall_ratio']:.3g}x"
        ratio = f"{r['cpu_ratio']:.3g} (wall {r['wall_ratio']:.3g})"
        tries = int(r.get("attempts", 1))
        if not r["reliable"]:
            after = f" after {tries} measurements" if tries > 1 else ""
            ratio = f"unreliable{after}: {pair} differ by more than {MARGIN:.0%}"
        elif tries > 1:
            ratio += f", measurement {tries}"
    else:
        ratio = _number(r.get("ratio"))
    holds = r.get("holds")
    verdict = "" if holds is None else ("yes" if holds else "**no**")
    cells = [
        _number(r.get("benchmark")),
        seconds("project_s"),
        _number(r.get("anchor")),
        seconds("anchor_s"),
        ratio,
        _number(r.get("target")),
        verdict,
    ]
    return "| " + " | ".join(cells) + " |"
