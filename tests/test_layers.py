"""The layers go one way and the import graph has no cycles (import-linter contracts in
pyproject.toml): the core <- ``attncoda.hooks`` <- the CLI, with ``case_studies`` on top.

The tree is the package: ``attncoda/hooks/`` and ``attncoda/cli/`` are plain subpackages, so
import-linter (grimp) reads the graph straight from the checkout or an editable install, the same
graph Python imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_is_one_package() -> None:
    """No folder beside ``attncoda/`` is installed under its name (no ``package-dir`` mapping)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "package-dir" not in text
    assert not (ROOT / "hooks").exists()
    for sub in ("hooks", "cli"):
        assert (ROOT / "attncoda" / sub / "__init__.py").is_file()


def test_grimp_sees_hooks_and_cli_inside_attncoda() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("attncoda", cache_dir=None)
    modules = graph.modules
    assert {"attncoda.hooks", "attncoda.hooks.zoo", "attncoda.cli"} <= modules
    assert graph.find_modules_directly_imported_by("attncoda.hooks.zoo")


def test_import_contracts_hold() -> None:
    pytest.importorskip("importlinter")
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            "pyproject.toml",
            "--no-cache",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout
