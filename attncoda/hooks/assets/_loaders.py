"""Loading fetched assets: :func:`load_model`, :func:`load_corpus`, :func:`load_text`, :func:`paragraphs`.

Every loader verifies the asset first (:func:`asset_path`) and never fetches: a missing asset is
an :class:`AssetNotFoundError` that names the ``attncoda fetch`` command.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ._cache import FileProblem, _read_manifest, asset_path
from ._errors import AssetDamagedError
from ._registry import Asset, get_asset

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "load_corpus",
    "load_model",
    "load_speech",
    "load_text",
    "paragraphs",
]


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


class _no_loading_bar:
    """transformers' progress bars off while a model loads from local files: its 'Loading
    weights' bar takes a second, says nothing, prints even under ``-q``, and in a kernel without
    ipywidgets comes with a red TqdmWarning."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        if self._was_on:
            hf_logging.enable_progress_bar()


def _load_folder(
    asset: Asset,
    folder: Path,
    *,
    dtype: torch.dtype | str,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import transformers

    auto = getattr(transformers, asset.details["auto_class"])
    kwargs: dict[str, Any] = {"dtype": dtype, "local_files_only": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with _no_loading_bar():
        model = auto.from_pretrained(str(folder), **kwargs).eval()
    # speech models come with their processor (feature extractor and tokenizer)
    reader = (
        transformers.AutoProcessor if asset.details.get("processor") else transformers.AutoTokenizer
    )
    tokenizer = reader.from_pretrained(str(folder), local_files_only=True)
    return model, tokenizer


def load_model(
    name: str,
    *,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a fetched model and its tokenizer from the cache (never from a hub).

    Parameters
    ----------
    name
        ``"smollm2-135m"``, ``"gemma3-270m"``, ``"minilm-l6"``, ``"mpnet-base"``,
        ``"qwen2.5-coder-0.5b"`` or ``"qwen2.5-coder-1.5b"``.
    dtype
        Weight dtype, a ``torch.dtype`` or its name; default fp32 (the cached weights are fp32).
    device
        Device to move the model to.
    attn_implementation
        Passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"eager"``); transformers' default
        when None.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    model : transformers.PreTrainedModel
        In eval mode: ``LlamaForCausalLM``, ``Gemma3ForCausalLM``, ``BertModel``,
        ``MPNetModel`` or ``Qwen2ForCausalLM``.
    tokenizer : transformers.PreTrainedTokenizerBase

    Raises
    ------
    AssetDamagedError
        If a file of the model (weights, config, tokenizer) does not have its manifest's sha256;
        checked before anything is loaded. The message names ``attncoda fetch NAME``, which
        repairs it.
    AssetNotFoundError
        If the model is not fetched or stale; the message names ``attncoda fetch NAME``.
    ValueError
        If ``name`` is a corpus.

    Examples
    --------
    >>> model, tok = load_model("smollm2-135m")  # doctest: +SKIP
    >>> type(model).__name__, model.config.num_hidden_layers  # doctest: +SKIP
    ('LlamaForCausalLM', 30)
    """
    asset = get_asset(name)
    if asset.kind != "model":
        raise ValueError(f"{name!r} is a corpus; use load_corpus({name!r}) or load_text({name!r})")
    folder = asset_path(name, cache_dir)
    model, tokenizer = _load_folder(
        asset, folder, dtype=dtype, attn_implementation=attn_implementation
    )
    if str(device) != "cpu":
        # PreTrainedModel.to is wrapped by a decorator whose stub mypy misreads
        cast(Any, model).to(device)
    return model, tokenizer


def load_corpus(
    name: str, *, cache_dir: str | os.PathLike[str] | None = None, verify: bool = True
) -> dict[str, str]:
    """Load a fetched corpus as ``{document name: text}``, in the corpus's order.

    Document names: Austen's six novels by their janeaustenr names (``"sensesensibility"``,
    ``"prideprejudice"``, ``"mansfieldpark"``, ``"emma"``, ``"northangerabbey"``,
    ``"persuasion"``); ``"mobydick"``; Wikipedia article titles (the first is ``"Anarchism"``);
    for ``"web"`` (World English Bible) ``"Preface"``, the books by their usual English names
    (``"Genesis"`` ... ``"Malachi"``, with ``"Daniel (Greek)"`` after ``"Daniel"``; the
    deuterocanon, ``"Tobit"`` ... ``"4 Maccabees"``; ``"Matthew"`` ... ``"Revelation"``) and
    ``"Glossary"``, 83 in all (``get_asset("web").details["documents"]``).
    Paragraphs are blank-line-separated blocks (see :func:`paragraphs`); in ``"web"`` a paragraph
    is one of the module's paragraphs (a chapter starts one), with each verse, and each line of
    poetry, on its own line. Notes, cross-references and headings (including the psalm
    superscriptions) are dropped.

    Parameters
    ----------
    name
        ``"austen"``, ``"mobydick"``, ``"wikipedia"`` or ``"web"``.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.
    verify
        Check the sha256 of the bytes read once more (a few milliseconds), against a change
        after :func:`asset_path` verified every file of the corpus.

    Returns
    -------
    dict of str to str

    Raises
    ------
    AssetDamagedError
        If a file of the corpus is damaged (another sha256, or missing); the message names the
        file and ``attncoda fetch NAME``, which repairs it.
    AssetNotFoundError
        If the corpus is not fetched or stale; the message names ``attncoda fetch NAME``.

    Examples
    --------
    >>> books = load_corpus("austen")  # doctest: +SKIP
    >>> list(books)[:2]  # doctest: +SKIP
    ['sensesensibility', 'prideprejudice']
    """
    asset = get_asset(name)
    if asset.kind != "corpus":
        raise ValueError(f"{name!r} is a model; use load_model({name!r})")
    folder = asset_path(name, cache_dir)
    manifest = _read_manifest(folder)
    out: dict[str, str] = {}
    for doc in manifest["documents"]:
        data = (folder / doc["file"]).read_bytes()
        actual = hashlib.sha256(data).hexdigest() if verify else doc["sha256"]
        if actual != doc["sha256"]:  # changed since asset_path checked it
            problem = FileProblem(doc["file"], doc["sha256"], actual).describe()
            raise AssetDamagedError(
                f"asset {name!r} is damaged in {folder}: {problem} (changed after it was "
                f"fetched); run `{asset.fetch_command}` to repair it"
            )
        out[doc["name"]] = data.decode("utf-8")
    return out


def load_speech(
    name: str = "austen-speech", *, cache_dir: str | os.PathLike[str] | None = None
) -> dict[str, tuple[Any, str]]:
    """Load a fetched speech corpus as ``{name: (16 kHz float32 samples, text)}``.

    Parameters
    ----------
    name
        ``"austen-speech"`` (the first sentence of Emma's chapters I-V, spoken by espeak-ng).
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    dict of str to (numpy.ndarray, str)

    Raises
    ------
    AssetNotFoundError
        If the corpus is not fetched, stale or damaged; the message names ``attncoda fetch NAME``.
    ValueError
        If ``name`` has no recordings.

    Examples
    --------
    >>> clips = load_speech()  # doctest: +SKIP
    >>> audio, text = clips["emma-chiii"]  # doctest: +SKIP
    >>> text.strip()  # doctest: +SKIP
    'Mr. Woodhouse was fond of society in his own way.'
    """
    from ._speech import read_wav

    texts = load_corpus(name, cache_dir=cache_dir)
    folder = asset_path(name, cache_dir)
    recordings = _read_manifest(folder).get("recordings")
    if not recordings:
        raise ValueError(f"corpus {name!r} has no recordings; use load_corpus({name!r})")
    return {r["name"]: (read_wav(folder / r["file"]), texts[r["name"]]) for r in recordings}


def load_text(
    name: str,
    document: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> str:
    """Load one document of a fetched corpus, or the whole corpus as one string.

    Parameters
    ----------
    name
        ``"austen"``, ``"mobydick"``, ``"wikipedia"`` or ``"web"``.
    document
        A document name (see :func:`load_corpus`). None returns the only document of a
        one-document corpus, or all documents joined by a blank line.
    cache_dir
        Cache directory; default :func:`default_cache_dir`.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        If ``document`` is not in the corpus; the message lists the names.
    AssetNotFoundError
        If the corpus is not fetched, stale or damaged (:class:`AssetDamagedError`); the message
        names ``attncoda fetch NAME``.

    Examples
    --------
    >>> pp = load_text("austen", "prideprejudice")  # doctest: +SKIP
    >>> "It is a truth universally acknowledged" in pp  # doctest: +SKIP
    True
    """
    docs = load_corpus(name, cache_dir=cache_dir)
    if document is None:
        return "\n\n".join(t.rstrip("\n") for t in docs.values()) + "\n"
    try:
        return docs[document]
    except KeyError:
        names = list(docs)
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        raise KeyError(f"corpus {name!r} has no document {document!r}; it has: {shown}") from None


_PARA_SPLIT = re.compile(r"\n[ \t]*\n")


def paragraphs(text: str, min_words: int = 1) -> list[str]:
    """Split text into paragraphs at blank lines and unwrap hard-wrapped lines.

    The lines of each blank-line-separated block are joined with single spaces (Austen and
    Moby-Dick are hard-wrapped at about 70 characters), and runs of whitespace are collapsed.

    Parameters
    ----------
    text
        Text whose paragraphs are separated by one or more blank lines.
    min_words
        Keep only paragraphs with at least this many whitespace-separated words.

    Returns
    -------
    list of str

    Examples
    --------
    >>> paragraphs("It is a truth\\nuniversally acknowledged.\\n\\n\\nChapter 2\\n")
    ['It is a truth universally acknowledged.', 'Chapter 2']
    >>> paragraphs("one two\\n\\nthree", min_words=2)
    ['one two']
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for block in _PARA_SPLIT.split(text):
        words = block.split()
        if words and len(words) >= min_words:
            out.append(" ".join(words))
    return out
