"""Head gates: zero- or mean-ablate attention heads without giving up SDPA, and score heads.

Transformers v5 removed ``head_mask`` and ``prune_heads``. Here a head is ablated inside the one
attention function attncoda registers: each layer's output is computed as before (SDPA by
default) and the gated heads' slices of the ``(batch, query, head, head_dim)`` output are set
to zero (zero ablation) or to a stored per-head mean output (mean ablation) before the output
projection. Zero ablation is exactly the same as zeroing the head's input columns of
``o_proj`` (GPT-2: rows of ``c_proj``; BERT: columns of ``output.dense``); the tests check this
to 1e-5 on every zoo twin. The model is restored on exit, also after an exception.

Units: ``unit="head"`` gates query heads. ``unit="kv_group"`` gates whole key/value groups of
a GQA model (query heads ``g * r .. g * r + r - 1`` share KV head ``g``, ``r`` =
heads / KV heads), the unit that can later be removed from the weights for real.

The module also holds the head-importance scores of the pruning case study (sink channel,
content channel, sink-blind, random, gradient) and the study itself (:func:`pruning_study`);
see ``case_studies/pruning/README.md``.

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

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import xarray as xr

from attncoda import EXIT_USAGE, AttncodaError

from ._perplexity import (
    Perplexity,
    PerplexityError,
    perplexity,
    text_windows,
    tokens_sha256,
    window_nll,
)
from ._registry import AttentionPlugin, RegistryError, can_switch, plugged

__all__ = [
    "REVERSED",
    "SCORES",
    "STUDY_TEXTS",
    "GateError",
    "HeadGate",
    "HeadLayout",
    "HeadMeans",
    "Perplexity",
    "PerplexityError",
    "ScoreInfo",
    "StudyResult",
    "gates",
    "gradient_importance",
    "head_layout",
    "head_means",
    "head_scores",
    "perplexity",
    "plot_study",
    "prune_order",
    "prune_plan",
    "pruning_study",
    "read_study",
    "resolve_units",
    "score_info",
    "study_text",
    "text_windows",
    "tokens_sha256",
    "write_study",
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
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    n_heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
    if n_layers is None or n_heads is None:
        raise GateError(
            f"cannot read the number of layers/heads from {type(config).__name__}; head gates do "
            "not support this model family yet"
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


# --------------------------------------------------------------------------------------------
# gradient importance (Michel et al. 2019)


class _GradGate(AttentionPlugin):
    """Multiplies head outputs by a per-sample gate of ones that requires grad."""

    def __init__(self, model: Any, gate: torch.Tensor) -> None:
        super().__init__(model)
        self.gate = gate  # (batch, layers, heads)

    def adjust_output(self, module: Any, layer: int, output: torch.Tensor) -> torch.Tensor:
        g = self.gate[:, layer].to(output.dtype)
        return output * g[:, None, :, None]


def gradient_importance(
    model: Any,
    input_ids: torch.Tensor,
    *,
    unit: Unit = "head",
    batch_size: int = 1,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Loss sensitivity to each head: mean over windows of ``|d loss / d gate|``.

    The recipe of Michel, Levy and Neubig (2019), "Are Sixteen Heads Really Better than One?":
    every head's output is multiplied by a gate ``xi = 1``; for each window ``x`` the gradient
    of its mean next-token loss with respect to the gates is taken, and the importance of a head
    is ``E_x |dL(x)/dxi_h|``. For ``unit="kv_group"`` one gate is shared by the group's heads
    (the gradient is the sum over the group before the absolute value). The model's parameters
    get no gradients (their ``requires_grad`` flags are restored afterwards).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM.
    input_ids : torch.Tensor
        ``(windows, T)`` token ids.
    unit : {"head", "kv_group"}, default "head"
    batch_size : int, default 1
        Windows per forward/backward pass (gates are per window, so this does not change the
        result).
    progress : callable, optional
        Called with the number of windows finished after each batch.

    Returns
    -------
    torch.Tensor
        ``(layers, units)`` float64 importances (higher: more important).

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=2, length=12)["input_ids"]
    >>> gradient_importance(model, ids).shape, gradient_importance(model, ids, unit="kv_group").shape
    (torch.Size([2, 4]), torch.Size([2, 2]))
    """
    _check_unit(unit)
    _require_registry(model, "gradient_importance")
    layout = head_layout(model)
    ids_all = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids_all.dim() != 2 or ids_all.shape[1] < 2 or len(ids_all) == 0:
        raise GateError(f"input_ids must be (windows, T) with T >= 2, got {tuple(ids_all.shape)}")
    device = getattr(model, "device", torch.device("cpu"))
    flags = [(p, p.requires_grad) for p in model.parameters()]
    total = torch.zeros(layout.n_layers, layout.n_units(unit), dtype=torch.float64)
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        for start in range(0, len(ids_all), batch_size):
            ids = ids_all[start : start + batch_size].to(device)
            gate = torch.ones(
                len(ids), layout.n_layers, layout.n_heads, device=device, requires_grad=True
            )
            with torch.enable_grad(), plugged(model, _GradGate(model, gate)):
                logits = model(input_ids=ids).logits
                loss = (window_nll(logits, ids) / (ids.shape[1] - 1)).sum()
                (grad,) = torch.autograd.grad(loss, gate)
            grad = grad.detach().double().cpu()
            if unit == "kv_group":
                grad = grad.view(len(ids), layout.n_layers, layout.n_kv_heads, -1).sum(-1)
            total += grad.abs().sum(0)
            del logits, loss
            if progress is not None:
                progress(len(ids))
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    return total / len(ids_all)


