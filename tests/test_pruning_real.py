"""The pruning study on a real offline model: ``attncoda prune smollm2-135m --quick`` end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest

from conftest import need

torch = pytest.importorskip("torch")
from attncoda.cli import main  # noqa: E402
from attncoda.hooks import assets  # noqa: E402
from attncoda.hooks import gates as G  # noqa: E402
from attncoda.hooks.evaluate import perplexity, text_windows, tokens_sha256  # noqa: E402
from attncoda.hooks.prune import novel_text  # noqa: E402
from attncoda.hooks.scores import SCORES  # noqa: E402

pytestmark = pytest.mark.real


def test_quick_prune_on_smollm2(tmp_path, capsys):
    need("smollm2-135m", "austen", "mobydick")
    out = tmp_path / "smollm2"
    # one fraction, not --quick's two: every score still prunes and is evaluated (~10 CPU-s less)
    argv = ["prune", "smollm2-135m", "--quick", "--fractions", "0.1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "sink_share" in printed.out and "%" in printed.err  # the table and the progress bar
    with open(out / "perplexity.csv") as fh:
        rows = list(csv.DictReader(fh))
    meta = json.loads((out / "meta.json").read_text())
    # the recorded command reproduces the run: --quick, and the fraction it did not imply
    assert meta["command"] == f"attncoda prune smollm2-135m --out {out} --fractions 0.1 --quick"
    assert meta["ks"] == [0, 27] and meta["n_units"] == 270
    assert {r["score"] for r in rows} == {"none", *SCORES}
    assert len(rows) == 3 * (1 + len(SCORES))  # Emma (calibration), Moby-Dick, P&P
    assert all(math.isfinite(float(r["perplexity"])) for r in rows)
    assert (out / "perplexity_vs_heads.png").stat().st_size > 10_000

    # the unpruned perplexity is the model's own loss on the very same tokens
    model, tokenizer = assets.load_model("smollm2-135m")
    windows = {}  # each novel tokenised once (2 CPU-s a novel)
    for corpus in ("mobydick", "prideprejudice"):
        ids = windows[corpus] = text_windows(tokenizer, novel_text(corpus), window=128, n_windows=1)
        assert meta["evaluation"][corpus]["tokens_sha256"] == tokens_sha256(ids)
        with torch.no_grad():
            loss = float(model(input_ids=ids, labels=ids).loss)
        (base,) = [r for r in rows if r["score"] == "none" and r["corpus"] == corpus]
        assert math.isclose(float(base["perplexity"]), math.exp(loss), rel_tol=1e-4)

    # a pruned row is reproduced by gates directly
    (row,) = [
        r for r in rows if r["score"] == "gradient" and r["k"] == "27" and r["corpus"] == "mobydick"
    ]
    plan: dict[int, list[int]] = {}
    for part in row["pruned"].split(";"):
        layer, heads = part[1:].split(":")
        plan[int(layer)] = [int(h) for h in heads.split(",")]
    assert sum(len(h) for h in plan.values()) == 27
    with G.gates(model, plan):
        again = perplexity(model, windows["mobydick"]).value
    assert math.isclose(float(row["perplexity"]), again, rel_tol=1e-4)


def test_prune_refuses_an_encoder(capsys):
    need("minilm-l6")
    assert main(["prune", "minilm-l6", "--quick", "-q"]) == 2
    assert "not a causal language model" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["persuasion", "genesis"])
def test_the_wider_texts_start_at_their_first_words_and_hold_the_windows(name):
    """The texts ``run --wider`` adds (issue 28) start where TEXT_STARTS says, with no front
    matter, and are long enough for the evidence protocol's eight 512-token windows."""
    from attncoda.hooks.prune import TEXT_STARTS

    corpus, _, start = TEXT_STARTS[name]
    need(corpus)
    text = novel_text(name)
    assert text.startswith(start)
    assert len(text.split()) > 8 * 512  # a token is rarely less than a word here
