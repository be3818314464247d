"""The case studies stay tied to their results: README tables equal what the committed result
files give, every results folder has a manifest, and each study's quick mode (on the real offline
models, ``-m real``) reproduces its committed golden results within the stated tolerance."""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from case_studies import STUDIES, _study
from conftest import need


def _study_of(name: str) -> _study.Study:
    return importlib.import_module(f"case_studies.{name}.study").STUDY


@functools.cache
def _rendered(name: str) -> dict[str, str]:
    """The study's tables as its committed results give them (``rendered_tables``), rendered
    once per process: the README test and the docs-pages test compare the same tables, and
    pruning's and ARACH's bootstrap their results (ARACH's 8 CPU-s)."""
    return _study_of(name).rendered_tables()


#: The studies whose tables take seconds to render: their README and docs-pages tests are
#: ``slow`` and share one worker (``xdist_group``), which renders the tables once for both.
COSTLY_TABLES = ("pruning", "arach")


def _tables_param(name: str) -> object:
    if name not in COSTLY_TABLES:
        return name
    return pytest.param(name, marks=[pytest.mark.slow, pytest.mark.xdist_group(f"tables-{name}")])


# --------------------------------------------------------------------------------------------
# the machinery


def test_resumable_studies_share_one_time_limit_in_minutes(monkeypatch, tmp_path) -> None:
    """The three resumable studies take ``--time-limit MINUTES`` (0: only rewrite the outputs);
    ARACH's older ``--stop-after SECONDS``, recorded in committed manifests, still means the
    same limit."""
    import argparse

    seen: dict[str, float | None] = {}
    for name in ("pruning", "arach", "conventions"):
        study = _study_of(name)
        monkeypatch.setattr(
            study, "run", lambda out, args, prov, n=name: seen.update({n: args.time_limit})
        )
        monkeypatch.setattr(_study.Provenance, "write", lambda self, folder: None)
        monkeypatch.setattr(study, "write_readme", lambda: [])
        for argv, minutes in ((["--time-limit", "1.5"], 1.5), (["--time-limit", "0"], 0.0)):
            assert _study.main(study, ["run", *argv, "--out", str(tmp_path)]) == 0
            assert seen.pop(name) == minutes
    assert (
        _study.main(_study_of("arach"), ["run", "--stop-after", "90", "--out", str(tmp_path)]) == 0
    )
    assert seen.pop("arach") == 1.5
    with pytest.raises(SystemExit):  # pruning never had the seconds spelling
        _study.main(_study_of("pruning"), ["run", "--stop-after", "90"])
    for name in ("pruning", "arach"):  # the two studies long enough to split between cores
        study = _study_of(name)
        monkeypatch.setattr(study, "run", lambda out, args, prov: seen.update(shard=args.shard))
        assert _study.main(study, ["run", "--shard", "2/3", "--out", str(tmp_path)]) == 0
        assert seen.pop("shard") == _study.Shard(2, 3)
        assert str(_study.Shard(2, 3)) == "2/3"
        for bad in ("0/2", "3/2", "1/0", "half", "1/2/3", "-1/2"):
            with pytest.raises(SystemExit) as refused:
                _study.main(study, ["run", "--shard", bad, "--out", str(tmp_path)])
            assert refused.value.code == 2
    args = argparse.Namespace(time_limit=None)
    assert _study.seconds_left(args, 0.0) is None
    args.time_limit = 0.5
    import time

    now = time.perf_counter()
    assert 29.0 < _study.seconds_left(args, now) <= 30.0
    assert _study.seconds_left(args, now - 3600) == 0.0


def test_render_replaces_only_marked_blocks_and_detects_stale_ones() -> None:
    text = (
        "intro\n<!-- table: a -->\n| x |\n|---|\n| 1 |\n<!-- /table -->\nmiddle 7\n"
        "<!-- table: b -->\n<!-- /table -->\nend\n"
    )
    tables = {"a": "| x |\n|---|\n| 2 |", "b": "| y |\n|---|\n| 3 |"}
    assert _study.stale_tables(text, tables) == ["a", "b"]
    out = _study.render_readme(text, tables)
    assert "| 2 |" in out and "| 3 |" in out and "| 1 |" not in out
    assert out.startswith("intro\n") and "middle 7\n" in out and out.endswith("end\n")
    assert _study.stale_tables(out, tables) == []
    with pytest.raises(KeyError, match="without a README block"):
        _study.render_readme(text, {**tables, "c": "| z |"})
    with pytest.raises(KeyError, match="has no rendered table"):
        _study.render_readme(text, {"a": tables["a"]})


