"""What every case study shares: one command line, a provenance manifest, README tables rendered
from result files, and quick runs compared with committed golden results.

Each study folder ``case_studies/<name>/`` has

- ``__main__.py``: ``python -m case_studies.<name> run|table|quick`` (built by :func:`main`);
- ``results/``: the committed results of the full run, with ``manifest.json`` (:class:`Provenance`:
  git commit and whether the tree was dirty, the exact command, package versions, the sha256 of
  every asset and of every token tensor the run used, wall time);
- ``golden/``: the committed results of the ``quick`` mode, which CI reruns and compares within a
  stated tolerance, so that a change to capture or analysis that moves a number fails CI instead
  of leaving stale results;
- ``README.md``, whose tables sit between ``<!-- table: NAME -->`` and ``<!-- /table -->``
  markers and are rendered from the result files by ``table`` (never typed by hand); ``table
  --check`` (and a test) fails when a README table differs from what the results give, or when
  the README states a number in prose outside those blocks (:func:`unrendered_numbers`: a
  sentence with a result goes in a rendered block, whose content may be prose).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
PACKAGES = (
    "attncoda",
    "numpy",
    "scipy",
    "pandas",
    "xarray",
    "torch",
    "transformers",
    "scikit-learn",
    "matplotlib",
    "h5netcdf",
    "zarr",
)


# --------------------------------------------------------------------------------------------
# provenance


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The commit the code was at, and whether the tree held changes (and which files)."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
        return out.stdout if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD").strip()
    changed = porcelain_paths(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit or "unknown", "dirty": bool(changed), "dirty_files": changed[:50]}


def porcelain_paths(status: str) -> list[str]:
    """The paths of ``git status --porcelain`` lines (``XY PATH``; a leading space is the X
    status, so only line ends may be stripped)."""
    return [ln[3:] for ln in status.splitlines() if ln.strip()]


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a study's numbers depend on, and Python's."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def asset_record(name: str) -> dict[str, Any]:
    """The sha256 of every file of a fetched asset (verified when read) and its fingerprint."""
    from attncoda.hooks import assets

    folder = assets.asset_path(name)  # verifies every sha256 (stamp fast path)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return {
        "fingerprint": manifest.get("fingerprint", ""),
        "sources": [s.get("package", "") for s in manifest.get("sources", [])],
        "files": {f["path"]: f["sha256"] for f in manifest.get("files", [])},
    }


@dataclass
class Provenance:
    """What a study run used, written as ``manifest.json`` beside its results.

    A study calls :meth:`asset` for every model and corpus it reads and :meth:`tokens` for every
    token tensor it evaluates; :meth:`write` adds the commit, the command, the package versions
    and the wall time.
    """

    study: str
    mode: str
    command: str = ""
    started: float = field(default_factory=time.perf_counter)
    started_at: str = field(
        default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    )
    assets: dict[str, Any] = field(default_factory=dict)
    token_sha256: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the commit and tree state when the run started (a long run outlives later commits)
    git: dict[str, Any] = field(default_factory=git_state)

    def asset(self, name: str) -> None:
        """Record an asset (its files' sha256s) once."""
        if name not in self.assets:
            self.assets[name] = asset_record(name)

    def tokens(self, label: str, ids: Any) -> str:
        """Record the sha256 of a token tensor under ``label`` (e.g. ``"smollm2-135m/mobydick"``)."""
        from attncoda.hooks.evaluate import tokens_sha256

        digest = tokens_sha256(ids)
        self.token_sha256[label] = digest
        return digest

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "mode": self.mode,
            "command": self.command,
            "git": self.git,
            "started": self.started_at,
            "wall_s": round(time.perf_counter() - self.started, 1),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
            "versions": package_versions(),
            "settings": self.settings,
            "assets": self.assets,
            "token_sha256": dict(sorted(self.token_sha256.items())),
        }

    def write(self, folder: Path) -> Path:
        return write_text(
            folder / MANIFEST, json.dumps(self.as_dict(), indent=1, sort_keys=False) + "\n"
        )


