"""The pruning sweep (attncoda.hooks.prune) on a twin: rows reproducible with gates, tables at
full precision read back, bad input; the ``attncoda prune`` command's refusals; and the layering
rule that the library never imports the case studies or switches the matplotlib backend."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import gates as G  # noqa: E402
from attncoda.hooks import prune as P  # noqa: E402
from attncoda.hooks.evaluate import perplexity  # noqa: E402
from attncoda.hooks.scores import prune_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_pruning_sweep_end_to_end(tmp_path):
    model = zoo.tiny_twin("llama")
    calib = zoo.tiny_batch(model, batch=2, length=12, seed=1)["input_ids"]
    evaluation = {
        "a": zoo.tiny_batch(model, batch=2, length=12, seed=2)["input_ids"],
        "b": zoo.tiny_batch(model, batch=1, length=12, seed=3)["input_ids"],
    }
    res = P.sweep_pruning(
        model,
        calib,
        evaluation,
        scores=["sink_share", "gradient", "random", "sink_share-reversed"],
        fractions=[0.25, 0.5],
        mode="mean",
    )
    assert res.meta["ks"] == [0, 2, 4]
    assert {(r["score"], r["k"]) for r in res.rows} == {
        ("none", 0),
        *(
            (s, k)
            for s in ("sink_share", "gradient", "random", "sink_share-reversed")
            for k in (2, 4)
        ),
    }
    assert res.orders["sink_share-reversed"] == res.orders["sink_share"][::-1]
    base = perplexity(model, torch.cat([evaluation["a"], evaluation["b"]]))
    assert math.isclose(res.perplexity("none", 0), base.value, rel_tol=1e-9)
    assert math.isclose(res.perplexity("none", 0, "b"), base.subset([2]).value, rel_tol=1e-9)
    # a row is reproducible with gates directly
    order = res.orders["gradient"]
    plan = prune_plan(order, 4, n_units=4)
    means = G.head_means(model, calib)
    with G.gates(model, plan, mode="mean", means=means):
        again = perplexity(model, torch.cat([evaluation["a"], evaluation["b"]]))
    assert math.isclose(res.perplexity("gradient", 4), again.value, rel_tol=1e-6)
    paths = P.write_sweep(res, tmp_path / "out")
    with open(paths["perplexity"]) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * (1 + 4 * 2)
    assert json.loads(paths["meta"].read_text())["mode"] == "mean"
    assert paths["figure"].stat().st_size > 1000
    back = P.read_sweep(tmp_path / "out")
    assert back.orders == res.orders and back.meta == json.loads(json.dumps(res.meta))
    assert back.perplexity("gradient", 4) == pytest.approx(res.perplexity("gradient", 4), 1e-6)
    np.testing.assert_allclose(back.scores.gradient.values, res.scores.gradient.values, 1e-5)
    with pytest.raises(G.GateError, match="unit='head'"):
        P.sweep_pruning(zoo.tiny_twin("gemma3"), calib, evaluation, unit="kv_group")
    with pytest.raises(G.GateError, match=r"fractions must lie in \[0, 1\]"):
        P.sweep_pruning(model, calib, evaluation, fractions=[1.5])


def test_cli_prune_rejects_bad_input(capsys):
    from attncoda.cli import main

    assert main(["prune", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert main(["prune", "austen"]) == 2  # a corpus: MODEL means the same in every command
    assert "unknown model 'austen'" in capsys.readouterr().err
    assert main(["prune", "smollm2-135m", "--fractions", "a,b"]) == 2
    assert "--fractions" in capsys.readouterr().err
    assert main(["prune", "smollm2-135m", "--window", "2"]) == 2
    assert main(["prune", "smollm2-135m", "--unit", "layer"]) == 2


def test_sweep_tables_hold_full_precision(tmp_path):
    """Every number of the CSV files reads back as the very float that was computed."""
    model = zoo.tiny_twin("llama")
    ids = zoo.tiny_batch(model, batch=3, length=12, seed=4)["input_ids"]
    res = P.sweep_pruning(model, ids[:1], {"t": ids[1:]}, scores=["sink_share", "random"])
    paths = P.write_sweep(res, tmp_path / "out")
    rows = ac.read_table(paths["perplexity"])
    assert rows["perplexity"].tolist() == [r["perplexity"] for r in res.rows]
    assert rows["nll"].tolist() == [r["nll"] for r in res.rows]
    heads = ac.read_table(paths["head_scores"])
    assert heads["sink_share"].tolist() == res.scores.sink_share.values.ravel().tolist()
    back = P.read_sweep(tmp_path / "out")
    assert back.rows == res.rows  # the empty channel and plan of the unpruned row included
    np.testing.assert_array_equal(back.scores.random.values, res.scores.random.values)


def test_the_sweep_figure_is_saved_crash_safely_in_the_format_of_its_suffix(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    model = zoo.tiny_twin("llama")
    ids = zoo.tiny_batch(model, batch=2, length=12, seed=4)["input_ids"]
    res = P.sweep_pruning(model, ids[:1], {"t": ids[1:]}, scores=["random"], fractions=[0.5])
    P.plot_sweep(res, tmp_path / "sweep.pdf")
    assert (tmp_path / "sweep.pdf").read_bytes()[:5] == b"%PDF-"
    P.plot_sweep(res, tmp_path / "qwen2.5-coder")  # a dot that is not an image suffix
    assert (tmp_path / "qwen2.5-coder.png").read_bytes()[:4] == b"\x89PNG"
    old = (tmp_path / "sweep.pdf").read_bytes()

    def interrupted(self, fname, **kwargs):
        Path(fname).write_bytes(b"%PDF- half a fig")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        P.plot_sweep(res, tmp_path / "sweep.pdf")
    assert (tmp_path / "sweep.pdf").read_bytes() == old  # the previous figure, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen2.5-coder.png", "sweep.pdf"]


def test_every_figure_is_written_through_save_figure():
    """One crash-safe writer for figures: a bare ``savefig`` in the library, the CLI or a study
    would leave a half-written file when interrupted (and two processes could interleave)."""
    sources = [
        p
        for folder in ("attncoda", "case_studies", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p != ROOT / "attncoda" / "_plot.py"
    ]
    assert len(sources) > 40
    bare = [str(p.relative_to(ROOT)) for p in sources if ".savefig(" in p.read_text("utf-8")]
    assert bare == []


def test_the_library_never_imports_case_studies_nor_switches_the_backend():
    library = sorted((ROOT / "attncoda").rglob("*.py"))
    assert len(library) > 20
    for path in library:
        source = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import) case_studies", source, re.M), path.name
        assert "matplotlib.use(" not in source, path.name
        found = re.findall(r"import matplotlib\.pyplot|from matplotlib import pyplot", source)
        if path.name == "_plot.py":  # one place: a new figure where pyplot shows figures
            assert (
                len(found) == 1
                and "if _pyplot_shows():\n        import matplotlib.pyplot" in source
            )
        else:
            assert not found, path.name