# --------------------------------------------------------------------------------------------
# head scores


@dataclass(frozen=True)
class ScoreInfo:
    """One head-importance score: what it measures and which heads it prunes first."""

    name: str
    channel: str  # "sink", "content", "full row", "baseline"
    statistic: str
    prune_first: Literal["high", "low"]


_SCORE_LIST = (
    ScoreInfo("sink_share", "sink", "mean sink share s", "high"),
    ScoreInfo("sink_logodds", "sink", "mean sink log-odds log(s/(1-s))", "high"),
    ScoreInfo("content_entropy", "content", "mean entropy of the content subcomposition", "high"),
    ScoreInfo(
        "content_aitchison",
        "content",
        "mean Aitchison distance of the content subcomposition to uniform, ||clr(c)||",
        "low",
    ),
    ScoreInfo(
        "content_clr_dispersion",
        "content",
        "mean standard deviation of clr(c) over content keys, ||clr(c)|| / sqrt(n)",
        "low",
    ),
    ScoreInfo("entropy", "full row", "mean entropy of the whole row (sink included)", "high"),
    ScoreInfo("max_attention", "full row", "mean maximum attention weight of the row", "low"),
    ScoreInfo("random", "baseline", "uniform random number (seeded)", "low"),
    ScoreInfo("gradient", "baseline", "mean |d loss / d head gate| (Michel et al. 2019)", "low"),
)

#: Every score, by name. ``prune_first`` says which end of the statistic is pruned first.
SCORES: dict[str, ScoreInfo] = {s.name: s for s in _SCORE_LIST}

_CAPTURE_SCORES = (
    "sink_share",
    "sink_logodds",
    "content_entropy",
    "content_aitchison",
    "content_clr_dispersion",
    "entropy",
    "max_attention",
)


#: Suffix of a score pruned in the opposite direction (e.g. ``"content_entropy-reversed"``).
REVERSED = "-reversed"


def score_info(name: str) -> ScoreInfo:
    """The :class:`ScoreInfo` of a score name, including ``NAME-reversed`` variants.

    A reversed score has the same statistic and prunes the other end first: a diagnostic for
    whether a score's direction, rather than its channel, is what fails.

    Examples
    --------
    >>> score_info("content_entropy-reversed").prune_first
    'low'
    """
    base = name.removesuffix(REVERSED)
    if base not in SCORES:
        raise GateError(
            f"unknown score {name!r}; known: {', '.join(SCORES)} (each also as NAME{REVERSED})"
        )
    info = SCORES[base]
    if base == name:
        return info
    flipped: Literal["high", "low"] = "low" if info.prune_first == "high" else "high"
    return ScoreInfo(name, info.channel, f"{info.statistic} (reversed direction)", flipped)


