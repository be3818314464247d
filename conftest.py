"""Doctests of ``hooks/`` run in the ordinary pytest collection, as ``attncoda.hooks`` modules.

``hooks/`` is installed as ``attncoda.hooks``. pytest's doctest plugin would import
``hooks/zoo.py`` by its path, as a second module ``hooks.zoo`` beside ``attncoda.hooks.zoo``
(with its own registry of attention functions and plug-ins). Here every doctest module under
``hooks/`` is collected from the installed module instead: same items, one copy of the code.

Docstring examples write where a user would, ``tempfile.mkdtemp()``; while one runs, that is a
folder of pytest's own temporary tree, so the suite leaves nothing behind in the system's.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem, DoctestModule

HOOKS = Path(__file__).resolve().parent / "hooks"


class _HooksDoctestModule(DoctestModule):
    """Doctests of one ``hooks/`` file, read from the ``attncoda.hooks`` module it installs as."""

    def _getobj(self) -> Any:
        stem = self.path.stem
        name = "attncoda.hooks" if stem == "__init__" else f"attncoda.hooks.{stem}"
        return importlib.import_module(name)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: Any) -> Any:
    collected = yield
    if file_path.suffix != ".py" or file_path.parent != HOOKS:
        return collected
    return [
        _HooksDoctestModule.from_parent(parent, path=file_path)
        if type(item) is DoctestModule
        else item
        for item in collected
    ]


@pytest.fixture(autouse=True)
def _doctest_temporary_files_under_pytest(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("doctest")))
