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
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from . import _rows
from ._errors import InputError, require_int

__all__ = ["HeadView", "head_view", "is_cross", "query_labels", "safe_svg", "token_labels"]

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


def quote_token(token: str, width: int | None = None) -> str:
    """A token inside text, the one way attncoda writes it everywhere (the report, the head
    view's and the explorer's tooltips, the CLI's summary): a double-quoted string literal, as
    JSON and Python read it, so a quote mark, a space or a newline is visible and unambiguous
    (``"\\""``, ``" the"``, ``"\\n"``); cut to ``width`` characters when given.

    Examples
    --------
    >>> print(quote_token('"'), quote_token(" the"), quote_token("\\n"))
    "\\"" " the" "\\n"
    """
    if width is not None and len(token) > width:
        token = token[: width - 1] + "…"
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
    return _labels_along(ds, sample, "position", positions, "token")


def _labels_along(
    ds: xr.Dataset, sample: int, dim: str, positions: list[int], name: str
) -> dict[int, str]:
    """Labels of ``positions`` along ``dim`` from the variable ``name`` (its text), else
    ``NAME_id`` (``#id``), else ``@position``."""
    for var, fmt in ((name, "{}"), (f"{name}_id", "#{}")):
        if var in ds.variables:
            da = ds[var]
            if "sample" in da.dims:
                da = da.isel(sample=sample)
            if da.dims == (dim,) and da.sizes[dim] == len(positions):
                # padding that a concatenation left without text reads as an empty token
                return {
                    p: fmt.format(v) if isinstance(v, (str, int)) else ""
                    for p, v in zip(positions, da.values.tolist(), strict=True)
                }
    return {p: f"@{p}" for p in positions}


def is_cross(ds: xr.Dataset) -> bool:
    """Whether ``ds`` holds cross attention: queries and keys are different sequences (the
    target's tokens query the source's), so a query position is not a key position."""
    return ds.attrs.get("attention_stack") == "cross" or "query_token_id" in ds.variables


def query_labels(ds: xr.Dataset, sample: int = 0) -> dict[int, str]:
    """Labels of the queries of sample ``sample``: the keys' labels of the same positions,
    except in cross attention, where the queries are the target's tokens (``query_token``,
    else ``query_token_id`` as ``#id``, else ``@position``).

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(length=3)
    >>> query_labels(ds)[1] == token_labels(ds)[1]  # self-attention: the keys' labels
    True
    """
    q_pos = [int(q) for q in np.asarray(ds["query"].values)]
    if not is_cross(ds):
        keys = token_labels(ds, sample)
        return {q: keys.get(q, f"@{q}") for q in q_pos}
    return _labels_along(ds, sample, "query", q_pos, "query_token")


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
        from ._atomic import write_signed_text

        target = Path(path).expanduser()
        if target.suffix.lower() == ".svg":  # a file of its own needs the SVG namespace
            text = self.svg.replace("<svg ", f'<svg xmlns="{_SVG_NS}" ', 1)
        else:
            text = self.to_html()
        return write_signed_text(target, text, overwrite=overwrite, what="view")

    def __repr__(self) -> str:
        return f"<HeadView {self.title}{' (truncated)' if self.truncated else ''}>"


# --------------------------------------------------------------------------------------------
# reading an SVG back: only the markup attncoda's views are made of

_NUM = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
_COLOUR = r"#[0-9a-fA-F]{6}|#[0-9a-fA-F]{3}|none|transparent"
#: Every attribute attncoda's SVG views use, with the values it writes (a full match).
_SVG_ATTRS: dict[str, str] = {
    "class": r"[a-z]+(?:-[a-z]+)*",
    "data-generator": r"attncoda",
    "role": r"img",
    "aria-label": r"[^\x00-\x08\x0b\x0c\x0e-\x1f]*",
    **{k: _NUM for k in ("x", "y", "width", "height", "cx", "cy", "r", "stroke-width")},
    "viewBox": rf"{_NUM} {_NUM} {_NUM} {_NUM}",
    "transform": rf"rotate\({_NUM} {_NUM} {_NUM}\)",
    "points": rf"{_NUM},{_NUM}(?: {_NUM},{_NUM})*",
    "fill": _COLOUR,
    "stroke": _COLOUR,
    "style": r"fill:#[0-9a-fA-F]{3,6}",
    "text-anchor": r"start|middle|end",
}
#: Every element attncoda's SVG views use.
_SVG_ELEMENTS = frozenset({"svg", "style", "text", "title", "rect", "circle", "polyline", "g"})
_SVG_MAX_ELEMENTS = 2_000_000


