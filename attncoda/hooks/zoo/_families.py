"""The families attncoda knows (transformers ``model_type`` names) and the tiny twin spec of each.

A spec is the config class, its small settings (2 layers, hidden size 32, 4 heads) and the
features of the family that matter for attention (grouped-query attention, sliding windows,
softcapping, learned sinks, bidirectional attention); :mod:`._twins` builds models from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "FAMILIES",
]


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

AutoClassName = Literal["AutoModelForCausalLM", "AutoModel"]


# --------------------------------------------------------------------------------------------
# Tiny twins
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TwinSpec:
    config_class: str
    auto_class: AutoClassName
    config: Mapping[str, Any]
    bos_id: int | None = None  # prepended by tiny_batch, like the real tokenizer
    eos_id: int | None = None  # appended by tiny_batch (BERT's [SEP])


_V = 128  # twin vocabulary size; tiny_batch draws ordinary tokens from [4, 100)
_TOKEN_LOW, _TOKEN_HIGH = 4, 100
_SMALL = {"vocab_size": _V, "initializer_range": 0.2, "max_position_embeddings": 64}
_ROPE = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    **_SMALL,
}
_MIXED = ["sliding_attention", "full_attention"]

# initializer_range 0.2 (instead of the usual 0.02) gives attention logits of order 1, so that
# attention rows of the twins are far from uniform and softcapping and sinks change the outputs.
_TWINS: dict[str, _TwinSpec] = {
    "gpt2": _TwinSpec(
        "GPT2Config",
        "AutoModelForCausalLM",
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "n_inner": 64,
            "n_positions": 64,
            "vocab_size": _V,
            "initializer_range": 0.2,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
        },
    ),
    "gpt_neox": _TwinSpec(
        "GPTNeoXConfig",
        "AutoModelForCausalLM",
        {**_ROPE, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1},
    ),
    "opt": _TwinSpec(
        "OPTConfig",
        "AutoModelForCausalLM",
        {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "ffn_dim": 64,
            "word_embed_proj_dim": 32,
            "num_attention_heads": 4,
            "dropout": 0.0,
            **_SMALL,
            "pad_token_id": 1,
            "bos_token_id": 2,
            "eos_token_id": 2,
        },
        bos_id=2,
    ),
    "llama": _TwinSpec(
        "LlamaConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
        },
    ),
    "qwen2": _TwinSpec(
        "Qwen2Config",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "bos_token_id": None,
            "eos_token_id": 3,
            "pad_token_id": 3,
        },
    ),
    "gemma3_text": _TwinSpec(
        "Gemma3TextConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "layer_types": _MIXED,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        bos_id=2,
    ),
    "gemma2": _TwinSpec(
        "Gemma2Config",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "layer_types": _MIXED,
            # the real model caps at 50, which random logits of order 1 never reach
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        bos_id=2,
    ),
    "gpt_oss": _TwinSpec(
        "GptOssConfig",
        "AutoModelForCausalLM",
        {
            **_ROPE,
            "intermediate_size": 32,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "layer_types": _MIXED,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
            "pad_token_id": 3,
            "eos_token_id": 3,
        },
    ),
    "bert": _TwinSpec(
        "BertConfig",
        "AutoModel",
        {
            **_ROPE,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "pad_token_id": 0,
        },
        bos_id=101,  # [CLS], as in bert-base-uncased's vocabulary
        eos_id=102,  # [SEP]
    ),
}

#: Every family with a tiny twin (transformers ``model_type`` names).
FAMILIES: tuple[str, ...] = tuple(_TWINS)

_ALIASES = {
    "gemma3": "gemma3_text",
    "gemma": "gemma3_text",
    "pythia": "gpt_neox",
    "neox": "gpt_neox",
    "gptneox": "gpt_neox",
    "gptoss": "gpt_oss",
    "smollm2": "llama",
    "qwen": "qwen2",
    "minilm": "bert",
}
