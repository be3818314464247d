"""Head-importance scores and prune plans: which attention heads to gate first.

Every score is a per-head statistic computed on a calibration text, with a direction that says
which end is pruned first (:data:`SCORES`, :class:`ScoreInfo`): the sink channel (sink share,
sink log-odds), the content channel (content entropy, content Aitchison distance to uniform,
content clr dispersion), sink-blind full-row statistics (entropy, maximum attention), and two
baselines (a seeded random draw, and the gradient importance of Michel et al. 2019). Each score
also exists reversed (``NAME-reversed``, :data:`REVERSED`). :func:`head_scores` computes them,
:func:`prune_order` ranks the units and :func:`prune_plan` takes the first ``k`` of a ranking
while every layer keeps a unit. The gates themselves are :mod:`attncoda.hooks.gates`; the sweep
over scores and ``k`` measuring perplexity is :mod:`attncoda.hooks.prune`.

Examples
--------
>>> from attncoda.hooks import zoo
>>> from attncoda.hooks.scores import head_scores, prune_order, prune_plan
>>> model = zoo.tiny_twin("llama")
>>> ids = zoo.tiny_batch(model, batch=2, length=12)["input_ids"]
>>> ds = head_scores(model, ids, scores=["sink_share"])
>>> plan = prune_plan(prune_order(ds, "sink_share"), 3, n_units=4)
>>> sum(len(heads) for heads in plan.values())
3
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import xarray as xr

from ._capture import capture
from ._registry import AttentionPlugin, plugged
from .evaluate import tokens_sha256, window_nll
from .gates import GateError, Unit, _check_unit, _require_registry, head_layout
from .zoo import model_id

__all__ = [
    "ATTENTION_SCORES",
    "REVERSED",
    "SCORES",
    "ScoreInfo",
    "gradient_importance",
    "head_scores",
    "order_within_layers",
    "order_without_layers",
    "prune_order",
    "prune_plan",
    "score_info",
]


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

#: The scores read from captured attention (the others need gradients or randomness).
ATTENTION_SCORES = (
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
    if bases & set(ATTENTION_SCORES):
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
            "model_id": model_id(model),
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


def order_within_layers(order: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """A score's order re-ranked within each layer: the same number of units in every layer.

    Each unit gets its rank among the units of its own layer in ``order``; units are then sorted
    by that rank, ties (one unit per layer) kept in ``order``'s sequence. The first ``k`` units
    of the result take ``k // layers`` or one more from every layer, each layer's least important
    first, so a plan (:func:`prune_plan`) cannot concentrate on a few layers: the layer-position
    control of a score.

    Examples
    --------
    >>> order_within_layers([(0, 1), (0, 0), (0, 2), (1, 2), (1, 0), (1, 1)])
    [(0, 1), (1, 2), (0, 0), (1, 0), (0, 2), (1, 1)]
    """
    seen: dict[int, int] = {}
    ranked = []
    for position, (layer, u) in enumerate(order):
        rank = seen.get(layer, 0)
        seen[layer] = rank + 1
        ranked.append((rank, position, (layer, u)))
    ranked.sort()
    return [unit for _, _, unit in ranked]


def order_without_layers(
    order: Sequence[tuple[int, int]], layers: Sequence[int]
) -> list[tuple[int, int]]:
    """A score's order with every unit of some layers left out (they are never pruned).

    The other layer-position control: e.g. ``layers=(0, 1, 2)`` asks whether a score's damage
    comes from the early layers it prunes first.

    Examples
    --------
    >>> order_without_layers([(0, 1), (2, 0), (1, 1), (2, 1)], layers=[0, 1])
    [(2, 0), (2, 1)]
    """
    drop = set(layers)
    return [(layer, u) for layer, u in order if layer not in drop]


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
