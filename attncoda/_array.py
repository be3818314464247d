"""Backend plumbing shared by the compositional core: numpy and torch through one namespace.

Every public function moves the parts axis to the end, works on a *log-composition* (log parts,
``-inf`` at invisible keys) plus a boolean visibility array, and moves the axis back. Keeping that
in one place is what lets every transform accept the same ``axis=``, ``mask=`` and
``from_logits=`` arguments.

The compositional core is split by idea: :mod:`attncoda._closure` (closure, the learned sink),
:mod:`attncoda._zeros` (zero replacement), :mod:`attncoda._logratio` (clr, alr, ilr and their
inverses), :mod:`attncoda._bases` (ilr bases), :mod:`attncoda._geometry` (the Aitchison geometry
of matched rows), :mod:`attncoda._pairwise` (all pairs of rows), and the sink/content side:
:mod:`attncoda._decompose`, :mod:`attncoda._entropy`, :mod:`attncoda._groups`,
:mod:`attncoda._aitchison_split` and :mod:`attncoda._entropy_change`.
Names and argument order follow :mod:`skbio.stats.composition` (``clr(x, axis=-1,
validate=True)``), with three additions:

``mask=``
    Boolean visibility broadcastable to ``x``. Invisible parts (keys hidden by causality or
    padding) are *structural zeros*: they are excluded from every computation, never replaced.
    Log-ratio outputs hold ``0`` there; compositions hold ``0``.
``from_logits=True``
    ``x`` holds logits or log-probabilities (any additive constant per row), with ``-inf`` at
    invisible parts. This is what capture produces: ``clr(softmax(z)) = z - mean(z)``, so no zero
    ever needs replacing and nothing underflows.
``ref=`` / ``sink=``
    The reference part defaults to the *sink*, the first visible part of each row (under left
    padding that is not index 0). :func:`~attncoda.alr` and :func:`~attncoda.alr_inv` also take
    scikit-bio's ``ref_idx=`` and composition-stats' ``denominator_idx=`` for it. R's
    ``compositions::alr`` uses the *last* part instead.

Every function that can meet a row with too few visible parts takes
``degenerate="raise" | "nan"``. Precision: float64 inputs are exact to rounding (identities hold
to 1e-10); float32 inputs are computed in float32 and hold to about 1e-5 relative;
float16/bfloat16 are computed in float32. ``validate=False`` skips the checks that read the data
(and an explicit basis), never the cheap checks of arguments.

The input rules below hold for every public maths function (the modules above); a call that breaks one is refused with a one-line
:class:`~attncoda.CompositionError` (or a subclass) that says what to do, never an internal
``AttributeError`` or a silently wrong number.

Array kinds
    Each array argument (the data, ``y``, ``mask``, ``basis``, ``sink``, ``groups``, an exponent,
    summaries) may be a numpy array, a torch tensor, or anything :func:`numpy.asarray` takes
    (nested lists, tuples, scalars). **If any of them is a torch tensor, the call computes in
    torch on that tensor's device**: the numpy and list arguments are copied there and the
    results are tensors. Otherwise it computes in numpy and returns numpy arrays. Nothing leaves
    its device and no autograd history is dropped (on one torch thread, CPU tensors that autograd
    does not track are computed by numpy on zero-copy views and returned as tensors:
    :func:`numpy_views`); tensors on different devices raise
    :class:`~attncoda.DeviceMismatchError`, and numpy data that torch cannot hold (``float128``)
    is refused. The basis builders (``pivot_basis``,
    ``sbp_basis``, ``group_basis``) take no data and always return small numpy tables; ``ilr``
    moves a basis to the data's device. **If the data is an** :class:`xarray.DataArray`, the
    call is labelled (:func:`labelled`): DataArray in, DataArray out, dims and coordinates kept.
Dtypes
    Data must be real numbers. Floats keep their dtype (float16 and bfloat16 are computed in
    float32); **integer arrays are accepted as counts** (converted to float64, as in
    scikit-bio, so ``closure([3, 1, 4])`` closes counts); booleans, complex numbers, strings,
    dates and objects are refused (a boolean array is far more often a mask passed by mistake
    than data). Masks must be **boolean** (True = visible part): 0/1 integers and floats are
    refused rather than guessed at, since additive float masks (0 / -inf) mean the opposite.
Axes, indices and counts
    ``axis``, ``ref``, sink and group indices and ``n_parts`` must be Python or numpy integers,
    not booleans or floats; negative indices count from the end, as in numpy, and anything out
    of range is refused.
Shapes
    Masks and per-row arguments must broadcast to the data (parts on ``axis``); ragged nested
    lists are refused.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import numbers
import reprlib
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import array_api_compat
import numpy as np
import xarray as xr

from ._errors import (
    AxisOutOfRangeError,
    CompositionError,
    DeviceMismatchError,
    NegativePartError,
    NonFiniteError,
    NotClosedError,
    PartIndexError,
    ShapeMismatchError,
    TooFewPartsError,
    ZeroPartError,
)

Array = Any  # a numpy.ndarray or a torch.Tensor; kept loose so both type-check

#: What to do with rows that have too few visible parts (see :func:`check_degenerate`).
Degenerate = Literal["raise", "nan"]

__all__ = [
    "Array",
    "LogComposition",
    "as_float",
    "device_of",
    "first_tensor",
    "is_tensor",
    "log_composition",
    "namespace",
]


def _is_torch(x: object) -> bool:
    return array_api_compat.is_torch_array(x)


def is_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor."""
    return _is_torch(x)


@functools.cache
def _numpy_namespace() -> Any:
    return array_api_compat.array_namespace(np.empty(0))


def namespace(*arrays: object) -> Any:
    """Return the array namespace of a call over ``arrays``: torch if any is a tensor, else numpy.

    numpy inputs (and lists) mixed with torch tensors are allowed: :func:`as_float` and
    :func:`to_kind` copy them to the tensor's device (the rule in this module's docstring).
    Tensors on different devices raise :class:`DeviceMismatchError`.
    """
    tensors = [a for a in arrays if _is_torch(a)]
    if not tensors:
        return _numpy_namespace()
    devices = {str(t.device) for t in tensors}  # type: ignore[attr-defined]
    if len(devices) > 1:
        raise DeviceMismatchError(
            f"inputs live on different devices {sorted(devices)}; move them to one device "
            "first, e.g. `y = y.to(x.device)`"
        )
    return array_api_compat.array_namespace(tensors[0])


