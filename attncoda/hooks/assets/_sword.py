"""A reader of SWORD zText Bible modules (the ``.bzs``/``.bzv``/``.bzz`` files) and their OSIS markup."""

from __future__ import annotations

import html
import re
import struct
import zlib
from collections.abc import Mapping, Sequence

from ._errors import AssetBuildError


def _read_ztext(bzs: bytes, bzv: bytes, bzz: bytes, label: str) -> list[str]:
    """The raw OSIS of every non-empty verse slot of one SWORD zText testament, in slot order.

    ``.bzs`` holds one little-endian record per zlib block (offset into ``.bzz``, compressed
    size, uncompressed size: three uint32); ``.bzv`` one per versification slot (block uint32,
    offset uint32, size uint16, into the decompressed block). Zero-size slots are empty; a slot
    that repeats an earlier slot's record (a linked verse) is read once. Slot order is the
    versification's order, as SWORD front-ends show it; a block may also hold superseded copies
    of a slot's text that no slot points to (the module's writer rewrites a slot when it appends
    a verse the versification lacks, e.g. Romans 14:24-26), and they are not read.

    A size over 65,535 bytes wraps around in its uint16 (Greek Daniel, which osis2mod put whole
    into one slot): a slot's size is taken as the largest that is congruent modulo 65,536 to the
    recorded one and does not run into the next slot of its block.
    """
    if len(bzs) % 12 or len(bzv) % 10:
        raise AssetBuildError(f"{label}: .bzs/.bzv sizes are not whole records")
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)]
    records = [struct.unpack_from("<IIH", bzv, i) for i in range(0, len(bzv), 10)]
    starts: dict[int, list[int]] = {}
    for slot, (block, offset, size) in enumerate(records):
        if not size:
            continue
        if block >= len(blocks) or offset + size > blocks[block][2]:
            raise AssetBuildError(f"{label}: verse slot {slot} falls outside its block")
        starts.setdefault(block, []).append(offset)
    texts: dict[int, bytes] = {}
    seen: set[tuple[int, int, int]] = set()
    out: list[str] = []
    for block, offset, size in records:
        if not size or (block, offset, size) in seen:
            continue
        seen.add((block, offset, size))
        if block not in texts:
            start, length, expected = blocks[block]
            try:
                texts[block] = zlib.decompress(bzz[start : start + length])
            except zlib.error as err:
                raise AssetBuildError(
                    f"{label}: block {block} does not decompress: {err}"
                ) from None
            if len(texts[block]) != expected:
                raise AssetBuildError(f"{label}: block {block} has the wrong uncompressed size")
        limit = min((o for o in starts[block] if o > offset), default=len(texts[block]))
        size += (limit - offset - size) // 65536 * 65536
        out.append(texts[block][offset : offset + size].decode("utf-8"))
    return out


# OSIS elements dropped with their content: footnotes and cross-references (``note``, which holds
# ``rdg``/``catchWord``/``reference``), and headings (``title``: book and section headings and the
# psalm superscriptions). A note becomes a space: it can sit between two words (Genesis 1:1).
_OSIS_DROP = re.compile(r"<note\b[^>]*>.*?</note>|<title\b[^>]*>.*?</title>", re.S)
# the start of a book, the preface or the glossary, and of a chapter (it names its book)
_OSIS_BOOK = re.compile(
    r'<div\b(?=[^>]*\bsID=)(?=[^>]*\btype="(book|front|glossary)")(?:(?=[^>]*\bosisID="([^"]+)"))?'
    r'[^>]*>|<chapter\b(?=[^>]*\bsID=)[^>]*\bosisID="([^".]+)\.[^"]*"[^>]*>'
)
# paragraph starts and line breaks in poetry (``l`` ends); chapters also start a paragraph
_OSIS_PARA = re.compile(r'<div\b(?=[^>]*\bsID=)[^>]*\btype="x-p"[^>]*>|<lb\b[^>]*type="x-p"[^>]*>')
_OSIS_LINE = re.compile(r"</l>|<l\b[^>]*\beID=[^>]*>|<item\b[^>]*>")
_OSIS_TAG = re.compile(r"<[^>]*>")


def _osis_documents(verses: Sequence[str], names: Mapping[str, str]) -> dict[str, str]:
    """Plain text per book from the OSIS verses of a SWORD module, in the order of ``names``.

    Kept: the words of every verse (and of the preface and glossary), with the module's
    paragraphs as blank-line-separated blocks (chapters start one), each verse and each poetry
    line on its own line inside its paragraph. Dropped: notes, cross-references, headings and
    every tag (Strong's numbers, milestones, quotation and speaker markup), keeping their text.
    """
    parts: dict[str, list[str]] = {}
    current: str | None = None
    for verse in verses:
        pieces = _OSIS_BOOK.split(_OSIS_DROP.sub(" ", verse))
        # split() yields text, then (type, osisID, chapter book) per marker, then text ...
        for k in range(0, len(pieces), 4):
            if k:
                kind, osis_id, chapter_book = pieces[k - 3 : k]
                key = osis_id if kind == "book" else (kind or chapter_book)
                if key not in names:
                    raise AssetBuildError(f"the module has an unknown book {key!r}")
                if names[key] != current:
                    current = names[key]
                    parts.setdefault(current, [])
                if chapter_book:
                    parts[current].append("\n\n")
            text = pieces[k]
            if current is None:
                if _OSIS_TAG.sub("", text).strip():
                    raise AssetBuildError("the module has text before its first book")
                continue
            text = _OSIS_PARA.sub("\n\n", text)
            parts[current].append(_OSIS_LINE.sub("\n", text))
        if current is not None:
            parts[current].append("\n")
    out: dict[str, str] = {}
    # in the order of ``names`` (for this module, its own slot order)
    for name in (n for n in dict.fromkeys(names.values()) if n in parts):
        chunks = parts[name]
        text = html.unescape(_OSIS_TAG.sub("", "".join(chunks)))
        lines = [" ".join(line.split()) for line in text.split("\n")]
        out[name] = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"
    return out
