"""The ``ds.coda`` accessor: attncoda's analysis and figures as methods of a dataset.

Registered on :class:`xarray.Dataset` when :mod:`attncoda` is imported. The accessor is stateless
(xarray creates a new one for every derived object). ``ds.coda.NAME(...)`` is
``attncoda.NAME(ds, ...)``: the same name, the same signature without the dataset, the same
docstring and the same result. Figures live under ``ds.coda.plot``, named like the
``attncoda.plot_*`` functions without the prefix: ``ds.coda.plot.sink_grid(...)`` is
``attncoda.plot_sink_grid(ds, ...)``. Methods apply to whatever dataset the function takes, e.g.
``ac.cluster_heads(ds).coda.plot.dendrograms()``.

Examples
--------
>>> import attncoda as ac
>>> ds = ac.testing.synthetic_rows(n_layers=2, n_heads=4)
>>> float(ds.coda.sink_rate(0.3))
0.5
>>> ds.coda.head_distances("cosine", "dropped").dims
('unit_a', 'unit_b')
>>> fig = ds.coda.cluster_heads("js", ks=(2,)).coda.plot.dendrograms()
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from . import _attribution, _clustering, _comparisons, _flips, _profiles, _rows
from . import _plot as pl
from . import _view as vw

__all__ = ["CodaAccessor"]


class _DatasetMethod:
    """``fn(ds, ...)`` as the method ``accessor.NAME(...)`` of an accessor holding ``ds``.

    On an instance it gives a bound method whose signature is ``fn``'s without its first
    argument; on the class, a function ``(self, ...)`` with ``fn``'s name and docstring (what
    ``help`` and Sphinx read). The descriptor, not a function, sits in the class ``__dict__`` and
    carries ``fn``'s ``__module__``, so doctest does not collect ``fn``'s examples a second time
    from the accessor's module.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        sig = inspect.signature(fn)
        rest = list(sig.parameters.values())[1:]
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

        def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return fn(self._ds, *args, **kwargs)

        functools.update_wrapper(method, fn)
        method.__signature__ = sig.replace(parameters=[self_param, *rest])  # type: ignore[attr-defined]
        self.method = method
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        # the attribute's name: ``plot.sink_grid`` wraps ``plot_sink_grid``
        self.method.__name__ = name
        self.method.__qualname__ = f"{owner.__qualname__}.{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self.method if obj is None else types.MethodType(self.method, obj)