def first_tensor(*arrays: object) -> Any:
    """The first torch tensor among ``arrays`` (whose device a mixed call computes on), or None."""
    return next((a for a in arrays if _is_torch(a)), None)


def _as_numpy(x: Any, what: str) -> np.ndarray:
    """``numpy.asarray(x)`` with a readable refusal for ragged nested lists and for numpy
    masked arrays (whose mask ``asarray`` would drop silently)."""
    if hasattr(x, "tocoo") and hasattr(x, "nnz"):  # a scipy.sparse array or matrix
        raise CompositionError(
            f"{what} is a scipy sparse {type(x).__name__}; its absent entries would be zero "
            f"parts: convert it with `{what}.toarray()` and mark structural zeros with mask="
        )
    if isinstance(x, np.ma.MaskedArray) and np.ma.getmaskarray(x).any():
        raise CompositionError(
            f"{what} is a numpy masked array; attncoda does not read numpy masks (the masked "
            f"values would count): pass {what}.data with mask=~{what}.mask (True = visible part)"
        )
    try:
        arr = np.asarray(x)
        # np.matrix (and other subclasses) change what reductions and indexing return: compute
        # on the plain array, as every result is one
        return arr if type(arr) is np.ndarray else arr.view(np.ndarray)
    except (ValueError, TypeError):
        raise ShapeMismatchError(
            f"{what} is not a rectangular array (nested rows of different lengths?); give rows "
            "of equal length and mark missing parts with mask="
        ) from None


def _check_tensor(x: Any, what: str) -> None:
    """Refuse tensors that hold no dense values attncoda could read: meta (shapes only),
    sparse (every layout but strided) and nested (ragged) tensors."""
    if x.is_meta:
        raise CompositionError(
            f"{what} is a meta tensor (a shape without values); load or compute its values "
            "first (e.g. `x.to_empty(device='cpu')` then fill it, or load the weights)"
        )
    if getattr(x, "is_nested", False):
        raise ShapeMismatchError(
            f"{what} is a nested (ragged) tensor; pad its rows to one length and mark the "
            "missing parts with mask= (e.g. `x.to_padded_tensor(0.0)`)"
        )
    if str(x.layout) != "torch.strided":
        raise CompositionError(
            f"{what} is a sparse tensor ({str(x.layout).replace('torch.', '')}); its absent "
            "entries would be zero parts: convert it with `x.to_dense()` and mark structural "
            "zeros with mask="
        )


def _check_numeric_dtype(dtype: Any, what: str, allow_bool: bool) -> str:
    """Classify ``dtype`` as ``"float"``, ``"int"`` or ``"bool"``, or refuse it."""
    name = str(dtype).replace("torch.", "")
    if name.startswith(("float", "bfloat")):
        return "float"
    if name.startswith(("int", "uint")):
        return "int"
    if name == "bool":
        if allow_bool:
            return "bool"
        raise CompositionError(
            f"{what} is boolean; it must hold numbers (a boolean array is a mask: pass it as "
            "mask=, or convert it with `.astype(float)` / `.float()` if you mean 0/1 values)"
        )
    raise CompositionError(
        f"{what} has dtype {name}, but must hold real numbers; convert it to a float array "
        "first (strings, complex numbers, dates and objects are not numbers to attncoda)"
    )


def to_kind(x: Any, xp: Any, like: Any, what: str = "x") -> Array:
    """``x`` as an array of ``xp`` (a tensor on ``like``'s device when ``xp`` is torch).

    The dtype is kept; numpy input that torch cannot hold is refused. Tensors are returned as
    they are (a tensor is never converted to numpy).
    """
    if _is_torch(x):
        _check_tensor(x, what)
        return x
    arr = _as_numpy(x, what)
    if like is None or not _is_torch(like):
        return arr
    import torch

    if arr.dtype.kind in "OUSMmVc":
        _check_numeric_dtype(arr.dtype, what, allow_bool=True)  # raises
    try:
        return torch.as_tensor(arr, device=like.device)
    except (TypeError, RuntimeError) as exc:
        raise CompositionError(
            f"{what} has dtype {arr.dtype}, which torch cannot hold ({exc}); convert it to "
            "float64 first"
        ) from None


def as_float(x: Array, xp: Any, like: Array | None = None, *, what: str = "x") -> Array:
    """Convert ``x`` to a floating array of ``xp`` without modifying it.

    Integers become float64 (counts are valid compositions, as in scikit-bio); float16 and
    bfloat16 become float32 so that logs and sums are not computed in half precision. Booleans
    and non-numeric dtypes are refused with :class:`CompositionError`. When the call computes in
    torch, ``like`` is the tensor (from :func:`first_tensor`) whose device numpy input is copied
    to.
    """
    x = to_kind(x, xp, like, what)
    kind = _check_numeric_dtype(x.dtype, what, allow_bool=False)
    if kind == "float":
        if _is_torch(x) and x.element_size() < 4:  # float16, bfloat16, float8
            return x.float()
        if not _is_torch(x) and x.dtype == np.float16:
            return x.astype(np.float32)
        return x
    return xp.astype(x, xp.float64)


def sqrt0(xp: Any, a: Array) -> Array:
    """``sqrt(a)`` of non-negative ``a`` whose gradient is 0 where ``a`` is 0 (a norm or a
    distance at 0, as ``torch.linalg.norm`` gives), not NaN: a double ``where`` for tensors
    that require gradients; the plain square root otherwise."""
    if not bool(getattr(a, "requires_grad", False)):
        return xp.sqrt(a)
    pos = a > 0
    return xp.where(pos, xp.sqrt(xp.where(pos, a, xp.ones_like(a))), xp.zeros_like(a))


def require_integer_sink(spec: Any, given: Any) -> None:
    """The one rule for ``sink=`` given as key indices or positions (``decompose``, the
    analyses, the explorer, the head view): integers only. A float (``1.99``, even ``2.0``) or a
    bool is refused, never truncated to a key (``int(1.99)`` is key 1).

    ``spec`` is ``given`` as an array (numpy or torch).
    """
    kind = str(spec.dtype).replace("torch.", "")
    if kind == "bool" or not kind.startswith(("int", "uint")):
        shown = repr(given) if spec.ndim == 0 or isinstance(given, (list, tuple)) else None
        if shown is None or "\n" in shown or len(shown) > 80:
            shown = f"{kind} values {reprlib.repr(spec.reshape(-1).tolist())}"
        raise ShapeMismatchError(
            f"sink must be an integer key index (or a list of them), got {shown}; a float or a "
            "bool is never rounded to a key: pass int(...) of the key you mean"
        )


