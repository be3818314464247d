"""Crash-safe outputs: write beside the target, then swap it in; never delete what others made.

Every file, store or folder attncoda writes goes through :func:`atomic_output`:

1. **Before any work**, :func:`check_output` refuses a target that exists unless ``overwrite``
   is set *and* the target is attncoda's own output (a dataset in attncoda's schema, or a folder
   whose ``.attncoda.json`` stamp lists every file in it), and refuses a parent folder that
   cannot be written. Callers run it before they load a model or compute anything.
2. The new output is written into a **staging folder** beside the target,
   ``.NAME.attncoda-PID-XXXX/``, marked by a ``STAGING`` file that the writer holds locked.
3. It is **swapped in** with one ``rename`` (a file, or a folder into an empty place) or, for a
   folder that replaces an old one, an atomic exchange (Linux ``renameat2(RENAME_EXCHANGE)``;
   elsewhere two renames, the old copy kept aside until the new one is in place). The target
   always holds the complete old data or the complete new data.
4. An exception in the block (a full disk, Ctrl-C) removes the staging folder and propagates,
   the old data untouched. A first SIGINT during the swap itself is **deferred** until the
   swap is done (:func:`deferred_interrupt`; writers whose library writes from background
   threads, such as zarr, defer it over their write call too); a second SIGINT interrupts at
   once.
5. Staging folders of **dead writers** (SIGKILL, power loss) are found by their marker and lock
   and removed the next time anything is written beside them (:func:`sweep`); an old copy that
   a writer had moved aside is first put back if the target is missing.

Examples
--------
>>> import pathlib, tempfile
>>> from attncoda import atomic_output
>>> target = pathlib.Path(tempfile.mkdtemp()) / "table.csv"
>>> with atomic_output(target) as tmp:
...     _ = tmp.write_text("a,b\\n1,2\\n")
>>> target.read_text()
'a,b\\n1,2\\n'
>>> with atomic_output(target) as tmp:  # doctest: +ELLIPSIS
...     _ = tmp.write_text("again")
Traceback (most recent call last):
...
attncoda._errors.OutputExistsError: ... exists; pass overwrite=True (--force) to replace it
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from ._errors import ForeignFileError, OutputError, OutputExistsError

__all__ = [
    "STAMP",
    "atomic_output",
    "available_memory",
    "check_free_space",
    "check_output",
    "deferred_interrupt",
    "file_digest",
    "file_is_ours",
    "folder_is_ours",
    "own_files",
    "read_own_file",
    "record_files",
    "sign_text",
    "staging_folder",
    "sweep",
    "target_lock",
]

#: The stamp attncoda writes into every output folder: the files it wrote there.
STAMP = ".attncoda.json"
#: The marker file of a staging folder; its writer holds an exclusive lock on it.
_MARKER = "STAGING"
_INFIX = ".attncoda-"
_OLD = "previous"

Kind = Literal["file", "store", "folder"]


# --------------------------------------------------------------------------------------------
# ownership


def folder_is_ours(folder: Path) -> str | None:
    """Why ``folder`` may not be replaced by attncoda, or None if it is attncoda's own output.

    A folder is attncoda's when its :data:`STAMP` lists every file in it (so nothing a user
    added would be deleted), or when it is empty.
    """
    if not folder.is_dir() or folder.is_symlink():
        return "it is not a folder"
    present = sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()
    )
    if not present:
        return None
    stamp = folder / STAMP
    try:
        listed = set(json.loads(stamp.read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        listed = set()  # no stamp: nothing in it is known to be attncoda's
    foreign = [p for p in present if p != STAMP and p not in listed]
    if foreign:
        return f"it holds files attncoda did not write ({_shown(foreign)})"
    # what attncoda wrote is replaced only if it is provably unchanged: its sha256 in the stamp
    hashes = own_files(folder)
    changed = []
    for name in present:
        if name == STAMP:
            continue
        want = hashes.get(name)
        try:
            same = want is not None and _digest_own(folder, name) == want
        except OSError:
            same = False
        if not same:
            changed.append(name)
    if changed:
        return (
            f"it holds files changed since attncoda wrote them, or that it cannot prove "
            f"unchanged ({_shown(changed)})"
        )
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _digest_own(folder: Path, name: str) -> str:
    """The sha256 of ``folder/name`` read with no symlink on the way (:func:`open_own`)."""
    fd = _open_own_fd(folder, name)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's content, as hex (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_files(folder: Path, kind: str, names: list[str] | None = None) -> None:
    """Write (or extend) ``folder``'s :data:`STAMP` with the files attncoda wrote there.

    ``names=None`` lists every file now in the folder (a staging folder that attncoda filled);
    otherwise ``names`` are added to the stamp's list (a file written into an existing output,
    e.g. ``report.html``). The stamp records each file's sha256 (``"sha256"``), which
    :func:`read_own_file` checks before anything reads the file back.
    """
    from ._version import __version__

    stamp = folder / STAMP
    if names is None:
        files = sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and not p.is_symlink() and p.name != STAMP
        )
        data: dict[str, Any] = {"kind": kind}
        hashes: dict[str, str] = {}
    else:
        try:
            data = json.loads(stamp.read_text(encoding="utf-8"))
            hashes = dict(data.get("sha256", {}))
        except (OSError, ValueError, TypeError, AttributeError):
            data, hashes = {"kind": kind, "files": []}, {}
        files = sorted({*data.get("files", []), *names})
    for name in files if names is None else names:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            hashes[name] = file_digest(path)
    data.update(
        files=files,
        sha256={k: hashes[k] for k in files if k in hashes},
        attncoda_version=__version__,
        written=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    replace_file(stamp, json.dumps(data, indent=1) + "\n")


def _umask() -> int:
    """The process's umask (read from /proc where it can be, without changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # pragma: no cover - no /proc: read it by setting it back
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


