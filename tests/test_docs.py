"""The documentation: every command it shows is valid, the API page covers the public namespace,
and (``-m real``) the Sphinx site builds with warnings as errors, executing the gallery."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import chromium, open_page

import attncoda as ac

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
FENCE = re.compile(r"^```(bash|console|shell|sh|python)\s*\n(.*?)^```", re.M | re.S)


def _blocks(lang: set[str]) -> list[tuple[str, str]]:
    out = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PAGES]:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            if m.group(1) in lang:
                out.append((str(page.relative_to(ROOT)), m.group(2)))
    return out


def _shell_commands() -> list[tuple[str, list[str]]]:
    """Every simple command of the shell blocks of the README and the docs."""
    cmds = []
    for where, block in _blocks({"bash", "console", "shell", "sh"}):
        block = re.sub(r"\\\n\s*", " ", block)  # a command continued over lines is one line
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


def test_ci_runs_the_readme_test_command() -> None:
    """``.ci/run`` runs the README's test command (its second command) verbatim, and that
    command ends with the whole test suite, ``pytest`` with nothing deselected."""
    second = [b for w, b in _blocks({"bash"}) if w == "README.md"][1].strip()
    assert second.startswith("pip install") and second.endswith("&& pytest"), second
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert second in ci, ".ci/run does not run the README's test command verbatim"


API_PAGES = [DOCS / "api.md", *sorted((DOCS / "api").glob("*.md"))]
_API_NAMES = re.compile(r"^\.\. api-names:: (\S+)\n((?:\n|   \S.*\n)*)", re.M)
_AUTO = re.compile(r"^\.\. (auto\w+|currentmodule|py:module|module):: (\S+)", re.M)


def _api_names() -> list[tuple[str, str, list[str]]]:
    """(page, module, names) of every ``api-names`` directive; names empty: the module's __all__."""
    out = []
    for page in API_PAGES:
        for m in _API_NAMES.finditer(page.read_text(encoding="utf-8")):
            names = [line.strip() for line in m.group(2).splitlines() if line.strip()]
            out.append((page.name, m.group(1), names))
    return out


def _documented(module: str) -> set[str]:
    names: set[str] = set()
    for _, mod, listed in _api_names():
        if mod == module:
            names |= set(listed) or set(importlib.import_module(mod).__all__)
    return names


def test_api_pages_cover_the_public_namespace() -> None:
    missing = sorted(set(ac.__all__) - _documented("attncoda") - {"__version__"})
    assert not missing, f"add these to an ``api-names:: attncoda`` list in docs/api/: {missing}"
    import attncoda.native
    import attncoda.testing

    assert set(attncoda.testing.__all__) <= _documented("attncoda.testing")
    assert set(attncoda.native.__all__) <= _documented("attncoda.native")


def _public_hooks_modules() -> list[str]:
    pytest.importorskip("torch")
    import attncoda.hooks as hooks

    subs = [m.name for m in pkgutil.iter_modules(hooks.__path__) if not m.name.startswith("_")]
    return ["attncoda.hooks", *(f"attncoda.hooks.{name}" for name in subs)]


def _has_doc(module: str, name: str) -> bool:
    """A function or class has a docstring; data has a ``#:`` comment where it is defined."""
    from sphinx.pycode import ModuleAnalyzer

    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj) or inspect.isroutine(obj) or callable(obj):
        return bool((obj.__doc__ or "").strip())
    package = module if module.count(".") == 1 else module.rsplit(".", 1)[0]
    candidates = [
        module,
        *(
            f"{package}.{m.name}"
            for m in pkgutil.iter_modules(importlib.import_module(package).__path__)
        ),
    ]
    for mod in candidates:
        try:
            docs = ModuleAnalyzer.for_module(mod).find_attr_docs()
        except Exception:  # a module without source
            continue
        if any(key[1] == name and "".join(lines).strip() for key, lines in docs.items()):
            return True
    return False


