"""Audits of the RPA prior with attncoda's core: datasets, and their markdown summary.

- :func:`prior_perturbation`: the (cached) prior read as a perturbation of each attention row,
  its Aitchison size and the entropy change it causes split into a sink part and a content part.
- :func:`entropy_trajectory`: row entropy across checkpoints, each change split exactly into the
  part due to the sink share and the part due to the content entropy, with and without each
  layer's prior.
- :func:`audit_rpa`: both for a training run folder
  (:class:`~attncoda.hooks.rpa_checkpoints.RunFolder`), as ``attncoda audit rpa`` runs it;
  :func:`audit_markdown` is what that command prints.

Examples
--------
>>> from attncoda.hooks import zoo
>>> from attncoda.hooks.rpa_audit import entropy_trajectory
>>> ids = zoo.tiny_batch(zoo.tiny_twin("llama"), length=10)["input_ids"]
>>> ds = entropy_trajectory([("a", zoo.tiny_twin("llama", seed=0))], ids)
>>> ds.sizes["checkpoint"]
1
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

import attncoda as ac

from ._capture import capture
from ._registry import observed
from .rpa import RPAError, RPAPrior, attached
from .rpa_checkpoints import Checkpoint, RunFolder, load_checkpoint

__all__ = [
    "audit_markdown",
    "audit_rpa",
    "entropy_trajectory",
    "prior_perturbation",
]


def _audit_rows(
    model: Any, prior: RPAPrior, input_ids: torch.Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 log-rows without and with the (cached) prior and log softmax(B), per layer.

    Returns ``(log_without, log_with, log_prior)`` of shape ``(sample, layer, head, query, key)``
    (``log_prior`` broadcasts over sample and head), ``-inf`` at invisible keys. ``log_with``
    comes from :func:`attncoda.hooks.capture` (which sees the adjusted mask), ``log_without``
    from the model's own q and k without the bias.
    """
    n_layers = prior.n_layers
    raw: dict[int, torch.Tensor] = {}

    def observe(
        module: Any,
        layer: int,
        query: Any,
        key: Any,
        mask: Any,
        scaling: Any,
        kwargs: Any,
        value: Any = None,
    ) -> None:
        rep = query.shape[1] // key.shape[1]
        k = key.double().repeat_interleave(rep, dim=1)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        raw[layer] = (query.double() @ k.transpose(-1, -2)) * scale

    was_training = model.training
    model.eval()
    input_ids = input_ids.to(next(model.parameters()).device)
    try:
        with torch.no_grad(), attached(model, prior, mode="cached"), observed(model, observe):
            with capture(model, what="rows") as cap:
                model(input_ids=input_ids)
        log_with = np.asarray(cap.dataset["log_attn"].values, dtype=np.float64)
    finally:
        model.train(was_training)
    length = input_ids.shape[-1]
    vis = np.tril(np.ones((length, length), dtype=bool))
    log_without = np.empty_like(log_with)
    log_prior = np.empty((1, n_layers, 1, length, length))
    for layer in range(n_layers):
        z = raw[layer].cpu().numpy()
        z = np.where(vis, z, -np.inf)
        log_without[:, layer] = z - _lse(z)
        b = prior.inference_bias(layer, length).double().cpu().numpy()
        b = np.where(vis, b, -np.inf)
        log_prior[0, layer, 0] = b - _lse(b)
    return log_without, log_with, log_prior


def _lse(a: np.ndarray) -> np.ndarray:
    m = np.max(a, axis=-1, keepdims=True)
    return np.asarray(m + np.log(np.sum(np.exp(a - m), axis=-1, keepdims=True)))


