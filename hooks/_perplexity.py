"""Perplexity of a causal LM on fixed windows of real text, with the model's own loss.

The text is tokenized once and cut into non-overlapping windows of equal length (each window
starts with the tokenizer's own prefix, e.g. Gemma's ``<bos>``, when it adds one), so every run
of a study sees exactly the same tokens. Perplexity is token-weighted: the summed negative
log-likelihood of every predicted token over the number of predicted tokens, where a window of
``T`` tokens predicts its last ``T - 1`` tokens, exactly as ``model(ids, labels=ids).loss``
does for one window.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attncoda import EXIT_USAGE, AttncodaError

__all__ = ["Perplexity", "PerplexityError", "perplexity", "text_windows", "tokens_sha256"]


class PerplexityError(AttncodaError, ValueError):
    """Bad input to the perplexity evaluation (shape, length, too little text)."""

    exit_code: ClassVar[int] = EXIT_USAGE


@dataclass(frozen=True)
class Perplexity:
    """Result of :func:`perplexity`.

    Attributes
    ----------
    nll : torch.Tensor
        Summed negative log-likelihood (nats) of each window's predicted tokens, ``(windows,)``,
        float64.
    n_tokens : torch.Tensor
        Predicted tokens per window, ``(windows,)`` (``T - 1`` each).
    """

    nll: torch.Tensor
    n_tokens: torch.Tensor

    @property
    def loss(self) -> float:
        """Token-weighted mean negative log-likelihood (nats per token)."""
        return float(self.nll.sum() / self.n_tokens.sum())

    @property
    def value(self) -> float:
        """The perplexity, ``exp(loss)``."""
        return math.exp(self.loss)

    def subset(self, index: Sequence[int] | slice) -> Perplexity:
        """The result over some of the windows (e.g. those of one corpus)."""
        idx = torch.arange(len(self.nll))[index] if isinstance(index, slice) else list(index)
        return Perplexity(self.nll[idx], self.n_tokens[idx])


def tokens_sha256(ids: torch.Tensor) -> str:
    """sha256 of a token tensor (int64, C order): proves two runs saw the same tokens.

    Examples
    --------
    >>> import torch
    >>> tokens_sha256(torch.tensor([[1, 2, 3]]))[:12]
    'e2e2033ae7e1'
    """
    arr = ids.detach().to("cpu", torch.int64).contiguous().numpy()
    return hashlib.sha256(arr.tobytes()).hexdigest()


def _special_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before the text (``[<bos>]`` for Gemma, ``[]`` for SmolLM2)."""
    with_special = list(tokenizer("a").input_ids)
    plain = list(tokenizer("a", add_special_tokens=False).input_ids)
    n = len(with_special) - len(plain)
    if n <= 0 or with_special[n:] != plain:
        return []
    return with_special[:n]