def test_prose_numbers_are_found_outside_rendered_blocks_code_and_names() -> None:
    text = (
        "# SmolLM2-135M and Qwen2.5-0.5B (issue 28, §2, Michel et al. 2019)\n"
        "Pruning 27 heads costs 318x; the band is 1.2-1.5x, 4,088 tokens, 2.6M parameters.\n"
        "Run `--repeats 11` on fp32 weights at commit 250d09a; [fig](results/k54.png).\n"
        "<!-- table: claims -->\nrendered prose: 985x [871, 1107]\n<!-- /table -->\n"
        "<!-- definitions -->\nwindows of 512 tokens, lr 2e-3\n<!-- /definitions -->\n"
        "```bash\npython -m x --k 54\n```\n"
        "A lone 3 seeds, at k=54 of the protocol.\n"
    )
    assert _study.unrendered_numbers(text) == ["27", "318x", "1.2-1.5x", "4,088", "2.6M", "54"]
    assert _study.unrendered_numbers(text, allowed=["k=54", "27 heads"]) == [
        "318x",
        "1.2-1.5x",
        "4,088",
        "2.6M",
    ]
    assert _study.unrendered_numbers(text, smallest=0)[-2:] == ["3", "54"]
    (where,) = _study.unrendered_numbers("a\nb 7.5x c", where=True)
    assert where.startswith("line 2: 7.5x")
    assert _study.unused_phrases(text, ["k=54", "k=55"]) == ["k=55"]


def test_table_check_fails_on_a_prose_number_that_no_block_renders(tmp_path, monkeypatch) -> None:
    """A number typed into a README's prose fails ``table --check``, like a stale table; the same
    sentence in a rendered block passes."""
    folder = tmp_path / "demo"
    (folder / "results").mkdir(parents=True)

    def tables(_results: Path) -> dict[str, str]:
        return {"claim": "It costs 318x."}

    study = _study.Study("demo", "demo", lambda *a: None, lambda *a: None, tables, ())
    monkeypatch.setattr(_study.Study, "folder", property(lambda self: folder))
    rendered = _study.render_readme(
        "<!-- table: provenance -->\n<!-- /table -->\n<!-- table: claim -->\n<!-- /table -->\n",
        study.rendered_tables(),
    )
    study.readme.write_text(rendered, encoding="utf-8")
    assert _study.main(study, ["table", "--check"]) == 0
    study.readme.write_text(rendered + "It costs 318x.\n", encoding="utf-8")
    assert _study.main(study, ["table", "--check"]) == 1
    (problem,) = study.prose_problems()
    assert "not rendered from results/: line 9: 318x" in problem


def test_the_provenance_table_never_calls_cells_from_a_modified_tree_clean(tmp_path) -> None:
    """A resumable study's manifest is written by the last command, which may have computed
    none of the cells it reports: the cells' own commits and tree states are listed, and those
    not from a clean tree are named one by one."""
    prov = _study.Provenance("demo", "run", "python -m case_studies.demo run")
    prov.git = {"commit": "a" * 40, "dirty": False, "dirty_files": []}
    prov.settings["cell_commits"] = {
        "m": [
            {"commit": "b" * 40, "dirty": False, "n": 5},
            {"commit": "c" * 40, "dirty": True, "n": 2, "cells": ["global/zero/x/k001", "y"]},
        ]
    }
    prov.write(tmp_path)
    table = _study.provenance_table(tmp_path)
    commit_row = next(line for line in table.splitlines() if line.startswith("| commit"))
    assert "not every cell" in commit_row
    (row,) = [line for line in table.splitlines() if "not from a clean tree (m)" in line]
    assert "2 at `cccccccccccc` (uncommitted changes" in row and "`global/zero/x/k001`" in row
    assert "bbbbbbbbbbbb" not in row
    prov.settings["cell_commits"]["m"].pop()
    prov.write(tmp_path)
    assert "(clean tree) |" in _study.provenance_table(tmp_path)


def test_markdown_cells_escape_pipes() -> None:
    assert _study.markdown_table(["a"], [["x|y"]]).splitlines()[-1] == "| x\\|y |"


