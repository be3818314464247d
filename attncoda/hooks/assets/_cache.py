"""The cache: where it is, and whether an asset in it is present and intact (verification).

Every asset folder carries a ``manifest.json`` with the size and sha256 of each file;
:func:`asset_status` (and :func:`asset_path`, :func:`is_fetched`) check a folder against it,
hashing only the files whose verified stamp (:mod:`._stamps`) no longer matches.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ._errors import AssetDamagedError, AssetNotFoundError
from ._registry import Asset, get_asset
from ._stamps import _file_key, _read_stamp, _StampWriter

__all__ = [
    "CACHE_ENV",
    "AssetStatus",
    "FileProblem",
    "asset_path",
    "asset_status",
    "default_cache_dir",
    "is_fetched",
    "resolve_cache_dir",
]


#: Environment variable that overrides the cache directory.
CACHE_ENV = "ATTNCODA_CACHE"

#: Name of the manifest written last into every cached asset folder.
MANIFEST = "manifest.json"

#: The states of a cached asset (see :class:`AssetStatus`).
AssetState = Literal["fetched", "missing", "damaged", "stale"]


# --------------------------------------------------------------------------------------------
# Cache paths
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """The cache directory: ``$ATTNCODA_CACHE`` if set and non-empty, else ``~/.cache/attncoda``.

    Examples
    --------
    >>> import os
    >>> os.environ["ATTNCODA_CACHE"] = "/tmp/attncoda-cache"
    >>> default_cache_dir()
    PosixPath('/tmp/attncoda-cache')
    >>> del os.environ["ATTNCODA_CACHE"]
    """
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "attncoda"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory to use: ``cache_dir`` if given, else :func:`default_cache_dir`.

    Examples
    --------
    >>> resolve_cache_dir("~/my-cache") == Path.home() / "my-cache"
    True
    """
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _final_path(asset: Asset, root: Path) -> Path:
    return root / asset.subdir / asset.name


