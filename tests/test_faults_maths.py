"""Hostile-but-fair input to the maths core: every call gives the right answer or one refusal.

Each refusal must be an :class:`attncoda.AttncodaError` (and a ``ValueError``) of the expected
class, in one line; never an internal ``AttributeError``/``IndexError``, a numpy broadcasting
error, a RuntimeWarning (turned into an error for attncoda by pyproject.toml) or a silently
wrong number. The accepted cases are checked against a direct computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import ilr_bases, sbp_matrices

import attncoda as ac
from attncoda import _bases
from conftest import requires_skbio, requires_torch

X3 = np.array([0.2, 0.3, 0.5])
X = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
ALL_HIDDEN = np.zeros((2, 3), bool)
NOT_ORTHONORMAL = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])  # the reported basis
NOT_CLR = np.eye(3)[:2]  # orthonormal rows, but they do not sum to 0
TOL64 = _bases.basis_tolerance(np.dtype(np.float64))  # sqrt(eps), at least 1e-6 (scikit-bio's)
TOL32 = math.sqrt(np.finfo(np.float32).eps)


def _torch():
    import torch

    return torch


def _t(a, **kw):
    return _torch().tensor(np.asarray(a), **kw)


def _refused(fn, error, match):
    with pytest.raises(error, match=match) as info:
        fn()
    err = info.value
    assert isinstance(err, ac.AttncodaError) and isinstance(err, ValueError)
    assert "\n" not in str(err), "an error message must be one line"
    return err


# ------------------------------------------------------------------------ refusals, one per case

CE, SM, NF, TF = ac.CompositionError, ac.ShapeMismatchError, ac.NonFiniteError, ac.TooFewPartsError
ZP, NP, NC, DM = ac.ZeroPartError, ac.NegativePartError, ac.NotClosedError, ac.DeviceMismatchError

# (case, error class, message pattern, call)
REFUSALS = [
    # closure / dtype / shape rules shared by every function
    ("closure-bool-data", CE, "boolean", lambda: ac.closure(np.array([True, False, True]))),
    ("closure-strings", CE, "real numbers", lambda: ac.closure(np.array(["0.5", "0.5"]))),
    ("closure-object", CE, "object", lambda: ac.closure(np.array([0.2, 0.8], dtype=object))),
    ("closure-complex", CE, "complex", lambda: ac.closure(np.array([1 + 1j, 2]))),
    (
        "closure-dates",
        CE,
        "datetime",
        lambda: ac.closure(np.array(["2020-01-01"], dtype="datetime64[D]")),
    ),
    ("closure-None", CE, "object", lambda: ac.closure(None)),
    ("closure-ragged", SM, "rectangular", lambda: ac.closure([[0.5, 0.5], [1.0]])),
    ("closure-0d", SM, "scalar", lambda: ac.closure(3.0)),
    ("closure-nan", NF, "NaN", lambda: ac.closure([0.5, np.nan])),
    ("closure-inf", NF, "infinite", lambda: ac.closure([0.5, np.inf])),
    ("closure-negative", NP, "negative", lambda: ac.closure([0.5, -0.1])),
    ("closure-zero-row", ZP, "no positive", lambda: ac.closure([[0.0, 0.0], [1.0, 1.0]])),
    ("closure-no-parts", ZP, "no parts", lambda: ac.closure(np.empty((2, 0)))),
    ("closure-mask-hides-all", ZP, "hidden by mask", lambda: ac.closure(X, mask=ALL_HIDDEN)),
    ("mask-int01", CE, "boolean", lambda: ac.closure(X, mask=np.array([[1, 1, 0], [1, 1, 1]]))),
    ("mask-float", CE, "mask == 0", lambda: ac.closure(X, mask=np.ones((2, 3)))),
    ("mask-strings", CE, "boolean", lambda: ac.closure(X, mask=["yes", "no", "yes"])),
    ("mask-wrong-shape", SM, "broadcast", lambda: ac.closure(X, mask=np.ones((3, 3), bool))),
    ("mask-too-many-dims", SM, "dims", lambda: ac.closure(X, mask=np.ones((1, 2, 3), bool))),
    ("mask-ragged", SM, "rectangular", lambda: ac.closure(X, mask=[[True, False], [True]])),
    ("axis-bool", SM, "integer", lambda: ac.closure(X, axis=True)),
    ("axis-float", SM, "integer", lambda: ac.closure(X, axis=1.0)),
    ("axis-str", SM, "integer", lambda: ac.closure(X, axis="0")),
    ("axis-out-of-range", SM, "out of range", lambda: ac.closure(X, axis=2)),
    ("axis-negative-out-of-range", SM, "out of range", lambda: ac.clr(X, axis=-3)),
    # multi_replace
    ("delta-negative", CE, r"\(0, 1\)", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=-0.1)),
    ("delta-zero", CE, r"\(0, 1\)", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=0)),
    ("delta-one", CE, r"\(0, 1\)", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=1.0)),
    ("delta-big-no-zeros", CE, r"\(0, 1\)", lambda: ac.multi_replace([0.5, 0.5], delta=5.0)),
    ("delta-nan", NF, "finite", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=np.nan)),
    ("delta-inf", NF, "finite", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=np.inf)),
    ("delta-str", CE, "real number", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta="a")),
    ("delta-list", CE, "real number", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=[0.1])),
    ("delta-bool", CE, "real number", lambda: ac.multi_replace([0.5, 0.5, 0.0], delta=True)),
    ("delta-k-zeros", CE, "too large", lambda: ac.multi_replace([1.0, 0.0, 0.0, 0.0], delta=0.4)),
    # add_learned_sink
    ("learned-sink-sum-above-1", NC, "above 1", lambda: ac.add_learned_sink([0.9, 0.2])),
    ("learned-sink-nan", NF, "NaN", lambda: ac.add_learned_sink([np.nan, 0.2])),
    ("learned-sink-0d", SM, "scalar", lambda: ac.add_learned_sink(0.5)),
    ("learned-sink-bool", CE, "boolean", lambda: ac.add_learned_sink(np.array([True, False]))),
    # clr / clr_inv
    ("clr-zero-part", ZP, "multi_replace", lambda: ac.clr([0.5, 0.0, 0.5])),
    ("clr-one-part", TF, "at least 2", lambda: ac.clr([1.0])),
    ("clr-no-parts", TF, "at least 2", lambda: ac.clr(np.empty((2, 0)))),
    ("clr-mask-hides-all", TF, "visible", lambda: ac.clr(X, mask=ALL_HIDDEN)),
    ("clr-logits-inf", NF, r"\+inf", lambda: ac.clr([1.0, np.inf], from_logits=True)),
    ("clr-logits-nan", NF, "NaN", lambda: ac.clr([1.0, np.nan], from_logits=True)),
    ("clr_inv-nan", NF, "NaN", lambda: ac.clr_inv([np.nan, 1.0])),
    ("clr_inv-inf", NF, r"\+inf", lambda: ac.clr_inv([np.inf, 1.0])),
    (
        "clr_inv-mask-hides-all",
        TF,
        "no visible part",
        lambda: ac.clr_inv([0.1, 0.2], mask=[False, False]),
    ),
    # alr / alr_inv
    ("alr-ref-out-of-range", SM, "out of range", lambda: ac.alr(X3, ref=3)),
    ("alr-ref-negative-out-of-range", SM, "out of range", lambda: ac.alr(X3, ref=-4)),
    ("alr-ref-bool", SM, "integer", lambda: ac.alr(X3, ref=True)),
    ("alr-ref-float", SM, "integer", lambda: ac.alr(X3, ref=1.0)),
    ("alr-ref-invisible", SM, "invisible", lambda: ac.alr(X3, ref=0, mask=[False, True, True])),
    ("alr_inv-ref-out-of-range", SM, "out of range", lambda: ac.alr_inv([0.1, 0.2], ref=3)),
    ("alr_inv-ref-float", SM, "integer", lambda: ac.alr_inv([0.1, 0.2], ref=1.5)),
    ("alr_inv-ref-bool", SM, "integer", lambda: ac.alr_inv([0.1, 0.2], ref=True)),
    ("alr_inv-nan", NF, "NaN", lambda: ac.alr_inv([np.nan, 0.2])),
    ("alr_inv-inf", NF, "infinite", lambda: ac.alr_inv([np.inf, 0.2])),
    (
        "alr_inv-mask-hides-all",
        TF,
        "no visible part",
        lambda: ac.alr_inv([[0.1, 0.2, 0.0]], mask=[[False] * 3]),
    ),
    (
        "alr_inv-mask-ref-out-of-range",
        SM,
        "out of range",
        lambda: ac.alr_inv([[0.1, 0.2, 0.0]], ref=7, mask=[[True] * 3]),
    ),
    (
        "alr_inv-mask-ref-invisible",
        SM,
        "invisible",
        lambda: ac.alr_inv([[0.0, 0.2, 0.3]], ref=0, mask=[[False, True, True]]),
    ),
    ("alr_inv-mask-int", CE, "boolean", lambda: ac.alr_inv([[0.1, 0.2, 0.0]], mask=[[1, 1, 1]])),
    # ilr / ilr_inv and bases
    ("ilr-basis-not-orthonormal", CE, "not orthonormal", lambda: ac.ilr(X3, basis=NOT_ORTHONORMAL)),
    ("ilr-basis-nan", NF, "sbp_basis", lambda: ac.ilr(X3, basis=np.full((2, 3), np.nan))),
    (
        "ilr-basis-inf",
        NF,
        "NaN or infinite",
        lambda: ac.ilr(X3, basis=np.array([[np.inf, 0, -np.inf], [0.5, -1, 0.5]])),
    ),
    ("ilr-basis-not-clr", CE, "sum to 0", lambda: ac.ilr(X3, basis=NOT_CLR)),
    (
        "ilr-basis-not-normalised",
        CE,
        "not orthonormal",
        lambda: ac.ilr(X3, basis=2 * ac.pivot_basis(3)),
    ),
    ("ilr-basis-square", SM, r"\(D-1, D\)", lambda: ac.ilr(X3, basis=np.eye(3))),
    ("ilr-basis-1d", SM, r"\(D-1, D\)", lambda: ac.ilr(X3, basis=np.ones(3))),
    ("ilr-basis-other-D", SM, r"\(D-1, D\)", lambda: ac.ilr(X3, basis=ac.pivot_basis(4))),
    ("ilr-basis-str", CE, "real numbers", lambda: ac.ilr(X3, basis="pivot")),
    ("ilr-basis-bool", CE, "boolean", lambda: ac.ilr(X3, basis=ac.pivot_basis(3) > 0)),
    (
        "ilr-basis-with-hidden-parts",
        SM,
        "every part visible",
        lambda: ac.ilr(X3, basis=ac.pivot_basis(3), mask=[True, True, False]),
    ),
    (
        "ilr_inv-basis-not-orthonormal",
        CE,
        "not orthonormal",
        lambda: ac.ilr_inv([0.1, 0.2], basis=NOT_ORTHONORMAL),
    ),
    ("ilr_inv-basis-not-clr", CE, "sum to 0", lambda: ac.ilr_inv([0.1, 0.2], basis=NOT_CLR)),
    (
        "ilr_inv-basis-nan",
        NF,
        "basis",
        lambda: ac.ilr_inv([0.1, 0.2], basis=np.full((2, 3), np.nan)),
    ),
    (
        "ilr_inv-basis-with-mask",
        SM,
        "mask",
        lambda: ac.ilr_inv([0.1, 0.2], basis=ac.pivot_basis(3), mask=[True] * 3),
    ),
    ("ilr_inv-nan", NF, "NaN", lambda: ac.ilr_inv([np.nan, 0.2])),
    ("ilr_inv-inf", NF, "infinite", lambda: ac.ilr_inv([np.inf, 0.2])),
    ("ilr_inv-minus-inf", NF, "infinite", lambda: ac.ilr_inv([-np.inf, 0.2])),
    (
        "ilr_inv-mask-hides-all",
        TF,
        "no visible part",
        lambda: ac.ilr_inv([0.1, 0.2], mask=[False] * 3),
    ),
    (
        "ilr_inv-coordinates-beyond-mask",
        SM,
        "beyond",
        lambda: ac.ilr_inv([0.1, 0.2], mask=[True, True, False]),
    ),
    (
        "ilr_inv-mask-wrong-shape",
        SM,
        "broadcast",
        lambda: ac.ilr_inv([0.1, 0.2], mask=[True, True]),
    ),
    ("pivot-1", TF, "at least 2", lambda: ac.pivot_basis(1)),
    ("pivot-0", TF, "at least 2", lambda: ac.pivot_basis(0)),
    ("pivot-negative", TF, "at least 2", lambda: ac.pivot_basis(-3)),
    ("pivot-bool", SM, "integer", lambda: ac.pivot_basis(True)),
    ("pivot-float", SM, "integer", lambda: ac.pivot_basis(3.5)),
    ("pivot-str", SM, "integer", lambda: ac.pivot_basis("3")),
    ("sbp-entry-2", SM, r"\+1, -1 or 0", lambda: ac.sbp_basis([[1, 2, -1], [0, 1, -1]])),
    ("sbp-fraction", SM, r"\+1, -1 or 0", lambda: ac.sbp_basis([[1, 0.5, -1], [0, 1, -1]])),
    ("sbp-nan", SM, r"\+1, -1 or 0", lambda: ac.sbp_basis([[1, np.nan, -1], [0, 1, -1]])),
    ("sbp-bool", SM, r"\+1, -1 or 0", lambda: ac.sbp_basis([[True, False]])),
    ("sbp-str", SM, r"\+1, -1 or 0", lambda: ac.sbp_basis([["1", "-1"]])),
    ("sbp-1d", SM, r"\(D-1, D\)", lambda: ac.sbp_basis([1, -1])),
    ("sbp-one-part", SM, "D >= 2", lambda: ac.sbp_basis(np.empty((0, 1)))),
    ("sbp-square", SM, r"\(D-1, D\)", lambda: ac.sbp_basis(np.ones((3, 3)))),
    ("sbp-row-without-minus", SM, "one -1", lambda: ac.sbp_basis([[1, 1, 1], [0, 1, -1]])),
    ("sbp-not-sequential", SM, "sequential", lambda: ac.sbp_basis([[1, -1, 0], [1, 0, -1]])),
    ("groups-overlap", SM, "exactly once", lambda: ac.group_basis([[0, 1], [1, 2]])),
    ("groups-gap", SM, "exactly once", lambda: ac.group_basis([[0], [2]])),
    ("groups-negative-index", SM, "exactly once", lambda: ac.group_basis([[-1], [0, 1]])),
    ("groups-empty-group", TF, "at least one part", lambda: ac.group_basis([[0], []])),
    ("groups-one-part", TF, "at least 2", lambda: ac.group_basis([[0]])),
    ("groups-bool-index", SM, "integer", lambda: ac.group_basis([[True], [False]])),
    ("groups-float-index", SM, "integer", lambda: ac.group_basis([[0.0], [1.0]])),
    ("groups-str", SM, "list of index lists", lambda: ac.group_basis("01")),
    ("groups-flat", SM, "list of index lists", lambda: ac.group_basis([0, 1])),
    ("groups-n_parts-bool", SM, "integer", lambda: ac.group_basis([[0], [1]], True)),
    ("groups-n_parts-zero", TF, "at least 2", lambda: ac.group_basis([[0], [1]], 0)),
    ("groups-n_parts-mismatch", SM, "exactly once", lambda: ac.group_basis([[0], [1]], 3)),
    # perturbation, powering, products and distances
    ("perturb-shapes", SM, "broadcast", lambda: ac.perturb(X, np.ones(4))),
    ("perturb-negative-y", NP, "negative", lambda: ac.perturb(X3, [-1.0, 1.0, 1.0])),
    (
        "perturb-two-negatives",
        NP,
        "negative",
        lambda: ac.perturb([-0.2, 0.3, 0.5], [-1.0, 1.0, 1.0]),
    ),
    ("perturb-nan", NF, "NaN", lambda: ac.perturb(X3, [np.nan, 1.0, 1.0])),
    ("perturb-disjoint", ZP, "no positive", lambda: ac.perturb([0.5, 0.5, 0.0], [0.0, 0.0, 1.0])),
    ("perturb-overflow", NF, "infinite", lambda: ac.perturb([1e200, 1.0], [1e200, 1.0])),
    ("perturb_inv-zero-y", ZP, "zero", lambda: ac.perturb_inv(X3, [0.0, 1.0, 1.0])),
    ("perturb_inv-shapes", SM, "broadcast", lambda: ac.perturb_inv(X, np.ones(4))),
    ("power-nan", NF, "NaN", lambda: ac.power(X3, np.nan)),
    ("power-inf", NF, "infinite", lambda: ac.power(X3, np.inf)),
    ("power-minus-inf", NF, "infinite", lambda: ac.power(X3, -np.inf)),
    ("power-row-nan", NF, "NaN", lambda: ac.power(X, [1.0, np.nan])),
    ("power-mask-hides-all", TF, "no visible part", lambda: ac.power(X, 2.0, mask=ALL_HIDDEN)),
    ("power-str", CE, "real numbers", lambda: ac.power(X3, "2")),
    ("power-complex", CE, "real numbers", lambda: ac.power(X3, 2j)),
    ("power-bool", CE, "boolean", lambda: ac.power(X3, True)),
    ("power-shape", SM, "broadcast", lambda: ac.power(X, np.array([1.0, 2.0, 3.0]))),
    ("inner-shapes", SM, "broadcast", lambda: ac.paired_inner(X, np.ones(4))),
    ("inner-parts-on-other-axis", SM, "same parts", lambda: ac.paired_inner(X, X3, axis=0)),
    ("perturb-parts-on-other-axis", SM, "same parts", lambda: ac.perturb(X, X3, axis=0)),
    ("distance-parts-broadcast", SM, "same parts", lambda: ac.aitchison_distance(X, X[:, :1])),
    ("split-parts-on-other-axis", SM, "same parts", lambda: ac.aitchison_split(X, X3, axis=0)),
    ("distance-shapes", SM, "broadcast", lambda: ac.aitchison_distance(X, np.ones(4))),
    ("norm-mask-hides-all", TF, "visible", lambda: ac.aitchison_norm(X, mask=ALL_HIDDEN)),
    ("pairwise-1d", SM, "items", lambda: ac.pairwise_aitchison(X3)),
    ("pairwise-y-parts", SM, "same parts", lambda: ac.pairwise_aitchison(X, np.ones((2, 4)))),
    (
        "pairwise-summed-y-shape",
        SM,
        "leading",
        lambda: ac.pairwise_aitchison(np.ones((2, 2, 3)), np.ones((3, 2, 3)), sum_over=0),
    ),
    (
        "pairwise-sum_over-bool",
        SM,
        "integer",
        lambda: ac.pairwise_aitchison(np.ones((4, 2, 2, 3)), sum_over=True),
    ),
    (
        "pairwise-sum_over-float",
        SM,
        "integer",
        lambda: ac.pairwise_aitchison(np.ones((2, 2, 3)), sum_over=0.0),
    ),
    (
        "pairwise-sum_over-parts",
        SM,
        "part axis",
        lambda: ac.pairwise_aitchison(np.ones((2, 2, 3)), sum_over=2),
    ),
    (
        "pairwise-sum_over-out-of-range",
        SM,
        "not an axis",
        lambda: ac.pairwise_aitchison(np.ones((2, 2, 3)), sum_over=5),
    ),
    (
        "pairwise-mask-differs",
        SM,
        "same visible keys",
        lambda: ac.pairwise_aitchison(X, mask=[[True, True, True], [True, True, False]]),
    ),
    # sink / content decomposition
    ("sink-out-of-range", SM, "out of range", lambda: ac.decompose(X3, sink=3)),
    ("sink-negative-out-of-range", SM, "out of range", lambda: ac.decompose(X3, sink=-4)),
    ("sink-bool", SM, "not a key index", lambda: ac.decompose(X3, sink=True)),
    ("sink-false", SM, "not a key index", lambda: ac.decompose(X3, sink=False)),
    ("sink-float", SM, "integer", lambda: ac.decompose(X3, sink=1.5)),
    ("sink-str", SM, "integer", lambda: ac.decompose(X3, sink="bos")),
    ("sink-empty", TF, "names no key", lambda: ac.decompose(X3, sink=[])),
    ("sink-2d-indices", SM, "1-d", lambda: ac.decompose(X3, sink=[[0, 1]])),
    ("sink-mask-wrong-shape", SM, "broadcast", lambda: ac.decompose(X3, sink=[True, False])),
    ("sink-everything", TF, "no visible content", lambda: ac.decompose(X3, sink=[0, 1, 2])),
    (
        "sink-invisible",
        SM,
        "left padding",
        lambda: ac.decompose([[-np.inf, 1.0, 2.0]], sink=0, from_logits=True),
    ),
    ("degenerate-unknown", CE, "degenerate", lambda: ac.decompose(X3, degenerate="skip")),
    (
        "decompose-mask-hides-all",
        TF,
        "no visible part",
        lambda: ac.decompose(X, mask=ALL_HIDDEN),
    ),
    ("decompose-one-part", TF, "no visible content", lambda: ac.decompose([1.0])),
    ("decompose-nan", NF, "NaN", lambda: ac.decompose([np.nan, 0.5, 0.5])),
    ("group-overlap", SM, "more than once", lambda: ac.group_decompose(X3, [[0, 1], [1, 2]])),
    ("group-part-with-mass-left-out", SM, "no group", lambda: ac.group_decompose(X3, [[0], [2]])),
    ("group-index-out-of-range", SM, "out of range", lambda: ac.group_decompose(X3, [[0], [5]])),
    ("group-bool-index", SM, "integer", lambda: ac.group_decompose(X3, [[True], [False, 2]])),
    ("group-float-index", SM, "integer", lambda: ac.group_decompose(X3, [[0.0], [1.0, 2.0]])),
    (
        "group-float-labels",
        SM,
        "integer label",
        lambda: ac.group_decompose(X3, np.array([0.0, 1.0, 1.0])),
    ),
    (
        "group-bool-labels",
        SM,
        "integer label",
        lambda: ac.group_decompose(X3, np.array([True, False, False])),
    ),
    (
        "group-label-below-minus-1",
        SM,
        "below -1",
        lambda: ac.group_decompose(X3, np.array([-2, 0, 1])),
    ),
    ("group-labels-wrong-shape", SM, "broadcast", lambda: ac.group_decompose(X3, np.array([0, 1]))),
    (
        "group-labels-all-left-out",
        TF,
        "no group",
        lambda: ac.group_decompose(X3, np.array([-1, -1, -1])),
    ),
    ("group-none", TF, "no group", lambda: ac.group_decompose(X3, [])),
    (
        "group-mask-hides-all",
        ZP,
        "hidden by mask",
        lambda: ac.group_decompose(X, [[0], [1, 2]], mask=ALL_HIDDEN),
    ),
    (
        "group-logits-nothing-grouped",
        TF,
        "no visible part",
        lambda: ac.group_decompose(
            [[0.0, 1.0, 2.0]], np.array([[-1, 0, 0]]), mask=[[True, False, False]], from_logits=True
        ),
    ),
    ("entropy-not-closed", NC, "closure", lambda: ac.entropy([0.5, 0.6])),
    (
        "entropy-logits-all-hidden",
        TF,
        "no visible part",
        lambda: ac.entropy([[-np.inf, -np.inf]], from_logits=True),
    ),
    ("entropy-nan", NF, "NaN", lambda: ac.entropy([np.nan, 1.0])),
    ("binary-entropy-above-1", CE, r"\[0, 1\]", lambda: ac.binary_entropy(1.5)),
    ("binary-entropy-negative", CE, r"\[0, 1\]", lambda: ac.binary_entropy(-0.1)),
    ("binary-entropy-nan", NF, "NaN", lambda: ac.binary_entropy(np.nan)),
    ("binary-entropy-bool", CE, "boolean", lambda: ac.binary_entropy(True)),
    ("split-shapes", SM, "broadcast", lambda: ac.aitchison_split(X, np.ones(4) / 4)),
    (
        "split-visibility-differs",
        SM,
        "visibility",
        lambda: ac.aitchison_split([0.0, 1.0, 2.0], [0.0, 1.0, -np.inf], from_logits=True),
    ),
    ("split-sink-out-of-range", SM, "out of range", lambda: ac.aitchison_split(X3, X3, sink=7)),
    ("pairwise-split-1d", SM, "items", lambda: ac.pairwise_aitchison_split(X3)),
    (
        "pairwise-split-visibility-differs",
        SM,
        "identical",
        lambda: ac.pairwise_aitchison_split(
            [[0.0, 1.0, 2.0], [0.0, 1.0, -np.inf]], from_logits=True
        ),
    ),
    # entropy attribution
    (
        "attribute-nan",
        NF,
        "sink_share_a",
        lambda: ac.attribute_entropy_change(np.nan, 1.0, 0.5, 1.0),
    ),
    (
        "attribute-share-above-1",
        CE,
        "sink_share_b",
        lambda: ac.attribute_entropy_change(0.5, 1.0, 1.5, 1.0),
    ),
    (
        "attribute-share-negative",
        CE,
        r"\[0, 1\]",
        lambda: ac.attribute_entropy_change(-0.1, 1.0, 0.5, 1.0),
    ),
    (
        "attribute-negative-entropy",
        CE,
        "negative",
        lambda: ac.attribute_entropy_change(0.2, -1.0, 0.5, 1.0),
    ),
    (
        "attribute-shapes",
        SM,
        "broadcast",
        lambda: ac.attribute_entropy_change(np.ones(2) / 2, np.ones(3), 0.5, 1.0),
    ),
    ("attribute-bool", CE, "boolean", lambda: ac.attribute_entropy_change(True, 1.0, 0.5, 1.0)),
    (
        "grouped-group-counts",
        SM,
        "broadcast",
        lambda: ac.attribute_grouped_entropy_change([0.5, 0.5], [1, 1], [0.5, 0.3, 0.2], [1, 1, 1]),
    ),
    (
        "grouped-leading-shapes",
        SM,
        "broadcast",
        lambda: ac.attribute_grouped_entropy_change(
            np.full((2, 2), 0.5), [1, 1], [[0.5, 0.5]] * 3, [1, 1]
        ),
    ),
    (
        "grouped-negative-share",
        NP,
        "negative",
        lambda: ac.attribute_grouped_entropy_change([1.5, -0.5], [1, 1], [0.5, 0.5], [1, 1]),
    ),
    (
        "grouped-not-closed",
        NC,
        "sum to 1",
        lambda: ac.attribute_grouped_entropy_change([0.2, 0.2], [1, 1], [0.5, 0.5], [1, 1]),
    ),
    (
        "grouped-negative-entropy",
        CE,
        "negative",
        lambda: ac.attribute_grouped_entropy_change([0.5, 0.5], [1, -1], [0.5, 0.5], [1, 1]),
    ),
    (
        "grouped-scalar",
        SM,
        "scalar",
        lambda: ac.attribute_grouped_entropy_change(0.5, 1.0, 0.5, 1.0),
    ),
    (
        "grouped-nan",
        NF,
        "NaN",
        lambda: ac.attribute_grouped_entropy_change([0.5, np.nan], [1, 1], [0.5, 0.5], [1, 1]),
    ),
    (
        "entropy-change-shapes",
        SM,
        "broadcast",
        lambda: ac.entropy_change(np.full((2, 3), 1 / 3), np.full((3, 4), 0.25)),
    ),
]
# torch inputs follow the same rules
TORCH_REFUSALS = [
    ("torch-complex", CE, "complex", lambda: ac.clr(_t([1 + 1j, 2]))),
    ("torch-mask-int", CE, "boolean", lambda: ac.clr(_t([0.5, 0.5]), mask=_t([1, 1]))),
    (
        "torch-float-mask-numpy-x",
        CE,
        "boolean",
        lambda: ac.clr(np.full((1, 4), 0.25), mask=_t(np.ones((1, 4)))),
    ),
    (
        "torch-basis-not-orthonormal",
        CE,
        "not orthonormal",
        lambda: ac.ilr(_t(X3), basis=_t(NOT_ORTHONORMAL)),
    ),
    ("torch-basis-nan-numpy-x", NF, "basis", lambda: ac.ilr(X3, basis=_t(np.full((2, 3), np.nan)))),
    ("torch-sink-float", SM, "integer", lambda: ac.decompose(_t(X3), sink=_t(1.5))),
    (
        "torch-devices-differ",
        DM,
        "devices",
        lambda: ac.inner(_t(np.ones(3)), _t(np.ones(3)).to("meta")),
    ),
]


@pytest.mark.parametrize(
    ("case", "error", "match", "call"),
    [pytest.param(*c, id=c[0]) for c in REFUSALS]
    + [pytest.param(*c, id=c[0], marks=requires_torch) for c in TORCH_REFUSALS],
)
def test_hostile_input_is_refused_in_one_line(case, error, match, call):
    _refused(call, error, match)


def test_the_reported_cases():
    """The two reports of issue #13, verbatim."""
    x = np.array([0.2, 0.3, 0.5])
    err = _refused(lambda: ac.ilr(x, basis=[[1, 0, -1], [0, 1, -1]]), ac.CompositionError, "B B")
    assert "ac.sbp_basis" in str(err) and "ac.pivot_basis" in str(err)
    _refused(lambda: ac.ilr(x, basis=np.full((2, 3), np.nan)), ac.NonFiniteError, "NaN")
    torch = pytest.importorskip("torch")
    out = ac.clr(np.full((1, 4), 0.25), mask=torch.ones(1, 4, dtype=torch.bool))
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), np.zeros((1, 4)))


