"""The inputs PyTorch's fused attention kernels accept, and a recorder that checks SDPA calls.

On CUDA, :func:`torch.nn.functional.scaled_dot_product_attention` runs a fused kernel (cuDNN,
flash or memory-efficient) only when its inputs follow that kernel's rules, and otherwise runs
the math kernel without a word. The math kernel forms the ``batch x heads x Q x K`` attention
matrix, which is exactly what attncoda promises not to do. Every SDPA call attncoda adds
(capture's fast summaries, ARACH's fast path) is therefore built to follow the flash or
memory-efficient rules, and the plug-ins that change a model's own SDPA call (RPA's bias,
ARACH's dense mask, head gates) hand it masks those rules accept.

The rules checked here are those of PyTorch's dispatcher (``aten/src/ATen/native/transformers``,
``sdp_utils``), taken at their strictest over the CUDA architectures that have the fused
kernels:

q, k, v
    4-D ``(batch, heads, sequence, head size)``, one dtype, the same batch size and the same
    number of heads (grouped-query attention only through ``enable_gqa=True``), a contiguous
    last dimension, storage offsets aligned to 16 bytes, no empty sequence.
head size
    The same for q and k and a multiple of 8 (the memory-efficient kernel needs 8 for fp16 and
    bf16 and 4 for fp32 on sm80+; flash pads to 8 itself but its direct entry point does not).
    Flash also needs the same head size for v, and at most 256.
dtype
    Flash: fp16 or bf16. Memory-efficient: fp16, bf16 or fp32.
mask
    Flash takes none: causal attention goes through ``is_causal=True``, which flash accepts only
    for as many queries as keys. The memory-efficient kernel takes none, a boolean mask or a
    float (additive) mask of the query dtype, broadcastable to ``(B, H, Q, K)``, with a
    contiguous last dimension.

The direct entry point ``aten._scaled_dot_product_efficient_attention``, which ARACH calls for
the log-sum-exp, skips the preparation the SDPA function does: its bias must already have the
query dtype and the full shape ``(B, H, Q, K)`` (broadcast dimensions may have stride 0), and
its strides along B, H and Q must be multiples of the kernel's alignment (8 elements for fp16
and bf16, 4 for fp32; :func:`aligned_bias` uses 16). The direct flash entry point needs head
sizes that are multiples of 8.

:class:`SDPARecorder` records every call of the SDPA function (and every direct call ARACH
reports through :func:`note_direct_call`) with the problems these rules find, so tests on a
CPU-only machine can prove that the calls would be eligible on CUDA.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Head sizes of every SDPA call attncoda adds are multiples of this.
HEAD_MULTIPLE = 8
#: Row stride (in elements) of biases handed to the direct memory-efficient entry point.
BIAS_ALIGN = 16
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD = 256


def kernel_head_size(size: int) -> int:
    """The smallest multiple of :data:`HEAD_MULTIPLE` that holds ``size`` columns.

    Examples
    --------
    >>> kernel_head_size(64), kernel_head_size(66), kernel_head_size(130)
    (64, 72, 136)
    """
    return -(-int(size) // HEAD_MULTIPLE) * HEAD_MULTIPLE


def pad_head(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` with zero columns appended to ``size`` along the last dimension, contiguous.

    Zero columns leave every dot product ``q . k`` unchanged and add zero columns to
    ``softmax(q k^T) v``, so attention over padded inputs equals attention over the originals
    (with an explicit ``scale``: the default one would read the padded size).

    Examples
    --------
    >>> pad_head(torch.ones(1, 1, 2, 3), 8).shape
    torch.Size([1, 1, 2, 8])
    """
    extra = int(size) - x.shape[-1]
    if extra < 0:
        raise ValueError(f"cannot pad a head size of {x.shape[-1]} down to {size}")
    if extra == 0:
        return x.contiguous()
    return torch.nn.functional.pad(x, (0, extra)).contiguous()


