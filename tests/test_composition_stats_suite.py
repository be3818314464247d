"""composition-stats' own unit tests, run on attncoda's functions.

``tests/vendor/composition_stats_test_composition.py`` is composition-stats 2.0.0's test module,
copied verbatim (BSD 3-Clause, Copyright (c) 2021 Nicolas Tessore; derived from scikit-bio's
tests, Copyright (c) 2013-- scikit-bio development team, Modified BSD; both licences are in
``tests/vendor/``). Its ``CompositionTests`` look their functions up in their module's namespace
at call time, so binding attncoda's functions there (``monkeypatch``) runs their assertions,
unmodified, on attncoda. Every test the unittest loader finds runs here; the ones that fail on
purpose are listed in ``DIFFERENCES`` with the reason (each is documented in the function's
docstring and in docs/gotchas.md) and marked ``xfail(strict=True)``, so one that starts passing
fails the suite.
"""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

import numpy as np
import pytest

import attncoda as ac
from conftest import vendored_module

pytest.importorskip("composition_stats", reason="the vendored tests import composition_stats")

VENDORED = Path(__file__).parent / "vendor" / "composition_stats_test_composition.py"

#: composition-stats name -> attncoda function bound in its place
BOUND = {
    "closure": ac.closure,
    "clr": ac.clr,
    "clr_inv": ac.clr_inv,
    "alr": ac.alr,
    "alr_inv": ac.alr_inv,
    "perturb": ac.perturb,
    "perturb_inv": ac.perturb_inv,
    "power": ac.power,
    "inner": ac.inner,
    "ilr": ac.ilr,
    "ilr_inv": ac.ilr_inv,
    "sbp_basis": ac.sbp_basis,
    "multiplicative_replacement": ac.multi_replace,
}
#: composition-stats names attncoda has no counterpart for: their tests use composition-stats'
#: own function on attncoda's closure (test_center, test_centralize, test_sbp_basis_gram_schmidt)
NOT_OURS = {"center", "centralize", "_gram_schmidt_basis"}

_CLOSURE = (
    "closure accepts any leading shape (captures are sample x layer x head x query x key); "
    "composition-stats refuses ndim > 2 (its 'bad2' case)"
)
_ILR_DEFAULT = (
    "the default ilr basis is the pivot basis (first balance: sink vs content), not "
    "composition-stats' Gram-Schmidt basis; both orthonormal, so distances agree"
)
_BASIS_FORM = (
    "ilr bases are clr vectors (rows summing to 0, as in scikit-bio) and sbp_basis returns "
    "them so; composition-stats takes and returns bases as compositions (clr_inv of ours)"
)
#: vendored test -> why it fails on attncoda's functions (a documented, deliberate difference)
DIFFERENCES = {
    "test_closure": _CLOSURE,
    "test_ilr": _ILR_DEFAULT,
    "test_ilr_inv": _ILR_DEFAULT,
    "test_ilr_basis": _BASIS_FORM,
    "test_ilr_basis_isomorphism": _BASIS_FORM,
    "test_ilr_inv_basis": _BASIS_FORM,
    "test_sbp_basis_elementwise": _BASIS_FORM,
    "test_sbp_basis_gram_schmidt": _BASIS_FORM,
    # its basis clr([0.80442968, 0.19557032]) is, in attncoda's form, an orthonormal basis of
    # two parts given to 8 decimals (B B^T off by ~2e-8): accepted since issue 27, as
    # scikit-bio accepts it; composition-stats refuses it as a composition
    "test_ilr_inv_basis_one_dimension_error": _BASIS_FORM,
}


def _vendored_module():
    return vendored_module("composition_stats_test_composition.py", "_composition_stats_tests")


THEIRS = _vendored_module()
TESTS = unittest.TestLoader().getTestCaseNames(THEIRS.CompositionTests)


def _run(name: str, monkeypatch: pytest.MonkeyPatch, **bindings) -> None:
    for attr, fn in {**BOUND, **bindings}.items():
        monkeypatch.setattr(THEIRS, attr, fn)
    THEIRS.CompositionTests(name).debug()  # setUp, the test, tearDown; failures raise


def test_every_imported_name_is_bound_or_listed():
    """A name the vendored module imports from composition_stats is either replaced by
    attncoda's function or named in NOT_OURS: nothing runs composition-stats' code unnoticed."""
    tree = ast.parse(VENDORED.read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "composition_stats"
        for alias in node.names
    }
    assert imported == set(BOUND) | NOT_OURS
    assert set(DIFFERENCES) <= set(TESTS)
    assert len(TESTS) == 22  # a new vendored copy with other tests must be reviewed here


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=DIFFERENCES[n]))
        if n in DIFFERENCES
        else n
        for n in TESTS
    ],
)
def test_composition_stats_suite(name, monkeypatch):
    _run(name, monkeypatch)


def test_closure_passes_once_limited_to_composition_stats_two_dimensions(monkeypatch):
    """test_closure fails only on the shape extension: with the 2-D limit put in front of
    attncoda's closure, every other assertion of it passes."""

    def closure_up_to_2d(x, *args, **kwargs):
        if np.ndim(x) > 2:
            raise ValueError("composition-stats takes at most 2 dimensions")
        return ac.closure(x, *args, **kwargs)

    _run("test_closure", monkeypatch, closure=closure_up_to_2d)
    # and attncoda's closure of that 3-D input is the closure of its one row, shape kept
    bad2 = np.array([[[1, 2, 3, 0, 5]]])
    np.testing.assert_allclose(ac.closure(bad2), bad2 / 11)
