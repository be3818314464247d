"""The ARACH claim study (issue #16): the paper's two GPT-2 claims tested on three offline models.

The paper (arXiv 2603.11067) reports for GPT-2 small that ARACH raises LAMBADA accuracy and
lowers PG-19 perplexity (its numbers are in no source held here: the PDF was never available,
``reference/papers.md``). This module measures the
same two quantities, paired (the same weights and the same tokens with ARACH off and on):

- **cloze**: LAMBADA-style last-word items (:func:`claim_items`) drawn deterministically, the
  same number from each source (Austen's six novels, Moby-Dick, the Wikipedia sample),
  *without* the "target already in context" filter; each item carries ``in_context`` so the
  filtered task is a secondary result of the same run;
- **perplexity**: the first ``ppl_tokens`` tokens of Moby-Dick (from "Call me Ishmael") and of
  the Wikipedia sample in non-overlapping windows of ``context`` tokens
  (:func:`attncoda.hooks.evaluate.text_windows`), with the summed NLL of every window stored so
  the paired bootstrap resamples whole windows.

Every (model, configuration, task) is one **cell**, a JSON file written atomically as soon as it
is done (:func:`run_claims`); a rerun skips every cell that is complete and made from the same
tokens, and redoes a cell that is missing, unreadable or stale. So a long run can be stopped
(``time_limit_s``, Ctrl-C, a crash) and continued later with the same command.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attncoda as ac
from attncoda import InputError, require_int, require_real
from attncoda.hooks import assets
from attncoda.hooks.arach import LAYER_SETS, Arach, ArachConfig
from attncoda.hooks.evaluate import (
    ClozeItem,
    cloze_accuracy,
    cloze_items,
    paired_bootstrap,
    perplexity,
    perplexity_of_nll,
    text_windows,
    tokens_sha256,
)

from .._study import Shard, fixed, scientific, significant, time_is_up, write_text

__all__ = [
    "CELL_FORMAT",
    "CLAIM_MODELS",
    "ClaimPlan",
    "Config",
    "cell_path",
    "claim_configs",
    "claim_items",
    "load_cells",
    "read_cell",
    "run_claims",
    "summarise",
]

#: The models of the claim study (the issue's "Qwen2.5-0.5B" is the offline Coder-Instruct model).
CLAIM_MODELS: tuple[str, ...] = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")
#: The model that gets the full offset sweep.
SWEEP_MODEL = "smollm2-135m"
CLOZE_SOURCES: tuple[str, ...] = ("austen", "mobydick", "wikipedia")
PPL_TEXTS: tuple[str, ...] = ("mobydick", "wikipedia")
#: Written into every cell; a cell of another format is redone.
CELL_FORMAT = "arach-claim-cell/1"


@dataclass(frozen=True)
class Config:
    """One arm of the comparison: the plain model (``offset is None``) or ARACH with an offset,
    a hub-position rule, a hub embedding and the layers that see the hubs (the other options
    keep :class:`ArachConfig`'s defaults).

    ``hub_embedding`` and ``layers`` are the sensitivity sweep's choices (:data:`SENSITIVITY`);
    at their defaults (``"token"``, ``"all"``) the name is the claim study's ``same_b-0.5``.

    Examples
    --------
    >>> Config(-0.5, "same", hub_embedding="zeros", layers="last_half").name
    'same_b-0.5_emb-zeros_layers-last_half'
    """

    offset: float | None = None
    hub_positions: str = "same"
    hub_embedding: str = "token"
    layers: str = "all"

    def __post_init__(self) -> None:
        if self.offset is not None:
            b = require_real(self.offset, "offset")
            object.__setattr__(self, "offset", float(b))
        if self.hub_positions not in ("same", "none"):
            raise InputError(f"hub_positions must be 'same' or 'none', got {self.hub_positions!r}")
        if self.hub_embedding not in ("token", "mean", "zeros"):
            raise InputError(
                f"hub_embedding must be 'token', 'mean' or 'zeros', got {self.hub_embedding!r}"
            )
        if self.layers not in ("all", *LAYER_SETS):
            raise InputError(f"layers must be 'all' or one of {LAYER_SETS}, got {self.layers!r}")
        if self.offset is None and (self.hub_embedding, self.layers) != ("token", "all"):
            raise InputError("the plain configuration has no hub options")

    @property
    def name(self) -> str:
        """``plain``, ``same_b-0.5``, ``none_b-2``, ``same_b-0.5_emb-zeros`` (a file name)."""
        if self.offset is None:
            return "plain"
        name = f"{self.hub_positions}_b{self.offset:g}"
        if self.hub_embedding != "token":
            name += f"_emb-{self.hub_embedding}"
        if self.layers != "all":
            name += f"_layers-{self.layers}"
        return name

    @property
    def label(self) -> str:
        """A table label: ``plain`` or ``'same', b = −0.5``."""
        if self.offset is None:
            return "plain"
        return f"{self.hub_positions}, b = {self.offset:g}".replace("-", "\u2212")

    def arach(self) -> ArachConfig:
        if self.offset is None:
            raise InputError("the plain configuration has no ARACH options")
        return ArachConfig(
            offset=self.offset,
            hub_positions=self.hub_positions,  # type: ignore[arg-type]
            hub_embedding=self.hub_embedding,  # type: ignore[arg-type]
            layers=None if self.layers == "all" else self.layers,
        )


#: The configurations every model runs (the issue's list), in the order they are run.
CORE_CONFIGS: tuple[Config, ...] = (
    Config(),
    Config(-0.5, "same"),
    Config(-0.5, "none"),
    Config(-1.0, "none"),
    Config(-2.0, "none"),
)
#: The offset grid of the full sweep (SmolLM2 only, both hub-position rules).
SWEEP: tuple[float, ...] = (0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0)
#: The sensitivity sweep (SmolLM2 only; issue #28): the reconstruction's choices the paper does
#: not fix, one at a time from the default ``same_b-0.5`` (hub embedding: the BOS token, the
#: mean of the prefix embeddings, zeros; the layers that see the hubs: all, the first or the
#: last half). The third choice, where the hubs sit, is the ``same``/``none`` pair of the sweep.
SENSITIVITY: tuple[Config, ...] = (
    Config(-0.5, "same", hub_embedding="zeros"),
    Config(-0.5, "same", hub_embedding="mean"),
    Config(-0.5, "same", layers="first_half"),
    Config(-0.5, "same", layers="last_half"),
)
#: The long-context check (SmolLM2 only; max_position_embeddings 8192): the same perplexity
#: tokens as the 1,024-token cells, in windows of this length, for these configurations.
LONG_CONTEXT = 2048
LONG_CONFIGS: tuple[Config, ...] = (Config(), Config(-0.5, "same"), Config(-1.0, "none"))


def claim_configs(model: str, sweep: Sequence[float] = SWEEP) -> list[Config]:
    """The configurations of one model: the core list, then (for SmolLM2) the rest of the sweep.

    Examples
    --------
    >>> [c.name for c in claim_configs("gemma3-270m")]
    ['plain', 'same_b-0.5', 'none_b-0.5', 'none_b-1', 'none_b-2']
    >>> len(claim_configs("smollm2-135m"))
    19
    """
    out = list(CORE_CONFIGS)
    if model == SWEEP_MODEL:
        for rule in ("same", "none"):
            for b in sweep:
                c = Config(b, rule)
                if c not in out:
                    out.append(c)
        out += [c for c in SENSITIVITY if c not in out]
    return out


@dataclass(frozen=True)
class ClaimPlan:
    """Sizes of the claim study.

    Attributes
    ----------
    cloze_per_source : int
        Cloze items drawn from each of Austen, Moby-Dick and Wikipedia (400: 1,200 in all, a
        95% half-width of at most 2.8 points on an accuracy).
    cloze_window : int
        Words of context before each target.
    ppl_tokens, context : int
        Perplexity tokens of each text (rounded up to whole windows) and the window length.
    cloze_batch, ppl_batch : int
        Items and windows per forward.
    sweep : tuple of float
        The offset grid of the SmolLM2 sweep.
    long_context : int or None
        Window length of the long-context perplexity cells (SmolLM2, :data:`LONG_CONFIGS`; the
        same ``ppl_tokens`` in fewer, longer windows); None runs none.
    n_boot, seed : int
    """

    cloze_per_source: int = 400
    cloze_window: int = 80
    ppl_tokens: int = 16384
    context: int = 1024
    cloze_batch: int = 16
    ppl_batch: int = 1
    sweep: tuple[float, ...] = SWEEP
    long_context: int | None = LONG_CONTEXT
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        require_int(self.cloze_per_source, "cloze_per_source", low=1)
        require_int(self.cloze_window, "cloze_window", low=1)
        require_int(self.context, "context", low=8)
        require_int(self.ppl_tokens, "ppl_tokens", low=self.context)
        require_int(self.cloze_batch, "cloze_batch", low=1)
        require_int(self.ppl_batch, "ppl_batch", low=1)
        if self.long_context is not None:
            require_int(self.long_context, "long_context", low=self.context + 1)
            if self.ppl_tokens % self.long_context:
                raise InputError(
                    f"ppl_tokens ({self.ppl_tokens}) must be a multiple of long_context "
                    f"({self.long_context}), so both window lengths score the same tokens"
                )
        require_int(self.n_boot, "n_boot", low=0)
        require_int(self.seed, "seed", low=0)
        if not isinstance(self.sweep, tuple) or not self.sweep:
            raise InputError(f"sweep must be a non-empty tuple of offsets, got {self.sweep!r}")
        for b in self.sweep:
            require_real(b, "sweep")

    @classmethod
    def quick(cls) -> ClaimPlan:
        """A CI smoke plan: 3 items per source (of 40 words of context), two windows of 64
        tokens per text."""
        return cls(
            cloze_per_source=3,
            cloze_window=40,
            ppl_tokens=128,
            context=64,
            sweep=(-0.5,),
            long_context=None,
            n_boot=200,
        )


# --------------------------------------------------------------------------------------------
# items and windows


def _source_texts(source: str) -> dict[str, str]:
    return assets.load_corpus(source)


def claim_items(
    plan: ClaimPlan, texts: Callable[[str], Mapping[str, str]] = _source_texts
) -> list[ClozeItem]:
    """``plan.cloze_per_source`` unfiltered items from each source, in source then text order.

    ``texts(source)`` gives a source's documents (default: the fetched corpus).
    """
    out: list[ClozeItem] = []
    for source in CLOZE_SOURCES:
        out += cloze_items(
            texts(source),
            n=plan.cloze_per_source,
            window=plan.cloze_window,
            seed=plan.seed,
            require_in_context=False,
        )
    return out


def ppl_text(
    name: str, n_chars: int, texts: Callable[[str], Mapping[str, str]] = _source_texts
) -> str:
    """About ``n_chars`` characters of a perplexity text, paragraphs joined by blank lines:
    Moby-Dick from "Call me Ishmael", the Wikipedia sample from its first article.

    ``texts(name)`` gives the corpus's documents (default: the fetched corpus).
    """
    if name not in PPL_TEXTS:
        raise InputError(f"unknown perplexity text {name!r}; use one of {PPL_TEXTS}")
    docs: list[str] = list(texts(name).values())
    if name == "mobydick":
        whole = "\n\n".join(docs)
        start = whole.find("Call me Ishmael")
        docs = [whole[max(start, 0) :]]
    paras: list[str] = []
    size = 0
    for doc in docs:
        for p in assets.paragraphs(doc):
            paras.append(p)
            size += len(p) + 2
            if size >= n_chars:
                return "\n\n".join(paras)
    return "\n\n".join(paras)


def ppl_windows(
    tokenizer: Any,
    name: str,
    plan: ClaimPlan,
    texts: Callable[[str], Mapping[str, str]] = _source_texts,
    *,
    context: int | None = None,
) -> torch.Tensor:
    """The ``(windows, context)`` ids of one perplexity text (``context``: default
    ``plan.context``; the same text, so the same tokens when no prefix is added, in windows of
    another length)."""
    return text_windows(
        tokenizer,
        ppl_text(name, plan.ppl_tokens * 8, texts),
        window=plan.context if context is None else context,
        n_tokens=plan.ppl_tokens,
    )


def long_task(text: str, context: int) -> str:
    """The task name of a long-context perplexity cell: ``ppl2048-mobydick``."""
    return f"ppl{context}-{text}"


def cloze_token_ids(tokenizer: Any, items: Sequence[ClozeItem]) -> torch.Tensor:
    """The ids the cloze scores (context with special tokens, then ``" " + target``), flattened
    with -1 between items: what a cell's ``tokens_sha256`` proves."""
    flat: list[int] = []
    for it in items:
        flat += tokenizer(it.context).input_ids
        flat += tokenizer(" " + it.target, add_special_tokens=False).input_ids
        flat.append(-1)
    return torch.tensor(flat)


# --------------------------------------------------------------------------------------------
# cells


def cell_path(root: Path, model: str, config: Config, task: str) -> Path:
    """``root/MODEL/CONFIG/TASK.json``."""
    return Path(root) / model / config.name / f"{task}.json"


def _is_cell(path: Path) -> str | None:
    """None if ``path`` is a cell file this study wrote (even a damaged one), else why not."""
    try:
        head = path.read_bytes()[:200]
    except OSError as exc:
        return f"unreadable ({exc})"
    if head == b"" or b'"format": "arach-claim-cell/' in head:
        return None
    return "not an ARACH claim cell (no format marker)"


def read_cell(path: Path, *, tokens: str | None = None, n: int | None = None) -> dict | None:
    """A complete cell, or None if it is missing, unreadable, of another format, made from other
    tokens than ``tokens`` (a sha256) or of another length than ``n``."""
    try:
        cell = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cell, dict) or cell.get("format") != CELL_FORMAT:
        return None
    if tokens is not None and cell.get("tokens_sha256") != tokens:
        return None
    values = cell.get("values")
    if not isinstance(values, dict) or not values:
        return None
    lengths = {len(v) for v in values.values() if isinstance(v, list)}
    if len(lengths) != 1 or (n is not None and lengths != {n}):
        return None
    return cell