def write_text(path: Path, text: str) -> Path:
    """Replace a file a study owns (a manifest, a README, a JSON or markdown result) crash-safely:
    an interrupt, a crash or another process writing it at the same time (``--shard``) leaves
    the whole old file or the whole new one, never a mix."""
    import attncoda as ac

    with ac.atomic_output(path, overwrite=True, kind="file", is_ours=lambda _path: None) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a results folder (``{}`` if there is none)."""
    path = folder / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def provenance_table(folder: Path) -> str:
    """A README table naming the commit, command and date behind a results folder."""
    m = read_manifest(folder)
    if not m:
        return markdown_table(["results", "made by"], [[f"`{folder.name}/`", "no manifest"]])
    git = m.get("git", {})
    dirty = git.get("dirty")
    state = {True: "with uncommitted changes", False: "clean tree"}.get(dirty, "tree state unknown")
    # a resumable study reports cells made by earlier runs: their trees, not this command's
    groups = {
        name: [g for g in found if g.get("dirty") is not False]
        for name, found in m.get("settings", {}).get("cell_commits", {}).items()
    }
    unclean = {name: found for name, found in groups.items() if found}
    if unclean:
        state += " for this command; not every cell it reports (below)"
    versions = m.get("versions", {})
    shown = ", ".join(
        f"{k} {versions[k]}" for k in ("attncoda", "torch", "transformers") if k in versions
    )
    rows = [
        ["commit", f"`{git.get('commit', 'unknown')[:12]}` ({state})"],
        ["command", f"`{m.get('command', '')}`"],
        ["started", str(m.get("started", "unknown"))],
        [
            "wall time",
            f"{fixed(m['wall_s'], 0)} s"
            if isinstance(m.get("wall_s"), (int, float))
            else "unknown",
        ],
        ["versions", shown or "not recorded"],
    ]
    for name, found in unclean.items():
        rows.append(
            [
                f"cells not from a clean tree ({name})",
                "; ".join(
                    f"{g['n']} at `{str(g['commit'])[:12]}` "
                    f"({'uncommitted changes; which files, not recorded' if g.get('dirty') else 'tree state unknown'}): "
                    + ", ".join(f"`{c}`" for c in g.get("cells", []))
                    for g in found
                ),
            ]
        )
    if git.get("note"):
        rows.append(["note", git["note"]])
    return markdown_table(["results/manifest.json", ""], rows)


# --------------------------------------------------------------------------------------------
# README tables

# a block: the opening marker line, any lines that are not markers, the closing marker line
_BLOCK = re.compile(
    r"^<!-- table: (?P<name>[\w.-]+) -->\n(?P<body>(?:(?!<!-- /?table).*\n)*)<!-- /table -->$",
    re.M,
)


# --------------------------------------------------------------------------------------------
# the one rounding rule of every table and sentence the studies render


def _decimal(x: float) -> Decimal:
    """``x`` as the decimal it stands for: 12 significant digits, which drops the binary noise
    of a computed value (``100 * 0.1075`` is 10.749999999999998, and stands for 10.75)."""
    return Decimal(f"{x:.12g}")


def fixed(x: float, digits: int, *, plus: bool = False, thousands: bool = False) -> str:
    """``x`` with ``digits`` decimals, rounded half away from zero (the studies' one rule: an
    exact half always goes away from zero, whatever its binary form); never ``-0``; ``plus``
    writes a ``+`` before a value that is not negative (as ``f"{x:+.2f}"``), ``thousands`` a
    comma between groups of three digits (as ``f"{x:,.0f}"``).

    Examples
    --------
    >>> from case_studies._study import fixed
    >>> fixed(-5.25, 1), fixed(-10.75, 1), fixed(100 * 0.1075, 1), fixed(2.5, 0), fixed(-0.04, 1)
    ('-5.3', '-10.8', '10.8', '3', '0.0')
    >>> fixed(0.125, 2, plus=True), fixed(-0.001, 2, plus=True), fixed(1234567.5, 0, thousands=True)
    ('+0.13', '+0.00', '1,234,568')
    """
    if not math.isfinite(x):
        return str(x)
    r = _decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    text = format(abs(r) if r == 0 else r, ",f" if thousands else "f")
    return "+" + text if plus and not text.startswith("-") else text


def significant(x: float, n: int) -> str:
    """``x`` to ``n`` significant digits by the same rule as :func:`fixed`, trailing zeros
    dropped (as ``f"{x:.{n}g}"`` writes it, without its binary-noise roundings).

    Examples
    --------
    >>> from case_studies._study import significant
    >>> significant(1.125, 3), significant(0.9105, 3), significant(45.65, 3), significant(2.0, 3)
    ('1.13', '0.911', '45.7', '2')
    """
    if not math.isfinite(x):
        return str(x)
    d = _decimal(x)
    if d == 0:
        return "0"
    r = d.quantize(Decimal(1).scaleb(d.adjusted() - n + 1), rounding=ROUND_HALF_UP)
    return f"{r.normalize():f}"


def scientific(x: float, digits: int) -> str:
    """``x`` in scientific notation with ``digits`` decimals in the mantissa, by the same rule as
    :func:`fixed` (as ``f"{x:.{digits}e}"`` writes it, without its binary-noise roundings).

    Examples
    --------
    >>> from case_studies._study import scientific
    >>> scientific(0.00925, 1), scientific(9.96e-5, 1), scientific(-1.25e-3, 1), scientific(0, 2)
    ('9.3e-03', '1.0e-04', '-1.3e-03', '0.00e+00')
    """
    if not math.isfinite(x):
        return str(x)
    d = _decimal(x)
    exponent = 0 if d == 0 else d.adjusted()
    step = Decimal(1).scaleb(-digits)
    mantissa = d.scaleb(-exponent).quantize(step, rounding=ROUND_HALF_UP)
    if abs(mantissa) >= 10:  # 9.96 to one decimal is 10.0: one more power of ten
        exponent += 1
        mantissa = d.scaleb(-exponent).quantize(step, rounding=ROUND_HALF_UP)
    return f"{abs(mantissa) if mantissa == 0 else mantissa:f}e{exponent:+03d}"


# --------------------------------------------------------------------------------------------
# resampling shared by the studies


def stratified_draws(strata: Sequence[str], n_boot: int, seed: int = 0) -> np.ndarray:
    """Bootstrap index draws ``(n_boot, n)``, each resampling every stratum within itself.

    Examples
    --------
    >>> from case_studies._study import stratified_draws
    >>> d = stratified_draws(["a", "a", "b"], 4)
    >>> d.shape, bool(((d[:, :2] < 2) & (d[:, 2:] == 2)).all())
    ((4, 3), True)
    """
    labels = np.asarray(strata)
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(labels)), np.int64)
    for s in dict.fromkeys(labels.tolist()):
        idx = np.flatnonzero(labels == s)
        cols = idx  # the stratum keeps its positions, so each replicate keeps the texts' mix
        out[:, cols] = idx[rng.integers(0, len(idx), (n_boot, len(idx)))]
    return out


def two_stage_draws(strata: Sequence[str], n_boot: int, seed: int = 4) -> list[np.ndarray]:
    """Two-stage bootstrap index draws: the strata (texts) drawn with replacement, then each
    drawn stratum's members (windows) drawn with replacement within it.

    Examples
    --------
    >>> from case_studies._study import two_stage_draws
    >>> d = two_stage_draws(["a", "a", "b"], 3)
    >>> len(d), all(len(x) in (2, 3, 4) for x in d)  # two draws of "a" or "b": 4, 3 or 2 windows
    (3, True)
    """
    labels = np.asarray(strata)
    groups = [np.flatnonzero(labels == s) for s in dict.fromkeys(labels.tolist())]
    rng = np.random.default_rng(seed)
    out = []
    n_groups, sizes = len(groups), {len(g) for g in groups}
    if len(sizes) == 1:
        # strata of one size (the studies' texts): the members of all drawn strata in one call,
        # a third of the time. The same draws: numpy takes each integer below 2**32 from the bit
        # generator's stream on its own, so one call for G * n of them gives what G calls for n
        # give (tests/test_studies.py compares the two)
        (n,) = sizes
        table = np.stack(groups)
        for _ in range(n_boot):
            picks = rng.integers(0, n_groups, n_groups)
            within = rng.integers(0, n, n_groups * n).reshape(n_groups, n)
            out.append(table[picks[:, None], within].ravel())
        return out
    for _ in range(n_boot):
        picks = rng.integers(0, len(groups), len(groups))
        out.append(
            np.concatenate(
                [groups[g][rng.integers(0, len(groups[g]), len(groups[g]))] for g in picks]
            )
        )
    return out


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are written as given (format them first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_readme(text: str, tables: Mapping[str, str], *, every: bool = True) -> str:
    """``text`` with every marked table block replaced by ``tables[name]``.

    ``every=False`` renders a page that quotes a few of the tables (a docs page): a rendered
    table without a block there is not an error.

    Raises
    ------
    KeyError
        A block names a table the study does not render, or (``every``) a rendered table has no
        block.
    """
    seen: set[str] = set()

    def replace(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in tables:
            raise KeyError(f"README block {name!r} has no rendered table; known: {sorted(tables)}")
        seen.add(name)
        return f"<!-- table: {name} -->\n{tables[name].strip(chr(10))}\n<!-- /table -->"

    out = _BLOCK.sub(replace, text)
    unused = sorted(set(tables) - seen)
    if unused and every:
        raise KeyError(f"rendered tables without a README block: {unused}")
    return out


def stale_tables(text: str, tables: Mapping[str, str]) -> list[str]:
    """Names of the README blocks whose content differs from the rendered tables."""
    found = {m.group("name"): m.group("body").strip("\n") for m in _BLOCK.finditer(text)}
    return sorted(
        name
        for name in set(found) | set(tables)
        if name not in found or name not in tables or found[name] != tables[name].strip("\n")
    )


def stale_blocks(text: str, tables: Mapping[str, str]) -> list[str]:
    """Names of the blocks a page holds whose content differs from the rendered tables (or that
    no table renders): :func:`stale_tables` for a page that quotes only some of them."""
    found = {m.group("name"): m.group("body").strip("\n") for m in _BLOCK.finditer(text)}
    return sorted(
        name for name, body in found.items() if name not in tables or body != tables[name].strip()
    )


# --------------------------------------------------------------------------------------------
# numbers in prose

# what the prose check never reads: rendered blocks, definition blocks, fenced code, inline code,
# HTML comments, link and image targets
_NOT_PROSE = re.compile(
    r"^<!-- table: [\w.-]+ -->\n(?:(?!<!-- /?table).*\n)*<!-- /table -->$"
    r"|^<!-- definitions -->\n(?:(?!<!-- /?definitions).*\n)*<!-- /definitions -->$"
    r"|^(?P<fence>```|~~~).*\n(?:.*\n)*?(?P=fence)[ \t]*$"
    r"|<!--[\s\S]*?-->"
    r"|`[^`\n]+`"
    r"|\]\([^)\s]*\)",
    re.M,
)
# a number as prose writes it: signs, thousands commas, decimals, exponents, a range (3-5,
# 0.2-0.4), a magnitude (2.6M, 1.4B), a percent or "x" suffix; the word it sits in decides whether it is a name
_NUMBER = re.compile(
    r"(?<![\w.])[-−+]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-−+]?\d+)?"
    r"(?:\s?[-–]\s?[-−]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-−+]?\d+)?)?[kMB]?%?x?(?![\w])"
)
# a number that names something rather than measures it: what follows a section sign,
# "issue"/"#", a figure, table or equation, an arXiv id, the year of a citation
_NAMING = re.compile(
    r"(?:§\s?|\bissues?\s#?|#|\b(?:Figure|Fig\.|Table|Eq\.|Section|arXiv:?)\s?)$"
    r"|\bet al\.,?\s\(?$",
    re.I,
)


def unrendered_numbers(
    text: str, *, allowed: Iterable[str] = (), where: bool = False, smallest: float = 10
) -> list[str]:
    r"""Numbers a README states in prose, outside what ``table`` renders: each one could drift
    from the result files, so ``table --check`` fails while any is left.

    Read as prose is everything but rendered blocks (``<!-- table: NAME -->`` ... ``<!--
    /table -->``, whose content may be prose too), fenced code, inline code spans (commands,
    file names, option values such as ```--repeats 11```), HTML comments, link targets and
    ``<!-- definitions -->`` ... ``<!-- /definitions -->`` blocks: settings a reader needs in
    words (a protocol's window size, a schedule's steps) that are choices made before a run, not
    its results. Within the prose a number is not counted when it is part of a name (it follows
    a letter in the same word: ``SmolLM2-135M``, ``Qwen2.5-0.5B``, ``fp32``, ``Q4_1``), is a
    commit hash, follows a section sign, "issue", ``#``, "Figure", "Table" or "arXiv", is the
    year of a citation ("et al. 2019"), or is a lone whole number below ``smallest`` (a count
    of seeds or layers; "7-8", "0.5", "3%" and "3x" still count).

    Parameters
    ----------
    text : str
        The README's markdown.
    allowed : iterable of str
        Exact phrases whose numbers are definitions, not results (e.g. ``"k=54"`` in a sentence
        that defines the protocol; a line break may stand for a space); every occurrence of a
        phrase is skipped. Keep them short
        and specific: a phrase allows only its own words.
    where : bool
        Return ``"line N: NUMBER in '...context...'"`` instead of the bare numbers.
    smallest : float
        Lone whole numbers below this are counts, not results (0: count every number).

    Returns
    -------
    list of str
        The numbers in prose, in reading order (empty: every number is rendered or allowed).

    Examples
    --------
    >>> unrendered_numbers("SmolLM2-135M pruned 27 heads: 318x (issue 28, §2).")
    ['27', '318x']
    >>> unrendered_numbers("<!-- table: a -->\nIt costs 318x.\n<!-- /table -->\nSee `k=54`.\n")
    []
    >>> unrendered_numbers("windows of 512 tokens cost 1.5x", allowed=["512 tokens"])
    ['1.5x']
    """
    masked = list(text)

    def blank(start: int, end: int) -> None:
        for i in range(start, end):
            if masked[i] != "\n":
                masked[i] = " "

    for m in _NOT_PROSE.finditer(text):
        blank(m.start(), m.end())
    prose = "".join(masked)
    for phrase in allowed:
        for m in _phrase(phrase).finditer(prose) if phrase.strip() else ():
            blank(m.start(), m.end())
    prose = "".join(masked)
    out = []
    for m in _NUMBER.finditer(prose):
        token = m.group()
        before = prose[max(0, m.start() - 24) : m.start()]
        word_start = re.search(r"[\w.\-]*$", before)
        if word_start and re.search(r"[A-Za-z]", word_start.group()):
            continue  # inside a name: SmolLM2-135M, Gemma-3, fp32
        if _NAMING.search(before):
            continue
        after = prose[m.end() : m.end() + 12]
        if re.match(r"[0-9a-f]*[a-f][0-9a-f]*\b", after) and re.fullmatch(r"[0-9a-f]+", token):
            continue  # a commit hash such as 250d09a
        bare = token.lstrip("+")
        if re.fullmatch(r"\d+", bare) and int(bare) < smallest:
            continue
        if where:
            line = prose.count("\n", 0, m.start()) + 1
            context = text[max(0, m.start() - 30) : m.end() + 30].replace("\n", " ")
            out.append(f"line {line}: {token} in '...{context}...'")
        else:
            out.append(token)
    return out


def unused_phrases(text: str, allowed: Iterable[str]) -> list[str]:
    """The phrases of an allow-list (:func:`unrendered_numbers`' ``allowed``) that the README no
    longer contains: a stale list allows nothing, and says so."""
    return [p for p in allowed if not p.strip() or not _phrase(p).search(text)]


def _phrase(phrase: str) -> re.Pattern[str]:
    """An allowed phrase as a pattern: its words in order, any run of whitespace (a line break
    of wrapped prose) between them."""
    return re.compile(r"\s+".join(re.escape(w) for w in phrase.split()))


# --------------------------------------------------------------------------------------------
# golden results


@dataclass(frozen=True)
class Golden:
    """A result file of the quick mode and how closely a rerun must reproduce it.

    ``rtol``/``atol`` apply to every numeric cell (CSV) or number (JSON); other cells must be
    equal. ``ignore`` lists columns or top-level JSON keys that are not results (timings).
    ``derived`` names columns (CSV) or keys (of any JSON object that also holds the operands)
    that are differences of others, e.g. ``(("diff", ("off", "on")),)``: their tolerance is
    ``atol + rtol * sum(|operand|)`` (golden operands), since a difference of two close numbers
    loses the operands' relative precision (cancellation) while a real change still moves it
    by more than that. ``scaled`` names CSV columns with their own ``rtol`` against the golden
    column's largest magnitude, e.g. ``(("gradient", 1e-3),)``: values that are sums of terms of
    both signs (gradients), whose rounding error is set by the largest terms, so that a value
    near zero keeps few of its digits on another CPU while a real change still moves the
    column's large values. ``slack`` names CSV columns of counted events that rounding can tip
    one way or the other at a near-tie (an ordering verdict between two distances that agree to
    the last bits), with how many events each row may move by: ``(("flips", 5, ""),)`` for a
    count, ``(("flip_rate", 5, "n_triples"),)`` for a rate over the row's ``n_triples``; the
    slack is added to the tolerance, so a row of a few hundred events keeps a tolerance of a few
    events, not of 0.1% of them.
    """

    file: str
    rtol: float = 1e-4
    atol: float = 1e-6
    ignore: tuple[str, ...] = ()
    derived: tuple[tuple[str, tuple[str, ...]], ...] = ()
    scaled: tuple[tuple[str, float], ...] = ()
    slack: tuple[tuple[str, float, str], ...] = ()


def _close(
    a: Any, b: Any, rtol: float, atol: float, derived: Mapping[str, Sequence[str]] | None = None
) -> bool:
    derived = derived or {}
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= atol + rtol * abs(b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return False
        for k in a:
            ops = derived.get(k, ())
            if ops and all(isinstance(b.get(o), (int, float)) for o in ops):
                scale = sum(abs(b[o]) for o in ops)
                if not _close(a[k], b[k], 0.0, atol + rtol * scale):
                    return False
            elif not _close(a[k], b[k], rtol, atol, derived):
                return False
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            _close(x, y, rtol, atol, derived) for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)


def compare(got: Path, golden: Path, spec: Sequence[Golden]) -> list[str]:
    """Differences between a quick run's files in ``got`` and the golden files (empty: same)."""
    import numpy as np
    import pandas as pd

    problems: list[str] = []
    for g in spec:
        a, b = got / g.file, golden / g.file
        if not b.is_file():
            problems.append(f"{g.file}: no golden file (run `quick --update`)")
            continue
        if not a.is_file():
            problems.append(f"{g.file}: the run wrote no such file")
            continue
        if g.file.endswith(".csv"):
            x = pd.read_csv(a).drop(columns=list(g.ignore), errors="ignore")
            y = pd.read_csv(b).drop(columns=list(g.ignore), errors="ignore")
            if list(x.columns) != list(y.columns) or len(x) != len(y):
                problems.append(
                    f"{g.file}: shape or columns differ ({x.shape} {list(x.columns)} vs "
                    f"{y.shape} {list(y.columns)})"
                )
                continue
            derived, scaled = dict(g.derived), dict(g.scaled)
            slack = {col: (events, per) for col, events, per in g.slack}
            named = set(scaled) | set(slack) | {per for _, per in slack.values() if per}
            if unknown := sorted(named - set(y.columns)):
                problems.append(f"{g.file}: the spec names columns it does not have: {unknown}")
                continue
            for col in x.columns:
                rtol = scaled.get(col, g.rtol)
                if pd.api.types.is_numeric_dtype(y[col]) and pd.api.types.is_numeric_dtype(x[col]):
                    xv, yv = x[col].to_numpy(float), y[col].to_numpy(float)
                    ops = [o for o in derived.get(col, ()) if o in y.columns]
                    if ops:  # a difference: tolerance scaled to its operands
                        scale = sum(np.abs(y[o].to_numpy(float)) for o in ops)
                    elif col in scaled:  # a sum of signed terms: scaled to the column
                        scale = np.nanmax(np.abs(yv), initial=0.0)
                    else:
                        scale = np.abs(yv)
                    tol = g.atol + rtol * scale
                    events, per = slack.get(col, (0.0, ""))
                    # inf - inf: equal infinities pass; a row of no events: any rate passes
                    with np.errstate(invalid="ignore", divide="ignore"):
                        tol = tol + (events / y[per].to_numpy(float) if per else events)
                        ok = (xv == yv) | (np.abs(xv - yv) <= tol)
                    bad = ~(ok | (np.isnan(xv) & np.isnan(yv)))
                else:  # cells missing in both (an empty CSV cell) are equal
                    both_missing = (x[col].isna() & y[col].isna()).to_numpy()
                    bad = (x[col].astype(str) != y[col].astype(str)).to_numpy() & ~both_missing
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    problems.append(
                        f"{g.file}: column {col!r} differs in {int(bad.sum())} rows (row {i}: "
                        f"{x[col].iloc[i]!r} vs golden {y[col].iloc[i]!r}; rtol {rtol}"
                        f"{' of the column' if col in scaled else ''}"
                        f"{f', slack {slack[col][0]:g} events' if col in slack else ''})"
                    )
        else:
            xa = json.loads(a.read_text())
            ya = json.loads(b.read_text())
            for key in g.ignore:
                xa.pop(key, None)
                ya.pop(key, None)
            for key in sorted(set(xa) | set(ya)):
                if not _close(xa.get(key), ya.get(key), g.rtol, g.atol, dict(g.derived)):
                    problems.append(
                        f"{g.file}: {key!r} differs ({json.dumps(xa.get(key))[:80]} vs golden "
                        f"{json.dumps(ya.get(key))[:80]}; rtol {g.rtol})"
                    )
    return problems


# --------------------------------------------------------------------------------------------
# resumable runs: one time limit, one spelling


def _minutes(text: str) -> float:
    """A non-negative, finite number of minutes (argparse refuses anything else: exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not a non-negative number of minutes: {text!r}")
    return value


def _seconds_as_minutes(text: str) -> float:
    try:
        return _minutes(text) / 60
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not a non-negative number of seconds: {text!r}"
        ) from None


def add_time_limit(parser: argparse.ArgumentParser, *, seconds_alias: bool = False) -> None:
    """``--time-limit MINUTES`` on a resumable study's ``run``: no new cell starts once that
    much time has passed (the cell under way finishes); 0 computes nothing new and only
    rewrites the outputs from the cells already done. ``seconds_alias`` keeps an older
    spelling, ``--stop-after SECONDS``, working (hidden) for commands recorded in manifests.
    """
    parser.add_argument(
        "--time-limit",
        type=_minutes,
        metavar="MINUTES",
        help="start no new cell after this many minutes; 0 only rewrites the outputs from the "
        "cells already done (rerun the same command to continue)",
    )
    if seconds_alias:
        parser.add_argument(
            "--stop-after", dest="time_limit", type=_seconds_as_minutes, help=argparse.SUPPRESS
        )


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` of a resumable study's cells: the cells at positions
    ``index - 1``, ``index - 1 + count``, ... of its fixed plan. ``count`` processes run with
    ``--shard 1/N`` ... ``--shard N/N`` split one model's cells between N cores with no
    coordination and no cell done twice (each process skips cells already on disk too, so a
    shard can start after an unsharded run, or be continued by one)."""

    index: int
    count: int

    def owns(self, position: int) -> bool:
        """Whether the cell at ``position`` (0-based) of the plan is this shard's."""
        return position % self.count == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _shard(text: str) -> Shard:
    """``K/N`` with 1 <= K <= N (argparse refuses anything else: exit 2)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(
            f"not a shard K/N with 1 <= K <= N (e.g. 1/2 and 2/2 for two processes): {text!r}"
        )
    return Shard(int(match[1]), int(match[2]))


def add_shard(parser: argparse.ArgumentParser) -> None:
    """``--shard K/N`` on a resumable study's ``run`` (:class:`Shard`); without it a run
    computes every missing cell."""
    parser.add_argument(
        "--shard",
        type=_shard,
        metavar="K/N",
        help="compute only the K-th of every N cells of the plan; run N processes with 1/N ... "
        "N/N to use N cores (each skips cells already done; rerun without it to finish)",
    )


def time_is_up(started: float, time_limit_s: float | None) -> bool:
    """Whether ``time_limit_s`` seconds have passed since ``started`` (a
    ``time.perf_counter()``); never without a limit. The one check every resumable study makes
    before it starts a cell."""
    return time_limit_s is not None and time.perf_counter() - started >= time_limit_s


def seconds_left(args: argparse.Namespace, started: float) -> float | None:
    """Seconds of ``args.time_limit`` left since ``started`` (a ``time.perf_counter()``),
    never below 0; ``None`` without a limit."""
    if args.time_limit is None:
        return None
    return max(0.0, args.time_limit * 60 - (time.perf_counter() - started))


# --------------------------------------------------------------------------------------------
# the command line


@dataclass
class Study:
    """One case study: how to run it, render its README tables, and check its quick mode."""

    name: str
    description: str
    run: Callable[[Path, argparse.Namespace, Provenance], None]
    quick: Callable[[Path, Provenance], None]
    tables: Callable[[Path], dict[str, str]]
    golden: Sequence[Golden]
    assets: Sequence[str] = ()
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    #: phrases of the README whose numbers are definitions, not results (``unrendered_numbers``'
    #: ``allowed``); settings described at length go in ``<!-- definitions -->`` blocks instead
    definitions: Sequence[str] = ()
    #: docs pages (paths from the repository root) that show or quote this study: ``table``
    #: renders the blocks they hold from the same tables, and ``table --check`` fails on a stale
    #: block or a number in their prose, as for the README
    docs: Sequence[str] = ()

    @property
    def folder(self) -> Path:
        return ROOT / "case_studies" / self.name

    @property
    def results(self) -> Path:
        return self.folder / "results"

    @property
    def golden_dir(self) -> Path:
        return self.folder / "golden"

    @property
    def readme(self) -> Path:
        return self.folder / "README.md"

    def rendered_tables(self) -> dict[str, str]:
        """The study's README tables, and ``provenance`` (from the results' manifest)."""
        return {"provenance": provenance_table(self.results), **self.tables(self.results)}

    def readme_tables(self, tables: Mapping[str, str] | None = None) -> dict[str, str]:
        """The rendered tables the README holds: all but those named ``docs-*``, which only
        docs pages quote (:attr:`docs`)."""
        tables = self.rendered_tables() if tables is None else tables
        return {k: v for k, v in tables.items() if not k.startswith("docs-")}

    def prose_problems(self, text: str | None = None) -> list[str]:
        """The README's numbers in prose that nothing renders (:func:`unrendered_numbers`),
        and allowed phrases it no longer contains; empty when the prose is clean."""
        text = self.readme.read_text(encoding="utf-8") if text is None else text
        return [
            f"number in prose, not rendered from {self.results.name}/: {n}"
            for n in unrendered_numbers(text, allowed=self.definitions, where=True)
        ] + [
            f"allowed phrase no longer in the README: {p!r}"
            for p in unused_phrases(text, self.definitions)
        ]

    def doc_pages(self) -> list[Path]:
        """The docs pages of :attr:`docs`, as paths."""
        return [ROOT / page for page in self.docs]

    def docs_problems(self, tables: Mapping[str, str] | None = None) -> list[str]:
        """Stale blocks and numbers in prose of the docs pages that quote this study (empty when
        they are clean)."""
        tables = self.rendered_tables() if tables is None else tables
        out = []
        for page in self.doc_pages():
            text = page.read_text(encoding="utf-8")
            out += [
                f"{page}: table {name!r} differs from {self.results}"
                for name in stale_blocks(text, tables)
            ]
            out += [
                f"{page}: number in prose, not rendered from {self.results.name}/: {n}"
                for n in unrendered_numbers(text, where=True)
            ]
        return out

    def write_docs(self, tables: Mapping[str, str]) -> list[str]:
        """Render the blocks of the docs pages that quote this study; return the pages changed."""
        changed = []
        for page in self.doc_pages():
            text = page.read_text(encoding="utf-8")
            if stale_blocks(text, tables):
                write_text(page, render_readme(text, tables, every=False))
                changed.append(str(page.relative_to(ROOT)))
        return changed

    def write_readme(self) -> list[str]:
        """Render the README tables from the results; return the names that changed."""
        text = self.readme.read_text(encoding="utf-8")
        tables = self.readme_tables()
        changed = stale_tables(text, tables)
        write_text(self.readme, render_readme(text, tables))
        return changed


def _write_golden(study: Study, run: Path) -> None:
    """Replace ``golden/`` with the compared files of a quick run and its manifest."""
    import shutil

    import attncoda as ac

    with ac.atomic_output(
        study.golden_dir, overwrite=True, kind="folder", stamp=f"golden:{study.name}"
    ) as folder:
        for name in (*(g.file for g in study.golden), MANIFEST):
            shutil.copy2(run / name, folder / name)


def _command(study: Study, argv: Sequence[str]) -> str:
    return shlex.join(["python", "-m", f"case_studies.{study.name}", *argv])


def main(study: Study, argv: Sequence[str] | None = None) -> int:
    """``python -m case_studies.<name> run|table|quick``; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=f"python -m case_studies.{study.name}", description=study.description
    )
    sub = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    run_p = sub.add_parser("run", help="the full study: regenerate results/ and the README tables")
    run_p.add_argument(
        "--out", type=Path, default=study.results, help="results folder (default: %(default)s)"
    )
    if study.add_arguments is not None:
        study.add_arguments(run_p)
    table_p = sub.add_parser("table", help="render the README tables from results/")
    table_p.add_argument(
        "--check", action="store_true", help="only check; exit 1 if a table is stale"
    )
    quick_p = sub.add_parser("quick", help="a short run compared with the committed golden results")
    quick_p.add_argument("--out", type=Path, help="keep the quick results in this folder")
    quick_p.add_argument(
        "--update", action="store_true", help="write the golden results instead of comparing"
    )
    args = parser.parse_args(argv)
    command = _command(study, argv)
    if args.mode == "table":
        text = study.readme.read_text(encoding="utf-8")
        every = study.rendered_tables()
        tables = study.readme_tables(every)
        stale = stale_tables(text, tables)
        if args.check:
            for name in stale:
                print(
                    f"{study.readme}: table {name!r} differs from {study.results}", file=sys.stderr
                )
            prose = study.prose_problems(text)
            for line in prose:
                print(f"{study.readme}: {line}", file=sys.stderr)
            docs = study.docs_problems(every)
            for line in docs:
                print(line, file=sys.stderr)
            return 1 if stale or prose or docs else 0
        write_text(study.readme, render_readme(text, tables))
        pages = study.write_docs(every)
        print(
            f"{study.readme}: {len(tables)} tables rendered ({', '.join(stale) or 'none'} changed)"
            + (f"; docs pages rendered: {', '.join(pages)}" if pages else "")
        )
        return 0
    if args.mode == "run":
        prov = Provenance(study.name, "run", command)
        args.out.mkdir(parents=True, exist_ok=True)
        study.run(args.out, args, prov)
        prov.write(args.out)
        if args.out.resolve() == study.results.resolve():
            changed = study.write_readme()
            study.write_docs(study.rendered_tables())
            print(f"{study.readme}: tables rendered ({', '.join(changed) or 'none'} changed)")
        return 0
    # quick
    target = args.out or Path(tempfile.mkdtemp(prefix=f"{study.name}-quick-"))
    target.mkdir(parents=True, exist_ok=True)
    prov = Provenance(study.name, "quick", command)
    study.quick(target, prov)
    prov.write(target)
    if args.update:
        _write_golden(study, target)
        print(f"golden results written to {study.golden_dir}")
        return 0
    problems = compare(target, study.golden_dir, study.golden)
    for line in problems:
        print(f"{study.name} quick: {line}", file=sys.stderr)
    print(
        f"{study.name} quick: {'differs from' if problems else 'reproduces'} the golden results "
        f"({len(study.golden)} files; results in {target})"
    )
    return 1 if problems else 0
