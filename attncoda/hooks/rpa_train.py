r"""Training RPA models: the Guardian, the context game, the schedules and :func:`train`.

The prior itself is :mod:`attncoda.hooks.rpa`; this module imports it (never the reverse), and
writes a run folder (:class:`~attncoda.hooks.rpa_checkpoints.RunFolder`) that
:func:`attncoda.hooks.rpa_audit.audit_rpa` reads. Every loss here is
:func:`attncoda.hooks.evaluate.next_token_loss` (with label smoothing on the training loss).

Components (each can be switched off for ablations by passing ``None`` / ``False`` in
:class:`TrainConfig`):

:class:`Guardian`
    A small REINFORCE controller (Atri, arXiv 2603.09253): a Gaussian policy
    ``Linear(4,64)-tanh-Linear(64,64)-tanh-Linear(64,3)`` with a learned ``log_std`` (Adam, lr
    1e-3) reads ``(gate_delta, sat_frac, mu_entropy, val_loss)`` and moves the attention
    temperature and two penalty weights: ``tau <- tau + 0.03 beta dtau`` (an overshoot above
    ``tau_max`` is pulled back by 0.10 x overshoot, then ``tau`` is clamped to
    ``[tau_min, tau_max]``), ``lambda_delta <- clip(lambda_delta + 0.01 beta d, 0, 1)``,
    ``lambda_sat <- clip(lambda_sat + 0.01 beta d, 0, 0.6)``. Training only: at inference the
    controller does not run.
:class:`ContextGame`
    Replicator / logit dynamics over candidate context lengths:
    ``q(c) ∝ q(c) exp(eta u(c))``, ``u(c) = -L(c) - lambda_s [sat(c) - s0]_+ + lambda_h H(c)/H_max``,
    implemented as a softmax with temperature over running log-weights.
:func:`lr_factor`
    Warmup, a flat prelude, then cosine decay to a non-zero floor (``schedule="floor"``), or the
    baseline's warmup + cosine to zero (``"cosine"``).
:class:`Chaos`
    The decaying logistic-map modulation of the LR and bias scale early in training.
:class:`WeightEMA`, :class:`SelectiveAveraging`
    EMA of the weights, and SWA-select: snapshots collected late in training only inside a
    helpful CE zone and with a minimum relative gain over the zone entry.

Choices where the paper gives no value (all options)
----------------------------------------------------
- **Reward.** ``R = -CE + lambda1 (CE_prev - CE)_+ + lambda2 sigmoid((CE_best - CE) / s)`` with
  ``lambda1 = 1``, ``lambda2 = 0.1``, ``s = 0.05`` (the paper: "gain-shaped, emphasizing
  improvements at already-low CE"; constants not given).
- **Baseline.** The listing's REINFORCE has no baseline; with a reward that is always about
  ``-CE < 0`` that only pushes every sampled action's probability down. The default subtracts an
  EMA of the reward (``reward_baseline="ema"``); ``"none"`` is the listing.
- **Cadence and ramp.** The Guardian steps every ``control_every`` training steps on a fixed
  *control* set (a held-out slice used for control only, never for the reported validation
  CE); ``beta = min(1, k / ramp_steps)`` at its ``k``-th step.
- **Context game.** Updated every ``game_every`` steps instead of once per epoch (runs here are
  shorter than an epoch); ``eta = 1``, ``lambda_s = 1``, ``s0 = 0.5``, ``lambda_h = 0.1``,
  temperature 1, and a minimum share of 5% per length so every length keeps being measured.
- **Schedules.** Flat prelude to 20% of the steps, floor 10% of the peak LR (paper: 5-10%),
  warmup 5%. Chaos time is rescaled to the paper's 8030 steps (its amplitude would not decay in
  a run of a few hundred steps otherwise). EMA decay ``1 - 1 / (0.05 * steps)`` (not given).
  SWA-select starts at 55% of training (the paper's epoch 60 of 110), accepts a snapshot when
  its control CE is within 2% of the best seen and at least 0.2% below the zone entry, and the
  final average is kept only if its control CE beats the un-averaged weights.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

import attncoda as ac
from attncoda import InputError

from .evaluate import next_token_loss
from .rpa import RPAPrior, attached, current_plugin, is_attached
from .rpa_checkpoints import RunFolder, save_checkpoint

__all__ = [
    "Chaos",
    "ContextGame",
    "ContextGameConfig",
    "Guardian",
    "GuardianConfig",
    "GuardianSignals",
    "SWASelectConfig",
    "SelectiveAveraging",
    "TokenData",
    "TrainConfig",
    "TrainResult",
    "WeightEMA",
    "checkpoint_steps",
    "evaluate",
    "lr_factor",
    "train",
]


# --------------------------------------------------------------------------------------------
# Guardian


@dataclass(frozen=True)
class GuardianConfig:
    """Constants of the Guardian (listing values where the paper gives them).

    Parameters
    ----------
    tau_step, lambda_step : float
        Step sizes of the temperature (0.03) and penalty weights (0.01).
    tau_min, tau_max : float
        Temperature bounds ``[0.3, 1.6]``.
    overshoot_pullback : float
        Fraction of an overshoot above ``tau_max`` pulled back before the clamp (0.10).
    lambda_delta_max, lambda_sat_max : float
        Upper bounds of the penalty weights (1.0, 0.6).
    hidden : int
        Policy width (64).
    lr : float
        Adam learning rate of the policy (1e-3).
    ramp_steps : int
        ``beta = min(1, k / ramp_steps)`` at the Guardian's ``k``-th step.
    reward_gain, reward_low, reward_scale : float
        ``lambda1``, ``lambda2`` and ``s`` of the reward.
    reward_baseline : {"ema", "none"}
        Subtract an EMA of the reward (default) or nothing (the listing).
    baseline_momentum : float
        EMA momentum of the reward baseline.
    """

    tau_step: float = 0.03
    lambda_step: float = 0.01
    tau_min: float = 0.3
    tau_max: float = 1.6
    overshoot_pullback: float = 0.10
    lambda_delta_max: float = 1.0
    lambda_sat_max: float = 0.6
    hidden: int = 64
    lr: float = 1e-3
    ramp_steps: int = 10
    reward_gain: float = 1.0
    reward_low: float = 0.1
    reward_scale: float = 0.05
    reward_baseline: Literal["ema", "none"] = "ema"
    baseline_momentum: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.tau_min <= self.tau_max:
            raise InputError(f"need 0 < tau_min <= tau_max, got {self.tau_min}, {self.tau_max}")
        if self.reward_baseline not in ("ema", "none"):
            raise InputError(
                f"reward_baseline must be 'ema' or 'none', got {self.reward_baseline!r}"
            )
        if self.ramp_steps < 1:
            raise InputError("ramp_steps must be >= 1")


@dataclass(frozen=True)
class GuardianSignals:
    """What the Guardian reads: its 4-d state."""

    gate_delta: float
    sat_frac: float
    mu_entropy: float
    val_loss: float

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(
            [self.gate_delta, self.sat_frac, self.mu_entropy, self.val_loss], dtype=torch.float32
        )


class Guardian(nn.Module):
    """Gain-aware REINFORCE controller of the attention temperature and two penalty weights.

    Parameters
    ----------
    config : GuardianConfig, optional
    tau, lambda_sat, lambda_delta : float
        Starting values (the prior's ``tau_init``, 0, 0).
    seed : int
        Seeds the policy initialisation and the action noise (the global random state is
        untouched).

    Examples
    --------
    >>> g = Guardian(seed=0)
    >>> for ce in (6.0, 5.8, 5.9, 5.5):
    ...     controls = g.step(GuardianSignals(0.0, 0.1, 0.8, ce))
    >>> 0.3 <= controls["tau"] <= 1.6 and 0.0 <= controls["lambda_sat"] <= 0.6
    True
    """

    def __init__(
        self,
        config: GuardianConfig | None = None,
        *,
        tau: float = 0.68,
        lambda_sat: float = 0.0,
        lambda_delta: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.config = cfg = config if config is not None else GuardianConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.policy = nn.Sequential(
                nn.Linear(4, cfg.hidden),
                nn.Tanh(),
                nn.Linear(cfg.hidden, cfg.hidden),
                nn.Tanh(),
                nn.Linear(cfg.hidden, 3),
            )
        self.log_std = nn.Parameter(torch.zeros(3))
        self.optimizer = torch.optim.Adam(self.parameters(), lr=cfg.lr)
        self._gen = torch.Generator().manual_seed(seed)
        self.tau = min(max(float(tau), cfg.tau_min), cfg.tau_max)
        self.lambda_sat = min(max(float(lambda_sat), 0.0), cfg.lambda_sat_max)
        self.lambda_delta = min(max(float(lambda_delta), 0.0), cfg.lambda_delta_max)
        self.n_steps = 0
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self._prev_loss: float | None = None
        self._best_loss: float | None = None
        self._baseline: float | None = None
        self.history: list[dict[str, float]] = []

    def reward(self, val_loss: float) -> float:
        """``-CE + lambda1 (CE_prev - CE)_+ + lambda2 sigmoid((CE_best - CE) / s)``."""
        cfg = self.config
        r = -float(val_loss)
        if self._prev_loss is not None:
            r += cfg.reward_gain * max(0.0, self._prev_loss - val_loss)
        if self._best_loss is not None:
            x = (self._best_loss - val_loss) / cfg.reward_scale
            r += cfg.reward_low / (1.0 + math.exp(-max(min(x, 50.0), -50.0)))
        return r

    def _learn(self, reward: float) -> float:
        assert self._pending is not None
        obs, action = self._pending
        cfg = self.config
        if cfg.reward_baseline == "ema":
            base = reward if self._baseline is None else self._baseline
            advantage = reward - base
            m = cfg.baseline_momentum
            self._baseline = (
                reward if self._baseline is None else m * self._baseline + (1 - m) * reward
            )
        else:
            advantage = reward
        with torch.enable_grad():
            dist = torch.distributions.Normal(self.policy(obs), self.log_std.exp())
            loss = -dist.log_prob(action).sum() * advantage
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return advantage

    def step(self, signals: GuardianSignals) -> dict[str, float]:
        """Learn from the reward of the previous action, then take a new one within bounds.

        Returns the new controls ``{"tau", "lambda_sat", "lambda_delta"}``.
        """
        cfg = self.config
        loss = float(signals.val_loss)
        if not math.isfinite(loss):
            raise InputError(f"the Guardian got a non-finite validation loss {loss}")
        reward = self.reward(loss)
        advantage = self._learn(reward) if self._pending is not None else 0.0
        self._prev_loss = loss
        self._best_loss = loss if self._best_loss is None else min(self._best_loss, loss)
        obs = signals.as_tensor()
        with torch.no_grad():
            mean = self.policy(obs)
            noise = torch.randn(3, generator=self._gen)
            action = mean + self.log_std.exp() * noise
        self._pending = (obs, action)
        self.n_steps += 1
        beta = min(1.0, self.n_steps / cfg.ramp_steps)
        d_tau, d_delta, d_sat = (float(a) for a in action)
        tau = self.tau + cfg.tau_step * beta * d_tau
        if tau > cfg.tau_max:
            tau -= cfg.overshoot_pullback * (tau - cfg.tau_max)
        self.tau = min(max(tau, cfg.tau_min), cfg.tau_max)
        self.lambda_delta = min(
            max(self.lambda_delta + cfg.lambda_step * beta * d_delta, 0.0), cfg.lambda_delta_max
        )
        self.lambda_sat = min(
            max(self.lambda_sat + cfg.lambda_step * beta * d_sat, 0.0), cfg.lambda_sat_max
        )
        controls = {
            "tau": self.tau,
            "lambda_sat": self.lambda_sat,
            "lambda_delta": self.lambda_delta,
        }
        self.history.append(
            {**controls, "reward": reward, "advantage": advantage, "val_loss": loss}
        )
        return controls

    def apply_to(self, prior: RPAPrior) -> None:
        """Write the controls into ``prior`` (every layer's ``tau``)."""
        prior.set_controls(tau=self.tau, lambda_sat=self.lambda_sat, lambda_delta=self.lambda_delta)


# --------------------------------------------------------------------------------------------
# context game


@dataclass(frozen=True)
class ContextGameConfig:
    """The context-length game.

    Parameters
    ----------
    lengths : tuple of int
        Candidate context lengths.
    eta : float
        Step size of the log-weights.
    temperature : float
        Softmax temperature over the log-weights.
    lambda_s, s0, lambda_h : float
        Saturation penalty weight and threshold, entropy bonus weight.
    min_share : float
        Every length keeps at least this probability.
    every : int
        Training steps between updates.
    momentum : float
        EMA momentum of the per-length running CE / saturation / entropy.
    """

    lengths: tuple[int, ...] = (64, 128)
    eta: float = 1.0
    temperature: float = 1.0
    lambda_s: float = 1.0
    s0: float = 0.5
    lambda_h: float = 0.1
    min_share: float = 0.05
    every: int = 50
    momentum: float = 0.1

    def __post_init__(self) -> None:
        if not self.lengths or any(int(c) < 2 for c in self.lengths):
            raise InputError(f"lengths must be >= 2, got {self.lengths}")
        if not 0 <= self.min_share * len(self.lengths) < 1:
            raise InputError("min_share * number of lengths must be below 1")


class ContextGame:
    """Replicator dynamics over context lengths (see the module docstring).

    Examples
    --------
    >>> game = ContextGame(ContextGameConfig(lengths=(32, 64)), seed=0)
    >>> game.observe(32, ce=6.0); game.observe(64, ce=5.0)
    >>> q = game.update()
    >>> q[64] > q[32]
    True
    """

    def __init__(self, config: ContextGameConfig | None = None, *, seed: int = 0) -> None:
        self.config = cfg = config if config is not None else ContextGameConfig()
        self.lengths = tuple(int(c) for c in cfg.lengths)
        self.log_weights = np.zeros(len(self.lengths))
        self.probs = np.full(len(self.lengths), 1.0 / len(self.lengths))
        self._gen = np.random.default_rng(seed)
        self._stats: dict[int, dict[str, float]] = {}

    def sample(self) -> int:
        """A context length drawn from the current mixture."""
        return int(self.lengths[int(self._gen.choice(len(self.lengths), p=self.probs))])

    def observe(self, length: int, ce: float, sat: float = 0.0, entropy: float = 0.0) -> None:
        """Record a training CE (and saturation, normalised membership entropy) at ``length``."""
        m = self.config.momentum
        st = self._stats.get(int(length))
        new = {"ce": float(ce), "sat": float(sat), "entropy": float(entropy)}
        if st is None:
            self._stats[int(length)] = new
        else:
            for k, v in new.items():
                st[k] = (1 - m) * st[k] + m * v

    def utility(self, length: int) -> float | None:
        """``-L - lambda_s [sat - s0]_+ + lambda_h H / H_max``, or None before any observation."""
        st = self._stats.get(int(length))
        if st is None:
            return None
        cfg = self.config
        return (
            -st["ce"] - cfg.lambda_s * max(0.0, st["sat"] - cfg.s0) + cfg.lambda_h * st["entropy"]
        )

    def update(self) -> dict[int, float]:
        """One replicator step; returns ``{length: probability}``."""
        cfg = self.config
        for i, c in enumerate(self.lengths):
            u = self.utility(c)
            if u is not None:
                self.log_weights[i] += cfg.eta * u
        z = self.log_weights / cfg.temperature
        q = np.exp(z - z.max())
        q /= q.sum()
        k = len(self.lengths)
        self.probs = (1 - k * cfg.min_share) * q + cfg.min_share
        return self.mixture()

    def mixture(self) -> dict[int, float]:
        return {c: float(p) for c, p in zip(self.lengths, self.probs, strict=True)}


# --------------------------------------------------------------------------------------------
# schedules and averaging


def lr_factor(
    step: int,
    total: int,
    *,
    schedule: Literal["cosine", "floor", "constant"] = "cosine",
    warmup_frac: float = 0.05,
    flat_frac: float = 0.2,
    floor: float = 0.1,
) -> float:
    """Multiplier of the peak learning rate at ``step`` of ``total``.

    ``"cosine"``: linear warmup, then cosine to 0. ``"floor"``: linear warmup, flat until
    ``flat_frac`` of the steps, then cosine to ``floor`` (the paper's flat prelude and non-zero
    floor). ``"constant"``: warmup then 1.

    Examples
    --------
    >>> round(lr_factor(100, 100, schedule="floor", floor=0.1), 6)
    0.1
    >>> lr_factor(10, 100, schedule="floor")
    1.0
    """
    if total < 1:
        raise InputError("total must be >= 1")
    warm = max(1, round(warmup_frac * total))
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        start, end = warm, 0.0
    elif schedule == "floor":
        start, end = max(warm, round(flat_frac * total)), float(floor)
        if step < start:
            return 1.0
    else:
        raise InputError(f"unknown schedule {schedule!r}")
    progress = min(1.0, (step - start) / max(1, total - start))
    return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Chaos:
    """Logistic-map modulation ``(1 - a) + a x`` with ``x <- 3.9 x (1 - x)``, ``a = 0.25 e^{-5e-4 t}``.

    ``time_scale`` multiplies ``t`` (use ``8030 / total_steps`` to decay as in the paper's run).

    Examples
    --------
    >>> c = Chaos()
    >>> 0.75 <= c.factor(0) <= 1.0
    True
    """

    def __init__(
        self,
        *,
        x0: float = 0.721,
        r: float = 3.9,
        amplitude: float = 0.25,
        decay: float = 5e-4,
        time_scale: float = 1.0,
    ) -> None:
        self.x = x0
        self.r = r
        self.amplitude = amplitude
        self.decay = decay
        self.time_scale = time_scale

    def factor(self, step: int) -> float:
        """Advance the map one step and return the modulation factor at ``step``."""
        self.x = self.r * self.x * (1.0 - self.x)
        a = self.amplitude * math.exp(-self.decay * step * self.time_scale)
        return (1.0 - a) + a * self.x


def _float_params(modules: list[nn.Module]) -> list[tuple[str, torch.Tensor]]:
    out: list[tuple[str, torch.Tensor]] = []
    for i, m in enumerate(modules):
        for name, p in m.named_parameters():
            out.append((f"{i}.{name}", p))
    return out


class WeightEMA:
    """Exponential moving average of the parameters of ``modules``.

    Examples
    --------
    >>> lin = nn.Linear(2, 2)
    >>> ema = WeightEMA([lin], decay=0.5)
    >>> with torch.no_grad():
    ...     _ = lin.weight.add_(1.0)
    >>> ema.update()
    >>> with ema.applied():
    ...     pass
    """

    def __init__(self, modules: list[nn.Module], decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise InputError(f"decay must be in [0, 1), got {decay}")
        self.modules = modules
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in _float_params(modules)}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in _float_params(self.modules):
            self.shadow[n].lerp_(p.detach(), 1.0 - self.decay)

    def state(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.shadow.items()}

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Temporarily load the averaged parameters."""
        with swapped(self.modules, self.shadow):
            yield


@contextmanager
def swapped(modules: list[nn.Module], values: dict[str, torch.Tensor]) -> Iterator[None]:
    """Temporarily load ``values`` (from :func:`_float_params` names) into ``modules``."""
    params = dict(_float_params(modules))
    saved = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for n, v in values.items():
                params[n].copy_(v)
        yield
    finally:
        with torch.no_grad():
            for n, v in saved.items():
                params[n].copy_(v)


@dataclass(frozen=True)
class SWASelectConfig:
    """SWA-select: late, selective weight averaging.

    Parameters
    ----------
    start_frac : float
        Collect from this fraction of training on (0.55).
    band : float
        Helpful zone: control CE within ``band`` (relative) of the best seen.
    min_gain : float
        Minimum relative gain over the control CE at zone entry.
    """

    start_frac: float = 0.55
    band: float = 0.02
    min_gain: float = 0.002


class SelectiveAveraging:
    """Collects weight snapshots that pass the SWA-select rules; averages them.

    Examples
    --------
    >>> swa = SelectiveAveraging(SWASelectConfig(start_frac=0.5))
    >>> w = {"a": torch.zeros(2)}
    >>> swa.offer(6, 10, w, 5.0), swa.offer(8, 10, {"a": torch.ones(2)}, 4.9)
    (False, True)
    >>> swa.average()["a"].tolist()
    [1.0, 1.0]
    """

    def __init__(self, config: SWASelectConfig | None = None) -> None:
        self.config = config if config is not None else SWASelectConfig()
        self.entry_ce: float | None = None
        self.best_ce: float | None = None
        self.count = 0
        self.accepted: list[int] = []
        self._sum: dict[str, torch.Tensor] | None = None

    def offer(
        self, step: int, total: int, weights: dict[str, torch.Tensor], control_ce: float
    ) -> bool:
        """Offer a snapshot with its control CE; returns whether it was collected."""
        cfg = self.config
        if step < cfg.start_frac * total:
            return False
        ce = float(control_ce)
        if self.entry_ce is None:
            self.entry_ce = ce
        self.best_ce = ce if self.best_ce is None else min(self.best_ce, ce)
        if ce > self.best_ce * (1 + cfg.band) or ce > self.entry_ce * (1 - cfg.min_gain):
            return False
        if self._sum is None:
            self._sum = {k: v.detach().double().clone() for k, v in weights.items()}
        else:
            for k, v in weights.items():
                self._sum[k] += v.detach().double()
        self.count += 1
        self.accepted.append(int(step))
        return True

    def average(self) -> dict[str, torch.Tensor] | None:
        """The mean of the collected snapshots (None if none was collected)."""
        if self._sum is None:
            return None
        return {k: (v / self.count).float() for k, v in self._sum.items()}


# --------------------------------------------------------------------------------------------
# data, evaluation, training


class TokenData:
    """Token ids for training: a 1-D training stream, fixed control and validation chunks.

    Parameters
    ----------
    train : torch.Tensor
        1-D LongTensor; batches are random contiguous chunks of it.
    control : torch.Tensor
        ``(n, T)`` chunks the Guardian, the context game and SWA-select read (never reported).
    validation : torch.Tensor
        ``(n, T)`` sequential non-overlapping chunks, for the reported validation CE.
    """

    def __init__(
        self, train: torch.Tensor, control: torch.Tensor, validation: torch.Tensor
    ) -> None:
        if train.dim() != 1 or control.dim() != 2 or validation.dim() != 2:
            raise InputError("train must be 1-D, control and validation 2-D (chunks, length)")
        self.train = train.long()
        self.control = control.long()
        self.validation = validation.long()

    def sample(self, length: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        """``(batch, length)`` random contiguous chunks of the training stream."""
        n = self.train.numel() - length
        if n <= 0:
            raise InputError(f"the training stream ({self.train.numel()}) is shorter than {length}")
        starts = torch.randint(0, n, (batch,), generator=generator)
        return torch.stack([self.train[s : s + length] for s in starts.tolist()])


@torch.no_grad()
def evaluate(
    model: Any,
    prior: RPAPrior | None,
    chunks: torch.Tensor,
    *,
    batch_size: int = 32,
    mode: Literal["cached", "batch"] = "cached",
) -> float:
    """Mean next-token cross-entropy (nats) over ``chunks`` ``(n, T)``, in eval mode.

    With a prior, its cached inference bias is used (``mode="batch"``: the training bias of each
    evaluation batch). The model's train/eval mode is restored.
    """
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    ctx: Any = nullcontext()
    if prior is not None and not is_attached(model):
        ctx = attached(model, prior, mode=mode)
    try:
        with ctx as plugin:
            old_mode = None
            if prior is not None and plugin is None:
                plugin = current_plugin(model)
            if plugin is not None:
                old_mode, plugin.mode = plugin.mode, mode
            try:
                for i in range(0, chunks.shape[0], batch_size):
                    ids = chunks[i : i + batch_size].to(device)
                    logits = model(input_ids=ids).logits
                    n = ids[:, 1:].numel()
                    total += float(next_token_loss(logits, ids)) * n
                    count += n
            finally:
                if plugin is not None and old_mode is not None:
                    plugin.mode = old_mode
    finally:
        model.train(was)
    if count == 0:
        raise InputError("no chunks to evaluate")
    return total / count


@dataclass(frozen=True)
class TrainConfig:
    """One training run (see :func:`train`).

    Parameters
    ----------
    steps : int
        Optimizer steps.
    context : int
        Training length without the context game, and the evaluation length.
    tokens_per_step : int
        Tokens per batch (batch = tokens_per_step // length), the same at every length.
    lr, weight_decay, betas, grad_clip : AdamW and clipping (weight decay on matrices only).
    schedule : {"cosine", "floor", "constant"}
        See :func:`lr_factor`; ``warmup_frac``, ``flat_frac``, ``lr_floor`` its constants.
    label_smoothing : float
        On the training loss (the paper: 0.015); reported CEs are never smoothed.
    warm_frac : float
        Bias warm-in over this fraction of the steps (the paper: about 1200 of 8030).
    chaos : bool
        Logistic-map modulation of LR and bias scale.
    ema : bool
        Keep an EMA of the weights (decay ``1 - 1 / (ema_horizon_frac * steps)``).
    guardian : GuardianConfig or None
        The Guardian (RPA runs only).
    context_game : ContextGameConfig or None
    swa_select : SWASelectConfig or None
    control_every : int
        Steps between control evaluations (Guardian, SWA-select, history).
    control_chunks : int
        Control chunks per control evaluation.
    checkpoints : int
        Checkpoints (including step 0 and the last step); 0 for none.
    checkpoint_spacing : {"linear", "log"}
        Evenly spaced, or log-spaced (dense early, where attention entropy moves fastest).
    seed : int
        Seeds data order, dropout, the Guardian and the context game.
    """

    steps: int = 400
    context: int = 128
    tokens_per_step: int = 2048
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    schedule: Literal["cosine", "floor", "constant"] = "cosine"
    warmup_frac: float = 0.05
    flat_frac: float = 0.2
    lr_floor: float = 0.1
    label_smoothing: float = 0.0
    warm_frac: float = 0.15
    chaos: bool = False
    ema: bool = False
    ema_horizon_frac: float = 0.05
    guardian: GuardianConfig | None = None
    context_game: ContextGameConfig | None = None
    swa_select: SWASelectConfig | None = None
    control_every: int = 10
    control_chunks: int = 8
    checkpoints: int = 5
    checkpoint_spacing: Literal["linear", "log"] = "linear"
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


@dataclass
class TrainResult:
    """What :func:`train` returns (and writes as ``result.json``)."""

    val_ce: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    guardian: list[dict[str, float]] = field(default_factory=list)
    context_mixture: dict[int, float] = field(default_factory=dict)
    swa_accepted: list[int] = field(default_factory=list)
    swa_used: bool = False
    seconds: float = 0.0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["context_mixture"] = {str(k): v for k, v in self.context_mixture.items()}
        return d


def checkpoint_steps(steps: int, n: int, spacing: Literal["linear", "log"] = "linear") -> list[int]:
    """The steps at which :func:`train` saves checkpoints (always 0 and ``steps`` when n >= 2).

    Examples
    --------
    >>> checkpoint_steps(300, 5), checkpoint_steps(300, 6, "log")
    ([0, 75, 150, 225, 300], [0, 1, 4, 17, 72, 300])
    """
    if n <= 0:
        return []
    if n == 1:
        return [steps]
    if spacing == "linear":
        pts = np.linspace(0, steps, n)
    elif spacing == "log":
        pts = np.concatenate([[0.0], np.geomspace(1, steps, n - 1)])
    else:
        raise InputError(f"checkpoint spacing must be 'linear' or 'log', got {spacing!r}")
    return sorted({round(float(x)) for x in pts})


def _param_groups(modules: list[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    seen: set[int] = set()
    for m in modules:
        for p in m.parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _gate_delta(
    prior: RPAPrior, length: int, prev: list[torch.Tensor] | None
) -> tuple[float, list[torch.Tensor] | None]:
    if not prior.has_statistics(length):
        return 0.0, prev
    now = [prior.inference_bias(layer, length) for layer in range(prior.n_layers)]
    if prev is None:
        return 0.0, now
    delta = float(np.mean([float((a - b).abs().mean()) for a, b in zip(now, prev, strict=True)]))
    return delta, now


def train(
    model: Any,
    prior: RPAPrior | None,
    data: TokenData,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    on_complete: Callable[[RunFolder, TrainResult], Any] | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` (with ``prior`` attached when given) and report validation CE.

    The reported CEs are over ``data.validation`` in eval mode (an RPA model uses its cached
    inference bias): ``"raw"`` (last weights), ``"ema"`` (with ``ema``), ``"swa_select"``
    (with ``swa_select``: the selective average if it beat the un-averaged weights on the
    control set, else those weights). With ``out_dir``, the run folder
    (:class:`~attncoda.hooks.rpa_checkpoints.RunFolder`) gets the checkpoints
    (``checkpoints/stepNNNNNN.pt``), the final weights (``final_raw.pt`` / ``final_ema.pt`` /
    ``final_swa.pt``, and ``final.pt``: the last of these that applies), held-out audit ids
    (``audit_ids.pt``), the config and the result (``result.json``). The folder is checked
    before training starts (new, empty, or with ``overwrite`` a run folder attncoda wrote) and
    is built beside its place, then swapped in whole when training ends: an interrupted run
    leaves the previous folder, if any, untouched and no partial run behind.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM built from a config.
    prior : RPAPrior or None
        None trains the baseline (no plug-in at all).
    data : TokenData
    config : TrainConfig
    out_dir : str or os.PathLike, optional
    overwrite : bool, default False
        Replace an existing ``out_dir`` that holds an earlier run (never a folder with files
        attncoda did not write).
    on_complete : callable, optional
        ``on_complete(run, result)`` is called with the staged run folder before it is swapped
        in, to add files of the caller's (a summary); they become part of the run.
    progress : bool
        Show a tqdm progress bar.
    desc : str
        Progress bar label.

    Returns
    -------
    TrainResult

    Examples
    --------
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> stream = torch.arange(400) % 50 + 4
    >>> data = TokenData(stream, stream[:64].view(4, 16), stream[64:128].view(4, 16))
    >>> res = train(model, None, data, TrainConfig(steps=3, context=16, tokens_per_step=64,
    ...             checkpoints=0), progress=False)
    >>> sorted(res.val_ce)
    ['raw']
    """
    cfg = config  # checked before the run folder is staged: a refused config writes nothing
    if cfg.guardian is not None and prior is None:
        raise InputError("the Guardian controls the RPA prior: pass a prior or guardian=None")
    lengths = cfg.context_game.lengths if cfg.context_game is not None else (cfg.context,)
    if max(lengths) > cfg.context:
        raise InputError("context-game lengths must not exceed the evaluation context")
    if cfg.tokens_per_step < max(lengths):
        raise InputError("tokens_per_step must be at least the longest context")
    if out_dir is None:
        if on_complete is not None:
            raise InputError("on_complete adds files to the run folder: pass out_dir as well")
        return _train(model, prior, data, cfg, None, progress=progress, desc=desc)
    with ac.atomic_output(
        out_dir, overwrite=overwrite, kind="folder", stamp="rpa-run", what="out_dir"
    ) as staged:
        run = RunFolder(staged)
        result = _train(model, prior, data, cfg, run, progress=progress, desc=desc)
        if on_complete is not None:
            on_complete(run, result)
    return result


def _train(
    model: Any,
    prior: RPAPrior | None,
    data: TokenData,
    cfg: TrainConfig,
    run: RunFolder | None,
    *,
    progress: bool,
    desc: str,
) -> TrainResult:
    """:func:`train`'s loop; ``run`` (a staged folder) gets the files."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    device = next(model.parameters()).device
    modules: list[nn.Module] = [model] + ([prior] if prior is not None else [])
    opt = torch.optim.AdamW(_param_groups(modules, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    game = ContextGame(cfg.context_game, seed=cfg.seed) if cfg.context_game is not None else None
    guardian = None
    if cfg.guardian is not None and prior is not None:
        guardian = Guardian(cfg.guardian, tau=float(prior.tau[0]), seed=cfg.seed)
        guardian.apply_to(prior)
    ema = None
    if cfg.ema:
        ema = WeightEMA(
            modules, decay=max(0.0, 1.0 - 1.0 / max(1.0, cfg.ema_horizon_frac * cfg.steps))
        )
    swa = SelectiveAveraging(cfg.swa_select) if cfg.swa_select is not None else None
    chaos = Chaos(time_scale=8030 / cfg.steps) if cfg.chaos else None
    warm_steps = max(1, round(cfg.warm_frac * cfg.steps))
    ckpt_steps = checkpoint_steps(cfg.steps, cfg.checkpoints, cfg.checkpoint_spacing)
    control = data.control[: cfg.control_chunks]
    if run is not None:
        torch.save(data.validation[:8].clone(), run.audit_ids)
        run.train_config.write_text(json.dumps(cfg.to_json(), indent=2))
    if prior is not None:
        prior.set_controls(bias_scale=0.0 if cfg.warm_frac > 0 else 1.0)
        prior.calibrate(model, [control.to(device)])
    result = TrainResult(val_ce={})
    prev_bias: list[torch.Tensor] | None = None

    def checkpoint(step: int) -> None:
        if run is not None and step in ckpt_steps:
            save_checkpoint(run.checkpoint(step), model, prior, step=step, seed=cfg.seed)

    def control_ce(weights: dict[str, torch.Tensor] | None = None) -> float:
        ctx = swapped(modules, weights) if weights is not None else nullcontext()
        mode: Literal["cached", "batch"] = (
            "cached" if prior is None or prior.has_statistics(cfg.context) else "batch"
        )
        with ctx:
            return evaluate(model, prior, control, mode=mode)

    start = time.perf_counter()
    ctx: Any = attached(model, prior, mode="auto") if prior is not None else nullcontext()
    with ctx as plugin:
        bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, leave=False)
        for step in bar:
            checkpoint(step)
            model.train()
            factor = chaos.factor(step) if chaos is not None else 1.0
            lr = (
                cfg.lr
                * factor
                * lr_factor(
                    step,
                    cfg.steps,
                    schedule=cfg.schedule,
                    warmup_frac=cfg.warmup_frac,
                    flat_frac=cfg.flat_frac,
                    floor=cfg.lr_floor,
                )
            )
            for g in opt.param_groups:
                g["lr"] = lr
            if prior is not None:
                prior.set_controls(bias_scale=min(1.0, step / warm_steps))
                prior.train_scale_factor = factor
            length = game.sample() if game is not None else cfg.context
            ids = data.sample(length, cfg.tokens_per_step // length, gen).to(device)
            logits = model(input_ids=ids).logits
            ce = next_token_loss(logits, ids, label_smoothing=cfg.label_smoothing)
            loss = ce + (prior.regularizer() if prior is not None else 0.0)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                nn.utils.clip_grad_norm_(
                    [p for m in modules for p in m.parameters()], cfg.grad_clip
                )
            opt.step()
            if ema is not None:
                ema.update()
            ce_plain = (
                float(next_token_loss(logits.detach(), ids))
                if cfg.label_smoothing
                else float(ce.detach())
            )
            result.losses.append(ce_plain)
            result.tokens += ids.numel()
            stats = prior.last_stats if prior is not None else {}
            if game is not None:
                game.observe(
                    length, ce_plain, stats.get("sat_frac", 0.0), stats.get("mu_entropy", 0.0)
                )
                if (step + 1) % cfg.context_game.every == 0:  # type: ignore[union-attr]
                    game.update()
            record: dict[str, Any] = {
                "step": step + 1,
                "train_ce": ce_plain,
                "lr": lr,
                "length": length,
            }
            if (step + 1) % cfg.control_every == 0 or step + 1 == cfg.steps:
                if prior is not None:
                    assert plugin is not None
                    plugin.track = True
                c_ce = control_ce()
                record["control_ce"] = c_ce
                if prior is not None:
                    stats = dict(prior.last_stats)
                    plugin.track = False
                    delta, prev_bias = _gate_delta(prior, cfg.context, prev_bias)
                    record.update(stats, gate_delta=delta, tau=float(prior.tau[0]))
                    if guardian is not None:
                        guardian.step(
                            GuardianSignals(
                                delta,
                                stats.get("sat_frac", 0.0),
                                stats.get("mu_entropy", 0.0),
                                c_ce,
                            )
                        )
                        guardian.apply_to(prior)
                        record.update(
                            lambda_sat=guardian.lambda_sat, lambda_delta=guardian.lambda_delta
                        )
                if swa is not None:
                    weights = (
                        ema.state()
                        if ema is not None
                        else {n: p.detach().clone() for n, p in _float_params(modules)}
                    )
                    cand_ce = control_ce(weights) if ema is not None else c_ce
                    record["swa_accepted"] = swa.offer(step + 1, cfg.steps, weights, cand_ce)
                if progress:
                    bar.set_postfix(ce=f"{ce_plain:.3f}", ctl=f"{c_ce:.3f}", lr=f"{lr:.1e}")
            result.history.append(record)
        bar.close()
        checkpoint(cfg.steps)
        result.seconds = time.perf_counter() - start
        # final evaluations (eval mode: cached bias)
        val = data.validation
        result.val_ce["raw"] = evaluate(model, prior, val)
        final_weights: dict[str, torch.Tensor] | None = None
        final_name: Literal["raw", "ema", "swa"] = "raw"
        if run is not None:
            save_checkpoint(run.final("raw"), model, prior, step=cfg.steps, weights="raw")
        if ema is not None:
            with ema.applied():
                result.val_ce["ema"] = evaluate(model, prior, val)
                if run is not None:
                    save_checkpoint(run.final("ema"), model, prior, step=cfg.steps, weights="ema")
            final_weights, final_name = ema.state(), "ema"
        if swa is not None:
            avg = swa.average()
            base_weights = final_weights
            base_ce = control_ce(base_weights)
            result.swa_accepted = list(swa.accepted)
            if avg is not None and control_ce(avg) < base_ce:
                result.swa_used = True
                final_weights = avg
            with swapped(modules, final_weights) if final_weights is not None else nullcontext():
                result.val_ce["swa_select"] = evaluate(model, prior, val)
                if run is not None:
                    save_checkpoint(
                        run.final("swa"),
                        model,
                        prior,
                        step=cfg.steps,
                        weights="swa" if result.swa_used else ("ema" if ema is not None else "raw"),
                    )
            final_name = "swa"
    if guardian is not None:
        result.guardian = list(guardian.history)
    if game is not None:
        result.context_mixture = game.mixture()
    if run is not None:
        shutil.copyfile(run.final(final_name), run.final())
        run.result.write_text(json.dumps(result.to_json(), indent=2))
    return result