def _write_cell(path: Path, cell: Mapping[str, Any]) -> None:
    # "format" first, so _is_cell recognises the file from its first bytes
    text = json.dumps({"format": CELL_FORMAT, **cell}, indent=None)
    with ac.atomic_output(path, overwrite=True, kind="file", is_ours=_is_cell) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


def _git_commit() -> str:
    from .._study import git_state

    state = git_state()
    return state["commit"] + ("+dirty" if state.get("dirty") else "")


@dataclass(frozen=True)
class _Task:
    name: str  # "ppl-mobydick", "cloze-austen", ...
    ids: Any  # windows tensor or the items
    sha: str
    n: int  # values per cell (windows or items)


def run_claims(
    model_name: str,
    root: str | Path,
    *,
    plan: ClaimPlan | None = None,
    configs: Sequence[Config] | None = None,
    time_limit_s: float | None = None,
    shard: Shard | None = None,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = print,
    record_tokens: Callable[[str, torch.Tensor], Any] | None = None,
    load_model: Callable[[str], tuple[Any, Any]] | None = None,
    texts: Callable[[str], Mapping[str, str]] | None = None,
) -> dict[str, int]:
    """Run every missing cell of one model into ``root/MODEL/CONFIG/TASK.json``.

    Cells run in priority order: for the issue's list (:data:`CORE_CONFIGS`), both perplexity
    texts of every configuration (the cheaper kind), then the three cloze sources; then the same
    for the rest of the SmolLM2 sweep; configurations in :func:`claim_configs` order. A cell
    that is complete and made from the same tokens is skipped.

    Parameters
    ----------
    model_name : str
        An offline causal LM (:data:`CLAIM_MODELS`).
    root : path-like
        The cells folder (``results/claims``).
    plan : ClaimPlan, optional
    configs : sequence of Config, optional
        Default :func:`claim_configs` of the model.
    time_limit_s : float, optional
        Seconds after which no new cell starts (the run resumes later where it stopped).
    shard : Shard, optional
        Compute only this shard's cells of the priority order (other processes run the rest).
    threads : int, optional, default 1
        ``torch.set_num_threads`` during the run (restored).
    progress, record_tokens
        One line per cell; ``record_tokens(label, ids)`` for every token tensor scored.
    load_model, texts
        Replace :func:`attncoda.hooks.assets.load_model` and the corpus reader (tests).

    Returns
    -------
    dict
        ``{"done": cells computed, "skipped": complete cells kept, "left": cells not started}``
        (with ``shard``, ``"other_shards"``: missing cells of the other shards).

    Examples
    --------
    >>> run_claims("smollm2-135m", "results/claims", time_limit_s=3600)  # doctest: +SKIP
    """
    plan = plan or ClaimPlan()
    configs = list(configs) if configs is not None else claim_configs(model_name, plan.sweep)
    if not configs or configs[0] != Config():
        raise InputError("the first configuration must be the plain model (the pairing arm)")
    if load_model is None:
        asset = assets.get_asset(model_name)
        if asset.kind != "model" or model_name == "minilm-l6":
            raise InputError(f"{model_name!r} is not a causal LM; use one of {CLAIM_MODELS}")
        load_model = assets.load_model
    if threads is not None:
        require_int(threads, "threads", low=1, high=os.cpu_count() or 1)
    if time_limit_s is not None:
        require_real(time_limit_s, "time_limit_s", low=0)
    root = Path(root)
    ac.check_output(root / model_name, kind="folder", overwrite=True, is_ours=lambda _p: None)
    say = progress or (lambda _msg: None)
    record = record_tokens or (lambda _label, _ids: None)
    t0 = time.perf_counter()
    commit = _git_commit()  # the code that runs is the code at the start (HEAD may move later)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, tok = load_model(model_name)
        tasks: list[_Task] = []
        for name in PPL_TEXTS:
            w = ppl_windows(tok, name, plan, texts or _source_texts)
            record(f"{model_name}/ppl-{name} windows", w)
            tasks.append(_Task(f"ppl-{name}", w, tokens_sha256(w), len(w)))
        items = claim_items(plan, texts or _source_texts)
        by_source = _split_items(items, plan.cloze_per_source)
        write_passages(root, plan, texts or _source_texts)  # the cloze bootstrap's unit
        for source, its in zip(CLOZE_SOURCES, by_source, strict=True):
            ids = cloze_token_ids(tok, its)
            record(f"{model_name}/cloze-{source} (context + target, -1 between items)", ids)
            tasks.append(_Task(f"cloze-{source}", its, tokens_sha256(ids), len(its)))
        long_tasks: list[_Task] = []
        if plan.long_context is not None and model_name == SWEEP_MODEL:
            for name in PPL_TEXTS:
                w = ppl_windows(tok, name, plan, texts or _source_texts, context=plan.long_context)
                label = long_task(name, plan.long_context)
                record(f"{model_name}/{label} windows", w)
                long_tasks.append(_Task(label, w, tokens_sha256(w), len(w)))
        counts = {"done": 0, "skipped": 0, "left": 0, **({"other_shards": 0} if shard else {})}
        # the issue's list (CORE_CONFIGS) completes, perplexity then cloze, before the sweep
        # starts; configuration-major within each kind, so the first configurations finish
        # first; then the long-context cells and the sensitivity sweep (issue #28)
        core = [c for c in configs if c in CORE_CONFIGS]
        rest = [c for c in configs if c not in CORE_CONFIGS and c not in SENSITIVITY]
        order = []
        for group in (core, rest):
            order += [(t, c) for c in group for t in tasks if t.name.startswith("ppl")]
            order += [(t, c) for c in group for t in tasks if t.name.startswith("cloze")]
        # the plain arm at the long context first; the layer choices' perplexity (never
        # measured before); the default arm at the long context; the hub embeddings'
        # perplexity (measured at T = 256 in the earlier evaluation); the sensitivity cloze;
        # the other long-context arms last
        sens = [c for c in configs if c in SENSITIVITY]
        layer_sens = [c for c in sens if c.layers != "all"]
        ppl_tasks = [t for t in tasks if t.name.startswith("ppl")]
        order += [(t, c) for c in configs if c in LONG_CONFIGS[:1] for t in long_tasks]
        order += [(t, c) for c in layer_sens for t in ppl_tasks]
        order += [(t, c) for c in configs if c in LONG_CONFIGS[1:2] for t in long_tasks]
        order += [(t, c) for c in sens if c not in layer_sens for t in ppl_tasks]
        order += [(t, c) for c in sens for t in tasks if t.name.startswith("cloze")]
        order += [(t, c) for c in configs if c in LONG_CONFIGS[2:] for t in long_tasks]
        for position, (task, config) in enumerate(order):
            path = cell_path(root, model_name, config, task.name)
            if read_cell(path, tokens=task.sha, n=task.n) is not None:
                counts["skipped"] += 1
                continue
            if shard is not None and not shard.owns(position):
                counts["other_shards"] += 1
                continue
            if time_is_up(t0, time_limit_s):
                counts["left"] += 1
                continue
            start = time.perf_counter()
            wrapper = None if config.offset is None else Arach(model, config=config.arach())
            if task.name.startswith("ppl"):
                res = perplexity(
                    wrapper if wrapper is not None else model, task.ids, batch_size=plan.ppl_batch
                )
                values: dict[str, list] = {
                    "window_nll": res.nll.tolist(),
                    "window_tokens": res.n_tokens.tolist(),
                }
                summary = f"ppl {res.value:.3f}"
            else:
                c = cloze_accuracy(
                    model, tok, task.ids, wrapper=wrapper, batch_size=plan.cloze_batch
                )
                values = {
                    "correct": c.correct.astype(int).tolist(),
                    "target_logprob": c.target_logprob.tolist(),
                    "in_context": [bool(it.in_context) for it in task.ids],
                }
                summary = f"acc {c.accuracy:.3f}"
            seconds = time.perf_counter() - start
            _write_cell(
                path,
                {
                    "model": model_name,
                    "config": dataclasses.asdict(config),
                    "task": task.name,
                    "tokens_sha256": task.sha,
                    "plan": dataclasses.asdict(plan),
                    "seconds": round(seconds, 1),
                    "torch_threads": torch.get_num_threads(),
                    "commit": commit,
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "values": values,
                },
            )
            counts["done"] += 1
            say(
                f"[{time.perf_counter() - t0:6.0f}s] {model_name} {config.name} {task.name}: "
                f"{summary} ({seconds:.0f} s)"
            )
        return counts
    finally:
        torch.set_num_threads(previous_threads)


