"""The conventions case study end to end on the real offline models (``--quick``)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_quick_case_study_writes_tables_figures_and_report(tmp_path):
    need("smollm2-135m", "gemma3-270m", "minilm-l6", "austen")
    from case_studies.conventions.study import main

    assert main(["--quick", "--out", str(tmp_path)]) == 0
    import pandas as pd

    for table in (
        "summary",
        "flip_rates",
        "clustering_agreement",
        "clustering_structure",
        "entropy_attribution",
        "profiles",
    ):
        assert (tmp_path / f"{table}.csv").stat().st_size > 0, table
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary.model.tolist() == ["smollm2-135m", "gemma3-270m", "minilm-l6", "minilm-l6"]
    assert summary.heads.tolist() == [270, 72, 72, 72]
    flips = pd.read_csv(tmp_path / "flip_rates.csv")
    assert flips.flip_rate.between(0, 1).all()
    assert (flips.ci_low <= flips.ci_high + 1e-12).all()
    # trained causal LMs have strong first-token sinks, so the convention matters for them
    causal = summary[summary.model != "minilm-l6"]
    assert (causal["sink_rate_0.3"] > 0.3).all()
    assert (causal.flip_max > 0.1).all()
    att = pd.read_csv(tmp_path / "entropy_attribution.csv")
    np.testing.assert_allclose(att.sink + att.content, att.total, atol=2e-5)  # 6 digits in CSV
    figures = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"flip_rates_models.png", "flip_rates_models.svg"} <= figures
    assert "smollm2-135m_dendrograms_js.svg" in figures
    report = (tmp_path / "README.md").read_text()
    assert "17%-47%" in report and "smollm2-135m" in report