def _check_scores(scores: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(scores))
    if not names:
        raise GateError("no scores asked for")
    for n in names:
        score_info(n)
    return names


def _bases(names: Sequence[str]) -> set[str]:
    return {n.removesuffix(REVERSED) for n in names}


def _row_statistics(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """Per (layer, head) sums and counts of the capture-based statistics over queries >= 1."""
    sink_index = ds.sink_index.values
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}

    def add(name: str, val: torch.Tensor | np.ndarray) -> None:
        v = val.numpy() if isinstance(val, torch.Tensor) else val
        v = np.where(np.isfinite(v), v, np.nan).astype(np.float64)
        ok = np.isfinite(v)
        s = np.where(ok, v, 0.0).sum(axis=-1)  # over queries
        c = ok.sum(axis=-1)
        sums[name] = sums.get(name, 0) + s.sum(0)  # over samples
        counts[name] = counts.get(name, 0) + c.sum(0)

    q0 = ds["query"].values >= 1
    for name in ("sink_share", "sink_logodds", "entropy", "content_entropy"):
        add(name, ds[name].values[..., q0])
    la_all = ds.log_attn.values  # (sample, layer, head, query, key)
    keys = torch.arange(la_all.shape[-1])
    for s_i in range(la_all.shape[0]):
        sink = keys == int(sink_index[s_i])
        ait, disp, mx = [], [], []
        for layer in range(la_all.shape[1]):
            la = torch.from_numpy(la_all[s_i, layer][:, q0])  # (head, query, key)
            vis = torch.isfinite(la)
            content = vis & ~sink
            n = content.sum(-1).to(torch.float64)
            z = torch.where(content, la.double(), 0.0)
            mean = z.sum(-1) / n.clamp_min(1)
            sq = torch.where(content, (la.double() - mean[..., None]) ** 2, 0.0).sum(-1)
            nan = torch.full_like(sq, math.nan)
            ait.append(torch.where(n >= 1, sq.sqrt(), nan))
            disp.append(torch.where(n >= 1, (sq / n.clamp_min(1)).sqrt(), nan))
            mx.append(la.amax(-1).double().exp())
        add("content_aitchison", torch.stack(ait)[None])
        add("content_clr_dispersion", torch.stack(disp)[None])
        add("max_attention", torch.stack(mx)[None])
    return {k: sums[k] / np.maximum(counts[k], 1) for k in sums}