def test_two_stage_draws_are_those_of_one_call_per_drawn_stratum() -> None:
    """Strata of one size draw the members of all drawn strata in one call: the committed
    intervals were computed with one call per drawn stratum, which must give the same draws."""

    def per_stratum(strata, n_boot, seed):
        labels = np.asarray(strata)
        groups = [np.flatnonzero(labels == s) for s in dict.fromkeys(labels.tolist())]
        rng = np.random.default_rng(seed)
        return [
            np.concatenate([groups[g][rng.integers(0, len(groups[g]), len(groups[g]))] for g in p])
            for p in (rng.integers(0, len(groups), len(groups)) for _ in range(n_boot))
        ]

    for n_strata, size in ((4, 2), (4, 24), (3, 8), (3, 1), (1, 5)):
        strata = np.repeat([f"text{i}" for i in range(n_strata)], size)
        for seed in (0, 4, 43):
            got = _study.two_stage_draws(strata, 50, seed=seed)
            want = per_stratum(strata, 50, seed)
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b), (n_strata, size, seed)
    uneven = ["a", "a", "a", "b", "c", "c"]
    for a, b in zip(_study.two_stage_draws(uneven, 50), per_stratum(uneven, 50, 4), strict=True):
        assert np.array_equal(a, b)


def test_compare_holds_tolerance_and_reports_what_differs(tmp_path: Path) -> None:
    got, gold = tmp_path / "got", tmp_path / "gold"
    got.mkdir()
    gold.mkdir()
    (gold / "t.csv").write_text("name,value,seconds\na,1.0,3\nb,2.0,4\n")
    (got / "t.csv").write_text("name,value,seconds\na,1.00001,9\nb,2.0,9\n")
    (gold / "r.json").write_text(json.dumps({"ppl": 10.0, "items": [1, 2], "wall": 5}))
    (got / "r.json").write_text(json.dumps({"ppl": 10.0005, "items": [1, 2], "wall": 6}))
    spec = [
        _study.Golden("t.csv", rtol=1e-4, ignore=("seconds",)),
        _study.Golden("r.json", rtol=1e-4, ignore=("wall",)),
    ]
    assert _study.compare(got, gold, spec) == []
    (got / "t.csv").write_text("name,value,seconds\na,1.01,9\nb,2.0,9\n")
    (got / "r.json").write_text(json.dumps({"ppl": 11.0, "items": [1, 2], "wall": 6}))
    problems = _study.compare(got, gold, spec)
    assert any("column 'value' differs in 1 rows" in p for p in problems)
    assert any("'ppl' differs" in p for p in problems)
    assert _study.compare(got, gold, [_study.Golden("missing.csv")])[0].startswith("missing.csv")


def test_compare_scales_a_signed_sum_column_to_its_largest_value(tmp_path: Path) -> None:
    """A ``scaled`` column (a gradient: rounding set by its largest terms) is compared to its
    own rtol of the golden column's largest magnitude; other columns keep the file's rtol."""
    got, gold = tmp_path / "got", tmp_path / "gold"
    got.mkdir()
    gold.mkdir()
    (gold / "s.csv").write_text("head,gradient,other\n0,-2.0,1e-3\n1,1e-3,1.0\n")
    (got / "s.csv").write_text("head,gradient,other\n0,-2.0,1e-3\n1,2.5e-3,1.0\n")
    scaled = _study.Golden("s.csv", rtol=1e-4, scaled=(("gradient", 1e-3),))
    assert _study.compare(got, gold, [scaled]) == []  # 1.5e-3 <= 1e-3 * 2.0
    (problem,) = _study.compare(got, gold, [_study.Golden("s.csv", rtol=1e-4)])
    assert "column 'gradient' differs in 1 rows" in problem and "of the column" not in problem
    (got / "s.csv").write_text("head,gradient,other\n0,-2.0,1.2e-3\n1,3.5e-3,1.0\n")
    problems = _study.compare(got, gold, [scaled])
    assert any(
        "'gradient' differs in 1 rows" in p and "rtol 0.001 of the column" in p for p in problems
    )
    assert any("'other' differs in 1 rows" in p and "rtol 0.0001)" in p for p in problems)
    typo = _study.Golden("s.csv", scaled=(("gradeint", 1e-3),))
    assert any("does not have: ['gradeint']" in p for p in _study.compare(got, gold, [typo]))


