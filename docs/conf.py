"""Sphinx configuration of the attncoda documentation.

Build (the CI build treats warnings as errors and executes the gallery)::

    pip install -e ".[docs]"
    sphinx-build -W -b html docs docs/_build/html

Narrative pages are Markdown (MyST), the API reference comes from the numpydoc-style docstrings
(napoleon), and ``docs/examples/plot_*.py`` are executed by sphinx-gallery on every build: an
example that raises fails the build.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

HERE = Path(__file__).resolve().parent
#: The repository root: case-study pages include the studies' README files from there. A build
#: from a copy of docs/ sets ATTNCODA_REPO.
REPO = Path(os.environ.get("ATTNCODA_REPO") or HERE.parent).resolve()
sys.path.insert(0, str(REPO))  # case_studies is importable from the repository root
sys.path.insert(0, str(HERE / "_ext"))  # the gallery's image scraper, MathML, api-names

import attncoda  # noqa: E402

project = "attncoda"
author = "attncoda developers"
copyright = "attncoda developers, Apache-2.0"
release = attncoda.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "attncoda_mathml",  # maths as MathML at build time: no MathJax, no CDN, no script
    "attncoda_api",  # the API pages' ``api-names`` tables
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_ext",
    "_intersphinx",
    "examples/GALLERY_HEADER.rst",
    "sg_execution_times.rst",  # left by older sphinx-gallery runs: they load CDN scripts
    "**/sg_execution_times.rst",
    "Thumbs.db",
    ".DS_Store",
]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 6  # included READMEs are shifted two levels down

autodoc_member_order = "bysource"
# Entries show short names (each API page is one module and says which): the figure methods of
# ``ds.coda.plot`` do not parade the private module that defines them.
add_module_names = False
autodoc_typehints = "none"  # signatures show the annotations; types are in the docstrings
autodoc_default_options = {"show-inheritance": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
napoleon_preprocess_types = True  # "numpy.ndarray", "xarray.DataArray" in docstrings link out

# The tables of the API pages link to the entries on the same page: no stub pages.
autosummary_generate = False

# Offline inventories (the build has no network): docs/_intersphinx/make_inventories.py writes
# them from the installed packages with each project's documented URL layout.
sys.path.insert(0, str(HERE / "_intersphinx"))
from make_inventories import BASES  # noqa: E402

intersphinx_mapping = {
    name: (url, str(HERE / "_intersphinx" / f"{name}.inv")) for name, url in BASES.items()
}
intersphinx_disabled_reftypes = ["std:doc"]
intersphinx_timeout = 1

html_theme = "alabaster"
html_title = f"attncoda {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Attention rows as compositional data",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "230px",
}

sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    # attncoda draws without pyplot: its figures are scraped from the examples' namespaces
    "image_scrapers": ("matplotlib", "attncoda_gallery.scrape"),
    "reset_modules": ("matplotlib",),
    "plot_gallery": "True",
    # the computation-times page loads jQuery, DataTables and Bootstrap from CDNs
    "write_computation_times": False,
}

# --------------------------------------------------------------------------------------------
# `{{ include: PATH }}` in a page inserts a Markdown file of the repository (headings shifted
# down by ``shift`` levels); a missing file becomes a note that says how to produce it.

_INCLUDE = re.compile(r"\{\{\s*include:\s*(\S+?)(?:\s+shift=(\d))?\s*\}\}")
_IMAGE = re.compile(r"!\[([^\]]*)\]\((?!https?:)([^)\s]+)\)")


_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?!https?:|#)([^)\s]+)\)")


def _shift_headings(text: str, shift: int) -> str:
    out, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None and re.match(r"#{1,5} ", line):
            line = "#" * shift + line
        out.append(line)
    return "\n".join(out)


def _include(match: re.Match[str], docname: str) -> str:
    rel, shift = match.group(1), int(match.group(2) or 1)
    path = REPO / rel
    if not path.is_file():
        return (
            f"```{{note}}\n`{rel}` is not in this checkout yet: it is written when the study "
            "is run (see the command above).\n```\n"
        )
    text = path.read_text(encoding="utf-8")
    # a figure's path is relative to the included file: make it relative to the including page
    # (Sphinx copies it into the build); a missing figure is a build warning, so an error
    page_dir = (HERE / docname).parent

    def figure(m: re.Match[str]) -> str:
        target = os.path.relpath(path.parent / m.group(2), page_dir)
        return f"![{m.group(1)}]({Path(target).as_posix()})"

    text = _IMAGE.sub(figure, text)
    text = _LINK.sub(lambda m: f"{m.group(1)} (`{m.group(2)}`)", text)  # repo-relative links
    return "\n" + _shift_headings(text, shift) + "\n"


def _source_read(app, docname, source):  # type: ignore[no-untyped-def]
    source[0] = _INCLUDE.sub(lambda m: _include(m, docname), source[0])


# --------------------------------------------------------------------------------------------
# ``.. attncoda-help::`` renders ``attncoda [COMMAND] --help`` for every subcommand, so the
# command reference cannot drift from the parser.


def _help_directive():  # type: ignore[no-untyped-def]
    import argparse

    from docutils import nodes
    from docutils.parsers.rst import Directive

    from attncoda.cli import build_parser

    class AttncodaHelp(Directive):
        has_content = False

        def run(self):  # type: ignore[no-untyped-def]
            os.environ["COLUMNS"] = "96"
            out = []

            def walk(parser, words):  # type: ignore[no-untyped-def]
                title = " ".join(["attncoda", *words])
                rubric = nodes.rubric(text=title)
                rubric["ids"] = [nodes.make_id("cli-" + "-".join(words or ["attncoda"]))]
                out.append(rubric)
                out.append(nodes.literal_block(text=parser.format_help()))
                for action in parser._actions:
                    if isinstance(action, argparse._SubParsersAction):
                        for name, sub in action.choices.items():
                            walk(sub, [*words, name])

            walk(build_parser(), [])
            return out

    return AttncodaHelp


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _source_read)
    app.add_directive("attncoda-help", _help_directive())