def aligned_bias(bias: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``bias`` as a view of the full ``shape`` ``(B, H, Q, K)`` the direct kernel reads.

    Broadcast dimensions stay stride 0 (nothing is repeated); the rows are copied once into
    storage whose row stride is a multiple of :data:`BIAS_ALIGN` elements unless they already
    are. The result has a contiguous last dimension and a 16-byte aligned start.

    Examples
    --------
    >>> b = aligned_bias(torch.zeros(1, 1, 5, 5), (2, 3, 5, 5))
    >>> b.shape, b.stride()
    (torch.Size([2, 3, 5, 5]), (0, 0, 16, 1))
    """
    if bias.dim() != 4:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if not _bias_aligned(bias):
        k = bias.shape[-1]
        rows = -(-k // BIAS_ALIGN) * BIAS_ALIGN
        storage = torch.zeros(*bias.shape[:-1], rows, dtype=bias.dtype, device=bias.device)
        storage[..., :k] = bias
        bias = storage[..., :k]
    return bias.expand(*shape)


def _bias_aligned(bias: torch.Tensor) -> bool:
    if bias.numel() and bias.stride(-1) != 1:
        return False
    if (bias.storage_offset() * bias.element_size()) % 16:
        return False
    return all(
        s % BIAS_ALIGN == 0
        for n, s in zip(bias.shape[:-1], bias.stride()[:-1], strict=True)
        if n > 1
    )


# --------------------------------------------------------------------------------------------
# the rules


def _offset_aligned(t: torch.Tensor) -> bool:
    return t.numel() == 0 or (t.storage_offset() * t.element_size()) % 16 == 0


def fused_problems(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> dict[str, list[str]]:
    """Why the flash and the memory-efficient kernels would refuse an SDPA call on CUDA.

    The rules are those in the module docstring; the tensors may live on any device (the check
    reads shapes, dtypes and strides only), so a CPU test can check what a CUDA run would get.

    Returns
    -------
    dict
        ``{"flash": [...], "efficient": [...]}``, the reasons each kernel would refuse the call;
        the call is eligible for a fused kernel when either list is empty.

    Examples
    --------
    >>> q = torch.zeros(1, 2, 4, 66)
    >>> fused_problems(q, q, q, is_causal=True)["efficient"]
    ['head sizes (66, 66, 66) are not multiples of 8']
    >>> q = pad_head(q, 72)
    >>> fused_problems(q, q, q, is_causal=True)
    {'flash': ['dtype torch.float32 (flash: fp16 or bf16)'], 'efficient': []}
    """
    common: list[str] = []
    tensors = {"query": query, "key": key, "value": value}
    if any(t.dim() != 4 for t in tensors.values()):
        common.append("q, k and v must be 4-D (batch, heads, sequence, head size)")
        return {"flash": common, "efficient": list(common)}
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        common.append(f"q, k and v have different dtypes {sorted(map(str, dtypes))}")
    elif query.dtype not in _FUSED_DTYPES:
        common.append(f"dtype {query.dtype} (fused kernels: fp16, bf16 or fp32)")
    if len({query.shape[0], key.shape[0], value.shape[0]}) > 1:
        common.append("q, k and v have different batch sizes")
    heads = (query.shape[1], key.shape[1], value.shape[1])
    if enable_gqa:
        if key.shape[1] != value.shape[1] or query.shape[1] % key.shape[1]:
            common.append(f"heads {heads} do not form query groups")
    elif len(set(heads)) > 1:
        common.append(f"q, k and v have different numbers of heads {heads} (no enable_gqa)")
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        common.append("an empty sequence")
    for name, t in tensors.items():
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            common.append(f"{name}'s last dimension is not contiguous (stride {t.stride(-1)})")
        if not _offset_aligned(t):
            common.append(f"{name}'s storage offset is not 16-byte aligned")
    sizes = (query.shape[-1], key.shape[-1], value.shape[-1])
    if query.shape[-1] != key.shape[-1]:
        common.append(f"q and k head sizes differ {sizes[:2]}")
    flash, efficient = list(common), list(common)
    if any(s % HEAD_MULTIPLE for s in sizes):
        efficient.append(f"head sizes {sizes} are not multiples of {HEAD_MULTIPLE}")
    if len(set(sizes)) > 1 or query.shape[-1] > _FLASH_MAX_HEAD:
        flash.append(f"head sizes {sizes} (flash: all equal, at most {_FLASH_MAX_HEAD})")
    if query.dtype not in _FLASH_DTYPES:
        flash.append(f"dtype {query.dtype} (flash: fp16 or bf16)")
    if is_causal and query.shape[-2] != key.shape[-2]:
        flash.append(
            f"is_causal with {query.shape[-2]} queries over {key.shape[-2]} keys (flash: equal)"
        )
    if attn_mask is not None:
        flash.append("an explicit mask (flash takes none; use is_causal)")
        efficient.extend(_mask_problems(attn_mask, query, key))
    return {"flash": flash, "efficient": efficient}


def _mask_problems(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> list[str]:
    out = []
    if mask.dtype != torch.bool and mask.dtype != query.dtype:
        out.append(f"mask dtype {mask.dtype} is neither bool nor the query dtype {query.dtype}")
    full = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if mask.dim() > 4 or any(
        m not in (1, f) for m, f in zip(mask.shape[::-1], full[::-1], strict=False)
    ):
        out.append(f"mask shape {tuple(mask.shape)} does not broadcast to {full}")
    if mask.numel() and mask.stride(-1) != 1 and mask.shape[-1] > 1:
        out.append(f"mask's last dimension is not contiguous (stride {mask.stride(-1)})")
    return out


def direct_efficient_problems(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None
) -> list[str]:
    """Why ``aten._scaled_dot_product_efficient_attention`` would refuse a direct call.

    The SDPA function's own rules (without its padding and broadcasting of the mask) plus the
    kernel's checks on the bias: query dtype, full shape ``(B, H, Q, K)``, strides along B, H
    and Q multiples of 8 elements (broadcast dimensions may have stride 0), contiguous last
    dimension, 16-byte aligned start.

    Examples
    --------
    >>> q = torch.zeros(2, 3, 5, 8)
    >>> for problem in direct_efficient_problems(q, q, q, torch.zeros(2, 1, 5, 5)):
    ...     print(problem)
    bias shape (2, 1, 5, 5) is not (B, H, Q, K) = (2, 3, 5, 5)
    bias stride along B (25) is not a multiple of 8
    bias stride along Q (5) is not a multiple of 8
    >>> direct_efficient_problems(q, q, q, aligned_bias(torch.zeros(2, 1, 5, 5), (2, 3, 5, 5)))
    []
    """
    out = fused_problems(query, key, value)["efficient"]
    if bias is None:
        return out
    if bias.dtype != query.dtype:
        out.append(f"bias dtype {bias.dtype} is not the query dtype {query.dtype}")
    full = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if tuple(bias.shape) != full:
        out.append(f"bias shape {tuple(bias.shape)} is not (B, H, Q, K) = {full}")
    if bias.dim() == 4:
        for name, n, s in zip("BHQ", bias.shape[:3], bias.stride()[:3], strict=True):
            if n > 1 and s % HEAD_MULTIPLE:
                out.append(f"bias stride along {name} ({s}) is not a multiple of {HEAD_MULTIPLE}")
    if bias.numel() and bias.stride(-1) != 1:
        out.append("bias's last dimension is not contiguous")
    if not _offset_aligned(bias):
        out.append("bias's storage offset is not 16-byte aligned")
    return out


def direct_flash_problems(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> list[str]:
    """Why ``aten._scaled_dot_product_flash_attention`` would refuse a direct causal call.

    Examples
    --------
    >>> q = torch.zeros(1, 2, 4, 12, dtype=torch.bfloat16)
    >>> direct_flash_problems(q, q, q)
    ['head sizes (12, 12, 12) are not multiples of 8 (the direct entry point does not pad)']
    """
    out = fused_problems(query, key, value, is_causal=True)["flash"]
    sizes = (query.shape[-1], key.shape[-1], value.shape[-1])
    if any(s % HEAD_MULTIPLE for s in sizes):
        out.append(
            f"head sizes {sizes} are not multiples of 8 (the direct entry point does not pad)"
        )
    return out


# --------------------------------------------------------------------------------------------
# the recorder


@dataclass
class SDPACall:
    """One recorded attention call and what the CUDA rules say about it.

    Attributes
    ----------
    site : str
        The module that made the call (``"attncoda.hooks._capture"``,
        ``"transformers.integrations.sdpa_attention"``, ...).
    op : str
        ``"sdpa"`` (the SDPA function), ``"efficient"`` or ``"flash"`` (direct entry points).
    shapes : dict
        ``{"query", "key", "value", "mask"}`` shapes (``None`` for no mask).
    dtypes : dict
        The same for dtypes.
    is_causal : bool
    problems : dict
        ``{"flash": [...], "efficient": [...]}``; for a direct call only its own kernel's list.
    """

    site: str
    op: str
    shapes: dict[str, tuple[int, ...] | None]
    dtypes: dict[str, torch.dtype | None]
    is_causal: bool
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def eligible(self) -> bool:
        """Whether some fused kernel accepts the call."""
        return any(not p for p in self.problems.values())

    @property
    def head_size(self) -> int:
        """The query head size."""
        shape = self.shapes["query"]
        assert shape is not None
        return int(shape[-1])


_RECORDERS: list[SDPARecorder] = []


def _describe(
    site: str,
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    problems: dict[str, list[str]],
) -> SDPACall:
    items = {"query": q, "key": k, "value": v, "mask": mask}
    return SDPACall(
        site=site,
        op=op,
        shapes={n: None if t is None else tuple(t.shape) for n, t in items.items()},
        dtypes={n: None if t is None else t.dtype for n, t in items.items()},
        is_causal=bool(is_causal),
        problems=problems,
    )


def note_direct_call(
    op: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    is_causal: bool,
    site: str = "",
) -> None:
    """Tell active recorders about a direct call of a fused entry point (a no-op otherwise)."""
    if not _RECORDERS:
        return
    if op == "flash":
        problems = {"flash": direct_flash_problems(query, key, value)}
    else:
        problems = {"efficient": direct_efficient_problems(query, key, value, bias)}
    call = _describe(site, op, query, key, value, bias, is_causal, problems)
    for rec in _RECORDERS:
        rec.calls.append(call)


class SDPARecorder:
    """Record every SDPA call made inside a ``with`` block, with the CUDA kernel rules' verdict.

    Wraps :func:`torch.nn.functional.scaled_dot_product_attention` for the block (the call
    still runs) and collects the direct fused calls reported through :func:`note_direct_call`.

    Attributes
    ----------
    calls : list of SDPACall
        In call order.

    Examples
    --------
    >>> q = torch.zeros(1, 2, 4, 8)
    >>> with SDPARecorder() as rec:
    ...     _ = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    >>> [(c.op, c.eligible, c.problems["efficient"]) for c in rec.calls]
    [('sdpa', True, [])]
    """

    def __init__(self) -> None:
        self.calls: list[SDPACall] = []
        self._original: Callable[..., Any] | None = None

    def from_site(self, prefix: str) -> list[SDPACall]:
        """The calls made by modules whose name starts with ``prefix``."""
        return [c for c in self.calls if c.site.startswith(prefix)]

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0,
            is_causal: bool = False,
            scale: float | None = None,
            enable_gqa: bool = False,
            **kwargs: Any,
        ) -> torch.Tensor:
            site = str(sys._getframe(1).f_globals.get("__name__", ""))
            problems = fused_problems(
                query, key, value, attn_mask, is_causal=is_causal, enable_gqa=enable_gqa
            )
            if dropout_p:
                problems = {k: [*v, "dropout (not checked)"] for k, v in problems.items()}
            call = _describe(site, "sdpa", query, key, value, attn_mask, is_causal, problems)
            for rec in _RECORDERS:
                rec.calls.append(call)
            extra = {"enable_gqa": True} if enable_gqa else {}
            return original(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                **extra,
                **kwargs,
            )

        return recorded

    def __enter__(self) -> SDPARecorder:
        if not _RECORDERS:
            self._original = torch.nn.functional.scaled_dot_product_attention
            torch.nn.functional.scaled_dot_product_attention = self._wrap(self._original)
        _RECORDERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _RECORDERS.remove(self)
        if self._original is not None:
            torch.nn.functional.scaled_dot_product_attention = self._original
            self._original = None
