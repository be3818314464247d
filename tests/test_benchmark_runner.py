"""``benchmarks/run``'s header names the CPU its table was measured on."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run"


def _runner():
    loader = importlib.machinery.SourceFileLoader("benchmarks_run", str(RUN))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_header_names_the_cpu_model_and_its_widest_vector_extension() -> None:
    cpu = _runner()._cpu
    machine = platform.machine()
    avx512 = "processor\t: 0\nmodel name\t: AMD EPYC 9005\nflags\t\t: fpu sse4_2 avx avx2 avx512f\n"
    assert cpu(avx512) == f"{machine}, AMD EPYC 9005, AVX-512"
    assert (
        cpu("model name : Old Xeon\nflags : fpu sse4_2 avx avx2\n") == f"{machine}, Old Xeon, AVX2"
    )
    assert cpu("flags : neon\n") == machine  # an Arm machine: no model line, no x86 extension
    assert cpu().startswith(machine)  # this machine's own /proc/cpuinfo (or none)
