"""Shared fixtures and optional-dependency markers (xarray's ``_importorskip`` pattern)."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from inspect import signature
from pathlib import Path

# One thread per pytest-xdist worker, for torch, OpenMP and BLAS, and for the processes the tests
# start (they inherit this environment): the workers already use every core between them, and
# two workers with a thread per core each put four busy threads on two cores, which wait for
# each other at every parallel operation (the costliest tests took 4-7% less CPU with one).
# Set before numpy and torch load their thread pools.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import numpy as np
import pytest


def _importorskip(modname: str) -> tuple[bool, pytest.MarkDecorator]:
    try:
        importlib.import_module(modname)
        has = True
    except ImportError:
        has = False
    return has, pytest.mark.skipif(
        not has, reason=f"requires {modname} (pip install attncoda[test])"
    )


has_torch, requires_torch = _importorskip("torch")
has_skbio, requires_skbio = _importorskip("skbio")
has_composition_stats, requires_composition_stats = _importorskip("composition_stats")

if os.environ.get("PYTEST_XDIST_WORKER"):  # pools a plugin may have started before this file
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    if has_torch:
        import torch

        torch.set_num_threads(1)


#: CPU seconds (this process and those it waits for) of the tests that take longest, as
#: ``ATTNCODA_TEST_CPU=FOLDER pytest`` measures them (CONTRIBUTING.md): the run starts the costliest
#: first. Only the order depends on these numbers; a test not listed counts as 10 s if marked
#: ``slow``, 2 s if ``real``, else nothing.
CPU_SECONDS = {
    # measured 6 December 2026 (AMD EPYC, 2 cores, pytest -n 2); a group costs the sum of its
    # tests, and a shared run (a study's quick mode, the docs pages' interpreter) is counted on
    # one of them; the four quick modes measured again on 7 December, after their sizes shrank
    "tests/test_studies.py::test_quick_mode_reproduces_the_golden_results[conventions]": 37.0,
    "tests/test_conventions_real.py::test_minilm_quick_cells_resume_and_give_a_claim_table": 22.0,
    "tests/test_studies.py::test_quick_mode_reproduces_the_golden_results[pruning]": 35.0,
    "tests/test_studies.py::test_quick_mode_reproduces_the_golden_results[arach]": 33.0,
    "tests/test_docs.py::test_python_blocks_of_the_docs_run[docs/capture.md]": 34.0,
    "tests/test_pruning_real.py::test_quick_prune_on_smollm2": 26.5,
    "tests/test_docs.py::test_sphinx_site_builds_with_the_executed_gallery": 27.1,
    "tests/test_studies.py::test_quick_mode_reproduces_the_golden_results[rpa]": 16.0,
    "tests/test_types.py::test_mypy_finds_no_type_errors": 23.7,
    "tests/test_notebook.py::test_readme_and_getting_started_run_twice_in_a_row": 22.9,
    "tests/test_distributed.py::test_jobs_on_a_cluster_equal_in_memory_and_survive_a_killed_worker": 20.8,
    "tests/test_tokens_real.py::test_sink_with_and_without_a_special_first_token_table": 20.2,
    "tests/test_capture_real.py::test_gemma3_rows_and_summaries_past_the_sliding_window": 19.8,
    "tests/test_notebook.py::test_the_notebook_shows_every_figure_with_smollm2": 17.9,
    "tests/test_distributed.py::test_a_cluster_shows_progress_and_closes_without_killing_workers": 14.0,
    "tests/test_qwen_real.py::test_rows_on_austen[qwen2.5-coder-0.5b]": 12.8,
    # Qwen2.5-Coder-1.5B's (7 December 2026), with ATTNCODA_LARGE_TESTS=1 (its group, ~200
    # CPU-s, is then the largest of the run; without it, its load and its pin)
    "tests/test_qwen_real.py::test_rows_on_austen[qwen2.5-coder-1.5b]": 43.5,
    "tests/test_qwen_real.py::test_left_padding[qwen2.5-coder-1.5b]": 29.2,
    "tests/test_qwen_real.py::test_rows_on_wikipedia[qwen2.5-coder-1.5b]": 24.3,
    "tests/test_qwen_real.py::test_summaries_on_austen[qwen2.5-coder-1.5b]": 23.5,
    "tests/test_qwen_real.py::test_capture_records_provenance_and_changes_no_logits[qwen2.5-coder-1.5b]": 11.0,
    "tests/test_notebook.py::test_a_notebook_showing_the_explorer_twice_stores_its_data_once": 12.9,
    "tests/test_whisper_real.py::test_transcription_of_the_speech_corpus_is_close_to_the_text": 12.5,
    "tests/test_cli.py::test_the_readme_command_line_gives_no_warning": 11.3,
    "tests/test_conventions_evidence.py::test_claims_only_keeps_the_run_that_built_the_window_tables": 9.8,
    "tests/test_conventions_evidence.py::test_the_claim_table_is_recomputed_from_the_committed_cells": 9.6,
    "tests/test_notebook.py::test_figures_accessors_and_views_show_in_a_fresh_kernel": 9.5,
    "tests/test_studies.py::test_readme_tables_equal_the_result_files[arach]": 8.1,
    "tests/test_cli.py::test_demo_quick_on_smollm2": 8.4,
}


def _xdist_group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


#: Seconds without a finished test after which the run says what it is waiting on, so that
#: it is never silent for minutes (``ATTNCODA_TEST_HEARTBEAT`` overrides it; 0 turns it off).
HEARTBEAT_S = float(os.environ.get("ATTNCODA_TEST_HEARTBEAT", "30"))
_running: dict[str, float] = {}
_last_finish = [time.monotonic()]
_tests_done = threading.Event()
_finished = [0]


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _running[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _running.pop(nodeid, None)
    _last_finish[0] = time.monotonic()
    _finished[0] += 1


_REPO = Path(__file__).resolve().parents[1]
_tree_before: list[dict[str, str] | None] = [None]


def _working_tree() -> dict[str, str] | None:
    """The repository's changed and new files (not ignored ones: caches, venvs, build outputs)
    with a sha256 of each, or None outside a git checkout (an sdist)."""
    import hashlib

    try:
        out = subprocess.run(
            ["git", "-C", str(_REPO), "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    state = {}
    for entry in out.split(b"\0"):
        if len(entry) < 4:
            continue
        name = entry[3:].decode("utf-8", "surrogateescape")
        path = _REPO / name
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"
        except OSError:
            digest = "?"
        state[name] = f"{entry[:2].decode()} {digest}"
    return state


def pytest_sessionstart(session: pytest.Session) -> None:
    """In the process that reports (not in an xdist worker): the state of the repository's
    working tree, which no test may change (checked at the end), and a daemon thread that writes
    one line when no test has finished for ``HEARTBEAT_S``: the tests running and for how long
    (or that the workers are still starting and collecting)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _tree_before[0] = _working_tree()
    if HEARTBEAT_S <= 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    _last_finish[0] = time.monotonic()

    def beat() -> None:
        while not _tests_done.wait(HEARTBEAT_S / 3):
            now = time.monotonic()
            quiet = now - _last_finish[0]
            if quiet < HEARTBEAT_S:
                continue
            oldest = sorted(_running.items(), key=lambda kv: kv[1])[:3]
            what = (
                ", ".join(f"{n} ({now - t:.0f} s)" for n, t in oldest)
                if oldest
                else "the workers are starting or collecting"
                if not _finished[0]
                else f"nothing ({_finished[0]} tests done; the workers are shutting down)"
            )
            reporter.write_line(f"[{quiet:.0f} s without a finished test] running: {what}")
            _last_finish[0] = now  # said once per quiet period

    threading.Thread(target=beat, name="attncoda-heartbeat", daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The heartbeat stops (what follows is the summary); a run that changed, added or removed
    a file of the repository's working tree fails, naming the files (tests write under their
    ``tmp_path``; a file you edit while the tests run is named too)."""
    _tests_done.set()
    before = _tree_before[0]
    if os.environ.get("PYTEST_XDIST_WORKER") or before is None:
        return
    after = _working_tree()
    if after is None or after == before:
        return
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"the tests changed {len(changed)} file(s) of the working tree: "
        + ", ".join(changed[:10])
        + (" ..." if len(changed) > 10 else "")
    )
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests skip cleanly where CUDA is absent; the costliest tests run first (those of one
    ``xdist_group`` together, costing their sum; the others in collection order), so that
    pytest-xdist (``--dist loadgroup --no-loadscope-reorder``: in this order) starts the longest
    tests while the short ones are left to fill the cores at the end (otherwise a docs build
    or a study's quick mode drawn last keeps one core busy after the other has finished)."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip)

    def cost(item: pytest.Item) -> float:
        group = _xdist_group(item)
        nodeid = item.nodeid.removesuffix(f"@{group}")  # pytest-xdist's suffix, if already added
        if nodeid in CPU_SECONDS:
            return CPU_SECONDS[nodeid]
        return (
            10.0
            if item.get_closest_marker("slow")
            else 2.0
            if item.get_closest_marker("real")
            else 0.0
        )

    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_xdist_group(item) or item.nodeid, []).append(item)
    order = sorted(units.values(), key=lambda unit: -sum(map(cost, unit)))
    items[:] = [item for unit in order for item in unit]


# vendored files are run by the test modules that import them, never collected on their own
# (--doctest-modules would import every .py there with the original bindings); this lives here,
# not in a tests/vendor/conftest.py, because a second module named conftest would replace this
# one in sys.modules for the tests' `from conftest import ...`
collect_ignore_glob = ["vendor/*.py"]


def vendored_module(filename: str, name: str) -> object:
    """Import ``tests/vendor/FILENAME`` (not collected by pytest) as a module named ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "vendor" / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class QuickRun:
    """One run of ``python -m case_studies.NAME quick --out OUT``: its process and folder."""

    name: str
    result: subprocess.CompletedProcess[str]
    out: Path

    def finished(self) -> QuickRun:
        """This run, after checking that it wrote all its results (whether or not they equal
        the golden ones, which the study's golden test checks)."""
        res = self.result
        assert "the golden results" in res.stdout, (
            f"{self.name} quick did not finish:\n" + res.stdout[-2000:] + res.stderr[-3000:]
        )
        return self


