"""The offline head view: what it draws, what it refuses, and how it behaves in a browser.

The browser tests load a saved view in Debian's chromium (headless, over the DevTools protocol:
see ``tests/browser.py``), move the mouse over a cell as a user would and read what the page
then shows as hovered: the cell's tooltip (its SVG ``<title>``) must name its tokens and carry
its weights, computed here independently from the captured log-attention.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from browser import needs_chromium, open_page

import attncoda as ac
from attncoda._view import token_labels

WORDS = [f"w{i}" for i in range(40)]


def _rows(length: int = 10, **kw: object) -> xr.Dataset:
    return ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=length, **kw)


def _titles(svg: str, cls: str = "acv-c") -> list[str]:
    return re.findall(rf'<rect class="{cls}"[^>]*><title>(.*?)</title>', svg, flags=re.S)


def _weights(ds: xr.Dataset, layer: int, head: int, sample: int) -> np.ndarray:
    z = ds["log_attn"].sel(layer=layer, head=head).isel(sample=sample).values.astype(np.float64)
    return np.where(np.isfinite(z), np.exp(np.where(np.isfinite(z), z, 0.0)), 0.0)


def test_one_cell_per_visible_key_with_its_weights() -> None:
    ds = _rows(8)
    view = ac.head_view(ds, layer=1, head=2, sample=1, tokens=WORDS[:8])
    p = _weights(ds, 1, 2, 1)
    titles = _titles(view.svg)
    # causal: query q sees keys 0..q, key 0 is the sink (its own column), so q content cells
    assert len(titles) == sum(range(8))
    assert len(_titles(view.svg, "acv-k")) == 8  # one sink cell per query
    for text in titles:
        q, k = (int(v) for v in re.search(r"query (\d+) .* key (\d+)", text).groups())  # type: ignore[union-attr]
        assert 0 < k <= q, text  # nothing above the diagonal, nothing in the sink's place
        assert f"&quot;{WORDS[q]}&quot;" in text and f"&quot;{WORDS[k]}&quot;" in text
        s = p[q, 0]
        assert f"weight p = {p[q, k]:.4f}" in text
        assert f"content weight c/(1 − s) = {p[q, k] / (1 - s):.4f}" in text
        assert f"row sink share s = {s:.4f}" in text


def test_tokens_come_from_the_dataset() -> None:
    ds = _rows(6)
    assert token_labels(ds, 0) == dict(enumerate(ds["token"].isel(sample=0).values.tolist()))
    ds = ds.drop_vars("token")
    ids = ds["token_id"].isel(sample=0).values
    assert token_labels(ds, 0) == {p: f"#{i}" for p, i in enumerate(ids)}  # ids, no strings
    assert token_labels(ds.drop_vars("token_id"), 0)[2] == "@2"
    words = np.array([[f"a{i}" for i in range(6)], [f"b{i}" for i in range(6)]])
    ds = ds.assign_coords(token=(("sample", "position"), words))
    assert token_labels(ds, 1)[3] == "b3"
    view = ds.coda.view(layer=0, head=0, sample=1)
    assert "&quot;b3&quot;" in view.svg and "#" + str(ids[3]) not in view.svg
    # whitespace tokens stay visible as labels
    spaced = ds.assign_coords(token=(("sample", "position"), np.array([[" ", "\n", "x"] * 2] * 2)))
    svg = ac.head_view(spaced, layer=0, head=0).svg
    assert "␣" in svg and "⏎" in svg


def test_padding_and_sink_index_are_respected() -> None:
    ds = _rows(8)
    la = ds["log_attn"].values.copy()
    la[0, ..., :2] = -np.inf  # sample 0 left-padded by two tokens: keys 0, 1 invisible
    la[0, :, :, :2, :] = -np.inf  # and the padded queries see nothing
    la[0, ..., 2] = np.where(np.isfinite(la[0, ..., 2]), la[0, ..., 2], -np.inf)
    ds = ds.assign(log_attn=(ds["log_attn"].dims, la))
    ds = ds.assign_coords(sink_index=("sample", np.array([2, 0])))
    view = ac.head_view(ds, layer=0, head=1, sample=0, tokens=WORDS[:8])
    sinks = _titles(view.svg, "acv-k")
    assert len(sinks) == 6 and all("key 2 &quot;w2&quot;" in t for t in sinks)
    for text in _titles(view.svg):
        k = int(re.search(r"key (\d+)", text).group(1))  # type: ignore[union-attr]
        assert k >= 3


def test_padded_queries_of_a_bidirectional_model_are_left_out() -> None:
    ds = _rows(8)
    la = np.full(ds["log_attn"].shape, -np.inf, np.float32)
    # sample 0: positions 0, 1 are padding; every query (padding too) sees keys 2..7
    p = np.random.default_rng(0).dirichlet(np.ones(6), size=ds["log_attn"].shape[:4])
    la[..., 2:] = np.log(p)
    ds = ds.assign(log_attn=(ds["log_attn"].dims, la)).assign_coords(
        sink_index=("sample", np.array([2, 2]))
    )
    view = ac.head_view(ds, layer=0, head=0, sample=0, tokens=WORDS[:8])
    assert {int(m) for m in re.findall(r"query (\d+) ", view.svg)} == set(range(2, 8))
    assert len(_titles(view.svg)) == 6 * 5  # not causal: every real query sees every content key


def test_long_samples_are_windowed_and_say_so() -> None:
    ds = _rows(30)
    full = ac.head_view(ds, max_tokens=30)
    assert not full.truncated and "truncated" not in full.svg
    view = ac.head_view(ds, max_tokens=10, start=12, tokens=WORDS[:30])
    assert view.truncated
    assert "truncated: positions 12–21 drawn of 0–29 (max_tokens=10)" in view.svg
    qs = {int(m) for m in re.findall(r"query (\d+) ", view.svg)}
    assert qs == set(range(12, 22))
    # the mass on keys left out is told in the sink tooltip
    p = _weights(ds, int(ds.layer[-1]), 0, 0)
    outside = p[12, 1:12].sum()
    assert f"(of which {outside:.4f} on keys not drawn)" in _titles(view.svg, "acv-k")[0]


def test_colour_options() -> None:
    ds = _rows(8)
    lin = ac.head_view(ds, color="weight")
    log = ac.head_view(ds, scale="log", decades=2)
    assert "colour: weight p, linear" in lin.svg
    assert "colour: content weight c / (1 − s), log" in log.svg
    fills = set(re.findall(r'class="acv-c"[^>]*fill="(#[0-9a-f]{6})"', log.svg))
    assert len(fills) > 5  # a real colour scale, not one flat colour


def test_refusals_are_one_line_errors() -> None:
    ds = _rows(6)
    with pytest.raises(ac.InputError, match=r"layer=7 was not captured; .* layers \[0, 1\]"):
        ac.head_view(ds, layer=7)
    with pytest.raises(ac.InputError, match="sample must be from 0 to 1"):
        ac.head_view(ds, sample=2)
    with pytest.raises(ac.InputError, match="scale must be"):
        ac.head_view(ds, scale="sqrt")  # type: ignore[arg-type]
    with pytest.raises(ac.InputError, match="tokens= needs one string per position"):
        ac.head_view(ds, tokens=["a", "b"])
    with pytest.raises(ac.InputError, match="max_tokens must be >= 1"):
        ac.head_view(ds, max_tokens=0)
    with pytest.raises(ac.RowsRequiredError):
        ac.head_view(ds.drop_vars("log_attn"))


def test_save_is_a_page_that_loads_nothing(tmp_path: Path) -> None:
    folder = tmp_path
    view = ac.head_view(_rows(6))
    page = view.save(folder / "view.html")
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text.lower() and "://" not in text
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert view._repr_html_().count("<svg") == 1
    with pytest.raises(ac.OutputExistsError):
        view.save(page)
    view.save(page, overwrite=True)
    (folder / "mine.html").write_text("not a view")
    with pytest.raises(ac.OutputExistsError, match="not a file attncoda wrote"):
        view.save(folder / "mine.html", overwrite=True)
    svg = view.save(folder / "view.svg").read_text(encoding="utf-8")
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" ')


# --------------------------------------------------------------------------------------------
# in a real browser


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, xr.Dataset]:
    ds = _rows(12)
    page = tmp_path_factory.mktemp("view") / "view.html"
    ac.head_view(ds, layer=1, head=1, sample=0, tokens=WORDS[:12]).save(page)
    return page, ds


@pytest.mark.real
@needs_chromium
def test_view_renders_in_chromium_and_hover_shows_the_cell(
    saved: tuple[Path, xr.Dataset], tmp_path: Path
) -> None:
    import matplotlib.image as mpimg

    page, ds = saved
    p = _weights(ds, 1, 1, 0)
    with open_page(page, tmp_path / "profile") as tab:
        # it renders: a box of the right size, and a screenshot with the colour scale in it
        box = tab.evaluate(
            "(() => { const r = document.querySelector('svg.acv').getBoundingClientRect();"
            " return [r.width, r.height]; })()"
        )
        assert box[0] > 300 and box[1] > 200
        png = mpimg.imread(io.BytesIO(tab.screenshot()), format="png")
        colours = {tuple(px) for px in (png[..., :3] * 255).astype(int).reshape(-1, 3)[::7]}
        assert len(colours) > 20, "the screenshot is (nearly) blank"
        # hover the cell of query 9, key 4: find where it is drawn, move the mouse there
        where = tab.evaluate(
            "(() => { for (const r of document.querySelectorAll('rect.acv-c')) {"
            " const t = r.querySelector('title').textContent;"
            " if (t.startsWith('query 9 ') && t.includes('key 4 ')) {"
            " const b = r.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2];"
            " } } return null; })()"
        )
        assert where is not None
        assert tab.evaluate("document.querySelectorAll('rect:hover').length") == 0
        tab.hover(*where)
        hovered = tab.evaluate(
            "(() => { const h = Array.from(document.querySelectorAll(':hover')).pop();"
            " return [h.tagName, h.querySelector('title').textContent,"
            " getComputedStyle(h).stroke]; })()"
        )
        assert tab.requests() == [page.resolve().as_uri()]  # nothing loaded from anywhere
    tag, tooltip, stroke = hovered
    assert tag == "rect"
    assert tooltip.startswith('query 9 "w9" → key 4 "w4"')
    assert f"weight p = {p[9, 4]:.4f}" in tooltip
    assert f"row sink share s = {p[9, 0]:.4f}" in tooltip
    assert f"content weight c/(1 − s) = {p[9, 4] / (1 - p[9, 0]):.4f}" in tooltip
    assert stroke == "rgb(214, 39, 40)"  # the hovered cell is outlined


def test_report_scatter_and_dendrogram_axes_have_round_ticks() -> None:
    """The scatter's y axis reads 0, 0.5, 1, ... (steps of 1, 2, 2.5 or 5 times a power of ten,
    ending on a tick above the data), not 0, 0.91, 1.8, 2.7, 3.6 (five equal cuts of the range)."""
    import re

    from attncoda._view import dendrograms_svg, scatter_svg

    svg = scatter_svg(
        np.r_[0.1, 0.5, 0.9],
        np.r_[0.3, 2.0, 3.46],
        np.r_[0.0, 0.5, 1.0],
        ["a", "b", "c"],
        heading="h",
        x_label="x",
        y_label="y",
        legend="c",
        x_range=(0.0, 1.0),
    )
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([^<]+)</text>', svg)]
    steps = np.diff(ticks)
    assert ticks[0] == 0 and ticks[-1] >= 3.46 * 1.05 and len(ticks) <= 7
    assert np.allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
    assert any(np.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), ticks
    x_ticks = [float(t) for t in re.findall(r'text-anchor="middle">([\d.]+)</text>', svg)]
    assert x_ticks == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    z = np.array([[0, 1, 0.1, 2], [2, 3, 0.31, 3]])
    dendro = dendrograms_svg(
        [z], ["p"], ["a", "b", "c"], ["A", "B", "C"], np.r_[0, 0.5, 1], heading="h", legend="c"
    )
    heights = re.findall(r'text-anchor="middle">([\d.]+)</text>', dendro)
    assert heights == ["0", "0.1", "0.2", "0.3"], heights
