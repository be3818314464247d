"""The exception hierarchy and the exit codes of the ``attncoda`` command.

Every error attncoda raises on purpose derives from :class:`AttncodaError`, so a caller can catch
one class; each also keeps the builtin base it always had (``ValueError``, ``RuntimeError``,
``FileNotFoundError``, ...), so existing ``except ValueError`` code keeps working. Each class
carries the exit code the command line maps it to (``exit_code``): :data:`EXIT_USAGE` for input
the user can correct, :data:`EXIT_FAILURE` for a run that could not complete. Anything else that
escapes the command is a bug and exits with :data:`EXIT_INTERNAL`, so the three can be told apart
by a script.

Examples
--------
>>> import attncoda as ac
>>> issubclass(ac.NonFiniteError, ac.AttncodaError), issubclass(ac.NonFiniteError, ValueError)
(True, True)
>>> ac.NonFiniteError.exit_code
2
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "AttncodaError",
    "CompositionError",
    "DeviceMismatchError",
    "NegativePartError",
    "NonFiniteError",
    "NotClosedError",
    "OutputExistsError",
    "ShapeMismatchError",
    "TooFewPartsError",
    "ZeroPartError",
]

#: Exit codes of the ``attncoda`` command (also listed in ``attncoda --help``).
EXIT_OK = 0
#: The run could not complete (a corrupted file, a failed download, a full disk, ...).
EXIT_FAILURE = 1
#: Bad usage: an option, argument or input file the user can correct.
EXIT_USAGE = 2
#: An internal error: a bug in attncoda (the traceback is printed; please report it).
EXIT_INTERNAL = 70
#: Interrupted by the user (SIGINT, Ctrl-C): 128 + 2, as shells report it.
EXIT_INTERRUPTED = 130


class AttncodaError(Exception):
    """Root of every error that attncoda raises on purpose.

    The message says what is wrong and what to do, in one line. ``exit_code`` is the status the
    ``attncoda`` command exits with when this error ends it.
    """

    exit_code: ClassVar[int] = EXIT_FAILURE


class OutputExistsError(AttncodaError, FileExistsError):
    """An output path exists and may not be replaced (not attncoda's, or ``overwrite`` not set)."""

    exit_code: ClassVar[int] = EXIT_USAGE


class CompositionError(AttncodaError, ValueError):
    """Base class of every input error raised by attncoda's compositional core."""

    exit_code: ClassVar[int] = EXIT_USAGE


class NonFiniteError(CompositionError):
    """An input holds NaN or an infinity where a finite value is required."""


class NegativePartError(CompositionError):
    """A composition has a negative part."""


class ZeroPartError(CompositionError):
    """A log-ratio transform met a zero part that is not marked invisible.

    Structural zeros (keys hidden by the causal mask or by padding) must be excluded with
    ``mask=`` or passed as ``-inf`` log-inputs; rounding zeros in user data can be replaced with
    :func:`attncoda.multi_replace`.
    """


class NotClosedError(CompositionError):
    """Rows that must sum to one (probabilities) do not."""


class TooFewPartsError(CompositionError):
    """A row has fewer visible parts than the operation needs (at least two, or a non-empty group)."""


class ShapeMismatchError(CompositionError):
    """Shapes, axes, masks or bases do not fit together."""


class DeviceMismatchError(CompositionError):
    """Torch tensors that must be combined live on different devices."""
