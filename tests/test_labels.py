"""Labelled results: every maths function takes DataArrays and keeps their dims and coordinates.

Each case calls one public maths function on DataArrays and on the same numpy arrays: the values
must be equal exactly (the wrapper only reorders axes), and the result must carry the dims and
coordinates that docs/maths.md (and ``attncoda._array``'s labelled section) promise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import attncoda as ac
from attncoda._array import MATHS_FUNCTIONS

D = 5


def rows(seed: int = 0, *, logits: bool = False) -> xr.DataArray:
    """Rows over (sample, head, key) with coordinates on each dim and one on two dims."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(2, 3, D))
    values = z if logits else ac.closure(np.exp(z))
    return xr.DataArray(
        values,
        dims=("sample", "head", "key"),
        coords={
            "sample": ["s0", "s1"],
            "head": [4, 5, 6],
            "key": np.arange(10, 10 + D),
            "token": (("sample", "key"), np.array([list("abcde"), list("vwxyz")])),
            "run": "demo",  # a scalar coordinate
        },
        attrs={"units": "probability"},
    )


def numpy_of(value):
    return (
        value.transpose("sample", "head", "key").values
        if isinstance(value, xr.DataArray)
        else value
    )


def same_values(labelled, plain) -> None:
    np.testing.assert_array_equal(np.asarray(labelled), np.asarray(plain))


ROW_COORDS = {"sample", "head", "run"}


def check_rows(out: xr.DataArray, expected_dims: tuple[str, ...]) -> None:
    assert isinstance(out, xr.DataArray)
    assert out.dims == expected_dims
    for name in ROW_COORDS:
        assert name in out.coords
    assert out["sample"].values.tolist() == ["s0", "s1"]
    assert out["head"].values.tolist() == [4, 5, 6]


def check_parts(out: xr.DataArray) -> None:
    check_rows(out, ("sample", "head", "key"))
    assert out["key"].values.tolist() == list(range(10, 10 + D))
    assert out["token"].dims == ("sample", "key")


# ------------------------------------------------------------------------ one case per function


def case_same(name, **kw):
    def run():
        x = rows()
        fn = getattr(ac, name)
        out = fn(x, **kw)
        same_values(out, fn(x.values, **kw))
        check_parts(out)
        assert out.name == name

    return run


def case_reduce(name, pair=False, **kw):
    def run():
        x, y = rows(0), rows(1)
        fn = getattr(ac, name)
        args = (x, y) if pair else (x,)
        out = fn(*args, **kw)
        same_values(out, fn(*(a.values for a in args), **kw))
        check_rows(out, ("sample", "head"))
        assert "key" not in out.coords and "token" not in out.coords

    return run


def run_alr():
    x = rows()
    out = ac.alr(x)
    same_values(out, ac.alr(x.values))
    check_rows(out, ("sample", "head", "key_alr"))
    assert out["key_alr"].values.tolist() == [11, 12, 13, 14]  # the numerator parts
    ref2 = ac.alr(x, ref=2)
    assert ref2["key_alr"].values.tolist() == [10, 11, 13, 14]
    back = ac.alr_inv(out)
    same_values(back, ac.alr_inv(out.values))
    check_rows(back, ("sample", "head", "key"))
    # with a mask the parts axis keeps its length, so it keeps its dim and labels
    mask = xr.ones_like(x, dtype=bool)
    masked = ac.alr(x, mask=mask)
    check_parts(masked)
    same_values(masked, ac.alr(x.values, mask=mask.values))


def run_ilr():
    x = rows()
    z = ac.ilr(x)
    same_values(z, ac.ilr(x.values))
    check_rows(z, ("sample", "head", "key_ilr"))
    assert z.sizes["key_ilr"] == D - 1
    back = ac.ilr_inv(z)
    same_values(back, ac.ilr_inv(z.values))
    check_rows(back, ("sample", "head", "key"))
    basis = ac.sbp_basis(
        np.array([[1, 1, -1, -1, 0], [1, -1, 0, 0, 0], [0, 0, 1, -1, 0], [1, 1, 1, 1, -1]])
    )
    same_values(ac.ilr(x, basis), ac.ilr(x.values, basis))


