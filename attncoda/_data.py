"""The xarray data model of captured attention, its validation, and atomic save/load.

Dims ``sample, layer, head, query, key`` (query and key are token positions) plus ``position``
for per-token coordinates. Variables:

``log_attn`` (sample, layer, head, query, key)
    fp32 log-attention, ``-inf`` at invisible keys (rows mode).
``sink_share``, ``sink_logodds``, ``balance``, ``entropy``, ``content_entropy``
    (sample, layer, head, query) summaries; NaN where undefined (a row with no content key).
``learned_sink_log_attn`` (sample, layer, head, query)
    log-mass of a learned (GPT-OSS style) sink, when captured with ``sink="learned"``.
``token_id`` (sample, position), ``token`` (sample, position), ``sink_index`` (sample)
    coordinates: ids, their text (``""`` at padding and at positions a sample lacks) and the
    first valid key of each sample.

Attributes are netCDF-safe: strings and numbers only (the capture spec is a JSON string,
booleans are 0/1).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import zlib
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import xarray as xr

from ._errors import EXIT_USAGE, AttncodaError, OutputExistsError

__all__ = [
    "DIMS",
    "SUMMARY_VARIABLES",
    "SchemaError",
    "check_save",
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


#: The version of the on-disk schema that :func:`save` writes (root attribute
#: :data:`SCHEMA_ATTR`); :func:`load` refuses a newer one. Files without it are version 0.
SCHEMA_VERSION = 1
SCHEMA_ATTR = "attncoda_schema"


def _version() -> str:
    from ._version import __version__

    return __version__


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


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
    tokens: np.ndarray | Sequence[Sequence[str]] | None = None,
    sink_index: Sequence[int] | np.ndarray | None = None,
    attrs: Mapping[str, Any] | None = None,
    check_values: bool = True,
) -> xr.Dataset:
    """Build a dataset in attncoda's schema from arrays.

    Parameters
    ----------
    summaries : mapping of name -> array (sample, layer, head, query), optional
    log_attn : array (sample, layer, head, query, key), optional
        Kept without a copy when it is a float32 or float16 numpy array or a lazy (dask) array
        of either; anything else is converted to float32.
    learned_sink_log_attn : array (sample, layer, head, query), optional
    layers, heads : sequences of int
        Coordinates (the model's layer and head indices).
    query_positions : sequence of int
        Token position of each query.
    n_keys : int, optional
        Number of key positions (defaults to ``log_attn.shape[-1]`` or ``max(query)+1``).
    token_ids : array (sample, position), optional
    tokens : array of str (sample, position), optional
        The text of each token (``""`` where there is none: padding, or a shorter sample),
        stored as the ``token`` coordinate.
    sink_index : array (sample,), optional
        First valid key of each sample.
    attrs : mapping, optional
        Provenance; dicts and lists are JSON-encoded, booleans stored as 0/1.
    check_values : bool, default True
        Check the values as :func:`validate_dataset` does (one pass, in blocks of at most
        64 MB); False checks the structure only, for arrays that will be checked later
        (:func:`save` checks them again before it writes).

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
        rows = _rows_array(log_attn)
        data_vars["log_attn"] = (
            DIMS,
            rows,
            {
                "long_name": (
                    "fp32 log-attention; -inf at invisible keys"
                    if rows.dtype == np.float32
                    else "fp32 log-attention stored as float16 (lossy); -inf at invisible keys"
                )
            },
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
    if tokens is not None:
        coords["token"] = (("sample", "position"), _token_array(tokens))
    coords["sink_index"] = (
        ("sample",),
        np.zeros(n_samples, np.int64) if sink_index is None else np.asarray(sink_index, np.int64),
    )
    ds = xr.Dataset(data_vars, coords=coords, attrs=_netcdf_attrs(attrs or {}))
    validate_dataset(ds, values=check_values)
    return ds


def _rows_array(log_attn: Any) -> Any:
    """``log_attn`` without a copy where it can be kept: a float32 or float16 numpy array (the
    buffer capture wrote its rows into) or a lazy (dask) array of either, read only when used;
    anything else becomes a float32 numpy array."""
    dtype = getattr(log_attn, "dtype", None)
    if dtype in (np.float32, np.float16) and (
        isinstance(log_attn, np.ndarray) or hasattr(log_attn, "dask")
    ):
        return log_attn
    return np.asarray(log_attn, dtype=np.float32)


def _token_array(tokens: Any) -> np.ndarray:
    """Token strings as an object array of ``str``: variable-length in netCDF and zarr alike (a
    fixed-width ``<U`` array would refuse or truncate longer tokens appended to a zarr store)."""
    arr = np.asarray(tokens, dtype=object)
    for value in arr.flat:
        if not isinstance(value, str):
            raise SchemaError(
                f"tokens must be strings (use '' where there is no token), got {value!r} of "
                f"type {type(value).__name__}"
            )
    return arr


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


def require_dataset(value: Any, where: str) -> None:
    """Refuse, in one line, anything but an :class:`xarray.Dataset` where ``where`` needs one
    (a DataArray such as ``ds.log_attn``, an array, a path, None).

    Raises
    ------
    SchemaError
    """
    if isinstance(value, xr.Dataset):
        return
    if isinstance(value, xr.DataArray):
        hint = "; a DataArray such as ds.log_attn is one variable: pass the dataset ds"
    elif isinstance(value, (str, os.PathLike)):
        hint = f"; load the file first: ac.load({str(value)!r})"
    else:
        hint = "; pass a capture (cap.dataset, ac.load(path)) or analysis results"
    raise SchemaError(f"{where} takes an xarray.Dataset, got {type(value).__name__}{hint}")


def validate_dataset(ds: xr.Dataset, *, values: bool = True) -> None:
    """Check that ``ds`` follows the schema; raise :class:`SchemaError` naming what is wrong.

    Structure: the variables and their dims, netCDF-safe attributes, unique coordinates, sink
    indices inside the sequence. Values (``values=True``, one pass over the data in blocks of
    samples): sink shares in [0, 1], entropies >= 0, balances finite, ``log_attn`` rows that
    close (their probabilities sum to 1, or to 1 minus the learned sink's share), no NaN where
    the schema has none (NaN summaries are allowed: they mark rows without content). Tolerances
    are those of float32 arithmetic.

    Parameters
    ----------
    ds : xarray.Dataset
    values : bool, default True
        Also check the values (reads a dask-backed dataset once).

    Raises
    ------
    SchemaError

    Examples
    --------
    >>> import xarray as xr, attncoda as ac
    >>> ac.validate_dataset(xr.Dataset())
    Traceback (most recent call last):
    ...
    attncoda._data.SchemaError: dataset has neither summaries nor log_attn; is it an attncoda capture?
    >>> ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=4)
    >>> ac.validate_dataset(ds.assign(log_attn=ds.log_attn + 1.0))
    Traceback (most recent call last):
    ...
    attncoda._data.SchemaError: log_attn has values above 0 (up to 1); log-probabilities are <= 0
    """
    require_dataset(ds, "validate_dataset")
    present = [v for v in (*SUMMARY_VARIABLES, "log_attn") if v in ds.data_vars]
    if not present:
        raise SchemaError("dataset has neither summaries nor log_attn; is it an attncoda capture?")
    for name in SUMMARY_VARIABLES:
        if name in ds.data_vars and ds[name].dims != DIMS[:4]:
            raise SchemaError(f"{name} must have dims {DIMS[:4]}, has {ds[name].dims}")
    if "log_attn" in ds.data_vars and ds["log_attn"].dims != DIMS:
        raise SchemaError(f"log_attn must have dims {DIMS}, has {ds['log_attn'].dims}")
    if "learned_sink_log_attn" in ds.data_vars and ds["learned_sink_log_attn"].dims != DIMS[:4]:
        raise SchemaError(f"learned_sink_log_attn must have dims {DIMS[:4]}")
    for name in (*present, "learned_sink_log_attn"):
        if name in ds.data_vars and not np.issubdtype(ds[name].dtype, np.floating):
            raise SchemaError(f"{name} must hold floats, holds {ds[name].dtype}")
    owners = [("", ds.attrs)] + [(f"{name}.", ds[name].attrs) for name in ds.variables]
    for where, attrs in owners:
        for key, val in attrs.items():
            plain = isinstance(val, (str, int, float, np.integer, np.floating, np.ndarray))
            if (
                not plain
                or isinstance(val, (bool, np.bool_))
                or (isinstance(val, np.ndarray) and val.dtype.kind not in "iufU")
            ):
                raise SchemaError(
                    f"attribute {where}{key!r} has type {type(val).__name__}; netCDF takes "
                    "strings and numbers only (encode dicts as JSON, booleans as 0/1, None as "
                    "'')"
                )
    version = ds.attrs.get(SCHEMA_ATTR)
    if version is not None and (
        isinstance(version, (bool, np.bool_))
        or not isinstance(version, (int, np.integer))
        or int(version) > SCHEMA_VERSION
    ):
        raise SchemaError(
            f"the dataset's schema version is {_plain(version)!r}; this attncoda "
            f"({_version()}) reads versions up to {SCHEMA_VERSION}: upgrade attncoda"
        )
    _check_coordinates(ds)
    for dim in ds.dims:
        if dim in ds.indexes and not ds.indexes[dim].is_unique:
            dup = ds.indexes[dim][ds.indexes[dim].duplicated()][0]
            dup = dup.item() if hasattr(dup, "item") else dup
            raise SchemaError(
                f"coordinate {dim!r} repeats the value {dup!r}; labels must be unique"
            )
    if "token" in ds.coords:
        _check_tokens(ds)
    if "sink_index" in ds.coords:
        n_keys = ds.sizes.get("key", ds.sizes.get("position"))
        idx = np.asarray(ds["sink_index"].values)
        if idx.size and (idx.min() < 0 or (n_keys is not None and idx.max() >= n_keys)):
            raise SchemaError(
                f"sink_index holds {int(idx.min())}..{int(idx.max())}, outside the "
                f"{n_keys} key positions"
            )
    if values:
        _check_values(ds)


#: Coordinates of whole numbers (indices of samples, layers, heads and token positions).
_INDEX_LIMIT = 2**31
_INDEX_COORDS = ("sample", "layer", "head", "query", "key", "position", "sink_index", "token_id")


def _check_coordinates(ds: xr.Dataset) -> None:
    """Index coordinates hold whole numbers >= 0 in an integer dtype: a metadata edit (a zarr
    ``.zarray`` dtype changed to a float) reinterprets the stored bytes as other numbers, which
    would load as wrong layer or head labels."""
    for name in _INDEX_COORDS:
        if name not in ds.coords:
            continue
        values = np.asarray(ds[name].values)
        if values.dtype.kind not in "iu":
            raise SchemaError(
                f"coordinate {name!r} holds {values.dtype}, not integers (its stored type was "
                "changed?); re-create the dataset from its capture"
            )
        if name == "token_id" or not values.size:
            continue
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= _INDEX_LIMIT:
            raise SchemaError(
                f"coordinate {name!r} holds {low if low < 0 else high}; indices count from 0 "
                f"and stay below 2**31 (its stored type or bytes were changed?); re-create the "
                "dataset from its capture"
            )


def _check_tokens(ds: xr.Dataset) -> None:
    """``token`` is a (sample, position) coordinate of strings, beside ``token_id`` if present."""
    token = ds["token"]
    if token.dims != ("sample", "position"):
        raise SchemaError(f"token must have dims ('sample', 'position'), has {token.dims}")
    if token.dtype.kind not in ("U", "O", "T"):  # T: numpy's StringDType (zarr reads)
        raise SchemaError(f"token must hold strings, holds {token.dtype}")
    if "token_id" in ds.coords and ds["token_id"].dims != token.dims:
        raise SchemaError(
            f"token_id has dims {ds['token_id'].dims} but token has {token.dims}; both are "
            "(sample, position)"
        )


#: float32 slack of the value checks (shares, entropies, row sums in log space).
_TOL = 1e-4
_ROW_TOL = 1e-3
_BLOCK_BYTES = 64 << 20


def _blocks(da: xr.DataArray, keep: tuple[str, ...] = ("key",)) -> Iterator[dict[Hashable, slice]]:
    """``isel`` indexers that cut ``da`` into blocks of at most :data:`_BLOCK_BYTES` (as
    float32), along its leading dims (never along ``keep``): one sample of all-layer rows at
    T=2048 is 4.5 GB, so blocks of samples alone would make every check a copy of that size."""
    dims, shape = da.dims, da.shape
    trailing = max(4, da.dtype.itemsize)
    split = len(dims)
    while split > 0 and (dims[split - 1] in keep or trailing * shape[split - 1] <= _BLOCK_BYTES):
        split -= 1
        trailing *= shape[split]
    if split == 0:
        yield {}
        return
    j = split - 1
    step = max(1, _BLOCK_BYTES // trailing)
    for outer in np.ndindex(*shape[:j]):
        for start in range(0, shape[j], step):
            idx = {d: slice(o, o + 1) for d, o in zip(dims[:j], outer, strict=True)}
            idx[dims[j]] = slice(start, start + step)
            yield idx


def _block(da: xr.DataArray, idx: dict[Hashable, slice]) -> np.ndarray:
    """One block's values (read from disk for a lazy array), float16 upcast to float32."""
    values = np.asarray(da.isel(idx).values)
    return values.astype(np.float32) if values.dtype == np.float16 else values


def _check_values(ds: xr.Dataset) -> None:
    bounds = {
        "sink_share": (-_TOL, 1 + _TOL, "shares lie in [0, 1]"),
        "entropy": (-_TOL, np.inf, "entropies are >= 0"),
        "content_entropy": (-_TOL, np.inf, "entropies are >= 0"),
        "balance": (-np.inf, np.inf, "balances are finite"),
    }
    for name, (lo, hi, rule) in bounds.items():
        if name not in ds.data_vars:
            continue
        for idx in _blocks(ds[name]):
            block = _block(ds[name], idx)
            with np.errstate(invalid="ignore"):
                bad = ~((block >= lo) & (block <= hi)) & ~np.isnan(block)
                if name == "balance":
                    bad |= np.isinf(block)
            if bad.any():
                raise SchemaError(
                    f"{name} holds {block[bad].flat[0]!r} ({int(bad.sum())} bad values); {rule}"
                    " — the data are corrupted or were not written by attncoda"
                )
    if "log_attn" not in ds.data_vars:
        return
    learned = "learned_sink_log_attn" in ds.data_vars
    # float16 rows carry up to half a float16 step of error in each log-probability, and so
    # in the log of a row's sum: up to 2^-6 for log-probabilities down to -32
    row_tol = _ROW_TOL if ds["log_attn"].dtype != np.float16 else 2.0**-5
    for idx in _blocks(ds["log_attn"]):
        block = _block(ds["log_attn"], idx)
        if np.isnan(block).any():
            raise SchemaError(
                "log_attn holds NaN; invisible keys are -inf and every row is a "
                "log-probability — the data are corrupted or were not written by attncoda"
            )
        top = float(block.max(initial=-np.inf))
        if top > _TOL:
            raise SchemaError(
                f"log_attn has values above 0 (up to {top:.3g}); log-probabilities are <= 0"
            )
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = block.max(axis=-1)
            finite = np.isfinite(m)
            lse = np.where(
                finite,
                m + np.log(np.exp(block - np.where(finite, m, 0)[..., None]).sum(-1)),
                -np.inf,
            )
            if learned:
                lse = np.logaddexp(lse, _block(ds["learned_sink_log_attn"], idx))
                finite = np.isfinite(lse)
        off = np.abs(np.where(finite, lse, 0.0))
        if (off > row_tol).any():
            raise SchemaError(
                f"log_attn rows do not close: a row's probabilities sum to "
                f"{float(np.exp(lse[off > row_tol].flat[0])):.6g}, not 1 "
                f"({int((off > row_tol).sum())} rows) — the data are corrupted or were not "
                "written by attncoda"
            )


def _format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("netcdf", "zarr"):
            raise SchemaError(f"format must be 'netcdf' or 'zarr', got {fmt!r}")
        return fmt
    if path.suffix in (".nc", ".nc4", ".netcdf"):
        return "netcdf"
    if path.suffix == ".zarr":
        return "zarr"
    raise SchemaError(
        f"cannot tell the format of {str(path)!r} from its suffix; use .nc or .zarr, or pass "
        "format='netcdf' / 'zarr'"
    )


#: Root attribute of zarr stores whose every chunk was written (so a missing one is damage).
_ALL_CHUNKS = "attncoda_all_chunks"


def _outside(path: Path, what: str) -> SchemaError:
    return SchemaError(
        f"{str(path)!r} is refused: {what}; a capture's data must come from the file or store "
        "alone (re-create it with ac.save)"
    )


def _check_netcdf_contained(path: Path) -> None:
    """Refuse a netCDF/HDF5 file that names other files as its data: external storage, virtual
    datasets, external or soft links (checked on every object, before any value is read)."""
    import h5py

    try:
        fh = h5py.File(path, "r")
    except OSError:
        return  # not HDF5 at all: the reader says why
    with fh:
        todo: list[h5py.Group] = [fh]
        while todo:
            group = todo.pop()
            for name in group:
                link = group.get(name, getlink=True)
                where = f"{group.name.rstrip('/')}/{name}"
                if not isinstance(link, h5py.HardLink):
                    kind = type(link).__name__
                    raise _outside(path, f"{where} is a link ({kind}) to data elsewhere")
                obj = group[name]
                if isinstance(obj, h5py.Group):
                    todo.append(obj)
                elif isinstance(obj, h5py.Dataset):
                    if obj.external:
                        raise _outside(path, f"variable {where} keeps its bytes in another file")
                    if obj.is_virtual:
                        raise _outside(path, f"variable {where} is a virtual dataset")


def _check_zarr_contained(path: Path) -> None:
    """Refuse a zarr store holding a symlink (a chunk or metadata file that reads another
    file), or anything but plain files and folders, or metadata naming a path outside it."""
    root = os.path.realpath(path)
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            entry = os.path.join(here, name)
            st = os.lstat(entry)
            rel = os.path.relpath(entry, root)
            if stat.S_ISLNK(st.st_mode):
                raise _outside(path, f"{rel} is a symlink")
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise _outside(path, f"{rel} is not a regular file")
    consolidated = path / ".zmetadata"
    if consolidated.is_file():
        try:
            keys = list(json.loads(consolidated.read_text(encoding="utf-8"))["metadata"])
        except (ValueError, KeyError, TypeError):
            return  # unreadable: the reader says why
        for key in keys:
            parts = str(key).split("/")
            if str(key).startswith(("/", "~")) or any(p in ("", ".", "..") for p in parts):
                raise _outside(path, f"its metadata names {str(key)[:80]!r}, outside the store")


def _check_contained(path: Path, fmt: str) -> None:
    """A capture's data come from its own file or store: nothing it names elsewhere is read."""
    if fmt == "netcdf" and path.is_file():
        _check_netcdf_contained(path)
    elif fmt == "zarr" and path.is_dir():
        _check_zarr_contained(path)


def _open(path: Path, fmt: str) -> xr.Dataset:
    """Open a capture; a file or store that cannot be read raises :class:`SchemaError`."""
    _check_contained(path, fmt)
    try:
        if fmt == "netcdf":
            if not path.is_file():
                raise SchemaError(f"{str(path)!r} is not a netCDF file (it is a folder)")
            try:
                with xr.open_dataset(path, engine="h5netcdf") as opened:
                    ds = opened.load()
            except OSError as exc:
                bad = _find_bad_hdf5_chunk(path)
                if bad is None:
                    raise
                raise SchemaError(
                    f"netCDF file {str(path)!r} is damaged: {bad} fails its fletcher32 "
                    "checksum; restore it from a copy or re-create it"
                ) from exc
        else:
            if not path.is_dir():
                raise SchemaError(f"{str(path)!r} is not a zarr store (a .zarr store is a folder)")
            _check_zarr_complete(path)
            ds = xr.open_zarr(path, consolidated=None)
    except SchemaError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SchemaError(
            f"cannot read {str(path)!r} as a {fmt} capture ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); is it complete and written by attncoda?"
        ) from exc
    ds.attrs.pop(_ALL_CHUNKS, None)
    if "token" in ds.coords and ds["token"].dims == ("sample", "position"):
        # netCDF reads fixed-width <U, zarr numpy's StringDType: one dtype, as make_dataset gives
        ds = ds.assign_coords(token=(ds["token"].dims, _token_array(ds["token"].values)))
    return ds


def _zarr_metadata(path: Path) -> dict[str, Any]:
    """Array metadata of a zarr v2 store: name -> its ``.zarray`` content, and the root attrs."""
    consolidated = path / ".zmetadata"
    meta: dict[str, Any] = {}
    if consolidated.is_file():
        meta = json.loads(consolidated.read_text(encoding="utf-8"))["metadata"]
    else:
        for f in path.rglob(".zarray"):
            meta[f"{f.parent.relative_to(path).as_posix()}/.zarray"] = json.loads(f.read_text())
        if (path / ".zattrs").is_file():
            meta[".zattrs"] = json.loads((path / ".zattrs").read_text())
    return meta


def _check_zarr_complete(path: Path) -> None:
    """Every array the store's metadata lists exists, and (stores saved by :func:`save`) every
    chunk of it: zarr reads a missing chunk as fill values, which would pass for data."""
    if (path / "zarr.json").is_file():
        return  # zarr format 3: attncoda writes format 2; xarray checks what it can
    if not (path / ".zgroup").is_file():
        raise SchemaError(f"{str(path)!r} is not a zarr store (no .zgroup); is it a capture?")
    meta = _zarr_metadata(path)
    root = meta.get(".zattrs", {})
    # every chunk is written by save() and its appends (write_empty_chunks): a store that says
    # so, or carries the schema version, has a file for every chunk and no other
    all_chunks = bool(root.get(_ALL_CHUNKS, 0)) or SCHEMA_ATTR in root
    for key, zarray in meta.items():
        if not key.endswith("/.zarray"):
            continue
        name = key[: -len("/.zarray")]
        folder = path / name
        if not (folder / ".zarray").is_file():
            raise SchemaError(
                f"zarr store {str(path)!r} is damaged: variable {name!r} is listed but its "
                "folder is missing; re-create the store"
            )
        if not all_chunks:
            continue
        shape, chunks = zarray["shape"], zarray["chunks"]
        sep = zarray.get("dimension_separator", ".") or "."
        counts = [-(-n // c) if c else 0 for n, c in zip(shape, chunks, strict=True)]
        if not counts:
            expected = {"0"}
        elif 0 in counts:
            expected = set()
        else:
            expected = {sep.join(map(str, i)) for i in np.ndindex(*counts)}
        if sep == ".":
            have = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
        else:
            have = {
                p.relative_to(folder).as_posix().replace("/", sep)
                for p in folder.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            }
        missing = sorted(expected - have)
        # only chunk-named files count: a user's notes.txt in a variable's folder is theirs
        # (never read, never replaced), not a chunk beyond the shape
        extra = sorted(k for k in have - expected if all(p.isdigit() for p in k.split(sep)))
        if extra and not missing:
            raise SchemaError(
                f"zarr store {str(path)!r} is damaged: variable {name!r} has {len(extra)} "
                f"chunk(s) beyond its shape (e.g. {extra[0]}); an interrupted or foreign "
                "append? Re-create the store"
            )
        if missing:
            raise SchemaError(
                f"zarr store {str(path)!r} is damaged: variable {name!r} lacks "
                f"{len(missing)} of {len(expected)} chunks (e.g. {missing[0]}); an interrupted "
                "copy or append? Re-create the store"
            )


def _is_ours(path: Path, fmt: str) -> str | None:
    """None if ``path`` holds a capture in attncoda's schema (so it may be replaced).

    A zarr store's files are looked at first: a file of the user's inside a variable's folder
    would otherwise read as a chunk beyond the shape, and the refusal should name it as theirs.
    """
    if fmt == "zarr":
        try:
            foreign = _foreign_in_store(path)
        except (SchemaError, OSError, ValueError) as exc:
            return f"it is not an attncoda capture ({exc})"
        if foreign:
            shown = ", ".join(foreign[:3]) + (
                f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            )
            return f"it holds files attncoda did not write ({shown})"
    try:
        ds = _open(path, fmt)
        try:
            validate_dataset(ds, values=False)
        finally:
            ds.close()
    except SchemaError as exc:
        return f"it is not an attncoda capture ({exc})"
    return None


_ZARR_META = (".zarray", ".zattrs", ".zgroup", ".zmetadata")


def _foreign_in_store(path: Path) -> list[str]:
    """Files and folders of a zarr store that are not zarr's (a user's ``notes.txt``,
    ``mydir/``): replacing the store would delete them."""
    meta = _zarr_metadata(path)
    arrays: dict[str, str] = {}
    for key, zarray in meta.items():
        if key.endswith("/.zarray"):
            sep = (zarray.get("dimension_separator") or ".") if isinstance(zarray, dict) else "."
            arrays[key[: -len("/.zarray")]] = sep
    foreign: list[str] = []
    for entry in sorted(path.iterdir()):
        name = entry.name
        if name in (".zattrs", ".zgroup", ".zmetadata") and entry.is_file():
            continue
        if name not in arrays or not entry.is_dir() or entry.is_symlink():
            foreign.append(name + ("/" if entry.is_dir() else ""))
            continue
        sep = arrays[name]
        for inner in sorted(entry.rglob("*")):
            rel = inner.relative_to(entry).as_posix()
            if inner.is_dir() and sep == "/" and rel.replace("/", "").isdigit():
                continue
            chunk = rel.replace("/", sep) if sep == "/" else rel
            ok = inner.is_file() and (
                rel in _ZARR_META or all(p.isdigit() for p in chunk.split(sep))
            )
            if not ok:
                foreign.append(f"{name}/{rel}")
    return foreign


_APPEND_ATTRS = ("model_id", "family", "weights_sha256", "capture_spec", "dtype")


def _check_append(old: xr.Dataset, new: xr.Dataset, path: Path) -> None:
    """Appending along ``sample`` needs the same variables, coordinates and provenance."""
    if set(old.data_vars) != set(new.data_vars):
        raise SchemaError(
            f"cannot append to {str(path)!r}: it holds {sorted(map(str, old.data_vars))}, the "
            f"new data hold {sorted(map(str, new.data_vars))}"
        )
    for dim in ("layer", "head", "query", "key", "position"):
        if (dim in old.dims) != (dim in new.dims):
            raise SchemaError(f"cannot append to {str(path)!r}: only one of them has a {dim} dim")
        if dim in old.dims and not np.array_equal(old[dim].values, new[dim].values):
            raise SchemaError(
                f"cannot append to {str(path)!r}: its {dim} coordinate differs "
                f"({_short(old[dim].values)} vs {_short(new[dim].values)}); append only "
                "captures of the same layers, heads and lengths"
            )
    for key in _APPEND_ATTRS:
        if str(old.attrs.get(key, "")) != str(new.attrs.get(key, "")):
            raise SchemaError(
                f"cannot append to {str(path)!r}: attribute {key} differs "
                f"({str(old.attrs.get(key, ''))[:60]!r} vs {str(new.attrs.get(key, ''))[:60]!r}); "
                "a store holds captures of one model with one capture spec"
            )


def _short(values: np.ndarray) -> str:
    items = values.tolist()
    return str(items) if len(items) <= 6 else f"[{items[0]}, ..., {items[-1]}] ({len(items)})"


def check_save(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    append: bool = False,
    overwrite: bool = False,
) -> Path:
    """Refuse, before any work, a :func:`save` to ``path`` that would be refused later.

    Checks the suffix (or ``format``), that an existing file or store may be replaced
    (``overwrite`` and in attncoda's schema) or appended to, and that the folder is writable.
    Run it before a long capture so that a bad output path fails in a second, not after the
    capture.

    Returns
    -------
    pathlib.Path
        The path :func:`save` will write.

    Raises
    ------
    ValueError
        An unknown suffix or format (a :class:`SchemaError`).
    OutputExistsError, OutputError
        As :func:`save` would raise them.

    Examples
    --------
    >>> import tempfile, pathlib, attncoda as ac
    >>> ac.check_save(pathlib.Path(tempfile.mkdtemp()) / "cap.nc").name
    'cap.nc'
    """
    from ._atomic import check_output

    target = Path(path).expanduser()
    fmt = _format(target, format)
    if append and fmt != "zarr":
        raise SchemaError("append=True needs a zarr store; netCDF files are written whole")
    if append and target.exists():
        problem = _is_ours(target, fmt)
        if problem is not None:
            raise OutputExistsError(f"cannot append to {str(target)!r}: {problem}")
        check_output(target.parent / ".probe", what="store")
        return target
    return check_output(
        target,
        overwrite=overwrite,
        kind="file" if fmt == "netcdf" else "store",
        is_ours=lambda p: _is_ours(p, fmt),
        what="dataset",
    )


def save(
    ds: xr.Dataset,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    append: bool = False,
    overwrite: bool = False,
) -> Path:
    """Save a capture crash-safely: write beside ``path``, then swap it in.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset in attncoda's schema (checked, values included, before anything is written).
    path : path-like
        ``.nc`` (netCDF4 via h5netcdf) or ``.zarr`` (zarr format 2, a directory).
    format : {"netcdf", "zarr"}, optional
    append : bool, default False
        zarr only: append along ``sample`` to an existing store of attncoda's (created if
        missing). The store must hold the same variables, layers, heads, query and key
        positions, model and capture spec; anything else is refused. Appended samples are
        numbered after the store's.
    overwrite : bool, default False
        Replace an existing file or store. Only captures in attncoda's schema are ever replaced;
        a folder or file of anything else is refused whatever ``overwrite`` says.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    OutputExistsError
        ``path`` exists and ``overwrite`` is False, or it is not an attncoda capture.
    OutputError
        ``path``'s folder cannot be written.
    SchemaError
        ``ds`` is not in attncoda's schema, or does not match the store it is appended to.

    Notes
    -----
    The old file or store stays complete until the new one is: the new data are written into a
    staging folder beside ``path`` (``.NAME.attncoda-*``) and renamed into place (a store that
    replaces a store is exchanged with it atomically). An exception or Ctrl-C during the write
    leaves the old data and no staging folder; a killed process leaves a staging folder that
    the next save beside it removes. A zarr store's every chunk is written, so that
    :func:`load` can tell a damaged store (a chunk missing) from one holding NaN.

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib, attncoda as ac
    >>> s = {k: np.zeros((1, 1, 1, 2), np.float32) for k in ac.SUMMARY_VARIABLES}
    >>> ds = ac.make_dataset(summaries=s, layers=[0], heads=[0], query_positions=[0, 1])
    >>> p = ac.save(ds, pathlib.Path(tempfile.mkdtemp()) / "cap.nc")
    >>> ac.load(p).identical(ds)
    True
    >>> _ = ac.save(ds, p, overwrite=True)  # replacing needs overwrite=True
    """
    from ._atomic import deferred_interrupt, sweep, target_lock

    require_dataset(ds, "save()")
    target = Path(path).expanduser()
    fmt = _format(target, format)
    validate_dataset(ds)
    if "token" in ds.coords and ds["token"].chunks is not None:
        # strings have no fixed size for a lazy (dask) write: read them (sample x position)
        ds = ds.assign_coords(token=(ds["token"].dims, _token_array(ds["token"].values)))
    if append:
        # a new store in a folder that does not exist yet: made now, as save() without append
        # does (its lock file lives beside the store)
        if not target.exists() and not target.parent.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
        check_save(target, format=fmt, append=True)
        # one writer at a time: another process's append (or replacement) finishes first, so
        # the samples are numbered after it; a store created meanwhile is appended to
        with target_lock(target, what="dataset"):
            if target.exists():
                sweep(target)
                with load(target, check_values=False) as old:
                    _check_append(old, ds, target)
                    n_old = old.sizes["sample"]
                    kept = dict(old.attrs)
                ds = ds.assign_coords(sample=np.arange(n_old, n_old + ds.sizes["sample"]))
                # xarray replaces the root attributes with the appended dataset's: keep the
                # store's (the schema version and the every-chunk flag that makes load refuse a
                # missing chunk among them)
                ds = _with_token_checksums(ds).assign_attrs(
                    {**kept, SCHEMA_ATTR: SCHEMA_VERSION, _ALL_CHUNKS: 1}
                )
                undo = _AppendUndo(target, n_old)
                try:
                    with deferred_interrupt():  # finished, not torn, by a first Ctrl-C
                        with _drained_on_failure() as writes:
                            ds.to_zarr(
                                writes.store(target),
                                append_dim="sample",
                                zarr_format=2,
                                write_empty_chunks=True,
                            )
                except BaseException:  # a full disk, a second Ctrl-C: all or nothing
                    undo.restore()  # after every write under way has landed (drained)
                    raise
                return target
            return _save_new(ds, target, fmt, overwrite)
    return _save_new(ds, target, fmt, overwrite)


class _WritesInFlight:
    """The file writes of one ``to_zarr`` call to a local store, counted as they run on zarr's
    event loop, so that a failed call can stop the ones not yet started and wait for the ones
    under way (zarr gathers its chunk writes: the first error does not cancel the others)."""

    def __init__(self) -> None:
        import threading

        self.cond = threading.Condition()
        self.running = 0
        self.stopped = False

    def store(self, root: Path) -> Any:
        """A :class:`zarr.storage.LocalStore` on ``root`` whose writes are counted here."""
        from zarr.storage import LocalStore

        tracker = self

        class _CountedStore(LocalStore):  # a class per call: with_read_only() keeps its counter
            async def set(self, key: str, value: Any) -> None:
                with tracker.started(key):
                    await super().set(key, value)

            async def set_if_not_exists(self, key: str, value: Any) -> None:
                with tracker.started(key):
                    await super().set_if_not_exists(key, value)

        return _CountedStore(root)

    @contextlib.contextmanager
    def started(self, key: str) -> Iterator[None]:
        with self.cond:
            if self.stopped:
                raise OSError(
                    errno.ECANCELED, "an earlier write failed; this one was not made", key
                )
            self.running += 1
        try:
            yield
        except BaseException:
            self.stopped = True  # the first failure stops the writes that have not started
            raise
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def stop_and_drain(self, timeout: float = 60.0) -> None:
        """No write starts from now on; return once those under way have finished."""
        with self.cond:
            self.stopped = True
            self.cond.wait_for(lambda: self.running == 0, timeout=timeout)


@contextlib.contextmanager
def _drained_on_failure() -> Iterator[_WritesInFlight]:
    """Count the writes of one ``to_zarr`` call to a local store; when the call fails, stop
    the writes not yet started and wait for those under way before the error goes on, so that
    what cleans up after it (an undo, a staging folder's removal) runs after the last write.
    zarr writes chunks concurrently on its own event loop, and the first error reaches the
    caller while the writes started beside it are still landing."""
    writes = _WritesInFlight()
    try:
        yield writes
    except BaseException:
        writes.stop_and_drain()
        raise


class _AppendUndo:
    """What an append to a zarr v2 store may change, kept so that a failed append (a full disk
    mid-write) can be taken back: the store's metadata files, and every array's last chunk
    along ``sample`` (rewritten when it is partial); files the append adds are removed.
    The store then holds the samples it held before, loadable."""

    def __init__(self, store: Path, n_old: int) -> None:
        self.store = store
        self.files = {p for p in store.rglob("*") if p.is_file()}
        self.saved: dict[Path, bytes] = {}
        for path in self.files:
            if path.name.startswith("."):
                self.saved[path] = path.read_bytes()
        for zarray in store.glob("*/.zarray"):
            folder = zarray.parent
            try:
                meta = json.loads(zarray.read_text())
                dims = json.loads((folder / ".zattrs").read_text())["_ARRAY_DIMENSIONS"]
            except (OSError, ValueError, KeyError):
                continue
            if "sample" not in dims or not meta.get("chunks") or n_old == 0:
                continue
            axis = dims.index("sample")
            last = str((n_old - 1) // int(meta["chunks"][axis]))
            sep = meta.get("dimension_separator", ".") or "."
            for chunk in folder.rglob("*"):
                if chunk.is_file() and not chunk.name.startswith("."):
                    key = chunk.relative_to(folder).as_posix().replace("/", sep).split(sep)
                    if len(key) > axis and key[axis] == last:
                        self.saved[chunk] = chunk.read_bytes()

    def restore(self) -> None:
        for path in sorted(self.store.rglob("*"), reverse=True):
            if path.is_file() and path not in self.files:
                path.unlink(missing_ok=True)
        for path, data in self.saved.items():
            path.write_bytes(data)


def _checksum_encoding(ds: xr.Dataset, fmt: str) -> dict[str, dict[str, Any]]:
    """Every numeric array carries checksums: CRC32C per zarr chunk, fletcher32 per HDF5 chunk
    (:func:`load` then refuses a chunk whose bytes changed). Strings are left to the engine."""
    checksum: dict[str, Any]
    if fmt == "zarr":
        from numcodecs import CRC32C

        checksum = {"filters": [CRC32C()]}
    else:
        checksum = {"fletcher32": True}
    return {
        str(name): dict(checksum)
        for name, v in ds.variables.items()
        if v.dtype.kind in "biuf" and v.ndim > 0 and v.size > 0
    }


#: Per-sample CRC32 of the token strings (a coordinate along ``sample``, so that appends
#: carry their own): strings have no chunk checksums of the engines' (numeric arrays do).
_TOKEN_CRC = "attncoda_token_crc32"


def _token_crc32(tokens: np.ndarray) -> np.ndarray:
    """CRC32 of each sample's tokens, as JSON (ASCII escapes: every string has one encoding)."""
    return np.array(
        [zlib.crc32(json.dumps([str(t) for t in row]).encode("ascii")) for row in tokens],
        dtype=np.uint32,
    )


def _with_token_checksums(ds: xr.Dataset) -> xr.Dataset:
    if "token" not in ds.coords or ds["token"].dims != ("sample", "position"):
        return ds
    crc = _token_crc32(np.asarray(ds["token"].values))
    return ds.assign_coords({_TOKEN_CRC: ("sample", crc)})


def _verify_tokens(ds: xr.Dataset, path: Path) -> xr.Dataset:
    """Refuse tokens whose text changed since they were saved; drop the checksums."""
    if _TOKEN_CRC not in ds.coords:
        return ds  # saved before tokens had checksums
    stored = np.asarray(ds[_TOKEN_CRC].values)
    if "token" not in ds.coords or ds["token"].dims != ("sample", "position"):
        raise SchemaError(f"{str(path)!r} is damaged: it has token checksums but no tokens")
    bad = np.flatnonzero(stored != _token_crc32(np.asarray(ds["token"].values)))
    if bad.size:
        raise SchemaError(
            f"{str(path)!r} is damaged: the token text of sample {int(bad[0])} "
            f"({bad.size} sample(s) in all) fails its checksum; restore it from a copy or "
            "re-create it"
        )
    return ds.drop_vars(_TOKEN_CRC)


def _verify_zarr_chunks(path: Path) -> None:
    """Decode every chunk of every checksummed array of a zarr v2 store; a chunk whose bytes
    changed (bit rot, a bad copy) raises :class:`SchemaError` naming the variable and chunk."""
    from numcodecs import get_codec

    for key, zarray in _zarr_metadata(path).items():
        if not key.endswith("/.zarray"):
            continue
        filters = [get_codec(f) for f in zarray.get("filters") or []]
        if not any(getattr(f, "codec_id", "") in ("crc32c", "crc32") for f in filters):
            continue
        compressor = get_codec(zarray["compressor"]) if zarray.get("compressor") else None
        name = key[: -len("/.zarray")]
        for chunk in sorted((path / name).rglob("*")):
            if chunk.name.startswith(".") or not chunk.is_file():
                continue
            key = chunk.relative_to(path / name).as_posix().replace("/", ".")
            if not all(part.isdigit() for part in key.split(".")):
                continue  # not a chunk (a user's note): zarr never reads it
            try:
                data: Any = chunk.read_bytes()
                if compressor is not None:
                    data = compressor.decode(data)
                for f in reversed(filters):
                    data = f.decode(data)
            except Exception as exc:  # a codec's own error: a checksum, a broken stream
                label = chunk.relative_to(path / name).as_posix()
                raise SchemaError(
                    f"zarr store {str(path)!r} is damaged: variable {name!r}, chunk {label} "
                    f"fails its checksum ({' '.join(str(exc).split())[:120]}); restore it from "
                    "a copy or re-create the store"
                ) from exc


def _find_bad_hdf5_chunk(path: Path) -> str | None:
    """Which variable and chunk of a netCDF file fail their fletcher32 checksum, if any."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            for name, dset in f.items():
                if not isinstance(dset, h5py.Dataset) or dset.chunks is None:
                    continue
                for sl in dset.iter_chunks():
                    try:
                        dset[sl]
                    except OSError:
                        where = ", ".join(f"{s.start}:{s.stop}" for s in sl)
                        return f"variable {name!r}, chunk [{where}]"
    except OSError:
        return None
    return None


def _netcdf_bytes(ds: xr.Dataset) -> int:
    """About how many bytes ``ds`` takes as an (uncompressed) netCDF file."""
    return int(sum(v.nbytes for v in ds.variables.values())) + (64 << 10)


def _memory_budget() -> int:
    """How large a netCDF file may be built in memory before it is written: half the memory
    available now, else 1 GiB."""
    from ._atomic import available_memory

    free = available_memory()
    return free // 2 if free is not None else 1 << 30


class _WriteOrDefer:
    """A binary file for h5py's file-object driver whose writes never fail in HDF5's eyes.

    HDF5 that meets a failed write (ENOSPC on a disk that filled after the free-space check)
    leaves a half-closed file behind that crashes the process (SIGSEGV) when it is collected,
    also when it writes through a Python file object. Here the first failed write is kept, and
    every later byte is dropped (the position still moves, reads of what was not written give
    zeros): HDF5 finishes and closes a file that is then discarded, and
    :meth:`raise_deferred` raises the kept error, a plain :class:`OSError`, after the close.
    """

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "w+b", buffering=0)  # the staging file; closed by close()
        self.error: OSError | None = None

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        start, done = self._fh.tell(), 0
        while self.error is None and done < len(view):
            try:
                n = self._fh.write(view[done:])
            except OSError as exc:
                self.error = exc
                break
            if not n:  # a raw write of 0 bytes: nothing more will fit
                self.error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                break
            done += n
        self._fh.seek(start + len(view))
        return len(view)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = self._fh.readinto(view) or 0
        if self.error is not None and n < len(view):  # dropped bytes read as zeros
            view[n:] = bytes(len(view) - n)
            self._fh.seek(len(view) - n, os.SEEK_CUR)
            n = len(view)
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self._fh.read()
        buffer = bytearray(size)
        return bytes(buffer[: self.readinto(buffer)])

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._fh.truncate(size)
            except OSError as exc:
                self.error = exc
        return self._fh.tell() if size is None else size

    def flush(self) -> None:
        """Nothing to do: writes are unbuffered (the one fsync is :meth:`sync`'s)."""

    def sync(self) -> None:
        """fsync once HDF5 is done: filesystems that allocate late report a full disk here."""
        if self.error is None:
            try:
                os.fsync(self._fh.fileno())
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        self._fh.close()

    def raise_deferred(self) -> None:
        if self.error is not None:
            raise self.error


def _write_netcdf_to_disk(ds: xr.Dataset, path: Path, encoding: dict[str, Any]) -> None:
    """Write ``ds`` as netCDF at ``path`` with HDF5 writing through :class:`_WriteOrDefer`: a
    disk that fills during the write is an :class:`OSError` after HDF5 closed the file."""
    fh = _WriteOrDefer(path)
    try:
        ds.to_netcdf(fh, engine="h5netcdf", encoding=encoding)  # type: ignore[call-overload]
        fh.sync()
    finally:
        fh.close()
    fh.raise_deferred()


def _save_new(ds: xr.Dataset, target: Path, fmt: str, overwrite: bool) -> Path:
    """Write a whole file or store at ``target`` (staged, then swapped in)."""
    from ._atomic import atomic_output, check_free_space, deferred_interrupt

    kind: Literal["file", "store"] = "file" if fmt == "netcdf" else "store"
    need = _netcdf_bytes(ds)
    if fmt == "netcdf":  # HDF5 on a full disk crashes the process: refuse before the write
        check_free_space(target, need, what="dataset")
    with atomic_output(
        target, overwrite=overwrite, kind=kind, is_ours=lambda p: _is_ours(p, fmt), what="dataset"
    ) as staging:
        # zarr writes from background threads: a Ctrl-C mid-write would leave them writing
        # into the staging folder after its removal, so the write call is finished first
        with deferred_interrupt():
            ds = _with_token_checksums(ds).assign_attrs({SCHEMA_ATTR: SCHEMA_VERSION})
            encoding = _checksum_encoding(ds, fmt)
            if fmt == "netcdf" and need <= _memory_budget():
                # HDF5 writes into memory, Python writes the file: a disk that fills meanwhile
                # is a plain OSError (ENOSPC), not a half-closed HDF5 file that crashes later
                data = ds.to_netcdf(engine="h5netcdf", encoding=encoding)
                with open(staging, "wb") as fh:
                    fh.write(data)
            elif fmt == "netcdf":  # too large for memory: checked against the free space
                # above, and HDF5 never sees a failed write (a full disk is an OSError after)
                _write_netcdf_to_disk(ds, staging, encoding)
            else:
                out = ds.assign_attrs({_ALL_CHUNKS: 1})
                with _drained_on_failure() as writes:  # none lands after the staging's removal
                    out.to_zarr(
                        writes.store(staging),
                        mode="w-",
                        zarr_format=2,
                        consolidated=True,
                        write_empty_chunks=True,
                        encoding=encoding,
                    )
    return target


def load(
    path: str | os.PathLike[str], *, format: str | None = None, check_values: bool = True
) -> xr.Dataset:
    """Load a capture saved with :func:`save` (into memory for netCDF, lazily for zarr).

    Parameters
    ----------
    path : path-like
    format : {"netcdf", "zarr"}, optional
        Default: from the suffix.
    check_values : bool, default True
        Check the values as :func:`validate_dataset` does (one pass over the data; a zarr store
        stays lazy). False opens a large store at once; its structure, and the presence of
        every variable and chunk, are still checked.

    Raises
    ------
    FileNotFoundError
        Nothing at ``path``.
    SchemaError
        The file or store cannot be read, lacks a variable or a chunk (a damaged store), or
        does not follow attncoda's schema.

    Examples
    --------
    See :func:`save`.
    """
    target = Path(path).expanduser()
    if not target.exists():
        raise FileNotFoundError(f"no capture at {str(target)!r}")
    fmt = _format(target, format)
    if fmt == "zarr" and check_values and target.is_dir():
        _check_contained(target, fmt)  # before any chunk is read (again in _open: cheap)
        _verify_zarr_chunks(target)  # every chunk's checksum, naming a damaged one
    out = _verify_tokens(_open(target, fmt), target)
    validate_dataset(out, values=check_values)  # a newer schema version is refused here
    out.attrs.pop(SCHEMA_ATTR, None)
    known = {*SUMMARY_VARIABLES, "log_attn", "learned_sink_log_attn"}
    extra = sorted(str(v) for v in out.data_vars if v not in known)
    if extra:  # named, never silently mixed with the schema's variables
        import warnings

        warnings.warn(
            f"{str(target)!r} holds variables outside attncoda's schema: {', '.join(extra)}; "
            "they are loaded as they are, unchecked",
            UserWarning,
            stacklevel=2,
        )
    return out