def test_every_public_name_of_attncoda_hooks_is_documented() -> None:
    """Every public module of attncoda.hooks has an API page listing its whole ``__all__``, and
    each of those names has a docstring (or a ``#:`` comment for data), so none shows empty."""
    whole = {mod for _, mod, names in _api_names() if not names}
    undocumented = []
    for module in _public_hooks_modules():
        assert module in whole, f"no ``api-names:: {module}`` (without a list) in docs/api/"
        mod = importlib.import_module(module)
        assert getattr(mod, "__all__", None), f"{module} has no __all__"
        undocumented += [f"{module}.{n}" for n in mod.__all__ if not _has_doc(module, n)]
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_no_private_module_is_presented_as_api() -> None:
    for page in API_PAGES:
        text = page.read_text(encoding="utf-8")
        for m in [*_AUTO.finditer(text), *_API_NAMES.finditer(text)]:
            directive, target = (
                (m.group(1), m.group(2)) if m.re is _AUTO else ("api-names", m.group(1))
            )
            parts = target.split(".")
            module_parts = (
                parts
                if directive in ("automodule", "currentmodule", "py:module", "module", "api-names")
                else parts[:-1]
            )
            private = [p for p in module_parts if p.startswith("_")]
            # a class defined in a private module but reached through a public name (the
            # figures of ``ds.coda.plot``) is shown by its short name (add_module_names=False)
            if directive == "autoclass" and target == "attncoda._accessor.PlotAccessor":
                continue
            assert not private, f"{page.name}: {directive}:: {target} presents a private module"


def test_cli_page_lists_the_exit_codes_of_the_command() -> None:
    """docs/cli.md's table of exit codes has exactly the codes ``attncoda --help`` lists."""
    from attncoda.cli import EXIT_CODES

    table = re.findall(r"^\| (\d+) \|", (DOCS / "cli.md").read_text(encoding="utf-8"), re.M)
    assert sorted(int(code) for code in table) == sorted(code for code, _ in EXIT_CODES)


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


# --------------------------------------------------------------------------------------------
# No remote assets: the built site must work offline.

_REMOTE = r"""(?:https?:)?//"""
_TAG_ASSET = re.compile(
    rf"""<(script|link|img|iframe|source|embed|object)\b[^>]*?\b(src|href|data)\s*=\s*["']?({_REMOTE}[^"'\s>]+)""",
    re.I,
)
_CSS_ASSET = re.compile(rf"""(@import\s+|url\(\s*)["']?({_REMOTE}[^"')\s]+)""", re.I)


def remote_assets(site: Path) -> list[str]:
    """Every script, style sheet, image or frame of the built site that would be loaded from
    the network: ``src=``/``href=`` of such tags in the HTML pages, ``@import`` and ``url()`` in
    the CSS files and inline styles. Links for the reader (``<a href="https://...">``) are not
    assets and are allowed."""
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css", ".js") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        where = path.relative_to(site)
        if path.suffix == ".html":
            found += [
                f"{where}: <{m.group(1)} {m.group(2)}={m.group(3)}"
                for m in _TAG_ASSET.finditer(text)
            ]
        if path.suffix in (".html", ".css"):
            found += [f"{where}: {m.group(0)}" for m in _CSS_ASSET.finditer(text)]
        if path.suffix == ".js":  # a script that injects one (MathJax's loader does)
            found += [
                f"{where}: {m.group(0)}"
                for m in re.finditer(rf"""\.src\s*=\s*["']{_REMOTE}[^"']+""", text)
            ]
    return found