def replace_file(target: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``target`` through a private temporary file, then rename it into place.

    The one way attncoda writes a small file in place: the temporary file beside ``target`` is
    created exclusively under a random name (``tempfile.mkstemp``: ``O_CREAT | O_EXCL |
    O_NOFOLLOW``), so a file or symlink someone placed under a guessable name is never written
    through; it gets the usual permissions (``0o666`` less the umask) before the rename, and it
    is removed if anything fails. A symlink at ``target`` is replaced, not followed.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> p = replace_file(pathlib.Path(tempfile.mkdtemp()) / "a.txt", "hi\\n")
    >>> p.read_text()
    'hi\\n'
    """
    path = Path(target)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".attncoda-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


#: The largest file :func:`read_own_file` and :func:`file_is_ours` read (a page, table or figure).
MAX_OWN_BYTES = 256 << 20


def _name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain relative path inside a folder (None if it is)."""
    if not isinstance(name, str) or not name:
        return f"{name!r} is not a file name"
    if "\0" in name or "\\" in name or name.startswith(("/", "~")) or ":" in name.split("/")[0]:
        return f"{name!r} is not a relative path inside the folder"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"{name!r} is not a plain relative path inside the folder (no '..', '.', '//')"
    return None


def own_files(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The files ``folder``'s :data:`STAMP` lists with a sha256: name -> hex digest.

    Only plain relative names are returned (see :func:`read_own_file`); an unreadable stamp,
    or one reached through a symlink, lists nothing.
    """
    try:
        raw = json.loads(_read_regular(Path(folder) / STAMP, 16 << 20).decode("utf-8"))
        listed = raw.get("sha256", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(listed, dict):
        return {}
    return {
        k: v
        for k, v in listed.items()
        if _name_problem(k) is None and isinstance(v, str) and len(v) == 64
    }


def read_own_file(folder: str | os.PathLike[str], name: object) -> bytes:
    """The content of ``folder/name``, only if attncoda wrote it there and it is unchanged.

    The file must be named by a plain relative path (no absolute path, no ``..``, no ``~``), lie
    inside ``folder`` with no symlink on the way, be a regular file, and be listed in the
    folder's :data:`STAMP` with the sha256 of the bytes read. Anything that reads back what a
    folder's manifest names (the HTML report) reads through this function: a manifest is
    treated as untrusted input.

    Raises
    ------
    ForeignFileError
        One line saying which condition failed.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "t.csv").write_text("a\\n1\\n")
    >>> record_files(folder, "demo")
    >>> read_own_file(folder, "t.csv")
    b'a\\n1\\n'
    >>> read_own_file(folder, "../t.csv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    attncoda._errors.ForeignFileError: ... not a plain relative path inside the folder ...
    """
    problem = _name_problem(name)
    if problem is not None:
        raise ForeignFileError(problem)
    assert isinstance(name, str)
    root = Path(folder)
    want = own_files(root).get(name)
    if want is None:
        raise ForeignFileError(
            f"{name!r} is not listed with its sha256 in {STAMP} of {str(root)!r}: attncoda did "
            "not write it there (or wrote it before files were hashed; re-run the analysis)"
        )
    try:
        data = open_own(root, name)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ForeignFileError(f"{name!r} passes through a symlink; it is not read") from exc
        raise ForeignFileError(f"{name!r} cannot be read ({exc.strerror or exc})") from exc
    if hashlib.sha256(data).hexdigest() != want:
        raise ForeignFileError(
            f"{name!r} was changed after attncoda wrote it (its sha256 differs from {STAMP}); "
            "it is not read"
        )
    return data


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_own(folder: str | os.PathLike[str], name: str, limit: int = MAX_OWN_BYTES) -> bytes:
    """The bytes of ``folder/name`` read through one chain of descriptors: no symlink anywhere.

    Every folder on the way is opened relative to the one before it with ``O_NOFOLLOW |
    O_DIRECTORY`` and the file with ``O_NOFOLLOW``; the opened file is checked with ``fstat``
    (a regular file) and read from that descriptor. A symlink swapped in at any step between
    a check and a read (a race) makes the open fail (``ELOOP``/``ENOTDIR``) instead of reading
    what it points to. ``name`` must be a plain relative path (see :func:`read_own_file`).
    """
    return _read_fd(_open_own_fd(folder, name), name, limit)


def _open_own_fd(folder: str | os.PathLike[str], name: str) -> int:
    """An open descriptor of ``folder/name`` (see :func:`open_own`), or OSError."""
    problem = _name_problem(name)
    if problem is not None:
        raise OSError(errno.EINVAL, problem, name)
    parts = name.split("/")
    dflags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
    dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in parts[:-1]:
            nxt = os.open(part, dflags, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return fd


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file, not following a final symlink, at most ``limit`` bytes."""
    flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    return _read_fd(os.open(path, flags), str(path), limit)


def _read_fd(fd: int, path: str, limit: int) -> bytes:
    """Read at most ``limit`` bytes from the open descriptor ``fd`` of a regular file; closes it."""
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        import stat

        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", str(path))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", str(path))
    return data


#: The last line of every single-file page attncoda writes: the sha256 of all lines before it.
_SIGNATURE = "attncoda-sha256:"


def sign_text(text: str, comment: tuple[str, str] = ("<!--", "-->")) -> str:
    """``text`` with a last line signing it: a comment holding the sha256 of all before it.

    Every single file page attncoda writes (views, reports, explorers) is signed so that
    :func:`file_is_ours` recognises the whole file, not a tag anyone can copy.

    Examples
    --------
    >>> signed = sign_text("<p>hi</p>")
    >>> signed.splitlines()[-1].startswith("<!-- attncoda-sha256:")
    True
    """
    body = text if text.endswith("\n") else text + "\n"
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{body}{comment[0]} {_SIGNATURE}{digest} {comment[1]}\n"


def file_is_ours(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a whole file attncoda wrote with :func:`sign_text` (None if it is).

    The one check every page writer passes as ``is_ours`` to :func:`atomic_output` before it
    replaces a file: the file's last line must hold the sha256 of every byte before it, so a
    user's page that merely contains (or copies) attncoda's output is never replaced.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> page = pathlib.Path(tempfile.mkdtemp()) / "view.html"
    >>> _ = page.write_text(sign_text("<p>attncoda's</p>"))
    >>> file_is_ours(page) is None
    True
    >>> _ = page.write_text("<p>mine</p>\\n" + page.read_text())
    >>> file_is_ours(page)
    'it is not a file attncoda wrote (its content does not match its attncoda signature)'
    """
    try:
        data = _read_regular(Path(path), MAX_OWN_BYTES)
    except OSError as exc:
        return f"it is not a file attncoda wrote ({exc.strerror or exc})"
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    mark = _SIGNATURE.encode()
    if mark not in last:
        return "it is not a file attncoda wrote (no attncoda signature on its last line)"
    digest = last.split(mark, 1)[1][:64].decode("ascii", "replace")
    if hashlib.sha256(body + b"\n").hexdigest() != digest:
        return "it is not a file attncoda wrote (its content does not match its attncoda signature)"
    return None


def write_signed_text(
    path: str | os.PathLike[str],
    text: str,
    *,
    overwrite: bool = False,
    what: str = "page",
    comment: tuple[str, str] = ("<!--", "-->"),
) -> Path:
    """Write ``text`` crash-safely as a signed page (:func:`sign_text`); replace only ours.

    An existing file is replaced only with ``overwrite=True`` and only if
    :func:`file_is_ours` says attncoda wrote the whole of it.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> page = pathlib.Path(tempfile.mkdtemp()) / "p.html"
    >>> _ = write_signed_text(page, "<p>1</p>")
    >>> _ = write_signed_text(page, "<p>2</p>", overwrite=True)
    >>> page.read_text().startswith("<p>2</p>")
    True
    """
    target = Path(path).expanduser()
    signed = sign_text(text, comment)
    with atomic_output(target, overwrite=overwrite, is_ours=file_is_ours, what=what) as tmp:
        tmp.write_text(signed, encoding="utf-8")
    return target


# --------------------------------------------------------------------------------------------
# validation before work


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(path.anchor or ".")  # pragma: no cover - the root always exists


def _probe_writable(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (a real probe: root ignores permission bits)."""
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:  # an unnamed file where the OS has them (O_TMPFILE): a kill leaves nothing behind
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc})"
    return None