def run_clr_inv():
    c = ac.clr(rows())
    out = ac.clr_inv(c)
    same_values(out, ac.clr_inv(c.values))
    check_parts(out)


def run_add_learned_sink():
    x = rows() * 0.9
    out = ac.add_learned_sink(x)
    same_values(out, ac.add_learned_sink(x.values))
    check_rows(out, ("sample", "head", "key"))
    assert out.sizes["key"] == D + 1
    assert "token" not in out.coords  # the keys moved by one: their labels would lie


def run_power():
    x = rows()
    a = xr.DataArray([1.0, 2.0, -0.5], dims="head", coords={"head": [4, 5, 6]})
    out = ac.power(x, a)
    same_values(out, ac.power(x.values, a.values[None, :]))
    check_parts(out)


def run_pairwise(name):
    def run():
        x = rows()
        fn = getattr(ac, name)
        out = fn(x) if name == "pairwise_aitchison" else fn(x, x)
        plain = fn(x.values) if name == "pairwise_aitchison" else fn(x.values, x.values)
        same_values(out, plain)
        check_rows_pair(out)

    return run


def check_rows_pair(out: xr.DataArray) -> None:
    assert out.dims == ("sample", "head_a", "head_b")
    assert out["head_a"].values.tolist() == [4, 5, 6]
    assert out["head_b"].values.tolist() == [4, 5, 6]
    assert out["sample"].values.tolist() == ["s0", "s1"]
    assert float(out.sel(head_a=5, head_b=5).max()) == pytest.approx(0.0, abs=1e-12) or (
        out.name == "inner"
    )


def run_pairwise_sum_over():
    x = rows().transpose("head", "sample", "key")
    out = ac.pairwise_aitchison(x, sum_over="head")
    same_values(out, ac.pairwise_aitchison(x.values, sum_over=0))
    assert out.dims == ("sample_a", "sample_b")
    assert out["sample_a"].values.tolist() == ["s0", "s1"]


def run_decompose():
    z = rows(logits=True)
    res = ac.decompose(z, from_logits=True)
    plain = ac.decompose(z.values, from_logits=True)
    assert isinstance(res, xr.Dataset)
    for f in dataclasses.fields(plain):
        same_values(res[f.name], getattr(plain, f.name))
    check_parts(res["content"])
    check_rows(res["sink_share"], ("sample", "head"))


def run_group_decompose():
    z = rows(logits=True)
    groups = [[0], [1, 2], [3, 4]]
    res = ac.group_decompose(z, groups, from_logits=True)
    plain = ac.group_decompose(z.values, groups, from_logits=True)
    same_values(res["shares"], plain.shares)
    check_rows(res["shares"], ("sample", "head", "group"))
    check_rows(res["entropy"], ("sample", "head"))


def run_aitchison_split():
    x, y = rows(0), rows(1)
    res = ac.aitchison_split(x, y)
    plain = ac.aitchison_split(x.values, y.values)
    same_values(res["sink"], plain.sink)
    same_values(res["total"], plain.total)
    check_rows(res["content"], ("sample", "head"))


def run_pairwise_aitchison_split():
    x = rows()
    res = ac.pairwise_aitchison_split(x)
    plain = ac.pairwise_aitchison_split(x.values)
    same_values(res["content"], plain.content)
    check_rows_pair(res["total"])


def run_entropy_change():
    a, b = rows(0, logits=True), rows(1, logits=True)
    res = ac.entropy_change(a, b, from_logits=True)
    plain = ac.entropy_change(a.values, b.values, from_logits=True)
    same_values(res["total"], plain.total)
    check_rows(res["sink"], ("sample", "head"))