@pytest.fixture(scope="session")
def study_quick(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], QuickRun]:
    """``study_quick(NAME)``: the study's quick mode, run once per session (per pytest-xdist
    worker) and shared by its golden test and the tests that read its outputs; they carry
    ``xdist_group("quick-NAME")``, so one worker runs them all on one run."""
    runs: dict[str, QuickRun | subprocess.TimeoutExpired] = {}

    def run(name: str) -> QuickRun:
        if name not in runs:
            out = tmp_path_factory.mktemp(f"{name}-quick") / "q"
            try:
                res = subprocess.run(
                    [sys.executable, "-m", f"case_studies.{name}", "quick", "--out", str(out)],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    timeout=1200,
                )
            except subprocess.TimeoutExpired as exc:  # fails every test of it, run once
                runs[name] = exc
            else:
                runs[name] = QuickRun(name, res, out)
        done = runs[name]
        if isinstance(done, subprocess.TimeoutExpired):
            raise done
        return done

    return run


def need(*names: str) -> None:
    """Skip the calling test unless every named offline asset is fetched (real tests)."""
    from attncoda.hooks import assets

    for name in names:
        if not assets.is_fetched(name):
            pytest.skip(f"asset {name!r} is not fetched; run `attncoda fetch {name}`")


def assert_one_pass_runs_agree(first, second, valid):
    """Two captures of the same batch by the summaries' one pass (each ``(output, dataset)``),
    run with other blocks, head groups or row kernels, agree to fp32 rounding: the outputs,
    and every summary at the valid queries (layer 0 sees the same inputs both times and is held
    closer; later layers inherit the outputs' rounding)."""
    import attncoda as ac

    np.testing.assert_allclose(first[0][valid], second[0][valid], atol=1e-5, rtol=1e-5)
    v = valid[:, None, None, :]
    for name in ac.SUMMARY_VARIABLES:
        a = np.where(v, first[1][name].values, np.nan)
        b = np.where(v, second[1][name].values, np.nan)
        np.testing.assert_allclose(
            a[:, 0], b[:, 0], atol=1e-6, rtol=1e-5, equal_nan=True, err_msg=f"{name}, layer 0"
        )
        np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-4, equal_nan=True, err_msg=name)


