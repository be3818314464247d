"""CoDa core benchmark: every maths function against its peers, and the sink/content decomposition.

Two parts, timed against the anchors a user would otherwise reach for, in the same process, one
thread each side, interleaved (``benchmarks/_measure.py``); the first is measured by
``benchmarks/bench_maths.py`` (its own section of the results), the second here:

- every public maths function with a peer (closure, clr, clr_inv, alr, alr_inv, ilr, ilr_inv,
  perturb, perturb_inv, power, inner, paired_inner, aitchison_norm, aitchison_distance,
  multi_replace, entropy of probabilities and of logits) on 25,000 x 512 float64, numpy input and
  torch input: against scikit-bio and composition-stats (entropy: ``scipy.stats.entropy``, of
  logits also torch's ``Categorical``; target 1x: never slower; on torch input
  composition-stats and scipy get the numpy array), a plain formula without validation and
  ``validate=False`` (target 1.2x each: validation costs at most 20% of a call);
- 10^6 rows of 64 parts: clr, ilr, the decomposition (which no library has: against plain
  numpy / torch computations of the same quantities), rows given as logits, and all-pairs
  Aitchison distances against scipy.

Every benchmark checks once that attncoda and its anchors compute the same numbers. ``ratio`` is
the CPU-time ratio ``project / anchor``: below 1 means attncoda is faster; ``<= 0.1x`` means 10x
faster.

Run: ``python benchmarks/bench_coda.py [--rows N] [--repeats R] [--quick]``. The full run takes
~5 minutes on an idle 2-core machine; ``--quick`` (5 x 10^4 and 2,500 rows) about a minute. BLAS
settings from the environment (``OPENBLAS_CORETYPE``...) are left as they are and printed in the
header.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import attncoda as ac

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import (
    ATTEMPTS,
    MARGIN,
    TABLE_HEAD,
    interleave_reliable,
    markdown_row,
    one_thread,
    reused_memory,
    row,
)

D = 64  # parts per row (keys)
HEADS = 270  # SmolLM2-135M: 30 layers x 9 heads
FULL_ROWS = 1_000_000
QUICK_ROWS = 50_000

SLOW_S = 1.5
FLOOR = 1.5  # target against a minimal unvalidated computation: validation costs at most 50%
CLR_REFERENCE = "attncoda clr of the probabilities (memory-bound reference)"
Row = dict[str, Any]


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


skc = _optional("skbio.stats.composition")
cst = _optional("composition_stats")
torch = _optional("torch")
ssd = _optional("scipy.spatial.distance")
scipy_stats = _optional("scipy.stats")


# ------------------------------------------------------------------------------------ timing


def prefault(nbytes: int) -> None:
    """Touch (and free) ``nbytes`` of fresh memory, untimed.

    On a virtual machine whose host backs guest memory lazily, the first touch of memory freed
    a while ago costs ~1 s per GB (host page faults) and makes multi-GB results noisy; touching
    as much memory just before each timed call of such a case gives every implementation the
    same warm start.
    """
    if nbytes > 0:
        buf = np.empty(nbytes, dtype=np.uint8)
        buf[::4096] = 1
        del buf


@dataclass
class Case:
    """One attncoda operation and the anchors it is compared with, timed together."""

    name: str
    project: Callable[[], Any]
    anchors: list[tuple[str, Callable[[], Any], float]] = field(default_factory=list)
    # (anchor label, callable, target ratio project/anchor, at most)
    extrapolate: dict[str, float] = field(default_factory=dict)  # anchor label -> factor
    warm_bytes: int = 0  # memory touched before each timed call (see prefault)

    def rows(self, repeats: int, slow_s: float = SLOW_S, attempts: int = ATTEMPTS) -> list[Row]:
        fns = {"__project__": self.project} | {a: f for a, f, _ in self.anchors}
        warm = self.warm_bytes
        pairs = [("__project__", a, self.extrapolate.get(a, 1.0)) for a, _, _ in self.anchors]
        measured = interleave_reliable(
            fns,
            repeats,
            pairs,
            attempts=attempts,
            slow_s=slow_s,
            before=(lambda: prefault(warm)) if warm else None,
        )
        return [
            row(
                self.name,
                measured,
                "__project__",
                label,
                target,
                scale=self.extrapolate.get(label, 1.0),
            )
            for label, _, target in self.anchors
        ]


def case_rows(cases: list[Case], repeats: int, slow_s: float = SLOW_S) -> Iterator[Row]:
    """Every row of ``cases`` under one thread each side, with freed memory kept for reuse
    (:func:`_measure.reused_memory`), each also printed to stderr as it is measured (the
    progress of a long run)."""
    with one_thread(), reused_memory():
        for case in cases:
            for r in case.rows(repeats, slow_s=slow_s, attempts=ATTEMPTS):
                print(markdown_row(r), file=sys.stderr, flush=True)
                yield r


def cases_main(
    doc: str,
    iter_rows: Callable[[bool, int | None], Iterator[Row]],
    quick_help: str,
    default_repeats: int,
    argv: list[str] | None = None,
) -> None:
    """The command line of a module of cases: ``[--quick] [--repeats R]``, rows to stderr."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--repeats", type=int, default=None, help=f"timed rounds (default {default_repeats})"
    )
    args = parser.parse_args(argv)
    print(TABLE_HEAD, file=sys.stderr)
    list(iter_rows(args.quick, args.repeats))


