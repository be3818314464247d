"""The coverage matrix: every architecture transformers ships with softmax attention and a tiny
config that builds on CPU, captured and compared with the model's own eager attention.

Each architecture is built from a tiny random config (2 layers, hidden 32, 4 heads, a vocabulary
of 99; made from transformers' config registry with small overrides, or listed here by hand for
the ones that need special inputs: vision, speech, encoder-decoders) and given a batch of two
short inputs, the second padded where the model takes an ``attention_mask``. It then either

* captures **exactly** (``"exact"``): every attention matrix eager gives (``output_attentions``:
  the self-attention of one stack; encoder, decoder and cross attention of an encoder-decoder)
  equals the captured rows within 1e-5 at every valid query; the model's outputs while capturing
  rows and while capturing summaries are within eager's own distance from SDPA (plus a floor of
  1e-5); and the summaries equal those recomputed from the rows (``attncoda.decompose``, 1e-4), or
* is **refused** (``"refused"``): ``capture`` raises a one-line :class:`CaptureError` naming why.

Anything else (a mismatch, another exception, a refusal over several lines) is ``"fails"``.
Architectures whose tiny config does not build (or whose eager forward does not run) are listed
apart with the reason.

``python -m tests.coverage_matrix --write`` runs all of them, writes ``tests/coverage_results.json``
and regenerates the tables of ``docs/capture.md`` between their marker comments;
``tests/test_coverage_matrix.py`` checks each architecture against ``tests/coverage_expected.json``
and that the docs equal the rendering of the results file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "coverage_results.json"
EXPECTED = ROOT / "tests" / "coverage_expected.json"
DOCS = ROOT / "docs" / "capture.md"
KINDS = ("decoder", "encoder", "vision", "speech", "encoder-decoder")

#: tolerances of "exact"
ROWS_ATOL = 1e-5
OUTPUT_FLOOR = 1e-5
SUMMARY_TOL = 1e-4
#: a tiny model larger than this kept a large default the overrides missed
MAX_PARAMETERS = 20_000_000

VOCAB = 99
BATCH, SEQ, PAD = 2, 10, 3  # sample 1 has PAD padding positions

# small values for whichever of these a config has (the generic tiny config)
_TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "n_embd": 32,
    "d_model": 32,
    "embed_dim": 32,
    "dim": 32,
    "embedding_size": 32,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "d_kv": 8,
    "kv_channels": 8,
    "intermediate_size": 48,
    "n_inner": 48,
    "ffn_dim": 48,
    "d_ff": 48,
    "hidden_dim": 48,
    "encoder_ffn_dim": 48,
    "decoder_ffn_dim": 48,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "n_ctx": 64,
    "max_seq_len": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "sliding_window": 4,
    "rotary_dim": 4,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
}


@dataclass
class Arch:
    """One architecture: how to build its tiny model and its inputs."""

    name: str
    kind: str
    model_class: str
    overrides: dict[str, Any] = field(default_factory=dict)
    inputs: str = "text"  # text | text-nomask | image | audio | features | seq2seq | whisper
    note: str = ""


# ---------------------------------------------------------------------------------- registry


def _registry_archs() -> dict[str, Arch]:
    """Decoders and encoders generated from transformers' model registry."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal,
    )
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES as masked,
    )
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES as seq2seq,
    )
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES as base

    out: dict[str, Arch] = {}
    for mt, cls in causal.items():
        if mt in masked or mt in seq2seq or mt in _NOT_TEXT or not isinstance(cls, str):
            continue
        out[mt] = Arch(mt, "decoder", cls)
    for mt in masked:
        if mt in seq2seq or mt in _NOT_TEXT or not isinstance(base.get(mt), str):
            continue
        out[mt] = Arch(mt, "encoder", base[mt])
    return out


