"""The attention explorer: what the page holds, what it refuses, and how it behaves in a browser.

The Python tests read the page as text: its policy pins exactly its one script and one style,
every token is escaped, and the rows decoded from its data block (independently of the page's
script) equal ``exp(log_attn)`` to the stated precision. The browser tests load a saved page in
Debian's chromium (headless, over the DevTools protocol: see ``tests/browser.py``), click,
press keys and move the mouse as a user would, and read what the page then shows.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from browser import needs_chromium, open_page

import attncoda as ac
from attncoda._explore import LEVELS, json_block
from attncoda.cli import main

#: A content weight is stored to the nearest 1/LEVELS: shown within half of that.
TOL = 0.5 / LEVELS + 1e-6
HOSTILE = [
    "</script><img src=x onerror=alert(1)>",
    '"><svg onload=alert(2)>',
    "line\u2028sep\u2029para",
    "&amp; <!-- -->",
]


def _rows(length: int = 12, **kw: Any) -> xr.Dataset:
    return ac.testing.synthetic_rows(n_samples=2, n_layers=3, n_heads=4, length=length, **kw)


def _hostile(ds: xr.Dataset) -> xr.Dataset:
    tokens = ds["token"].values.copy().astype(object)
    for i, t in enumerate(HOSTILE):
        tokens[:, i + 1] = t
    return ds.assign_coords(token=(("sample", "position"), tokens.astype(str)))


def _data(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="acx-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def _decode(meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The data block's arrays, decoded here (as the page's script does, written again)."""
    raw = zlib.decompress(base64.b64decode(meta["blob"]))
    s, l_, h, q = (len(meta[k]) for k in ("samples", "layers", "heads", "queries"))
    n_rows, n_codes = s * l_ * h * q, meta["n_codes"]
    out: dict[str, np.ndarray] = {}
    at = 0
    for name, dt in (("lam", "<f4"), ("H", "<f4"), ("Hc", "<f4"), ("lo", "<u2"), ("hi", "<u2")):
        size = np.dtype(dt).itemsize * n_rows
        out[name] = np.frombuffer(raw[at : at + size], dt).reshape(s, l_, h, q)
        at += size
    hi8 = np.frombuffer(raw[at : at + n_codes], np.uint8).astype(np.int64)
    lo8 = np.frombuffer(raw[at + n_codes : at + 2 * n_codes], np.uint8)
    assert at + 2 * n_codes == len(raw)
    out["codes"] = (hi8 << 8) | lo8
    return out


def _weights(ds: xr.Dataset) -> np.ndarray:
    z = ds["log_attn"].values.astype(np.float64)
    return np.where(np.isfinite(z), np.exp(np.where(np.isfinite(z), z, 0.0)), 0.0)