def _split_items(items: Sequence[ClozeItem], per_source: int) -> list[list[ClozeItem]]:
    """The items of each source group, in :data:`CLOZE_SOURCES` order (claim_items's order)."""
    return [list(items[i * per_source : (i + 1) * per_source]) for i in range(len(CLOZE_SOURCES))]


def rerun_modified_cells(
    root: str | Path, model_name: str, scratch: str | Path, *, kind: str = "", **run: Any
) -> list[Path]:
    """Recompute whole, at the current clean commit, every cell of ``model_name`` that a
    modified tree made (``+dirty``), into ``root/clean-rerun/`` (:data:`CLEAN_RERUN`), where
    :func:`clean_rerun_note` compares each with the stored cell.

    The stored cells stay the claim cells. :func:`run_claims` computes into ``scratch``, which
    first receives every other cell of the configurations involved (a clean rerun's copy where
    there is one), so that it computes exactly the modified-tree cells: checked before any cell
    is computed.

    Parameters
    ----------
    root : path-like
        The cells folder (``results/claims``).
    model_name : str
    scratch : path-like
        An empty or earlier scratch folder (a rerun cut short resumes there).
    kind : str, optional
        Only the cells whose task starts with it (``"ppl"``, ``"cloze"``).
    **run
        Passed to :func:`run_claims` (``plan``, ``threads``, ``progress``, ``load_model``, ...).

    Returns
    -------
    list of Path
        The cells written under ``root/clean-rerun``.

    Raises
    ------
    InputError
        When the working tree has uncommitted changes (the rerun must record a clean commit),
        or when the scratch folder would compute other cells than the modified-tree ones.
    """
    import shutil

    if _git_commit().endswith("+dirty"):
        raise InputError("commit your changes first: a clean rerun must record a clean commit")
    root, scratch = Path(root), Path(scratch)
    stored = load_cells(root)
    dirty = {
        k: c
        for k, c in stored.items()
        if k[0] == model_name
        and k[2].startswith(kind)
        and str(c.get("commit", "")).endswith("+dirty")
    }
    if not dirty:
        return []
    configs = {Config(**c["config"]).name: Config(**c["config"]) for c in dirty.values()}
    configs.pop(Config().name, None)
    order = [Config(), *sorted(configs.values(), key=lambda c: (c.offset is None, c.name))]
    scratch.mkdir(parents=True, exist_ok=True)
    if (root / PASSAGES_FILE).is_file():
        shutil.copy2(root / PASSAGES_FILE, scratch / PASSAGES_FILE)
    for (model, name, task), cell in stored.items():
        if model != model_name or (model, name, task) in dirty:
            continue
        if name not in {c.name for c in order}:
            continue
        config = Config(**cell["config"])
        clean = cell_path(root / CLEAN_RERUN, model, config, task)
        target = cell_path(scratch, model, config, task)
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(clean if clean.is_file() else cell_path(root, model, config, task), target)

    def done(key: tuple[str, str, str]) -> Path | None:
        path = cell_path(scratch, key[0], Config(**dirty[key]["config"]), key[2])
        return path if read_cell(path) is not None else None

    todo = [k for k in dirty if done(k) is None]
    dry = run_claims(
        model_name, scratch, configs=order, **{**run, "time_limit_s": 0, "progress": None}
    )
    if dry["left"] != len(todo):
        raise InputError(
            f"{scratch} would compute {dry['left']} cells, not the {len(todo)} modified-tree "
            "cells left: a configuration involved has cells missing from the store"
        )
    run_claims(model_name, scratch, configs=order, **run)
    written = []
    for key in sorted(dirty):
        path = done(key)
        if path is None:  # a time limit stopped the run first
            continue
        target = root / CLEAN_RERUN / path.relative_to(scratch)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        written.append(target)
    return written


#: The file, beside the cells, of :func:`recheck_cells`.
RECHECK_FILE = "recheck-dirty-cells.json"


def recheck_cells(
    root: Path,
    model_name: str,
    *,
    windows: Sequence[int] = (0,),
    plan: ClaimPlan | None = None,
    load_model: Callable[[str], tuple[Any, Any]] | None = None,
    texts: Callable[[str], Mapping[str, str]] | None = None,
) -> Path:
    """Recompute some windows of every perplexity cell of ``model_name`` that a modified tree
    made (``+dirty``), at the current commit, and write what they gave beside what the cell
    holds (``root/recheck-dirty-cells.json``): a spot check of cells that cannot be rerun whole.

    Windows are the cells' own tokens (:func:`ppl_windows`; a cell of other tokens is refused).
    """
    plan = plan or ClaimPlan()
    root = Path(root)
    cells = {k: c for k, c in load_cells(root).items() if k[0] == model_name}
    dirty = [
        (k, c)
        for k, c in sorted(cells.items())
        if str(c.get("commit", "")).endswith("+dirty") and k[2].startswith("ppl")
    ]
    dirty.sort(key=lambda kc: kc[0][1] != "plain")  # the plain arm pairs with every row: first
    model_obj, tok = (load_model or assets.load_model)(model_name)
    commit = _git_commit()
    out = []
    torch.set_num_threads(1)
    for (model, config_name, task), cell in dirty:
        text = task.split("-", 1)[1]
        context = None if task.startswith("ppl-") else int(task[3:].split("-")[0])
        w = ppl_windows(tok, text, plan, texts or _source_texts, context=context)
        if tokens_sha256(w) != cell["tokens_sha256"]:
            raise InputError(f"{config_name}/{task}: the cell was made from other tokens")
        config = Config(**cell["config"])
        wrapper = None if config.offset is None else Arach(model_obj, config=config.arach())
        for i in windows:
            res = perplexity(wrapper if wrapper is not None else model_obj, w[i : i + 1])
            out.append(
                {
                    "cell": f"{model}/{config_name}/{task}",
                    "cell_commit": cell["commit"],
                    "window": int(i),
                    "stored_nll": float(cell["values"]["window_nll"][i]),
                    "recomputed_nll": float(res.nll[0]),
                }
            )
        # written after every cell, so a stopped check keeps what it did
        doc = {"format": "arach-recheck/1", "commit": commit, "windows": list(windows), "rows": out}
        write_text(root / RECHECK_FILE, json.dumps(doc, indent=1) + "\n")
    return root / RECHECK_FILE


