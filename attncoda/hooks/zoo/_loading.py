"""Loading a model by its MODEL argument: a twin, an offline asset, or a hub checkpoint.

:func:`check_model` validates the argument without loading anything; :func:`load` returns
``(model, tokenizer)`` in eager attention, from the offline assets first (see
:mod:`attncoda.hooks.assets`), else from a hub or its local cache.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ._entries import _BY_HUB_ID, _BY_NAME, MODELS, ModelEntry, _unknown_message, resolve_family
from ._errors import ModelUnavailableError, UnknownModelError
from ._families import _TWINS, FAMILIES
from ._twins import ByteTokenizer, _as_dtype, tiny_twin

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "check_model",
    "load",
]


def check_model(name: str) -> str:
    """Check a MODEL argument without loading anything; return which form it is.

    The forms, in the order they are tried: ``twin:FAMILY`` (a tiny random twin,
    :func:`tiny_twin`), a registry name or hub id of a registry entry (:func:`list_models`; an
    entry with an offline asset loads from the cache), a local checkpoint directory (holding
    ``config.json`` or one ``.gguf`` file), and any other hub id ``org/name``.

    Returns
    -------
    {"twin", "registry", "local", "hub"}

    Raises
    ------
    UnknownModelError
        For anything else, with the closest registry names; for a path that is not a
        checkpoint directory; for an unknown twin family.

    Examples
    --------
    >>> check_model("smollm2-135m"), check_model("twin:llama"), check_model("org/model")
    ('registry', 'twin', 'hub')
    >>> check_model("smolm2")
    Traceback (most recent call last):
    ...
    attncoda.hooks.zoo.UnknownModelError: unknown model 'smolm2'. Did you mean 'smollm2-135m'? ...
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownModelError(f"a model name must be a non-empty string, got {name!r}")
    key = name.strip()
    if key.startswith("twin:"):
        family = key.split(":", 1)[1]
        try:
            resolved = resolve_family(family)
        except KeyError:
            resolved = ""
        if resolved not in _TWINS:
            raise UnknownModelError(
                f"unknown twin family {family!r}; families: {', '.join(FAMILIES)}"
            )
        return "twin"
    if _BY_NAME.get(key.lower()) or _BY_HUB_ID.get(key.lower()):
        return "registry"
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and len(list(path.glob("*.gguf"))) != 1:
            raise UnknownModelError(
                f"{key!r} is not a checkpoint directory: it has no config.json and not exactly "
                "one .gguf file (save one with model.save_pretrained(DIR))"
            )
        return "local"
    looks_like_path = key.startswith(("/", ".", "~")) or key.endswith("/") or key.count("/") > 1
    if looks_like_path or path.exists():
        raise UnknownModelError(f"no checkpoint directory at {key!r}")
    if key.count("/") == 1:
        return "hub"
    raise UnknownModelError(
        _unknown_message(key, "model")
        + " Pass a registry name, twin:FAMILY, a hub id 'org/name' or a local checkpoint "
        "directory."
    )


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_LOCATE_KWARGS = frozenset(
    {"revision", "local_files_only", "gguf_file", "token", "subfolder", "trust_remote_code"}
)