def summaries(seed: int) -> tuple[xr.DataArray, xr.DataArray]:
    d = ac.decompose(rows(seed, logits=True), from_logits=True)
    return d["sink_share"], d["content_entropy"]


def run_attribute_entropy_change():
    (sa, ha), (sb, hb) = summaries(0), summaries(1)
    res = ac.attribute_entropy_change(sa, ha, sb, hb)
    plain = ac.attribute_entropy_change(sa.values, ha.values, sb.values, hb.values)
    same_values(res["content"], plain.content)
    check_rows(res["sink"], ("sample", "head"))


def run_attribute_grouped_entropy_change():
    z0, z1 = rows(0, logits=True), rows(1, logits=True)
    groups = [[0], [1, 2], [3, 4]]
    a = ac.group_decompose(z0, groups, from_logits=True)
    b = ac.group_decompose(z1, groups, from_logits=True)
    res = ac.attribute_grouped_entropy_change(
        a["shares"], a["within_entropy"], b["shares"], b["within_entropy"]
    )
    plain = ac.attribute_grouped_entropy_change(
        a["shares"].values,
        a["within_entropy"].values,
        b["shares"].values,
        b["within_entropy"].values,
    )
    same_values(res["within"], plain.within)
    check_rows(res["within"], ("sample", "head", "group"))
    check_rows(res["between"], ("sample", "head"))


def run_binary_entropy():
    s = summaries(0)[0]
    out = ac.binary_entropy(s)
    same_values(out, ac.binary_entropy(s.values))
    check_rows(out, ("sample", "head"))


def run_binary_entropy_from_logs():
    s = summaries(0)[0]
    out = ac.binary_entropy_from_logs(np.log(s), np.log1p(-s))
    same_values(out, ac.binary_entropy_from_logs(np.log(s.values), np.log1p(-s.values)))
    check_rows(out, ("sample", "head"))


CASES = {
    "closure": case_same("closure"),
    "multi_replace": case_same("multi_replace"),
    "clr": case_same("clr"),
    "perturb": lambda: (
        same_values(ac.perturb(rows(0), rows(1)), ac.perturb(rows(0).values, rows(1).values)),
        check_parts(ac.perturb(rows(0), rows(1))),
    ),
    "perturb_inv": lambda: check_parts(ac.perturb_inv(rows(0), rows(1))),
    "power": run_power,
    "clr_inv": run_clr_inv,
    "alr": run_alr,
    "alr_inv": run_alr,
    "ilr": run_ilr,
    "ilr_inv": run_ilr,
    "add_learned_sink": run_add_learned_sink,
    "aitchison_norm": case_reduce("aitchison_norm"),
    "aitchison_distance": case_reduce("aitchison_distance", pair=True),
    "paired_inner": case_reduce("paired_inner", pair=True),
    "entropy": case_reduce("entropy"),
    "inner": run_pairwise("inner"),
    "pairwise_aitchison": run_pairwise("pairwise_aitchison"),
    "decompose": run_decompose,
    "group_decompose": run_group_decompose,
    "aitchison_split": run_aitchison_split,
    "pairwise_aitchison_split": run_pairwise_aitchison_split,
    "entropy_change": run_entropy_change,
    "attribute_entropy_change": run_attribute_entropy_change,
    "attribute_grouped_entropy_change": run_attribute_grouped_entropy_change,
    "binary_entropy": run_binary_entropy,
    "binary_entropy_from_logs": run_binary_entropy_from_logs,
}


