"""Analysis folders and the self-contained HTML report.

:func:`analyze` runs attncoda's standard analysis of a capture and writes a folder: CSV tables,
PNG + SVG figures and ``analysis.json`` (a manifest of the sections, captions, key numbers and
provenance). :func:`write_report` turns such a folder into ``report.html``: one file with every
figure embedded as a base64 PNG, tables as HTML, an inline stylesheet and a Content-Security-Policy
that forbids every network request, so it opens offline and can be mailed as it is.

What :func:`analyze` computes depends on what the capture holds:

- *summaries* (or rows, from which summaries are recomputed): per-head profiles and the sink
  rate, the exact entropy split :math:`H = H_b(s) + (1 - s) H(\\hat c)` averaged over every row,
  and the attribution of the entropy change from layer to layer to sink growth and content
  sharpening;
- *rows* of at least three heads: verdict flips between the ``kept`` convention and the
  ``dropped`` one (and the sink term of ``split``) for several metrics, with bootstrap intervals
  over samples, head clustering with and without the sink, and two heads' rows drawn as sink bar
  plus content heatmap.

Examples
--------
>>> import tempfile, attncoda as ac
>>> folder = tempfile.mkdtemp()
>>> result = ac.analyze(ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3), folder,
...                  n_boot=10, progress=False)
>>> ac.write_report(folder).name
'report.html'
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
import json
import math
import os
import platform
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from . import _attribution, _backend, _clustering, _comparisons, _conventions, _flips, _profiles
from . import _view as vw
from ._data import SUMMARY_VARIABLES, require_dataset
from ._errors import EXIT_USAGE, AttncodaError
from ._tables import write_table

__all__ = [
    "MANIFEST",
    "REPORT",
    "Analysis",
    "FigureRef",
    "ReportError",
    "Section",
    "TableRef",
    "analyze",
    "check_report",
    "load_analysis",
    "print_summary",
    "render_html",
    "write_report",
]

#: Name of the manifest :func:`analyze` writes into its folder.
MANIFEST = "analysis.json"
#: Name of the HTML page :func:`write_report` writes by default.
REPORT = "report.html"

#: The only sources the report may load: inline styles and ``data:`` images (no network).
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_FLIP_METRICS = ("cosine", "js", "tv", "aitchison")
#: The generator named in every report's head (how attncoda recognises its own pages).
_GENERATOR = "attncoda"


class ReportError(AttncodaError, ValueError):
    """A folder is not an analysis folder, or a dataset cannot be analysed."""

    exit_code: ClassVar[int] = EXIT_USAGE


# --------------------------------------------------------------------------------------------
# the manifest


@dataclass
class FigureRef:
    """A figure of a section: ``stem.png`` and ``stem.svg`` in the analysis folder.

    ``view`` names an SVG file of the folder drawn with hover tooltips (no script): the report
    shows it inline in place of the PNG, which stays linked.
    """

    stem: str
    caption: str
    view: str = ""


@dataclass
class TableRef:
    """A table of a section: a CSV file in the analysis folder; ``max_rows`` are shown inline."""

    file: str
    caption: str
    max_rows: int = 40


@dataclass
class Section:
    """A heading, a few paragraphs of text, figures and tables."""

    heading: str
    text: list[str] = field(default_factory=list)
    figures: list[FigureRef] = field(default_factory=list)
    tables: list[TableRef] = field(default_factory=list)


@dataclass
class Analysis:
    """What :func:`analyze` found: the lines of the terminal summary, key numbers, sections."""

    title: str
    summary: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """The manifest as JSON (non-finite numbers become null)."""
        return json.dumps(_jsonable(asdict(self)), indent=1, allow_nan=False)

    def write(self, folder: str | os.PathLike[str]) -> Path:
        """Write this manifest as ``folder/analysis.json`` (atomically) and return its path."""
        path = Path(folder) / MANIFEST
        from ._atomic import replace_file

        return replace_file(path, self.to_json())

    @classmethod
    def from_json(cls, text: str) -> Analysis:
        """Read a manifest written by :meth:`to_json`.

        Every field is checked as untrusted input: texts must be strings, ``max_rows`` a
        whole number, ``numbers`` numbers (or strings and lists of strings), ``meta`` plain
        values. File names are checked later, when the report reads the files
        (:func:`attncoda._atomic.read_own_file`).

        Raises
        ------
        ValueError, KeyError, TypeError
            A field is missing or of the wrong type.
        """
        try:
            raw = json.loads(text)
        except RecursionError:  # json's decoder recurses once per nested list or object
            raise ValueError("it is nested too deeply to be a manifest attncoda wrote") from None
        try:  # a lone surrogate ("\\ud800") is valid JSON but no text a page can hold
            json.dumps(raw, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"it holds a lone surrogate ({exc.object[exc.start : exc.end]!a}), not text"
            ) from None
        if not isinstance(raw, dict):
            raise TypeError("the manifest is not a JSON object")
        sections = [
            Section(
                heading=_text(s, "heading"),
                text=_texts(s.get("text", []), "text"),
                figures=[
                    FigureRef(_text(f, "stem"), _text(f, "caption"), _text(f, "view", ""))
                    for f in _list(s.get("figures", []), "figures")
                ],
                tables=[
                    TableRef(_text(t, "file"), _text(t, "caption"), _whole(t.get("max_rows", 40)))
                    for t in _list(s.get("tables", []), "tables")
                ],
            )
            for s in _list(raw.get("sections", []), "sections")
        ]
        numbers = _dict(raw.get("numbers", {}), "numbers")
        for key, value in numbers.items():
            ok = (
                value is None
                or isinstance(value, (int, float, str))
                or (isinstance(value, list) and all(isinstance(v, str) for v in value))
            )
            if not ok:
                raise TypeError(f"numbers[{key!r}] is a {type(value).__name__}")
        meta = _dict(raw.get("meta", {}), "meta")
        for key, value in meta.items():
            if isinstance(value, (dict, list)):
                meta[key] = json.dumps(value, ensure_ascii=False)[:2000]
        return cls(
            title=_text(raw, "title"),
            summary=_texts(raw.get("summary", []), "summary"),
            numbers=numbers,
            meta=meta,
            sections=sections,
            files=_texts(raw.get("files", []), "files"),
        )


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError(f"{name} must be a list of objects")
    return value


def _dict(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be an object")
    return dict(value)


def _text(obj: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string, got {type(value).__name__}")
    return value


def _texts(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of strings")
    return list(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**6:
        raise TypeError(f"max_rows must be a whole number from 0 to 10**6, got {value!r}")
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def load_analysis(folder: str | os.PathLike[str]) -> Analysis:
    """Read ``analysis.json`` of a folder written by :func:`analyze`.

    Raises
    ------
    ReportError
        If the folder has no manifest (it was not written by ``attncoda analyze`` or
        ``attncoda demo``) or the manifest is unreadable.
    """
    from ._atomic import open_own

    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ReportError(
            f"{str(folder)!r} is not an analysis folder (no {MANIFEST}); write one with "
            "`attncoda analyze DATASET --out DIR`"
        )
    try:  # one descriptor, no symlink on the way: the manifest of this folder, nothing else
        text = open_own(folder, MANIFEST, 64 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ReportError(
            f"{path} cannot be read as this folder's own manifest ({why}); it must be a regular "
            "file in the folder, not a symlink; re-run the analysis"
        ) from exc
    try:
        return Analysis.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{path} is not a valid analysis manifest: {exc}") from exc


# --------------------------------------------------------------------------------------------
# small helpers


def _xlogx(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.0f}%"


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}g}"


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """One of the report's tables, through :func:`write_table`: full precision, NaN as blank."""
    import pandas as pd

    write_table(pd.DataFrame([list(r) for r in rows], columns=list(header)), path)


