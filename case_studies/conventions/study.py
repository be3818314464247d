"""The conventions study: verdict flips, head clustering and entropy attribution under the
``kept`` / ``dropped`` / ``split`` sink conventions, on five real models over four texts, and the
paper's BERT pipeline on two-segment MiniLM inputs under three sink choices.

``run`` measures every missing cell (:mod:`.protocol`: one ``(model, sink, text, block of
windows)`` per file, written crash-safely, skipped when present, so a long run can be stopped
and continued), then builds every table from the complete cells (:mod:`.evidence`), writes them
with figures into ``--out`` and renders the claim table (paper vs ours, 95% interval, sample,
verdict) into the README. A model whose cells are incomplete is reported as pending.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

import attncoda as ac
from attncoda.hooks import assets

from .._study import (
    ROOT,
    Golden,
    Provenance,
    Study,
    add_time_limit,
    fixed,
    markdown_table,
    read_manifest,
    scientific,
)
from .._study import main as study_main
from . import evidence as ev
from .protocol import (
    FULL,
    MODELS,
    PAIR_CELL_SINKS,
    QUICK,
    TEXTS,
    Size,
    load_cells,
    log,
    measure_pairs,
    measure_texts,
    read_text_cells,
    registered_texts,
    sink_keys,
    slug,
    text_cells_path,
    write_text_cells,
)
from .sinks import PAIR_SINK_LABELS, PAIR_SINKS, merge_samples

RESULTS = Path(__file__).resolve().parent / "results"
#: The quick mode's models: the encoder (two sinks, the pair pipeline) and a decoder, so that
#: both kinds of cell and the tables across models run (Gemma-3 left it in December 2026, for
#: CI's time: it ran the decoder's path a second time).
QUICK_MODELS = ("minilm-l6", "smollm2-135m")
NAMES = {
    "minilm-l6": "MiniLM-L6",
    "smollm2-135m": "SmolLM2-135M",
    "gemma3-270m": "Gemma-3-270M",
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B",
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B",
}
SINK_NAMES = {"first": "first token", "[SEP]": "`[SEP]`"}


def default_cells() -> Path:
    """Where the full run keeps its cells: beside the offline assets (they are large)."""
    return assets.default_cache_dir() / "studies" / "conventions" / "cells"


def _n_blocks(n: int, block: int) -> int:
    return -(-n // block)


# ------------------------------------------------------------------------------------ analysis


def analyse(
    models: Sequence[str], texts: Sequence[str], size: Size, cells: Path, out: Path, prov: Any
) -> dict[str, pd.DataFrame]:
    """Build every table from the complete cells; figures into ``out/figures``."""
    frames: dict[str, list[pd.DataFrame]] = {
        k: []
        for k in (
            "flip_rates",
            "clustering_agreement",
            "clustering_structure",
            "clustering_artifact",
            "entropy_fraction",
            "entropy_attribution",
            "summary",
            "cells",
            "pairs",
            "pairs_sink_tokens",
        )
    }
    boots: dict[str, np.ndarray] = {}
    n_blocks = _n_blocks(size.windows, size.block)
    flip_figs: dict[str, xr.Dataset] = {}
    for model in models:
        for sink in sink_keys(model):
            key = {"model": model, "sink_key": sink}
            cmp, meta = load_cells(cells, model, sink, texts, size.length, n_blocks)
            needed = len(texts) * n_blocks
            frames["cells"].append(pd.DataFrame(meta).assign(needed=needed))
            if cmp is None:
                log(f"{model} {sink}: {len(meta)} of {needed} cells; pending")
                frames["summary"].append(
                    pd.DataFrame(
                        [{**key, "status": "pending", "cells": len(meta), "needed": needed}]
                    )
                )
                continue
            _record(prov, model, texts, meta)
            got, b = _cached(
                cells
                / model
                / "tables"
                / f"{slug(sink)}-{_fingerprint(cells, meta, size, MODEL_FIELDS, _model_tables)}",
                out,
                lambda folder, cmp=cmp, key=key, meta=meta, needed=needed: _model_tables(
                    cmp, key, meta, needed, size, folder
                ),
            )
            for name, df in got.items():
                frames[name].append(df)
            boots.update({f"{model}|{sink}|{k}": v for k, v in b.items()})
            if sink == "first":  # the per-text cells the claim table reads, from these cells
                write_text_cells(
                    text_cells_path(out / "cells", model, "first"),
                    ev.text_cells(cmp, {"model": model, "sink_key": "first", **_cells_state(meta)}),
                )
            fl = got["flip_rates"]
            fl = fl[fl.text == "all"].set_index(["metric", "pair", "scope"])
            flip_figs[f"{NAMES[model]} ({SINK_NAMES[sink]})"] = xr.Dataset.from_dataframe(
                fl[["flip_rate", "ci_low", "ci_high"]]
            )
    if "minilm-l6" in models:
        _pairs(size, cells, frames, prov)
    if flip_figs:
        ac.save_figure(
            ac.plot_flip_table(
                flip_figs, pair="kept/dropped", scope="all", title="verdict flips, kept vs dropped"
            ),
            out / "figures" / "flip_rates_models",
        )
    tables = {k: pd.concat(v, ignore_index=True) for k, v in frames.items() if v}
    tables["claim_evidence"] = claim_evidence(out, models)
    tables["claims"] = claims(tables, tables["claim_evidence"], models, texts, size)
    return tables


def _cells_state(meta: list[dict[str, Any]]) -> dict[str, str]:
    """Which commits measured a set of cells and whether their trees held changes (cells from
    before cells recorded it say ``unrecorded``), as attrs of the per-text cells."""
    states = sorted(
        {f"{str(m['commit'])[:12]} ({_tree(m.get('dirty'))})" for m in meta if m.get("commit")}
    )
    return {"measured_at": "; ".join(states)}


def _tree(dirty: Any) -> str:
    if dirty is None or (isinstance(dirty, float) and np.isnan(dirty)):
        return "tree state unrecorded"
    return "modified tree" if int(dirty) else "clean tree"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def claim_evidence(results: Path, models: Sequence[str]) -> pd.DataFrame:
    """The claim statistics of every model whose per-text cells are in ``results/cells/``
    (:func:`.evidence.claim_evidence`), and the across-scale difference where both Qwen models'
    are; each row records the sha256 of the cell file(s) it was computed from."""
    parts = []
    read: dict[str, xr.Dataset] = {}
    shas: dict[str, str] = {}
    for model in models:
        path = text_cells_path(results / "cells", model, "first")
        if not path.is_file():
            continue
        read[model] = read_text_cells(path)
        shas[model] = file_sha256(path)
        key = {"model": model, "sink_key": "first"}
        parts.append(ev.claim_evidence(read[model], key).assign(cells_sha256=shas[model]))
    small, large = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
    if small in read and large in read:
        key = {"model": f"{small} vs {large}", "sink_key": "first"}
        parts.append(
            ev.scale_evidence(read[small], read[large], key).assign(
                cells_sha256=f"{shas[small]} {shas[large]}"
            )
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def stale_evidence(results: Path) -> list[str]:
    """The committed per-text cell files whose sha256 differs from the one ``claim_evidence.csv``
    was computed from (or that it does not cover): the claim table must be rebuilt from them."""
    folder = results / "cells"
    files = sorted(folder.glob("*.nc")) if folder.is_dir() else []
    ev_csv = _frame(results, "claim_evidence")
    known = set()
    if len(ev_csv) and "cells_sha256" in ev_csv:
        for v in ev_csv.cells_sha256.dropna():
            known.update(str(v).split())
    return [f.name for f in files if file_sha256(f) not in known]


def rebuild_claims(results: Path) -> dict[str, pd.DataFrame]:
    """The claim evidence and claim table recomputed from ``results/`` alone: the committed
    per-text cells and the window tables (no model, no cache)."""
    m = read_manifest(results)
    settings = m.get("settings", {})
    size = Size(**settings["size"]) if "size" in settings else FULL
    summ = _frame(results, "summary")
    models = list(settings.get("models", list(dict.fromkeys(summ.model))))
    texts = list(settings.get("texts", list(TEXTS)))
    t = {
        name: _frame(results, name)
        for name in ("summary", "flip_rates", "clustering_artifact", "pairs", "entropy_fraction")
    }
    t["claims_before"] = _frame(results, "claims")
    evidence = claim_evidence(results, models)
    return {"claim_evidence": evidence, "claims": claims(t, evidence, models, texts, size)}


#: The tables one (model, sink) contributes; cached beside its cells.
MODEL_TABLES = (
    "flip_rates",
    "clustering_agreement",
    "clustering_structure",
    "clustering_artifact",
    "entropy_fraction",
    "entropy_attribution",
    "summary",
)


def _fingerprint(
    cells: Path, meta: list[dict[str, Any]], size: Size, fields: Sequence[str], code: Any
) -> str:
    """What one analysis depends on: its cells (name, size, mtime), the ``fields`` of the study's
    size it reads, and its code (the function ``code`` and :mod:`.evidence`); a change to any of
    them recomputes it."""
    files = []
    for m in meta:
        path = cells / str(m["model"]) / str(m["file"])
        st = path.stat()
        files.append([path.name, st.st_size, st.st_mtime_ns])
    used = {f: getattr(size, f) for f in fields}
    source = [Path(ev.__file__).read_text(), inspect.getsource(code)]
    blob = json.dumps([sorted(files), used, source], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


#: The fields of :class:`Size` each analysis reads.
MODEL_FIELDS = ("windows", "length", "block", "n_boot", "n_boot_cluster")
PAIR_FIELDS = ("pairs", "pair_length", "pair_block", "pair_run", "n_boot", "n_boot_cluster")


def _cached(
    folder: Path, out: Path | None, compute: Any
) -> tuple[dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """The tables (CSVs), bootstrap replicates (``boots.npz``) and figures of one analysis,
    computed once into ``folder`` (crash-safely) and copied from there afterwards."""
    if not folder.is_dir():
        with ac.atomic_output(folder, kind="folder", what="conventions tables") as tmp:
            compute(tmp)
    tables = {p.stem: ac.read_table(p) for p in sorted(folder.glob("*.csv"))}
    with np.load(folder / "boots.npz") as z:
        boots = {k.replace("__", " ").replace("_to_", "->"): z[k] for k in z.files}
    if out is not None and (folder / "figures").is_dir():
        figs = out / "figures"
        figs.mkdir(parents=True, exist_ok=True)
        for f in sorted((folder / "figures").glob("*")):
            with ac.atomic_output(figs / f.name, overwrite=True, is_ours=lambda _p: None) as tmp:
                shutil.copy2(f, tmp)
    return tables, boots


def _model_tables(
    cmp: xr.Dataset,
    key: dict[str, Any],
    meta: list[dict[str, Any]],
    needed: int,
    size: Size,
    folder: Path,
) -> None:
    """Every table of one (model, sink) from its cells, written into ``folder``."""
    t0 = time.perf_counter()
    log(f"{key['model']} {key['sink_key']}: analysing {cmp.sizes['sample']} windows")
    got: dict[str, pd.DataFrame] = {"flip_rates": ev.flips(cmp, size.n_boot, key)}
    agree, struct, fits = ev.clustering(cmp, key)
    got["clustering_agreement"], got["clustering_structure"] = agree, struct
    got["clustering_artifact"] = ev.artifact(cmp, size.n_boot_cluster, key)
    frac, trans, boots = ev.entropy(cmp, size.n_boot, key)
    got["entropy_fraction"], got["entropy_attribution"] = frac, trans
    share = cmp["sink_share"].fillna(0) * cmp["n_rows"]
    mean_share = share.sum("sample") / cmp["n_rows"].sum()
    summ = {
        **key,
        "status": "complete",
        "cells": len(meta),
        "needed": needed,
        "texts": len(set(cmp["text"].values.tolist())),
        "windows": int(cmp.sizes["sample"]),
        "tokens_per_window": size.length,
        "heads": int(cmp.sizes["unit_a"]),
        "layers": len(set(cmp["layer_a"].values.tolist())),
        "sink_rate_0.3": float((mean_share > 0.3).mean()),
        "mean_sink_share": float(mean_share.mean()),
        "capture_s": float(sum(m["capture_s"] for m in meta)),
        "cell_analysis_s": float(sum(m["analysis_s"] for m in meta)),
        "table_analysis_s": time.perf_counter() - t0,
    }
    got["summary"] = pd.DataFrame([summ])
    for name, df in got.items():
        ac.write_table(df, folder / f"{name}.csv")
    np.savez(
        folder / "boots.npz",
        **{k.replace(" ", "__").replace("->", "_to_"): v for k, v in boots.items()},
    )
    _figures(str(key["model"]), str(key["sink_key"]), cmp, fits, folder)


def _record(prov: Any, model: str, texts: Sequence[str], meta: list[dict[str, Any]]) -> None:
    if prov is None:
        return
    prov.asset(model)
    for t in texts:
        prov.asset(TEXTS[t][0])
    for m in meta:
        prov.token_sha256[f"{m['model']}/{m['text']}/block{m['block']}"] = m["tokens_sha256"]


def _figures(
    model: str, sink: str, cmp: xr.Dataset, fits: dict[str, xr.Dataset], out: Path
) -> None:
    tag = model if sink == "first" else f"{model}-sep"
    fig_dir = out / "figures"
    for m, cl in fits.items():
        ac.save_figure(
            ac.plot_dendrograms(cl, title=f"{tag}: {m} head clustering per convention"),
            fig_dir / f"{tag}_dendrograms_{m}",
        )
    att = xr.Dataset(
        {
            v: cmp[f"att_{v}"].rename(att_transition="transition")
            for v in ("sink", "content", "total", "n_rows")
        }
    )
    ac.save_figure(
        ac.plot_entropy_attribution(att, title=f"{tag}: entropy change between layers"),
        fig_dir / f"{tag}_entropy_attribution",
    )


def _pairs(size: Size, cells: Path, frames: dict[str, list[pd.DataFrame]], prov: Any) -> None:
    n_blocks = _n_blocks(size.pairs, size.pair_block)
    loaded: dict[str, tuple[xr.Dataset, list[dict[str, Any]]]] = {}
    for choice in PAIR_CELL_SINKS:
        cmp, meta = load_cells(cells, "minilm-l6", choice, ["pairs"], size.pair_length, n_blocks)
        frames["cells"].append(pd.DataFrame(meta).assign(needed=n_blocks))
        if cmp is None:
            log(f"minilm-l6 pairs {choice}: {len(meta)} of {n_blocks} cells; pending")
            continue
        if prov is not None:
            prov.asset("minilm-l6")
            prov.asset("wikipedia")
            for m in meta:
                prov.token_sha256[f"minilm-l6/wikipedia-pairs/block{m['block']}"] = m[
                    "tokens_sha256"
                ]
        loaded[choice] = (cmp, meta)
    for choice in PAIR_SINKS:
        base = "row-argmax" if choice == "head-argmax" else choice
        if base not in loaded:
            frames["pairs"].append(pd.DataFrame([{"sink_choice": choice, "status": "pending"}]))
            continue
        cmp, meta = loaded[base]
        folder = (
            cells
            / "minilm-l6"
            / "tables"
            / f"pairs-{choice}-{_fingerprint(cells, meta, size, PAIR_FIELDS, _pair_tables)}"
        )
        got, _ = _cached(
            folder,
            None,
            lambda tmp, cmp=cmp, choice=choice: _pair_tables(cmp, choice, size, tmp),
        )
        for name, df in got.items():
            frames[name].append(df)


def _pair_tables(cmp: xr.Dataset, choice: str, size: Size, folder: Path) -> None:
    """The artifact statistics, flip rates and summary row of one sink choice of the pairs."""
    log(f"minilm-l6 pairs {choice}: analysing {cmp.sizes['sample']} pairs")
    key = {"model": "minilm-l6", "sink_key": choice}
    got: dict[str, pd.DataFrame] = {}
    if choice == "row-argmax":
        tok = cmp["row_sink_token"].values.ravel()
        names = {101: "[CLS]", 102: "[SEP]"}
        labels = np.array([names.get(int(t), "other") for t in tok])
        own = _own_sep_share(cmp["row_sink_key"].values, size.pair_length)
        got["pairs_sink_tokens"] = pd.DataFrame(
            [
                {"most_attended": lab, "share_of_rows": float((labels == lab).mean())}
                for lab in ("[CLS]", "[SEP]", "other")
            ]
            + [{"most_attended": "[SEP] closing the query's segment", "share_of_rows": own}]
        )
    n_pairs = int(cmp.sizes["sample"])
    if choice == "head-argmax":
        cmp = cmp.assign(sink_share=cmp["head_argmax_share"])
    # bootstrap unit: runs of consecutive pairs (they continue one another, so single pairs
    # are not independent); the point estimates are row-weighted means either way
    cmp = cmp[[v for v in cmp.data_vars if "unit_a" in cmp[v].dims or v == "n_rows"]]
    parent = np.arange(n_pairs) // size.pair_run
    cmp = merge_samples(cmp, parent, np.array([f"pairs/run{i}" for i in range(parent.max() + 1)]))
    if choice == "head-argmax":
        art = ev.artifact(cmp, size.n_boot_cluster, key, with_dropped=False)
    else:
        art = ev.artifact(cmp, size.n_boot_cluster, key)
        fl = ac.flip_rates(
            cmp, ev.METRICS, between=(("kept", "dropped"),), by_layer=False, n_boot=size.n_boot
        )
        cols = ["flip_rate", "ci_low", "ci_high", "flips", "n_triples"]
        got["flip_rates"] = (
            fl[cols].to_dataframe().reset_index().assign(**key, text="wikipedia-pairs")
        )
    got["clustering_artifact"] = art
    share = cmp["sink_share"].fillna(0) * cmp["n_rows"]
    mean_share = share.sum("sample") / cmp["n_rows"].sum()
    verdict, why = ev.artifact_verdict(art)
    got["pairs"] = pd.DataFrame(
        [
            {
                "sink_choice": choice,
                "status": "complete",
                "pairs": n_pairs,
                "bootstrap_unit": f"{size.pair_run} consecutive pairs",
                "tokens_per_pair": size.pair_length,
                "mean_sink_share": float(mean_share.mean()),
                "sink_rate_0.3": float((mean_share > 0.3).mean()),
                "artifact": verdict,
                "why": why,
            }
        ]
    )
    for name, df in got.items():
        ac.write_table(df, folder / f"{name}.csv")
    np.savez(folder / "boots.npz")


def _own_sep_share(key_pos: np.ndarray, length: int) -> float:
    """Share of rows whose most-attended key is the [SEP] closing the query's own segment."""
    a_end = (length - 3) // 2 + (length - 3) % 2 + 1  # position of the first [SEP]
    q = np.arange(length)
    own = np.where(q <= a_end, a_end, length - 1)
    return float((key_pos == own[None, :]).mean())