def test_compare_gives_counted_events_a_slack_of_a_few_near_ties(tmp_path: Path) -> None:
    """A ``slack`` column may move by its events (a count) or events per row (a rate): a row of
    252 triples keeps a tolerance of a few flips, a row of millions no more than rtol gives."""
    got, gold = tmp_path / "got", tmp_path / "gold"
    got.mkdir()
    gold.mkdir()
    (gold / "f.csv").write_text("flips,n,rate\n103,252,0.4087301587\n862556,9732420,0.0886\n")
    (got / "f.csv").write_text("flips,n,rate\n102,252,0.4047619048\n862558,9732420,0.0886\n")
    plain = _study.Golden("f.csv", rtol=1e-3, atol=1e-4)
    assert {p.split(":")[1].split("differs")[0] for p in _study.compare(got, gold, [plain])} == {
        " column 'flips' ",
        " column 'rate' ",
    }
    slack = (("flips", 5.0, ""), ("rate", 5.0, "n"))
    spec = _study.Golden("f.csv", rtol=1e-3, atol=1e-4, slack=slack)
    assert _study.compare(got, gold, [spec]) == []
    (got / "f.csv").write_text("flips,n,rate\n96,252,0.380952381\n862558,9732420,0.0886\n")
    problems = _study.compare(got, gold, [spec])  # 7 flips of 252: more than near-ties
    assert any("'flips' differs in 1 rows" in p for p in problems)
    assert any("'rate' differs in 1 rows" in p for p in problems)
    typo = _study.Golden("f.csv", slack=(("rate", 5.0, "n_triples"),))
    assert any("does not have: ['n_triples']" in p for p in _study.compare(got, gold, [typo]))


def test_compare_takes_cells_empty_in_both_files_as_equal(tmp_path: Path) -> None:
    """An empty text cell (e.g. no heads pruned at k = 0) reads as NaN in both files."""
    got, gold = tmp_path / "got", tmp_path / "gold"
    got.mkdir()
    gold.mkdir()
    (gold / "t.csv").write_text('k,pruned\n0,\n1,"L0:1"\n')
    (got / "t.csv").write_text('k,pruned\n0,\n1,"L0:1"\n')
    assert _study.compare(got, gold, [_study.Golden("t.csv")]) == []
    (got / "t.csv").write_text('k,pruned\n0,"L0:2"\n1,"L0:1"\n')
    problems = _study.compare(got, gold, [_study.Golden("t.csv")])
    assert "column 'pruned' differs in 1 rows" in problems[0]


def test_git_state_keeps_the_first_changed_path_whole_and_is_taken_at_start() -> None:
    assert _study.porcelain_paths(" M attncoda/cli.py\nD  hooks/x.py\n") == [
        "attncoda/cli.py",
        "hooks/x.py",
    ]
    state = _study.git_state()
    prov = _study.Provenance("demo", "quick")
    assert prov.git["commit"] == state["commit"]
    assert prov.as_dict()["git"] is prov.git


def test_a_manifest_records_commit_command_versions_and_hashes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    prov = _study.Provenance("demo", "quick", "python -m case_studies.demo quick")
    digest = prov.tokens("smollm2-135m/emma", torch.tensor([[1, 2, 3]]))
    prov.write(tmp_path)
    m = _study.read_manifest(tmp_path)
    assert m["command"] == "python -m case_studies.demo quick"
    assert len(m["git"]["commit"]) == 40 and isinstance(m["git"]["dirty"], bool)
    assert m["versions"]["torch"] == torch.__version__.split("+")[0] or m["versions"]["torch"]
    assert m["token_sha256"] == {"smollm2-135m/emma": digest}
    assert m["wall_s"] >= 0


# --------------------------------------------------------------------------------------------
# every study


@pytest.mark.parametrize("name", [_tables_param(n) for n in STUDIES])
def test_readme_tables_equal_the_result_files(name: str) -> None:
    """Every number in a study README's tables comes from its results (``table --check``)."""
    study = _study_of(name)
    text = study.readme.read_text(encoding="utf-8")
    tables = study.readme_tables(_rendered(name))
    assert tables, name
    assert _study.stale_tables(text, tables) == [], (
        f"run `python -m case_studies.{name} table` (or rerun the study)"
    )