def _decoded_rows(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p, s and c/(1 - s) of every cell (NaN where invisible), from the data block alone."""
    d = _decode(meta)
    lam = d["lam"].astype(np.float64)
    n_k = len(meta["keys"])
    with np.errstate(over="ignore"):
        s = np.where(np.isnan(lam), np.nan, 1 / (1 + np.exp(-lam)))
        rest = np.where(np.isnan(lam), np.nan, 1 / (1 + np.exp(lam)))
    c = np.full((*lam.shape, n_k), np.nan)
    keys = np.arange(n_k)
    span = (keys >= d["lo"][..., None]) & (keys < d["hi"][..., None])
    codes = np.zeros(span.shape, np.int64)
    codes[span] = d["codes"]
    c = np.where(codes > 0, (codes - 1) / meta["levels"], np.nan)
    p = rest[..., None] * c
    for i, k in enumerate(meta["sink"]):
        p[i, ..., k] = np.where(np.isfinite(lam[i]) | (lam[i] == np.inf), s[i], np.nan)
    return p, s, c


# --------------------------------------------------------------------------------------------
# the page as text


def test_json_block_escapes_what_could_end_the_script() -> None:
    text = json_block({"t": HOSTILE})
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in text
    assert json.loads(text) == {"t": HOSTILE}


def test_policy_pins_the_one_script_and_the_one_style() -> None:
    page = ac.explore(_hostile(_rows())).html
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert policy is not None
    csp = html.unescape(policy.group(1))
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 1 and len(styles) == 1
    assert page.count("<script") == 2  # the script, and the data block that is not run

    def sha(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    assert f"script-src 'sha256-{sha(scripts[0])}'" in csp
    assert f"style-src 'sha256-{sha(styles[0])}'" in csp
    # nothing the policy would block: no style attributes, no event handlers, no sources
    assert not re.search(r"<[^>]+\sstyle=", page)
    assert not re.search(r"<[^>]+\son[a-z]+=", page.split('id="acx-data"')[0])
    assert "://" not in page.replace("http://www.w3.org", "")


def test_tokens_and_names_are_escaped() -> None:
    page = ac.explore(_hostile(_rows()), title="<b>title</b>").html
    for t in HOSTILE:
        assert t not in page
    assert "<img" not in page and "<svg" not in page and "<b>" not in page
    assert "&lt;b&gt;title&lt;/b&gt;" in page
    meta = _data(page)
    assert meta["tokens"][0][1 : 1 + len(HOSTILE)] == HOSTILE
    assert meta["title"] == "<b>title</b>"


def test_rows_decode_to_exp_log_attn_within_the_stated_precision() -> None:
    ds = _rows(16)
    la = ds["log_attn"].values.copy()
    la[1, ..., :3] = -np.inf  # sample 1 left-padded by three tokens: its sink is key 3
    la[1, :, :, :3, :] = -np.inf
    z = np.where(np.isfinite(la[1, ..., 3:]), la[1, ..., 3:], -np.inf)
    lse = np.logaddexp.reduce(z, axis=-1, keepdims=True)
    la[1, ..., 3:] = np.where(np.isfinite(z), z - np.where(np.isfinite(lse), lse, 0.0), -np.inf)
    ds["log_attn"] = (ds["log_attn"].dims, la)
    ds = ds.assign_coords(sink_index=("sample", np.array([0, 3])))
    meta = _data(ac.explore(ds.drop_vars(list(ac.SUMMARY_VARIABLES))).html)
    p, s, c = _decoded_rows(meta)
    want = _weights(ds)
    vis = np.isfinite(la)
    assert (np.isfinite(p) == vis).all()  # a cell is drawn where, and only where, it is visible
    assert np.abs(p[vis] - want[vis]).max() <= TOL
    for i, k in enumerate((0, 3)):
        share = want[i, ..., k]
        rows = vis[i].any(-1)
        np.testing.assert_allclose(s[i][rows], share[rows], atol=1e-6)
        content = want[i] * vis[i]
        content[..., k] = 0
        mass = content.sum(-1, keepdims=True)
        ok = vis[i] & (mass > 0)
        ok[..., k] = False
        cw = np.divide(content, mass, out=np.zeros_like(content), where=mass > 0)
        assert np.abs(c[i][ok] - cw[ok]).max() <= TOL
    # the first query of a causal model sees only its sink: all mass on it
    assert np.isinf(_decode(meta)["lam"][0, :, :, 0]).all()


def test_a_custom_sink_is_the_column_apart() -> None:
    ds = _rows(10)
    meta = _data(ac.explore(ds, sink=1).html)
    assert meta["sink"] == [1, 1]
    assert meta["source"] == "computed from the rows with attncoda.decompose"
    p, s, _ = _decoded_rows(meta)
    want, vis = _weights(ds), np.isfinite(ds["log_attn"].values)
    assert np.abs(p[vis] - want[vis]).max() <= TOL
    np.testing.assert_allclose(s[..., 2:], want[..., 2:, 1], atol=1e-6)  # queries seeing key 1


def test_summaries_come_from_the_variables_else_from_decompose() -> None:
    ds = _rows(10)
    with_vars = _data(ac.explore(ds).html)
    computed = _data(ac.explore(ds.drop_vars(list(ac.SUMMARY_VARIABLES))).html)
    assert with_vars["source"] == "the capture's summaries variables"
    assert computed["source"] == "computed from the rows with attncoda.decompose"
    a, b = np.asarray(with_vars["summaries"]), np.asarray(computed["summaries"])
    np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-4, atol=1e-5)
    # means over a head's rows of one sample: s, H, H_b(s), (1 - s) H(c), H(c), rows
    d = ac.decompose(ds["log_attn"].values.astype(np.float64), from_logits=True, degenerate="nan")
    share = d.sink_share[1, 2, 3, 1:]  # the first query has no content: left out
    s_, h_, hb, part, hc, n = b[1, 2, 3]
    assert n == 9
    assert s_ == pytest.approx(share.mean(), rel=1e-5)
    assert h_ == pytest.approx(d.entropy[1, 2, 3, 1:].mean(), rel=1e-5)
    assert hc == pytest.approx(d.content_entropy[1, 2, 3, 1:].mean(), rel=1e-5)
    assert hb == pytest.approx(float(np.mean(ac.binary_entropy(share))), rel=1e-5)
    assert hb + part == pytest.approx(h_, rel=1e-5)  # H = H_b(s) + (1 - s) H(c), exactly


def test_choices_and_refusals() -> None:
    ds = _rows(8)
    meta = _data(ac.explore(ds, sample=[1], layer=0, head=2).html)
    assert meta["samples"] == [1] and meta["start"] == {"layer": 0, "head": 2}
    assert len(meta["tokens"]) == 1
    assert ac.explore(ds, sample=0).shape == {"layer": 3, "head": 4, "sample": 1, "query": 8}
    with pytest.raises(ac.InputError, match=r"layer=7 was not captured; .* layers \[0, 1, 2\]"):
        ac.explore(ds, layer=7)
    with pytest.raises(ac.InputError, match="head=4 was not captured"):
        ac.explore(ds, head=4)
    with pytest.raises(ac.InputError, match="sample must be from 0 to 1"):
        ac.explore(ds, sample=2)
    with pytest.raises(ac.InputError, match="names a sample twice"):
        ac.explore(ds, sample=[0, 0])
    with pytest.raises(ac.InputError, match="selects no sample"):
        ac.explore(ds, sample=[])
    with pytest.raises(ac.InputError, match="sample must be a whole number"):
        ac.explore(ds, sample=0.5)
    with pytest.raises(ac.InputError, match="title must be a string"):
        ac.explore(ds, title=3)  # type: ignore[arg-type]
    with pytest.raises(ac.RowsRequiredError):
        ac.explore(ds.drop_vars("log_attn"))


def test_save_notebook_and_accessor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _rows(6)
    ex = ds.coda.explore(layer=1)
    assert _data(ex.html)["start"]["layer"] == 1
    page = ex.save(tmp_path / "explorer.html")
    written = page.read_text(encoding="utf-8")
    assert written.startswith(ex.html) and "attncoda-sha256:" in written.splitlines()[-1]
    with pytest.raises(ac.OutputExistsError, match="exists; pass overwrite=True"):
        ex.save(page)
    ac.explore(ds, layer=0).save(page, overwrite=True)
    assert _data(page.read_text(encoding="utf-8"))["start"]["layer"] == 0
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my own notes</p>")
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        ex.save(mine, overwrite=True)
    assert mine.read_text() == "<p>my own notes</p>"
    # a user's page that holds a whole explorer (signature included) plus notes is theirs
    mine.write_text("<p>my own notes</p>\n" + page.read_text(encoding="utf-8"))
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        ex.save(mine, overwrite=True)
    assert mine.read_text().startswith("<p>my own notes</p>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explorer.html", "mine.html"]
    frame = ex.embed()._repr_html_()
    assert frame.startswith("<iframe ") and 'sandbox="allow-scripts"' in frame
    assert "allow-same-origin" not in frame and frame.count("<") == 2  # the page is escaped
    assert html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1)) == ex.html  # type: ignore[union-attr]
    # shown in a notebook: written once beside it, named by its content, and referenced
    monkeypatch.chdir(tmp_path)
    frame = ex._repr_html_()
    src = re.search(r'src="([^"]*)"', frame).group(1)  # type: ignore[union-attr]
    assert src.startswith("attncoda-explorer/") and frame == ex._repr_html_()
    # lazy: JupyterLab rewrites the relative src to its /files/ URL before the frame loads
    assert 'loading="lazy"' in frame
    assert (tmp_path / src).read_text(encoding="utf-8").startswith(ex.html)
    assert len(list((tmp_path / "attncoda-explorer").iterdir())) == 1
    # a name taken by a file attncoda did not write: left alone, the page goes inline
    (tmp_path / src).write_text("<p>mine</p>")
    assert "srcdoc=" in ex._repr_html_() and (tmp_path / src).read_text() == "<p>mine</p>"


def test_cli_end_to_end_on_a_twin_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i}. " + "a few words of text " * 12 for i in range(4)))
    cap = tmp_path / "rows.nc"
    argv = ["capture", "twin:llama", str(text), "--what", "rows", "--passages", "2"]
    assert main([*argv, "--max-tokens", "20", "--out", str(cap), "-q"]) == 0
    assert main(["explore", str(cap)]) == 0
    page = tmp_path / "rows-explorer.html"
    assert f"explorer: {page}" in capsys.readouterr().out
    meta = _data(page.read_text(encoding="utf-8"))
    ds = ac.load(cap)
    assert len(meta["samples"]) == 2 and len(meta["layers"]) == ds.sizes["layer"]
    p, _, _ = _decoded_rows(meta)
    want, vis = _weights(ds), np.isfinite(ds["log_attn"].values)
    assert np.abs(p[vis] - want[vis]).max() <= TOL
    # refusals: one line each, exit 2, nothing written
    out = tmp_path / "one.html"
    for args, message in (
        ([str(cap)], "exists; pass"),
        ([str(cap), "--out", str(out), "--sample", "7"], "--sample 7 is out of range"),
        ([str(cap), "--out", str(out), "--sample", "5:9"], "selects none of the 2 samples"),
        ([str(cap), "--out", str(out), "--layer", "99"], "layer=99 was not captured"),
        ([str(cap), "--out", str(tmp_path / "x.txt")], "must name an .html file"),
        ([str(tmp_path / "missing.nc")], "no such dataset"),
        ([str(cap), "--sample", "x"], "is not 'all'"),
    ):
        assert main(["explore", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not out.exists()
    summaries = tmp_path / "summ.nc"
    ac.save(ds.coda.decompose(), summaries)
    assert main(["explore", str(summaries)]) == 2
    assert "has no rows (log_attn)" in capsys.readouterr().err
    assert main(["explore", str(cap), "--force", "--sample", "1", "--head", "0"]) == 0
    assert _data(page.read_text(encoding="utf-8"))["samples"] == [1]


@pytest.mark.slow  # several seconds (a process, a real mount or a whole pipeline)
def test_demo_writes_the_explorer_and_its_report_links_to_it(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(
        "\n\n".join(f"Paragraph {i}. " + "some words of a text " * 12 for i in range(4))
    )
    out = tmp_path / "demo"
    argv = ["demo", "--model", "twin:llama", "--text", str(text), "--quick", "--passages", "2"]
    assert main([*argv, "--n-boot", "0", "--out", str(out), "-q"]) == 0
    meta = _data((out / "explorer.html").read_text(encoding="utf-8"))
    summary = ac.load_analysis(out).summary
    assert any(line.startswith("explorer: ") and "explorer.html" in line for line in summary)
    rows = ac.load(out / "rows.nc")
    assert meta["layers"] == [int(v) for v in rows["layer"].values]
    report = (out / "report.html").read_text(encoding="utf-8")
    assert '<a href="explorer.html">Open the attention explorer</a>' in report
    # each head of the sink-share grid links to the same head in the explorer
    linked = re.findall(r'<a href="explorer.html#layer=(\d+)&amp;head=(\d+)">', report)
    shape = rows.sizes["layer"], rows.sizes["head"]
    assert len(linked) >= shape[0] * shape[1], (len(linked), shape)
    assert ("0", "0") in linked and "click a head to open it in the explorer" in report
    assert "explorer.html" in ac.load_analysis(out).files


# --------------------------------------------------------------------------------------------
# in a real browser


def _ready(tab: Any) -> None:
    for _ in range(300):
        if tab.evaluate("document.documentElement.dataset.ready"):
            break
        time.sleep(0.05)
    assert tab.evaluate("document.documentElement.dataset.ready") == "1"


def _click(tab: Any, x: float, y: float) -> None:
    for kind in ("mousePressed", "mouseReleased"):
        tab.call(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
        )


_CODES = {
    "ArrowUp": 38,
    "ArrowDown": 40,
    "ArrowLeft": 37,
    "ArrowRight": 39,
    "Home": 36,
    "End": 35,
    "Escape": 27,
}


def _press(tab: Any, key: str) -> None:
    params: dict[str, Any] = {"key": key, "code": key}
    if key in _CODES:
        params["windowsVirtualKeyCode"] = _CODES[key]
        tab.call("Input.dispatchKeyEvent", {"type": "rawKeyDown", **params})
    else:
        tab.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": key, **params})
    tab.call("Input.dispatchKeyEvent", {"type": "keyUp", **params})


def _centre(tab: Any, selector: str) -> list[float]:
    return tab.evaluate(  # type: ignore[no-any-return]
        f"(() => {{ const b = document.querySelector({json.dumps(selector)})"
        ".getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; })()"
    )


def _state(tab: Any) -> dict[str, str]:
    return tab.evaluate("Object.assign({}, document.body.dataset)")  # type: ignore[no-any-return]


def _cell_point(tab: Any, query: int, key: int, panel: str = "#acx-pa") -> list[float]:
    """Where the page draws the cell (query position, key position) of a panel's view."""
    geo = tab.evaluate(f"window.acxGeometry({1 if panel == '#acx-pb' else 0})")
    row = geo["rows"].index(query)
    col = next(c for c in geo["cols"] if c["k"] == key)
    x, y = col["x"] + geo["cs"] / 2, geo["top"] + row * geo["cs"] + geo["cs"] / 2
    # scroll the page so that the cell is in the viewport (a mouse can only point there)
    # (the main column scrolls in a wide window, the page in a narrow one)
    expr = (
        f"(() => {{ const o = document.querySelector('{panel} .acx-over'),"
        " m = document.getElementById('acx-main');"
        f" m.scrollTop += o.getBoundingClientRect().y + {y} - 300;"
        f" window.scrollTo(0, o.getBoundingClientRect().y + window.scrollY + {y} - 300);"
        " const c = o.getBoundingClientRect(); return [c.x, c.y]; })()"
    )
    x0, y0 = tab.evaluate(expr)
    return [x0 + x, y0 + y]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, xr.Dataset]:
    ds = _hostile(_rows(14))
    page = tmp_path_factory.mktemp("explore") / "explorer.html"
    ac.explore(ds, layer=2, head=0).save(page)
    return page, ds