# ------------------------------------------------------------------------------------ claims


def _pct(x: float) -> str:
    return f"{fixed(100 * x, 0)}%" if np.isfinite(x) else "n/a"


def _ci_pct(lo: float, hi: float) -> str:
    return f"[{fixed(100 * lo, 0)}, {fixed(100 * hi, 0)}]" if np.isfinite(lo) else "n/a"


def _unit(row: Any) -> str:
    return ev.UNITS.get(str(row.unit), str(row.unit))


def claims(
    t: dict[str, pd.DataFrame],
    evidence: pd.DataFrame,
    models: Sequence[str],
    texts: Sequence[str],
    size: Size,
) -> pd.DataFrame:
    """The claim table: per claim and model, the paper's number, ours pooled over the texts and
    per text, a 95% interval with its resampling unit, the sample behind it, and a verdict with
    its reason.

    The numbers of a model come from ``evidence`` (:func:`.evidence.claim_evidence` of its
    committed per-text cells); a model without committed cells falls back to the window tables
    (intervals over windows within these texts, which the repository cannot recompute), and its
    ``unit`` says so."""
    rows: list[dict[str, Any]] = []
    summ = t["summary"].set_index(["model", "sink_key"])
    sample_note = f"{size.windows} windows x {size.length} tokens x {len(texts)} texts"
    fallback_unit = "windows within texts (cells not in the repository)"

    def complete(model: str) -> bool:
        return (model, "first") in summ.index and summ.loc[(model, "first")].status == "complete"

    def ev_rows(model: str, claim: str) -> pd.DataFrame:
        if not len(evidence):
            return evidence
        return evidence[
            (evidence.model == model) & (evidence.sink_key == "first") & (evidence.claim == claim)
        ].set_index("stat")

    def pending(claim: str, model: str, paper: str) -> None:
        s = summ.loc[(model, "first")] if (model, "first") in summ.index else None
        done = f"{int(s.cells)}/{int(s.needed)} cells" if s is not None else "not run"
        rows.append(
            dict(
                claim=claim,
                model=model,
                setting="",
                paper=paper,
                ours="pending",
                per_text="",
                ci="",
                unit="",
                n=done,
                verdict="not run",
                why="cells incomplete",
            )
        )

    fr = t.get("flip_rates", pd.DataFrame())
    for model in models:
        if not complete(model):
            pending("verdict flips kept/dropped", model, "17%-47%")
            continue
        e = ev_rows(model, "flips")
        for metric in ev.CLAIM_METRICS:
            sel = (
                (fr.model == model)
                & (fr.sink_key == "first")
                & (fr.pair == "kept/dropped")
                & (fr.scope == "all")
                & (fr.metric == metric)
            )
            r = fr[sel & (fr.text == "all")].iloc[0]
            if len(e) and metric in e.index:
                x = e.loc[metric]
                value, lo, hi, unit = x.value, x.ci_low, x.ci_high, _unit(x)
                per = [getattr(x, f"text_{tx}") for tx in texts]
            else:
                value, lo, hi, unit = r.flip_rate, r.ci_low, r.ci_high, fallback_unit
                per = [fr[sel & (fr.text == tx)].flip_rate.iloc[0] for tx in texts]
            verdict, why = ev.flip_verdict(value, per, lo, hi)
            rows.append(
                dict(
                    claim=f"verdict flips kept/dropped, {metric}",
                    model=model,
                    setting="first-token sink",
                    paper="17%-47% (range over ten unnamed models)",
                    # one decimal: whole percents made a narrow interval look like a point
                    ours=f"{fixed(100 * value, 1)}%",
                    per_text=", ".join(
                        f"{tx} {fixed(100 * v, 1)}%" for tx, v in zip(texts, per, strict=True)
                    ),
                    ci=f"[{fixed(100 * lo, 1)}, {fixed(100 * hi, 1)}]",
                    unit=unit,
                    n=f"{sample_note}; {int(r.n_triples):,} triples",
                    verdict=verdict,
                    why=why,
                )
            )
    art = t.get("clustering_artifact", pd.DataFrame())
    for model in models:
        if not complete(model):
            pending("clustering artifact (JS + MDS)", model, "artifact of the convention")
            continue
        e = ev_rows(model, "artifact")
        if len(e):
            a = e.reset_index()[["stat", "value", "ci_low", "ci_high"]]
            per = "; ".join(
                f"{label} "
                + ", ".join(f"{tx} {fixed(getattr(e.loc[stat], f'text_{tx}'), 2)}" for tx in texts)
                for stat, label in (("rho_kept", "|rho|"), ("ari_k2", "ARI"))
            )
            unit = _unit(e.iloc[0])
        else:
            a = art[(art.model == model) & (art.sink_key == "first")]
            per, unit = "not committed", "windows within each text (cells not in the repository)"
        rows.append(
            _artifact_claim(a, model, "single segments, first-token sink", sample_note, per, unit)
        )
    pairs = t.get("pairs", pd.DataFrame())
    for choice in PAIR_SINKS:
        a = art[(art.model == "minilm-l6") & (art.sink_key == choice)] if len(art) else art
        if not len(a):
            rows.append(
                dict(
                    claim="clustering artifact, BERT pair pipeline",
                    model="minilm-l6",
                    setting=PAIR_SINK_LABELS[choice],
                    paper="artifact of the convention",
                    ours="pending",
                    per_text="",
                    ci="",
                    unit="",
                    n="",
                    verdict="not run",
                    why="cells incomplete",
                )
            )
            continue
        p = pairs[pairs.sink_choice == choice].iloc[0]
        rows.append(
            _artifact_claim(
                a,
                "minilm-l6",
                f"`[CLS] A [SEP] B [SEP]`, sink = {PAIR_SINK_LABELS[choice]}",
                f"{int(p.pairs)} Wikipedia pairs x {int(p.tokens_per_pair)} tokens",
                "one text",
                f"{p.bootstrap_unit} (one text; cells not in the repository)",
                claim="clustering artifact, BERT pair pipeline",
            )
        )
    ef = t.get("entropy_fraction", pd.DataFrame())
    paper_e = "30% / 95% / 79% (70M / 1B / 1.4B, across training)"
    for model in models:
        if not complete(model):
            pending("entropy drop due to the sink", model, paper_e)
            continue
        e = ev_rows(model, "entropy")
        for scope in ("first->last", "consecutive, pooled"):
            sel = (ef.model == model) & (ef.sink_key == "first") & (ef.scope == scope)
            w = ef[sel & (ef.text == "all")].iloc[0]
            stat = f"sink share, {scope}"
            if len(e) and stat in e.index:
                x, c = e.loc[stat], e.loc["mean change"]
                value, lo, hi, unit = x.value, x.ci_low, x.ci_high, _unit(x)
                per = [getattr(x, f"text_{tx}") for tx in texts]
                change, c_lo, c_hi = c.value, c.ci_low, c.ci_high
                held = c.get("seeds_holding_0", np.nan)
                n_seeds = c.get("n_seeds", np.nan)
            else:
                held = n_seeds = np.nan
                value, lo, hi, unit = w.sink_fraction, w.ci_low, w.ci_high, fallback_unit
                per = [ef[sel & (ef.text == tx)].sink_fraction.iloc[0] for tx in texts]
                change, c_lo, c_hi = w.mean_total_change, w.total_ci_low, w.total_ci_high
            # undefined when the change's interval holds 0 under any bootstrap seed: an end at 0
            # to within resampling error does not show a change
            seeded = not pd.isna(held) and not pd.isna(n_seeds)
            undefined = c_lo <= 0 <= c_hi or (seeded and int(held) > 0)
            holds = (
                f"holds 0 under {int(held)} of {int(n_seeds)} bootstrap seeds"
                if seeded and 0 < int(held) < int(n_seeds)
                else f"holds 0 under every one of {int(n_seeds)} bootstrap seeds"
                if seeded and int(held) == int(n_seeds)
                else "holds 0"
            )
            spread = max(per) - min(per) > 1  # over 100 points between texts: a ratio to ~0
            rows.append(
                dict(
                    claim="entropy drop due to the sink",
                    model=model,
                    setting=f"across depth, {scope} layers",
                    paper=paper_e,
                    ours="undefined" if undefined else _pct(value),
                    per_text=", ".join(f"{tx} {_pct(v)}" for tx, v in zip(texts, per, strict=True)),
                    ci="" if undefined else _ci_pct(lo, hi),
                    unit=unit,
                    n=sample_note,
                    verdict="not comparable",
                    why=(
                        f"no change across depth is shown: mean change {fixed(change, 2, plus=True)} nats, 95% "
                        f"CI [{fixed(c_lo, 2, plus=True)}, {fixed(c_hi, 2, plus=True)}] {holds}, so a share of it is not defined"
                        if undefined
                        else "depth, not training checkpoints (none offline); mean change "
                        f"{fixed(change, 2, plus=True)} nats [{fixed(c_lo, 2, plus=True)}, {fixed(c_hi, 2, plus=True)}]"
                        + (" (a rise: the share is of a rise, not of a drop)" if c_lo > 0 else "")
                        + (
                            "; the texts disagree by over 100 points: a ratio to a small change"
                            if spread
                            else ""
                        )
                    ),
                )
            )
    small, large = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
    pair_key = f"{small} vs {large}"
    for scope in ("first->last", "consecutive, pooled"):
        if not (complete(small) and complete(large)):
            rows.append(
                dict(
                    claim="entropy sink share across scale (one family)",
                    model=pair_key,
                    setting=scope,
                    paper=paper_e,
                    ours="pending",
                    per_text="",
                    ci="",
                    unit="",
                    n="",
                    verdict="not run",
                    why="cells incomplete",
                )
            )
            continue
        pts = {
            m: float(
                ef[
                    (ef.model == m)
                    & (ef.sink_key == "first")
                    & (ef.scope == scope)
                    & (ef.text == "all")
                ].sink_fraction.iloc[0]
            )
            for m in (small, large)
        }
        e = (
            evidence[(evidence.claim == "scale") & (evidence.model == pair_key)]
            if len(evidence)
            else evidence
        )
        e = e.set_index("stat") if len(e) else e
        stat = f"sink share difference, {scope}"
        if len(e) and stat in e.index:
            x = e.loc[stat]
            d, lo, hi, unit = x.value, x.ci_low, x.ci_high, _unit(x)
            per_txt = ", ".join(
                f"{tx} {fixed(100 * getattr(x, f'text_{tx}'), 0, plus=True)} pts" for tx in texts
            )
        else:
            old = t.get("claims_before", pd.DataFrame())
            old = (
                old[
                    (old.claim == "entropy sink share across scale (one family)")
                    & (old.setting == f"1.5B minus 0.5B, {scope}")
                ]
                if len(old)
                else old
            )
            if not len(old):
                continue
            o = old.iloc[0]
            d = float(o.ours.split(" pts", 1)[0]) / 100
            ci_vals = o.ci.strip("[]").split(", ")
            lo, hi = float(ci_vals[0]) / 100, float(ci_vals[1]) / 100
            unit, per_txt = "windows within texts (cells not in the repository)", "not committed"
        rows.append(
            dict(
                claim="entropy sink share across scale (one family)",
                model=pair_key,
                setting=f"1.5B minus 0.5B, {scope}",
                paper="70M 30% -> 1B 95% -> 1.4B 79%",
                ours=f"{fixed(100 * d, 0, plus=True)} pts ({_pct(pts[small])} -> {_pct(pts[large])})",
                per_text=per_txt,
                ci=f"[{fixed(100 * lo, 0, plus=True)}, {fixed(100 * hi, 0, plus=True)}]",
                unit=unit,
                n=sample_note,
                verdict="not comparable",
                why="closest offline proxy: same family at two scales, across depth, not "
                "training; instruction-tuned dequantised code models",
            )
        )
    return pd.DataFrame(rows)


