"""
Why does entropy fall? Sink growth vs content sharpening
========================================================

:func:`attncoda.attribute_entropy` splits the change of each row's entropy between two states
(two layers here; two checkpoints or a plug-in off and on elsewhere) into the part due to the
sink share and the part due to the content entropy, exactly (the two-player Shapley value of
:math:`H = H_b(s) + (1 - s) H(\\hat c)`).
"""

import numpy as np

import attncoda as ac

# sink logits grow with depth: later layers park more mass on the sink
sink_logits = np.linspace(-2, 4, 4)[:, None] + np.zeros((4, 3))
ds = ac.testing.synthetic_rows(
    n_samples=4, n_layers=4, n_heads=3, length=16, sink_logits=sink_logits
)
att = ac.attribute_entropy(ds, along="layer")
print(att[["total", "sink", "content"]].mean("head").to_pandas().round(3))
assert float(abs(att.sink + att.content - att.total).max()) < 1e-12

# %%
# Per layer transition: orange is the part of the change due to the sink share, blue the part
# due to the content entropy, the black mark the total.
bars = ac.plot_entropy_attribution(att)
