"""Figures: every plot builds headlessly and saves as PNG and SVG, without pyplot."""

from __future__ import annotations

import inspect
import os
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
    ax = ac.plot_sink_grid(ds, title="grid")
    assert ax.get_title() == "grid"
    assert ax.images[0].get_array().shape == (3, 3)
    check_saved(ax, tmp_path, "grid")  # an Axes saves as its figure
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
    ax = ac.plot_flip_table({"model a": fr, "model b": fr})
    assert [t.get_text() for t in ax.get_xticklabels()] == ["model a", "model b"]
    check_saved(ax, tmp_path, "flips_many")


def test_entropy_attribution_bars(ds, tmp_path):
    att = ac.attribute_entropy(ds, along="layer")
    ax = ac.plot_entropy_attribution(att)
    assert len(ax.patches) == 4  # sink and content bar per transition
    check_saved(ax, tmp_path, "attribution")


def test_two_panel_rows(ds, tmp_path):
    fig = ds.coda.plot.rows(sample=1, layer=2, head=0)
    assert len(fig.axes) == 3  # sink bars, content heatmap, colour bar
    heat = fig.axes[1].images[0].get_array()
    assert heat.shape == (8, 8)
    check_saved(fig, tmp_path, "rows")


def _pixels(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(getattr(fig, "figure", fig))  # an Axes: its figure
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


@pytest.mark.slow
def test_figures_never_load_pyplot():
    code = (
        "import sys, attncoda as ac; ds = ac.testing.synthetic_rows();"
        "ac.plot_sink_grid(ds)._repr_png_(); ac.plot_rows(ds, layer=0, head=0)._repr_png_();"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# ax=, tokens=, norm= and what each function returns


def _figure_of(width=6, height=4, n=1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


# name -> (the data it takes, panels it draws, what it returns)
RETURNS = {
    "sink_grid": (lambda ds: ds, 1, "axes"),
    "sink_vs_content": (lambda ds: ac.head_profiles(ds), 1, "axes"),
    "flip_table": (lambda ds: ac.flip_rates(ds, ["cosine"], n_boot=5), 1, "axes"),
    "entropy_attribution": (lambda ds: ac.attribute_entropy(ds, along="layer"), 1, "axes"),
    "rows": (lambda ds: ds, 2, "figure"),
    "dendrograms": (
        lambda ds: ac.cluster_heads(ds, "js", ["kept", "dropped"], ks=(2,)),
        2,
        "figure",
    ),
}


@pytest.mark.parametrize("name", sorted(RETURNS))
def test_every_figure_draws_into_given_axes_and_returns_what_matplotlib_users_expect(ds, name):
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    data_of, panels, kind = RETURNS[name]
    fn = getattr(ac, f"plot_{name}")
    data = data_of(ds)
    fig, axes = _figure_of(n=panels)
    out = fn(data, ax=axes[0] if panels == 1 else axes)
    if kind == "axes":
        assert out is axes[0]
    else:
        assert out is fig
    assert all(a.has_data() for a in axes)  # drawn into the user's axes, no other figure
    # without ax=, a new figure of the same kind
    fresh = fn(data)
    assert isinstance(fresh, Axes if kind == "axes" else Figure)
    assert (fresh.figure if kind == "axes" else fresh) is not fig


@pytest.mark.parametrize("name", sorted(RETURNS))
def test_every_new_figure_shows_itself_in_jupyter(ds, name):
    """The Axes or Figure returned has ``_repr_png_`` (IPython's display protocol): the picture
    of its whole figure, with no pyplot; it stays a plain matplotlib object (pickles too)."""
    import io
    import pickle

    from matplotlib.image import imread

    data_of, _, kind = RETURNS[name]
    out = getattr(ac, f"plot_{name}")(data_of(ds))
    png = out._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(io.BytesIO(png))
    fig = out.figure if kind == "axes" else out
    width, height = fig.get_size_inches() * 100  # at 100 dpi, trimmed or grown to what is drawn
    assert 0.5 < image.shape[0] / height < 1.5 and 0.5 < image.shape[1] / width < 1.5
    assert image[..., :3].std() > 0.05  # something is drawn
    again = pickle.loads(pickle.dumps(out))
    assert again._repr_png_()[:8] == png[:8]


def test_a_figure_drawn_into_pyplot_axes_is_left_to_pyplot():
    """No double display: pyplot shows its own figures (inline backend), so attncoda adds no
    image for them; and drawing into them never gives pyplot's Axes a display method."""
    code = (
        "import matplotlib.pyplot as plt, attncoda as ac\n"
        "from attncoda._figures import inline_png as png_of\n"
        "ds = ac.testing.synthetic_rows()\n"
        "fig, ax = plt.subplots()\n"
        "out = ac.plot_sink_grid(ds, ax=ax)\n"
        "print(out is ax, hasattr(out, '_repr_png_'), png_of(fig))\n"
        # pyplot imported with a backend that only writes files (Agg): attncoda's own figure
        "print(png_of(ac.plot_sink_grid(ds).figure)[:4], len(plt.get_fignums()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert out.stdout.splitlines() == ["True False None", "b'\\x89PNG' 1"]


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("sink_grid", "not axes", "ax= must be a matplotlib Axes"),
        ("rows", None, "a sequence of 2 matplotlib Axes"),  # one Axes for two panels
        ("dendrograms", None, "a sequence of 2 matplotlib Axes"),
    ],
)
def test_wrong_axes_are_refused(ds, name, bad, message):
    data_of, _, _ = RETURNS[name]
    if bad is None:
        bad = _figure_of()[1][0]
    with pytest.raises(ac.InputError, match=message):
        getattr(ac, f"plot_{name}")(data_of(ds), ax=bad)


def test_axes_of_two_figures_are_refused(ds):
    with pytest.raises(ac.InputError, match="one figure"):
        ac.plot_rows(ds, ax=[_figure_of()[1][0], _figure_of()[1][0]])


def test_rows_are_labelled_with_the_dataset_tokens(ds):
    fig = ac.plot_rows(ds, sample=1, layer=0, head=1)
    bars, heat = fig.axes[:2]
    want = [str(t) for t in ds.token.values[1]]
    assert [t.get_text() for t in bars.get_yticklabels()] == want
    keys = [t.get_text() for t in heat.get_xticklabels()]
    assert keys[0] == "<bos> [sink]" and keys[1:] == want[1:]


def test_tokens_argument_overrides_and_false_gives_positions(ds):
    mine = [f"w{i}\n$x$" for i in range(ds.sizes["position"])]
    mine[3] = " "
    fig = ac.plot_rows(ds, layer=0, head=0, tokens=mine)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    # whitespace shown as the head view shows it, $ escaped so matplotlib reads no mathtext
    assert labels[2] == "w2\u23ce\\$x\\$"
    assert labels[3] == "\u2423"
    fig = ac.plot_rows(ds, layer=0, head=0, tokens=False)
    assert fig.axes[0].get_yticklabels()[0].get_text() == "0"
    plain = ds.drop_vars("token")
    fig = ac.plot_rows(plain, layer=0, head=0)  # no token coordinate: positions
    assert fig.axes[0].get_yticklabels()[0].get_text() == "0"
    for bad in (["too", "few"], "a string", 3):
        with pytest.raises(ac.InputError, match="one string per position"):
            ac.plot_rows(ds, layer=0, head=0, tokens=bad)


def test_long_sequences_get_thinned_token_labels():
    long = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=1, length=150)
    fig = ac.plot_rows(long, layer=0, head=0, max_tokens=150)  # (the default windows to 64)
    labels = fig.axes[0].get_yticklabels()
    assert 30 <= len(labels) <= 64
    assert labels[1].get_text() == str(long.token.values[0, 3])  # every third token


def test_a_key_subset_keeps_its_token_labels(ds):
    head = ds.isel(query=slice(0, 5), key=slice(0, 5))
    fig = ac.plot_rows(head, layer=0, head=0)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        str(t) for t in ds.token.values[0, :5]
    ]


