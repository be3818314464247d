"""attncoda: attention rows as compositional data."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attncoda")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"

__all__ = ["__version__"]
