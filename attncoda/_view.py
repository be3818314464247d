"""An interactive view of one head's attention that works offline: inline SVG, no script.

:func:`head_view` draws the rows of one head for one sample as a token-by-token grid: one row
per query, one column per key, the sink column drawn apart on the left, so that the content
attention is not washed out by the sink. Hovering a cell shows (as the SVG ``<title>`` tooltip
of the browser) the query and key tokens, the attention weight, the row's sink share and the
cell's content weight ``c / (1 - s)``. The page loads nothing (no CDN, no script), so it works
offline, inside Jupyter (``_repr_html_``) and inside attncoda's report under its strict
Content-Security-Policy.

Examples
--------
>>> import attncoda as ac
>>> view = ac.head_view(ac.testing.synthetic_rows(), layer=1, head=2, sample=0)
>>> view.svg.startswith("<svg")
True
>>> view.svg.count('class="acv-c"') > 0
True
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from . import _analysis as an
from ._errors import InputError, require_int

__all__ = ["HeadView", "head_view", "token_labels"]

#: The only sources a saved view may load: inline styles (no network, no script).
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_GENERATOR = "attncoda"
_SVG_NS = "http://www.w3.org/2000/svg"

# viridis at nine stops (matplotlib's values), for content cells
_VIRIDIS = (
    (0.267, 0.005, 0.329),
    (0.279, 0.175, 0.483),
    (0.230, 0.322, 0.546),
    (0.173, 0.449, 0.558),
    (0.128, 0.567, 0.551),
    (0.154, 0.680, 0.504),
    (0.369, 0.789, 0.383),
    (0.678, 0.864, 0.190),
    (0.993, 0.906, 0.144),
)
# white to dark orange, for the sink column (the colour of the sink in attncoda's figures)
_ORANGES = (
    (1.0, 0.961, 0.922),
    (0.992, 0.682, 0.420),
    (0.851, 0.282, 0.004),
    (0.498, 0.153, 0.016),
)

_STYLE = (
    ".acv text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:11px;"
    "fill:#222}.acv .acv-h{font-family:system-ui,sans-serif;font-size:13px;font-weight:600}"
    ".acv .acv-n{font-family:system-ui,sans-serif;font-size:11px;fill:#555}"
    ".acv .acv-s{fill:#a0410d;font-weight:700}"
    ".acv rect.acv-c:hover,.acv rect.acv-k:hover{stroke:#d62728;stroke-width:2}"
)


def _colour(stops: Sequence[tuple[float, float, float]], t: float) -> str:
    t = min(1.0, max(0.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    rgb = [round(255 * (a + f * (b - a))) for a, b in zip(stops[i], stops[i + 1], strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _scaled(v: np.ndarray, vmax: float, scale: str, decades: float) -> np.ndarray:
    """Values in [0, 1] for the colour map: ``v / vmax``, or ``decades`` of log10 below vmax."""
    if vmax <= 0:
        return np.zeros_like(v)
    if scale == "linear":
        return np.clip(v / vmax, 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.clip(1.0 + (np.log10(np.maximum(v, 0.0)) - np.log10(vmax)) / decades, 0.0, 1.0)


def _show(token: str, width: int) -> str:
    """A token as a label: whitespace made visible, cut to ``width`` characters."""
    t = token.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "")
    if not t.strip():
        t = t.replace(" ", "␣") or "∅"
    return t if len(t) <= width else t[: width - 1] + "…"


def _quote(token: str) -> str:
    return json.dumps(token, ensure_ascii=False)


def token_labels(
    ds: xr.Dataset, sample: int = 0, tokens: Sequence[str] | None = None
) -> dict[int, str]:
    """The text of each token position of one sample, by position.

    From ``tokens`` if given (one string per position), else the dataset's ``token``
    coordinate (decoded strings), else its ``token_id`` coordinate (``"#id"``), else the
    position itself (``"@p"``).

    Examples
    --------
    >>> import attncoda as ac
    >>> token_labels(ac.testing.synthetic_rows(length=4), tokens=["a", "b", "c", "d"])[2]
    'c'
    """
    if "position" in ds.coords:
        positions = [int(p) for p in np.asarray(ds["position"].values)]
    else:
        keys = ds["key"].values if "key" in ds.coords else ds["query"].values
        positions = [int(p) for p in np.asarray(keys)]
    if tokens is not None:
        if isinstance(tokens, str) or len(tokens) != len(positions):
            raise InputError(
                f"tokens= needs one string per position ({len(positions)}), got "
                f"{len(tokens) if not isinstance(tokens, str) else 'a single string'}"
            )
        return {p: str(t) for p, t in zip(positions, tokens, strict=True)}
    for name, fmt in (("token", "{}"), ("token_id", "#{}")):
        if name in ds.coords or name in ds.data_vars:
            da = ds[name]
            if "sample" in da.dims:
                da = da.isel(sample=sample)
            if da.dims == ("position",) and da.sizes["position"] == len(positions):
                return {
                    p: fmt.format(v) for p, v in zip(positions, da.values.tolist(), strict=True)
                }
    return {p: f"@{p}" for p in positions}


class HeadView:
    """One head's attention rows as self-contained inline SVG (see :func:`head_view`).

    Shown as it is by Jupyter (``_repr_html_``); :meth:`save` writes it as an HTML page or an
    SVG file; :attr:`svg` is the fragment attncoda's report embeds.

    Attributes
    ----------
    svg : str
        The ``<svg>`` element, with its own inline style and a ``<title>`` tooltip per cell,
        for an HTML page (no namespace declaration: HTML gives inline SVG its namespace).
    title : str
        What is drawn (layer, head, sample).
    truncated : bool
        Whether positions beyond ``max_tokens`` were left out (the view says so under the grid).
    """

    def __init__(self, svg: str, title: str, truncated: bool) -> None:
        self.svg = svg
        self.title = title
        self.truncated = truncated

    def _repr_html_(self) -> str:
        return f'<div style="overflow:auto;max-width:100%">{self.svg}</div>'

    def to_html(self) -> str:
        """The view as a complete HTML page that loads nothing."""
        from ._version import __version__

        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="generator" content="{_GENERATOR} {html.escape(__version__)}">'
            f"<title>{html.escape(self.title)}</title></head>"
            f'<body style="margin:12px">{self._repr_html_()}</body></html>\n'
        )

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the view crash-safely: an HTML page, or the bare SVG if ``path`` ends in .svg.

        Parameters
        ----------
        path : path
            The file to write.
        overwrite : bool, default False
            Replace an existing file (only a view or report attncoda wrote).

        Returns
        -------
        pathlib.Path
        """
        from ._atomic import atomic_output

        target = Path(path).expanduser()
        if target.suffix.lower() == ".svg":  # a file of its own needs the SVG namespace
            text = self.svg.replace("<svg ", f'<svg xmlns="{_SVG_NS}" ', 1) + "\n"
        else:
            text = self.to_html()
        with atomic_output(target, overwrite=overwrite, is_ours=_is_view, what="view") as tmp:
            tmp.write_text(text, encoding="utf-8")
        return target

    def __repr__(self) -> str:
        return f"<HeadView {self.title}{' (truncated)' if self.truncated else ''}>"


