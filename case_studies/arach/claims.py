"""The ARACH claim study (issue #16): the paper's two GPT-2 claims tested on three offline models.

The paper (arXiv 2603.11067, as summarised) reports for GPT-2 small LAMBADA accuracy
46.89 -> 50.42 and PG-19 perplexity 37.33 -> 33.11 with ARACH on. This module measures the
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
    text_windows,
    tokens_sha256,
)

from .._study import Shard, time_is_up

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
        """A CI smoke plan: 3 items per source, two windows of 64 tokens per text."""
        return cls(
            cloze_per_source=3,
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
        # first; then the long-context cells, then the sensitivity sweep (issue #28)
        core = [c for c in configs if c in CORE_CONFIGS]
        rest = [c for c in configs if c not in CORE_CONFIGS and c not in SENSITIVITY]
        order = []
        for group in (core, rest):
            order += [(t, c) for c in group for t in tasks if t.name.startswith("ppl")]
            order += [(t, c) for c in group for t in tasks if t.name.startswith("cloze")]
        order += [(t, c) for c in configs if c in LONG_CONFIGS for t in long_tasks]
        sens = [c for c in configs if c in SENSITIVITY]
        order += [(t, c) for c in sens for t in tasks if t.name.startswith("ppl")]
        order += [(t, c) for c in sens for t in tasks if t.name.startswith("cloze")]
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


def _window_ppl(x: np.ndarray) -> float:
    return float(np.exp(x.mean()))


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
                r = paired_bootstrap(na, nb, statistic=_window_ppl, n_boot=n_boot, seed=seed)
                rows.append(
                    _row(
                        model,
                        config,
                        task,
                        r.as_dict(),
                        int(sum(a["values"]["window_tokens"])),
                        len(na),
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
                r = paired_bootstrap(off, on, n_boot=n_boot, seed=seed)
                rows.append(
                    _row(
                        model,
                        config,
                        "cloze",
                        r.as_dict(),
                        len(off),
                        len(off),
                        mean_dlogprob=float(lp.mean()),
                    )
                )
                r = paired_bootstrap(off[inctx], on[inctx], n_boot=n_boot, seed=seed)
                rows.append(
                    _row(
                        model,
                        config,
                        "cloze-in-context",
                        r.as_dict(),
                        int(inctx.sum()),
                        int(inctx.sum()),
                        mean_dlogprob=float(lp[inctx].mean()),
                    )
                )
    return rows


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
#: The paper's GPT-2 small numbers (as summarised; `reference/papers.md`, 1.2).
PAPER = {
    "cloze": ("LAMBADA accuracy", 46.89, 50.42),
    "ppl": ("PG-19 perplexity", 37.33, 33.11),
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
    text = f"{x:+.{digits}f}"
    if text[1:].strip("0.") == "":
        return "+" + text[1:]
    return text.replace("-", MINUS)


def verdict(row: Mapping[str, Any]) -> str:
    """The direction test of one row against the paper's claim (accuracy up, perplexity down).

    ``reproduced (direction)`` when the whole 95% interval lies on the paper's side of zero,
    ``contradicted`` when it lies on the other side, else ``not resolved``; the size is never
    comparable (another model, other texts, a reconstructed mechanism; see the README).

    Examples
    --------
    >>> verdict({"measure": "cloze", "low": -0.05, "high": -0.01})
    'contradicted: worse, 95% CI excludes 0'
    >>> verdict({"measure": "ppl-wikipedia", "low": -2.0, "high": -0.5})
    'reproduced (direction): better, 95% CI excludes 0'
    """
    better_is_up = str(row["measure"]).startswith("cloze")
    low, high = float(row["low"]), float(row["high"])
    if low > 0 or high < 0:
        better = (low > 0) == better_is_up
        return (
            "reproduced (direction): better, 95% CI excludes 0"
            if better
            else "contradicted: worse, 95% CI excludes 0"
        )
    return "not resolved: 95% CI includes 0"


def _fmt_row(row: Mapping[str, Any]) -> list[str]:
    """Plain → ARACH, the difference with its interval, and n (points for accuracies)."""
    if str(row["measure"]).startswith("cloze"):
        k, d = 100.0, 1
        ours = f"{row['off'] * k:.1f} → {row['on'] * k:.1f}"
        n = f"{row['n']} items"
    else:
        k, d = 1.0, 2
        ours = f"{row['off']:.2f} → {row['on']:.2f}"
        n = f"{row['n']} tokens ({row['blocks']} windows)"
    ci = f"{signed(row['diff'] * k, d)} [{signed(row['low'] * k, d)}, {signed(row['high'] * k, d)}]"
    return [ours, ci, n]


def claim_tables(root: Path, *, n_boot: int = 2000, seed: int = 0) -> dict[str, str]:
    """The README tables of the claim study, from the cells under ``root`` (``results/claims``).

    ``claims``: the paper's two claims against ours for every model and core configuration
    (rows whose cells are not yet run say so); ``claims-filtered``: the target-in-context
    subset; ``claims-sweep``: the SmolLM2 offset sweep; ``claims-cost``: measured seconds per
    cell and the time a model's full run takes.
    """
    from .._study import markdown_table

    done = load_cells(root) if Path(root).is_dir() else {}
    rows = summarise(root, n_boot=n_boot, seed=seed, cells=done) if done else []
    index = {(r["model"], r["config"], r["measure"]): r for r in rows}
    main, filtered, sweep = [], [], []
    paper_cloze = f"{PAPER['cloze'][1]:.2f} → {PAPER['cloze'][2]:.2f} (+3.53)"
    paper_ppl = f"{PAPER['ppl'][1]:.2f} → {PAPER['ppl'][2]:.2f} ({MINUS}4.22)"
    for model in CLAIM_MODELS:
        for config in CORE_CONFIGS[1:]:
            for measure in ("cloze", "ppl-mobydick", "ppl-wikipedia"):
                paper = paper_cloze if measure == "cloze" else paper_ppl
                r = index.get((model, config.name, measure))
                head = [MEASURE_LABEL[measure], model, f"`{config.name}`", paper]
                if r is None:
                    main.append([*head, "not run yet", "", "", "not run yet"])
                else:
                    main.append([*head, *_fmt_row(r), verdict(r)])
            r = index.get((model, config.name, "cloze-in-context"))
            if r is not None:
                filtered.append([model, f"`{config.name}`", *_fmt_row(r), verdict(r)])
    swept = sorted(
        (c for c in claim_configs(SWEEP_MODEL) if c.offset is not None),
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
    return {
        "claims": markdown_table(
            [
                "claim (measure)",
                "model",
                "configuration",
                "paper, GPT-2 small",
                "ours: plain → ARACH",
                "ARACH − plain [95% CI]",
                "n",
                "verdict",
            ],
            main,
        ),
        "claims-filtered": markdown_table(
            [
                "model",
                "configuration",
                "plain → ARACH (%)",
                "ARACH − plain [95% CI], points",
                "n",
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
        "claims-cost": cost_table(done),
        "claims-summary": claim_summary(rows, done),
    }


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
            half = [f"{(r['high'] - r['low']) * 50:.1f}" for r in cloze]
            lo_half, hi_half = min(half, key=float), max(half, key=float)
            plural = "s" if lo_half != hi_half else ""
            halves = f"half-width{plural} {_one_or_range(lo_half, hi_half, '-')}"
            parts.append(
                f"cloze on {cloze[0]['n']:,} items: plain {cloze[0]['off'] * 100:.1f}%, ARACH − "
                f"plain {_span(cloze, 100, 1)} points over {len(cloze)} of "
                f"{len(core)} configurations (95% CI {halves}; "
                f"{_verdict_counts(cloze)})"
            )
        for text in PPL_TEXTS:
            ppl = [r for r in mine if r["measure"] == f"ppl-{text}"]
            if ppl:
                parts.append(
                    f"perplexity of {MEASURE_LABEL[f'ppl-{text}'].split(', ')[1]} on "
                    f"{ppl[0]['n']:,} tokens: plain {ppl[0]['off']:.2f}, ARACH − plain "
                    f"{_span(ppl, 1, 2)} over {len(ppl)} configurations ({_verdict_counts(ppl)})"
                )
        missing = len(core) * len(measures) - sum(r["measure"] in measures for r in mine)
        text = f"{head}: " + ("; ".join(parts) if parts else "no claim row complete yet")
        if missing:
            text += f"; claim rows not complete yet: {missing} of {len(core) * len(measures)}"
        if model == SWEEP_MODEL:
            swept = [
                r
                for r in rows
                if r["model"] == model and r["config"] not in core and r["measure"] in measures
            ]
            extra = len(measures) * (len(claim_configs(model)) - len(CORE_CONFIGS))
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
                    f"{med[key]:.0f}" if key in med else "?"
                    for key in ((True, "ppl"), (False, "ppl"), (True, "cloze"), (False, "cloze"))
                ),
                f"{len(mine)} / {planned_cells(model)}",
                f"{total / 3600:.1f} h"
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