def test_remote_asset_check_finds_remote_scripts_and_styles(tmp_path: Path) -> None:
    """The check of the built site can fail: each kind of remote asset is found, local assets
    and reader links are not."""
    page = tmp_path / "page.html"
    page.write_text(
        '<html><head><script defer src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js">'
        '</script><link rel="stylesheet" href="//cdn.example.org/x.css">'
        '<link rel="stylesheet" href="_static/alabaster.css"><script src="_static/doctools.js">'
        '</script><style>@import url("https://fonts.example.org/f.css");</style></head>'
        '<body><a href="https://numpy.org/doc/stable/">numpy</a><img src="_images/a.png">'
        "</body></html>",
        encoding="utf-8",
    )
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "theme.css").write_text(
        "body { background: url(https://example.org/bg.png) }", encoding="utf-8"
    )
    found = remote_assets(tmp_path)
    assert len(found) == 4, found
    assert any("mathjax" in f for f in found) and any("//cdn.example.org" in f for f in found)
    assert any("fonts.example.org" in f for f in found) and any("bg.png" in f for f in found)
    page.write_text('<a href="https://numpy.org">n</a><script src="_static/x.js"></script>')
    (tmp_path / "_static" / "theme.css").write_text("body { background: url(bg.png) }")
    assert remote_assets(tmp_path) == []


def test_maths_renders_to_mathml_without_a_script() -> None:
    """The docs' math renderer: LaTeX to MathML at build time (no MathJax, no network)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from attncoda_mathml import to_mathml
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    inline = to_mathml(r"H = H_b(s) + (1 - s)\,H(c)", display=False)
    assert inline.startswith("<math") and 'display="inline"' in inline and "<msub>" in inline
    block = to_mathml(r"\begin{align} a &= b \\ c &= \frac{d}{e} \end{align}", display=True)
    assert 'display="block"' in block and "<mfrac>" in block and "<mtable" in block
    with pytest.raises(ValueError, match="cannot convert"):
        to_mathml(r"\frac{a}{", display=False)
    with pytest.raises(ValueError, match=r"unknown \\foo"):  # never raw LaTeX in a page
        to_mathml(r"\foo{a} + b", display=False)


def test_offline_inventories_read_as_sphinx_reads_them() -> None:
    """The committed intersphinx inventories (docs/_intersphinx, written offline by
    make_inventories.py) load with Sphinx's reader and hold the names our docstrings use."""
    pytest.importorskip("sphinx")
    from sphinx.util.inventory import InventoryFile

    want = {
        "python": ("py:class", "pathlib.Path", "library/pathlib.html#pathlib.Path"),
        "numpy": ("py:class", "numpy.ndarray", "reference/generated/numpy.ndarray.html"),
        "scipy": ("py:function", "scipy.special.logsumexp", "scipy.special.logsumexp.html"),
        "xarray": ("py:class", "xarray.DataArray", "generated/xarray.DataArray.html"),
        "torch": ("py:class", "torch.Tensor", "tensors.html#torch.Tensor"),
        "pandas": ("py:class", "pandas.DataFrame", "reference/api/pandas.DataFrame.html"),
    }
    for project, (role, name, page) in want.items():
        path = DOCS / "_intersphinx" / f"{project}.inv"
        base = "https://example.invalid/"
        with open(path, "rb") as fh:
            inv = InventoryFile.load(fh, base, lambda base, uri: base + uri)
        data = inv.data if hasattr(inv, "data") else inv  # Sphinx >= 8.2 returns an object
        entry = data[role][name]
        uri = entry.uri if hasattr(entry, "uri") else entry[2]
        assert uri.startswith(base) and page in uri, (project, uri)