def check_output(
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    kind: Kind = "file",
    is_ours: Callable[[Path], str | None] | None = None,
    what: str = "output",
) -> Path:
    """Refuse, before any work, an output that cannot or may not be written.

    Parameters
    ----------
    target : path-like
        The file, store or folder to write.
    overwrite : bool, default False
        Allow replacing an existing target, if it is attncoda's own. An existing empty folder
        may always be filled (``kind="folder"``).
    kind : {"file", "store", "folder"}
        What will be written: one file (``.nc``), a folder that the writer creates (a zarr
        store), or a folder of files that attncoda fills (an analysis or report folder).
    is_ours : callable, optional
        ``is_ours(path)`` returns None if an existing target is attncoda's own output, else
        the reason it is not. Default: :func:`folder_is_ours` for folders; files and stores are
        never attncoda's unless this is given.
    what : str
        How messages name the target (``"--out"``, ``"dataset"``).

    Returns
    -------
    pathlib.Path
        The target, with ``~`` expanded and a symlink followed to the path it points to.

    Raises
    ------
    OutputExistsError
        The target exists and ``overwrite`` is not set, or it is not attncoda's output.
    OutputError
        The parent folder cannot be created or written.
    """
    path = Path(target).expanduser()
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    empty_folder = kind == "folder" and path.is_dir() and not any(path.iterdir())
    if path.exists() and not empty_folder:
        if not overwrite:
            how = "--force" if what.startswith("--") else "overwrite=True (--force)"
            raise OutputExistsError(f"{what} {str(path)!r} exists; pass {how} to replace it")
        reason: str | None
        want_dir = kind != "file"
        if path.is_dir() != want_dir:
            reason = "it is a folder" if path.is_dir() else "it is not a folder"
        elif kind == "folder":
            reason = (is_ours or folder_is_ours)(path)
        else:
            reason = is_ours(path) if is_ours is not None else "attncoda cannot tell it wrote it"
        if reason is not None:
            raise OutputExistsError(
                f"{what} {str(path)!r} exists and attncoda will not replace it: {reason}; "
                "choose another path or move it away yourself"
            )
    parent = _nearest_existing(path.parent)
    problem = _probe_writable(parent)
    if problem is not None:
        raise OutputError(f"{what} {str(path)!r} cannot be written: {problem}")
    return path


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_free_space(
    target: str | os.PathLike[str], need: int, *, what: str = "output", margin: float = 0.05
) -> None:
    """Refuse, before any work, an output of about ``need`` bytes that its disk cannot hold.

    The free space (for this user) of the filesystem that will hold ``target`` must exceed
    ``need`` by ``margin`` (a fraction) plus 256 KiB. Writers whose library cannot fail cleanly
    on a full disk (HDF5 leaves a half-closed file behind that crashes the process later) run
    this first.

    Raises
    ------
    OutputError
        Naming the size needed and the space free.

    Examples
    --------
    >>> import tempfile
    >>> check_free_space(tempfile.mkdtemp() + "/x.nc", 1000)
    >>> check_free_space(tempfile.mkdtemp() + "/x.nc", 10**18)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    attncoda._errors.OutputError: output '...x.nc' needs about 1000000000000 MB ...
    """
    path = Path(target).expanduser()
    folder = _nearest_existing(path.parent)
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # pragma: no cover - no statvfs: nothing to check
        return
    free = st.f_bavail * st.f_frsize
    want = int(need * (1 + margin)) + (256 << 10)
    if free < want:
        raise OutputError(
            f"{what} {str(path)!r} needs about {max(1, round(need / 1e6))} MB and {folder} has "
            f"{free / 1e6:.1f} MB free; free some space or write it elsewhere (nothing was "
            "written)"
        )