@pytest.mark.parametrize("name", ["sink_grid", "flip_table", "rows"])
def test_heatmaps_take_a_log_colour_norm(ds, name):
    from matplotlib.colors import LogNorm, PowerNorm

    data_of, _, kind = RETURNS[name]
    fn = getattr(ac, f"plot_{name}")
    data = data_of(ds)

    def image(out):
        return (out if kind == "axes" else out.axes[1]).images[0]

    if name != "flip_table":  # synthetic flip rates can all be 0: nothing to put on a log scale
        log = image(fn(data, norm="log")).norm
        assert isinstance(log, LogNorm) and 0 < log.vmin < log.vmax
    custom = PowerNorm(0.5, vmin=0, vmax=1)
    assert image(fn(data, norm=custom)).norm is custom
    with pytest.raises(ac.InputError, match="not a colour scale"):
        fn(data, norm="sqrt")


def test_a_log_norm_without_positive_values_is_refused():
    from attncoda._plot import _norm

    with pytest.raises(ac.InputError, match="positive values"):
        _norm("log", np.zeros(3), None, None)


def test_accessor_forwards_ax_tokens_and_norm(ds):
    fig, (bars, heat) = _figure_of(n=2)
    out = ds.coda.plot.rows(layer=0, head=0, ax=(bars, heat), tokens=False, norm="log")
    assert out is fig and heat.images
    _, (ax,) = _figure_of()
    assert ds.coda.plot.sink_grid(ax=ax, norm="log") is ax


# ------------------------------------------------------------------------------ save_figure