# ------------------------------------------------------------------------ explicit ilr bases


@given(ilr_bases(), st.data())
@settings(max_examples=60, deadline=None)
def test_orthonormal_bases_pass_and_invert(basis, data):
    d = basis.shape[1]
    z = data.draw(hnp.arrays(np.float64, (3, d), elements=st.floats(-20, 20)))
    x = np.exp(z - z.max(-1, keepdims=True))
    coords = ac.ilr(x, basis)
    # orthonormal: the coordinates are an isometry of the clr space, and ilr_inv undoes ilr
    np.testing.assert_allclose(np.linalg.norm(coords, axis=-1), ac.aitchison_norm(x), atol=1e-9)
    np.testing.assert_allclose(ac.ilr_inv(coords, basis), ac.closure(x), atol=1e-10)
    # permuting the parts or flipping a balance keeps a basis valid
    perm = np.random.default_rng(d).permutation(d)
    ac.ilr(x[:, perm], -basis[:, perm])


@given(ilr_bases(dtype=np.float32))
@settings(max_examples=40, deadline=None)
def test_float32_bases_built_in_float32_pass(basis):
    assert basis.dtype == np.float32
    x = ac.closure(np.arange(1.0, basis.shape[1] + 1), validate=True).astype(np.float32)
    out = ac.ilr(x, basis)
    assert out.dtype == np.float32
    np.testing.assert_allclose(ac.ilr_inv(out, basis), x, atol=1e-5)