#: How the claim table words each outcome of the artifact test. The paper's claim is about a
#: BERT pipeline and our test is a reconstruction: a model that shows the artifact is
#: *consistent with* the claim; one that does not show it is not a contradiction of a claim
#: about other models.
ARTIFACT_VERDICTS = {
    "appears": "consistent with",
    "does not appear": "not seen here",
    "unclear": "not conclusive",
    "MDS-1 follows the sink share": "consistent with (kept view only)",
    "MDS-1 does not follow the sink share": "not seen here (kept view only)",
}


def _artifact_claim(
    a: pd.DataFrame,
    model: str,
    setting: str,
    n: str,
    per_text: str,
    unit: str,
    claim: str = "clustering artifact (JS + MDS)",
) -> dict[str, Any]:
    s = a.set_index("stat")
    verdict, why = ev.artifact_verdict(a)
    rho = s.loc["rho_kept"]
    ours = f"|rho(MDS-1, sink share)| {fixed(rho.value, 2)}"
    ci = f"[{fixed(rho.ci_low, 2)}, {fixed(rho.ci_high, 2)}]"
    if "ari_k2" in s.index:
        ari = s.loc["ari_k2"]
        ours += f"; ARI kept/dropped k=2 {fixed(ari.value, 2)}"
        ci += f"; [{fixed(ari.ci_low, 2)}, {fixed(ari.ci_high, 2)}]"
        if ari.ci_low == ari.ci_high:
            why += "; the ARI is the same in every draw" + (
                " (every text gives the same partitions)" if unit.startswith("texts") else ""
            )
    return dict(
        claim=claim,
        model=model,
        setting=setting,
        paper="artifact of the convention",
        ours=ours,
        per_text=per_text,
        ci=ci,
        unit=unit,
        n=n,
        verdict=ARTIFACT_VERDICTS[verdict],
        why=f"artifact {verdict}: {why}",
    )


