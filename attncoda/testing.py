"""Sample data and fault injectors for tests of code built on attncoda (as :mod:`xarray.testing`).

:func:`synthetic_rows`
    A small capture in attncoda's schema (rows and summaries), without a model: for examples,
    docs and unit tests of analyses.
:class:`DieOnce`
    Kills a worker process once, mid-job, after scribbling NaN over the job's region of a zarr
    store: for drills of :func:`attncoda.hooks.distributed.run_jobs` (resume, no corruption).

Examples
--------
>>> from attncoda.testing import synthetic_rows
>>> synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=4).log_attn.dims
('sample', 'layer', 'head', 'query', 'key')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xarray as xr

from ._data import SUMMARY_VARIABLES, make_dataset
from ._decompose import decompose

__all__ = ["DieOnce", "synthetic_rows"]


def synthetic_rows(
    n_samples: int = 2,
    n_layers: int = 2,
    n_heads: int = 4,
    length: int = 12,
    *,
    sink_logits: Any = None,
    seed: int = 0,
    dtype: Any = np.float32,
    causal: bool = True,
) -> xr.Dataset:
    """A small synthetic capture (rows and summaries) with the schema of ``what="both"``.

    Head ``h`` of layer ``l`` gets a sink logit ``sink_logits[l, h]`` on key 0 (default: spread
    from -3 to 5 over the heads of each layer, so half the heads are sink-heavy), a head-specific
    preference for the previous token or for recent keys, and Gaussian noise. Rows are
    log-softmaxes over the visible keys (causal by default), ``-inf`` elsewhere. Tokens are
    drawn from a small English vocabulary (``token_id`` and the ``token`` text), with ``<bos>``
    at key 0.

    Parameters
    ----------
    n_samples, n_layers, n_heads, length : int
    sink_logits : array_like (n_layers, n_heads), optional
    seed : int
    dtype : numpy dtype, default float32
    causal : bool, default True

    Returns
    -------
    xarray.Dataset

    Examples
    --------
    >>> from attncoda.testing import synthetic_rows
    >>> ds = synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=4)
    >>> ds.log_attn.dims
    ('sample', 'layer', 'head', 'query', 'key')
    """
    rng = np.random.default_rng(seed)
    if sink_logits is None:
        sink_logits = np.tile(np.linspace(-3, 5, n_heads), (n_layers, 1))
    sink_logits = np.broadcast_to(np.asarray(sink_logits, np.float64), (n_layers, n_heads))
    q = np.arange(length)[:, None]
    k = np.arange(length)[None, :]
    prev = (k == q - 1).astype(np.float64)
    recency = -np.abs(q - k) / 3.0
    style = rng.random((n_layers, n_heads, 2)) * np.array([4.0, 2.0])
    z = (
        rng.standard_normal((n_samples, n_layers, n_heads, length, length))
        + style[None, :, :, 0, None, None] * prev
        + style[None, :, :, 1, None, None] * recency
    )
    z[..., 0] = sink_logits[None, :, :, None]
    if causal:
        z = np.where(k <= q, z, -np.inf)
    m = z.max(-1, keepdims=True)
    z = z - (np.log(np.exp(z - m).sum(-1, keepdims=True)) + m)
    d = decompose(z, from_logits=True, degenerate="nan")
    summaries = {name: getattr(d, name) for name in SUMMARY_VARIABLES}
    token_ids = rng.integers(4, 100, (n_samples, length))
    token_ids[:, 0] = _BOS  # key 0, the sink, is a BOS as in models whose tokenizer adds one
    return make_dataset(
        summaries=summaries,
        log_attn=z.astype(dtype),
        layers=range(n_layers),
        heads=range(n_heads),
        query_positions=range(length),
        token_ids=token_ids,
        tokens=np.asarray(_VOCABULARY, dtype=object)[token_ids],
        attrs={"model_id": "synthetic", "family": "synthetic"},
    )


# the synthetic vocabulary: ids 0-3 special (1 is the BOS), then words with their leading space
_BOS = 1
_WORDS = (
    "the of and to a in that is was he for it with as his on be at by had not are but from or "
    "have an they which one you were her all she there would their we him been has when who will "
    "more no if out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made after also "
    "did many before must through back years where much your way well down should because each "
    "just those people"
).split()
_VOCABULARY = ("<pad>", "<bos>", "<eos>", "<unk>", *(" " + w for w in _WORDS))[:100]


class _Job(Protocol):
    name: str


class _Slot(Protocol):
    """What :class:`DieOnce` reads of the job slot it is called with (a job of
    :func:`attncoda.hooks.distributed.run_jobs` and its windows in the store)."""

    job: _Job
    group: str
    start: int
    count: int


class DieOnce:
    """Fault injection for tests and drills: kill the worker process once, mid-job.

    Passed as ``_before_marker`` to :func:`attncoda.hooks.distributed.run_jobs`, it scribbles
    NaN over the job's region of the store (a half-written job) and exits the process without
    cleanup (status 17), the first time only (``flag``, a file, remembers). The job then has no
    completion marker, so dask's retry or the next run writes it again in full.

    Parameters
    ----------
    flag : str or os.PathLike
        Created (holding the job's name) when the process is killed; while it exists,
        :class:`DieOnce` does nothing.
    store : str or os.PathLike
        The zarr store of the jobs.
    """

    def __init__(self, flag: str | os.PathLike[str], store: str | os.PathLike[str]) -> None:
        self.flag = Path(flag)
        self.store = str(store)

    def __call__(self, slot: _Slot) -> None:
        if self.flag.exists():
            return
        self.flag.write_text(slot.job.name)
        region = {"sample": slice(slot.start, slot.start + slot.count)}
        garbage = xr.open_zarr(self.store, group=slot.group, consolidated=False).isel(region)
        bad = xr.Dataset({"sink_share": xr.full_like(garbage.sink_share.load(), np.nan)})
        bad.drop_vars(list(bad.coords)).to_zarr(self.store, group=slot.group, region=region)
        os._exit(17)
