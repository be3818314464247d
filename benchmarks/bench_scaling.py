"""Scaling benchmark: summaries capture time and peak extra memory against the sequence length T.

SmolLM2-135M (the offline asset, fp32, CPU, batch 1) on real Austen text (Pride and Prejudice),
T in (512, 1024, 2048, 4096, 8192). Paths:

``sdpa``
    the plain SDPA forward, ``model(input_ids=ids)``: the anchor.
``summaries``
    the same forward inside ``attncoda.hooks.capture(model, what="summaries")`` (all 30 x 9 heads),
    including building ``cap.dataset``.
``eager_output_attentions``
    HF eager attention with ``output_attentions=True`` (holds 30 x 9 x T^2 fp32 weights).
``transformerlens``
    TransformerLens 4.x ``TransformerBridge`` booted offline from the already-loaded HF model
    (``TransformerBridge.boot_transformers(name, hf_model=model, tokenizer=tok)``; raw HF weights,
    no layer-norm folding, so its logits are the model's), running
    ``run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))``: the attention
    patterns only (the bridge switches the model to eager attention, as it must to see them).

Every (path, T, repeat) runs in a fresh subprocess, the paths alternating for each T and repeat
(their order rotated from one repeat to the next), so allocator state cannot leak from one
measurement into another. In the child: load the model, ``torch.set_num_threads(--threads)``,
one untimed warm-up forward on the first 64 tokens (short, so that it does not pre-grow the heap
for T), ``gc.collect()``, then one timed forward during which a background thread samples the RSS
from ``/proc/self/statm`` every ~2 ms; memory = peak RSS during the forward minus the RSS just
before it (GB = 10^9 bytes). Time = median over ``--repeats`` children (default 3 below T=4096,
1 from 4096 on), memory = the largest of those peaks.

The eager and TransformerLens paths are skipped for a T whose attention weights alone,
30 x 9 x T^2 x 4 bytes, exceed ``--budget`` (default 0.6) of ``MemAvailable``; the row then says
how much they would need. A child that still runs out of memory (it runs under an address-space
limit of its current size + 85% of ``MemAvailable``, so it fails with an allocation error instead
of calling the OOM killer on a shared machine) is reported as OOM.

Before timing, a check child at T=64 compares every path's logits with the plain forward
(<= 1e-3), and TransformerLens's patterns (rows sum to 1) and HF's eager attentions with
attncoda's captured rows of one layer and with the summaries' sink share of every layer (<= 1e-4).
A path that fails its check is reported with the reason instead of being timed.

Run: ``python benchmarks/bench_scaling.py [--lengths 512 1024 2048 4096 8192] [--repeats N]
[--threads 2] [--quick]`` (the full run takes ~10 min on 2 cores, ``--quick`` ~1.5 min).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LENGTHS = (512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (256, 512)
PATHS = ("sdpa", "summaries", "eager_output_attentions", "transformerlens")
QUADRATIC = ("eager_output_attentions", "transformerlens")  # hold 30 x 9 x T^2 weights
LAYERS, HEADS = 30, 9
TL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the asset is this model (GGUF, dequantised)
TL_MISSING = "not installed: pip install transformer-lens==4.3.0"
CHECK_LENGTH, CHECK_LAYER = 64, 14
WARMUP = 64  # tokens of the untimed warm-up forward in each child
LOGIT_TOL, PATTERN_TOL = 1e-3, 1e-4
SUMMARIES_TARGET_T, SUMMARIES_TARGET = 2048, 1.5


def _bench_capture() -> Any:
    """The sibling module (model loading, tokens, the three attncoda/HF paths, PeakRSS)."""
    spec = importlib.util.spec_from_file_location("bench_capture", HERE / "bench_capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _offline_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def attention_weights_bytes(length: int) -> int:
    return LAYERS * HEADS * length * length * 4


def _load_average() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(open("/proc/loadavg").read().split()[:3])


def _tl_available() -> bool:
    return importlib.util.find_spec("transformer_lens") is not None


# ---------------------------------------------------------------------------------------------
# child side


def _boot_bridge(model: Any, tokenizer: Any) -> Any:
    """TransformerBridge around the loaded HF model, offline (no hub call: config from the model)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(
        TL_NAME, hf_model=model, tokenizer=tokenizer, device="cpu"
    )


