"""Evaluating language models: one next-token loss, and what is measured with it.

- :func:`next_token_loss`: the causal-LM cross-entropy (logits at position ``t`` predict token
  ``t + 1``), the one implementation behind every loss in attncoda: perplexity, token scores,
  ARACH's ``labels=`` loss, the gradient head importance and the RPA trainer.
- Perplexity on fixed windows of real text (:func:`text_windows`, :func:`perplexity`): the text
  is tokenized once and cut into non-overlapping windows of equal length, each starting with the
  tokenizer's own prefix (:func:`special_prefix`, e.g. Gemma's ``<bos>``), so every run of a
  study sees exactly the same tokens (:func:`tokens_sha256`). Perplexity is token-weighted: the
  summed negative log-likelihood of every predicted token over the number of predicted tokens,
  where a window of ``T`` tokens predicts its last ``T - 1`` tokens, exactly as
  ``model(ids, labels=ids).loss`` does for one window.
- Per-token scores of a long text in sliding windows (:func:`score_tokens`), with or without a
  plug-in wrapped around the same model (a paired comparison).
- Paired bootstrap intervals (:func:`paired_bootstrap`, :func:`perplexity_interval`).
- A deterministic LAMBADA-style last-word task from raw texts (:func:`cloze_items`,
  :func:`cloze_accuracy`).

Examples
--------
>>> import torch
>>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: the loss is log 4 per token
>>> round(float(next_token_loss(logits, torch.tensor([[0, 1, 2]]))), 4)
1.3863
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from attncoda import EXIT_USAGE, AttncodaError, InputError, require_int

from .assets import paragraphs, word_error_rate

__all__ = [
    "ClozeItem",
    "ClozeResult",
    "PairedInterval",
    "Perplexity",
    "PerplexityError",
    "TokenScores",
    "cloze_accuracy",
    "cloze_items",
    "next_token_loss",
    "paired_bootstrap",
    "perplexity",
    "perplexity_interval",
    "perplexity_of_nll",
    "score_tokens",
    "special_prefix",
    "text_windows",
    "tokens_sha256",
    "window_nll",
    "word_error_rate",
]


class PerplexityError(AttncodaError, ValueError):
    """Bad input to the perplexity evaluation (shape, length, too little text)."""

    exit_code: ClassVar[int] = EXIT_USAGE


# --------------------------------------------------------------------------------------------
# the next-token loss


def next_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    reduction: Literal["mean", "sum", "none"] = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Cross-entropy of each next token: the logits at position ``t`` predict ``labels[:, t + 1]``.

    The same quantity as transformers' causal-LM loss (``model(ids, labels=ids).loss`` for
    ``reduction="mean"``). Half-precision logits are upcast to float32 (as transformers'
    ``ForCausalLMLoss`` does); float32 and float64 logits keep their precision.

    Parameters
    ----------
    logits : torch.Tensor
        ``(batch, T, vocab)``.
    labels : torch.Tensor
        ``(batch, T)`` token ids; ``ignore_index`` marks positions that are not predicted.
    reduction : {"mean", "sum", "none"}, default "mean"
        Mean or sum over the predicted tokens, or ``(batch, T - 1)`` per-token losses (0 at
        ignored positions).
    label_smoothing : float, default 0
        As in :func:`torch.nn.functional.cross_entropy` (a training loss; evaluations use 0).
    ignore_index : int, default -100

    Returns
    -------
    torch.Tensor
        A scalar, or ``(batch, T - 1)`` for ``reduction="none"``.

    Examples
    --------
    >>> import torch
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=2, length=8)["input_ids"]
    >>> with torch.no_grad():
    ...     out = model(input_ids=ids, labels=ids)
    >>> bool(torch.isclose(next_token_loss(out.logits, ids), out.loss))
    True
    >>> tuple(next_token_loss(out.logits, ids, reduction="none").shape)
    (2, 7)
    """
    shift = logits[:, :-1]
    if shift.element_size() < 4:
        shift = shift.float()
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        shift.reshape(-1, shift.shape[-1]),
        target.reshape(-1),
        reduction=reduction,
        label_smoothing=label_smoothing,
        ignore_index=ignore_index,
    )
    return loss.view(target.shape) if reduction == "none" else loss


