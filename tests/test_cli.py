"""The ``attncoda`` command: every subcommand's --help, the capture -> analyze -> report path on a
tiny twin, Unix exit codes and one-line errors, and the demo on the real SmolLM2 (``-m real``)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attncoda as ac
from attncoda.cli import build_parser, main
from attncoda.cli._common import parse_index

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
FRONT = ("demo", "fetch", "capture", "analyze", "report", "prune", "audit")


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix, name))
                out += _subcommands(sub, (*prefix, name))
    return out


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _subcommands(build_parser())
    assert {c[0] for c in commands} >= set(FRONT)
    assert ("audit", "rpa") in commands
    assert ("audit", "arach") not in commands  # a case study now: python -m case_studies.arach.run
    for cmd in commands:
        assert main([*cmd, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: attncoda {' '.join(cmd)}"), cmd


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: attncoda" in capsys.readouterr().err


def test_shared_options_are_spelled_alike() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("demo", "capture", "analyze", "report"):
        flags = {o for a in subs.choices[name]._actions for o in a.option_strings}
        assert {"--out", "-q", "--quiet"} <= flags, name
    for name in ("demo", "capture"):
        flags = {o for a in subs.choices[name]._actions for o in a.option_strings}
        assert "--threads" in flags


def _options(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple]:
    """(command, action) of every option of every subcommand."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _options(sub, (*prefix, name))
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            out.append((" ".join(prefix), action))
    return out


def _expanded_help(action: argparse.Action) -> str:
    """The help as --help prints it (``%(default)s`` filled in)."""
    return (action.help or "") % {"default": action.default}


_DEFAULT = re.compile(r"\s*\(default: [^)]*\)")


def test_an_option_shared_by_commands_reads_the_same_in_each() -> None:
    """The same option has one metavar, one type and one help text (up to its default) in every
    command: they come from one definition in attncoda/cli/_common.py."""
    kinds: dict[str, dict[str, tuple]] = {}
    helps: dict[str, dict[str, str]] = {}
    for command, action in _options(build_parser()):
        if action.help == argparse.SUPPRESS:
            continue
        flag = action.option_strings[-1]
        kinds.setdefault(flag, {})[command] = (
            action.metavar,
            getattr(action.type, "__name__", None),
        )
        # what --out is (a folder, a file, a dataset), what --quick shrinks, what --rows adds,
        # what -q also silences and what fetch's --force does depend on the command
        if action.dest not in ("out", "quick", "rows", "quiet") and command != "fetch":
            helps.setdefault(flag, {})[command] = _DEFAULT.sub("", _expanded_help(action))
    shared = {flag for flag, seen in kinds.items() if len(seen) > 1}
    assert {"--out", "--force", "--threads", "--passages", "--max-tokens", "--n-boot"} <= shared
    for flag in shared:
        if flag == "--out":  # DIR, FILE or PATH as the command writes
            assert {m for m, _ in kinds[flag].values()} <= {"DIR", "FILE", "PATH"}, kinds[flag]
            continue
        assert len(set(kinds[flag].values())) == 1, f"{flag}: metavar/type differ: {kinds[flag]}"
        assert len(set(helps.get(flag, {}).values())) <= 1, f"{flag}: help differs: {helps[flag]}"


def test_every_default_is_shown_the_same_way() -> None:
    """An option with a default says it in its help as ``(default: X)``, with X its real value
    where argparse knows it."""
    for command, action in _options(build_parser()):
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._StoreTrueAction):
            continue
        if action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default}" in _expanded_help(action), (
                command,
                action.option_strings,
            )
        elif "default" in (action.help or ""):
            assert "(default: " in action.help, (command, action.option_strings, action.help)


def test_demo_help_shows_the_defaults_of_its_config() -> None:
    """The demo's defaults live in DemoConfig (the library); its help must say the same."""
    from attncoda.hooks.demo import DemoConfig

    full, quick = DemoConfig(), DemoConfig.quick()
    demo = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["demo"]
    helps = {a.dest: a.help for a in demo._actions}
    for field in ("passages", "max_tokens", "n_boot"):
        shown = f"(default: {getattr(full, field)}; --quick: {getattr(quick, field)})"
        assert helps[field].endswith(shown), (field, helps[field])