# ------------------------------------------------------------------------------------ data


def attention_logits(rows: int, parts: int = D, seed: int = 0, dtype: Any = np.float64) -> Any:
    """Attention-like logits: a sink logit well above varied content logits."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, parts), dtype=np.float64)
    z *= rng.uniform(0.5, 3.0, size=(rows, 1))  # sharp and flat rows
    z[:, 0] += rng.uniform(0.0, 6.0, size=rows)  # the sink
    return z.astype(dtype, copy=False)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def causal_logits(rows: int, parts: int = D, seed: int = 1) -> np.ndarray:
    """Logits of causal query blocks (query q sees keys 0..q), -inf above the diagonal, as in
    captured ``log_attn`` rows; the first query of each block (one visible key) is dropped."""
    z = attention_logits(rows, parts, seed)
    q = np.arange(rows) % (parts - 1) + 1  # queries 1..parts-1: at least two visible keys
    z[np.arange(parts)[None, :] > q[:, None]] = -np.inf
    return z


def _check(name: str, got: Any, expected: Any, tol: float) -> None:
    g = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    e = expected.numpy() if hasattr(expected, "numpy") else np.asarray(expected)
    if g.shape != e.shape or not np.allclose(g, e, rtol=tol, atol=tol, equal_nan=True):
        raise AssertionError(f"{name}: attncoda and its anchor disagree; the timing would lie")


# ------------------------------------------------------------------------------------ references


def numpy_decompose(x: np.ndarray) -> dict[str, np.ndarray]:
    """Plain numpy: the decomposition's quantities from probabilities, sink = key 0."""
    n = x.shape[-1] - 1
    total = x.sum(-1)
    content_mass = x[:, 1:].sum(-1)
    s = x[:, 0] / total
    logx = np.log(x)
    balance = np.sqrt(n / (n + 1)) * (logx[:, 0] - logx[:, 1:].mean(-1))
    content = np.zeros_like(x)
    content[:, 1:] = x[:, 1:] / content_mass[:, None]
    c = content[:, 1:]
    content_entropy = -(c * np.log(c)).sum(-1)
    p = x / total[:, None]
    entropy = -(p * np.log(p)).sum(-1)
    binary = -(s * np.log(s) + (1 - s) * np.log1p(-s))
    return {
        "sink_share": s,
        "sink_logodds": logx[:, 0] - np.log(content_mass),
        "balance": balance,
        "content": content,
        "entropy": entropy,
        "content_entropy": content_entropy,
        "binary_entropy": binary,
    }


def numpy_decompose_logits(z: np.ndarray) -> dict[str, np.ndarray]:
    """Plain numpy, log-space (softmax rows never formed from probabilities)."""
    n = z.shape[-1] - 1
    m = z.max(-1, keepdims=True)
    logp = z - (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))
    zc = z[:, 1:]
    mc = zc.max(-1, keepdims=True)
    log_c = zc - (mc + np.log(np.exp(zc - mc).sum(-1, keepdims=True)))
    c = np.exp(log_c)
    log_s = logp[:, 0]
    log_1ms = np.log(np.exp(logp[:, 1:]).sum(-1))
    s = np.exp(log_s)
    content = np.zeros_like(z)
    content[:, 1:] = c
    return {
        "sink_share": s,
        "sink_logodds": log_s - log_1ms,
        "balance": np.sqrt(n / (n + 1)) * (z[:, 0] - zc.mean(-1)),
        "content": content,
        "entropy": -(np.exp(logp) * logp).sum(-1),
        "content_entropy": -(c * log_c).sum(-1),
        "binary_entropy": -(s * log_s + (1 - s) * log_1ms),
    }


def torch_decompose_logits(z: Any) -> dict[str, Any]:
    """Plain torch, the same quantities (what a capture-side user would write)."""
    n = z.shape[-1] - 1
    logp = torch.log_softmax(z, dim=-1)
    zc = z[:, 1:]
    log_c = torch.log_softmax(zc, dim=-1)
    c = log_c.exp()
    log_s = logp[:, 0]
    log_1ms = torch.logsumexp(logp[:, 1:], dim=-1)
    s = log_s.exp()
    content = torch.zeros_like(z)
    content[:, 1:] = c
    return {
        "sink_share": s,
        "sink_logodds": log_s - log_1ms,
        "balance": (n / (n + 1)) ** 0.5 * (z[:, 0] - zc.mean(-1)),
        "content": content,
        "entropy": -(logp.exp() * logp).sum(-1),
        "content_entropy": -(c * log_c).sum(-1),
        "binary_entropy": -(s * log_s + (1 - s) * log_1ms),
    }


