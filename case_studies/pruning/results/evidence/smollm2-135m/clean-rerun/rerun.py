"""How the cells in this folder were recomputed (issue 28): from a clean worktree of commit
8189719 (``git worktree add --detach DIR 8189719``; ``PYTHONPATH=DIR``), one torch thread,
``nice``, with the committed ``head_scores.csv``/``.json`` copied in first so that only the
listed cells (and the unpruned baseline, which ``run_cells`` always computes) ran. Each cell's
file records the commit and ``dirty: false`` that :func:`case_studies._study.git_state` saw."""

import time
from pathlib import Path

import torch

from attncoda.hooks import assets
from case_studies._study import Provenance
from case_studies.pruning.evidence import Cell, run_cells
from case_studies.pruning.study import EVIDENCE, evidence_windows

torch.set_num_threads(1)
prov = Provenance("pruning", "rerun-estimate", "one.py")
print(prov.git, flush=True)
t0, c0 = time.perf_counter(), time.process_time()
model, tok = assets.load_model("smollm2-135m")
cal, ev = evidence_windows(tok, EVIDENCE["smollm2-135m"])
# first run: skip_0_2/zero/content_entropy/k027; second run: global/zero/max_attention/k054
cells = [Cell("skip_0_2", "zero", "content_entropy", 0, 27)]
run_cells(
    model,
    cal,
    ev,
    Path("/tmp/prune-rerun/smollm2-135m"),
    EVIDENCE["smollm2-135m"],
    only=cells,
    progress=lambda line: print(
        line, time.perf_counter() - t0, time.process_time() - c0, flush=True
    ),
    record={"commit": prov.git["commit"], "dirty": prov.git["dirty"]},
)
print("wall", time.perf_counter() - t0, "cpu", time.process_time() - c0)
