"""Faults against the ``attncoda`` command: every option is checked before a model loads or a
file is written; errors are one line with the documented exit code (2 bad usage, 1 failed run,
70 a bug, 130 interrupted); no output of the user's is replaced and no half-done output is left.

Each "before any work" case also checks that nothing was loaded: the model loaders are replaced
by functions that fail the test if called.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import attncoda as ac
from attncoda.cli import main
from conftest import need, signals_as_in_a_terminal

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any command loads a model (the error must come first)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad option was refused")

    import transformers

    from attncoda.hooks import assets, rpa_checkpoints, zoo

    monkeypatch.setattr(zoo, "load", refuse)
    monkeypatch.setattr(rpa_checkpoints, "load_checkpoint", refuse)
    monkeypatch.setattr(zoo, "tiny_twin", refuse)
    monkeypatch.setattr(assets, "load_model", refuse)
    for auto in ("AutoModel", "AutoModelForCausalLM"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", refuse)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, needle: str) -> None:
    # one-line warnings may come first (e.g. the sink is an ordinary token); the error is one line
    lines = [
        line for line in err.strip().splitlines() if not line.startswith("attncoda: warning: ")
    ]
    assert len(lines) == 1 and lines[0].startswith("attncoda: error: "), err
    assert "Traceback" not in err
    assert needle in lines[0], err


# --------------------------------------------------------------------------------------------
# capture


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--queries=-100"], "--queries -100 is outside the passages"),
        (["--queries", "3,100"], "--queries 100 is outside"),
        (["--queries", "3,3"], "twice"),
        (["--sink", "99"], "beyond --max-tokens"),
        (["--sink=-1"], "count from 0"),
        (["--sink", "0,0"], "twice"),
        (["--sink", "x"], "--sink must be"),
        (["--threads", "100000"], "must be at most"),
        (["--threads", "0"], "must be at least 1"),
        (["--out", "{tmp}/x.csv"], "must end in .nc or .zarr"),
        (["--out", "/proc/attncoda-test.nc"], "cannot be written"),
        (["--out", "{text}/x.nc"], "not a folder"),
        # checked against the twin's config (2 layers, 4 heads, 64 positions), not its weights
        (["--layers", "9"], "--layers 9 is out of range: twin:llama has 2 layers"),
        (["--layers=-3"], "--layers -3 is out of range"),
        (["--layers", "0,-2"], "names one of the layers twice"),
        (["--heads", "4"], "--heads 4 is out of range: twin:llama has 4 heads"),
        (["--layers", "5:9"], "--layers 5:9 selects none of the 2 layers"),
        (["--max-tokens", "65"], "--max-tokens 65 is beyond the 64 positions of twin:llama"),
        (["--dtype", "fp8"], "invalid choice: 'fp8' (choose from 'float32', 'bfloat16'"),
        (["--device", "gpu"], "--device 'gpu' is not a torch device"),
    ],
)
def test_capture_options_are_refused_before_the_model_loads(
    extra, needle, tmp_path, text_file, capsys, no_model_loads
):
    argv = ["capture", "twin:llama", str(text_file), "--max-tokens", "16"]
    argv += [a.format(tmp=tmp_path, text=text_file) for a in extra]
    if "--out" not in extra:
        argv += ["--out", str(tmp_path / "cap.nc")]
    code, _, err = _run(argv, capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert not (tmp_path / "cap.nc").exists()


@pytest.mark.parametrize("model", ["nosuch", "twin:nosuch", "/no/such/checkpoint", "./x"])
def test_an_unknown_model_is_refused_before_anything_loads(
    model, tmp_path, text_file, capsys, no_model_loads
):
    code, _, err = _run(["capture", model, str(text_file), "--out", str(tmp_path / "c.nc")], capsys)
    assert code == 2
    needle = {"nosuch": "unknown model", "twin:nosuch": "twin family"}.get(model, "checkpoint")
    _one_line_error(err, needle)


def test_capture_never_replaces_a_folder_of_user_files(tmp_path, text_file, capsys, no_model_loads):
    target = tmp_path / "d.nc"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):
        code, _, err = _run(
            ["capture", "twin:llama", str(text_file), "--out", str(target), *force], capsys
        )
        assert code == 2
        _one_line_error(err, "d.nc")
    assert (target / "notes.txt").read_text() == "mine"


def test_capture_replaces_its_own_output_only_with_force(tmp_path, text_file, capsys):
    target = tmp_path / "cap.nc"
    argv = ["capture", "twin:llama", str(text_file), "--passages", "2", "--max-tokens", "12"]
    assert _run([*argv, "--out", str(target), "-q"], capsys)[0] == 0
    first = ac.load(target).attrs["command"]
    code, _, err = _run([*argv, "--passages", "3", "--out", str(target), "-q"], capsys)
    assert code == 2
    _one_line_error(err, "--force")
    assert ac.load(target).attrs["command"] == first
    assert _run([*argv, "--passages", "3", "--out", str(target), "-q", "--force"], capsys)[0] == 0
    assert ac.load(target).sizes["sample"] == 3


def test_a_query_beyond_a_short_passage_fails_before_its_work(tmp_path, capsys):
    """--queries inside --max-tokens, but a passage is shorter: refused at that forward."""
    text = tmp_path / "short.txt"
    text.write_text("\n\n".join(" ".join(f"w{j}" for j in range(5)) for _ in range(2)))
    out = tmp_path / "cap.nc"
    argv = ["capture", "twin:llama", str(text), "--min-words", "5", "--max-tokens", "60"]
    code, _, err = _run([*argv, "--queries", "50", "--out", str(out), "-q"], capsys)
    assert code == 2
    _one_line_error(err, "50")
    assert not out.exists()


def test_a_cuda_device_without_cuda_is_refused_before_the_model_loads(
    tmp_path, text_file, capsys, no_model_loads, monkeypatch
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (
        ["capture", "twin:llama", str(text_file), "--out", str(tmp_path / "c.nc")],
        ["prune", "twin:llama", "--out", str(tmp_path / "p")],
        ["demo", "--model", "twin:llama", "--text", str(text_file), "--out", str(tmp_path / "d")],
        ["analyze", str(text_file), "--out", str(tmp_path / "a")],
        ["audit", "rpa", str(tmp_path), "--out", str(tmp_path / "r")],
    ):
        code, _, err = _run([*argv, "--device", "cuda"], capsys)
        assert code == 2, argv
        _one_line_error(err, "--device 'cuda': this machine has no CUDA device")
    assert [p.name for p in tmp_path.iterdir()] == [text_file.name]  # nothing written


def test_the_default_max_tokens_fits_a_short_context(tmp_path, text_file, capsys):
    """Without --max-tokens, a model with fewer than 128 positions (a twin: 64) gets its own."""
    out = tmp_path / "cap.nc"
    argv = ["capture", "twin:gpt2", str(text_file), "--passages", "1", "--layers", "0"]
    assert _run([*argv, "--out", str(out), "-q"], capsys)[0] == 0
    assert ac.load(out).sizes["query"] == 64


@pytest.mark.real
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["capture", "smollm2-135m", "--corpus", "austen:emma", "--layers", "99"],
            "--layers 99 is out of range: smollm2-135m has 30 layers",
        ),
        (
            ["capture", "smollm2-135m", "--corpus", "austen:emma", "--heads", "9"],
            "--heads 9 is out of range: smollm2-135m has 9 heads",
        ),
        (
            ["capture", "smollm2-135m", "--corpus", "austen:emma", "--max-tokens", "100000"],
            "--max-tokens 100000 is beyond the 8192 positions of smollm2-135m",
        ),
        (
            ["prune", "smollm2-135m", "--window", "100000"],
            "--window 100000 is beyond the 8192 positions",
        ),
        (["demo", "--max-tokens", "9000"], "--max-tokens 9000 is beyond the 8192 positions"),
    ],
)
def test_real_model_options_are_checked_against_its_config_before_it_loads(
    argv, needle, tmp_path, capsys, no_model_loads
):
    need("smollm2-135m")
    code, _, err = _run([*argv, "--out", str(tmp_path / "out.nc")], capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert not (tmp_path / "out.nc").exists()


@pytest.mark.parametrize("why", ["HF_HUB_OFFLINE", "no network"])
def test_a_hub_id_neither_reachable_nor_cached_is_refused_at_once(
    why, tmp_path, text_file, capsys, no_model_loads, monkeypatch
):
    import huggingface_hub.constants
    import transformers

    from attncoda.hooks import zoo

    def no_config(*args, **kwargs):
        raise AssertionError("transformers was asked for the config (and would retry)")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_config)
    if why == "HF_HUB_OFFLINE":
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(zoo, "_hub_reachable", lambda timeout=3.0: False)
    out = tmp_path / "c.nc"
    code, _, err = _run(
        ["capture", "someorg/no-such-model", str(text_file), "--out", str(out)], capsys
    )
    assert code == 1
    _one_line_error(err, "'someorg/no-such-model' is not in the local hub cache")
    assert ("HF_HUB_OFFLINE is set" if why == "HF_HUB_OFFLINE" else "cannot be reached") in err
    assert "attncoda fetch NAME" in err and not out.exists()


# --------------------------------------------------------------------------------------------
# analyze and report


@pytest.fixture
def summaries(tmp_path: Path) -> Path:
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    dec = ac.decompose(rows.log_attn.values, from_logits=True, degenerate="nan")
    summ = ac.make_dataset(
        summaries={
            "sink_share": dec.sink_share,
            "sink_logodds": dec.sink_logodds,
            "balance": dec.balance,
            "entropy": dec.entropy,
            "content_entropy": dec.content_entropy,
        },
        layers=[0, 1],
        heads=[0, 1, 2],
        query_positions=range(6),
    )
    return ac.save(summ, tmp_path / "summ.nc")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--rows", "{summ}"], "holds no rows"),
        (["--metrics", ""], "--metrics is empty"),
        (["--metrics", "cosine,nosuch"], "unknown metric 'nosuch'"),
        (["--threshold", "1.5"], "--threshold"),
        (["--device", "gpu0"], "not a torch device"),
    ],
)
def test_analyze_refuses_before_writing_anything(extra, needle, tmp_path, summaries, capsys):
    out = tmp_path / "an2"
    argv = ["analyze", str(summaries), "--out", str(out), "-q"]
    code, _, err = _run([*argv, *[a.format(summ=summaries) for a in extra]], capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if ".attncoda-" in p.name] == []


def test_analyze_refuses_a_damaged_store(tmp_path, capsys):
    import shutil

    store = ac.save(
        ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=3), tmp_path / "r.zarr"
    )
    shutil.rmtree(store / "log_attn")
    code, _, err = _run(["analyze", str(store), "--out", str(tmp_path / "a"), "-q"], capsys)
    assert code == 2
    _one_line_error(err, "damaged")
    assert not (tmp_path / "a").exists()


def test_analyze_and_report_replace_their_own_outputs_only_with_force(tmp_path, summaries, capsys):
    out = tmp_path / "an"
    argv = ["analyze", str(summaries), "--out", str(out), "--n-boot", "0", "-q", "--no-figures"]
    assert _run(argv, capsys)[0] == 0
    code, _, err = _run(argv, capsys)
    assert code == 2
    _one_line_error(err, "--force")
    assert _run([*argv, "--force"], capsys)[0] == 0
    assert _run(["report", str(out), "-q"], capsys)[0] == 0
    code, _, err = _run(["report", str(out), "-q"], capsys)
    assert code == 2
    _one_line_error(err, "report.html")
    assert _run(["report", str(out), "-q", "--force"], capsys)[0] == 0
    (out / "mine.txt").write_text("notes")
    code, _, err = _run([*argv, "--force"], capsys)
    assert code == 2
    _one_line_error(err, "mine.txt")
    assert (out / "mine.txt").read_text() == "notes"
    elsewhere = tmp_path / "page.html"
    elsewhere.write_text("<html>my page</html>")
    code, _, err = _run(["report", str(out), "--out", str(elsewhere), "--force"], capsys)
    assert code == 2
    _one_line_error(err, "not a file attncoda wrote")
    assert elsewhere.read_text() == "<html>my page</html>"


# --------------------------------------------------------------------------------------------
# demo, prune, audit


def test_demo_with_an_unknown_model_leaves_no_folder(tmp_path, capsys, no_model_loads):
    out = tmp_path / "demo"
    code, _, err = _run(["demo", "--model", "nosuch", "--out", str(out), "-q"], capsys)
    assert code == 2
    _one_line_error(err, "unknown model 'nosuch'")
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--text", "austen:nosuch"], "no document 'nosuch'"),
        (["--text", "smollm2-135m"], "is a model"),
        (["--threads", "100000"], "must be at most"),
    ],
)
def test_demo_options_are_refused_before_any_work(extra, needle, tmp_path, capsys, no_model_loads):
    out = tmp_path / "demo"
    code, _, err = _run(["demo", *extra, "--out", str(out), "-q"], capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert not out.exists()


def test_demo_never_replaces_a_folder_of_user_files(tmp_path, capsys, no_model_loads):
    out = tmp_path / "attncoda-demo"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    code, _, err = _run(["demo", "--model", "twin:llama", "--out", str(out), "--force"], capsys)
    assert code == 2
    _one_line_error(err, "thesis.tex")
    assert (out / "thesis.tex").read_text() == "mine"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--threads", "100000"], "must be at most"),
        (["--fractions", "0.1,1.5"], "between 0 and 1"),
        (["--fractions", ""], "between 0 and 1"),
        (["--scores", "nosuch"], "unknown score 'nosuch'"),
        (["--scores", ","], "--scores is empty"),
        (["--window", "2"], "--window is too small"),
    ],
)
def test_prune_options_are_refused_before_the_model_loads(
    extra, needle, tmp_path, capsys, no_model_loads
):
    argv = ["prune", "smollm2-135m", "--out", str(tmp_path / "p"), *extra]
    code, _, err = _run(argv, capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert list(tmp_path.iterdir()) == []


def test_prune_never_replaces_a_folder_of_user_files(tmp_path, capsys, no_model_loads):
    out = tmp_path / "p"
    out.mkdir()
    (out / "data.csv").write_text("mine")
    code, _, err = _run(["prune", "smollm2-135m", "--out", str(out), "--force"], capsys)
    assert code == 2
    _one_line_error(err, "data.csv")


# --------------------------------------------------------------------------------------------
# exit codes


def test_exit_codes_are_listed_in_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for code in ("0", "1", "2", "70", "129", "130", "143"):
        assert f"\n  {code} " in out, out


def test_a_bug_exits_70_with_its_traceback(monkeypatch, capsys, tmp_path, summaries):
    """An unexpected exception is neither bad usage nor a failed run: 70 and a traceback."""
    import attncoda.cli._analyze as analyze_command

    def crash(path):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(analyze_command, "load_dataset", crash)
    code = main(["analyze", str(summaries), "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 70
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert err.strip().splitlines()[-1].startswith("attncoda: error: internal error")


def test_a_failed_run_exits_1(monkeypatch, capsys, tmp_path, text_file):
    """A full disk while saving: a one-line error and 1, the run failed."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ac, "save", full)
    argv = ["capture", "twin:llama", str(text_file), "--passages", "1", "--max-tokens", "8"]
    code, _, err = _run([*argv, "--out", str(tmp_path / "c.nc"), "-q"], capsys)
    assert code == 1
    _one_line_error(err, "No space left on device")


