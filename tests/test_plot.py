"""Figures: every plot builds headlessly and saves as PNG and SVG, without pyplot."""

from __future__ import annotations

import subprocess
import sys

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
    check_saved(ac.plot_sink_vs_content(ds.coda.profiles()), tmp_path, "scatter")


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
    fig = ds.coda.plot_rows(sample=1, layer=2, head=0)
    assert len(fig.axes) == 3  # sink bars, content heatmap, colour bar
    heat = fig.axes[1].images[0].get_array()
    assert heat.shape == (8, 8)
    check_saved(fig, tmp_path, "rows")


def test_figures_never_load_pyplot():
    code = (
        "import sys, attncoda as ac; ds = ac.testing.synthetic_rows();"
        "ac.plot_sink_grid(ds); ac.plot_rows(ds, layer=0, head=0);"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