@needs_chromium
def test_thumbnails_keys_and_switches_in_chromium(
    saved: tuple[Path, xr.Dataset], tmp_path: Path
) -> None:
    page, _ = saved
    with open_page(page, tmp_path / "profile", 1300, 1000) as tab:
        _ready(tab)
        assert _state(tab) == {"layer": "2", "head": "0", "conv": "split", "sample": "0"}
        # a thumbnail click opens that head large
        _click(tab, *_centre(tab, 'canvas[data-layer="1"][data-head="3"]'))
        assert (_state(tab)["layer"], _state(tab)["head"]) == ("1", "3")
        assert tab.evaluate("document.querySelector('#acx-pa .acx-layer').value") == "1"
        # the keyboard: layer, head, sample, conventions
        for key, want in (
            ("ArrowDown", ("2", "3")),
            ("ArrowLeft", ("2", "2")),
            ("ArrowUp", ("1", "2")),
            ("ArrowRight", ("1", "3")),
        ):
            _press(tab, key)
            assert (_state(tab)["layer"], _state(tab)["head"]) == want, key
        _press(tab, "n")
        assert _state(tab)["sample"] == "1"
        _press(tab, "p")
        assert _state(tab)["sample"] == "0"
        for key, conv in (("k", "kept"), ("d", "dropped"), ("s", "split")):
            _press(tab, key)
            assert _state(tab)["conv"] == conv
        # the mouse: the convention's radio buttons
        _click(tab, *_centre(tab, 'input[name="acx-conv"][value="dropped"]'))
        assert _state(tab)["conv"] == "dropped"
        # compare: a second view, its own head from a thumbnail click
        _press(tab, "c")
        assert tab.evaluate("document.getElementById('acx-pb').hidden") is False
        _click(tab, *_centre(tab, "#acx-pb .acx-view"))
        _click(tab, *_centre(tab, 'canvas[data-layer="0"][data-head="1"]'))
        right = tab.evaluate("Object.assign({}, document.getElementById('acx-pb').dataset)")
        assert (right["layer"], right["head"]) == ("0", "1")
        assert (_state(tab)["layer"], _state(tab)["head"]) == ("1", "3")  # the left one stays
        assert tab.requests() == [page.resolve().as_uri()]  # nothing loaded from anywhere
        assert tab.evaluate("window.acxViolations.length") == 0


