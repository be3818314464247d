"""Figures: every plot builds headlessly and saves as PNG and SVG, without pyplot."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

import attncoda as ac

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def ds():
    return ac.testing.synthetic_rows(n_samples=3, n_layers=3, n_heads=3, length=8)


def check_saved(fig, tmp_path, name):
    paths = ac.save_figure(fig, tmp_path / name)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    png, svg = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]


def test_sink_grid_and_scatter(ds, tmp_path):
    fig = ac.plot_sink_grid(ds, title="grid")
    assert fig.axes[0].get_title() == "grid"
    assert fig.axes[0].images[0].get_array().shape == (3, 3)
    check_saved(fig, tmp_path, "grid")
    check_saved(ac.plot_sink_vs_content(ds.coda.head_profiles()), tmp_path, "scatter")


def test_dendrograms_side_by_side(ds, tmp_path):
    cl = ac.cluster_heads(ds, "js", ["kept", "dropped", "content"], ks=(2,))
    fig = ac.plot_dendrograms(cl)
    assert len(fig.axes) == 3
    assert "kept" in fig.axes[0].get_title()
    check_saved(fig, tmp_path, "dendrograms")


def test_flip_table_for_one_model_and_several(ds, tmp_path):
    fr = ac.flip_rates(ds, ["cosine", "js"], n_boot=20)
    check_saved(ac.plot_flip_table(fr), tmp_path, "flips_one")
    fig = ac.plot_flip_table({"model a": fr, "model b": fr})
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["model a", "model b"]
    check_saved(fig, tmp_path, "flips_many")


def test_entropy_attribution_bars(ds, tmp_path):
    att = ac.attribute_entropy(ds, along="layer")
    fig = ac.plot_entropy_attribution(att)
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # sink and content bar per transition
    check_saved(fig, tmp_path, "attribution")


def test_two_panel_rows(ds, tmp_path):
    fig = ds.coda.plot.rows(sample=1, layer=2, head=0)
    assert len(fig.axes) == 3  # sink bars, content heatmap, colour bar
    heat = fig.axes[1].images[0].get_array()
    assert heat.shape == (8, 8)
    check_saved(fig, tmp_path, "rows")


def _pixels(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())


# every figure of ds.coda.plot: the dataset it takes and arguments that exercise its parameters
PLOT_CALLS = {
    "sink_grid": (lambda ds: ds, {"title": "grid", "vmax": 0.8}),
    "sink_vs_content": (lambda ds: ac.head_profiles(ds), {"title": "scatter"}),
    "rows": (lambda ds: ds, {"sample": 1, "layer": 2, "head": 0}),
    "dendrograms": (lambda ds: ac.cluster_heads(ds, "js", ks=(2,)), {"title": "tree"}),
    "flip_table": (lambda ds: ac.flip_rates(ds, ["cosine"], n_boot=5), {"scope": "all"}),
    "entropy_attribution": (lambda ds: ac.attribute_entropy(ds, along="layer"), {}),
}


def test_the_plot_accessor_covers_every_figure_function():
    methods = {name for name in vars(type(ac.testing.synthetic_rows().coda.plot))}
    methods = {name for name in methods if not name.startswith("_")}
    figures = {name.removeprefix("plot_") for name in ac.__all__ if name.startswith("plot_")}
    assert methods == figures == set(PLOT_CALLS)


@pytest.mark.parametrize("name", sorted(PLOT_CALLS))
def test_plot_accessor_methods_mirror_the_plot_functions(ds, name):
    fn, (data_of, kwargs) = getattr(ac, f"plot_{name}"), PLOT_CALLS[name]
    data = data_of(ds)
    method = getattr(data.coda.plot, name)
    want = inspect.signature(fn)
    assert inspect.signature(method) == want.replace(parameters=list(want.parameters.values())[1:])
    assert method.__doc__ == fn.__doc__ and method.__name__ == name
    np.testing.assert_array_equal(_pixels(method(**kwargs)), _pixels(fn(data, **kwargs)))


def test_figures_never_load_pyplot():
    code = (
        "import sys, attncoda as ac; ds = ac.testing.synthetic_rows();"
        "ac.plot_sink_grid(ds); ac.plot_rows(ds, layer=0, head=0);"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
