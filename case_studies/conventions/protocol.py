"""The measuring half of the conventions study: windows of real text through real models, stored
as resumable cells.

A *cell* is one ``(model, sink, text, block of windows)``: the per-window head comparisons
(:func:`attncoda.head_comparisons` with ``per_sample=True``, all six metrics) and the per-window
entropy attribution across depth (consecutive layers and first -> last layer), written as one
netCDF file with :func:`attncoda.atomic_output`, so an interrupted run leaves finished cells
whole and no partial file; a rerun skips every cell whose file exists. The two-segment MiniLM
pipeline has its own cells (``pairs``), one per block of ``[CLS] A [SEP] B [SEP]`` pairs and sink
choice (see :mod:`.sinks`).
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import attncoda as ac
from attncoda.hooks import assets

from .._study import git_state, time_is_up
from .sinks import comparisons_by_row_sink, head_argmax_share, row_argmax_sinks, segment_sep_sinks

#: Smallest first: the order the full run measures them in.
MODELS = ("minilm-l6", "smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: Text name -> (corpus asset, document).
TEXTS = {
    "emma": ("austen", "emma"),
    "mobydick": ("mobydick", None),
    "wikipedia": ("wikipedia", None),
    "web": ("web", None),
}
#: The pair pipeline's stored sink choices (``head-argmax`` is derived from ``row-argmax`` cells).
PAIR_CELL_SINKS = ("cls", "own-sep", "row-argmax")


@dataclass(frozen=True)
class Size:
    """How much each cell and the whole protocol measure."""

    windows: int  # per text
    length: int  # tokens per window, special tokens included
    block: int  # windows per cell (one batched forward)
    pairs: int  # two-segment MiniLM pairs
    pair_length: int  # tokens per pair, special tokens included
    pair_block: int
    pair_run: int  # consecutive pairs per bootstrap unit (they continue one another)
    n_boot: int  # bootstrap replicates of flip rates and entropy fractions
    n_boot_cluster: int  # bootstrap replicates of the clustering statistics


FULL = Size(
    windows=24,
    length=128,
    block=8,
    pairs=512,
    pair_length=128,
    pair_block=32,
    pair_run=8,
    n_boot=200,
    n_boot_cluster=50,
)
QUICK = Size(
    windows=2,
    length=32,
    block=2,
    pairs=4,
    pair_length=32,
    pair_block=4,
    pair_run=1,
    n_boot=20,
    n_boot_cluster=5,
)


def log(msg: str) -> None:
    print(f"[conventions] {msg}", file=sys.stderr, flush=True)


def registered_texts() -> list[str]:
    """The study's texts whose corpus is a registered asset (the World English Bible is not yet)."""
    names = {a.name for a in assets.list_assets("corpus")}
    return [t for t, (asset, _) in TEXTS.items() if asset in names]


def sink_keys(model: str) -> tuple[str, ...]:
    """The single-segment sinks analysed for ``model``: the first token, and for MiniLM also the
    closing ``[SEP]`` (where Clark et al. found much of BERT's attention)."""
    return ("first", "[SEP]") if model == "minilm-l6" else ("first",)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "", text.lower()) or "x"


# ------------------------------------------------------------------------------------ data


def corpus_text(text: str) -> str:
    asset, document = TEXTS[text]
    return "\n\n".join(assets.paragraphs(assets.load_text(asset, document), min_words=40))


def windows(tokenizer: Any, text: str, n: int, length: int) -> Any:
    """``n`` consecutive windows of ``length`` tokens, each with the model's special tokens."""
    import torch  # heavy, optional: only when measuring

    probe = "Emma Woodhouse"
    raw_probe = tokenizer(probe, add_special_tokens=False).input_ids
    full_probe = tokenizer(probe).input_ids
    start = next(
        i for i in range(len(full_probe)) if full_probe[i : i + len(raw_probe)] == raw_probe
    )
    prefix, suffix = full_probe[:start], full_probe[start + len(raw_probe) :]
    body = length - len(prefix) - len(suffix)
    ids = tokenizer(text[: 40 * n * length], add_special_tokens=False).input_ids
    if len(ids) < n * body:
        raise ac.InputError(f"not enough text for {n} windows of {length} tokens")
    rows = [prefix + ids[i * body : (i + 1) * body] + suffix for i in range(n)]
    return torch.tensor(rows, dtype=torch.long)


