"""Head gates: zero- or mean-ablate attention heads without giving up SDPA.

Transformers v5 removed ``head_mask`` and ``prune_heads``. Here a head is ablated inside the one
attention function attncoda registers: each layer's output is computed as before (SDPA by
default) and the gated heads' slices of the ``(batch, query, head, head_dim)`` output are set
to zero (zero ablation) or to a stored per-head mean output (mean ablation) before the output
projection. Zero ablation is exactly the same as zeroing the head's input columns of
``o_proj`` (GPT-2: rows of ``c_proj``; BERT: columns of ``output.dense``); the tests check this
to 1e-5 on every zoo twin. The model is restored on exit, also after an exception.

Gates add no attention call and leave the layer's own call as it was: the same q, k, v and
the same mask (``None`` with ``is_causal`` for plain causal batches), so on CUDA it runs on the
same fused kernel (flash, memory-efficient or cuDNN) as without gates; the gate is one
``index_fill``/``index_copy`` on the ``(batch, query, head, head_dim)`` output.

Units: ``unit="head"`` gates query heads. ``unit="kv_group"`` gates whole key/value groups of
a GQA model (query heads ``g * r .. g * r + r - 1`` share KV head ``g``, ``r`` =
heads / KV heads), the unit that can later be removed from the weights for real.

Which heads to gate is another question: head-importance scores and prune plans are in
:mod:`attncoda.hooks.scores`, the sweep over scores and pruned-head counts in
:mod:`attncoda.hooks.prune`, perplexity in :mod:`attncoda.hooks.evaluate`.

Examples
--------
>>> import torch
>>> from attncoda.hooks import zoo
>>> from attncoda.hooks.gates import gates
>>> model = zoo.tiny_twin("llama")
>>> batch = zoo.tiny_batch(model, length=8)
>>> with torch.no_grad(), gates(model, {0: [1, 2], 1: [0]}):
...     gated = model(**batch).logits
>>> model.config._attn_implementation  # restored
'sdpa'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from attncoda import EXIT_USAGE, AttncodaError

from ._registry import (
    AttentionPlugin,
    RegistryError,
    can_switch,
    n_layers_heads,
    plugged,
    text_config,
)

__all__ = [
    "GateError",
    "HeadGate",
    "HeadLayout",
    "HeadMeans",
    "gates",
    "head_layout",
    "head_means",
    "resolve_units",
]

Mode = Literal["zero", "mean"]
Unit = Literal["head", "kv_group"]
HeadSpec = Mapping[int, int | Iterable[int]] | Iterable[tuple[int, int]]


class GateError(AttncodaError, ValueError):
    """A head gate cannot be set up: unknown layer or head, a whole layer gated, bad options."""

    exit_code: ClassVar[int] = EXIT_USAGE


# --------------------------------------------------------------------------------------------
# layout and head specifications


@dataclass(frozen=True)
class HeadLayout:
    """Layers, query heads and key/value heads of a model.

    Examples
    --------
    >>> HeadLayout(n_layers=30, n_heads=9, n_kv_heads=3).group_size
    3
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    def n_units(self, unit: Unit) -> int:
        """Units per layer: query heads, or key/value groups."""
        return self.n_heads if unit == "head" else self.n_kv_heads

    def query_heads(self, unit: Unit, index: int) -> range:
        """The query heads of one unit."""
        if unit == "head":
            return range(index, index + 1)
        r = self.group_size
        return range(index * r, (index + 1) * r)


def head_layout(model: Any) -> HeadLayout:
    """Read layers, heads and key/value heads from a model's (text) config.

    Raises
    ------
    GateError
        If the config does not say how many layers or heads the model has.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> head_layout(zoo.tiny_twin("llama"))
    HeadLayout(n_layers=2, n_heads=4, n_kv_heads=2)
    """
    text = text_config(model)
    n_layers, n_heads = n_layers_heads(model)
    if n_layers is None or n_heads is None:
        raise GateError(
            f"cannot read the number of layers/heads from {type(model.config).__name__}; head "
            "gates do not support this model family yet"
        )
    n_kv = getattr(text, "num_key_value_heads", None) or n_heads
    if n_heads % n_kv:
        raise GateError(f"{n_heads} query heads do not split into {n_kv} key/value groups")
    return HeadLayout(int(n_layers), int(n_heads), int(n_kv))