def load(
    name: str | os.PathLike[str],
    *,
    revision: str | None = None,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    source: Literal["auto", "asset", "hub"] = "auto",
    cache_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    """Load a model and its tokenizer, in eval mode: the one loader behind every MODEL argument.

    ``name`` may be

    - ``twin:FAMILY``: the tiny random twin of a family (:func:`tiny_twin`), with a
      :class:`ByteTokenizer`;
    - a registry name (:func:`list_models`). With ``source="auto"`` an entry that has an offline
      asset loads it from the cache filled by ``attncoda fetch NAME`` (through
      :func:`attncoda.hooks.assets.load_model`), and any other entry loads its hub id;
    - a local directory holding a transformers checkpoint (``config.json`` plus weights, e.g. from
      ``save_pretrained``) or a single ``.gguf`` file; never touches a hub;
    - any other hub id (``"org/name"``), for users with a hub.

    Parameters
    ----------
    name
        Registry name, hub id or local directory.
    revision
        Hub revision: a branch, tag or commit, e.g. a Pythia training checkpoint ``"step1000"``
        (see :func:`pythia_revisions`). Implies the hub for registry names.
    dtype
        Weight dtype (``torch.float32`` by default); ``"auto"`` keeps the checkpoint's dtype.
    device
        Device to put the model on.
    attn_implementation
        Passed to ``from_pretrained``; transformers' default (sdpa where supported) when None.
    source
        ``"auto"`` (offline asset where the entry has one, else hub), ``"asset"`` or ``"hub"``.
    cache_dir
        Cache directory of the offline assets (see :mod:`attncoda.hooks.assets`); not the hub
        cache, which transformers takes from ``HF_HOME``.
    **kwargs
        Passed to the model's ``from_pretrained`` for hub ids and local directories (e.g.
        ``local_files_only=True``, ``token``, ``trust_remote_code``); those that locate files
        (``revision``, ``local_files_only``, ``gguf_file``, ``token``, ``subfolder``,
        ``trust_remote_code``) also go to the config and the tokenizer. Not used for offline
        assets.

    Returns
    -------
    model : transformers.PreTrainedModel
        A causal LM (``AutoModelForCausalLM``) for decoders, ``AutoModel`` for encoders.
    tokenizer : transformers.PreTrainedTokenizerBase, ByteTokenizer or None
        A :class:`ByteTokenizer` for a twin; None for a local directory without tokenizer
        files.

    Raises
    ------
    ValueError
        For a name that is neither a registry name, a directory nor a hub id; for a Pythia
        ``step`` revision that was never published; for ``source="asset"`` without an asset.
    ModelUnavailableError
        (an ``OSError``) when the hub cannot be reached or has no such model, or the offline asset
        is not fetched; the message says what would make the model available.

    Examples
    --------
    >>> model, tok = load("minilm-l6")  # doctest: +SKIP
    >>> model, tok = load("pythia-70m", revision="step512")  # doctest: +SKIP
    >>> model, tok = load("/path/to/checkpoint")  # doctest: +SKIP
    """
    if source not in ("auto", "asset", "hub"):
        raise UnknownModelError(f"source must be 'auto', 'asset' or 'hub', not {source!r}")
    key = os.fspath(name).strip() if isinstance(name, os.PathLike) else str(name).strip()
    if not isinstance(name, os.PathLike) and key.startswith("twin:"):
        check_model(key)
        twin = tiny_twin(
            key.split(":", 1)[1],
            attn_implementation=attn_implementation,
            dtype="float32" if dtype == "auto" else dtype,
        )
        if str(device) != "cpu":
            twin = twin.to(device)  # type: ignore[arg-type]  # transformers types .to narrowly
        from .._registry import text_config  # imports torch: only when a model is built

        return twin, ByteTokenizer(int(text_config(twin).vocab_size))
    entry = None
    if not isinstance(name, os.PathLike):
        entry = _BY_NAME.get(key.lower()) or _BY_HUB_ID.get(key.lower())
    if entry is None and (isinstance(name, os.PathLike) or os.path.isdir(key)):
        path = Path(key).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"no checkpoint directory at {str(path)!r}")
        return _load_pretrained(
            str(path), None, dtype, device, attn_implementation, local=True, **kwargs
        )
    if entry is None:
        if check_model(key) != "hub":  # raises UnknownModelError for anything else
            raise UnknownModelError(f"{key!r} is not a hub id")
        if source == "asset":
            raise ValueError(f"{key!r} has no offline asset")
        return _load_hub(key, None, revision, dtype, device, attn_implementation, **kwargs)

    if revision is not None and revision.startswith("step") and entry.revisions:
        if revision not in entry.revisions:
            close = difflib.get_close_matches(revision, entry.revisions, n=3)
            raise ValueError(
                f"{entry.name!r} has no revision {revision!r}"
                + (f" (closest: {', '.join(close)})" if close else "")
                + "; see pythia_revisions()"
            )
    use_asset = entry.asset is not None and revision is None and source != "hub"
    if source == "asset" and entry.asset is None:
        raise ValueError(f"{entry.name!r} has no offline asset; use source='hub' with a hub")
    if source == "asset" and revision is not None:
        raise ValueError("offline assets have no revisions; use source='hub' for revision=")
    if use_asset:
        assert entry.asset is not None
        return _load_asset(entry, dtype, device, attn_implementation, cache_dir)
    return _load_hub(entry.hub_id, entry, revision, dtype, device, attn_implementation, **kwargs)


