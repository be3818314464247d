"""CoDa core benchmark: clr, ilr, the sink/content decomposition and all-pairs Aitchison distances.

Rows of 64 parts (10^6 rows by default; float64 unless marked), timed against the anchors a user
would otherwise reach for, measured in the same process: scikit-bio and composition-stats for the
transforms, scipy for pairwise distances, and a plain numpy / torch computation of the same
quantities where no library has the operation (the decomposition, rows given as logits). Every
benchmark checks once that attncoda and its anchors compute the same numbers, then times them
round-robin (the order rotates each round) and reports medians. ``ratio`` is
``project_s / anchor_s``: below 1 means attncoda is faster; ``<= 0.1x`` means 10x faster.

Run: ``python benchmarks/bench_coda.py [--rows N] [--repeats R] [--quick]``. The full run takes
2-3 minutes on an idle 2-core machine; ``--quick`` (5 x 10^4 rows) under 20 s. BLAS settings
from the environment (``OPENBLAS_CORETYPE``...) are left as they are and printed in the header.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import attncoda as ac

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import MARGIN, TABLE_HEAD, interleave, markdown_row, one_thread, row

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

    def rows(self, repeats: int, slow_s: float = SLOW_S) -> list[Row]:
        fns = {"__project__": self.project} | {a: f for a, f, _ in self.anchors}
        warm = self.warm_bytes
        measured = interleave(
            fns, repeats, slow_s=slow_s, before=(lambda: prefault(warm)) if warm else None
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


# ------------------------------------------------------------------------------------ report


def iter_rows(quick: bool = False, rows: int | None = None, repeats: int | None = None) -> Any:
    """Yield the table rows case by case (so that a long run shows progress)."""
    n = rows or (QUICK_ROWS if quick else FULL_ROWS)
    r = repeats or (3 if quick else 5)
    with one_thread():
        for case in build_cases(n, quick):
            yield from case.rows(r, slow_s=0.5 if quick else SLOW_S)


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
