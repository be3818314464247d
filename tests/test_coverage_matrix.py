"""The coverage matrix (``tests/coverage_matrix.py``): every architecture captures exactly or is
refused in one line, as ``tests/coverage_expected.json`` says; the docs table is the rendering of
``tests/coverage_results.json`` (regenerate both with ``python -m tests.coverage_matrix --write``)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import coverage_matrix as cm

ARCHS = cm.architectures()
EXPECTED: dict[str, dict[str, str]] = json.loads(cm.EXPECTED.read_text(encoding="utf-8"))


#: architectures whose check costs over 5 CPU-s (measured with ATTNCODA_TEST_CPU, 6 December
#: 2026: falcon_h1 6.3 CPU-s): ``slow``, out of the inner loop
SLOW_ARCHS = {"falcon_h1"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ARCHS else n for n in ARCHS]
)
def test_architecture_captures_exactly_or_is_refused_in_one_line(name):
    expected = EXPECTED.get(name)
    assert expected is not None, f"{name} is in the matrix but not in coverage_expected.json"
    result = cm.check(ARCHS[name])
    assert result.status == expected["status"], f"{name}: {result.status}: {result.note}"
    if "reason" in expected:
        assert re.search(expected["reason"], result.note), f"{name}: {result.note}"
    if result.status == "refused":
        assert "\n" not in result.note.strip()


def test_results_file_holds_every_architecture_as_expected():
    results = cm.load_results()
    assert list(results) == list(ARCHS)
    assert set(EXPECTED) == set(ARCHS)
    for name, r in results.items():
        assert r["status"] == EXPECTED[name]["status"], name
        assert r["kind"] == ARCHS[name].kind, name


def test_docs_tables_are_the_rendering_of_the_results():
    text = cm.DOCS.read_text(encoding="utf-8")
    assert cm.docs_blocks(text) == cm.render(cm.load_results()), (
        "docs/capture.md's coverage tables differ from tests/coverage_results.json; "
        "run `python -m tests.coverage_matrix --write`"
    )


def test_matrix_covers_forty_architectures_of_five_kinds():
    results = cm.load_results()
    captured = {n: r for n, r in results.items() if r["status"] in ("exact", "refused")}
    assert len(captured) >= 40
    for kind in cm.KINDS:
        assert any(r["kind"] == kind and r["status"] == "exact" for r in captured.values()), kind


def test_no_architecture_is_expected_to_fail():
    """Every architecture in the matrix captures exactly or is refused: a known wrong capture
    is a bug to fix (or a refusal to add), never an expectation."""
    failing = sorted(n for n, e in EXPECTED.items() if e["status"] == "fails")
    assert not failing, f"expected to fail: {failing}"
