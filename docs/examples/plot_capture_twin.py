"""
Capturing attention from a model
================================

:func:`attncoda.hooks.capture` records per-row summaries (and, if asked, fp32 rows) while the
model runs, without switching it away from SDPA. Here on a tiny randomly initialised Llama twin
(built from a config in well under a second; the same code works on any HuggingFace model).
"""

import torch

import attncoda as ac
from attncoda.hooks import capture, zoo

model = zoo.tiny_twin("llama")
batch = zoo.tiny_batch(model, batch=3, length=16)

with torch.no_grad(), capture(model, what="both") as cap:
    model(**batch)
ds = cap.dataset
print(ds)

# %%
# Summaries have dims ``sample, layer, head, query``; rows add ``key``. The sink of each sample
# is its first valid key (``sink_index``).
profiles = ds.coda.head_profiles()
print(profiles.sink_share.round(3).to_pandas())

# %%
# The mean sink share of every head, and the rows of one head: the sink share of each query and
# the renormalised content of its row.
grid = ac.plot_sink_grid(ds, title="tiny llama twin: mean sink share")
rows = ac.plot_rows(ds, layer=1, head=0)
