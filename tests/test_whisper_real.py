"""Whisper base from the offline assets, on the espeak-ng speech corpus: transcription, capture of
the encoder, decoder and cross-attention against eager, generate(); and the docs' tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need

torch = pytest.importorskip("torch")
from attncoda.hooks import assets, capture, zoo  # noqa: E402
from attncoda.hooks.assets import transcribe  # noqa: E402
from attncoda.hooks.evaluate import word_error_rate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Highest WER per clip; measured 0.13-0.40 (docs/whisper.md), espeak-ng 1.51.
MAX_WER, MAX_MEAN_WER = 0.5, 0.3


def test_the_docs_tables_are_those_of_the_committed_results():
    proc = subprocess.run(
        [sys.executable, "-m", "case_studies.whisper_sinks", "table", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((ROOT / "docs" / "results" / "whisper-sinks.json").read_text())
    assert {c["name"] for c in result["clips"]} == {f"emma-ch{c}" for c in "i ii iii iv v".split()}


@pytest.fixture(scope="module")
def whisper():
    need("whisper-base", "austen-speech")
    model, processor = zoo.load("whisper-base")
    return model, processor, assets.load_speech("austen-speech")


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.xdist_group("whisper-base")
def test_transcription_of_the_speech_corpus_is_close_to_the_text(whisper):
    model, processor, clips = whisper
    wers = {}
    for name, (audio, text) in clips.items():
        wers[name] = word_error_rate(text, transcribe(model, processor, audio))
    print("WER", {k: round(v, 2) for k, v in wers.items()})
    assert max(wers.values()) <= MAX_WER, wers
    assert np.mean(list(wers.values())) <= MAX_MEAN_WER, wers


@pytest.mark.real
@pytest.mark.xdist_group("whisper-base")
def test_the_teacher_forced_batch_is_a_clip_the_prompt_and_its_text(whisper):
    """One helper builds Whisper's teacher-forced inputs (CLI capture, case study, tests): the
    clip's features, then the four prompt tokens, then the text's tokens, cut and cast on demand."""
    model, processor, clips = whisper
    audio, text = clips["emma-chi"]
    batch = assets.teacher_forced_batch(processor, audio, f"  {text}\n")
    ids = batch["decoder_input_ids"][0].tolist()
    tok = processor.tokenizer
    prompt = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    assert "".join(prompt) == assets.WHISPER_PROMPT
    assert ids[:4] == tok.convert_tokens_to_ids(prompt) == [50258, 50259, 50359, 50363]
    assert tok.decode(ids[4:]) == text.strip() and len(ids) > 10
    feats = batch["input_features"]
    assert feats.shape == (1, model.config.num_mel_bins, 3000) and feats.dtype == torch.float32
    short = assets.teacher_forced_batch(processor, audio, text, max_tokens=6, dtype=torch.float16)
    assert short["decoder_input_ids"].tolist() == [ids[:6]]
    assert short["input_features"].dtype == torch.float16
    assert torch.equal(short["input_features"], feats.half())


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.xdist_group("whisper-base")
def test_capture_of_every_stack_equals_eager_and_outputs_do_not_move(whisper):
    model, processor, clips = whisper
    audio, text = clips["emma-chiii"]
    batch = assets.teacher_forced_batch(processor, audio, text)
    layers = {"encoder": [0, 5], "decoder": None, "cross": None}
    heads = {"encoder": [0, 7], "decoder": None, "cross": None}
    queries = {"encoder": slice(0, 64), "decoder": None, "cross": None}
    with torch.no_grad():
        before = model(**batch).logits
        with capture(model, what="rows", layers=layers, heads=heads, queries=queries) as cap:
            during = model(**batch).logits
        model.set_attn_implementation("eager")
        try:
            ref = model(**batch, output_attentions=True)
        finally:
            model.set_attn_implementation("sdpa")
    # logits of magnitude ~10 after 12 layers: fp32 rounding (4.6e-5 measured)
    np.testing.assert_allclose(during.numpy(), before.numpy(), atol=1e-4)
    got = cap.datasets
    enc = np.stack([ref.encoder_attentions[i][:, [0, 7], :64].numpy() for i in (0, 5)], axis=1)
    np.testing.assert_allclose(np.exp(got["encoder"].log_attn.values), enc, atol=1e-5)
    for stack, weights in (("decoder", ref.decoder_attentions), ("cross", ref.cross_attentions)):
        want = np.stack([w.numpy() for w in weights], axis=1)
        np.testing.assert_allclose(np.exp(got[stack].log_attn.values), want, atol=1e-5)
    assert got["cross"].sizes["key"] == 1500  # the audio frames


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.xdist_group("whisper-base")
def test_generate_captures_cross_attention_of_every_step(whisper):
    model, processor, clips = whisper
    audio, _ = clips["emma-chiv"]
    feats = processor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad(), capture(model, what="summaries", layers={"cross": [5]}) as cap:
        out = model.generate(feats, language="en", task="transcribe", max_new_tokens=30)
    ds = cap.datasets["cross"]
    # a query per decoder position fed, the forced prompt included (exactness per step:
    # tests/test_capture_stacks.py); summaries have no key dim, the source is 1500 positions
    assert ds.sizes["query"] >= out.shape[1] and ds.sizes["position"] == 1500
    assert np.isfinite(ds.sink_share.values).all()


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.xdist_group("whisper-base")
def test_the_cli_captures_every_stack_of_a_clip_and_explores_its_cross_attention(tmp_path):
    """`attncoda capture whisper-base --corpus austen-speech` writes one file per stack; the
    explorer of the cross-attention file shows the transcript down the side and the audio
    frames, labelled by their time, along the top."""
    import re

    import attncoda as ac
    from attncoda.cli import main

    need("whisper-base", "austen-speech")
    out = tmp_path / "w.nc"
    argv = ["capture", "whisper-base", "--corpus", "austen-speech:emma-chi", "--what", "rows"]
    argv += ["--layers", "5", "--heads", "0", "--out", str(out), "-q"]
    assert main(argv) == 0
    files = {s: tmp_path / f"w.{s}.nc" for s in ("encoder", "decoder", "cross")}
    got = {s: ac.load(p) for s, p in files.items()}
    assert {s: ds.attrs["attention_stack"] for s, ds in got.items()} == {s: s for s in files}
    cross = got["cross"]
    assert cross.sizes["key"] == 1500 and cross.sizes["query"] == got["decoder"].sizes["query"]
    assert cross["token"].values[0, :2].tolist() == ["0.00s", "0.02s"]
    words = "".join(cross["query_token"].values[0].tolist())
    assert words.startswith("<|startoftranscript|>") and "Emma Woodhouse" in words
    page = tmp_path / "cross.html"
    assert main(["explore", str(files["cross"]), "--out", str(page)]) == 0
    block = re.search(r'id="acx-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S)
    meta = json.loads(block.group(1))  # type: ignore[union-attr]
    assert meta["cross"] is True and meta["tokens"][0][1] == "0.02s"
    assert meta["query_tokens"][0][4:7] == ["Em", "ma", " Wood"]
