r"""RPA: the Regime-Position Alignment prior as a plug-in for HuggingFace decoder models.

Implements the length-aware attention prior of Atri (arXiv 2603.09253, "Efficient Reasoning at
Fixed Test-Time Cost via Length-Aware Attention Priors and Gain-Aware Training"; digest in
``reference/papers.md``, section 2) for GPT-2 style and Llama style models built from configs.

The prior, per layer :math:`\ell` and sequence length :math:`T`:

1. **Fuzzy regimes.** :math:`\mu_t(r) \propto \exp(-\lVert W h_t - c_r \rVert^2 / 2\sigma_r^2)`,
   :math:`r = 1..R`, from the layer's *input* residual :math:`h_t` (the un-normalised block
   input), with learned :math:`W` (``Linear(d, d)``), centres :math:`c_r` and scales
   :math:`\sigma_r` (:class:`GaussianFuzzy`). A membership-entropy floor is added to the loss.
2. **Length-aware basis.** :math:`\Phi(T) \in \mathbb{R}^{T \times K}`: raised-cosine blocks
   centred at ``linspace(0, T-1, K)`` with half-width ``max(1, 1.5 T / K)``, rows closed to 1
   (:func:`soft_blocks`).
3. **Alignment.** :math:`S = \bar\mu^\top \Phi` (:math:`R \times K`, :math:`\bar\mu` the batch
   mean), :math:`P = \mathrm{Sinkhorn}(\exp(S / \tau_{align}))` (:func:`sinkhorn`).
4. **Bias.** :math:`B = \bar\mu P \Phi^\top` (:math:`T \times T`), mixed with a linear distance
   penalty ``(1-m) B + m (-beta |i-j| / (T-1))``, z-scored over the whole matrix, divided by the
   attention temperature :math:`\tau_{att}` (clamped to ``[bias_tau_min, tau_max]``), clipped to
   ``[-4, 4]`` and multiplied by the warm-in scale (:func:`rpa_bias`).
5. **Added before the softmax** through attncoda's registered attention function
   (:func:`attached`): the same :math:`T \times T` bias for every head and batch item. Within
   the rows it is a perturbation: ``softmax(z + B_i) = C(softmax(z) * softmax(B_i))``.

At inference (``model.eval()``) :math:`B(T)` does not depend on the input: it is computed once per
length from the membership statistics the prior collected during training (or
:meth:`RPAPrior.calibrate`) and cached, so an RPA model has no extra inference parameters and runs
no controller. Around the prior, each in its own module and each importing this one: training
(the Guardian, the context game, the schedules and :func:`~attncoda.hooks.rpa_train.train`) in
:mod:`attncoda.hooks.rpa_train`; checkpoints and the layout of a training run's folder in
:mod:`attncoda.hooks.rpa_checkpoints`; the audit of the prior with attncoda's core in
:mod:`attncoda.hooks.rpa_audit`.

Choices where the paper is silent or inconsistent (each is an option)
---------------------------------------------------------------------
- **Backbone.** The paper's model is a fuzzy mixture-of-experts Transformer with per-block
  residual gates and an attention-output gate. This plug-in adds *only* the prior to an
  unchanged HF model (GPT-2 or Llama): the prior's parameters live in a separate
  :class:`RPAPrior` module, and the model's modules are never modified (hooks are removed on
  exit). The paper's "type-2" uncertainty branch (unused in its results) is not implemented.
- **Inference cache.** The paper says :math:`B(T)` is "cached per length" without saying from
  what. For a causal model :math:`\mu_t` depends only on tokens up to ``t``, so the expected
  batch mean :math:`\bar\mu_t` is a function of the position alone: the prior keeps an EMA of
  :math:`\bar\mu_t` per (layer, position) (``stat_momentum``, bias-corrected) and builds
  :math:`B(T)` for any :math:`T` up to the longest length seen from it. During training the
  bias is the paper's on-the-fly batch bias (``mode="batch"``); in eval mode it is the cached one
  (``mode="cached"``). The training bias is a batch statistic that includes later positions of the
  batch (through :math:`P` and the z-score); the cached bias does not use the input at all.
- **Temperature floors.** The listing clamps :math:`\tau_{att}` to ``[0.6, 1.6]`` in the bias
  path but the Guardian keeps it in ``[0.3, 1.6]`` (and the paper's Figure 1 plots it in
  0.25-0.40, where the bias-path clamp makes it inert). Defaults follow the listing
  (``bias_tau_min=0.6``, ``tau_min=0.3``); set ``bias_tau_min=0.3`` for one floor.
- **What tau_att scales.** As in the listing, :math:`\tau_{att}` rescales only the prior, not
  :math:`QK^\top` (a plug-in must not change the model's own logits).
- **Alignment mass.** :math:`S` sums over the sequence (``alignment_mass="sum"``, the paper):
  its entries grow like :math:`T/(RK)`, so at long lengths ``exp(S/tau_align)`` saturates the
  ``[1e-9, 1e9]`` clamp. ``"mean"`` divides by :math:`T` instead.
- **Sinkhorn for R != K.** Rows are normalised to 1 and columns to ``R/K`` (the consistent
  marginals; the paper's "rows then columns to 1" only exists for ``K = R``, its configuration).
- **Entropy floor.** The loss term is ``(alpha * 0.5) * (1 + lambda_sat) *
  relu(eta * log R - H_mu)`` per layer, summed over layers. The paper's "0.02" is taken as
  ``alpha`` (``entropy_floor_weight``); ``eta`` (``entropy_floor_frac``) is not given and
  defaults to 0.5. CE is mean-reduced here (the listing sums), so 0.02 is relative to a per-token
  CE.
- **lambda_delta and gate_delta.** With no gates, ``lambda_delta`` (Guardian-controlled, starts
  at 0) weights a *drift* penalty ``R * mean((mu_bar_batch - mu_bar_running)^2)`` that keeps the
  training bias close to the cached inference bias; the Guardian's ``gate_delta`` signal is the
  mean change of the cached bias between its steps. ``sat_frac`` is the fraction of tokens whose
  largest membership exceeds ``saturation_threshold`` (0.9).

Properties of a length-aware prior worth knowing
------------------------------------------------
- :math:`B(T)` depends on :math:`T` (through :math:`\Phi(T)`, the distance penalty and the
  z-score), so row ``i`` of a forward over ``T`` tokens differs from row ``i`` of a forward over
  ``T' != T`` tokens. Generation with a KV cache gives each new token the last row of
  ``B(current length)``; the cached keys of layers >= 1 were computed under shorter lengths, so
  incremental decoding equals a full forward only for one-layer models. This is the paper's
  design ("cached per length"), not an approximation of the plug-in.
- The bias is indexed by key/query slot, not by ``position_ids``: under left padding the
  padded slots are masked but shift the real tokens' slots (the paper trains without padding).

Examples
--------
>>> import torch
>>> from attncoda.hooks import rpa, zoo
>>> model = zoo.tiny_twin("llama")
>>> prior = rpa.RPAPrior.for_model(model, seed=0)
>>> ids = zoo.tiny_batch(model, length=16)["input_ids"]
>>> with rpa.attached(model, prior, mode="batch"):
...     out = model(input_ids=ids)
>>> prior.bias_for(0, prior.last_memberships[0]).shape
torch.Size([16, 16])
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from attncoda import AttncodaError

from ._kernels import aligned_bias
from ._registry import (
    AttentionPlugin,
    attention_modules,
    call_is_causal,
    plugged,
    text_config,
    visible_mask,
)

__all__ = [
    "GaussianFuzzy",
    "RPAConfig",
    "RPAError",
    "RPAPlugin",
    "RPAPrior",
    "alignment",
    "attached",
    "current_plugin",
    "is_attached",
    "rpa_bias",
    "sinkhorn",
    "soft_blocks",
]

Mode = Literal["auto", "batch", "cached"]


class RPAError(AttncodaError, ValueError):
    """The RPA prior cannot be built, attached or evaluated as asked."""


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class RPAConfig:
    """Hyperparameters of the RPA prior (defaults: the paper's WikiText-2 configuration).

    Parameters
    ----------
    regimes : int
        Number of fuzzy regimes ``R`` (paper: 4; guidance 3-8).
    basis : int or None
        Number of positional blocks ``K``; None means ``K = R`` (the paper).
    tau_align : float
        Alignment temperature (0.70; guidance 0.6-0.8).
    sinkhorn_iters : int
        Sinkhorn-Knopp rounds (6 in the WT2 config, 8 the class default).
    alignment_mass : {"sum", "mean"}
        ``S`` sums memberships over the sequence (paper) or averages them.
    posmix : float
        Weight ``m`` of the linear distance penalty (0.10).
    pos_beta : float
        Initial slope of the distance penalty (learned, clamped at >= 0; 0.2).
    tau_init, tau_min, tau_max : float
        Attention temperature: initial value (0.68) and the Guardian's bounds ``[0.3, 1.6]``.
    bias_tau_min : float
        Floor of the temperature in the bias path (0.6 in the listing).
    bias_clip : float
        Clip of the standardised bias (4.0).
    detach_alignment : bool
        Detach ``S`` (and so ``P``) from the graph (``rpa_detach=True``).
    entropy_floor_weight, entropy_floor_frac : float
        ``alpha`` (0.02) and ``eta`` (0.5) of the membership-entropy floor.
    drift_weight : float
        Multiplier of the Guardian's ``lambda_delta`` in the drift penalty (1.0).
    stat_momentum : float
        EMA momentum of the per-position membership statistics behind the inference cache.
    saturation_threshold : float
        A token is saturated when its largest membership exceeds this (0.9).
    cache_size : int
        How many ``(layer, query length, key length, dtype)`` masks the inference cache keeps.
    """

    regimes: int = 4
    basis: int | None = None
    tau_align: float = 0.70
    sinkhorn_iters: int = 6
    alignment_mass: Literal["sum", "mean"] = "sum"
    posmix: float = 0.10
    pos_beta: float = 0.2
    tau_init: float = 0.68
    tau_min: float = 0.3
    tau_max: float = 1.6
    bias_tau_min: float = 0.6
    bias_clip: float = 4.0
    detach_alignment: bool = True
    entropy_floor_weight: float = 0.02
    entropy_floor_frac: float = 0.5
    drift_weight: float = 1.0
    stat_momentum: float = 0.05
    saturation_threshold: float = 0.9
    cache_size: int = 64

    def __post_init__(self) -> None:
        if self.regimes < 1:
            raise RPAError(f"regimes must be >= 1, got {self.regimes}")
        if self.basis is not None and self.basis < 1:
            raise RPAError(f"basis must be >= 1 or None, got {self.basis}")
        if self.sinkhorn_iters < 1:
            raise RPAError(f"sinkhorn_iters must be >= 1, got {self.sinkhorn_iters}")
        if self.alignment_mass not in ("sum", "mean"):
            raise RPAError(f"alignment_mass must be 'sum' or 'mean', got {self.alignment_mass!r}")
        if not 0.0 <= self.posmix <= 1.0:
            raise RPAError(f"posmix must be in [0, 1], got {self.posmix}")
        if not 0.0 < self.tau_min <= self.tau_init <= self.tau_max:
            raise RPAError(
                f"need 0 < tau_min <= tau_init <= tau_max, got {self.tau_min}, {self.tau_init}, "
                f"{self.tau_max}"
            )
        if not 0.0 < self.bias_tau_min <= self.tau_max:
            raise RPAError(f"need 0 < bias_tau_min <= tau_max, got {self.bias_tau_min}")
        if self.bias_clip <= 0:
            raise RPAError(f"bias_clip must be positive, got {self.bias_clip}")
        if not 0.0 < self.stat_momentum <= 1.0:
            raise RPAError(f"stat_momentum must be in (0, 1], got {self.stat_momentum}")

    @property
    def n_basis(self) -> int:
        """``K`` (``basis``, or ``regimes`` when None)."""
        return self.basis if self.basis is not None else self.regimes


# --------------------------------------------------------------------------------------------
# the mathematics (pure functions)


def soft_blocks(
    length: int,
    n_basis: int,
    *,
    eps: float = 1e-6,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    r"""The raised-cosine length-aware basis :math:`\Phi(T)`, shape ``(T, K)``.

    Centres ``c = linspace(0, T-1, K)``, half-width ``w = max(1, 1.5 T / K)``;
    :math:`\Phi_{tk} = \tfrac12 (1 + \cos(\pi \min(|t - c_k| / w, 1)))` (0 beyond ``w``), rows
    divided by their sum ``+ eps`` (so they sum to ``1 - O(eps)``).

    Parameters
    ----------
    length : int
        ``T`` (>= 1).
    n_basis : int
        ``K`` (>= 1).
    eps : float
        Added to the row sums (1e-6 in the paper).
    device, dtype
        Of the result.

    Returns
    -------
    torch.Tensor

    Examples
    --------
    >>> phi = soft_blocks(8, 3)
    >>> phi.shape, bool(torch.allclose(phi.sum(-1), torch.ones(8), atol=1e-5))
    (torch.Size([8, 3]), True)
    """
    if length < 1 or n_basis < 1:
        raise RPAError(f"need length >= 1 and n_basis >= 1, got {length}, {n_basis}")
    t = torch.arange(length, device=device, dtype=torch.float64)
    centres = torch.linspace(0.0, float(length - 1), n_basis, device=device, dtype=torch.float64)
    width = max(1.0, 1.5 * length / n_basis)
    dist = (t[:, None] - centres[None, :]).abs() / width
    phi = 0.5 * (1.0 + torch.cos(math.pi * dist.clamp(max=1.0)))
    phi = torch.where(dist > 1.0, torch.zeros_like(phi), phi)
    phi = phi / (phi.sum(-1, keepdim=True) + eps)
    return phi.to(dtype)


def sinkhorn(kernel: torch.Tensor, iters: int, *, eps: float = 1e-9) -> torch.Tensor:
    """Sinkhorn-Knopp scaling of a positive ``(..., R, K)`` kernel.

    Each round normalises rows to sum 1, then columns to sum ``R / K`` (``+ eps`` in the
    denominators). For ``R = K`` (the paper's configuration) the limit is doubly stochastic;
    after any number of rounds the columns are exact and the rows approximate.

    Parameters
    ----------
    kernel : torch.Tensor
        Positive entries, shape ``(..., R, K)``.
    iters : int
        Rounds (>= 1).
    eps : float
        Added to the row and column sums.

    Returns
    -------
    torch.Tensor
        The scaled plan, same shape.

    Examples
    --------
    >>> p = sinkhorn(torch.rand(4, 4) + 0.1, iters=50)
    >>> bool(torch.allclose(p.sum(0), torch.ones(4), atol=1e-5))
    True
    >>> bool(torch.allclose(p.sum(1), torch.ones(4), atol=1e-4))
    True
    """
    if iters < 1:
        raise RPAError(f"iters must be >= 1, got {iters}")
    if kernel.dim() < 2:
        raise RPAError(f"kernel must have at least 2 dims (R, K), got shape {tuple(kernel.shape)}")
    r, k = kernel.shape[-2], kernel.shape[-1]
    col_mass = r / k
    p = kernel
    for _ in range(iters):
        p = p / (p.sum(-1, keepdim=True) + eps)
        p = p * col_mass / (p.sum(-2, keepdim=True) + eps)
    return p


def alignment(
    mu_bar: torch.Tensor,
    phi: torch.Tensor,
    *,
    tau_align: float = 0.70,
    iters: int = 6,
    mass: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    r"""The regime-to-block plan :math:`P = \mathrm{Sinkhorn}(\exp(S / \tau_{align}))`.

    Parameters
    ----------
    mu_bar : torch.Tensor
        Batch-mean memberships, ``(T, R)``.
    phi : torch.Tensor
        :math:`\Phi(T)`, ``(T, K)``.
    tau_align : float
        Alignment temperature (floored at 1e-6).
    iters : int
        Sinkhorn rounds.
    mass : {"sum", "mean"}
        :math:`S = \bar\mu^\top \Phi` (paper) or that divided by ``T``.

    Returns
    -------
    torch.Tensor
        ``(R, K)``.

    Examples
    --------
    >>> mu = torch.softmax(torch.randn(16, 4), -1)
    >>> alignment(mu, soft_blocks(16, 4)).shape
    torch.Size([4, 4])
    """
    s = mu_bar.transpose(-1, -2) @ phi
    if mass == "mean":
        s = s / mu_bar.shape[-2]
    logk = (s / max(float(tau_align), 1e-6)).clamp(math.log(1e-9), math.log(1e9))
    return sinkhorn(torch.exp(logk), iters)


def rpa_bias(
    mu_bar: torch.Tensor,
    *,
    config: RPAConfig | None = None,
    pos_beta: torch.Tensor | float = 0.2,
    tau: torch.Tensor | float = 0.68,
    scale: torch.Tensor | float = 1.0,
    return_stages: bool = False,
) -> Any:
    r"""The RPA bias :math:`B(T)` of one layer from batch-mean memberships.

    Steps (``reference/papers.md`` section 2.3): alignment plan :math:`P`;
    :math:`B = \bar\mu P \Phi^\top`; ``B = (1-m) B + m (-beta |i-j| / (T-1))``; global z-score
    (``+1e-6``) and ``nan_to_num``; divide by ``tau`` clamped to ``[bias_tau_min, tau_max]``; clip
    to ``[-bias_clip, bias_clip]``; multiply by ``scale``.

    Parameters
    ----------
    mu_bar : torch.Tensor
        ``(T, R)`` memberships averaged over the batch (:math:`B` is linear in :math:`\mu`, so
        the mean of the per-item biases equals the bias of the mean).
    config : RPAConfig, optional
        Constants; default :class:`RPAConfig()`.
    pos_beta, tau, scale
        Distance slope (clamped at >= 0), attention temperature, warm-in scale in ``[0, 1]``.
    return_stages : bool
        Also return ``{"plan", "raw", "mixed", "standardised"}``.

    Returns
    -------
    torch.Tensor or (torch.Tensor, dict)
        ``(T, T)``, rows = queries, columns = keys.

    Examples
    --------
    >>> mu = torch.softmax(torch.randn(12, 4), -1)
    >>> b = rpa_bias(mu)
    >>> b.shape, float(b.abs().max()) <= 4.0
    (torch.Size([12, 12]), True)
    """
    cfg = config if config is not None else RPAConfig()
    if mu_bar.dim() != 2 or mu_bar.shape[-1] != cfg.regimes:
        raise RPAError(
            f"mu_bar must have shape (T, {cfg.regimes}) for R={cfg.regimes}, got "
            f"{tuple(mu_bar.shape)}"
        )
    length = mu_bar.shape[0]
    mu = mu_bar.float()
    phi = soft_blocks(length, cfg.n_basis, device=mu.device)
    mu_align = mu.detach() if cfg.detach_alignment else mu
    plan = alignment(
        mu_align,
        phi,
        tau_align=cfg.tau_align,
        iters=cfg.sinkhorn_iters,
        mass=cfg.alignment_mass,
    )
    raw = mu @ plan @ phi.T
    mixed = raw
    if cfg.posmix > 0:
        pos = torch.arange(length, device=mu.device, dtype=torch.float32)
        dist = (pos[:, None] - pos[None, :]).abs() / max(length - 1, 1)
        beta = torch.as_tensor(pos_beta, dtype=torch.float32, device=mu.device).clamp(min=0.0)
        mixed = (1.0 - cfg.posmix) * raw + cfg.posmix * (-beta * dist)
    if mixed.numel() > 1:
        std = mixed.std()
        z = (mixed - mixed.mean()) / (std + 1e-6)
    else:  # a single entry has no spread: the standardised bias is 0
        z = mixed - mixed
    z = torch.nan_to_num(z)
    tau_t = torch.as_tensor(tau, dtype=torch.float32, device=mu.device)
    bias = z / tau_t.clamp(cfg.bias_tau_min, cfg.tau_max)
    bias = bias.clamp(-cfg.bias_clip, cfg.bias_clip)
    bias = bias * torch.as_tensor(scale, dtype=torch.float32, device=mu.device)
    if return_stages:
        return bias, {"plan": plan, "raw": raw, "mixed": mixed, "standardised": z}
    return bias


# --------------------------------------------------------------------------------------------
# the prior's parameters


class GaussianFuzzy(nn.Module):
    r"""Gaussian fuzzy memberships :math:`\mu_t(r) \propto \exp(-\lVert W h_t - c_r\rVert^2 / 2\sigma_r^2)`.

    ``W = Linear(d, d)``; centres start as ``randn(R, d) / sqrt(d)``, ``log sigma`` at 0; the
    inverse variance ``exp(-2 log sigma)`` is clamped to ``[1e-3, 1e3]``, the logits to
    ``[-30, 30]``; NaN memberships become ``1/R``.

    Examples
    --------
    >>> fz = GaussianFuzzy(8, 3)
    >>> mu = fz(torch.randn(2, 5, 8))
    >>> mu.shape, bool(torch.allclose(mu.sum(-1), torch.ones(2, 5)))
    (torch.Size([2, 5, 3]), True)
    """

    def __init__(self, d_model: int, regimes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.centers = nn.Parameter(torch.randn(regimes, d_model) / math.sqrt(d_model))
        self.log_sigma = nn.Parameter(torch.zeros(regimes))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.proj(hidden)
        dist2 = (
            (z * z).sum(-1, keepdim=True) - 2.0 * z @ self.centers.T + (self.centers**2).sum(-1)
        ).clamp(min=0.0)
        invvar = torch.exp(-2.0 * self.log_sigma).clamp(1e-3, 1e3)
        logits = (-0.5 * dist2 * invvar).clamp(-30.0, 30.0)
        mu = torch.softmax(logits, dim=-1)
        return torch.nan_to_num(mu, nan=1.0 / mu.shape[-1])


class RPAPrior(nn.Module):
    """The RPA prior of one model: per-layer memberships, distance slopes, and their state.

    Parameters are the memberships (:class:`GaussianFuzzy` per layer) and ``pos_beta`` per layer.
    Buffers (saved in ``state_dict``): ``tau`` per layer (moved by the Guardian), ``bias_scale``
    (warm-in), ``lambda_sat`` and ``lambda_delta`` (penalty weights moved by the Guardian), and
    the per-position membership statistics ``mu_stat`` / ``mu_stat_weight`` behind the inference
    cache.

    Parameters
    ----------
    hidden_size, n_layers, max_positions : int
        Of the model the prior is for (see :meth:`for_model`).
    config : RPAConfig, optional

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> prior = RPAPrior.for_model(zoo.tiny_twin("gpt2"), RPAConfig(regimes=3))
    >>> prior.n_layers, prior.config.n_basis
    (2, 3)
    """

    tau: torch.Tensor
    bias_scale: torch.Tensor
    lambda_sat: torch.Tensor
    lambda_delta: torch.Tensor
    mu_stat: torch.Tensor
    mu_stat_weight: torch.Tensor

    def __init__(
        self,
        hidden_size: int,
        n_layers: int,
        max_positions: int,
        config: RPAConfig | None = None,
    ) -> None:
        super().__init__()
        cfg = config if config is not None else RPAConfig()
        if hidden_size < 1 or n_layers < 1 or max_positions < 1:
            raise RPAError(
                f"need positive sizes, got hidden_size={hidden_size}, n_layers={n_layers}, "
                f"max_positions={max_positions}"
            )
        self.config = cfg
        self.hidden_size = int(hidden_size)
        self.n_layers = int(n_layers)
        self.max_positions = int(max_positions)
        self.fuzzy = nn.ModuleList(GaussianFuzzy(hidden_size, cfg.regimes) for _ in range(n_layers))
        self.pos_beta = nn.Parameter(torch.full((n_layers,), float(cfg.pos_beta)))
        self.register_buffer("tau", torch.full((n_layers,), float(cfg.tau_init)))
        self.register_buffer("bias_scale", torch.tensor(1.0))
        self.register_buffer("lambda_sat", torch.tensor(0.0))
        self.register_buffer("lambda_delta", torch.tensor(0.0))
        self.register_buffer("mu_stat", torch.zeros(n_layers, max_positions, cfg.regimes))
        self.register_buffer("mu_stat_weight", torch.zeros(n_layers, max_positions))
        #: transient multiplier of the bias in batch mode (the chaos warm-in); not saved
        self.train_scale_factor = 1.0
        self.last_memberships: dict[int, torch.Tensor] = {}  # layer -> (B, T, R), last forward
        self.last_stats: dict[str, float] = {}
        self._penalties: list[torch.Tensor] = []
        self._cache: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()

    # -- construction --------------------------------------------------------------------

    @classmethod
    def for_model(
        cls,
        model: Any,
        config: RPAConfig | None = None,
        *,
        seed: int | None = 0,
        max_positions: int | None = None,
    ) -> RPAPrior:
        """A prior sized for ``model``, on its device.

        Parameters
        ----------
        model : transformers.PreTrainedModel
            A decoder (GPT-2 or Llama style).
        config : RPAConfig, optional
        seed : int or None
            Seed of the prior's initialisation (the global torch random state is untouched);
            None uses the global state.
        max_positions : int, optional
            Longest length the prior supports; default the model's ``max_position_embeddings``
            (or 4096 when the config has none).

        Returns
        -------
        RPAPrior
        """
        text = text_config(model)
        hidden = getattr(text, "hidden_size", None)
        n_layers = getattr(text, "num_hidden_layers", None)
        if hidden is None or n_layers is None:
            raise RPAError(f"cannot read hidden_size/num_hidden_layers from {type(text).__name__}")
        if max_positions is None:
            max_positions = int(getattr(text, "max_position_embeddings", None) or 4096)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        if seed is None:
            prior = cls(int(hidden), int(n_layers), max_positions, config)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                prior = cls(int(hidden), int(n_layers), max_positions, config)
        return prior.to(device)

    # -- training-time quantities ----------------------------------------------------------

    def memberships(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Memberships ``(B, T, R)`` of ``layer`` from its input residual ``(B, T, d)``."""
        self._check_layer(layer)
        if hidden.shape[-1] != self.hidden_size:
            raise RPAError(
                f"hidden size {hidden.shape[-1]} does not match the prior's {self.hidden_size}"
            )
        fz: GaussianFuzzy = self.fuzzy[layer]  # type: ignore[assignment]
        return fz(hidden.to(fz.proj.weight.dtype))

    def bias_for(
        self, layer: int, mu: torch.Tensor, *, scale: float | torch.Tensor | None = None
    ) -> torch.Tensor:
        """The batch bias ``(T, T)`` of ``layer`` for memberships ``(B, T, R)`` or ``(T, R)``."""
        self._check_layer(layer)
        mu_bar = mu.mean(0) if mu.dim() == 3 else mu
        return rpa_bias(
            mu_bar,
            config=self.config,
            pos_beta=self.pos_beta[layer],
            tau=self.tau[layer],
            scale=self.bias_scale if scale is None else scale,
        )

    def regularizer(self) -> torch.Tensor:
        """The membership-entropy floor (+ drift penalty) of the last training forward.

        Sum over layers of ``(alpha/2) (1 + lambda_sat) relu(eta log R - H_mu)`` plus
        ``drift_weight * lambda_delta * R * mean((mu_bar - mu_stat)^2)``. Zero (a tensor) when
        the last forward computed no memberships.
        """
        if not self._penalties:
            return torch.zeros((), device=self.pos_beta.device)
        return torch.stack(self._penalties).sum()

    def _penalty(self, layer: int, mu: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        r = cfg.regimes
        h = -(mu * torch.log(mu.clamp_min(1e-12))).sum(-1).mean()
        floor = torch.relu(cfg.entropy_floor_frac * math.log(r) - h) if r > 1 else h * 0.0
        loss = (cfg.entropy_floor_weight * 0.5) * (1.0 + self.lambda_sat) * floor
        if float(self.lambda_delta) > 0 and cfg.drift_weight > 0:
            length = mu.shape[1]
            ref = self._stat_estimate(layer, length, allow_missing=True)
            if ref is not None:
                drift = ((mu.mean(0) - ref) ** 2).mean() * r
                loss = loss + cfg.drift_weight * self.lambda_delta * drift
        return loss

    @torch.no_grad()
    def _update_stats(self, layer: int, mu: torch.Tensor, *, exact: bool = False) -> None:
        length = mu.shape[1]
        if length > self.max_positions:
            raise RPAError(
                f"sequence length {length} exceeds the prior's max_positions={self.max_positions}"
            )
        mu_bar = mu.detach().mean(0).to(self.mu_stat.dtype)
        if exact:  # calibration: cumulative mean weighted by batch size
            n = float(mu.shape[0])
            self.mu_stat[layer, :length] += n * mu_bar
            self.mu_stat_weight[layer, :length] += n
            return
        a = self.config.stat_momentum
        self.mu_stat[layer, :length].mul_(1 - a).add_(a * mu_bar)
        self.mu_stat_weight[layer, :length].mul_(1 - a).add_(a)

    def _stat_estimate(
        self, layer: int, length: int, *, allow_missing: bool = False
    ) -> torch.Tensor | None:
        if length > self.max_positions:
            raise RPAError(
                f"length {length} exceeds the prior's max_positions={self.max_positions}"
            )
        w = self.mu_stat_weight[layer, :length]
        if bool((w <= 0).any()):
            if allow_missing:
                return None
            seen = int((self.mu_stat_weight[layer] > 0).sum())
            raise RPAError(
                f"the prior has no membership statistics for layer {layer} at positions up to "
                f"{length} (it has them for {seen} positions): train it at this length or call "
                "prior.calibrate(model, batches) before using the cached (eval-mode) bias"
            )
        return self.mu_stat[layer, :length] / w[:, None]

    def has_statistics(self, length: int) -> bool:
        """Whether every layer has membership statistics for positions ``< length``."""
        if length > self.max_positions:
            return False
        return bool((self.mu_stat_weight[:, :length] > 0).all())

    # -- inference cache --------------------------------------------------------------------

    def _state_key(self) -> tuple[int, ...]:
        return tuple(
            int(t._version)
            for t in (self.pos_beta, self.tau, self.bias_scale, self.mu_stat, self.mu_stat_weight)
        )

    def inference_bias(self, layer: int, length: int) -> torch.Tensor:
        """The cached inference bias ``B(T)`` ``(T, T)`` (float32) of ``layer``.

        Computed from the per-position membership statistics, once per length and prior state:
        it changes only when the statistics, ``tau``, ``pos_beta`` or ``bias_scale`` change.

        Examples
        --------
        >>> from attncoda.hooks import zoo
        >>> model = zoo.tiny_twin("llama")
        >>> prior = RPAPrior.for_model(model)
        >>> prior.calibrate(model, [zoo.tiny_batch(model, length=16)["input_ids"]])
        >>> b = prior.inference_bias(0, 16)
        >>> b is prior.inference_bias(0, 16), b.shape
        (True, torch.Size([16, 16]))
        """
        self._check_layer(layer)
        key = ("bias", layer, int(length), self._state_key())
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        with torch.no_grad():
            mu_bar = self._stat_estimate(layer, int(length))
            assert mu_bar is not None
            bias = rpa_bias(
                mu_bar,
                config=self.config,
                pos_beta=self.pos_beta[layer],
                tau=self.tau[layer],
                scale=self.bias_scale,
            )
        self._remember(key, bias)
        return bias

    def _remember(self, key: tuple[Any, ...], value: torch.Tensor) -> None:
        self._cache[key] = value
        while len(self._cache) > max(1, self.config.cache_size):
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        """Drop every cached bias and mask (they are also invalidated automatically)."""
        self._cache.clear()

    # -- Guardian interface --------------------------------------------------------------------

    @torch.no_grad()
    def set_controls(
        self,
        *,
        tau: float | None = None,
        lambda_sat: float | None = None,
        lambda_delta: float | None = None,
        bias_scale: float | None = None,
    ) -> None:
        """Set the controlled quantities (``tau`` in every layer), clamped to their bounds.

        ``tau`` to ``[tau_min, tau_max]``, ``lambda_sat`` to ``[0, 0.6]``, ``lambda_delta`` to
        ``[0, 1]``, ``bias_scale`` to ``[0, 1]``.
        """
        cfg = self.config
        if tau is not None:
            self.tau.fill_(min(max(float(tau), cfg.tau_min), cfg.tau_max))
        if lambda_sat is not None:
            self.lambda_sat.fill_(min(max(float(lambda_sat), 0.0), 0.6))
        if lambda_delta is not None:
            self.lambda_delta.fill_(min(max(float(lambda_delta), 0.0), 1.0))
        if bias_scale is not None:
            self.bias_scale.fill_(min(max(float(bias_scale), 0.0), 1.0))

    # -- calibration ------------------------------------------------------------------------------

    @torch.no_grad()
    def calibrate(self, model: Any, batches: Iterable[torch.Tensor], *, reset: bool = True) -> None:
        """Recompute the membership statistics from ``batches`` of input ids (exact means).

        Runs the model in eval mode with the on-the-fly batch bias (as in training, without
        dropout), layer by layer, so the statistics of layer ``l`` see the prior of layers
        ``< l``. The model's train/eval mode is restored afterwards.

        Parameters
        ----------
        model : transformers.PreTrainedModel
        batches : iterable of torch.Tensor
            ``(batch, T)`` input ids.
        reset : bool
            Start from empty statistics (default) or add to the current ones (which are then
            treated as a weight-1 mean).
        """
        if reset:
            self.mu_stat.zero_()
            self.mu_stat_weight.zero_()
        was_training = model.training
        model.eval()
        try:
            with attached(model, self, mode="batch", calibrating=True):
                n = 0
                for ids in batches:
                    model(input_ids=ids.to(self.pos_beta.device))
                    n += 1
            if n == 0:
                raise RPAError("calibrate() got no batches")
        finally:
            model.train(was_training)
        # turn the sums into means with weight 1
        w = self.mu_stat_weight.clamp_min(1e-12)
        seen = self.mu_stat_weight > 0
        self.mu_stat.copy_(torch.where(seen[..., None], self.mu_stat / w[..., None], 0.0))
        self.mu_stat_weight.copy_(seen.to(self.mu_stat_weight.dtype))

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise RPAError(f"layer {layer} out of range: the prior has {self.n_layers} layers")

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        out = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.clear_cache()
        return out


# --------------------------------------------------------------------------------------------
# the plug-in


def _block_of(model: Any, attn: Sequence[Any]) -> list[Any]:
    """The decoder block (the ModuleList element) that holds each attention module."""
    names = {id(m): n for n, m in model.named_modules()}
    mods = dict(model.named_modules())
    blocks = []
    for m in attn:
        parts = names[id(m)].split(".")
        digits = [i for i, p in enumerate(parts) if p.isdigit()]
        if not digits:
            raise RPAError(
                f"cannot find the decoder block of {names[id(m)]!r}: attention modules must sit "
                "inside a ModuleList of blocks (GPT-2 style or Llama style models)"
            )
        blocks.append(mods[".".join(parts[: digits[-1] + 1])])
    return blocks


class RPAPlugin(AttentionPlugin):
    """Adds an :class:`RPAPrior`'s bias before the softmax (use :func:`attached`).

    In ``"batch"`` mode the bias of each forward is computed from that batch's memberships (the
    training path; the membership statistics are updated when the model is in training mode);
    in ``"cached"`` mode it is the prior's cached inference bias. ``"auto"`` follows
    ``model.training``.
    """

    def __init__(
        self,
        model: Any,
        prior: RPAPrior,
        *,
        mode: Mode = "auto",
        track: bool = False,
        calibrating: bool = False,
    ) -> None:
        super().__init__(model)
        if mode not in ("auto", "batch", "cached"):
            raise RPAError(f"mode must be 'auto', 'batch' or 'cached', got {mode!r}")
        self.model = model
        self.prior = prior
        self.mode: Mode = mode
        self.track = track
        self.calibrating = calibrating
        self.hidden: dict[int, torch.Tensor] = {}
        self._state_key: tuple[int, ...] = ()
        self._stats: dict[str, list[float]] = {}

    def current_mode(self) -> Literal["batch", "cached"]:
        if self.mode == "auto":
            return "batch" if self.model.training else "cached"
        return self.mode

    # called by the hooks of attached()
    def begin_forward(self) -> None:
        self.hidden.clear()
        self.prior._penalties = []
        self.prior.last_memberships = {}
        self._stats = {"entropy": [], "saturation": [], "clip": []}
        self._state_key = self.prior._state_key()

    def end_forward(self) -> None:
        st = self._stats
        self.prior.last_stats = {
            k: float(np.mean(v))
            for k, v in (
                ("mu_entropy", st.get("entropy", [])),
                ("sat_frac", st.get("saturation", [])),
                ("clip_frac", st.get("clip", [])),
            )
            if v
        }

    def adjust_mask(
        self,
        module: Any,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        kwargs: dict[str, Any],
    ) -> torch.Tensor | None:
        q_len, kv_len = query.shape[-2], key.shape[-2]
        mode = self.current_mode()
        hidden = self.hidden.get(layer)
        mu = None
        if hidden is not None and (mode == "batch" or self.track):
            mu = self.prior.memberships(layer, hidden)
            self._record(layer, mu)
        if mode == "batch":
            if mu is None:
                raise RPAError(
                    f"no input hidden states were recorded for layer {layer}; use attached() to "
                    "attach the prior (it hooks the decoder blocks)"
                )
            if mu.shape[1] != kv_len:
                raise RPAError(
                    "the batch (training) bias needs full sequences (query length == key "
                    f"length, no KV cache), got {q_len} queries over {kv_len} keys; use "
                    "model.eval() (the cached bias) for generation"
                )
            scale = self.prior.bias_scale * self.prior.train_scale_factor
            bias = self.prior.bias_for(layer, mu, scale=scale)
            self._stats["clip"].append(
                float(
                    (bias.detach().abs() >= self.prior.config.bias_clip * scale - 1e-6)
                    .float()
                    .mean()
                )
            )
            rows = bias[kv_len - q_len :].to(query.dtype)
            return _add_bias(rows, mask, query, module, kwargs, kv_len)
        # cached
        return self._cached_mask(layer, q_len, kv_len, mask, query, module, kwargs)

    def _record(self, layer: int, mu: torch.Tensor) -> None:
        prior = self.prior
        prior.last_memberships[layer] = mu
        cfg = prior.config
        with torch.no_grad():
            md = mu.detach()
            h = -(md * torch.log(md.clamp_min(1e-12))).sum(-1).mean()
            r = cfg.regimes
            self._stats["entropy"].append(float(h) / math.log(r) if r > 1 else 0.0)
            self._stats["saturation"].append(
                float((md.amax(-1) > cfg.saturation_threshold).float().mean())
            )
        if self.calibrating:
            prior._update_stats(layer, mu, exact=True)
            return
        if self.model.training and self.current_mode() == "batch":
            if torch.is_grad_enabled():
                prior._penalties.append(prior._penalty(layer, mu))
            prior._update_stats(layer, mu)

    def _cached_mask(
        self,
        layer: int,
        q_len: int,
        kv_len: int,
        mask: torch.Tensor | None,
        query: torch.Tensor,
        module: Any,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        prior = self.prior
        sliding = kwargs.get("sliding_window")
        if mask is None:
            key = (
                "mask",
                layer,
                q_len,
                kv_len,
                query.dtype,
                query.device,
                sliding,
                self._state_key,
            )
            hit = prior._cache.get(key)
            if hit is not None:
                prior._cache.move_to_end(key)
                return hit
        bias = prior.inference_bias(layer, kv_len)
        rows = bias[kv_len - q_len :].to(device=query.device, dtype=query.dtype)
        out = _add_bias(rows, mask, query, module, kwargs, kv_len)
        if mask is None:
            # kept with aligned rows: SDPA would otherwise copy it into aligned storage for the
            # memory-efficient kernel at every layer call
            out = aligned_bias(out, out.shape)
            prior._remember(key, out)
        return out


def _add_bias(
    rows: torch.Tensor,
    mask: torch.Tensor | None,
    query: torch.Tensor,
    module: Any,
    kwargs: dict[str, Any],
    kv_len: int,
) -> torch.Tensor:
    """The float additive mask: the layer's visibility (0 / finfo.min) with ``rows`` added.

    It is what the model's own SDPA call receives, in the form CUDA's memory-efficient kernel
    takes (flash takes no mask): the query dtype, shape ``(1 | batch, 1, Q, K)`` (broadcast
    over heads), a contiguous last dimension. Invisible entries hold ``finfo.min``, not
    ``-inf``, so no row is all ``-inf`` (NaN) and the sum with a bias stays finite.
    """
    neg = torch.finfo(query.dtype).min
    if mask is None:
        q_len = query.shape[-2]
        q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)
        vis, _ = visible_mask(
            None,
            q_pos,
            kv_len,
            causal=call_is_causal(module, kwargs),
            sliding_window=kwargs.get("sliding_window"),
            device=query.device,
        )
        return torch.where(vis, rows, torch.full_like(rows, neg))
    if mask.shape[-1] != kv_len:
        raise RPAError(
            f"the attention mask covers {mask.shape[-1]} keys but the layer has {kv_len}; static "
            "KV caches are not supported by the RPA plug-in"
        )
    if mask.dtype == torch.bool:
        return torch.where(mask, rows, torch.full_like(rows, neg))
    return mask + rows.to(mask.dtype)


_ATTACHED: dict[int, RPAPlugin] = {}  # id(model) -> the plug-in attached to it


def is_attached(model: Any) -> bool:
    """Whether an RPA prior is attached to ``model`` (inside :func:`attached`).

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> prior = RPAPrior.for_model(model)
    >>> with attached(model, prior):
    ...     is_attached(model), type(current_plugin(model)).__name__
    (True, 'RPAPlugin')
    >>> is_attached(model), current_plugin(model)
    (False, None)
    """
    return id(model) in _ATTACHED


def current_plugin(model: Any) -> RPAPlugin | None:
    """The :class:`RPAPlugin` attached to ``model``, or None (example: :func:`is_attached`)."""
    return _ATTACHED.get(id(model))


@contextmanager
def attached(
    model: Any,
    prior: RPAPrior,
    *,
    mode: Mode = "auto",
    track: bool = False,
    calibrating: bool = False,
) -> Iterator[RPAPlugin]:
    """Apply ``prior`` to ``model`` inside the block; the model is left as it was on exit.

    The model is switched to attncoda's registered attention function (the previous
    implementation computes every output) and forward pre-hooks on its decoder blocks record
    each layer's input residual; both are undone on exit, also after an exception.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal decoder (GPT-2 style or Llama style).
    prior : RPAPrior
        Sized for ``model`` (:meth:`RPAPrior.for_model`).
    mode : {"auto", "batch", "cached"}
        ``"batch"``: the paper's training bias from each batch's memberships. ``"cached"``: the
        input-independent inference bias ``B(T)``. ``"auto"`` (default): batch while
        ``model.training``, cached in eval mode.
    track : bool
        In cached mode, still compute memberships to report ``prior.last_stats`` (the Guardian's
        signals) without using them for the bias.
    calibrating : bool
        Internal (:meth:`RPAPrior.calibrate`).

    Yields
    ------
    RPAPlugin

    Raises
    ------
    RPAError
        For a bidirectional model, or a prior sized for another model.

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("gpt2")
    >>> prior = RPAPrior.for_model(model)
    >>> batch = zoo.tiny_batch(model, length=10)
    >>> model.train()  # doctest: +ELLIPSIS
    GPT2LMHeadModel(...)
    >>> with attached(model, prior):
    ...     loss = model(**batch, labels=batch["input_ids"]).loss + prior.regularizer()
    >>> model.config._attn_implementation
    'sdpa'
    """
    if id(model) in _ATTACHED:
        raise RPAError("an RPA prior is already attached to this model; attach one at a time")
    attn = attention_modules(model)
    if len(attn) != prior.n_layers:
        raise RPAError(
            f"the prior has {prior.n_layers} layers but the model has {len(attn)} attention "
            "modules; build it with RPAPrior.for_model(model)"
        )
    if not all(bool(getattr(m, "is_causal", True)) for m in attn):
        raise RPAError(
            "the RPA prior is for causal decoders; this model has bidirectional attention"
        )
    if text_config(model).hidden_size != prior.hidden_size:
        raise RPAError("the prior's hidden size does not match the model's")
    blocks = _block_of(model, attn)
    plugin = RPAPlugin(model, prior, mode=mode, track=track, calibrating=calibrating)
    handles = []

    def start(_module: Any, _args: Any, _kwargs: Any) -> None:
        plugin.begin_forward()

    def finish(_module: Any, _args: Any, _kwargs: Any, _out: Any) -> None:
        plugin.end_forward()

    def recorder(layer: int) -> Callable[..., None]:
        def pre_hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args and torch.is_tensor(args[0]) else kwargs.get("hidden_states")
            if hidden is not None:
                plugin.hidden[layer] = hidden

        return pre_hook

    _ATTACHED[id(model)] = plugin
    try:
        handles.append(model.register_forward_pre_hook(start, with_kwargs=True))
        handles.append(model.register_forward_hook(finish, with_kwargs=True))
        for i, (m, block) in enumerate(zip(attn, blocks, strict=True)):
            layer = getattr(m, "layer_idx", None)
            layer = i if layer is None else int(layer)
            handles.append(block.register_forward_pre_hook(recorder(layer), with_kwargs=True))
        with plugged(model, plugin):
            yield plugin
    finally:
        for h in handles:
            h.remove()
        plugin.hidden.clear()
        _ATTACHED.pop(id(model), None)