def _check_unit(unit: str) -> None:
    if unit not in ("head", "kv_group"):
        raise GateError(f"unit must be 'head' or 'kv_group', got {unit!r}")


def resolve_units(
    layout: HeadLayout, heads: HeadSpec, unit: Unit = "head"
) -> dict[int, tuple[int, ...]]:
    """Validate a head specification; ``{layer: sorted unit indices}`` without empty layers.

    ``heads`` is ``{layer: head or [heads]}`` or an iterable of ``(layer, head)`` pairs; with
    ``unit="kv_group"`` the indices are key/value groups. Negative indices count from the end.

    Raises
    ------
    GateError
        Unknown layers or heads, or every unit of a layer gated.

    Examples
    --------
    >>> resolve_units(HeadLayout(2, 4, 2), [(1, 3), (0, 0), (1, -1)])
    {0: (0,), 1: (3,)}
    """
    _check_unit(unit)
    what = "head" if unit == "head" else "key/value group"
    n = layout.n_units(unit)
    pairs: list[tuple[Any, Any]] = []
    if isinstance(heads, Mapping):
        for layer, hs in heads.items():
            items = [hs] if isinstance(hs, (int, np.integer)) else list(hs)
            pairs.extend((layer, h) for h in items)
    else:
        try:
            pairs = [tuple(p) for p in heads]  # type: ignore[misc]
        except TypeError as exc:
            raise GateError(
                "heads must be {layer: [heads]} or an iterable of (layer, head) pairs, got "
                f"{heads!r}"
            ) from exc
    out: dict[int, set[int]] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise GateError(f"expected (layer, {what}) pairs, got {pair!r}")
        layer, h = pair
        if not isinstance(layer, (int, np.integer)) or not isinstance(h, (int, np.integer)):
            raise GateError(f"layer and {what} indices must be ints, got {pair!r}")
        if not -layout.n_layers <= layer < layout.n_layers:
            raise GateError(
                f"layer {layer} does not exist: the model has {layout.n_layers} layers "
                f"(0..{layout.n_layers - 1})"
            )
        if not -n <= h < n:
            raise GateError(
                f"{what} {h} does not exist in layer {int(layer)}: each layer has {n} {what}s "
                f"(0..{n - 1})"
            )
        out.setdefault(int(layer) % layout.n_layers, set()).add(int(h) % n)
    for layer, hs in out.items():
        if len(hs) == n:
            raise GateError(
                f"all {n} {what}s of layer {layer} would be gated: that removes the layer's whole "
                "attention block, which is not head pruning; keep at least one"
                + (
                    " (with one key/value head per layer, use unit='head')"
                    if unit == "kv_group" and n == 1
                    else ""
                )
            )
    return {layer: tuple(sorted(hs)) for layer, hs in sorted(out.items())}


# --------------------------------------------------------------------------------------------
# the gate plugin


@dataclass
class HeadMeans:
    """Mean attention output of every head: what mean ablation puts in place of a head.

    Attributes
    ----------
    means : dict of int to torch.Tensor
        ``{layer: (heads, head_dim)}`` float32 means over every valid token of the reference.
    n_tokens : int
        Tokens averaged over.
    """

    means: dict[int, torch.Tensor]
    n_tokens: int