def test_save_figure_keeps_dots_in_names_and_drops_only_an_image_suffix(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1])
    # two models whose names differ after a dot: one file each (was: both 'qwen2.png')
    a = ac.save_figure(fig, tmp_path / "qwen2.5-coder-0.5b_js")
    b = ac.save_figure(fig, tmp_path / "qwen2.5-coder-1.5b_js")
    assert [p.name for p in a + b] == [
        "qwen2.5-coder-0.5b_js.png",
        "qwen2.5-coder-0.5b_js.svg",
        "qwen2.5-coder-1.5b_js.png",
        "qwen2.5-coder-1.5b_js.svg",
    ]
    assert [p.name for p in ac.save_figure(fig, tmp_path / "grid.PNG", ["pdf"])] == ["grid.pdf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in a + b] + ["grid.pdf"]
    )  # nothing else: no staging debris


def test_save_figure_replaces_its_file_whole_and_refuses_bad_targets(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1])
    (tmp_path / "old.png").write_bytes(b"not a png")
    (png,) = ac.save_figure(fig, tmp_path / "old", ["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "taken.svg").mkdir()
    with pytest.raises(ac.OutputExistsError, match="folder"):
        ac.save_figure(fig, tmp_path / "taken")
    assert not (tmp_path / "taken.png").exists()  # checked before the first format is written
    with pytest.raises(ac.InputError, match="cannot write"):
        ac.save_figure(fig, tmp_path / "x", ["png", "docx"])
    with pytest.raises(ac.InputError, match="formats"):
        ac.save_figure(fig, tmp_path / "x", "png")
    assert not list(tmp_path.glob("x*"))


@pytest.mark.parametrize("length", [5, 64])
@pytest.mark.parametrize("name", sorted(RETURNS))
def test_every_figure_keeps_its_titles_labels_and_colour_bars_inside(name, length):
    """Drawn as saved, every title, axis label, tick label and colour bar of a new figure lies
    inside the figure (nothing cut at the edge), for a short and a 64-token capture, with the
    long titles the report gives them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ds = ac.testing.synthetic_rows(n_samples=3, n_layers=3, n_heads=3, length=length)
    data_of, _, kind = RETURNS[name]
    title = "layer 15, head 6 (most sink-heavy captured head, mean sink share 0.93), sample 1"
    out = getattr(ac, f"plot_{name}")(data_of(ds), title=title)
    fig = out.figure if kind == "axes" else out
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    outside = []
    # what matplotlib drew: each Axes (a colour bar is one) with its title, labels and ticks,
    # and the figure's own texts (a suptitle)
    for artist in [*fig.axes, *fig.texts]:
        ext = artist.get_tightbbox(renderer) if hasattr(artist, "get_tightbbox") else None
        ext = ext if ext is not None else artist.get_window_extent(renderer)
        if ext.x0 < box.x0 - 1 or ext.y0 < box.y0 - 1 or ext.x1 > box.x1 + 1 or ext.y1 > box.y1 + 1:
            if hasattr(artist, "get_title"):  # an Axes: its title, else its label
                outside.append(artist.get_title() or artist.get_ylabel() or repr(artist))
            else:
                outside.append(artist.get_text())
    assert outside == []


def test_rows_of_a_long_sample_are_windowed_and_the_title_says_so():
    ds = ac.testing.synthetic_rows(n_samples=1, n_layers=1, n_heads=2, length=100)
    fig = ac.plot_rows(ds, layer=0, head=1)
    heat = fig.axes[1].images[0].get_array()
    assert heat.shape == (64, 64)
    assert "positions 0-63 of its 100 tokens" in fig.texts[0].get_text().replace("\n", " ")
    fig = ac.plot_rows(ds, layer=0, head=1, window=(40, 70), title="mine")
    assert fig.axes[1].images[0].get_array().shape == (30, 30)
    assert fig.axes[1].get_xticklabels()[0].get_text() == str(ds["token"].values[0, 40])
    text = fig.texts[0].get_text().replace("\n", " ")
    assert text.startswith("mine: positions 40-69 of its 100 tokens"), text
    short = ac.plot_rows(ac.testing.synthetic_rows(length=12), layer=1, head=0)
    assert ":" not in short.texts[0].get_text()  # every token drawn: nothing to say
    # right padding (keys 30-99 seen by no query, their queries see nothing) is left out
    z = ds["log_attn"].values.copy()
    z[..., 30:] = -np.inf
    z[..., 30:, :] = -np.inf
    padded = ds[["log_attn"]].copy()
    padded["log_attn"] = (ds["log_attn"].dims, z)
    fig = ac.plot_rows(padded, layer=0, head=0)
    assert fig.axes[1].images[0].get_array().shape == (30, 30)
    assert "70 padding keys left out" in fig.texts[0].get_text().replace("\n", " ")
    for bad in ((5,), "0:10", (200, 300)):
        with pytest.raises(ac.InputError, match="window"):
            ac.plot_rows(ds, layer=0, head=0, window=bad)