def test_float32_bases_of_many_parts_pass():
    for d in (64, 1024):
        basis = ac.pivot_basis(d).astype(np.float32)
        x = ac.closure(np.linspace(1.0, 2.0, d)).astype(np.float32)
        ac.ilr(x, basis)
        # the same basis cast to float64 is a basis to 7 digits (off by ~7e-8): accepted, as
        # scikit-bio accepts it (a false refusal before issue 27)
        ac.ilr(x.astype(np.float64), basis.astype(np.float64))


@requires_torch
def test_torch_float32_basis_on_its_device():
    torch = pytest.importorskip("torch")
    basis = torch.tensor(ac.pivot_basis(6), dtype=torch.float32)
    x = torch.tensor(ac.closure(np.arange(1.0, 7.0)), dtype=torch.float32)
    out = ac.ilr(x, basis)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), ac.ilr(x.numpy(), basis.numpy()), atol=1e-6)


def _perturbed(basis: np.ndarray, kind: str, delta: float, rng: np.random.Generator) -> np.ndarray:
    """A basis off from orthonormal by ``delta`` in the checked quantities."""
    b = basis.copy()
    n_rows, d = b.shape
    i = int(rng.integers(n_rows))
    if kind == "scale":  # a row's norm changes: diag(B B^T) = (1 + delta)^2
        b[i] *= 1 + delta
    elif kind == "shear":  # rows stay clr vectors but two stop being orthogonal
        k = (i + 1) % n_rows
        b[i] += delta * b[k]
    elif kind == "shift":  # a row gains a component along the ones vector: B 1 != 0
        b[i] += delta / math.sqrt(d)
    elif kind == "entry":  # one entry off by delta * sqrt(D)
        b[i, int(rng.integers(d))] += delta * math.sqrt(d)
    return b


