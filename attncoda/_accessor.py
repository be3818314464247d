"""The ``ds.coda`` accessor: attncoda's analysis and figures as methods of a captured dataset.

Registered on :class:`xarray.Dataset` when :mod:`attncoda` is imported. The accessor is stateless
(xarray creates a new one for every derived object): each method calls the function of the same
name in :mod:`attncoda` with the dataset as first argument.

Examples
--------
>>> import attncoda as ac
>>> ds = ac.testing.synthetic_rows(n_layers=2, n_heads=4)
>>> float(ds.coda.sink_rate(0.3))
0.5
>>> ds.coda.head_distances("cosine", "dropped").dims
('unit_a', 'unit_b')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xarray as xr

from . import _analysis as an

__all__ = ["CodaAccessor"]


@xr.register_dataset_accessor("coda")
class CodaAccessor:
    """Analysis of attention rows under named conventions (``kept``, ``dropped``, ``split``).

    Parameters
    ----------
    ds : xarray.Dataset
        A capture in attncoda's schema (rows and/or summaries).
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    # analysis ---------------------------------------------------------------------------------
    def profiles(self, **kwargs: Any) -> xr.Dataset:
        """Per-head profiles; see :func:`attncoda.head_profiles`.

        Examples
        --------
        >>> import attncoda as ac
        >>> ac.testing.synthetic_rows().coda.profiles().sink_share.dims
        ('layer', 'head')
        """
        return an.head_profiles(self._ds, **kwargs)

    def sink_rate(self, threshold: float = 0.3, **kwargs: Any) -> xr.DataArray:
        """Share of heads with mean sink share above ``threshold``; see :func:`attncoda.sink_rate`.

        Examples
        --------
        >>> import attncoda as ac
        >>> ac.testing.synthetic_rows(n_layers=1, n_heads=4).coda.sink_rate(0.3).item()
        0.5
        """
        return an.sink_rate(self._ds, threshold, **kwargs)

    def comparisons(self, metrics: str | Sequence[str] | None = None, **kwargs: Any) -> xr.Dataset:
        """All head-vs-head comparisons; see :func:`attncoda.head_comparisons`.

        Examples
        --------
        >>> import attncoda as ac
        >>> ac.testing.synthetic_rows().coda.comparisons("tv").view.values.tolist()
        ['kept', 'dropped', 'sink']
        """
        return an.head_comparisons(self._ds, metrics, **kwargs)

    def head_distances(
        self, metric: str = "aitchison", convention: str = "kept", **kwargs: Any
    ) -> xr.DataArray:
        """Head-vs-head dissimilarities; see :func:`attncoda.head_distances`.

        Examples
        --------
        >>> import attncoda as ac
        >>> ac.testing.synthetic_rows(n_heads=3).coda.head_distances("js", "split").dims
        ('term', 'unit_a', 'unit_b')
        """
        return an.head_distances(self._ds, metric, convention, **kwargs)

    def flip_rates(self, metrics: str | Sequence[str] | None = None, **kwargs: Any) -> xr.Dataset:
        """Verdict flips between conventions; see :func:`attncoda.flip_rates`.

        Examples
        --------
        >>> import attncoda as ac
        >>> fr = ac.testing.synthetic_rows(n_samples=3).coda.flip_rates("cosine", n_boot=10)
        >>> fr.flip_rate.dims
        ('metric', 'pair', 'scope')
        """
        return an.flip_rates(self._ds, metrics, **kwargs)

    def cluster(self, metric: str = "js", **kwargs: Any) -> xr.Dataset:
        """Head clustering under each convention; see :func:`attncoda.cluster_heads`.

        Examples
        --------
        >>> import attncoda as ac
        >>> ac.testing.synthetic_rows(n_layers=2, n_heads=3).coda.cluster("js", ks=(2,)).ari.dims
        ('pair', 'k')
        """
        return an.cluster_heads(self._ds, metric, **kwargs)

    def attribute_entropy(self, other: xr.Dataset | None = None, **kwargs: Any) -> xr.Dataset:
        """Entropy change split into sink and content parts; see :func:`attncoda.attribute_entropy`.

        Examples
        --------
        >>> import attncoda as ac
        >>> att = ac.testing.synthetic_rows(n_layers=3).coda.attribute_entropy(along="layer")
        >>> att.transition.values.tolist()
        ['0->1', '1->2']
        """
        return an.attribute_entropy(self._ds, other, **kwargs)

    # figures ----------------------------------------------------------------------------------
    def plot_sink_grid(self, **kwargs: Any) -> Any:
        """Layer x head grid of mean sink share; see :func:`attncoda.plot_sink_grid`.

        Examples
        --------
        >>> import attncoda as ac
        >>> fig = ac.testing.synthetic_rows().coda.plot_sink_grid()
        """
        from ._plot import plot_sink_grid

        return plot_sink_grid(self._ds, **kwargs)

    def plot_sink_vs_content(self, **kwargs: Any) -> Any:
        """Sink share vs content entropy per head; see :func:`attncoda.plot_sink_vs_content`.

        Examples
        --------
        >>> import attncoda as ac
        >>> fig = ac.testing.synthetic_rows().coda.plot_sink_vs_content()
        """
        from ._plot import plot_sink_vs_content

        return plot_sink_vs_content(self._ds, **kwargs)

    def plot_rows(self, **kwargs: Any) -> Any:
        """Sink bar and renormalised content heatmap of single rows; see :func:`attncoda.plot_rows`.

        Examples
        --------
        >>> import attncoda as ac
        >>> fig = ac.testing.synthetic_rows().coda.plot_rows(layer=0, head=3)
        """
        from ._plot import plot_rows

        return plot_rows(self._ds, **kwargs)

    def plot_dendrograms(self, metric: str = "js", **kwargs: Any) -> Any:
        """Dendrograms side by side per convention; see :func:`attncoda.plot_dendrograms`.

        Examples
        --------
        >>> import attncoda as ac
        >>> fig = ac.testing.synthetic_rows(n_layers=2, n_heads=3).coda.plot_dendrograms("js")
        """
        from ._plot import plot_dendrograms

        return plot_dendrograms(an.cluster_heads(self._ds, metric), **kwargs)
