"""Exception classes raised by attncoda for bad input.

Every class derives from :class:`CompositionError`, itself a :class:`ValueError`, so callers can
catch one base class. Each message says what is wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "CompositionError",
    "DeviceMismatchError",
    "NegativePartError",
    "NonFiniteError",
    "NotClosedError",
    "ShapeMismatchError",
    "TooFewPartsError",
    "ZeroPartError",
]


class CompositionError(ValueError):
    """Base class of every input error raised by attncoda's compositional core."""


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