def prior_perturbation(model: Any, prior: RPAPrior, input_ids: torch.Tensor) -> Any:
    """How the (cached) prior changes each attention row: sink balance vs content reshaping.

    With the prior, row ``i`` is the perturbation ``x_i (+) softmax(B_i)`` of the row without
    it (``softmax(z + B) = C(softmax(z) * softmax(B))``). Its squared Aitchison size splits
    exactly into a sink part (the change of the sink-vs-content balance, ``b(softmax(B_i))^2``)
    and a content part (``d_A^2`` between the content subcompositions), and the entropy change it
    causes splits into sink and content parts (Shapley). Query 0 (sink only) is skipped.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    prior : RPAPrior
        With membership statistics for ``input_ids``' length (a trained or calibrated prior).
    input_ids : torch.Tensor
        ``(sample, T)``.

    Returns
    -------
    xarray.Dataset
        Over ``(layer, head)``: ``aitchison_sink``, ``aitchison_content`` (mean squared parts),
        ``sink_fraction`` (sink / total), ``entropy_without``, ``entropy_with``,
        ``delta_entropy``, ``delta_entropy_sink``, ``delta_entropy_content``,
        ``sink_share_without``, ``sink_share_with`` (means over samples and queries >= 1), and
        the attribute ``perturbation_max_error`` (max abs difference between the captured rows
        and ``perturb(rows without, softmax(B))``).

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> prior = RPAPrior.for_model(model)
    >>> ids = zoo.tiny_batch(model, length=12)["input_ids"]
    >>> prior.calibrate(model, [ids])
    >>> ds = prior_perturbation(model, prior, ids)
    >>> ds.attrs["perturbation_max_error"] < 1e-5
    True
    """
    log_without, log_with, log_prior = _audit_rows(model, prior, input_ids)
    qs = slice(1, None)
    lw, lp, lo = log_without[..., qs, :], log_with[..., qs, :], log_prior[..., qs, :]
    vis = np.isfinite(lw)
    lp_b = np.broadcast_to(lo, lw.shape)
    rebuilt = ac.perturb(np.exp(lw), np.exp(lp_b), mask=vis)
    err = float(np.max(np.abs(np.where(vis, rebuilt - np.exp(lp), 0.0))))
    split = ac.aitchison_split(lw, lp, from_logits=True)
    ch = ac.entropy_change(lw, lp, from_logits=True)
    d0 = ac.decompose(lw, from_logits=True)
    d1 = ac.decompose(lp, from_logits=True)

    def mean(a: Any) -> np.ndarray:
        return np.asarray(a, dtype=np.float64).mean(axis=(0, 3))

    sink, content = mean(split.sink), mean(split.content)
    total = sink + content
    coords = {"layer": np.arange(prior.n_layers), "head": np.arange(lw.shape[2])}
    dims = ("layer", "head")
    ds = xr.Dataset(
        {
            "aitchison_sink": (dims, sink),
            "aitchison_content": (dims, content),
            "sink_fraction": (
                dims,
                np.divide(sink, total, out=np.full_like(sink, np.nan), where=total > 0),
            ),
            "entropy_without": (dims, mean(d0.entropy)),
            "entropy_with": (dims, mean(d1.entropy)),
            "delta_entropy": (dims, mean(ch.total)),
            "delta_entropy_sink": (dims, mean(ch.sink)),
            "delta_entropy_content": (dims, mean(ch.content)),
            "sink_share_without": (dims, mean(d0.sink_share)),
            "sink_share_with": (dims, mean(d1.sink_share)),
        },
        coords=coords,
        attrs={
            "perturbation_max_error": err,
            "length": int(input_ids.shape[-1]),
            "samples": int(input_ids.shape[0]),
            "description": "RPA prior as a perturbation of attention rows by softmax(B)",
        },
    )
    return ds


CheckpointLike = Checkpoint | tuple[Any, RPAPrior | None] | Callable[[], Any] | str | os.PathLike


def _resolve_checkpoint(item: Any) -> tuple[Any, RPAPrior | None]:
    if callable(item) and not isinstance(item, nn.Module):
        item = item()
    if isinstance(item, (str, os.PathLike)):
        item = load_checkpoint(item)
    if isinstance(item, Checkpoint):
        return item.model, item.prior
    if isinstance(item, tuple):
        if len(item) == 2 and isinstance(item[1], (RPAPrior, type(None))):
            return item[0], item[1]
        return item[0], None  # e.g. zoo.load()'s (model, tokenizer)
    if isinstance(item, nn.Module):
        return item, None
    raise RPAError(f"cannot read a checkpoint from {type(item).__name__}")


