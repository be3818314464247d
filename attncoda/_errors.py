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

from numpy.exceptions import AxisError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "AttncodaError",
    "AxisOutOfRangeError",
    "CompositionError",
    "DeviceMismatchError",
    "ForeignFileError",
    "InputError",
    "NegativePartError",
    "NonFiniteError",
    "NotClosedError",
    "OutputError",
    "OutputExistsError",
    "PartIndexError",
    "ShapeMismatchError",
    "TooFewPartsError",
    "ZeroPartError",
    "require_int",
    "require_real",
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


class InputError(AttncodaError, ValueError):
    """An argument has the wrong type or lies outside its documented range."""

    exit_code: ClassVar[int] = EXIT_USAGE


class OutputError(AttncodaError, OSError):
    """An output cannot be written where asked (its folder is missing rights, or is a file)."""

    exit_code: ClassVar[int] = EXIT_USAGE


class OutputExistsError(OutputError, FileExistsError):
    """An output path exists and may not be replaced (not attncoda's, or ``overwrite`` not set)."""


class ForeignFileError(InputError):
    """A file that attncoda was asked to read back is not one it wrote: outside its folder,
    reached through a symlink, not listed with its sha256 in the folder's stamp, or changed."""


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
    """A row has fewer visible parts than the operation needs (at least two, or a non-empty group).

    Raised under ``degenerate="raise"``, the default of every maths function that can meet such
    a row (the first query of a causal model sees one key); ``degenerate="nan"`` gives NaN in
    those rows instead.
    """


class ShapeMismatchError(CompositionError):
    """Shapes, axes, masks or bases do not fit together."""


class PartIndexError(ShapeMismatchError, IndexError):
    """An index into the parts of a row (``ref``, a sink, a group member) is out of range.

    An ``IndexError`` as in Python and scikit-bio (``alr(x, ref_idx=5)`` on 3 parts), and
    still a :class:`ShapeMismatchError` (a ``ValueError``) for code that caught that.
    """


class AxisOutOfRangeError(ShapeMismatchError, AxisError):
    """An ``axis=`` outside ``[-ndim, ndim)``.

    numpy's :class:`~numpy.exceptions.AxisError` (itself a ``ValueError`` and an
    ``IndexError``), as numpy and scikit-bio raise it, and still a :class:`ShapeMismatchError`.
    """


class DeviceMismatchError(CompositionError):
    """Torch tensors that must be combined live on different devices."""


def require_int(
    value: object, name: str, *, low: int | None = None, high: int | None = None
) -> int:
    """``value`` as an int, refusing bools, floats and anything out of ``[low, high]``.

    Raises
    ------
    InputError
        One line naming ``name``, the value and the allowed range.

    Examples
    --------
    >>> require_int(3, "passages", low=1)
    3
    >>> require_int(1.0, "passages", low=1)
    Traceback (most recent call last):
    ...
    attncoda._errors.InputError: passages must be a whole number, got 1.0 (float)
    """
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    out = int(value)
    if (low is not None and out < low) or (high is not None and out > high):
        where = (
            f"from {low} to {high}"
            if low is not None and high is not None
            else (f">= {low}" if low is not None else f"<= {high}")
        )
        raise InputError(f"{name} must be {where}, got {out}")
    return out


def require_real(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    finite: bool = True,
) -> float:
    """``value`` as a float, refusing bools, NaN, infinities (unless ``finite=False``) and
    anything out of ``[low, high]``.

    Raises
    ------
    InputError

    Examples
    --------
    >>> require_real(0.5, "threshold", low=0, high=1)
    0.5
    """
    import math
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    out = float(value)
    if math.isnan(out) or (finite and math.isinf(out)):
        raise InputError(f"{name} must be a finite number, got {out}")
    if (low is not None and out < low) or (high is not None and out > high):
        raise InputError(f"{name} must lie in [{low}, {high}], got {out}")
    return out