def test_exit_codes_are_listed_in_the_main_help(capsys: pytest.CaptureFixture[str]) -> None:
    from attncoda.cli import EXIT_CODES

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^  {code}\s+{re.escape(meaning)}$", out, re.M), (code, meaning)
    assert {code for code, _ in EXIT_CODES} == {0, 1, 2, 70, 129, 130, 143}


def test_parse_index() -> None:
    assert parse_index("all") is None
    assert parse_index("0,3,-1") == [0, 3, -1]
    assert parse_index("2:10:2") == slice(2, 10, 2)
    assert parse_index(":4") == slice(None, 4, None)
    for bad in ("x", "1:2:3:4", "0:4:0", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_index(bad)


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_capture_analyze_report_on_a_twin(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "cap.nc"
    argv = ["capture", "twin:llama", str(text_file), "--what", "both", "--passages", "3"]
    assert main([*argv, "--max-tokens", "24", "--out", str(cap), "-q"]) == 0
    ds = ac.load(cap)
    assert dict(ds.sizes)["sample"] == 3 and ds.sizes["query"] == 24
    assert {"log_attn", "sink_share"} <= set(ds.data_vars)
    assert ds.attrs["command"].startswith(f"attncoda capture twin:llama {text_file} --passages 3")
    out = tmp_path / "analysis"
    assert main(["analyze", str(cap), "--out", str(out), "--n-boot", "5", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "sink rate" in printed and "verdict flips" in printed
    assert (out / "analysis.json").is_file() and (out / "sink_grid.png").is_file()
    assert main(["report", str(out), "-q"]) == 0
    assert (out / "report.html").is_file()
    # a capture goes through analyze first, into the folder analyze writes by default
    capsys.readouterr()
    assert main(["report", str(cap), "--n-boot", "0"]) == 0
    assert (tmp_path / "cap" / "report.html").is_file()
    printed = capsys.readouterr().out
    assert "next:" not in printed  # the report is written: nothing left to suggest
    assert printed.strip().splitlines()[-1] == f"report: {tmp_path / 'cap' / 'report.html'}"


def test_analyze_and_report_of_a_capture_share_one_folder_and_say_force(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "runs" / "emma.nc"
    argv = ["capture", "twin:llama", str(text_file), "--passages", "2", "--max-tokens", "12"]
    assert main([*argv, "--out", str(cap), "-q"]) == 0
    assert main(["analyze", str(cap), "--n-boot", "0", "-q", "--no-figures"]) == 0
    assert (tmp_path / "runs" / "emma" / "analysis.json").is_file()
    capsys.readouterr()
    # the same folder: refused without --force, and the message is the command's spelling
    assert main(["report", str(cap), "--n-boot", "0", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "overwrite=True" not in err, err
    assert main(["report", str(cap), "--n-boot", "0", "-q", "--force"]) == 0
    assert (tmp_path / "runs" / "emma" / "report.html").is_file()


def test_a_summaries_capture_names_the_sections_it_cannot_give(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "summ.nc"
    argv = ["capture", "twin:llama", str(text_file), "--passages", "2", "--max-tokens", "12"]
    assert main([*argv, "--out", str(cap), "-q"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(cap), "--n-boot", "0", "-q", "--no-figures", "--report"]) == 0
    printed = capsys.readouterr().out
    hint = [line for line in printed.splitlines() if line.startswith("verdict flips")]
    assert len(hint) == 1 and "not computed" in hint[0] and "--what both" in hint[0], printed
    assert "--rows" in hint[0]
    # the option names in the hint are the real ones
    capture_help = build_parser()._subparsers._group_actions[0].choices["capture"].format_help()
    assert "--what {summaries,rows,both}" in capture_help
    page = (tmp_path / "summ" / "report.html").read_text(encoding="utf-8")
    for heading in (
        "Do the conventions agree? Verdict flips",
        "Head clustering with and without the sink",
        "Two heads, row by row",
    ):
        section = page.split(f"<h2>{heading}</h2>", 1)[1].split("</section>", 1)[0]
        assert "Not computed" in section and "--what both" in section, heading


def test_capture_selection_and_queries(tmp_path: Path, text_file: Path) -> None:
    cap = tmp_path / "sel.nc"
    argv = ["capture", "twin:gpt2", str(text_file), "--passages", "2", "--max-tokens", "16"]
    argv += ["--layers", "1", "--heads", "0:2", "--queries", "-1", "--out", str(cap), "-q"]
    assert main(argv) == 0
    ds = ac.load(cap)
    assert ds["layer"].values.tolist() == [1]
    assert ds["head"].values.tolist() == [0, 1]
    assert ds.sizes["query"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["capture", "no-such-model", "{text}"], "unknown model 'no-such-model'"),
        (["capture", "twin:no-such-family", "{text}"], "no-such-family"),
        (["capture", "twin:llama", "{tmp}/missing.txt"], "no such text file"),
        (["capture", "whisper-base", "{text}"], "is a speech model: it reads audio"),
        (["capture", "twin:whisper", "--corpus", "austen"], "pass --corpus austen-speech"),
        (["capture", "twin:llama", "{text}", "--stack", "cross"], "--stack is for encoder-"),
        (["capture", "twin:llama", "{text}", "--layers", "9"], "out of range"),
        (["capture", "twin:llama", "{text}", "--out", "{tmp}/x.csv"], "must end in .nc or .zarr"),
        (["capture", "twin:llama"], "give text files"),
        (["capture", "twin:llama", "{text}", "--min-words", "500"], "lower --min-words"),
        (["analyze", "{tmp}/missing.nc"], "no such dataset"),
        (["analyze", "{text}"], "cannot read"),
        (["report", "{tmp}"], "not an analysis folder"),
        (["demo", "--text", "no-such-corpus"], "unknown asset 'no-such-corpus'"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(
    argv: list[str],
    message: str,
    tmp_path: Path,
    text_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(text=text_file, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attncoda: error: ") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_analyze_on_a_torch_device_and_a_bad_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "rows.nc"
    ac.save(ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=10), cap)
    bad = tmp_path / "bad"
    assert main(["analyze", str(cap), "--device", "gpu0", "--out", str(bad), "-q"]) == 2
    assert "not a torch device" in capsys.readouterr().err
    assert not bad.exists()  # refused before any file is written
    numbers = {}
    for name, extra in (("numpy", []), ("device", ["--device", "cpu"])):
        argv = ["analyze", str(cap), "--out", str(tmp_path / name), "--n-boot", "5"]
        assert main([*argv, "--no-figures", "-q", *extra]) == 0
        numbers[name] = ac.load_analysis(tmp_path / name).numbers
    assert "flip_rate_kept_dropped_js" in numbers["numpy"]
    assert "clustering_ari_k2" in numbers["numpy"]
    for key, want in numbers["numpy"].items():
        if isinstance(want, str) or (
            isinstance(want, list) and any(isinstance(v, str) for v in want)
        ):  # labels (the sink tokens) are exact
            assert numbers["device"][key] == want, key
            continue
        assert numbers["device"][key] == pytest.approx(want, rel=1e-6, abs=1e-9), key


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "twin:llama", "x.txt", "--layers", "a-b"]) == 2
    assert "argument --layers" in capsys.readouterr().err
    assert main(["demo", "--passages", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2


@pytest.mark.slow
def test_entry_points_run_as_processes() -> None:
    """The console script's module and ``python -m attncoda``."""
    for cmd in (
        [sys.executable, "-m", "attncoda.cli", "--version"],
        [sys.executable, "-m", "attncoda", "demo", "--help"],
    ):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert res.returncode == 0, res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "attncoda.cli", "analyze", "missing.nc"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == "attncoda: error: no such dataset: missing.nc"


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_demo_on_a_twin_and_a_text_file(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    argv = ["demo", "--model", "twin:llama", "--text", str(text_file), "--quick"]
    assert main([*argv, "--passages", "3", "--n-boot", "5", "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "report:" in printed and "sink rate" in printed
    for name in ("report.html", "summaries.nc", "rows.nc", "sink_grid.png", "sink_grid.svg"):
        assert (out / name).is_file(), name
    assert ac.load(out / "summaries.nc").sizes["sample"] == 3


@pytest.mark.real
@pytest.mark.slow
def test_demo_quick_on_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's main job, shortened: the real SmolLM2-135M on Emma, fully offline."""
    from attncoda.hooks import assets

    if not (assets.is_fetched("smollm2-135m") and assets.is_fetched("austen")):
        pytest.skip("needs `attncoda fetch smollm2-135m austen`")
    out = tmp_path / "attncoda-demo"
    assert main(["demo", "--quick", "--passages", "4", "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "smollm2-135m on 4 passages of austen:emma" in printed
    res = ac.load_analysis(out)
    assert res.numbers["n_layers"] == 30 and res.numbers["n_heads"] == 9
    assert 0 < res.numbers["sink_rate"] <= 1
    assert res.numbers["entropy_identity_max_error"] < 1e-4
    page = (out / "report.html").read_text()
    # figures are inline SVG (with hover) or embedded PNG
    assert page.count('src="data:image/png;base64,') + page.count("<svg ") >= 7
    summaries = ac.load(out / "summaries.nc")
    assert summaries.attrs["family"] == "llama"
    rows = ac.load(out / "rows.nc")
    assert rows["layer"].values.tolist() == [1, 15, 28]


def test_audit_rpa_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit rpa` (attncoda.cli._audit.register_audit_rpa) parses, helps, rejects a missing run."""
    from attncoda.cli import CommandError
    from attncoda.cli._audit import register_audit_rpa

    parser = argparse.ArgumentParser(prog="attncoda audit")
    register_audit_rpa(parser.add_subparsers(dest="target"))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["rpa", "--help"])
    assert exc.value.code == 0
    assert "RUN_DIR" in capsys.readouterr().out
    args = parser.parse_args(["rpa", str(tmp_path / "missing"), "-q"])
    with pytest.raises(CommandError) as err:
        args.func(args)
    assert err.value.code == 2 and "no such run folder" in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "_capture",
        "_registry",
        "arach",
        "arach_audit",
        "assets",
        "demo",
        "distributed",
        "evaluate",
        "gates",
        "prune",
        "rpa",
        "rpa_audit",
        "rpa_checkpoints",
        "rpa_train",
        "scores",
        "zoo",
    ],
)
def test_hooks_module_has_examples(name: str) -> None:
    """Every hooks module documents itself with examples; they run in the ordinary doctest
    collection, so here they are only counted."""
    import doctest
    import importlib

    module = importlib.import_module(f"attncoda.hooks.{name}")
    examples = sum(len(t.examples) for t in doctest.DocTestFinder().find(module))
    assert examples >= 1, name


def test_warnings_print_as_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library warning during a command is one line (no source line), and a capture on the
    default path gives none."""
    import warnings

    from attncoda.hooks import demo

    text = tmp_path / "t.txt"
    text.write_text("God said, let there be light, and there was light in all the land. " * 4)
    argv = ["capture", "twin:llama", str(text), "--passages", "1", "--min-words", "5"]
    assert main([*argv, "--max-tokens", "16", "--out", str(tmp_path / "a.nc"), "-q"]) == 0
    assert capsys.readouterr().err == ""  # the happy path: no warning
    encode = demo.encode_passages

    def warn_then_encode(*args, **kwargs):
        warnings.warn("a library's warning\n  over two lines", UserWarning, stacklevel=1)
        return encode(*args, **kwargs)

    monkeypatch.setattr(demo, "encode_passages", warn_then_encode)
    assert main([*argv, "--max-tokens", "16", "--out", str(tmp_path / "b.nc"), "-q"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attncoda: warning: a library's warning over two lines"]


@pytest.mark.real
@pytest.mark.slow
def test_the_readme_command_line_gives_no_warning(tmp_path: Path) -> None:
    """The README's capture -> analyze -> report on SmolLM2-135M (a tokenizer adding no BOS),
    with attncoda's sink warning made an error: the happy path warns about nothing."""
    from attncoda.hooks import assets

    if not (assets.is_fetched("smollm2-135m") and assets.is_fetched("austen")):
        pytest.skip("needs `attncoda fetch smollm2-135m austen`")
    base = [sys.executable, "-W", "error::attncoda.hooks.SinkTokenWarning", "-m", "attncoda.cli"]
    for argv in (
        ["capture", "smollm2-135m", "--corpus", "austen:emma", "--passages", "2"],
        ["analyze", "emma.nc", "--out", "emma/", "--n-boot", "0"],
        ["report", "emma/"],
    ):
        res = subprocess.run(
            [
                *base,
                *argv,
                *(["--max-tokens", "24", "--out", "emma.nc"] if argv[0] == "capture" else []),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        assert "warning" not in res.stderr.lower(), res.stderr
    assert "sink_note" in ac.load(tmp_path / "emma.nc").attrs
    assert (tmp_path / "emma" / "report.html").is_file()