# --------------------------------------------------------------------------------------------
# interrupts: real subprocesses


def _long_text(folder: Path) -> Path:
    text = folder / "long.txt"
    text.write_text("\n\n".join(" ".join(f"w{i}x{j}" for j in range(120)) for i in range(200)))
    return text


def _capture_args(text: Path, target: Path) -> list[str]:
    """``attncoda capture``'s arguments (after the program name) for ``text`` into ``target``."""
    base = ["capture", "twin:llama", str(text)]
    return [*base, "--what", "rows", "--max-tokens", "64", "--out", str(target), "-q"]


@pytest.fixture(scope="module")
def first_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished two-passage CLI capture per format, written once for the signal cases (by
    the CLI's ``main`` in this process: the same files as ``attncoda capture`` writes, without
    a second interpreter loading torch and transformers)."""
    folder = tmp_path_factory.mktemp("first")
    text = _long_text(folder)
    made = {}
    for suffix in (".zarr", ".nc"):
        target = folder / f"r{suffix}"
        assert main([*_capture_args(text, target), "--passages", "2"]) == 0
        made[suffix] = target
    return made


@pytest.mark.slow
@pytest.mark.parametrize(
    "suffix, sig, code",
    # each signal once and each format at least once (a signal's exit code does not depend on
    # the format, nor a format's staging on the signal; each case is a fresh interpreter with
    # torch and transformers, ~7 CPU-s): the library-level tests in test_faults_data.py cross
    # every signal with both formats
    [
        (".zarr", signal.SIGINT, 130),
        (".nc", signal.SIGTERM, 143),
        (".zarr", signal.SIGHUP, 129),
    ],
)
def test_a_signal_during_a_cli_save_exits_with_its_code_and_keeps_the_old_output(
    tmp_path, first_outputs, suffix, sig, code
):
    text = _long_text(tmp_path)
    target = tmp_path / f"r{suffix}"
    made = first_outputs[suffix]  # the old output: a CLI capture of 2 passages
    if made.is_dir():
        shutil.copytree(made, target)
    else:
        shutil.copy2(made, target)
    base = [sys.executable, "-m", "attncoda.cli", *_capture_args(text, target)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*base, "--passages", "200", "--force"],
        preexec_fn=signals_as_in_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 300
    hit = False
    while time.monotonic() < deadline and proc.poll() is None and not hit:
        for p in tmp_path.iterdir():
            marker = p / "STAGING"
            if ".attncoda-" in p.name and marker.is_file() and marker.stat().st_size:
                hit = True
        time.sleep(0.002)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert hit, "the save ended before the interrupt could land"
    assert proc.returncode == code, (out, err)
    assert "wrote" not in out
    assert "left as they were" in err and "Exception in thread" not in err
    assert "Traceback" not in err
    assert ac.load(target).sizes["sample"] == 2
    assert [p.name for p in tmp_path.iterdir() if ".attncoda-" in p.name] == []


@pytest.mark.parametrize("n_boot", ["1000000000", str(10**30)])
def test_an_n_boot_beyond_memory_is_refused_before_any_work(tmp_path, capsys, n_boot):
    data = ac.save(
        ac.testing.synthetic_rows(n_samples=3, n_layers=1, n_heads=3, length=6),
        tmp_path / "rows.nc",
    )
    out = tmp_path / "an"
    code, _, err = _run(["analyze", str(data), "--out", str(out), "--n-boot", n_boot], capsys)
    assert code == 2
    _one_line_error(err, "GB of memory for the bootstrap")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".attncoda" in p.name]
    # the same through the API (a ReportError, exit code 2)
    with pytest.raises(ac.ReportError, match="choose a smaller n_boot"):
        ac.analyze(ac.load(data), out, n_boot=int(n_boot), progress=False)


# --------------------------------------------------------------------------------------------
# odd names, bytes and manifests (issue #48): one line and exit 2, never a traceback (exit 70)


@pytest.mark.parametrize("command", ["explore", "analyze", "report"])
def test_a_hidden_dataset_name_gets_a_hidden_analysis_folder(command, tmp_path, capsys):
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    hidden = ac.save(rows, tmp_path / ".hidden.nc")
    extra = {"explore": [], "analyze": ["-q", "--n-boot", "0", "--no-figures"], "report": ["-q"]}
    code, _, err = _run([command, str(hidden), *extra[command]], capsys)
    assert code == 0, err
    if command == "explore":
        assert (tmp_path / ".hidden-explorer.html").is_file()
    else:
        assert (tmp_path / ".hidden").is_dir()


@pytest.mark.parametrize("name", [".nc", "...zarr"])
def test_a_dataset_name_that_is_all_suffix_asks_for_out(name, tmp_path, capsys):
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    path = ac.save(rows, tmp_path / name, format="zarr" if "zarr" in name else "netcdf")
    for command in ("explore", "analyze"):
        code, _, err = _run([command, str(path)], capsys)
        assert code == 2
        _one_line_error(err, "--out")


@pytest.mark.parametrize("command", ["explore", "analyze", "report"])
def test_an_argument_that_is_not_utf8_is_refused_in_one_line(command, tmp_path, summaries, capsys):
    bad = b"caf\xff".decode("utf-8", "surrogateescape")  # how Python passes such bytes
    argv = {
        "explore": ["explore", str(summaries), "--title", bad],
        "analyze": ["analyze", str(summaries), "--out", str(tmp_path / bad)],
        "report": ["report", str(tmp_path / bad)],
    }[command]
    code, _, err = _run(argv, capsys)
    assert code == 2
    _one_line_error(err, "not UTF-8")
    assert [p.name for p in tmp_path.iterdir()] == ["summ.nc"]


@pytest.mark.parametrize(
    ("manifest", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"title": "\\ud800", "sections": []}', "lone surrogate"),
        ('{"title": "ok", "sections": [{"heading": "\\udfff x"}]}', "lone surrogate"),
    ],
    ids=["nested-100000", "surrogate-title", "surrogate-heading"],
)
def test_a_hostile_manifest_is_refused_in_one_line(manifest, needle, tmp_path, summaries, capsys):
    out = tmp_path / "an"
    argv = ["analyze", str(summaries), "--out", str(out), "--n-boot", "0", "-q", "--no-figures"]
    assert _run(argv, capsys)[0] == 0
    (out / "analysis.json").write_text(manifest, encoding="utf-8")
    code, _, err = _run(["report", str(out), "-q"], capsys)
    assert code == 2
    _one_line_error(err, needle)
    assert not (out / "report.html").exists()
