"""The Figure and Axes classes of attncoda's figures: matplotlib's, shown inline by Jupyter.

Outside a Jupyter kernel attncoda builds its figures without :mod:`matplotlib.pyplot` (no GUI
backend is ever chosen), so pyplot's inline backend would never see them, and IPython has no image formatter for a Figure or
an Axes until pyplot is imported: a notebook would print ``<Axes: ...>`` and no picture. These
subclasses add ``_repr_png_`` (IPython's rich display protocol), nothing else: they are the
plain matplotlib objects in every other respect (styling, ``savefig``, pickling, ``isinstance``).

No double display: a figure pyplot manages (drawn into axes from ``plt.subplots()``, or made
in a kernel) is shown by pyplot's backend, so its ``_repr_png_`` gives None; a :class:`Figure`
of ours that a cell returns is shown by :func:`_png_once`, which lets pyplot go of it.

Imported only when a figure is drawn (it imports matplotlib).
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.axes import Axes as _MplAxes
from matplotlib.figure import Figure as _MplFigure

__all__ = ["Axes", "Figure", "inline_png"]


def inline_png(fig: Any) -> bytes | None:
    """PNG bytes of ``fig`` for a notebook (100 dpi, trimmed to what is drawn), or None when
    pyplot manages the figure: pyplot's backend shows it, and a second image would repeat it.

    Drawn in memory (no file: :func:`attncoda.save_figure` writes files).

    Examples
    --------
    >>> import attncoda as ac
    >>> inline_png(ac.plot_sink_grid(ac.testing.synthetic_rows()).figure)[:4]
    b'\\x89PNG'
    """
    if getattr(fig.canvas, "manager", None) is not None:
        return None
    buf = io.BytesIO()
    fig.canvas.print_figure(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _png_once(fig: Any) -> bytes:
    """The PNG of ``fig`` for IPython, and pyplot lets go of it: a figure returned by a cell and
    also held by pyplot would otherwise show twice (as the cell's result, then again when the
    inline backend shows every figure it holds at the cell's end)."""
    import sys

    buf = io.BytesIO()
    fig.canvas.print_figure(buf, format="png", dpi=100, bbox_inches="tight")
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and getattr(fig.canvas, "manager", None) is not None:
        plt.close(fig)  # still usable (savefig, ...), only no longer pyplot's to show
    return buf.getvalue()


def show_once_in_ipython() -> None:
    """Register :func:`_png_once` as IPython's PNG formatter of :class:`Figure` (more specific
    than the one pyplot's inline backend registers for every matplotlib Figure)."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, _png_once)


class Figure(_MplFigure):
    """A :class:`matplotlib.figure.Figure` that Jupyter shows as an image."""

    def _repr_png_(self) -> bytes | None:
        return inline_png(self)


class Axes(_MplAxes):
    """A :class:`matplotlib.axes.Axes` that Jupyter shows as the image of its figure."""

    def _repr_png_(self) -> bytes | None:
        return inline_png(self.figure)
