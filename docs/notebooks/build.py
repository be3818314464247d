"""Write ``first-look.ipynb``: the README's Use block and the getting-started code, cell by cell,
then every figure, the accessors' lists and the head view.

Run ``python docs/notebooks/build.py`` after changing the README's Use block or the Python block
of ``docs/getting-started.md``; ``tests/test_notebook.py`` fails while the committed notebook
differs from what this writes, and executes it in a real Jupyter kernel (``-m real``: SmolLM2),
and the same figure cells after a tiny twin's capture (every run).

The notebook is stored without outputs. Code blocks are cut into cells at blank lines. A cell
meant to show something (the docs' cells ending in a ``.plot.`` expression, and the cells of
``FIGURES``) says what in its ``attncoda.shows`` metadata (``image``: a PNG or SVG figure;
``html``: a rich HTML view, list or table), and the test checks the kernel's output for it.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = Path(__file__).with_name("first-look.ipynb")

#: the cells after the README's Use block: what a notebook user looks at. Each is (kind, source):
#: kind "markdown", or what a code cell shows ("image", "html"; None: nothing)
FIGURES: list[tuple[str | None, str]] = [
    ("markdown", "## What `ds.coda` and `ds.coda.plot` offer\n\nEach lists its methods."),
    ("html", "ds.coda"),
    ("html", "ds.coda.plot"),
    ("markdown", "## Results as tables\n\nA layer x head result of a capture, as pandas shows it."),
    ("html", "ds.coda.head_profiles().sink_share.round(2).to_pandas()"),
    ("markdown", "## Every figure\n\nEach shows itself, with no `%matplotlib` line."),
    ("image", "ds.coda.plot.sink_grid()"),
    ("image", "ds.coda.plot.sink_vs_content()"),
    ("image", 'ds.coda.attribute_entropy(along="layer").coda.plot.entropy_attribution()'),
    (
        "image",
        "rows = cap.dataset  # the rows of the README's second capture\nrows.coda.plot.rows()",
    ),
    ("image", 'rows.coda.cluster_heads("js", ks=(2,)).coda.plot.dendrograms()'),
    ("image", 'rows.coda.flip_rates(["cosine", "js"], n_boot=0).coda.plot.flip_table()'),
    ("markdown", "## The head view\n\nOne head token by token; hover a cell."),
    ("html", "view"),
    (
        "markdown",
        "## The explorer\n\nEvery captured layer x head of the rows: click a thumbnail, switch "
        "kept / dropped / split, hover a cell.",
    ),
    ("html", "rows.coda.explore()"),
]

FENCE = re.compile(r"^```python\s*\n(.*?)^```", re.M | re.S)


def readme_use_block() -> str:
    """The Python block of the README's section "Use"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return _only_block(section, "README.md, section Use")


def getting_started_block() -> str:
    """The Python block of ``docs/getting-started.md`` (section "From Python")."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    return _only_block(section, "docs/getting-started.md, section From Python")


def _only_block(section: str, where: str) -> str:
    blocks = FENCE.findall(section)
    if len(blocks) != 1:
        raise SystemExit(f"{where}: expected one ```python block, found {len(blocks)}")
    return str(blocks[0])


def split_cells(code: str) -> list[str]:
    """``code`` cut at blank lines, except inside a bracket or before an indented line."""
    lines = code.splitlines()
    cells: list[str] = []
    current: list[str] = []
    for i, line in enumerate(lines):
        if line.strip():
            current.append(line)
            continue
        after = next((n for n in lines[i + 1 :] if n.strip()), "")
        if current and _complete("\n".join(current)) and not after.startswith((" ", "\t")):
            cells.append("\n".join(current))
            current = []
        elif current:
            current.append(line)
    if current:
        cells.append("\n".join(current))
    return cells


def _complete(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def shows_something(code: str) -> bool:
    """Whether a cell's last statement is an expression Jupyter displays (not ``print(...)``)."""
    body = ast.parse(code).body
    if not body or not isinstance(body[-1], ast.Expr):
        return False
    value = body[-1].value
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "print"
    )


def code_cell(source: str, shows: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"attncoda": {"shows": shows}} if shows else {}
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": meta,
        "outputs": [],
        "source": source,
    }


def markdown_cell(source: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def _shows_of(code: str) -> str | None:
    """What a docs cell shows: a figure when its last statement is a ``.plot.`` expression."""
    if not shows_something(code):
        return None
    last = ast.get_source_segment(code, ast.parse(code).body[-1]) or ""
    return "image" if ".plot." in last else None


def figure_cells() -> list[dict[str, Any]]:
    """The cells after the README's Use block (they use its ``ds``, ``cap`` and ``view``)."""
    return [
        markdown_cell(src) if kind == "markdown" else code_cell(src, kind) for kind, src in FIGURES
    ]


def notebook() -> dict[str, Any]:
    """The notebook: the README's Use block, the figures, then getting-started's code."""
    return wrap(
        [
            markdown_cell(
                "# A first look at attention with attncoda\n\n"
                "The README's *Use* block and the getting-started page's code, cell by cell, "
                "then every figure. Written by `docs/notebooks/build.py` from `README.md` and "
                "`docs/getting-started.md`: edit those, then run it. Needs "
                "`attncoda fetch smollm2-135m austen`."
            ),
            markdown_cell("## The README's *Use* block"),
            *(code_cell(c, _shows_of(c)) for c in split_cells(readme_use_block())),
            *figure_cells(),
            markdown_cell("## Getting started, *From Python*"),
            *(code_cell(c, _shows_of(c)) for c in split_cells(getting_started_block())),
        ]
    )


def wrap(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """A notebook (nbformat 4) of ``cells`` for the ``python3`` kernel."""
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def dumps(nb: dict[str, Any]) -> str:
    """The notebook as stored (cell ids numbered, one JSON layout)."""
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"cell-{i:02d}"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    NOTEBOOK.write_text(dumps(notebook()), encoding="utf-8")
    print(f"wrote {NOTEBOOK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