def eager_weights(model, batch):
    """HF eager attention weights of every layer (``output_attentions=True``) of the model's body
    (``base_model``, without the output head: the weights need no logits, and the head of a
    large vocabulary costs as much as the layers), as a numpy array ``(sample, layer, head,
    query, key)``; the model's attention implementation is restored."""
    import torch

    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model.base_model(**batch, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return torch.stack(out.attentions, dim=1).numpy()


def assert_allclose(actual, desired, rtol=1e-7, atol=0.0, err_msg="") -> None:
    """``numpy.testing.assert_allclose`` for the large arrays of real models (rows, logits):
    the same test, ``|actual - desired| <= atol + rtol * |desired|`` elementwise in the arrays'
    own precision, block by block, so that its temporaries stay small and in cache. numpy's
    makes a dozen full-size ones: 20 CPU-s for Gemma-3's logits over 600 tokens (157 M values),
    most of it faulting in fresh memory, against 0.3 s here. numpy's function itself runs where
    the quick test fails (for its report) and where an input is not a finite float array of the
    other's shape (for its rules on NaN, infinities and broadcasting)."""
    a, d = np.asarray(actual), np.asarray(desired)
    if a.shape == d.shape and a.dtype.kind == d.dtype.kind == "f":
        flat_a, flat_d = a.reshape(-1), d.reshape(-1)
        step = 1 << 20
        for i in range(0, flat_a.size, step):
            x, y = flat_a[i : i + step], flat_d[i : i + step]
            if not (np.isfinite(x).all() and np.isfinite(y).all()):
                break
            bound = np.abs(y)
            bound *= rtol
            bound += atol
            if not (np.abs(x - y) <= bound).all():
                break
        else:
            return
    np.testing.assert_allclose(a, d, rtol=rtol, atol=atol, err_msg=err_msg)


def assert_array_equal(actual, desired, err_msg="") -> None:
    """``numpy.testing.assert_array_equal`` for the large arrays of real models (logits, hidden
    states): equal shapes and values, decided by ``numpy.array_equal`` (one pass, no full-size
    temporaries: numpy's test took 3 CPU-s on Qwen2.5's logits of 256 tokens). numpy's function
    gives the verdict wherever that is not plainly "equal" (its report on failure, its rules on
    NaN and broadcasting)."""
    a, d = np.asarray(actual), np.asarray(desired)
    if a.shape == d.shape and a.dtype == d.dtype and np.array_equal(a, d):
        return
    np.testing.assert_array_equal(a, d, err_msg=err_msg)


def first_tokens(tokenizer, text: str, n: int) -> dict:
    """The first ``n`` tokens of ``text`` as a batch of one (``input_ids``, ``attention_mask``),
    checked to be ``n`` long (a text too short for the test fails it, not shortens it)."""
    batch = tokenizer(text, return_tensors="pt")
    batch = {k: v[:, :n] for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    assert batch["input_ids"].shape[1] == n
    return batch


def check_capture_on_text(model, tokenizer, text: str, length: int):
    """Capture a real causal model over the first ``length`` tokens of ``text`` and check it.

    The logits do not change while capturing (1e-5), the captured rows equal HF eager
    attention (1e-5), and both summaries routes equal the core's decomposition of the captured
    rows (1e-4): the SDPA route (``exact_outputs=True``, which leaves every layer's inputs as the
    rows saw them) in every layer, the one pass (the default) in layer 0, whose inputs are the
    same in both captures (later layers see its outputs, equal to the model's to fp32 rounding,
    which Qwen2.5's activations amplify past 1e-4 in the balance). Returns the dataset of rows
    and summaries (``what="both"``).
    ``test_qwen_real.py`` checks Qwen2.5's rows-only captures and their outputs against float64
    on its own.
    """
    import torch

    import attncoda as ac
    from attncoda.hooks import capture

    batch = first_tokens(tokenizer, text, length)
    with torch.no_grad():
        before = model(**batch).logits
        with capture(model, what="both") as cap:
            during = model(**batch).logits
    assert_allclose(during.numpy(), before.numpy(), atol=1e-5)
    ds = cap.dataset
    assert_allclose(np.exp(ds.log_attn.values), eager_weights(model, batch), atol=1e-5)
    # the fast summaries path equals the core applied to the captured rows (no logits needed)
    no_logits = (
        {"logits_to_keep": 1} if "logits_to_keep" in signature(model.forward).parameters else {}
    )
    with torch.no_grad(), capture(model, what="summaries", exact_outputs=True) as fast:
        model(**batch, **no_logits)
    with torch.no_grad(), capture(model, what="summaries") as one_pass:
        model(**batch, **no_logits)
    la = ds.log_attn.values.astype(np.float64)
    sink = np.arange(la.shape[-1]) == int(ds.sink_index.values[0])  # the sample's first valid key
    d = ac.decompose(la, sink=np.broadcast_to(sink, la.shape), from_logits=True, degenerate="nan")
    for var in ac.SUMMARY_VARIABLES:
        want = getattr(d, var)
        for got in (fast.dataset[var].values, one_pass.dataset[var].values[:, :1]):
            ref = want[:, : got.shape[1]]
            finite = np.isfinite(ref)
            assert (np.isfinite(got) == finite).all(), var
            assert_allclose(got[finite], ref[finite], atol=1e-4, rtol=1e-4, err_msg=var)
    return ds


#: Set to 1 to let the table tests write the tables they render into the docs and the README
#: (``ATTNCODA_UPDATE_TABLES=1 pytest ...``) instead of failing on a difference.
UPDATE_TABLES = os.environ.get("ATTNCODA_UPDATE_TABLES") == "1"


def table_block(path: Path, name: str) -> tuple[str, int, int]:
    """The text of ``path`` and the span of the body of its ``<!-- table: NAME -->`` block (the
    lines between that marker and ``<!-- /table -->``, the same markers as the case studies)."""
    text = path.read_text(encoding="utf-8")
    m = re.search(rf"^<!-- table: {re.escape(name)} -->\n(.*?)^<!-- /table -->$", text, re.S | re.M)
    assert m is not None, f"{path.name} has no <!-- table: {name} --> block"
    return text, m.start(1), m.end(1)


def per_layer_masks(model, masks):
    """Pre-hooks on the attention modules that replace each layer's mask (an explicit reference
    for plug-ins that change masks); the caller removes the returned handles."""
    from attncoda.hooks._registry import attention_modules

    handles = []
    for layer, module in enumerate(attention_modules(model)):

        def hook(_m, args, kwargs, layer=layer):
            kwargs["attention_mask"] = masks[layer]
            return args, kwargs

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """Six paragraphs of fifty words: passages for capture and demo on tiny twins."""
    paras = [f"Paragraph {i}. " + " ".join(f"word{j}" for j in range(50)) for i in range(6)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(paras), encoding="utf-8")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)


@pytest.fixture
def old_style_model():
    """A tiny random GPT-Neo: its modelling code computes attention itself (no registry path)."""
    torch = pytest.importorskip("torch")
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=32,
    )
    model = GPTNeoForCausalLM(config).eval()
    if type(model)._can_set_attn_implementation():
        pytest.skip("GPT-Neo learned to switch implementations; pick another old-style model")
    return model


def signals_as_in_a_terminal() -> None:
    """In the child: SIGINT and SIGHUP as a terminal delivers them (a test run as a background
    job inherits SIGINT ignored, one under ``nohup`` SIGHUP, and a process that ignores a signal
    is rightly not ended by it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
