"""The ARACH study driver (case_studies/arach): its plan refuses bad sizes, and its command line
(``python -m case_studies.arach.run``, which replaced ``attncoda audit arach``) refuses bad
options in one line, before a model loads or a file is written."""

from __future__ import annotations

import dataclasses
import math

import pytest

import attncoda as ac

pytest.importorskip("torch")
from case_studies.arach import run as arach_run
from case_studies.arach.study import EvalPlan


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the study loads a model (the error must come first)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad option was refused")

    from attncoda.hooks import assets

    monkeypatch.setattr(assets, "load_model", refuse)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"ppl_tokens": -1}, "ppl_tokens must be >= 2"),
        ({"ppl_tokens": 100}, "at least the longest context"),
        ({"cloze_n": 0}, "cloze_n must be >= 1"),
        ({"audit_samples": 0}, "audit_samples must be >= 1"),
        ({"contexts": (4,), "sweep_ppl_context": 4}, "contexts must be >= 8"),
        ({"offsets": (math.nan,)}, "offsets must be a finite number"),
        ({"offsets": (math.inf,)}, "offsets must be finite or -inf"),
        ({"sweep_ppl_context": 512}, "must be one of contexts"),
        ({"ablations": ("hub_embedding",)}, "an ablation is 'option=value'"),
    ],
)
def test_eval_plan_refuses_bad_sizes(changes, needle):
    with pytest.raises(ac.InputError, match=needle):
        dataclasses.replace(EvalPlan(), **changes)


def test_eval_plan_quick_is_a_valid_small_plan():
    quick = EvalPlan.quick()
    assert quick.contexts == (128,) and quick.offsets == (-0.5,) and quick.cloze_n == 6
    assert EvalPlan().offsets == (0.0, -0.25, -0.5, -1.0, -2.0, -4.0)


def _one_line_error(err: str, needle: str) -> None:
    assert err.startswith(f"{arach_run.PROG}: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert needle in err, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--threads", "0"], "threads must be from 1 to"),
        (["--threads", "100000"], "threads must be from 1 to"),
        (["--ppl-tokens=-1"], "ppl_tokens must be >= 2"),
        (["--ppl-tokens", "100"], "at least the longest context"),
        (["--cloze-items", "0"], "cloze_n must be >= 1"),
        (["--audit-samples", "0"], "audit_samples must be >= 1"),
        (["--contexts", "4"], "contexts must be >= 8"),
        (["--offsets", "nan"], "offsets must be a finite number"),
        (["--offsets", ","], "--offsets is empty"),
        (["--out", "/proc/attncoda-test"], "cannot be written"),
    ],
)
def test_run_options_are_refused_before_the_model_loads(
    extra, needle, tmp_path, capsys, no_model_loads
):
    argv = ["run", "smollm2-135m", "--out", str(tmp_path / "a"), *extra]
    assert arach_run.main(argv) == 2
    _one_line_error(capsys.readouterr().err, needle)
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_a_model_that_is_not_a_causal_lm(tmp_path, capsys, no_model_loads):
    assert arach_run.main(["run", "minilm-l6", "--quick", "--out", str(tmp_path / "a")]) == 2
    _one_line_error(capsys.readouterr().err, "is not a causal LM")
    assert list(tmp_path.iterdir()) == []


def test_parser_and_usage_errors(capsys):
    assert arach_run.main(["run", "smollm2-135m", "--offsets", "a,b", "--quick"]) == 2
    assert "not a comma-separated list of numbers" in capsys.readouterr().err
    assert arach_run.main(["nothing"]) == 2
    assert arach_run.main(["run", "--help"]) == 0
    assert "--hub-embedding" in capsys.readouterr().out


def test_the_command_line_has_no_audit_arach_any_more(capsys):
    from attncoda.cli import main

    assert main(["audit", "arach", "smollm2-135m", "--quick"]) == 2
    assert "invalid choice: 'arach'" in capsys.readouterr().err


def _golden_copy(tmp_path, change):
    """A copy of the committed golden files with ``change(frame)`` applied to claims.csv and
    ppl.csv (``got``), and the golden folder itself."""
    import shutil

    import pandas as pd

    from case_studies.arach.study import STUDY

    got = tmp_path / "got"
    shutil.copytree(STUDY.golden_dir, got)
    for name in ("claims.csv", "ppl.csv"):
        frame = pd.read_csv(got / name)
        change(frame)
        frame.to_csv(got / name, index=False, float_format="%.17g")
    return got, STUDY.golden_dir


def test_golden_differences_tolerate_cancellation_but_not_a_real_change(tmp_path):
    """Issue #28: another machine rounds the two perplexities ~1e-5 apart, which moves ARACH −
    plain by more than 1e-4 of itself; the derived columns' tolerance scales to the operands,
    so that passes, while a change of 1e-3 in the operands, or of the difference alone, fails."""
    from case_studies._study import Golden, compare
    from case_studies.arach.study import GOLDEN

    spec = [g for g in GOLDEN if g.file in ("claims.csv", "ppl.csv")]
    plain_spec = [Golden(g.file, rtol=g.rtol, atol=g.atol) for g in spec]

    def rounding(frame):  # the operands move by 1e-5 relative, in opposite directions
        ppl = frame["measure"].str.startswith("ppl") if "measure" in frame else frame["off"] > 1
        shift = (frame["off"] + frame["on"]) * 1e-5
        frame.loc[ppl, "off"] = frame["off"] * (1 + 1e-5)
        frame.loc[ppl, "on"] = frame["on"] * (1 - 1e-5)
        for col in ("diff", "low", "high"):
            frame.loc[ppl, col] = frame[col] - shift

    got, gold = _golden_copy(tmp_path / "a", rounding)
    assert compare(got, gold, spec) == []
    assert compare(got, gold, plain_spec) != []  # what the derived tolerance is for

    def real(frame):  # ARACH's perplexity changes by 1e-3 of itself
        frame["on"] = frame["on"] * (1 + 1e-3)
        frame["diff"] = frame["on"] - frame["off"]

    got, gold = _golden_copy(tmp_path / "b", real)
    problems = compare(got, gold, spec)
    assert any("'on'" in p for p in problems) and any("'diff'" in p for p in problems)

    def interval_only(frame):  # only an interval end moves, by 1e-3 of the operands
        frame["high"] = frame["high"] + (frame["off"] + frame["on"]) * 1e-3

    got, gold = _golden_copy(tmp_path / "c", interval_only)
    problems = compare(got, gold, spec)
    assert problems and all("'high'" in p for p in problems)
