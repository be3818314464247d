"""MPNet against MiniLM: where the two sentence encoders put their sinks.

``python -m case_studies.encoder_sinks run`` captures the rows of ``mpnet-base`` and
``minilm-l6`` over the first 256 tokens of *Emma* (the text of the real-model tables: the first
twelve paragraphs of at least 40 words, truncated by the tokenizer, so that both special tokens,
``<s> ... </s>`` and ``[CLS] ... [SEP]``, are in the row) and writes
``docs/results/encoder-sinks.json`` (with its provenance); ``table`` renders the
``encoder-sinks`` block of ``docs/capture.md`` from that file, and ``table --check`` exits 1 when
the block differs from what the file gives (``tests/test_encoder_sinks.py`` runs it). A run takes
about 20 CPU-s.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from case_studies._study import ROOT, Provenance, fixed, markdown_table, write_text

MODELS = ("minilm-l6", "mpnet-base")
LENGTH = 256
RESULT = ROOT / "docs" / "results" / "encoder-sinks.json"
DOC = ROOT / "docs" / "capture.md"
BLOCK = "encoder-sinks"


def emma() -> str:
    from attncoda.hooks import assets

    text = assets.load_text("austen", "emma")
    return " ".join(assets.paragraphs(text, min_words=40)[:12])


def measure(name: str, text: str, prov: Provenance) -> dict[str, Any]:
    """Per layer: the attention share of the first and of the last key (means over heads and
    queries) and which key gets the most attention (mean over heads and queries)."""
    import torch

    from attncoda.hooks import assets, capture

    prov.asset(name)
    model, tokenizer = assets.load_model(name)
    enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=LENGTH)
    batch = {k: enc[k] for k in ("input_ids", "attention_mask")}
    ids = batch["input_ids"][0]
    if ids.shape[0] != LENGTH:
        raise SystemExit(f"the text gives {ids.shape[0]} tokens under {name}, not {LENGTH}")
    prov.tokens(f"{name}/emma", batch["input_ids"])
    with torch.no_grad(), capture(model, what="rows") as cap:
        model(**batch)
    rows = np.exp(cap.dataset.log_attn.values[0].astype(np.float64))  # layer, head, query, key
    mean = rows.mean(axis=(1, 2))  # layer, key
    top = mean.argmax(axis=-1)
    last = LENGTH - 1
    return {
        "first_token": tokenizer.convert_ids_to_tokens([int(ids[0])])[0],
        "end_token": tokenizer.convert_ids_to_tokens([int(ids[last])])[0],
        "first_share": [round(float(v), 4) for v in mean[:, 0]],
        "end_share": [round(float(v), 4) for v in mean[:, last]],
        "top_key": ["first" if k == 0 else "end" if k == last else "other" for k in top],
        "capture_path": cap.dataset.attrs.get("capture_path", ""),
    }


def run() -> int:
    text = emma()
    prov = Provenance("encoder-sinks", "run", command="python -m case_studies.encoder_sinks run")
    prov.asset("austen")
    models = {name: measure(name, text, prov) for name in MODELS}
    out = {"tokens": LENGTH, "text": "Emma, first 12 paragraphs of >= 40 words", "models": models}
    out["provenance"] = prov.as_dict()
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    write_text(RESULT, json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return table(check=False)


def _triple(values: Sequence[float]) -> str:
    v = np.asarray(values)
    return f"{fixed(v.mean(), 2)} / {fixed(v[len(v) // 2 :].mean(), 2)} / {fixed(v.max(), 2)}"


def render(result: dict[str, Any]) -> str:
    """The ``encoder-sinks`` table: a summary row and a per-layer row for each model."""
    rows = []
    for name, m in result["models"].items():
        top = m["top_key"]
        rows.append(
            [
                f"`{name}`",
                f"{len(top)}",
                f"`{m['first_token']}`: {_triple(m['first_share'])}",
                f"`{m['end_token']}`: {_triple(m['end_share'])}",
                f"{top.count('first')} / {top.count('end')} / {top.count('other')}",
            ]
        )
    summary = markdown_table(
        [
            "model",
            "layers",
            "first token: share mean / last half / peak",
            "end token: share mean / last half / peak",
            "top key is first / end / other (layers)",
        ],
        rows,
    )
    per_layer = markdown_table(
        ["model", "key", "share by layer, from layer 0"],
        [
            [
                f"`{name}`",
                f"`{m[key + '_token']}`",
                " ".join(f"{fixed(v, 2)}" for v in m[key + "_share"]),
            ]
            for name, m in result["models"].items()
            for key in ("first", "end")
        ],
    )
    return summary + "\n\n" + per_layer + "\n"


def _block(text: str) -> re.Match[str]:
    m = re.search(rf"^<!-- table: {BLOCK} -->\n(.*?)^<!-- /table -->$", text, re.S | re.M)
    if m is None:
        raise SystemExit(f"{DOC.relative_to(ROOT)} has no <!-- table: {BLOCK} --> block")
    return m


def table(*, check: bool) -> int:
    result = json.loads(RESULT.read_text(encoding="utf-8"))
    text = DOC.read_text(encoding="utf-8")
    m = _block(text)
    want = render(result)
    if m.group(1) == want:
        return 0
    if check:
        print(
            f"{DOC.relative_to(ROOT)}: the {BLOCK} table differs from {RESULT.name}; run "
            "python -m case_studies.encoder_sinks table",
            file=sys.stderr,
        )
        return 1
    write_text(DOC, text[: m.start(1)] + want + text[m.end(1) :])
    print(f"rendered {BLOCK} in {DOC.relative_to(ROOT)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m case_studies.encoder_sinks", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="measure both models and rewrite the result file and the table")
    tab = sub.add_parser("table", help="render the table from the committed result file")
    tab.add_argument("--check", action="store_true", help="exit 1 when the table is stale")
    args = parser.parse_args(argv)
    return run() if args.command == "run" else table(check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
