"""The pruning study's evidence protocol on tiny twins: layer-control plans, resumable cells,
block-bootstrap intervals, random-order bands and the claim tables built on them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from attncoda.hooks import zoo  # noqa: E402
from attncoda.hooks.evaluate import perplexity  # noqa: E402
from attncoda.hooks.gates import gates  # noqa: E402
from attncoda.hooks.scores import (  # noqa: E402
    order_within_layers,
    order_without_layers,
    prune_plan,
)
from case_studies._study import stratified_draws, two_stage_draws  # noqa: E402
from case_studies.pruning import evidence as E  # noqa: E402
from case_studies.pruning import study  # noqa: E402

# ------------------------------------------------------------------------------- layer controls


@st.composite
def orders(draw):
    n_layers = draw(st.integers(1, 6))
    n_units = draw(st.integers(2, 6))
    units = [(layer, u) for layer in range(n_layers) for u in range(n_units)]
    perm = draw(st.permutations(units))
    return list(perm), n_layers, n_units


@settings(max_examples=60, deadline=None)
@given(orders(), st.data())
def test_within_layer_plans_take_the_same_number_from_every_layer(case, data):
    order, n_layers, n_units = case
    ranked = order_within_layers(order)
    assert sorted(ranked) == sorted(order)
    k = data.draw(st.integers(0, n_layers * (n_units - 1)))
    plan = prune_plan(ranked, k, n_units)
    counts = [len(plan.get(layer, ())) for layer in range(n_layers)]
    assert sum(counts) == k
    assert max(counts) - min(counts) <= 1  # the same number per layer, up to the remainder
    assert max(counts) <= n_units - 1  # no layer loses all its heads
    # within a layer the order's least important heads go first
    for layer, heads in plan.items():
        own = [u for lay, u in order if lay == layer]
        assert set(heads) == set(own[: len(heads)])


@settings(max_examples=60, deadline=None)
@given(orders(), st.data())
def test_skipped_layers_are_never_pruned_and_every_layer_keeps_a_head(case, data):
    order, n_layers, n_units = case
    skip = data.draw(st.sets(st.integers(0, n_layers - 1), max_size=n_layers - 1))
    kept = order_without_layers(order, sorted(skip))
    assert kept == [u for u in order if u[0] not in skip]
    k = data.draw(st.integers(0, (n_layers - len(skip)) * (n_units - 1)))
    plan = prune_plan(kept, k, n_units)
    assert not set(plan) & skip
    assert sum(len(h) for h in plan.values()) == k
    assert all(len(h) <= n_units - 1 for h in plan.values())


def test_a_control_plan_beyond_what_the_layers_can_give_is_refused():
    order = order_without_layers([(0, 0), (0, 1), (1, 0), (1, 1)], [0])
    with pytest.raises(ValueError, match="at most 1"):
        prune_plan(order, 2, n_units=2)


# ----------------------------------------------------------------------------- resumable cells

PROTOCOL = E.Evidence(
    fractions=(0.125, 0.25),
    main_scores=("sink_share", "entropy", "gradient"),
    other_scores=("content_entropy",),
    mean_scores=("sink_share",),
    random_seeds=3,
)


@pytest.fixture(scope="module")
def tiny():
    model = zoo.tiny_twin("llama", num_hidden_layers=6)  # layers 3-5 left by skip_0_2
    ids = zoo.tiny_batch(model, batch=5, length=12)["input_ids"]
    return model, ids[:1], {"a": ids[1:3], "b": ids[3:]}


@pytest.fixture(scope="module")
def tiny_run(tiny, tmp_path_factory):
    model, calibration, evaluation = tiny
    folder = tmp_path_factory.mktemp("evidence") / "tiny"
    done = E.run_cells(model, calibration, evaluation, folder, PROTOCOL)
    return folder, done


def test_every_planned_cell_is_done_and_matches_gates_directly(tiny, tiny_run):
    model, _, evaluation = tiny
    folder, done = tiny_run
    meta = json.loads((folder / "meta.json").read_text())
    assert sorted(c.label for c in done) == sorted(meta["cells"])
    # base + 2 ks x (3 controls x 3 main + 3 random + 1 mean + 1 other)
    assert len(done) == 1 + 2 * (9 + 3 + 1 + 1)
    cells = E.load_cells(folder)
    cell = E.Cell("within_layer", "zero", "entropy", 0, 6)
    plan = {
        int(part[1:].split(":")[0]): [int(h) for h in part.split(":")[1].split(",")]
        for part in cells[cell]["pruned"].split(";")
    }
    assert [len(h) for h in plan.values()] == [1] * 6  # within layer: one head in each layer
    ids = torch.cat(list(evaluation.values()))
    with gates(model, plan):
        want = perplexity(model, ids)
    assert np.allclose(cells[cell]["nll"], want.nll.numpy(), rtol=1e-6)
    skip = cells[E.Cell("skip_0_2", "zero", "entropy", 0, 6)]["pruned"]
    assert {int(part[1:].split(":")[0]) for part in skip.split(";")} <= {3, 4, 5}
    rows = E.window_table(cells)
    assert len(rows) == len(cells) * 4 and {r["text"] for r in rows} == {"a", "b"}


def test_a_rerun_skips_done_cells_and_redoes_damaged_ones(tiny, tiny_run, tmp_path):
    import shutil

    model, calibration, evaluation = tiny
    src, _ = tiny_run
    folder = tmp_path / "copy"
    shutil.copytree(src, folder)
    before = E.load_cells(folder)
    damaged = E.Cell("global", "zero", "sink_share", 0, 3)
    missing = E.Cell("global", "zero", "random", 1, 6)
    other_tokens = E.Cell("global", "mean", "sink_share", 0, 3)
    text = damaged.path(folder).read_text()
    damaged.path(folder).write_text(text[: len(text) // 2])  # a write cut short
    missing.path(folder).unlink()
    rec = json.loads(other_tokens.path(folder).read_text())
    rec["tokens_sha256"] = "0" * 64  # made on other tokens
    other_tokens.path(folder).write_text(json.dumps(rec))
    lines: list[str] = []
    E.run_cells(model, calibration, evaluation, folder, PROTOCOL, progress=lines.append)
    assert sorted(line.split(":")[0] for line in lines) == sorted(
        [damaged.label, missing.label, other_tokens.label]
    )
    after = E.load_cells(folder)
    assert set(after) == set(before)
    for cell in (damaged, missing, other_tokens):
        assert np.allclose(after[cell]["nll"], before[cell]["nll"], rtol=1e-6)
    lines.clear()
    E.run_cells(model, calibration, evaluation, folder, PROTOCOL, progress=lines.append)
    assert lines == []  # nothing left to do


def test_a_time_limit_stops_between_cells_and_the_next_call_continues(tiny, tmp_path):
    model, calibration, evaluation = tiny
    folder = tmp_path / "split"
    assert E.run_cells(model, calibration, evaluation, folder, PROTOCOL, time_limit_s=0) == []
    assert E.load_cells(folder) == {}
    done = E.run_cells(model, calibration, evaluation, folder, PROTOCOL)
    assert len(done) == len(json.loads((folder / "meta.json").read_text())["cells"])


def test_shards_split_the_cells_between_processes_and_together_equal_one_run(tiny, tiny_run):
    """``--shard 1/2`` and ``2/2`` compute disjoint halves of the plan; together every cell,
    each once, with the numbers one unsharded run gives."""
    model, calibration, evaluation = tiny
    whole, _ = tiny_run
    folder = whole.parent / "sharded"
    from case_studies._study import Shard

    seen: list[list[str]] = []
    for index in (1, 2):
        lines: list[str] = []
        E.run_cells(
            model,
            calibration,
            evaluation,
            folder,
            PROTOCOL,
            shard=Shard(index, 2),
            progress=lines.append,
        )
        seen.append([line.split(":")[0] for line in lines])
    plan = [
        c.label
        for c in E.plan_cells(PROTOCOL, json.loads((folder / "meta.json").read_text())["ks"])
    ]
    assert seen == [plan[0::2], plan[1::2]]
    expected, got = E.load_cells(whole), E.load_cells(folder)
    assert set(got) == set(expected)
    for cell in expected:
        assert np.allclose(got[cell]["nll"], expected[cell]["nll"], rtol=1e-6), cell.label
    lines = []
    E.run_cells(model, calibration, evaluation, folder, PROTOCOL, progress=lines.append)
    assert lines == []  # an unsharded rerun finds nothing left


# ------------------------------------------------------------------------------- statistics


def test_the_ratio_interval_is_the_paired_block_bootstrap_over_windows(tiny_run):
    folder, _ = tiny_run
    cells = E.load_cells(folder)
    on = E.Cell("global", "zero", "entropy", 0, 6)
    r = E.ratio_interval(cells, on)
    base, pruned = cells[E.BASE], cells[on]
    # the point ratio is the perplexity ratio of the summed NLLs
    want = math.exp((sum(pruned["nll"]) - sum(base["nll"])) / sum(base["n_tokens"]))
    assert math.isclose(r.ratio, want, rel_tol=1e-9)
    assert r.low <= r.ratio <= r.high and r.n_windows == 4
    # windows as blocks of tokens; the conditional interval resamples each text's windows
    # among themselves (texts fixed)
    n = np.asarray(base["n_tokens"], float)
    a, b = np.asarray(base["nll"]) / n, np.asarray(pruned["nll"]) / n
    draws = stratified_draws(base["texts"], 2000, seed=0)
    assert all(set(np.asarray(base["texts"])[d].tolist()) == set(base["texts"]) for d in draws)
    lo, hi = np.quantile(b[draws].mean(1) - a[draws].mean(1), [0.025, 0.975])
    assert math.isclose(r.cond_low, math.exp(lo)) and math.isclose(r.cond_high, math.exp(hi))
    # the headline interval draws the texts, then the windows of each drawn text
    two = two_stage_draws(base["texts"], 2000, seed=0)
    d2 = np.array([b[i].mean() - a[i].mean() for i in two])
    lo2, hi2 = np.quantile(d2, [0.025, 0.975])
    assert math.isclose(r.low, math.exp(lo2)) and math.isclose(r.high, math.exp(hi2))
    assert r.conditional().low == r.cond_low and r.conditional().ratio == r.ratio
    same = E.ratio_interval(cells, on, on)
    assert same.ratio == same.low == same.high == 1.0
    by_text = E.ratio_interval(cells, on, text="a")
    assert by_text.n_windows == 2 and by_text.per_text == ()
    # with one text there is no spread between texts: the two intervals are the same
    assert math.isclose(by_text.low, by_text.cond_low)
    assert math.isclose(by_text.high, by_text.cond_high)
    # the per-text values are each text's own ratio, in the texts' order
    assert [t for t, _ in r.per_text] == list(dict.fromkeys(base["texts"]))
    for t, v in r.per_text:
        assert math.isclose(v, E.ratio_interval(cells, on, text=t).ratio, rel_tol=1e-12)


def _fake(nll: list[float]) -> dict:
    return {"nll": nll, "n_tokens": [10] * len(nll), "texts": ["t"] * len(nll), "pruned": ""}


def test_the_random_band_is_the_median_and_5_95_quantiles_of_the_orders():
    cells = {E.BASE: _fake([20.0, 20.0])}
    logs = np.log([1.5, 2.0, 3.0, 8.0, 1.1])
    for seed, lr in enumerate(logs):
        cells[E.Cell("global", "zero", "random", seed, 3)] = _fake([20 + 10 * lr] * 2)
    med, p5, p95, n = E.random_band(cells, 3)
    assert n == 5
    assert math.isclose(med, 2.0)
    assert math.isclose(p5, float(np.quantile([1.5, 2.0, 3.0, 8.0, 1.1], 0.05)))
    assert math.isclose(p95, float(np.quantile([1.5, 2.0, 3.0, 8.0, 1.1], 0.95)))
    assert E.random_band(cells, 7)[3] == 0


def test_the_100x_verdict_follows_the_interval():
    assert study._verdict_100x(E.RatioInterval(300, 150, 600, 24, 1)).startswith("holds")
    assert study._verdict_100x(E.RatioInterval(30, 15, 60, 24, 1)).startswith("does not hold")
    assert study._verdict_100x(E.RatioInterval(120, 60, 200, 24, 1)).startswith("inconclusive")


def test_the_layer_share_of_the_gap_is_between_none_and_all_of_it():
    def share(own, *controlled):
        gap = {"global": E.RatioInterval(own, own, own, 24, 1)}
        for c, r in zip(("within_layer", "skip_0_2"), controlled, strict=False):
            gap[c] = E.RatioInterval(r, r, r, 24, 1)
        return study.ChannelLayer("entropy", 5, {}, gap, {}).layer_share()

    # a range over the controls, each named: neither alone is the layer share
    assert share(100.0, 10.0, 1.0) == "50% (same number per layer) to 100% (layers 0-2 kept)"
    assert share(100.0, 0.5, 0.8) == "100% (same number per layer and layers 0-2 kept)"
    assert share(3.17, 3.18, 2.68).startswith("0% (same number per layer) to 15%")  # not -0%
    assert share(0.9, 2.0) == "n/a"  # no gap in the own order
    assert share(5.0) == "n/a"  # no control run yet


def test_tables_render_from_a_run_folder_and_show_partial_runs_as_partial(tiny, tmp_path):
    model, calibration, evaluation = tiny
    results = tmp_path / "results"
    folder = results / study.EVIDENCE_DIR / "smollm2-135m"
    cells = E.plan_cells(PROTOCOL, [0, 3, 6])
    E.run_cells(model, calibration, evaluation, folder, PROTOCOL, only=cells[:8])
    models = study.read_evidence(results)
    assert list(models) == ["smollm2-135m"]
    coverage = study.coverage_table(models, results)
    assert "8 of 29 (**partial**)" in coverage and "not run" in coverage
    table = study.evidence_table(models["smollm2-135m"])
    assert "—" in table and "x [" in table  # done cells with CIs, missing ones as dashes
    claims = study.claims_table(models)
    assert "Pruning by the wrong" in claims
    assert "channel" in study.channel_layer_answer(models) or "layer" in study.channel_layer_answer(
        models
    )


@pytest.mark.parametrize(
    ("full_row", "content_ratio", "verdict"),
    [
        (300.0, 500.0, "not specific: a content score also costs >100x"),
        (300.0, 20.0, "specific: every"),
        (3.0, 2.5, "no >100x in either channel"),
    ],
)
def test_the_claims_ask_whether_the_100x_is_specific_to_the_full_row_scores(
    full_row, content_ratio, verdict
):
    """Beside the >100x row, the content scores at the same k and order: a reader learns
    whether the sink-blind full-row scores are special or any early-layer-first order is."""
    rng = np.random.default_rng(0)
    base = rng.uniform(2.5, 3.5, size=12)  # per-window mean NLL

    def cell(score: str, ratio: float) -> tuple[E.Cell, dict]:
        loss = base + math.log(ratio) + rng.normal(0, 0.01, size=12)
        return E.Cell("global", "zero", score, 0, 8), {
            "nll": (loss * 64).tolist(),
            "n_tokens": [64] * 12,
        }

    cells = {E.BASE: {"nll": (base * 64).tolist(), "n_tokens": [64] * 12}}
    sink = 1.5 if full_row > 100 else 4.5  # Gemma-3's pattern: the sink share prunes worse
    cells.update(
        [cell("entropy", full_row), cell("max_attention", full_row / 1.5), cell("sink_share", sink)]
    )
    cells.update(cell(s, content_ratio) for s in study.CONTENT)
    meta = {"ks": [0, 8], "n_units": 40, "protocol": {}, "cells": []}
    evidence = {"m": study.ModelEvidence("m", meta, cells)}
    claims = study.claims_table(evidence)
    row = next(line for line in claims.splitlines() if "specific to the full-row" in line)
    assert verdict in row
    gap = next(line for line in claims.splitlines() if "The gap is the channel" in line)
    answer = study.channel_layer_answer(evidence)
    if full_row < sink:
        assert "contradicted: entropy prunes better than the sink share" in gap
        assert "no channel penalty" in answer
    else:
        assert "contradicted" not in gap and "no channel penalty" not in answer
    for s in study.CONTENT:
        shown = float(row.split(f"{s}: ")[1].split("x [")[0])
        assert math.isclose(shown, content_ratio, rel_tol=0.02), (s, shown)


def _two_text_meta() -> dict:
    """A model folder's ``meta.json`` for two texts ``a`` and ``b`` of four windows each."""
    return {
        "ks": [0, 8],
        "n_units": 40,
        "protocol": {},
        "cells": [],
        "texts": {"a": {"windows": 4}, "b": {"windows": 4}},
    }