# --------------------------------------------------------------------------------------------
# interrupts


class _Deferred:
    def __init__(self) -> None:
        self.pending = False


#: The signals a write defers until its swap is done: Ctrl-C, and (where the process handles
#: them, as the ``attncoda`` command does, or leaves them at their default) ``kill`` and a
#: closed terminal.
_DEFERRED = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _deliver(before: Any, signum: int, frame: Any) -> None:
    """Do what signal ``signum`` did under the handler ``before``: Python's KeyboardInterrupt,
    the default (end the process, by the same signal), or the caller's own handler."""
    if before is signal.default_int_handler:
        raise KeyboardInterrupt
    if before is signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    elif callable(before):
        before(signum, frame)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[_Deferred]:
    """Hold back a first SIGINT (and SIGTERM, SIGHUP) until the block ends; a second one
    interrupts at once.

    The caller checks ``state.pending`` (cleaning up first) and on exit the held-back signal
    does what it did before the block: ``KeyboardInterrupt`` (Python's SIGINT default), ending
    the process (``SIG_DFL``: SIGTERM and SIGHUP by default) or calling the caller's handler
    (the ``attncoda`` command turns SIGTERM and SIGHUP into an interrupt). A signal that is
    ignored (a background job's SIGINT) stays ignored. Outside the main thread, or where
    signals are not available, it does nothing.
    """
    state = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous: dict[int, Any] = {}
    for sig in _DEFERRED:
        handler_now = signal.getsignal(sig)
        if handler_now is not signal.SIG_IGN and handler_now is not None:
            previous[sig] = handler_now
    first: list[int] = []

    def deliver(signum: int, frame: Any) -> None:
        _deliver(previous[signum], signum, frame)

    def handler(signum: int, frame: Any) -> None:
        if state.pending:  # a second signal: stop now; the staging folder is swept later
            deliver(signum, frame)
        state.pending = True
        first.append(signum)

    installed: list[int] = []
    try:
        for sig in previous:
            signal.signal(sig, handler)
            installed.append(sig)
    except (ValueError, OSError):  # pragma: no cover - embedded interpreters
        for sig in installed:
            signal.signal(sig, previous[sig])
        yield state
        return
    try:
        yield state
    finally:
        for sig in installed:
            signal.signal(sig, previous[sig])
    if state.pending:
        deliver(first[0], None)


