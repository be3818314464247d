"""The ARACH claim study's new pieces on tiny twins and generated text: unfiltered cloze items
with their in-context flag, batched cloze scoring equal to one-by-one scoring, and resumable
cells (a rerun skips complete cells and redoes a damaged or stale one)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import attncoda as ac
from attncoda.hooks import arach, zoo
from attncoda.hooks.evaluate import cloze_accuracy, cloze_items
from case_studies.arach import claims
from conftest import need

WORDS = "alpha beta gamma delta river meadow harbour lantern".split()


def _text(seed: int, n: int = 600) -> str:
    """Generated prose: sentences of random words, so some targets repeat in their context and
    some do not."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ws = rng.choice(WORDS, size=rng.integers(3, 7)).tolist()
        out.append(" ".join(["The", *ws]) + ".")
    return " ".join(out)


class _WordTok:
    """A whitespace tokenizer over the tiny twins' vocabulary (ids 4..99); no special tokens."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        ids = [4 + (sum(map(ord, w)) % 96) for w in text.split()]
        return type("Enc", (), {"input_ids": ids})()


def test_unfiltered_items_keep_targets_missing_from_their_context_and_flag_them():
    texts = {"a": _text(0), "b": _text(1)}
    every = cloze_items(texts, n=200, window=12, require_in_context=False)
    flags = [it.in_context for it in every]
    assert any(flags) and not all(flags)  # the draw holds both kinds
    for it in every:  # the flag is exactly "target among the context's words"
        bare = {w.strip(".").lower() for w in it.context.split()}
        assert it.in_context == (it.target.lower() in bare)
    filtered = cloze_items(texts, n=50, window=12)
    assert all(it.in_context for it in filtered)
    # the default (filtered) draw is unchanged by the new option
    assert filtered == cloze_items(texts, n=50, window=12, require_in_context=True)
    # deterministic
    assert every == cloze_items(texts, n=200, window=12, require_in_context=False)


@pytest.mark.parametrize("wrapper", [False, True])
def test_batched_cloze_scores_equal_one_by_one_scores(wrapper):
    model = zoo.tiny_twin("llama")
    items = cloze_items({"a": _text(2)}, n=12, window=9, require_in_context=False)
    hub = arach.Arach(model, offset=-0.5) if wrapper else None
    tok = _WordTok()
    batched = cloze_accuracy(model, tok, items, wrapper=hub, batch_size=5)
    single = cloze_accuracy(model, tok, items, wrapper=hub, batch_size=1)
    np.testing.assert_allclose(batched.target_logprob, single.target_logprob, atol=1e-4)
    assert np.array_equal(batched.correct, single.correct)


# ------------------------------------------------------------------------------ resumable cells

PLAN = claims.ClaimPlan(
    cloze_per_source=3, cloze_window=9, ppl_tokens=64, context=32, long_context=None, n_boot=50
)
CONFIGS = (claims.Config(), claims.Config(-0.5, "same"), claims.Config(-1.0, "none"))


def _corpora(source: str) -> dict[str, str]:
    return {f"{source}-{i}": _text(10 * i + len(source)) for i in range(2)}


def _run(root: Path, **kwargs):
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    tok.pad_token_id = 0
    return claims.run_claims(
        "twin",
        root,
        plan=PLAN,
        configs=CONFIGS,
        progress=None,
        load_model=lambda _name: (model, tok),
        texts=_corpora,
        **kwargs,
    )


def test_cells_resume_skip_complete_ones_and_redo_damaged_or_stale_ones(tmp_path):
    root = tmp_path / "claims"
    n_cells = len(CONFIGS) * (len(claims.PPL_TEXTS) + len(claims.CLOZE_SOURCES))
    assert _run(root, time_limit_s=0.0) == {"done": 0, "skipped": 0, "left": n_cells}
    first = _run(root)
    assert first == {"done": n_cells, "skipped": 0, "left": 0}
    cells = sorted(root.glob("twin/*/*.json"))
    assert len(cells) == n_cells
    kept = {p: p.read_text() for p in cells}
    assert _run(root) == {"done": 0, "skipped": n_cells, "left": 0}
    assert {p: p.read_text() for p in cells} == kept  # untouched
    # a cell cut short (a crash mid-write cannot leave one: writes are atomic; a damaged disk can)
    damaged = claims.cell_path(root, "twin", CONFIGS[1], "cloze-mobydick")
    damaged.write_text(kept[damaged][:40])
    # a stale cell: made from other tokens
    stale = claims.cell_path(root, "twin", CONFIGS[2], "ppl-wikipedia")
    cell = json.loads(kept[stale])
    cell["tokens_sha256"] = "0" * 64
    stale.write_text(json.dumps(cell))
    assert _run(root) == {"done": 2, "skipped": n_cells - 2, "left": 0}
    # redone from the same tokens: the same numbers
    for p in (damaged, stale):
        assert json.loads(p.read_text())["values"] == json.loads(kept[p])["values"]


def test_two_shards_share_the_cells_and_an_unsharded_rerun_finds_none_left(tmp_path):
    from case_studies._study import Shard

    root = tmp_path / "claims"
    n_cells = len(CONFIGS) * (len(claims.PPL_TEXTS) + len(claims.CLOZE_SOURCES))
    first = _run(root, shard=Shard(2, 2))
    assert first == {
        "done": n_cells // 2,
        "skipped": 0,
        "left": 0,
        "other_shards": n_cells - n_cells // 2,
    }
    second = _run(root, shard=Shard(1, 2))
    assert second == {
        "done": n_cells - n_cells // 2,
        "skipped": n_cells // 2,
        "left": 0,
        "other_shards": 0,
    }
    assert len(list(root.glob("twin/*/*.json"))) == n_cells
    assert _run(root) == {"done": 0, "skipped": n_cells, "left": 0}


def test_the_issue_list_completes_before_the_sweep_starts(tmp_path):
    # a stopped run must leave the core configurations whole (perplexity and cloze), not every
    # configuration's perplexity and no cloze at all
    sweep_only = claims.Config(-3.0, "same")
    assert sweep_only not in claims.CORE_CONFIGS
    lines: list[str] = []
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    tok.pad_token_id = 0
    claims.run_claims(
        "twin",
        tmp_path / "claims",
        plan=PLAN,
        configs=(*CONFIGS, sweep_only),
        progress=lines.append,
        load_model=lambda _name: (model, tok),
        texts=_corpora,
    )
    done = [tuple(line.split("] ", 1)[1].split(":")[0].split()[1:]) for line in lines]
    core = [(c, t) for c, t in done if c != sweep_only.name]
    assert done[: len(core)] == core  # the sweep comes last
    kinds = [t.split("-")[0] for _, t in core]
    assert kinds == sorted(kinds, key=["ppl", "cloze"].index)  # perplexity, then cloze
    assert [t.split("-")[0] for c, t in done if c == sweep_only.name] == ["ppl"] * 2 + ["cloze"] * 3


def test_a_file_that_is_not_a_cell_is_never_overwritten(tmp_path):
    root = tmp_path / "claims"
    foreign = claims.cell_path(root, "twin", CONFIGS[0], "ppl-mobydick")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("my notes\n")
    with pytest.raises(ac.OutputExistsError):
        _run(root)
    assert foreign.read_text() == "my notes\n"


def test_summary_pairs_every_configuration_with_the_plain_model(tmp_path):
    root = tmp_path / "claims"
    _run(root)
    rows = claims.summarise(root, n_boot=50)
    measures = {(r["config"], r["measure"]) for r in rows}
    for config in CONFIGS[1:]:
        for m in ("cloze", "cloze-in-context", "ppl-mobydick", "ppl-wikipedia"):
            assert (config.name, m) in measures
    cloze = next(r for r in rows if r["measure"] == "cloze" and r["config"] == "same_b-0.5")
    assert cloze["n"] == 3 * PLAN.cloze_per_source
    ppl = next(r for r in rows if r["measure"] == "ppl-mobydick" and r["config"] == "same_b-0.5")
    assert ppl["blocks"] == PLAN.ppl_tokens // PLAN.context
    assert ppl["low"] <= ppl["diff"] <= ppl["high"]


def test_the_readme_summary_is_built_from_the_cells_and_says_what_is_missing(tmp_path, monkeypatch):
    """The "Result" lines: every number comes from summarise's rows; a model without
    cells says "not run yet"; a missing cell shows as an incomplete claim row, not a gap."""
    monkeypatch.setattr(claims, "CLAIM_MODELS", ("twin", "absent"))
    monkeypatch.setattr(claims, "CORE_CONFIGS", CONFIGS)
    root = tmp_path / "claims"
    _run(root)
    rows = claims.summarise(root, n_boot=50)
    text = claims.claim_summary(rows, claims.load_cells(root))
    twin, absent = text.splitlines()
    assert absent == "- **absent** (0 of 15 cells): not run yet."
    assert twin.startswith("- **twin** (15 of 15 cells): cloze on 9 items: plain ")
    cloze = [r for r in rows if r["measure"] == "cloze"]
    assert f"plain {cloze[0]['off'] * 100:.1f}%" in twin
    assert claims._span(cloze, 100, 1) + " points over 2 of 2 configurations" in twin
    ppl = [r for r in rows if r["measure"] == "ppl-wikipedia"]
    assert f"plain {ppl[0]['off']:.2f}, ARACH − plain {claims._span(ppl, 1, 2)}" in twin
    assert "not complete" not in twin
    claims.cell_path(root, "twin", CONFIGS[2], "cloze-austen").unlink()
    rows = claims.summarise(root, n_boot=50)
    twin = claims.claim_summary(rows, claims.load_cells(root)).splitlines()[0]
    assert "(14 of 15 cells)" in twin and "over 1 of 2 configurations" in twin
    assert twin.endswith("claim rows not complete yet: 1 of 6.")


def test_plans_and_configurations_refuse_bad_values():
    with pytest.raises(ac.InputError, match="ppl_tokens"):
        claims.ClaimPlan(ppl_tokens=10, context=64)
    with pytest.raises(ac.InputError, match="hub_positions"):
        claims.Config(-0.5, "first")
    with pytest.raises(ac.InputError, match="plain model"):
        claims.run_claims("twin", "unused", configs=[claims.Config(-0.5)], load_model=lambda n: 1)
    assert [c.name for c in claims.claim_configs("smollm2-135m")][:5] == [
        "plain",
        "same_b-0.5",
        "none_b-0.5",
        "none_b-1",
        "none_b-2",
    ]
    smol = claims.claim_configs("smollm2-135m")
    assert len(smol) == 1 + 2 * len(claims.SWEEP) + len(claims.SENSITIVITY)
    assert smol[-len(claims.SENSITIVITY) :] == list(claims.SENSITIVITY)
    for bad, match in (
        ({"hub_embedding": "first"}, "hub_embedding"),
        ({"layers": "middle"}, "layers"),
    ):
        with pytest.raises(ac.InputError, match=match):
            claims.Config(-0.5, "same", **bad)
    with pytest.raises(ac.InputError, match="plain"):
        claims.Config(None, hub_embedding="zeros")
    with pytest.raises(ac.InputError, match="multiple of long_context"):
        claims.ClaimPlan(ppl_tokens=3000, context=1000, long_context=2000)
    # the default names stay the claim study's (old cells keep their paths)
    assert claims.Config(-0.5, "same", "token", "all").name == "same_b-0.5"
    assert claims.Config(-0.5, "same", layers="first_half").arach().layers == "first_half"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--stop-after", "-1"],
        ["run", "--stop-after", "nan"],
        ["run", "--time-limit", "-1"],
        ["run", "--time-limit", "inf"],
        ["run", "--models", "minilm-l6"],
    ],
)
def test_the_study_command_refuses_bad_options_before_work(argv, capsys, monkeypatch):
    from case_studies.arach import study

    monkeypatch.setattr(claims, "run_claims", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as exc:
        study.main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.real
def test_the_full_plan_draws_its_items_and_windows_from_the_real_corpora():
    """ClaimPlan(): 400 unfiltered items per source (both kinds present), deterministic; and
    16 windows of 1024 tokens per perplexity text (at least 16k predicted tokens)."""
    need("austen", "mobydick", "wikipedia")
    plan = claims.ClaimPlan()
    items = claims.claim_items(plan)
    assert len(items) == 3 * plan.cloze_per_source >= 1000
    groups = [items[i * 400 : (i + 1) * 400] for i in range(3)]
    assert {it.source for it in groups[1]} == {"mobydick"}
    assert all(it.source != "mobydick" for it in groups[0] + groups[2])
    share = np.mean([it.in_context for it in items])
    assert 0.05 < share < 0.95  # both kinds of item
    assert [(it.source, it.index) for it in items[:5]] == [
        (it.source, it.index) for it in claims.claim_items(plan)[:5]
    ]
    assert claims.ppl_text("mobydick", 100).startswith("Call me Ishmael")
    for name in claims.PPL_TEXTS:
        text = claims.ppl_text(name, plan.ppl_tokens * 8)
        assert len(text.split()) > plan.ppl_tokens // 2  # about 16k tokens need 10k+ words


def test_long_context_and_sensitivity_cells_run_after_the_sweep_and_pair_with_plain(tmp_path):
    """SmolLM2's plan (issue #28): the long-context cells score the same tokens in longer
    windows, the sensitivity configurations run after the sweep, every run writes the cloze
    passages, and the cloze rows resample passages (fewer clusters than items)."""
    plan = claims.ClaimPlan(
        cloze_per_source=3, cloze_window=9, ppl_tokens=64, context=32, long_context=64, n_boot=50
    )
    configs = (claims.Config(), claims.Config(-0.5, "same"), *claims.SENSITIVITY[:1])
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    tok.pad_token_id = 0
    lines: list[str] = []
    root = tmp_path / "claims"
    claims.run_claims(
        "smollm2-135m",
        root,
        plan=plan,
        configs=configs,
        progress=lines.append,
        load_model=lambda _name: (model, tok),
        texts=_corpora,
    )
    done = [tuple(line.split("] ", 1)[1].split(":")[0].split()[1:]) for line in lines]
    sens = claims.SENSITIVITY[0].name
    first_sens = next(i for i, (c, _) in enumerate(done) if c == sens)
    assert all(c != sens for c, _ in done[:first_sens])
    assert ("plain", "ppl64-mobydick") in done[:first_sens]  # the long context before it
    long_cell = json.loads(
        claims.cell_path(root, "smollm2-135m", configs[0], "ppl64-mobydick").read_text()
    )
    short_cell = json.loads(
        claims.cell_path(root, "smollm2-135m", configs[0], "ppl-mobydick").read_text()
    )
    assert (
        len(long_cell["values"]["window_nll"]) == 1 and len(short_cell["values"]["window_nll"]) == 2
    )
    assert (
        json.loads(claims.cell_path(root, "smollm2-135m", configs[2], "ppl-mobydick").read_text())[
            "config"
        ]["hub_embedding"]
        == "zeros"
    )
    passages = claims.read_passages(root, dataclasses.asdict(plan))
    assert passages is not None and all(len(v) == 3 for v in passages.values())
    rows = claims.summarise(root, n_boot=50)
    measures = {(r["config"], r["measure"]) for r in rows}
    assert ("same_b-0.5", "ppl64-wikipedia") in measures and (sens, "cloze") in measures
    cloze = next(r for r in rows if r["measure"] == "cloze" and r["config"] == "same_b-0.5")
    assert cloze["unit"] == "passages"
    assert cloze["blocks"] == len({f"{s}/{p}" for s, v in passages.items() for p in v})
    # without the passages file the bootstrap falls back to items, and says so
    (root / claims.PASSAGES_FILE).unlink()
    cloze = next(r for r in claims.summarise(root, n_boot=50) if r["measure"] == "cloze")
    assert cloze["unit"] == "items" and cloze["blocks"] == cloze["n"]


def test_verdicts_never_call_an_interval_with_zero_worse_and_name_a_nil_change():
    row = {"measure": "ppl-mobydick", "off": 50.0}
    assert claims.verdict({**row, "low": -0.1, "high": 3.0}) == "not resolved: 95% CI includes 0"
    nil = claims.verdict({**row, "low": 0.05, "high": 0.2})
    assert nil.startswith("contradicted") and "practically nil" in nil and "0.4%" in nil
    assert "practically nil" not in claims.verdict({**row, "low": 0.1, "high": 0.6})
    cloze = {"measure": "cloze", "off": 0.2, "low": -0.006, "high": 0.004}
    assert claims.verdict(cloze).startswith("not resolved") and "0.6 points" in claims.verdict(
        cloze
    )
    assert claims._paper("ppl-wikipedia").startswith("none")
    # the paper's numbers are in no source held here: a row cites the direction only (#50)
    assert claims._paper("ppl-mobydick").startswith("PG-19: perplexity down")
    assert claims._paper("cloze").startswith("LAMBADA: accuracy up")
    import re

    assert not re.search(r"\d\.\d", claims._paper("cloze") + claims._paper("ppl-mobydick"))


def test_recheck_recomputes_the_windows_of_modified_tree_cells(tmp_path):
    """A cell marked ``+dirty`` gets its window recomputed at the current code, beside the
    stored value; the README note reports the largest difference."""
    root = tmp_path / "claims"
    _run(root)
    for other in root.glob("twin/*/*.json"):  # clean, whatever state this tree is in
        cell = json.loads(other.read_text())
        other.write_text(json.dumps({**cell, "commit": "1" * 40}))
    path = claims.cell_path(root, "twin", CONFIGS[1], "ppl-wikipedia")
    cell = json.loads(path.read_text())
    cell["commit"] = "0" * 40 + "+dirty"
    path.write_text(json.dumps(cell))
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    tok.pad_token_id = 0
    out = claims.recheck_cells(
        root, "twin", plan=PLAN, load_model=lambda _n: (model, tok), texts=_corpora
    )
    doc = json.loads(out.read_text())
    assert [r["cell"] for r in doc["rows"]] == ["twin/same_b-0.5/ppl-wikipedia"]
    row = doc["rows"][0]
    assert abs(row["recomputed_nll"] - row["stored_nll"]) < 1e-3
    note = claims.provenance_cells_table(claims.load_cells(root), root)
    assert "1 from a modified tree" in note and "Spot check" in note


def test_a_clean_rerun_states_its_agreement_with_each_modified_tree_cell(tmp_path):
    """Cells rerun at a clean commit sit in ``clean-rerun/`` (not read as claim cells), and the
    provenance note says per cell how far they agree with the stored modified-tree cell."""
    config = claims.Config(-0.5, "same")

    def cell(commit, correct, logprob):
        return {
            "model": "m",
            "config": dataclasses.asdict(config),
            "task": "cloze-austen",
            "commit": commit,
            "values": {"correct": correct, "target_logprob": logprob},
        }

    claims._write_cell(
        claims.cell_path(tmp_path, "m", config, "cloze-austen"),
        cell("a" * 40 + "+dirty", [1, 0, 1, 1], [-1.0, -2.0, -0.5, -0.25]),
    )
    assert claims.clean_rerun_note(tmp_path) == ""
    claims._write_cell(
        claims.cell_path(tmp_path / claims.CLEAN_RERUN, "m", config, "cloze-austen"),
        cell("b" * 40, [1, 0, 1, 0], [-1.0, -2.0, -0.5, -0.75]),
    )
    assert len(claims.load_cells(tmp_path)) == 1  # the rerun is not a claim cell
    note = claims.clean_rerun_note(tmp_path)
    assert f"`{'a' * 12}` + changes" in note and f"`{'b' * 12}`" in note
    assert "| accuracy 75.00% | accuracy 50.00% | 1 of 4 items change verdict" in note
    assert "target log-probability 5.0e-01 | no |" in note
    assert (
        "1 of the 1 modified-tree cells (1 of 1 cloze)" in note and "0 of the 1 rerun agree" in note
    )

    # a perplexity cell: perplexity and summed NLL of both, the largest window difference, and
    # agreement within RERUN_RTOL; a modified-tree cell not rerun is named
    def ppl(commit, nll):
        return {
            **cell(commit, [], []),
            "task": "ppl-wikipedia",
            "values": {"window_nll": nll, "window_tokens": [100, 100]},
        }

    for task in ("ppl-wikipedia", "ppl-mobydick"):
        claims._write_cell(
            claims.cell_path(tmp_path, "m", config, task),
            {**ppl("a" * 40 + "+dirty", [200.0, 300.0]), "task": task},
        )
    near = 300.0 * (1 + claims.RERUN_RTOL / 2)
    claims._write_cell(
        claims.cell_path(tmp_path / claims.CLEAN_RERUN, "m", config, "ppl-wikipedia"),
        ppl("b" * 40, [200.0, near]),
    )
    note = claims.clean_rerun_note(tmp_path)
    assert "2 of the 3 modified-tree cells (1 of 2 perplexity, 1 of 1 cloze)" in note
    assert "not rerun yet: `m/same_b-0.5/ppl-mobydick`" in note
    row = next(r for r in note.splitlines() if "ppl-wikipedia" in r)
    assert f"| perplexity {np.exp(2.5):.3f}; summed NLL 500.000 |" in row
    assert f"perplexity {np.exp((200 + near) / 200):.3f}; summed NLL 500.015 |" in row
    assert "| 1.5e-02 nats in a window (5.0e-05 of it) | yes |" in row
    claims._write_cell(
        claims.cell_path(tmp_path / claims.CLEAN_RERUN, "m", config, "ppl-wikipedia"),
        ppl("b" * 40, [200.0, 300.0 * (1 + 2 * claims.RERUN_RTOL)]),
    )
    row = next(r for r in claims.clean_rerun_note(tmp_path).splitlines() if "ppl-wikipedia" in r)
    assert row.endswith("| no |")


def test_modified_tree_cells_are_rerun_whole_into_clean_rerun_and_nothing_else(
    tmp_path, monkeypatch
):
    """``rerun_modified_cells`` computes exactly the ``+dirty`` cells (the others of their
    configurations are copied into the scratch folder first), writes them under
    ``clean-rerun/`` with the clean commit, leaves the stored cells alone, and refuses to run
    from a modified tree."""
    root = tmp_path / "claims"
    _run(root)
    for other in root.glob("twin/*/*.json"):  # clean, whatever state this tree is in
        cell = json.loads(other.read_text())
        other.write_text(json.dumps({**cell, "commit": "1" * 40}))
    marked = [
        claims.cell_path(root, "twin", CONFIGS[1], "ppl-wikipedia"),
        claims.cell_path(root, "twin", CONFIGS[2], "cloze-austen"),
    ]
    for path in marked:
        cell = json.loads(path.read_text())
        path.write_text(json.dumps({**cell, "commit": "0" * 40 + "+dirty"}))
    stored = {p: p.read_text() for p in root.glob("twin/*/*.json")}
    model = zoo.tiny_twin("llama")
    tok = zoo.ByteTokenizer(model.config.vocab_size)
    tok.pad_token_id = 0
    computed = []

    def kwargs():
        return {
            "plan": PLAN,
            "progress": computed.append,
            "load_model": lambda _n: (model, tok),
            "texts": _corpora,
        }

    monkeypatch.setattr(claims, "_git_commit", lambda: "0" * 40 + "+dirty")
    with pytest.raises(ac.InputError, match="commit your changes first"):
        claims.rerun_modified_cells(root, "twin", tmp_path / "scratch", **kwargs())
    monkeypatch.setattr(claims, "_git_commit", lambda: "c" * 40)
    written = claims.rerun_modified_cells(root, "twin", tmp_path / "scratch", **kwargs())
    assert len(computed) == 2 and all("ppl-wikipedia" in m or "cloze-austen" in m for m in computed)
    assert written == [root / claims.CLEAN_RERUN / p.relative_to(root) for p in sorted(marked)]
    for path, new in zip(sorted(marked), written, strict=True):
        again, old = json.loads(new.read_text()), json.loads(stored[path])
        assert again["commit"] == "c" * 40 and again["values"] == old["values"]
    assert {p: p.read_text() for p in root.glob("twin/*/*.json")} == stored
    note = claims.clean_rerun_note(root)
    assert "2 of the 2 modified-tree cells (1 of 1 perplexity, 1 of 1 cloze)" in note
    assert "2 of the 2 rerun agree" in note
    assert "With the reruns in place of the stored cells, no number of a claim row moves." in note
    # a rerun far from its stored cell: the claim row it enters moves, by the perplexity shown
    moved = json.loads(written[1].read_text())
    nll = moved["values"]["window_nll"]
    moved["values"]["window_nll"] = [2 * x for x in nll]
    written[1].write_text(json.dumps(moved))
    note = claims.clean_rerun_note(root)
    assert "of the 1 claim rows whose numbers move change verdict; the largest change" in note
    assert note.split("interval end is ")[1].split()[1] == "perplexity."
    written[1].write_text(json.dumps({**moved, "values": {**moved["values"], "window_nll": nll}}))
    # only one kind, and nothing left to compute on a second call
    assert claims.rerun_modified_cells(root, "twin", tmp_path / "s2", kind="ppl", **kwargs()) == [
        written[0] if "ppl" in written[0].name else written[1]
    ]