def window_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL per window, float64 ``(windows,)``: :func:`next_token_loss` summed.

    Examples
    --------
    >>> import torch
    >>> nll = window_nll(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
    >>> [round(v, 5) for v in nll.tolist()]  # two predicted tokens at log 4 each
    [2.77259, 2.77259]
    """
    return next_token_loss(logits, ids, reduction="none").double().sum(-1)


# --------------------------------------------------------------------------------------------
# perplexity on fixed windows


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


def special_prefix(tokenizer: Any) -> list[int]:
    """The token ids a tokenizer puts before a text: what every evaluation window starts with.

    The rule: encode a probe text with and without special tokens and take what the tokenizer's
    own encoding puts *before* the plain tokens. Ids it appends *after* them (an EOS, BERT's
    ``[SEP]``) are not part of the prefix, and the ``bos_token_id`` attribute is never consulted:
    a tokenizer whose BOS is None, whose BOS equals its EOS, or whose template does not add its
    BOS gets exactly what its encoding shows. So SmolLM2 (``bos_token_id`` set, never added)
    gets ``[]``, Gemma-3 ``[<bos>]`` and MiniLM ``[[CLS]]``. When the plain tokens do not
    appear in the special encoding at all, no prefix can be told apart and the result is ``[]``.

    Examples
    --------
    >>> class Tok:  # a BERT-like template: [CLS] text [SEP]
    ...     def __call__(self, text, add_special_tokens=True):
    ...         ids = [101, 7, 102] if add_special_tokens else [7]
    ...         return type("Enc", (), {"input_ids": ids})()
    >>> special_prefix(Tok())
    [101]
    """
    with_special = list(tokenizer("a").input_ids)
    plain = list(tokenizer("a", add_special_tokens=False).input_ids)
    n = len(plain)
    if n == 0:
        return []
    for start in range(len(with_special) - n + 1):
        if with_special[start : start + n] == plain:
            return with_special[:start]
    return []


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
    prefix (:func:`special_prefix`, e.g. ``<bos>``) followed by the next ``window - len(prefix)``
    text tokens.

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
    prefix = special_prefix(tokenizer)
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


# --------------------------------------------------------------------------------------------
# scoring long texts


def _check_wrapper(wrapper: Any, model: Any) -> None:
    if wrapper is not None and getattr(wrapper, "model", None) is not model:
        raise InputError("wrapper= was built for a different model")


@dataclass(frozen=True)
class TokenScores:
    """Per-token negative log-likelihoods (nats) of a sliding-window evaluation.

    Attributes
    ----------
    nll : ndarray (n,)
        ``-log p(token | context)`` of every scored token, in text order.
    position : ndarray (n,)
        Index of each scored token in the input ids.
    context : ndarray (n,)
        Number of tokens the prediction could see (the position within its window).
    window : ndarray (n,)
        Index of the window each token was scored in.
    """

    nll: np.ndarray
    position: np.ndarray
    context: np.ndarray
    window: np.ndarray

    @property
    def perplexity(self) -> float:
        """``exp(mean nll)``."""
        return float(np.exp(self.nll.mean()))


@torch.no_grad()
def score_tokens(
    model: Any,
    input_ids: torch.Tensor | Sequence[int],
    *,
    context: int = 1024,
    stride: int | None = None,
    prefix: Sequence[int] = (),
    wrapper: Callable[..., Any] | None = None,
    batch_size: int = 1,
) -> TokenScores:
    """Sliding-window next-token NLLs of a long text, of the model or of a plug-in around it.

    Each window is ``prefix`` (e.g. Gemma's ``<bos>``, which the model expects first) followed
    by ``context - len(prefix)`` text tokens; windows start every ``stride`` text tokens
    (default: non-overlapping). A window scores the text tokens no earlier window scored; a text
    token can only be scored if something precedes it in its window, so without a prefix each
    non-overlapping window predicts its last ``context - 1`` tokens, exactly as
    ``model(ids, labels=ids)`` does, and with a prefix every text token is predicted once. With
    ``wrapper`` the same windows run through the plug-in (a paired comparison).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    input_ids : 1-D LongTensor or sequence of int
        The tokenised text without special tokens (a ``(1, n)`` tensor is accepted).
    context : int, default 1024
        Window length in tokens, prefix included.
    stride : int, optional
        Text tokens between window starts (default: ``context - len(prefix)``).
    prefix : sequence of int, default ()
        Tokens put in front of every window and never scored.
    wrapper : callable, optional
        A plug-in around ``model``, called like the model and returning its output (e.g.
        :class:`attncoda.hooks.arach.Arach`); ``wrapper.model`` must be ``model``. None scores
        the plain model.
    batch_size : int, default 1
        Windows per forward (windows of one length are batched together).

    Returns
    -------
    TokenScores
        ``context`` counts the tokens each prediction could see, prefix included.

    Examples
    --------
    >>> from attncoda.hooks import arach, zoo
    >>> model = zoo.tiny_twin("llama")
    >>> ids = zoo.tiny_batch(model, batch=1, length=40)["input_ids"][0]
    >>> off = score_tokens(model, ids, context=16)
    >>> on = score_tokens(model, ids, context=16, wrapper=arach.Arach(model))
    >>> len(off.nll) == len(on.nll) == 37  # 3 windows: 15 + 15 + 7 predicted tokens
    True
    >>> len(score_tokens(model, ids, context=16, prefix=[2]).nll)  # every token
    40
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    pre = torch.as_tensor(list(prefix), dtype=torch.long)
    n_pre = len(pre)
    if ids.dim() != 1 or ids.numel() + n_pre < 2:
        raise InputError("input_ids must be one sequence of at least 2 tokens (prefix included)")
    span = context - n_pre
    if span < (1 if n_pre else 2):
        raise InputError(f"context={context} leaves no room for text after the prefix")
    stride = span if stride is None else stride
    if not 1 <= stride <= span:
        raise InputError(f"stride must lie in 1..{span}, got {stride}")
    _check_wrapper(wrapper, model)
    device = next(model.parameters()).device
    n = ids.numel()
    spans = []  # (start, end, first scored text index)
    start = prev_end = 0
    while True:
        end = min(start + span, n)
        spans.append((start, end, max(prev_end, start + (0 if n_pre else 1))))
        if end == n:
            break
        prev_end = end
        start += stride
    nll_parts, pos_parts, ctx_parts, win_parts = [], [], [], []
    fwd = wrapper if wrapper is not None else model
    runs: list[list[int]] = []  # windows of one length run together, batch_size at a time
    for w, (s, e, _) in enumerate(spans):
        first = spans[runs[-1][0]] if runs else None
        if first is not None and len(runs[-1]) < batch_size and e - s == first[1] - first[0]:
            runs[-1].append(w)
        else:
            runs.append([w])
    for run in runs:
        batch = torch.stack([torch.cat([pre, ids[spans[w][0] : spans[w][1]]]) for w in run])
        batch = batch.to(device)
        logits = fwd(input_ids=batch).logits
        nll = next_token_loss(logits, batch, reduction="none")
        for row, w in enumerate(run):
            s, e, lo = spans[w]
            if lo >= e:
                continue
            # text token t sits at window index n_pre + t - s; its logit at one before
            sel = nll[row, n_pre + lo - s - 1 : n_pre + e - s - 1].cpu().numpy()
            positions = np.arange(lo, e)
            nll_parts.append(sel.astype(np.float64))
            pos_parts.append(positions)
            ctx_parts.append(n_pre + positions - s)
            win_parts.append(np.full(len(sel), w))
    return TokenScores(
        nll=np.concatenate(nll_parts),
        position=np.concatenate(pos_parts),
        context=np.concatenate(ctx_parts),
        window=np.concatenate(win_parts),
    )


# --------------------------------------------------------------------------------------------
# paired statistics


@dataclass(frozen=True)
class PairedInterval:
    """A paired difference ``on - off`` with a percentile bootstrap interval."""

    off: float
    on: float
    diff: float
    low: float
    high: float
    level: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def paired_bootstrap(
    off: np.ndarray,
    on: np.ndarray,
    *,
    statistic: Callable[..., Any] | None = None,
    clusters: np.ndarray | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    vectorized: bool | None = None,
) -> PairedInterval:
    """Percentile bootstrap interval of ``statistic(on) - statistic(off)`` over paired items.

    Items (or whole clusters of items, e.g. blocks of consecutive tokens) are resampled with
    replacement, the same draw for both arms.

    Parameters
    ----------
    off, on : array (n,)
        Per-item values of the two arms (accuracy 0/1, token NLL, ...), paired by index.
    statistic : callable, default mean
        Maps the values of a resample to a number (e.g. ``lambda x: np.exp(x.mean())`` for
        perplexity from NLLs).
    clusters : int array (n,), optional
        Cluster label of each item; clusters are resampled whole.
    n_boot, level, seed
        Resamples, interval level, seed of the draw (deterministic).
    vectorized : bool, optional
        As in :func:`scipy.stats.bootstrap`: ``statistic`` takes an ``axis`` keyword and
        reduces along it, so that all resamples are computed at once. Default: whether
        ``statistic`` has an ``axis`` parameter (the default mean has). The interval is the
        same either way, bit for bit: the draws and each resample's values in their order are.

    Returns
    -------
    PairedInterval

    See Also
    --------
    scipy.stats.bootstrap : the unpaired, unclustered bootstrap this follows in its arguments.

    Examples
    --------
    >>> import numpy as np
    >>> off = np.array([0, 1, 0, 1, 1, 0, 0, 1.0]); on = np.array([1, 1, 0, 1, 1, 1, 0, 1.0])
    >>> r = paired_bootstrap(off, on, n_boot=500)
    >>> round(r.diff, 3), r.low <= r.diff <= r.high
    (0.25, True)
    """
    a = np.asarray(off, dtype=np.float64)
    b = np.asarray(on, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError("off and on must be 1-D arrays of the same, non-zero length")
    if not 0 < level < 1:
        raise InputError("level must lie in (0, 1)")
    n_boot = require_int(n_boot, "n_boot", low=1)
    if vectorized not in (None, True, False):
        raise InputError(f"vectorized must be True, False or None, got {vectorized!r}")
    stat = statistic if statistic is not None else np.mean
    if vectorized is None:
        vectorized = _takes_axis(stat)
    if clusters is None:
        order, sizes = np.arange(len(a)), np.ones(len(a), dtype=np.int64)
    else:
        labels = np.asarray(clusters)
        if labels.shape != a.shape:
            raise InputError("clusters must have one label per item")
        # each cluster's items in index order, clusters in label order
        _, inverse, sizes = np.unique(labels, return_inverse=True, return_counts=True)
        order = np.argsort(inverse, kind="stable")
    k = len(sizes)
    pick = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))  # one draw per row
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if (sizes == sizes[0]).all():  # every resample has the same length: one 2-D gather
        m = int(sizes[0])
        idx = order[(starts[pick][..., None] + np.arange(m)).reshape(n_boot, k * m)]
        if vectorized:
            diffs = np.asarray(stat(b[idx], axis=-1) - stat(a[idx], axis=-1), dtype=np.float64)
        else:
            diffs = np.array([stat(b[i]) - stat(a[i]) for i in idx], dtype=np.float64)
    else:  # resamples of different lengths: gathered at once, the statistic row by row
        lengths = sizes[pick].reshape(-1)
        ends = np.cumsum(lengths)
        flat = np.arange(ends[-1]) - np.repeat(ends - lengths, lengths)
        idx = order[np.repeat(starts[pick].reshape(-1), lengths) + flat]
        bounds = np.concatenate([[0], ends[k - 1 :: k]])
        va, vb = a[idx], b[idx]
        diffs = np.array(
            [stat(vb[lo:hi]) - stat(va[lo:hi]) for lo, hi in itertools.pairwise(bounds)],
            dtype=np.float64,
        )
    alpha = (1 - level) / 2
    lo, hi = np.quantile(diffs, [alpha, 1 - alpha])
    s_off, s_on = stat(a), stat(b)
    return PairedInterval(
        off=float(s_off),
        on=float(s_on),
        diff=float(s_on - s_off),
        low=float(lo),
        high=float(hi),
        level=level,
        n=len(a),
    )


def _takes_axis(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has an ``axis`` parameter (a numpy reduction, or a function written so)."""
    import inspect

    try:
        return "axis" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def perplexity_of_nll(nll: np.ndarray, axis: int | None = None) -> Any:
    """Perplexity, ``exp(mean(nll))``, along ``axis``: a :func:`paired_bootstrap` statistic
    that computes all resamples at once.

    Examples
    --------
    >>> round(float(perplexity_of_nll(np.array([1.0, 3.0]))), 4)
    7.3891
    """
    return np.exp(np.mean(nll, axis=axis))


def perplexity_interval(
    off: TokenScores, on: TokenScores, *, block: int = 128, n_boot: int = 2000, seed: int = 0
) -> PairedInterval:
    """Perplexity off vs on with a block-bootstrap interval of the difference ``ppl_on - ppl_off``.

    Tokens are resampled in blocks of ``block`` consecutive scored tokens (neighbouring tokens'
    losses are correlated).

    Examples
    --------
    >>> import numpy as np
    >>> z = np.zeros(256, dtype=int)
    >>> a = TokenScores(np.full(256, 2.0), np.arange(256), z, z)
    >>> b = TokenScores(np.full(256, 1.9), np.arange(256), z, z)
    >>> r = perplexity_interval(a, b, n_boot=100)
    >>> round(r.off, 3), round(r.on, 3)
    (7.389, 6.686)
    """
    if not np.array_equal(off.position, on.position):
        raise InputError("the two scorings must cover the same tokens (same windows)")
    clusters = np.arange(len(off.nll)) // block
    return paired_bootstrap(
        off.nll,
        on.nll,
        statistic=perplexity_of_nll,
        clusters=clusters,
        n_boot=n_boot,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------
# cloze (LAMBADA-style last word) from the Austen novels

_STOP = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each either else
    ever every few for from further had has have having he her here hers herself him himself his
    how however i if in into is it its itself just least less let like made make many may me might
    mine more most much must my myself neither never no nor not now of off often on once one only
    or other others otherwise ought our ours ourselves out over own perhaps quite rather really
    said same say says shall she should since so some still such than that the their theirs them
    themselves then there these they this those though through thus till to too under until up
    upon us very was we well were what whatever when where whether which while who whom whose why
    will with within without would yet you your yours yourself yourselves indeed sure think
    thing things nothing something anything everything always again away back even ever going
    know known much mrs miss sir""".split()
)

_FINAL = re.compile(r"^([A-Za-z]+)[.!?]['\"\u2019\u201d)]*$")
_BARE = re.compile(r"[^a-z]")


@dataclass(frozen=True)
class ClozeItem:
    """One last-word item: predict ``target`` (one word) after ``context``."""

    context: str
    target: str
    source: str
    index: int  # word index of the target in its source text
    #: whether the target word (case-insensitive) occurs among the context's words
    in_context: bool = True


def cloze_items(
    texts: Mapping[str, str],
    n: int = 150,
    *,
    window: int = 80,
    min_letters: int = 4,
    seed: int = 0,
    require_in_context: bool = True,
) -> list[ClozeItem]:
    """A deterministic LAMBADA-style last-word task from raw texts.

    A candidate is a word that ends a sentence (it is followed by ``.``, ``!`` or ``?`` and
    optionally closing quotes), has at least ``min_letters`` letters only, is not a stop word,
    and (with ``require_in_context``, the default) occurs (case-insensitively) among the
    ``window`` words before it; its context is those ``window`` words. Every item records in
    ``in_context`` whether its target occurs in its context, so an unfiltered draw
    (``require_in_context=False``) holds the filtered task as its ``in_context`` subset. ``n`` candidates are drawn without replacement with ``seed`` from all texts
    and returned in text order. Paragraphs are unwrapped first (:func:`assets.paragraphs`).

    Parameters
    ----------
    texts : mapping of str to str
        Source name -> text (e.g. ``assets.load_corpus("austen")``).
    n : int, default 150
    window : int, default 80
    min_letters : int, default 4
    seed : int, default 0
    require_in_context : bool, default True
        Keep only targets that occur in their context (the filter of the earlier studies).
        ``False`` keeps every candidate, as LAMBADA's own items do not all repeat the target.

    Returns
    -------
    list of ClozeItem

    Examples
    --------
    >>> text = ("The garden was quiet and the garden was green. " * 3) + "She loved the garden."
    >>> items = cloze_items({"t": text}, n=1, window=12)
    >>> items[0].target, items[0].context.split()[-3:]
    ('garden', ['She', 'loved', 'the'])
    >>> unfiltered = cloze_items({"t": "We sat by the quiet river. We walked along the river."},
    ...                          n=2, window=5, require_in_context=False)
    >>> [(it.target, it.in_context) for it in unfiltered]
    [('river', False), ('river', True)]
    """
    if n < 1 or window < 1:
        raise InputError("n and window must be positive")
    candidates: list[ClozeItem] = []
    for source, text in texts.items():
        words = " ".join(paragraphs(text)).split()
        bare = [_BARE.sub("", w.lower()) for w in words]
        for k in range(window, len(words)):
            m = _FINAL.match(words[k])
            if m is None:
                continue
            target = m.group(1)
            low = target.lower()
            if len(low) < min_letters or low in _STOP:
                continue
            seen = low in bare[k - window : k]
            if require_in_context and not seen:
                continue
            candidates.append(ClozeItem(" ".join(words[k - window : k]), target, source, k, seen))
    if len(candidates) < n:
        raise InputError(f"only {len(candidates)} candidate items; ask for fewer")
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(candidates), size=n, replace=False).tolist())
    return [candidates[i] for i in chosen]


