"""The errors of the model zoo: a model name nothing accepts, a model nothing can provide."""

from __future__ import annotations

from typing import ClassVar

from attncoda import EXIT_USAGE, AttncodaError

__all__ = [
    "ModelUnavailableError",
    "UnknownModelError",
]


class UnknownModelError(AttncodaError, ValueError):
    """A model name is none of the forms :func:`check_model` accepts."""

    exit_code: ClassVar[int] = EXIT_USAGE


class ModelUnavailableError(AttncodaError, OSError):
    """A model could be found neither in the offline assets nor on a reachable hub."""
