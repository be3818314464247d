"""The xarray data model of captured attention, its validation, and atomic save/load.

Dims ``sample, layer, head, query, key`` (query and key are token positions) plus ``position``
for per-token coordinates. Variables:

``log_attn`` (sample, layer, head, query, key)
    fp32 log-attention, ``-inf`` at invisible keys (rows mode).
``sink_share``, ``sink_logodds``, ``balance``, ``entropy``, ``content_entropy``
    (sample, layer, head, query) summaries; NaN where undefined (a row with no content key).
``learned_sink_log_attn`` (sample, layer, head, query)
    log-mass of a learned (GPT-OSS style) sink, when captured with ``sink="learned"``.
``token_id`` (sample, position), ``sink_index`` (sample)
    coordinates.

Attributes are netCDF-safe: strings and numbers only (the capture spec is a JSON string,
booleans are 0/1).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ._errors import EXIT_USAGE, AttncodaError

__all__ = [
    "DIMS",
    "SUMMARY_VARIABLES",
    "SchemaError",
    "load",
    "make_dataset",
    "save",
    "validate_dataset",
]

DIMS = ("sample", "layer", "head", "query", "key")
SUMMARY_VARIABLES = ("sink_share", "sink_logodds", "balance", "entropy", "content_entropy")
_SUMMARY_ATTRS = {
    "sink_share": "attention mass on the sink key(s)",
    "sink_logodds": "log(s / (1 - s)) of the sink share s",
    "balance": "sqrt(n/(n+1)) log(s / g(c)): first pivot ilr coordinate, sink vs content",
    "entropy": "Shannon entropy of the row over visible keys (nats)",
    "content_entropy": "entropy of the content subcomposition c / (1 - s) (nats)",
}


class SchemaError(AttncodaError, ValueError):
    """A dataset does not follow attncoda's schema."""

    exit_code: ClassVar[int] = EXIT_USAGE