# --------------------------------------------------------------------------------------------
# one writer at a time per target

_LOCK_SUFFIX = ".attncoda.lock"
_LOCK_MARK = b"attncoda lock"
#: How long a writer waits for another process's lock on the same target (seconds).
LOCK_WAIT_S = 120.0
_held: dict[str, int] = {}
_held_guard = threading.Lock()


def _lock_file(target: Path) -> Path:
    return target.parent / f".{target.name}{_LOCK_SUFFIX}"


@contextlib.contextmanager
def target_lock(
    target: str | os.PathLike[str], *, what: str = "output", wait_s: float | None = None
) -> Iterator[None]:
    """Hold the advisory lock of ``target``: one attncoda writer at a time appends to it or
    swaps it (other processes wait, at most ``wait_s`` seconds, default :data:`LOCK_WAIT_S`).

    The lock is ``fcntl.flock`` on ``.NAME.attncoda.lock`` beside the target, created by the
    first writer and removed by the holder when it is done (only if it holds attncoda's
    mark: a file of that name that attncoda did not create is refused, never touched).
    Re-entrant within a process. Where ``fcntl`` is missing (Windows), it does nothing.

    Raises
    ------
    OutputError
        Another process held the lock for longer than ``wait_s`` (its pid is named), or the
        lock file is not attncoda's.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks
        yield
        return
    path = _lock_file(Path(target).expanduser().absolute())
    key = str(path)
    with _held_guard:
        if key in _held:
            _held[key] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _held_guard:
                _held[key] -= 1
        return
    deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise OutputError(
                f"{what} {str(target)!r} cannot be locked ({path.name}: {exc.strerror or exc})"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            if time.monotonic() > deadline:
                pid = holder[2] if len(holder) > 2 and holder[2].isdigit() else "?"
                raise OutputError(
                    f"{what} {str(target)!r} is being written by another attncoda process "
                    f"(pid {pid}); nothing was written; try again when it is done"
                ) from None
            time.sleep(0.05)
            continue
        try:  # the holder before us may have removed the file: lock the one at the path
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        content = os.pread(fd, 200, 0)
        if content and not content.startswith(_LOCK_MARK):
            raise OutputError(
                f"{what} {str(target)!r}: {path.name} exists and attncoda did not create it; "
                "move it away"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, _LOCK_MARK + f" {os.getpid()}\n".encode(), 0)
        with _held_guard:
            _held[key] = 1
        try:
            yield
        finally:
            with _held_guard:
                del _held[key]
            with contextlib.suppress(OSError):
                os.unlink(path)  # while locked: a waiter then sees another file and retries
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# staging and swapping


def _lock(fh: Any, blocking: bool) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: fall back on the pid
        return True
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _staging_name(target: Path) -> str:
    return f".{target.name}{_INFIX}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


#: A staging folder with no marker, or an empty one, is taken for abandoned only after this long:
#: its writer creates, locks and fills the marker within microseconds of creating the folder.
_GRACE_S = 60.0


def _abandoned(folder: Path) -> bool:
    """A staging folder whose writer is gone: its marker lock can be taken (or its pid is dead).

    The writer creates the folder, then the marker, locks it and writes its pid into it; a
    folder killed before that is abandoned once :data:`_GRACE_S` old.
    """
    marker = folder / _MARKER
    try:
        young = time.time() - folder.stat().st_mtime < _GRACE_S
        if not marker.exists():
            return not young and not any(folder.iterdir())
        with open(marker, "r+b") as fh:
            try:
                import fcntl  # noqa: F401
            except ImportError:  # pragma: no cover - Windows: the pid written in the marker
                return not _pid_alive(int(fh.read().decode().split()[0]))
            if not _lock(fh, blocking=False):
                return False
            return bool(fh.read(1)) or not young
    except (OSError, ValueError, IndexError):
        return False


def sweep(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the staging folders that dead writers left beside ``target``; return them.

    Only folders named ``.NAME.attncoda-*`` that hold attncoda's marker, and whose writer no
    longer holds the marker's lock, are touched. If such a writer had moved the old target
    aside and the target is now missing, the old copy is put back first.
    """
    path = Path(target)
    prefix = _staging_name(path)
    removed: list[Path] = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.is_dir() and not entry.is_symlink()):
            continue
        if not _abandoned(entry):
            continue
        old = entry / _OLD
        if (old.exists() or old.is_symlink()) and not (path.exists() or path.is_symlink()):
            with contextlib.suppress(OSError):
                os.rename(old, path)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


