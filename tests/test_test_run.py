"""The test run's own machinery: what keeps the README's test command within its time.

Tests that share an expensive fixture (a study's quick mode, a loaded real model) carry one
``xdist_group`` so that pytest-xdist (``--dist loadgroup``) runs them on one worker, which builds
the fixture once. Nothing fails when that grouping silently stops (pytest 9.2 with
pytest-xdist 3.8 did: pytest-dev/pytest-xdist#1386); the run just does the work twice. This
checks it in a small pytest session of its own, under the same options as ours.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")


@pytest.mark.slow  # a pytest-xdist session of its own: 6.4 CPU-s (6 December 2026)
def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    seen = tmp_path / "seen"
    seen.mkdir()
    body = f"""
        import os
        from pathlib import Path

        import pytest

        SEEN = Path({str(seen)!r})


        def _mark(name):
            (SEEN / name).write_text(os.environ.get("PYTEST_XDIST_WORKER", "main"))


        @pytest.mark.xdist_group("shared")
        @pytest.mark.parametrize("i", range(6))
        def test_grouped_by_a_function_mark(i):
            _mark(f"function-{{i}}")


        @pytest.mark.parametrize(
            "i", [pytest.param(i, marks=pytest.mark.xdist_group("shared")) for i in range(6)]
        )
        def test_grouped_by_a_parameter_mark(i):
            _mark(f"parameter-{{i}}")


        @pytest.mark.parametrize("i", range(12))
        def test_free(i):
            pass
        """
    (tmp_path / "test_groups.py").write_text(textwrap.dedent(body), encoding="utf-8")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2"]
    cmd += ["--dist", "loadgroup", "--no-loadscope-reorder", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    workers = {p.name: p.read_text() for p in seen.iterdir()}
    assert len(workers) == 12
    assert len(set(workers.values())) == 1, (
        f"one xdist_group ran on several workers: {workers}; with pytest-xdist's loadgroup "
        "broken, every shared fixture (study quick modes) is built once per worker"
    )