@dataclass(frozen=True)
class ClozeResult:
    """Per-item greedy exact-match results (1.0 / 0.0) and the target's log-probability."""

    correct: np.ndarray
    target_logprob: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())


@torch.no_grad()
def cloze_accuracy(
    model: Any,
    tokenizer: Any,
    items: Sequence[ClozeItem],
    *,
    wrapper: Callable[..., Any] | None = None,
    batch_size: int = 16,
) -> ClozeResult:
    """Greedy exact match of the last word: every sub-token of ``" " + target`` is the argmax.

    The context is tokenised as the tokenizer does by default (special tokens included, e.g.
    Gemma's BOS) and the target without special tokens; items are batched with right padding.

    Examples
    --------
    >>> from attncoda.hooks import arach  # doctest: +SKIP
    >>> res = cloze_accuracy(model, tok, items, wrapper=arach.Arach(model))  # doctest: +SKIP
    """
    _check_wrapper(wrapper, model)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = []
    for it in items:
        ctx = tokenizer(it.context).input_ids
        tgt = tokenizer(" " + it.target, add_special_tokens=False).input_ids
        encoded.append((ctx, tgt))
    correct = np.zeros(len(items))
    logprob = np.zeros(len(items))
    order = np.argsort([len(c) + len(t) for c, t in encoded], kind="stable")
    for b0 in range(0, len(order), batch_size):
        idx = order[b0 : b0 + batch_size]
        seqs = [encoded[i][0] + encoded[i][1] for i in idx]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        # only the logits that predict target tokens (the LM head dominates small models)
        n_tgt = max(len(encoded[i][1]) for i in idx)
        keep = torch.zeros((len(seqs), n_tgt), dtype=torch.long)
        for r, i in enumerate(idx):
            n_ctx, n_t = len(encoded[i][0]), len(encoded[i][1])
            keep[r] = torch.arange(n_ctx - 1, n_ctx - 1 + n_tgt).clamp(max=n_ctx + n_t - 2)
        ids, mask, keep = ids.to(device), mask.to(device), keep.to(device)
        fwd = wrapper if wrapper is not None else model
        logits = fwd(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits.float()
        for r, i in enumerate(idx):
            tgt = encoded[i][1]
            rows = logits[r, : len(tgt)]
            target = torch.tensor(tgt, device=rows.device)
            correct[i] = float(bool((rows.argmax(-1) == target).all()))
            lp = torch.log_softmax(rows, dim=-1).gather(-1, target[:, None]).sum()
            logprob[i] = float(lp)
    return ClozeResult(correct=correct, target_logprob=logprob)


# --------------------------------------------------------------------------------------------
# speech: the word error rate