class StagingFolder:
    """A staging folder made by :func:`staging_folder`; :meth:`remove` removes it."""

    def __init__(self, path: Path, marker: Any) -> None:
        self.path = path
        self._marker = marker  # open, locked: the folder is in use while this process lives
        self._removed = False
        # removed when dropped, at the interpreter's exit, or (see staging_folder) on a kill
        self._finalizer = weakref.finalize(self, _remove_staging, path, marker)
        _register_for_kill(self)

    def remove(self) -> None:
        """Remove the folder and everything in it (attncoda made it); idempotent."""
        if not self._removed:
            self._removed = True
            _unregister_for_kill(self)
            self._finalizer()


def _remove_staging(path: Path, marker: Any) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        marker.close()


def staging_folder(beside: str | os.PathLike[str], label: str = "") -> StagingFolder:
    """A new staging folder ``.NAME.attncoda-LABEL-XXXX/`` beside ``beside``, marked as ours.

    For work files that live for a while (a streamed capture's rows) and must not outlive
    their writer. First the staging folders that dead writers left beside ``beside`` are
    removed (:func:`sweep`: only folders that hold attncoda's locked marker, or empty ones,
    never anything else). The new folder holds the marker (``STAGING``: the pid, locked by
    this process until the folder is removed), so a later :func:`sweep` recognises it once
    this process is gone, whatever killed it. It is removed by :meth:`StagingFolder.remove`,
    when the object is dropped, at the interpreter's exit, and when this process is ended by
    SIGTERM or SIGHUP left at their default action (which still ends it, by the same signal,
    once the folder is gone). SIGINT raises ``KeyboardInterrupt`` as before; the caller's
    cleanup (or the exit) removes the folder. SIGKILL leaves it to the next :func:`sweep`.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from attncoda import staging_folder
    >>> where = pathlib.Path(tempfile.mkdtemp()) / "rows.zarr"
    >>> work = staging_folder(where, "rows")
    >>> work.path.name.startswith(".rows.zarr.attncoda-rows-")
    True
    >>> work.remove()
    >>> work.path.exists()
    False
    """
    target = Path(beside)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target)
    prefix = _staging_name(target) + (f"{label}-" if label else "")
    _arm_kill()  # first: a SIGTERM held back below then removes the folder when delivered
    with deferred_interrupt():  # no signal between creating the folder and marking it
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
        marker = open(path / _MARKER, "w+b")  # held open (locked) while the folder lives
        _lock(marker, blocking=True)
        marker.write(f"{os.getpid()} attncoda staging for {target.name}\n".encode())
        marker.flush()
        folder = StagingFolder(path, marker)
    return folder


