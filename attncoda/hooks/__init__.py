"""attncoda.hooks: everything that touches models.

``capture`` (attention rows and summaries from any HuggingFace model; ``empty_cache`` gives
back the freed rows buffer kept for the next capture; ``native_status`` says whether the
summaries' one pass runs attncoda's compiled kernel), ``zoo`` (model registry and tiny twins),
``assets`` (offline real models and corpora). The core ``attncoda`` package
never imports torch or transformers; this package imports them lazily, on first use of
``capture`` (so ``attncoda fetch`` works without loading torch).

Modules, one idea each (import them by name, e.g. ``from attncoda.hooks import gates``):

- ``gates``: zero or mean ablation of attention heads; ``scores``: head-importance scores and
  prune plans; ``prune``: the sweep over scores and pruned-head counts behind ``attncoda prune``.
- ``evaluate``: the one next-token loss, perplexity on fixed windows, per-token scores, paired
  bootstrap intervals, a cloze task.
- ``arach``: the ARACH hub-token plug-in; ``arach_audit``: its attention audit (datasets).
- ``rpa``: the RPA prior and its plug-in; ``rpa_train``: the Guardian, the schedules and the
  trainer; ``rpa_checkpoints``: checkpoints and the run-folder layout; ``rpa_audit``: the audits
  of the prior (datasets) behind ``attncoda audit rpa``.
- ``demo``, ``distributed``: the main job and capture at scale.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._capture import (
        ATTENTION_NAME,
        Capture,
        CaptureError,
        CaptureSpec,
        SinkTokenWarning,
        capture,
    )
    from ._native import native_status
    from ._rows import empty_cache

__all__ = [
    "ATTENTION_NAME",
    "Capture",
    "CaptureError",
    "CaptureSpec",
    "SinkTokenWarning",
    "capture",
    "empty_cache",
    "native_status",
]


#: the private module each public name comes from, imported on first use (it imports torch)
_HOMES = dict.fromkeys(__all__, "_capture") | {"empty_cache": "_rows", "native_status": "_native"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'attncoda.hooks' has no attribute {name!r}")