@given(
    ilr_bases(min_parts=3),
    st.sampled_from(["scale", "shear", "shift", "entry"]),
    st.floats(10.0, 1e6),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=120, deadline=None)
def test_bases_off_beyond_tolerance_are_refused(basis, kind, factor, seed):
    rng = np.random.default_rng(seed)
    if kind == "shear" and basis.shape[0] < 2:
        kind = "scale"
    bad = _perturbed(basis, kind, min(factor * TOL64, 0.5), rng)
    x = ac.closure(np.arange(1.0, basis.shape[1] + 1))
    _refused(lambda: ac.ilr(x, bad), ac.CompositionError, "sbp_basis")
    _refused(lambda: ac.ilr_inv(np.zeros(basis.shape[0]), bad), ac.CompositionError, "sbp_basis")
    # in float32 the same relative error passes only if it is within float32's tolerance
    bad32 = _perturbed(basis.astype(np.float32), kind, min(factor * TOL32, 0.5), rng)
    _refused(lambda: ac.ilr(x, bad32), ac.CompositionError, "float32")


@given(ilr_bases(), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_bases_within_rounding_pass(basis, seed):
    noise = np.random.default_rng(seed).normal(size=basis.shape)
    nearly = basis + noise * TOL64 / (100 * basis.shape[1])
    ac.ilr(ac.closure(np.arange(1.0, basis.shape[1] + 1)), nearly)


def test_large_bases_are_checked_by_content(monkeypatch):
    """A large basis that passed is remembered by a digest of its bytes: the same basis skips
    the Gram product, but any change to it (even in place) is checked again."""
    d = 512  # a 512-part basis (511 x 512 values): its Gram product costs 4x its digest
    basis = ac.pivot_basis(d)
    assert basis.size >= _bases._CACHED_BASIS_SIZE
    x = ac.closure(np.linspace(1.0, 3.0, d))
    ac.ilr(x, basis)
    calls = []
    original = _bases.basis_tolerance
    monkeypatch.setattr(_bases, "basis_tolerance", lambda dt: calls.append(dt) or original(dt))
    ac.ilr(x, basis)  # remembered: no tolerance lookup, no Gram product
    assert calls == []
    basis[3, 5] += 1e-3  # the caller edits the basis in place
    _refused(lambda: ac.ilr(x, basis), ac.CompositionError, "orthonormal|sum to 0")
    assert calls


def test_validate_false_skips_the_basis_check(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the basis was checked despite validate=False")

    monkeypatch.setattr(_bases, "check_basis", fail)
    out = ac.ilr(X3, NOT_ORTHONORMAL, validate=False)  # the documented opt-out
    np.testing.assert_allclose(out, ac.clr(X3) @ NOT_ORTHONORMAL.T)
    ac.ilr_inv([0.1, 0.2], NOT_ORTHONORMAL, validate=False)
    with pytest.raises(AssertionError, match="validate=False"):
        ac.ilr(X3, NOT_ORTHONORMAL)


@requires_skbio
@given(ilr_bases(), st.data())
@settings(max_examples=40, deadline=None)
def test_ilr_with_a_custom_basis_equals_scikit_bio(basis, data):
    from skbio.stats import composition as skc

    d = basis.shape[1]
    z = data.draw(hnp.arrays(np.float64, (4, d), elements=st.floats(-15, 15)))
    x = ac.closure(np.exp(z))
    np.testing.assert_allclose(ac.ilr(x, basis), skc.ilr(x, basis), atol=1e-10)
    coords = ac.ilr(x, basis)
    np.testing.assert_allclose(ac.ilr_inv(coords, basis), skc.ilr_inv(coords, basis), atol=1e-10)


@requires_skbio
def test_scikit_bio_refuses_what_we_refuse():
    """Same meaning as scikit-bio's basis check; ours also requires rows summing to 0, without
    which the map is no isometry (scikit-bio accepts such a basis)."""
    from skbio.stats import composition as skc

    with pytest.raises(ValueError, match="orthonormal"):
        skc.ilr(X3, NOT_ORTHONORMAL)
    _refused(lambda: ac.ilr(X3, NOT_ORTHONORMAL), ac.CompositionError, "orthonormal")
    y = np.array([0.6, 0.3, 0.1])
    d_sk = np.linalg.norm(skc.ilr(X3, NOT_CLR) - skc.ilr(y, NOT_CLR))
    assert not np.isclose(d_sk, ac.aitchison_distance(X3, y))  # not an isometry
    _refused(lambda: ac.ilr(X3, NOT_CLR), ac.CompositionError, "sum to 0")


@given(sbp_matrices())
@settings(max_examples=40, deadline=None)
def test_every_sequential_partition_gives_an_orthonormal_basis(sbp):
    basis = ac.sbp_basis(sbp)
    np.testing.assert_allclose(basis @ basis.T, np.eye(len(basis)), atol=1e-12)
    np.testing.assert_allclose(basis.sum(1), 0, atol=1e-12)
    bad = sbp.copy()
    bad[0, 0] = 2
    _refused(lambda: ac.sbp_basis(bad), ac.ShapeMismatchError, r"\+1, -1 or 0")


# ------------------------------------------------------------------------ mixed array kinds


def _mixed_cases():
    """(name, numpy call, mixed call): the mixed call gives a tensor equal to the numpy one."""
    torch = _torch()
    t = torch.tensor
    x, y = X, np.array([[0.5, 0.25, 0.25], [0.3, 0.3, 0.4]])
    m = np.array([[True, True, True], [True, False, True]])
    b = ac.pivot_basis(3)
    labels = np.array([0, 1, 1])
    return [
        ("clr np x, torch mask", lambda: ac.clr(x, mask=m), lambda: ac.clr(x, mask=t(m))),
        ("clr torch x, np mask", lambda: ac.clr(x, mask=m), lambda: ac.clr(t(x), mask=m)),
        (
            "clr torch x, list mask",
            lambda: ac.clr(x, mask=m),
            lambda: ac.clr(t(x), mask=m.tolist()),
        ),
        (
            "closure list x, torch mask",
            lambda: ac.closure(x, mask=m),
            lambda: ac.closure(x.tolist(), mask=t(m)),
        ),
        (
            "multi_replace np x, torch mask",
            lambda: ac.multi_replace(x, mask=m),
            lambda: ac.multi_replace(x, mask=t(m)),
        ),
        (
            "clr_inv np z, torch mask",
            lambda: ac.clr_inv(x, mask=m),
            lambda: ac.clr_inv(x, mask=t(m)),
        ),
        ("alr np x, torch mask", lambda: ac.alr(x, mask=m), lambda: ac.alr(x, mask=t(m))),
        (
            "alr_inv np y, torch mask",
            lambda: ac.alr_inv(x, mask=m),
            lambda: ac.alr_inv(x, mask=t(m)),
        ),
        ("ilr np x, torch basis", lambda: ac.ilr(x, b), lambda: ac.ilr(x, t(b))),
        ("ilr torch x, np basis", lambda: ac.ilr(x, b), lambda: ac.ilr(t(x), b)),
        ("ilr np x, torch mask", lambda: ac.ilr(x, mask=m), lambda: ac.ilr(x, mask=t(m))),
        (
            "ilr_inv np z, torch basis",
            lambda: ac.ilr_inv(x[:, :2], b),
            lambda: ac.ilr_inv(x[:, :2], t(b)),
        ),
        ("perturb np, torch", lambda: ac.perturb(x, y), lambda: ac.perturb(x, t(y))),
        ("perturb torch, list", lambda: ac.perturb(x, y), lambda: ac.perturb(t(x), y.tolist())),
        ("perturb_inv np, torch", lambda: ac.perturb_inv(x, y), lambda: ac.perturb_inv(x, t(y))),
        (
            "power np x, torch a",
            lambda: ac.power(x, np.array([2.0, 0.5])),
            lambda: ac.power(x, t([2.0, 0.5])),
        ),
        ("inner np, torch", lambda: ac.inner(x, y), lambda: ac.inner(x, t(y))),
        (
            "distance torch, np",
            lambda: ac.aitchison_distance(x, y),
            lambda: ac.aitchison_distance(t(x), y),
        ),
        (
            "norm np x, torch mask",
            lambda: ac.aitchison_norm(x, mask=m),
            lambda: ac.aitchison_norm(x, mask=t(m)),
        ),
        (
            "pairwise np x, torch y",
            lambda: ac.pairwise_aitchison(x, y),
            lambda: ac.pairwise_aitchison(x, t(y)),
        ),
        (
            "pairwise np x, torch mask",
            lambda: ac.pairwise_aitchison(x, mask=m[:1]),
            lambda: ac.pairwise_aitchison(x, mask=t(m[:1])),
        ),
        (
            "entropy np x, torch mask",
            lambda: ac.entropy(ac.closure(x, mask=m), mask=m),
            lambda: ac.entropy(ac.closure(x, mask=m), mask=t(m)),
        ),
        (
            "binary_entropy list",
            lambda: ac.binary_entropy(np.array([0.2, 0.5])),
            lambda: ac.binary_entropy(t([0.2, 0.5])),
        ),
        (
            "decompose np x, torch sink",
            lambda: ac.decompose(x, sink=[False, True, False]).balance,
            lambda: ac.decompose(x, sink=t([False, True, False])).balance,
        ),
        (
            "decompose np x, torch mask",
            lambda: ac.decompose(x, mask=m).sink_share,
            lambda: ac.decompose(x, mask=t(m)).sink_share,
        ),
        (
            "group_decompose np x, torch labels",
            lambda: ac.group_decompose(x, labels).shares,
            lambda: ac.group_decompose(x, t(labels)).shares,
        ),
        (
            "aitchison_split np, torch",
            lambda: ac.aitchison_split(x, y).content,
            lambda: ac.aitchison_split(x, t(y)).content,
        ),
        (
            "pairwise split np x, torch mask",
            lambda: ac.pairwise_aitchison_split(x, mask=m[:1]).sink,
            lambda: ac.pairwise_aitchison_split(x, mask=t(m[:1])).sink,
        ),
        (
            "entropy_change np, torch",
            lambda: ac.entropy_change(x, y).total,
            lambda: ac.entropy_change(x, t(y)).total,
        ),
        (
            "attribute np, torch",
            lambda: ac.attribute_entropy_change(0.2, 1.0, 0.5, 2.0).sink,
            lambda: ac.attribute_entropy_change(0.2, t(1.0), 0.5, 2.0).sink,
        ),
        (
            "grouped attribute np, torch",
            lambda: (
                ac.attribute_grouped_entropy_change(
                    [0.5, 0.5], [1.0, 1.0], [0.2, 0.8], [0.5, 1.0]
                ).between
            ),
            lambda: (
                ac.attribute_grouped_entropy_change(
                    [0.5, 0.5], t([1.0, 1.0]), [0.2, 0.8], [0.5, 1.0]
                ).between
            ),
        ),
    ]


@requires_torch
def test_a_tensor_anywhere_makes_the_call_compute_in_torch():
    torch = pytest.importorskip("torch")
    for name, numpy_call, mixed_call in _mixed_cases():
        want = numpy_call()
        got = mixed_call()
        assert isinstance(got, torch.Tensor), name
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12, err_msg=name)


@requires_torch
def test_numpy_data_torch_cannot_hold_is_refused():
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("float128 is float64 on this platform")
    x = np.full((1, 4), 0.25, dtype=np.longdouble)
    np.testing.assert_allclose(ac.clr(x).astype(np.float64), 0)  # numpy alone is fine
    _refused(lambda: ac.clr(x, mask=_t(np.ones((1, 4), bool))), ac.CompositionError, "torch")


# ------------------------------------------------------------------------ accepted edge cases


def test_integer_counts_are_compositions():
    counts = np.array([[3, 1, 4], [1, 5, 9]])
    floats = counts.astype(float)
    for fn in (ac.closure, ac.clr, ac.ilr, ac.alr, ac.aitchison_norm):
        np.testing.assert_allclose(fn(counts), fn(floats), atol=1e-15, err_msg=fn.__name__)
    np.testing.assert_allclose(ac.clr(counts, from_logits=True), ac.clr(floats, from_logits=True))
    assert ac.entropy(np.array([0, 1])) == 0.0
    np.testing.assert_allclose(ac.power(floats, 2), ac.closure(floats**2))
    np.testing.assert_allclose(ac.power(floats, np.int64(2)), ac.closure(floats**2))


def test_integer_like_indices_are_accepted():
    np.testing.assert_allclose(ac.clr(X, axis=np.int64(1)), ac.clr(X, axis=1))
    np.testing.assert_allclose(ac.alr(X3, ref=np.int64(2)), ac.alr(X3, ref=2))
    np.testing.assert_allclose(ac.alr(X3, ref=-1), ac.alr(X3, ref=2))
    np.testing.assert_allclose(ac.decompose(X3, sink=-1).sink_share, 0.5)
    np.testing.assert_allclose(ac.decompose(X3, sink=np.int64(2)).sink_share, 0.5)
    np.testing.assert_allclose(ac.pivot_basis(np.int32(4)), ac.pivot_basis(4))
    # a list of booleans for sink= is a mask of sink keys, not the indices 1 and 0
    np.testing.assert_allclose(ac.decompose(X3, sink=[False, True, True]).sink_share, 0.8)


def test_empty_batches_give_empty_results():
    x = np.empty((0, 3))
    assert ac.closure(x).shape == (0, 3)
    assert ac.clr(x).shape == (0, 3)
    assert ac.alr(x).shape == (0, 2)
    assert ac.ilr(x).shape == (0, 2)
    assert ac.ilr(x, ac.pivot_basis(3)).shape == (0, 2)
    assert ac.ilr_inv(np.empty((0, 2))).shape == (0, 3)
    assert ac.entropy(x).shape == (0,)
    assert ac.aitchison_norm(x).shape == (0,)
    assert ac.decompose(x).sink_share.shape == (0,)
    assert ac.group_decompose(x, [[0], [1, 2]]).shares.shape == (0, 2)
    assert ac.pairwise_aitchison(x).shape == (0, 0)


def test_compositions_of_one_part():
    np.testing.assert_array_equal(ac.clr_inv([0.0]), [1.0])
    np.testing.assert_array_equal(ac.alr_inv(np.empty((2, 0))), np.ones((2, 1)))
    np.testing.assert_array_equal(ac.ilr_inv(np.empty((2, 0))), np.ones((2, 1)))
    np.testing.assert_array_equal(ac.closure([5]), [1.0])


def test_rows_without_any_visible_key_are_nan_with_degenerate_nan():
    z = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, 2.0]])
    d = ac.decompose(z, from_logits=True, degenerate="nan")
    for name in ("sink_share", "sink_logodds", "balance", "entropy", "content_entropy"):
        value = getattr(d, name)
        assert np.isnan(value[0]), name
        assert np.isfinite(value[1]), name
    np.testing.assert_allclose(d.entropy[1], ac.entropy(z[1], from_logits=True))