def head_scores(
    model: Any,
    input_ids: torch.Tensor,
    *,
    scores: Sequence[str] = tuple(SCORES),
    unit: Unit = "head",
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> xr.Dataset:
    """Head statistics behind every importance score, from a calibration text.

    Capture-based statistics (sink share, sink log-odds, content entropy, content Aitchison
    distance to uniform, content clr dispersion, full-row entropy, maximum attention) are means
    over every query ``>= 1`` of every window (query 0 sees only the sink); they come from one
    :func:`attncoda.hooks.capture` with ``what="both"`` per window. ``gradient`` is
    :func:`gradient_importance`, ``random`` a seeded uniform draw. For ``unit="kv_group"`` the
    capture statistics are averaged over the group's query heads.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose attention goes through the registry.
    input_ids : torch.Tensor
        ``(windows, T)`` calibration tokens, one window per capture (memory: layers x heads x
        T x T float32 per window).
    scores : sequence of str
        Names from :data:`SCORES`.
    unit : {"head", "kv_group"}
    seed : int
        Seed of the ``random`` score.
    progress : callable, optional
        Called with 1 after each capture window and each gradient window.

    Returns
    -------
    xarray.Dataset
        One variable per score over ``(layer, head)`` (``(layer, kv_group)`` for groups); each
        variable's attrs give ``channel``, ``statistic`` and ``prune_first``.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=2, length=12)["input_ids"]
    >>> ds = head_scores(model, ids, scores=["sink_share", "content_aitchison", "gradient"])
    >>> sorted(ds.data_vars), dict(ds.sizes)
    (['content_aitchison', 'gradient', 'sink_share'], {'layer': 2, 'head': 4})
    """
    from ._capture import capture

    names = _check_scores(scores)
    bases = _bases(names)
    _check_unit(unit)
    _require_registry(model, "head_scores")
    layout = head_layout(model)
    ids_all = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids_all.dim() != 2 or ids_all.shape[1] < 3 or len(ids_all) == 0:
        raise GateError(f"input_ids must be (windows, T) with T >= 3, got {tuple(ids_all.shape)}")
    device = getattr(model, "device", torch.device("cpu"))
    values: dict[str, np.ndarray] = {}
    if bases & set(_CAPTURE_SCORES):
        sums: dict[str, np.ndarray] = {}
        for w in ids_all:
            with torch.no_grad(), capture(model, what="both") as cap:
                model(input_ids=w[None].to(device))
            stats = _row_statistics(cap.dataset)
            del cap
            for k, v in stats.items():
                sums[k] = sums.get(k, 0) + v
            if progress is not None:
                progress(1)
        for k, v in sums.items():
            per_head = v / len(ids_all)
            if unit == "kv_group":
                per_head = per_head.reshape(layout.n_layers, layout.n_kv_heads, -1).mean(-1)
            values[k] = per_head
    if "gradient" in bases:
        values["gradient"] = gradient_importance(
            model, ids_all, unit=unit, progress=progress
        ).numpy()
    if "random" in bases:
        rng = np.random.default_rng(seed)
        values["random"] = rng.random((layout.n_layers, layout.n_units(unit)))
    dim = "head" if unit == "head" else "kv_group"
    data_vars = {}
    for n in names:
        info = score_info(n)
        data_vars[n] = xr.Variable(
            ("layer", dim),
            values[n.removesuffix(REVERSED)],
            attrs={
                "channel": info.channel,
                "statistic": info.statistic,
                "prune_first": info.prune_first,
            },
        )
    return xr.Dataset(
        data_vars,
        coords={"layer": np.arange(layout.n_layers), dim: np.arange(layout.n_units(unit))},
        attrs={
            "unit": unit,
            "seed": seed,
            "n_windows": len(ids_all),
            "window": int(ids_all.shape[1]),
            "tokens_sha256": tokens_sha256(ids_all),
            "model_id": str(getattr(model.config, "_name_or_path", "")),
        },
    )


def prune_order(scores: xr.Dataset, score: str) -> list[tuple[int, int]]:
    """Units ``(layer, unit)`` from least to most important by one score.

    Ties (and NaN statistics, which go last) are broken by layer then unit index.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"sink_share": (("layer", "head"), np.array([[0.1, 0.9], [0.5, 0.2]]))})
    >>> ds.sink_share.attrs["prune_first"] = "high"
    >>> prune_order(ds, "sink_share")
    [(0, 1), (1, 0), (1, 1), (0, 0)]
    """
    if score not in scores:
        raise GateError(f"score {score!r} is not in the dataset: {', '.join(map(str, scores))}")
    var = scores[score]
    prune_first = var.attrs.get("prune_first")
    if prune_first is None:
        prune_first = score_info(score).prune_first
    vals = np.asarray(var.values, dtype=np.float64)
    key = -vals if prune_first == "high" else vals
    key = np.where(np.isfinite(key), key, np.inf)
    n_layers, n_units = vals.shape
    flat = [(float(key[layer, u]), layer, u) for layer in range(n_layers) for u in range(n_units)]
    flat.sort()
    return [(layer, u) for _, layer, u in flat]


def prune_plan(
    order: Sequence[tuple[int, int]], k: int, n_units: int
) -> dict[int, tuple[int, ...]]:
    """The first ``k`` units of ``order`` that leave every layer at least one unit.

    A unit is skipped when its layer already has ``n_units - 1`` pruned units, so plans are
    nested: the plan for ``k`` contains the plan for any smaller ``k``.

    Raises
    ------
    GateError
        If ``k`` exceeds the units that can be pruned (``layers x (n_units - 1)``).

    Examples
    --------
    >>> prune_plan([(0, 0), (0, 1), (1, 1), (1, 0)], 2, n_units=2)
    {0: (0,), 1: (1,)}
    """
    layers = {layer for layer, _ in order}
    limit = len(layers) * (n_units - 1)
    if not 0 <= k <= limit:
        raise GateError(
            f"cannot prune {k} units: at most {limit} can go while every layer keeps one"
        )
    plan: dict[int, list[int]] = {}
    for layer, u in order:
        if sum(len(v) for v in plan.values()) == k:
            break
        if len(plan.get(layer, [])) >= n_units - 1:
            continue
        plan.setdefault(layer, []).append(u)
    return {layer: tuple(sorted(us)) for layer, us in sorted(plan.items())}


# --------------------------------------------------------------------------------------------
# the pruning study


@dataclass
class StudyResult:
    """Output of :func:`pruning_study`.

    Attributes
    ----------
    rows : list of dict
        One row per (score, k, corpus): ``score, channel, k, fraction, corpus, perplexity,
        ratio`` (to the unpruned model on the same corpus), ``nll, n_tokens``.
    scores : xarray.Dataset
        The head statistics (:func:`head_scores`).
    orders : dict of str to list of (int, int)
        Each score's pruning order.
    meta : dict
        Model, unit, mode, token counts and sha256s, timings.
    """

    rows: list[dict[str, Any]]
    scores: xr.Dataset
    orders: dict[str, list[tuple[int, int]]]
    meta: dict[str, Any] = field(default_factory=dict)

    def perplexity(self, score: str, k: int, corpus: str = "all") -> float:
        """One perplexity; ``k=0`` gives the unpruned model whatever the score."""
        want = "none" if k == 0 else score
        for r in self.rows:
            if r["score"] == want and r["k"] == k and r["corpus"] == corpus:
                return float(r["perplexity"])
        raise KeyError(f"no result for score={score!r}, k={k}, corpus={corpus!r}")


#: Where each study text starts (the first paragraph of the novel proper).
STUDY_TEXTS: dict[str, tuple[str, str | None, str]] = {
    "emma": ("austen", "emma", "Emma Woodhouse, handsome, clever, and rich"),
    "mobydick": ("mobydick", None, "Call me Ishmael."),
    "prideprejudice": ("austen", "prideprejudice", "It is a truth universally acknowledged"),
}


def study_text(name: str) -> str:
    """One of the study's texts (:data:`STUDY_TEXTS`): paragraphs from the novel's first one on.

    Paragraphs are unwrapped (:func:`attncoda.hooks.assets.paragraphs`) and joined by blank
    lines, so the front matter (title pages, transcriber's notes) is left out.

    Examples
    --------
    >>> study_text("mobydick")[:30]  # doctest: +SKIP
    'Call me Ishmael. Some years ago'
    """
    from . import assets

    if name not in STUDY_TEXTS:
        raise GateError(f"unknown study text {name!r}; known: {', '.join(STUDY_TEXTS)}")
    corpus, document, start = STUDY_TEXTS[name]
    paras = assets.paragraphs(assets.load_text(corpus, document))
    first = next((i for i, p in enumerate(paras) if p.startswith(start)), None)
    if first is None:  # pragma: no cover - the assets are pinned
        raise GateError(f"the {name} text has no paragraph starting {start!r}")
    return "\n\n".join(paras[first:])


def study_ks(n_total: int, fractions: Sequence[float], limit: int) -> list[int]:
    """Distinct unit counts ``round(f * n_total)``, capped at ``limit``, ascending, with 0."""
    ks = {0}
    for f in fractions:
        if not 0 <= f <= 1:
            raise GateError(f"fractions must lie in [0, 1], got {f}")
        ks.add(min(round(f * n_total), limit))
    return sorted(ks)


def pruning_study(
    model: Any,
    calibration: torch.Tensor,
    evaluation: Mapping[str, torch.Tensor],
    *,
    scores: Sequence[str] = tuple(SCORES),
    fractions: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.5),
    unit: Unit = "head",
    mode: Mode = "zero",
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = False,
) -> StudyResult:
    """Prune the k least important heads by each score and measure held-out perplexity.

    Scores come from ``calibration`` (:func:`head_scores`); for each score and each ``k`` the
    first ``k`` units of its order (:func:`prune_plan`: no layer loses all its heads) are gated
    and the token-weighted perplexity of every ``evaluation`` corpus is measured on the same
    tokens. ``k = 0`` (the unpruned model) is evaluated once.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose attention goes through the registry.
    calibration : torch.Tensor
        ``(windows, T)`` tokens the scores (and, for ``mode="mean"``, the means) come from.
    evaluation : mapping of str to torch.Tensor
        ``{corpus: (windows, T)}`` held-out tokens.
    scores : sequence of str
        Names from :data:`SCORES`.
    fractions : sequence of float
        Fractions of all units to prune; ``k = round(f * units)``.
    unit : {"head", "kv_group"}
    mode : {"zero", "mean"}
    seed : int
        Seed of the ``random`` score.
    batch_size : int
        Evaluation windows per forward pass.
    progress : bool
        Show a tqdm progress bar on stderr.

    Returns
    -------
    StudyResult

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=4, length=12)["input_ids"]
    >>> res = pruning_study(model, ids[:2], {"text": ids[2:]}, scores=["random"],
    ...                     fractions=[0.25])
    >>> sorted({(r["score"], r["k"]) for r in res.rows})
    [('none', 0), ('random', 2)]
    """
    from tqdm.auto import tqdm

    names = _check_scores(scores)
    _check_unit(unit)
    if mode not in ("zero", "mean"):
        raise GateError(f"mode must be 'zero' or 'mean', got {mode!r}")
    if not evaluation:
        raise GateError("evaluation= has no corpus")
    _require_registry(model, "pruning_study")
    layout = head_layout(model)
    n_units = layout.n_units(unit)
    if n_units < 2:
        raise GateError(
            f"each layer has {n_units} {'key/value group' if unit == 'kv_group' else 'head'}; "
            "pruning one would remove the whole attention block (use unit='head')"
        )
    n_total = layout.n_layers * n_units
    ks = study_ks(n_total, fractions, layout.n_layers * (n_units - 1))
    corpora = list(evaluation)
    ids = torch.cat([evaluation[c] for c in corpora])
    bounds = np.cumsum([0] + [len(evaluation[c]) for c in corpora])
    n_calib = len(calibration)
    n_capture = n_calib if _bases(names) & set(_CAPTURE_SCORES) else 0
    n_grad = n_calib if "gradient" in _bases(names) else 0
    n_mean = n_calib if mode == "mean" else 0
    n_evals = 1 + len(names) * (len(ks) - 1)
    bar = tqdm(
        total=n_capture + n_grad + n_mean + n_evals * len(ids),
        disable=not progress,
        unit="window",
        desc="scores",
        dynamic_ncols=True,
    )
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        ds = head_scores(
            model, calibration, scores=names, unit=unit, seed=seed, progress=bar.update
        )
        timings["scores_s"] = time.perf_counter() - t0
        means = None
        if mode == "mean":
            bar.set_description("means")
            t0 = time.perf_counter()
            means = head_means(model, calibration, batch_size=batch_size)
            bar.update(n_mean)
            timings["means_s"] = time.perf_counter() - t0
        orders = {n: prune_order(ds, n) for n in names}
        rows: list[dict[str, Any]] = []
        base: dict[str, Perplexity] = {}

        def record(score: str, k: int, plan: dict[int, tuple[int, ...]], res: Perplexity) -> None:
            parts = {c: res.subset(range(bounds[i], bounds[i + 1])) for i, c in enumerate(corpora)}
            parts["all"] = res
            for corpus, p in parts.items():
                if k == 0:
                    base[corpus] = p
                rows.append(
                    {
                        "score": score,
                        "channel": score_info(score).channel if score != "none" else "",
                        "k": k,
                        "fraction": round(k / n_total, 4),
                        "corpus": corpus,
                        "perplexity": p.value,
                        "ratio": p.value / base[corpus].value,
                        "nll": float(p.nll.sum()),
                        "n_tokens": int(p.n_tokens.sum()),
                        "pruned": _format_plan(plan),
                    }
                )

        t0 = time.perf_counter()
        bar.set_description("unpruned")
        record("none", 0, {}, perplexity(model, ids, batch_size=batch_size, progress=bar.update))
        for name in names:
            for k in ks[1:]:
                bar.set_description(f"{name} k={k}")
                plan = prune_plan(orders[name], k, n_units)
                with gates(model, plan, mode=mode, unit=unit, means=means):
                    res = perplexity(model, ids, batch_size=batch_size, progress=bar.update)
                record(name, k, plan, res)
        timings["evaluation_s"] = time.perf_counter() - t0
    finally:
        bar.close()
    meta = {
        "model_id": str(getattr(model.config, "_name_or_path", "")),
        "n_layers": layout.n_layers,
        "n_heads": layout.n_heads,
        "n_kv_heads": layout.n_kv_heads,
        "unit": unit,
        "mode": mode,
        "seed": seed,
        "ks": ks,
        "n_units": n_total,
        "scores": names,
        "calibration_windows": int(n_calib),
        "window": int(ids.shape[1]),
        "calibration_tokens_sha256": tokens_sha256(calibration),
        "evaluation": {
            c: {"windows": len(evaluation[c]), "tokens_sha256": tokens_sha256(evaluation[c])}
            for c in corpora
        },
        "timings": timings,
    }
    return StudyResult(rows, ds, orders, meta)