@pytest.mark.parametrize("name", STUDIES)
def test_readme_prose_states_no_number_the_results_do_not_render(name: str) -> None:
    """A number in a README's prose (outside rendered blocks, code and definitions) could drift
    from its result file; ``table --check`` refuses it, and so does this test."""
    study = _study_of(name)
    assert study.prose_problems() == [], f"render these from {study.results} (see table --check)"


@pytest.mark.parametrize("name", [_tables_param(n) for n in STUDIES])
def test_docs_pages_quote_the_study_as_its_results_give_it(name: str) -> None:
    """The docs pages that show or quote a study (its case-study page; ``docs/conventions.md``)
    hold its rendered blocks as the results give them, and no number in their prose
    (``table --check`` reads them too)."""
    study = _study_of(name)
    assert f"docs/case-studies/{name}.md" in study.docs
    assert study.docs_problems(_rendered(name)) == [], f"run `python -m case_studies.{name} table`"


def test_table_check_reads_the_docs_pages_too(tmp_path, monkeypatch) -> None:
    """A docs page that quotes a study fails ``table --check`` on a stale block or a number in
    its prose, and ``table`` renders its blocks."""
    folder = tmp_path / "demo"
    (folder / "results").mkdir(parents=True)
    page = tmp_path / "page.md"

    def tables(_results: Path) -> dict[str, str]:
        return {"claim": "It costs 318x.", "docs-quote": "31% flip."}

    study = _study.Study(
        "demo", "demo", lambda *a: None, lambda *a: None, tables, (), docs=(str(page),)
    )
    monkeypatch.setattr(_study.Study, "folder", property(lambda self: folder))
    monkeypatch.setattr(_study, "ROOT", tmp_path)
    study.readme.write_text(
        _study.render_readme(
            "<!-- table: provenance -->\n<!-- /table -->\n<!-- table: claim -->\n<!-- /table -->\n",
            study.readme_tables(),
        ),
        encoding="utf-8",
    )
    page.write_text("Intro.\n\n<!-- table: docs-quote -->\n<!-- /table -->\n", encoding="utf-8")
    assert _study.main(study, ["table", "--check"]) == 1  # the block is stale
    assert _study.main(study, ["table"]) == 0
    assert "31% flip." in page.read_text(encoding="utf-8")
    assert _study.main(study, ["table", "--check"]) == 0
    page.write_text(page.read_text(encoding="utf-8") + "A quarter flip: 25%.\n", encoding="utf-8")
    assert _study.main(study, ["table", "--check"]) == 1
    (problem,) = study.docs_problems()
    assert "25%" in problem


@pytest.mark.parametrize("name", STUDIES)
def test_every_results_folder_has_a_manifest(name: str) -> None:
    study = _study_of(name)
    m = _study.read_manifest(study.results)
    assert m.get("study") == name and m.get("git", {}).get("commit"), study.results
    golden = _study.read_manifest(study.golden_dir)
    assert golden.get("mode") == "quick", study.golden_dir
    for g in study.golden:
        assert (study.golden_dir / g.file).is_file(), g.file


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.xdist_group(f"quick-{n}")) for n in STUDIES]
)
def test_quick_mode_reproduces_the_golden_results(name: str, study_quick) -> None:
    """CI reruns each study's quick mode on the real offline models: a moved number fails.
    (Each is one test, so pytest-xdist runs the four side by side; the tests that read a quick
    mode's other outputs share its run.)"""
    need(*_study_of(name).assets)
    res = study_quick(name).result
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "reproduces the golden results" in res.stdout


#: Sentences that once said more than their numbers (issue #50), by page: each was rewritten or
#: is now rendered from the results, and none may come back.
OVERCLAIMS = {
    "case_studies/pruning/README.md": (
        "early layers' sink heads does",
        "residual stream",
        "each control bounds it",
        "run reproduced the published claim",
        "did not reproduce the hundredfold",
        "ablation: reproduced",
    ),
    "case_studies/conventions/README.md": (
        "the entropy does not change across depth",
        "far less than",
        "(Pythia across training)",
    ),
    "case_studies/arach/README.md": (
        "46.89",
        "50.42",
        "37.33",
        "33.11",
        "therefore reproduced as an attention statistic",
        "of them practically nil",
        "**No choice reverses the verdict**:",
        "whose load left the run",
    ),
    "case_studies/rpa/README.md": (
        "only the schedules' sign agrees",
        "control shows the gain comes from",
    ),
    "docs/conventions.md": ("a quarter of cosine",),
}