@needs_chromium
def test_hover_highlights_row_and_column_and_tells_the_weights(
    saved: tuple[Path, xr.Dataset], tmp_path: Path
) -> None:
    page, ds = saved
    p = _weights(ds)[0, 2, 0]  # sample 0, layer 2, head 0
    with open_page(page, tmp_path / "profile", 1300, 1000) as tab:
        _ready(tab)
        tab.call("Log.enable")
        assert tab.evaluate("document.getElementById('acx-tip').hidden") is True
        for conv, query, key in (("split", 9, 2), ("kept", 11, 0), ("dropped", 13, 5)):
            _press(tab, conv[0])
            tab.hover(*_cell_point(tab, query, key))
            pane = tab.evaluate("Object.assign({}, document.getElementById('acx-pa').dataset)")
            assert (pane["hoverQuery"], pane["hoverKey"]) == (str(query), str(key))
            tip = tab.evaluate("document.getElementById('acx-tip').innerText")
            assert tab.evaluate("document.getElementById('acx-tip').hidden") is False
            # the highlight: the overlay is tinted along the row and the column, clear elsewhere
            tint = tab.evaluate(
                "(() => { const g = window.acxGeometry(0), o = document.querySelector("
                "'#acx-pa .acx-over').getContext('2d'); const px = (x, y) => o.getImageData("
                f"x, y, 1, 1).data[3]; const r = g.rows.indexOf({query}), c = g.cols.find("
                f"c => c.k === {key}), y = g.top + r * g.cs + 1, x = c.x + 1;"
                " return [px(g.width - 3, y), px(x, g.height - 3), px(g.width - 3, g.height - 3)];"
                " })()"
            )
            assert tint[0] > 0 and tint[1] > 0 and tint[2] == 0, tint
            words = ds["token"].values[0]
            assert f"query {query} {json.dumps(str(words[query]))}" in tip
            assert f"key {key} {json.dumps(str(words[key]))}" in tip
            shown = {m[0]: float(m[1]) for m in re.findall(r"(p|s|c/\(1 − s\)) = ([0-9.]+)", tip)}
            s = p[query, 0]
            assert abs(shown["p"] - p[query, key]) <= TOL + 5e-5, (conv, tip)
            assert abs(shown["s"] - s) <= 5e-5 + 1e-6
            if key != 0:
                assert abs(shown["c/(1 − s)"] - p[query, key] / (1 - s)) <= TOL + 5e-5
            else:
                assert "(the sink)" in tip
        # a hostile token string is text in the tooltip, never markup
        tab.hover(*_cell_point(tab, 6, 1))
        tip = tab.evaluate("document.getElementById('acx-tip').textContent")
        assert json.dumps(HOSTILE[0]) in tip
        assert tab.evaluate("document.querySelectorAll('img, svg, iframe, object').length") == 0
        labels = tab.evaluate(
            "Array.from(document.querySelectorAll('#acx-sample option')).map(o => o.textContent)"
        )
        assert "</script>" in labels[0]  # the sample's first tokens, as text
        tab.hover(5, 5)
        assert tab.evaluate("document.getElementById('acx-tip').hidden") is True
        assert tab.requests() == [page.resolve().as_uri()]
        assert tab.evaluate("window.acxViolations.length") == 0
        logged = [
            ev["params"]["entry"]["text"]
            for ev in tab.dt.events
            if ev.get("method") == "Log.entryAdded"
        ]
        assert not [t for t in logged if "Content Security Policy" in t], logged


