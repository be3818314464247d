"""Sphinx math renderer that writes MathML at build time, so the maths of the docs needs no script
and no network (MathJax would come from a CDN).

Every ``$...$``, ``$$...$$`` (MyST) and ``:math:`` / ``.. math::`` (docstrings) is converted by
``latex2mathml``; browsers render MathML natively (Chromium >= 109, Firefox, Safari). A formula
the converter cannot read fails the build (the docs build with ``-W``) instead of showing raw
LaTeX.

Enable with ``extensions = [..., "attncoda_mathml"]``; it registers itself as
``html_math_renderer``.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.application import Sphinx
from sphinx.locale import _
from sphinx.util import logging
from sphinx.util.math import get_node_equation_number

logger = logging.getLogger(__name__)

# latex2mathml lays out ``align*`` as a table of aligned columns but reads ``aligned`` and
# ``gather`` as plain text (a literal "&"); ``align`` would add its own equation numbers.
_ALIGN = re.compile(r"\\(begin|end)\{(?:align|aligned|alignat)\*?\}")
_UNKNOWN = re.compile(r">(\\[A-Za-z]+)<")
_PLAIN = re.compile(r"\\(?:begin|end)\{(?:equation|gather|gathered)\*?\}")


def to_mathml(latex: str, display: bool) -> str:
    """MathML of one formula (``display`` for a block).

    Raises
    ------
    ValueError
        When the converter cannot read ``latex``.
    """
    body = _PLAIN.sub("", _ALIGN.sub(lambda m: rf"\{m.group(1)}{{align*}}", latex.strip()))
    try:
        mathml = convert(body, display="block" if display else "inline")
    except Exception as exc:  # the converter raises many types; all mean "cannot read"
        raise ValueError(f"cannot convert to MathML: {latex!r} ({exc})") from exc
    unknown = _UNKNOWN.findall(mathml)
    if unknown:  # the converter passes a command it does not know through as text
        raise ValueError(f"cannot convert to MathML: {latex!r} (unknown {', '.join(unknown)})")
    return mathml


def _convert_or_warn(self: Any, node: nodes.Element, display: bool) -> str:
    try:
        return to_mathml(node.astext(), display)
    except ValueError as exc:
        logger.warning(str(exc), location=node)
        return f"<code>{self.encode(node.astext())}</code>"


def visit_math(self: Any, node: nodes.Element) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS="math notranslate nohighlight"))
    self.body.append(_convert_or_warn(self, node, display=False))
    self.body.append("</span>")
    raise nodes.SkipNode


def visit_displaymath(self: Any, node: nodes.Element) -> None:
    self.body.append(self.starttag(node, "div", CLASS="math notranslate nohighlight"))
    if node.get("number"):
        number = get_node_equation_number(self, node)
        self.body.append(f'<span class="eqno">({number})')
        self.add_permalink_ref(node, _("Link to this equation"))
        self.body.append("</span>")
    self.body.append(_convert_or_warn(self, node, display=True))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_html_math_renderer(
        "mathml", inline_renderers=(visit_math, None), block_renderers=(visit_displaymath, None)
    )
    app.config.html_math_renderer = "mathml"
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
