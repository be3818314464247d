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
