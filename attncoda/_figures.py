"""The Figure and Axes classes of attncoda's figures: matplotlib's, shown inline by Jupyter.

attncoda builds its figures without :mod:`matplotlib.pyplot` (no GUI backend is ever chosen),
so pyplot's inline backend never sees them, and IPython has no image formatter for a Figure or
an Axes until pyplot is imported: a notebook would print ``<Axes: ...>`` and no picture. These
subclasses add ``_repr_png_`` (IPython's rich display protocol), nothing else: they are the
plain matplotlib objects in every other respect (styling, ``savefig``, pickling, ``isinstance``).

No double display: a figure pyplot manages (drawn into axes from ``plt.subplots()``) is shown
by pyplot's backend, so its ``_repr_png_`` gives None; once pyplot is imported, IPython's own
Figure formatter (which takes precedence over ``_repr_png_``) shows a returned Figure once.

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


class Figure(_MplFigure):
    """A :class:`matplotlib.figure.Figure` that Jupyter shows as an image."""

    def _repr_png_(self) -> bytes | None:
        return inline_png(self)


class Axes(_MplAxes):
    """A :class:`matplotlib.axes.Axes` that Jupyter shows as the image of its figure."""

    def _repr_png_(self) -> bytes | None:
        return inline_png(self.figure)
