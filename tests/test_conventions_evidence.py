"""The conventions study's new pieces on generated data and tiny twins: sink choices on a
two-segment input, per-row sinks through the core, pooled vs first-to-last entropy attribution,
stratified bootstraps, the artifact verdict, and resuming an interrupted run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import attncoda as ac

pytest.importorskip("sklearn")

from case_studies.conventions import evidence as ev
from case_studies.conventions import protocol, sinks


def _pair_ids() -> tuple[np.ndarray, np.ndarray]:
    # [CLS] a a [SEP] b b b [SEP]
    ids = np.array([[101, 5, 6, 102, 7, 8, 9, 102], [101, 5, 102, 6, 7, 8, 9, 102]])
    types = np.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    return ids, types


def test_own_segment_sep_is_the_sep_closing_each_querys_segment():
    ids, types = _pair_ids()
    got = sinks.segment_sep_sinks(types, ids, 102)
    assert got.tolist() == [[3, 3, 3, 3, 7, 7, 7, 7], [2, 2, 2, 7, 7, 7, 7, 7]]
    # every query's sink is a [SEP] of its own segment, never the other segment's
    assert (ids[np.arange(2)[:, None], got] == 102).all()
    assert (types[np.arange(2)[:, None], got] == types).all()


def test_a_segment_without_sep_is_an_input_error():
    ids, types = _pair_ids()
    ids = ids.copy()
    ids[0, 7] = 9
    with pytest.raises(ac.InputError, match="segment 1 has no"):
        sinks.segment_sep_sinks(types, ids, 102)


def _bidirectional(n_samples: int = 2, length: int = 8, seed: int = 0) -> xr.Dataset:
    return ac.testing.synthetic_rows(
        n_samples=n_samples, n_layers=2, n_heads=3, length=length, causal=False, seed=seed
    )


def test_per_row_sinks_match_the_core_on_each_group_of_rows():
    ds = _bidirectional()
    ids, types = _pair_ids()
    row_sink = sinks.segment_sep_sinks(types, ids, 102)
    got = sinks.comparisons_by_row_sink(ds, row_sink, ["js", "aitchison"])
    for s in range(2):
        parts = []
        for k in np.unique(row_sink[s]):
            q = np.flatnonzero(row_sink[s] == k)
            parts.append(
                ac.head_comparisons(
                    ds.isel(sample=[s], query=q), ["js", "aitchison"], per_sample=True, sink=int(k)
                )
            )
        n = np.array([float(p.n_rows.values[0]) for p in parts])
        for m in ("js", "aitchison"):
            want = sum(p[m].isel(sample=0).values * w for p, w in zip(parts, n, strict=True))
            np.testing.assert_allclose(got[m].isel(sample=s).values, want / n.sum(), atol=1e-9)
        assert int(got.n_rows.values[s]) == int(n.sum())


def test_one_sink_for_every_row_is_the_core_itself():
    ds = _bidirectional()
    got = sinks.comparisons_by_row_sink(ds, np.full((2, 8), 3), ["cosine"])
    core = ac.head_comparisons(ds, ["cosine"], per_sample=True, sink=3)
    np.testing.assert_allclose(got.cosine.values, core.cosine.values, atol=1e-12)
    np.testing.assert_allclose(got.sink_share.values, core.sink_share.values, atol=1e-12)


def test_row_argmax_picks_the_key_most_attended_on_average():
    ds = _bidirectional(length=6)
    best = sinks.row_argmax_sinks(ds)
    p = np.exp(ds.log_attn.transpose("sample", "layer", "head", "query", "key").values)
    mean = p.mean(axis=(1, 2))
    assert best.shape == (2, 6)
    np.testing.assert_array_equal(mean.max(-1), mean[np.arange(2)[:, None], np.arange(6), best])


def test_head_argmax_share_is_the_cores_sink_share_on_that_key():
    ds = _bidirectional(length=6)
    share = sinks.head_argmax_share(ds)
    p = np.exp(ds.log_attn.isel(sample=0, layer=1, head=2).values).mean(0)
    key = int(p.argmax())
    prof = ac.head_profiles(ds.isel(sample=[0]), sink=key, max_offset=None)
    want = float(prof.sink_share.sel(layer=1, head=2))
    assert share.sel(sample=0, unit_a="L1.H2").item() == pytest.approx(want, abs=1e-6)
    # no key of that head gets more
    assert share.sel(sample=0, unit_a="L1.H2").item() == pytest.approx(p.max(), abs=1e-6)


def _cells(n_texts: int = 2, per_text: int = 3, n_layers: int = 4) -> xr.Dataset:
    parts = []
    for t in range(n_texts):
        ds = ac.testing.synthetic_rows(
            n_samples=per_text, n_layers=n_layers, n_heads=3, length=10, seed=t
        )
        cell = protocol.window_attribution(ds, None)
        labels = [f"t{t}/{i}" for i in range(per_text)]
        parts.append(cell.assign_coords(sample=labels, text=("sample", [f"t{t}"] * per_text)))
    return xr.concat(parts, dim="sample")


def test_first_to_last_and_pooled_consecutive_fractions_are_the_cores():
    cells = _cells()
    frac, _, _ = ev.entropy(cells, n_boot=10, key={"model": "m", "sink_key": "first"})
    rows = []
    for t in range(2):
        rows.append(
            ac.testing.synthetic_rows(n_samples=3, n_layers=4, n_heads=3, length=10, seed=t)
        )
    ds = xr.concat(rows, dim="sample").assign_coords(sample=np.arange(6))
    ends = ac.attribute_entropy(ds.isel(layer=[0, -1]), along="layer").attrs["sink_fraction"]
    pooled = ac.attribute_entropy(ds, along="layer").attrs["sink_fraction"]
    a = frac[frac.text == "all"].set_index("scope")
    assert a.loc["first->last", "sink_fraction"] == pytest.approx(ends, rel=1e-9)
    assert a.loc["consecutive, pooled", "sink_fraction"] == pytest.approx(pooled, rel=1e-9)
    # the totals telescope (same mean change), the Shapley split is path dependent
    assert a.loc["first->last", "mean_total_change"] == pytest.approx(
        a.loc["consecutive, pooled", "mean_total_change"], rel=1e-9
    )
    assert ends != pytest.approx(pooled, rel=1e-6)
    for scope in a.index:
        assert a.loc[scope, "ci_low"] <= a.loc[scope, "sink_fraction"] <= a.loc[scope, "ci_high"]
        # the interval of the denominator (decides whether a share is defined at all)
        lo, hi = a.loc[scope, ["total_ci_low", "total_ci_high"]]
        assert lo <= a.loc[scope, "mean_total_change"] <= hi and lo < hi


def test_stratified_draws_resample_within_each_text():
    texts = np.array(["a"] * 3 + ["b"] * 5 + ["c"] * 2)
    d = ev.stratified_draws(texts, 50, seed=0)
    assert d.shape == (50, 10)
    assert (texts[d] == texts[None, :]).all()
    assert len(np.unique(d[:, :3])) > 1  # it does resample


def _artifact(rho: tuple[float, float], ari: tuple[float, float] | None) -> pd.DataFrame:
    rows = [{"stat": "rho_kept", "value": sum(rho) / 2, "ci_low": rho[0], "ci_high": rho[1]}]
    if ari is not None:
        rows.append({"stat": "ari_k2", "value": sum(ari) / 2, "ci_low": ari[0], "ci_high": ari[1]})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("rho", "ari", "verdict"),
    [
        ((0.8, 0.9), (-0.1, 0.1), "appears"),
        ((0.1, 0.3), (-0.1, 0.1), "does not appear"),
        ((0.8, 0.9), (0.7, 1.0), "does not appear"),
        ((0.4, 0.9), (-0.1, 0.1), "unclear"),
        ((0.8, 0.9), None, "MDS-1 follows the sink share"),
    ],
)
def test_artifact_verdict(rho, ari, verdict):
    assert ev.artifact_verdict(_artifact(rho, ari))[0] == verdict


@pytest.mark.slow
def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    pytest.importorskip("torch")
    size = protocol.Size(
        windows=3,
        length=12,
        block=1,
        pairs=2,
        pair_length=12,
        pair_block=1,
        pair_run=1,
        n_boot=5,
        n_boot_cluster=2,
    )
    text = " ".join(f"word{i} and more text." for i in range(200))

    def corpus(name: str) -> str:
        return text

    cells = tmp_path / "cells"
    args = ("twin:llama", ["one"], size, cells)
    # a spent time limit starts nothing (and leaves nothing behind)
    assert protocol.measure_texts(*args, time_limit_s=0, corpus=corpus) == 0
    assert not cells.exists() or not any(cells.rglob("*"))
    assert protocol.measure_texts(*args, stop_after=1, corpus=corpus) == 1
    first = sorted(cells.rglob("*.nc"))
    assert len(first) == 1
    stamp = first[0].stat().st_mtime_ns
    assert protocol.measure_texts(*args, corpus=corpus) == 2  # only the missing cells
    assert first[0].stat().st_mtime_ns == stamp  # the finished cell was not redone
    assert protocol.measure_texts(*args, corpus=corpus) == 0
    assert not [p for p in cells.rglob("*") if p.is_file() and p.suffix != ".nc"]
    resumed, meta = protocol.load_cells(cells, "twin:llama", "first", ["one"], 12, 3)
    assert resumed is not None and resumed.sizes["sample"] == 3 and len(meta) == 3
    fresh = tmp_path / "fresh"
    assert protocol.measure_texts("twin:llama", ["one"], size, fresh, corpus=corpus) == 3
    again, _ = protocol.load_cells(fresh, "twin:llama", "first", ["one"], 12, 3)
    assert again is not None
    np.testing.assert_allclose(again.js.values, resumed.js.values, atol=1e-6)
    np.testing.assert_allclose(again.att_sink.values, resumed.att_sink.values, atol=1e-9)
    # an incomplete set of cells is not analysed
    (cells / "twin:llama" / first[0].name).unlink()
    assert protocol.load_cells(cells, "twin:llama", "first", ["one"], 12, 3)[0] is None


def test_each_rate_of_the_readme_flips_table_sits_under_its_own_metric():
    from case_studies.conventions import study

    results = study.STUDY.results
    table = study.render_tables(results)["flips"].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    fr = pd.read_csv(results / "flip_rates.csv")
    fr = fr[(fr.text == "all") & (fr.pair == "kept/dropped") & (fr.scope == "all")]
    by_label = {study.METRIC_LABELS[m]: m for m in ev.METRICS}
    checked = 0
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] != "MiniLM-L6 (first token)":
            continue
        for name, cell in zip(header[2:], cells[2:], strict=True):
            rate = fr[(fr.model == "minilm-l6") & (fr.sink_key == "first")]
            rate = rate[rate.metric == by_label[name]].flip_rate.iloc[0]
            assert cell.replace("*", "").split()[0] == f"{100 * rate:.0f}%", name
            checked += 1
    assert checked == len(ev.METRICS)


def test_the_readme_summary_reads_every_number_from_the_result_files(tmp_path):
    import shutil

    from case_studies.conventions import study

    assert study.claims_summary(tmp_path).startswith("- No claim table yet")
    results = tmp_path / "results"
    shutil.copytree(study.STUDY.results, results, ignore=shutil.ignore_patterns("figures"))
    before = study.claims_summary(results)
    cl = pd.read_csv(results / "claims.csv")
    outside = cl[cl.claim.str.startswith("verdict flips") & (cl.verdict != "consistent with")]
    for r in outside.itertuples():
        assert f"{r.ours} {r.ci}, texts {r.per_text} ({r.verdict})" in before
    # a model whose entropy rises across depth is named as such, with its own numbers
    ef = pd.read_csv(results / "entropy_fraction.csv")
    mine = (ef.model == "smollm2-135m") & (ef.sink_key == "first")
    ef.loc[mine, ["mean_total_change", "total_ci_low", "total_ci_high"]] = [0.42, 0.40, 0.44]
    ef.to_csv(results / "entropy_fraction.csv", index=False)
    after = study.claims_summary(results)
    assert "SmolLM2-135M +0.42 nats, sink share" in after
    rises = after.split("*rises* across depth in ", 1)[1].split(", so", 1)[0]
    assert "SmolLM2-135M" in rises and "SmolLM2-135M" not in before.split("*rises*", 1)[1]


# --------------------------------------------------------------------------------------------
# the claim table from committed per-text cells (issue 28)


def _claim_cells(n_texts: int = 4, per_text: int = 3) -> xr.Dataset:
    parts = []
    for t in range(n_texts):
        ds = ac.testing.synthetic_rows(n_samples=per_text, n_layers=3, n_heads=3, length=10, seed=t)
        cmp = ac.head_comparisons(ds, ev.CLAIM_METRICS, per_sample=True)
        cell = xr.merge([cmp, protocol.window_attribution(ds, None)])
        labels = [f"t{t}/{i}" for i in range(per_text)]
        parts.append(cell.assign_coords(sample=labels, text=("sample", [f"t{t}"] * per_text)))
    out = xr.concat(parts, dim="sample")
    out.attrs = {"attncoda_kind": "attncoda.head_comparisons"}
    return out


@pytest.mark.slow
def test_text_cells_store_losslessly_and_pool_to_the_cores_numbers(tmp_path):
    cells = _claim_cells()
    tc = ev.text_cells(cells, {"model": "m"})
    path = protocol.text_cells_path(tmp_path, "m", "first")
    protocol.write_text_cells(path, tc)
    back = protocol.read_text_cells(path)
    for m in ev.CLAIM_METRICS:  # the upper triangle holds the whole symmetric matrix
        np.testing.assert_array_equal(back[m].values, tc[m].values.astype(np.float32))
    # pooled over the texts, the per-text cells give the flip rates of all windows
    direct = ac.flip_rates(cells, list(ev.CLAIM_METRICS), by_layer=False, n_boot=0)
    e = ev.claim_evidence(back, {"model": "m"}).set_index(["claim", "stat"])
    for m in ev.CLAIM_METRICS:
        want = float(direct.flip_rate.sel(metric=m, pair="kept/dropped", scope="all"))
        assert e.loc[("flips", m), "value"] == pytest.approx(want, abs=1e-12)
        one = ac.flip_rates(cells.isel(sample=[0, 1, 2]), [m], by_layer=False, n_boot=0)
        assert e.loc[("flips", m), "text_t0"] == pytest.approx(float(one.flip_rate.squeeze()))
    frac, _, _ = ev.entropy(cells, n_boot=0, key={})
    a = frac[frac.text == "all"].set_index("scope")
    for scope in ("first->last", "consecutive, pooled"):
        got = e.loc[("entropy", f"sink share, {scope}"), "value"]
        assert got == pytest.approx(a.loc[scope, "sink_fraction"], rel=1e-9)
    assert e.loc[("entropy", "mean change"), "value"] == pytest.approx(
        a.loc["first->last", "mean_total_change"], rel=1e-9
    )
    # every interval is a texts (or two-stage) interval around its value
    assert set(e.unit) == {"texts", "two-stage"}
    assert (e.ci_low <= e.value + 1e-12).all() and (e.value <= e.ci_high + 1e-12).all()


def test_text_draws_are_every_bootstrap_draw_with_its_probability():
    counts, p = ev.text_draws(3)
    assert len(counts) == 10 and p.sum() == pytest.approx(1)
    rng = np.random.default_rng(0)
    sims = np.array([np.bincount(rng.integers(0, 3, 3), minlength=3) for _ in range(20000)])
    for c, q in zip(counts, p, strict=True):
        assert (sims == c).all(axis=1).mean() == pytest.approx(q, abs=0.01)


def test_two_stage_draws_resample_texts_then_windows():
    texts = np.array(["a"] * 4 + ["b"] * 4)
    draws = ev.two_stage_draws(texts, 300, seed=0)
    only_one = [d for d in draws if len(set(texts[d])) == 1]
    assert 0 < len(only_one) < 300  # a draw may repeat one text (first stage)
    assert any(len(set(d[:4])) < 4 for d in draws)  # and repeats windows within it


@pytest.mark.parametrize(
    ("value", "per_text", "ci", "verdict"),
    [
        (0.30, [0.28, 0.31], (0.28, 0.31), "consistent with"),
        (0.16, [0.15, 0.18], (0.16, 0.16), "borderline"),  # texts straddle 17%
        (0.18, [0.18, 0.19], (0.165, 0.19), "borderline"),  # the interval straddles it
        (0.46, [0.45, 0.49], (0.45, 0.48), "borderline"),  # the upper edge
        (0.10, [0.09, 0.12], (0.09, 0.11), "outside the published range"),
    ],
)
def test_flip_verdict_words(value, per_text, ci, verdict):
    assert ev.flip_verdict(value, per_text, *ci)[0] == verdict


@pytest.mark.slow  # ~14 CPU-s: every claim's bootstrap over the committed cells
def test_the_claim_table_is_recomputed_from_the_committed_cells(tmp_path):
    """Every committed per-text cell file is the one claim_evidence.csv was computed from, and
    recomputing MiniLM's evidence from it gives the committed numbers; a changed cell makes the
    table recompute (and so ``table --check`` fail until the results are rebuilt)."""
    import shutil

    from case_studies.conventions import study

    results = study.STUDY.results
    assert study.stale_evidence(results) == []
    committed = pd.read_csv(results / "claim_evidence.csv")
    path = results / "cells" / "minilm-l6-first.nc"
    assert path.is_file(), "the MiniLM claim cells are committed"
    again = ev.claim_evidence(protocol.read_text_cells(path), {"model": "minilm-l6"})
    mine = committed[committed.model == "minilm-l6"].reset_index(drop=True)
    for col in ("value", "ci_low", "ci_high", *[c for c in again if c.startswith("text_")]):
        np.testing.assert_allclose(mine[col], again[col], rtol=1e-9, atol=1e-12, err_msg=col)
    # a changed cell is noticed: the claims are rebuilt from the cells now there
    copy = tmp_path / "results"
    shutil.copytree(results, copy, ignore=shutil.ignore_patterns("figures", "*.nc"))
    (copy / "cells").mkdir(exist_ok=True)
    tc = protocol.read_text_cells(path)
    tc["js"] = tc["js"] * 1.5 + 0.01 * tc["cosine"]
    protocol.write_text_cells(copy / "cells" / path.name, tc)
    assert study.stale_evidence(copy) == [path.name]
    cl = study.claims_frame(copy)
    old = study.claims_frame(results)
    row = (cl.model == "minilm-l6") & (cl.claim == "verdict flips kept/dropped, js")
    assert (
        cl[row].ours.iloc[0] != old[row].ours.iloc[0] or cl[row].ci.iloc[0] != old[row].ci.iloc[0]
    )


@pytest.mark.slow  # 4.8 and 5.0 CPU-s in two runs of 6 December 2026
def test_claims_only_keeps_the_run_that_built_the_window_tables(tmp_path):
    """``run --claims-only`` rebuilds only the claims, so its manifest names the run that built
    the window tables: the one that wrote the manifest before it, or, after an earlier
    --claims-only, the run that one recorded (a second rebuild once named the first rebuild)."""
    import json
    import shutil

    from case_studies._study import MANIFEST, Provenance, read_manifest
    from case_studies.conventions import study

    copy = tmp_path / "results"
    shutil.copytree(
        study.STUDY.results,
        copy,
        ignore=shutil.ignore_patterns("figures", "*.nc"),
    )
    (copy / "cells").mkdir(exist_ok=True)
    shutil.copy2(study.STUDY.results / "cells" / "minilm-l6-first.nc", copy / "cells")
    committed = read_manifest(copy)
    # the committed manifest names the run that built the tables: itself, or (after a
    # --claims-only rebuild) the one it recorded
    made = committed["settings"].get("window_tables_made_by") or committed
    assert "--claims-only" not in made["command"], "the committed manifest names the table run"
    # a manifest written by a full run: the rebuild records that run
    full = {**read_manifest(copy), "command": "python -m case_studies.conventions run"}
    full["settings"] = {k: v for k, v in full["settings"].items() if k != "window_tables_made_by"}
    (copy / MANIFEST).write_text(json.dumps(full))
    for command in ("first rebuild", "second rebuild"):
        prov = Provenance("conventions", "run", command)
        study.claims_only(copy, prov)
        prov.write(copy)
        kept = read_manifest(copy)["settings"]["window_tables_made_by"]
        assert kept["command"] == full["command"]
        assert kept["git"] == full["git"] and kept["started"] == full["started"]


def test_recomputed_tables_are_compared_number_by_number_and_rendered(tmp_path):
    """``run --compare-with REV``: the recomputed tables against the ones they replace, a row
    per file (identical numbers, the largest differences, changed verdicts, rows that no longer
    line up), and the README's provenance block says so."""
    from case_studies.conventions import study

    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    flips = pd.DataFrame(
        {
            "metric": ["js", "tv", "cosine"],
            "flip_rate": [0.1, 0.2, 0.3],
            "flips": [10, 20, 30],
            "verdict": ["consistent with", "not seen here", "borderline"],
            "capture_s": [1.0, 2.0, 3.0],  # a timing: never compared
        }
    )
    ac.write_table(flips, before / "flip_rates.csv")
    moved = flips.assign(capture_s=[9.0, 9.0, 9.0])
    moved.loc[1, "flip_rate"] = 0.2 + 3e-9
    moved.loc[0, "flips"] = 12
    moved.loc[2, "verdict"] = "consistent with"
    ac.write_table(moved, after / "flip_rates.csv")
    ac.write_table(flips.iloc[:2], before / "pairs.csv")
    ac.write_table(flips, after / "pairs.csv")
    ac.write_table(flips, before / "summary.csv")
    ac.write_table(flips, after / "summary.csv")
    cmp = study.compare_tables(before, after).set_index("file")
    fr = cmp.loc["flip_rates.csv"]
    assert (fr.numbers, fr.identical, fr.text_changed, fr.rows_match) == (6, 4, 1, 1)
    assert fr.max_abs_diff == pytest.approx(3e-9, rel=1e-3)
    assert fr.max_rel_diff == pytest.approx(3e-9 / (0.2 + 3e-9), rel=1e-3)
    assert (fr.counts_changed, fr.max_count_diff) == (1, 2)  # a count apart from the rates
    assert cmp.loc["pairs.csv"].rows_match == 0
    same = cmp.loc["summary.csv"]
    assert (same.identical, same.max_abs_diff, same.text_changed) == (same.numbers, 0.0, 0)

    ac.write_table(cmp.reset_index(), after / study.RECOMPUTED)
    (after / "manifest.json").write_text('{"settings": {"compared_with": "abc123"}}')
    note = "\n".join(study.recomputed_note(after))
    assert "10 of 12 numbers identical" in note and "`abc123`" in note
    assert "1 counts moved, by at most 2" in note and "1.5e-08 relative" in note
    assert "1 text cells" in note and "rows differ" in note
    assert study.recomputed_note(before) == []


def test_a_compare_with_naming_no_commit_is_refused_before_any_work(tmp_path, capsys):
    from case_studies.conventions import study

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        study.main(["run", "--tables-only", "--compare-with", "no-such-rev", "--out", str(out)])
    assert exit_.value.code == 2
    assert "'no-such-rev' names no commit holding" in capsys.readouterr().err
    assert not out.exists()