def test_inline_code_naming_a_public_object_is_linked() -> None:
    """The docs link inline code such as ``ac.decompose`` to the API (attncoda_api's
    ``resolve_name``); code naming nothing public, or a private name, stays plain."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from attncoda_api import resolve_name
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    assert resolve_name("ac.decompose") == "attncoda.decompose"
    assert resolve_name("ac.save(ds, path)") == "attncoda.save"
    assert resolve_name("attncoda.hooks.capture") == "attncoda.hooks.capture"
    assert resolve_name("attncoda.hooks.zoo.load") == "attncoda.hooks.zoo.load"
    assert resolve_name("ac.testing.synthetic_rows()") == "attncoda.testing.synthetic_rows"
    for plain in ("ac.no_such_name", "attncoda._logratio.clr", "np.log", "decompose", "ac."):
        assert resolve_name(plain) is None, plain


@pytest.mark.slow
def test_the_transformerlens_page_example_runs(tmp_path: Path) -> None:
    """docs/transformerlens.md computes attncoda's metrics on a pattern cache laid out as
    TransformerLens's (batch, head, query, key), without TransformerLens or nnsight: its code
    runs as written in a fresh interpreter where importing either library fails."""
    page = (DOCS / "transformerlens.md").read_text(encoding="utf-8")
    for call in ("run_with_cache", 'cache["pattern", l]', "ds.log_attn.sel(layer=l)"):
        assert call in page, call
    blocks = [m.group(2) for m in FENCE.finditer(page) if m.group(1) == "python"]
    assert blocks, "no python block"
    blocker = tmp_path / "sitecustomize.py"  # the example must not need either library
    blocker.write_text(
        "import sys\nfor name in ('transformer_lens', 'nnsight'):\n    sys.modules[name] = None\n",
        encoding="utf-8",
    )
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    res = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(tmp_path),
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": "1",
        },
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].split() == ["head", "0", "1", "2", "3"], res.stdout  # the profile table
    assert 0.0 <= float(lines[-1]) <= 1.0  # the sink rate


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
    for page in (
        "getting-started",
        "maths",
        "schema",
        "capture",
        "conventions",
        "cli",
        "api",
        "transformerlens",
    ):
        assert (out / f"{page}.html").is_file(), page
    assert "attncoda capture" in (out / "cli.html").read_text(encoding="utf-8")
    assert (out / "case-studies" / "conventions.html").is_file()
    assert (out / "gotchas.html").is_file()
    # offline: no remote script or style anywhere, the maths is MathML, no MathJax
    assert remote_assets(out) == []
    maths = (out / "maths.html").read_text(encoding="utf-8")
    assert maths.count("<math") >= 10 and not re.search(r"<script[^>]*mathjax", maths, re.I)
    assert not (out / "sg_execution_times.html").exists()
    assert not (out / "auto_examples" / "sg_execution_times.html").exists()
    # the API split by module, with tables, linked out through the offline inventories
    for module in ("coda", "decompose", "data", "hooks", "gates", "zoo", "transformerlens"):
        assert (out / "api" / f"{module}.html").is_file() or (out / f"{module}.html").is_file()
    gates = (out / "api" / "gates.html").read_text(encoding="utf-8")
    assert 'class="autosummary' in gates and "HeadGate" in gates
    decompose = (out / "api" / "decompose.html").read_text(encoding="utf-8")
    assert "https://docs.pytorch.org/docs/stable/tensors.html#torch.Tensor" in decompose
    # narrative pages link into the API
    started = (out / "getting-started.html").read_text(encoding="utf-8")
    assert 'href="api/hooks.html#attncoda.hooks.capture"' in started
    # inline code in pages nobody annotated links too (`ac.group_decompose` in maths.md)
    assert 'href="api/decompose.html#attncoda.group_decompose"' in maths
    # closure's See Also: two entries, each with its description, none made of a continuation
    closure = next(
        p.read_text(encoding="utf-8")
        for p in (out / "api").glob("*.html")
        if 'id="attncoda.closure"' in p.read_text(encoding="utf-8")
    )
    entry = closure[closure.index('id="attncoda.closure"') :]
    see_also = entry[entry.index("seealso") : entry.index("</div>", entry.index("seealso"))]
    assert "composition_stats.closure" in see_also and "which attncoda accepts: captures" in (
        see_also
    )
    assert ">accepts<" not in see_also
    # code blocks fit the page's column as a reader's window shows it (no sideways scroll)
    if chromium() is not None:
        with open_page(out / "index.html", tmp_path / "profile", 1100, 900) as tab:
            wide = tab.evaluate(
                "Array.from(document.querySelectorAll('div.highlight pre'))"
                ".filter(p => p.scrollWidth > p.clientWidth + 1)"
                ".map(p => p.scrollWidth + ' > ' + p.clientWidth + ': ' + p.textContent.slice(0, 50))"
            )
        assert wide == [], wide


def _python_blocks_by_page() -> dict[str, list[str]]:
    """The ```python blocks of each docs page (not the README's), in page order."""
    pages: dict[str, list[str]] = {}
    for where, code in _blocks({"python"}):
        if where.startswith("docs/"):
            pages.setdefault(where, []).append(code)
    return pages


def test_the_docs_pages_show_python_blocks() -> None:
    """There are blocks for ``test_python_blocks_of_the_docs_run`` to run."""
    assert sum(len(blocks) for blocks in _python_blocks_by_page().values()) >= 4


#: Runs the block files named on its command line one after another in this interpreter, each as
#: its own ``__main__`` script (``runpy.run_path``: fresh globals, ``__file__`` the block, so a
#: spawned worker process imports the block as a script's would), in its own folder as working
#: directory and temporary directory; writes one traceback (or null) per block to ``argv[1]``.
_PAGE_RUNNER = """\
import json, os, runpy, sys, tempfile, traceback
import torch
torch.set_num_threads(1)
out, results = os.path.abspath(sys.argv[1]), []
for script in sys.argv[2:]:
    folder = os.path.dirname(script)
    os.chdir(folder)
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    print(f"--- {script}", file=sys.stderr, flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        results.append(None if exc.code in (None, 0) else f"SystemExit({exc.code!r})")
    except KeyboardInterrupt:
        raise
    except BaseException:
        results.append(traceback.format_exc())
    else:
        results.append(None)
with open(out, "w", encoding="utf-8") as fh:
    json.dump(results, fh)
"""


@contextlib.contextmanager
def _holding_port(port: int) -> Iterator[None]:
    """Listen on ``port`` while the block runs, as a user's running cluster would (when another
    process holds it already, it is taken anyway)."""
    with socket.socket() as sock:
        with contextlib.suppress(OSError):
            sock.bind(("", port))
            sock.listen()
        yield


@dataclass(frozen=True)
class _PagesRun:
    """One run of every docs page's python blocks in one fresh interpreter: each block's
    traceback (or None) by page, and what the interpreter wrote to stderr while each page ran."""

    returncode: int
    errors: dict[str, list[str | None]]
    stderr: dict[str, str]
    tail: str


@pytest.fixture(scope="session")
def docs_pages_run(tmp_path_factory: pytest.TempPathFactory) -> _PagesRun:
    """The python blocks of every docs page, run once per session (per pytest-xdist worker;
    the page tests share ``xdist_group("docs-pages")``, so one worker runs them all) by one
    fresh interpreter: importing torch, transformers and attncoda once for all the pages
    rather than once per page saved ~2.5 CPU-s a page (10 pages; measured 6 December 2026).
    Each block still runs as its own script with fresh globals, as the blocks of one page
    always did."""
    from attncoda.hooks import assets

    if not (assets.is_fetched("smollm2-135m") and assets.is_fetched("austen")):
        pytest.skip("needs `attncoda fetch smollm2-135m austen`")
    tmp_path = tmp_path_factory.mktemp("docs-pages")
    scripts, owner = [], {}
    for p, (page, blocks) in enumerate(sorted(_python_blocks_by_page().items())):
        for i, code in enumerate(blocks, 1):
            folder = tmp_path / f"page{p}-block{i}"  # its files and tempfile.mkdtemp() land here
            folder.mkdir()
            (folder / "block.py").write_text(code, encoding="utf-8")
            scripts.append(str(folder / "block.py"))
            owner[scripts[-1]] = page
    runner = tmp_path / "run_blocks.py"
    runner.write_text(_PAGE_RUNNER, encoding="utf-8")
    results = tmp_path / "results.json"
    with _holding_port(8787):  # dask's default dashboard port: a block must not need it
        res = subprocess.run(
            [sys.executable, str(runner), str(results), *scripts],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=tmp_path,
            env={**os.environ, "MPLBACKEND": "Agg", "TMPDIR": str(tmp_path)},
        )
    errors: dict[str, list[str | None]] = {page: [] for page in owner.values()}
    if results.is_file():
        for script, error in zip(
            scripts, json.loads(results.read_text(encoding="utf-8")), strict=True
        ):
            errors[owner[script]].append(error)
    stderr = dict.fromkeys(errors, "")
    for part in re.split(r"^(?=--- )", res.stderr, flags=re.M):
        script = part.split("\n", 1)[0].removeprefix("--- ")
        if script in owner:
            stderr[owner[script]] += part
    return _PagesRun(res.returncode, errors, stderr, res.stderr[-3000:])


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.xdist_group("docs-pages")
@pytest.mark.parametrize("page", sorted(_python_blocks_by_page()))
def test_python_blocks_of_the_docs_run(page: str, docs_pages_run: _PagesRun) -> None:
    """Each ```python block of a docs page runs as written: as its own script, with nothing
    from the other blocks, in a fresh interpreter (importing torch and attncoda once for all
    the pages, not once per block or page: ``docs_pages_run``)."""
    blocks = _python_blocks_by_page()[page]
    run = docs_pages_run
    assert run.returncode == 0 and run.errors[page], f"{page}: the runner failed\n{run.tail}"
    # a block that starts a cluster on a fixed port collides with the user's own cluster
    assert "already in use" not in run.stderr[page], run.stderr[page][-3000:]
    errors = run.errors[page]
    assert len(errors) == len(blocks)
    failed = [
        f"{page}, block {i} of {len(blocks)}:\n{code}\n{error[-3000:]}"
        for i, (code, error) in enumerate(zip(blocks, errors, strict=True), 1)
        if error is not None
    ]
    assert not failed, "\n\n".join(failed)


def _see_also_entries(obj: object, qualname: str) -> list[tuple[str, str]]:
    """(name, description) of each See Also entry of ``obj``'s docstring as the docs render it:
    attncoda_api's joining, then napoleon (the ``seealso`` block it writes)."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from attncoda_api import see_also_joined
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    lines = inspect.getdoc(obj).splitlines()  # type: ignore[union-attr]
    config = Config(napoleon_use_rtype=False, napoleon_preprocess_types=True)
    rst = str(NumpyDocstring(see_also_joined(lines), config, what="function", name=qualname))
    block = rst.partition(".. seealso::")[2].split("\n.. ", 1)[0]
    entries: list[tuple[str, str]] = []
    first, _, rest = block.partition("\n")
    if first.strip():  # napoleon's one-line form: names without descriptions
        block = "   " + first.strip() + "\n" + rest
    for line in block.splitlines():
        named = re.fullmatch(r"   (?::py:\w+:`(?P<name>[^`]+)`(?:, )?)+.*", line)
        if named:
            for name in re.findall(r":py:\w+:`([^`]+)`", line):
                entries.append((name.lstrip("~"), ""))
        elif line.startswith("       ") and entries:
            entries[-1] = (entries[-1][0], (entries[-1][1] + " " + line.strip()).strip())
    return entries


