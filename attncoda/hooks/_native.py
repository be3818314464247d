"""The summaries' one pass on attncoda's compiled row kernel, for torch tensors.

The kernel itself, its compilation, its check and its switch (``ATTNCODA_NATIVE``) live in
:mod:`attncoda.native` (the core: it is maths on arrays, and
:func:`attncoda.head_comparisons` uses the same library); this module hands it torch's CPU
tensors as numpy views (no copy) and splits rows over ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attncoda import native


def native_status() -> str:
    """Whether the summaries' one pass runs attncoda's compiled kernel, and if not, why.

    The kernel is compiled on first use, once per process (about a quarter of a second, in a
    temporary folder removed at once). Without it the one pass runs torch's ops instead:
    the same summaries and outputs to fp32 rounding, 12-24% slower per layer in
    ``bench_capture`` (7 December 2026; most at long contexts). The same as
    :func:`attncoda.native.status`.

    Returns
    -------
    str
        ``"compiled"``, or the reason it is not used, in the words of
        :func:`attncoda.native.status` (which lists them).

    See Also
    --------
    capture : the summaries' one pass is where the kernel runs.
    attncoda.native.status : the same, from the core.

    Examples
    --------
    >>> from attncoda.hooks import native_status
    >>> native_status()  # doctest: +SKIP
    'compiled'
    """
    return native.status()


def softmax_entropy_rows() -> Callable[..., None] | None:
    """The compiled kernel as ``kernel(logits, stats, normalize=True, causal=False)``, or
    ``None`` where it is not available.

    ``logits``: a contiguous float32 CPU tensor whose last axis holds each row's logits (at
    least one key; finite, hidden keys at a large negative value such as -1e37); it is
    overwritten with the rows' softmax (``normalize=False``: ``exp(l - m)``, the softmax times
    ``Z``, one sweep fewer; ``causal=True``: the last two axes are consecutive causal queries
    by keys, the last query seeing every key, and each row's keys after its query become 0
    unread, as :func:`attncoda.native.softmax_entropy_rows` says). ``stats``: a float32
    ``(3, rows)`` CPU tensor, each of its three rows contiguous (a view into a larger tensor will
    do), that receives each row's maximum ``m``, ``1 / Z`` and ``sum p (l - m)``. Rows are split over
    ``torch.get_num_threads()`` threads when the block is large enough to pay for it.
    """
    if native.status() != "compiled":
        return None

    def run(
        logits: torch.Tensor, stats: torch.Tensor, normalize: bool = True, causal: bool = False
    ) -> None:
        # what a numpy view needs; attncoda.native checks dtype, contiguity and shape
        if not (
            logits.device.type == stats.device.type == "cpu"
            and not logits.requires_grad
            and not stats.requires_grad
        ):
            raise ValueError(
                "softmax_entropy_rows takes contiguous float32 CPU logits (rows, n >= 1) and "
                f"stats (3, rows); got {tuple(logits.shape)} {logits.dtype} and "
                f"{tuple(stats.shape)} {stats.dtype}"
            )
        native.softmax_entropy_rows(
            logits.numpy(), stats.numpy(), torch.get_num_threads(), normalize, causal
        )

    return run
