"""Docstring examples write where a user would, ``tempfile.mkdtemp()``; while one runs, that is a
folder of pytest's own temporary tree, so the suite leaves nothing behind in the system's.
"""

from __future__ import annotations

import tempfile

import pytest
from _pytest.doctest import DoctestItem


@pytest.fixture(autouse=True)
def _doctest_temporary_files_under_pytest(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if isinstance(request.node, DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("doctest")))