def make_dataset(
    *,
    summaries: Mapping[str, np.ndarray] | None = None,
    log_attn: np.ndarray | None = None,
    learned_sink_log_attn: np.ndarray | None = None,
    layers: Sequence[int],
    heads: Sequence[int],
    query_positions: Sequence[int] | np.ndarray,
    n_keys: int | None = None,
    token_ids: np.ndarray | None = None,
    sink_index: Sequence[int] | np.ndarray | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Build a dataset in attncoda's schema from arrays.

    Parameters
    ----------
    summaries : mapping of name -> array (sample, layer, head, query), optional
    log_attn : array (sample, layer, head, query, key), optional
    learned_sink_log_attn : array (sample, layer, head, query), optional
    layers, heads : sequences of int
        Coordinates (the model's layer and head indices).
    query_positions : sequence of int
        Token position of each query.
    n_keys : int, optional
        Number of key positions (defaults to ``log_attn.shape[-1]`` or ``max(query)+1``).
    token_ids : array (sample, position), optional
    sink_index : array (sample,), optional
        First valid key of each sample.
    attrs : mapping, optional
        Provenance; dicts and lists are JSON-encoded, booleans stored as 0/1.

    Returns
    -------
    xarray.Dataset

    Examples
    --------
    >>> import numpy as np, attncoda as ac
    >>> s = {k: np.zeros((1, 2, 3, 4), np.float32) for k in ac.SUMMARY_VARIABLES}
    >>> ds = ac.make_dataset(summaries=s, layers=[0, 1], heads=[0, 1, 2], query_positions=range(4))
    >>> dict(ds.sizes)
    {'sample': 1, 'layer': 2, 'head': 3, 'query': 4, 'position': 4}
    """
    if summaries is None and log_attn is None:
        raise SchemaError("a dataset needs summaries or log_attn (or both)")
    qpos = np.asarray(query_positions, dtype=np.int64)
    if n_keys is None:
        n_keys = int(log_attn.shape[-1]) if log_attn is not None else int(qpos.max()) + 1
    data_vars: dict[str, Any] = {}
    for name, val in (summaries or {}).items():
        if name not in SUMMARY_VARIABLES:
            raise SchemaError(f"unknown summary {name!r}; expected one of {SUMMARY_VARIABLES}")
        arr = np.asarray(val, dtype=np.float32)
        data_vars[name] = (DIMS[:4], arr, {"long_name": _SUMMARY_ATTRS[name]})
    if log_attn is not None:
        data_vars["log_attn"] = (
            DIMS,
            np.asarray(log_attn, dtype=np.float32),
            {"long_name": "fp32 log-attention; -inf at invisible keys"},
        )
    if learned_sink_log_attn is not None:
        data_vars["learned_sink_log_attn"] = (
            DIMS[:4],
            np.asarray(learned_sink_log_attn, dtype=np.float32),
            {"long_name": "log-attention on the learned sink (GPT-OSS style)"},
        )
    first = next(iter(data_vars.values()))[1]
    n_samples = first.shape[0]
    coords: dict[str, Any] = {
        "sample": np.arange(n_samples),
        "layer": np.asarray(layers, dtype=np.int64),
        "head": np.asarray(heads, dtype=np.int64),
        "query": qpos,
        "position": np.arange(n_keys),
    }
    if log_attn is not None:
        coords["key"] = np.arange(log_attn.shape[-1])
    if token_ids is not None:
        coords["token_id"] = (("sample", "position"), np.asarray(token_ids, dtype=np.int64))
    coords["sink_index"] = (
        ("sample",),
        np.zeros(n_samples, np.int64) if sink_index is None else np.asarray(sink_index, np.int64),
    )
    ds = xr.Dataset(data_vars, coords=coords, attrs=_netcdf_attrs(attrs or {}))
    validate_dataset(ds)
    return ds


def _netcdf_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in attrs.items():
        if isinstance(val, bool):
            out[key] = int(val)
        elif val is None:
            out[key] = ""
        elif isinstance(val, (dict, list, tuple)):
            out[key] = json.dumps(val)
        elif isinstance(val, str):
            out[key] = str(val)  # plain str: subclasses such as torch's TorchVersion break h5py
        elif isinstance(val, (int, float, np.integer, np.floating)):
            out[key] = val
        else:
            out[key] = str(val)
    return out


def validate_dataset(ds: xr.Dataset) -> None:
    """Check that ``ds`` follows the schema; raise :class:`SchemaError` naming what is wrong.

    Examples
    --------
    >>> import xarray as xr, attncoda as ac
    >>> ac.validate_dataset(xr.Dataset())
    Traceback (most recent call last):
    ...
    attncoda._data.SchemaError: dataset has neither summaries nor log_attn; is it an attncoda capture?
    """
    present = [v for v in (*SUMMARY_VARIABLES, "log_attn") if v in ds.data_vars]
    if not present:
        raise SchemaError("dataset has neither summaries nor log_attn; is it an attncoda capture?")
    for name in SUMMARY_VARIABLES:
        if name in ds.data_vars and ds[name].dims != DIMS[:4]:
            raise SchemaError(f"{name} must have dims {DIMS[:4]}, has {ds[name].dims}")
    if "log_attn" in ds.data_vars and ds["log_attn"].dims != DIMS:
        raise SchemaError(f"log_attn must have dims {DIMS}, has {ds['log_attn'].dims}")
    for key, val in ds.attrs.items():
        if not isinstance(val, (str, int, float, np.integer, np.floating, np.ndarray)):
            raise SchemaError(
                f"attribute {key!r} has type {type(val).__name__}; netCDF takes strings and "
                "numbers only (encode dicts as JSON, booleans as 0/1)"
            )


def _format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("netcdf", "zarr"):
            raise ValueError(f"format must be 'netcdf' or 'zarr', got {fmt!r}")
        return fmt
    if path.suffix in (".nc", ".nc4", ".netcdf"):
        return "netcdf"
    if path.suffix == ".zarr":
        return "zarr"
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its suffix; use .nc or .zarr, or pass "
        "format='netcdf' / 'zarr'"
    )


def save(
    ds: xr.Dataset, path: str | os.PathLike[str], *, format: str | None = None, append: bool = False
) -> Path:
    """Save a capture atomically: write to a temporary name beside ``path``, then rename.

    Parameters
    ----------
    ds : xarray.Dataset
    path : path-like
        ``.nc`` (netCDF4 via h5netcdf) or ``.zarr`` (zarr format 2, a directory).
    format : {"netcdf", "zarr"}, optional
    append : bool, default False
        zarr only: append along ``sample`` to an existing store (created if missing).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib, attncoda as ac
    >>> s = {k: np.zeros((1, 1, 1, 2), np.float32) for k in ac.SUMMARY_VARIABLES}
    >>> ds = ac.make_dataset(summaries=s, layers=[0], heads=[0], query_positions=[0, 1])
    >>> p = ac.save(ds, pathlib.Path(tempfile.mkdtemp()) / "cap.nc")
    >>> ac.load(p).identical(ds)
    True
    """
    validate_dataset(ds)
    target = Path(path)
    fmt = _format(target, format)
    target.parent.mkdir(parents=True, exist_ok=True)
    if append:
        if fmt != "zarr":
            raise ValueError("append=True needs a zarr store; netCDF files are written whole")
        if target.exists():
            ds.to_zarr(target, append_dim="sample", zarr_format=2)
            return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staged = tmp / target.name
    try:
        if fmt == "netcdf":
            ds.to_netcdf(staged, engine="h5netcdf")
        else:
            ds.to_zarr(staged, mode="w", zarr_format=2, consolidated=True)
        if target.exists() and target.is_dir():
            old = tmp / (target.name + ".old")
            os.replace(target, old)
            os.replace(staged, target)
        else:
            os.replace(staged, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load(path: str | os.PathLike[str], *, format: str | None = None) -> xr.Dataset:
    """Load a capture saved with :func:`save` (fully into memory for netCDF, lazily for zarr).

    Examples
    --------
    See :func:`save`.
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no capture at {str(target)!r}")
    fmt = _format(target, format)
    if fmt == "netcdf":
        with xr.open_dataset(target, engine="h5netcdf") as ds:
            out = ds.load()
    else:
        out = xr.open_zarr(target, consolidated=None)
    validate_dataset(out)
    return out
