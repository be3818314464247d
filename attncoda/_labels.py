"""Labelled (xarray) inputs for the maths functions: DataArray in, DataArray out.

Every public maths function (:data:`MATHS_FUNCTIONS`) is wrapped by :func:`labelled`. Called
without a :class:`xarray.DataArray` argument, the wrapper only checks ``isinstance`` and calls the
function as it is (numpy in, numpy out; torch in, torch out). Called with DataArrays, it

1. finds the **parts dim**: ``dim=`` when given; else the dim at ``axis=`` when ``axis`` is
   given; else ``"key"`` (``"group"`` for group shares) when present; else the only dim of a
   1-D array. A DataArray of several dims without any of these is *ambiguous* and refused
   (:class:`~attncoda.ShapeMismatchError`) rather than guessed at;
2. aligns every labelled argument (``x``, ``y``, ``mask``, a boolean ``sink``, per-row
   arguments such as ``power``'s exponent) with ``join="exact"``: labels that disagree are an
   error, never an inner join that silently drops rows;
3. orders each one as ``(other dims..., parts dim)`` (missing dims become length-1 axes, so a
   ``mask`` over ``(query, key)`` broadcasts against ``(sample, ..., query, key)`` as in numpy),
   calls the numpy function on the values with ``axis=-1``, and
4. labels the result: the other dims and every coordinate that lives on them are kept; an output
   axis of the parts' length keeps the parts dim and its coordinates; an output axis of another
   length gets a new dim (``"<dim>_alr"``, ``"<dim>_ilr"``; the inverses drop those suffixes);
   pairwise results get ``<item>_a`` and ``<item>_b`` with the item coordinates on both sides.
   Results that bundle several arrays (:class:`~attncoda.SinkContent` and friends) come back as
   an :class:`xarray.Dataset` with one variable per field, so ``res.sink_share`` reads the same.

The DataArray's values are read into numpy (a dask-backed array is computed); labels are the
point here, not laziness: for lazy data use ``xarray.apply_ufunc(..., dask="parallelized")``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np
import xarray as xr

from ._errors import ShapeMismatchError

__all__ = ["MATHS_FUNCTIONS", "Spec", "labelled"]

F = TypeVar("F", bound=Callable[..., Any])

#: Names of the public maths functions that take DataArrays (filled in by :func:`labelled`).
MATHS_FUNCTIONS: list[str] = []


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one maths function's arguments and results relate to labelled dims.

    Attributes
    ----------
    parts
        Parameters that carry the parts dim (the data first). ``strict`` ones must be DataArrays
        when the data is; others (``sink``, ``basis``) pass through when they are not.
    strict
        Parameters of ``parts`` that must be labelled when the data is (``x``, ``y``, ``mask``).
    rows
        Parameters with one value per row (no parts dim).
    resized
        Name suffix of an output parts axis whose length differs from the input's (``"alr"``,
        ``"ilr"``); ``"inverse"`` strips such a suffix; ``"same"`` keeps the dim name; ``"group"``
        names a trailing output axis ``extra_dim`` whatever its length.
    pairwise
        Items on the last non-parts dim are compared all-against-all (``<item>_a``, ``<item>_b``).
    default_dim
        The parts dims taken (the first present) when nothing else says which.
    extra_dim
        Name of a trailing output axis that is neither the parts nor the items (group shares).
    """

    parts: tuple[str, ...] = ("x", "mask")
    strict: tuple[str, ...] = ("x", "y", "mask", "z")
    rows: tuple[str, ...] = ()
    resized: str | None = None
    pairwise: bool = False
    default_dim: tuple[str, ...] = ("key",)
    extra_dim: str = "group"


def labelled(spec: Spec) -> Callable[[F], F]:
    """Wrap a maths function so that DataArray arguments give labelled results (see module)."""

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        dim_param = inspect.Parameter(
            "dim", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None"
        )
        new_sig = sig.replace(parameters=[*params, dim_param])
        names = set(spec.parts) | set(spec.rows)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            dim = kwargs.pop("dim", None)
            if dim is None and not _any_labelled(args, kwargs):
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            given = {k: v for k, v in bound.arguments.items() if k in names}
            data_name = spec.parts[0] if spec.parts else spec.rows[0]
            if not isinstance(given.get(data_name), xr.DataArray):
                labelled_args = sorted(k for k, v in given.items() if isinstance(v, xr.DataArray))
                if labelled_args:
                    raise ShapeMismatchError(
                        f"{', '.join(labelled_args)} is a DataArray but {data_name} is not; "
                        f"give {data_name} as a DataArray too, or pass .values throughout"
                    )
                raise ShapeMismatchError(
                    f"dim={dim!r} names a dim of a DataArray, but {data_name} is not one; use "
                    "axis= for numpy arrays and torch tensors"
                )
            return _call_labelled(fn, spec, bound, dim)

        call.__signature__ = new_sig  # type: ignore[attr-defined]
        MATHS_FUNCTIONS.append(fn.__name__)
        return call  # type: ignore[return-value]

    return wrap