def _read_manifest(folder: Path) -> dict[str, Any]:
    with open(folder / MANIFEST, encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


# --------------------------------------------------------------------------------------------
# Verification: sha256 of every listed file, with a verified stamp as the fast path
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileProblem:
    """One file of a cached asset that does not match its manifest.

    Attributes
    ----------
    path
        The file's path inside the asset folder, as the manifest lists it.
    expected
        The sha256 the manifest records.
    actual
        The file's sha256, or ``"missing"``.
    """

    path: str
    expected: str
    actual: str

    def describe(self) -> str:
        """One phrase: ``PATH has sha256 ACTUAL, expected EXPECTED`` (12-digit prefixes)."""
        if self.actual == "missing":
            return f"{self.path} is missing"
        return f"{self.path} has sha256 {self.actual[:12]}, expected {self.expected[:12]}"


@dataclass(frozen=True)
class AssetStatus:
    """The state of an asset's cached copy, as :func:`asset_status` finds it.

    Attributes
    ----------
    name
        The asset name.
    folder
        Where the asset lives (or would live) in the cache.
    state
        ``"fetched"`` (every listed file has its manifest's sha256), ``"missing"`` (no folder),
        ``"damaged"`` (a listed file is missing or has another sha256, or the manifest is
        unreadable) or ``"stale"`` (built from other pins or by an older recipe).
    reason
        What is wrong, as the phrase that follows ``asset 'NAME'`` in an error message; empty
        when fetched.
    problems
        The damaged files, in manifest order (empty unless a file is damaged).
    hashed
        The files this check hashed in full; the others passed by their verified stamp.
    manifest_sha256
        sha256 of the manifest's bytes (None without a readable manifest).
    """

    name: str
    folder: Path
    state: AssetState
    reason: str = ""
    problems: tuple[FileProblem, ...] = ()
    hashed: tuple[str, ...] = ()
    manifest_sha256: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the copy is fetched and intact."""
        return self.state == "fetched"

    def error(self, command: str, root: Path) -> AssetNotFoundError:
        """The one-line error that refuses this copy; ``command`` is the fetch command to name."""
        if self.state == "damaged":
            return AssetDamagedError(
                f"asset {self.name!r} {self.reason}; run `{command}` to repair it (cache: {root})"
            )
        return AssetNotFoundError(
            f"asset {self.name!r} {self.reason}; run `{command}` to fetch it (cache: {root})"
        )


def _manifest_entries(manifest: Mapping[str, Any]) -> list[tuple[str, int, str]] | None:
    """The manifest's ``(path, bytes, sha256)`` entries, or None if the list is malformed."""
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return None
    out = []
    for entry in files:
        if not isinstance(entry, dict):
            return None
        path, size, sha = entry.get("path"), entry.get("bytes"), entry.get("sha256")
        if not (isinstance(path, str) and isinstance(size, int) and isinstance(sha, str)):
            return None
        parts = Path(path).parts
        if not parts or Path(path).is_absolute() or ".." in parts or path == MANIFEST:
            return None
        out.append((path, size, sha))
    return out


def _check_cached(asset: Asset, root: Path, *, full: bool = False) -> AssetStatus:
    """The state of the cached copy of ``asset`` under ``root``.

    Every file the manifest lists is checked: by its stamp entry when that still matches its
    size, mtime and ctime (unless ``full``), else by a full sha256. Files hashed in full and found
    intact are stamped (when the cache is writable).
    """
    folder = _final_path(asset, root)
    name = asset.name
    if not folder.is_dir():
        return AssetStatus(name, folder, "missing", "is not fetched")
    try:
        raw = (folder / MANIFEST).read_bytes()
        manifest = json.loads(raw)
        if not isinstance(manifest, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        return AssetStatus(
            name, folder, "damaged", f"is incomplete in {folder} (no readable {MANIFEST})"
        )
    manifest_sha = hashlib.sha256(raw).hexdigest()
    if manifest.get("fingerprint") != asset.fingerprint():
        return AssetStatus(
            name,
            folder,
            "stale",
            f"in {folder} was built from other pins or by an older recipe",
            manifest_sha256=manifest_sha,
        )
    entries = _manifest_entries(manifest)
    if entries is None:
        return AssetStatus(
            name,
            folder,
            "damaged",
            f"is damaged in {folder} ({MANIFEST} has no valid file list)",
            manifest_sha256=manifest_sha,
        )
    stamp = {} if full else _read_stamp(root, name, manifest_sha)
    writer: _StampWriter | None = None
    verified: dict[str, list[Any]] = {}
    problems: list[FileProblem] = []
    hashed: list[str] = []
    for rel, _size, expected in entries:
        path = folder / rel
        try:
            before = path.stat()
        except OSError:
            problems.append(FileProblem(rel, expected, "missing"))
            continue
        record = [*_file_key(before), expected]
        if stamp.get(rel) == record:
            verified[rel] = record
            continue
        if writer is None:
            writer = _StampWriter(root, name)  # before the first hash: see _StampWriter
        try:
            actual = _sha256_file(path)
            after = path.stat()
        except OSError:
            problems.append(FileProblem(rel, expected, "missing"))
            continue
        hashed.append(rel)
        if actual != expected:
            problems.append(FileProblem(rel, expected, actual))
        elif _file_key(after) == _file_key(before) and writer.trusts(after):
            verified[rel] = record
    if writer is not None:
        writer.commit(manifest_sha, verified)
    if problems:
        more = f" and {len(problems) - 1} more file(s)" if len(problems) > 1 else ""
        return AssetStatus(
            name,
            folder,
            "damaged",
            f"is damaged in {folder}: {problems[0].describe()}{more} (changed after it was "
            "fetched)",
            tuple(problems),
            tuple(hashed),
            manifest_sha,
        )
    return AssetStatus(name, folder, "fetched", "", (), tuple(hashed), manifest_sha)


def _fetch_command(asset: Asset, root: Path, cache_dir: object) -> str:
    cache_opt = "" if cache_dir is None else f" --cache-dir {root}"
    return f"{asset.fetch_command}{cache_opt}"


def asset_status(
    name: str, cache_dir: str | os.PathLike[str] | None = None, *, full: bool = False
) -> AssetStatus:
    """Check the cached copy of an asset and say what state it is in; never raises for a bad copy.

    Every file the asset's manifest lists (weights, config and tokenizer files, documents,
    licences) is checked against the manifest's sha256. A file whose verified stamp entry still
    matches its size, ``mtime_ns`` and ``ctime_ns`` passes without being read; any other file is
    hashed in full, and the stamp (``.verified/NAME.json`` in the cache) is rewritten for the
    files found intact, atomically, unless the cache is read-only. Nothing is downloaded.

    Parameters
    ----------
    name
        A registered asset name (see :func:`list_assets`).
    cache_dir
        Cache directory; default :func:`default_cache_dir`.
    full
        Hash every file in full, ignoring the stamp (what ``attncoda fetch --verify`` does). This
        also catches a change that left a file's size and times as they were (bit rot, a write
        to the raw device), which the stamp cannot see.

    Returns
    -------
    AssetStatus
        ``state`` is ``"fetched"``, ``"missing"``, ``"damaged"`` or ``"stale"``.

    Raises
    ------
    UnknownAssetError
        If ``name`` is not registered.

    Examples
    --------
    >>> asset_status("austen", cache_dir="/nonexistent").state
    'missing'
    >>> asset_status("austen").problems  # doctest: +SKIP
    ()
    """
    asset = get_asset(name)
    return _check_cached(asset, resolve_cache_dir(cache_dir), full=full)


def asset_path(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the folder of a fetched asset, after checking every file's sha256.

    The folder is valid only if its manifest is present and matches the current pins, and every
    file it lists has the manifest's sha256 (checked as :func:`asset_status` does: a file
    unchanged since its last full hash passes by its verified stamp). Nothing is downloaded.

    Parameters
    ----------
    name
        A registered asset name (see :func:`list_assets`).
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    UnknownAssetError
        If ``name`` is not registered.
    AssetDamagedError
        If a listed file is missing or has another sha256, or the manifest is unreadable; the
        one-line message names the file, both sha256 prefixes and ``attncoda fetch NAME``, which
        repairs it.
    AssetNotFoundError
        If the asset is missing or stale; the message names ``attncoda fetch NAME``.

    Examples
    --------
    >>> asset_path("austen")  # doctest: +SKIP
    PosixPath('/home/me/.cache/attncoda/corpora/austen')
    """
    asset = get_asset(name)
    root = resolve_cache_dir(cache_dir)
    status = _check_cached(asset, root)
    if not status.ok:
        raise status.error(_fetch_command(asset, root, cache_dir), root)
    return status.folder


def is_fetched(name: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether :func:`asset_path` would succeed for ``name`` (fetched and intact).

    Examples
    --------
    >>> is_fetched("austen", cache_dir="/nonexistent")
    False
    """
    try:
        asset_path(name, cache_dir)
    except AssetNotFoundError:
        return False
    return True


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