def numpy_clr_causal(z: np.ndarray) -> np.ndarray:
    """Plain numpy clr over the visible (finite) keys, 0 at the others."""
    vis = np.isfinite(z)
    mean = np.where(vis, z, 0.0).sum(-1, keepdims=True) / vis.sum(-1, keepdims=True)
    return np.where(vis, z - mean, 0.0)


def numpy_decompose_causal(z: np.ndarray) -> dict[str, np.ndarray]:
    """Plain numpy with -inf keys: same quantities over visible keys (masked reductions)."""
    vis = np.isfinite(z)
    zc = np.where(vis, z, -np.inf)[:, 1:]
    n = vis[:, 1:].sum(-1)
    m = z.max(-1, keepdims=True)
    logp = z - (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))
    mc = zc.max(-1, keepdims=True)
    log_c = zc - (mc + np.log(np.exp(zc - mc).sum(-1, keepdims=True)))
    c = np.exp(log_c)
    with np.errstate(invalid="ignore"):
        plogp = np.where(vis, np.exp(logp) * logp, 0.0)
        clogc = np.where(vis[:, 1:], c * log_c, 0.0)
    log_s = logp[:, 0]
    log_1ms = np.log(np.exp(logp[:, 1:]).sum(-1))
    s = np.exp(log_s)
    content = np.zeros_like(z)
    content[:, 1:] = c
    mean_c = np.where(vis[:, 1:], z[:, 1:], 0.0).sum(-1) / n
    return {
        "sink_share": s,
        "sink_logodds": log_s - log_1ms,
        "balance": np.sqrt(n / (n + 1)) * (z[:, 0] - mean_c),
        "content": content,
        "entropy": -plogp.sum(-1),
        "content_entropy": -clogc.sum(-1),
        "binary_entropy": -(s * log_s + (1 - s) * log_1ms),
    }


def _check_decompose(name: str, d: Any, ref: dict[str, Any], tol: float) -> None:
    for key, val in ref.items():
        _check(f"{name}.{key}", getattr(d, key), val, tol)


# ------------------------------------------------------------------------------------ pairwise