# ------------------------------------------------------------------------------------ run


def run(
    out: Path = RESULTS,
    *,
    size: Size = FULL,
    models: Sequence[str] = MODELS,
    texts: Sequence[str] | None = None,
    cells: Path | None = None,
    measure: bool = True,
    time_limit_s: float | None = None,
    prov: Provenance | None = None,
) -> dict[str, pd.DataFrame]:
    """Measure the missing cells (unless ``measure=False``), then write every table.

    ``time_limit_s`` starts no new block of windows after that many seconds (0 measures
    nothing); the tables then cover the (model, sink) pairs whose cells are all there.
    """
    texts = list(texts if texts is not None else registered_texts())
    cells = cells if cells is not None else default_cells()
    if time_limit_s is not None:
        ac.require_real(time_limit_s, "time_limit_s", low=0)
    wall = time.perf_counter()

    def left() -> float | None:
        return (
            None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - wall))
        )

    if measure:
        for model in models:
            measure_texts(model, texts, size, cells, time_limit_s=left())
            if model == "minilm-l6":
                measure_pairs(size, cells, time_limit_s=left())
    tables = analyse(models, texts, size, cells, out, prov)
    for name, df in tables.items():
        ac.write_table(df, out / f"{name}.csv")
    if prov is not None:
        prov.settings.update(
            size=asdict(size),
            models=list(models),
            texts=list(texts),
            texts_missing=[x for x in TEXTS if x not in texts],
            cells=str(cells),
        )
    log(f"tables written in {fixed(time.perf_counter() - wall, 0)} s; results in {out}")
    return tables


