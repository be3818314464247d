"""Entropy attribution: how much of each head's entropy change comes from the sink channel."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from ._conventions import AnalysisError, DatasetMismatchError
from ._data import require_dataset
from ._entropy import binary_entropy
from ._entropy_change import attribute_entropy_change
from ._profiles import _summaries

__all__ = [
    "attribute_entropy",
]


# --------------------------------------------------------------------------------------------
# entropy attribution


def _strip(ds: xr.Dataset, keep: Sequence[str]) -> xr.Dataset:
    """Only the variables in ``keep``, without non-index coordinates."""
    out = ds[list(keep)]
    drop = [c for c in out.coords if c not in out.dims]
    return out.drop_vars(drop)


def attribute_entropy(
    a: xr.Dataset,
    b: xr.Dataset | None = None,
    *,
    along: str | None = None,
    dims: Sequence[str] = ("sample", "query"),
    sink: Any = None,
) -> xr.Dataset:
    r"""Split the change of row entropy from ``a`` to ``b`` into sink growth and content sharpening.

    Per row, :math:`H = H_b(s) + (1 - s) H(\hat c)`, and the change from ``a`` to ``b`` is split
    by :func:`attncoda.attribute_entropy_change` (the two-player Shapley value): a *sink* part
    (the change of the sink share) and a *content* part (the change of the content entropy),
    which add up exactly to the total. Rows are paired: ``a`` and ``b`` must have the same dims
    and coordinates (two checkpoints or plug-in on/off on the same tokens, two layers after
    selecting them). The parts are then averaged over ``dims`` (default samples and queries) on
    the rows defined in both, per head; means of parts add up to means of totals exactly.

    Parameters
    ----------
    a, b : xarray.Dataset
        Summaries (``sink_share``, ``content_entropy``) or rows.
    along : str, optional
        Without ``b``: attribute the change between consecutive coordinates of this dim of
        ``a`` (e.g. ``along="layer"``: layer 0 -> 1, 1 -> 2, ...), over a ``transition`` dim.
    dims : sequence of str, default ("sample", "query")
        Dims averaged over.
    sink : optional
        As in :func:`head_profiles`.

    Returns
    -------
    xarray.Dataset
        ``sink``, ``content``, ``total`` (mean changes, nats), ``entropy_a``, ``entropy_b`` and
        ``n_rows`` over the remaining dims. Attrs aggregate over all heads (row-weighted):
        ``sink_mean``, ``content_mean``, ``total_mean`` and ``sink_fraction`` (sink part over
        total, the share of the change due to the sink).

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_layers=3, n_heads=2)
    >>> att = ac.attribute_entropy(ds, along="layer")
    >>> att.sizes["transition"], bool(abs(att.sink + att.content - att.total).max() < 1e-12)
    (2, True)
    """
    require_dataset(a, "attribute_entropy")
    if b is not None:
        require_dataset(b, "attribute_entropy")
    if b is None:
        if along is None:
            raise AnalysisError("give a second dataset b, or along= a dim of a (e.g. 'layer')")
        summ = _summaries(a, sink)
        if along not in summ.dims or summ.sizes[along] < 2:
            raise AnalysisError(f"along={along!r} needs a dim of at least 2 coordinates")
        coords = summ[along].values
        labels = [f"{coords[i]}->{coords[i + 1]}" for i in range(len(coords) - 1)]
        # every transition at once: the rows of coordinate i paired with those of i + 1, the
        # along dim relabelled "transition" on both sides (one pass, not one per transition)
        steps = _strip(summ, ["sink_share", "content_entropy"]).drop_vars(along)
        sa, sb = (
            steps.isel({along: part}).rename({along: "transition"}).assign_coords(transition=labels)
            for part in (slice(0, -1), slice(1, None))
        )
        out = attribute_entropy(sa, sb, dims=dims).transpose("transition", ...)
        return _with_fraction(out, a.attrs)
    if along is not None:
        raise AnalysisError("along= is only used without a second dataset")
    need = ["sink_share", "content_entropy"]
    sa = _strip(_summaries(a, sink), need)
    sb = _strip(_summaries(b, sink), need)
    if set(sa.dims) != set(sb.dims):
        raise DatasetMismatchError(
            f"rows are paired, so a and b need the same dims; got {dict(sa.sizes)} and "
            f"{dict(sb.sizes)}"
        )
    try:
        sa, sb = xr.align(sa, sb, join="exact")
    except ValueError as exc:
        raise DatasetMismatchError(
            "a and b must describe the same rows (same coordinates on every dim: samples, "
            f"heads, query positions); {exc}"
        ) from exc
    dims = [d for d in dims if d in sa.dims]
    sa = sa.transpose(*sb["sink_share"].dims)
    valid = (
        sa["sink_share"].notnull()
        & sa["content_entropy"].notnull()
        & sb["sink_share"].notnull()
        & sb["content_entropy"].notnull()
    )
    fill = {"sink_share": 0.5, "content_entropy": 0.0}
    va = {k: sa[k].where(valid, fill[k]).transpose(*valid.dims).values for k in need}
    vb = {k: sb[k].where(valid, fill[k]).transpose(*valid.dims).values for k in need}
    ch = attribute_entropy_change(
        va["sink_share"].astype(np.float64),
        va["content_entropy"].astype(np.float64),
        vb["sink_share"].astype(np.float64),
        vb["content_entropy"].astype(np.float64),
    )
    h_a = binary_entropy(va["sink_share"].astype(np.float64)) + (
        1 - va["sink_share"].astype(np.float64)
    ) * va["content_entropy"].astype(np.float64)
    n = valid.sum(dims)
    res: dict[str, Any] = {}
    safe_n = n.where(n > 0)
    for name, arr in (
        ("sink", ch.sink),
        ("content", ch.content),
        ("total", ch.total),
        ("entropy_a", h_a),
        ("entropy_b", h_a + ch.total),
    ):
        da = xr.DataArray(np.where(valid.values, arr, 0.0), dims=valid.dims, coords=valid.coords)
        res[name] = da.sum(dims) / safe_n
    res["n_rows"] = n
    out = xr.Dataset(res)
    for name, text in (
        ("sink", "entropy change due to the sink share (Shapley part)"),
        ("content", "entropy change due to the content entropy (Shapley part)"),
        ("total", "mean entropy change from a to b"),
    ):
        out[name].attrs["long_name"] = text
    return _with_fraction(out, a.attrs)


def _with_fraction(out: xr.Dataset, attrs: Mapping[Hashable, Any]) -> xr.Dataset:
    w = out["n_rows"].astype(np.float64)
    total = float((out["total"].fillna(0) * w).sum())
    sink = float((out["sink"].fillna(0) * w).sum())
    rows = float(w.sum())
    content = float((out["content"].fillna(0) * w).sum())
    out.attrs = {k: attrs[k] for k in ("model_id", "family") if k in attrs}
    out.attrs["sink_mean"] = sink / rows if rows else math.nan
    out.attrs["content_mean"] = content / rows if rows else math.nan
    out.attrs["total_mean"] = total / rows if rows else math.nan
    out.attrs["sink_fraction"] = sink / total if total != 0 else math.nan
    out.attrs["definition"] = "Shapley split of H = H_b(s) + (1 - s) H(c_hat), row by row"
    return out