#: The staging folders of this process to remove before a SIGTERM/SIGHUP ends it, and the
#: handlers those signals had before the first of them was made.
_LIVE: weakref.WeakSet[StagingFolder] = weakref.WeakSet()
_KILL_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
_BEFORE_KILL: dict[int, Any] = {}


def _on_kill(signum: int, frame: Any) -> None:
    for folder in list(_LIVE):
        folder.remove()
    before = _BEFORE_KILL.pop(signum, signal.SIG_DFL)
    _deliver(before, signum, frame)


def _register_for_kill(folder: StagingFolder) -> None:
    _LIVE.add(folder)
    _arm_kill()


def _arm_kill() -> None:
    """Install :func:`_on_kill` for SIGTERM/SIGHUP where they are at their default action."""
    if threading.current_thread() is not threading.main_thread():
        return  # handlers can only be set from the main thread: the next sweep removes it
    for sig in _KILL_SIGNALS:
        if sig in _BEFORE_KILL or signal.getsignal(sig) != signal.SIG_DFL:
            continue  # ours already, or a handler of the program's own (it decides)
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, _on_kill)
            _BEFORE_KILL[sig] = signal.SIG_DFL


def _unregister_for_kill(folder: StagingFolder) -> None:
    _LIVE.discard(folder)
    if _LIVE or threading.current_thread() is not threading.main_thread():
        return
    for sig, before in list(_BEFORE_KILL.items()):
        if signal.getsignal(sig) is _on_kill:  # not replaced by the program meanwhile
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, before)
        del _BEFORE_KILL[sig]


