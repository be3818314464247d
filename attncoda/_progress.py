"""Progress bars in a Jupyter kernel without ipywidgets: ``tqdm.auto`` imported once, quietly."""

from __future__ import annotations

import sys
import warnings


def quiet_tqdm_auto() -> None:
    """Import ``tqdm.auto`` once with its TqdmWarning ('IProgress not found') silenced.

    In a Jupyter kernel without ipywidgets, the first import of ``tqdm.auto`` (by an analysis's
    progress bar, by ``ac.explore``, by transformers while it loads weights) printed that warning
    in red in the cell, though the bars only fall back to text (they still work). Importing it
    here, when ``attncoda`` is imported, makes every later import a cached one. Outside a kernel
    nothing is imported early.
    """
    if "ipykernel" not in sys.modules:  # only a kernel warns
        return
    try:
        from tqdm import TqdmWarning
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        import tqdm.auto  # noqa: F401