def test_broadcasting_pairs_equals_explicit_pairs():
    y = np.array([0.6, 0.3, 0.1])
    yy = np.broadcast_to(y, X.shape)
    np.testing.assert_allclose(ac.perturb(X, y), ac.perturb(X, yy))
    np.testing.assert_allclose(ac.perturb_inv(X, y), ac.perturb_inv(X, yy))
    np.testing.assert_allclose(ac.paired_inner(X, y), ac.paired_inner(X, yy))
    np.testing.assert_allclose(ac.aitchison_distance(X, y), ac.aitchison_distance(X, yy))
    np.testing.assert_allclose(ac.aitchison_split(X, y).total, ac.aitchison_distance(X, y) ** 2)


def test_entropy_change_across_different_keys():
    a, b = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.3, 0.2, 0.1])
    ch = ac.entropy_change(a, b)
    np.testing.assert_allclose(ch.total, ac.entropy(b) - ac.entropy(a), atol=1e-12)
    np.testing.assert_allclose(ch.sink + ch.content, ch.total, atol=1e-12)


def test_group_lists_may_leave_out_parts_without_mass():
    z = np.array([0.0, -np.inf, 1.0, 2.0])  # part 1 is hidden: it need not be in a group
    g = ac.group_decompose(z, [[0], [2, 3]], from_logits=True)
    np.testing.assert_allclose(g.entropy, ac.entropy(z, from_logits=True), atol=1e-12)
    p = np.array([0.5, 0.0, 0.2, 0.3])  # a zero part carries no mass either
    np.testing.assert_allclose(ac.group_decompose(p, [[0], [2, 3]]).shares, [0.5, 0.5])


