"""mypy over the package (``[tool.mypy]`` in ``pyproject.toml``), as one test of the run.

Under pytest-xdist it takes one core beside the other tests instead of running before all of them
in the README's test command: ~26 CPU-s on a cold cache, 2 s on a warm one. Its cache lives in the
user's cache folder (``$XDG_CACHE_HOME/attncoda-tests/mypy``, beside the offline assets' cache),
not in the checkout, so a clean clone on a machine that ran the tests before starts warm (mypy
checks each cached module against its source's hash). Marked ``slow``, so the inner loop leaves
it out; ``mypy`` alone runs the same check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mypy_cache() -> Path | None:
    """A writable mypy cache folder in the user's cache, or None (mypy's own default)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "attncoda-tests" / f"mypy-py{sys.version_info[0]}.{sys.version_info[1]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None


@pytest.mark.slow
def test_mypy_finds_no_type_errors() -> None:
    cache = _mypy_cache()
    res = subprocess.run(
        [sys.executable, "-m", "mypy", *(["--cache-dir", str(cache)] if cache else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]
    assert res.stdout.startswith("Success: no issues found"), res.stdout[-2000:]