def entropy_trajectory(
    checkpoints: Sequence[tuple[str, Any]],
    input_ids: torch.Tensor,
    *,
    layers: Any = None,
) -> Any:
    """Row entropy over a sequence of checkpoints, its change split into sink growth and content.

    Every checkpoint sees the same ``input_ids``; for each (sample, layer, head, query >= 1) row
    the entropy change from the first checkpoint is split exactly (Shapley, see
    :func:`attncoda.attribute_entropy_change`) into a part due to the sink share and a part due
    to the content entropy, then averaged. ``*_path`` variables sum the splits of consecutive
    checkpoints (the split accumulated along training). RPA checkpoints are evaluated with their
    cached prior.

    Parameters
    ----------
    checkpoints : sequence of (label, checkpoint)
        A checkpoint is a path (:func:`save_checkpoint`), a :class:`Checkpoint`, a
        ``(model, prior_or_None)`` pair, a model, or a zero-argument callable returning any of
        these (loaded one at a time), e.g. Pythia revisions for users with a hub:
        ``[(r, lambda r=r: zoo.load("pythia-70m", revision=r)) for r in ["step1000", ...]]``.
    input_ids : torch.Tensor
        ``(sample, T)`` token ids.
    layers : optional
        Layers to capture (default all).

    Returns
    -------
    xarray.Dataset
        Over ``(checkpoint, layer, head)``: ``entropy``, ``sink_share``, ``content_entropy``,
        ``delta_entropy``, ``delta_sink``, ``delta_content`` (from the first checkpoint),
        ``delta_sink_path``, ``delta_content_path``; over ``checkpoint``: ``sink_fraction`` and
        ``sink_fraction_path`` (model-level share of the entropy change due to the sink). Every
        variable also exists with the suffix ``_no_prior``: the same rows with each layer's RPA
        bias removed at the same hidden states (the model's own logits), equal to the plain
        variables for checkpoints without a prior.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> ids = zoo.tiny_batch(zoo.tiny_twin("llama"), length=10)["input_ids"]
    >>> ck = [(f"s{s}", zoo.tiny_twin("llama", seed=s)) for s in (0, 1)]
    >>> ds = entropy_trajectory(ck, ids)
    >>> ds.sizes["checkpoint"], float(ds.delta_entropy[0].sum())
    (2, 0.0)
    """
    if len(checkpoints) < 1:
        raise RPAError("entropy_trajectory needs at least one checkpoint")
    labels: list[str] = []
    per: list[dict[str, np.ndarray]] = []
    layer_coord = head_coord = None
    for label, item in checkpoints:
        model, prior = _resolve_checkpoint(item)
        rows = _checkpoint_rows(model, prior, input_ids, layers)
        if layer_coord is not None and not np.array_equal(layer_coord, rows.pop("layer")):
            raise RPAError(f"checkpoint {label!r} has other layers than the first checkpoint")
        layer_coord = rows.pop("layer", layer_coord)
        head_coord = np.arange(rows["entropy"].shape[2])
        per.append(rows)
        labels.append(str(label))
    data: dict[str, Any] = {}
    dims = ("checkpoint", "layer", "head")
    for suffix in ("", "_no_prior"):
        for name, series in _split_series(per, suffix).items():
            data[name + suffix] = (dims, series)
    ds = xr.Dataset(data, coords={"checkpoint": labels, "layer": layer_coord, "head": head_coord})
    for suffix in ("", "_no_prior"):
        tot = ds["delta_entropy" + suffix].sum(("layer", "head"))
        ds["sink_fraction" + suffix] = ds["delta_sink" + suffix].sum(("layer", "head")) / tot.where(
            tot != 0
        )
        tot_p = (ds["delta_sink_path" + suffix] + ds["delta_content_path" + suffix]).sum(
            ("layer", "head")
        )
        ds["sink_fraction_path" + suffix] = ds["delta_sink_path" + suffix].sum(
            ("layer", "head")
        ) / tot_p.where(tot_p != 0)
    ds.attrs.update(
        description=(
            "row entropy across checkpoints; change split into sink growth and content. "
            "*_no_prior: the rows of the same forward with each layer's RPA bias removed (equal "
            "to the plain rows for checkpoints without a prior)"
        ),
        length=int(input_ids.shape[-1]),
        samples=int(input_ids.shape[0]),
    )
    return ds


