"""RPA training runs on disk: checkpoints, and the layout of a run folder.

A checkpoint (:func:`save_checkpoint`, :func:`load_checkpoint`) holds a model built from a config,
its RPA prior (:mod:`attncoda.hooks.rpa`; none for a baseline) and JSON metadata. A run folder
(:class:`RunFolder`) is what :func:`attncoda.hooks.rpa_train.train` writes and what
:func:`attncoda.hooks.rpa_audit.audit_rpa` (``attncoda audit rpa``) and the RPA case study read:
its file names exist only here.

Examples
--------
>>> RunFolder("runs/rpa_seed0").checkpoint(75).as_posix()
'runs/rpa_seed0/checkpoints/step000075.pt'
>>> RunFolder("runs/rpa_seed0").final("ema").name
'final_ema.pt'
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch

import attncoda as ac

from .rpa import RPAConfig, RPAError, RPAPrior

__all__ = ["Checkpoint", "RunFolder", "load_checkpoint", "save_checkpoint"]

#: The ``format`` field of every checkpoint :func:`save_checkpoint` writes.
FORMAT = "attncoda-rpa-checkpoint-1"

#: Which weights a final checkpoint holds: the last weights, their EMA, or the SWA-select choice.
Weights = Literal["raw", "ema", "swa"]


@dataclass(frozen=True)
class RunFolder:
    """The files of one RPA (or baseline) training run.

    ``RunFolder(path)``: ``.path`` is the folder (a :class:`pathlib.Path`). ``train(out_dir=...)``
    writes :attr:`audit_ids`, :attr:`train_config`, one checkpoint per saved step under
    :attr:`checkpoints`, the final weights (:meth:`final`) and :attr:`result`; the case study
    adds :attr:`summary`.
    """

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def checkpoints(self) -> Path:
        """The folder of the step checkpoints."""
        return self.path / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        """The checkpoint saved at ``step`` (``checkpoints/stepNNNNNN.pt``)."""
        return self.checkpoints / f"step{step:06d}.pt"

    def step_checkpoints(self) -> list[Path]:
        """The step checkpoints present, in step order."""
        return sorted(self.checkpoints.glob("step*.pt"))

    def final(self, weights: Weights | None = None) -> Path:
        """``final.pt`` (the weights the run reports), or ``final_raw.pt`` / ``final_ema.pt`` /
        ``final_swa.pt``."""
        return self.path / ("final.pt" if weights is None else f"final_{weights}.pt")

    def final_checkpoint(self) -> Path:
        """The checkpoint of the run's final model: ``final.pt``, else ``final_raw.pt``, else the
        last step checkpoint."""
        for path in (self.final(), self.final("raw")):
            if path.is_file():
                return path
        steps = self.step_checkpoints()
        if not steps:
            raise FileNotFoundError(f"no final weights and no checkpoints under {self.path}")
        return steps[-1]

    @property
    def audit_ids(self) -> Path:
        """Held-out token ids ``(sample, T)`` for audits."""
        return self.path / "audit_ids.pt"

    @property
    def train_config(self) -> Path:
        """The :class:`~attncoda.hooks.rpa_train.TrainConfig` as JSON."""
        return self.path / "train_config.json"

    @property
    def result(self) -> Path:
        """The :class:`~attncoda.hooks.rpa_train.TrainResult` as JSON."""
        return self.path / "result.json"

    @property
    def summary(self) -> Path:
        """The case study's summary of the run (written when the run is complete)."""
        return self.path / "summary.json"


@dataclass
class Checkpoint:
    """A model, its prior (None for a baseline) and the metadata saved with them."""

    model: Any
    prior: RPAPrior | None
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    path: str | os.PathLike[str], model: Any, prior: RPAPrior | None = None, **meta: Any
) -> Path:
    """Save a model built from a config, its prior and JSON-able metadata.

    The file is written crash-safely (:func:`attncoda.atomic_output`: an interrupt leaves the
    previous file whole and no debris). An existing file at ``path`` is replaced only if it is
    an attncoda RPA checkpoint; anything else is refused (:class:`attncoda.OutputExistsError`).

    Examples
    --------
    >>> import tempfile, os
    >>> from attncoda.hooks import zoo
    >>> model = zoo.tiny_twin("llama")
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = save_checkpoint(os.path.join(d, "c.pt"), model, step=3)
    ...     load_checkpoint(p).meta["step"]
    3
    """
    path = Path(path)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "model_config": json.dumps(model.config.to_dict()),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "meta": json.dumps(meta),
    }
    if prior is not None:
        payload["prior"] = {k: v.detach().cpu() for k, v in prior.state_dict().items()}
        payload["prior_config"] = json.dumps(asdict(prior.config))
        payload["prior_sizes"] = [prior.hidden_size, prior.n_layers, prior.max_positions]
    with ac.atomic_output(
        path, overwrite=True, kind="file", is_ours=_not_a_checkpoint, what="checkpoint"
    ) as tmp:
        torch.save(payload, tmp)
    return path


def _is_checkpoint(payload: Any) -> bool:
    """Whether a loaded file is what :func:`save_checkpoint` writes."""
    return isinstance(payload, dict) and payload.get("format") == FORMAT


def _not_a_checkpoint(path: Path) -> str | None:
    """Why ``path`` is not a file :func:`save_checkpoint` may replace (None: it is one of its
    checkpoints)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any unreadable file: not provably ours
        payload = None
    return None if _is_checkpoint(payload) else "it is not an attncoda RPA checkpoint"


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    map_location: str | torch.device = "cpu",
    dtype: torch.dtype | str = "auto",
) -> Checkpoint:
    """Load what :func:`save_checkpoint` wrote: the model (eval mode) and its prior.

    The model and prior go to ``map_location``; the model's weights are cast to ``dtype``
    (``"auto"``: as saved; one of :data:`attncoda.hooks.zoo.DTYPES` or a ``torch.dtype``).
    """
    import transformers  # heavy: loaded only when a model is rebuilt from its config

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if not _is_checkpoint(payload):
        raise RPAError(f"{path} is not an attncoda RPA checkpoint")
    cfg_dict = json.loads(payload["model_config"])
    model_type = cfg_dict.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg_dict)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(payload["model"])
    model.to(map_location).eval()
    if dtype != "auto":
        from .zoo import _as_dtype  # the one spelling of --dtype's names

        model.to(_as_dtype(dtype))
    prior = None
    if "prior" in payload:
        known = {f.name for f in fields(RPAConfig)}
        pcfg = RPAConfig(
            **{k: v for k, v in json.loads(payload["prior_config"]).items() if k in known}
        )
        hidden, n_layers, max_pos = (int(v) for v in payload["prior_sizes"])
        prior = RPAPrior(hidden, n_layers, max_pos, pcfg)
        prior.load_state_dict(payload["prior"])
        prior.to(map_location)
    return Checkpoint(model=model, prior=prior, meta=json.loads(payload["meta"]))
