"""Concurrent and interrupted fetches: per-asset locks, scratch folders and their leftovers.

A fetch builds in ``.tmp/NAME`` while it holds ``.locks/NAME``; what a killed fetch leaves there
is listed by :func:`list_leftovers` and removed by the next fetch (never what a running one uses).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ._cache import MANIFEST, _final_path, resolve_cache_dir
from ._registry import ASSETS
from ._stamps import STAMPS

__all__ = [
    "list_leftovers",
]


def _holder(fh: BinaryIO) -> str:
    """Who holds a lock, as its holder wrote it (``pid N on HOST since TIME``), or ''."""
    try:
        fh.seek(0)
        return fh.read(200).decode("utf-8", "replace").strip()
    except OSError:
        return ""


@contextlib.contextmanager
def _locked(
    root: Path,
    name: str,
    *,
    blocking: bool = True,
    create: bool = True,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[bool]:
    """Hold the exclusive per-asset lock ``.locks/NAME`` (concurrent fetches must not collide).

    Yields whether the lock is held. With ``blocking`` (the default) it waits for the lock and
    yields True. Otherwise it yields False at once if another process (or another open of the
    lock in this one) holds it: a fetch of ``name`` is running. Without ``create`` a missing
    lock file is not created (nothing can hold it: yields True without locking), so a read-only
    cache can be inspected. Without ``fcntl`` (Windows) nothing is locked, and a non-blocking
    attempt yields False (cannot tell, so assume a fetch is running). A blocking wait is said
    first through ``on_wait`` (who holds the lock, as its holder wrote it in the lock file), so
    that a second fetch never waits silently.
    """
    lock = root / ".locks" / name
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no locking, rename stays atomic
        yield blocking
        return
    if not create and not lock.exists():
        yield True
        return
    if create:
        lock.parent.mkdir(exist_ok=True)
    with open(lock, "a+b" if create else "rb") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not blocking:
                yield False
                return
            if on_wait is not None:
                who = _holder(fh) or "another process"
                on_wait(f"waiting for {who}, which is fetching {name!r} (lock {lock})")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        if create:  # who holds it, for whoever waits (the file is the lock, never a record)
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {stamp}".encode())
                fh.flush()
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def list_leftovers(cache_dir: str | os.PathLike[str] | None = None) -> list[tuple[Path, bool]]:
    """What fetches left in the cache's ``.tmp`` folder, and whether each fetch is still running.

    A fetch builds in ``.tmp/NAME`` while it holds the lock ``.locks/NAME``; a process killed
    mid-fetch leaves the folder behind. The next :func:`fetch` of any asset removes the leftovers
    of dead fetches (those whose lock it can take without waiting), never those of a fetch that
    is still running in another process. This function only looks (it writes nothing).

    Parameters
    ----------
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    list of (pathlib.Path, bool)
        Each ``.tmp/NAME`` folder and whether a fetch of ``NAME`` is running now.

    Examples
    --------
    >>> list_leftovers("/nonexistent")
    []
    """
    tmp_root = resolve_cache_dir(cache_dir) / ".tmp"
    try:
        folders = sorted(p for p in tmp_root.iterdir() if p.is_dir())
    except OSError:
        return []
    out = []
    for folder in folders:
        try:
            with _locked(tmp_root.parent, folder.name, blocking=False, create=False) as free:
                running = not free
        except OSError:
            running = True  # cannot tell: say so rather than call it dead
        out.append((folder, running))
    return out


def _clean_leftovers(root: Path) -> None:
    """Remove what dead fetches left in ``root/.tmp`` (lock free); keep running fetches' files.

    A dead fetch's previous copy moved aside by :func:`_install` (killed between its two
    renames) is put back first when the asset has no copy in place. Errors (a read-only cache)
    leave everything as it was. Old temp files of verified stamps are removed as well.
    """
    tmp_root = root / ".tmp"
    if tmp_root.is_dir():
        for folder in sorted(p for p in tmp_root.iterdir() if p.is_dir()):
            with contextlib.suppress(OSError), _locked(root, folder.name, blocking=False) as free:
                if free:
                    _remove_scratch(root, folder)
        with contextlib.suppress(OSError):
            tmp_root.rmdir()  # only if empty
    stamps = root / STAMPS
    if stamps.is_dir():
        day_ago = time.time() - 86_400
        for tmp in stamps.glob("*.tmp"):  # a verification killed before its os.replace
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < day_ago:
                    tmp.unlink()


def _remove_scratch(root: Path, scratch: Path) -> None:
    """Empty a dead fetch's ``.tmp/NAME`` folder (its lock held) and remove it.

    Only what :func:`fetch` creates there (``build-*`` and ``old-*`` folders) is deleted; anything
    else is left alone. If the asset has no copy in place but an ``old-*/previous`` copy exists
    (a fetch killed inside :func:`_install`), that copy is moved back first.
    """
    asset = ASSETS.get(scratch.name)
    if asset is not None:
        final = _final_path(asset, root)
        if not final.exists():
            for old in sorted(scratch.glob("old-*/previous")):
                if (old / MANIFEST).is_file():
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(old, final)
                    break
    for child in scratch.iterdir():
        if child.is_dir() and child.name.startswith(("build-", "old-")):
            shutil.rmtree(child, ignore_errors=True)
    with contextlib.suppress(OSError):
        scratch.rmdir()  # only if empty


def _scratch_dir(root: Path, name: str) -> Path:
    """A fresh ``.tmp/NAME`` folder inside the cache (lock held).

    Whatever an earlier, interrupted fetch of ``name`` left there is deleted first. Building
    inside the cache keeps the final ``os.replace`` on one filesystem.
    """
    scratch = root / ".tmp" / name
    if scratch.is_dir():
        _remove_scratch(root, scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch
