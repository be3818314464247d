"""Where Whisper base puts its attention sinks: measure (``run``) and render the docs' tables.

``python -m case_studies.whisper_sinks run`` speaks nothing itself: it reads the ``austen-speech``
corpus (``attncoda fetch austen-speech whisper-base``), transcribes each clip greedily, then runs
the decoder teacher-forced on the prompt ``<|startoftranscript|><|en|><|transcribe|>
<|notimestamps|>`` and the reference text, captures summaries of every stack (sink = the first
key: audio frame 0 for the encoder and cross-attention, ``<|startoftranscript|>`` for the
decoder) and cross-attention rows, and writes ``docs/results/whisper-sinks.json``.
``python -m case_studies.whisper_sinks table [--check]`` renders the tables of ``docs/whisper.md`` from
that file (``--check`` exits 1 when the page differs; ``tests/test_whisper_real.py`` runs it).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from case_studies._study import ROOT, Provenance, fixed, write_text

RESULT = ROOT / "docs" / "results" / "whisper-sinks.json"
PAGE = ROOT / "docs" / "whisper.md"


def run() -> dict[str, Any]:
    import numpy as np
    import torch

    from attncoda.hooks import assets, capture
    from attncoda.hooks.assets import teacher_forced_batch, transcribe
    from attncoda.hooks.evaluate import word_error_rate

    prov = Provenance("whisper-sinks", "run", command="python -m case_studies.whisper_sinks run")
    prov.asset("whisper-base")
    prov.asset("austen-speech")

    torch.manual_seed(0)
    model, processor = assets.load_model("whisper-base")
    clips = assets.load_speech("austen-speech")
    per_clip, shares = [], {"encoder": [], "decoder": [], "cross": []}
    peaks: list[list[int]] = []
    tops: list[list[bool]] = []  # per clip, per decoder layer
    for name, (audio, text) in clips.items():
        hyp = transcribe(model, processor, audio)
        batch = teacher_forced_batch(processor, audio, text)
        dec = batch["decoder_input_ids"]
        prov.tokens(f"whisper-base/{name}", dec)
        with torch.no_grad(), capture(model, what="summaries") as cap:
            model(**batch)
        for stack, ds in cap.datasets.items():
            # mean over heads and queries (the decoder's query 0 sees only its sink: left out)
            s = ds.sink_share.values[0]
            if stack == "decoder":
                s = s[:, :, 1:]
            shares[stack].append(s.mean(axis=(1, 2)))
        with torch.no_grad(), capture(
            model, what="rows", layers={"decoder": None, "cross": None}
        ) as cap:  # fmt: skip
            model(**batch)
        rows = np.exp(cap.datasets["cross"].log_attn.values[0])  # layer, head, query, key
        own = np.exp(cap.datasets["decoder"].log_attn.values[0].astype(np.float64))
        half = own.shape[-1] // 2  # the later queries' mean over heads: is the sink their top key?
        tops.append((own[:, :, half:, :half].mean(axis=(1, 2)).argmax(-1) == 0).tolist())
        seconds = len(audio) / 16_000
        frames = round(seconds / 0.02)  # 20 ms an encoder position
        peaks.append(
            [int(np.argmax(rows[layer].mean(axis=(0, 1)))) for layer in range(rows.shape[0])]
        )
        per_clip.append(
            {
                "name": name,
                "text": text.strip(),
                "transcription": hyp,
                "wer": round(word_error_rate(text, hyp), 4),
                "seconds": round(seconds, 3),
                "speech_frames": frames,
                "decoder_tokens": int(dec.shape[1]),
            }
        )
    layers = len(shares["encoder"][0])
    result = {
        "model": "whisper-base",
        "corpus": "austen-speech",
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "clips": per_clip,
        "sink_share": {
            stack: [round(float(np.mean([v[layer] for v in vals])), 4) for layer in range(layers)]
            for stack, vals in shares.items()
        },
        "cross_peak_key": [[p[layer] for p in peaks] for layer in range(layers)],
        # decoder layers whose later queries' top key is <|startoftranscript|> in most clips
        "decoder_sink_top": [
            int(sum(t[layer] for t in tops) * 2 > len(tops)) for layer in range(layers)
        ],
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }
    result["provenance"] = prov.as_dict()
    RESULT.parent.mkdir(exist_ok=True)
    write_text(RESULT, json.dumps(result, indent=1) + "\n")
    return result


def tables(result: dict[str, Any]) -> dict[str, str]:
    sinks = [
        "| layer | encoder (frame 0) | decoder (`<\\|startoftranscript\\|>`) | cross (frame 0) | cross: key with most attention, per clip |",
        "|---|---|---|---|---|",
    ]
    s = result["sink_share"]
    for layer in range(len(s["encoder"])):
        peak = ", ".join(str(k) for k in result["cross_peak_key"][layer])
        sinks.append(
            f"| {layer} | {fixed(s['encoder'][layer], 3)} | {fixed(s['decoder'][layer], 3)} | "
            f"{fixed(s['cross'][layer], 3)} | {peak} |"
        )
    clips = ["| clip | seconds (frames) | text | transcription | WER |", "|---|---|---|---|---|"]
    for c in result["clips"]:
        clips.append(
            f"| {c['name']} | {fixed(c['seconds'], 1)} ({c['speech_frames']}) | {c['text']} | "
            f"{c['transcription']} | {fixed(c['wer'], 2)} |"
        )
    return {"whisper-sinks": "\n".join(sinks), "whisper-transcriptions": "\n".join(clips)}


README = ROOT / "README.md"


def readme_row(result: dict[str, Any]) -> str:
    """Whisper's row of the README's real-models table: its decoder's sink, the first token."""
    from attncoda.hooks import assets, zoo

    entry, asset = zoo.get_entry("whisper-base"), assets.get_asset("whisper-base")
    share = result["sink_share"]["decoder"]
    n = len(share)
    size = (
        f"{fixed(result['parameters'] / 1e6, 0)}M params, {entry.layers}+{entry.layers} layers "
        f"(encoder + decoder), {entry.heads} heads ({entry.kv_heads} KV)"
    )
    sink = (
        f"`<\\|startoftranscript\\|>` (decoder position 0; top key in "
        f"{sum(result['decoder_sink_top'])}/{n} layers)"
    )
    summary = f"{fixed(sum(share) / n, 2)} / {fixed(sum(share[n // 2 :]) / (n - n // 2), 2)} / {fixed(max(share), 2)}"
    fetch = f"`{asset.fetch_command}` ({fixed(asset.download_size / 1e6, 0, thousands=True)} MB)"
    return f"| `whisper-base` | {entry.family} | {size} | {sink} | {summary} | {fetch} |"


def render_readme(text: str, result: dict[str, Any]) -> str:
    """The README with Whisper's row last in its real-models block (written or replaced)."""
    start = text.index("<!-- table: real-models -->")
    end = text.index("<!-- /table -->", start)
    lines = [ln for ln in text[start:end].splitlines() if not ln.startswith("| `whisper-base` |")]
    return text[:start] + "\n".join([*lines, readme_row(result)]) + "\n" + text[end:]


def render(page: str, result: dict[str, Any]) -> str:
    for name, body in tables(result).items():
        start, end = f"<!-- table: {name} -->", "<!-- /table -->"
        i = page.index(start) + len(start)
        j = page.index(end, i)
        page = page[:i] + "\n" + body + "\n" + page[j:]
    return page


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        run()
    elif argv[:1] != ["table"]:
        print("usage: python -m case_studies.whisper_sinks run | table [--check]", file=sys.stderr)
        return 2
    result = json.loads(RESULT.read_text(encoding="utf-8"))
    stale = []
    for path, make in ((PAGE, render), (README, render_readme)):
        old = path.read_text(encoding="utf-8")
        new = make(old, result)
        if new != old:
            stale.append(path.name)
            if "--check" not in argv:
                write_text(path, new)
    if stale and "--check" in argv:
        print(
            f"{', '.join(stale)} differ from {RESULT}: run `python -m case_studies.whisper_sinks table`"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