def per_query_pdist(c: np.ndarray) -> np.ndarray:
    """scipy's C loop over pairs (``pdist``), one call per query."""
    out = np.empty((c.shape[0], c.shape[1] * (c.shape[1] - 1) // 2))
    for q in range(c.shape[0]):
        out[q] = ssd.pdist(c[q], "sqeuclidean")
    return out


def per_pair_loop(c: np.ndarray) -> np.ndarray:
    """The per-pair Python loop: ``scipy.spatial.distance.sqeuclidean`` for every head pair."""
    q_n, h, _ = c.shape
    out = np.zeros((q_n, h, h))
    for q in range(q_n):
        cq = c[q]
        for i in range(h):
            for j in range(i + 1, h):
                out[q, i, j] = out[q, j, i] = ssd.sqeuclidean(cq[i], cq[j])
    return out


def head_matrix_loop(c: np.ndarray) -> np.ndarray:
    """Head x head distances over all queries, per-pair loop over concatenated clr rows."""
    h = c.shape[1]
    flat = np.ascontiguousarray(c.transpose(1, 0, 2)).reshape(h, -1)
    out = np.zeros((h, h))
    for i in range(h):
        for j in range(i + 1, h):
            out[i, j] = out[j, i] = ssd.euclidean(flat[i], flat[j])
    return out


def head_matrix_pdist(c: np.ndarray) -> np.ndarray:
    h = c.shape[1]
    flat = np.ascontiguousarray(c.transpose(1, 0, 2)).reshape(h, -1)
    return ssd.squareform(ssd.pdist(flat, "euclidean"))


def head_matrix_attncoda(x: np.ndarray) -> np.ndarray:
    """Squared distances add over queries: ``sum_over`` lays each head's rows end to end."""
    return ac.pairwise_aitchison(x, sum_over=0)


# ------------------------------------------------------------------------------------ cases


def build_cases(rows: int, quick: bool) -> list[Case]:
    z = attention_logits(rows)
    x = softmax(z)
    cases: list[Case] = []
    on = "10^6" if rows == 1_000_000 else f"{rows:,}"
    shape = f"{on} x {D}"

    # ---- clr ---------------------------------------------------------------------------
    clr = Case(f"clr, {shape} f64", lambda: ac.clr(x))
    if skc is not None:
        _check("clr vs scikit-bio", ac.clr(x[:1000]), skc.clr(x[:1000]), 1e-10)
        clr.anchors.append(("scikit-bio 0.7 clr", lambda: skc.clr(x), 1.0))
    if cst is not None:
        _check("clr vs composition-stats", ac.clr(x[:1000]), cst.clr(x[:1000]), 1e-10)
        clr.anchors.append(("composition-stats clr", lambda: cst.clr(x), 1.0))
    cases.append(clr)

    # ---- ilr ---------------------------------------------------------------------------
    # default bases differ (attncoda: pivot, sink vs content first; the others: Gram-Schmidt);
    # both are orthonormal, so norms (Aitchison norms) agree, and the work is the same
    norms = np.linalg.norm(ac.ilr(x[:1000]), axis=-1)
    ilr = Case(f"ilr (default basis), {shape} f64", lambda: ac.ilr(x))
    if skc is not None:
        _check("ilr vs scikit-bio", norms, np.linalg.norm(skc.ilr(x[:1000]), axis=-1), 1e-9)
        ilr.anchors.append(("scikit-bio ilr (default basis)", lambda: skc.ilr(x), 1.0))
    if cst is not None:
        _check("ilr vs composition-stats", norms, np.linalg.norm(cst.ilr(x[:1000]), axis=-1), 1e-9)
        ilr.anchors.append(("composition-stats ilr (default basis)", lambda: cst.ilr(x), 1.0))
    cases.append(ilr)

    basis = ac.pivot_basis(D)
    ilr_b = Case(f"ilr (given basis), {shape} f64", lambda: ac.ilr(x, basis))
    if skc is not None:
        _check("ilr basis", ac.ilr(x[:1000], basis), skc.ilr(x[:1000], basis), 1e-10)
        ilr_b.anchors.append(("scikit-bio ilr (same basis)", lambda: skc.ilr(x, basis), 1.0))
    if cst is not None:
        simplex_basis = cst.clr_inv(basis)  # composition-stats takes the basis as compositions
        _check("ilr basis cs", ac.ilr(x[:1000], basis), cst.ilr(x[:1000], simplex_basis), 1e-9)
        ilr_b.anchors.append(
            ("composition-stats ilr (same basis)", lambda: cst.ilr(x, simplex_basis), 1.0)
        )
    cases.append(ilr_b)

    # ---- decomposition -----------------------------------------------------------------
    _check_decompose("decompose", ac.decompose(x[:1000]), numpy_decompose(x[:1000]), 1e-9)
    cases.append(
        Case(
            f"decompose (sink/content), {shape} f64",
            lambda: ac.decompose(x),
            [
                ("plain numpy, same quantities", lambda: numpy_decompose(x), 1.0),
                (CLR_REFERENCE, lambda: ac.clr(x), 3.0),
            ],
        )
    )
    ref = numpy_decompose_logits(z[:1000])
    _check_decompose("decompose logits", ac.decompose(z[:1000], from_logits=True), ref, 1e-9)
    cases.append(
        Case(
            f"decompose from_logits, {shape} f64",
            lambda: ac.decompose(z, from_logits=True),
            [
                ("plain numpy log-space, same quantities", lambda: numpy_decompose_logits(z), 1.0),
                (CLR_REFERENCE, lambda: ac.clr(x), 3.0),
            ],
        )
    )

    # ---- from_logits (capture's log_attn rows) ---------------------------------------------
    centred = z - z.mean(-1, keepdims=True)
    _check("clr logits", ac.clr(z[:1000], from_logits=True), centred[:1000], 1e-10)
    del centred
    logits_case = Case(
        f"clr from_logits, {shape} f64",
        lambda: ac.clr(z, from_logits=True),
        [("plain numpy z - mean(z), unvalidated", lambda: z - z.mean(-1, keepdims=True), FLOOR)],
    )
    if skc is not None:
        logits_case.anchors.append(("scikit-bio clr(softmax(z))", lambda: skc.clr(softmax(z)), 1.0))
    cases.append(logits_case)

    zc = causal_logits(rows)
    _check("clr causal", ac.clr(zc[:1000], from_logits=True), numpy_clr_causal(zc[:1000]), 1e-10)
    cases.append(
        Case(
            f"clr from_logits, causal -inf keys, {shape} f64",
            lambda: ac.clr(zc, from_logits=True),
            [("plain numpy masked mean, unvalidated", lambda: numpy_clr_causal(zc), FLOOR)],
        )
    )
    _check_decompose(
        "decompose causal",
        ac.decompose(zc[:1000], from_logits=True),
        numpy_decompose_causal(zc[:1000]),
        1e-9,
    )
    cases.append(
        Case(
            f"decompose from_logits, causal -inf keys, {shape} f64",
            lambda: ac.decompose(zc, from_logits=True),
            [("plain numpy masked, same quantities", lambda: numpy_decompose_causal(zc), 1.0)],
        )
    )

    # the same rows with the sink and the visible keys given as boolean arrays (how a capture
    # with a per-row sink token, or a user with padding, calls it): full-size masks
    sink0 = np.zeros(zc.shape, dtype=bool)
    sink0[:, 0] = True
    vis = np.isfinite(zc)
    _check_decompose(
        "decompose masks",
        ac.decompose(zc[:1000], sink0[:1000], from_logits=True, mask=vis[:1000]),
        numpy_decompose_causal(zc[:1000]),
        1e-9,
    )
    cases.append(
        Case(
            f"decompose from_logits, boolean sink and key-mask arrays, {shape} f64",
            lambda: ac.decompose(zc, sink0, from_logits=True, mask=vis),
            [("plain numpy masked, same quantities", lambda: numpy_decompose_causal(zc), 1.0)],
        )
    )

    # ---- torch float32 -------------------------------------------------------------------
    if torch is not None:
        xt = torch.from_numpy(x).float()
        zt = torch.from_numpy(z).float()
        clr_t = Case(
            f"clr torch f32, {shape}",
            lambda: ac.clr(xt),
            [("plain torch log - mean, unvalidated", lambda: _torch_clr(xt), FLOOR)],
        )
        if skc is not None:
            _check("clr torch", ac.clr(xt[:1000]), skc.clr(xt[:1000]), 1e-5)
            clr_t.anchors.insert(0, ("scikit-bio clr on the tensor", lambda: skc.clr(xt), 1.0))
        cases.append(clr_t)
        logits_t = Case(
            f"clr from_logits torch f32, {shape}",
            lambda: ac.clr(zt, from_logits=True),
            [
                (
                    "plain torch z - mean(z), unvalidated",
                    lambda: zt - zt.mean(-1, keepdim=True),
                    FLOOR,
                )
            ],
        )
        if skc is not None:
            logits_t.anchors.append(
                ("scikit-bio clr(softmax(z)) on the tensor", lambda: skc.clr(zt.softmax(-1)), 1.0)
            )
        cases.append(logits_t)
        ref_t = torch_decompose_logits(zt[:1000])
        _check_decompose("decompose torch", ac.decompose(zt[:1000], from_logits=True), ref_t, 1e-4)
        cases.append(
            Case(
                f"decompose from_logits torch f32, {shape}",
                lambda: ac.decompose(zt, from_logits=True),
                [("plain torch, same quantities", lambda: torch_decompose_logits(zt), 1.0)],
            )
        )

    # ---- all-pairs Aitchison distances over 270 heads -----------------------------------
    if ssd is not None:
        cases.extend(_pairwise_cases(x, quick))
    return cases


def _torch_clr(xt: Any) -> Any:
    log = torch.log(xt)
    return log - log.mean(-1, keepdim=True)


def _pairwise_cases(x: np.ndarray, quick: bool) -> list[Case]:
    queries = x.shape[0] // HEADS
    heads = x[: queries * HEADS].reshape(queries, HEADS, D)
    clr = skc.clr if skc is not None else ac.clr
    lib = "scikit-bio" if skc is not None else "attncoda"
    sample = heads[:1]
    c_sample = clr(sample)
    _check("pairwise", ac.pairwise_aitchison(sample, squared=True), per_pair_loop(c_sample), 1e-9)
    _check(
        "pairwise pdist",
        ac.pairwise_aitchison(sample[:1], squared=True)[0],
        ssd.squareform(per_query_pdist(c_sample[:1])[0]),
        1e-9,
    )
    # the per-pair loop over every query would take ~20 min at 10^6 rows: it is timed on a few
    # queries and scaled to all of them (its cost per query is uniform)
    k = 1 if quick else 3
    few = heads[:k]
    shape = f"{queries:,} queries x {HEADS} heads x {D}"
    per_query = Case(
        f"pairwise_aitchison per query (270x270 each), {shape}",
        lambda: ac.pairwise_aitchison(heads, squared=True),
        [
            (f"{lib} clr + scipy pdist per query", lambda: per_query_pdist(clr(heads)), 1.0),
            (
                f"{lib} clr + per-pair scipy loop (timed on {k} queries, x{queries / k:.0f})",
                lambda: per_pair_loop(clr(few)),
                0.1,
            ),
        ],
        extrapolate={
            f"{lib} clr + per-pair scipy loop (timed on {k} queries, x{queries / k:.0f})": queries
            / k
        },
    )
    small = heads[: max(4, queries // 50)]
    _check("head matrix", head_matrix_attncoda(small), head_matrix_loop(clr(small)), 1e-8)
    _check("head matrix pdist", head_matrix_attncoda(small), head_matrix_pdist(clr(small)), 1e-8)
    head = Case(
        f"head x head distances over all queries, {shape}",
        lambda: head_matrix_attncoda(heads),
        [
            (
                f"{lib} clr + scipy pdist on concatenated rows",
                lambda: head_matrix_pdist(clr(heads)),
                1.0,
            ),
            (
                f"{lib} clr + per-pair scipy loop over {HEADS * (HEADS - 1) // 2:,} head pairs",
                lambda: head_matrix_loop(clr(heads)),
                0.1,
            ),
        ],
    )
    per_query.warm_bytes = head.warm_bytes = queries * HEADS * HEADS * 8  # one result
    return [per_query, head]


# ------------------------------------------------------------------------------------ functions

FN_ROWS, FN_PARTS = 25_000, 512  # the size of issue #31's comparison (100 MB per float64 array)
QUICK_FN_ROWS = 2_500
INNER_ROWS = 4_000  # inner returns the N x M Gram matrix: 4,000^2 x 8 B = 128 MB
VALIDATION = 1.2  # validation may cost at most 20% of a call
PLAIN = "unvalidated"  # marks anchors that skip validation: their target is VALIDATION


@dataclass
class Fn:
    """One public maths function and its peers, for numpy or torch input of the same values."""

    name: str
    ours: Callable[[Any, bool], Any]  # (inputs, validate) -> result
    peers: dict[str, Callable[[Any], Any]]  # label -> (inputs) -> result
    numpy_only: frozenset[str] = frozenset()  # peers that take numpy input only


def _inputs(rows: int, parts: int) -> dict[str, np.ndarray]:
    z = attention_logits(rows, parts, seed=2)
    x = softmax(z)
    y = softmax(attention_logits(rows, parts, seed=3))
    zeros = x.copy()
    zeros[x < np.quantile(x, 0.05)] = 0.0  # 5% rounding zeros
    zeros /= zeros.sum(-1, keepdims=True)  # closed, as composition-stats expects
    return {
        "x": x,
        "y": y,
        "raw": np.exp(z),  # positive, unclosed
        "c": np.log(x) - np.log(x).mean(-1, keepdims=True),
        "a": np.log(x[:, 1:]) - np.log(x[:, :1]),
        "zeros": zeros,
    }


def _plain(xp: Any) -> dict[str, Callable[..., Any]]:
    """Plain formulas in numpy or torch (no validation at all)."""
    keep = {"keepdims": True} if xp is np else {"keepdim": True}
    log, exp, cat = xp.log, xp.exp, (np.concatenate if xp is np else torch.cat)

    def mean(a: Any) -> Any:
        return a.mean(-1, **keep)

    def total(a: Any) -> Any:
        return a.sum(-1, **keep)

    def top(a: Any) -> Any:
        return xp.amax(a, -1, **keep)

    def norm(a: Any) -> Any:
        return xp.sqrt((a * a).sum(-1))

    def clr(x: Any) -> Any:
        lx = log(x)
        return lx - mean(lx)

    def softmax_(c: Any) -> Any:
        e = exp(c - top(c))
        return e / total(e)

    def alr_inv(a: Any) -> Any:
        return softmax_(cat([a[:, :1] * 0, a], -1))

    return {
        "closure": lambda x: x / total(x),
        "clr": clr,
        "clr_inv": softmax_,
        "alr": lambda x: log(x[:, 1:]) - log(x[:, :1]),
        "alr_inv": alr_inv,
        "perturb": lambda x, y: (x * y) / total(x * y),
        "perturb_inv": lambda x, y: (x / y) / total(x / y),
        "power": lambda x: softmax_(2.0 * log(x)),
        "norm": lambda x: norm(clr(x)),
        "distance": lambda x, y: norm(clr(x) - clr(y)),
        "inner": lambda x, y: clr(x) @ clr(y).T,
        "paired_inner": lambda x, y: (clr(x) * clr(y)).sum(-1),
        "entropy": lambda x: -(x * log(x)).sum(-1),  # (every part positive here)
        "entropy of logits": lambda c: -(softmax_(c) * (c - log(total(exp(c))))).sum(-1),
    }


def _functions(basis: np.ndarray) -> list[Fn]:
    """Every public maths function with a peer, and the peers (label -> call on the inputs)."""
    fns = [
        Fn("closure", lambda d, v: ac.closure(d["raw"], validate=v), {}),
        Fn("clr", lambda d, v: ac.clr(d["x"], validate=v), {}),
        Fn("clr_inv", lambda d, v: ac.clr_inv(d["c"], validate=v), {}),
        Fn("alr", lambda d, v: ac.alr(d["x"], validate=v), {}),
        Fn("alr_inv", lambda d, v: ac.alr_inv(d["a"], validate=v), {}),
        Fn("ilr (default basis)", lambda d, v: ac.ilr(d["x"], validate=v), {}),
        Fn("ilr (given basis)", lambda d, v: ac.ilr(d["x"], d["basis"], validate=v), {}),
        Fn("ilr_inv (default basis)", lambda d, v: ac.ilr_inv(d["z"], validate=v), {}),
        Fn("ilr_inv (given basis)", lambda d, v: ac.ilr_inv(d["z"], d["basis"], validate=v), {}),
        Fn("perturb", lambda d, v: ac.perturb(d["x"], d["y"], validate=v), {}),
        Fn("perturb_inv", lambda d, v: ac.perturb_inv(d["x"], d["y"], validate=v), {}),
        Fn("power (a=2)", lambda d, v: ac.power(d["x"], 2.0, validate=v), {}),
        Fn(
            f"inner ({INNER_ROWS:,} x {INNER_ROWS:,} Gram)",
            lambda d, v: ac.inner(d["xi"], d["yi"], validate=v),
            {},
        ),
        Fn("paired_inner", lambda d, v: ac.paired_inner(d["x"], d["y"], validate=v), {}),
        Fn("aitchison_norm", lambda d, v: ac.aitchison_norm(d["x"], validate=v), {}),
        Fn(
            "aitchison_distance", lambda d, v: ac.aitchison_distance(d["x"], d["y"], validate=v), {}
        ),
        Fn("multi_replace", lambda d, v: ac.multi_replace(d["zeros"], validate=v), {}),
        Fn(
            "entropy",
            lambda d, v: ac.entropy(d["x"], validate=v),
            {"scipy.stats": lambda d: scipy_stats.entropy(d["x"], axis=-1)} if scipy_stats else {},
            numpy_only=frozenset({"scipy.stats"}),  # its array-API mode is opt-in
        ),
        Fn(
            "entropy of logits",
            lambda d, v: ac.entropy(d["c"], validate=v, from_logits=True),
            _logit_entropy_peers(),
            numpy_only=frozenset({"scipy.stats + softmax"}),
        ),
    ]
    # the functions scikit-bio and composition-stats have (entropy's peers are its own)
    shared = [f for f in fns if not f.name.startswith("entropy")]
    by = {f.name.split(" ")[0] + (" given" if "given" in f.name else ""): f for f in shared}
    peers = [("scikit-bio", skc, "multi_replace"), ("composition-stats", cst, None)]
    for label, lib, replace in peers:
        if lib is None:
            continue
        # composition-stats takes an ilr basis as compositions, scikit-bio as clr vectors
        lib_basis = basis if lib is skc else lib.clr_inv(basis)
        for key, call in _peer_calls(lib, lib_basis, replace or "multiplicative_replacement"):
            by[key].peers[label] = call
            if lib is cst:
                by[key].numpy_only |= {label}
    if skc is not None:
        by["multi_replace"].numpy_only |= {"scikit-bio"}  # it returns numpy for a tensor
    return fns


def _logit_entropy_peers() -> dict[str, Callable[[Any], Any]]:
    """The entropy of softmax rows from their logits: scipy, and torch's ``Categorical``."""
    peers: dict[str, Callable[[Any], Any]] = {}
    if scipy_stats is not None:
        from scipy.special import softmax

        peers["scipy.stats + softmax"] = lambda d: scipy_stats.entropy(
            softmax(d["c"], axis=-1), axis=-1
        )
    if torch is not None:
        peers["torch Categorical"] = lambda d: torch.distributions.Categorical(
            logits=torch.as_tensor(d["c"]), validate_args=False
        ).entropy()
    return peers


def _peer_calls(lib: Any, basis: Any, replace: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """scikit-bio's or composition-stats' call for each function: the same names and arguments,
    ``basis`` in the library's own form, ``replace`` its multiplicative replacement."""
    return [
        ("closure", lambda d: lib.closure(d["raw"])),
        ("clr", lambda d: lib.clr(d["x"])),
        ("clr_inv", lambda d: lib.clr_inv(d["c"])),
        ("alr", lambda d: lib.alr(d["x"])),
        ("alr_inv", lambda d: lib.alr_inv(d["a"])),
        ("ilr", lambda d: lib.ilr(d["x"])),
        ("ilr given", lambda d: lib.ilr(d["x"], basis)),
        ("ilr_inv", lambda d: lib.ilr_inv(d["z"])),
        ("ilr_inv given", lambda d: lib.ilr_inv(d["z"], basis)),
        ("perturb", lambda d: lib.perturb(d["x"], d["y"])),
        ("perturb_inv", lambda d: lib.perturb_inv(d["x"], d["y"])),
        ("power", lambda d: lib.power(d["x"], 2.0)),
        ("inner", lambda d: lib.inner(d["xi"], d["yi"])),
        ("paired_inner", lambda d: (lib.clr(d["x"]) * lib.clr(d["y"])).sum(-1)),
        ("aitchison_norm", lambda d: _norm(lib.clr(d["x"]))),
        ("aitchison_distance", lambda d: _norm(lib.clr(d["x"]) - lib.clr(d["y"]))),
        ("multi_replace", lambda d: getattr(lib, replace)(d["zeros"])),
    ]


def _apply(f: Callable[..., Any], args: list[Any]) -> Any:
    return f(*args)


def _check_function(fn: Fn, case: Case, kind: str) -> None:
    """attncoda against each anchor that computes the same numbers (not the default-basis ilr of
    the peers, whose Gram-Schmidt basis differs: there the norms must agree)."""
    ours = case.project()
    for label, call, _ in case.anchors:
        theirs = call()
        if fn.name.startswith("ilr (default") and "attncoda" not in label and "plain" not in label:
            ours_n, theirs_n = _norm(ours), _norm(theirs)
            _check(f"{case.name} vs {label} (norms)", ours_n, theirs_n, 1e-9)
        elif fn.name.startswith("ilr_inv (default") and "attncoda" not in label:
            continue  # another basis: other compositions
        else:
            _check(f"{case.name} vs {label}", ours, theirs, 1e-9)
        del theirs


def _norm(a: Any) -> Any:
    return np.linalg.norm(a, axis=-1) if isinstance(a, np.ndarray) else a.norm(dim=-1)


def function_cases(rows: int, parts: int = FN_PARTS) -> list[Case]:
    """Every maths function on ``rows x parts`` float64, numpy and torch input: against each peer
    (target 1x), a plain unvalidated formula and ``validate=False`` (target 1.2x each: validation
    costs at most 20%)."""
    basis = ac.pivot_basis(parts)
    data = _inputs(rows, parts)
    data["basis"] = basis
    data["z"] = ac.ilr(data["x"])
    data["xi"], data["yi"] = data["x"][:INNER_ROWS], data["y"][:INNER_ROWS]
    kinds: list[tuple[str, dict[str, Any], Any]] = [("numpy", data, np)]
    if torch is not None:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in data.items()}
        kinds.append(("torch", tensors, torch))
    plain_keys = {
        "closure": ("closure", ("raw",)),
        "clr": ("clr", ("x",)),
        "clr_inv": ("clr_inv", ("c",)),
        "alr": ("alr", ("x",)),
        "alr_inv": ("alr_inv", ("a",)),
        "perturb": ("perturb", ("x", "y")),
        "perturb_inv": ("perturb_inv", ("x", "y")),
        "power": ("power", ("x",)),
        "inner": ("inner", ("xi", "yi")),
        "paired_inner": ("paired_inner", ("x", "y")),
        "aitchison_norm": ("norm", ("x",)),
        "aitchison_distance": ("distance", ("x", "y")),
        "entropy": ("entropy", ("x",)),
        "entropy of logits": ("entropy of logits", ("c",)),
    }
    cases = []
    for kind, d, xp in kinds:
        plain = _plain(xp)
        for fn in _functions(basis):
            label = f"{fn.name}, {rows:,} x {parts} f64 {kind}"
            case = Case(label, functools.partial(fn.ours, d, True))
            for peer, call in fn.peers.items():
                on = data if peer in fn.numpy_only else d
                suffix = " on numpy" if kind == "torch" and peer in fn.numpy_only else ""
                case.anchors.append((peer + suffix, functools.partial(call, on), 1.0))
            key = fn.name if fn.name in plain_keys else fn.name.split(" ")[0]
            if key in plain_keys:
                name, args = plain_keys[key]
                f = plain[name]
                call = functools.partial(_apply, f, [d[k] for k in args])
                case.anchors.append((f"plain {kind} formula, {PLAIN}", call, VALIDATION))
            unvalidated = functools.partial(fn.ours, d, False)
            case.anchors.append(
                ("attncoda validate=False (validation's share)", unvalidated, VALIDATION)
            )
            _check_function(fn, case, kind)
            cases.append(case)
    return cases


# ------------------------------------------------------------------------------------ report


def iter_rows(quick: bool = False, rows: int | None = None, repeats: int | None = None) -> Any:
    """Yield the table rows case by case (so that a long run shows progress)."""
    n = rows or (QUICK_ROWS if quick else FULL_ROWS)
    r = repeats or (3 if quick else 5)
    with one_thread(), reused_memory():
        for case in build_cases(n, quick):  # seconds per call: measured twice at most
            yield from case.rows(r, slow_s=0.5 if quick else SLOW_S, attempts=2)
    # (the function cases, function_cases below, are benchmarks/bench_maths.py's section)


def run(quick: bool = False, rows: int | None = None, repeats: int | None = None) -> list[Row]:
    """Rows for the benchmark table (keys: benchmark, project_s, anchor, anchor_s, ratio, target,
    holds); ``ratio = project_s / anchor_s``."""
    return list(iter_rows(quick, rows, repeats))


def header(rows: int, repeats: int) -> str:
    versions = [f"numpy {np.__version__}"]
    for name in ("torch", "skbio", "composition_stats", "scipy"):
        mod = _optional(name)
        if mod is not None:
            versions.append(f"{name} {getattr(mod, '__version__', '?')}")
    blas = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_"))}
    return (
        f"attncoda {ac.__version__}; {', '.join(versions)}; python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs; BLAS env {blas or 'default'}\n"
        f"{rows:,} rows x {D} parts, one thread each side, medians of {repeats} interleaved "
        "repeats (order rotated); ratio = attncoda CPU time / anchor CPU time (below 1: attncoda "
        f"faster), unreliable where the wall-clock ratio differs by more than {MARGIN:.0%}; "
        f"load {os.getloadavg()[0]:.1f}"
    )


def markdown(rows: list[Row]) -> str:
    return "\n".join([TABLE_HEAD, *map(markdown_row, rows)])


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help=f"rows (default {FULL_ROWS:,})")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows, 3 repeats")
    args = parser.parse_args(argv)
    rows_n = args.rows or (QUICK_ROWS if args.quick else FULL_ROWS)
    repeats = args.repeats or (3 if args.quick else 5)
    print(header(rows_n, repeats), flush=True)
    start = time.perf_counter()
    print(TABLE_HEAD, flush=True)
    rows = []
    for r in iter_rows(args.quick, rows_n, repeats):
        rows.append(r)
        print(markdown_row(r), flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s; load {os.getloadavg()[0]:.1f} at the end)")
    return rows


if __name__ == "__main__":
    main()
