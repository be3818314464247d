"""The layers go one way and the import graph has no cycles (import-linter contracts in
pyproject.toml): the core <- ``attncoda.hooks`` <- the CLI, with ``case_studies`` on top.

grimp, under import-linter, finds a package by walking its folder, so on an editable install it
would see ``attncoda/`` without ``attncoda.hooks`` (installed from ``hooks/``). The check runs on
a copy of the sources laid out as pip installs them: ``hooks/`` inside ``attncoda/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SOURCES = shutil.ignore_patterns("__pycache__", "*.pyc", "results", "golden", "out", "*.md")


def installed_layout(dest: Path) -> Path:
    """Copy the packages into ``dest`` the way pip installs them; return ``dest``."""
    shutil.copytree(ROOT / "attncoda", dest / "attncoda", ignore=_SOURCES)
    shutil.copytree(ROOT / "hooks", dest / "attncoda" / "hooks", ignore=_SOURCES)
    shutil.copytree(ROOT / "case_studies", dest / "case_studies", ignore=_SOURCES)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint_imports(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            "pyproject.toml",
            "--no-cache",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_copy_is_what_python_imports(tmp_path: Path) -> None:
    folder = installed_layout(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(folder)}
    res = subprocess.run(
        [sys.executable, "-c", "import attncoda.hooks.zoo as z; print(z.__file__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(folder)), res.stdout


def test_import_contracts_hold(tmp_path: Path) -> None:
    pytest.importorskip("importlinter")
    res = lint_imports(installed_layout(tmp_path))
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout
