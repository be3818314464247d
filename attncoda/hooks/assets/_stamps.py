"""Verified stamps: ``.verified/NAME.json`` remembers which files a full hash has proved.

A stamp is keyed by the manifest's sha256 and each file's size, ``mtime_ns`` and ``ctime_ns``; a
file whose entry still matches is not hashed again. Stamps live outside the asset folder, so the
folder holds exactly what its manifest lists.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Folder of the cache that holds the verified stamps, one ``NAME.json`` per asset.
STAMPS = ".verified"

#: Version of the stamp format; a stamp of another version is ignored (every file is hashed).
_STAMP_VERSION = 1


def _file_key(st: os.stat_result) -> tuple[int, int, int]:
    """What a verified stamp remembers of a file: size, mtime and ctime in nanoseconds.

    Every write to a file and every ``os.utime`` on it sets its ctime to the current time, so a
    matching key means the file was not changed through the file system since it was hashed.
    """
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stamp_path(root: Path, name: str) -> Path:
    return root / STAMPS / f"{name}.json"


def _read_stamp(root: Path, name: str, manifest_sha256: str) -> dict[str, list[Any]]:
    """The stamp's file entries (path -> [size, mtime_ns, ctime_ns, sha256]); empty if there is
    no usable stamp for this manifest."""
    try:
        with open(_stamp_path(root, name), encoding="utf-8") as fh:
            stamp = json.load(fh)
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(stamp, dict)
        or stamp.get("version") != _STAMP_VERSION
        or stamp.get("manifest_sha256") != manifest_sha256
        or not isinstance(stamp.get("files"), dict)
    ):
        return {}
    return {k: v for k, v in stamp["files"].items() if isinstance(v, list) and len(v) == 4}


class _StampWriter:
    """Writes a verified stamp atomically (temp file + ``os.replace``), or nothing if it cannot.

    The temp file is created before the first file is hashed: its mtime is the file system's
    clock at that moment. A file whose mtime or ctime is not older than that clock could be
    changed again within the same clock tick without changing its key (file times are coarse),
    so it is not stamped and the next check hashes it again. On a read-only cache the temp file
    cannot be created and nothing is stamped.
    """

    def __init__(self, root: Path, name: str) -> None:
        self.target = _stamp_path(root, name)
        self.tmp: Path | None = None
        self.clock = 0
        try:
            self.target.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp", dir=self.target.parent)
        except OSError:
            return
        try:
            self.clock = os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
        self.tmp = Path(tmp)

    def trusts(self, st: os.stat_result) -> bool:
        """Whether a file with this stat may be stamped (older than the clock)."""
        return self.tmp is not None and max(st.st_mtime_ns, st.st_ctime_ns) < self.clock

    def commit(self, manifest_sha256: str, files: Mapping[str, list[Any]]) -> None:
        if self.tmp is None:
            return
        stamp = {"version": _STAMP_VERSION, "manifest_sha256": manifest_sha256, "files": files}
        try:
            with open(self.tmp, "w", encoding="utf-8") as fh:
                json.dump(stamp, fh, indent=1, sort_keys=True)
                fh.write("\n")
            self.tmp.chmod(0o644)  # mkstemp's file is private; the assets are readable by all
            os.replace(self.tmp, self.target)
        except OSError:
            self.discard()
        self.tmp = None

    def discard(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.tmp.unlink()
        self.tmp = None
