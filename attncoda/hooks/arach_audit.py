"""The ARACH attention audit: where attention mass goes with hubs, as datasets.

For each sample the plain model and the ARACH plug-in (:mod:`attncoda.hooks.arach`, dense mode so
that :func:`attncoda.hooks.capture` sees the hub rows) run once; every verbal row is split into
three groups, sink (the first token), hub (``h_i``) and content (the other verbal keys), with
:func:`attncoda.group_decompose`, and the entropy change off -> on is attributed with
:func:`attncoda.attribute_grouped_entropy_change`. :func:`audit` returns the per-head dataset,
:func:`audit_findings` its headline numbers. Figures of these datasets belong to the study that
draws them (``case_studies/arach``).

Examples
--------
>>> from attncoda.hooks import arach, zoo
>>> from attncoda.hooks.arach_audit import audit, audit_findings
>>> model = zoo.tiny_twin("llama")
>>> ids = zoo.tiny_batch(model, batch=1, length=12)["input_ids"]
>>> ds = audit(model, [ids], arach=arach.Arach(model))
>>> 0 < audit_findings(ds)["mean_hub_on"] < 1
True
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

import attncoda as ac
from attncoda import InputError

from ._capture import capture
from .arach import Arach

__all__ = ["audit", "audit_findings"]


def _audit_rows(log_attn: np.ndarray, length: int, arach_on: bool) -> dict[str, np.ndarray]:
    """Three-group (sink / hub / content) quantities of verbal rows, per (layer, head, query)."""
    q = np.arange(length)
    n_keys = log_attn.shape[-1]
    labels = np.full((length, n_keys), 2, dtype=np.int64)
    labels[:, 0] = 0
    if arach_on:
        labels[q, length + q] = 1
    dec = ac.group_decompose(log_attn.astype(np.float64), labels, from_logits=True)
    return {"shares": dec.shares, "within": dec.within_entropy, "entropy": dec.entropy}


def audit(
    model: Any,
    samples: Sequence[torch.Tensor],
    *,
    arach: Arach,
    first_query: int = 1,
) -> Any:
    """Attention with ARACH off vs on, per layer and head, through the core's decomposition.

    For each sample the plain model and the plug-in (dense mode, so that
    :func:`attncoda.hooks.capture` sees the hub rows) run once; every verbal row is split into
    three groups, sink (the first token), hub (``h_i``, for ARACH) and content (the other verbal
    keys) with :func:`attncoda.group_decompose`, and the entropy change off -> on is attributed
    with :func:`attncoda.attribute_grouped_entropy_change` (between-group part plus one
    within-group part per group, summing exactly to the change). Rows are averaged over queries
    ``>= first_query`` and samples.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    samples : sequence of LongTensor (T,) or (1, T)
        Token ids; each is one forward pass.
    arach : Arach
        The plug-in; a copy with ``mode="dense"`` is used.
    first_query : int, default 1
        Queries before it are skipped (query 0 has no content key).

    Returns
    -------
    xarray.Dataset
        Over ``layer, head`` (and ``group = sink, hub, content``): ``sink_off``, ``sink_on``,
        ``hub_on``, ``content_entropy_off``, ``content_entropy_on``, ``entropy_off``,
        ``entropy_on``, ``shares_off``, ``shares_on``, ``within_off``, ``within_on``, and the
        attribution ``dH_between``, ``dH_within`` (by group) and ``dH_total``.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=1, length=12)["input_ids"]
    >>> ds = audit(model, [ids], arach=arach.Arach(model))
    >>> sorted(ds.sizes.items())
    [('group', 3), ('head', 4), ('layer', 2)]
    """
    dense = Arach(model, config=dataclasses.replace(arach.config, mode="dense"))
    sums: dict[str, np.ndarray] = {}
    count = 0
    layers = heads = None
    for sample in samples:
        ids = torch.as_tensor(sample).reshape(1, -1).to(next(model.parameters()).device)
        t = ids.shape[1]
        if t <= first_query:
            raise InputError(f"a sample of {t} tokens has no query >= first_query={first_query}")
        with torch.no_grad():
            with capture(model, what="rows") as cap_off:
                model(input_ids=ids)
            # through the patched model(...): the capture then records the user's inputs
            # (ids, no mask) rather than the 2T-long embeddings and the 4-D mask
            with capture(model, what="rows", queries=list(range(t))) as cap_on, dense:
                model(input_ids=ids)
        ds_off, ds_on = cap_off.dataset, cap_on.dataset
        layers, heads = ds_off["layer"].values, ds_off["head"].values
        off = _audit_rows(ds_off.log_attn.values[0], t, arach_on=False)
        on = _audit_rows(ds_on.log_attn.values[0], t, arach_on=True)
        ch = ac.attribute_grouped_entropy_change(
            off["shares"], off["within"], on["shares"], on["within"]
        )
        per_row = {
            "shares_off": off["shares"],
            "shares_on": on["shares"],
            "within_off": off["within"],
            "within_on": on["within"],
            "entropy_off": off["entropy"],
            "entropy_on": on["entropy"],
            "dH_between": ch.between,
            "dH_within": ch.within,
            "dH_total": ch.total,
        }
        for name, val in per_row.items():
            # (layer, head, query[, group]) -> mean over queries >= first_query
            m = np.asarray(val)[:, :, first_query:].mean(axis=2)
            sums[name] = sums.get(name, 0) + m
        count += 1
    if count == 0:
        raise InputError("audit() needs at least one sample")
    mean = {k: v / count for k, v in sums.items()}
    lh = ("layer", "head")
    lhg = ("layer", "head", "group")
    ds = xr.Dataset(
        {
            "sink_off": (lh, mean["shares_off"][..., 0]),
            "sink_on": (lh, mean["shares_on"][..., 0]),
            "hub_on": (lh, mean["shares_on"][..., 1]),
            "content_entropy_off": (lh, mean["within_off"][..., 2]),
            "content_entropy_on": (lh, mean["within_on"][..., 2]),
            "entropy_off": (lh, mean["entropy_off"]),
            "entropy_on": (lh, mean["entropy_on"]),
            "shares_off": (lhg, mean["shares_off"]),
            "shares_on": (lhg, mean["shares_on"]),
            "within_off": (lhg, mean["within_off"]),
            "within_on": (lhg, mean["within_on"]),
            "dH_between": (lh, mean["dH_between"]),
            "dH_within": (lhg, mean["dH_within"]),
            "dH_total": (lh, mean["dH_total"]),
        },
        coords={"layer": layers, "head": heads, "group": ["sink", "hub", "content"]},
        attrs={
            "arach_config": json.dumps(dataclasses.asdict(arach.config)),
            "n_samples": count,
            "first_query": first_query,
        },
    )
    return ds


def audit_findings(ds: Any) -> dict[str, Any]:
    """Headline numbers of an :func:`audit` dataset (per-layer means over heads).

    Returns the layer with the strongest sink (off), its sink share off/on and hub share, the
    layer where the sink drops most, and the correlation across layers between the sink share
    off and the drop.
    """
    sink_off = ds.sink_off.mean("head").values
    sink_on = ds.sink_on.mean("head").values
    hub_on = ds.hub_on.mean("head").values
    drop = sink_off - sink_on
    strongest = int(np.argmax(sink_off))
    biggest = int(np.argmax(drop))
    corr = float(np.corrcoef(sink_off, drop)[0, 1]) if len(sink_off) > 2 else float("nan")
    layers = ds.layer.values
    return {
        "strongest_sink_layer": int(layers[strongest]),
        "strongest_sink_off": float(sink_off[strongest]),
        "strongest_sink_on": float(sink_on[strongest]),
        "strongest_hub_on": float(hub_on[strongest]),
        "largest_drop_layer": int(layers[biggest]),
        "largest_drop": float(drop[biggest]),
        "mean_sink_off": float(sink_off.mean()),
        "mean_sink_on": float(sink_on.mean()),
        "mean_hub_on": float(hub_on.mean()),
        "mean_content_entropy_off": float(ds.content_entropy_off.mean()),
        "mean_content_entropy_on": float(ds.content_entropy_on.mean()),
        "mean_dH_total": float(ds.dH_total.mean()),
        "mean_dH_between": float(ds.dH_between.mean()),
        "mean_dH_within_content": float(ds.dH_within.sel(group="content").mean()),
        "corr_sink_off_vs_drop": corr,
        "hub_share_from_sink": float(drop.mean() / hub_on.mean()) if hub_on.mean() > 0 else 0.0,
    }
