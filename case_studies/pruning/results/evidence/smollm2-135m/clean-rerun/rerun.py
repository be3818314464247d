"""How the cells in this folder were recomputed (issue 28): every cell of ``../cells`` that
recorded a modified tree (``dirty: true``), with the unpruned baseline that ``run_cells`` always
computes, from a clean worktree (``git worktree add --detach DIR COMMIT``; ``PYTHONPATH=DIR``,
run from DIR), one torch thread, ``nice``, with the committed ``head_scores.csv``/``.json`` copied
into the output folder first so that only the listed cells ran. Three cells at 8189719
(the baseline, ``skip_0_2/zero/content_entropy/k027``, ``global/zero/max_attention/k054``, one
at a time), the other 25 at d3bc423 with this script (the three already there are skipped).
Each cell's file records the commit and ``dirty: false`` that
:func:`case_studies._study.git_state` saw; ``python -m case_studies.pruning table`` compares
them with the committed cells."""

import json
import time
from pathlib import Path

import torch

from attncoda.hooks import assets
from case_studies._study import Provenance
from case_studies.pruning.evidence import Cell, run_cells
from case_studies.pruning.study import EVIDENCE, evidence_windows

torch.set_num_threads(1)
prov = Provenance("pruning", "rerun-estimate", "rerun.py")
print(prov.git, flush=True)
assert not prov.git["dirty"], "run from a clean worktree"
here = Path(__file__).resolve().parent
committed = here.parent / "cells"
cells = []
for f in sorted(committed.rglob("*.json")):
    rec = json.loads(f.read_text())
    if rec.get("dirty") is True:
        control, mode, score, k = f.relative_to(committed).with_suffix("").parts
        cells.append(Cell(control, mode, score, 0, int(k[1:])))
print(len(cells), "cells from a modified tree", flush=True)
t0, c0 = time.perf_counter(), time.process_time()
model, tok = assets.load_model("smollm2-135m")
cal, ev = evidence_windows(tok, EVIDENCE["smollm2-135m"])
run_cells(
    model,
    cal,
    ev,
    Path("/tmp/prune-rerun/smollm2-135m"),  # then copied here
    EVIDENCE["smollm2-135m"],
    only=cells,
    progress=lambda line: print(
        line, time.perf_counter() - t0, time.process_time() - c0, flush=True
    ),
    record={"commit": prov.git["commit"], "dirty": prov.git["dirty"]},
)
print("wall", time.perf_counter() - t0, "cpu", time.process_time() - c0)