def claims_only(out: Path, prov: Provenance) -> None:
    """``run --claims-only``: the claim table from ``out`` alone. The manifest keeps what the
    window tables were made with (settings, assets, token hashes, the run that made them) and
    says in a note which cells each part comes from."""
    before = read_manifest(out)
    if not (out / "summary.csv").is_file():
        raise ac.InputError(f"{out} holds no study results; run the study first")
    got = rebuild_claims(out)
    for name, df in got.items():
        ac.write_table(df, out / f"{name}.csv")
    prov.settings.update(before.get("settings", {}))
    prov.assets.update(before.get("assets", {}))
    prov.token_sha256.update(before.get("token_sha256", {}))
    # the run that built the window tables: kept from the manifest when an earlier
    # --claims-only recorded it (that run only rebuilt the claims), else the one that wrote it
    prov.settings["window_tables_made_by"] = before.get("settings", {}).get(
        "window_tables_made_by"
    ) or {k: before.get(k) for k in ("command", "git", "started", "wall_s", "versions")}
    prov.git["note"] = cells_note(out)


#: Columns that are not results: timings, where and from which file a number was computed.
_NOT_COMPARED = frozenset(
    {"capture_s", "analysis_s", "cell_analysis_s", "table_analysis_s", "commit", "dirty"}
    | {"file", "cells_sha256"}
)
#: Text columns that are results (the claim table's rendered numbers and verdicts), not keys.
_RESULT_TEXT = frozenset({"verdict", "why", "ci", "ours", "per_text", "n"})
#: The file comparing recomputed window tables with the ones they replaced.
RECOMPUTED = "recomputed_vs_before.csv"


def _as_text(column: pd.Series) -> pd.Series:
    """A table column as the text it shows (empty for a missing value)."""
    return column.fillna("").astype(str)


def compare_tables(before: Path, after: Path) -> pd.DataFrame:
    """Every result table in both folders, ``after`` against ``before``, a row each: how many
    numbers are identical, the largest absolute and relative differences of the others, and how
    many text cells (verdicts, reasons, rendered intervals) changed. Rows are compared in file
    order: their text columns (the keys) must match, or the file says so (``rows_match`` 0).
    ``cells.csv`` compares the cells' token hashes: the same tokens went in."""
    rows = []
    for path in sorted(after.glob("*.csv")):
        old_path = before / path.name
        if path.name == RECOMPUTED or not old_path.is_file():
            continue
        new, old = ac.read_table(path), ac.read_table(old_path)
        cols = [c for c in new.columns if c in old.columns and c not in _NOT_COMPARED]
        row: dict[str, Any] = {"file": path.name, "rows_before": len(old), "rows_after": len(new)}
        if len(new) != len(old):
            rows.append({**row, "rows_match": 0})
            continue
        numeric = [
            c
            for c in cols
            if pd.api.types.is_numeric_dtype(new[c]) and pd.api.types.is_numeric_dtype(old[c])
        ]
        text = [c for c in cols if c not in numeric]
        keys = [c for c in text if c not in _RESULT_TEXT]
        same_keys = all((_as_text(new[c]) == _as_text(old[c])).all() for c in keys)
        a = new[numeric].to_numpy(dtype=np.float64)
        b = old[numeric].to_numpy(dtype=np.float64)
        both_nan = np.isnan(a) & np.isnan(b)
        equal = (a == b) | both_nan
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = np.where(equal, 0.0, np.abs(a - b))
            rel = np.where(equal, 0.0, diff / np.maximum(np.abs(a), np.abs(b)))
        # counts (flips, triples) apart from real numbers: a count moves by whole units
        is_int = pd.api.types.is_integer_dtype
        counts = np.array([is_int(new[c]) and is_int(old[c]) for c in numeric], dtype=bool)
        real = ~counts
        changed_text = sum(
            int((_as_text(new[c]) != _as_text(old[c])).sum()) for c in text if c not in keys
        )
        rows.append(
            {
                **row,
                "rows_match": int(same_keys),
                "numbers": int(a.size),
                "identical": int(equal.sum()),
                "max_abs_diff": float(np.nanmax(diff[:, real])) if real.any() and a.size else 0.0,
                "max_rel_diff": float(np.nanmax(rel[:, real])) if real.any() and a.size else 0.0,
                "counts_changed": int((~equal[:, counts]).sum()) if counts.any() else 0,
                "max_count_diff": float(np.nanmax(diff[:, counts]))
                if counts.any() and a.size
                else 0.0,
                "text_changed": changed_text,
            }
        )
    return pd.DataFrame(rows)


def _committed_results(rev: str) -> list[str] | None:
    """The files of ``results/`` committed at git revision ``rev``, or ``None`` where ``rev``
    names no commit holding it."""
    rel = RESULTS.relative_to(ROOT).as_posix()
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:{rel}"],
        capture_output=True,
        text=True,
    )
    return listing.stdout.split() if listing.returncode == 0 else None


def _revision(value: str) -> str:
    """``--compare-with``'s REV: refused by argparse (exit 2, one line, before any work) where
    it names no commit holding this study's results."""
    if _committed_results(value) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} names no commit holding {RESULTS.relative_to(ROOT).as_posix()}; give "
            "a commit of this repository (git log -- case_studies/conventions/results)"
        )
    return value


def committed_tables(rev: str, folder: Path) -> Path:
    """The result tables committed at git revision ``rev`` (a commit of this repository),
    written into ``folder``; refused in one line where ``rev`` names none."""
    rel = RESULTS.relative_to(ROOT).as_posix()
    names = _committed_results(rev)
    if names is None:
        raise ac.InputError(f"--compare-with {rev!r}: no {rel} at that revision; give a commit")
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith(".csv") and name != RECOMPUTED:
            blob = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{rel}/{name}"],
                capture_output=True,
                check=True,
            ).stdout
            (folder / name).write_bytes(blob)
    return folder


def cells_note(results: Path) -> str:
    """Which commit and tree state measured the cells behind each part of the results: the
    manifest's note (the README's cells-provenance block, as plain text)."""
    lines = [ln for ln in cells_provenance(results).splitlines() if ln and ln[0] != "|"]
    return " ".join(ln.removeprefix("- ").replace("**", "").replace("`", "") for ln in lines)


# ------------------------------------------------------------------------------------ README


def _frame(results: Path, name: str) -> pd.DataFrame:
    path = results / f"{name}.csv"
    return ac.read_table(path) if path.is_file() else pd.DataFrame()


#: How the README names each metric of :data:`attncoda.METRICS`.
METRIC_LABELS = {
    "aitchison": "Aitchison",
    "cosine": "cosine",
    "js": "JS",
    "tv": "TV",
    "kl": "KL",
    "entropy": "entropy",
}


def _names(models: Sequence[str]) -> str:
    names = [NAMES.get(m, m) for m in models]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _artifact_numbers(stats: pd.DataFrame, model: str, sink: str) -> str:
    """``|rho| v [lo, hi], ARI k=2 v [lo, hi]`` of one (model, sink) artifact test."""
    a = stats[(stats.model == model) & (stats.sink_key == sink)].set_index("stat")
    return ", ".join(
        f"{label} {fixed(a.loc[stat].value, 2)} [{fixed(a.loc[stat].ci_low, 2)}, {fixed(a.loc[stat].ci_high, 2)}]"
        for stat, label in (("rho_kept", "|rho(MDS-1, sink share)|"), ("ari_k2", "ARI k=2"))
        if stat in a.index
    )