def _is_view(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return "it is not an attncoda view"
    ours = f'content="{_GENERATOR} ' in head or 'data-generator="attncoda"' in head
    return None if ours else "it is not an attncoda view (no attncoda generator tag)"


def _pick(ds: xr.Dataset, dim: str, value: Any) -> int:
    values = [int(v) for v in np.asarray(ds[dim].values)]
    if value is None:
        return values[-1] if dim == "layer" else values[0]
    v = require_int(value, dim)
    if v not in values:
        raise InputError(f"{dim}={v} was not captured; this dataset has {dim}s {values}")
    return v


def head_view(
    ds: xr.Dataset,
    *,
    layer: int | None = None,
    head: int | None = None,
    sample: int = 0,
    sink: Any = None,
    tokens: Sequence[str] | None = None,
    color: Literal["content", "weight"] = "content",
    scale: Literal["linear", "log"] = "linear",
    decades: float = 3.0,
    max_tokens: int = 64,
    start: int | None = None,
    cell: int = 14,
    title: str | None = None,
) -> HeadView:
    """An interactive, offline view of one head's attention rows for one sample.

    One grid row per query, one column per key; the sink column is drawn apart on the left
    (orange: the row's sink share), the content keys to its right. Keys a query cannot see
    (the causal upper triangle, padding) are left empty. Hovering a cell shows the query and
    key tokens, the weight ``p``, the row's sink share ``s`` and the content weight
    ``c / (1 - s)``. Tokens label both axes (the ``token`` coordinate when the capture has
    it, else ``#token_id``).

    Parameters
    ----------
    ds : xarray.Dataset
        A capture with rows (``log_attn``).
    layer, head : int, optional
        Layer and head (coordinate values); default the last layer and the first head.
    sample : int, default 0
        Index of the sample.
    sink : optional
        Key position of each sample's sink; default the ``sink_index`` coordinate.
    tokens : sequence of str, optional
        Text of each position, overriding the dataset's tokens.
    color : {"content", "weight"}, default "content"
        Colour content cells by their content weight ``c / (1 - s)`` (what the ``dropped``
        convention compares) or by the raw weight ``p``.
    scale : {"linear", "log"}, default "linear"
        Colour scale; ``"log"`` spans ``decades`` powers of ten below the largest value.
    decades : float, default 3
        Range of the log scale.
    max_tokens : int, default 64
        At most this many positions are drawn, from ``start``; a note under the grid says so
        when the sample is longer (each row's tooltip gives the mass on keys left out).
    start : int, optional
        First query position drawn (default: the first query with a visible key).
    cell : int, default 14
        Size of a cell in pixels.
    title : str, optional
        Heading drawn above the grid.

    Returns
    -------
    HeadView
        ``_repr_html_`` for Jupyter, ``.save(path)``, ``.svg``.

    Raises
    ------
    RowsRequiredError
        If the dataset has no rows.
    InputError
        An unknown layer or head, a sample out of range, or an option out of range.

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(length=6)
    >>> view = ac.head_view(ds, layer=0, head=1, tokens=list("abcdef"))
    >>> "sink share" in view.svg and "&quot;c&quot;" in view.svg
    True
    >>> ds.coda.view(layer=0, head=1).title
    'layer 0, head 1, sample 0'
    """
    la = an._require_rows(ds)
    layer_v, head_v = _pick(ds, "layer", layer), _pick(ds, "head", head)
    n_samples = ds.sizes["sample"]
    sample = require_int(sample, "sample", low=0, high=n_samples - 1)
    max_tokens = require_int(max_tokens, "max_tokens", low=1)
    cell = require_int(cell, "cell", low=4, high=64)
    if color not in ("content", "weight"):
        raise InputError(f"color must be 'content' or 'weight', got {color!r}")
    if scale not in ("linear", "log"):
        raise InputError(f"scale must be 'linear' or 'log', got {scale!r}")
    if isinstance(decades, bool) or not (isinstance(decades, (int, float)) and decades > 0):
        raise InputError(f"decades must be a number > 0, got {decades!r}")
    labels = token_labels(ds, sample, tokens)
    z = np.asarray(la.sel(layer=layer_v, head=head_v).isel(sample=sample).values, np.float64)
    q_pos = [int(q) for q in np.asarray(la["query"].values)]
    k_pos = [int(k) for k in (la["key"].values if "key" in la.coords else range(z.shape[1]))]
    s_idx = int(an._sink_positions(ds, sink)[sample])
    vis = np.isfinite(z)
    p = np.where(vis, np.exp(np.where(vis, z, 0.0)), 0.0)
    rows_ok = np.flatnonzero(vis.any(axis=1))  # padded queries have no visible key
    if start is not None:
        start = require_int(start, "start", low=0)
        rows_ok = rows_ok[np.asarray([q_pos[i] for i in rows_ok], np.int64) >= start]
    if len(rows_ok) == 0:
        raise InputError(
            f"sample {sample} has no query with a visible key"
            + (f" at or after start={start}" if start is not None else "")
        )
    first = q_pos[rows_ok[0]]
    window = (first, first + max_tokens)  # positions drawn, as [lo, hi)
    rows = np.asarray([i for i in rows_ok if window[0] <= q_pos[i] < window[1]], np.intp)
    all_cols = [j for j in range(len(k_pos)) if j != s_idx and vis[:, j].any()]
    cols = np.asarray([j for j in all_cols if window[0] <= k_pos[j] < window[1]], np.intp)
    truncated = len(rows) < len(rows_ok) or len(cols) < len(all_cols)

    share = p[rows, s_idx] * vis[rows, s_idx]
    pc = p[np.ix_(rows, cols)]
    content_mass = p[rows].sum(axis=1) - share  # all non-sink mass, drawn or not
    with np.errstate(invalid="ignore", divide="ignore"):
        cw = np.where(content_mass[:, None] > 0, pc / content_mass[:, None], np.nan)
    outside = content_mass - pc.sum(axis=1)
    vals = cw if color == "content" else pc
    cvis = vis[np.ix_(rows, cols)]
    # the top of the colour scale: the 99th percentile of the cells drawn (a query with one
    # content key has content weight 1 and would otherwise wash out every other row)
    finite = vals[cvis & np.isfinite(vals)]
    vmax = float(np.percentile(finite, 99)) if finite.size else 0.0
    t_content = _scaled(np.nan_to_num(vals), vmax, scale, decades)
    t_sink = _scaled(share, 1.0, scale, decades)

    def tok(pos: int) -> str:
        return labels.get(pos, f"@{pos}")

    # geometry: query labels | sink column | gap | content grid; key labels on top
    width_chars = 12
    q_text = [_show(tok(q_pos[i]), width_chars) for i in rows]
    k_text = [_show(tok(k_pos[j]), width_chars) for j in cols]
    sink_text = _show(tok(k_pos[s_idx]), width_chars)
    char_w = 6.7
    left = 8 + char_w * max([len(t) for t in q_text] + [4]) + 34
    label_h = 8 + char_w * max([len(t) for t in [*k_text, sink_text]] + [4])
    heading_h = 64
    top = heading_h + label_h
    gap = max(8, cell)
    x_sink = left
    x0 = left + cell + gap
    grid_w = x0 + cell * len(cols)
    legend_y = top + cell * len(rows) + 18
    width = int(max(grid_w + 16, 560))
    height = int(legend_y + 64 + (16 if truncated else 0))
    esc = html.escape
    heading = title or f"layer {layer_v}, head {head_v}, sample {sample}"
    what = "content weight c / (1 − s)" if color == "content" else "weight p"
    out = [
        f'<svg class="acv" data-generator="attncoda" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{esc(heading)}">',
        f"<style>{_STYLE}</style>",
        f'<text class="acv-h" x="8" y="18">{esc(heading)}</text>',
        '<text class="acv-n" x="8" y="34">rows: queries; columns: keys; the sink column '
        "apart</text>",
        f'<text class="acv-n" x="8" y="48">hover a cell: its tokens, weight p, sink share s, '
        f"content weight (colour: {esc(what)}, {scale})</text>",
    ]
    # key labels, vertical, reading upwards from the grid
    for c, label in [(x_sink, sink_text)] + [(x0 + n * cell, t) for n, t in enumerate(k_text)]:
        cls = ' class="acv-s"' if c == x_sink else ""
        xx = c + cell / 2 + 4
        out.append(
            f'<text{cls} x="{xx:.1f}" y="{top - 4}" transform="rotate(-90 {xx:.1f} {top - 4})">'
            f"{esc(label)}</text>"
        )
    out.append(
        f'<text class="acv-n" x="{x_sink - 2}" y="{heading_h - 2}">sink</text>'
        f'<text class="acv-n" x="{x0}" y="{heading_h - 2}">content keys</text>'
    )
    out.append(
        f'<rect x="{x0}" y="{top}" width="{cell * len(cols)}" height="{cell * len(rows)}" '
        'fill="#fafafa" stroke="#ddd"/>'
    )
    for r, i in enumerate(rows):
        y = top + r * cell
        qt = tok(q_pos[i])
        out.append(
            f'<text x="{left - 8 - 30}" y="{y + cell - 3}" text-anchor="end">{esc(q_text[r])}'
            f"<title>query {q_pos[i]} {esc(_quote(qt))}</title></text>"
            f'<text class="acv-n" x="{left - 6}" y="{y + cell - 3}" text-anchor="end">'
            f"{q_pos[i]}</text>"
        )
        if vis[i, s_idx]:
            s = float(share[r])
            out.append(
                f'<rect class="acv-k" x="{x_sink}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{_colour(_ORANGES, float(t_sink[r]))}"><title>'
                f"query {q_pos[i]} {esc(_quote(qt))} → sink, key {k_pos[s_idx]} "
                f"{esc(_quote(tok(k_pos[s_idx])))}\nsink share s = {s:.4f}\n"
                f"content mass 1 − s = {1 - s:.4f}"
                + (f"\n(of which {float(outside[r]):.4f} on keys not drawn)" if truncated else "")
                + "</title></rect>"
            )
        for n, j in enumerate(cols):
            if not vis[i, j]:
                continue
            w, c = float(pc[r, n]), float(cw[r, n])
            fill = _colour(_VIRIDIS, float(t_content[r, n]))
            out.append(
                f'<rect class="acv-c" x="{x0 + n * cell}" y="{y}" width="{cell}" '
                f'height="{cell}" fill="{fill}"><title>query {q_pos[i]} {esc(_quote(qt))} → key '
                f"{k_pos[j]} {esc(_quote(tok(k_pos[j])))}\nweight p = {w:.4f}\n"
                f"content weight c/(1 − s) = {c:.4f}\nrow sink share s = {float(share[r]):.4f}"
                "</title></rect>"
            )
    # legends: sink share 0..1, content 0..vmax
    ly = legend_y
    steps = 10
    for n in range(steps + 1):
        t = n / steps
        out.append(
            f'<rect x="{8 + 12 * n}" y="{ly}" width="12" height="10" '
            f'fill="{_colour(_ORANGES, t)}"/>'
            f'<rect x="{230 + 12 * n}" y="{ly}" width="12" height="10" '
            f'fill="{_colour(_VIRIDIS, t)}"/>'
        )
    lo = "0" if scale == "linear" else f"{vmax * 10**-decades:.2g}"
    slo = "0" if scale == "linear" else f"{10**-decades:.2g}"
    out.append(
        f'<text class="acv-n" x="8" y="{ly + 24}">sink share s: {slo} … 1</text>'
        f'<text class="acv-n" x="230" y="{ly + 24}">{esc(what)}: {lo} … {vmax:.3g} '
        "(99th percentile; above it, the top colour)</text>"
    )
    if truncated:
        out.append(
            f'<text class="acv-n" x="8" y="{ly + 44}">truncated: positions {window[0]}–'
            f"{window[1] - 1} drawn of {k_pos[min([*all_cols, s_idx])]}–"
            f"{max(q_pos[rows_ok[-1]], k_pos[max([*all_cols, s_idx])])} "
            f"(max_tokens={max_tokens}); pass start= or max_tokens= to see others</text>"
        )
    out.append("</svg>")
    return HeadView("".join(out), heading, truncated)