def _checkpoint_rows(
    model: Any, prior: RPAPrior | None, input_ids: torch.Tensor, layers: Any
) -> dict[str, Any]:
    """Per-row (sample, layer, head, query >= 1) sink share, content entropy and entropy."""
    names = ("sink_share", "content_entropy", "entropy")
    if prior is not None:
        log_without, log_with, _ = _audit_rows(model, prior, input_ids)
        sel = np.arange(prior.n_layers)
        if layers is not None:
            sel = np.atleast_1d(np.arange(prior.n_layers)[layers])
        out: dict[str, Any] = {"layer": sel}
        for suffix, logs in (("", log_with), ("_no_prior", log_without)):
            d = ac.decompose(logs[:, sel, :, 1:, :], from_logits=True)
            for v in names:
                out[v + suffix] = np.asarray(getattr(d, v), np.float64)
        return out
    was_training = model.training
    model.eval()
    ids = input_ids.to(next(model.parameters()).device)
    try:
        with torch.no_grad(), capture(model, layers=layers) as cap:
            model(input_ids=ids)
        ds = cap.dataset.isel(query=slice(1, None))
    finally:
        model.train(was_training)
    out = {"layer": ds["layer"].values}
    for v in names:
        out[v] = out[v + "_no_prior"] = np.asarray(ds[v].values, np.float64)
    return out


def _split_series(per: list[dict[str, np.ndarray]], suffix: str) -> dict[str, np.ndarray]:
    """Means over (sample, query) of the rows and of their entropy-change splits."""
    s, h, e = "sink_share" + suffix, "content_entropy" + suffix, "entropy" + suffix
    first = per[0]
    out: dict[str, list[np.ndarray]] = {}
    path_s = np.zeros_like(first[e])
    path_c = np.zeros_like(first[e])
    for i, cur in enumerate(per):
        ch = ac.attribute_entropy_change(first[s], first[h], cur[s], cur[h])
        if i > 0:
            prev = per[i - 1]
            step = ac.attribute_entropy_change(prev[s], prev[h], cur[s], cur[h])
            path_s = path_s + np.asarray(step.sink)
            path_c = path_c + np.asarray(step.content)
        for name, val in (
            ("entropy", cur[e]),
            ("sink_share", cur[s]),
            ("content_entropy", cur[h]),
            ("delta_entropy", ch.total),
            ("delta_sink", ch.sink),
            ("delta_content", ch.content),
            ("delta_sink_path", path_s),
            ("delta_content_path", path_c),
        ):
            out.setdefault(name, []).append(np.asarray(val, np.float64).mean(axis=(0, 3)))
    return {k: np.stack(v) for k, v in out.items()}


def audit_rpa(
    run_dir: str | os.PathLike[str],
    *,
    baseline_dir: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    input_ids: torch.Tensor | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    dtype: str = "auto",
) -> dict[str, Any]:
    """Audit a training run folder (for ``attncoda audit rpa``).

    Reads the run folder (:class:`~attncoda.hooks.rpa_checkpoints.RunFolder`) that
    :func:`attncoda.hooks.rpa_train.train` wrote: its step checkpoints (the trajectory), its
    final checkpoint and its held-out audit ids. Returns (and with ``out`` writes as netCDF plus
    ``audit.md``):

    - ``"trajectory"``: :func:`entropy_trajectory` over the run's checkpoints;
    - ``"perturbation"``: :func:`prior_perturbation` of the final RPA model (RPA runs only);
    - ``"baseline_trajectory"``: the same for ``baseline_dir`` when given.

    Parameters
    ----------
    run_dir : str or os.PathLike
        An RPA (or baseline) run folder.
    baseline_dir : str or os.PathLike, optional
        A baseline run folder to put side by side.
    out : str or os.PathLike, optional
        Folder for ``*.nc`` and ``audit.md``: new, empty, or (``overwrite=True``) one attncoda
        wrote; written beside its place and swapped in when complete.
    input_ids : torch.Tensor, optional
        Token ids to use instead of the run's audit ids.
    overwrite : bool, default False
        Replace an existing audit folder (only one attncoda wrote).
    device : str, default "cpu"
        Torch device the checkpoints run on (``cuda``, ``cuda:N``, ``mps``), checked before any
        checkpoint loads (:func:`attncoda.hooks.zoo.check_device`).
    dtype : str, default "auto"
        Weight dtype of the checkpoints' models (``"auto"``: as saved; see
        :data:`attncoda.hooks.zoo.DTYPES`); attention statistics are computed in float32.

    Returns
    -------
    dict of str to xarray.Dataset
    """
    from . import zoo

    device = zoo.check_device(device)
    if dtype != "auto":
        zoo._as_dtype(dtype)  # refused before any checkpoint loads
    run = RunFolder(run_dir)
    if out is not None:
        ac.check_output(out, overwrite=overwrite, kind="folder")
    ids = input_ids if input_ids is not None else _audit_ids(run)
    on = {"map_location": device, "dtype": dtype}
    result: dict[str, Any] = {"trajectory": entropy_trajectory(_run_checkpoints(run, **on), ids)}
    ck = load_checkpoint(run.final_checkpoint(), **on)
    if ck.prior is not None:
        result["perturbation"] = prior_perturbation(ck.model, ck.prior, ids)
    if baseline_dir is not None:
        result["baseline_trajectory"] = entropy_trajectory(
            _run_checkpoints(RunFolder(baseline_dir), **on), ids
        )
    if out is not None:
        with ac.atomic_output(out, overwrite=overwrite, kind="folder", stamp="rpa-audit") as folder:
            for name, ds in result.items():
                ds.to_netcdf(folder / f"{name}.nc")
            (folder / "audit.md").write_text(audit_markdown(result))
    return result