def claims_summary(results: Path) -> str:
    """The README's "what the claim table says": one bullet per claim, every number read from
    the result files in ``results`` (typed prose drifted from the tables once a run changed)."""
    cl = claims_frame(results)
    summ = _frame(results, "summary")
    if not len(cl) or not len(summ):
        return "- No claim table yet: run the study."
    first = summ[summ.sink_key == "first"]
    done = first[first.status == "complete"]
    lines = []
    if len(done):
        s = done.iloc[0]
        lines.append(
            f"- **Sample.** {len(done)} of {len(first)} models complete, each on "
            f"{int(s.texts)} texts x {int(s.windows) // int(s.texts)} windows of "
            f"{int(s.tokens_per_window)} tokens ({int(s.windows)} windows per model)"
            + (
                f"; pending: {_names(first[first.status != 'complete'].model.tolist())}."
                if len(done) < len(first)
                else "."
            )
        )
    # verdict flips: how many rates land in the published range, which do not, text spread
    flips = cl[cl.claim.str.startswith("verdict flips") & (cl.verdict != "not run")]
    if len(flips):
        fr = _frame(results, "flip_rates")
        inside = flips[flips.verdict == "consistent with"]
        lo, hi = ev.PUBLISHED_FLIPS
        outside = [
            f"{NAMES.get(r.model, r.model)} {METRIC_LABELS[r.claim.rsplit(', ', 1)[1]]} "
            f"{r.ours} {r.ci}, texts {r.per_text} "
            f"({r.verdict})"
            for r in flips[flips.verdict != "consistent with"].itertuples()
        ]
        per_text = fr[
            (fr.sink_key == "first")
            & ~fr.text.isin(["all", "wikipedia-pairs"])
            & (fr.pair == "kept/dropped")
            & (fr.scope == "all")
            & fr.metric.isin(ev.CLAIM_METRICS)
            & fr.model.isin(done.model)
        ]
        spread = per_text.groupby(["model", "metric"]).flip_rate.agg(lambda x: x.max() - x.min())
        lines.append(
            f"- **Verdict flips** (`kept` vs `dropped`; "
            f"{', '.join(METRIC_LABELS[m] for m in ev.CLAIM_METRICS)}): "
            f"{len(inside)} of {len(flips)} model-metric rates are *consistent with* the "
            f"published {_pct(lo)}-{_pct(hi)} (rate, every text and interval inside it; a range "
            "over ten unnamed models, so consistency, not a reproduction of any one number)"
            + (f"; the others: {'; '.join(outside)}" if outside else "")
            + (
                f". The texts of one model and metric differ by at most "
                f"{fixed(100 * spread.max(), 0)} points."
                if len(spread)
                else "."
            )
        )
    # the clustering artifact on single segments, grouped by verdict
    art = cl[cl.claim == "clustering artifact (JS + MDS)"]
    art = art[art.verdict != "not run"]
    stats = _frame(results, "clustering_artifact")
    if len(art):
        parts = []
        for verdict, g in art.groupby("verdict", sort=False):
            detail = (
                ""
                if verdict == "consistent with"
                else " ("
                + "; ".join(
                    f"{NAMES.get(r.model, r.model)}: {r.ours}, 95% CI {r.ci}, per text "
                    f"{r.per_text}; {r.why.split(': ', 1)[-1]}"
                    for r in g.itertuples()
                )
                + ")"
            )
            parts.append(f"*{verdict}* on {_names(g.model.tolist())}{detail}")
        lines.append(f"- **Clustering artifact, single segments**: {'; '.join(parts)}.")
    # the BERT pair pipeline: where MiniLM's rows go, then each sink choice's verdict
    pairs = _frame(results, "pairs")
    pairs = pairs[pairs.status == "complete"] if len(pairs) else pairs
    if len(pairs):
        tok = _frame(results, "pairs_sink_tokens")
        where = ""
        if len(tok):
            top = tok.sort_values("share_of_rows", ascending=False).iloc[0]
            where = (
                f"{fixed(100 * top.share_of_rows, 1)}% of MiniLM's rows attend most (mean over heads) to "
                f"{top.most_attended}; "
            )
        choices = []
        for p in pairs.itertuples():
            rho = _artifact_numbers(stats, "minilm-l6", p.sink_choice)
            choices.append(
                f"sink = {PAIR_SINK_LABELS[p.sink_choice]} (mean sink share "
                f"{fixed(100 * p.mean_sink_share, 1)}%): artifact {p.artifact} ({rho}; {p.why})"
            )
        lines.append(
            f"- **BERT pair pipeline** ({int(pairs.pairs.iloc[0])} two-segment Wikipedia pairs "
            f"on MiniLM): {where}" + "; ".join(choices) + "."
        )
    # entropy attribution across depth: direction, both splits, and ill-conditioned ratios
    ent = cl[(cl.claim == "entropy drop due to the sink") & (cl.verdict != "not run")]
    if len(ent):
        ef = _frame(results, "entropy_fraction")
        parts, rises = [], []
        for model in dict.fromkeys(ent.model):
            e = ef[(ef.model == model) & (ef.sink_key == "first")].set_index(["scope", "text"])
            fl, co = e.loc[("first->last", "all")], e.loc[("consecutive, pooled", "all")]
            texts = e.loc["first->last"].drop(index="all").sink_fraction
            part = (
                f"{NAMES.get(model, model)} {fixed(fl.mean_total_change, 2, plus=True)} nats, sink share "
                f"{_pct(fl.sink_fraction)} / {_pct(co.sink_fraction)}"
            )
            if (ent[ent.model == model].ours == "undefined").any():
                part += " (undefined in the claim table: the change is not shown to differ from 0)"
            if texts.max() - texts.min() > 1:  # a spread over 100 points: a ratio to ~0
                part += (
                    f" (per text {_pct(texts.min())} to {_pct(texts.max())}: a ratio to a small "
                    "change, not a usable share)"
                )
            parts.append(part)
            if fl.total_ci_low > 0:
                rises.append(model)
        text = (
            "- **Entropy across depth** (mean change first -> last layer; the sink's share "
            "first -> last / consecutive layers pooled; intervals in the claim table): "
            + "; ".join(parts)
            + "."
        )
        if rises:
            text += (
                f" The entropy *rises* across depth in {_names(rises)}, so there the share is "
                "of a rise, not of the paper's collapse."
            )
        lines.append(text)
    scale = cl[(cl.claim == "entropy sink share across scale (one family)")]
    scale = scale[scale.verdict != "not run"]
    if len(scale):
        lines.append(
            "- **Across scale** (Qwen2.5-Coder 1.5B minus 0.5B, one family, across depth): "
            + "; ".join(
                f"{r.setting.split(', ', 1)[1]} {r.ours} {r.ci}" for r in scale.itertuples()
            )
            + "."
        )
    return "\n".join(lines)


def claims_frame(results: Path) -> pd.DataFrame:
    """The claim table of ``results``: ``claims.csv`` while the committed per-text cells are the
    ones ``claim_evidence.csv`` was computed from, else recomputed from the cells now there (so
    ``table`` never renders intervals that the committed cells no longer give)."""
    stale = stale_evidence(results)
    if stale:
        log(f"claim evidence is stale for {', '.join(stale)}: recomputing from results/cells")
        return rebuild_claims(results)["claims"]
    return _frame(results, "claims")


def intervals_note(cl: pd.DataFrame) -> str:
    """How many intervals the claim table holds, their units, and that none is corrected."""
    shown = cl[cl.ci.fillna("").str.len() > 0]
    n_ci = int(sum(str(c).count("[") for c in shown.ci))
    n_why = int(sum(str(c).count("CI [") + str(c).count("nats [") for c in cl.why.fillna("")))
    n = n_ci + n_why
    units = cl[cl.unit.fillna("").str.len() > 0].unit.value_counts()
    by_unit = "; ".join(f"{v} rows over {k}" for k, v in units.items())
    return (
        f"The claim table holds {n} 95% intervals: {n_ci} in the CI column ({len(shown)} rows; "
        f"an artifact row holds two) and {n_why} of entropy changes in the why column. None is "
        f"corrected for multiplicity: each is a per-claim interval, to be read on its own; even "
        f"if every one were exact, about {fixed(n / 20, 1)} of them would miss their value by chance. "
        f"Resampling units: {by_unit}."
    )


def cells_provenance(results: Path) -> str:
    """Which commit and tree state measured the cells behind the window tables and behind the
    claim table, and how the claim cells' pooled flip rates compare with the window tables'."""
    cells = _frame(results, "cells")
    lines = []
    if len(cells):
        dirty = cells["dirty"] if "dirty" in cells else pd.Series(np.nan, index=cells.index)
        states = dirty.map(_tree)
        counts = ", ".join(f"{k}: {v}" for k, v in states.value_counts().items())
        m = read_manifest(results)
        made = m.get("settings", {}).get("window_tables_made_by") or m
        git = made.get("git") or {}
        lines.append(
            f"- **Window tables** (`cells.csv`): {len(cells)} cells measured at "
            f"{cells.commit.nunique()} commit{'s' if cells.commit.nunique() != 1 else ''} "
            f"({counts}; each cell's commit is in "
            f"`cells.csv`), built into the tables by `{made.get('command', 'unknown')}` at "
            f"`{str(git.get('commit', 'unknown'))[:12]}` ("
            + {True: "modified tree", False: "clean tree"}.get(git.get("dirty"), "tree unknown")
            + f") on {made.get('started', 'an unrecorded date')}."
        )
    evidence = _frame(results, "claim_evidence")
    fr = _frame(results, "flip_rates")
    folder = results / "cells"
    for path in sorted(folder.glob("*.nc")) if folder.is_dir() else []:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            model, state = str(ds.attrs.get("model", "")), ds.attrs.get("measured_at", "")
        line = f"- **Claim cells** `cells/{path.name}`: measured at {state or 'unrecorded'}"
        e = (
            evidence[(evidence.model == model) & (evidence.claim == "flips")]
            if len(evidence)
            else evidence
        )
        if len(e) and len(fr):
            w = fr[
                (fr.model == model)
                & (fr.sink_key == "first")
                & (fr.text == "all")
                & (fr.pair == "kept/dropped")
                & (fr.scope == "all")
            ].set_index("metric")
            gap = max(abs(r.value - w.loc[r.stat, "flip_rate"]) for r in e.itertuples())
            line += (
                "; their pooled flip rates equal the window tables' exactly"
                if gap == 0
                else f"; their pooled flip rates differ from the window tables' by at most "
                f"{scientific(gap, 1)}"
            )
        lines.append(line + ".")
    lines += recomputed_note(results)
    return "\n".join(lines) if lines else "- No cells recorded."


