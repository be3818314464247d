"""The ARACH attention audit (attncoda.hooks.arach_audit) on a twin: exact identities of the
three-group decomposition and entropy attribution, and agreement with a plain capture."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda.hooks import arach, capture  # noqa: E402
from attncoda.hooks.arach_audit import audit, audit_findings  # noqa: E402

NEG_INF = float("-inf")


def ids_for(model, batch=2, length=12, seed=0, **kw):
    return zoo.tiny_batch(model, batch=batch, length=length, seed=seed, **kw)


def test_audit_identities_on_a_twin():
    model = zoo.tiny_twin("llama")
    ids = [ids_for(model, batch=1, length=10, seed=s)["input_ids"] for s in (0, 1)]
    ds = audit(model, ids, arach=arach.Arach(model, offset=0.0))
    assert dict(ds.sizes) == {"layer": 2, "head": 4, "group": 3}
    total = ds.dH_between + ds.dH_within.sum("group")
    np.testing.assert_allclose(total.values, ds.dH_total.values, atol=1e-9)
    np.testing.assert_allclose(
        (ds.entropy_on - ds.entropy_off).values, ds.dH_total.values, atol=1e-9
    )
    np.testing.assert_allclose(ds.shares_on.sum("group").values, 1.0, atol=1e-9)
    assert float(ds.hub_on.min()) > 0 and float(ds.shares_off.sel(group="hub").max()) == 0
    # the sink share off is what a plain summaries capture reports
    sums = []
    for x in ids:
        with capture(model, what="summaries") as cap, torch.no_grad():
            model(input_ids=x)
        sums.append(cap.dataset.sink_share.values[0, :, :, 1:].mean(-1))
    np.testing.assert_allclose(ds.sink_off.values, np.mean(sums, axis=0), atol=1e-5)
    # hubs invisible: nothing moves
    flat = audit(model, ids[:1], arach=arach.Arach(model, offset=NEG_INF))
    np.testing.assert_allclose(flat.hub_on.values, 0.0, atol=1e-12)
    np.testing.assert_allclose(flat.dH_total.values, 0.0, atol=1e-5)
    findings = audit_findings(ds)
    assert findings["strongest_sink_layer"] in (0, 1)
