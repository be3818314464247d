"""scikit-bio's own composition unit tests, run on attncoda's functions.

``tests/vendor/skbio_test_composition_base.py`` is scikit-bio 0.7.4's
``skbio/stats/composition/tests/test_base.py``, copied verbatim from the installed wheel
(Copyright (c) 2013-- scikit-bio development team, Modified BSD; the licence is
``tests/vendor/LICENSE-scikit-bio.txt``). As for composition-stats
(``tests/test_composition_stats_suite.py``), its ``CompositionTests`` look their functions up in
their module's namespace at call time, so binding attncoda's functions there (``monkeypatch``)
runs scikit-bio's assertions, unmodified, on attncoda: its exact error messages included where
it checks them. The tests that fail on purpose are listed in ``DIFFERENCES`` with the reason
(documented in the function's docstring or docs/gotchas.md) and marked ``xfail(strict=True)``,
so one that starts passing fails the suite.

The module's other classes test functions attncoda does not have (``tree_basis``, ``vlr``,
``pairwise_vlr``, ``rclr``): they would test scikit-bio, not attncoda, and are not run
(``test_every_test_case_is_run_or_listed`` keeps that list exact).
"""

from __future__ import annotations

import ast
import contextlib
import unittest
from pathlib import Path

import numpy as np
import pytest

import attncoda as ac
from conftest import vendored_module

pytest.importorskip("skbio", reason="the vendored tests import scikit-bio")
pytest.importorskip("pandas", reason="the vendored tests import pandas")

VENDORED = Path(__file__).parent / "vendor" / "skbio_test_composition_base.py"

#: scikit-bio name -> attncoda function bound in its place
BOUND = {
    "closure": ac.closure,
    "multi_replace": ac.multi_replace,
    "perturb": ac.perturb,
    "perturb_inv": ac.perturb_inv,
    "power": ac.power,
    "inner": ac.inner,
    "clr": ac.clr,
    "clr_inv": ac.clr_inv,
    "ilr": ac.ilr,
    "ilr_inv": ac.ilr_inv,
    "alr": ac.alr,
    "alr_inv": ac.alr_inv,
    "sbp_basis": ac.sbp_basis,
}
#: scikit-bio names attncoda has no counterpart for: tests that use them run scikit-bio's own
#: function (test_centralize on attncoda's closure; test_ilr_backends' expected values)
NOT_OURS = {
    "centralize",
    "rclr",
    "rclr_inv",
    "vlr",
    "pairwise_vlr",
    "tree_basis",
    "_check_composition",
    "_check_basis",
    "_gram_schmidt_basis",
    "_rclr_inv",
}
#: test classes of the vendored module that test only functions attncoda does not have
NOT_RUN = {"TestTreeBasis", "VLRTests", "RCLRTests"}
#: CompositionTests that call no attncoda function (scikit-bio's private validators)
ONLY_THEIRS = {"test_check_composition", "test_check_basis"}

_MESSAGES = (
    "scikit-bio compares its exact error messages ('Input matrix must have strictly positive "
    "components.', 'Invalid index 5 on dimension 1.'); attncoda raises the same classes "
    "(ValueError, IndexError) with its own one-line messages that say what to do"
)
_ILR_DEFAULT = (
    "the default ilr basis is the pivot basis (first balance: sink vs content), not "
    "scikit-bio's Gram-Schmidt basis; both orthonormal, so distances and inner products agree"
)
_NOT_CENTRED = (
    "clr_inv of rows that do not sum to 0 warns in scikit-bio; attncoda's clr_inv is the "
    "softmax, defined for any real rows (logits), so it computes without a warning"
)
_ONE_PART = (
    "alr_inv of rows of 0 coordinates is the composition of one part, [1] (the simplex of one "
    "part is a point; ilr_inv does the same); scikit-bio refuses the empty axis"
)
#: vendored test -> why it fails on attncoda's functions (a documented, deliberate difference)
DIFFERENCES: dict[str, str] = {
    "test_closure": _MESSAGES,
    "test_alr": _MESSAGES,
    "test_alr_inv": _MESSAGES,
    "test_clr": _MESSAGES,
    "test_ilr_errors": _MESSAGES,
    "test_multi_replace": _MESSAGES,
    "test_clr_inv": _NOT_CENTRED,
    "test_ilr": _ILR_DEFAULT,
    "test_ilr_inv": _ILR_DEFAULT,
    "test_ilr_backends": _ILR_DEFAULT,
    "test_ilr_inv_backends": _ILR_DEFAULT,
}
#: scikit-bio's messages, compared by its tests word for word (see _MESSAGES)
THEIR_MESSAGES = {
    "Input matrix must have strictly positive components.",
    "Input matrix cannot have negative components.",
    "Input matrix cannot have compositions without observed components.",
    "Invalid index 5 on dimension 1.",
    "Invalid index -5 on dimension 1.",
    "Invalid index 6 on dimension 1.",
    "Invalid index -6 on dimension 1.",
    "Dimension 1 of the input matrix has zero length.",
    "Number of basis 1 not match to the subspace dim 2.",
    "Basis needs to be a 2-D matrix, not a 1-D matrix.",
    "Consider using a smaller `delta`.",
}


