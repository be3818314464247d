"""attncoda.hooks: everything that touches models.

``capture`` (attention rows and summaries from any HuggingFace model), ``zoo`` (model registry
and tiny twins), ``assets`` (offline real models and corpora). The core ``attncoda`` package
never imports torch or transformers; this package imports them lazily, on first use of
``capture`` (so ``attncoda fetch`` works without loading torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._capture import ATTENTION_NAME, Capture, CaptureError, CaptureSpec, capture

__all__ = ["ATTENTION_NAME", "Capture", "CaptureError", "CaptureSpec", "capture"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import _capture

        return getattr(_capture, name)
    raise AttributeError(f"module 'attncoda.hooks' has no attribute {name!r}")