def test_tolerances_follow_the_dtype():
    rows = np.array([[0.6, 0.4 + 5e-5]], dtype=np.float32)  # float32 rounding of a closed row
    np.testing.assert_allclose(ac.add_learned_sink(rows)[:, 0], 0)
    _refused(lambda: ac.add_learned_sink(rows.astype(np.float64)), ac.NotClosedError, "above 1")
    assert ac.clr(np.array([0.25, 0.75], dtype=np.float16)).dtype == np.float32


def test_huge_exponents_give_the_rounded_exact_result():
    # x ** 1e308 is the vertex (0, 0, 1) to float precision: the exact result, rounded
    np.testing.assert_array_equal(ac.power([0.001, 0.001, 0.998], 1e308), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(ac.power([1e-10, 0.5, 0.6], -1e308), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(ac.power([1e-10, 1e-10], 1e308), [0.5, 0.5])
    a = np.array([1e308, -1e308, 0.0])  # one power per row, both signs
    rows = np.array([[0.2, 0.3, 0.5]] * 3)
    np.testing.assert_array_equal(ac.power(rows, a), [[0, 0, 1], [1, 0, 0], [1 / 3] * 3])
    m = np.array([[True, True, False]] * 3)
    np.testing.assert_array_equal(ac.power(rows, a, mask=m), [[0, 1, 0], [1, 0, 0], [0.5, 0.5, 0]])


def test_multi_replace_within_range():
    out = ac.multi_replace([0.5, 0.5, 0.0], delta=0.01)
    np.testing.assert_allclose(out, [0.495, 0.495, 0.01])
    np.testing.assert_allclose(ac.multi_replace([0.5, 0.5, 0.0], delta=np.float32(0.01)), out)


def test_hidden_parts_are_never_read():
    """NaN padding under mask= (xarray's ragged layout) is ignored, for logits as for
    probabilities; a NaN at a visible part is refused."""
    z = np.array([[1.0, 2.0, np.nan], [0.5, 0.1, 0.3]])
    mask = ~np.isnan(z)
    padded = np.where(mask, z, -np.inf)
    for fn in (ac.clr, ac.ilr, ac.alr, ac.aitchison_norm, ac.entropy):
        np.testing.assert_array_equal(
            fn(z, mask=mask, from_logits=True), fn(padded, from_logits=True), err_msg=fn.__name__
        )
    d = ac.decompose(z, mask=mask, from_logits=True)
    np.testing.assert_allclose(d.entropy, ac.entropy(padded, from_logits=True), atol=1e-12)
    p = ac.closure(np.where(mask, np.exp(np.nan_to_num(z)), np.nan), mask=mask)
    np.testing.assert_allclose(ac.clr(p, mask=mask), ac.clr(padded, from_logits=True), atol=1e-12)
    visible_nan = mask.copy()
    visible_nan[0, 2] = True
    _refused(lambda: ac.clr(z, mask=visible_nan, from_logits=True), NF, "visible parts")


# --------------------------------------------------------------------------------------------
# false refusals and numpy masked arrays (issue 27)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: ac.clr(x),
        lambda x: ac.alr(x),
        lambda x: ac.ilr(x),
        lambda x: ac.closure(x),
        lambda x: ac.decompose(x),
        lambda x: ac.aitchison_distance(x, x),
    ],
)
def test_a_masked_numpy_array_is_refused_not_read_without_its_mask(call):
    x = np.ma.array([[0.5, 0.3, 0.2, 0.1]], mask=[[0, 0, 1, 0]])
    with pytest.raises(ac.CompositionError, match=r"masked array.*mask=~"):
        call(x)
    call(np.ma.array([[0.5, 0.3, 0.2, 0.1]]))  # nothing masked: plain numbers


