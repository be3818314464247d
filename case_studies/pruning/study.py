"""The pruning study: its protocol, on the library's pruning sweep.

The study is ``attncoda prune MODEL`` with the command's defaults, run on SmolLM2-135M and
Gemma-3-270M (``python -m case_studies.pruning.run study``). Everything it computes is the
library's :mod:`attncoda.hooks.prune` (one implementation, shared with the command): scores from
the first windows of *Emma*, perplexity on *Moby-Dick* and *Pride and Prejudice*, tables at full
precision and the figure. This module names the study's protocol and gives the sweep the study's
names, so that a Python session can rerun one model or reread the results::

    from attncoda.hooks import assets
    from case_studies.pruning import study

    model, tok = assets.load_model("smollm2-135m")
    result = study.pruning_study(model, tok, quick=True)
    study.write_study(result, "/tmp/smollm2-quick")
    study.read_study("case_studies/pruning/results/smollm2-135m").perplexity("gradient", 27)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attncoda.hooks.prune import TEXTS, PruneSweep, default_windows, sweep_pruning
from attncoda.hooks.prune import novel_text as study_text
from attncoda.hooks.prune import plot_sweep as plot_study
from attncoda.hooks.prune import read_sweep as read_study
from attncoda.hooks.prune import write_sweep as write_study

__all__ = [
    "PROTOCOL",
    "QUICK",
    "STUDY_TEXTS",
    "Protocol",
    "StudyResult",
    "plot_study",
    "pruning_study",
    "read_study",
    "study_text",
    "write_study",
]

#: The study's result: one pruning sweep per model.
StudyResult = PruneSweep
#: The texts of the study (those of ``attncoda prune``): ``name -> (corpus, document, start)``.
STUDY_TEXTS = TEXTS


@dataclasses.dataclass(frozen=True)
class Protocol:
    """Sizes of one run of the study (the defaults of ``attncoda prune``)."""

    window: int = 512
    calibration_windows: int = 4
    eval_windows: int = 4
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)


#: The protocol of the README's results.
PROTOCOL = Protocol()
#: ``--quick``: the one-minute smoke run.
QUICK = Protocol(window=256, calibration_windows=1, eval_windows=1, fractions=(0.1, 0.3))


def pruning_study(model: Any, tokenizer: Any, *, quick: bool = False, **options: Any) -> PruneSweep:
    """The study on one loaded model: the study texts' windows, then the pruning sweep.

    Parameters
    ----------
    model, tokenizer
        A causal LM and its tokenizer (e.g. ``assets.load_model("smollm2-135m")``).
    quick : bool, default False
        :data:`QUICK` instead of :data:`PROTOCOL`.
    **options
        Passed to :func:`attncoda.hooks.prune.sweep_pruning` (``scores``, ``unit``, ``mode``,
        ``seed``, ``batch_size``, ``progress``).

    Returns
    -------
    StudyResult
    """
    protocol = QUICK if quick else PROTOCOL
    calibration, evaluation = default_windows(
        tokenizer,
        window=protocol.window,
        calibration_windows=protocol.calibration_windows,
        eval_windows=protocol.eval_windows,
    )
    options.setdefault("fractions", protocol.fractions)
    return sweep_pruning(model, calibration, evaluation, **options)