class PlotAccessor:
    """Figures of a dataset: ``ds.coda.plot.NAME(...)`` is ``attncoda.plot_NAME(ds, ...)``.

    Parameters
    ----------
    ds : xarray.Dataset
        What the figure function takes: a capture, :func:`attncoda.head_profiles`,
        :func:`attncoda.cluster_heads`, :func:`attncoda.flip_rates` or
        :func:`attncoda.attribute_entropy` output.
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    sink_grid = _DatasetMethod(pl.plot_sink_grid)
    sink_vs_content = _DatasetMethod(pl.plot_sink_vs_content)
    rows = _DatasetMethod(pl.plot_rows)
    dendrograms = _DatasetMethod(pl.plot_dendrograms)
    flip_table = _DatasetMethod(pl.plot_flip_table)
    entropy_attribution = _DatasetMethod(pl.plot_entropy_attribution)


@xr.register_dataset_accessor("coda")
class CodaAccessor:
    """Analysis of attention rows under named conventions (``kept``, ``dropped``, ``split``).

    ``ds.coda.NAME(...)`` is ``attncoda.NAME(ds, ...)`` for :func:`~attncoda.head_profiles`,
    :func:`~attncoda.sink_rate`, :func:`~attncoda.head_comparisons`,
    :func:`~attncoda.head_distances`, :func:`~attncoda.flip_rates`,
    :func:`~attncoda.cluster_heads` and :func:`~attncoda.attribute_entropy`; ``ds.coda.plot``
    holds the figures (:class:`PlotAccessor`). ``ds.coda.view(...)`` is
    :func:`~attncoda.head_view` (an interactive, offline view of one head) and
    ``ds.coda.decompose()`` the summaries dataset of a rows dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        A capture in attncoda's schema (rows and/or summaries), or the output of an analysis
        (for its figures).
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    head_profiles = _DatasetMethod(_profiles.head_profiles)
    sink_rate = _DatasetMethod(_profiles.sink_rate)
    head_comparisons = _DatasetMethod(_comparisons.head_comparisons)
    head_distances = _DatasetMethod(_comparisons.head_distances)
    flip_rates = _DatasetMethod(_flips.flip_rates)
    cluster_heads = _DatasetMethod(_clustering.cluster_heads)
    attribute_entropy = _DatasetMethod(_attribution.attribute_entropy)
    #: ``ds.coda.view(...)`` is :func:`attncoda.head_view` (``ds``, ...): the name the
    #: interactive view goes by in notebooks.
    view = _DatasetMethod(vw.head_view)

    def decompose(self, *, sink: Any = None) -> xr.Dataset:
        """The summaries dataset of a rows dataset: each row split into sink and content.

        What ``attncoda capture --what summaries`` would have written for the same tokens:
        the summary variables (``sink_share``, ``sink_logodds``, ``balance``, ``entropy``,
        ``content_entropy``) computed from
        ``log_attn`` with :func:`attncoda.decompose`, the rows dropped, coordinates (tokens,
        sink positions) and attributes kept. Summaries already present are recomputed. A row
        whose only visible key is the sink gets ``s = 1``, infinite log-odds and entropy 0, as
        in a capture; other rows without a sink or a content key get NaN.

        Parameters
        ----------
        sink : optional
            Key position of each sample's sink; default the ``sink_index`` coordinate (which
            the result then records).

        Returns
        -------
        xarray.Dataset
            Dims ``sample, layer, head, query`` (and ``position`` for per-token coordinates).

        Raises
        ------
        RowsRequiredError
            If the dataset has no rows (``log_attn``).

        Examples
        --------
        >>> import attncoda as ac
        >>> rows = ac.testing.synthetic_rows(n_layers=2, n_heads=3)
        >>> summ = rows.drop_vars(list(ac.SUMMARY_VARIABLES)).coda.decompose()
        >>> sorted(summ.data_vars) == sorted(ac.SUMMARY_VARIABLES), "log_attn" in summ
        (True, False)
        """
        ds = self._ds
        summ = _profiles._row_summaries(ds, sink)
        sinks = _rows._sink_positions(ds, sink)
        if sink is not None:
            ds = ds.assign_coords(sink_index=("sample", sinks))
        # rows whose only visible key is the sink: all mass on it, as capture records them
        vis = np.isfinite(np.asarray(ds["log_attn"].values))
        only_sink = (vis.sum(-1) == 1) & np.take_along_axis(
            vis, sinks[:, None, None, None, None], axis=-1
        )[..., 0]
        fill = {"sink_share": 1.0, "sink_logodds": np.inf, "entropy": 0.0}
        out = ds.drop_vars(["log_attn", *(v for v in summ.data_vars if v in ds.data_vars)])
        out = out.drop_dims("key", errors="ignore")
        for name in summ.data_vars:
            val = np.asarray(summ[name].values, np.float32)
            if name in fill:
                val = np.where(only_sink, np.float32(fill[name]), val)
            out[name] = (summ[name].dims, val, dict(ds[name].attrs) if name in ds else {})
        return out

    @property
    def plot(self) -> PlotAccessor:
        """Figures of this dataset, named like the ``attncoda.plot_*`` functions without the prefix.

        Examples
        --------
        >>> import attncoda as ac
        >>> fig = ac.testing.synthetic_rows().coda.plot.sink_grid()
        """
        return PlotAccessor(self._ds)