def _format_plan(plan: Mapping[int, Sequence[int]]) -> str:
    """``"L0:1,2;L3:0"``: the pruned units per layer."""
    return ";".join(f"L{layer}:{','.join(map(str, us))}" for layer, us in plan.items())


_COLOURS = {
    "sink_share": "#b2182b",
    "sink_logodds": "#ef8a62",
    "content_entropy": "#2166ac",
    "content_aitchison": "#4393c3",
    "content_clr_dispersion": "#92c5de",
    "entropy": "#7f7f7f",
    "max_attention": "#bf9b30",
    "random": "#000000",
    "gradient": "#1b7837",
}


def plot_study(result: StudyResult, path: str | Path | None = None) -> Any:
    """Figure of perplexity (log scale) against heads pruned, one line per score and panel per corpus.

    Parameters
    ----------
    result : StudyResult
    path : str or Path, optional
        Where to save the figure (format from the suffix); the figure is returned either way.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    corpora = list(dict.fromkeys(r["corpus"] for r in result.rows))
    scores = [s for s in result.meta.get("scores", []) if s != "none"]
    fig, axes = plt.subplots(1, len(corpora), figsize=(4.6 * len(corpora), 4.2), squeeze=False)
    unit = result.meta.get("unit", "head")
    base = {r["corpus"]: r["perplexity"] for r in result.rows if r["k"] == 0}
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for s in scores:
            pts = sorted(
                (r["k"], r["perplexity"])
                for r in result.rows
                if r["corpus"] == corpus and r["score"] == s
            )
            xs = [0, *(k for k, _ in pts)]
            ys = [base[corpus], *(p for _, p in pts)]
            reversed_ = s.endswith(REVERSED)
            style = {"content": "-", "sink": "--", "full row": ":", "baseline": "-."}
            ax.plot(
                xs,
                ys,
                linestyle=(0, (1, 2)) if reversed_ else style.get(score_info(s).channel, "-"),
                marker="x" if reversed_ else "o",
                ms=4 if reversed_ else 3,
                color=_COLOURS.get(s.removesuffix(REVERSED)),
                label=s,
            )
        ax.set_yscale("log")
        ax.set_title(corpus)
        ax.set_xlabel(
            f"{'heads' if unit == 'head' else 'KV groups'} pruned ({result.meta.get('mode', 'zero')} ablation)"
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("perplexity")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    title = f"{result.meta.get('model_id', '')}: perplexity after pruning the k least important"
    fig.suptitle(f"{title} {'heads' if unit == 'head' else 'KV groups'} by each score", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def read_study(folder: str | Path) -> StudyResult:
    """Read a study written by :func:`write_study` (e.g. to plot it again).

    Examples
    --------
    >>> res = read_study("case_studies/pruning/results/smollm2-135m")  # doctest: +SKIP
    >>> res.perplexity("gradient", 27)  # doctest: +SKIP
    38.67...
    """
    import csv
    import json

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    with open(folder / "perplexity.csv", newline="") as fh:
        rows: list[dict[str, Any]] = []
        for r in csv.DictReader(fh):
            rows.append(
                {
                    **r,
                    "k": int(r["k"]),
                    "fraction": float(r["fraction"]),
                    "perplexity": float(r["perplexity"]),
                    "ratio": float(r["ratio"]),
                    "nll": float(r["nll"]),
                    "n_tokens": int(r["n_tokens"]),
                }
            )
    with open(folder / "head_scores.csv", newline="") as fh:
        table = list(csv.reader(fh))
    layer_col, dim, *names = table[0]
    body = np.array(table[1:], dtype=np.float64)
    layers = np.unique(body[:, 0]).astype(int)
    units = np.unique(body[:, 1]).astype(int)
    shape = (len(layers), len(units))
    scores = xr.Dataset(
        {
            n: xr.Variable(
                (layer_col, dim),
                body[:, 2 + i].reshape(shape),
                attrs={"prune_first": score_info(n).prune_first},
            )
            for i, n in enumerate(names)
        },
        coords={layer_col: layers, dim: units},
    )
    orders: dict[str, list[tuple[int, int]]] = {}
    with open(folder / "prune_order.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            orders.setdefault(r["score"], []).append((int(r["layer"]), int(r[dim])))
    return StudyResult(rows, scores, orders, meta)


def write_study(
    result: StudyResult, out: str | Path, *, overwrite: bool = False
) -> dict[str, Path]:
    """Write a study's tables and figure into a folder.

    Files: ``perplexity.csv`` (the rows), ``head_scores.csv`` (every head statistic),
    ``prune_order.csv`` (each score's order), ``meta.json`` and ``perplexity_vs_heads.png``.
    The folder is new, empty, or (``overwrite=True``) one attncoda wrote; it is written beside
    its place and swapped in when complete.

    Returns
    -------
    dict of str to Path
        The written files by kind (at their final place).
    """
    import attncoda as ac

    with ac.atomic_output(out, overwrite=overwrite, kind="folder", stamp="prune") as folder:
        _write_study_into(result, folder)
    return {kind: Path(out) / path.name for kind, path in _study_paths(Path(out)).items()}


def _study_paths(folder: Path) -> dict[str, Path]:
    return {
        "perplexity": folder / "perplexity.csv",
        "head_scores": folder / "head_scores.csv",
        "prune_order": folder / "prune_order.csv",
        "meta": folder / "meta.json",
        "figure": folder / "perplexity_vs_heads.png",
    }


def _write_study_into(result: StudyResult, folder: Path) -> None:
    import csv
    import json

    import matplotlib.pyplot as plt

    paths = _study_paths(folder)
    cols = [
        "score",
        "channel",
        "k",
        "fraction",
        "corpus",
        "perplexity",
        "ratio",
        "nll",
        "n_tokens",
        "pruned",
    ]
    with open(paths["perplexity"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in result.rows:
            w.writerow(
                {
                    **r,
                    "perplexity": f"{r['perplexity']:.4f}",
                    "ratio": f"{r['ratio']:.4f}",
                    "nll": f"{r['nll']:.4f}",
                }
            )
    ds = result.scores
    dim = next(d for d in ds.dims if d != "layer")
    names = list(ds.data_vars)
    with open(paths["head_scores"], "w", newline="") as fh:
        w2 = csv.writer(fh)
        w2.writerow(["layer", dim, *names])
        for layer in ds.layer.values:
            for u in ds[dim].values:
                w2.writerow(
                    [int(layer), int(u), *(f"{float(ds[n].values[layer, u]):.6g}" for n in names)]
                )
    with open(paths["prune_order"], "w", newline="") as fh:
        w3 = csv.writer(fh)
        w3.writerow(["score", "rank", "layer", dim])
        for s, order in result.orders.items():
            for rank, (layer, u) in enumerate(order):
                w3.writerow([s, rank, layer, u])
    paths["meta"].write_text(json.dumps(result.meta, indent=2) + "\n")
    fig = plot_study(result, paths["figure"])
    plt.close(fig)