# --------------------------------------------------------------------------------------------
# passages: the cloze bootstrap's resampling unit

#: The file, beside the cells, that names each cloze item's passage (written by every run).
PASSAGES_FILE = "cloze-passages.json"
PASSAGES_FORMAT = "arach-cloze-passages/1"
#: Sources whose passage is a chapter (a heading word ``CHAPTER``/``Chapter`` starts one);
#: in the others (Wikipedia) the passage is the whole article.
CHAPTERED: tuple[str, ...] = ("austen", "mobydick")
PASSAGE_RULE = (
    "a passage is a chapter of a novel (Austen, Moby-Dick: the words from one CHAPTER/Chapter "
    "heading to the next) or a whole Wikipedia article"
)


def cloze_passages(
    plan: ClaimPlan, texts: Callable[[str], Mapping[str, str]] = _source_texts
) -> dict[str, list[str]]:
    """The passage of every cloze item of ``plan``, per source (:data:`PASSAGE_RULE`).

    Items whose 80-word contexts overlap, or that share a chapter's characters and topic, are
    not independent; the bootstrap resamples passages whole. The labels are
    ``"DOCUMENT ch K"`` (K: the number of chapter headings at or before the item's target word,
    counted over the same words :func:`~attncoda.hooks.evaluate.cloze_items` reads) or the
    article's name.

    Examples
    --------
    >>> labels = cloze_passages(ClaimPlan())  # doctest: +SKIP
    >>> labels["mobydick"][:2]  # doctest: +SKIP
    ['mobydick ch 9', 'mobydick ch 10']
    """
    out: dict[str, list[str]] = {}
    by_source = _split_items(claim_items(plan, texts), plan.cloze_per_source)
    for source, items in zip(CLOZE_SOURCES, by_source, strict=True):
        docs = texts(source)
        heads: dict[str, list[int]] = {}
        labels = []
        for it in items:
            if source not in CHAPTERED:
                labels.append(it.source)
                continue
            if it.source not in heads:
                words = " ".join(assets.paragraphs(docs[it.source])).split()
                heads[it.source] = [i for i, w in enumerate(words) if w in ("CHAPTER", "Chapter")]
            labels.append(f"{it.source} ch {bisect.bisect_right(heads[it.source], it.index)}")
        out[source] = labels
    return out


