r"""The names every analysis shares: conventions, metrics and views, and the errors that refuse them.

Every comparison of attention rows has to decide what to do with the sink (the key at
``sink_index`` of each sample, by default the first visible key). Three named conventions:

``kept``
    the sink stays in the row: the row is compared as captured;
``dropped``
    the sink is removed and the rest renormalised: the content subcomposition
    :math:`\hat c = c / (1 - s)` is compared;
``split``
    the sink term and the content term are reported separately. The *sink term* applies the
    metric to the sink channel (the two-part composition :math:`(s, 1 - s)`; for the Aitchison
    geometry the balance :math:`b`), the *content term* applies it to :math:`\hat c` (so it equals
    the ``dropped`` comparison). For the Aitchison distance the two terms add up exactly to the
    ``kept`` one, :math:`d_A^2 = (b_x - b_y)^2 + d_A^2(\hat c_x, \hat c_y)`; for the other metrics
    no such identity exists, which is why their ``kept`` values mix two questions.

Metrics (all reported as dissimilarities, larger = farther apart; rows of two heads are only
compared at the same ``(sample, query)``, i.e. over the same visible keys):

============  ================================================================================
``aitchison`` squared Aitchison distance :math:`\|\mathrm{clr}\,x - \mathrm{clr}\,y\|^2`
``cosine``    cosine distance :math:`1 - x\cdot y / (\|x\| \|y\|)` of the probability vectors
``js``        Jensen-Shannon divergence (nats) :math:`H((x+y)/2) - (H(x) + H(y))/2`
``tv``        total variation :math:`\tfrac12 \sum_k |x_k - y_k|`
``kl``        Kullback-Leibler divergence :math:`KL(x_a \| x_b)` (not symmetric: row ``a``
              against column ``b``)
``entropy``   absolute entropy difference :math:`|H(x) - H(y)|`
============  ================================================================================

The analyses themselves: :mod:`attncoda._comparisons` (head-vs-head comparisons and
distances), :mod:`attncoda._flips` (verdict flips between conventions),
:mod:`attncoda._clustering`, :mod:`attncoda._profiles` (per-head profiles, sink rate) and
:mod:`attncoda._attribution` (entropy attribution).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ._errors import EXIT_USAGE, AttncodaError

__all__ = [
    "CONVENTIONS",
    "METRICS",
    "VIEWS",
    "AnalysisError",
    "DatasetMismatchError",
    "RowsRequiredError",
    "UnknownConventionError",
    "UnknownMetricError",
]


METRICS = ("aitchison", "cosine", "js", "tv", "kl", "entropy")
CONVENTIONS = ("kept", "dropped", "split")
#: What :func:`head_comparisons` stores per metric: the ``kept`` and ``dropped`` comparisons and
#: the sink term of ``split`` (the content term of ``split`` *is* the ``dropped`` comparison).
VIEWS = ("kept", "dropped", "sink")

_ALIASES = {
    "jensen-shannon": "js",
    "jensen_shannon": "js",
    "jsd": "js",
    "total_variation": "tv",
    "total-variation": "tv",
    "cos": "cosine",
    "entropy_difference": "entropy",
    "entropy-difference": "entropy",
    "aitchison2": "aitchison",
}
_LONG_NAMES = {
    "aitchison": "mean squared Aitchison distance over compared rows",
    "cosine": "mean cosine distance (1 - cosine similarity) over compared rows",
    "js": "mean Jensen-Shannon divergence (nats) over compared rows",
    "tv": "mean total variation distance over compared rows",
    "kl": "mean KL(row of unit_a || row of unit_b) (nats) over compared rows",
    "entropy": "mean absolute entropy difference (nats) over compared rows",
}


# --------------------------------------------------------------------------------------------
# errors


class AnalysisError(AttncodaError, ValueError):
    """Base class of the input errors raised by attncoda's analysis functions."""

    exit_code: ClassVar[int] = EXIT_USAGE


class UnknownMetricError(AnalysisError):
    """A metric name is not one of :data:`METRICS`."""


class UnknownConventionError(AnalysisError):
    """A convention is not ``kept``, ``dropped`` or ``split`` (or a view is not known)."""


class RowsRequiredError(AnalysisError):
    """The operation needs attention rows (``log_attn``), but the dataset only has summaries."""


class DatasetMismatchError(AnalysisError):
    """Two datasets that must describe the same rows (same dims and coordinates) do not."""


def _metric(name: str) -> str:
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in METRICS:
        raise UnknownMetricError(f"unknown metric {name!r}; choose one of {METRICS}")
    return key


def _metrics(names: str | Sequence[str] | None) -> tuple[str, ...]:
    if names is None:
        return METRICS
    if isinstance(names, str):
        names = [names]
    out = tuple(dict.fromkeys(_metric(n) for n in names))
    if not out:
        raise UnknownMetricError("no metric given")
    return out


def _view(name: str) -> str:
    """A comparison view: ``kept``, ``dropped``, ``sink`` (split's sink term) or ``content``."""
    key = str(name).lower()
    if key in ("content", "split_content", "split:content"):
        return "dropped"
    if key in ("split_sink", "split:sink"):
        return "sink"
    if key not in VIEWS:
        raise UnknownConventionError(
            f"unknown convention/view {name!r}; choose 'kept', 'dropped', or split's terms "
            "'sink' and 'content'"
        )
    return key


def _view_label(name: str) -> str:
    key = str(name).lower()
    return "content" if key in ("content", "split_content", "split:content") else _view(key)
