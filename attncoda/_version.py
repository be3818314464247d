"""The installed version of attncoda (one place, read by the package and its modules)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attncoda")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"
