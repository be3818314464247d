"""A sphinx-gallery image scraper for attncoda's figures.

attncoda draws figures without :mod:`matplotlib.pyplot` (so no GUI backend is ever chosen), which
sphinx-gallery's matplotlib scraper cannot see. This scraper embeds every
:class:`matplotlib.figure.Figure` that a code block of an example left in its namespace (directly,
or as the figure of an :class:`matplotlib.axes.Axes`, which single-panel plots return) and that
was not embedded before, in the order the variables were bound.
"""

from __future__ import annotations

from typing import Any

_seen: list[Any] = []  # figures already embedded (kept alive so ids are never reused)


def scrape(block: Any, block_vars: dict[str, Any], gallery_conf: dict[str, Any]) -> str:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from sphinx_gallery.scrapers import figure_rst

    namespace = block_vars["example_globals"]
    new: list[Any] = []
    for value in list(namespace.values()):
        fig = value.figure if isinstance(value, Axes) else value
        if isinstance(fig, Figure) and not any(fig is s for s in [*_seen, *new]):
            new.append(fig)
    paths = []
    for fig, path in zip(new, block_vars["image_path_iterator"], strict=False):
        fig.savefig(path, dpi=96)
        paths.append(path)
        _seen.append(fig)
    return figure_rst(paths, gallery_conf["src_dir"])