def _load_asset(
    entry: ModelEntry,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    cache_dir: str | os.PathLike[str] | None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    from attncoda.hooks import assets  # lazy: heavy, and only needed here

    assert entry.asset is not None
    try:
        return assets.load_model(
            entry.asset,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            cache_dir=cache_dir,
        )
    except assets.AssetNotFoundError as exc:
        raise ModelUnavailableError(
            f"{exc} (the offline asset {entry.asset!r} is not fetched: run "
            f"`attncoda fetch {entry.asset}`; with a model hub, "
            f"load({entry.name!r}, source='hub') loads {entry.hub_id!r} instead)"
        ) from exc


def _load_hub(
    hub_id: str,
    entry: ModelEntry | None,
    revision: str | None,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    try:
        return _load_pretrained(
            hub_id,
            entry,
            dtype,
            device,
            attn_implementation,
            local=False,
            revision=revision,
            **kwargs,
        )
    except OSError as exc:
        where = f"{hub_id!r}" + (f" at revision {revision!r}" if revision else "")
        offline = sorted(e.name for e in MODELS if e.asset is not None)
        raise ModelUnavailableError(
            f"could not load {where} from a model hub ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}). This model "
            "needs a reachable model hub (or the checkpoint in the local hub cache); attncoda "
            f"never downloads from a hub by itself. Models available offline: "
            f"{', '.join(offline)} (`attncoda fetch NAME`), or pass a local checkpoint "
            "directory."
        ) from exc


def _load_pretrained(
    where: str,
    entry: ModelEntry | None,
    dtype: torch.dtype | str,
    device: str | torch.device,
    attn_implementation: str | None,
    *,
    local: bool,
    revision: str | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | ByteTokenizer | None]:
    import transformers

    common: dict[str, Any] = dict(kwargs)
    if revision is not None:
        common["revision"] = revision
    if local:
        common.setdefault("local_files_only", True)
        folder = Path(where)
        if not (folder / "config.json").exists():
            ggufs = sorted(folder.glob("*.gguf"))
            if len(ggufs) != 1:
                raise FileNotFoundError(
                    f"{where!r} is not a checkpoint directory: no config.json "
                    f"and {len(ggufs)} .gguf files"
                )
            common.setdefault("gguf_file", ggufs[0].name)

    # the keyword arguments that locate files, shared by config, model and tokenizer
    locate = {k: v for k, v in common.items() if k in _LOCATE_KWARGS}
    if entry is not None:
        auto_name: str = entry.auto_class
    else:
        config = transformers.AutoConfig.from_pretrained(where, **locate)
        archs = getattr(config, "architectures", None) or []
        causal = any(a.endswith(_CAUSAL_SUFFIXES) for a in archs)
        auto_name = "AutoModelForCausalLM" if causal else "AutoModel"
    auto = getattr(transformers, auto_name)

    model_kwargs = dict(common)
    model_kwargs["dtype"] = dtype if dtype == "auto" else _as_dtype(dtype)
    if attn_implementation is not None:
        model_kwargs["attn_implementation"] = attn_implementation
    model = auto.from_pretrained(where, **model_kwargs)
    model.eval()
    if str(device) != "cpu":
        model = model.to(device)

    tokenizer: PreTrainedTokenizerBase | None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, **locate)
    except (OSError, ValueError, TypeError):
        if not local:
            raise
        tokenizer = None  # a bare checkpoint (e.g. a saved tiny twin) has no tokenizer
    return model, tokenizer
