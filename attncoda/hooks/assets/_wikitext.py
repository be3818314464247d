"""Wikitext to plain prose: :func:`clean_wikitext` (templates, tables, markup and link syntax removed)."""

from __future__ import annotations

import html
import re

__all__ = [
    "clean_wikitext",
]


# --------------------------------------------------------------------------------------------
# Wikitext cleaning
# --------------------------------------------------------------------------------------------

_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
# elements whose content is not prose: removed with their content
_DROP_ELEMENTS = (
    "ref|references|math|chem|ce|gallery|timeline|imagemap|score|syntaxhighlight|source|"
    "hiero|graph|mapframe|maplink|templatedata|categorytree|pre|code|table|nowiki"
)
_DROP_BLOCK_RE = re.compile(rf"<({_DROP_ELEMENTS})\b[^>]*?(?<!/)>.*?</\1\s*>", re.S | re.I)
_SELF_CLOSING_RE = re.compile(rf"<({_DROP_ELEMENTS})\b[^>]*/>", re.I)
_BR_RE = re.compile(r"<br\s*/?>", re.I)
_TAG_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9]*\b[^<>]*>")
_EXT_LINK_RE = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_URL_RE = re.compile(r"\bhttps?://\S+")
_QUOTES_RE = re.compile(r"'{2,}")
_MAGIC_RE = re.compile(r"__[A-Z]+__")
_HEADING_RE = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_LINK_TOKEN_RE = re.compile(r"\[\[|\]\]")
_DROP_LINK_NS = {"file", "image", "media", "category"}
_INTERWIKI_KEEP = {
    "wikt",
    "wiktionary",
    "w",
    "wikipedia",
    "s",
    "wikisource",
    "q",
    "wikiquote",
    "b",
    "wikibooks",
    "n",
    "wikinews",
    "v",
    "wikiversity",
    "commons",
    "meta",
    "m",
    "species",
    "wikispecies",
    "voy",
    "d",
}
_LANG_CODE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*$")
_STOP_SECTIONS = {
    "see also",
    "references",
    "external links",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "footnotes",
    "citations",
    "notes and references",
    "references and notes",
    "works cited",
    "primary sources",
    "secondary sources",
    "literature",
    "selected bibliography",
    "discography",
    "filmography",
    "gallery",
}
_LIST_PREFIXES = ("*", "#", ":", ";", "|", "!", "{", "}", "----")


