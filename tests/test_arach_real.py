"""ARACH on the real offline models: fast = dense = plain at b = -inf, and the quick evaluation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import need

torch = pytest.importorskip("torch")
from attncoda.hooks import arach, assets  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster than 2 on a shared, loaded machine
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize(("name", "length"), [("smollm2-135m", 96), ("gemma3-270m", 48)])
def test_fast_dense_and_plain_agree_on_real_text(name, length, one_thread):
    need(name, "austen")
    model, tok = assets.load_model(name)
    text = " ".join(assets.paragraphs(assets.load_text("austen", "emma"), min_words=60)[:3])
    ids = tok(text, return_tensors="pt").input_ids[:, :length]
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        fast = arach.Arach(model)(input_ids=ids).logits
        dense = arach.Arach(model, mode="dense")(input_ids=ids).logits
        off = arach.Arach(model, offset=float("-inf"))(input_ids=ids).logits
    torch.testing.assert_close(fast, dense, rtol=0, atol=2e-3)
    torch.testing.assert_close(off, plain, rtol=0, atol=2e-3)
    assert (fast - plain).abs().max() > 0.1  # hubs do change a real model's predictions


@pytest.mark.xdist_group("quick-arach")
def test_quick_evaluation_writes_everything(study_quick):
    """The study's quick mode (its golden test's run: ``EvalPlan.quick()`` on SmolLM2) writes
    every file and sane numbers."""
    need("smollm2-135m", "austen", "mobydick")
    from case_studies.arach.study import EvalPlan

    out = study_quick("arach").finished().out
    for f in ("results.json", "ppl.csv", "cloze.csv", "audit.nc", "audit_layers.png", "sweep.png"):
        assert (out / f).exists(), f
    res = json.loads((out / "results.json").read_text())
    assert res["model"] == "smollm2-135m"
    for row in res["perplexity"]:
        assert math.isfinite(row["off"]) and math.isfinite(row["on"])
        assert row["low"] <= row["diff"] <= row["high"]
    (cloze,) = res["cloze"]
    assert cloze["offset"] == -0.5 and 0 <= cloze["off"] <= 1
    assert cloze["n"] == EvalPlan.quick().cloze_n
    audit = res["audit"]
    assert 0 <= audit["mean_hub_on"] < 1 and 0 < audit["mean_sink_off"] < 1
    assert np.isfinite(audit["mean_dH_total"])


def test_evaluation_reports_progress_and_returns_what_it_saves(tmp_path, one_thread):
    """A small plan: a line per step, and the returned results are those of results.json."""
    need("smollm2-135m", "austen", "mobydick")
    from case_studies.arach.study import EvalPlan, run_evaluation

    plan = EvalPlan(
        contexts=(32,),
        ppl_tokens=64,
        offsets=(-0.5,),
        sweep_ppl_context=32,
        ablations=(),
        cloze_n=2,
        audit_samples=1,
        audit_length=8,
        n_boot=20,
    )
    lines: list[str] = []
    res = run_evaluation("smollm2-135m", tmp_path, plan=plan, figures=False, progress=lines.append)
    assert len(lines) >= 4  # perplexity of each text, cloze off and on, the audit
    saved = json.loads((tmp_path / "results.json").read_text())
    assert json.dumps(saved) == json.dumps(res) and saved["model"] == "smollm2-135m"