#: registry entries that are not text models of one stack (multimodal, speech, a pipeline
#: wrapper): their text inputs alone do not make a forward pass of the model they name
_NOT_TEXT = frozenset(
    {
        "whisper",
        "trocr",
        "musicgen",
        "musicgen_melody",
        "moshi",
        "fuyu",
        "git",
        "mllama",
        "emu3",
        "got_ocr2",
        "phi4_multimodal",
        "gemma3",
        "gemma3n",
        "gemma4",
        "gemma4_unified",
        "gemma4_assistant",
        "gemma4_unified_assistant",
        "llama4",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen4_exp",
        "dots3_note",
        "modernvbert",
        "ultravbert",
        "perceiver",
        "tapas",
        "layoutlm",
        "luke",
    }
)

_SPEECH_CONV = {
    "conv_dim": (16, 16),
    "conv_stride": (4, 2),
    "conv_kernel": (8, 3),
    "num_conv_pos_embeddings": 4,
    "num_conv_pos_embedding_groups": 2,
    "num_feat_extract_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "mask_time_prob": 0.0,
    "do_stable_layer_norm": True,
}

_VISION = {"image_size": 32, "patch_size": 8, "num_channels": 3}

#: architectures that need inputs other than token ids, listed by hand
_BY_HAND: list[Arch] = [
    # vision transformers
    Arch("vit", "vision", "ViTModel", _VISION, "image"),
    Arch("deit", "vision", "DeiTModel", _VISION, "image"),
    Arch("dinov2", "vision", "Dinov2Model", _VISION, "image"),
    Arch("dinov2_with_registers", "vision", "Dinov2WithRegistersModel", _VISION, "image"),
    Arch("beit", "vision", "BeitModel", _VISION, "image"),
    Arch("data2vec-vision", "vision", "Data2VecVisionModel", _VISION, "image"),
    Arch("ijepa", "vision", "IJepaModel", _VISION, "image"),
    Arch("vit_msn", "vision", "ViTMSNModel", _VISION, "image"),
    Arch("vit_mae", "vision", "ViTMAEModel", {**_VISION, "mask_ratio": 0.0}, "image"),
    Arch("clip_vision", "vision", "CLIPVisionModel", _VISION, "image"),
    Arch("siglip_vision", "vision", "SiglipVisionModel", _VISION, "image"),
    Arch(
        "swin",
        "vision",
        "SwinModel",
        {
            **_VISION,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 4],
            "window_size": 4,
        },
        "image",
    ),
    Arch(
        "swinv2",
        "vision",
        "Swinv2Model",
        {
            **_VISION,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 4],
            "window_size": 4,
        },
        "image",
    ),
    # speech encoders
    Arch("wav2vec2", "speech", "Wav2Vec2Model", _SPEECH_CONV, "audio"),
    Arch("hubert", "speech", "HubertModel", _SPEECH_CONV, "audio"),
    Arch("data2vec-audio", "speech", "Data2VecAudioModel", _SPEECH_CONV, "audio"),
    Arch("unispeech", "speech", "UniSpeechModel", _SPEECH_CONV, "audio"),
    Arch("unispeech-sat", "speech", "UniSpeechSatModel", _SPEECH_CONV, "audio"),
    Arch("wavlm", "speech", "WavLMModel", _SPEECH_CONV, "audio"),
    Arch("sew", "speech", "SEWModel", {**_SPEECH_CONV, "squeeze_factor": 1}, "audio"),
    # encoder-decoders
    Arch("t5", "encoder-decoder", "T5ForConditionalGeneration", {}, "seq2seq"),
    Arch("mt5", "encoder-decoder", "MT5ForConditionalGeneration", {}, "seq2seq"),
    Arch("umt5", "encoder-decoder", "UMT5ForConditionalGeneration", {}, "seq2seq"),
    Arch("longt5", "encoder-decoder", "LongT5ForConditionalGeneration", {}, "seq2seq"),
    Arch(
        "switch_transformers",
        "encoder-decoder",
        "SwitchTransformersForConditionalGeneration",
        {"num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1},
        "seq2seq",
    ),
    Arch("bart", "encoder-decoder", "BartForConditionalGeneration", {}, "seq2seq"),
    Arch("mbart", "encoder-decoder", "MBartForConditionalGeneration", {}, "seq2seq"),
    Arch("marian", "encoder-decoder", "MarianMTModel", {}, "seq2seq"),
    Arch("pegasus", "encoder-decoder", "PegasusForConditionalGeneration", {}, "seq2seq"),
    Arch(
        "pegasus_x",
        "encoder-decoder",
        "PegasusXForConditionalGeneration",
        {"block_size": 4, "num_global_tokens": 2},
        "seq2seq",
    ),
    Arch("blenderbot", "encoder-decoder", "BlenderbotForConditionalGeneration", {}, "seq2seq"),
    Arch(
        "blenderbot-small",
        "encoder-decoder",
        "BlenderbotSmallForConditionalGeneration",
        {},
        "seq2seq",
    ),
    Arch("m2m_100", "encoder-decoder", "M2M100ForConditionalGeneration", {}, "seq2seq"),
    Arch("nllb-moe", "encoder-decoder", "NllbMoeForConditionalGeneration", {}, "seq2seq"),
    Arch("plbart", "encoder-decoder", "PLBartForConditionalGeneration", {}, "seq2seq"),
    Arch("mvp", "encoder-decoder", "MvpForConditionalGeneration", {}, "seq2seq"),
    Arch(
        "led", "encoder-decoder", "LEDForConditionalGeneration", {"attention_window": 4}, "seq2seq"
    ),
    Arch(
        "bigbird_pegasus",
        "encoder-decoder",
        "BigBirdPegasusForConditionalGeneration",
        {"attention_type": "original_full"},
        "seq2seq",
    ),
    Arch(
        "fsmt",
        "encoder-decoder",
        "FSMTForConditionalGeneration",
        {"src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "langs": ["en", "de"]},
        "seq2seq",
    ),
    Arch(
        "prophetnet",
        "encoder-decoder",
        "ProphetNetForConditionalGeneration",
        {"ngram": 2, "num_buckets": 8, "relative_max_distance": 16},
        "seq2seq",
    ),
    Arch("t5gemma", "encoder-decoder", "T5GemmaForConditionalGeneration", {}, "seq2seq"),
    Arch(
        "whisper",
        "encoder-decoder",
        "WhisperForConditionalGeneration",
        {
            "num_mel_bins": 8,
            "max_source_positions": 16,
            "max_target_positions": 32,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
        },
        "whisper",
    ),
]


def architectures() -> dict[str, Arch]:
    """Every architecture of the matrix by name, sorted by kind and name."""
    archs = _registry_archs()
    for arch in _BY_HAND:
        archs[arch.name] = arch
    return dict(sorted(archs.items(), key=lambda kv: (KINDS.index(kv[1].kind), kv[0])))


# ---------------------------------------------------------------------------------- building


class NotBuilt(Exception):
    """The tiny config does not build, or eager does not run, on CPU: outside the matrix."""


def _config(arch: Arch, model_cls: Any) -> Any:
    config_cls = model_cls.config_class
    default = config_cls()
    kwargs = {k: v for k, v in _TINY.items() if k in vars(default)}
    kwargs.update(arch.overrides)
    if arch.kind == "vision" or arch.kind == "speech":
        kwargs.pop("vocab_size", None)
    for key in ("layer_types", "mlp_layer_types", "attention_types"):
        if key in vars(default) and key not in arch.overrides:
            kwargs[key] = None  # rebuilt for 2 layers where the config derives it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return config_cls(**kwargs)
        except Exception:
            for key in ("layer_types", "mlp_layer_types", "attention_types"):
                kwargs.pop(key, None)
            return config_cls(**kwargs)


def build(arch: Arch) -> Any:
    """The tiny random model of ``arch`` (seed 0, eval mode)."""
    import torch
    import transformers

    try:
        model_cls = getattr(transformers, arch.model_class)
    except Exception as err:
        raise NotBuilt(f"{arch.model_class} does not import: {_line(err)}") from None
    try:
        config = _config(arch, model_cls)
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            size = sum(p.numel() for p in model_cls(config).parameters())
    except Exception as err:
        raise NotBuilt(f"the tiny config does not build: {_line(err)}") from None
    if size > MAX_PARAMETERS:
        raise NotBuilt(f"the tiny config still has {size:,} parameters (a default not overridden)")
    try:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model_cls(config).eval()
    except Exception as err:
        raise NotBuilt(f"the tiny config does not build: {_line(err)}") from None


def inputs(arch: Arch, model: Any) -> tuple[dict[str, Any], dict[str, np.ndarray | None]]:
    """The batch of two and, per attention stack, which queries are valid ``(sample, query)``
    (``None``: all; the stack is filled in from the eager weights' shape where unknown)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    cfg = model.config
    if arch.inputs == "image":
        size = getattr(cfg, "image_size", 32)
        size = size if isinstance(size, int) else size[0]
        batch = {"pixel_values": torch.randn(BATCH, 3, size, size, generator=gen)}
        if arch.name == "vit_mae":  # its patches are shuffled by this noise: the same each run
            batch["noise"] = torch.rand(BATCH, (size // cfg.patch_size) ** 2, generator=gen)
        return batch, {}
    if arch.inputs == "audio":
        return {"input_values": torch.randn(BATCH, 100, generator=gen)}, {}
    if arch.inputs == "whisper":
        n = cfg.max_source_positions * 2
        feats = torch.randn(BATCH, cfg.num_mel_bins, n, generator=gen)
        dec = torch.randint(4, VOCAB - 10, (BATCH, 5), generator=gen)
        return {"input_features": feats, "decoder_input_ids": dec}, {}
    ids = torch.randint(4, VOCAB - 10, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    left = arch.kind == "decoder"
    if left:
        mask[1, :PAD] = 0
    else:
        mask[1, -PAD:] = 0
    ids[mask == 0] = 0
    valid = mask.numpy().astype(bool)
    if arch.inputs == "seq2seq":
        dec = torch.randint(4, VOCAB - 10, (BATCH, 6), generator=gen)
        batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}
        return batch, {"encoder": valid}
    return {"input_ids": ids, "attention_mask": mask}, {"self": valid}


# ---------------------------------------------------------------------------------- checking


@dataclass
class Result:
    name: str
    kind: str
    status: str  # exact | refused | fails | not built
    note: str = ""
    cpu_s: float = 0.0

    def row(self) -> dict[str, str]:
        return {"kind": self.kind, "status": self.status, "note": self.note}


def _line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first}"[:200]


def _first_tensor(out: Any) -> Any:
    import torch

    for value in out.values() if hasattr(out, "values") else out:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    raise NotBuilt("the model returns no floating-point output")


def _output_gap(a: Any, b: Any, valid: np.ndarray | None) -> float:
    x, y = a.detach().double().numpy(), b.detach().double().numpy()
    diff = np.abs(x - y)
    if valid is not None and diff.ndim >= 2 and diff.shape[:2] == valid.shape:
        diff = diff[valid]
    return float(diff.max()) if diff.size else 0.0


def _eager_stacks(out: Any) -> dict[str, np.ndarray]:
    import torch

    def stacked(weights: Any) -> np.ndarray:
        return torch.stack([w.detach() for w in weights], dim=1).double().numpy()

    if getattr(out, "cross_attentions", None) is not None and getattr(
        out, "encoder_attentions", None
    ):
        return {
            "encoder": stacked(out.encoder_attentions),
            "decoder": stacked(out.decoder_attentions),
            "cross": stacked(out.cross_attentions),
        }
    weights = getattr(out, "attentions", None)
    if weights and all(w is not None for w in weights):
        return {"self": stacked(weights)}
    raise NotBuilt("output_attentions=True returns none")


def _compare_rows(
    name: str, ds: Any, eager: np.ndarray, valid: np.ndarray | None, learned: bool = False
) -> str:
    rows = np.exp(ds.log_attn.values.astype(np.float64))
    if rows.shape != eager.shape:
        return f"{name} rows have shape {rows.shape}, eager {eager.shape}"
    if learned:  # learned sinks: eager's rows keep the sink's mass out; the capture's are closed
        total = eager.sum(-1, keepdims=True)
        eager = np.divide(eager, total, out=np.zeros_like(eager), where=total > 0)
    if valid is not None and valid.shape == (rows.shape[0], rows.shape[3]):
        keep = valid[:, None, None, :, None]
        rows, eager = np.where(keep, rows, 0.0), np.where(keep, eager, 0.0)
    gap = float(np.abs(rows - eager).max())
    return f"{name} rows differ from eager by {gap:.2e}" if not gap <= ROWS_ATOL else ""


def _compare_summaries(name: str, rows: Any, fast: Any) -> str:
    import attncoda as ac

    la = rows.log_attn.values.astype(np.float64)
    keys = np.arange(la.shape[-1])
    sink_index = np.asarray(rows.sink_index.values).reshape(-1)
    sink = np.broadcast_to((keys[None, :] == sink_index[:, None])[:, None, None, None, :], la.shape)
    live = np.isfinite(la).any(-1)  # padding queries have no row
    d = ac.decompose(
        np.where(live[..., None], la, 0.0), sink=sink, from_logits=True, degenerate="nan"
    )
    for var in ac.SUMMARY_VARIABLES:
        got = np.where(live, fast[var].values, np.nan)
        want = np.where(live, getattr(d, var), np.nan)
        finite = np.isfinite(want)
        if not (np.isfinite(got) == finite).all():
            return f"{name} {var}: NaN where the rows give a value (or the reverse)"
        if not np.allclose(got[finite], want[finite], atol=SUMMARY_TOL, rtol=SUMMARY_TOL):
            gap = float(np.abs(got[finite] - want[finite]).max())
            return f"{name} {var} differs from the rows' by {gap:.2e}"
    return ""


def check(arch: Arch) -> Result:
    """Build ``arch``, capture it and compare with eager; the :class:`Result`."""
    start = time.process_time()
    try:
        status, note = _check(arch)
    except NotBuilt as err:
        status, note = "not built", str(err)
    return Result(arch.name, arch.kind, status, note, time.process_time() - start)


def _check(arch: Arch) -> tuple[str, str]:
    import torch

    from attncoda.hooks import CaptureError, capture

    model = build(arch)
    batch, valid = inputs(arch, model)
    own = model.config._attn_implementation
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sdpa = _first_tensor(model(**batch))
            model.set_attn_implementation("eager")
            out = model(**batch, output_attentions=True)
            model.set_attn_implementation(own)
        except NotBuilt:
            raise
        except Exception as err:
            raise NotBuilt(f"the tiny model does not run: {_line(err)}") from None
        no_weights = ""
        try:
            eager = _eager_stacks(out)
        except Exception as err:
            eager, no_weights = {}, str(err) if isinstance(err, NotBuilt) else _line(err)
        mask = valid.get("self") if "self" in eager else valid.get("encoder")
        ref_gap = _output_gap(_first_tensor(out), sdpa, mask)
        try:
            with capture(model, what="rows") as cap:
                during = _first_tensor(model(**batch))
            with capture(model, what="summaries") as fast:
                during_fast = _first_tensor(model(**batch))
            _ = cap.datasets, fast.datasets  # a refusal may come when the capture is read
        except CaptureError as err:
            msg = str(err)
            if not eager and "attention" not in msg:
                raise NotBuilt(f"eager gives no attention weights ({no_weights})") from None
            if "\n" in msg.strip():
                return "fails", f"refused over several lines: {_line(err)}"
            return "refused", msg.strip()
        except Exception as err:
            return "fails", f"capture raised {_line(err)}"
    if not eager:
        raise NotBuilt(f"eager gives no attention weights ({no_weights}), yet capture ran")
    try:
        learned = any(torch.is_tensor(getattr(m, "sinks", None)) for m in model.modules())
        return _compare(eager, valid, cap, fast, sdpa, during, during_fast, ref_gap, mask, learned)
    except Exception as err:
        return "fails", f"reading the capture raised {_line(err)}"


def _compare(
    eager, valid, cap, fast, sdpa, during, during_fast, ref_gap, mask, learned
) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    got = cap.datasets
    if set(got) != set(eager):
        return "fails", f"captured stacks {sorted(got)}, eager gives {sorted(eager)}"
    problems = []
    for name, weights in eager.items():
        problems.append(_compare_rows(name, got[name], weights, valid.get(name), learned))
        problems.append(_compare_summaries(name, got[name], fast.datasets[name]))
    bound = ref_gap + OUTPUT_FLOOR
    for what, value in (("rows", during), ("summaries", during_fast)):
        gap = _output_gap(value, sdpa, mask)
        if not gap <= bound:
            problems.append(
                f"outputs while capturing {what} moved {gap:.1e} (eager vs SDPA: {ref_gap:.1e})"
            )
    problems = [p for p in problems if p]
    if problems:
        return "fails", "; ".join(problems)
    return "exact", ", ".join(f"{n} {tuple(w.shape[1:3])}" for n, w in eager.items()).replace(
        "(", "layers x heads ("
    )


# ---------------------------------------------------------------------------------- rendering

TABLE_OPEN, TABLE_CLOSE = "<!-- coverage-matrix -->", "<!-- /coverage-matrix -->"
UNBUILT_OPEN, UNBUILT_CLOSE = "<!-- coverage-not-built -->", "<!-- /coverage-not-built -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(results: dict[str, dict[str, str]]) -> tuple[str, str]:
    """The two docs tables (the matrix; the architectures that do not build) as markdown."""
    lines = ["| architecture | kind | status | notes |", "|---|---|---|---|"]
    unbuilt = ["| architecture | kind | why not in the matrix |", "|---|---|---|"]
    counts: dict[tuple[str, str], int] = {}
    for name, r in results.items():
        if r["status"] == "not built":
            unbuilt.append(f"| `{name}` | {r['kind']} | {_cell(r['note'])} |")
            continue
        counts[r["kind"], r["status"]] = counts.get((r["kind"], r["status"]), 0) + 1
        lines.append(f"| `{name}` | {r['kind']} | {r['status']} | {_cell(r['note'])} |")
    summary = "; ".join(
        f"{kind}: "
        + ", ".join(
            f"{counts[kind, s]} {s}" for s in ("exact", "refused", "fails") if (kind, s) in counts
        )
        for kind in KINDS
        if any(k == kind for k, _ in counts)
    )
    total = sum(counts.values())
    head = f"{total} architectures ({summary}).\n\n"
    return head + "\n".join(lines) + "\n", "\n".join(unbuilt) + "\n"


def _replace_block(text: str, open_: str, close: str, body: str) -> str:
    pattern = re.compile(rf"^{re.escape(open_)}\n.*?^{re.escape(close)}$", re.S | re.M)
    if not pattern.search(text):
        raise SystemExit(f"{DOCS.name} has no {open_} ... {close} block")
    return pattern.sub(lambda _m: f"{open_}\n{body}{close}", text)


def docs_blocks(text: str) -> tuple[str, str]:
    """The bodies of the two generated blocks in the text of docs/capture.md."""
    out = []
    for open_, close in ((TABLE_OPEN, TABLE_CLOSE), (UNBUILT_OPEN, UNBUILT_CLOSE)):
        m = re.search(rf"^{re.escape(open_)}\n(.*?)^{re.escape(close)}$", text, re.S | re.M)
        out.append(m.group(1) if m else "")
    return out[0], out[1]


def write_docs(results: dict[str, dict[str, str]]) -> None:
    table, unbuilt = render(results)
    text = DOCS.read_text(encoding="utf-8")
    text = _replace_block(text, TABLE_OPEN, TABLE_CLOSE, table)
    text = _replace_block(text, UNBUILT_OPEN, UNBUILT_CLOSE, unbuilt)
    DOCS.write_text(text, encoding="utf-8")


def load_results() -> dict[str, dict[str, str]]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.coverage_matrix", description=__doc__)
    parser.add_argument("names", nargs="*", help="architectures to run (default: all)")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write tests/coverage_results.json and the tables of docs/capture.md",
    )
    args = parser.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    archs = architectures()
    names = args.names or list(archs)
    results: dict[str, dict[str, str]] = {}
    total = 0.0
    for name in names:
        r = check(archs[name])
        total += r.cpu_s
        results[name] = r.row()
        print(f"{r.cpu_s:6.2f}s  {r.kind:16} {name:28} {r.status:9} {r.note}", flush=True)
    print(f"{len(results)} architectures in {total:.1f} CPU-s")
    if args.write:
        if args.names:
            raise SystemExit("--write runs every architecture; give no names")
        RESULTS.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        write_docs(results)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
