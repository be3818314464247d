"""Runnable case studies composed from attncoda and attncoda.hooks (nothing imports them).

Each study is ``python -m case_studies.<name> run|table|quick`` (see :mod:`case_studies._study`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

#: The studies with the run|table|quick entry point, results/, golden/ and README tables.
STUDIES = ("conventions", "pruning", "arach", "rpa")


def run_per_model(
    command: Sequence[str], models: Sequence[str], extra: Sequence[str], out: Path
) -> int:
    """``attncoda COMMAND MODEL --out out/MODEL EXTRA --force`` for each model; the first
    non-zero status.

    The output folder is passed relative to the working directory where it can be, so that the
    command recorded in each folder's metadata reads the same on every machine. ``--force``: a
    study regenerates its own result folders (attncoda still refuses any file it did not write).
    """
    from attncoda.cli import main as attncoda_main

    for model in models:
        folder = out / model
        try:
            folder = folder.relative_to(Path.cwd())
        except ValueError:
            pass
        status = attncoda_main([*command, model, "--out", str(folder), *extra, "--force"])
        if status:
            return status
    return 0