def _is_pattern(name: str) -> bool:
    return name.endswith("hook_pattern")


def _child_paths(bc: Any, model: Any, tokenizer: Any, path: str) -> Any:
    """``make(ids) -> fn`` for ``path``; the TransformerLens bridge is booted once, here."""
    import torch

    if path != "transformerlens":
        return lambda ids: bc._paths(model, ids)[path]
    bridge = _boot_bridge(model, tokenizer)

    def make(ids: Any) -> Any:
        def tl() -> Any:
            with torch.no_grad():
                return bridge.run_with_cache(ids, names_filter=_is_pattern)

        return tl

    return make


def _limit_address_space() -> None:
    """Fail allocations with an error (reported as OOM) instead of waking the OOM killer."""
    avail = mem_available_bytes()
    try:
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return
    if avail is not None:
        limit = vm + int(0.85 * avail)
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(
        s in text
        for s in (
            "not enough memory",
            "can't allocate memory",
            "cannot allocate memory",
            "out of memory",
        )
    )


def _measure_child(path: str, length: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    bc = _bench_capture()
    model, tokenizer = bc._load()
    ids = bc._tokens(tokenizer, length)
    try:
        make = _child_paths(bc, model, tokenizer, path)
    except ImportError as exc:
        return {"error": f"{TL_MISSING} ({exc})"}
    except Exception as exc:
        return {"error": f"TransformerLens boot failed: {type(exc).__name__}: {exc}"}
    out = make(ids[:, :WARMUP])()  # warm-up, short: its heap must not pre-grow for T
    del out
    _limit_address_space()
    fn = make(ids)
    try:
        with bc.PeakRSS() as mem:
            out, cpu, elapsed = bc.clocked(fn)
        del out
    except Exception as exc:
        if _is_oom(exc):
            return {"error": f"OOM: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        raise
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "extra_gb": mem.growth_gb,
        "before_gb": (mem.before or 0) / 1e9,
    }


def _max_abs(a: Any, b: Any) -> float:
    return float((a - b).abs().max())


def _check_bridge(
    bridge: Any, model: Any, ids: Any, plain: Any, rows: Any, sink: Any
) -> dict[str, Any]:
    import torch

    logits, cache = bridge.run_with_cache(ids, names_filter=_is_pattern)
    names = sorted(cache.keys(), key=lambda n: int(n.split(".")[1]))
    pat = torch.stack([cache[n] for n in names])[:, 0]  # layer, head, query, key
    return {
        "logits": _max_abs(logits, plain),
        "row_sums": float((pat.sum(-1) - 1).abs().max()),
        "rows": _max_abs(pat[CHECK_LAYER], rows),
        "sink_share": _max_abs(pat[..., 0], sink),
        "hooks": f"{len(names)} x {names[0]}",
        "attn_implementation": str(model.config._attn_implementation),
    }


def _check_child(threads: int) -> dict[str, Any]:
    """Each path's logits vs the plain forward; patterns vs attncoda's rows, at T=64."""
    import torch

    from attncoda.hooks import capture

    torch.set_num_threads(threads)
    bc = _bench_capture()
    model, tokenizer = bc._load()
    ids = bc._tokens(tokenizer, CHECK_LENGTH)
    result: dict[str, Any] = {}
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with capture(model, what="summaries") as cap:
            logits = model(input_ids=ids).logits
        sink = torch.from_numpy(cap.dataset.sink_share.values[0])  # layer, head, query
        result["summaries"] = {"logits": _max_abs(logits, plain)}
        with capture(model, layers=[CHECK_LAYER], what="rows") as cap:
            model(input_ids=ids)
        rows = torch.from_numpy(cap.dataset.log_attn.values[0, 0]).exp()  # head, query, key
        out = bc._paths(model, ids)["eager_output_attentions"]()
        att = torch.stack(out.attentions)[:, 0]  # layer, head, query, key
        result["eager_output_attentions"] = {
            "logits": _max_abs(out.logits, plain),
            "rows": _max_abs(att[CHECK_LAYER], rows),
            "sink_share": _max_abs(att[..., 0], sink),
        }
        try:
            bridge = _boot_bridge(model, tokenizer)
        except ImportError as exc:
            result["transformerlens"] = {"error": f"{TL_MISSING} ({exc})"}
        except Exception as exc:
            result["transformerlens"] = {
                "error": f"TransformerLens boot failed: {type(exc).__name__}: {exc}"
            }
        else:
            try:
                result["transformerlens"] = _check_bridge(bridge, model, ids, plain, rows, sink)
            except Exception as exc:
                result["transformerlens"] = {
                    "error": f"TransformerLens run_with_cache failed: {type(exc).__name__}: {exc}"
                }
    result["sdpa"] = {}
    for res in result.values():
        if "error" in res:
            continue
        bad = [
            k
            for k, v in res.items()
            if isinstance(v, float) and v > (LOGIT_TOL if k == "logits" else PATTERN_TOL)
        ]
        if bad:
            res["error"] = "check failed: " + ", ".join(f"{k} off by {res[k]:.2g}" for k in bad)
    return result


def _child_main(args: argparse.Namespace) -> None:
    if args.check:
        print(json.dumps(_check_child(args.threads)))
    else:
        print(json.dumps(_measure_child(args.child, args.length, args.threads)))


# ---------------------------------------------------------------------------------------------
# parent side


def _spawn(extra: list[str], threads: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *extra, "--threads", str(threads)],
        capture_output=True,
        text=True,
        check=False,
        env=_offline_env(),
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        return dict(json.loads(lines[-1]))
    if out.returncode in (-9, 137):
        return {"error": "OOM: the child was killed (SIGKILL, the kernel's OOM killer)"}
    tail = [ln for ln in out.stderr.strip().splitlines() if ln.strip()][-1:]
    if any(_is_oom(RuntimeError(t)) for t in tail):
        return {"error": f"OOM: {tail[0][:160]}"}
    return {"error": f"child failed (rc {out.returncode}): {' '.join(tail)[:200]}"}


def check(threads: int) -> dict[str, Any]:
    """``{path: {difference: value, ...}}``; a path with an ``error`` entry is not timed."""
    res = _spawn(["--check"], threads)
    if "error" in res and isinstance(res["error"], str):  # the check child itself failed
        return {path: {"error": f"check did not run: {res['error']}"} for path in PATHS}
    return res


def measure(
    lengths: tuple[int, ...],
    repeats: int | None,
    threads: int,
    budget: float,
    paths: tuple[str, ...] = PATHS,
    checked: dict[str, Any] | None = None,
    log: Any = None,
) -> list[dict[str, Any]]:
    """One record per (T, path): seconds (median), extra_gb (max) or error."""
    checked = checked or {}
    records = []
    for length in lengths:
        n = repeats if repeats is not None else (1 if length >= 4096 else 3)
        avail = mem_available_bytes()
        todo: dict[str, dict[str, Any]] = {}
        for path in paths:
            rec: dict[str, Any] = {"T": length, "path": path, "seconds": [], "extra_gb": []}
            need = attention_weights_bytes(length)
            if path == "transformerlens" and not _tl_available():
                rec["error"] = TL_MISSING
            elif "error" in checked.get(path, {}):
                rec["error"] = checked[path]["error"]
            elif path in QUADRATIC and avail is not None and need > budget * avail:
                rec["error"] = (
                    f"skipped: would need {need / 1e9:.0f} GB for the attention weights "
                    f"alone (> {budget:.0%} of {avail / 1e9:.0f} GB available)"
                )
            todo[path] = rec
        for rep in range(n):
            order = list(todo)
            order = order[rep % len(order) :] + order[: rep % len(order)]  # rotate the order
            for path in order:
                rec = todo[path]
                if "error" in rec:
                    continue
                res = _spawn(["--child", path, "--length", str(length)], threads)
                if log is not None:
                    print(f"T={length} {path} repeat {rep + 1}/{n}: {res}", file=log, flush=True)
                if "error" in res:
                    rec["error"] = res["error"]
                    continue
                rec["seconds"].append(res["seconds"])
                rec["extra_gb"].append(res["extra_gb"])
        for rec in todo.values():
            secs, gbs = rec.pop("seconds"), rec.pop("extra_gb")
            if "error" not in rec:
                rec["seconds"] = statistics.median(secs)
                rec["extra_gb"] = max(gbs) if None not in gbs else None
                rec["repeats"] = len(secs)
            records.append(rec)
    return records


def _anchor(records: list[dict[str, Any]], length: int) -> dict[str, Any]:
    for rec in records:
        if rec["T"] == length and rec["path"] == "sdpa":
            return rec
    return {}


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return a / b
    return None


def markdown(records: list[dict[str, Any]]) -> str:
    lines = [
        "| T | path | seconds | ratio to SDPA | peak extra memory GB | memory ratio to SDPA |",
        "|---|---|---|---|---|---|",
    ]
    for rec in records:
        anchor = _anchor(records, rec["T"])
        if "error" in rec:
            lines.append(f"| {rec['T']} | {rec['path']} | {rec['error']} | | | |")
            continue
        r = _ratio(rec["seconds"], anchor.get("seconds"))
        m = _ratio(rec["extra_gb"], anchor.get("extra_gb"))
        gb = rec["extra_gb"]
        lines.append(
            f"| {rec['T']} | {rec['path']} | {rec['seconds']:.2f} | "
            f"{'' if r is None else f'{r:.2f}x'} | {'' if gb is None else f'{gb:.2f}'} | "
            f"{'' if m is None else f'{m:.2f}x'} |"
        )
    return "\n".join(lines)


def _label(path: str) -> str:
    return {
        "summaries": "capture summaries (30x9 heads)",
        "eager_output_attentions": "HF eager output_attentions=True",
        "transformerlens": "TransformerLens run_with_cache (hook_pattern only)",
    }[path]


def rows(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run`` (keys: benchmark, project_s, anchor, anchor_s, ratio, target,
    holds)."""
    out = []
    for rec in records:
        if rec["path"] == "sdpa":
            continue
        anchor = _anchor(records, rec["T"])
        mem = ""
        if "error" in rec:
            mem = f" ({rec['error']})"
        elif rec.get("extra_gb") is not None and anchor.get("extra_gb") is not None:
            mem = f" (peak extra {rec['extra_gb']:.2f} GB vs SDPA {anchor['extra_gb']:.2f} GB)"
        ratio = _ratio(rec.get("seconds"), anchor.get("seconds"))
        target, holds = "(reference)", None
        if rec["path"] == "summaries":
            if rec["T"] == SUMMARIES_TARGET_T:
                target = f"<= {SUMMARIES_TARGET}x"
                holds = ratio is not None and ratio <= SUMMARIES_TARGET
            else:
                target = f"(<= {SUMMARIES_TARGET}x at T={SUMMARIES_TARGET_T})"
        out.append(
            {
                "benchmark": f"{_label(rec['path'])}, T={rec['T']}{mem}",
                "project_s": rec.get("seconds"),
                "anchor": "plain SDPA forward",
                "anchor_s": anchor.get("seconds"),
                "ratio": ratio,
                "target": target,
                "holds": holds,
            }
        )
    summ = [r for r in records if r["path"] == "summaries" and r.get("extra_gb") is not None]
    mratios = [
        (r["T"], _ratio(r["extra_gb"], _anchor(records, r["T"]).get("extra_gb"))) for r in summ
    ]
    mratios = [(t, m) for t, m in mratios if m is not None]
    if mratios:
        # judged in the full run only: at T=256 SDPA's extra memory (~0.06 GB) is allocator noise
        lo, hi = min(m for _, m in mratios), max(m for _, m in mratios)
        out.append(
            {
                "benchmark": "summaries peak extra memory / SDPA's, T="
                + ", ".join(f"{t}: {m:.2f}x" for t, m in mratios),
                "project_s": None,
                "anchor": "plain SDPA forward",
                "anchor_s": None,
                "ratio": hi,
                "target": "O(T): ratio ~ constant in T (max/min <= 1.5)",
                "holds": None if quick else hi / lo <= 1.5,
            }
        )
    if not quick:
        longest = max(r["T"] for r in records)
        summ_long = [r for r in records if r["path"] == "summaries" and r["T"] == longest]
        if summ_long:
            rec = summ_long[0]
            out.append(
                {
                    "benchmark": f"summaries at T={longest} completes on this machine"
                    + (
                        f" ({rec['error']})"
                        if "error" in rec
                        else f" (peak extra {rec['extra_gb']:.2f} GB)"
                    ),
                    "project_s": rec.get("seconds"),
                    "anchor": "plain SDPA forward",
                    "anchor_s": _anchor(records, longest).get("seconds"),
                    "ratio": _ratio(rec.get("seconds"), _anchor(records, longest).get("seconds")),
                    "target": f"completes (T={longest}, {_ram_gb()})",
                    "holds": "error" not in rec,
                }
            )
    return out


def _ram_gb() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "this machine"
    return f"{total / 2**30:.0f} GiB RAM"


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for the benchmark table (quick: T=256, 512, one repeat each, ~1-2 min)."""
    checked = check(threads=2)
    return rows(
        measure(QUICK_LENGTHS if quick else LENGTHS, 1 if quick else None, 2, 0.6, checked=checked),
        quick,
    )


def header(threads: int) -> str:
    import torch

    avail = mem_available_bytes()
    tl = "absent"
    if _tl_available():
        from importlib.metadata import version

        tl = version("transformer-lens")
    return (
        f"{time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {os.cpu_count()} CPUs  "
        f"torch {torch.__version__}  threads {threads}  transformer-lens {tl}  "
        f"MemAvailable {(avail or 0) / 1e9:.1f} GB\n{_load_average()}"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="children per (path, T) (default: 3 below T=4096, 1 from 4096 on)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument(
        "--budget",
        type=float,
        default=0.6,
        help="skip eager/TransformerLens where 30*9*T^2*4 B > this x MemAvailable",
    )
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--quick", action="store_true", help="T=256, 512, one repeat")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.check:
        _child_main(args)
        return []
    lengths = tuple(args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS))
    repeats = 1 if args.quick and args.repeats is None else args.repeats
    print(header(args.threads), flush=True)
    start = time.perf_counter()
    checked = check(args.threads)
    print(
        f"\ncheck at T={CHECK_LENGTH} (max abs differences; layer {CHECK_LAYER} for rows):",
        flush=True,
    )
    for path, res in checked.items():
        print(f"  {path}: {res}", flush=True)
    records = measure(
        lengths,
        repeats,
        args.threads,
        args.budget,
        tuple(args.paths),
        checked=checked,
        log=sys.stderr,
    )
    print("\n" + markdown(records))
    print(f"\ntotal {time.perf_counter() - start:.0f} s; at the end: {_load_average()}")
    return rows(records, args.quick)


if __name__ == "__main__":
    main()
