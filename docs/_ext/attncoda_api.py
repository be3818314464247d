"""``.. api-names:: MODULE``: an autosummary table of public names, then each name's entry.

The API pages list names once, here or in the module's ``__all__``, and never twice::

    .. api-names:: attncoda.hooks.gates

    .. api-names:: attncoda
       :title: Transforms

       closure
       clr

With no content the names are the module's ``__all__`` (every public name of the module, so a
name added to ``__all__`` appears in the docs without editing a page); with content, the listed
names. Each name becomes ``autofunction``, ``autoclass`` (with its documented members),
``autoexception`` or ``autodata`` by what the object is. Data show their value when it is short.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: Longest value repr shown for a data entry; longer ones show no value.
SHORT_VALUE = 70


def public_names(module: str) -> list[str]:
    """The module's ``__all__`` without dunder names (``__version__``)."""
    mod = importlib.import_module(module)
    return [n for n in getattr(mod, "__all__", ()) if not n.startswith("__")]


def entry(module: str, name: str) -> list[str]:
    """The autodoc directive (reST lines) of ``module.name`` chosen by the object's kind."""
    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return [f".. autoexception:: {name}", "   :members:", ""]
    if inspect.isclass(obj):
        return [f".. autoclass:: {name}", "   :members:", ""]
    if callable(obj):
        return [f".. autofunction:: {name}", ""]
    if len(repr(obj)) <= SHORT_VALUE:
        return [f".. autodata:: {name}", ""]
    return [f".. autodata:: {name}", "   :no-value:", ""]


_RELATIVE_DOC = re.compile(r":doc:`(?![/~])([^`<]+?)`|:doc:`([^`<]*?)<(?!/)([^`>]+)>`")


def absolute_doc_links(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]):  # type: ignore[no-untyped-def]
    """Docstrings name pages from the docs root (``:doc:`gotchas```); the API pages live one
    level down (``api/``), so a relative name would miss: make each one absolute."""

    def fix(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f":doc:`/{m.group(1)}`"
        return f":doc:`{m.group(2)}</{m.group(3)}>`"

    lines[:] = [_RELATIVE_DOC.sub(fix, line) for line in lines]


def join_see_also(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]):  # type: ignore[no-untyped-def]
    """Put each See Also entry on one line before napoleon reads it.

    Napoleon takes any line of a See Also section that starts with a word and a colon for a new
    entry, even an indented continuation line (``    accepts: captures are ...``), and links the
    word as a name. Numpydoc's rule is the indentation: an indented line continues the entry
    above it, so each such line is joined to its entry here.
    """
    lines[:] = see_also_joined(lines)


def see_also_joined(lines: list[str]) -> list[str]:
    """``lines`` with each See Also entry's indented continuation lines joined to the entry."""
    out: list[str] = []
    section = None
    for i, line in enumerate(lines):
        if line.strip() and i + 1 < len(lines) and _RULE.fullmatch(lines[i + 1].strip()):
            section = line.strip()  # a numpydoc section header (its underline follows)
        elif (
            section == "See Also"
            and line[:1].isspace()
            and line.strip()
            and out
            and out[-1].strip()
            and not _RULE.fullmatch(out[-1].strip())
        ):
            out[-1] = f"{out[-1].rstrip()} {line.strip()}"
            continue
        out.append(line)
    return out


_RULE = re.compile(r"-{3,}")
_CODE_NAME = re.compile(r"^(ac|attncoda)((?:\.\w+)+)(\(.*\))?$")


def resolve_name(text: str) -> str | None:
    """The full name of a public attncoda object that inline code names (``ac.clr``,
    ``attncoda.hooks.capture(...)``, ``ac.testing.synthetic_rows()``), else None."""
    m = _CODE_NAME.match(text.strip())
    if m is None:
        return None
    parts = ["attncoda", *m.group(2).lstrip(".").split(".")]
    if any(part.startswith("_") for part in parts):
        return None
    for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return None
            obj = getattr(obj, attr)
        return ".".join(parts)
    return None


def link_inline_code(app: Sphinx, doctree: nodes.document) -> None:
    """Inline code that names a public object (```ac.decompose```) links to its API entry, as
    the ``{func}`` role would; code naming nothing public stays plain. Names that no API page
    documents are left as they are (no warning)."""
    for literal in list(doctree.findall(nodes.literal)):
        if isinstance(literal.parent, (addnodes.pending_xref, nodes.reference)):
            continue
        target = resolve_name(literal.astext())
        if target is None:
            continue
        xref = addnodes.pending_xref(
            "",
            refdomain="py",
            reftype="obj",
            reftarget=target,
            refexplicit=True,
            refwarn=False,
            refdoc=app.env.docname,
        )
        literal.replace_self(xref)
        xref += literal


class ApiNames(SphinxDirective):
    required_arguments = 1
    has_content = True

    def run(self) -> list[nodes.Node]:
        module = self.arguments[0]
        names = [line.strip() for line in self.content if line.strip()] or public_names(module)
        if not names:
            raise self.error(f"{module} has no __all__ and no names were listed")
        missing = [n for n in names if not hasattr(importlib.import_module(module), n)]
        if missing:
            raise self.error(f"{module} has no {', '.join(missing)}")
        lines = [f".. currentmodule:: {module}", "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   {n}" for n in names] + [""]
        for n in names:
            lines += entry(module, n)
        node = nodes.container()
        nested_parse_with_titles(
            self.state, StringList(lines, source=f"<api-names {module}>"), node
        )
        return node.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("api-names", ApiNames)
    app.connect("autodoc-process-docstring", join_see_also, priority=100)  # before napoleon
    app.connect("autodoc-process-docstring", absolute_doc_links)
    app.connect("doctree-read", link_inline_code)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