def recomputed_note(results: Path) -> list[str]:
    """How the recomputed tables agree with the ones they replaced (:data:`RECOMPUTED`): a
    line and a table of the files, or nothing where no comparison was made."""
    cmp = _frame(results, RECOMPUTED.removesuffix(".csv"))
    if not len(cmp):
        return []
    rev = str(read_manifest(results).get("settings", {}).get("compared_with", "unknown"))
    n, same = int(cmp.numbers.fillna(0).sum()), int(cmp.identical.fillna(0).sum())
    text = int(cmp.text_changed.fillna(0).sum())
    moved = int(cmp.counts_changed.fillna(0).sum())
    line = (
        f"- **Recomputed**: every window-table cell measured again from nothing at a clean "
        f"commit, against the tables they replace (committed at `{rev[:12]}`): {same:,} of "
        f"{n:,} numbers identical"
    )
    if same < n:
        line += (
            f"; the real numbers differ by at most "
            f"{scientific(float(cmp.max_rel_diff.max()), 1)} relative"
        )
    if moved:
        line += (
            f"; {moved} counts moved, by at most {int(cmp.max_count_diff.max())} (flips of "
            f"near-tied distances, which rounding orders either way, and the rates they make)"
        )
    line += f"; {text} text cells (verdicts, reasons, rendered numbers) changed."
    if not bool(cmp.rows_match.fillna(0).all()):
        line += " Files whose rows no longer line up are marked below."

    def cells(r: Any) -> list[str]:
        if not int(r.rows_match):
            return [f"{int(r.rows_after)} (before {int(r.rows_before)}: rows differ)", *"———"]
        if not int(r.numbers):
            return [f"{int(r.rows_after)}", "text only", "—", "—", f"{int(r.text_changed)}"]
        return [
            f"{int(r.rows_after)}",
            f"{int(r.identical):,} / {int(r.numbers):,}",
            scientific(float(r.max_rel_diff), 1) if float(r.max_rel_diff) else "none",
            f"{int(r.counts_changed)} (by <= {int(r.max_count_diff)})"
            if int(r.counts_changed)
            else "none",
            f"{int(r.text_changed)}",
        ]

    table = markdown_table(
        [
            "file",
            "rows",
            "numbers identical",
            "largest relative difference",
            "counts moved",
            "text changed",
        ],
        [[f"`{r.file}`", *cells(r)] for r in cmp.itertuples()],
    )
    return [line, "", table]


def cost_table(results: Path) -> str:
    """Mean seconds per cell (a block of windows) from ``cells.csv``."""
    cells = _frame(results, "cells")
    if not len(cells):
        return "No cell timings recorded."
    rows = []
    for (model, text), g in cells.groupby(
        [cells.model, cells.text.eq("wikipedia-pairs").map({True: "pairs", False: "texts"})],
        sort=False,
    ):
        blocks = g.drop_duplicates(["sink_key", "text", "block"])
        per_block = blocks.groupby(["text", "block"]).capture_s.first()
        rows.append(
            [
                NAMES.get(model, model) + (" pairs" if text == "pairs" else ""),
                f"{int(g.windows.iloc[0])}",
                f"{len(g)}",
                f"{fixed(per_block.median(), 0)} ({fixed(per_block.min(), 0)}-{fixed(per_block.max(), 0)})",
                f"{fixed(g.analysis_s.median(), 0)} ({fixed(g.analysis_s.min(), 0)}-{fixed(g.analysis_s.max(), 0)})",
            ]
        )
    return markdown_table(
        [
            "model",
            "windows or pairs per cell",
            "cells",
            "capture s per block, median (range)",
            "analysis s per cell and sink, median (range)",
        ],
        rows,
    )


def flip_units_note(results: Path) -> str:
    """How the flip rates' two intervals compare, rendered from ``flip_rates.csv`` and
    ``claim_evidence.csv``: the claim table's over texts only, the window tables' over windows
    (all texts' windows together), per model and claim metric."""
    from .evidence import CLAIM_METRICS

    fr, ev = _frame(results, "flip_rates"), _frame(results, "claim_evidence")
    if not len(fr) or not len(ev):
        return "No flip results yet."
    ev = ev[(ev.claim == "flips") & (ev.sink_key == "first")]
    ratios = []
    for r in ev.itertuples():
        w = fr[
            (fr.model == r.model)
            & (fr.metric == r.stat)
            & (fr.sink_key == "first")
            & (fr.pair == "kept/dropped")
            & (fr.scope == "all")
            & (fr.text == "all")
        ]
        if len(w) and r.stat in CLAIM_METRICS:
            ratios.append((w.ci_high.iloc[0] - w.ci_low.iloc[0]) / (r.ci_high - r.ci_low))
    if not ratios:
        return "No flip results yet."
    half, wider = sum(x >= 0.5 for x in ratios), sum(x > 1 for x in ratios)
    return (
        "Windows within a text are not redrawn for the flip rates: the repository holds their "
        "per-text matrices, not per-window ones, so a second stage cannot be drawn from it (the "
        "entropy claims keep per-window parts, and draw both stages). What that leaves out: the "
        "window bootstrap of `flip_rates.csv` (windows of all texts together) gives intervals "
        f"{fixed(min(ratios), 2)} to {fixed(max(ratios), 2)} times as wide as the texts' over the "
        f"{len(ratios)} model-metric rates of the claim table (at least half as wide in {half} of "
        f"them, wider in {wider}): the flip intervals hold the windows fixed, and a two-stage "
        "interval could be wider than they are."
    )


def emma_flips_quote(results: Path) -> str:
    """The sentence ``docs/conventions.md`` quotes: SmolLM2-135M's flip rates on *Emma*
    (``kept`` vs ``dropped``, first-token sink), from ``flip_rates.csv``."""
    fr = _frame(results, "flip_rates")
    if not len(fr):
        return "No flip results yet."
    sel = fr[
        (fr.model == "smollm2-135m")
        & (fr.sink_key == "first")
        & (fr.pair == "kept/dropped")
        & (fr.scope == "all")
        & (fr.text == "emma")
    ].set_index("metric")
    if not {"cosine", "js", "aitchison"} <= set(sel.index):
        return "No flip results for SmolLM2-135M on Emma yet."

    def rate(m: str) -> str:
        r = sel.loc[m]
        return f"{_pct(r.flip_rate)} [{_pct(r.ci_low)}, {_pct(r.ci_high)}]"

    return (
        f"On SmolLM2-135M over Austen's *Emma*, {rate('cosine')} of cosine and {rate('js')} of "
        "Jensen-Shannon verdicts flip between `kept` and `dropped`, and "
        f"{rate('aitchison')} of Aitchison ones (95% intervals over windows)."
    )


