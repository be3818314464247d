"""``ds.coda`` methods that are not one-to-one wrappers: ``decompose`` and ``view``."""

from __future__ import annotations

import numpy as np
import pytest

import attncoda as ac

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import capture  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decompose_of_rows_is_what_capture_writes_as_summaries(family: str) -> None:
    model = zoo.tiny_twin(family)
    ids = torch.randint(4, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model, what="both") as cap:
        model(ids)
    ds = cap.dataset
    rows = ds.drop_vars(list(ac.SUMMARY_VARIABLES))
    summ = rows.coda.decompose()
    assert "log_attn" not in summ and "key" not in summ.dims
    assert summ.attrs == ds.attrs
    np.testing.assert_array_equal(summ["token_id"].values, ds["token_id"].values)
    np.testing.assert_array_equal(summ["sink_index"].values, ds["sink_index"].values)
    ac.validate_dataset(summ)
    for name in ac.SUMMARY_VARIABLES:
        a, b = ds[name].values, summ[name].values
        assert summ[name].dims == ds[name].dims
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=name)
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=name)
        ok = np.isfinite(a)
        np.testing.assert_allclose(b[ok], a[ok], atol=2e-5, err_msg=name)


def test_decompose_with_another_sink_records_it() -> None:
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=1, n_heads=2, length=6)
    summ = rows.coda.decompose(sink=[1, 1])
    assert summ["sink_index"].values.tolist() == [1, 1]
    assert np.isnan(summ["sink_share"].sel(query=0)).all()  # query 0 cannot see key 1
    with pytest.raises(ac.RowsRequiredError):
        summ.coda.decompose()


def test_view_is_head_view() -> None:
    ds = ac.testing.synthetic_rows(length=5)
    assert ds.coda.view(layer=0, head=1).svg == ac.head_view(ds, layer=0, head=1).svg


# ------------------------------------------------------------------ what the accessors offer


def _public(cls: type) -> list[str]:
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        names.update((n, None) for n in vars(klass) if not n.startswith("_"))
    return list(names)


@pytest.mark.parametrize("path", ["coda", "coda.plot"])
def test_accessors_list_every_method_with_its_summary(path: str) -> None:
    ds = ac.testing.synthetic_rows()
    acc = ds.coda if path == "coda" else ds.coda.plot
    lines = repr(acc).splitlines()
    page = acc._repr_html_()
    assert lines[0].startswith(f"ds.{path}: ") and lines[-1] == f"  help(ds.{path}.NAME) says more"
    public = _public(type(acc))
    assert [line.split()[0].split("(")[0] for line in lines[1:-1]] == public
    assert page.count("<tr>") == len(public)
    for name in public:
        member = getattr(type(acc), name)
        doc = (member.fget if isinstance(member, property) else member).__doc__
        line = next(x for x in lines if x.split()[0].split("(")[0] == name)
        text = line.split("  ", 2)[-1].strip()
        assert text.split()[:2] == doc.split()[:2], (name, text)  # its docstring's summary
        assert f"<code>ds.{path}.{name}" in page


def test_the_list_is_generated_and_escaped() -> None:
    ds = ac.testing.synthetic_rows()

    class Mine(ac.CodaAccessor):
        """Mine: mine <b>only</b>."""

        _path = "ds.mine"

        def shiny(self) -> None:
            """Shine <b>bright</b> & clear, with :func:`~attncoda.clr`. A second sentence."""

    text, page = repr(Mine(ds)), Mine(ds)._repr_html_()
    assert "  shiny()  " in text and text.splitlines()[-2].endswith(
        "Shine <b>bright</b> & clear, with clr."
    )
    assert "head_profiles(...)" in text  # the base's methods first
    assert "Shine &lt;b&gt;bright&lt;/b&gt; &amp; clear" in page and "<b>" not in page
    assert "ds.mine: Mine: mine &lt;b&gt;only&lt;/b&gt;." in page
