"""Every public maths function against its peers, on numpy and on torch input.

closure, clr, clr_inv, alr, alr_inv, ilr, ilr_inv (default and given basis), perturb,
perturb_inv, power, inner, paired_inner, aitchison_norm, aitchison_distance, multi_replace and
entropy (of probabilities, and of logits) on 25,000 x 512 float64 (issue #31's size), timed by
``benchmarks/_measure.py`` in one process, one thread each side, interleaved: against
scikit-bio and composition-stats (entropy: ``scipy.stats.entropy``, of logits also torch's
``Categorical``; target 1x: never slower; on torch input composition-stats and scipy get the
numpy array), a plain formula without validation and ``validate=False`` (target 1.2x each:
validation costs at most 20% of a call). A case whose ratios are unreliable (wall clock and CPU
time disagree) is measured again, up to 3 times. The cases are built in ``bench_coda.py``
(:func:`bench_coda.function_cases`), whose own section holds the 10^6-row decomposition and
pairwise comparisons.

Run: ``python benchmarks/bench_maths.py [--quick]`` (rows printed as they are measured), or
``benchmarks/run --only bench_maths --out benchmarks/results.md``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_coda import FN_ROWS, QUICK_FN_ROWS, SLOW_S, case_rows, cases_main, function_cases


def iter_rows(quick: bool = False, repeats: int | None = None) -> Iterator[dict[str, Any]]:
    """The table rows case by case; each is also printed to stderr (progress of a long run)."""
    cases = function_cases(QUICK_FN_ROWS if quick else FN_ROWS)
    return case_rows(cases, repeats or (3 if quick else 5), slow_s=0.5 if quick else SLOW_S)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run`` (keys: benchmark, project_s, anchor, anchor_s, ratio, target,
    holds, and those of :func:`_measure.row`)."""
    return list(iter_rows(quick))


def main(argv: list[str] | None = None) -> None:
    cases_main(__doc__, iter_rows, "2,500 rows, 3 repeats", 5, argv)


if __name__ == "__main__":
    main()
