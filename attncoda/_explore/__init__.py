"""The attention explorer: every layer and head of a rows capture in one offline HTML page.

:func:`explore` turns a rows capture (``log_attn``) into one self-contained page: an overview of
every layer x head as a small pattern thumbnail (coloured by the raw weights, where the sink
dominates, or by the content renormalised), a large view of one head with layer, head, sample,
convention (``kept``, ``dropped``, ``split``) and window chosen on the page or with the
keyboard, a second head beside it to compare, a tooltip with both tokens, ``p``, the row's sink
share ``s`` and ``c / (1 - s)``, and the per-head summaries with the exact split
``H = H_b(s) + (1 - s) H(c)``.

The page loads nothing: its script and style are inline and pinned by sha256 hashes in its own
Content-Security-Policy (no ``unsafe-inline``, no ``unsafe-eval``, ``connect-src 'none'``); the
data is a JSON block (``<``, ``>``, ``&``, U+2028 and U+2029 escaped) holding a base64
deflate stream, which the page inflates with the browser's own ``DecompressionStream``. Token
strings reach the page only through ``textContent`` and canvas text.

Encoding and precision
----------------------
Each row is stored as its sink log-odds ``log(s / (1 - s))`` (float32, from
:func:`attncoda.decompose` through the rows' summaries) and its content weights
``c_k / (1 - s)`` quantised linearly to multiples of ``1 / 4096`` (:data:`LEVELS`): the page
shows every content weight to within ``1 / 8192`` (1.2e-4) and every raw weight
``p = (1 - s) c_k / (1 - s)`` to within ``(1 - s) / 8192``; the sink share is float32. Only
each row's visible span of keys is stored, as two byte planes that deflate well: SmolLM2-135M's
30 x 9 heads over one 256-token sample make a 7.9 MB page.

Examples
--------
>>> import attncoda as ac
>>> ex = ac.explore(ac.testing.synthetic_rows(n_layers=2, n_heads=3, length=8))
>>> ex
<Explorer 2 layers x 3 heads, 2 samples, 8 queries>
>>> ex.html.startswith("<!DOCTYPE html>") and "connect-src 'none'" in ex.html
True
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import zlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from .. import _profiles, _rows
from .. import _view as vw
from .._data import DIMS
from .._entropy import binary_entropy
from .._errors import AttncodaError, InputError, require_int

__all__ = ["LEVELS", "Explorer", "explore"]

#: Content weights ``c / (1 - s)`` are stored as multiples of ``1 / LEVELS``.
LEVELS = 4096
#: The page's height inside a notebook (pixels): the page fits it (its grid and its views
#: scroll inside), so the notebook is the only other scroll level.
IFRAME_HEIGHT = 820
#: The folder, beside the notebook (the kernel's working directory), that holds the pages a
#: notebook shows: one file per explorer, named by its content, so a notebook stores only an
#: ``<iframe src>`` per display (the page and its data once, however often it is shown).
NOTEBOOK_FOLDER = "attncoda-explorer"


@cache
def _asset(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def csp() -> str:
    """The page's Content-Security-Policy: its one script and one style, pinned by hash.

    Examples
    --------
    >>> "'unsafe-inline'" in csp() or "'unsafe-eval'" in csp()
    False
    """
    return (
        f"default-src 'none'; script-src '{_sha256(_asset('page.js'))}'; "
        f"style-src '{_sha256(_asset('page.css'))}'; img-src data:; connect-src 'none'; "
        "base-uri 'none'; form-action 'none'"
    )


def json_block(value: Any) -> str:
    """``value`` as JSON safe inside ``<script type="application/json">``.

    ``<``, ``>`` and ``&`` are written as ``\\u`` escapes (no ``</script>`` or ``<!--`` can
    close or change the block), and so are U+2028, U+2029 and every other non-ASCII character.

    Examples
    --------
    >>> json_block({"t": "</script>&\\u2028"})
    '{"t": "\\\\u003c/script\\\\u003e\\\\u0026\\\\u2028"}'
    """
    text = json.dumps(value, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class Explorer:
    """An attention explorer page (see :func:`explore`).

    Shown inline by Jupyter (``_repr_html_``): the page is written once, named by its content,
    into :data:`NOTEBOOK_FOLDER` beside the notebook (the kernel's working directory) and shown
    in a sandboxed ``<iframe src>``, so the notebook holds a few hundred bytes per display and
    not the data (7.9 MB for SmolLM2's 30 x 9 heads); its own Content-Security-Policy applies
    and the notebook's scripts and styles cannot reach it. Where that folder cannot be
    written, or for a notebook that must stand alone (nbviewer, VS Code, e-mail), :meth:`embed`
    gives the page inside the output (``<iframe srcdoc>``). :meth:`save` writes it as one file.

    Attributes
    ----------
    html : str
        The complete page.
    title : str
        Its title.
    shape : dict
        Sizes of what it holds (``layer``, ``head``, ``sample``, ``query``).
    """

    def __init__(self, page: str, title: str, shape: dict[str, int]) -> None:
        self.html = page
        self.title = title
        self.shape = shape

    def _iframe(self, source: str) -> str:
        return (
            f'<iframe title="{html.escape(self.title)}" sandbox="allow-scripts" '
            f'style="width:100%;height:{IFRAME_HEIGHT}px;border:1px solid #ddd" {source}>'
            "</iframe>"
        )

    def notebook_file(self, folder: str | os.PathLike[str] = NOTEBOOK_FOLDER) -> Path:
        """Write the page into ``folder`` (relative to the working directory) as
        ``<sha256 of the page>.html``, once: a file of that name already holds this page.

        Examples
        --------
        >>> import tempfile, pathlib, attncoda as ac
        >>> ex = ac.explore(ac.testing.synthetic_rows(n_layers=1, n_heads=2, length=6))
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> ex.notebook_file(folder) == ex.notebook_file(folder)
        True
        """
        from .._atomic import file_is_ours, write_signed_text

        name = hashlib.sha256(self.html.encode("utf-8")).hexdigest()[:24] + ".html"
        target = Path(folder) / name
        if target.is_file() and file_is_ours(target) is None:
            return target  # named by its content: already this page
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_signed_text(target, self.html, what="explorer")

    def _repr_html_(self) -> str:
        try:
            path = self.notebook_file()
        except (OSError, AttncodaError):  # read-only, or a name taken by a file not ours
            return self._iframe(f'srcdoc="{html.escape(self.html, quote=True)}"')
        # loading="lazy": JupyterLab rewrites a relative src to its /files/ URL a moment after
        # the output is inserted; an iframe that loads at once fetches the relative URL first,
        # which the lab serves as its own app: the first display showed a blank nested
        # JupyterLab (checked in JupyterLab 4, headless chromium), the lazy one the explorer
        src = html.escape(path.as_posix(), quote=True)
        return self._iframe(f'loading="lazy" src="{src}"')

    def embed(self) -> _Embedded:
        """The page to show inside the notebook's output itself (``<iframe srcdoc>``): the
        notebook stands alone, and holds the data once per display.

        Examples
        --------
        >>> import attncoda as ac
        >>> ex = ac.explore(ac.testing.synthetic_rows(n_layers=1, n_heads=2, length=6))
        >>> "srcdoc=" in ex.embed()._repr_html_()
        True
        """
        return _Embedded(self)

    @staticmethod
    def check_target(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Refuse, before any work, a path that :meth:`save` would refuse.

        Examples
        --------
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> Explorer.check_target(folder / "explorer.html").name
        'explorer.html'
        """
        from .._atomic import check_output, file_is_ours

        # replaced only if attncoda wrote the whole file (its signature covers every byte)
        return check_output(path, overwrite=overwrite, is_ours=file_is_ours, what="explorer")

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the page crash-safely (staged beside ``path``, then renamed into place).

        Parameters
        ----------
        path : path
            The HTML file to write.
        overwrite : bool, default False
            Replace an existing file, only if it is a view or explorer attncoda wrote.

        Returns
        -------
        pathlib.Path
            The page written.

        Raises
        ------
        OutputExistsError
            ``path`` exists and ``overwrite`` is not set, or it is not attncoda's.

        Examples
        --------
        >>> import tempfile, pathlib, attncoda as ac
        >>> ex = ac.explore(ac.testing.synthetic_rows(n_layers=1, n_heads=2, length=6))
        >>> ex.save(pathlib.Path(tempfile.mkdtemp()) / "explorer.html").name
        'explorer.html'
        """
        from .._atomic import write_signed_text

        return write_signed_text(path, self.html, overwrite=overwrite, what="explorer")

    def __repr__(self) -> str:
        s = self.shape
        return (
            f"<Explorer {s['layer']} layers x {s['head']} heads, {s['sample']} sample"
            f"{'s' if s['sample'] != 1 else ''}, {s['query']} queries>"
        )


class _Embedded:
    """An :class:`Explorer` shown with its page inside the output (see :meth:`Explorer.embed`)."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer

    def _repr_html_(self) -> str:
        ex = self.explorer
        return ex._iframe(f'srcdoc="{html.escape(ex.html, quote=True)}"')

    def __repr__(self) -> str:
        return repr(self.explorer)


def _samples(ds: xr.Dataset, sample: Any) -> list[int]:
    n = ds.sizes["sample"]
    if sample is None:
        return list(range(n))
    if isinstance(sample, (str, bytes)) or not isinstance(sample, (Sequence, np.ndarray, range)):
        return [require_int(sample, "sample", low=0, high=n - 1)]
    picked = [require_int(s, "sample", low=0, high=n - 1) for s in sample]
    if not picked:
        raise InputError("sample= selects no sample; give an index or a list of indices")
    if len(set(picked)) != len(picked):
        raise InputError(f"sample= names a sample twice: {picked}")
    return picked


def _content_codes(z: np.ndarray, sink: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantised content weights of rows ``z`` (..., K): codes, and each row's visible span.

    Code 0 marks the sink and invisible keys; a content key gets ``round(c / (1 - s) *
    LEVELS) + 1``. Only keys in ``[lo, hi)`` (first to last visible key) are returned.
    """
    vis = np.isfinite(z)
    content = vis.copy()
    content[..., sink] = False
    zc = np.where(content, z, -np.inf)
    top = zc.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        w = np.exp(zc - top)
        c = w / np.where(content.any(-1, keepdims=True), w.sum(-1, keepdims=True), 1.0)
    code = np.where(content, np.rint(c * LEVELS) + 1, 0).astype(np.uint16)
    k = vis.shape[-1]
    any_vis = vis.any(-1)
    lo = np.where(any_vis, vis.argmax(-1), 0)
    hi = np.where(any_vis, k - vis[..., ::-1].argmax(-1), 0)
    keys = np.arange(k)
    span = (keys >= lo[..., None]) & (keys < hi[..., None])
    return code[span], lo.astype(np.uint16), hi.astype(np.uint16)


def _span(mask: np.ndarray) -> list[int]:
    """``[first, last + 1)`` of the True entries of ``mask`` (``[0, 0]`` when there are none)."""
    idx = np.flatnonzero(mask)
    return [int(idx[0]), int(idx[-1]) + 1] if idx.size else [0, 0]


def _coarse(x: np.ndarray) -> bytes:
    """float32 with the 12 low bits of the mantissa cleared (relative precision 5e-4): entropies
    shown to 3 decimals deflate to half their size."""
    bits = np.ascontiguousarray(x, "<f4").view("<u4") & np.uint32(0xFFFFF000)
    return bits.tobytes()


def _logodds(summ: xr.Dataset, z: np.ndarray, sink: int) -> np.ndarray:
    """Sink log-odds of rows ``z``: the summaries' where defined, +inf (all mass on the sink),
    -inf (sink invisible) and NaN (nothing visible) for the rows decompose leaves out."""
    lam = np.asarray(summ, np.float64)
    vis = np.isfinite(z)
    has_sink = vis[..., sink]
    has_content = (vis.sum(-1) - has_sink) > 0
    lam = np.where(np.isnan(lam) & has_sink & ~has_content, np.inf, lam)
    lam = np.where(np.isnan(lam) & ~has_sink & has_content, -np.inf, lam)
    return lam


def _head_summaries(s: np.ndarray, h: np.ndarray, hc: np.ndarray) -> list[float | None]:
    """Means over the rows with a sink and content: s, H, H_b(s), (1 - s) H(c), H(c), rows."""
    ok = np.isfinite(s) & np.isfinite(hc) & np.isfinite(h)
    if not ok.any():
        return [None] * 5 + [0]
    s, h, hc = s[ok], h[ok], hc[ok]
    hb = np.asarray(binary_entropy(np.clip(s, 0.0, 1.0)), np.float64)
    vals = [s.mean(), h.mean(), hb.mean(), ((1 - s) * hc).mean(), hc.mean()]
    out: list[float | None] = [float(f"{v:.6g}") for v in vals]
    return [*out, int(ok.sum())]


def explore(
    ds: xr.Dataset,
    *,
    sample: Any = None,
    layer: int | None = None,
    head: int | None = None,
    sink: Any = None,
    title: str | None = None,
) -> Explorer:
    """An interactive, offline explorer of every layer and head of a rows capture.

    The page shows an overview of all heads (a thumbnail of each head's pattern; click one to
    open it), a large view of one head (tokens on both axes, hover a cell to highlight its
    query row and key column and to read both tokens, ``p``, the row's sink share ``s`` and
    ``c / (1 - s)``), the conventions as a switch (``kept``: the raw row; ``dropped``: the sink
    removed and the content renormalised; ``split``: the sink share beside the renormalised
    content), a second head to compare side by side, and each head's mean sink share,
    entropy, content entropy and the split ``H = H_b(s) + (1 - s) H(c)``. Long samples are
    windowed (every token is in the file; the window moves and zooms). The keys are listed on
    the page. Precision: see the module documentation (content weights to 1.2e-4).

    Parameters
    ----------
    ds : xarray.Dataset
        A capture with rows (``log_attn``, ``-inf`` at invisible keys), e.g.
        ``capture(model, what="rows", tokenizer=tok)``.
    sample : int or sequence of int, optional
        Samples to include (indices); default all. The file grows linearly with them.
    layer, head : int, optional
        Layer and head shown first (coordinate values); default the last layer's first head.
    sink : optional
        Key position of each sample's sink; default the ``sink_index`` coordinate.
    title : str, optional
        The page's title; default names the model.

    Returns
    -------
    Explorer
        ``_repr_html_`` for Jupyter, ``.save(path)``, ``.html``.

    Raises
    ------
    RowsRequiredError
        If the dataset has no rows.
    InputError
        An unknown layer or head, a sample out of range, a title that is not a string.

    See Also
    --------
    head_view : one head as static SVG (no script).

    Examples
    --------
    >>> import attncoda as ac
    >>> ds = ac.testing.synthetic_rows(n_layers=2, n_heads=3, length=10)
    >>> ex = ac.explore(ds, sample=1, layer=0, head=2)
    >>> ex.shape
    {'layer': 2, 'head': 3, 'sample': 1, 'query': 10}
    >>> ds.coda.explore(sample=[0, 1]).shape["sample"]
    2
    """
    la = _rows._require_rows(ds)
    layer_v, head_v = vw._pick(ds, "layer", layer), vw._pick(ds, "head", head)
    picked = _samples(ds, sample)
    if title is not None and not isinstance(title, str):
        raise InputError(f"title must be a string, got {type(title).__name__}")
    n_l, n_h, n_q, n_k = (ds.sizes[d] for d in ("layer", "head", "query", "key"))
    if n_k > 65535:
        raise InputError(f"the explorer holds rows of at most 65535 keys, this capture has {n_k}")
    sinks = _rows._sink_positions(ds, sink)
    sub = ds.isel(sample=picked)
    k_pos = [int(k) for k in (la["key"].values if "key" in la.coords else range(n_k))]
    # a custom sink= goes on as key positions of the samples kept (sinks are key indices)
    rows_summ = _profiles._row_summaries(
        sub, None if sink is None else np.asarray(k_pos)[sinks[picked]]
    )
    from_vars = sink is None and all(v in ds.data_vars for v in ("sink_share", "content_entropy"))
    has_h = from_vars and "entropy" in ds.data_vars
    summ = sub if from_vars and has_h else rows_summ
    source = (
        "the capture's summaries variables"
        if summ is sub
        else "computed from the rows with attncoda.decompose"
    )
    lam_all, h_all, hc_all, lo_all, hi_all, codes = [], [], [], [], [], []
    summaries = []
    for i, s_idx in enumerate(picked):
        k_sink = int(sinks[s_idx])
        per_layer = []
        for li in range(n_l):
            z = np.asarray(la.data[s_idx, li], np.float64)  # (H, Q, K)
            code, lo, hi = _content_codes(z, k_sink)
            lam = _logodds(rows_summ["sink_logodds"].values[i, li], z, k_sink)
            h = np.asarray(summ["entropy"].transpose(*DIMS[:4]).values[i, li], np.float64)
            hc = np.asarray(summ["content_entropy"].transpose(*DIMS[:4]).values[i, li], np.float64)
            s = np.asarray(summ["sink_share"].transpose(*DIMS[:4]).values[i, li], np.float64)
            per_layer.append([_head_summaries(s[hh], h[hh], hc[hh]) for hh in range(n_h)])
            lam_all.append(lam.astype("<f4"))
            h_all.append(h.astype("<f4"))
            hc_all.append(hc.astype("<f4"))
            lo_all.append(lo)
            hi_all.append(hi)
            codes.append(code)
        summaries.append(per_layer)
    code = np.concatenate([c.ravel() for c in codes])
    parts = [np.concatenate([a.ravel() for a in lam_all]).astype("<f4").tobytes()]
    parts += [_coarse(np.concatenate([a.ravel() for a in arrs])) for arrs in (h_all, hc_all)]
    parts += [
        np.concatenate([a.ravel() for a in lo_all]).astype("<u2").tobytes(),
        np.concatenate([a.ravel() for a in hi_all]).astype("<u2").tobytes(),
        (code >> 8).astype(np.uint8).tobytes(),
        (code & 0xFF).astype(np.uint8).tobytes(),
    ]
    blob = base64.b64encode(zlib.compress(b"".join(parts), 6)).decode("ascii")
    q_pos = [int(q) for q in np.asarray(la["query"].values)]
    tokens, query_tokens = [], []
    real, real_q = [], []
    for s_idx in picked:
        # padding is not part of a sample: its real keys are those some query sees, its real
        # queries those that see a key (left and right padding alike)
        vis = np.isfinite(np.asarray(la.data[s_idx]))
        keys_seen = vis.any(axis=(0, 1, 2))
        queries_seeing = vis.any(axis=(0, 1, 3))
        if not vw.is_cross(ds):  # a query at a padding position is padding too
            queries_seeing &= np.isin(q_pos, np.asarray(k_pos)[keys_seen])
        real.append(_span(keys_seen))
        real_q.append(_span(queries_seeing))
        labels = vw.token_labels(ds, s_idx)
        tokens.append([labels.get(k, f"@{k}") for k in k_pos])
        q_labels = vw.query_labels(ds, s_idx)
        query_tokens.append([q_labels.get(q, f"@{q}") for q in q_pos])
    model = str(ds.attrs.get("model_id", "") or "")
    if model and Path(model).is_absolute():  # a local checkpoint: its folder's name
        model = Path(model).name
    heading = title if title is not None else f"attention explorer{': ' + model if model else ''}"
    layers = [int(v) for v in np.asarray(ds["layer"].values)]
    heads = [int(v) for v in np.asarray(ds["head"].values)]
    meta = {
        "format": 1,
        "title": heading,
        "model": model,
        "levels": LEVELS,
        "layers": layers,
        "heads": heads,
        "samples": picked,
        "queries": q_pos,
        "keys": k_pos,
        "tokens": tokens,
        "query_tokens": query_tokens,
        "cross": vw.is_cross(ds),
        "sink": [int(sinks[s]) for s in picked],
        "real": real,
        "real_queries": real_q,
        "start": {"layer": layers.index(layer_v), "head": heads.index(head_v)},
        "source": source,
        "summaries": summaries,
        "n_codes": int(code.size),
        "blob": blob,
    }
    page = _page(heading, meta)
    shape = {"layer": n_l, "head": n_h, "sample": len(picked), "query": n_q}
    return Explorer(page, heading, shape)


def _page(title: str, meta: dict[str, Any]) -> str:
    from .._version import __version__

    esc = html.escape
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp(), quote=False)}">'
        f'<meta name="generator" content="attncoda {esc(__version__)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_asset('page.css')}</style></head>"
        f"<body>{_asset('page.html')}"
        f'<script type="application/json" id="acx-data">{json_block(meta)}</script>'
        f"<script>{_asset('page.js')}</script></body></html>\n"
    )
