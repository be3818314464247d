"""The ARACH study driver: texts, offsets and protocol of the paired evaluation, its tables and
figures.

:func:`run_evaluation` runs one offline model with ARACH off and on (the same weights; the
plug-in is :mod:`attncoda.hooks.arach`):

1. perplexity on Moby-Dick and Emma in non-overlapping windows at several context lengths, with
   block-bootstrap intervals of the paired difference, the offset sweep and the hub variants
   (:func:`attncoda.hooks.evaluate.score_tokens`,
   :func:`attncoda.hooks.evaluate.perplexity_interval`);
2. last-word (cloze) accuracy on items from the six Austen novels at every offset
   (:func:`attncoda.hooks.evaluate.cloze_accuracy`,
   :func:`attncoda.hooks.evaluate.paired_bootstrap`);
3. the attention audit (:func:`attncoda.hooks.arach_audit.audit`) on Emma paragraphs.

It writes ``results.json``, ``ppl.csv`` and ``cloze.csv`` (full precision,
:func:`attncoda.write_table`), ``audit.nc`` and the figures (:func:`plot_audit`, the sweep) into
one crash-safe output folder. ``python -m case_studies.arach.run`` is its command line.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attncoda as ac
from attncoda import AttncodaError, InputError, require_int, require_real
from attncoda.hooks import assets
from attncoda.hooks.arach import Arach, ArachConfig
from attncoda.hooks.arach_audit import audit, audit_findings
from attncoda.hooks.evaluate import (
    cloze_accuracy,
    cloze_items,
    paired_bootstrap,
    perplexity_interval,
    score_tokens,
    special_prefix,
)

from .._study import (
    Golden,
    Study,
    add_shard,
    add_time_limit,
    fixed,
    seconds_left,
    write_text,
)
from .._study import main as study_main
from .claims import (
    CLAIM_MODELS,
    MINUS,
    ClaimPlan,
    Config,
    cell_provenance,
    claim_tables,
    cloze_token_ids,
    load_cells,
    run_claims,
    signed,
    summarise,
)

__all__ = ["OFFSETS", "STUDY", "EvalPlan", "plot_audit", "render_tables", "run_evaluation"]


#: Offsets of the sweep (the issue's list).
OFFSETS: tuple[float, ...] = (0.0, -0.25, -0.5, -1.0, -2.0, -4.0)


@dataclass(frozen=True)
class EvalPlan:
    """Sizes of one paired evaluation (see :func:`run_evaluation`).

    The default takes roughly 10-20 minutes per model on 2 CPU cores (one torch thread);
    :meth:`quick` about a minute.

    Attributes
    ----------
    contexts : tuple of int
        Perplexity window lengths; each is scored off and at the default offset.
    ppl_tokens : int
        Text tokens of each perplexity text (Moby-Dick, Emma).
    offsets : tuple of float
        The offset sweep (cloze, and perplexity at ``sweep_ppl_context``).
    sweep_ppl_context : int
    ablations : tuple of str
        ``"option=value"`` variants of the hub (e.g. ``"hub_embedding=mean"``) scored for
        perplexity at ``sweep_ppl_context`` with the default offset.
    cloze_n, cloze_batch : int
        Cloze items and items per forward.
    audit_samples, audit_length : int
        Emma paragraphs (of at least ``audit_length`` tokens) in the audit, and their length.
    n_boot, seed : int
        Bootstrap resamples; seed of items and resamples.
    """

    contexts: tuple[int, ...] = (256, 1024)
    ppl_tokens: int = 2048
    offsets: tuple[float, ...] = OFFSETS
    sweep_ppl_context: int = 256
    ablations: tuple[str, ...] = ("hub_embedding=mean", "hub_embedding=zeros", "hub_positions=none")
    cloze_n: int = 120
    cloze_batch: int = 16
    audit_samples: int = 4
    audit_length: int = 128
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        """Every size is checked here, so a bad plan fails before a model loads."""
        if not isinstance(self.contexts, tuple) or not self.contexts:
            raise InputError(f"contexts must be a non-empty tuple of ints, got {self.contexts!r}")
        for ctx in self.contexts:
            require_int(ctx, "contexts", low=8)
        require_int(self.ppl_tokens, "ppl_tokens", low=2)
        if self.ppl_tokens < max(self.contexts):
            raise InputError(
                f"ppl_tokens ({self.ppl_tokens}) must be at least the longest context "
                f"({max(self.contexts)}): no window would fit"
            )
        if not isinstance(self.offsets, tuple) or not self.offsets:
            raise InputError(f"offsets must be a non-empty tuple, got {self.offsets!r}")
        for b in self.offsets:
            if require_real(b, "offsets", finite=False) == math.inf:
                raise InputError("offsets must be finite or -inf, got inf")
        require_int(self.sweep_ppl_context, "sweep_ppl_context", low=8)
        if self.sweep_ppl_context not in self.contexts:
            raise InputError(
                f"sweep_ppl_context ({self.sweep_ppl_context}) must be one of contexts "
                f"{self.contexts}"
            )
        for ab in self.ablations:
            _parse_ablation(ab)
        require_int(self.cloze_n, "cloze_n", low=1)
        require_int(self.cloze_batch, "cloze_batch", low=1)
        require_int(self.audit_samples, "audit_samples", low=1)
        require_int(self.audit_length, "audit_length", low=4)
        require_int(self.n_boot, "n_boot", low=0)
        require_int(self.seed, "seed", low=0)

    @classmethod
    def quick(cls) -> EvalPlan:
        """A smoke-test plan (about a minute for SmolLM2 on one CPU thread)."""
        return cls(
            contexts=(128,),
            ppl_tokens=256,
            offsets=(-0.5,),
            sweep_ppl_context=128,
            ablations=(),
            cloze_n=6,
            audit_samples=1,
            audit_length=32,
            n_boot=200,
        )


def _text(corpus: str) -> str:
    if corpus == "mobydick":
        text = assets.load_text("mobydick")
        return text[text.find("Call me Ishmael") :]
    if corpus == "austen":
        text = assets.load_text("austen", "emma")
        return text[text.find("Emma Woodhouse") :]
    raise InputError(f"unknown corpus {corpus!r}")


def _corpus_ids(tokenizer: Any, corpus: str, n_tokens: int) -> torch.Tensor:
    """The first ``n_tokens`` tokens (no special tokens) of a perplexity text."""
    paras = assets.paragraphs(_text(corpus)[: n_tokens * 8])
    ids = tokenizer("\n\n".join(paras), add_special_tokens=False).input_ids[:n_tokens]
    if len(ids) < n_tokens:
        raise InputError(f"not enough {corpus} text for {n_tokens} tokens")
    return torch.tensor(ids)


def _audit_samples(tokenizer: Any, n: int, length: int) -> list[torch.Tensor]:
    """``n`` Emma paragraphs cut to ``length`` tokens, each tokenised as its own text."""
    out = []
    for para in assets.paragraphs(_text("austen"), min_words=length):
        ids = tokenizer(para).input_ids
        if len(ids) >= length:
            out.append(torch.tensor(ids[:length]))
        if len(out) == n:
            return out
    raise InputError(f"fewer than {n} Emma paragraphs of {length} tokens")


def _parse_ablation(text: str) -> dict[str, Any]:
    key, _, value = str(text).partition("=")
    if not value:
        raise InputError(f"an ablation is 'option=value', got {text!r}")
    val: Any = value
    if key == "hub_token_id":
        val = int(value)
    return {key.strip(): val}


def run_evaluation(
    model_name: str,
    out_dir: str | Path,
    *,
    plan: EvalPlan | None = None,
    arach_options: Mapping[str, Any] | None = None,
    figures: bool = True,
    threads: int | None = None,
    progress: Callable[[str], None] | None = print,
    overwrite: bool = False,
    record_tokens: Callable[[str, torch.Tensor], Any] | None = None,
) -> dict[str, Any]:
    """The paired ARACH evaluation of one offline model: same weights, ARACH off vs on.

    1. Perplexity on Moby-Dick (from "Call me Ishmael") and Emma (from "Emma Woodhouse"): the
       first ``plan.ppl_tokens`` tokens in non-overlapping windows of each ``plan.contexts``
       length (each window starts with the tokenizer's prefix, e.g. Gemma's BOS), off and at
       the default offset, with block-bootstrap intervals of ``ppl_on - ppl_off``; the offset
       sweep and the hub ablations at ``plan.sweep_ppl_context``.
    2. Cloze accuracy on :func:`~attncoda.hooks.evaluate.cloze_items` from the six Austen novels, off and at every
       offset of ``plan.offsets``, with paired bootstrap intervals of the accuracy difference.
    3. The attention audit (:func:`~attncoda.hooks.arach_audit.audit`) on Emma paragraphs, and
       its figures.

    Writes ``results.json``, ``ppl.csv``, ``cloze.csv``, ``audit.nc`` and figures to
    ``out_dir``; returns the results dictionary.

    Parameters
    ----------
    model_name : str
        An offline asset: ``"smollm2-135m"`` or ``"gemma3-270m"``.
    out_dir : path-like
    plan : EvalPlan, optional
        Sizes; default :class:`EvalPlan`; ``EvalPlan.quick()`` for a smoke run.
    arach_options : mapping, optional
        Options of :class:`~attncoda.hooks.arach.ArachConfig` other than ``offset`` (e.g.
        ``hub_embedding``).
    figures : bool, default True
    threads : int, optional
        ``torch.set_num_threads`` for the run (restored afterwards). On a shared, loaded machine
        one thread can be many times faster than two.
    progress : callable, optional
        Receives one line per step (default ``print``).
    overwrite : bool, default False
        Replace an existing output folder (only one attncoda wrote). The folder is written
        beside its place and swapped in when complete.
    record_tokens : callable, optional
        ``record_tokens(label, ids)`` for every token tensor evaluated (the perplexity texts,
        the cloze items, the audit passages), e.g. :meth:`case_studies._study.Provenance.tokens`.

    Raises
    ------
    InputError, UnknownAssetError, OutputExistsError
        Before anything loads: a bad option, an unknown or non-causal model, an output folder
        that may not be written.

    Examples
    --------
    >>> res = run_evaluation("smollm2-135m", "out", plan=EvalPlan.quick())  # doctest: +SKIP
    >>> sorted(res)[:3]  # doctest: +SKIP
    ['ablations', 'arach', 'audit']
    """
    plan = plan or EvalPlan()
    opts = dict(arach_options or {})
    if "offset" in opts:
        raise InputError("the offset is swept; give the other options in arach_options")
    try:
        base = ArachConfig(**opts)
        ablations = [_parse_ablation(a) for a in plan.ablations]
        for ab in ablations:
            dataclasses.replace(base, **ab)  # bad ablations fail before any work
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AttncodaError):
            raise
        raise InputError(f"bad ARACH option: {exc}") from exc
    asset = assets.get_asset(model_name)
    if asset.kind != "model" or model_name == "minilm-l6":
        raise InputError(f"{model_name!r} is not a causal LM; use smollm2-135m or gemma3-270m")
    if threads is not None:
        require_int(threads, "threads", low=1, high=os.cpu_count() or 1)
    say = progress or (lambda _msg: None)
    ac.check_output(out_dir, overwrite=overwrite, kind="folder")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with ac.atomic_output(out_dir, overwrite=overwrite, kind="folder", stamp="arach") as out:
            return _run(
                model_name,
                out,
                plan,
                base,
                ablations,
                figures,
                say,
                assets.load_model,
                assets.load_corpus,
                record_tokens or (lambda _label, _ids: None),
            )
    finally:
        torch.set_num_threads(previous_threads)


def _run(
    model_name: str,
    out: Path,
    plan: EvalPlan,
    base: ArachConfig,
    ablations: list[dict[str, Any]],
    figures: bool,
    say: Callable[[str], None],
    load_model: Callable[..., Any],
    load_corpus: Callable[..., Any],
    record: Callable[[str, torch.Tensor], Any],
) -> dict[str, Any]:
    t0 = time.perf_counter()
    model, tokenizer = load_model(model_name)
    prefix = special_prefix(tokenizer)
    results: dict[str, Any] = {
        "model": model_name,
        "arach": dataclasses.asdict(base),
        "hub_token_id": Arach(model, config=base)._hub_token,
        "plan": dataclasses.asdict(plan),
        "window_prefix": prefix,
        "torch_threads": torch.get_num_threads(),
    }

    def hub(offset: float, **changes: Any) -> Arach:
        return Arach(model, config=dataclasses.replace(base, offset=offset, **changes))

    def stamp() -> str:
        return f"[{time.perf_counter() - t0:6.0f}s]"

    # 1. perplexity
    ppl_rows: list[dict[str, Any]] = []
    ablation_rows: list[dict[str, Any]] = []
    for corpus in ("mobydick", "austen"):
        ids = _corpus_ids(tokenizer, corpus, plan.ppl_tokens)
        record(f"{model_name}/{corpus} (perplexity, before windowing)", ids)
        for ctx in plan.contexts:
            off = score_tokens(model, ids, context=ctx, prefix=prefix)
            offsets = plan.offsets if ctx == plan.sweep_ppl_context else (base.offset,)
            if base.offset not in offsets:
                offsets = (*offsets, base.offset)
            for b in offsets:
                on = score_tokens(model, ids, context=ctx, prefix=prefix, wrapper=hub(b))
                r = perplexity_interval(off, on, n_boot=plan.n_boot, seed=plan.seed)
                ppl_rows.append({"corpus": corpus, "context": ctx, "offset": b, **r.as_dict()})
                say(
                    f"{stamp()} ppl {corpus} T={ctx} b={b:+.2f}: {r.off:.2f} -> {r.on:.2f} "
                    f"(diff {r.diff:+.2f} [{r.low:+.2f}, {r.high:+.2f}])"
                )
            if ctx != plan.sweep_ppl_context:
                continue
            for ab in ablations:
                on = score_tokens(
                    model, ids, context=ctx, prefix=prefix, wrapper=hub(base.offset, **ab)
                )
                r = perplexity_interval(off, on, n_boot=plan.n_boot, seed=plan.seed)
                name = ",".join(f"{k}={v}" for k, v in ab.items())
                ablation_rows.append(
                    {"corpus": corpus, "context": ctx, "offset": base.offset, "variant": name}
                    | r.as_dict()
                )
                say(f"{stamp()} ppl {corpus} T={ctx} {name}: {r.off:.2f} -> {r.on:.2f}")
    results["perplexity"] = ppl_rows
    results["ablations"] = ablation_rows

    # 2. cloze
    items = cloze_items(load_corpus("austen"), n=plan.cloze_n, seed=plan.seed)
    record(
        f"{model_name}/cloze items (context + target, -1 between items)",
        cloze_token_ids(tokenizer, items),
    )
    off_c = cloze_accuracy(model, tokenizer, items, batch_size=plan.cloze_batch)
    cloze_rows = []
    say(f"{stamp()} cloze off: {off_c.accuracy:.3f} (n={len(items)})")
    for b in plan.offsets:
        on_c = cloze_accuracy(model, tokenizer, items, wrapper=hub(b), batch_size=plan.cloze_batch)
        r = paired_bootstrap(off_c.correct, on_c.correct, n_boot=plan.n_boot, seed=plan.seed)
        lp = float(np.mean(on_c.target_logprob - off_c.target_logprob))
        cloze_rows.append({"offset": b, **r.as_dict(), "mean_dlogprob": lp})
        say(
            f"{stamp()} cloze b={b:+.2f}: {r.off:.3f} -> {r.on:.3f} "
            f"(diff {r.diff:+.3f} [{r.low:+.3f}, {r.high:+.3f}])"
        )
    results["cloze"] = cloze_rows
    results["cloze_items"] = [
        {"source": it.source, "index": it.index, "target": it.target} for it in items
    ]

    # 3. audit
    samples = _audit_samples(tokenizer, plan.audit_samples, plan.audit_length)
    record(f"{model_name}/audit passages (emma)", torch.stack(samples))
    ds = audit(model, samples, arach=hub(base.offset))
    ds.attrs["model"] = model_name
    with ac.atomic_output(out / "audit.nc", overwrite=True, is_ours=lambda _path: None) as tmp:
        ds.to_netcdf(tmp)
    results["audit"] = audit_findings(ds)
    results["audit_per_layer"] = {
        name: ds[name].mean("head").values.round(4).tolist()
        for name in ("sink_off", "sink_on", "hub_on", "content_entropy_off", "content_entropy_on")
    }
    results["audit_per_layer"]["dH_total"] = ds.dH_total.mean("head").values.round(4).tolist()
    results["audit_per_layer"]["dH_between"] = ds.dH_between.mean("head").values.round(4).tolist()
    results["audit_per_layer"]["dH_within_content"] = (
        ds.dH_within.sel(group="content").mean("head").values.round(4).tolist()
    )
    say(f"{stamp()} audit: {json.dumps(results['audit'])}")
    if figures:
        files = plot_audit(ds, out, title=model_name)
        files.append(_plot_sweep(cloze_rows, ppl_rows, plan, out, model_name))
        results["figures"] = [f.name for f in files]
    results["seconds"] = round(time.perf_counter() - t0, 1)
    write_text(out / "results.json", json.dumps(results, indent=1))
    for name, rows in (("ppl.csv", ppl_rows + ablation_rows), ("cloze.csv", cloze_rows)):
        if rows:
            ac.write_table(rows, out / name)
    return results


def plot_audit(ds: Any, out_dir: str | Path, *, title: str = "") -> list[Path]:
    """Figures of where attention mass moves with ARACH (needs matplotlib; no backend is set).

    Writes ``audit_layers.png`` (per layer: sink off/on and hub share, mean over heads),
    ``audit_heads.png`` (layer x head maps of the sink change and the hub share),
    ``audit_groups.png`` (stacked sink/hub/content shares per layer, off vs on) and
    ``audit_entropy.png`` (the entropy attribution per layer).

    Returns
    -------
    list of Path
        The files written.
    """
    from matplotlib.figure import Figure  # optional dependency (attncoda[analysis])

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layers = ds.layer.values
    files = []

    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    ax.plot(layers, ds.sink_off.mean("head"), "o-", label="sink share, ARACH off")
    ax.plot(layers, ds.sink_on.mean("head"), "o-", label="sink share, ARACH on")
    ax.plot(layers, ds.hub_on.mean("head"), "s--", label="hub share, ARACH on")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention mass (mean over heads, queries)")
    ax.set_title(f"{title} where attention mass moves".strip())
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    files.append(out / "audit_layers.png")
    ac.save_figure(fig, files[-1], formats=["png"], dpi=120)

    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    d_sink = (ds.sink_on - ds.sink_off).values
    lim = float(np.abs(d_sink).max()) or 1.0
    im0 = axes[0].imshow(d_sink, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    axes[0].set_title("sink share on - off")
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    fig.colorbar(im0, ax=axes[0])
    im1 = axes[1].imshow(ds.hub_on.values, aspect="auto", cmap="viridis")
    axes[1].set_title("hub share (on)")
    axes[1].set_xlabel("head")
    fig.colorbar(im1, ax=axes[1])
    fig.suptitle(title)
    fig.tight_layout()
    files.append(out / "audit_heads.png")
    ac.save_figure(fig, files[-1], formats=["png"], dpi=120)

    fig = Figure(figsize=(9, 4.0))
    ax = fig.subplots()
    width = 0.4
    colors = {"sink": "#c44e52", "hub": "#55a868", "content": "#4c72b0"}
    for k, (name, shift) in enumerate((("shares_off", -width / 2), ("shares_on", width / 2))):
        bottom = np.zeros(len(layers))
        sh = ds[name].mean("head")
        for g in ("sink", "hub", "content"):
            v = sh.sel(group=g).values
            ax.bar(
                layers + shift,
                v,
                width,
                bottom=bottom,
                color=colors[g],
                alpha=0.55 if k == 0 else 1.0,
                label=f"{g} ({'off' if k == 0 else 'on'})",
            )
            bottom += v
    ax.set_xlabel("layer (left bar: off, right bar: on)")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1)
    ax.legend(ncol=6, fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_title(f"{title} sink / hub / content shares".strip())
    fig.tight_layout()
    files.append(out / "audit_groups.png")
    ac.save_figure(fig, files[-1], formats=["png"], dpi=120)

    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    ax.plot(layers, ds.dH_total.mean("head"), "k-o", label="total entropy change")
    ax.plot(layers, ds.dH_between.mean("head"), "-o", label="between groups")
    for g in ("sink", "hub", "content"):
        ax.plot(layers, ds.dH_within.sel(group=g).mean("head"), "--", label=f"within {g}")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_ylabel("nats")
    ax.set_title(f"{title} entropy change off -> on, attributed".strip())
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    files.append(out / "audit_entropy.png")
    ac.save_figure(fig, files[-1], formats=["png"], dpi=120)
    return files


def _plot_sweep(
    cloze_rows: list[dict[str, Any]],
    ppl_rows: list[dict[str, Any]],
    plan: EvalPlan,
    out: Path,
    title: str,
) -> Path:
    from matplotlib.figure import Figure  # optional dependency (attncoda[analysis])

    fig = Figure(figsize=(9, 3.5))
    axes = fig.subplots(1, 2)
    b = np.array([r["offset"] for r in cloze_rows])
    d = np.array([r["diff"] for r in cloze_rows])
    lo = np.array([r["low"] for r in cloze_rows])
    hi = np.array([r["high"] for r in cloze_rows])
    axes[0].errorbar(b, d, yerr=[d - lo, hi - d], fmt="o-", capsize=3)
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].set_xlabel("offset b")
    axes[0].set_ylabel("cloze accuracy on - off")
    for corpus in ("mobydick", "austen"):
        rows = [
            r for r in ppl_rows if r["corpus"] == corpus and r["context"] == plan.sweep_ppl_context
        ]
        if len(rows) > 1:
            bb = np.array([r["offset"] for r in rows])
            dd = np.array([r["diff"] for r in rows])
            ll = np.array([r["low"] for r in rows])
            hh = np.array([r["high"] for r in rows])
            axes[1].errorbar(bb, dd, yerr=[dd - ll, hh - dd], fmt="o-", capsize=3, label=corpus)
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_xlabel("offset b")
    axes[1].set_ylabel(f"perplexity on - off (T={plan.sweep_ppl_context})")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(frameon=False)
    fig.suptitle(f"{title}: paired differences, 95% bootstrap intervals")
    fig.tight_layout()
    path = out / "sweep.png"
    ac.save_figure(fig, path, formats=["png"], dpi=120)
    return path


# ------------------------------------------------------------------------------------ the study

# ``python -m case_studies.arach run|table|quick`` (``case_studies._study``): ``run`` is the
# paired evaluation of both models with the default plan (one torch thread), ``quick`` the
# ``EvalPlan.quick()`` smoke run of SmolLM2-135M compared with ``golden/``.

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELS = ("smollm2-135m", "gemma3-270m")
TEXTS = {"mobydick": "Moby-Dick", "austen": "Emma"}


def _run_study(out: Path, args: Any, prov: Any) -> None:
    """The claim study (:mod:`case_studies.arach.claims`) of ``args.models`` into ``out/claims``,
    resumable: complete cells are kept, and no new cell starts after ``--time-limit`` minutes."""
    plan = ClaimPlan()
    root = out / "claims"
    t0 = time.perf_counter()
    for name in args.models:
        for asset in (name, "austen", "mobydick", "wikipedia"):
            prov.asset(asset)
        left = seconds_left(args, t0)
        counts = run_claims(
            name, root, plan=plan, time_limit_s=left, shard=args.shard, record_tokens=prov.tokens
        )
        prov.settings.setdefault("cells", {})[name] = counts
    write_claim_outputs(root, n_boot=plan.n_boot, seed=plan.seed)
    prov.settings.update(plan=dataclasses.asdict(plan), models=list(args.models), threads=1)
    # the run's own commit is not every cell's: each cell names the commit and tree state
    # that made it, and the manifest lists them (every cell from a modified tree by name)
    prov.settings["cell_provenance"] = cell_provenance(load_cells(root))


def write_claim_outputs(
    root: Path, *, n_boot: int, seed: int, figures: bool = True
) -> list[dict[str, Any]]:
    """``claims.csv`` (one row per model, configuration and measure) and the sweep figures,
    from the cells under ``root``."""
    rows = summarise(root, n_boot=n_boot, seed=seed)
    if rows:
        ac.write_table(rows, root / "claims.csv")
    if figures:
        for model in sorted({r["model"] for r in rows}):
            plot_claims(rows, model, root / f"{model}-by-offset.png")
    return rows


def plot_claims(rows: list[dict[str, Any]], model: str, path: Path) -> Path | None:
    """Paired differences against b, one line per hub-position rule, for each measure."""
    from matplotlib.figure import Figure  # optional dependency (attncoda[analysis])

    measures = ("cloze", "cloze-in-context", "ppl-mobydick", "ppl-wikipedia")
    mine = [r for r in rows if r["model"] == model]
    if not mine:
        return None
    fig = Figure(figsize=(12, 3.2))
    axes = fig.subplots(1, len(measures))
    for ax, measure in zip(axes, measures, strict=True):
        for rule, marker in (("same", "o-"), ("none", "s--")):
            sel = sorted(
                (r for r in mine if r["measure"] == measure and r["hub_positions"] == rule),
                key=lambda r: r["offset"],
            )
            if not sel:
                continue
            b = np.array([r["offset"] for r in sel])
            d = np.array([r["diff"] for r in sel])
            lo = np.array([r["low"] for r in sel])
            hi = np.array([r["high"] for r in sel])
            ax.errorbar(
                b, d, yerr=[d - lo, hi - d], fmt=marker, capsize=3, label=f"hub_positions={rule}"
            )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("offset b")
        ax.set_title(measure, fontsize=9)
        ax.set_ylabel(
            "accuracy on − plain" if measure.startswith("cloze") else "perplexity on − plain"
        )
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"{model}: ARACH − plain, paired 95% bootstrap intervals")
    fig.tight_layout()
    ac.save_figure(fig, path, formats=["png"], dpi=110)
    return path


#: The configurations of the quick claim run (CI).
QUICK_CONFIGS = (Config(), Config(-0.5, "same"), Config(-0.5, "none"))


def _quick(out: Path, prov: Any) -> None:
    """``EvalPlan.quick()`` and ``ClaimPlan.quick()`` on SmolLM2-135M, one torch thread."""
    for asset in ("smollm2-135m", "austen", "mobydick", "wikipedia"):
        prov.asset(asset)
    run_evaluation(
        "smollm2-135m",
        out,
        plan=EvalPlan.quick(),
        threads=1,
        progress=None,
        record_tokens=prov.tokens,
    )
    quick = ClaimPlan.quick()
    run_claims(
        "smollm2-135m",
        out / "claims",
        plan=quick,
        configs=QUICK_CONFIGS,
        progress=None,
        record_tokens=prov.tokens,
    )
    write_claim_outputs(out / "claims", n_boot=quick.n_boot, seed=quick.seed, figures=False)
    write_text(out / "claims.csv", (out / "claims" / "claims.csv").read_text(encoding="utf-8"))
    prov.settings.update(
        plan=dataclasses.asdict(EvalPlan.quick()),
        claim_plan=dataclasses.asdict(quick),
        models=["smollm2-135m"],
    )


def _arguments(parser: Any) -> None:
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(CLAIM_MODELS),
        choices=list(CLAIM_MODELS),
        help="models of the claim study, run in this order (default: all three)",
    )
    add_time_limit(parser, seconds_alias=True)
    add_shard(parser)


def _b(offset: float) -> str:
    return f"{offset:g}".replace("-", MINUS)


def _ci(r: Mapping[str, Any], digits: int = 2) -> str:
    return f"{signed(r['diff'], digits)} [{signed(r['low'], digits)}, {signed(r['high'], digits)}]"


def _direction(row: Mapping[str, Any], better_is_up: bool) -> str:
    """``worse`` / ``better`` when the interval excludes 0, else ``not resolved``."""
    if row["low"] > 0 or row["high"] < 0:
        return "better" if (row["low"] > 0) == better_is_up else "worse"
    return "not resolved"


def evaluation_findings(res: Mapping[str, Mapping[str, Any]]) -> str:
    """The earlier evaluation's comparison with the GPT-2 reference, every number from
    ``results/<model>/results.json`` (``res``: model -> results)."""
    parts = []
    cloze = []
    for m, r in res.items():
        default = r["arach"]["offset"]
        row = next(x for x in r["cloze"] if x["offset"] == default)
        cloze.append(
            f"{m} {signed(row['diff'] * 100, 1)} points "
            f"[{signed(row['low'] * 100, 1)}, {signed(row['high'] * 100, 1)}] "
            f"({_direction(row, True)})"
        )
    b = _b(next(iter(res.values()))["arach"]["offset"])
    parts.append(f"At b = {b}, cloze accuracy ARACH − plain: " + "; ".join(cloze) + ".")
    rel, kinds = [], {"worse": 0, "better": 0, "not resolved": 0}
    for r in res.values():
        for row in r["perplexity"]:
            if row["offset"] == r["arach"]["offset"]:
                rel.append(row["diff"] / row["off"] * 100)
                kinds[_direction(row, False)] += 1
    parts.append(
        f"Perplexity at b = {b} (both texts, both window lengths, both models) changes by "
        f"{signed(min(rel), 0)}% to {signed(max(rel), 0)}%: "
        + ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
        + " (interval against 0)."
    )
    sweep_rows = [
        (m, row)
        for m, r in res.items()
        for row in r["perplexity"]
        if row["context"] == r["plan"]["sweep_ppl_context"]
    ]
    cloze_rows = [(m, row) for m, r in res.items() for row in r["cloze"]]
    better = sum(_direction(row, False) == "better" for _, row in sweep_rows) + sum(
        _direction(row, True) == "better" for _, row in cloze_rows
    )
    offsets = sorted({row["offset"] for _, row in sweep_rows})
    parts.append(
        f"Over the offset sweep (b from {_b(offsets[-1])} to {_b(offsets[0])}; "
        f"{len(sweep_rows)} perplexity and {len(cloze_rows)} cloze rows), {better} "
        "interval(s) lie on the paper's side of 0."
    )
    m, best = min(sweep_rows, key=lambda mr: mr[1]["diff"] / mr[1]["off"])
    parts.append(
        f"The closest case is {m} on {TEXTS[best['corpus']]} at b = {_b(best['offset'])}: "
        f"{_ci(best)} ({_direction(best, False)}; `results/{m}/results.json`, `perplexity`, "
        f"context {best['context']})."
    )
    monotone = 0
    series = 0
    for r in res.values():
        for corpus in TEXTS:
            on = [
                row["on"]
                for row in sorted(r["perplexity"], key=lambda x: -x["offset"])
                if row["corpus"] == corpus and row["context"] == r["plan"]["sweep_ppl_context"]
            ]
            series += 1
            monotone += all(a >= b for a, b in itertools.pairwise(on))
    parts.append(
        f"ARACH's perplexity falls monotonically as b decreases in {monotone} of {series} "
        "model × text series (b = −∞ is the plain model)."
    )
    return " ".join(parts)


def earlier_sensitivity(res: Mapping[str, Mapping[str, Any]]) -> str:
    """The earlier evaluation's hub variants read as a sensitivity check (``ablations`` of
    ``results/<model>/results.json``): how many rows are worse, better or not resolved."""
    rows = [(m, row) for m, r in res.items() for row in r["ablations"]]
    if not rows:
        return "The earlier evaluation ran no hub variants."
    kinds = {"worse": 0, "better": 0, "not resolved": 0}
    for _m, row in rows:
        kinds[_direction(row, False)] += 1
    variants = sorted({row["variant"] for _m, row in rows})
    r0 = next(iter(res.values()))
    return (
        f"The earlier evaluation already changed the hub embedding and positions alone "
        f"({', '.join(f'`{v}`' for v in variants)}; b = {_b(r0['arach']['offset'])}, windows "
        f"of {r0['plan']['sweep_ppl_context']} tokens, {r0['plan']['ppl_tokens']:,} tokens per "
        f"text, [hub variants table](#results)) on {' and '.join(res)}: of its {len(rows)} "
        "perplexity rows, "
        + ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
        + " (interval against 0)."
    )


def audit_prose(res: Mapping[str, Mapping[str, Any]]) -> str:
    """The audit's reading, one bullet per model, every number from ``results.json``'s
    ``audit`` and ``audit_per_layer``: does mass leave the sink for the hub, most visibly in
    the strongest-sink layer?"""
    lines = []
    for m, r in res.items():
        a = r["audit"]
        per = r["audit_per_layer"]
        hub = np.asarray(per["hub_on"])
        same_layer = a["strongest_sink_layer"] == a["largest_drop_layer"]
        drop = a["mean_sink_off"] - a["mean_sink_on"]
        ratio = drop / a["mean_hub_on"] if a["mean_hub_on"] > 0 else float("inf")
        yes = same_layer and ratio <= 1
        text = f"- **{m}: {'yes' if yes else 'not in this form'}.** "
        text += (
            f"The strongest sink, layer {a['strongest_sink_layer']} "
            f"({fixed(a['strongest_sink_off'], 2)} → {fixed(a['strongest_sink_on'], 2)}), "
            + (
                f"is also where the sink drops most ({fixed(a['largest_drop'], 2)})"
                if same_layer
                else f"is not where the sink drops most (layer {a['largest_drop_layer']}: "
                f"{fixed(a['largest_drop'], 2)})"
            )
            + f"; the hub takes {fixed(a['strongest_hub_on'], 2)} of the "
            f"attention in that layer. Averaged over layers the sink falls "
            f"{fixed(a['mean_sink_off'], 2)} → {fixed(a['mean_sink_on'], 2)} and the hub takes "
            f"{fixed(a['mean_hub_on'], 3)} (at most {fixed(hub.max(), 2)}, layer {int(hub.argmax())}): "
        )
        if ratio <= 1:
            text += (
                f"the sink's loss is {fixed(ratio * 100, 0)}% of the hub's share, the rest of the hub's "
                "share comes from content. "
            )
        else:
            text += (
                f"the sink loses {fixed(ratio, 1)}× what the hub takes, so most of that mass goes to "
                "content, an indirect effect of the changed hidden states rather than direct "
                "competition for the row's mass (a reading, not tested). "
            )
        within = a["mean_dH_within_content"]
        text += (
            f"Across layers corr(sink off, sink drop) = {fixed(a['corr_sink_off_vs_drop'], 2)}. "
            f"The entropy changes by {signed(a['mean_dH_total'], 2)} nats: "
            f"{signed(a['mean_dH_between'], 2)} between groups, "
            f"{signed(within, 2)} within content."
        )
        lines.append(text)
    return "\n".join(lines)


def _run_provenance(results: Path) -> str:
    """The last run's manifest, saying how many cells that run computed: its commit and tree
    state are that run's, not every cell's (``claims-provenance`` lists those)."""
    from .._study import provenance_table, read_manifest

    table = provenance_table(results)
    cells = read_manifest(results).get("settings", {}).get("cells", {})
    done = sum(int(c.get("done", 0)) for c in cells.values()) if cells else None
    if done is None:
        return table
    lines = table.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| commit |"):
            lines[i] = line[: -len(" |")] + (
                f"; the last run, which computed {done} of the cells below |"
            )
    return "\n".join(lines)


def render_tables(results: Path) -> dict[str, str]:
    """The README tables: the claim study's from ``results/claims/`` (cells), the earlier
    evaluation's from ``results/<model>/results.json`` and its provenance from
    ``results/evaluation/manifest.json`` (``table`` renders them)."""
    from .._study import markdown_table, provenance_table

    claim = claim_tables(results / "claims")
    evaluation = {"provenance-evaluation": provenance_table(results / "evaluation")}
    claim["provenance"] = _run_provenance(results)

    res = {m: json.loads((results / m / "results.json").read_text()) for m in MODELS}
    ppl, sweep, variants, cloze, audit_rows = [], [], [], [], []
    offsets = sorted({row["offset"] for r in res.values() for row in r["perplexity"]}, reverse=True)
    for m, r in res.items():
        default = r["arach"]["offset"]
        ctx = r["plan"]["sweep_ppl_context"]
        for row in r["perplexity"]:
            if row["offset"] == default:
                ppl.append(
                    [
                        m,
                        TEXTS[row["corpus"]],
                        row["context"],
                        fixed(row["off"], 2),
                        fixed(row["on"], 2),
                        _ci(row),
                    ]
                )
        for corpus, text in TEXTS.items():
            rows = {
                row["offset"]: row
                for row in r["perplexity"]
                if row["corpus"] == corpus and row["context"] == ctx
            }
            off = next(iter(rows.values()))["off"]
            sweep.append(
                [
                    m,
                    text,
                    fixed(off, 2),
                    *(fixed(rows[b]["on"], 2) if b in rows else "" for b in offsets),
                ]
            )
        for row in r["ablations"]:
            variants.append(
                [
                    m,
                    TEXTS[row["corpus"]],
                    row["variant"],
                    fixed(row["off"], 2),
                    fixed(row["on"], 2),
                    _ci(row),
                ]
            )
        for row in r["cloze"]:
            cloze.append(
                [
                    m,
                    _b(row["offset"]),
                    fixed(row["off"], 3),
                    fixed(row["on"], 3),
                    _ci(row, 3),
                    signed(row["mean_dlogprob"], 3),
                ]
            )
        a = r["audit"]
        within = a["mean_dH_within_content"]
        audit_rows.append(
            [
                m,
                f"L{a['strongest_sink_layer']}: {fixed(a['strongest_sink_off'], 3)} → "
                f"{fixed(a['strongest_sink_on'], 3)}, {fixed(a['strongest_hub_on'], 3)}",
                f"{fixed(a['largest_drop'], 3)} (L{a['largest_drop_layer']})",
                f"{fixed(a['mean_sink_off'], 3)} → {fixed(a['mean_sink_on'], 3)}",
                fixed(a["mean_hub_on"], 3),
                f"{fixed(a['mean_content_entropy_off'], 3)} → {fixed(a['mean_content_entropy_on'], 3)}",
                f"{signed(a['mean_dH_total'], 3)} = {signed(a['mean_dH_between'], 3)} "
                f"{'+' if within >= 0 else MINUS} {fixed(abs(within), 3)}",
                signed(a["corr_sink_off_vs_drop"], 2),
            ]
        )
    return {
        **claim,
        **evaluation,
        "evaluation-findings": evaluation_findings(res),
        "sensitivity-earlier": earlier_sensitivity(res),
        "audit-findings": audit_prose(res),
        "perplexity": markdown_table(
            ["model", "text", "context", "ppl off", "ppl on", "on − off [95% CI]"], ppl
        ),
        "sweep": markdown_table(["model", "text", "off", *(f"b={_b(b)}" for b in offsets)], sweep),
        "variants": markdown_table(
            ["model", "text", "variant", "ppl off", "ppl on", "on − off [95% CI]"], variants
        ),
        "cloze": markdown_table(
            ["model", "b", "acc off", "acc on", "on − off [95% CI]", "mean Δ log p(target)"],
            cloze,
        ),
        "audit": markdown_table(
            [
                "model",
                "strongest-sink layer: sink off → on, hub share",
                "largest sink drop",
                "mean sink off → on",
                "mean hub share",
                "content entropy off → on",
                "ΔH = between + within content",
                "corr(sink off, sink drop) over layers",
            ],
            audit_rows,
        ),
    }


#: The quick mode's files CI compares with ``golden/``. Perplexity and cloze use fixed tokens
#: and greedy scoring, the bootstrap is seeded, so a rerun on this machine repeats them; rtol
#: 1e-4 leaves room for another CPU's float rounding (a cloze item whose greedy answer flips
#: would still show, as it should). ARACH − plain and its interval ends are differences of two
#: perplexities of similar size: another machine's rounding of the operands (about 1e-5
#: relative) moves them by more than 1e-4 of themselves, so their tolerance is 1e-4 of the
#: operands (:class:`~case_studies._study.Golden` ``derived``). Timings, thread count and
#: figure names are not results.
DIFFERENCES: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (col, ("off", "on")) for col in ("diff", "low", "high")
)
GOLDEN = (
    Golden("claims.csv", rtol=1e-4, atol=1e-6, derived=DIFFERENCES),
    Golden("ppl.csv", rtol=1e-4, atol=1e-6, derived=DIFFERENCES),
    Golden("cloze.csv", rtol=1e-4, atol=1e-6, derived=DIFFERENCES),
    Golden(
        "results.json",
        rtol=1e-4,
        atol=1e-6,
        ignore=("seconds", "torch_threads", "figures"),
        derived=DIFFERENCES,
    ),
)

STUDY = Study(
    name="arach",
    description="ARACH hub tokens: the claim study (the paper's cloze and perplexity gains "
    "tested on SmolLM2-135M, Gemma-3-270M and Qwen2.5-Coder-0.5B, paired against the plain "
    "model, resumable); `quick` also reruns the earlier evaluation's smoke plan.",
    run=_run_study,
    quick=_quick,
    tables=render_tables,
    golden=GOLDEN,
    assets=(*CLAIM_MODELS, "austen", "mobydick", "wikipedia"),
    add_arguments=_arguments,
    docs=("docs/case-studies/arach.md",),
)


def main(argv: Any = None) -> int:
    return study_main(STUDY, argv)