def _audit_ids(run: RunFolder) -> torch.Tensor:
    path = run.audit_ids
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; pass input_ids= or use a run folder")
    ids = torch.load(path, weights_only=True)
    if not torch.is_tensor(ids):
        raise RPAError(f"{path} does not hold a tensor of token ids")
    return ids


def _run_checkpoints(run: RunFolder, **on: Any) -> list[tuple[str, Any]]:
    """(label, loader) of a run's step checkpoints, each loaded ``on`` a device and dtype."""
    files = run.step_checkpoints()
    if not files:
        raise FileNotFoundError(f"no checkpoints under {run.checkpoints}")
    return [(f.stem, lambda f=f: load_checkpoint(f, **on)) for f in files]


def audit_markdown(result: dict[str, Any]) -> str:
    """A short markdown summary of :func:`audit_rpa`'s datasets."""
    lines: list[str] = []
    for name in ("trajectory", "baseline_trajectory"):
        ds = result.get(name)
        if ds is None:
            continue
        lines += [
            f"## {name}",
            "",
            "Means over layers, heads, samples and queries; ΔH from the first checkpoint, split "
            "exactly into the part due to the sink share and the part due to the content "
            "entropy (Shapley); sink fraction = sink part / ΔH summed over layers and heads, at "
            "the endpoint and summed along the checkpoints (path). The last two columns remove "
            "each layer's RPA bias at the same hidden states (equal to the rows without a prior).",
            "",
            "| checkpoint | entropy | sink share | ΔH | sink part | content part "
            "| sink fraction (endpoint) | sink fraction (path) | entropy without bias "
            "| sink fraction without bias (path) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i, label in enumerate(ds["checkpoint"].values):
            sel = ds.isel(checkpoint=i)
            lines.append(
                f"| {label} | {float(sel.entropy.mean()):.3f} | {float(sel.sink_share.mean()):.3f} "
                f"| {float(sel.delta_entropy.mean()):+.3f} | {float(sel.delta_sink.mean()):+.3f} "
                f"| {float(sel.delta_content.mean()):+.3f} | {float(sel.sink_fraction):.2f} "
                f"| {float(sel.sink_fraction_path):.2f} "
                f"| {float(sel.entropy_no_prior.mean()):.3f} "
                f"| {float(sel.sink_fraction_path_no_prior):.2f} |"
            )
        lines.append("")
    pert = result.get("perturbation")
    if pert is not None:
        lines += [
            "## prior as a perturbation (per layer, mean over heads)",
            "",
            "| layer | Aitchison sink part | content part | sink fraction | ΔH | ΔH sink | "
            "ΔH content |",
            "|---|---|---|---|---|---|---|",
        ]
        for layer in pert["layer"].values:
            s = pert.sel(layer=layer).mean("head")
            lines.append(
                f"| {int(layer)} | {float(s.aitchison_sink):.3f} | {float(s.aitchison_content):.3f} "
                f"| {float(s.sink_fraction):.3f} | {float(s.delta_entropy):+.3f} "
                f"| {float(s.delta_entropy_sink):+.3f} | {float(s.delta_entropy_content):+.3f} |"
            )
        lines += [
            "",
            f"perturbation identity max error: {pert.attrs['perturbation_max_error']:.2e}",
            "",
        ]
    return "\n".join(lines)
