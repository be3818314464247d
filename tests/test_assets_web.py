"""The World English Bible corpus (``web``): the SWORD zText reader and OSIS cleaning.

The unit tests build a tiny zText module in memory (zlib blocks, ``.bzs`` block index, ``.bzv``
verse index) with the module's quirks: empty and linked slots, a superseded copy no slot points
to, a slot whose uint16 size wrapped, a book whose start marker is lost, a footnote between two
words. The ``real`` test checks the fetched corpus against shared/reference/offline-assets.md.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from test_assets import require

from attncoda.hooks import assets
from attncoda.hooks.assets import AssetBuildError, _corpora, _sword

NAMES = {"front": "Preface", "Gen": "Genesis", "Hos": "Hosea"}

PREFACE = (
    '<div sID="g1" type="front"/><title level="1" type="main">Preface to it</title>'
    '<div sID="g2" type="x-p"/>Intro   text.<div eID="g2" type="x-p"/><div eID="g1" type="front"/>'
)
GEN_1_1 = (
    '<div canonical="true" osisID="Gen" sID="g3" type="book"/><title type="main">Genesis</title>'
    '<div sID="g4" type="x-p"/><chapter n="1" osisID="Gen.1" sID="Gen.1"/>'
    '<w lemma="strong:H7225">In</w> the beginning, God<note placement="foot">'
    '<reference type="annotateRef">1:1 </reference>a footnote</note>created &amp; made. '
)
GEN_1_2 = 'Second verse.<div eID="g4" type="x-p"/><div sID="g5" type="x-p"/>'
GEN_1_3 = '<l level="1" sID="l1"/>A line,<l eID="l1" level="1"/><l level="2" sID="l2"/>another.'
STALE = "A SUPERSEDED COPY"
# Hosea's book start is lost, as in the real module: its first chapter marker names the book
HOS_LONG = '<chapter n="1" osisID="Hos.1" sID="Hos.1"/>' + "word " * 14_000
HOS_LAST = "Last verse."


def _module(*, break_block: bool = False) -> tuple[bytes, bytes, bytes]:
    """A two-block zText testament: (bzs, bzv, bzz)."""
    block0 = b""
    slots: list[tuple[int, int, int]] = [(0, 0, 0)]  # an empty slot
    for text in (PREFACE, GEN_1_1, STALE, GEN_1_2, GEN_1_3):
        raw = text.encode()
        if text != STALE:  # no slot points to the stale copy
            slots.append((0, len(block0), len(raw)))
        block0 += raw
    slots.append(slots[-2])  # a linked verse repeats the record of 1:2
    long_raw = HOS_LONG.encode()
    assert len(long_raw) > 65_535
    block1 = long_raw + HOS_LAST.encode()
    slots += [(1, 0, len(long_raw) % 65_536), (1, len(long_raw), len(HOS_LAST))]
    bzz, bzs = b"", b""
    for block in (block0, block1):
        packed = zlib.compress(block)
        if break_block and block is block1:
            packed = packed[:10] + b"\x00" * 10 + packed[20:]
        bzs += struct.pack("<III", len(bzz), len(packed), len(block))
        bzz += packed
    bzv = b"".join(struct.pack("<IIH", *s) for s in slots)
    return bzs, bzv, bzz


def test_ztext_reads_slots_in_order_once_with_wrapped_sizes():
    verses = _sword._read_ztext(*_module(), "test")
    assert verses == [PREFACE, GEN_1_1, GEN_1_2, GEN_1_3, HOS_LONG, HOS_LAST]
    assert all(STALE not in v for v in verses)


def test_osis_documents_keep_verse_text_and_drop_markup():
    docs = _sword._osis_documents(_sword._read_ztext(*_module(), "test"), NAMES)
    assert list(docs) == ["Preface", "Genesis", "Hosea"]
    assert docs["Preface"] == "Intro text.\n"
    # the footnote becomes a space; the heading goes; each verse and poetry line is a line;
    # paragraphs are blank-line separated
    assert docs["Genesis"] == (
        "In the beginning, God created & made.\nSecond verse.\n\nA line,\nanother.\n"
    )
    assert assets.paragraphs(docs["Genesis"]) == [
        "In the beginning, God created & made. Second verse.",
        "A line, another.",
    ]
    hosea = docs["Hosea"].split("\n")
    assert hosea[0].split() == ["word"] * 14_000 and hosea[1] == HOS_LAST


def test_osis_documents_order_follows_the_names():
    verses = _sword._read_ztext(*_module(), "test")
    reordered = {"Hos": "Hosea", "Gen": "Genesis", "front": "Preface"}
    assert list(_sword._osis_documents(verses, reordered)) == ["Hosea", "Genesis", "Preface"]


def test_ztext_faults_are_build_errors():
    bzs, bzv, bzz = _module()
    with pytest.raises(AssetBuildError, match="does not decompress"):
        _sword._read_ztext(*_module(break_block=True), "test")
    with pytest.raises(AssetBuildError, match="whole records"):
        _sword._read_ztext(bzs, bzv[:-1], bzz, "test")
    outside = bzv + struct.pack("<IIH", 0, 10**6, 5)
    with pytest.raises(AssetBuildError, match="outside its block"):
        _sword._read_ztext(bzs, outside, bzz, "test")
    missing_block = bzv + struct.pack("<IIH", 7, 0, 5)
    with pytest.raises(AssetBuildError, match="outside its block"):
        _sword._read_ztext(bzs, missing_block, bzz, "test")
    verses = _sword._read_ztext(bzs, bzv, bzz, "test")
    with pytest.raises(AssetBuildError, match="unknown book 'Hos'"):
        _sword._osis_documents(verses, {"front": "Preface", "Gen": "Genesis"})
    with pytest.raises(AssetBuildError, match="text before its first book"):
        _sword._osis_documents(["stray words", *verses], NAMES)


def test_web_registry_entry():
    web = assets.get_asset("web")
    assert web.kind == "corpus" and web.in_all  # 4 MB, ~5 s to fetch: in `fetch --all`
    assert "public domain" in web.licence
    docs = web.details["documents"]
    assert (
        len(docs) == 83 == len(set(docs))
    )  # preface, 39 + Greek Daniel, 14 deuterocanon, 27, glossary
    assert docs[:3] == ("Preface", "Genesis", "Exodus")
    assert docs[-3:] == ("Jude", "Revelation", "Glossary")
    assert docs.index("Malachi") + 15 == docs.index("Matthew")  # 14 between
    assert len({_corpora._slug(n) for n in docs}) == 83  # one file name per document


@pytest.mark.real
def test_real_web():
    require("web")
    books = assets.load_corpus("web")
    assert list(books) == list(assets.get_asset("web").details["documents"])
    # shared/reference/offline-assets.md, section 3.3: 4,997,166 bytes and 925,874 words
    total_bytes = sum(len(t.encode()) for t in books.values())
    total_words = sum(len(t.split()) for t in books.values())
    assert total_bytes == pytest.approx(4_997_166, rel=0.005)
    assert total_words == pytest.approx(925_874, rel=0.005)
    assert books["Genesis"].startswith(
        "In the beginning, God created the heavens and the earth.\n"
        "The earth was formless and empty."
    )
    assert "Jesus wept." in books["John"].splitlines()
    assert (
        books["Revelation"]
        .rstrip()
        .endswith("The grace of the Lord Jesus Christ be with all the saints. Amen.")
    )
    assert books["Hosea"].startswith("Yahweh’s word that came to Hosea the son of Beeri")
    # Greek Daniel sits in one slot longer than 65,535 bytes: read whole, to Bel and the Dragon
    assert books["Daniel (Greek)"].rstrip().endswith("devoured in a moment before his face.")
    # superseded copies are not read: Romans 14:23 once
    assert books["Romans"].count("whatever is not of faith is sin") == 1
    joined = "".join(books.values())
    for residue in ("<", ">", "&amp;", "&lt;", "strong:", "osisID", "\r", "  "):
        assert residue not in joined, residue
    assert len(assets.paragraphs(books["Genesis"], min_words=40)) == pytest.approx(305, abs=5)
    assert books["Preface"].startswith("The Holy Bible is a collection of books and letters")