def safe_svg(text: str) -> str:
    """An SVG file's markup rebuilt from attncoda's own vocabulary, for inlining in a page.

    The SVG is parsed as XML (no DOCTYPE, entity or CDATA allowed) and written out again
    element by element: only the elements, attributes and attribute values attncoda's views
    use are accepted (no script, no link, no ``on*`` handler, no ``foreignObject``, no
    ``href``, no URL anywhere), the only style sheets are attncoda's own, and all text is
    escaped. Anything else is refused, not stripped: a figure that does not pass is not shown.

    Raises
    ------
    InputError
        Naming the first element, attribute or value that attncoda does not write.

    Examples
    --------
    >>> svg = grid_svg(np.eye(2), ["a", "b"], ["x", "y"], [["1", "2"], ["3", "4"]],
    ...                heading="h", row_name="r", col_name="c", legend="v")
    >>> safe_svg(svg) == svg
    True
    >>> safe_svg('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    Traceback (most recent call last):
    ...
    attncoda._errors.InputError: the SVG holds <script>, which attncoda's views never contain
    """
    import xml.etree.ElementTree as ET

    if re.search(r"<!(?!--)", text):
        raise InputError("the SVG holds a DOCTYPE, entity or CDATA section; attncoda writes none")
    if "<svg" in text and f'xmlns="{_SVG_NS}"' not in text:
        text = text.replace("<svg", f'<svg xmlns="{_SVG_NS}"', 1)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError(f"the SVG is not well-formed XML ({exc})") from exc
    styles = {_STYLE, _FIG_STYLE}
    count = 0
    out: list[str] = []

    def tag_of(el: ET.Element) -> str:
        ns, _, local = el.tag.rpartition("}")
        if ns != "{" + _SVG_NS or local not in _SVG_ELEMENTS:
            raise InputError(
                f"the SVG holds <{local}>, which attncoda's views never contain"
                if ns == "{" + _SVG_NS
                else f"the SVG holds an element outside SVG ({el.tag[:80]!r})"
            )
        return local

    def emit(el: ET.Element, top: bool) -> None:
        nonlocal count
        count += 1
        if count > _SVG_MAX_ELEMENTS:
            raise InputError(f"the SVG holds more than {_SVG_MAX_ELEMENTS:,} elements")
        tag = tag_of(el)
        if top != (tag == "svg"):
            raise InputError("the SVG's root must be <svg>, and only its root")
        attrs = []
        for key, value in el.attrib.items():
            rule = _SVG_ATTRS.get(key)
            if rule is None or not re.fullmatch(rule, value):
                shown = value if len(value) <= 40 else value[:37] + "..."
                raise InputError(
                    f"the SVG's <{tag}> has {key[:60]}={shown!r}, which attncoda's views never "
                    "write"
                )
            attrs.append(f' {key}="{html.escape(value, quote=True)}"')
        out.append(f"<{tag}{''.join(attrs)}>")
        if tag == "style":
            if len(el) or (el.text or "") not in styles:
                raise InputError("the SVG holds a style sheet that is not attncoda's")
            out.append(el.text or "")
        elif el.text:
            out.append(html.escape(el.text, quote=True))
        for child in el:
            emit(child, False)
            if child.tail:
                out.append(html.escape(child.tail, quote=True))
        out.append(f"</{tag}>")

    emit(root, True)
    rebuilt = "".join(out)
    # attncoda writes empty elements as <x .../>; write them back the same way
    return re.sub(r"<(rect|circle|polyline)([^<>]*)></\1>", r"<\1\2/>", rebuilt)


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
    la = _rows._require_rows(ds)
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
    s_idx = int(_rows._sink_positions(ds, sink)[sample])
    vis = np.isfinite(z)
    p = np.where(vis, np.exp(np.where(vis, z, 0.0)), 0.0)
    # the sample's tokens are the keys some query sees: padding is never seen (a padded query
    # of a causal model sees nothing; one of a bidirectional model sees the text, not itself)
    real = {k_pos[j] for j in np.flatnonzero(vis.any(axis=0))}
    cross = is_cross(ds)  # queries are the target's tokens, keys the source's
    rows_ok = np.asarray(
        [i for i in np.flatnonzero(vis.any(axis=1)) if cross or q_pos[i] in real], np.intp
    )
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
    k_window = window
    if cross:  # the keys' window starts at the first source key any query sees
        k_first = k_pos[all_cols[0]] if all_cols else 0
        k_window = (k_first, k_first + max_tokens)
    cols = np.asarray([j for j in all_cols if k_window[0] <= k_pos[j] < k_window[1]], np.intp)
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

    q_labels = query_labels(ds, sample) if cross else {}

    def q_tok(pos: int) -> str:
        return q_labels.get(pos, f"@{pos}") if cross else tok(pos)

    # geometry: query labels | sink column | gap | content grid; key labels on top
    width_chars = 12
    q_text = [_show(q_tok(q_pos[i]), width_chars) for i in rows]
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
    esc = html.escape
    heading = title or f"layer {layer_v}, head {head_v}, sample {sample}"
    what = "content weight c / (1 − s)" if color == "content" else "weight p"
    lo = "0" if scale == "linear" else f"{vmax * 10**-decades:.2g}"
    slo = "0" if scale == "linear" else f"{10**-decades:.2g}"
    notes = [
        "rows: queries; columns: keys; the sink column apart",
        f"hover a cell: its tokens, weight p, sink share s, content weight (colour: {what}, "
        f"{scale})",
    ]
    legends = (
        f"sink share s: {slo} … 1",
        f"{what}: {lo} … {vmax:.3g} (99th percentile; above it, the top colour)",
    )
    all_first = k_pos[min([*all_cols, s_idx])]
    all_last = max(q_pos[rows_ok[-1]], k_pos[max([*all_cols, s_idx])])
    trunc_note = (
        f"truncated: positions {window[0]}–{window[1] - 1} drawn of {all_first}–"
        f"{all_last} (max_tokens={max_tokens}); pass start= or max_tokens= to see others"
        if truncated
        else ""
    )
    # wide enough for the grid and for every line of text (a short view has long notes)
    legend_x = max(230, 8 + _text_w(legends[0]) + 16)
    width = int(
        max(
            grid_w + 16,
            16 + _text_w(heading, 13, bold=True),
            *(16 + _text_w(t) for t in (*notes, trunc_note)),
            legend_x + _text_w(legends[1]) + 8,
        )
    )
    height = int(legend_y + 64 + (16 if truncated else 0))
    out = [
        f'<svg class="acv" data-generator="attncoda" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{esc(heading)}">',
        f"<style>{_STYLE}</style>",
        f'<text class="acv-h" x="8" y="18">{esc(heading)}</text>',
        f'<text class="acv-n" x="8" y="34">{esc(notes[0])}</text>',
        f'<text class="acv-n" x="8" y="48">{esc(notes[1])}</text>',
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
        qt = q_tok(q_pos[i])
        out.append(
            f'<text x="{left - 8 - 30}" y="{y + cell - 3}" text-anchor="end">{esc(q_text[r])}'
            f"<title>query {q_pos[i]} {esc(quote_token(qt))}</title></text>"
            f'<text class="acv-n" x="{left - 6}" y="{y + cell - 3}" text-anchor="end">'
            f"{q_pos[i]}</text>"
        )
        if vis[i, s_idx]:
            s = float(share[r])
            out.append(
                f'<rect class="acv-k" x="{x_sink}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{_colour(_ORANGES, float(t_sink[r]))}"><title>'
                f"query {q_pos[i]} {esc(quote_token(qt))} → sink, key {k_pos[s_idx]} "
                f"{esc(quote_token(tok(k_pos[s_idx])))}\nsink share s = {s:.4f}\n"
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
                f'height="{cell}" fill="{fill}"><title>query {q_pos[i]} {esc(quote_token(qt))} → key '
                f"{k_pos[j]} {esc(quote_token(tok(k_pos[j])))}\nweight p = {w:.4f}\n"
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


# --------------------------------------------------------------------------------------------
# the report's figures as inline SVG with hover (no script): a grid, a scatter, dendrograms

_FIG_STYLE = (
    ".acf text{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:12px;"
    "fill:#222}.acf .acf-h{font-size:13px;font-weight:600}.acf .acf-n{font-size:11px;fill:#555}"
    ".acf .acf-v{font-size:11px;pointer-events:none}"
    ".acf rect.acf-c:hover,.acf circle.acf-p:hover{stroke:#d62728;stroke-width:2.5}"
    ".acf g.acf-l:hover text{fill:#d62728;font-weight:700}"
)


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _svg_open(width: float, height: float, label: str) -> str:
    return (
        f'<svg class="acf" data-generator="attncoda" width="{int(width)}" height="{int(height)}" '
        f'viewBox="0 0 {int(width)} {int(height)}" role="img" aria-label="{html.escape(label)}">'
        f"<style>{_FIG_STYLE}</style>"
    )


def _legend(x: float, y: float, stops: Sequence[tuple[float, float, float]], text: str) -> str:
    cells = "".join(
        f'<rect x="{x + 14 * n:.1f}" y="{y}" width="14" height="10" '
        f'fill="{_colour(stops, n / 10)}"/>'
        for n in range(11)
    )
    return cells + f'<text class="acf-n" x="{x + 164:.1f}" y="{y + 9}">{html.escape(text)}</text>'


def _text_w(text: str, size: float = 11, *, bold: bool = False) -> float:
    """A generous estimate of the width of ``text`` in the SVGs' sans-serif at ``size`` px (the
    SVGs size themselves so that headings and legends are never cut; nothing is measured)."""
    return len(text) * size * (0.64 if bold else 0.58)


def _legend_w(x: float, text: str) -> float:
    """Where :func:`_legend` at ``x`` ends: its colour cells, then its text."""
    return x + 164 + _text_w(text)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> np.ndarray:
    """At most about ``n`` + 1 round tick values covering ``[lo, hi]`` (steps of 1, 2, 2.5 or 5
    times a power of ten, as matplotlib's ``MaxNLocator`` picks them)."""
    from matplotlib.ticker import MaxNLocator

    ticks = MaxNLocator(nbins=n, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    return np.round(np.asarray(ticks, np.float64), 12)


def _tick_text(t: float) -> str:
    return f"{t:g}"


def grid_svg(
    values: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    titles: Sequence[Sequence[str]],
    *,
    heading: str,
    row_name: str,
    col_name: str,
    legend: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cell_text: Sequence[Sequence[str]] | None = None,
    cell_w: int = 40,
    cell_h: int = 20,
    stops: Sequence[tuple[float, float, float]] = _VIRIDIS,
) -> str:
    """A heatmap as inline SVG: labelled rows and columns, a ``<title>`` tooltip per cell.

    Examples
    --------
    >>> svg = grid_svg(np.eye(2), ["a", "b"], ["x", "y"], [["1", "2"], ["3", "4"]],
    ...                heading="h", row_name="r", col_name="c", legend="v")
    >>> svg.count('class="acf-c"')
    4
    """
    values = np.asarray(values, np.float64)
    n_r, n_c = values.shape
    esc = html.escape
    left = 16 + 7 * max([len(s) for s in row_labels] + [2]) + 18
    top = 58
    width = max(
        left + n_c * cell_w + 20,
        _legend_w(8, legend) + 8,
        16 + _text_w(heading, 13, bold=True),
        left + _text_w(col_name) + 8,
    )
    height = top + n_r * cell_h + 44
    out = [
        _svg_open(width, height, heading),
        f'<text class="acf-h" x="8" y="18">{esc(heading)}</text>',
        f'<text class="acf-n" x="{left}" y="{top - 24}">{esc(col_name)}</text>',
        f'<text class="acf-n" x="8" y="{top - 6}">{esc(row_name)}</text>',
    ]
    for j, c in enumerate(col_labels):
        out.append(
            f'<text x="{left + j * cell_w + cell_w / 2:.1f}" y="{top - 6}" '
            f'text-anchor="middle">{esc(c)}</text>'
        )
    span = (vmax - vmin) or 1.0
    for i, r in enumerate(row_labels):
        y = top + i * cell_h
        out.append(
            f'<text x="{left - 8}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end">{esc(r)}</text>'
        )
        for j in range(n_c):
            v = values[i, j]
            fill = "#eeeeee" if not np.isfinite(v) else _colour(stops, (v - vmin) / span)
            x = left + j * cell_w
            out.append(
                f'<rect class="acf-c" x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" '
                f'fill="{fill}" stroke="#fff"><title>{esc(titles[i][j])}</title></rect>'
            )
            if cell_text is not None and cell_text[i][j]:
                ink = "#000" if _luminance(fill) > 0.45 else "#fff"
                out.append(
                    f'<text class="acf-v" x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 4:.1f}" '
                    f'text-anchor="middle" style="fill:{ink}">{esc(cell_text[i][j])}</text>'
                )
    out.append(_legend(8, top + n_r * cell_h + 16, stops, legend))
    out.append("</svg>")
    return "".join(out)


def scatter_svg(
    x: np.ndarray,
    y: np.ndarray,
    colour: np.ndarray,
    titles: Sequence[str],
    *,
    heading: str,
    x_label: str,
    y_label: str,
    legend: str,
    x_range: tuple[float, float] | None = None,
) -> str:
    """A scatter plot as inline SVG, a ``<title>`` tooltip per point (colour in [0, 1]).

    Examples
    --------
    >>> svg = scatter_svg(np.r_[0.1, 0.9], np.r_[1.0, 2.0], np.r_[0.0, 1.0], ["a", "b"],
    ...                   heading="h", x_label="x", y_label="y", legend="c")
    >>> svg.count('class="acf-p"')
    2
    """
    x, y, colour = (np.asarray(a, np.float64) for a in (x, y, colour))
    ok = np.isfinite(x) & np.isfinite(y)
    esc = html.escape
    w = max(600, 16 + _text_w(heading, 13, bold=True), _legend_w(8, legend) + 8)
    h, left, top = 420, 64, 34
    pw, ph = 600 - left - 24, h - top - 78
    x0, x1 = x_range if x_range is not None else (float(x[ok].min()), float(x[ok].max()))
    y0, y1 = (0.0, float(y[ok].max()) * 1.05) if ok.any() else (0.0, 1.0)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    y_ticks = _nice_ticks(y0, y1)
    y0, y1 = min(y0, float(y_ticks[0])), max(y1, float(y_ticks[-1]))  # the axis ends on ticks
    x_ticks = [t for t in _nice_ticks(x0, x1) if x0 - 1e-9 <= t <= x1 + 1e-9]

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    out = [
        _svg_open(w, h, heading),
        f'<text class="acf-h" x="8" y="18">{esc(heading)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for t in x_ticks:
        out.append(
            f'<text class="acf-n" x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">'
            f"{_tick_text(t)}</text>"
        )
    for t in y_ticks:
        out.append(
            f'<text class="acf-n" x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">'
            f"{_tick_text(t)}</text>"
        )
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{top + ph + 34}" text-anchor="middle">'
        f"{esc(x_label)}</text>"
        f'<text x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + ph / 2:.1f})">{esc(y_label)}</text>'
    )
    for i in np.flatnonzero(ok):
        out.append(
            f'<circle class="acf-p" cx="{px(x[i]):.1f}" cy="{py(y[i]):.1f}" r="5" '
            f'fill="{_colour(_VIRIDIS, float(colour[i]))}" stroke="#333" stroke-width="0.5">'
            f"<title>{esc(titles[int(i)])}</title></circle>"
        )
    out.append(_legend(8, h - 20, _VIRIDIS, legend))
    out.append("</svg>")
    return "".join(out)


def dendrograms_svg(
    linkages: Sequence[np.ndarray],
    panel_titles: Sequence[str],
    leaf_labels: Sequence[str],
    leaf_titles: Sequence[str],
    leaf_colour: np.ndarray,
    *,
    heading: str,
    legend: str,
    height_label: str = "merge height",
) -> str:
    """Dendrograms side by side as inline SVG: one leaf per row, horizontal labels, tooltips.

    Examples
    --------
    >>> z = np.array([[0, 1, 0.1, 2], [2, 3, 0.3, 3]])
    >>> svg = dendrograms_svg([z], ["p"], ["a", "b", "c"], ["A", "B", "C"], np.r_[0, 0.5, 1],
    ...                       heading="h", legend="c")
    >>> svg.count('class="acf-l"')
    3
    """
    from scipy.cluster.hierarchy import dendrogram  # scipy: the analysis already needs it

    esc = html.escape
    n = len(leaf_labels)
    row_h = 16
    label_w = 14 + 7.2 * max(len(s) for s in leaf_labels)
    tree_w = 220
    panel_w = label_w + tree_w + 40
    top = 52
    width = max(
        panel_w * len(linkages) + 16,
        _legend_w(8, legend) + 8,
        16 + _text_w(heading, 13, bold=True),
        8 + panel_w * (len(linkages) - 1) + max(_text_w(t) for t in panel_titles) + 8,
    )
    height = top + n * row_h + 60
    out = [
        _svg_open(width, height, heading),
        f'<text class="acf-h" x="8" y="18">{esc(heading)}</text>',
    ]
    for p, (z, name) in enumerate(zip(linkages, panel_titles, strict=True)):
        ox = 8 + p * panel_w
        dn = dendrogram(np.asarray(z, np.float64), no_plot=True)
        hmax = max(float(np.max(dn["dcoord"])), 1e-12)

        def fx(hgt: float, ox: float = ox, hmax: float = hmax) -> float:
            return ox + label_w + hgt / hmax * tree_w

        def fy(ic: float) -> float:
            return top + (ic - 5) / 10 * row_h + row_h / 2

        out.append(f'<text class="acf-n" x="{ox}" y="{top - 12}">{esc(name)}</text>')
        for ic, dc in zip(dn["icoord"], dn["dcoord"], strict=True):
            pts = " ".join(f"{fx(d):.1f},{fy(i):.1f}" for i, d in zip(ic, dc, strict=True))
            out.append(f'<polyline points="{pts}" fill="none" stroke="#555" stroke-width="1.2"/>')
        for r, leaf in enumerate(dn["leaves"]):
            y = top + r * row_h
            out.append(
                f'<g class="acf-l"><title>{esc(leaf_titles[leaf])}</title>'
                f'<rect x="{ox}" y="{y}" width="{label_w + tree_w:.1f}" height="{row_h}" '
                'fill="transparent"/>'
                f'<circle cx="{ox + 6}" cy="{y + row_h / 2}" r="5" '
                f'fill="{_colour(_VIRIDIS, float(leaf_colour[leaf]))}" stroke="#333" '
                'stroke-width="0.5"/>'
                f'<text x="{ox + 15}" y="{y + row_h / 2 + 4}">{esc(leaf_labels[leaf])}</text></g>'
            )
        axis_y = top + n * row_h + 14
        for t in _nice_ticks(0.0, hmax, 4):
            if t > hmax * (1 + 1e-9):
                continue
            out.append(
                f'<text class="acf-n" x="{fx(t):.1f}" y="{axis_y}" text-anchor="middle">'
                f"{_tick_text(t)}</text>"
            )
        out.append(
            f'<text class="acf-n" x="{fx(hmax / 2):.1f}" y="{axis_y + 14}" '
            f'text-anchor="middle">{esc(height_label)}</text>'
        )
    out.append(_legend(8, height - 16, _VIRIDIS, legend))
    out.append("</svg>")
    return "".join(out)
