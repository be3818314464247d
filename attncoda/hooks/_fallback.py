"""Capture for models that cannot switch attention implementation: eager weights + forward hooks.

Older-style modelling code (GPT-Neo, Bloom, Falcon, ...) computes attention itself instead of
calling transformers' attention registry. There the only access is the probabilities the module
returns with ``output_attentions=True``. They are converted to fp32 log-probabilities; exact
zeros (structural masks, and fp16/bf16 underflow, which cannot be told apart here) become
invisible keys. This path is slower and holds each layer's T x T weights while it runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ._registry import attention_modules
from ._session import (
    _call_positions,
    _Record,
    _Session,
    _sink_index,
    _sink_mask,
    _summaries_from_logits,
    check_call_shape,
    check_finite_rows,
)
from ._spec import CaptureError


@contextmanager
def fallback_capture(model: Any, session: _Session) -> Iterator[None]:
    """Install hooks that read attention weights from attention modules; always remove them."""
    modules = attention_modules(model)
    if not modules:
        raise CaptureError(
            f"{type(model).__name__} cannot switch its attention implementation and has no "
            "attention module to hook; attncoda cannot capture it"
        )
    handles = []
    for index, module in enumerate(modules):
        session.layer_of[id(module)] = index
        handles.append(module.register_forward_hook(_hook(session, index)))

    def force_weights(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kwargs["output_attentions"] = True
        return args, kwargs

    handles.append(model.register_forward_pre_hook(force_weights, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _hook(session: _Session, layer: int) -> Any:
    def hook(module: Any, args: Any, output: Any) -> None:
        if layer not in session.layers:
            return
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if not torch.is_tensor(weights) or weights.dim() != 4:
            raise CaptureError(
                f"{type(module).__name__} returned no 4-D attention weights even with "
                "output_attentions=True; this model cannot be captured"
            )
        with torch.no_grad():
            _record(session, module, layer, weights)

    return hook


def _record(session: _Session, module: Any, layer: int, weights: torch.Tensor) -> None:
    spec = session.spec
    call = session.calls.get(layer, 0)
    session.calls[layer] = call + 1
    batch, n_heads, q_len, kv_len = weights.shape
    check_call_shape(session, module, layer, n_heads, q_len, kv_len)
    positions = _call_positions(session, layer, q_len, kv_len)
    if not positions:
        return
    offset = kv_len - q_len
    w = weights[:, session.heads][:, :, [p - offset for p in positions]].float()
    # NaN compares False with 0: without this check a NaN row would become an all-invisible
    # row, which reads as padding
    check_finite_rows(~torch.isfinite(w).all(dim=-1))
    visible = w > 0
    logits = torch.where(
        visible, torch.log(w.clamp_min(torch.finfo(torch.float32).tiny)), -math.inf
    )
    sink_index = _sink_index(session, spec, None, batch, kv_len, q_len, w.device)
    summaries = None
    rows = None
    if spec.what in ("rows", "both"):
        rows = logits.cpu().numpy()
    if spec.what in ("summaries", "both"):
        sink = _sink_mask(spec, sink_index, kv_len, w.device)
        summaries = {
            k: v.cpu().numpy()
            for k, v in _summaries_from_logits(logits.clone(), visible, sink).items()
        }
    session.add(
        _Record(
            layer=layer,
            call=call,
            query_pos=np.asarray(positions),
            kv_len=kv_len,
            summaries=summaries,
            rows=rows,
        )
    )