def segment_pairs(tokenizer: Any, text: str, n: int, length: int) -> dict[str, Any]:
    """``n`` pairs of consecutive text segments as BERT pair inputs ``[CLS] A [SEP] B [SEP]``.

    The token stream is cut into consecutive segments of ``(length - 3) // 2`` and the rest
    tokens (A then B, then the next pair's A...), so every pair has exactly ``length`` tokens and
    B continues A; segments are cut at token boundaries, not sentence ends.
    """
    import torch  # heavy, optional: only when measuring

    a_len = (length - 3) // 2 + (length - 3) % 2
    b_len = (length - 3) // 2
    ids = tokenizer(text[: 40 * n * length], add_special_tokens=False).input_ids
    if len(ids) < n * (a_len + b_len):
        raise ac.InputError(f"not enough text for {n} pairs of {length} tokens")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    rows, types = [], []
    for i in range(n):
        a = ids[i * (a_len + b_len) : i * (a_len + b_len) + a_len]
        b = ids[i * (a_len + b_len) + a_len : (i + 1) * (a_len + b_len)]
        rows.append([cls, *a, sep, *b, sep])
        types.append([0] * (a_len + 2) + [1] * (b_len + 1))
    return {
        "input_ids": torch.tensor(rows, dtype=torch.long),
        "token_type_ids": torch.tensor(types, dtype=torch.long),
    }


# ------------------------------------------------------------------------------------ cells


def cell_path(cells: Path, model: str, sink: str, text: str, length: int, block: int) -> Path:
    return cells / model / f"{text}-{slug(sink)}-L{length}-b{block:03d}.nc"


def _clean_attrs(ds: xr.Dataset) -> xr.Dataset:
    for var in ds.variables.values():
        var.attrs = {k: v for k, v in var.attrs.items() if isinstance(v, (str, int, float))}
    return ds


def write_cell(path: Path, ds: xr.Dataset) -> None:
    """Write one cell crash-safely (a staging file swapped in when complete)."""
    with ac.atomic_output(path, what="conventions cell") as tmp:
        _clean_attrs(ds).to_netcdf(tmp, engine="h5netcdf")


def read_cell(path: Path) -> xr.Dataset:
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def window_attribution(ds: xr.Dataset, sink: Any) -> xr.Dataset:
    """Per-window entropy attribution across depth: consecutive layers and first -> last."""
    cons = ac.attribute_entropy(ds, along="layer", dims=("query",), sink=sink)
    ends = ac.attribute_entropy(ds.isel(layer=[0, -1]), along="layer", dims=("query",), sink=sink)
    out = {}
    for prefix, att in (("att", cons), ("ends", ends)):
        att = att.rename(transition=f"{prefix}_transition")
        for v in ("sink", "content", "total", "entropy_a", "entropy_b", "n_rows"):
            out[f"{prefix}_{v}"] = att[v]
    return xr.Dataset(out)


def _relabel(ds: xr.Dataset, text: str, first: int) -> xr.Dataset:
    n = ds.sizes["sample"]
    labels = [f"{text}/{first + i}" for i in range(n)]
    return ds.assign_coords(sample=labels, text=("sample", [text] * n))


def _cell_attrs(**kw: Any) -> dict[str, Any]:
    """The cell's own attrs plus the code state that measured it: the commit and whether the
    tree held changes to tracked files (``dirty`` 0/1; netCDF attrs hold no booleans), so the
    manifest can say exactly which cells came from a modified tree."""
    state = git_state()
    return {**kw, "commit": state["commit"], "dirty": int(state["dirty"])}


def _out_of_time(started: float, time_limit_s: float | None, what: str) -> bool:
    if not time_is_up(started, time_limit_s):
        return False
    log(f"{what}: time limit reached; the same command continues from here")
    return True