def test_every_maths_function_has_a_case():
    assert sorted(CASES) == sorted(MATHS_FUNCTIONS)
    assert set(MATHS_FUNCTIONS) <= set(ac.__all__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dataarray_in_dataarray_out(name):
    CASES[name]()


def test_pairwise_sum_over_by_name():
    run_pairwise_sum_over()


# ------------------------------------------------------------------------ dims, masks, alignment


def test_parts_dim_default_is_key_wherever_it_is():
    x = rows().transpose("key", "sample", "head")
    out = ac.clr(x)
    assert out.dims == ("sample", "head", "key")
    same_values(out.transpose(*rows().dims), ac.clr(rows().values))


def test_parts_dim_by_name_or_axis():
    x = rows().rename(key="part")
    with pytest.raises(ac.ShapeMismatchError, match="dim="):
        ac.clr(x)  # no 'key' and several dims: ambiguous, refused
    same_values(ac.clr(x, dim="part"), ac.clr(x.values))
    same_values(ac.clr(x, axis=-1), ac.clr(x.values))
    with pytest.raises(ac.ShapeMismatchError, match="different parts dims"):
        ac.clr(x, dim="part", axis=0)
    with pytest.raises(ac.ShapeMismatchError, match="not a dim"):
        ac.clr(x, dim="nope")
    one = xr.DataArray([0.2, 0.3, 0.5], dims="part")
    assert ac.clr(one).dims == ("part",)


def test_dim_with_numpy_is_refused():
    with pytest.raises(ac.ShapeMismatchError, match="axis= for numpy"):
        ac.clr(np.ones(3) / 3, dim="key")


def test_mask_as_dataarray_broadcasts_by_name():
    z = rows(logits=True)
    mask = xr.DataArray(
        np.array([True, True, False, True, True]), dims="key", coords={"key": z["key"].values}
    )
    out = ac.clr(z, from_logits=True, mask=mask)
    check_parts(out)
    same_values(out, ac.clr(z.values, from_logits=True, mask=mask.values))
    assert float(abs(out.sel(key=12)).max()) == 0.0


def test_unlabelled_mask_with_labelled_data_is_refused():
    z = rows(logits=True)
    with pytest.raises(ac.ShapeMismatchError, match="mask is not"):
        ac.clr(z, from_logits=True, mask=np.ones(D, bool))
    with pytest.raises(ac.ShapeMismatchError, match="x is not"):
        ac.clr(z.values, from_logits=True, mask=xr.ones_like(z, dtype=bool))


def test_mask_without_parts_dim_is_refused():
    z = rows(logits=True)
    with pytest.raises(ac.ShapeMismatchError, match="without the parts dim"):
        ac.clr(z, from_logits=True, mask=xr.DataArray([True, True], dims="sample"))


def test_misaligned_labels_are_refused_not_inner_joined():
    x, y = rows(0), rows(1)
    with pytest.raises(ac.ShapeMismatchError, match="coordinates"):
        ac.aitchison_distance(x, y.assign_coords(head=[7, 8, 9]))


def test_numpy_and_torch_results_are_unchanged():
    torch = pytest.importorskip("torch")
    x = rows().values
    assert type(ac.clr(x)) is np.ndarray
    assert isinstance(ac.clr(torch.as_tensor(x)), torch.Tensor)
    assert type(ac.decompose(x)) is ac.SinkContent


# ------------------------------------------------------------------------ properties


@st.composite
def labelled_rows(draw):
    n_a = draw(st.integers(1, 3))
    n_b = draw(st.integers(1, 3))
    n_parts = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    order = draw(st.permutations(["a", "b", "key"]))
    z = np.random.default_rng(seed).normal(size=(n_a, n_b, n_parts))
    da = xr.DataArray(
        z,
        dims=("a", "b", "key"),
        coords={
            "a": np.arange(n_a) * 10,
            "b": [f"b{i}" for i in range(n_b)],
            "key": np.arange(n_parts),
        },
    )
    return da.transpose(*order)


@given(labelled_rows())
@settings(max_examples=40, deadline=None)
def test_labels_round_trip_and_values_equal_numpy(z):
    """Any dim order in: values equal numpy's on the same rows exactly, labels round-trip.

    (Exactly: the numpy call on the same array, parts moved last. Another order of the rows may
    differ in the last bit, as numpy's own matmul does for another batch shape.)
    """
    lead = [d for d in z.dims if d != "key"]
    plain = z.transpose(*lead, "key").values
    c = ac.clr(z, from_logits=True)
    assert c.dims == (*lead, "key")
    same_values(c, ac.clr(plain, from_logits=True))
    back = ac.clr_inv(c)
    same_values(back, ac.clr_inv(ac.clr(plain, from_logits=True)))
    expected = np.exp(z) / np.exp(z).sum("key")
    xr.testing.assert_allclose(back, expected.transpose(*back.dims))
    for coord in ("a", "b", "key"):
        assert back[coord].values.tolist() == z[coord].values.tolist()
    zi = ac.ilr(z, from_logits=True)
    assert zi.dims == (*lead, "key_ilr")
    same_values(zi, ac.ilr(plain, from_logits=True))
    xr.testing.assert_allclose(ac.ilr_inv(zi), back.drop_vars("key"))
    al = ac.alr(z, from_logits=True)
    assert al["key_alr"].values.tolist() == z["key"].values[1:].tolist()
    same_values(al, ac.alr(plain, from_logits=True))


def test_captured_rows_decompose_by_label_with_the_first_causal_query():
    """The issue's case: rows as capture writes them, first query one-part, labels kept."""
    ds = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=2, length=6)
    la = ds.log_attn
    with pytest.raises(ac.TooFewPartsError, match="degenerate='nan'"):
        ac.decompose(la, from_logits=True)
    d = ac.decompose(la, from_logits=True, degenerate="nan")
    plain = ac.decompose(la.values, from_logits=True, degenerate="nan")
    assert d.sink_share.dims == ("sample", "layer", "head", "query")
    assert d.content.dims == la.dims
    assert d.sink_index.values.tolist() == ds.sink_index.values.tolist()
    for name in ("sink_share", "content_entropy", "balance"):
        same_values(d[name], getattr(plain, name))
    assert bool(d.content_entropy.isel(query=0).isnull().all())
    c = ac.clr(la, from_logits=True, degenerate="nan")
    assert bool(c.sel(query=0).isnull().all()) and not bool(
        c.sel(query=slice(1, None)).isnull().any()
    )