class HeadGate(AttentionPlugin):
    """The plugin behind :func:`gates`: replaces gated heads' output slices.

    Attributes
    ----------
    units : dict of int to tuple of int
        ``{layer: units}`` as validated.
    heads : dict of int to tuple of int
        ``{layer: query heads}`` that are gated.
    calls : int
        Layer calls in which the gate was applied (0 after a block means nothing was gated).
    """

    def __init__(
        self,
        model: Any,
        heads: HeadSpec,
        *,
        mode: Mode = "zero",
        unit: Unit = "head",
        means: HeadMeans | None = None,
    ) -> None:
        super().__init__(model)
        if mode not in ("zero", "mean"):
            raise GateError(f"mode must be 'zero' or 'mean', got {mode!r}")
        if mode == "mean" and means is None:
            raise GateError(
                "mode='mean' needs the heads' mean outputs: means=head_means(model, reference_ids)"
            )
        if mode == "zero" and means is not None:
            raise GateError("means= is only used with mode='mean'")
        self.layout = head_layout(model)
        self.mode: Mode = mode
        self.unit: Unit = unit
        self.units = resolve_units(self.layout, heads, unit)
        self.heads = {
            layer: tuple(h for u in us for h in self.layout.query_heads(unit, u))
            for layer, us in self.units.items()
        }
        if means is not None:
            missing = [layer for layer in self.heads if layer not in means.means]
            if missing:
                raise GateError(f"means= has no mean outputs for layers {missing}")
        self.means = means
        self.calls = 0
        self._index: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _idx(self, layer: int, device: torch.device) -> torch.Tensor:
        key = (layer, device)
        idx = self._index.get(key)
        if idx is None:
            idx = torch.tensor(self.heads[layer], dtype=torch.long, device=device)
            self._index[key] = idx
        return idx

    def adjust_output(self, module: Any, layer: int, output: torch.Tensor) -> torch.Tensor:
        """Zero or mean-replace the gated heads of ``output`` ``(batch, query, head, dim)``."""
        if layer not in self.heads:
            return output
        if output.shape[2] != self.layout.n_heads:
            raise GateError(
                f"layer {layer} returned {output.shape[2]} heads but the config says "
                f"{self.layout.n_heads}; head gates cannot tell which slice is which head"
            )
        idx = self._idx(layer, output.device)
        self.calls += 1
        if self.mode == "zero":
            return output.index_fill(2, idx, 0.0)
        assert self.means is not None
        mean = self.means.means[layer].to(output.device, output.dtype).index_select(0, idx)
        return output.index_copy(2, idx, mean.expand(*output.shape[:2], *mean.shape))


def _require_registry(model: Any, what: str) -> None:
    if not can_switch(model):
        raise RegistryError(
            f"{type(model).__name__} computes attention in its own code, not through "
            f"transformers' attention registry, so {what} cannot reach its heads; zero the "
            "heads' input columns of the attention output projection instead"
        )