def _strip_balanced(text: str, open_tok: str, close_tok: str) -> str:
    """Remove (possibly nested) ``open_tok ... close_tok`` spans; stray tokens are dropped."""
    token_re = re.compile(re.escape(open_tok) + "|" + re.escape(close_tok))
    out: list[str] = []
    depth = 0
    pos = 0
    for m in token_re.finditer(text):
        if m.group() == open_tok:
            if depth == 0:
                out.append(text[pos : m.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                pos = m.end()
        else:  # stray closing token outside any span
            out.append(text[pos : m.start()])
            pos = m.end()
    if depth == 0:
        out.append(text[pos:])
    return "".join(out)


def _render_link(inner: str) -> str:
    """Display text of an internal link ``[[inner]]`` (nested links already rendered)."""
    target, pipe, label = inner.partition("|")
    visible = target.startswith(":")
    target = target.lstrip(":").strip()
    if ":" in target and not visible:
        prefix = target.split(":", 1)[0].strip().lower()
        if prefix in _DROP_LINK_NS:
            return ""
        if _LANG_CODE_RE.match(prefix) and prefix not in _INTERWIKI_KEEP:
            return ""  # interlanguage link
    if pipe:
        label = label.rsplit("|", 1)[-1].strip() if "|" in label else label.strip()
        if label:
            return label
        # pipe trick: [[Foo (bar)|]] shows "Foo"
        return re.sub(r"\s*\(.*?\)\s*$", "", target.split(":", 1)[-1])
    return target.lstrip("#")


def _resolve_links(text: str) -> str:
    stack: list[list[str]] = [[]]
    pos = 0
    for m in _LINK_TOKEN_RE.finditer(text):
        stack[-1].append(text[pos : m.start()])
        pos = m.end()
        if m.group() == "[[":
            stack.append([])
        elif len(stack) > 1:
            inner = "".join(stack.pop())
            stack[-1].append(_render_link(inner))
        # a stray "]]" is dropped
    stack[-1].append(text[pos:])
    while len(stack) > 1:  # unclosed "[[": keep the text, drop the brackets
        inner = "".join(stack.pop())
        stack[-1].append(inner)
    return "".join(stack[0])


def _tidy(paragraph: str) -> str:
    """Repair the gaps that removed markup leaves in a paragraph."""
    s = re.sub(r"\s+", " ", paragraph)
    s = re.sub(r"\(\s*[,;:.]?\s*\)", "", s)  # "()" or "( ; )" left by removed templates
    s = re.sub(r"\(\s*[,;:]\s*", "(", s)  # "(, born ..." -> "(born ..."
    s = re.sub(r"\s*[,;:]\s*\)", ")", s)
    s = re.sub(r"\(\s+", "(", s)
    s = re.sub(r"\s+\)", ")", s)
    s = re.sub(r"\s+([,.;:!?%])", r"\1", s)
    s = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", s)  # ", ," -> ","
    s = re.sub(r",\.", ".", s)
    s = re.sub(r"\s{2,}", " ", s)
    return s.strip()


def clean_wikitext(wikitext: str) -> str:
    """Turn MediaWiki markup into plain paragraphs of prose.

    Removes comments, ``<ref>`` and other non-prose elements, templates ``{{...}}`` and tables
    ``{|...|}`` (both nested), file/image/category/interlanguage links, list, indent and table
    lines, bold/italic quotes, and end sections such as "References" or "External links".
    Resolves ``[[target|label]]`` to the label and ``[url label]`` to the label. Section
    headings are kept as one-line paragraphs when their section has prose. Paragraphs are
    separated by one blank line.

    Parameters
    ----------
    wikitext
        The ``<text>`` of one revision.

    Returns
    -------
    str
        Clean text ending in a newline (empty string if nothing is left).

    Examples
    --------
    >>> clean_wikitext("'''Anarchism''' is a [[political philosophy|philosophy]].<ref>x</ref>")
    'Anarchism is a philosophy.\\n'
    """
    s = _COMMENT_RE.sub("", wikitext)
    s = _DROP_BLOCK_RE.sub(" ", s)
    s = _SELF_CLOSING_RE.sub(" ", s)
    s = _strip_balanced(s, "{{", "}}")
    s = _strip_balanced(s, "{|", "|}")
    s = _resolve_links(s)
    s = _EXT_LINK_RE.sub(lambda m: m.group(1) or "", s)
    s = _URL_RE.sub("", s)
    s = _BR_RE.sub(" ", s)
    s = _TAG_RE.sub("", s)
    s = _QUOTES_RE.sub("", s)
    s = _MAGIC_RE.sub("", s)
    s = html.unescape(s).replace("\xa0", " ").replace("\u200b", "")

    # (level, text) items; level 0 = paragraph
    items: list[tuple[int, str]] = []
    current: list[str] = []
    skip_level = 0  # > 0 while inside an end section such as "References"

    def flush() -> None:
        if current:
            para = _tidy(" ".join(current))
            if re.search(r"[A-Za-z]", para):
                items.append((0, para))
            current.clear()

    for raw in s.split("\n"):
        line = raw.strip()
        heading = _HEADING_RE.match(line)
        if heading:
            flush()
            level = len(heading.group(1))
            title = _tidy(heading.group(2))
            if skip_level and level > skip_level:
                continue
            skip_level = level if title.lower() in _STOP_SECTIONS else 0
            if not skip_level and title:
                items.append((level, title))
            continue
        if skip_level:
            continue
        if not line or line.startswith(_LIST_PREFIXES):
            flush()
            continue
        current.append(line)
    flush()

    # keep a heading only if some paragraph follows before the next heading of its level or above
    kept: list[str] = []
    for i, (level, text) in enumerate(items):
        if level == 0:
            kept.append(text)
            continue
        for later_level, _ in items[i + 1 :]:
            if later_level == 0:
                kept.append(text)
                break
            if later_level <= level:
                break
    return "\n\n".join(kept) + "\n" if kept else ""