@pytest.mark.parametrize("kw", ["ref", "ref_idx", "denominator_idx"])
@pytest.mark.parametrize("value", [3, 5, -4])
def test_an_out_of_range_reference_is_an_index_error(kw, value):
    with pytest.raises(IndexError, match="out of range"):
        ac.alr([[0.5, 0.3, 0.2]], **{kw: value})
    with pytest.raises(ValueError):  # and still the ValueError it was
        ac.alr([[0.5, 0.3, 0.2]], **{kw: value})


@pytest.mark.parametrize("decimals", [8, 7])
def test_a_basis_given_to_8_decimals_is_accepted(decimals):
    basis = np.round(ac.pivot_basis(12), decimals)
    assert np.abs(basis @ basis.T - np.eye(11)).max() > 1.5e-8 or decimals == 8
    x = np.random.default_rng(0).dirichlet(np.ones(12), size=3)
    np.testing.assert_allclose(ac.ilr(x, basis=basis), ac.ilr(x), atol=1e-5)


def test_a_basis_that_is_not_orthonormal_is_still_refused():
    basis = ac.pivot_basis(6)
    basis[0] *= 1 + 1e-4
    with pytest.raises(ac.CompositionError, match="not orthonormal"):
        ac.ilr(np.full((1, 6), 1 / 6), basis=basis)


# --------------------------------------------------------------------------------------------
# arrays that are not dense numbers, and closure tolerances of the input's precision (issue 27)

#: every public maths entry point, called on one (2, 4) input
ENTRY_POINTS = {
    "closure": lambda x: ac.closure(x),
    "clr": lambda x: ac.clr(x),
    "clr_inv": lambda x: ac.clr_inv(x),
    "alr": lambda x: ac.alr(x),
    "alr_inv": lambda x: ac.alr_inv(x),
    "ilr": lambda x: ac.ilr(x),
    "ilr_inv": lambda x: ac.ilr_inv(x),
    "power": lambda x: ac.power(x, 2.0),
    "perturb": lambda x: ac.perturb(x, x),
    "perturb_inv": lambda x: ac.perturb_inv(x, x),
    "inner": lambda x: ac.inner(x, x),
    "paired_inner": lambda x: ac.paired_inner(x, x),
    "aitchison_norm": lambda x: ac.aitchison_norm(x),
    "aitchison_distance": lambda x: ac.aitchison_distance(x, x),
    "pairwise_aitchison": lambda x: ac.pairwise_aitchison(x),
    "multi_replace": lambda x: ac.multi_replace(x),
    "entropy": lambda x: ac.entropy(x),
    "decompose": lambda x: ac.decompose(x),
    "group_decompose": lambda x: ac.group_decompose(x, [[0], [1, 2, 3]]),
    "aitchison_split": lambda x: ac.aitchison_split(x, x),
    "entropy_change": lambda x: ac.entropy_change(x, x),
    "add_learned_sink": lambda x: ac.add_learned_sink(x),
}
ROWS = [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]


def _tensors():
    torch = pytest.importorskip("torch")
    x = torch.tensor(ROWS, dtype=torch.float64)
    return {
        "meta": (x.to("meta"), "meta tensor"),
        "sparse_coo": (x.to_sparse(), "sparse tensor \\(sparse_coo\\)"),
        "sparse_csr": (x.to_sparse_csr(), "sparse tensor \\(sparse_csr\\)"),
        "nested": (torch.nested.nested_tensor([x[0], x[1, :3]]), "nested \\(ragged\\) tensor"),
        "complex": (x.to(torch.complex64), "must hold real numbers"),
        "quantized": (torch.quantize_per_tensor(x.float(), 0.01, 0, torch.quint8), "real numbers"),
        "bool": (x > 0.2, "is boolean"),
    }


@requires_torch
@pytest.mark.parametrize(
    "kind", ["meta", "sparse_coo", "sparse_csr", "nested", "complex", "quantized", "bool"]
)
@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_tensors_without_dense_real_values_are_refused_in_one_line(name, kind):
    x, match = _tensors()[kind]
    with pytest.raises(ac.CompositionError, match=match) as info:
        ENTRY_POINTS[name](x)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("make", ["coo_array", "csr_matrix"])
@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_scipy_sparse_arrays_are_refused_in_one_line(name, make):
    import scipy.sparse

    x = getattr(scipy.sparse, make)(np.array(ROWS))
    _refused(lambda: ENTRY_POINTS[name](x), ac.CompositionError, f"scipy sparse {make}")


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_np_matrix_and_unmasked_masked_arrays_compute_as_plain_arrays(name):
    plain = ENTRY_POINTS[name](np.array(ROWS))
    for x in (np.matrix(ROWS), np.ma.array(ROWS)):
        out = ENTRY_POINTS[name](x)
        for got, want in zip(_fields(out), _fields(plain), strict=True):
            assert type(got) is np.ndarray, (name, type(x), type(got))
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def _fields(out):
    values = [out] if not hasattr(out, "__dict__") else list(vars(out).values())
    return [v.detach() if hasattr(v, "detach") else v for v in values]


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_masked_array_is_refused_by_every_entry_point(name):
    x = np.ma.array(ROWS, mask=[[0, 0, 1, 0], [0, 0, 0, 0]])
    _refused(lambda: ENTRY_POINTS[name](x), ac.CompositionError, "masked array")


@requires_torch
@pytest.mark.parametrize("name", ["clr", "ilr", "entropy", "decompose", "aitchison_distance"])
def test_strided_int_and_grad_tensors_compute_like_dense_float_ones(name):
    import torch

    x = torch.tensor(ROWS, dtype=torch.float64)
    want = _fields(ENTRY_POINTS[name](x))
    strided = torch.tensor(ROWS, dtype=torch.float64).T.contiguous().T  # not contiguous
    assert not strided.is_contiguous()
    for variant in (strided, x.clone().requires_grad_()):
        got = _fields(ENTRY_POINTS[name](variant))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g.detach() if hasattr(g, "detach") else g), w)
    counts = torch.tensor([[4, 3, 2, 1], [1, 2, 3, 4]])
    if name != "entropy":  # counts are compositions; entropy needs closed rows
        got = _fields(ENTRY_POINTS[name](counts))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n", [3, 64, 4096])