def test_claim_rows_name_the_ablation_show_per_text_values_and_flag_a_split_verdict():
    """Each claim row names its ablation and shows each text's own ratio; where the texts fall
    on both sides of the verdict's line, the verdict says "borderline"; the note counts the
    intervals and says none is corrected for multiplicity."""
    texts = ["a"] * 4 + ["b"] * 4
    base = np.full(8, 3.0)

    def rec(per_text: dict[str, float]) -> dict:
        loss = base + np.log([per_text[t] for t in texts])
        return {"nll": (loss * 64).tolist(), "n_tokens": [64] * 8, "texts": texts}

    cells = {
        E.BASE: rec({"a": 1.0, "b": 1.0}),
        E.Cell("global", "zero", "entropy", 0, 8): rec({"a": 60.0, "b": 400.0}),
        E.Cell("global", "mean", "entropy", 0, 8): rec({"a": 2.0, "b": 3.0}),
        E.Cell("global", "zero", "sink_share", 0, 8): rec({"a": 1.5, "b": 1.5}),
    }
    meta = _two_text_meta()
    evidence = {"m": study.ModelEvidence("m", meta, cells)}
    rows = study.claims_table(evidence).splitlines()
    assert "| ablation |" in rows[0] and "per text (a / b)" in rows[0]
    zero = next(r for r in rows if "costs >100x" in r)
    mean = next(r for r in rows if "with mean ablation" in r)
    assert "| zero |" in zero and "60x / 400x" in zero and "borderline" in zero
    assert "| mean |" in mean and "2x / 3x" in mean and "borderline" not in mean
    assert "CI over texts then windows" in zero and "(texts fixed: [" in zero
    note = study.claims_note(evidence)
    n = sum(r.count("x [") for r in rows[2:])
    assert f"holds {n} intervals" in note and "None is corrected for multiplicity" in note


