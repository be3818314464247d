"""attncoda.hooks: everything that touches models.

``capture`` (attention rows and summaries from any HuggingFace model), ``zoo`` (model registry
and tiny twins), ``assets`` (offline real models and corpora). Importing this package imports
torch and transformers; the core ``attncoda`` package never does.
"""

from ._capture import ATTENTION_NAME, Capture, CaptureError, CaptureSpec, capture

__all__ = ["ATTENTION_NAME", "Capture", "CaptureError", "CaptureSpec", "capture"]
