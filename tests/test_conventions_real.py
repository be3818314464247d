"""The conventions study on the real offline MiniLM and corpora (its quick size): cells resume,
the pair pipeline's sink choices, and a claim table whose rows come from the result files. The
cells are those of the study's quick mode (its golden test's run, shared: ``study_quick``)."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from conftest import need

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.xdist_group("quick-conventions")]


def test_minilm_quick_cells_resume_and_give_a_claim_table(tmp_path, study_quick):
    need("minilm-l6", "austen", "mobydick", "wikipedia")
    from case_studies.conventions import evidence as ev
    from case_studies.conventions import protocol, study

    cells, out = tmp_path / "cells", tmp_path / "out"
    texts = protocol.registered_texts()
    size = protocol.QUICK
    # the quick mode measured every MiniLM cell from nothing: two sinks ([CLS], [SEP]) per block
    quick = study_quick("conventions").finished().out / "cells"
    shutil.copytree(quick / "minilm-l6", cells / "minilm-l6")
    made = sorted(p.name for p in (cells / "minilm-l6").glob("*.nc"))
    pairs = [name for name in made if name.startswith("pairs-")]
    blocks = -(-size.windows // size.block)
    assert len(made) - len(pairs) == len(texts) * blocks * 2
    assert len(pairs) == 3 * -(-size.pairs // size.pair_block)
    # without one text block (both sinks) and one pair block, a rerun measures just those, and
    # measures them as the first run did
    gone = [
        *(
            protocol.cell_path(cells, "minilm-l6", s, texts[-1], size.length, blocks - 1)
            for s in protocol.sink_keys("minilm-l6")
        ),
        *(
            protocol.cell_path(cells, "minilm-l6", s, "pairs", size.pair_length, 0)
            for s in protocol.PAIR_CELL_SINKS
        ),
    ]
    for path in gone:
        path.unlink()
    assert protocol.measure_texts("minilm-l6", texts, size, cells, stop_after=1) == 1
    assert protocol.measure_texts("minilm-l6", texts, size, cells) == 1
    assert protocol.measure_texts("minilm-l6", texts, size, cells) == 0
    assert protocol.measure_pairs(size, cells) == 3
    assert protocol.measure_pairs(size, cells) == 0
    for path in gone:
        again = protocol.read_cell(path)
        first = protocol.read_cell(quick / "minilm-l6" / path.name)
        xr.testing.assert_allclose(again, first, rtol=1e-6, atol=1e-7)
    tables = study.run(out, size=size, models=["minilm-l6"], cells=cells, measure=False)
    for name in ("claims", "flip_rates", "clustering_artifact", "entropy_fraction", "pairs"):
        assert (out / f"{name}.csv").stat().st_size > 0, name
    claims = pd.read_csv(out / "claims.csv")
    assert len(claims) == len(tables["claims"])
    pair_rows = claims[claims.claim == "clustering artifact, BERT pair pipeline"]
    assert len(pair_rows) == 4  # [CLS], own [SEP], row argmax, head argmax
    assert set(claims.verdict) <= {
        "consistent with",
        "outside the published range",
        "borderline",
        "not seen here",
        "not conclusive",
        "not comparable",
        "not run",
        "consistent with (kept view only)",
        "not seen here (kept view only)",
    }
    # the claim table's single-segment rows come from the per-text cells run wrote, which
    # rebuild the same table alone
    assert (out / "cells" / "minilm-l6-first.nc").is_file()
    rebuilt = study.rebuild_claims(out)["claims"]
    rebuilt.to_csv(tmp_path / "rebuilt.csv", index=False)  # the same CSV round trip
    rebuilt = pd.read_csv(tmp_path / "rebuilt.csv")
    cols = ["claim", "model", "ours", "per_text", "ci", "unit", "verdict"]
    pd.testing.assert_frame_equal(rebuilt[cols].fillna(""), claims[cols].fillna(""))
    assert set(claims.unit.dropna()) & {ev.UNITS["texts"], ev.UNITS["two-stage"]}
    ent = claims[claims.claim == "entropy drop due to the sink"]
    assert {s.split(", ", 1)[1] for s in ent.setting} == {
        "first->last layers",
        "consecutive, pooled layers",
    }
    flips = pd.read_csv(out / "flip_rates.csv")
    assert flips.flip_rate.between(0, 1).all()
    assert (flips.ci_low <= flips.ci_high + 1e-12).all()
    assert set(flips.text) == {"all", *texts, "wikipedia-pairs"}
    tok = pd.read_csv(out / "pairs_sink_tokens.csv").set_index("most_attended").share_of_rows
    assert tok[["[CLS]", "[SEP]", "other"]].sum() == pytest.approx(1.0)
    frac = pd.read_csv(out / "entropy_fraction.csv")
    assert np.isfinite(frac.sink_fraction).all()
    assert (frac.ci_low <= frac.ci_high).all()