def test_rows_closed_in_16_bits_are_closed(dtype, n):
    """A softmax row rounded to float16/bfloat16 deviates from 1 by up to eps / 2 (about 4e-3
    in bfloat16): refused before issue 27 by float32's fixed 1e-4."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(n)
    rows = torch.softmax(torch.randn(64, n, generator=g, dtype=torch.float64), -1)
    low = rows.to(getattr(torch, dtype))
    assert float((low.double().sum(-1) - 1).abs().max()) > 1e-4 or n == 4096
    np.testing.assert_allclose(ac.entropy(low).numpy(), ac.entropy(rows).numpy(), atol=0.05)
    ac.decompose(low)
    if dtype == "float16":
        ac.entropy(low.numpy())  # numpy float16 as well


def test_long_float32_rows_are_closed_and_open_ones_refused():
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(200_000), size=2).astype(np.float32)
    ac.entropy(rows)
    _refused(lambda: ac.entropy(rows * np.float32(1.01)), ac.NotClosedError, "sum to 1")
    _refused(lambda: ac.entropy(np.array([[0.5, 0.5 + 2e-4]], np.float32)), ac.NotClosedError, "")
    _refused(lambda: ac.entropy(np.array([[0.5, 0.5 + 2e-3]], np.float16)), ac.NotClosedError, "")


# ------------------------------------------------------------------------ gradients (issue #48)
# Every differentiable output has a finite gradient equal to finite differences wherever its
# value is finite, rows with zeros (masked or exact) included: a masked branch's NaN gradient
# (``torch.where(p > 0, p * log(p), 0)``: 0 x -inf) must never leak into the others.

P4 = [[0.2, 0.3, 0.1, 0.4], [0.7, 0.1, 0.15, 0.05]]
P_ZERO = [[0.2, 0.0, 0.3, 0.5], [0.6, 0.1, 0.0, 0.3]]  # exact zeros where the value is finite
Q4 = [[0.1, 0.3, 0.2, 0.4], [0.5, 0.2, 0.15, 0.15]]
MASK = [[True, False, True, True], [True, True, True, False]]
LOGITS = [[1.0, -0.5, 0.25, 2.0], [0.3, -float("inf"), 1.5, -2.0]]


def _decompose_outputs(**kw):
    fields = ("sink_share", "sink_logodds", "balance", "content", "entropy")
    fields += ("content_entropy", "sink_entropy", "binary_entropy")
    return [(f"decompose.{f}", lambda x, f=f: getattr(ac.decompose(x, **kw), f)) for f in fields]


def _on_closed(fn, mask=None):
    """``fn`` of the rows closed over their visible parts in torch (functions that require
    closed rows: finite differences move one part, which would open the row)."""

    def closed(x):
        visible = x if mask is None else x * _t(MASK)
        return fn(x / visible.sum(-1, keepdim=True))

    return closed


# (case, function of one float64 tensor, input rows)
GRADIENTS = [
    ("closure", ac.closure, P4),
    ("closure-zero", ac.closure, P_ZERO),
    ("closure-mask", lambda x: ac.closure(x, mask=_t(MASK)), P4),
    ("clr", ac.clr, P4),
    ("clr-mask", lambda x: ac.clr(x, mask=_t(MASK)), P4),
    ("clr-logits", lambda x: ac.clr(x, from_logits=True), LOGITS),
    ("clr_inv", ac.clr_inv, [[0.1, -0.3, 0.5, -0.3]]),
    ("alr", ac.alr, P4),
    ("alr_inv", ac.alr_inv, [[0.1, -0.3, 0.5]]),
    ("ilr", ac.ilr, P4),
    ("ilr-mask", lambda x: ac.ilr(x, mask=_t(MASK)), P4),
    ("ilr_inv", ac.ilr_inv, [[0.1, -0.3, 0.5]]),
    ("entropy", _on_closed(ac.entropy), P4),
    ("entropy-zero", _on_closed(ac.entropy), P_ZERO),
    ("entropy-mask", _on_closed(lambda x: ac.entropy(x, mask=_t(MASK)), MASK), P4),
    ("entropy-logits", lambda x: ac.entropy(x, from_logits=True), LOGITS),
    ("binary_entropy", ac.binary_entropy, [0.2, 0.5, 0.9]),
    (
        "binary_entropy_from_logs",
        lambda x: ac.binary_entropy_from_logs(x, torch_log1mexp(x)),
        [-1.6, -0.7],
    ),
    ("aitchison_norm", ac.aitchison_norm, P4),
    ("aitchison_distance", lambda x: ac.aitchison_distance(x, _t(P4[::-1])), P4),
    ("inner", lambda x: ac.inner(x, _t(P4[::-1])), P4),
    ("perturb", lambda x: ac.perturb(x, _t(P4[::-1])), P4),
    ("power", lambda x: ac.power(x, 0.7), P4),
    ("paired_inner", lambda x: ac.paired_inner(x, _t(P4[::-1])), P4),
    ("pairwise_aitchison", lambda x: ac.pairwise_aitchison(x, _t(Q4)), P4),
    ("pairwise_aitchison-0", lambda x: ac.pairwise_aitchison(x, _t(P4[::-1])), P4),
    ("pairwise_aitchison-self", ac.pairwise_aitchison, P4),  # 0 on the diagonal: gradient 0
    ("aitchison_distance-0", lambda x: ac.aitchison_distance(x, _t(P4)), P4),
    ("aitchison_norm-0", ac.aitchison_norm, [[0.25] * 4, [0.1, 0.2, 0.3, 0.4]]),
    *(
        (f"aitchison_split.{f}", lambda x, f=f: getattr(ac.aitchison_split(x, _t(P4[::-1])), f), P4)
        for f in ("sink", "content", "total")
    ),
    ("add_learned_sink", lambda x: ac.add_learned_sink(0.3 * x), P4),
    ("multi_replace", ac.multi_replace, P_ZERO),
    (
        "attribute_entropy_change",
        lambda x: ac.attribute_entropy_change(x[0, 0], x[0, 1], x[1, 0], x[1, 1]).total,
        P4,
    ),
    (
        "group_decompose",
        _on_closed(lambda x: ac.group_decompose(x, [[0], [1, 2], [3]]).entropy),
        P4,
    ),
    ("entropy_change", _on_closed(lambda x: ac.entropy_change(x, _t(P4[::-1])).total), P4),
    *((name, _on_closed(fn), P4) for name, fn in _decompose_outputs()),
    *((n + "-mask", _on_closed(fn, MASK), P4) for n, fn in _decompose_outputs(mask=_t(MASK))),
    *((name + "-logits", fn, LOGITS) for name, fn in _decompose_outputs(from_logits=True)),
    *((name + "-sink2", _on_closed(fn), P4) for name, fn in _decompose_outputs(sink=[0, 2])),
]


def torch_log1mexp(log_s):
    torch = _torch()
    return torch.log(-torch.expm1(log_s))


@requires_torch
@pytest.mark.parametrize(("case", "fn", "rows"), GRADIENTS, ids=[g[0] for g in GRADIENTS])
def test_every_differentiable_output_has_the_finite_differences_gradient(case, fn, rows):
    torch = _torch()
    x = torch.tensor(rows, dtype=torch.float64, requires_grad=True)
    out = fn(x)
    finite = torch.isfinite(out.detach())
    assert bool(finite.any()), case

    def values(x):  # the finite outputs only: the others have no gradient to check
        return fn(x)[finite]

    (grad,) = torch.autograd.grad(values(x).sum(), x, allow_unused=True)
    if grad is not None:
        assert bool(torch.isfinite(grad).all()), f"{case}: {grad}"
    if case.endswith(("-self", "-0")):
        # a norm or distance at 0 has no derivative (its gradient there is 0, as torch's norm
        # gives, checked finite above): finite differences are checked where it is positive
        finite = finite & (out.detach() != 0)
    # gradcheck moves each input by 1e-6: inputs at an exact 0 or -inf stay where they are
    movable = torch.isfinite(x.detach()) & (x.detach() != 0)
    base = x.detach().clone()

    def moved(free):
        full = base.clone()
        full[movable] = free
        return values(full)

    free = base[movable].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(moved, (free,), eps=1e-6, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------ overflowing row sums
# Finite parts whose row sum overflows the dtype closed to zeros (x / inf), silently in bfloat16.
# Those rows are scaled by a power of two first; results for ordinary rows are unchanged.

OVERFLOWING = [
    ("float64", np.float64, [1e308, 1e308], [0.5, 0.5]),
    ("float32", np.float32, [3e38] * 3, [1 / 3] * 3),
    ("float32-uneven", np.float32, [3e38, 1e38, 3e38, 1.0], [3 / 7, 1 / 7, 3 / 7, 0.0]),
]


@pytest.mark.parametrize(
    ("case", "dtype", "row", "want"), OVERFLOWING, ids=[c[0] for c in OVERFLOWING]
)
@pytest.mark.parametrize("validate", [True, False])
def test_rows_whose_sum_overflows_close_to_their_shares(case, dtype, row, want, validate):
    x = np.array([row, [1.0] * len(row)], dtype=dtype)
    tol = 10 * np.finfo(dtype).eps
    for got in (
        ac.closure(x, validate=validate),
        ac.closure(x, mask=np.ones(x.shape, bool), validate=validate),
        ac.perturb(x, np.ones_like(x), validate=validate),
    ):
        np.testing.assert_allclose(got[0], want, rtol=tol, atol=tol)
        np.testing.assert_allclose(got[1], 1 / len(row), rtol=tol)


@requires_torch
@pytest.mark.parametrize(
    ("dtype", "row"),
    [
        ("float64", [1e308, 1e308]),
        ("float32", [3e38] * 3),
        ("bfloat16", [3e38] * 3),
        ("float16", [4e4, 4e4]),
    ],
)
def test_tensor_rows_whose_sum_overflows_close_to_their_shares(dtype, row):
    torch = _torch()
    got = ac.closure(torch.tensor(row, dtype=getattr(torch, dtype)))
    np.testing.assert_allclose(got.double().numpy(), 1 / len(row), rtol=1e-2)


def test_large_blocked_rows_whose_sum_overflows_close_to_their_shares():
    x = np.full((20_000, 500), 1e306)  # 80 MB: the blocked path
    for validate in (True, False):
        got = ac.closure(x, validate=validate)
        np.testing.assert_allclose(got[[0, -1]], 1 / 500, rtol=1e-12)


@given(
    hnp.arrays(np.float64, (3, 5), elements=st.floats(0.0, 1e300)).filter(
        lambda a: (a.sum(-1) > 0).all()
    )
)
@settings(max_examples=50, deadline=None)
def test_ordinary_rows_close_exactly_as_by_their_sum(x):
    np.testing.assert_array_equal(ac.closure(x), x / x.sum(-1, keepdims=True))