@needs_chromium
@pytest.mark.parametrize("how", ["beside", "embedded"])
def test_inline_in_a_sandboxed_iframe_as_a_notebook_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """``_repr_html_`` in a host page (what Jupyter does with it): the page, written beside the
    notebook (or embedded), runs inside its sandboxed iframe, draws every head and reports no
    policy violation."""
    ds = _hostile(_rows(10))
    host = tmp_path / "notebook.html"
    monkeypatch.chdir(tmp_path)  # the kernel's working directory: the notebook's folder
    ex = ac.explore(ds)
    output = ex._repr_html_() if how == "beside" else ex.embed()._repr_html_()
    assert len(output) < 1000 if how == "beside" else len(output) > len(ex.html)
    body = "<p>a notebook cell's output:</p>" + output
    host.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    with open_page(host, tmp_path / "profile") as tab:
        # the sandboxed srcdoc frame has an opaque origin: chromium runs it as a target of its own
        frame = None
        for _ in range(200):
            targets = tab.dt.call("Target.getTargets")["targetInfos"]
            frame = next((t for t in targets if t["type"] == "iframe"), None)
            if frame is not None:
                break
            time.sleep(0.05)
        assert frame is not None
        assert (
            frame["url"] == "about:srcdoc"
            if how == "embedded"
            else frame["url"].endswith(f"attncoda-explorer/{ex.notebook_file().name}")
        )
        session = tab.dt.call(
            "Target.attachToTarget", {"targetId": frame["targetId"], "flatten": True}
        )
        inner = (
            "[document.documentElement.dataset.ready, window.acxViolations.length,"
            " document.querySelectorAll('#acx-grid canvas').length,"
            " document.querySelectorAll('img, svg').length,"
            # the page fits its frame: the notebook is the only other scroll level
            " document.scrollingElement.scrollHeight <= window.innerHeight]"
        )
        state: list[Any] = []
        for _ in range(200):
            reply = tab.dt.call(
                "Runtime.evaluate",
                {"expression": inner, "returnByValue": True},
                session=session["sessionId"],
            )
            state = reply["result"]["value"]
            if state[0]:
                break
            time.sleep(0.05)
        assert state == ["1", 0, 12, 0, True]
        pages = [host] + ([ex.notebook_file()] if how == "beside" else [])
        assert tab.requests() == [p.resolve().as_uri() for p in pages]