def text_windows(
    tokenizer: Any,
    text: str,
    *,
    window: int = 512,
    n_windows: int | None = None,
    n_tokens: int | None = None,
) -> torch.Tensor:
    """Cut a text into non-overlapping token windows of one length, each a model input.

    The text is tokenized once without special tokens; each window is the tokenizer's special
    prefix (if any, e.g. ``<bos>``) followed by the next ``window - len(prefix)`` text tokens.

    Parameters
    ----------
    tokenizer
        A HuggingFace tokenizer.
    text
        The text (e.g. ``"\\n\\n".join(assets.paragraphs(...))``).
    window
        Tokens per window, prefix included.
    n_windows, n_tokens
        How many windows to return; ``n_tokens`` is rounded up to whole windows. At most one of
        the two; default: every whole window of the text.

    Returns
    -------
    torch.LongTensor
        ``(n_windows, window)``.

    Raises
    ------
    PerplexityError
        If the text is too short for the windows asked for, or ``window`` is below 2.

    Examples
    --------
    >>> from attncoda.hooks import assets  # doctest: +SKIP
    >>> model, tok = assets.load_model("gemma3-270m")  # doctest: +SKIP
    >>> ids = text_windows(tok, assets.load_text("mobydick"), window=256, n_windows=4)  # doctest: +SKIP
    >>> ids.shape, ids[:, 0].tolist()  # doctest: +SKIP
    (torch.Size([4, 256]), [2, 2, 2, 2])
    """
    if n_windows is not None and n_tokens is not None:
        raise PerplexityError("give n_windows or n_tokens, not both")
    prefix = _special_prefix(tokenizer)
    body = window - len(prefix)
    if window < 2 or body < 1:
        raise PerplexityError(f"window must hold the prefix and at least one token, got {window}")
    if n_tokens is not None:
        if n_tokens < 1:
            raise PerplexityError(f"n_tokens must be positive, got {n_tokens}")
        n_windows = -(-n_tokens // window)
    if n_windows is not None and n_windows < 1:
        raise PerplexityError(f"n_windows must be positive, got {n_windows}")
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    available = len(ids) // body
    if n_windows is None:
        n_windows = available
    if available < n_windows or n_windows < 1:
        raise PerplexityError(
            f"the text has {len(ids)} tokens: {available} windows of {window}, "
            f"{n_windows} were asked for"
        )
    rows = [prefix + ids[i * body : (i + 1) * body] for i in range(n_windows)]
    return torch.tensor(rows, dtype=torch.long)


def perplexity(
    model: Any,
    input_ids: torch.Tensor,
    *,
    batch_size: int = 1,
    progress: Callable[[int], None] | None = None,
) -> Perplexity:
    """Token-weighted perplexity of a causal LM over windows of tokens.

    Each window is one forward pass (``batch_size`` windows at a time, no padding); the loss is
    the model's own next-token cross-entropy over the window's last ``T - 1`` tokens, the same
    quantity as ``model(input_ids=w, labels=w).loss`` for one window ``w``. Runs under
    ``torch.no_grad()``; whatever is active around the call (a :func:`~attncoda.hooks.gates.gates`
    block, a capture) applies.

    Parameters
    ----------
    model
        A causal LM returning ``.logits``.
    input_ids
        ``(windows, T)`` or ``(T,)`` token ids, e.g. from :func:`text_windows`.
    batch_size
        Windows per forward pass.
    progress
        Called with the number of windows finished after each batch (e.g. ``tqdm.update``).

    Returns
    -------
    Perplexity
        Per-window summed NLL and token counts; ``.value`` is the perplexity.

    Examples
    --------
    >>> import torch
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=2, length=16)["input_ids"]
    >>> ppl = perplexity(model, ids)
    >>> with torch.no_grad():
    ...     loss = model(input_ids=ids, labels=ids).loss  # equal lengths: token-weighted = mean
    >>> abs(ppl.value - float(torch.exp(loss))) < 1e-3 * ppl.value
    True
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise PerplexityError(
            f"input_ids must be (windows, T) with T >= 2, got shape {tuple(input_ids.shape)}"
        )
    if batch_size < 1:
        raise PerplexityError(f"batch_size must be positive, got {batch_size}")
    device = getattr(model, "device", torch.device("cpu"))
    nll: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(input_ids), batch_size):
            ids = input_ids[start : start + batch_size].to(device)
            logits = model(input_ids=ids).logits
            nll.append(window_nll(logits, ids).cpu())
            del logits
            if progress is not None:
                progress(len(ids))
    n = torch.full((len(input_ids),), input_ids.shape[1] - 1, dtype=torch.long)
    return Perplexity(torch.cat(nll), n)


def window_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL per window, float64 ``(windows,)``, as the model's loss computes it.

    Half-precision logits are upcast to float32 like transformers' ``ForCausalLMLoss`` does;
    float64 logits stay float64.
    """
    shift = logits[:, :-1]
    if shift.element_size() < 4:
        shift = shift.float()
    target = ids[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        shift.reshape(-1, shift.shape[-1]), target.reshape(-1), reduction="none"
    )
    return loss.view(target.shape).double().sum(-1)