@contextmanager
def gates(
    model: Any,
    heads: HeadSpec,
    *,
    mode: Mode = "zero",
    unit: Unit = "head",
    means: HeadMeans | None = None,
) -> Iterator[HeadGate]:
    """Ablate attention heads inside the block, through attncoda's registered attention function.

    Every layer still runs the attention implementation the model had (SDPA by default); only
    the gated heads' slices of the attention output are replaced before the output
    projection. Zero ablation equals zeroing those heads' input columns of ``o_proj``. The
    model's attention implementation is restored on exit, also after an exception; the weights
    are never touched.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model whose attention goes through transformers' attention registry.
    heads : mapping or iterable
        ``{layer: head or [heads]}`` or ``[(layer, head), ...]``; key/value group indices when
        ``unit="kv_group"``. Negative indices count from the end. May be empty (no-op).
    mode : {"zero", "mean"}, default "zero"
        Replace a head's output by zeros, or by its mean output over a reference text
        (``means=``, from :func:`head_means`).
    unit : {"head", "kv_group"}, default "head"
        Gate query heads, or whole key/value groups of a GQA model.
    means : HeadMeans, optional
        Required with ``mode="mean"``.

    Yields
    ------
    HeadGate
        ``gate.heads`` lists the gated query heads per layer; ``gate.calls`` counts the layer
        calls it applied to.

    Raises
    ------
    GateError
        Unknown layer or head indices, every head of a layer gated, bad ``mode``/``unit``.
    RegistryError
        The model's attention does not go through the registry.

    Examples
    --------
    >>> import torch
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")  # 4 query heads over 2 key/value heads
    >>> ids = zoo.tiny_batch(model, length=8)["input_ids"]
    >>> means = head_means(model, ids)
    >>> with torch.no_grad(), gates(model, {1: 0}, unit="kv_group", mode="mean", means=means) as g:
    ...     _ = model(input_ids=ids)
    >>> g.heads, g.calls
    ({1: (0, 1)}, 1)
    >>> with gates(model, {0: [0, 1, 2, 3]}):  # doctest: +IGNORE_EXCEPTION_DETAIL
    ...     pass
    Traceback (most recent call last):
    attncoda.hooks.gates.GateError: all 4 heads of layer 0 would be gated: ...
    """
    _check_unit(unit)
    plugin = HeadGate(model, heads, mode=mode, unit=unit, means=means)
    _require_registry(model, "head gates")
    with plugged(model, plugin):
        yield plugin


# --------------------------------------------------------------------------------------------
# mean outputs for mean ablation


class _MeanRecorder(AttentionPlugin):
    """Sums every head's output over valid tokens (the output itself is left unchanged)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, float] = {}
        self.weights: torch.Tensor | None = None  # (batch, tokens) 0/1

    def adjust_output(self, module: Any, layer: int, output: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = output.detach().double()
            if self.weights is None:
                s = out.sum(dim=(0, 1))
                n = float(out.shape[0] * out.shape[1])
            else:
                w = self.weights[:, -out.shape[1] :].to(out.device, out.dtype)
                s = torch.einsum("bq,bqhd->hd", w, out)
                n = float(w.sum())
            self.sums[layer] = self.sums.get(layer, 0) + s.cpu()
            self.counts[layer] = self.counts.get(layer, 0.0) + n
        return output


def _batches(
    input_ids: torch.Tensor | Iterable[Mapping[str, torch.Tensor]], batch_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids[None] if input_ids.dim() == 1 else input_ids
        for start in range(0, len(ids), batch_size):
            yield {"input_ids": ids[start : start + batch_size]}
    else:
        for batch in input_ids:
            yield dict(batch)


def head_means(
    model: Any,
    reference: torch.Tensor | Iterable[Mapping[str, torch.Tensor]],
    *,
    batch_size: int = 1,
) -> HeadMeans:
    """Every head's mean attention output over a reference text, for ``mode="mean"``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    reference : torch.Tensor or iterable of dict
        ``(windows, T)`` token ids, or batches ``{"input_ids", "attention_mask"}``; padding
        tokens (mask 0) are left out of the means.
    batch_size : int, default 1
        Windows per forward pass when ``reference`` is a tensor.

    Returns
    -------
    HeadMeans

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("gpt2")
    >>> m = head_means(model, zoo.tiny_batch(model, length=8)["input_ids"])
    >>> m.means[0].shape, m.n_tokens
    (torch.Size([4, 8]), 16)
    """
    _require_registry(model, "head_means")
    rec = _MeanRecorder(model)
    device = getattr(model, "device", torch.device("cpu"))
    with torch.no_grad(), plugged(model, rec):
        for batch in _batches(reference, batch_size):
            batch = {k: v.to(device) for k, v in batch.items()}
            rec.weights = batch.get("attention_mask")
            model(**batch)
    if not rec.sums:
        raise GateError("head_means saw no attention output: the reference was empty")
    means = {
        layer: (s / max(rec.counts[layer], 1.0)).float() for layer, s in sorted(rec.sums.items())
    }
    return HeadMeans(means, int(next(iter(rec.counts.values()))))