@pytest.mark.real
@pytest.mark.filterwarnings("ignore::UserWarning")  # the sink is 'The': no BOS in the passage
@needs_chromium
def test_smollm2_30x9x256_opens_small_and_right(tmp_path: Path) -> None:
    from conftest import need

    need("smollm2-135m", "austen")
    from attncoda.hooks.demo import passage_rows  # bench_explore's case, measured there

    ds = passage_rows()
    assert dict(ds.sizes)["layer"] == 30 and ds.sizes["head"] == 9 and ds.sizes["key"] == 256
    page = ac.explore(ds).save(tmp_path / "smollm2.html")
    assert page.stat().st_size < 10e6
    meta = _data(page.read_text(encoding="utf-8"))
    p, _, _ = _decoded_rows(meta)
    want, vis = _weights(ds), np.isfinite(ds["log_attn"].values)
    assert np.abs(p[vis] - want[vis]).max() <= TOL
    with open_page(page, tmp_path / "profile", 1300, 1000) as tab:
        _ready(tab)
        assert tab.evaluate("document.querySelectorAll('#acx-grid canvas').length") == 270
        tab.hover(*_cell_point(tab, 40, 17))
        tip = tab.evaluate("document.getElementById('acx-tip').innerText")
        shown = float(re.search(r"p = ([0-9.]+)", tip).group(1))  # type: ignore[union-attr]
        assert abs(shown - want[0, 29, 0, 40, 17]) <= TOL + 5e-5
        assert tab.requests() == [page.resolve().as_uri()]


def _padded(length: int = 40, n_layers: int = 3, n_heads: int = 4) -> xr.Dataset:
    """Rows with padding: sample 0 right-padded (real tokens 0-19), sample 1 left-padded (real
    tokens 10-39, its sink at 10). Padding keys are seen by no query, padded queries see none."""
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=n_layers, n_heads=n_heads, length=length)
    z = ds["log_attn"].values.astype(np.float64)
    real = np.zeros((2, length), bool)
    real[0, :20] = True
    real[1, 10:] = True
    for s in range(2):
        keep = real[s][None, None, :, None] & real[s][None, None, None, :]
        zs = np.where(keep, z[s], -np.inf)
        top = np.where(np.isfinite(zs).any(-1, keepdims=True), zs.max(-1, keepdims=True), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            lse = np.log(np.exp(zs - top).sum(-1, keepdims=True)) + top
            z[s] = np.where(np.isfinite(zs), zs - lse, -np.inf)
    out = ds.drop_vars([v for v in ds.data_vars if v != "log_attn"])  # tokens kept
    out["log_attn"] = (ds["log_attn"].dims, z.astype(np.float32))
    return out.assign_coords(sink_index=("sample", np.array([0, 10])))


def test_padding_is_left_out_of_the_data_block() -> None:
    meta = _data(ac.explore(_padded()).html)
    assert meta["real"] == [[0, 20], [10, 40]]
    assert meta["real_queries"] == [[0, 20], [10, 40]]
    assert meta["sink"] == [0, 10]


def _set_window(tab: Any, n: int) -> None:
    tab.evaluate(
        f"(() => {{ const w = document.getElementById('acx-win'); w.value = '{n}';"
        " w.dispatchEvent(new Event('change')); })()"
    )


@needs_chromium
def test_padding_is_never_shown_as_keys(tmp_path: Path) -> None:
    """Right padding (sample 0) and left padding (sample 1): the window, its keys and queries,
    End / Home / ] / [ and the thumbnails' scale stop at the sample's real tokens."""
    page = tmp_path / "padded.html"
    ac.explore(_padded()).save(page)
    with open_page(page, tmp_path / "profile", 1400, 1000) as tab:
        _ready(tab)
        for sample, (a, b) in ((0, (0, 20)), (1, (10, 40))):
            if sample:
                _press(tab, "n")
            assert _state(tab)["sample"] == str(sample)
            options = tab.evaluate(
                "Array.from(document.querySelectorAll('#acx-win option')).map(o => o.textContent)"
            )
            assert options[-1] == f"all {b - a} tokens", options
            geo = tab.evaluate("window.acxGeometry(0)")  # the default window: every real token
            assert sorted(c["k"] for c in geo["cols"]) == list(range(a, b))
            assert geo["rows"] == list(range(a, b))
            _set_window(tab, 16)
            for key in ("End", "]", "]", "Home", "[", "End"):
                _press(tab, key)
                geo = tab.evaluate("window.acxGeometry(0)")
                keys = [c["k"] for c in geo["cols"]]  # split: the sink apart, then the window
                assert len(set(keys) - {a}) in (15, 16) and len(keys) in (16, 17), (key, keys)
                assert min(keys) >= a and max(keys) < b, (key, keys)
                assert all(a <= q < b for q in geo["rows"]), (key, geo["rows"])
            assert max(keys) == b - 1  # End: the last real token
            _press(tab, "Home")
            assert min(c["k"] for c in tab.evaluate("window.acxGeometry(0)")["cols"]) == a
            # the thumbnails: one pixel column per real token (20 or 30, not 40)
            size = tab.evaluate(
                "(() => { const c = document.querySelector('#acx-grid canvas');"
                " return [c.width, c.height]; })()"
            )
            assert size == [b - a, b - a]
            assert "padding left out" in tab.evaluate(
                "document.getElementById('acx-startv').textContent"
            )
            _set_window(tab, b - a)
        assert tab.evaluate("window.acxViolations.length") == 0


@needs_chromium
def test_at_30_layers_the_selected_head_and_its_view_stay_in_sight(tmp_path: Path) -> None:
    """30 x 9 heads in a 1400 x 1000 window: the grid beside the large view, the page itself
    does not scroll, the selected thumbnail is scrolled into the grid's sight; in compare mode
    both views keep their token labels and the tooltip covers no summary table."""
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=30, n_heads=9, length=40)
    page = tmp_path / "wide.html"
    ac.explore(ds, layer=0, head=0).save(page)
    rect = (
        "(s => { const b = document.querySelector(s).getBoundingClientRect();"
        " return [b.left, b.top, b.right, b.bottom]; })"
    )
    with open_page(page, tmp_path / "profile", 1400, 1000) as tab:
        _ready(tab)
        assert tab.evaluate("document.scrollingElement.scrollHeight") <= 1000
        for layer in (0, 29, 14):
            while int(_state(tab)["layer"]) != layer:
                _press(tab, "ArrowDown" if int(_state(tab)["layer"]) < layer else "ArrowUp")
            _press(tab, "ArrowRight")
            sel = f'canvas[data-layer="{layer}"][data-head="1"]'
            _, top, _, bottom = tab.evaluate(f"{rect}({json.dumps(sel)})")
            box = tab.evaluate(f"{rect}('#acx-overview')")
            assert box[1] <= top and bottom <= box[3] and bottom <= 1000, (layer, top, box)
            view = tab.evaluate(f"{rect}('#acx-pa .acx-cells')")
            assert view[1] < 500 and view[0] >= box[2], view  # beside the grid, near the top
        assert tab.evaluate("window.acxGeometry(0).cs") >= 9  # token labels, not positions
        _press(tab, "c")
        for i, panel in ((0, "#acx-pa"), (1, "#acx-pb")):
            geo = tab.evaluate(f"window.acxGeometry({i})")
            assert geo["cs"] >= 9, geo["cs"]
            for query, key in ((5, 3), (20, 1), (39, 38)):
                tab.hover(*_cell_point(tab, query, key, panel))
                tip = tab.evaluate(f"{rect}('#acx-tip')")
                for t in ("#acx-pa table.acx-summ", "#acx-pb table.acx-summ"):
                    b = tab.evaluate(f"{rect}({json.dumps(t)})")
                    clear = tip[2] <= b[0] or tip[0] >= b[2] or tip[3] <= b[1] or tip[1] >= b[3]
                    assert clear, (panel, query, key, tip, t, b)
        assert tab.evaluate("window.acxViolations.length") == 0