def test_a_borderline_comparison_is_widened_to_more_texts_where_computed():
    """Where the per-text values straddle the verdict's line, the claim names the cells to run
    on more texts (``borderline_cells``); once those cells are there, the verdict adds each
    added text's own ratio, the interval over all texts and whether the added texts settle it,
    and the note counts the added interval."""
    texts = ["a"] * 4 + ["b"] * 4
    wide_texts = [t for t in study.WIDER_TEXTS for _ in range(4)]

    def rec(per_text: dict[str, float], labels: list[str]) -> dict:
        loss = 3.0 + np.log([per_text[t] for t in labels])
        return {"nll": (loss * 64).tolist(), "n_tokens": [64] * len(labels), "texts": labels}

    entropy = E.Cell("global", "zero", "entropy", 0, 8)
    cells = {
        E.BASE: rec({"a": 1.0, "b": 1.0}, texts),
        entropy: rec({"a": 60.0, "b": 400.0}, texts),
        E.Cell("global", "zero", "sink_share", 0, 8): rec({"a": 1.5, "b": 1.5}, texts),
    }
    meta = _two_text_meta()
    m = study.ModelEvidence("m", meta, cells)
    assert study.borderline_cells({"m": m}) == {"m": {E.BASE, entropy}}
    before = study.claims_note({"m": m})
    assert "more texts" not in before
    # the coarseness counts the draws of the texts each interval resamples: C(2n - 1, n)
    assert "a bootstrap over 2 texts has 3 distinct draws of them)" in before

    first, second = study.WIDER_TEXTS
    for values, words in (
        ({first: 150.0, second: 300.0}, "2 of the 2 added texts above 100x"),
        ({first: 20.0, second: 300.0}, "1 of the 2 added texts above 100x"),
    ):
        m.wider = {
            E.BASE: rec(dict.fromkeys(study.WIDER_TEXTS, 1.0), wide_texts),
            entropy: rec(values, wide_texts),
        }
        row = next(r for r in study.claims_table({"m": m}).splitlines() if "costs >100x" in r)
        shown = f"{values[first]:.0f}x / {values[second]:.0f}x"
        assert f"on 2 more texts ({first} / {second}: {shown}), over all 4 texts" in row
        assert words in row and "(16 windows)" in row
        note = study.claims_note({"m": m})
        assert "1 of the intervals above are over all 4 texts" in note
        assert "a bootstrap over 2 texts has 3 distinct draws of them, over 4 texts 35)" in note
        n = int(before.split("holds ")[1].split(" intervals")[0])
        assert f"holds {n + 1} intervals" in note

    # the interval over all texts says where it lies
    m.wider[entropy] = rec({first: 500.0, second: 800.0}, wide_texts)
    row = next(r for r in study.claims_table({"m": m}).splitlines() if "costs >100x" in r)
    assert "the interval lies above 100x" in row
    # the verdict reads the interval over every text, not the first texts' one
    assert "zero ablation: holds on our protocol (CI above 100x)" in row
    m.wider[entropy] = rec({first: 2.0, second: 3.0}, wide_texts)
    row = next(r for r in study.claims_table({"m": m}).splitlines() if "costs >100x" in r)
    # one text of four at 400x: an interval over texts cannot rule out another such text
    assert "0 of the 2 added texts above 100x; the interval spans 100x" in row
    assert "zero ablation: inconclusive (CI spans 100x)" in row
    m.cells[entropy] = rec({"a": 200.0, "b": 400.0}, texts)
    m.wider[entropy] = rec({first: 500.0, second: 800.0}, wide_texts)
    row = next(r for r in study.claims_table({"m": m}).splitlines() if "costs >100x" in r)
    assert "borderline" not in row and "more texts" not in row  # not split: nothing to widen


