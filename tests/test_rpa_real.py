"""The RPA plug-in on the real offline SmolLM2-135M and on real Austen tokens."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need, per_layer_masks

torch = pytest.importorskip("torch")
from attncoda.hooks import assets, rpa, rpa_audit, rpa_train  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def smollm2():
    need("smollm2-135m", "austen")
    model, tok = assets.load_model("smollm2-135m")
    text = " ".join(assets.paragraphs(assets.load_text("austen", "persuasion"), min_words=30)[:6])
    ids = tok(text, return_tensors="pt").input_ids
    return model, ids


def test_prior_on_smollm2_equals_explicit_bias_and_leaves_model_unchanged(smollm2):
    model, ids = smollm2
    ids = ids[:, :48].repeat(2, 1)
    prior = rpa.RPAPrior.for_model(model, seed=0)
    prior.calibrate(model, [ids])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with rpa.attached(model, prior):
            got = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    torch.testing.assert_close(before, after, atol=0, rtol=0)
    assert float((got - before).abs().max()) > 1e-2
    # explicit reference: HF eager attention, each layer given causal + B_l as its mask
    t = ids.shape[-1]
    vis = torch.ones(t, t, dtype=torch.bool).tril()
    masks = [
        torch.where(vis, prior.inference_bias(i, t), torch.finfo(torch.float32).min)[None, None]
        for i in range(prior.n_layers)
    ]
    handles = per_layer_masks(model, masks)
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            want = model(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_prior_perturbation_on_smollm2(smollm2):
    model, ids = smollm2
    ids = ids[:, :40]
    prior = rpa.RPAPrior.for_model(model, seed=1)
    prior.calibrate(model, [ids])
    ds = rpa_audit.prior_perturbation(model, prior, ids)
    assert ds.attrs["perturbation_max_error"] < 1e-5
    assert ds.sizes["layer"] == 30 and ds.sizes["head"] == 9
    np.testing.assert_allclose(
        ds.delta_entropy_sink + ds.delta_entropy_content, ds.delta_entropy, atol=1e-9
    )
    # SmolLM2 has strong sinks: rows put most of their mass on the first token
    assert float(ds.sink_share_without.mean()) > 0.3


def test_short_rpa_training_on_austen_tokens_lowers_the_loss(smollm2, tmp_path):
    import transformers

    _, ids = smollm2
    need("austen")
    tok = transformers.AutoTokenizer.from_pretrained(
        str(assets.asset_path("smollm2-135m")), local_files_only=True
    )
    text = assets.load_text("austen", "emma")[:60_000]
    stream = torch.as_tensor(tok(text)["input_ids"])
    uniq, inverse = torch.unique(stream, return_inverse=True)  # a small vocabulary for speed
    stream = inverse
    val = ids[0, : 4 * 32]
    lookup = {int(u): i for i, u in enumerate(uniq)}
    val = torch.as_tensor([lookup.get(int(v), 0) for v in val]).view(4, 32)
    data = rpa_train.TokenData(stream, val[:2], val[2:])
    config = transformers.LlamaConfig(
        vocab_size=len(uniq),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    prior = rpa.RPAPrior.for_model(model, seed=0)
    cfg = rpa_train.TrainConfig(
        steps=40,
        context=32,
        tokens_per_step=256,
        lr=3e-3,
        guardian=rpa_train.GuardianConfig(),
        context_game=rpa_train.ContextGameConfig(lengths=(16, 32), every=10),
        control_every=10,
        control_chunks=2,
        checkpoints=2,
    )
    res = rpa_train.train(model, prior, data, cfg, out_dir=tmp_path, progress=False)
    assert np.mean(res.losses[-5:]) < np.mean(res.losses[:5]) - 0.5
    audit = rpa_audit.audit_rpa(tmp_path, input_ids=data.validation)
    assert audit["perturbation"].attrs["perturbation_max_error"] < 1e-5


def test_every_study_size_builds_and_runs_with_the_prior():
    """Each size of the case study builds (the paper's odd head size 85 cannot take RoPE: 84)."""
    from case_studies.rpa.run import SIZES, build_model

    for name, size in SIZES.items():
        model = build_model(size, size.vocab or 49152, seed=0, device="cpu")
        attn = model.model.layers[0].self_attn
        assert attn.head_dim == (84 if name == "paper" else size.hidden // size.heads)
        prior = rpa.RPAPrior.for_model(model, rpa.RPAConfig(), seed=1)
        ids = torch.randint(0, size.vocab or 49152, (1, 16))
        with torch.no_grad(), rpa.attached(model, prior):
            out = model(input_ids=ids).logits
        assert out.shape == (1, 16, size.vocab or 49152) and torch.isfinite(out).all()
        if name == "paper":  # ~75M parameters: the paper's 90M minus its mixture-of-experts FFN
            assert 70e6 < sum(p.numel() for p in model.parameters()) < 80e6


def test_case_study_commands_end_to_end_at_the_tiny_size(tmp_path, capsys):
    """`ablation` (three stages, then the report) and `audit`, as a user runs them."""
    need("austen")
    import json

    from case_studies.rpa.run import main

    out = tmp_path / "rpa"
    common = ["--size", "tiny", "--steps", "3", "--eval-chunks", "2", "--checkpoints", "1"]
    assert main(["ablation", "--seeds", "0", *common, "--out", str(out), "-q"]) == 0
    runs = json.loads((out / "results.json").read_text())
    assert sorted(r["stage"] for r in runs) == ["baseline", "guardian", "rpa"]
    assert all(np.isfinite(r["val_ce"]["raw"]) and not r["tf32"] for r in runs)
    table = (out / "ablation.md").read_text()
    assert "+RPA" in table and "+Guardian/schedules" in table
    assert (out / "figures" / "training_curves.png").is_file()
    assert main(["audit", "--size", "tiny", "--seed", "0", "--out", str(out), "-q"]) == 0
    assert "perturbation identity max error" in capsys.readouterr().out
    assert (out / "audit" / "audit_seed0.md").is_file()
    # TF32 is a CUDA switch: asking for it on the CPU is refused before anything is written
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--stage", "rpa", "--tf32", "--device", "cpu", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert "--tf32 applies to CUDA devices only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
@pytest.mark.slow
def test_paper_size_training_steps_on_a_gpu(tmp_path):
    """The paper-size run on CUDA: a few steps of the Guardian stage, checkpoints and summary."""
    need("austen")
    import json

    from case_studies.rpa.run import main

    out = tmp_path / "paper"
    args = ["train", "--stage", "guardian", "--size", "paper", "--steps", "3", "--device", "cuda"]
    args += ["--tf32", "--eval-chunks", "4", "--checkpoints", "1"]
    assert main([*args, "--out", str(out), "-q"]) == 0
    summary = json.loads((out / "runs" / "guardian_seed0" / "summary.json").read_text())
    assert summary["size"] == "paper" and np.isfinite(summary["val_ce"]["raw"])
    assert summary["tf32"] is True