def as_bool(mask: Array, xp: Any, like: Array, what: str = "mask") -> Array:
    """Convert a visibility mask to a boolean array of ``xp`` on ``like``'s device.

    Only boolean masks are accepted (True = visible part); 0/1 integers and floats are refused
    with a hint, since a float mask is often additive (0 = visible, -inf = hidden).
    """
    mask = to_kind(mask, xp, like, what)
    if not xp.isdtype(mask.dtype, "bool"):
        raise CompositionError(
            f"{what} must be boolean (True = visible part), got dtype {mask.dtype}; convert it "
            "with `mask.astype(bool)` / `mask.bool()` if 1 marks a visible part (an additive "
            "0/-inf mask is `mask == 0`)"
        )
    return mask


def epsilon(dtype: Any) -> float:
    """Machine epsilon of a numpy or torch float dtype (bfloat16's 2**-7 included); 0 for
    integers (exact)."""
    name = str(dtype).replace("torch.", "")
    if name == "bfloat16":
        return 2.0**-7
    if name.startswith("float8"):
        return 2.0**-2 if "e5m2" in name else 2.0**-3
    try:
        kind = np.dtype(name)
    except TypeError:
        return 0.0
    return float(np.finfo(kind).eps) if kind.kind == "f" else 0.0


def tolerance(dtype: Any, n_parts: int = 1, *, source: Any = None) -> float:
    """Closure tolerance for rows of ``n_parts`` values computed in ``dtype``.

    1e-6 in float64 and 1e-4 in float32, and never less than the rounding a closed row can
    carry: its values rounded once to the precision they were given in (``source``, e.g.
    float16 rows upcast to float32) move the sum by at most ``eps(source) / 2`` (the values sum
    to 1), allowed twice over for the producer's own rounding; summing ``n_parts`` values
    (pairwise, as numpy and torch do) adds up to ``log2(n_parts) * eps(dtype)``. So float16
    and bfloat16 rows closed where they were made are not refused.

    Examples
    --------
    >>> tolerance("float32"), tolerance("float64")
    (0.0001, 1e-06)
    >>> tolerance("float32", 3, source="float16")  # values rounded to float16
    0.0009765625
    """
    base = 1e-6 if "64" in str(dtype) else 1e-4
    given = epsilon(source) if source is not None else 0.0
    return max(base, given, math.log2(max(n_parts, 2)) * epsilon(dtype))


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer index or count: a Python or numpy integer, or a 0-d
    integer array or tensor; never a bool, a float or a string."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Integral):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(value, "ndim", 1) != 0:
        return False
    name = str(dtype).replace("torch.", "")
    return name.startswith(("int", "uint"))


def check_index(value: object, n: int, what: str) -> int:
    """``value`` as an index into ``n`` parts (negative counts from the end), or a refusal."""
    if not is_integer(value):
        raise ShapeMismatchError(f"{what} must be an integer index, got {value!r}")
    i = int(value)  # type: ignore[call-overload]
    if not -n <= i < n:
        raise PartIndexError(f"{what}={i} is out of range for rows of {n} parts")
    return i % n


def check_count(value: object, what: str, minimum: int) -> int:
    """``value`` as an integer count of at least ``minimum``, or a refusal."""
    if not is_integer(value):
        raise ShapeMismatchError(f"{what} must be an integer, got {value!r}")
    n = int(value)  # type: ignore[call-overload]
    if n < minimum:
        raise TooFewPartsError(f"{what} must be at least {minimum}, got {n}")
    return n


def normalize_axis(axis: object, ndim: int) -> int:
    """Return ``axis`` as a non-negative index, or raise :class:`ShapeMismatchError`."""
    if not is_integer(axis):
        raise ShapeMismatchError(f"axis must be an integer, got {axis!r}")
    if ndim == 0:
        raise ShapeMismatchError("expected an array with a parts axis, got a scalar")
    ax = int(axis)  # type: ignore[call-overload]
    if not -ndim <= ax < ndim:
        raise AxisOutOfRangeError(f"axis {ax} is out of range for an array with {ndim} dims")
    return ax % ndim


def broadcast_mask(
    mask: Array, shape: tuple[int, ...], axis: int, xp: Any, what: str = "mask"
) -> Array:
    """Broadcast ``mask`` to ``shape`` (parts axis already moved last) with a readable error."""
    try:
        return xp.broadcast_to(mask, shape)
    except (ValueError, RuntimeError) as exc:
        raise ShapeMismatchError(
            f"{what} of shape {tuple(mask.shape)} does not broadcast to the data's shape {shape} "
            f"(after moving axis {axis} last); give {what} the data's shape"
        ) from exc


def pair_shape(
    a: Array, b: Array, axis: int | None = None, what: str = "x and y"
) -> tuple[int, ...]:
    """The shape ``a`` and ``b`` broadcast to, or :class:`ShapeMismatchError`.

    With ``axis`` (the parts axis of each), both must also have their parts on the same axis of
    that shape, with the same number of parts (parts are never broadcast).
    """
    sa, sb = tuple(a.shape), tuple(b.shape)
    try:
        shape = tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        raise ShapeMismatchError(
            f"{what} have shapes {sa} and {sb}, which do not broadcast; give arrays of the same "
            "shape (parts on the same axis)"
        ) from None
    if axis is not None and sa != sb:
        own_a, own_b = normalize_axis(axis, len(sa)), normalize_axis(axis, len(sb))
        same_axis = len(sa) - own_a == len(sb) - own_b  # counted from the right, as broadcasting
        if not same_axis or sa[own_a] != sb[own_b]:
            raise ShapeMismatchError(
                f"{what} of shapes {sa} and {sb} do not have the same parts on axis={axis}; "
                "give them the same number of dims (or use axis=-1) and the same parts"
            )
    return shape


def broadcast_pair(
    a: Array, b: Array, xp: Any, axis: int | None = None, what: str = "x and y"
) -> tuple[Array, Array]:
    """``a`` and ``b`` broadcast to one shape (views), or :class:`ShapeMismatchError`; with
    ``axis``, checked to share their parts axis (see :func:`pair_shape`)."""
    if tuple(a.shape) == tuple(b.shape):
        return a, b
    shape = pair_shape(a, b, axis, what)
    return xp.broadcast_to(a, shape), xp.broadcast_to(b, shape)