def _vendored_module():
    return vendored_module("skbio_test_composition_base.py", "_skbio_composition_tests")


THEIRS = _vendored_module()
TESTS = [
    n
    for n in unittest.TestLoader().getTestCaseNames(THEIRS.CompositionTests)
    if n not in ONLY_THEIRS
]


def _run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for attr, fn in BOUND.items():
        monkeypatch.setattr(THEIRS, attr, fn)
    THEIRS.CompositionTests(name).debug()  # setUp, the test, tearDown; failures raise


def test_every_imported_name_is_bound_or_listed():
    """A name the vendored module imports from scikit-bio's composition module is either
    replaced by attncoda's function or named in NOT_OURS: nothing runs scikit-bio's code
    unnoticed in place of attncoda's."""
    tree = ast.parse(VENDORED.read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module in ("skbio.stats.composition", "skbio.stats.composition._base")
        for alias in node.names
    }
    assert imported == set(BOUND) | NOT_OURS
    assert set(DIFFERENCES) <= set(TESTS)


def test_every_test_case_is_run_or_listed():
    classes = {
        name
        for name, obj in vars(THEIRS).items()
        if isinstance(obj, type) and issubclass(obj, unittest.TestCase)
    }
    assert classes == {"CompositionTests", "TestCase"} | NOT_RUN  # TestCase: imported
    names = unittest.TestLoader().getTestCaseNames(THEIRS.CompositionTests)
    assert ONLY_THEIRS <= set(names)
    assert len(names) == 29  # a new vendored copy with other tests must be reviewed here


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=DIFFERENCES[n])
        )
        if n in DIFFERENCES
        else n
        for n in TESTS
    ],
)
def test_skbio_suite(name, monkeypatch):
    _run(name, monkeypatch)


def _their_wording_not_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the vendored tests check scikit-bio's error classes but not its wording, and not
    its warning for clr_inv of non-centred rows: every other assertion still runs."""
    case = THEIRS.CompositionTests
    equal, regex = case.assertEqual, case.assertRaisesRegex

    def assert_equal(self, first, second, msg=None):
        if isinstance(second, str) and second in THEIR_MESSAGES:
            assert isinstance(first, str) and first and "\n" not in first  # ours: one line
            return None
        return equal(self, first, second, msg)

    def assert_raises_regex(self, exception, expected_regex, *args, **kwargs):
        if expected_regex in THEIR_MESSAGES:
            return self.assertRaises(exception, *args, **kwargs)
        return regex(self, exception, expected_regex, *args, **kwargs)

    def assert_warns(self, warning, *args, **kwargs):
        assert warning is UserWarning and not args  # only clr_inv's non-centred rows warn
        return contextlib.nullcontext()

    monkeypatch.setattr(case, "assertEqual", assert_equal)
    monkeypatch.setattr(case, "assertRaisesRegex", assert_raises_regex)
    monkeypatch.setattr(case, "assertWarns", assert_warns)


#: tests that still fail with scikit-bio's wording not compared, and why
DIFFERENCES_BEYOND_WORDING = {"test_alr_inv": _ONE_PART}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(
                strict=True, raises=AssertionError, reason=DIFFERENCES_BEYOND_WORDING[n]
            ),
        )
        if n in DIFFERENCES_BEYOND_WORDING
        else n
        for n in sorted(n for n, why in DIFFERENCES.items() if why != _ILR_DEFAULT)
    ],
)
def test_skbio_suite_but_their_wording(name, monkeypatch):
    """The tests that fail only on scikit-bio's wording (or its clr_inv warning) pass every
    other assertion: the same error classes (IndexError for an index out of range, numpy's
    AxisError for an axis, ValueError otherwise) and the same numbers."""
    _their_wording_not_compared(monkeypatch)
    _run(name, monkeypatch)


@pytest.mark.parametrize("name", ["test_ilr", "test_ilr_inv"])
def test_skbio_ilr_tests_with_their_basis(name, monkeypatch):
    """The ilr tests fail only on the default basis: given scikit-bio's Gram-Schmidt basis
    (in clr form, as attncoda takes bases), attncoda's ilr and ilr_inv pass them."""

    def with_their_basis(fn, extra):
        def call(x, basis=None, *args, **kwargs):
            if basis is None:
                basis = THEIRS._gram_schmidt_basis(np.shape(x)[-1] + extra)
            return fn(x, basis, *args, **kwargs)

        return call

    for attr, fn in BOUND.items():
        monkeypatch.setattr(THEIRS, attr, fn)
    monkeypatch.setattr(THEIRS, "ilr", with_their_basis(ac.ilr, 0))
    monkeypatch.setattr(THEIRS, "ilr_inv", with_their_basis(ac.ilr_inv, 1))
    THEIRS.CompositionTests(name).debug()