@pytest.mark.parametrize("page", sorted(OVERCLAIMS))
def test_no_sentence_says_more_than_its_numbers_again(page: str) -> None:
    text = " ".join((_study.ROOT / page).read_text(encoding="utf-8").split())
    back = [s for s in OVERCLAIMS[page] if s in text]
    assert not back, f"{page}: {back} (issue #50: make the sentence as strong as its numbers)"


# --------------------------------------------------------------------------------------------
# one rounding rule (issue #50)


def test_the_rounding_rule_sends_exact_halves_away_from_zero_and_agrees_elsewhere() -> None:
    from case_studies._study import fixed, scientific, significant

    # exact halves, whatever their binary form (100 * 0.1075 is 10.749999999999998)
    assert [fixed(x, 1) for x in (-5.25, -10.75, 100 * 0.1075, 0.45)] == [
        "-5.3",
        "-10.8",
        "10.8",
        "0.5",
    ]
    assert [significant(x, 2) for x in (0.285, 236.5, 1.25e-7)] == ["0.29", "240", "0.00000013"]
    assert [scientific(x, 1) for x in (0.00925, -1.25e-3, 9.96e-5)] == [
        "9.3e-03",
        "-1.3e-03",
        "1.0e-04",
    ]
    assert fixed(-0.001, 2) == "0.00" and fixed(-0.001, 2, plus=True) == "+0.00"
    assert fixed(1234567.5, 0, thousands=True) == "1,234,568"
    # away from halves the rule writes what Python's formats write
    rng = np.random.default_rng(0)
    for x in rng.standard_normal(300) * 10.0 ** rng.integers(-6, 7, 300):
        x = float(x)
        assert fixed(x, 3) == f"{x:.3f}".replace("-0.000", "0.000"), x
        assert fixed(x, 0, thousands=True, plus=True) in (f"{x:+,.0f}", "+0"), x
        assert scientific(x, 2) == f"{x:.2e}", x
        assert significant(x, 6) == np.format_float_positional(float(f"{x:.6g}"), trim="-"), x


#: Functions whose precision formats are not rendered into a README or docs page: the rule's
#: own decimal conversion, progress lines kept in a variable, and a data file's column.
_NOT_RENDERED = {
    ("_study.py", "_decimal"),
    ("arach/claims.py", "run_claims"),
    ("arach/study.py", "stamp"),
    ("rpa/run.py", "train_one"),
    ("rpa/run.py", "write_runs_table"),
    ("rpa/study.py", "train_all"),
}
_LOGS = {"print", "say", "log", "progress"}


def _precision_formats(path: Path) -> list[tuple[str, int, str]]:
    """``(function, line, spec)`` of every f-string format with a precision (``.2f``, ``.1e``,
    ``.0%``, ``.3g``) outside a call of print / say / log / progress."""
    import ast
    import re

    found = []

    def visit(node: ast.AST, func: str, in_log: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func = node.name
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            in_log = in_log or name in _LOGS
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None and not in_log:
            spec = "".join(
                str(v.value) for v in node.format_spec.values if isinstance(v, ast.Constant)
            )
            if re.search(r"\.\d+[eEfFgG%]", spec):
                found.append((func, node.lineno, spec))
        for child in ast.iter_child_nodes(node):
            visit(child, func, in_log)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>", False)
    return found


def test_the_studies_render_numbers_only_through_the_rounding_rule(tmp_path: Path) -> None:
    """An f-string's ``.2f`` rounds the binary value (−10.75 is −10.7499… and shows as −10.7):
    a number a study renders goes through fixed / significant / scientific instead."""
    root = _study.ROOT / "case_studies"
    bad = [
        f"{path.relative_to(root)}:{line} in {func}: {spec}"
        for path in sorted(root.rglob("*.py"))
        for func, line, spec in _precision_formats(path)
        if (path.relative_to(root).as_posix(), func) not in _NOT_RENDERED
    ]
    assert not bad, bad
    # the scan sees a format in a renderer, and none in a progress line
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def row(x):\n    say(f"{x:.1f}")\n    return [f"{x:.2f}", f"{x:,}", f"{x:+.0%}"]\n',
        encoding="utf-8",
    )
    assert _precision_formats(probe) == [("row", 3, ".2f"), ("row", 3, "+.0%")]