def measure_texts(
    model: str,
    texts: Sequence[str],
    size: Size,
    cells: Path,
    *,
    stop_after: int | None = None,
    time_limit_s: float | None = None,
    corpus: Callable[[str], str] | None = None,
) -> int:
    """Compute every missing single-segment cell of ``model``; return how many were written.

    ``stop_after`` stops after that many new cells (to test resuming); ``time_limit_s`` starts
    no new block of windows once that many seconds have passed (the block under way finishes),
    to split a long run over sessions; ``corpus`` maps a text name to its text (default: the
    registered corpus asset).
    """
    import torch  # heavy, optional: only when measuring

    from attncoda.hooks import capture, zoo  # imports torch: only when used

    todo = [
        (text, b, sink)
        for text in texts
        for b in range(-(-size.windows // size.block))
        for sink in sink_keys(model)
        if not cell_path(cells, model, sink, text, size.length, b).exists()
    ]
    if not todo:
        log(f"{model}: all {len(texts)} texts done")
        return 0
    started = time.perf_counter()
    read = corpus or corpus_text
    model_obj, tokenizer = zoo.load(model)
    # a cell needs the attention rows, not the logits: the output head computes the last
    # position's only (Gemma-3's head of 262k tokens costs as much as its layers on 32 tokens)
    no_logits = (
        {"logits_to_keep": 1}
        if "logits_to_keep" in inspect.signature(model_obj.forward).parameters
        else {}
    )
    written = 0
    ids_by_text: dict[str, Any] = {}
    for text, _b, _ in todo:
        if text not in ids_by_text:
            ids_by_text[text] = windows(tokenizer, read(text), size.windows, size.length)
    for text, b in dict.fromkeys((t, b) for t, b, _ in todo):
        if _out_of_time(started, time_limit_s, model):
            return written
        lo, hi = b * size.block, min(size.windows, (b + 1) * size.block)
        ids = ids_by_text[text][lo:hi]
        start = time.perf_counter()
        # exact_outputs: every layer runs the model's own kernel, so the study measures the
        # model as deployed, and its committed cells reproduce bit for bit
        with torch.no_grad(), capture(model_obj, what="rows", exact_outputs=True) as cap:
            model_obj(input_ids=ids, attention_mask=torch.ones_like(ids), **no_logits)
        rows = cap.dataset
        capture_s = time.perf_counter() - start
        for sink in sink_keys(model):
            path = cell_path(cells, model, sink, text, size.length, b)
            if path.exists():
                continue
            t0 = time.perf_counter()
            pos = None if sink == "first" else size.length - 1
            cmp = ac.head_comparisons(rows, ac.METRICS, per_sample=True, sink=pos)
            cell = xr.merge([cmp.astype(np.float32), window_attribution(rows, pos)])
            cell = _relabel(cell, text, lo)
            cell.attrs = _cell_attrs(
                attncoda_kind=cmp.attrs["attncoda_kind"],
                kind="conventions-cell",
                model=model,
                sink_key=sink,
                text=text,
                block=b,
                windows=hi - lo,
                length=size.length,
                tokens_sha256=_tokens_sha(ids),
                capture_s=round(capture_s, 2),
                analysis_s=round(time.perf_counter() - t0, 2),
            )
            write_cell(path, cell)
            written += 1
            log(
                f"{model} {sink} {text} block {b}: {hi - lo} windows, capture {capture_s:.1f} s, "
                f"analysis {time.perf_counter() - t0:.1f} s"
            )
            if stop_after is not None and written >= stop_after:
                return written
        del rows
    return written


def _tokens_sha(ids: Any) -> str:
    from attncoda.hooks.evaluate import tokens_sha256  # imports torch

    return str(tokens_sha256(ids))


def measure_pairs(
    size: Size,
    cells: Path,
    *,
    stop_after: int | None = None,
    time_limit_s: float | None = None,
) -> int:
    """Compute every missing cell of the two-segment MiniLM pipeline; return how many
    (``stop_after``, ``time_limit_s``: as in :func:`measure_texts`)."""
    import torch  # heavy, optional: only when measuring

    from attncoda.hooks import capture, zoo  # imports torch: only when used

    model = "minilm-l6"
    n_blocks = -(-size.pairs // size.pair_block)
    todo = [
        (b, s)
        for b in range(n_blocks)
        for s in PAIR_CELL_SINKS
        if not cell_path(cells, model, s, "pairs", size.pair_length, b).exists()
    ]
    if not todo:
        log("minilm-l6 pairs: all done")
        return 0
    started = time.perf_counter()
    model_obj, tokenizer = zoo.load(model)
    enc = segment_pairs(tokenizer, corpus_text("wikipedia"), size.pairs, size.pair_length)
    written = 0
    for b in dict.fromkeys(b for b, _ in todo):
        if _out_of_time(started, time_limit_s, "minilm-l6 pairs"):
            return written
        lo, hi = b * size.pair_block, min(size.pairs, (b + 1) * size.pair_block)
        ids, types = enc["input_ids"][lo:hi], enc["token_type_ids"][lo:hi]
        start = time.perf_counter()
        with torch.no_grad(), capture(model_obj, what="rows", exact_outputs=True) as cap:
            model_obj(input_ids=ids, token_type_ids=types, attention_mask=torch.ones_like(ids))
        rows = cap.dataset
        capture_s = time.perf_counter() - start
        for choice in PAIR_CELL_SINKS:
            path = cell_path(cells, model, choice, "pairs", size.pair_length, b)
            if path.exists():
                continue
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if choice == "cls":
                cmp = ac.head_comparisons(rows, ac.METRICS, per_sample=True, sink=0)
            else:
                if choice == "own-sep":
                    row_sink = segment_sep_sinks(types.numpy(), ids.numpy(), tokenizer.sep_token_id)
                else:
                    row_sink = row_argmax_sinks(rows)
                    extra["head_argmax_share"] = head_argmax_share(rows).astype(np.float32)
                    keys = ids.numpy()[np.arange(len(ids))[:, None], row_sink]
                    extra["row_sink_token"] = xr.DataArray(keys, dims=("sample", "query"))
                    extra["row_sink_key"] = xr.DataArray(row_sink, dims=("sample", "query"))
                cmp = comparisons_by_row_sink(rows, row_sink, ac.METRICS)
            cell = cmp.astype(np.float32)
            for name, var in extra.items():
                cell[name] = var.assign_coords(sample=cell["sample"].values)
            cell = _relabel(cell, "pairs", lo)
            cell.attrs = _cell_attrs(
                attncoda_kind=cmp.attrs["attncoda_kind"],
                kind="conventions-pairs-cell",
                model=model,
                sink_key=choice,
                text="wikipedia-pairs",
                block=b,
                windows=hi - lo,
                length=size.pair_length,
                tokens_sha256=_tokens_sha(ids),
                token_types_sha256=_tokens_sha(types),
                capture_s=round(capture_s, 2),
                analysis_s=round(time.perf_counter() - t0, 2),
            )
            write_cell(path, cell)
            written += 1
            log(
                f"minilm-l6 pairs {choice} block {b}: {hi - lo} pairs, capture {capture_s:.1f} s, "
                f"analysis {time.perf_counter() - t0:.1f} s"
            )
            if stop_after is not None and written >= stop_after:
                return written
        del rows
    return written


def load_cells(
    cells: Path, model: str, sink: str, texts: Sequence[str], length: int, n_blocks: int
) -> tuple[xr.Dataset | None, list[dict[str, Any]]]:
    """All cells of ``(model, sink)`` over ``texts`` concatenated along ``sample`` (None if any is
    missing), and each present cell's attrs."""
    parts, meta, missing = [], [], False
    for text in texts:
        for b in range(n_blocks):
            path = cell_path(cells, model, sink, text, length, b)
            if not path.exists():
                missing = True
                continue
            ds = read_cell(path)
            meta.append({**ds.attrs, "file": path.name})
            parts.append(ds)
    if missing or not parts:
        return None, meta
    out = xr.concat(parts, dim="sample", combine_attrs="drop")
    # the core recognises its comparison datasets by this tag (kept in every cell)
    out.attrs = {"attncoda_kind": parts[0].attrs["attncoda_kind"]}
    return out, meta


# ------------------------------------------------------------------------------------ text cells


def text_cells_path(folder: Path, model: str, sink: str) -> Path:
    """Where the committed per-text cells of one ``(model, sink)`` live (``results/cells/``)."""
    return folder / f"{model}-{slug(sink)}.nc"


def write_text_cells(path: Path, ds: xr.Dataset) -> None:
    """Write the per-text cells of :func:`.evidence.text_cells` crash-safely, replacing an older
    file: the head-vs-head matrices have a zero diagonal and are symmetric, so only their upper
    triangle is stored, compressed (the lower one too where rounding made them differ: lossless
    either way, in float32 as the window cells)."""
    n = ds.sizes["unit_a"]
    iu = np.triu_indices(n, 1)
    out = ds.drop_vars([v for v in ds.data_vars if "unit_b" in ds[v].dims])
    out = out.drop_dims("unit_b").rename(unit_a="unit")
    out = out.rename({c: c.replace("_a", "") for c in ("layer_a", "head_a") if c in out.coords})
    for name, var in ds.data_vars.items():
        if "unit_b" not in var.dims:
            continue
        lead = [d for d in var.dims if d not in ("unit_a", "unit_b")]
        full = var.transpose(*lead, "unit_a", "unit_b").values.astype(np.float32)
        out[name] = ((*lead, "pair"), full[..., iu[0], iu[1]], var.attrs)
        lower = full[..., iu[1], iu[0]]
        if not np.array_equal(lower, full[..., iu[0], iu[1]]):  # not exactly symmetric
            out[f"{name}_lower"] = ((*lead, "pair"), lower)
    out.attrs = {k: v for k, v in ds.attrs.items() if isinstance(v, (str, int, float))}
    enc = {v: {"zlib": True, "complevel": 6, "shuffle": True} for v in out.data_vars}
    with ac.atomic_output(
        path, overwrite=True, is_ours=lambda _p: None, what="conventions text cells"
    ) as tmp:
        _clean_attrs(out).to_netcdf(tmp, engine="h5netcdf", encoding=enc)


def read_text_cells(path: Path) -> xr.Dataset:
    """The per-text cells written by :func:`write_text_cells`, with full ``(unit_a, unit_b)``
    matrices again: a comparisons dataset the core reads (one ``sample`` per text)."""
    with xr.open_dataset(path, engine="h5netcdf") as raw:
        ds = raw.load()
    n = ds.sizes["unit"]
    iu = np.triu_indices(n, 1)
    units = ds["unit"].values
    coords: dict[str, Any] = {"unit_a": units, "unit_b": units}
    for side in ("a", "b"):
        for c in ("layer", "head"):
            coords[f"{c}_{side}"] = (f"unit_{side}", ds[c].values)
    out = xr.Dataset(coords={k: v for k, v in ds.coords.items() if "unit" not in ds[k].dims})
    out = out.assign_coords(coords)
    for name, var in ds.data_vars.items():
        if name.endswith("_lower"):
            continue
        if "pair" in var.dims:
            lead = [d for d in var.dims if d != "pair"]
            full = np.zeros((*var.shape[:-1], n, n), np.float32)
            full[..., iu[0], iu[1]] = var.values
            lower = ds[f"{name}_lower"] if f"{name}_lower" in ds else var
            full[..., iu[1], iu[0]] = lower.transpose(*var.dims).values
            out[name] = ((*lead, "unit_a", "unit_b"), full, var.attrs)
        else:
            dims = tuple("unit_a" if d == "unit" else d for d in var.dims)
            out[name] = (dims, var.values, var.attrs)
    out.attrs = dict(ds.attrs)
    return out


def cells_json(meta: list[dict[str, Any]]) -> str:
    return json.dumps(meta, default=str)