_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2`` on Linux; False where it is not available (the caller falls back)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):  # pragma: no cover - old glibc
        return False
    at_fdcwd = -100
    res = fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), ctypes.c_uint(flags))
    if res == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP if hasattr(errno, "ENOTSUP") else 95):
        return False  # the filesystem cannot: fall back
    raise OSError(err, os.strerror(err), str(dst))


def _install(staged_path: Path, target: Path, box: Path) -> None:
    """Put ``staged_path`` at ``target``; an old target ends up inside ``box`` (or is gone)."""
    if not (target.exists() or target.is_symlink()):
        if staged_path.is_dir():
            os.rename(staged_path, target)  # fails if a folder appeared there meanwhile
        elif not _renameat2(staged_path, target, _RENAME_NOREPLACE):
            os.replace(staged_path, target)
        return
    if staged_path.is_file() and target.is_file():
        os.replace(staged_path, target)  # atomic for files
        return
    if _renameat2(staged_path, target, _RENAME_EXCHANGE):
        return  # the old data now sits at staged_path, inside the box
    old = box / _OLD
    os.rename(target, old)
    try:
        os.rename(staged_path, target)
    except BaseException:
        os.rename(old, target)
        raise


@contextlib.contextmanager
def atomic_output(
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    kind: Kind = "file",
    is_ours: Callable[[Path], str | None] | None = None,
    stamp: str | None = None,
    what: str = "output",
) -> Iterator[Path]:
    """Write an output crash-safely: yield a staging path, swap it in when the block succeeds.

    Parameters
    ----------
    target : path-like
        The file, store or folder to write.
    overwrite, kind, is_ours, what
        As for :func:`check_output` (called first).
    stamp : str, optional
        For folders: record every file written in the folder's :data:`STAMP` under this kind
        (so a later ``overwrite`` knows the folder is attncoda's).

    Yields
    ------
    pathlib.Path
        Where to write: a path that does not exist yet (``kind="file"`` or ``"store"``: create
        the file or the zarr store there) or an empty folder (``kind="folder"``).

    Raises
    ------
    OutputExistsError, OutputError
        As :func:`check_output`; also if the target appeared meanwhile.
    KeyboardInterrupt
        After cleaning up, if SIGINT arrived during the block.
    """
    path = check_output(target, overwrite=overwrite, kind=kind, is_ours=is_ours, what=what)
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path)
    work: StagingFolder | None = None
    try:
        # the box is marked and locked as ours, and removed on an exception, Ctrl-C, and a
        # SIGTERM/SIGHUP left at their default (staging_folder): a kill leaves no debris
        work = staging_folder(path)
        box = work.path
        staging = box / path.name
        if kind == "folder":
            staging.mkdir()
        yield staging
        with target_lock(path, what=what), deferred_interrupt() as interrupt:
            if kind == "folder" and stamp is not None:
                record_files(staging, stamp)
            if not interrupt.pending:
                if path.exists() and not existed:  # appeared while we were working
                    raise OutputExistsError(
                        f"{what} {str(path)!r} appeared while attncoda was writing it; "
                        "nothing was replaced"
                    )
                if existed:  # still replaceable? (a user may have added files meanwhile)
                    check_output(path, overwrite=overwrite, kind=kind, is_ours=is_ours, what=what)
                _install(staging, path, box)
            work.remove()
    finally:
        if work is not None:
            work.remove()
