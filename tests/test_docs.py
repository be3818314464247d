"""The documentation: every command it shows is valid, the API page covers the public namespace,
and (``-m real``) the Sphinx site builds with warnings as errors, executing the gallery."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attncoda as ac

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
FENCE = re.compile(r"^```(bash|console|shell|sh|python)\s*\n(.*?)^```", re.M | re.S)


def _blocks(lang: set[str]) -> list[tuple[str, str]]:
    out = []
    for page in [ROOT / "README.md", *PAGES]:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            if m.group(1) in lang:
                out.append((str(page.relative_to(ROOT)), m.group(2)))
    return out


def _shell_commands() -> list[tuple[str, list[str]]]:
    """Every simple command of the shell blocks of the README and the docs."""
    cmds = []
    for where, block in _blocks({"bash", "console", "shell", "sh"}):
        for line in block.splitlines():
            line = line.removeprefix("$ ").strip()
            if not line or line.startswith("#"):
                continue
            for piece in re.split(r"&&|\|\||;|\|", line):
                words = shlex.split(piece, comments=True)
                if words:
                    cmds.append((where, words))
    return cmds


def test_docs_show_commands() -> None:
    names = {words[0] for _, words in _shell_commands()}
    assert {"attncoda", "pip", "python"} <= names


def test_every_attncoda_command_in_readme_and_docs_parses() -> None:
    from attncoda.cli import build_parser

    seen = 0
    for where, words in _shell_commands():
        if words[0] != "attncoda":
            continue
        try:
            args = build_parser().parse_args(words[1:])
        except SystemExit as exc:  # pragma: no cover - reported below
            pytest.fail(f"{where}: `{shlex.join(words)}` does not parse (exit {exc.code})")
        assert getattr(args, "func", None) is not None, f"{where}: {shlex.join(words)}"
        seen += 1
    assert seen >= 10


def test_every_python_module_in_readme_and_docs_exists() -> None:
    sys.path.insert(0, str(ROOT))  # case_studies run from the repository root
    try:
        for where, words in _shell_commands():
            if words[:2] == ["python", "-m"]:
                assert importlib.util.find_spec(words[2]) is not None, f"{where}: {words[2]}"
    finally:
        sys.path.remove(str(ROOT))


def test_readme_main_job_is_the_demo() -> None:
    """The README's first command ends with the main job, `attncoda demo`."""
    first = next(b for w, b in _blocks({"bash"}) if w == "README.md")
    assert "attncoda fetch smollm2-135m austen" in first
    assert "attncoda demo" in first


def test_api_page_covers_the_public_namespace() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"\.\. auto(?:function|class|data|exception):: (\w+)", api))
    missing = sorted(set(ac.__all__) - documented - {"__version__"})
    assert not missing, f"add these to docs/api.md: {missing}"


def test_every_page_is_in_a_toctree() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    for page in PAGES:
        rel = page.relative_to(DOCS).with_suffix("").as_posix()
        if rel == "index":
            continue
        name = rel.split("/")[-1]
        assert re.search(rf"^{re.escape(name)}$|^{re.escape(rel)}$", text, re.M), rel


def test_gallery_examples_are_named_for_sphinx_gallery() -> None:
    examples = sorted((DOCS / "examples").glob("*.py"))
    assert len(examples) >= 4
    for ex in examples:
        assert ex.name.startswith("plot_"), ex.name
        source = ex.read_text(encoding="utf-8")
        assert source.startswith('"""\n'), f"{ex.name} needs a docstring title"


@pytest.mark.real
@pytest.mark.slow
def test_sphinx_site_builds_with_the_executed_gallery(tmp_path: Path) -> None:
    """`sphinx-build -W` of a copy of docs/ (the gallery is executed; a failing example or any
    warning fails the build), then the HTML is checked to hold the executed figures."""
    for mod in ("sphinx", "myst_parser", "sphinx_gallery"):
        pytest.importorskip(mod, reason=f"needs {mod} (pip install 'attncoda[docs]')")
    from attncoda.hooks import assets

    if not (assets.is_fetched("smollm2-135m") and assets.is_fetched("austen")):
        pytest.skip("the gallery's real example needs `attncoda fetch smollm2-135m austen`")
    src = tmp_path / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "auto_examples"))
    out = tmp_path / "html"
    env = {**os.environ, "ATTNCODA_REPO": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    res = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    examples = sorted((DOCS / "examples").glob("plot_*.py"))
    for ex in examples:
        page = out / "auto_examples" / f"{ex.stem}.html"
        html = page.read_text(encoding="utf-8")
        images = re.findall(rf'src="(\.\./_images/sphx_glr_{ex.stem}_\d+\.png)"', html)
        assert images, f"{ex.name}: no executed figure in {page.name}"
        for img in images:
            path = (page.parent / img).resolve()
            assert path.is_file() and path.stat().st_size > 1000, img
    for page in ("getting-started", "maths", "schema", "capture", "conventions", "cli", "api"):
        assert (out / f"{page}.html").is_file(), page
    assert "attncoda capture" in (out / "cli.html").read_text(encoding="utf-8")
    assert (out / "case-studies" / "conventions.html").is_file()
    assert (out / "gotchas.html").is_file()


@pytest.mark.real
@pytest.mark.slow
def test_python_blocks_of_the_docs_run(tmp_path: Path) -> None:
    """Each ```python block of the docs pages runs as written, in a fresh interpreter."""
    from attncoda.hooks import assets

    if not (assets.is_fetched("smollm2-135m") and assets.is_fetched("austen")):
        pytest.skip("needs `attncoda fetch smollm2-135m austen`")
    blocks = [(w, b) for w, b in _blocks({"python"}) if w.startswith("docs/")]
    assert len(blocks) >= 4
    for i, (where, code) in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text("import torch\ntorch.set_num_threads(1)\n" + code, encoding="utf-8")
        res = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "MPLBACKEND": "Agg"},
        )
        assert res.returncode == 0, f"{where}, block {i}:\n{code}\n{res.stderr[-3000:]}"
