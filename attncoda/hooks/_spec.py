"""What a capture is asked for: :class:`CaptureSpec`, the checks of its arguments, and
:class:`CaptureError`.

Every argument of :func:`attncoda.hooks.capture` is checked here once, before any forward pass:
an int is an int (no bools, no floats), lists hold no duplicates, slices have a non-zero step,
and the message of each refusal names the argument, the value and what to pass instead.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from attncoda import EXIT_USAGE, AttncodaError

What = Literal["summaries", "rows", "both"]


SinkChoice = Literal["first", "learned"] | int | Sequence[int]


class CaptureError(AttncodaError, RuntimeError):
    """A capture cannot be set up, or would return nothing."""

    exit_code: ClassVar[int] = EXIT_USAGE


class SinkTokenWarning(UserWarning):
    """The input lacks the special token its tokenizer starts every text with.

    Given (once per capture) by :func:`~attncoda.hooks.capture` given ``tokenizer=`` when
    ``sink="first"`` lands on an ordinary token although that tokenizer prepends a BOS/CLS token
    (Gemma's ``<bos>``, BERT's ``[CLS]``): the input was encoded with
    ``add_special_tokens=False`` or sliced after it, and the model, trained with that token as
    its sink, behaves otherwise without it (Gemma-3's sink share falls from 0.38 to 0.00, see
    "Choosing the sink" in docs/capture.md). Models whose tokenizer prepends nothing (SmolLM2,
    Qwen2.5) take their first text token as the sink, as in training: no warning; the report
    names the sink tokens. Keep the tokenizer's special tokens, or pass a fixed ``sink=``.
    """


def _is_int(value: Any) -> bool:
    """A Python or numpy integer; bools (``True`` is an int to Python) are not."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _show(value: Any) -> str:
    """A short one-line repr of a user's value for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _show_sel(sel: Any) -> str:
    """A normalised selection as the user would write it (tuples as lists)."""
    return _show(list(sel) if isinstance(sel, tuple) else sel)


def _kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "a bool"
    if isinstance(value, (float, np.floating)):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple, range, np.ndarray)):
        return "a nested sequence"
    return f"of type {type(value).__name__}"


_HINT = {
    "layers": "pass an int, a list/tuple/range of ints, a slice of ints, or None/'all'",
    "heads": "pass an int, a list/tuple/range of ints, a slice of ints, or None/'all'",
    "queries": "pass an int, a list/tuple/range of ints, a slice of ints, or None/'all'",
    "sink": "pass 'first', 'learned', a key position (an int >= 0) or a list of them",
}


def _int_items(value: Any, name: str) -> tuple[int, ...]:
    """The ints of a flat list/tuple/range/1-D integer array; refuses anything else."""
    hint = _HINT[name]
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise CaptureError(
                f"{name}={_show(value)} is a {value.ndim}-D {value.dtype} array; {hint}"
            )
        items = tuple(int(v) for v in value)
    elif isinstance(value, (list, tuple, range)):
        for v in value:
            if not _is_int(v):
                raise CaptureError(f"{name}={_show(value)} holds {_show(v)}, {_kind(v)}; {hint}")
        items = tuple(int(v) for v in value)
    else:
        raise CaptureError(f"{name}={_show(value)} is {_kind(value)}; {hint}")
    if not items:
        raise CaptureError(f"{name}={_show(value)} is empty, so nothing would be captured; {hint}")
    counts = Counter(items)
    twice = sorted(i for i, c in counts.items() if c > 1)
    if twice:
        raise CaptureError(
            f"{name}={_show(value)} names {', '.join(map(str, twice))} more than once; "
            "name each once"
        )
    return items


def _selection(value: Any, name: str) -> tuple[int, ...] | slice | None:
    """Normalise a layers/heads/queries selection (types only; ranges are checked later)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value == "all":
            return None
        raise CaptureError(f"{name}={value!r} is not a selection; {_HINT[name]}")
    if _is_int(value):
        return (int(value),)
    if isinstance(value, slice):
        parts = []
        for part in (value.start, value.stop, value.step):
            if part is not None and not _is_int(part):
                raise CaptureError(
                    f"{name}={_show(value)} has the bound {_show(part)}, {_kind(part)}; pass a "
                    "slice of ints or None"
                )
            parts.append(None if part is None else int(part))
        if parts[2] == 0:
            raise CaptureError(f"{name}={_show(value)} has step 0; use a non-zero step or None")
        return slice(*parts)
    return _int_items(value, name)


def _resolve(sel: tuple[int, ...] | slice | None, n: int, name: str) -> list[int]:
    """Indices in ``0..n-1`` of a layers/heads selection; negative ones count from the end."""
    if sel is None:
        return list(range(n))
    if isinstance(sel, slice):
        out = sorted(set(range(n)[sel]))
        if not out:
            raise CaptureError(
                f"{name}s={_show(sel)} selects none of the model's {n} {name}s (the selection is "
                "empty); nothing would be captured"
            )
        return out
    seen: dict[int, int] = {}
    for i in sel:
        if not -n <= i < n:
            raise CaptureError(
                f"{name}s={_show_sel(sel)}: {name} index {i} is out of range: the model has {n} "
                f"{name}s; pass indices in {-n}..{n - 1}"
            )
        j = i % n
        if j in seen:
            raise CaptureError(
                f"{name}s={_show(list(sel))} names {name} {j} twice ({seen[j]} and {i}); name "
                f"each {name} once"
            )
        seen[j] = i
    return sorted(seen)