def test_the_mean_ablation_lines_pair_each_score_mean_with_zero():
    """The README's mean-ablation lines come from the cells: both ablations of every mean
    score at the second k, in its own order; a score without both cells is left out."""
    base = np.full(12, 3.0)

    def rec(ratio: float) -> dict:
        return {"nll": ((base + math.log(ratio)) * 64).tolist(), "n_tokens": [64] * 12}

    cells = {
        E.BASE: rec(1.0),
        E.Cell("global", "zero", "entropy", 0, 8): rec(240.0),
        E.Cell("global", "mean", "entropy", 0, 8): rec(2.5),
        E.Cell("global", "zero", "sink_share", 0, 8): rec(1.5),
    }
    protocol = {"mean_scores": ["sink_share", "entropy"]}
    meta = {"ks": [0, 4, 8], "n_units": 40, "protocol": protocol, "cells": []}
    text = study.mean_ablation_answer({"m": study.ModelEvidence("m", meta, cells)})
    assert (
        text
        == "- **m** (k=8 (20%), own order): entropy 2.5x [2.5, 2.5] mean vs 240x [240, 240] zero."
    )
    meta["ks"] = [0, 4]
    assert study.mean_ablation_answer({"m": study.ModelEvidence("m", meta, cells)}) == (
        "No mean-ablation cells yet."
    )


