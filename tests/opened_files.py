"""Evidence of which files a process opened, for ``tests/test_faults_opened.py`` (issue #48).

Run as a script, it is the child: ``python tests/opened_files.py SPEC.json`` installs an audit
hook (:func:`sys.addaudithook`, event ``open``: raised by ``open``, ``io.open`` and ``os.open``)
in a fresh interpreter, runs the spec's actions (``ac.load``, ``ac.write_report``, the
``attncoda`` command in-process) one after another and writes every path the process asked to
open, with the action it happened in, as JSON. An audit hook cannot be removed, so it lives only
in this child, never in the test process.

An ``open`` event names a path as given; one opened relative to a directory descriptor
(``os.open(name, dir_fd=fd)``, how attncoda reads an analysis folder's files) is resolved here
from the descriptor (``/proc/self/fd``): ``os.open`` is wrapped to tell the hook which
descriptor the call came with. Each path is recorded as asked (made absolute) and as
``os.path.realpath`` resolves it (where a symlink leads; with ``O_NOFOLLOW`` only the folders
on the way are resolved, since a final symlink is refused, not followed; a name opened in a held
directory descriptor is its directory's path as ``/proc`` gives it, not resolved again, which
would race with a swapped folder).

Files HDF5 opens (netCDF through h5py or netCDF4, its external storage, its links) are opened in
C and raise no audit event: :func:`strace` runs the same child under ``strace -f -y`` and
:func:`parse_strace` reads every ``open``/``openat`` of every thread and child, the path asked
(resolved against the directory descriptor strace names) and the file the kernel opened (the
returned descriptor's path).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: strace's open calls: those of the C library and of Python (``openat``), old and new.
TRACED = "open,openat,openat2,creat"


def run(spec: dict[str, Any], work: Path, *, under_strace: bool = False) -> dict[str, Any]:
    """Run the child on ``spec`` (keys: ``actions``, a list of ``[label, kind, args]``; ``cwd``;
    ``bypass``, a protection to switch off, for the tests that show the evidence can see a
    leak). Returns ``{"events": [...], "results": {label: outcome}, "strace": [...] | None}``."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "opened.json"
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out)}))
    cmd = [sys.executable, str(Path(__file__).resolve()), str(spec_path)]
    log = work / "strace.log"
    if under_strace:
        cmd = ["strace", "-f", "-y", "-qq", "-s", "4096", "-e", f"trace={TRACED}", "-o", str(log)]
        cmd += [sys.executable, str(Path(__file__).resolve()), str(spec_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evidence = json.loads(out.read_text())
    evidence["stderr"] = proc.stderr
    evidence["strace"] = parse_strace(log.read_text()) if under_strace else None
    return evidence


def strace_missing() -> str | None:
    """Why strace cannot run here, or None."""
    if shutil.which("strace") is None:
        return "strace is not installed (apt-get install strace)"
    probe = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat", "-o", os.devnull, "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"strace cannot trace here: {probe.stderr.strip()[:200]}"
    return None


_CALL = re.compile(
    r"^\d+\s+(?P<call>open|openat|openat2|creat)\("
    r"(?:(?:AT_FDCWD|-?\d+)(?:<(?P<dir>[^>]*)>)?, )?"
    r"\"(?P<path>(?:[^\"\\]|\\.)*)\""
)
_RESUMED = re.compile(r"^\d+\s+<\.\.\. (open|openat|openat2|creat) resumed>")
_RESULT = re.compile(r"\) += (?P<fd>-?\d+)(?:<(?P<real>.*)>)?(?: E[A-Z0-9]+ \(.*\))?$")


def parse_strace(text: str) -> list[dict[str, Any]]:
    """Every open call of a ``strace -f -y`` log: ``{"path": asked, made absolute against the
    call's directory descriptor; "real": the opened file (None when the call failed)}``.
    A call split by another thread (``<unfinished ...>`` / ``<... resumed>``) is joined."""
    calls: list[dict[str, Any]] = []
    pending: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        pid = line.split(" ", 1)[0]
        match = _CALL.match(line)
        if match:
            path = _unescape(match["path"])
            base = match["dir"] or "/"
            call = {"path": os.path.normpath(os.path.join(base, path)), "real": None}
            if line.endswith("<unfinished ...>"):
                pending[pid] = call
                continue
        elif _RESUMED.match(line) and pid in pending:
            call = pending.pop(pid)
        else:
            continue
        result = _RESULT.search(line)
        if result and int(result["fd"]) >= 0 and result["real"]:
            call["real"] = result["real"]
        calls.append(call)
    assert calls, "strace saw no open at all: the log is not what this parser reads"
    return calls


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


# --------------------------------------------------------------------------------------------
# the child


def _child(spec_path: str) -> None:
    import threading

    spec = json.loads(Path(spec_path).read_text())
    os.chdir(spec.get("cwd") or os.getcwd())
    events: list[dict[str, Any]] = []
    state = threading.local()
    current: list[str | None] = [None]

    real_open = os.open

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        state.dir_fd = dir_fd
        try:
            return real_open(path, flags, mode, dir_fd=dir_fd)
        finally:
            state.dir_fd = None

    for group in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks):
        if real_open in group:
            group.add(os_open)  # shutil and others test membership to pick their fd paths
    os.open = os_open  # type: ignore[assignment]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not args or isinstance(args[0], int) or args[0] is None:
            return
        path = os.fsdecode(os.fspath(args[0]))
        base = os.getcwd()
        dir_fd = getattr(state, "dir_fd", None)
        held = dir_fd is not None and not os.path.isabs(path)
        if held:
            base = os.readlink(f"/proc/self/fd/{dir_fd}")
        full = os.path.normpath(os.path.join(base, path))
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        nofollow = flags & getattr(os, "O_NOFOLLOW", 0)
        if held and nofollow and os.sep not in path:
            # one name in the directory the descriptor holds, which the kernel resolved when it
            # was opened: resolving its path again here would race with a process that swaps a
            # folder on that path for a symlink (and name where the symlink leads now)
            real = full
        elif nofollow:  # a final symlink is refused, not followed
            head, name = os.path.split(full)
            real = os.path.join(os.path.realpath(head), name)
        else:
            real = os.path.realpath(full)
        events.append({"action": current[0], "path": full, "real": real})

    sys.addaudithook(hook)

    import attncoda as ac
    from attncoda.cli import main

    if spec.get("bypass") == "contained":  # the store and file checks of ac.load, switched off
        from attncoda import _data

        _data._check_contained = lambda path, fmt: None
    elif spec.get("bypass") == "nofollow":  # the report's reads follow symlinks
        from attncoda import _atomic

        _atomic._NOFOLLOW = 0

    results: dict[str, str] = {}
    for label, kind, args in spec["actions"]:
        current[0] = label
        try:
            if kind == "load":
                ds = ac.load(args[0])
                results[label] = f"loaded {dict(ds.sizes)}"
            elif kind == "write_report":
                results[label] = f"wrote {ac.write_report(args[0], overwrite=True)}"
            elif kind == "cli":
                results[label] = f"exit {main(args)}"
            else:
                raise ValueError(kind)
        except Exception as exc:  # a refusal: the outcome, not the child's end
            results[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        finally:
            current[0] = None
    Path(spec["out"]).write_text(json.dumps({"events": events, "results": results}))


if __name__ == "__main__":
    _child(sys.argv[1])