def test_lazy_dataarrays_are_computed():
    pytest.importorskip("dask")
    la = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=2, length=6).log_attn
    lazy = la.chunk({"sample": 1})
    out = ac.entropy(lazy, from_logits=True)
    same_values(out, ac.entropy(la.values, from_logits=True))
    assert out.dims == ("sample", "layer", "head", "query")


def test_map_blocks_with_a_template_as_docs_cluster_says():
    pytest.importorskip("dask")
    la = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=2, length=6).log_attn
    rows = la.isel(query=slice(1, None))
    lazy = rows.chunk({"sample": 1})
    out = xr.map_blocks(
        lambda block: ac.entropy(block, from_logits=True),
        lazy,
        template=lazy.isel(key=0, drop=True),
    )
    same_values(out.compute(), ac.entropy(rows.values, from_logits=True))


@pytest.mark.parametrize("name", sorted(MATHS_FUNCTIONS))
def test_signature_and_docs_show_dim_where_there_is_a_parts_dim(name):
    import inspect

    fn = getattr(ac, name)
    summaries_only = name in {
        "binary_entropy",
        "binary_entropy_from_logs",
        "attribute_entropy_change",
    }
    assert ("dim" in inspect.signature(fn).parameters) is not summaries_only
    if not summaries_only and "Parameters\n    ----------" in fn.__doc__:
        assert "    dim : str, optional\n" in fn.__doc__
    if summaries_only:
        with pytest.raises(TypeError):
            fn(*([0.5] * len(inspect.signature(fn).parameters)), dim="key")