def test_wider_refuses_a_shard_before_any_model_loads(tmp_path, monkeypatch):
    """``run --wider`` computes its few cells in one process: a ``--shard`` beside it would be
    ignored, so it is refused in one line before a model loads."""

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(study.assets, "load_model", no_model)
    with pytest.raises(SystemExit, match="takes no --shard; drop --shard"):
        study.main(["run", "--wider", "--shard", "1/2", "--out", str(tmp_path / "out")])


# --------------------------------------------------------------- verdicts against their numbers

_IV = r"(?P<r>[\d.,]+)x \[(?P<lo>[\d.,]+), (?P<hi>[\d.,]+)\]"


def _decisive(ours: str, verdict: str) -> tuple[float, float]:
    """The interval a claim row's verdict rests on: the one over every text where the row was
    widened, else the row's first interval (the two-stage one)."""
    import re

    wide = re.search(r"over all \d+ texts " + _IV, verdict)
    m = wide or re.search(_IV, ours)
    assert m is not None, ours
    return float(m["lo"].replace(",", "")), float(m["hi"].replace(",", ""))


#: verdict words and what they require of the decisive interval ``(low, high)``
_RULES = {
    "(CI above 100x)": lambda lo, hi: lo > 100,
    "(CI below 100x)": lambda lo, hi: hi < 100,
    "(CI spans 100x)": lambda lo, hi: lo <= 100 <= hi,
    "better than the gradient": lambda lo, hi: hi < 1,
    "worse than the gradient": lambda lo, hi: lo > 1,
    "as good as the gradient": lambda lo, hi: lo <= 1 <= hi,
    "the interval lies above 100x": lambda lo, hi: lo > 100,
    "the interval lies below 100x": lambda lo, hi: hi < 100,
    "the interval spans 100x": lambda lo, hi: lo <= 100 <= hi,
    "the interval lies above 1x": lambda lo, hi: lo > 1,
    "the interval lies below 1x": lambda lo, hi: hi < 1,
    "the interval spans 1x": lambda lo, hi: lo <= 1 <= hi,
}