def _resolves(name: str, module: str) -> bool:
    """Whether a See Also name is an object: dotted from its package, or a name of ``module``."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return len(parts) == 1 and hasattr(importlib.import_module(module), name)


def test_see_also_of_every_public_function_names_objects_with_descriptions() -> None:
    """Every See Also entry of every documented function and class renders as a name the docs
    link (an object that exists) with its description; a continuation line such as ``accepts:
    captures are ...`` is part of the entry above it, not a new name."""
    modules = ["attncoda", "attncoda.testing", "attncoda.native"]
    if importlib.util.find_spec("torch") is not None:
        modules += _public_hooks_modules()
    seen = 0
    bad = []
    for module in modules:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if not (inspect.isroutine(obj) or inspect.isclass(obj)) or "See Also" not in (
                obj.__doc__ or ""
            ):
                continue
            entries = _see_also_entries(obj, f"{module}.{name}")
            seen += len(entries)
            if not entries:
                bad.append(f"{module}.{name}: a See Also section with no entry")
            bad += [
                f"{module}.{name}: See Also {ref!r} ({'no such object' if not _resolves(ref, module) else 'no description'})"
                for ref, text in entries
                if not _resolves(ref, module) or not text
            ]
    assert seen > 20  # the docstrings do have See Also sections
    assert not bad, "\n".join(bad)
