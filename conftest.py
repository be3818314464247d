"""Docstring examples write where a user would, ``tempfile.mkdtemp()``; while one runs, that is a
folder of pytest's own temporary tree, so the suite leaves nothing behind in the system's.

Under pytest-xdist (``-n auto`` in pyproject.toml) each worker, and every process a test starts,
gets its share of the cores for its thread pools (``OMP_NUM_THREADS``, read when torch is first
imported, which is after this file): two workers with two threads each on two cores spend their
time waiting on each other. A value already in the environment is kept.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time

import pytest
from _pytest.doctest import DoctestItem

#: ``ATTNCODA_TEST_CPU=FOLDER`` records each test's CPU seconds (this process's, plus the
#: processes it started and waited for) in FOLDER/<worker>.tsv: the suite's budget is CPU time,
#: as wall time on a shared machine says little (CONTRIBUTING.md, "Commands").
_CPU_LOG = os.environ.get("ATTNCODA_TEST_CPU")

#: numpy asks the kernel for huge pages for every array of 4 MB or more; a kernel that compacts
#: memory to find them (``defrag`` = ``madvise``, as on the 2-core CI machine) spends seconds of
#: system time on the suite's large temporaries: Gemma-3's capture test took 8.8 s of it, 3.6 s
#: without. Set here, before the pytest-xdist workers and the tests' processes start (they read
#: it when they import numpy); the numbers do not change. A value already set is kept.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, _THREADS)


@pytest.fixture(autouse=True)
def _doctest_temporary_files_under_pytest(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("doctest")))


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
        start, began = _cpu_seconds(), time.time()
        yield
        cpu, ended = _cpu_seconds() - start, time.time()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        os.makedirs(_CPU_LOG, exist_ok=True)
        with open(os.path.join(_CPU_LOG, f"{worker}.tsv"), "a", encoding="utf-8") as log:
            log.write(f"{cpu:.3f}\t{began:.3f}\t{ended:.3f}\t{item.nodeid}\n")