def _cross_capture() -> xr.Dataset:
    """Cross attention of a tiny BART: 5 target tokens query 9 source tokens (left padding in
    sample 1), labelled so that a query's token can never be mistaken for a key's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attncoda.hooks import capture

    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration(config).eval()
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    gen = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(4, 90, (2, 9), generator=gen),
        "attention_mask": mask,
        "decoder_input_ids": torch.randint(4, 90, (2, 5), generator=gen),
    }
    with torch.no_grad(), capture(model, layers={"cross": None}, what="rows") as cap:
        model(**batch)
    ds = cap.dataset
    src = np.array([[f"src{k}" for k in range(9)]] * 2)
    tgt = np.array([[f"tgt{q}<b>" for q in range(5)]] * 2)
    return ds.assign_coords(
        token=(("sample", "position"), src), query_token=(("sample", "query"), tgt)
    )


def test_cross_attention_labels_queries_with_the_target_tokens(tmp_path: Path) -> None:
    ds = _cross_capture()
    assert ds.attrs["attention_stack"] == "cross" and ds.sizes["query"] != ds.sizes["key"]
    meta = _data(ac.explore(ds).html)
    assert meta["cross"] is True
    assert meta["query_tokens"][0] == [f"tgt{q}<b>" for q in range(5)]
    assert meta["tokens"][0] == [f"src{k}" for k in range(9)]
    assert meta["sink"] == [0, 3]  # the first real source token of each sample
    # the head view: target tokens down the side, source tokens along the top, as text
    svg = ac.head_view(ds, sample=1).svg
    assert "tgt4&lt;b&gt;" in svg and "src8" in svg and "<b>" not in svg
    # saved, loaded, explored from the CLI: the same labels
    path = tmp_path / "cross.nc"
    ac.save(ds, path)
    assert main(["explore", str(path), "--out", str(tmp_path / "cross.html")]) == 0
    again = _data((tmp_path / "cross.html").read_text(encoding="utf-8"))
    assert again["cross"] is True and again["query_tokens"] == meta["query_tokens"]


@needs_chromium
def test_cross_attention_tooltip_names_the_target_query_and_the_source_key(
    tmp_path: Path,
) -> None:
    ds = _cross_capture()
    page = tmp_path / "cross.html"
    ac.explore(ds).save(page)
    p = _weights(ds)[1]  # sample 1
    with open_page(page, tmp_path / "profile", 1300, 1000) as tab:
        _ready(tab)
        _press(tab, "n")  # sample 1: three padding keys, every query still shown
        assert _state(tab)["sample"] == "1"
        geo = tab.evaluate("window.acxGeometry(0)")
        assert geo["rows"] == [0, 1, 2, 3, 4]
        layer, head = int(_state(tab)["layer"]), int(_state(tab)["head"])
        for query, key in ((4, 6), (0, 8)):
            tab.hover(*_cell_point(tab, query, key))
            tip = tab.evaluate("document.getElementById('acx-tip').textContent")
            assert f"query {query} {json.dumps(f'tgt{query}<b>')}" in tip, tip
            assert f"key {key} {json.dumps(f'src{key}')}" in tip, tip
            want = p[ds.layer.values.tolist().index(layer), head, query, key]
            shown = float(re.search(r"p = ([0-9.]+)", tip).group(1))  # type: ignore[union-attr]
            assert abs(shown - want) <= TOL + 5e-5
        assert tab.evaluate("document.querySelectorAll('b').length") == 0
        assert "Cross attention" in tab.evaluate("document.getElementById('acx-sub').textContent")
        assert tab.requests() == [page.resolve().as_uri()]


@needs_chromium
def test_click_locks_a_cell_and_the_token_view_tells_its_row(tmp_path: Path) -> None:
    """A click locks a cell (the mouse moving on changes nothing); the token view shows the
    sample's real tokens (left padding left out) with the weight the locked query pays each
    one under each convention, against log_attn; a second click or Esc frees it."""
    ds = _padded()
    page = tmp_path / "lock.html"
    ac.explore(ds, layer=1, head=2).save(page)
    p = _weights(ds)[1]  # sample 1: left-padded, real tokens 10-39, sink 10
    with open_page(page, tmp_path / "profile", 1400, 1000) as tab:
        _ready(tab)
        _press(tab, "n")
        query, key = 30, 17
        _click(tab, *_cell_point(tab, query, key))
        assert tab.evaluate("document.getElementById('acx-tokens').dataset.query") == "30"
        tab.hover(*_cell_point(tab, 25, 12))  # moving on: the lock holds
        pane = tab.evaluate("Object.assign({}, document.getElementById('acx-pa').dataset)")
        assert (pane["hoverQuery"], pane["hoverKey"]) == (str(query), str(key))
        read = (
            "Array.from(document.querySelectorAll('#acx-tokens .acx-t'))"
            ".map(s => [+s.dataset.k, s.dataset.w, s.textContent])"
        )
        for head, conv in ((2, "split"), (2, "kept"), (2, "dropped"), (1, "dropped")):
            if head != int(_state(tab)["head"]):
                _press(tab, "ArrowLeft")
            _press(tab, conv[0])
            spans = tab.evaluate(read)
            assert [k for k, _, _ in spans] == list(range(10, 40))  # no padding
            row = p[1, head, query]  # layer 1
            s = row[10]
            for k, w, _ in spans:
                if k > query:  # not visible (causal)
                    assert w == "", (k, w)
                    continue
                want = {
                    "kept": row[k],
                    "dropped": None if k == 10 else row[k] / (1 - s),
                    "split": s if k == 10 else row[k] / (1 - s),
                }[conv]
                if want is None:
                    assert w == ""
                else:
                    assert abs(float(w) - want) <= TOL + 1e-6, (conv, k, w, want)
            words = [str(t) for t in ds["token"].values[1, 10:40]]
            assert all(t for _, _, t in spans) and len(words) == len(spans)
        _press(tab, "Escape")
        assert tab.evaluate("document.getElementById('acx-tokens').dataset.query") == ""
        _click(tab, *_cell_point(tab, query, key))
        _click(tab, *_cell_point(tab, query, key))  # the same cell again: freed
        assert tab.evaluate("document.getElementById('acx-tokens').dataset.query") == ""
        assert tab.evaluate("window.acxViolations.length") == 0


@needs_chromium
def test_one_head_across_samples_and_a_link_to_a_head(tmp_path: Path) -> None:
    """The active head's mean sink share and content entropy in every sample, from the page's
    summaries; a click opens that sample. ``#layer=L&head=H&sample=S`` opens that head."""
    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=3, n_heads=4, length=12)
    page = tmp_path / "across.html"
    ex = ac.explore(ds, layer=2, head=0)
    ex.save(page)
    meta = _data(ex.html)
    with open_page(page, tmp_path / "profile", 1400, 1000) as tab:
        _ready(tab)
        _press(tab, "ArrowRight")  # layer 2, head 1
        rows = tab.evaluate(
            "Array.from(document.querySelectorAll('#acx-samples button'))"
            ".map(b => [+b.dataset.sample, +b.dataset.s, +b.dataset.hc])"
        )
        assert [r[0] for r in rows] == [0, 1, 2]
        for s, share, hc in rows:
            want = meta["summaries"][s][2][1]
            assert abs(share - want[0]) < 1e-9 and abs(hc - want[4]) < 1e-9
        _click(tab, *_centre(tab, '#acx-samples button[data-sample="2"]'))
        assert _state(tab)["sample"] == "2"
        tab.evaluate("window.location.hash = 'layer=0&head=3&sample=1'")
        for _ in range(100):
            if _state(tab)["layer"] == "0":
                break
            time.sleep(0.02)
        assert (_state(tab)["layer"], _state(tab)["head"], _state(tab)["sample"]) == ("0", "3", "1")
    with open_page(page, tmp_path / "profile2", 1400, 1000) as tab:  # opened with a fragment
        other = tmp_path / "across2.html"  # another document: the fragment read at load
        other.write_bytes(page.read_bytes())
        tab.call("Page.navigate", {"url": other.resolve().as_uri() + "#layer=1&head=2"})
        for _ in range(300):
            if tab.evaluate("document.URL").startswith(other.resolve().as_uri()):
                break
            time.sleep(0.02)
        _ready(tab)
        assert (_state(tab)["layer"], _state(tab)["head"]) == ("1", "2")
        assert tab.evaluate("window.acxViolations.length") == 0