def _any_labelled(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    return any(isinstance(a, xr.DataArray) for a in args) or any(
        isinstance(v, xr.DataArray) for v in kwargs.values()
    )


def parts_dim(
    x: xr.DataArray, dim: Hashable | None, axis: Any, default: Sequence[str], what: str = "x"
) -> Hashable:
    """The parts dim of ``x`` by the rule of this module, or a one-line refusal."""
    if dim is not None:
        if dim not in x.dims:
            raise ShapeMismatchError(f"dim={dim!r} is not a dim of {what} {tuple(x.dims)}")
        if axis is not None:
            named = _dim_at(x, axis, what)
            if named != dim:
                raise ShapeMismatchError(
                    f"dim={dim!r} and axis={axis!r} ({named!r}) name different parts dims of "
                    f"{what}; give only dim="
                )
        return dim
    if axis is not None:
        return _dim_at(x, axis, what)
    for name in default:
        if name in x.dims:
            return name
    if x.ndim == 1:
        return x.dims[0]
    wanted = " or ".join(repr(d) for d in default)
    raise ShapeMismatchError(
        f"{what} has dims {tuple(x.dims)} and none is {wanted}; say which one holds the parts "
        f"with dim=, e.g. dim={x.dims[-1]!r}"
    )


def _dim_at(x: xr.DataArray, axis: Any, what: str) -> Hashable:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise ShapeMismatchError(f"axis must be an integer, got {axis!r}")
    if not -x.ndim <= int(axis) < x.ndim:
        raise ShapeMismatchError(f"axis {int(axis)} is out of range for {what} {tuple(x.dims)}")
    return x.dims[int(axis)]


def _arrange(da: xr.DataArray, order: Sequence[Hashable]) -> np.ndarray:
    """``da``'s values with its dims in ``order`` and length-1 axes for the dims it lacks."""
    present = [d for d in order if d in da.dims]
    # C order, as a numpy caller's own array would be: results then equal theirs bit for bit
    values = np.ascontiguousarray(da.transpose(*present).values)
    index = tuple(slice(None) if d in da.dims else np.newaxis for d in order)
    return values[index]


def _coords_on(
    sources: Sequence[xr.DataArray], dims: Sequence[Hashable], skip: Sequence[Hashable] = ()
) -> dict[Hashable, Any]:
    """Coordinates of ``sources`` (first wins) that live on ``dims`` only."""
    out: dict[Hashable, Any] = {}
    keep = set(dims)
    for src in sources:
        for name, coord in src.coords.items():
            if name in out or name in skip or not set(coord.dims) <= keep:
                continue
            out[name] = coord.variable
    return out


def _suffixed(
    src: xr.DataArray, item: Hashable, suffix: str
) -> tuple[Hashable, dict[Hashable, Any]]:
    """Coordinates of ``src`` on its item dim, renamed ``<name>_<suffix>`` onto a new dim."""
    new_dim = f"{item}_{suffix}"
    coords: dict[Hashable, Any] = {}
    for name, coord in src.coords.items():
        if coord.dims != (item,):
            continue
        values = np.asarray(coord.values)
        if values.dtype == object:  # a MultiIndex: its levels are coordinates of their own
            continue
        coords[f"{name}_{suffix}"] = (new_dim, values, coord.attrs)
    return new_dim, coords


def _call_labelled(fn: Callable[..., Any], spec: Spec, bound: inspect.BoundArguments, dim: Any):
    args = bound.arguments
    data_name = spec.parts[0] if spec.parts else spec.rows[0]
    x: xr.DataArray = args[data_name]
    part_args = {k: v for k, v in args.items() if k in spec.parts and isinstance(v, xr.DataArray)}
    row_args = {k: v for k, v in args.items() if k in spec.rows and isinstance(v, xr.DataArray)}
    for k in spec.parts:
        v = args.get(k)
        if v is not None and k in spec.strict and not isinstance(v, xr.DataArray):
            raise ShapeMismatchError(
                f"{data_name} is a DataArray but {k} is not; give {k} as a DataArray with named "
                "dims (so it is aligned by label), or pass .values of every array"
            )
    if spec.parts:
        pdim = parts_dim(x, dim, args.get("axis"), spec.default_dim, data_name)
        for k, v in part_args.items():
            if pdim not in v.dims:
                raise ShapeMismatchError(
                    f"{k} has dims {tuple(v.dims)} without the parts dim {pdim!r} of "
                    f"{data_name}; give it that dim (a mask is per part)"
                )
        for k, v in row_args.items():
            if pdim in v.dims:
                raise ShapeMismatchError(
                    f"{k} holds one value per row, but has the parts dim {pdim!r}; drop it"
                )
    else:
        if dim is not None:
            raise ShapeMismatchError(f"{fn.__name__} has no parts dim; leave dim= unset")
        pdim = None
    labelled_all = {**part_args, **row_args}
    item: Hashable | None = None
    if spec.pairwise:
        others = [d for d in x.dims if d != pdim]
        if not others:
            raise ShapeMismatchError(
                f"{fn.__name__} compares items: {data_name} needs a dim besides {pdim!r}"
            )
        item = others[-1]
    try:
        exclude = [item] if item is not None else []
        xr.align(*labelled_all.values(), join="exact", exclude=exclude)
    except ValueError as err:
        raise ShapeMismatchError(
            f"the labelled arguments do not share their coordinates ({str(err).splitlines()[0]}); "
            "select matching labels first (e.g. xr.align)"
        ) from None
    # dims of the result before its trailing axes: x's order, then what the others add
    lead: list[Hashable] = [d for d in x.dims if d not in (pdim, item)]
    for v in labelled_all.values():
        lead += [d for d in v.dims if d not in lead and d not in (pdim, item)]
    tail = [d for d in (item, pdim) if d is not None]
    call = dict(args)
    summed: list[Hashable] = []
    if spec.pairwise and call.get("sum_over") is not None:
        so = call["sum_over"]
        summed = [so] if isinstance(so, str) else list(so)
        if not all(isinstance(s, str) and s in lead for s in summed):
            raise ShapeMismatchError(
                f"sum_over={so!r}: with a DataArray name the summed dims, among {tuple(lead)}"
            )
        call["sum_over"] = tuple(lead.index(s) for s in summed)
    for k, v in part_args.items():
        call[k] = _arrange(v, [*lead, *tail])
    for k, v in row_args.items():
        call[k] = _arrange(v, [*lead, item] if item is not None else lead)
    if "axis" in inspect.signature(fn).parameters and spec.parts:
        call["axis"] = -1
    result = fn(**call)
    out_lead = [d for d in lead if d not in summed]
    sources = [*labelled_all.values()]
    ctx = _Context(spec, x, pdim, item, out_lead, sources, args, fn.__name__)
    if dataclasses.is_dataclass(result):
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        total = getattr(type(result), "total", None)
        if isinstance(total, property) and total.fget is not None:  # AitchisonSplit.total
            fields["total"] = total.fget(result)
        variables = {name: ctx.wrap(value, name) for name, value in fields.items()}
        return xr.Dataset(variables)
    return ctx.wrap(result, fn.__name__)


@dataclasses.dataclass
class _Context:
    spec: Spec
    x: xr.DataArray
    pdim: Hashable | None
    item: Hashable | None
    lead: list[Hashable]
    sources: list[xr.DataArray]
    args: dict[str, Any]
    fn_name: str

    def wrap(self, value: Any, name: str) -> xr.DataArray:
        values = np.asarray(value)
        n_lead = len(self.lead)
        shape_lead = values.shape[:n_lead]
        trailing = values.ndim - n_lead
        dims: list[Hashable] = list(self.lead)
        extra: dict[Hashable, Any] = {}
        resized = False
        if self.item is not None and trailing == 2:
            dim_a, ca = _suffixed(self.x, self.item, "a")
            y = self.args.get("y")
            dim_b, cb = _suffixed(y if isinstance(y, xr.DataArray) else self.x, self.item, "b")
            dims += [dim_a, dim_b]
            extra = {**ca, **cb}
        elif trailing == 1:
            dims.append(self._trailing(int(values.shape[-1]), extra))
            if dims[-1] == self.pdim and values.shape[-1] != self.x.sizes[self.pdim]:
                resized = True
        elif trailing != 0:
            raise ShapeMismatchError(
                f"{self.fn_name} returned {values.shape} for dims {tuple(self.lead)}; "
                "this is a bug in attncoda"
            )
        assert len(shape_lead) == n_lead
        # coordinates on the parts dim only label an output axis of the parts' length
        on_parts = [n for n, c in self.x.coords.items() if self.pdim in c.dims]
        coords = _coords_on(self.sources, dims, skip=on_parts if resized else ())
        coords.update(extra)
        return xr.DataArray(values, dims=dims, coords=coords, name=name)

    def _trailing(self, n: int, extra: dict[Hashable, Any]) -> Hashable:
        """Name (and coordinates, into ``extra``) of a trailing output axis of length ``n``."""
        pdim = self.pdim
        if pdim is None:
            return self.spec.extra_dim
        n_parts = int(self.x.sizes[pdim])
        resized = self.spec.resized
        if n == n_parts and resized not in ("ilr", "inverse", "same", "group"):
            return pdim
        if resized == "alr":  # each coordinate is log(x_j / x_ref): label it by its part j
            new = f"{pdim}_alr"
            given = [self.args[k] for k in ("ref", "ref_idx", "denominator_idx") if k in self.args]
            ref = int(next((r for r in given if r is not None), 0))
            keep = [j for j in range(n_parts) if j != ref % n_parts]
            for cname, coord in self.x.coords.items():
                if coord.dims == (pdim,) and np.asarray(coord.values).dtype != object:
                    extra[f"{cname}_alr" if cname == pdim else cname] = (
                        new,
                        np.asarray(coord.values)[keep],
                    )
            return new
        if resized == "ilr":
            return f"{pdim}_ilr"
        if resized == "inverse":
            text = str(pdim)
            for suffix in ("_alr", "_ilr"):
                if text.endswith(suffix):
                    return text[: -len(suffix)]
            return pdim
        if resized == "same":
            return pdim
        return self.spec.extra_dim  # "group"