def _passage_key(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What the items depend on: the passages of one plan serve every plan with these."""
    return {k: plan[k] for k in ("cloze_per_source", "cloze_window", "seed")}


def write_passages(
    root: Path, plan: ClaimPlan, texts: Callable[[str], Mapping[str, str]] = _source_texts
) -> Path:
    """``root/cloze-passages.json``: :func:`cloze_passages` of ``plan`` with the rule."""
    labels = cloze_passages(plan, texts)
    doc = {
        "format": PASSAGES_FORMAT,
        "rule": PASSAGE_RULE,
        "plan": _passage_key(dataclasses.asdict(plan)),
        "passages": labels,
    }
    Path(root).mkdir(parents=True, exist_ok=True)
    return write_text(Path(root) / PASSAGES_FILE, json.dumps(doc, indent=1) + "\n")


def read_passages(root: Path, plan: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """The passages under ``root`` if they were made for ``plan``'s items, else None."""
    try:
        doc = json.loads((Path(root) / PASSAGES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if doc.get("format") != PASSAGES_FORMAT or doc.get("plan") != _passage_key(plan):
        return None
    return {s: list(doc["passages"][s]) for s in CLOZE_SOURCES if s in doc.get("passages", {})}


# --------------------------------------------------------------------------------------------
# summaries (what the tables show)


def planned_cells(model: str) -> int:
    """Cells of ``model``'s full claim run: each configuration on every perplexity text and
    cloze source, and (SmolLM2) the long-context cells of :data:`LONG_CONFIGS`."""
    long = len(LONG_CONFIGS) * len(PPL_TEXTS) if model == SWEEP_MODEL else 0
    return len(claim_configs(model)) * (len(PPL_TEXTS) + len(CLOZE_SOURCES)) + long


def load_cells(root: Path) -> dict[tuple[str, str, str], dict]:
    """Every complete cell under ``root``: ``{(model, config name, task): cell}``."""
    out: dict[tuple[str, str, str], dict] = {}
    for path in sorted(Path(root).glob("*/*/*.json")):
        cell = read_cell(path)
        if cell is not None:
            out[(cell["model"], Config(**cell["config"]).name, cell["task"])] = cell
    return out


def summarise(
    root: Path,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    cells: Mapping[tuple[str, str, str], dict] | None = None,
) -> list[dict[str, Any]]:
    """One row per (model, configuration, measure) with the paired interval against the plain
    model on the same tokens.

    Measures: ``cloze`` (all items, accuracy), ``cloze-in-context`` (the filtered subset),
    ``ppl-mobydick``, ``ppl-wikipedia`` (perplexity; the bootstrap resamples whole windows). A
    cloze row needs all three sources' cells of both arms; otherwise the row is absent.
    ``cells``: :func:`load_cells` of ``root`` when the caller has already read them.
    """
    cells = load_cells(root) if cells is None else cells
    models = sorted({m for m, _, _ in cells}, key=lambda m: (m not in CLAIM_MODELS, m))
    rows: list[dict[str, Any]] = []
    for model in models:
        names = {c for m, c, _ in cells if m == model}
        configs = [c for c in claim_configs(model) if c.name in names and c.offset is not None]
        configs += sorted(
            (
                Config(**cells[k]["config"])
                for k in cells
                if k[0] == model
                and k[1] in names
                and k[1] not in {c.name for c in claim_configs(model)}
            ),
            key=lambda c: (c.hub_positions, -(c.offset or 0)),
        )
        seen: set[str] = set()
        for config in configs:
            if config.name in seen:
                continue
            seen.add(config.name)
            # ppl-TEXT, and the long-context ppl2048-TEXT where they were run
            ppl_tasks = sorted({t for m, _, t in cells if m == model and t.startswith("ppl")})
            for task in ppl_tasks:
                a = cells.get((model, "plain", task))
                b = cells.get((model, config.name, task))
                if a is None or b is None or a["tokens_sha256"] != b["tokens_sha256"]:
                    continue
                na = np.asarray(a["values"]["window_nll"]) / np.asarray(
                    a["values"]["window_tokens"]
                )
                nb = np.asarray(b["values"]["window_nll"]) / np.asarray(
                    b["values"]["window_tokens"]
                )
                r = paired_bootstrap(na, nb, statistic=perplexity_of_nll, n_boot=n_boot, seed=seed)
                rows.append(
                    _row(
                        model,
                        config,
                        task,
                        r.as_dict(),
                        int(sum(a["values"]["window_tokens"])),
                        len(na),
                        unit="windows",
                    )
                )
            parts = [
                (
                    cells.get((model, "plain", f"cloze-{s}")),
                    cells.get((model, config.name, f"cloze-{s}")),
                )
                for s in CLOZE_SOURCES
            ]
            if all(
                a is not None and b is not None and a["tokens_sha256"] == b["tokens_sha256"]
                for a, b in parts
            ):
                off = np.concatenate([a["values"]["correct"] for a, _ in parts]).astype(float)
                on = np.concatenate([b["values"]["correct"] for _, b in parts]).astype(float)
                inctx = np.concatenate([a["values"]["in_context"] for a, _ in parts]).astype(bool)
                lp = np.concatenate(
                    [
                        np.asarray(b["values"]["target_logprob"])
                        - np.asarray(a["values"]["target_logprob"])
                        for a, b in parts
                    ]
                )
                per_text = {
                    f"diff_{s}": float(
                        np.mean(b["values"]["correct"]) - np.mean(a["values"]["correct"])
                    )
                    for s, (a, b) in zip(CLOZE_SOURCES, parts, strict=True)
                }
                clusters = _cloze_clusters(root, parts)
                for measure, keep in (("cloze", np.ones_like(inctx)), ("cloze-in-context", inctx)):
                    groups = None if clusters is None else clusters[keep]
                    r = paired_bootstrap(
                        off[keep], on[keep], clusters=groups, n_boot=n_boot, seed=seed
                    )
                    rows.append(
                        _row(
                            model,
                            config,
                            measure,
                            r.as_dict(),
                            int(keep.sum()),
                            int(keep.sum()) if groups is None else len(np.unique(groups)),
                            mean_dlogprob=float(lp[keep].mean()),
                            unit="items" if groups is None else "passages",
                            **(per_text if measure == "cloze" else {}),
                        )
                    )
    return rows


def _cloze_clusters(root: Path, parts: Sequence[tuple[Any, Any]]) -> np.ndarray | None:
    """The passage label of every cloze item of ``parts`` (``"source/label"``, in source
    order) from ``root``'s :data:`PASSAGES_FILE`; None where it is missing or made for other
    items (the bootstrap then resamples items, and the row says so)."""
    plan = parts[0][0]["plan"]
    passages = read_passages(root, plan)
    if passages is None or set(passages) != set(CLOZE_SOURCES):
        return None
    labels = []
    for source, (a, _) in zip(CLOZE_SOURCES, parts, strict=True):
        if len(passages[source]) != len(a["values"]["correct"]):
            return None
        labels += [f"{source}/{lab}" for lab in passages[source]]
    return np.asarray(labels)


def _row(
    model: str,
    config: Config,
    measure: str,
    r: Mapping[str, float],
    n: int,
    blocks: int,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "model": model,
        "config": config.name,
        "offset": config.offset,
        "hub_positions": config.hub_positions,
        "measure": measure,
        **{k: r[k] for k in ("off", "on", "diff", "low", "high")},
        "n": n,
        "blocks": blocks,
        **extra,
    }


# --------------------------------------------------------------------------------------------
# the claim tables

MINUS = "\u2212"
#: The paper's GPT-2 small claims, as directions only: no source held here gives its numbers
#: (`reference/papers.md`, section 1: abstract and third-party summaries; the PDF was never
#: available), so the claim rows cite none.
PAPER = {
    "cloze": ("LAMBADA accuracy", "up"),
    "ppl": ("PG-19 perplexity", "down"),
}
MEASURE_LABEL = {
    "cloze": "cloze accuracy (%), all items",
    "cloze-in-context": "cloze accuracy (%), target in context",
    "ppl-mobydick": "perplexity, Moby-Dick",
    "ppl-wikipedia": "perplexity, Wikipedia",
}


def signed(x: float, digits: int) -> str:
    """``+0.169`` / ``−0.019`` / ``+0.000``: a sign always, a typographic minus, and a value
    that rounds to zero is ``+`` (the README tables' number format for differences)."""
    text = fixed(x, digits)
    if text.strip("0.") == "":
        return "+" + text
    return text.replace("-", MINUS) if text.startswith("-") else "+" + text


#: A change is "practically nil" when its whole 95% interval lies within this band around 0:
#: 1% of the plain model's perplexity, or 1 point of cloze accuracy (a definition, chosen before
#: the sensitivity sweep ran; the README states it).
NIL_PPL_RELATIVE = 0.01
NIL_CLOZE_POINTS = 1.0
TEXT_NAME = {"austen": "Austen", "mobydick": "Moby-Dick", "wikipedia": "Wikipedia"}


def _nil_size(row: Mapping[str, Any]) -> str | None:
    """``"at most 0.6% of plain"`` when the row's interval is practically nil, else None."""
    low, high = float(row["low"]), float(row["high"])
    if str(row["measure"]).startswith("cloze"):
        far = max(abs(low), abs(high)) * 100
        return (
            f"the whole CI within {fixed(far, 1)} points of 0" if far <= NIL_CLOZE_POINTS else None
        )
    far = max(abs(low), abs(high)) / float(row["off"])
    if far <= NIL_PPL_RELATIVE:
        return f"the whole CI within {fixed(far * 100, 1)}% of plain perplexity"
    return None


def verdict(row: Mapping[str, Any]) -> str:
    """The direction test of one row against the paper's claim (accuracy up, perplexity down).

    ``reproduced (direction)`` when the whole 95% interval lies on the paper's side of zero,
    ``contradicted`` when it lies on the other side, else ``not resolved`` (an interval that
    includes 0 is never called worse or better); the size is never comparable (another model,
    other texts, a reconstructed mechanism; see the README). A row whose whole interval lies
    within :data:`NIL_PPL_RELATIVE` of the plain perplexity, or :data:`NIL_CLOZE_POINTS` of
    accuracy, is also called *practically nil*, with its size.

    Examples
    --------
    >>> verdict({"measure": "cloze", "low": -0.05, "high": -0.01, "off": 0.2})
    'contradicted: worse, 95% CI excludes 0'
    >>> verdict({"measure": "ppl-wikipedia", "low": -2.0, "high": -0.5, "off": 20.0})
    'reproduced (direction): better, 95% CI excludes 0'
    >>> verdict({"measure": "ppl-wikipedia", "low": -0.03, "high": 0.05, "off": 21.57})
    'not resolved: 95% CI includes 0; practically nil (the whole CI within 0.2% of plain perplexity)'
    """
    better_is_up = str(row["measure"]).startswith("cloze")
    low, high = float(row["low"]), float(row["high"])
    if low > 0 or high < 0:
        better = (low > 0) == better_is_up
        text = (
            "reproduced (direction): better, 95% CI excludes 0"
            if better
            else "contradicted: worse, 95% CI excludes 0"
        )
    else:
        text = "not resolved: 95% CI includes 0"
    nil = _nil_size(row)
    return text if nil is None else f"{text}; practically nil ({nil})"


def _paper(measure: str) -> str:
    """The paper's claim a row is set against, as a direction: LAMBADA for cloze, PG-19 (books)
    for the Moby-Dick perplexity (no source held here gives the paper's numbers); the sources
    name no WikiText result, so Wikipedia rows have none."""
    if measure.startswith("cloze"):
        name, way = PAPER["cloze"]
        return f"{name.split()[0]}: accuracy {way} (numbers not in our sources)"
    if measure.endswith("mobydick"):
        name, way = PAPER["ppl"]
        return f"{name.split()[0]}: perplexity {way} (numbers not in our sources)"
    return "none (the sources give no WikiText result)"


def _fmt_row(row: Mapping[str, Any]) -> list[str]:
    """Plain → ARACH, the difference with its interval, and n with the resampling unit (points
    for accuracies)."""
    unit = row.get("unit", "items" if str(row["measure"]).startswith("cloze") else "windows")
    if str(row["measure"]).startswith("cloze"):
        k, d = 100.0, 1
        ours = f"{fixed(row['off'] * k, 1)} → {fixed(row['on'] * k, 1)}"
        n = f"{row['n']} items; {row['blocks']} {unit}"
    else:
        k, d = 1.0, 2
        ours = f"{fixed(row['off'], 2)} → {fixed(row['on'], 2)}"
        n = f"{row['n']} tokens; {row['blocks']} {unit}"
    ci = f"{signed(row['diff'] * k, d)} [{signed(row['low'] * k, d)}, {signed(row['high'] * k, d)}]"
    return [ours, ci, n]


def _per_text(row: Mapping[str, Any]) -> str:
    """The cloze row's ARACH − plain per source, in points; a perplexity row is one text."""
    if row["measure"] != "cloze":
        return "(one text)"
    return ", ".join(
        f"{TEXT_NAME[s]} {signed(row[f'diff_{s}'] * 100, 1)}"
        for s in CLOZE_SOURCES
        if f"diff_{s}" in row
    )


def _count_intervals(table: str) -> int:
    """The 95% intervals (``[low, high]``) a rendered table holds."""
    import re

    return len(re.findall(r"\[[^\]\[]+, [^\]\[]+\]", table))


def sensitivity_rows(
    index: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> list[tuple[str, Config, dict[str, Mapping[str, Any] | None]]]:
    """The sensitivity sweep's rows, the default first: (choice changed, configuration, rows by
    measure) on SmolLM2."""
    base = Config(-0.5, "same")
    arms = [("nothing (the default)", base), ("where hubs sit: no position", Config(-0.5, "none"))]
    for c in SENSITIVITY:
        what = (
            f"hub embedding: {c.hub_embedding}"
            if c.hub_embedding != "token"
            else f"layers: {c.layers.replace('_', ' ')}"
        )
        arms.append((what, c))
    measures = ("cloze", "ppl-mobydick", "ppl-wikipedia")
    return [
        (what, c, {m: index.get((SWEEP_MODEL, c.name, m)) for m in measures}) for what, c in arms
    ]


def _reverses(rows: Mapping[str, Mapping[str, Any] | None]) -> str:
    """Whether a configuration's rows reverse the study's verdict (every measure contradicted)."""
    done = {m: r for m, r in rows.items() if r is not None}
    if not done:
        return "not run yet"
    kinds = {m: verdict(r).split(":")[0] for m, r in done.items()}
    better = [m for m, k in kinds.items() if k == "reproduced (direction)"]
    open_ = [m for m, k in kinds.items() if k == "not resolved"]
    missing = len(rows) - len(done)
    if better:
        text = "yes: better on " + ", ".join(MEASURE_LABEL.get(m, m) for m in better)
    elif open_:
        text = "no reversal; not resolved on " + ", ".join(MEASURE_LABEL.get(m, m) for m in open_)
    else:
        text = "no: worse on every measure run"
    return text + (
        f" ({missing} measure{'s' if missing > 1 else ''} not run yet)" if missing else ""
    )


def claim_tables(root: Path, *, n_boot: int = 2000, seed: int = 0) -> dict[str, str]:
    """The README tables of the claim study, from the cells under ``root`` (``results/claims``).

    ``claims``: the paper's two claims against ours for every model and core configuration
    (rows whose cells are not yet run say so), with per-text values and each interval's
    resampling unit; ``claims-intervals``: how many intervals that table holds (none is
    corrected for multiplicity); ``claims-filtered``: the target-in-context subset;
    ``claims-sweep``: the SmolLM2 offset sweep; ``claims-sensitivity`` and
    ``claims-sensitivity-verdict``: the reconstruction choices on SmolLM2; ``claims-long``:
    2,048-token windows; ``claims-cost``: measured seconds per cell and the time a model's full
    run takes; ``claims-summary``: one line per model.
    """
    from .._study import markdown_table

    done = load_cells(root) if Path(root).is_dir() else {}
    rows = summarise(root, n_boot=n_boot, seed=seed, cells=done) if done else []
    index = {(r["model"], r["config"], r["measure"]): r for r in rows}
    main, filtered, sweep = [], [], []
    for model in CLAIM_MODELS:
        for config in CORE_CONFIGS[1:]:
            for measure in ("cloze", "ppl-mobydick", "ppl-wikipedia"):
                r = index.get((model, config.name, measure))
                head = [MEASURE_LABEL[measure], model, f"`{config.name}`", _paper(measure)]
                if r is None:
                    main.append([*head, "not run yet", "", "", "", "not run yet"])
                else:
                    ours, ci, n = _fmt_row(r)
                    main.append([*head, ours, ci, _per_text(r), n, verdict(r)])
            r = index.get((model, config.name, "cloze-in-context"))
            if r is not None:
                filtered.append([model, f"`{config.name}`", *_fmt_row(r), verdict(r)])
    swept = sorted(
        (c for c in claim_configs(SWEEP_MODEL) if c.offset is not None and c not in SENSITIVITY),
        key=lambda c: (c.hub_positions != "same", -float(c.offset or 0.0)),
    )
    for config in swept:
        cells = [index.get((SWEEP_MODEL, config.name, m)) for m in MEASURE_LABEL]
        if all(c is None for c in cells):
            sweep.append(
                [
                    config.hub_positions,
                    f"{config.offset:g}".replace("-", MINUS),
                    "not run yet",
                    "",
                    "",
                    "",
                ]
            )
            continue
        sweep.append(
            [config.hub_positions, f"{config.offset:g}".replace("-", MINUS)]
            + [("" if c is None else _fmt_row(c)[1]) for c in cells]
        )
    main_table = markdown_table(
        [
            "claim (measure)",
            "model",
            "configuration",
            "paper, GPT-2 small (as summarised)",
            "ours: plain → ARACH",
            "ARACH − plain [95% CI]",
            "per text: ARACH − plain",
            "n; resampling unit",
            "verdict",
        ],
        main,
    )
    return {
        "claims": main_table,
        "claims-intervals": intervals_note(main_table, rows),
        "claims-filtered": markdown_table(
            [
                "model",
                "configuration",
                "plain → ARACH (%)",
                "ARACH − plain [95% CI], points",
                "n; resampling unit",
                "verdict",
            ],
            filtered,
        ),
        "claims-sweep": markdown_table(
            [
                "hub_positions",
                "b",
                *(f"{MEASURE_LABEL[m]}: ARACH − plain [95% CI]" for m in MEASURE_LABEL),
            ],
            sweep,
        ),
        "claims-sensitivity": sensitivity_table(index),
        "claims-sensitivity-verdict": sensitivity_verdict(index),
        "claims-long": long_table(index, done),
        "claims-cost": cost_table(done),
        "claims-summary": claim_summary(rows, done),
        "claims-findings": claim_findings(rows),
        "claims-provenance": provenance_cells_table(done, Path(root)),
    }


def intervals_note(table: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """One paragraph: how many intervals the claim table holds, their resampling units, and
    that none is corrected for multiplicity."""
    n = _count_intervals(table)
    cloze = [r for r in rows if r["measure"] == "cloze" and r.get("unit") == "passages"]
    passages = sorted({r["blocks"] for r in cloze})
    unit = (
        f"passages ({'/'.join(map(str, passages))} of them: {PASSAGE_RULE}), not items"
        if cloze
        else "items"
    )
    return (
        f"The claim table holds {n} 95% intervals. Each is a marginal, paired percentile "
        f"bootstrap interval: cloze rows resample {unit}, since items from one passage are "
        "correlated; perplexity rows resample whole windows. None is corrected for "
        f"multiplicity: if ARACH changed nothing, about {fixed(n * 0.05, 1)} of the {n} would still be "
        "expected to exclude 0 by chance. " + _same_side(rows)
    )


def _same_side(rows: Sequence[Mapping[str, Any]]) -> str:
    """Which models' claim rows (core configurations, all items and both texts) all exclude 0
    on the same side: there the verdict does not rest on any single interval."""
    core = {c.name for c in CORE_CONFIGS[1:]}
    measures = ("cloze", *(f"ppl-{t}" for t in PPL_TEXTS))
    same, mixed = [], []
    for model in CLAIM_MODELS:
        mine = [
            r
            for r in rows
            if r["model"] == model and r["config"] in core and r["measure"] in measures
        ]
        if not mine:
            continue
        kinds = {verdict(r).split(":")[0] for r in mine}
        (same if len(kinds) == 1 and "not resolved" not in kinds else mixed).append(
            f"{model} ({len(mine)} rows)"
        )
    text = ""
    if same:
        text += (
            "On " + ", ".join(same) + " every interval excludes 0 on the same side, so the "
            "verdict there does not rest on any single row"
        )
    if mixed:
        text += ("; on " if text else "On ") + ", ".join(mixed) + " the verdicts differ by row"
    return text + "." if text else ""


def sensitivity_table(index: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> str:
    """SmolLM2: ARACH − plain for the default and each reconstruction choice changed alone."""
    from .._study import markdown_table

    out = []
    for what, config, rows in sensitivity_rows(index):
        cells = [
            "not run yet" if r is None else f"{_fmt_row(r)[1]}: {verdict(r).split(':')[0]}"
            for r in rows.values()
        ]
        out.append([what, f"`{config.name}`", *cells, _reverses(rows)])
    return markdown_table(
        [
            "choice changed (from the default)",
            "configuration",
            "cloze accuracy, points [95% CI]",
            "perplexity, Moby-Dick [95% CI]",
            "perplexity, Wikipedia [95% CI]",
            "reverses the verdict?",
        ],
        out,
    )


def sensitivity_verdict(index: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> str:
    """One paragraph: does any reconstruction choice reverse the SmolLM2 verdict?"""
    arms = sensitivity_rows(index)
    run = [(w, c, r) for w, c, r in arms if all(v is not None for v in r.values())]
    partial = [(w, c, r) for w, c, r in arms if any(v is not None for v in r.values())]
    missing = [c.name for _w, c, r in arms if all(v is None for v in r.values())]
    better = [
        (w, m)
        for w, _c, r in partial
        for m, v in r.items()
        if v is not None and verdict(v).startswith("reproduced")
    ]
    unresolved = [
        (w, m)
        for w, _c, r in partial
        for m, v in r.items()
        if v is not None and verdict(v).startswith("not resolved")
    ]
    cells = sum(v is not None for _w, _c, r in partial for v in r.values())
    text = (
        f"Of the {len(arms)} configurations of the sensitivity sweep, {len(run)} have all "
        f"three measures and {len(partial) - len(run)} some ({cells} rows in all). "
    )
    if better:
        text += "A choice **reverses** the verdict on " + "; ".join(
            f"{w} ({MEASURE_LABEL[m]})" for w, m in better
        )
        text += ": its whole interval lies on the paper's side of 0. "
    else:
        text += (
            f"**No choice reverses the verdict on {SWEEP_MODEL}** (the one model swept; "
            f"{len(arms) - 1} choices changed one at a time from the default): no row's interval "
            "lies on the paper's side of 0; other models and other combinations of choices were "
            "not run. "
        )
    if unresolved:
        text += "Not resolved (interval includes 0): " + "; ".join(
            f"{w} ({MEASURE_LABEL[m]})" for w, m in unresolved
        )
        text += ". "
    else:
        text += "Every row run is contradicted (worse, its interval excluding 0). "
    if missing:
        text += "Not run yet: " + ", ".join(f"`{n}`" for n in missing) + "."
    return text.strip()


def long_table(
    index: Mapping[tuple[str, str, str], Mapping[str, Any]],
    cells: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> str:
    """SmolLM2 perplexity on the same tokens in 1,024- and 2,048-token windows, plain and ARACH."""
    from .._study import markdown_table

    out = []
    for text in PPL_TEXTS:
        for task in (f"ppl-{text}", long_task(text, LONG_CONTEXT)):
            plain = cells.get((SWEEP_MODEL, "plain", task))
            if plain is not None:
                nll = np.asarray(plain["values"]["window_nll"])
                tokens = np.asarray(plain["values"]["window_tokens"])
                window = plain["plan"]["context"] if task.startswith("ppl-") else LONG_CONTEXT
                out.append(
                    [
                        TEXT_NAME[text],
                        "plain",
                        str(window),
                        fixed(float(np.exp(nll.sum() / tokens.sum())), 2),
                        "",
                        f"{int(tokens.sum())} tokens; {len(nll)} windows",
                        "",
                    ]
                )
        for config in LONG_CONFIGS[1:]:
            for task in (f"ppl-{text}", long_task(text, LONG_CONTEXT)):
                r = index.get((SWEEP_MODEL, config.name, task))
                plain = cells.get((SWEEP_MODEL, "plain", task))
                window = LONG_CONTEXT if task != f"ppl-{text}" else None
                if plain is not None and window is None:
                    window = int(plain["plan"]["context"])
                head = [TEXT_NAME[text], f"`{config.name}`"]
                if r is None:
                    out.append([*head, str(window or ""), "not run yet", "", "", ""])
                    continue
                ours, ci, n = _fmt_row(r)
                out.append([*head, str(window), ours, ci, n, verdict(r)])
    return markdown_table(
        [
            "text",
            "configuration",
            "window T",
            "plain → ARACH",
            "ARACH − plain [95% CI]",
            "n; resampling unit",
            "verdict",
        ],
        out,
    )


def claim_findings(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README's reading of the claim rows, one bullet per model, every number from
    :func:`summarise`'s ``rows``: the verdicts, the least harmful configuration per measure, the
    two hub-position rules at b = −0.5, the filtered task and (SmolLM2) the offset sweep."""
    core = [c.name for c in CORE_CONFIGS[1:]]
    measures = ("cloze", *(f"ppl-{t}" for t in PPL_TEXTS))
    sens = {c.name for c in SENSITIVITY}
    lines = []
    for model in CLAIM_MODELS:
        mine = {
            (r["config"], r["measure"]): r
            for r in rows
            if r["model"] == model and r["config"] not in sens
        }
        claim = [mine[(c, m)] for c in core for m in measures if (c, m) in mine]
        if not claim:
            lines.append(f"- **{model}**: no claim row complete yet.")
            continue
        nil = sum(_nil_size(r) is not None for r in claim)
        text = f"- **{model}**: {len(claim)} claim rows: {_verdict_counts(claim)}" + (
            f"; {nil} of the {len(claim)} practically nil in size" if nil else ""
        )
        text += "."
        least = []
        for m in measures:
            got = [mine[(c, m)] for c in core if (c, m) in mine]
            if got:
                best = min(got, key=lambda r: r["diff"] * (-1 if m.startswith("cloze") else 1))
                least.append(
                    f"{'cloze' if m == 'cloze' else MEASURE_LABEL[m]} "
                    f"`{best['config']}` ({_fmt_row(best)[1]})"
                )
        if least:
            text += " Closest to the paper's direction: " + "; ".join(least) + "."
        pairs = []
        for m in measures:
            a, b = mine.get(("same_b-0.5", m)), mine.get(("none_b-0.5", m))
            if a is not None and b is not None:
                pairs.append(
                    f"{MEASURE_LABEL[m].split(', ')[-1] if m != 'cloze' else 'cloze'} "
                    f"{_fmt_row(b)[1].split(' [')[0]} vs {_fmt_row(a)[1].split(' [')[0]}"
                )
        if pairs:
            text += " At b = −0.5, `none` vs `same`: " + "; ".join(pairs) + "."
        filt = [mine[(c, "cloze-in-context")] for c in core if (c, "cloze-in-context") in mine]
        if filt:
            text += f" Filtered task (target in context): {_verdict_counts(filt)}."
        if model == SWEEP_MODEL:
            swept = [r for (c, m), r in mine.items() if c not in core and m in MEASURE_LABEL]
            if swept:
                n_conf = len({r["config"] for r in swept})
                text += (
                    f" The rest of the offset sweep ({n_conf} configurations, "
                    f"{len(swept)} rows with the filtered task): {_verdict_counts(swept)}."
                )
        lines.append(text)
    every = [r for r in rows if r["measure"] in MEASURE_LABEL]
    better = sum(verdict(r).startswith("reproduced") for r in every)
    lines.append(
        f"\nOver all {len(every)} rows of every model and configuration (sensitivity sweep "
        f"included), {better} reproduce the paper's direction."
    )
    return "\n".join(lines)


def cell_provenance(cells: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """Which commit and tree state made each cell: ``{"clean": {commit: n}, "dirty": {commit
    +dirty: [MODEL/CONFIG/TASK, ...]}, "unknown": [...]}`` (what the manifest records)."""
    clean: dict[str, int] = {}
    dirty: dict[str, list[str]] = {}
    unknown: list[str] = []
    for (model, config, task), cell in sorted(cells.items()):
        commit = str(cell.get("commit", ""))
        name = f"{model}/{config}/{task}"
        if not commit or commit.startswith("unknown"):
            unknown.append(name)
        elif commit.endswith("+dirty"):
            dirty.setdefault(commit, []).append(name)
        else:
            clean[commit] = clean.get(commit, 0) + 1
    return {"clean": clean, "dirty": dirty, "unknown": unknown}


def provenance_cells_table(
    cells: Mapping[tuple[str, str, str], Mapping[str, Any]], root: Path | None = None
) -> str:
    """The README table of :func:`cell_provenance`: every dirty cell by name, and the spot
    check of :func:`recheck_cells` where ``root`` holds one."""
    from .._study import markdown_table

    prov = cell_provenance(cells)
    rows = []
    for commit, n in sorted(prov["clean"].items(), key=lambda kv: -kv[1]):
        models = sorted({m for (m, _, _), c in cells.items() if c.get("commit") == commit})
        rows.append([f"`{commit[:12]}`", "clean tree", str(n), ", ".join(models)])
    for commit, names in sorted(prov["dirty"].items()):
        rows.append(
            [
                f"`{commit[:12]}`",
                "uncommitted changes on top of it",
                str(len(names)),
                ", ".join(f"`{n}`" for n in names),
            ]
        )
    if prov["unknown"]:
        rows.append(["unknown", "unknown", str(len(prov["unknown"])), ", ".join(prov["unknown"])])
    n_dirty = sum(len(v) for v in prov["dirty"].values())
    table = markdown_table(["commit", "tree", "cells", "which"], rows)
    text = (
        f"{len(cells)} cells: {sum(prov['clean'].values())} computed at a clean commit, "
        f"{n_dirty} from a modified tree, {len(prov['unknown'])} of unknown state.\n\n{table}"
    )
    check = _recheck_note(root) if root is not None else ""
    rerun = clean_rerun_note(root) if root is not None else ""
    return text + "".join(f"\n\n{x}" for x in (check, rerun) if x)


def _recheck_note(root: Path) -> str:
    """One sentence on :data:`RECHECK_FILE` under ``root`` ('' when there is none)."""
    try:
        doc = json.loads((Path(root) / RECHECK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    rows = doc.get("rows", [])
    if not rows:
        return ""
    diffs = [abs(r["recomputed_nll"] - r["stored_nll"]) for r in rows]
    rel = max(d / abs(r["stored_nll"]) for d, r in zip(diffs, rows, strict=True))
    cells = len({r["cell"] for r in rows})
    return (
        f"Spot check (`{RECHECK_FILE}`): window {', '.join(map(str, doc['windows']))} of "
        f"{cells} modified-tree cells recomputed at the clean commit `{doc['commit'][:12]}`; "
        f"the largest difference from the stored summed window NLL is {scientific(max(diffs), 2)} nats "
        f"({scientific(rel, 1)} of it)."
    )


#: Cells recomputed whole at a clean commit, to check cells that a modified tree made
#: (``results/claims/clean-rerun/MODEL/CONFIG/TASK.json``; not read as claim cells).
CLEAN_RERUN = "clean-rerun"

#: A rerun perplexity cell agrees with the stored one when every window's summed NLL is within
#: this relative difference (the spread of float32 kernels between runs is about 1e-6).
RERUN_RTOL = 1e-4


def _rerun_row(key: tuple[str, str, str], old: Mapping[str, Any], new: Mapping[str, Any]) -> list:
    """One row of :func:`clean_rerun_note`'s table: the cell, where the stored one was made,
    both values, the largest difference and whether they agree."""
    was = str(old.get("commit", ""))
    made = f"`{was[:12]}`{' + changes' if was.endswith('+dirty') else ''}"
    same_tokens = new.get("tokens_sha256") == old.get("tokens_sha256")
    if key[2].startswith("cloze"):
        a = np.asarray(old["values"]["correct"], bool)
        b = np.asarray(new["values"]["correct"], bool)
        lp = np.abs(
            np.asarray(old["values"]["target_logprob"], float)
            - np.asarray(new["values"]["target_logprob"], float)
        )
        values = [f"accuracy {fixed(100 * x.mean(), 2)}%" for x in (a, b)]
        changed = int((a != b).sum())
        largest = (
            f"{changed} of {len(a)} items change verdict; target log-probability "
            f"{scientific(float(lp.max()), 1)}"
        )
        agrees = changed == 0
    else:
        values = []
        for cell in (old, new):
            nll = np.asarray(cell["values"]["window_nll"], float)
            tokens = np.asarray(cell["values"]["window_tokens"], float)
            values.append(
                f"perplexity {fixed(float(np.exp(nll.sum() / tokens.sum())), 3)}; summed NLL "
                f"{fixed(float(nll.sum()), 3, thousands=True)}"
            )
        x = np.asarray(old["values"]["window_nll"], float)
        y = np.asarray(new["values"]["window_nll"], float)
        rel = np.abs(x - y) / np.abs(x)
        largest = (
            f"{scientific(float(np.abs(x - y).max()), 1)} nats in a window "
            f"({scientific(float(rel.max()), 1)} of it)"
            if rel.max() > 0
            else f"none: all {len(x)} windows' NLLs identical"
        )
        agrees = bool(rel.max() <= RERUN_RTOL)
    verdict = "yes" if agrees and same_tokens else "no" + ("" if same_tokens else " (OTHER TOKENS)")
    return [f"`{'/'.join(key)}`", made, *values, largest, verdict]


def clean_rerun_note(root: Path) -> str:
    """Per cell rerun at a clean commit (:data:`CLEAN_RERUN`), how it agrees with the stored
    modified-tree cell, as a table: cloze accuracy and the items whose verdict differs, or a
    perplexity cell's perplexity, summed NLL and largest window difference; with how many of
    the modified-tree cells have been rerun ('' when none was)."""
    from .._study import markdown_table

    reruns = load_cells(Path(root) / CLEAN_RERUN)
    stored = load_cells(Path(root))
    rows = [_rerun_row(k, stored[k], new) for k, new in sorted(reruns.items()) if k in stored]
    if not rows:
        return ""
    dirty = {k for k, c in stored.items() if str(c.get("commit", "")).endswith("+dirty")}
    counts = []
    for kind, label in (("ppl", "perplexity"), ("cloze", "cloze")):
        of = {k for k in dirty if k[2].startswith(kind)}
        if of:
            counts.append(f"{len(of & set(reruns))} of {len(of)} {label}")
    names = [f"`{'/'.join(k)}`" for k in sorted(dirty - set(reruns))]
    commits = sorted({str(c.get("commit", ""))[:12] for c in reruns.values()})
    agree = sum(r[-1] == "yes" for r in rows)
    effect = _rerun_effect(Path(root), stored, reruns)
    table = markdown_table(
        ["cell", "stored cell made at", "stored", "rerun", "largest difference", "agrees"], rows
    )
    return (
        f"Clean rerun (`{CLEAN_RERUN}/`): {len(dirty & set(reruns))} of the {len(dirty)} "
        f"modified-tree cells ({', '.join(counts)}) recomputed whole at "
        f"{', '.join(f'`{c}`' for c in commits)}; {agree} of the {len(rows)} rerun agree with the "
        "stored cell (a perplexity cell: every window's summed NLL within a relative "
        f"{scientific(RERUN_RTOL, 0)}; a cloze cell: no item changes verdict)"
        + (f"; not rerun yet: {', '.join(names)}" if names else "")
        + f". {effect}\n\n{table}"
    )


def _rerun_effect(
    root: Path,
    stored: Mapping[tuple[str, str, str], Mapping[str, Any]],
    reruns: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> str:
    """What the claim rows would say with the rerun cells in place of the stored ones: how many
    change verdict, and the largest change of an ARACH − plain difference or interval end
    (:func:`summarise` of the configurations involved, both ways, at the tables' resampling)."""
    keys = [k for k in reruns if k in stored]
    models = {k[0] for k in keys}
    configs = {k[1] for k in keys} | {Config().name}
    sub = {k: c for k, c in stored.items() if k[0] in models and k[1] in configs}
    swapped = {**sub, **{k: reruns[k] for k in keys}}

    def index(cells: Mapping[tuple[str, str, str], Any]) -> dict[tuple, dict[str, Any]]:
        return {(r["model"], r["config"], r["measure"]): r for r in summarise(root, cells=cells)}

    before, after = index(sub), index(swapped)
    shown = ("off", "on", "diff", "low", "high")
    touched = [k for k in before if k in after and any(before[k][f] != after[k][f] for f in shown)]
    flips = [k for k in touched if verdict(before[k]) != verdict(after[k])]
    parts = []
    for kind, scale, unit in (("ppl", 1.0, "perplexity"), ("cloze", 100.0, "accuracy points")):
        moved = [
            scale * abs(after[k][f] - before[k][f])
            for k in touched
            if k[2].startswith(kind)
            for f in ("diff", "low", "high")
        ]
        if moved:
            parts.append(f"{significant(max(moved), 2)} {unit}")
    if not touched:
        return "With the reruns in place of the stored cells, no number of a claim row moves."
    return (
        f"With the reruns in place of the stored cells, {len(flips)} of the {len(touched)} claim "
        "rows whose numbers move change verdict"
        + (
            "; the largest change of an ARACH − plain difference or interval end is "
            + " and ".join(parts)
            if parts
            else ""
        )
        + "."
    )


def _verdict_counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """``"4 contradicted, 1 not resolved"``: the verdicts of some rows, by kind."""
    counts: dict[str, int] = {}
    for r in rows:
        kind = verdict(r).split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    order = ("reproduced (direction)", "contradicted", "not resolved")
    return ", ".join(f"{counts[k]} {k}" for k in order if k in counts)


def _one_or_range(lo: str, hi: str, sep: str) -> str:
    """``lo`` when both printed ends agree, else ``lo``, ``sep``, ``hi``."""
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _span(rows: Sequence[Mapping[str, Any]], scale: float, digits: int) -> str:
    """``"−6.9 to −1.8"``: the smallest and largest ARACH − plain over some rows."""
    lo, hi = min(r["diff"] for r in rows) * scale, max(r["diff"] for r in rows) * scale
    return _one_or_range(signed(lo, digits), signed(hi, digits), " to ")


def claim_summary(
    rows: Sequence[Mapping[str, Any]], cells: Mapping[tuple[str, str, str], Any]
) -> str:
    """The README's "Result", one bullet per model, from :func:`summarise`'s ``rows``
    and :func:`load_cells`' ``cells``: what is done, the plain model, the range of ARACH − plain
    over the issue's configurations with the intervals' half-widths, and the verdicts (the
    sweep's too)."""
    core = {c.name for c in CORE_CONFIGS[1:]}
    measures = ("cloze", *(f"ppl-{t}" for t in PPL_TEXTS))
    lines = []
    for model in CLAIM_MODELS:
        done = sum(1 for (m, _, _) in cells if m == model)
        planned = planned_cells(model)
        head = f"- **{model}** ({done} of {planned} cells)"
        if not done:
            lines.append(f"{head}: not run yet.")
            continue
        mine = [r for r in rows if r["model"] == model and r["config"] in core]
        parts = []
        cloze = [r for r in mine if r["measure"] == "cloze"]
        if cloze:
            half = [fixed((r["high"] - r["low"]) * 50, 1) for r in cloze]
            lo_half, hi_half = min(half, key=float), max(half, key=float)
            plural = "s" if lo_half != hi_half else ""
            halves = f"half-width{plural} {_one_or_range(lo_half, hi_half, '-')}"
            parts.append(
                f"cloze on {cloze[0]['n']:,} items: plain {fixed(cloze[0]['off'] * 100, 1)}%, ARACH − "
                f"plain {_span(cloze, 100, 1)} points over {len(cloze)} of "
                f"{len(core)} configurations (95% CI {halves}; "
                f"{_verdict_counts(cloze)})"
            )
        for text in PPL_TEXTS:
            ppl = [r for r in mine if r["measure"] == f"ppl-{text}"]
            if ppl:
                parts.append(
                    f"perplexity of {MEASURE_LABEL[f'ppl-{text}'].split(', ')[1]} on "
                    f"{ppl[0]['n']:,} tokens: plain {fixed(ppl[0]['off'], 2)}, ARACH − plain "
                    f"{_span(ppl, 1, 2)} over {len(ppl)} configurations ({_verdict_counts(ppl)})"
                )
        missing = len(core) * len(measures) - sum(r["measure"] in measures for r in mine)
        text = f"{head}: " + ("; ".join(parts) if parts else "no claim row complete yet")
        if missing:
            text += f"; claim rows not complete yet: {missing} of {len(core) * len(measures)}"
        if model == SWEEP_MODEL:
            sens = {c.name for c in SENSITIVITY}
            swept = [
                r
                for r in rows
                if r["model"] == model
                and r["config"] not in core | sens
                and r["measure"] in measures
            ]
            extra = len(measures) * (
                len(claim_configs(model)) - len(CORE_CONFIGS) - len(SENSITIVITY)
            )
            if swept:
                text += (
                    f"; the rest of the offset sweep: {len(swept)} of {extra} rows "
                    f"({_verdict_counts(swept)})"
                )
        lines.append(text + ".")
    return "\n".join(lines)


def cost_table(cells: Mapping[tuple[str, str, str], dict]) -> str:
    """Measured seconds per cell (median over :func:`load_cells`' ``cells`` run) and a model's
    full-run estimate."""
    from .._study import markdown_table

    out = []
    for model in CLAIM_MODELS:
        mine = [c for (m, _, _), c in cells.items() if m == model]
        if not mine:
            out.append([model, "", "", "", "", f"0 / {planned_cells(model)}", "not run yet"])
            continue
        med: dict[tuple[bool, str], float] = {}
        for plain in (True, False):
            for kind in ("ppl", "cloze"):
                secs = [
                    c["seconds"]
                    for c in mine
                    if (c["config"]["offset"] is None) == plain and c["task"].startswith(kind)
                ]
                if secs:
                    med[(plain, kind)] = float(np.median(secs))
        configs = claim_configs(model)
        total = 0.0
        known = True
        for config in configs:
            for kind, n in (("ppl", len(PPL_TEXTS)), ("cloze", len(CLOZE_SOURCES))):
                key = (config.offset is None, kind)
                if key not in med:
                    key = (False, kind)  # an ARACH cell's cost stands in for a missing plain one
                if key not in med:
                    known = False
                    continue
                total += n * med[key]
        out.append(
            [
                model,
                *(
                    fixed(med[key], 0) if key in med else "?"
                    for key in ((True, "ppl"), (False, "ppl"), (True, "cloze"), (False, "cloze"))
                ),
                f"{len(mine)} / {planned_cells(model)}",
                f"{fixed(total / 3600, 1)} h"
                + ("" if known else " (lower bound: a cell kind not yet timed)"),
            ]
        )
    return markdown_table(
        [
            "model",
            "s per ppl cell, plain",
            "s per ppl cell, ARACH",
            "s per cloze cell, plain",
            "s per cloze cell, ARACH",
            "cells done",
            "full run (from the medians)",
        ],
        out,
    )
