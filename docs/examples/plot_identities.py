"""
The two identities, on three rows
=================================

A row of attention is a composition. Split it into the sink share :math:`s` and the content
subcomposition :math:`\\hat c = c / (1 - s)`; then

- :math:`H(x) = H_b(s) + (1 - s) H(\\hat c)` (entropy), and
- :math:`d_A^2(x, y) = (b_x - b_y)^2 + d_A^2(\\hat c_x, \\hat c_y)` (Aitchison distance).

Three rows with the same content pattern and growing sink share show why a one-number summary
mixes two questions: their entropy falls, yet their content is identical.
"""

import numpy as np
from matplotlib.figure import Figure

import attncoda as ac

content = np.array([0.5, 0.3, 0.15, 0.05])  # the same content pattern in every row
rows = np.stack([np.concatenate([[s], (1 - s) * content]) for s in (0.1, 0.5, 0.9)])
d = ac.decompose(rows)

print("sink share      ", d.sink_share.round(3))
print("entropy H(x)    ", ac.entropy(rows).round(3))
print("content entropy ", d.content_entropy.round(3), "(identical: same content)")

# %%
# The entropy identity holds row by row.
split_h = ac.binary_entropy(d.sink_share) + (1 - d.sink_share) * d.content_entropy
assert np.allclose(split_h, ac.entropy(rows), atol=1e-12)

# %%
# The Aitchison distance between the first and the last row is all sink term: their content
# subcompositions are equal, so the content term is zero.
split = ac.aitchison_split(rows[0], rows[2])
print(
    f"d_A^2 = {float(split.total):.4f} = sink {float(split.sink):.4f} + content "
    f"{float(split.content):.2e}"
)
assert np.isclose(split.total, ac.aitchison_distance(rows[0], rows[2]) ** 2)

# %%
# The entropy of each row as its two channels: the binary entropy of the sink share and the
# content entropy weighted by the mass left for content.
fig = Figure(figsize=(5.5, 3.2), layout="constrained")
ax = fig.add_subplot()
x = np.arange(3)
ax.bar(x, d.binary_entropy, color="tab:orange", label="sink channel $H_b(s)$")
ax.bar(
    x,
    (1 - d.sink_share) * d.content_entropy,
    bottom=d.binary_entropy,
    color="tab:blue",
    label=r"content channel $(1-s)H(\hat c)$",
)
ax.set_xticks(x, [f"s = {s:.1f}" for s in d.sink_share])
ax.set_ylabel("entropy (nats)")
ax.set_title("same content, growing sink: entropy falls")
ax.legend(fontsize=8)
