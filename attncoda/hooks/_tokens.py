"""Token strings of captured ids, and the check that an input kept its tokenizer's BOS.

A capture given ``tokenizer=`` stores each token's text as the ``token`` coordinate
``(sample, position)`` beside ``token_id``. The text is what ``tokenizer.decode([id])`` shows
(``" the"``, ``"\\n"``, ``"<bos>"``: readable, with its leading space), except where one id alone
is not valid text (a byte-level BPE token holding part of a multi-byte character decodes to
``"\\ufffd"``): then the tokenizer's own spelling of the token (``convert_ids_to_tokens``, e.g.
``"ĠðŁ"``) is kept, so that every token stays identifiable. Padding positions (attention mask 0)
and positions a sample does not have hold ``""``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._spec import SinkTokenWarning

__all__ = [
    "adds_special_first",
    "special_token_ids",
    "token_strings",
    "warn_if_sink_not_special",
]

_REPLACEMENT = "\ufffd"


def _one(tokenizer: Any, token_id: int) -> str:
    """The readable text of one token id (see the module docstring)."""
    try:
        text = str(tokenizer.decode([token_id]))
    except Exception:  # an id outside the tokenizer's vocabulary, or a tokenizer without decode
        text = ""
    if text and _REPLACEMENT not in text:
        return text
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        try:
            raw = convert(int(token_id))
        except Exception:
            raw = None
        if isinstance(raw, str) and raw:
            return raw
    return text or f"<{token_id}>"  # e.g. a twin's byte tokenizer on an id it never emits


def token_strings(
    tokenizer: Any, token_ids: np.ndarray, valid: np.ndarray | None = None
) -> np.ndarray:
    """Token text per id, as an object array of ``str`` of the shape of ``token_ids``.

    Parameters
    ----------
    tokenizer
        A transformers tokenizer, or anything with ``decode(list_of_ids)`` (a twin's
        :class:`~attncoda.hooks.zoo.ByteTokenizer`).
    token_ids : integer array
        Ids; negative ids (no token) become ``""``.
    valid : bool array of the same shape, optional
        False at padding positions, which become ``""``.

    Examples
    --------
    >>> import numpy as np
    >>> from attncoda.hooks.zoo import ByteTokenizer
    >>> tok = ByteTokenizer(vocab_size=300)
    >>> token_strings(tok, np.array([tok.encode("Hi!")]), np.array([[True, True, False]]))
    array([['H', 'i', '']], dtype=object)
    """
    ids = np.asarray(token_ids)
    keep = ids >= 0 if valid is None else (np.asarray(valid, bool) & (ids >= 0))
    out = np.full(ids.shape, "", dtype=object)
    cache: dict[int, str] = {}
    for index in zip(*np.nonzero(keep), strict=True):
        i = int(ids[index])
        if i not in cache:
            cache[i] = _one(tokenizer, i)
        out[index] = cache[i]
    return out


def special_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """The ids a sink may be without a warning: the tokenizer's special tokens (``all_special_ids``,
    BOS, CLS) and the model config's ``bos_token_id``."""
    ids: set[int] = set()
    for value in (
        *(getattr(tokenizer, "all_special_ids", None) or ()),
        getattr(tokenizer, "bos_token_id", None),
        getattr(tokenizer, "cls_token_id", None),
        getattr(getattr(model, "config", None), "bos_token_id", None),
    ):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            ids.add(int(value))
    return ids


def adds_special_first(tokenizer: Any) -> int | None:
    """The id of the special token ``tokenizer`` starts every text with (a BOS or CLS), or None
    for a tokenizer that prepends nothing (SmolLM2, Qwen2.5, a twin's byte tokenizer).

    Examples
    --------
    >>> from attncoda.hooks.zoo import ByteTokenizer
    >>> adds_special_first(ByteTokenizer(vocab_size=300)) is None
    True
    """
    try:
        ids = tokenizer("a")["input_ids"]
    except Exception:  # not callable as a transformers tokenizer: nothing to compare with
        return None
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    first = int(ids[0]) if ids else None
    return first if first is not None and first in special_token_ids(tokenizer) else None


def warn_if_sink_not_special(
    tokenizer: Any,
    special: Iterable[int],
    token_ids: np.ndarray,
    sink_index: np.ndarray,
    *,
    stacklevel: int = 2,
) -> bool:
    """Warn (:class:`SinkTokenWarning`) when a sample's sink is an ordinary token although the
    tokenizer starts every text with a special one (the input lost it); return True if it warned.

    A tokenizer that prepends nothing (SmolLM2, Qwen2.5) makes the first text token the sink, as
    the model saw in training: that is the default, not a warning (docs/capture.md, "Choosing
    the sink", measures both choices). ``token_ids`` is ``(batch, T)``, ``sink_index``
    ``(batch,)``.
    """
    ids = np.asarray(token_ids)
    sinks = ids[np.arange(ids.shape[0]), np.asarray(sink_index, np.int64)]
    allowed = set(special)
    ordinary = [b for b, i in enumerate(sinks.tolist()) if i not in allowed]
    if not ordinary:
        return False
    first = adds_special_first(tokenizer)
    if first is None:
        return False
    b = ordinary[0]
    pos, tid = int(sink_index[b]), int(sinks[b])
    others = f" (and {len(ordinary) - 1} more sample(s) of the batch)" if len(ordinary) > 1 else ""
    warnings.warn(
        f"the sink of sample {b} is the ordinary token {_one(tokenizer, tid)!r} (id {tid}, "
        f"position {pos}){others}, but this tokenizer starts every text with "
        f"{_one(tokenizer, first)!r}, the model's sink in training: the input was encoded "
        "without it (add_special_tokens=False) or sliced after it, and the sink shares then "
        "differ. Keep the tokenizer's special tokens, or choose the sink with "
        "capture(..., sink=POSITION); see 'Choosing the sink' in docs/capture.md",
        SinkTokenWarning,
        stacklevel=stacklevel,
    )
    return True
