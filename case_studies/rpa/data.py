"""Austen token data for the RPA case study: SmolLM2's tokenizer, optionally a small vocabulary.

Five novels train, *Persuasion* is held out. Every paragraph (blank-line block, hard wraps
unwrapped) is tokenized without special tokens and followed by ``<|endoftext|>``, as the paper
appends an EOS after every WikiText line. *Persuasion* is cut into sequential non-overlapping
chunks of the evaluation length (the tail is dropped); its first ``control_chunks`` chunks form
the *control* set that the Guardian, the context game and SWA-select read, and the rest the
*validation* set whose CE is reported (so nothing that steers training is scored).

With ``vocab`` set, SmolLM2 ids are remapped to the ``vocab - 1`` most frequent ids of the
*training* novels (by frequency rank) plus one UNK id, which makes the output layer small
enough to train on two CPU cores; ``vocab=None`` keeps SmolLM2's 49,152 ids (the paper-size
setting, for a GPU). The tokenized corpus is cached in ``cache_dir``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import attncoda as ac
from attncoda.hooks import assets
from attncoda.hooks.rpa_train import TokenData

from .._study import write_text

TRAIN_BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey")
HELD_OUT = "persuasion"
TOKENIZER = "smollm2-135m"
SEPARATOR = "<|endoftext|>"


@dataclass
class AustenData:
    """Token data plus what is needed to report it."""

    data: TokenData
    vocab_size: int
    unk_rate_train: float
    unk_rate_validation: float
    n_train_tokens: int
    n_validation_tokens: int
    n_control_tokens: int

    def describe(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "unk_rate_train": self.unk_rate_train,
            "unk_rate_validation": self.unk_rate_validation,
            "train_tokens": self.n_train_tokens,
            "validation_tokens": self.n_validation_tokens,
            "control_tokens": self.n_control_tokens,
            "train_books": list(TRAIN_BOOKS),
            "held_out": HELD_OUT,
        }


def _tokenize_books(cache_dir: Path) -> dict[str, np.ndarray]:
    """SmolLM2 ids of every novel (paragraphs + separator), cached as .npz."""
    path = cache_dir / "austen_smollm2_ids.npz"
    if path.is_file():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    import transformers

    folder = assets.asset_path(TOKENIZER)  # raises naming `attncoda fetch smollm2-135m`
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    sep = tok.convert_tokens_to_ids(SEPARATOR)
    if sep is None or sep == tok.unk_token_id:
        sep = tok.eos_token_id
    books = assets.load_corpus("austen")
    out: dict[str, np.ndarray] = {}
    for name, text in books.items():
        paras = assets.paragraphs(text)
        enc = tok(paras, add_special_tokens=False)["input_ids"]
        ids = [t for p in enc for t in (*p, sep)]
        out[name] = np.asarray(ids, dtype=np.int32)
    with ac.atomic_output(path, overwrite=True, is_ours=lambda _path: None) as tmp:
        np.savez(tmp, **out)  # tmp keeps the name, so savez adds no second .npz
    return out


def load_austen(
    *,
    context: int = 128,
    vocab: int | None = 8192,
    control_chunks: int = 32,
    cache_dir: str | Path = "case_studies/rpa/results/data",
) -> AustenData:
    """Train / control / validation token data from Austen's novels.

    Parameters
    ----------
    context : int
        Chunk length of the control and validation sets.
    vocab : int or None
        Remapped vocabulary size (most frequent training ids + UNK), or None for SmolLM2's own.
    control_chunks : int
        Leading chunks of the held-out novel used for control only.
    cache_dir : path
        Where the tokenized novels are cached.

    Returns
    -------
    AustenData
    """
    books = _tokenize_books(Path(cache_dir))
    train = np.concatenate([books[b] for b in TRAIN_BOOKS])
    held = books[HELD_OUT]
    if vocab is not None:
        ids, counts = np.unique(train, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        keep = ids[order[: vocab - 1]]
        table = np.full(int(max(train.max(), held.max())) + 1, vocab - 1, dtype=np.int64)
        table[keep] = np.arange(len(keep))
        train_m, held_m = table[train], table[held]
        unk_tr = float(np.mean(train_m == vocab - 1))
        unk_va = float(np.mean(held_m == vocab - 1))
        vocab_size = vocab
        meta = {"kept_smollm2_ids": keep.tolist()}
        write_text(Path(cache_dir) / f"vocab{vocab}.json", json.dumps(meta))
    else:
        train_m, held_m = train.astype(np.int64), held.astype(np.int64)
        unk_tr = unk_va = 0.0
        vocab_size = 49152
    n = len(held_m) // context
    chunks = torch.as_tensor(held_m[: n * context]).view(n, context)
    if n <= control_chunks:
        raise ValueError(f"the held-out novel has only {n} chunks of {context} tokens")
    control, validation = chunks[:control_chunks], chunks[control_chunks:]
    return AustenData(
        data=TokenData(torch.as_tensor(train_m), control, validation),
        vocab_size=vocab_size,
        unk_rate_train=unk_tr,
        unk_rate_validation=unk_va,
        n_train_tokens=len(train_m),
        n_validation_tokens=validation.numel(),
        n_control_tokens=control.numel(),
    )