def logsumexp(xp: Any, a: Array, keepdims: bool = False) -> Array:
    """Stable log-sum-exp over the last axis; rows that are all ``-inf`` give ``-inf``."""
    if _is_torch(a):
        import torch

        return torch.logsumexp(a, dim=-1, keepdim=keepdims)
    m = xp.max(a, axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    with np.errstate(divide="ignore"):
        out = xp.log(xp.sum(xp.exp(a - m), axis=-1, keepdims=True)) + m
    return out if keepdims else out[..., 0]


def row_sums(xp: Any, x: Array) -> Array:
    """``x``'s sums along its last axis, kept (``keepdims``), without floating-point warnings.

    A large float numpy ``x`` is summed through torch's kernel where installed (numpy's sum
    along a last axis of a few hundred parts is about 3x slower on one thread); the same
    sums, added in another order.
    """
    if isinstance(x, np.ndarray) and x.ndim >= 1 and x.nbytes >= TORCH_MIN_BYTES:
        views = torch_views(x)
        if views is not None:
            return torch_module().sum(views[0], -1, keepdim=True).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        return xp.sum(x, axis=-1, keepdims=True)


def all_finite(xp: Any, x: Array) -> bool:
    """Whether every value of ``x`` is finite (meant for small, per-row arrays).

    One reduction: the sum is finite iff every value is, unless it overflowed, in which case
    the values are checked one by one.
    """
    if _is_torch(x):
        x = x.detach()
    with np.errstate(invalid="ignore", over="ignore"):
        total = float(xp.sum(x))
    if math.isfinite(total):
        return True
    return bool(xp.all(xp.isfinite(x)))


def can_overwrite(x: Array) -> bool:
    """Whether a temporary the library allocated may be updated in place.

    Never true for a tensor that autograd tracks (an in-place update could invalidate a saved
    value); callers only ask this about arrays they created themselves, never about user input.
    """
    if isinstance(x, np.ndarray):
        return bool(x.flags.writeable)
    return not bool(getattr(x, "requires_grad", True))


def sum_where(xp: Any, a: Array, keep: Array, keepdims: bool = False) -> Array:
    """Sum over the last axis of the entries of ``a`` where ``keep`` is True (no temporary
    copy of ``a`` in numpy)."""
    if isinstance(a, np.ndarray):
        return np.sum(a, axis=-1, where=keep, keepdims=keepdims)
    return xp.sum(xp.where(keep, a, xp.zeros_like(a)), axis=-1, keepdims=keepdims)


def check_finite_values(xp: Any, x: Array, what: str) -> None:
    """Raise :class:`NonFiniteError` if ``x`` holds NaN or an infinity."""
    if not bool(xp.all(xp.isfinite(x))):
        raise NonFiniteError(
            f"{what} contains NaN or infinite values; attncoda never propagates them silently. "
            "Remove or fix those rows first"
        )


@dataclass
class LogComposition:
    """Rows on the last axis as log parts plus visibility.

    Attributes
    ----------
    xp
        The array namespace (numpy or torch).
    log
        Log parts, ``-inf`` at invisible parts. Defined up to an additive constant per row.
    visible
        Boolean, same shape as ``log``; ``None`` means every part is visible (the fast path).
    axis
        The caller's parts axis, normalised, so results can be moved back.
    rowsum
        Sum of ``log`` over the parts (keepdims) when it was already computed during validation
        (only without invisible parts); saves a pass over the data.
    owned
        Whether ``log`` is a temporary created here (never the caller's array), so that a final
        transform may reuse its memory (``clr(consume=True)``).
    """

    xp: Any
    log: Array
    visible: Array | None
    axis: int
    rowsum: Array | None = None
    owned: bool = False

    @property
    def n_parts(self) -> int:
        return int(self.log.shape[-1])

    def visible_full(self) -> Array:
        xp = self.xp
        if self.visible is None:
            return xp.ones(self.log.shape, dtype=xp.bool, device=device_of(self.log))
        return self.visible

    def count(self) -> Array:
        """Number of visible parts per row (float, keepdims)."""
        xp = self.xp
        if self.visible is None:
            return xp.full(
                (*self.log.shape[:-1], 1),
                float(self.n_parts),
                dtype=self.log.dtype,
                device=device_of(self.log),
            )
        return xp.astype(xp.sum(self.visible, axis=-1, keepdims=True), self.log.dtype)

    def zero_invisible(self, values: Array) -> Array:
        """Set invisible parts of ``values`` to 0 (log-ratio coordinates of structural zeros)."""
        if self.visible is None:
            return values
        return self.xp.where(self.visible, values, self.xp.zeros_like(values))

    def clr(self, consume: bool = False) -> Array:
        """Centred log-ratios over visible parts, 0 at invisible parts.

        With ``consume=True`` the result may be written into ``log`` itself when that is a
        temporary owned by this object; ``log`` must not be used afterwards.
        """
        xp = self.xp
        if self.visible is None:
            n = self.n_parts
            if self.rowsum is not None and n > 0:
                mean = self.rowsum / n
            else:
                mean = xp.mean(self.log, axis=-1, keepdims=True)
            if consume and self.owned and can_overwrite(self.log):
                self.log -= mean
                self.rowsum = None
                return self.log
            return self.log - mean
        mean = sum_where(xp, self.log, self.visible, keepdims=True) / self.count()
        if consume and self.owned and can_overwrite(self.log):
            out = self.log
            out -= mean
        else:
            out = self.log - mean
        # invisible parts are -inf - mean: set them to 0 in place (``out`` is ours either way)
        if isinstance(out, np.ndarray):
            np.copyto(out, 0.0, where=~self.visible)
            return out
        if can_overwrite(out):
            return out.masked_fill_(~self.visible, 0.0)
        return self.zero_invisible(out)

    def log_closed(self) -> Array:
        """Log-probabilities over visible parts (``-inf`` at invisible parts)."""
        return self.log - logsumexp(self.xp, self.log, keepdims=True)

    def restore(self, values: Array) -> Array:
        """Move the last axis back to the caller's parts axis."""
        if self.axis == values.ndim - 1:
            return values
        return self.xp.moveaxis(values, -1, self.axis)

    def require_parts(self, minimum: int = 2) -> None:
        """Raise :class:`TooFewPartsError` if any row has fewer than ``minimum`` visible parts."""
        if self.visible is None:
            if self.n_parts < minimum:
                raise TooFewPartsError(
                    f"rows have {self.n_parts} part(s); at least {minimum} are needed here; "
                    f"give more parts, {DEGENERATE_HINT}"
                )
            return
        low = self.count() < minimum
        if bool(self.xp.any(low)):
            raise too_few_parts(int(self.xp.sum(self.xp.astype(low, self.xp.int64))), minimum)

    def degenerate_rows(self, minimum: int, degenerate: str, validate: bool) -> Array | None:
        """Apply the ``degenerate=`` policy to rows with fewer than ``minimum`` visible parts.

        ``"raise"``: :meth:`require_parts` (with ``validate``) and ``None``. ``"nan"``: the
        boolean rows (keepdims) that the caller fills with NaN, or ``None`` when there are none.
        """
        check_degenerate(degenerate)
        if degenerate == "raise":
            if validate:
                self.require_parts(minimum)
            return None
        xp = self.xp
        if self.visible is None:
            if self.n_parts >= minimum:
                return None
            shape = (*self.log.shape[:-1], 1)
            return xp.ones(shape, dtype=xp.bool, device=device_of(self.log))
        low = self.count() < minimum
        return low if bool(xp.any(low)) else None


#: Values of every ``degenerate=`` argument: raise on rows with too few visible parts, or give
#: NaN there.
DEGENERATE = ("raise", "nan")

#: The end of every refusal of rows with too few visible parts: the same advice everywhere.
DEGENERATE_HINT = "or pass degenerate='nan' for NaN in those rows"


def check_degenerate(degenerate: object) -> None:
    """Refuse a ``degenerate=`` value other than ``"raise"`` or ``"nan"``."""
    if degenerate not in DEGENERATE:
        raise CompositionError(f"degenerate must be 'raise' or 'nan', got {degenerate!r}")


def too_few_parts(n_low: int, minimum: int) -> TooFewPartsError:
    """The one refusal of ``n_low`` rows with fewer than ``minimum`` visible parts."""
    if minimum <= 1:
        return TooFewPartsError(
            f"{n_low} row(s) have no visible part (mask= or -inf hides every part); drop those "
            f"rows, {DEGENERATE_HINT}"
        )
    return TooFewPartsError(
        f"{n_low} row(s) have fewer than {minimum} visible parts (e.g. the first query of a "
        f"causal model sees only itself); drop those rows (select queries >= {minimum - 1}), "
        f"{DEGENERATE_HINT}"
    )


def nan_rows(xp: Any, values: Array, low: Array | None) -> Array:
    """``values`` with NaN in the rows ``low`` marks (``low`` broadcasts against ``values``)."""
    if low is None:
        return values
    return xp.where(low, xp.full_like(values, math.nan), values)


def device_of(x: Array) -> Any:
    """The torch device of ``x``, or ``None`` for numpy (what array-API creation functions take)."""
    return x.device if _is_torch(x) else None


def parts_last(
    x: Array,
    axis: int = -1,
    mask: Array | None = None,
    *,
    others: tuple[Any, ...] = (),
    what: str = "x",
) -> tuple[Any, Array, Array | None, int]:
    """Return ``(xp, x, visible, axis)`` with ``x`` float, parts moved last, mask broadcast.

    ``visible`` is ``None`` when no mask was given. ``others`` are the call's other array
    arguments: they take part in choosing the namespace and device (a tensor among them makes
    the call compute in torch), but are not converted here.
    """
    xp = namespace(x, mask, *others)
    like = first_tensor(x, mask, *others)
    x = as_float(x, xp, like, what=what)
    ax = normalize_axis(axis, x.ndim)
    if ax != x.ndim - 1:
        x = xp.moveaxis(x, ax, -1)
    visible = None
    if mask is not None:
        m = as_bool(mask, xp, x)
        if m.ndim == x.ndim and ax != x.ndim - 1:
            m = xp.moveaxis(m, ax, -1)
        elif m.ndim > x.ndim:
            raise ShapeMismatchError(
                f"mask has {m.ndim} dims but the data only {x.ndim}; give a mask with the data's "
                "shape"
            )
        visible = broadcast_mask(m, tuple(x.shape), axis, xp)
    return xp, x, visible, ax


def log_composition(
    x: Array,
    axis: int = -1,
    *,
    mask: Array | None = None,
    from_logits: bool = False,
    validate: bool = True,
    allow_zeros: bool = False,
    require_closed: bool = False,
    others: tuple[Any, ...] = (),
    what: str = "x",
) -> LogComposition:
    """Validate ``x`` and return it as a :class:`LogComposition` with parts on the last axis.

    Parameters
    ----------
    x
        Compositions (non-negative parts) or, with ``from_logits=True``, logits or
        log-probabilities, where ``-inf`` marks an invisible part.
    mask
        Optional boolean visibility, broadcastable to ``x``; False parts are structural zeros.
    allow_zeros
        Whether visible zero parts are acceptable (entropy, closure) or an error (log-ratios).
    require_closed
        Whether rows must already sum to one over their visible parts.
    others
        The call's other array arguments, which choose the namespace with ``x`` (see
        :func:`parts_last`).
    """
    source = getattr(x, "dtype", None)  # the precision the values were given in
    xp, x, visible, ax = parts_last(x, axis, mask, others=others, what=what)

    if from_logits:
        if visible is None:
            # Fast path: a NaN or an infinity makes its row sum non-finite, so one reduction
            # (whose result clr reuses) replaces the separate NaN, +inf and -inf passes. Rows
            # that fail it (masked -inf keys, bad values, or a sum that overflowed) take the
            # precise path below.
            total = row_sums(xp, x)
            if all_finite(xp, total):
                return LogComposition(xp, x, None, ax, rowsum=total)
        if validate:
            ok = x < math.inf  # False for NaN and +inf
            if visible is not None:  # what mask= hides is never read (e.g. NaN padding)
                ok = ok | ~visible
            if not bool(xp.all(ok)):
                raise NonFiniteError(
                    "logits contain NaN or +inf at visible parts; only -inf is allowed (it marks "
                    "an invisible key), or hide padding with mask="
                )
        finite = x > -math.inf
        if visible is None:
            visible = None if bool(xp.all(finite)) else finite
        else:
            visible = visible & finite
        if visible is None:
            return LogComposition(xp, x, None, ax)
        neg_inf = xp.full((), -math.inf, dtype=x.dtype, device=device_of(x))
        log = xp.where(visible, x, neg_inf)
        return LogComposition(xp, log, visible, ax, owned=True)

    if validate and visible is None and not allow_zeros and not require_closed:
        # Fast path: log(x) is finite exactly where 0 < x < inf, and the row sums of finite logs
        # stay finite (|log x| < 750), so checking the row sums validates every part in the pass
        # that clr needs anyway. Failures get the precise diagnosis of validate_parts.
        with np.errstate(divide="ignore", invalid="ignore"):
            log = log_into(x) if isinstance(x, np.ndarray) else xp.log(x)
        total = row_sums(xp, log)
        if all_finite(xp, total):
            return LogComposition(xp, log, None, ax, rowsum=total, owned=True)
        validate_parts(xp, x, None, allow_zeros=False)  # raises

    if validate:
        validate_parts(xp, x, visible, allow_zeros=allow_zeros)
        if require_closed:
            validate_closed(xp, x, visible, source=source)
    if visible is None:
        # validated parts are > 0 (>= 0 with allow_zeros); unvalidated ones (validate=False)
        # give NaN/-inf where they are invalid, silently, as the caller asked
        if isinstance(x, np.ndarray):
            log = log_into(x)
        elif bool(getattr(x, "requires_grad", False)):
            # log(0) = -inf has an infinite derivative; times the zero gradient of the terms
            # that ignore it (0 log 0 = 0) it is NaN, which would reach every part: the log
            # of the positive parts only, constants elsewhere (the double ``where``)
            pos = x > 0
            log = xp.where(pos, xp.log(xp.where(pos, x, xp.ones_like(x))), _log_of_non_positive(x))
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                log = xp.log(x)
    else:
        safe = xp.where(visible, x, xp.ones_like(x))
        with np.errstate(divide="ignore", invalid="ignore"):
            log = xp.where(visible, xp.log(safe), xp.full_like(x, -math.inf))
    return LogComposition(xp, log, visible, ax, owned=True)


def _log_of_non_positive(x: Any) -> Any:
    """``log`` of a tensor's non-positive parts as constants: ``-inf`` at 0, NaN below."""
    import torch

    return torch.where(x == 0, -math.inf, math.nan).to(x.dtype).detach()


# Large numpy inputs are processed in blocks of rows, so that the temporaries of each block stay
# in cache and the only full-size arrays are the results (fresh memory is costly to fault in).
ROW_BLOCK_BYTES = 4 << 20
MIN_BLOCKED_BYTES = 64 << 20
#: Blocks of two factors and their product (three arrays) that stay in the shared L3 cache.
PRODUCT_BLOCK_BYTES = 1 << 20


def by_row_blocks(
    fn: Any,
    x: Array,
    axis: int,
    out_field: str | None = None,
    row_args: dict[str, np.ndarray] | None = None,
    **kwargs: Any,
) -> Any:
    """Apply a row-wise transform ``fn(block, **kwargs)`` to blocks of rows of ``x``.

    Only for a large, C-contiguous numpy ``x`` with the parts on its last axis (otherwise, and
    when any block raises a ``ValueError`` such as a :class:`CompositionError`, returns ``None``
    and the caller runs the one-shot path, which raises the precise error for the whole input).
    ``fn`` returns an array or a dataclass of arrays whose first axis is the block's rows; the
    blocks' results are written into arrays for all rows, with ``x``'s leading shape. With
    ``out_field``, ``fn`` also takes ``<out_field>_out=``, the block's slice of that field's
    result, and may compute the field in place there (saving a copy). ``row_args`` are numpy
    arrays that broadcast to ``x`` (masks of keys): each block gets its rows of them (``None``
    is returned where one does not broadcast).
    """
    if not isinstance(x, np.ndarray) or x.ndim < 2 or not x.flags.c_contiguous:
        return None
    if x.nbytes < MIN_BLOCKED_BYTES or normalize_axis(axis, x.ndim) != x.ndim - 1:
        return None
    n_parts = int(x.shape[-1])
    rows = x.reshape(-1, n_parts)
    n_rows = int(rows.shape[0])
    step = max(1, ROW_BLOCK_BYTES // max(1, n_parts * 8))
    if n_parts == 0 or n_rows <= step:
        return None
    by_rows: dict[str, np.ndarray] = {}
    for name, arr in (row_args or {}).items():
        try:  # a copy of the mask where its broadcast view has no row layout (1 byte a part)
            by_rows[name] = np.broadcast_to(arr, x.shape).reshape(-1, n_parts)
        except ValueError:
            return None
    outs: list[np.ndarray] | None = None
    first: Any = None
    extra: dict[str, np.ndarray] = {}
    try:
        for start in range(0, n_rows, step):
            block_args = {k: v[start : start + step] for k, v in by_rows.items()}
            res = fn(rows[start : start + step], **kwargs, **extra, **block_args)
            parts = [res] if isinstance(res, np.ndarray) else list(vars(res).values())
            if not all(isinstance(p, np.ndarray) and p.ndim >= 1 for p in parts):
                return None
            if outs is None:
                first = res
                outs = [np.empty((n_rows, *p.shape[1:]), dtype=p.dtype) for p in parts]
            for out, part in zip(outs, parts, strict=True):
                dest = out[start : start + step]
                if part is not extra.get(f"{out_field}_out"):
                    dest[...] = part
            if out_field is not None:
                k = list(vars(first)).index(out_field)
                extra = {f"{out_field}_out": outs[k][start + step : start + 2 * step]}
    except ValueError:
        return None
    assert outs is not None
    lead = tuple(x.shape[:-1])
    shaped = [o.reshape(*lead, *o.shape[1:]) for o in outs]
    if isinstance(first, np.ndarray):
        return shaped[0]
    return type(first)(**dict(zip(vars(first), shaped, strict=True)))


def validate_parts(xp: Any, x: Array, visible: Array | None, *, allow_zeros: bool) -> None:
    """One cheap combined pass; a precise diagnosis only when it fails."""
    data = x if visible is None else xp.where(visible, x, xp.ones_like(x))
    ok = (data >= 0) & (data < math.inf) if allow_zeros else (data > 0) & (data < math.inf)
    if bool(xp.all(ok)):
        if allow_zeros:
            with np.errstate(over="ignore"):  # an overflowing sum (inf) has mass too
                total = xp.sum(
                    data if visible is None else xp.where(visible, x, xp.zeros_like(x)), axis=-1
                )
            if bool(xp.any(total <= 0)):
                raise ZeroPartError(
                    "some rows have no positive visible part (all zeros, no parts, or every "
                    "part hidden by mask=); a composition needs mass somewhere: drop those rows"
                )
        return
    if bool(xp.any(xp.isnan(data))) or bool(xp.any(xp.isinf(data))):
        raise NonFiniteError(
            "input contains NaN or infinite values; attncoda never propagates them silently. "
            "Fix those rows, or pass logits with -inf for invisible keys and from_logits=True"
        )
    if bool(xp.any(data < 0)):
        raise NegativePartError(
            "compositions cannot have negative parts; if these are logits or log-probabilities, "
            "pass from_logits=True"
        )
    raise ZeroPartError(
        "zero parts have no log-ratio. If they are structural (causal mask, padding), mark them "
        "invisible with mask= (or pass -inf logits with from_logits=True); if they are rounding "
        "zeros in your data, replace them first with attncoda.multi_replace"
    )


def validate_closed(xp: Any, x: Array, visible: Array | None, *, source: Any = None) -> None:
    """Refuse rows that do not sum to 1 within :func:`tolerance` (of the dtype the values were
    given in, ``source``, and of the row length)."""
    total = xp.sum(x if visible is None else xp.where(visible, x, xp.zeros_like(x)), axis=-1)
    tol = tolerance(x.dtype, x.shape[-1] if x.ndim else 1, source=source)
    err = xp.abs(total - 1.0)
    if bool(xp.any(err > tol)):
        worst = float(xp.max(err))
        raise NotClosedError(
            f"rows must sum to 1 over their visible parts (worst deviation {worst:.3g} > {tol:g}); "
            "close them with attncoda.closure first, or, if the missing mass is a learned sink "
            "(GPT-OSS style rows summing below 1), add it back with attncoda.add_learned_sink"
        )


# --------------------------------------------------------------------------------------------
# elementwise kernels: torch's vectorised float64 log/exp on numpy memory


#: Arrays from this size on are worth a torch kernel call (~10 us of overhead per call).
TORCH_MIN_BYTES = 1 << 16


@functools.cache
def torch_module() -> Any:
    """torch, or ``None`` where it is not installed (the core works without it)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def torch_views(*arrays: np.ndarray) -> tuple[Any, ...] | None:
    """The numpy ``arrays`` as torch tensors sharing their memory, or ``None`` where torch is
    missing or cannot take them as they are: dtypes other than one float32/float64 dtype (numpy
    would promote mixed ones), negative strides. Read-only arrays are viewed too (torch's
    warning about them silenced): callers only read them and write into arrays of their own."""
    torch = torch_module()
    if torch is None:
        return None
    dtype = arrays[0].dtype
    if dtype not in (np.float32, np.float64) or any(a.dtype != dtype for a in arrays):
        return None
    try:
        if all(a.flags.writeable for a in arrays):
            return tuple(torch.from_numpy(a) for a in arrays)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return tuple(torch.from_numpy(a) for a in arrays)
    except ValueError:  # negative strides
        return None


@functools.cache
def numpy_kernel_is_avx512(name: str, dtype: np.dtype) -> bool:
    """Whether numpy's own ``name`` ufunc (``log``, ``exp``) runs its AVX-512 kernel for
    ``dtype`` on this CPU (numpy's ``opt_func_info``; False where numpy cannot say).

    That kernel (Intel's SVML, vectorised over eight float64 or sixteen float32 values) is
    faster than torch's on one thread: on an AMD EPYC (Zen 5, AVX-512), over 25,000 x 512,
    float64 log 10.8 ms against torch's 22.4, exp 11.1 against 16.4, float32 log 3.6 against
    9.7, exp 4.2 against 7.7. Without AVX-512 numpy's float64 kernels are scalar libm calls and
    torch's are the faster ones (see :func:`log_into`).
    """
    try:
        from numpy.lib.introspect import opt_func_info
    except ImportError:  # numpy < 2.0
        return False
    try:
        info = opt_func_info(func_name=f"^{name}$").get(name, {})
        current = str(info.get(dtype.char * 2, {}).get("current", ""))
    except Exception:  # an introspection numpy changed: keep the measured default
        return False
    return current.startswith(("X86_V4", "AVX512"))  # numpy >= 2.4 / numpy 2.0-2.3 names


def _elementwise(name: str, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    big = x.dtype in (np.float32, np.float64) and x.nbytes >= TORCH_MIN_BYTES
    views = torch_views(x, out) if big and not numpy_kernel_is_avx512(name, x.dtype) else None
    if views is None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return getattr(np, name)(x, out=out)
    getattr(torch_module(), name)(views[0], out=views[1])
    return out


def by_rows_into(
    name: str, x: np.ndarray, per_row: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """``numpy.<name>(x, per_row, out=out)`` for ``name`` ``"subtract"`` or ``"divide"``, with
    ``per_row`` one value a row (``keepdims``) broadcast along the last axis, without
    floating-point warnings.

    Large float arrays go through torch's kernels where installed: numpy's broadcast along a
    last axis of a few dozen parts is 2.2x (subtract) and 1.5x (divide) slower on one thread
    (4 MB blocks of 64 parts). IEEE subtraction and division are correctly rounded: the same
    values either way. ``out`` may be ``x``.
    """
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    big = x.dtype in (np.float32, np.float64) and x.nbytes >= TORCH_MIN_BYTES
    views = torch_views(x, per_row, out) if big and per_row.dtype == x.dtype else None
    if views is None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return getattr(np, name)(x, per_row, out=out)
    torch = torch_module()
    (torch.sub if name == "subtract" else torch.div)(views[0], views[1], out=views[2])
    return out


def log_into(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``numpy.log(x, out=out)`` (``out`` may be ``x``), without floating-point warnings.

    The dominant cost of clr, alr, ilr, clr_inv and the Aitchison distances, so it runs on the
    faster kernel of this CPU. With AVX-512, numpy's own (:func:`numpy_kernel_is_avx512`).
    Otherwise float64 and float32 go through torch where it is installed: numpy's float64
    ``log`` and ``exp`` are SIMD only with AVX-512 and otherwise call libm one value at a time,
    while torch's (SLEEF, 1 ulp) are vectorised for AVX2 too: 1.75x (log) and 2.5x (exp) faster
    on one thread of an AMD EPYC with AVX2. In float32, where numpy is SIMD with AVX2 too,
    torch's are still 1.7x faster there (4 MB: log 1.32 vs 2.34 ms, exp 1.12 vs 1.93 ms) and
    closer: at most 0.61 and 0.56 ulp from the exact values, against numpy's 0.71 and 2.3 ulp.
    Arrays torch cannot view stay in numpy.
    """
    return _elementwise("log", x, out)


def exp_into(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``numpy.exp(x, out=out)`` (``out`` may be ``x``), on this CPU's faster kernel (see
    :func:`log_into`), without floating-point warnings."""
    return _elementwise("exp", x, out)


# --------------------------------------------------------------------------------------------
# CPU tensors on one thread: numpy's kernels on zero-copy views

#: Tensor dtypes that numpy views share memory with (float16 and bfloat16 are computed in
#: float32 either way; complex is refused by the functions themselves).
_VIEWABLE = frozenset({"float32", "float64", "bool", "int8", "int16", "int32", "int64", "uint8"})


class _NotViewable(Exception):
    """A tensor argument that must stay in torch (another device, autograd, a dtype)."""


@functools.cache
def _strided() -> Any:
    import torch

    return torch.strided


def _view(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.name not in _VIEWABLE:
        raise _NotViewable  # e.g. float128, which the torch path refuses with its own message
    if not _is_torch(value):
        return value
    if (
        value.layout != _strided()  # sparse: refused on the torch path, with its message
        or getattr(value, "is_nested", False)
        or value.device.type != "cpu"
        or value.requires_grad
        or str(value.dtype).removeprefix("torch.") not in _VIEWABLE
        or value.is_conj()
        or value.is_neg()
    ):
        raise _NotViewable
    return value.numpy()


def numpy_views(
    args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]] | None:
    """The call's arguments with CPU tensors replaced by numpy views, or ``None`` to stay in torch.

    When torch computes on one thread (``torch.get_num_threads() == 1``) and every tensor
    argument is a CPU tensor that autograd does not track, numpy computes the same numbers on
    views of the same memory (no copy) and :func:`as_tensors` turns the results back into
    tensors. On one thread numpy is the faster engine: it asks the kernel for huge pages for large
    arrays, so a fresh 100 MB result costs ~12 ms to fault in against ~40 ms for torch's
    allocator (measured on the 2-core development VM, transparent huge pages on ``madvise``), and
    most maths steps write such a result. With several threads torch keeps its intra-op
    parallelism, and tensors on other devices or with autograd history never leave torch.
    """
    tensors = [v for v in (*args, *kwargs.values()) if _is_torch(v)]
    if not tensors:
        return None
    import torch

    if torch.get_num_threads() != 1:
        return None
    try:
        return [_view(a) for a in args], {k: _view(v) for k, v in kwargs.items()}
    except _NotViewable:
        return None


def as_tensors(result: Any) -> Any:
    """A result computed by numpy for tensor input (:func:`numpy_views`), as tensors.

    numpy arrays and scalars become CPU tensors (sharing memory where the array is writable),
    and the array fields of a result dataclass (:class:`~attncoda.SinkContent` and friends) and
    of tuples likewise; anything else is returned as it is.
    """
    import torch

    if isinstance(result, np.ndarray):
        return torch.from_numpy(result if result.flags.writeable else result.copy())
    if isinstance(result, np.generic):
        return torch.from_numpy(np.asarray(result).copy())
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.replace(
            result,
            **{
                f.name: as_tensors(getattr(result, f.name))
                for f in dataclasses.fields(result)
                if f.init
            },
        )
    if isinstance(result, tuple):
        items = [as_tensors(v) for v in result]
        return type(result)(*items) if hasattr(result, "_fields") else tuple(items)
    return result


# --------------------------------------------------------------------------------------------
# labelled (xarray) inputs: DataArray in, DataArray out


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
    """Wrap a maths function so that DataArray arguments give labelled results.

    Every public maths function (:data:`MATHS_FUNCTIONS`) is wrapped so. Called without a
    :class:`xarray.DataArray` argument, the wrapper only checks ``isinstance`` and calls the
    function as it is (numpy in, numpy out; torch in, torch out). Called with DataArrays, it

    1. finds the **parts dim**: ``dim=`` when given; else the dim at ``axis=`` when ``axis`` is
       given; else ``"key"`` (``"group"`` for group shares) when present; else the only dim of
       a 1-D array. A DataArray of several dims without any of these is *ambiguous* and refused
       (:class:`~attncoda.ShapeMismatchError`) rather than guessed at;
    2. aligns every labelled argument (``x``, ``y``, ``mask``, a boolean ``sink``, per-row
       arguments such as ``power``'s exponent) with ``join="exact"``: labels that disagree are
       an error, never an inner join that silently drops rows;
    3. orders each one as ``(other dims..., parts dim)`` (missing dims become length-1 axes, so
       a ``mask`` over ``(query, key)`` broadcasts against ``(sample, ..., query, key)`` as in
       numpy), calls the numpy function on the values with ``axis=-1``, and
    4. labels the result: the other dims and every coordinate that lives on them are kept; an
       output axis of the parts' length keeps the parts dim and its coordinates; an output axis
       of another length gets a new dim (``"<dim>_alr"``, ``"<dim>_ilr"``; the inverses drop
       those suffixes); pairwise results get ``<item>_a`` and ``<item>_b`` with the item
       coordinates on both sides. Results that bundle several arrays
       (:class:`~attncoda.SinkContent` and friends) come back as an :class:`xarray.Dataset` with
       one variable per field, so ``res.sink_share`` reads the same.

    The DataArray's values are read into numpy (a dask-backed array is computed); labels are the
    point here, not laziness: for lazy data use :func:`xarray.map_blocks` with a ``template``.
    """

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        has_dim = bool(spec.parts)  # functions of summaries have no parts dim to name
        dim_param = inspect.Parameter(
            "dim", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None"
        )
        new_sig = sig.replace(parameters=[*params, dim_param]) if has_dim else sig
        names = set(spec.parts) | set(spec.rows)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            dim = kwargs.pop("dim", None) if has_dim else None
            if dim is None and not _any_labelled(args, kwargs):
                views = numpy_views(args, kwargs)
                if views is not None:
                    return as_tensors(fn(*views[0], **views[1]))
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
        call.__doc__ = _with_dim_doc(fn.__doc__) if has_dim else fn.__doc__
        MATHS_FUNCTIONS.append(fn.__name__)
        return call  # type: ignore[return-value]

    return wrap


_DIM_DOC = """    dim : str, optional
        With :class:`xarray.DataArray` input, the parts dim; default ``"key"`` when present
        (the rules are on the maths page, under "The maths functions"). Refused for numpy and
        torch input, which take ``axis``.
"""


def _with_dim_doc(doc: str | None) -> str | None:
    """``doc`` with ``dim`` listed at the end of its Parameters section (when it has one)."""
    if not doc or "    Parameters\n    ----------\n" not in doc:
        return doc
    start = doc.index("    Parameters\n    ----------\n")
    ends = [
        doc.find(f"\n    {name}\n    {'-' * len(name)}\n", start)
        for name in ("Returns", "Raises", "See Also", "Notes", "References", "Examples")
    ]
    end = min((e for e in ends if e > start), default=-1)
    if end < 0:
        return doc
    return doc[:end] + _DIM_DOC + doc[end:]


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