def _sink_choice(value: Any) -> str | int | tuple[int, ...]:
    """Normalise ``sink=``: 'first', 'learned', a key position >= 0 or a tuple of them."""
    if isinstance(value, str):
        if value in ("first", "learned"):
            return value
        raise CaptureError(f"sink={value!r} is not a sink; {_HINT['sink']}")
    if _is_int(value):
        items: tuple[int, ...] = (int(value),)
    elif isinstance(value, (list, tuple, range, np.ndarray)):
        items = _int_items(value, "sink")
    else:
        raise CaptureError(f"sink={_show(value)} is {_kind(value)}; {_HINT['sink']}")
    negative = [i for i in items if i < 0]
    if negative:
        raise CaptureError(
            f"sink={_show(value)}: key position(s) {_show(negative)} are negative; fixed sinks "
            "count from the first key, so pass positions >= 0 (or sink='first')"
        )
    return items[0] if _is_int(value) else items


#: The dtypes rows may be stored in (``dtype=``): numpy's names.
ROW_DTYPES = ("float32", "float16")


def _rows_dtype(value: Any, what: str) -> str:
    """Normalise ``dtype=`` (the stored rows' dtype) to ``"float32"`` or ``"float16"``.

    bfloat16 is refused: numpy, netCDF and zarr format 2 have no bfloat16, so it could only be
    stored as another dtype under its name; float16 holds log-probabilities better anyway (10
    mantissa bits against 7, and a range down to -65504).
    """
    name = value if isinstance(value, str) else getattr(value, "__name__", None)
    if name is None and value is not None:
        name = str(value).replace("torch.", "")
    try:
        name = np.dtype(name).name if name not in (None, "bfloat16") else name
    except TypeError:
        pass
    if name == "bfloat16":
        raise CaptureError(
            f"dtype={_show(value)} cannot be stored: numpy, netCDF and zarr have no bfloat16; "
            "pass 'float16' (lossy, 10 mantissa bits against bfloat16's 7) or 'float32'"
        )
    if name not in ROW_DTYPES:
        raise CaptureError(
            f"dtype={_show(value)} is not a dtype rows can be stored in; pass 'float32' "
            "(default, exact to fp32) or 'float16' (half the bytes, lossy)"
        )
    if name != "float32" and what == "summaries":
        raise CaptureError(
            f"dtype={_show(value)} sets the dtype of stored rows, and what='summaries' stores "
            "none (summaries are always float32); pass what='rows' or 'both', or drop dtype="
        )
    return str(name)


def _fixed_sinks(spec: CaptureSpec) -> tuple[int, ...] | None:
    if isinstance(spec.sink, int):
        return (spec.sink,)
    if isinstance(spec.sink, tuple):
        return spec.sink
    return None


@dataclass(frozen=True)
class CaptureSpec:
    """What to capture. Serialised as JSON into the dataset's ``capture_spec`` attribute.

    Parameters
    ----------
    layers, heads, queries
        ``None`` (all), an int, a tuple of distinct ints or a slice (of ints). ``queries`` are
        token positions; negative values count from the end of each forward call (``-1`` is
        the last token) and are never wrapped (see :func:`capture`).
    what : {"summaries", "rows", "both"}
    sink : "first", "learned", int or tuple of ints
        ``"first"``: the first valid key of each sample (BOS, or the first token without BOS,
        the first non-padding token under left padding). ``"learned"``: the learned sink logit
        of GPT-OSS style models, added back as an extra part. An int or tuple: fixed key
        positions, counted from the first key (``>= 0``).
    chunk_size : int
        Query rows per chunk when recomputing logits (memory ~ chunk x keys x heads x 4 bytes).
    dtype : {"float32", "float16"}
        The dtype rows are stored in (computed in fp32 either way).
    exact_outputs : bool
        Whether every layer's output comes from the model's own attention kernel even where
        rows of every head and query are captured (see :func:`capture`).
    """

    layers: tuple[int, ...] | slice | None = None
    heads: tuple[int, ...] | slice | None = None
    queries: tuple[int, ...] | slice | None = None
    what: What = "summaries"
    sink: Any = "first"
    chunk_size: int = 256
    dtype: str = "float32"
    exact_outputs: bool = False

    def to_json(self) -> str:
        def enc(v: Any) -> Any:
            if isinstance(v, slice):
                return {"slice": [v.start, v.stop, v.step]}
            if isinstance(v, tuple):
                return list(v)
            return v

        return json.dumps({f.name: enc(getattr(self, f.name)) for f in dataclasses.fields(self)})