def _units(ds: xr.Dataset) -> str:
    return f"{ds.sizes.get('layer', 0)} layers x {ds.sizes.get('head', 0)} heads"


def _has_summaries(ds: xr.Dataset) -> bool:
    return all(v in ds.data_vars for v in ("sink_share", "content_entropy"))


class _Steps:
    """A progress bar over the named steps of the analysis (tqdm on stderr)."""

    def __init__(self, names: Sequence[str], enabled: bool) -> None:
        self._bar: Any = None
        if enabled and names:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(names), desc="analysis", unit="step", leave=True)

    def __call__(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(name)

    def done(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# --------------------------------------------------------------------------------------------
# the analysis


def analyze(
    summaries: xr.Dataset | None,
    out: str | os.PathLike[str],
    *,
    rows: xr.Dataset | None = None,
    title: str | None = None,
    meta: Mapping[str, Any] | None = None,
    metrics: Sequence[str] = _FLIP_METRICS,
    n_boot: int = 200,
    threshold: float = 0.3,
    figures: bool = True,
    progress: bool = True,
    seed: int = 0,
    device: Any = None,
    overwrite: bool = False,
) -> Analysis:
    """Analyse a capture and write tables, figures and ``analysis.json`` into ``out``.

    Parameters
    ----------
    summaries : xarray.Dataset or None
        A capture with summaries (``what="summaries"`` or ``"both"``), or with rows only (the
        summaries are then computed from the rows). None: use ``rows``.
    out : path
        Output folder: new, empty, or (with ``overwrite=True``) an analysis folder attncoda
        wrote. It is written beside its final place and swapped in when complete, so a failed
        or interrupted analysis leaves the previous folder as it was.
    rows : xarray.Dataset, optional
        A capture with rows (``log_attn``) of at least three heads, for verdict flips, head
        clustering and row figures. Default: ``summaries`` when it holds rows.
    title : str, optional
        Title of the report; default from the dataset's ``model_id`` attribute.
    meta : mapping, optional
        Provenance shown in the report (command line, corpus, timings, ...).
    metrics : sequence of str
        Metrics of the verdict-flip table.
    n_boot : int, default 200
        Bootstrap replicates of the flip-rate intervals (0: none).
    threshold : float, default 0.3
        Sink-rate threshold on a head's mean sink share.
    figures : bool, default True
        Draw figures (needs matplotlib).
    progress : bool, default True
        A progress bar over the steps, on stderr.
    seed : int, default 0
    device : str or torch.device, optional
        Where the head comparisons run (see :func:`attncoda.head_comparisons`), e.g. ``"cuda"``.
    overwrite : bool, default False
        Replace an existing analysis folder (only one attncoda wrote: see
        :func:`attncoda.check_output`).

    Returns
    -------
    Analysis
        Also written as ``out/analysis.json``; :func:`write_report` renders it.

    Raises
    ------
    ReportError
        If neither dataset holds summaries or rows, ``rows`` holds no rows, or an option is
        out of range; all checked before anything is written.
    UnknownMetricError
        An unknown or empty list of metrics.
    OutputExistsError, OutputError
        ``out`` may not or cannot be written.
    """
    for given in (summaries, rows):
        if given is not None:
            require_dataset(given, "analyze")
    if summaries is None:
        summaries = rows
    if summaries is None:
        raise ReportError("nothing to analyse: give a dataset with summaries or rows")
    if not _has_summaries(summaries) and "log_attn" not in summaries.data_vars:
        raise ReportError(
            "the dataset has neither summaries (sink_share, content_entropy) nor rows "
            f"(log_attn); it has {sorted(map(str, summaries.data_vars))}"
        )
    if rows is not None and "log_attn" not in rows.data_vars:
        raise ReportError(
            "the rows dataset holds no rows (log_attn); capture it with what='rows' or 'both'"
        )
    if rows is None and "log_attn" in summaries.data_vars:
        rows = summaries
    wanted = _conventions._metrics(metrics)
    if not wanted:
        raise _conventions.UnknownMetricError(
            f"no metric given; choose from {_conventions.METRICS}"
        )
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
        raise ReportError(f"n_boot must be a whole number >= 0, got {n_boot!r}")
    if rows is not None:  # only rows are bootstrapped (the verdict flips)
        _check_bootstrap_memory(n_boot, rows)
    if isinstance(threshold, bool) or not (
        isinstance(threshold, (int, float, np.number)) and 0 < threshold < 1
    ):
        raise ReportError(f"threshold must lie in (0, 1), got {threshold!r}")
    _backend._Backend.resolve("auto", device)  # a bad device fails here, before any file is written
    from ._atomic import atomic_output

    with atomic_output(
        out, overwrite=overwrite, kind="folder", stamp="analysis", what="analysis folder"
    ) as folder:
        return _analyze_into(
            folder,
            summaries,
            rows,
            title,
            meta,
            wanted,
            n_boot,
            threshold,
            figures,
            progress,
            seed,
            device,
        )


def _check_bootstrap_memory(n_boot: int, rows: xr.Dataset) -> None:
    """Refuse, before any work, more bootstrap replicates than memory holds: each replicate
    holds a weight per sample (drawn as int64, kept as float64) and its flip rates."""
    from ._atomic import available_memory

    n_samples = int(rows.sizes.get("sample", 1))
    need = int(n_boot) * (16 * n_samples + 64)
    free = available_memory()
    if free is not None and need > free // 2:
        raise ReportError(
            f"n_boot={int(n_boot):,} needs about {need / 1e9:.1f} GB of memory for the "
            f"bootstrap ({n_samples} samples) and {free / 1e9:.1f} GB are available; choose a "
            "smaller n_boot (--n-boot; 200 to 2000 replicates give stable intervals)"
        )


def _analyze_into(
    folder: Path,
    summaries: xr.Dataset,
    rows: xr.Dataset | None,
    title: str | None,
    meta: Mapping[str, Any] | None,
    wanted: tuple[str, ...],
    n_boot: int,
    threshold: float,
    figures: bool,
    progress: bool,
    seed: int,
    device: Any,
) -> Analysis:
    """The body of :func:`analyze`, writing into a folder of its own (the staging folder)."""
    n_units_rows = 0 if rows is None else rows.sizes["layer"] * rows.sizes["head"]
    use_rows = rows is not None and n_units_rows >= 3 and rows.sizes["sample"] >= 1
    attrs = dict(summaries.attrs)
    model = _model_name(str(attrs.get("model_id", "capture")))
    label = str((meta or {}).get("model") or model)
    res = Analysis(title=title or f"attncoda report: {label}")
    res.meta = {
        "model_id": model,
        "family": attrs.get("family", ""),
        "weights_sha256": attrs.get("weights_sha256", ""),
        "attention_implementation": attrs.get("attention_implementation", ""),
        "dtype": attrs.get("dtype", ""),
        "capture_spec": attrs.get("capture_spec", ""),
        "created": _dt.datetime.now().replace(microsecond=0).isoformat(),
        "attncoda": _version(),
        "python": platform.python_version(),
        **dict(meta or {}),
    }
    steps = ["profiles", "entropy"]
    if summaries.sizes.get("layer", 0) >= 2:
        steps.append("attribution")
    if use_rows:
        steps += ["flips", "clustering", "rows"]
    bar = _Steps(steps, progress)
    try:
        _text_section(res, summaries if rows is None else rows, summaries, folder)
        bar("profiles")
        prof = _profiles.head_profiles(summaries, max_offset=None, progress=progress)
        _profiles_section(res, summaries, prof, folder, threshold, figures)
        bar.done()
        bar("entropy")
        _entropy_section(res, summaries, folder)
        bar.done()
        if "attribution" in steps:
            bar("attribution")
            _attribution_section(res, summaries, folder, figures)
            bar.done()
        if use_rows:
            assert rows is not None
            bar("flips")
            # one pass over the rows serves the flips and the (js) clustering
            cmp = _comparisons.head_comparisons(
                rows,
                wanted if "js" in wanted else (*wanted, "js"),
                per_sample=True,
                mismatched="drop",
                device=device,
                progress=progress,
            )
            _flips_section(res, cmp, rows, folder, wanted, n_boot, seed, figures)
            bar.done()
            bar("clustering")
            _clustering_section(res, cmp, rows, folder, seed, figures)
            bar.done()
            bar("rows")
            _rows_section(res, rows, folder, figures, progress)
            bar.done()
        else:
            _sections_without_rows(res, rows)
    finally:
        bar.close()
    res.files = sorted(
        p.name for p in folder.iterdir() if p.is_file() and p.name not in (MANIFEST, REPORT)
    )
    res.files.append(MANIFEST)
    res.write(folder)
    return res


#: The sections that need fp32 rows of at least 3 heads, and what each shows.
ROW_SECTIONS = (
    ("Do the conventions agree? Verdict flips", "the verdict flips compare heads' rows"),
    ("Head clustering with and without the sink", "the head clustering compares heads' rows"),
    ("Two heads, row by row", "the head views draw two heads' rows"),
)

#: How to get rows: the capture options and the analysis's (the CLI's spelling and Python's).
ROWS_HINT = (
    "capture rows too (attncoda capture MODEL ... --what both --layers 1,15,28; Python: "
    "capture(model, what='both', layers=[...])) and analyze that capture, or pass a capture of "
    "rows as --rows ROWS.nc (Python: analyze(ds, folder, rows=rows))"
)


def _sections_without_rows(res: Analysis, rows: xr.Dataset | None) -> None:
    """Each section that needs rows, shown with one line saying why it is empty and which
    capture option brings it; the same line in the terminal summary."""
    why = (
        "this capture holds summaries only"
        if rows is None
        else f"the rows hold {rows.sizes['layer'] * rows.sizes['head']} head(s), 3 are needed"
    )
    for heading, what in ROW_SECTIONS:
        res.sections.append(
            Section(
                heading,
                text=[f"Not computed: {what}, and {why}. To get this section, {ROWS_HINT}."],
            )
        )
    res.summary.append(
        f"verdict flips, head clustering, head views: not computed ({why}); to get them, "
        f"{ROWS_HINT}"
    )


def _version() -> str:
    from ._version import __version__

    return __version__


def _model_name(model_id: str) -> str:
    """A model's name for the report: the folder name of a local path (which says where the
    weights lay on one machine, not which model it is), a hub id as it is."""
    path = Path(model_id).expanduser()
    if model_id.startswith(("/", "~", ".")) or (os.sep in model_id and path.exists()):
        return path.name or model_id
    return model_id


def _save(fig: Any, folder: Path, stem: str) -> None:
    from ._plot import _release, save_figure

    save_figure(fig, folder / stem, dpi=110)
    _release(fig)  # a report's figure is a file, not a notebook output


def _profiles_section(
    res: Analysis,
    ds: xr.Dataset,
    prof: xr.Dataset,
    folder: Path,
    threshold: float,
    figures: bool,
) -> None:
    share = prof["sink_share"].transpose("layer", "head")
    n_heads_total = int(np.isfinite(share.values).sum())
    heavy = int((share.values > threshold).sum())
    rate = heavy / n_heads_total if n_heads_total else math.nan
    per_layer = (share > threshold).mean("head")
    layers = [int(v) for v in share["layer"].values]
    rows = []
    for i, layer in enumerate(layers):
        for j, head in enumerate(prof["head"].values):
            rows.append(
                [layer, int(head)]
                + [
                    float(prof[v].transpose("layer", "head").values[i, j])
                    for v in SUMMARY_VARIABLES
                    if v in prof.data_vars
                ]
                + [int(prof["n_rows"].transpose("layer", "head").values[i, j])]
            )
    names = [v for v in SUMMARY_VARIABLES if v in prof.data_vars]
    _write_csv(folder / "head_profiles.csv", ["layer", "head", *names, "n_rows"], rows)
    layer_rows = []
    for i, layer in enumerate(layers):
        layer_rows.append(
            [
                layer,
                float(per_layer.values[i]),
                float(np.nanmean(share.values[i])),
                float(np.nanmean(prof["entropy"].transpose("layer", "head").values[i]))
                if "entropy" in prof
                else math.nan,
                float(np.nanmean(prof["content_entropy"].transpose("layer", "head").values[i])),
            ]
        )
    _write_csv(
        folder / "layers.csv",
        ["layer", "sink_rate", "mean_sink_share", "mean_entropy", "mean_content_entropy"],
        layer_rows,
    )
    n_samples = int(ds.sizes.get("sample", 0))
    n_rows = int(prof["n_rows"].sum())
    res.numbers.update(
        n_samples=n_samples,
        n_layers=len(layers),
        n_heads=int(prof.sizes["head"]),
        n_rows=n_rows,
        sink_rate=rate,
        sink_rate_threshold=threshold,
        heavy_heads=heavy,
        mean_sink_share=float(np.nanmean(share.values)),
    )
    res.summary.append(
        f"captured {n_samples} samples, {_units(ds)} ({n_rows:,} attention rows analysed)"
    )
    first, last = float(per_layer.values[0]), float(per_layer.values[-1])
    res.summary.append(
        f"sink rate (heads with mean sink share > {threshold:g}): {_pct(rate)} "
        f"({heavy} of {n_heads_total}); first layer {_pct(first)}, last layer {_pct(last)}"
    )
    sec = Section(
        "Where does attention go? Sink share per head",
        text=[
            "Each attention row is a composition over the visible keys. Its first visible key is "
            "the sink. A head's mean sink share is the average mass its rows put on the sink "
            "(rows with at least one content key: the first query, whose only key is the sink, "
            "is left out).",
            f"{heavy} of {n_heads_total} heads ({_pct(rate)}) put more than {threshold:g} of "
            "their attention on the sink on average: the sink rate. One-number summaries of "
            "these heads (entropy, cosine, Jensen-Shannon) mostly measure the sink.",
        ],
        tables=[
            TableRef("layers.csv", "per layer: sink rate and means over heads", max_rows=60),
            TableRef("head_profiles.csv", "per head: means over samples and queries", 0),
        ],
    )
    label = str(res.meta.get("model") or res.meta.get("model_id", ""))
    if figures:
        from ._plot import plot_sink_grid, plot_sink_vs_content

        grid = plot_sink_grid(
            prof, annotate=share.size <= 150, title=f"mean sink share per head: {label}"
        )
        _save(grid, folder, "sink_grid")
        _save(plot_sink_vs_content(prof), folder, "sink_vs_content")
    hc = prof["content_entropy"].transpose("layer", "head").values
    n_r = prof["n_rows"].transpose("layer", "head").values
    heads = [int(h) for h in share["head"].values]

    def about(i: int, j: int) -> str:
        return (
            f"layer {layers[i]}, head {heads[j]}\nmean sink share {share.values[i, j]:.3f}\n"
            f"mean content entropy {hc[i, j]:.3f} nats\n{int(n_r[i, j]):,} rows"
        )

    grid_view = vw.grid_svg(
        share.values,
        [str(v) for v in layers],
        [str(h) for h in heads],
        [[about(i, j) for j in range(len(heads))] for i in range(len(layers))],
        heading=f"mean sink share per head: {label}",
        row_name="layer",
        col_name="head",
        legend="mean sink share: 0 … 1 (hover a cell for the head's numbers)",
        cell_text=[[f"{v:.2f}" for v in row] for row in share.values],
        cell_w=40 if len(heads) <= 24 else 24,
        cell_h=20 if len(layers) <= 48 else 12,
    )
    n_l = max(len(layers) - 1, 1)
    scatter = vw.scatter_svg(
        share.values.ravel(),
        hc.ravel(),
        np.repeat(np.arange(len(layers)) / n_l, len(heads)),
        [about(i, j) for i in range(len(layers)) for j in range(len(heads))],
        heading="the two channels per head (hover a point: which head it is)",
        x_label="mean sink share s",
        y_label="mean content entropy (nats)",
        legend=f"layer {layers[0]} … {layers[-1]}",
        x_range=(0.0, 1.0),
    )
    sec.figures = [
        FigureRef(
            "sink_grid",
            "mean sink share of every head (layer x head)",
            _write_view(folder, "sink_grid_view.svg", grid_view),
        ),
        FigureRef(
            "sink_vs_content",
            "the two channels per head: mean sink share against mean content entropy "
            "(entropy of the renormalised content c / (1 - s))",
            _write_view(folder, "sink_vs_content_view.svg", scatter),
        ),
    ]
    res.sections.append(sec)


_SHOWN_SAMPLES = 4
_SHOWN_CHARS = 700


def _write_view(folder: Path, name: str, svg: str) -> str:
    """Write an inline-SVG figure as a file of its own (it opens in a browser) and return
    its name; the report inlines it."""
    text = svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    from ._atomic import replace_file

    replace_file(folder / name, text + "\n")
    return name


def _valid_positions(ds: xr.Dataset, sample: int) -> list[int]:
    """Token positions of a sample that are text, not padding: from its sink on, and where
    the dataset has rows or summaries, only positions whose query sees some key."""
    positions = [int(p) for p in np.asarray(ds["position"].values)]
    sink = int(ds["sink_index"].values[sample]) if "sink_index" in ds.coords else 0
    keep = [p for p in positions if p >= sink]
    seen: set[int] | None = None
    if "sink_share" in ds.data_vars:
        ok = ds["sink_share"].isel(sample=sample).notnull().any(["layer", "head"])
        seen = {int(q) for q, v in zip(ds["query"].values, ok.values, strict=True) if v}
    elif "log_attn" in ds.data_vars:
        la = ds["log_attn"].isel(sample=sample)
        ok = (abs(la) < np.inf).any(["layer", "head", "key"])
        seen = {int(q) for q, v in zip(ds["query"].values, ok.values, strict=True) if v}
    if seen:
        last = max(seen)
        keep = [p for p in keep if p <= last]
    return keep


def _quoted(token: str) -> str:
    """A token in the report's text: :func:`attncoda._view.quote_token`, cut to 40 characters."""
    return vw.quote_token(token, 40)


def _text_section(res: Analysis, ds: xr.Dataset, summaries: xr.Dataset, folder: Path) -> None:
    """The text the model read and the token each sample's sink is (from the ``token``
    coordinate of the capture; only the ids where a capture has no token strings)."""
    if "token" not in ds.coords and "token" in summaries.coords:
        ds = summaries
    has_text = "token" in ds.coords
    if not has_text and "token_id" not in ds.coords:
        return
    n = int(ds.sizes["sample"])
    table = []
    shown: list[str] = []
    sinks: dict[str, int] = {}
    for i in range(n):
        labels = vw.token_labels(ds, i)
        pos = _valid_positions(ds, i)
        if not pos:
            continue
        sink_pos = int(ds["sink_index"].values[i]) if "sink_index" in ds.coords else pos[0]
        sink_tok = labels.get(sink_pos, f"@{sink_pos}")
        sinks[sink_tok] = sinks.get(sink_tok, 0) + 1
        text = "".join(labels[p] for p in pos) if has_text else " ".join(labels[p] for p in pos)
        table.append([i, len(pos), sink_pos, sink_tok, text])
        if has_text and len(shown) < _SHOWN_SAMPLES:
            cut = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + " …"
            shown.append(
                f"Sample {i} ({len(pos)} tokens; sink: {_quoted(sink_tok)}"
                f" at position {sink_pos}): {cut}"
            )
    if not table:
        return
    _write_csv(
        folder / "passages.csv", ["sample", "tokens", "sink_position", "sink_token", "text"], table
    )
    named = ", ".join(
        f"{_quoted(t)} ({c} sample{'s' if c > 1 else ''})"
        for t, c in sorted(sinks.items(), key=lambda kv: -kv[1])[:6]
    )
    res.numbers["sink_tokens"] = sorted(sinks)
    res.summary.append(f"sink tokens: {named}")
    intro = [
        "The sink of each sample is its first visible token (the capture's sink_index); here "
        f"it is {named}. A model that adds no beginning-of-sequence token makes an "
        "ordinary sub-word the sink (the first piece of each passage); its attention share "
        "then measures the mass parked on the first position, not interest in that word. To "
        "put the sink elsewhere, capture with another sink= or pass sink= to the analysis "
        "functions.",
    ]
    if not has_text:
        intro.append(
            "This capture holds token ids only (#id), not their text, so the passages are "
            "not shown: capture with a tokenizer to see them."
        )
    elif len(shown) < len(table):
        intro.append(
            f"{len(table)} passages, {len(shown)} shown (the first {len(shown)}); every "
            "passage, its tokens and its sink token are in passages.csv."
        )
    else:
        intro.append(f"{len(table)} passage{'s' if len(table) > 1 else ''}, all shown.")
    res.sections.append(
        Section(
            "What the model read",
            text=intro + shown,
            tables=[TableRef("passages.csv", "each sample's tokens and sink token", 0)],
        )
    )


def _summ(ds: xr.Dataset) -> xr.Dataset:
    return ds if _has_summaries(ds) else _profiles._row_summaries(ds, None)


def _entropy_section(res: Analysis, ds: xr.Dataset, folder: Path) -> None:
    summ = _summ(ds)
    s = np.asarray(summ["sink_share"].values, np.float64)
    hc = np.asarray(summ["content_entropy"].values, np.float64)
    h = (
        np.asarray(summ["entropy"].values, np.float64)
        if "entropy" in summ
        else np.full_like(s, np.nan)
    )
    ok = np.isfinite(s) & np.isfinite(hc) & np.isfinite(h)
    if not ok.any():
        res.summary.append("entropy split: no row with both a sink and content keys")
        return
    s, hc, h = s[ok], hc[ok], h[ok]
    hb = -(_xlogx(s) + _xlogx(1 - s))
    hcont = (1 - s) * hc
    err = float(np.max(np.abs(hb + hcont - h)))
    mh, mb, mc = float(h.mean()), float(hb.mean()), float(hcont.mean())
    res.numbers.update(
        mean_entropy=mh,
        mean_sink_channel_entropy=mb,
        mean_content_channel_entropy=mc,
        entropy_identity_max_error=err,
    )
    res.summary.append(
        f"mean row entropy {mh:.3f} nats = {mb:.3f} sink channel H_b(s) + {mc:.3f} content "
        f"(1-s)H(c) [identity max error {err:.1e}]"
    )
    _write_csv(
        folder / "entropy_split.csv",
        ["quantity", "mean_nats"],
        [
            ["entropy H", mh],
            ["sink channel H_b(s)", mb],
            ["content channel (1 - s) H(c_hat)", mc],
            ["max |H - H_b(s) - (1 - s) H(c_hat)| over rows", err],
            ["rows", int(ok.sum())],
        ],
    )
    res.sections.append(
        Section(
            "The entropy of a row, split exactly",
            text=[
                "For every row, H(x) = H_b(s) + (1 - s) H(c_hat): the binary entropy of the sink "
                "share plus the content entropy weighted by the mass left for content. Averaged "
                f"over all {int(ok.sum()):,} captured rows: H = {mh:.3f} nats, of which "
                f"{mb:.3f} is the sink channel and {mc:.3f} the content channel. The identity "
                f"holds to {err:.1e} on these rows (float32 summaries).",
            ],
            tables=[TableRef("entropy_split.csv", "mean entropy and its two channels")],
        )
    )


def _attribution_section(res: Analysis, ds: xr.Dataset, folder: Path, figures: bool) -> None:
    att = _attribution.attribute_entropy(_summ(ds), along="layer")
    w = att["n_rows"].astype(np.float64)
    others = [d for d in att["sink"].dims if d != "transition"]

    def pooled(name: str) -> np.ndarray:
        v = (att[name].fillna(0) * w).sum(others) / w.sum(others)
        return np.asarray(v.values, np.float64)

    sink, content, total = pooled("sink"), pooled("content"), pooled("total")
    labels = [str(t) for t in att["transition"].values]
    _write_csv(
        folder / "entropy_attribution.csv",
        ["transition", "total", "sink_part", "content_part"],
        [[lab, t, s, c] for lab, t, s, c in zip(labels, total, sink, content, strict=True)],
    )
    tot, sk = float(np.nansum(total)), float(np.nansum(sink))
    frac = float(att.attrs.get("sink_fraction", math.nan))
    res.numbers.update(
        entropy_change_first_to_last=tot,
        entropy_change_sink_part=sk,
        entropy_change_content_part=float(np.nansum(content)),
        entropy_change_sink_fraction=frac,
    )
    res.summary.append(
        f"entropy change layer {labels[0].split('->')[0]} -> {labels[-1].split('->')[-1]}, "
        f"summed over layers: {tot:+.3f} nats; sink part {sk:+.3f}, content part "
        f"{float(np.nansum(content)):+.3f}"
    )
    sec = Section(
        "Why does entropy change from layer to layer?",
        text=[
            "The change of a row's entropy between two layers (same tokens, same query) splits "
            "exactly into a part due to the change of the sink share and a part due to the "
            "change of the content entropy (the two-player Shapley value of the identity "
            "above). The bars show both parts per transition, pooled over heads and rows; the "
            "black mark is the total. A falling entropy can mean that a layer sharpens its "
            "content attention, or only that it parks more mass on the sink.",
            f"Pooled over all transitions and heads, the sink part is {_pct(frac)} of the "
            "summed entropy change (this ratio is unstable when the total is near zero).",
        ],
        tables=[TableRef("entropy_attribution.csv", "entropy change per layer transition", 12)],
    )
    if figures:
        from ._plot import plot_entropy_attribution

        _save(plot_entropy_attribution(att), folder, "entropy_attribution")
        sec.figures = [
            FigureRef("entropy_attribution", "entropy change per layer: sink part, content part")
        ]
    res.sections.append(sec)


def _flips_section(
    res: Analysis,
    cmp: xr.Dataset,
    rows: xr.Dataset,
    folder: Path,
    metrics: Sequence[str],
    n_boot: int,
    seed: int,
    figures: bool,
) -> None:
    fr = _flips.flip_rates(
        cmp,
        list(metrics),
        between=(("kept", "dropped"), ("kept", "sink")),
        n_boot=n_boot if rows.sizes["sample"] >= 2 else 0,
        seed=seed,
    )
    table = []
    for m in fr["metric"].values:
        for p in fr["pair"].values:
            for sc in fr["scope"].values:
                sel = fr.sel(metric=m, pair=p, scope=sc)
                table.append(
                    [
                        str(m),
                        str(p),
                        str(sc),
                        float(sel["flip_rate"]),
                        float(sel["ci_low"]),
                        float(sel["ci_high"]),
                        int(sel["flips"]),
                        int(sel["n_triples"]),
                    ]
                )
    header = ["metric", "pair", "scope", "flip_rate", "ci_low", "ci_high", "flips", "n_triples"]
    _write_csv(folder / "flip_rates.csv", header, table)
    _write_csv(folder / "flip_rates_all.csv", header, [r for r in table if r[2] == "all"])
    kd = fr.sel(pair=str(fr["pair"].values[0]), scope="all")
    parts = []
    for m in fr["metric"].values:
        v = kd.sel(metric=m)
        ci = (
            f" [{_pct(float(v['ci_low']))}, {_pct(float(v['ci_high']))}]"
            if math.isfinite(float(v["ci_low"]))
            else ""
        )
        parts.append(f"{m} {_pct(float(v['flip_rate']))}{ci}")
        res.numbers[f"flip_rate_kept_dropped_{m}"] = float(v["flip_rate"])
    layers = ", ".join(str(int(v)) for v in rows["layer"].values)
    res.summary.append(
        f"verdict flips kept vs dropped (rows of layers {layers}, "
        f"{rows.sizes['head']} heads each): " + "; ".join(parts)
    )
    sec = Section(
        "Do the conventions agree? Verdict flips",
        text=[
            "For every anchor head A and pair of other heads {B, C} among the heads whose rows "
            f"were captured (layers {layers}), the verdict 'is B closer to A than C?' is taken "
            "with the sink kept in the rows (kept) and with the sink removed and the rest "
            "renormalised (dropped); the kept verdict is also compared with the sink term of "
            "the split convention (kept/sink). A flip is a verdict that reverses. Intervals "
            "are percentile bootstraps over samples.",
            "A high kept/dropped flip rate means that a comparison of heads with the sink kept "
            "answers a different question than one about their content: report both channels "
            "(the split convention), or say which one you mean.",
        ],
        tables=[
            TableRef("flip_rates_all.csv", "flip rates over all captured heads"),
            TableRef("flip_rates.csv", "flip rates by metric, convention pair and layer", 0),
        ],
    )
    if figures:
        from ._plot import plot_flip_table

        _save(plot_flip_table(fr), folder, "flip_rates")
    pair0 = str(fr["pair"].values[0])
    one = fr.sel(pair=pair0)
    metric_names = [str(m) for m in one["metric"].values]
    scopes = [str(c) for c in one["scope"].values]

    def flip_about(m: str, sc: str) -> str:
        v = one.sel(metric=m, scope=sc)
        lo, hi = float(v["ci_low"]), float(v["ci_high"])
        ci = f" (interval {_pct(lo)} to {_pct(hi)})" if math.isfinite(lo) else ""
        return (
            f"{m}, {sc}, {pair0}: {_pct(float(v['flip_rate']))} of verdicts flipped{ci}\n"
            f"{int(v['flips'])} of {int(v['n_triples'])} comparisons"
        )

    rates = one["flip_rate"].transpose("metric", "scope").values
    flip_view = vw.grid_svg(
        rates,
        metric_names,
        scopes,
        [[flip_about(m, sc) for sc in scopes] for m in metric_names],
        heading=f"verdicts flipped, {pair0} (hover a cell for the interval and counts)",
        row_name="metric",
        col_name="scope (all captured heads, or one layer)",
        legend="verdicts flipped: 0% … 50% and more",
        vmax=0.5,
        cell_text=[[_pct(v) for v in row] for row in rates],
        cell_w=max(64, 8 * max(len(c) for c in scopes)),
        cell_h=22,
        stops=vw._ORANGES,
    )
    sec.figures = [
        FigureRef(
            "flip_rates",
            "verdicts flipped between kept and dropped",
            _write_view(folder, "flip_rates_view.svg", flip_view),
        )
    ]
    res.sections.append(sec)


def _clustering_section(
    res: Analysis, cmp: xr.Dataset, rows: xr.Dataset, folder: Path, seed: int, figures: bool
) -> None:
    n_units = rows.sizes["layer"] * rows.sizes["head"]
    ks = tuple(k for k in (2, 3, 4) if k < n_units) or (2,)
    cl = _clustering.cluster_heads(cmp, "js", ("kept", "dropped"), ks=ks, seed=seed)
    table = []
    pair = str(cl["pair"].values[0])
    for k in cl["k"].values:
        table.append(
            [
                int(k),
                float(cl["ari"].sel(pair=pair, k=k)),
                float(cl["ari_sink_split"].sel(convention="kept", k=k)),
                float(cl["ari_sink_split"].sel(convention="dropped", k=k)),
            ]
        )
    _write_csv(
        folder / "clustering.csv",
        ["k", "ari_kept_vs_dropped", "ari_kept_vs_sink_split", "ari_dropped_vs_sink_split"],
        table,
    )
    # the sign of an MDS axis is arbitrary: report |rho|
    rho_kept = abs(float(cl["axis_sink_rho"].sel(convention="kept").values[0]))
    rho_drop = abs(float(cl["axis_sink_rho"].sel(convention="dropped").values[0]))
    res.numbers.update(
        clustering_ari_k2=float(cl["ari"].sel(pair=pair, k=ks[0])),
        mds1_sink_rho_kept=rho_kept,
        mds1_sink_rho_dropped=rho_drop,
    )
    res.summary.append(
        f"head clustering (Jensen-Shannon): agreement kept vs dropped, adjusted Rand index ARI "
        f"{_fmt(float(cl['ari'].sel(pair=pair, k=ks[0])), 2)} at k={ks[0]}; first MDS axis vs "
        f"sink share: |rho| {rho_kept:.2f} kept, {rho_drop:.2f} dropped"
    )
    sec = Section(
        "Head clustering with and without the sink",
        text=[
            "The standard head-clustering pipeline (Jensen-Shannon divergence between heads' "
            "rows over the same tokens, average linkage, MDS) run once with the sink in the "
            "rows and once on the content alone. Leaves are coloured by mean sink share. When "
            "the sink is kept, the leading structure follows the sink share (|Spearman rho| of "
            f"the first MDS axis with it: {rho_kept:.2f}; without the sink: {rho_drop:.2f}).",
            "Spearman's rho is the rank correlation (|rho| = 1: the first axis of the map of "
            "heads orders them exactly as their sink share does; 0: unrelated). The adjusted "
            "Rand index (ARI) measures how alike two groupings of the same heads are: 1 for the "
            "same groups, 0 for no more alike than chance. ARI kept vs dropped "
            f"{_fmt(float(cl['ari'].sel(pair=pair, k=ks[0])), 2)} at k={ks[0]} groups: the "
            "sink decides which heads look alike as much as their content does when it is far "
            "below 1.",
        ],
        tables=[
            TableRef(
                "clustering.csv",
                "adjusted Rand index between partitions (kept vs dropped, and each against the "
                "split of heads by sink share)",
            )
        ],
    )
    if figures:
        from ._plot import plot_dendrograms

        _save(plot_dendrograms(cl), folder, "dendrograms")
    c_layers = [int(v) for v in cl["layer"].values]
    c_heads = [int(v) for v in cl["head"].values]
    c_share = np.asarray(cl["sink_share"].values, np.float64)
    convs = [str(c) for c in cl["convention"].values]
    what = {"kept": "sink kept in the rows", "dropped": "sink dropped, content renormalised"}
    dendro = vw.dendrograms_svg(
        [cl["linkage"].sel(convention=c).values for c in convs],
        [
            f"{c} ({what.get(c, c)}): |rho| {abs(float(cl['axis_sink_rho'].sel(convention=c).values[0])):.2f}"
            for c in convs
        ],
        [f"L{la} H{h}" for la, h in zip(c_layers, c_heads, strict=True)],
        [
            f"layer {la}, head {h}\nmean sink share {v:.3f}"
            for la, h, v in zip(c_layers, c_heads, c_share, strict=True)
        ],
        np.clip(np.nan_to_num(c_share), 0, 1),
        heading="Jensen-Shannon head clustering (hover a head for its sink share)",
        legend="leaf colour: mean sink share 0 … 1",
        height_label="merge height (mean Jensen-Shannon divergence)",
    )
    sec.figures = [
        FigureRef(
            "dendrograms",
            "Jensen-Shannon head clustering, kept vs dropped",
            _write_view(folder, "dendrograms_view.svg", dendro),
        )
    ]
    res.sections.append(sec)


def _rows_section(
    res: Analysis, rows: xr.Dataset, folder: Path, figures: bool, progress: bool = False
) -> None:
    prof = _profiles.head_profiles(rows, max_offset=None, progress=progress)
    share = prof["sink_share"].transpose("layer", "head")
    vals = np.where(np.isfinite(share.values), share.values, np.nan)
    if not np.isfinite(vals).any():
        return
    hi = np.unravel_index(np.nanargmax(vals), vals.shape)
    lo = np.unravel_index(np.nanargmin(vals), vals.shape)
    # the sample with the most rows, cropped to its tokens (shorter samples are padded)
    finite = abs(rows["log_attn"]) < np.inf  # visible keys
    n_valid = finite.any("key").sum(["layer", "head", "query"]).values
    best = int(np.argmax(n_valid))
    length = int(finite.isel(sample=best).any("key").any(["layer", "head"]).sum())
    one = rows.isel(sample=[best])
    if length > 0:
        one = one.isel(query=slice(0, length))
        if "key" in one.dims:
            one = one.isel(key=slice(0, int(one["query"].values.max()) + 1))
    figs = []
    for tag, (i, j) in (("most", hi), ("least", lo)):
        layer = int(share["layer"].values[i])
        head = int(share["head"].values[j])
        stem = f"rows_L{layer}_H{head}"
        heading = (
            f"layer {layer}, head {head} ({tag} sink-heavy captured head, mean sink share "
            f"{vals[i, j]:.2f}), sample {best}"
        )
        if figures:
            from ._plot import plot_rows

            _save(plot_rows(one, sample=0, layer=layer, head=head, title=heading), folder, stem)
        view = vw.head_view(one, layer=layer, head=head, sample=0, title=heading)
        name = f"view_L{layer}_H{head}.svg"
        view.save(folder / name)
        figs.append(
            FigureRef(
                stem,
                f"rows of layer {layer}, head {head}: sink share and content"
                + (" (the first 64 tokens)" if view.truncated else ""),
                name,
            )
        )
    res.sections.append(
        Section(
            "Two heads, row by row",
            text=[
                "One row per query token, one column per key token it can see. The sink column, "
                "apart on the left, holds each row's sink share s; the grid to its right holds "
                "the content subcomposition c / (1 - s) of each row, which is what the dropped "
                "convention compares. Hover a cell for its tokens and weights. A sink-heavy head "
                "can have sharp or diffuse content attention; its sink share alone does not "
                "tell. The same view of any head: ds.coda.view(layer=, head=, sample=).",
            ],
            figures=figs,
        )
    )


# --------------------------------------------------------------------------------------------
# HTML


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1000px; padding: 1.2em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 1.8em;
  border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
pre.summary { background: #f5f5f5; padding: 0.8em; white-space: pre-wrap; font-size: 0.85em; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #345; }
.meta td { text-align: left; } .files li { font-family: monospace; font-size: 0.85em; }
.muted { color: #777; font-size: 0.85em; }
figure.view .scroll { overflow: auto; max-width: 100%; border: 1px solid #eee; }
figure.view svg { display: block; max-width: 100%; height: auto; }
ul.plain li { margin: 0.3em 0; } dl.terms dt { font-weight: 600; } dl.terms dd { margin: 0 0 0.4em 1.2em; }
"""


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _cell(value: str) -> str:
    try:
        x = float(value)
    except ValueError:
        return f'<td class="text">{_esc(value)}</td>'
    if value.strip().lstrip("-").isdigit():
        return f"<td>{_esc(value)}</td>"
    return f"<td>{_esc(_fmt(x, 3))}</td>"


def _own(folder: Path, name: str) -> bytes | str:
    """The bytes of a file the analysis names, or why it is not read (see
    :func:`attncoda._atomic.read_own_file`: only unchanged files attncoda wrote there)."""
    from ._atomic import read_own_file
    from ._errors import ForeignFileError

    try:
        return read_own_file(folder, name)
    except ForeignFileError as exc:
        return str(exc)


def _href(name: str) -> str:
    """A link to a file of the folder, percent-encoded (a ``:`` too: never a URL scheme)."""
    from urllib.parse import quote

    return quote(name, safe="/")


def _linkable(folder: Path, name: str) -> bool:
    """Whether the page may link to ``name``: a plain relative name of a regular file in the
    folder, not a symlink (a link is not a read, but it must not lead out of the folder)."""
    from ._atomic import _name_problem

    if _name_problem(name) is not None:
        return False
    here = folder
    for part in name.split("/"):
        here = here / part
        if here.is_symlink():
            return False
    return here.is_file()


def _not_shown(what: str, name: str, reason: str) -> str:
    return f'<p class="muted">{what} {_esc(name[:200])} is not shown: {_esc(reason[:400])}</p>'


def _table_html(folder: Path, ref: TableRef) -> str:
    data_bytes = _own(folder, ref.file)
    if isinstance(data_bytes, str):
        return _not_shown("table", ref.file, data_bytes)
    try:
        data = list(csv.reader(data_bytes.decode("utf-8").splitlines()))
    except (UnicodeDecodeError, csv.Error) as exc:
        return _not_shown("table", ref.file, f"it cannot be read as CSV ({exc})")
    if not data:
        return ""
    header, body = data[0], data[1:]
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)

    def table(rows: list[list[str]]) -> str:
        trs = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>"

    caption = (
        f'<p class="muted">{_esc(ref.caption)} (<a href="{_esc(_href(ref.file))}">'
        f"{_esc(ref.file)}</a>, {len(body)} rows)</p>"
    )
    if ref.max_rows and len(body) <= ref.max_rows:
        return caption + table(body)
    return (
        caption
        + f"<details><summary>show the table ({len(body)} rows)</summary>{table(body)}</details>"
    )


def _inline_svg(folder: Path, name: str) -> str:
    """An SVG file of the folder as an element of the page, rebuilt by :func:`safe_svg` from
    attncoda's own vocabulary (HTML gives it its namespace); or why it is not shown."""
    data = _own(folder, name)
    if isinstance(data, str):
        return _not_shown("figure", name, data)
    try:
        svg = vw.safe_svg(data.decode("utf-8"))
    except (UnicodeDecodeError, AttributeError, ValueError) as exc:
        return _not_shown("figure", name, str(exc))
    return svg


#: a head's cell in a view attncoda drew: its rect and a title that starts "layer L, head H"
_HEAD_CELL = re.compile(
    r'(<rect class="acf-c"[^<>]*>)<title>(layer (-?\d+), head (-?\d+)\b[^<]*)</title></rect>'
)


def _link_heads(svg: str) -> str:
    """Each head's cell of a view (already rebuilt by :func:`safe_svg`) as a link to the same
    head in the explorer beside the report (``explorer.html#layer=L&head=H``, read by its
    page); the links are ours, made of two integers, and nothing else of the SVG changes."""
    return _HEAD_CELL.sub(
        lambda m: (
            f'<a href="explorer.html#layer={int(m.group(3))}&amp;head={int(m.group(4))}">'
            f"{m.group(1)}<title>{m.group(2)} (click: open it in the explorer)</title></rect></a>"
        ),
        svg,
    )


def _figure_html(folder: Path, ref: FigureRef, explorer: bool = False) -> str:
    links = " ".join(
        f'<a href="{_esc(_href(f"{ref.stem}.{ext}"))}">{ext.upper()}</a>'
        for ext in ("png", "svg")
        if _linkable(folder, f"{ref.stem}.{ext}")
    )
    if ref.view:
        if links:
            links = "static: " + links
        svg = _inline_svg(folder, ref.view)
        linked = explorer and _HEAD_CELL.search(svg) is not None
        if linked:
            svg = _link_heads(svg)
        return (
            f'<figure id="fig-{_esc(ref.stem)}" class="view"><div class="scroll">'
            f"{svg}</div><figcaption>{_esc(ref.caption)}; hover for values"
            f"{'; click a head to open it in the explorer' if linked else ''}"
            f"{f' ({links})' if links else ''}</figcaption></figure>"
        )
    png = _own(folder, f"{ref.stem}.png")
    if isinstance(png, str):
        return _not_shown("figure", ref.stem, png)
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        return _not_shown("figure", ref.stem, "it is not a PNG image")
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="fig-{_esc(ref.stem)}"><img class="figure" alt="{_esc(ref.caption)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{_esc(ref.caption)} ({links})'
        "</figcaption></figure>"
    )


_TERMS = (
    (
        "sink share s",
        "the attention a row puts on its sink, the first visible token; the rest, 1 - s, is "
        "the content, spread over the other tokens",
    ),
    ("kept", "compare rows with the sink in them, as they come out of the model"),
    ("dropped", "remove the sink and renormalise the rest to sum to 1: compare content only"),
    ("split", "report the two channels side by side: the sink share and the content"),
)


def _plain_words(analysis: Analysis) -> str:
    """What the analysis found, as sentences built from its key numbers, and the terms."""
    num = analysis.numbers

    def has(*keys: str) -> bool:
        return all(
            isinstance(num.get(k), (int, float)) and not isinstance(num.get(k), bool) for k in keys
        )

    def number(key: str, default: float) -> float:
        return float(num[key]) if has(key) else default

    said = []
    if has("heavy_heads", "n_layers", "n_heads", "sink_rate"):
        total = int(num["n_layers"]) * int(num["n_heads"])
        said.append(
            f"{num['heavy_heads']} of the {total} heads ({_pct(num['sink_rate'])}) put more than "
            f"{number('sink_rate_threshold', 0.3):g} of their attention on the sink on average; "
            f"across all heads the mean sink share is {_pct(number('mean_sink_share', math.nan))}."
        )
    if isinstance(num.get("sink_tokens"), list) and num["sink_tokens"]:
        toks = ", ".join(_quoted(t) for t in num["sink_tokens"][:6])
        said.append(
            f"The sink, the first visible token of each sample, is {toks}"
            + (" (one of these per sample)." if len(num["sink_tokens"]) > 1 else ".")
        )
    if has("mean_entropy", "mean_sink_channel_entropy", "mean_content_channel_entropy"):
        said.append(
            f"A row's entropy averages {num['mean_entropy']:.2f} nats: "
            f"{num['mean_sink_channel_entropy']:.2f} from how much goes to the sink and "
            f"{num['mean_content_channel_entropy']:.2f} from how the rest is spread (exactly)."
        )
    if has("entropy_change_first_to_last", "entropy_change_sink_part"):
        said.append(
            f"From the first layer to the last, entropy changes by "
            f"{num['entropy_change_first_to_last']:+.2f} nats, "
            f"{num['entropy_change_sink_part']:+.2f} of it from the sink share alone."
        )
    if has("flip_rate_kept_dropped_js"):
        said.append(
            "Whether the sink is kept or dropped changes the answer to 'is head B closer to "
            f"head A than head C?' in {_pct(num['flip_rate_kept_dropped_js'])} of comparisons "
            "(Jensen-Shannon; other metrics below): kept and dropped measure different things."
        )
    if has("clustering_ari_k2", "mds1_sink_rho_kept", "mds1_sink_rho_dropped"):
        said.append(
            "Grouping heads by their rows gives other groups without the sink than with it: "
            f"adjusted Rand index (ARI; 1 = the same groups, 0 = as alike as chance) "
            f"{_fmt(num['clustering_ari_k2'], 2)}. With the sink kept, the main axis along "
            "which heads differ follows the sink share: |Spearman rho| (rank correlation, 1 = "
            f"the same order) {num['mds1_sink_rho_kept']:.2f} kept, "
            f"{num['mds1_sink_rho_dropped']:.2f} dropped."
        )
    items = "".join(f"<li>{_esc(t)}</li>" for t in said)
    terms = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in _TERMS)
    return f'<ul class="plain">{items}</ul><dl class="terms">{terms}</dl>'


def render_html(analysis: Analysis, folder: str | os.PathLike[str]) -> str:
    """The report page of ``analysis`` as one HTML string (figures read from ``folder``).

    The page loads nothing: figures are ``data:`` URIs or inline SVG (tooltips are SVG
    ``<title>`` elements, no script), the stylesheet is inline, and a Content-Security-Policy
    meta tag forbids every other source.

    ``analysis`` and the folder are untrusted input: every text is escaped; a file is read
    only if attncoda wrote it into ``folder`` and it is unchanged (named by a plain relative
    path, no symlink, listed with its sha256 in the folder's stamp:
    :func:`attncoda._atomic.read_own_file`); SVG views are rebuilt from attncoda's own
    vocabulary (:func:`attncoda.safe_svg`), never pasted; links are relative. What does not
    pass is replaced by a line saying why.
    """
    root = Path(folder)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f'<meta name="generator" content="{_GENERATOR} {_esc(_version())}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(analysis.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_esc(analysis.title)}</h1>",
        '<p class="muted">Attention rows as compositional data: how much attention goes to the '
        "sink, and how the rest is spread over content, answered separately.</p>",
        "<h2>In plain words</h2>",
        _plain_words(analysis),
        "<details><summary>the summary as the command printed it</summary>"
        '<pre class="summary">' + _esc("\n".join(analysis.summary)) + "</pre></details>",
    ]
    toc = "".join(
        f'<li><a href="#sec-{i}">{_esc(s.heading)}</a></li>'
        for i, s in enumerate(analysis.sections)
    )
    parts.append(f"<ol>{toc}</ol>")
    if "explorer.html" in analysis.files:  # attncoda demo writes the explorer beside the report
        parts.append(
            '<p><a href="explorer.html">Open the attention explorer</a>: every captured head '
            "of the rows, one large with its tokens, the kept / dropped / split conventions as "
            "a switch (a page of its own, beside this one).</p>"
        )
    for i, sec in enumerate(analysis.sections):
        parts.append(f'<section id="sec-{i}"><h2>{_esc(sec.heading)}</h2>')
        parts += [f"<p>{_esc(t)}</p>" for t in sec.text]
        parts += [_figure_html(root, f, "explorer.html" in analysis.files) for f in sec.figures]
        parts += [_table_html(root, t) for t in sec.tables]
        parts.append("</section>")
    meta_rows = "".join(
        f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>"
        for k, v in analysis.meta.items()
        if v not in ("", None)
    )
    parts.append(f'<h2>Provenance</h2><table class="meta">{meta_rows}</table>')
    files = "".join(
        f'<li><a href="{_esc(_href(f))}">{_esc(f)}</a></li>'
        for f in analysis.files
        if f != REPORT and _linkable(root, f)
    )
    parts.append(f'<h2>Files in this folder</h2><ul class="files">{files}</ul>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    folder: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Render the analysis folder ``folder`` into a self-contained HTML page.

    Parameters
    ----------
    folder : path
        A folder written by :func:`analyze` (``attncoda analyze`` / ``attncoda demo``).
    out : path, optional
        The HTML file; default ``folder/report.html``.
    overwrite : bool, default False
        Replace an existing report: only a whole page attncoda rendered (its last line signs
        its content: :func:`attncoda._atomic.file_is_ours`).

    Returns
    -------
    pathlib.Path
        The page written (atomically).
    """
    from ._atomic import STAMP, record_files, write_signed_text

    analysis = load_analysis(folder)
    inside = out is None or Path(out).expanduser().resolve().parent == Path(folder).resolve()
    target = Path(out).expanduser() if out is not None else Path(folder) / REPORT
    check_report(target, overwrite=overwrite)
    page = render_html(analysis, folder)
    write_signed_text(target, page, overwrite=overwrite, what="report")
    if inside and (Path(folder) / STAMP).is_file():
        record_files(Path(folder), "analysis", [target.name])
    return target


def check_report(out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Refuse, before any work, a report file that :func:`write_report` would refuse."""
    from ._atomic import check_output, file_is_ours

    return check_output(out, overwrite=overwrite, is_ours=file_is_ours, what="report")


def print_summary(analysis: Analysis, write: Callable[[str], Any] = print) -> None:
    """Print the terminal summary lines of an analysis."""
    for line in analysis.summary:
        write(line)