def render_tables(results: Path) -> dict[str, str]:
    """The README tables, from the result files in ``results`` (``table`` renders them)."""
    cl = claims_frame(results)
    claims_md = markdown_table(
        [
            "claim",
            "model",
            "setting",
            "paper",
            "ours (texts pooled)",
            "per text",
            "95% CI",
            "resampling unit",
            "n",
            "verdict",
            "why",
        ],
        [
            [
                r.claim,
                r.model,
                r.setting,
                r.paper,
                r.ours,
                r.per_text,
                r.ci,
                r.unit,
                r.n,
                f"**{r.verdict}**",
                r.why,
            ]
            for r in cl.fillna("").itertuples()
        ],
    )
    fr = _frame(results, "flip_rates")
    summ = _frame(results, "summary")
    rows = []
    for s in summ.itertuples():
        label = f"{NAMES.get(s.model, s.model)} ({SINK_NAMES.get(s.sink_key, s.sink_key)})"
        if s.status != "complete":
            rows.append([label, "pending", *[""] * 6])
            continue
        cells = []
        for m in ev.METRICS:
            r = fr[
                (fr.model == s.model)
                & (fr.sink_key == s.sink_key)
                & (fr.text == "all")
                & (fr.pair == "kept/dropped")
                & (fr.scope == "all")
                & (fr.metric == m)
            ].iloc[0]
            inside = ev.PUBLISHED_FLIPS[0] <= r.flip_rate <= ev.PUBLISHED_FLIPS[1]
            txt = _pct(r.flip_rate)
            cells.append(f"{'**' + txt + '**' if inside else txt} {_ci_pct(r.ci_low, r.ci_high)}")
        rows.append([label, f"{int(s.windows)} x {int(s.texts)}", *cells])
    pr = fr[fr.text == "wikipedia-pairs"] if len(fr) else fr
    for choice in dict.fromkeys(pr.sink_key.tolist() if len(pr) else []):
        cells = []
        for m in ev.METRICS:
            r = pr[(pr.sink_key == choice) & (pr.metric == m)].iloc[0]
            inside = ev.PUBLISHED_FLIPS[0] <= r.flip_rate <= ev.PUBLISHED_FLIPS[1]
            txt = _pct(r.flip_rate)
            cells.append(f"{'**' + txt + '**' if inside else txt} {_ci_pct(r.ci_low, r.ci_high)}")
        rows.append([f"MiniLM-L6 pairs, sink {PAIR_SINK_LABELS[choice]}", "pairs", *cells])
    # the headers come from the same tuple as the cells (they were typed in another order once,
    # which put every rate under its neighbour's name)
    flips_md = markdown_table(
        ["model (sink)", "windows x texts", *(METRIC_LABELS.get(m, m) for m in ev.METRICS)], rows
    )
    art = _frame(results, "clustering_artifact")
    rows = []
    for (model, sink), a in art.groupby(["model", "sink_key"], sort=False) if len(art) else []:
        s = a.set_index("stat")

        def cell(stat: str, s: pd.DataFrame = s) -> str:
            if stat not in s.index:
                return "n/a"
            r = s.loc[stat]
            return f"{fixed(r.value, 2)} [{fixed(r.ci_low, 2)}, {fixed(r.ci_high, 2)}]"

        verdict, _ = ev.artifact_verdict(a)
        label = (
            f"{NAMES.get(model, model)} ({SINK_NAMES[sink]})"
            if sink in SINK_NAMES
            else f"MiniLM-L6 pairs, sink {PAIR_SINK_LABELS[sink]}"
        )
        rows.append(
            [
                label,
                cell("rho_kept"),
                cell("rho_dropped"),
                cell("ari_k2"),
                cell("ari_k4"),
                cell("cophenetic_corr"),
                verdict,
            ]
        )
    clustering_md = markdown_table(
        [
            "model (sink)",
            "abs rho(MDS-1, sink share), kept",
            "dropped",
            "ARI kept/dropped k=2",
            "k=4",
            "cophenetic r",
            "artifact",
        ],
        rows,
    )
    ef = _frame(results, "entropy_fraction")
    rows = []
    if len(ef):
        for (model, sink), e in ef[ef.text == "all"].groupby(["model", "sink_key"], sort=False):
            fl = e[e.scope == "first->last"].iloc[0]
            co = e[e.scope == "consecutive, pooled"].iloc[0]
            texts = ef[
                (ef.model == model)
                & (ef.sink_key == sink)
                & (ef.text != "all")
                & (ef.scope == "first->last")
            ]
            rows.append(
                [
                    f"{NAMES.get(model, model)} ({SINK_NAMES[sink]})",
                    f"{fixed(fl.mean_total_change, 2, plus=True)} "
                    f"[{fixed(fl.total_ci_low, 2, plus=True)}, {fixed(fl.total_ci_high, 2, plus=True)}]",
                    f"{_pct(fl.sink_fraction)} {_ci_pct(fl.ci_low, fl.ci_high)}",
                    f"{_pct(co.sink_fraction)} {_ci_pct(co.ci_low, co.ci_high)}",
                    ", ".join(f"{r.text} {_pct(r.sink_fraction)}" for r in texts.itertuples()),
                ]
            )
    entropy_md = markdown_table(
        [
            "model (sink)",
            "entropy change, first -> last (nats, 95% CI)",
            "sink share, first -> last",
            "sink share, consecutive layers pooled",
            "first -> last per text",
        ],
        rows,
    )
    tok = _frame(results, "pairs_sink_tokens")
    tokens_md = markdown_table(
        ["most-attended key of a row (mean over heads)", "share of rows"],
        [[r.most_attended, _pct(r.share_of_rows)] for r in tok.itertuples()],
    )
    return {
        "claims": claims_md,
        "claims-intervals": intervals_note(cl) if len(cl) else "",
        "flip-units": flip_units_note(results),
        "docs-emma-flips": emma_flips_quote(results),
        "cells-provenance": cells_provenance(results),
        "cost": cost_table(results),
        "claims-summary": claims_summary(results),
        "flips": flips_md,
        "clustering": clustering_md,
        "entropy": entropy_md,
        "pair_tokens": tokens_md,
    }


# ------------------------------------------------------------------------------------ main


def _run(out: Path, args: argparse.Namespace, prov: Provenance) -> None:
    if args.claims_only:
        claims_only(out, prov)
        return
    # the tables a --compare-with run replaces, read before they are overwritten (the folder
    # goes whatever ends the run)
    with tempfile.TemporaryDirectory(prefix="before-") as scratch:
        before = committed_tables(args.compare_with, Path(scratch)) if args.compare_with else None
        run(
            out,
            models=args.models,
            texts=args.texts,
            cells=args.cells,
            measure=not args.tables_only,
            time_limit_s=None if args.time_limit is None else args.time_limit * 60,
            prov=prov,
        )
        if before is not None:
            ac.write_table(compare_tables(before, out), out / RECOMPUTED)
            prov.settings["compared_with"] = args.compare_with


def _quick(out: Path, prov: Provenance) -> None:
    run(out, size=QUICK, models=QUICK_MODELS, cells=out / "cells", prov=prov)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--texts",
        nargs="+",
        default=None,
        choices=list(TEXTS),
        help="texts (default: every one whose corpus is a registered asset)",
    )
    parser.add_argument(
        "--cells",
        type=Path,
        default=None,
        help="folder of the resumable cells (default: ~/.cache/attncoda/studies/conventions/cells)",
    )
    parser.add_argument(
        "--claims-only",
        action="store_true",
        help="rebuild only claim_evidence.csv and claims.csv from the committed per-text cells "
        "in --out/cells and the window tables there (no model, no cell cache)",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="measure nothing; build the tables from the cells already there",
    )
    parser.add_argument(
        "--compare-with",
        metavar="REV",
        type=_revision,
        default=None,
        help=f"after the run, compare its tables with those committed at git revision REV "
        f"(written to {RECOMPUTED}; the README says how they agree)",
    )
    add_time_limit(parser)


#: The quick mode's files CI compares with ``golden/`` (timings and provenance are not results).
#: A flip is an ordering verdict between two distances, so a near-tie that another CPU's (or
#: another BLAS call's) rounding orders the other way moves a count by one: a Gram computed by
#: ``syrk`` instead of ``gemm`` moved 33 rows by 1-5 flips of 178,920 or 9.7 million triples and
#: two layer-20 rows by one of 252, past rtol 1e-3. Counts and rates get five flips of slack.
_NOT_RESULTS = ("capture_s", "cell_analysis_s", "table_analysis_s")
_NEAR_TIES = (("flips", 5.0, ""), ("flip_rate", 5.0, "n_triples"))
GOLDEN = (
    Golden("summary.csv", rtol=1e-3, atol=1e-4, ignore=_NOT_RESULTS),
    Golden("flip_rates.csv", rtol=1e-3, atol=1e-4, slack=_NEAR_TIES),
    Golden("clustering_agreement.csv", rtol=1e-3, atol=1e-4),
    Golden("clustering_artifact.csv", rtol=1e-3, atol=1e-3),
    Golden("entropy_fraction.csv", rtol=1e-3, atol=1e-4),
    Golden("pairs.csv", rtol=1e-3, atol=1e-4),
)

STUDY = Study(
    name="conventions",
    description="Verdict flips, head clustering and entropy attribution under the kept / "
    "dropped / split conventions on five real models over four texts, and the BERT pair "
    "pipeline on MiniLM under three sink choices.",
    run=_run,
    quick=_quick,
    tables=render_tables,
    golden=GOLDEN,
    # what the quick mode (CI) needs; the full run also needs the two Qwen models
    assets=(*QUICK_MODELS, "austen", "mobydick", "wikipedia"),
    add_arguments=_arguments,
    docs=("docs/case-studies/conventions.md", "docs/conventions.md"),
)


def main(argv: Sequence[str] | None = None) -> int:
    return study_main(STUDY, argv)