def test_every_verdict_of_the_readme_agrees_with_the_interval_it_rests_on():
    """The label rule, read from the committed README: a verdict's words (above, below, spans;
    better, worse, as good) must say what its decisive interval says, and a row widened to
    more texts is judged by the interval over all of them (issue #50)."""
    from pathlib import Path

    text = Path(study.STUDY.readme).read_text(encoding="utf-8")
    block = text.split("<!-- table: claims -->")[1].split("<!-- /table -->")[0]
    rows = [line.split(" | ") for line in block.strip().splitlines()[2:]]
    checked = 0
    for row in rows:
        ours, verdict = row[4], row[7].rstrip(" |")
        lo, hi = _decisive(ours, verdict)
        head = verdict.split("; **borderline**")[0]
        for words, ok in _RULES.items():
            if words in head or (words.startswith("the interval") and words in verdict):
                assert ok(lo, hi), f"{row[0]}: '{words}' but the interval is [{lo}, {hi}]"
                checked += 1
    assert checked >= 10


def test_a_verdict_follows_the_widest_evidence(monkeypatch):
    """Three texts say better than the gradient, all five say worse: the verdict says worse."""
    m = study.ModelEvidence("m", {"ks": [0, 2], "n_units": 8}, {}, {})
    narrow = E.RatioInterval(0.9, 0.85, 0.96, 24, 1, (("a", 0.9),), None)
    wide = E.RatioInterval(1.06, 1.01, 1.13, 40, 1, (("a", 0.9), ("b", 1.2)), None)
    monkeypatch.setattr(study, "wider_interval", lambda m_, r: wide)
    assert study.widest(m, narrow) is wide
    monkeypatch.setattr(study, "wider_interval", lambda m_, r: None)
    assert study.widest(m, narrow) is narrow
