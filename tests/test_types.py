"""mypy over the package (``[tool.mypy]`` in ``pyproject.toml``), as one test of the run.

Under pytest-xdist it takes one core beside the other tests instead of running before all of them
in the README's test command: ~26 CPU-s on a cold cache (a clean clone), 2 s on a warm one. Marked
``slow``, so the inner loop leaves it out; ``mypy`` alone runs the same check.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_finds_no_type_errors() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]
    assert res.stdout.startswith("Success: no issues found"), res.stdout[-2000:]
