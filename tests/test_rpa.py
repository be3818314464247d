"""RPA prior, plug-in, Guardian, schedules, training and audit on tiny twins (fast)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import per_layer_masks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attncoda.hooks import rpa, rpa_audit, rpa_checkpoints, rpa_train, zoo  # noqa: E402
from attncoda.hooks._registry import ATTENTION_NAME  # noqa: E402

FAMILIES = ["gpt2", "llama"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run far faster on one thread when the cores are shared (and stay exact)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ids_for(model, length=16, batch=2, seed=0):
    return zoo.tiny_batch(model, length=length, batch=batch, seed=seed)["input_ids"]


def calibrated(family, length=16, layers=2, seed=0, **cfg):
    model = zoo.tiny_twin(family, num_hidden_layers=layers)
    prior = rpa.RPAPrior.for_model(model, rpa.RPAConfig(**cfg), seed=seed)
    prior.calibrate(model, [ids_for(model, length, batch=4, seed=9)])
    return model, prior


def causal_float_mask(bias, dtype=torch.float32):
    t = bias.shape[-1]
    vis = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.where(vis, bias.to(dtype), torch.finfo(dtype).min)[None, None]


# --------------------------------------------------------------------------------------------
# the mathematics


@pytest.mark.parametrize(("length", "k"), [(1, 4), (7, 3), (16, 4), (128, 4), (5, 12), (64, 1)])
def test_soft_blocks_rows_sum_to_one(length, k):
    phi = rpa.soft_blocks(length, k, dtype=torch.float64)
    assert phi.shape == (length, k)
    assert (phi >= 0).all()
    np.testing.assert_allclose(phi.sum(-1).numpy(), 1.0, atol=1e-5)


def test_soft_blocks_are_raised_cosines():
    phi = rpa.soft_blocks(9, 3, eps=0.0, dtype=torch.float64)
    # centres 0, 4, 8; width max(1, 1.5 * 9 / 3) = 4.5: t = 0 sees block 0 fully, block 1 at 4/4.5
    w0 = 1.0
    w1 = 0.5 * (1 + math.cos(math.pi * 4 / 4.5))
    np.testing.assert_allclose(phi[0].numpy(), [w0 / (w0 + w1), w1 / (w0 + w1), 0.0], atol=1e-12)


def test_sinkhorn_is_doubly_stochastic():
    gen = torch.Generator().manual_seed(0)
    kern = torch.exp(torch.randn(4, 4, generator=gen, dtype=torch.float64))
    p = rpa.sinkhorn(kern, iters=100)
    np.testing.assert_allclose(p.sum(0).numpy(), 1.0, atol=1e-8)
    np.testing.assert_allclose(p.sum(1).numpy(), 1.0, atol=1e-6)
    # after any number of rounds the columns are exact
    p6 = rpa.sinkhorn(kern, iters=6)
    np.testing.assert_allclose(p6.sum(0).numpy(), 1.0, atol=1e-8)
    np.testing.assert_allclose(p6.sum(1).numpy(), 1.0, atol=1e-2)


def test_sinkhorn_rectangular_uses_consistent_marginals():
    kern = torch.rand(3, 5, dtype=torch.float64) + 0.05
    p = rpa.sinkhorn(kern, iters=200)
    np.testing.assert_allclose(p.sum(1).numpy(), 1.0, atol=1e-6)
    np.testing.assert_allclose(p.sum(0).numpy(), 3 / 5, atol=1e-8)


def test_alignment_with_paper_constants_is_doubly_stochastic():
    gen = torch.Generator().manual_seed(1)
    mu = torch.softmax(torch.randn(128, 4, generator=gen), -1)
    for mass in ("sum", "mean"):
        p = rpa.alignment(mu, rpa.soft_blocks(128, 4), tau_align=0.7, iters=30, mass=mass)
        assert torch.isfinite(p).all()
        np.testing.assert_allclose(p.sum(0).numpy(), 1.0, atol=1e-4)
        np.testing.assert_allclose(p.sum(1).numpy(), 1.0, atol=1e-3)


def reference_bias(mu, cfg, beta, tau, scale):
    """The bias from the paper's steps, written out in float64 numpy."""
    mu = mu.double().numpy()
    t, k = mu.shape[0], cfg.n_basis
    phi = rpa.soft_blocks(t, k, dtype=torch.float64).numpy()
    s = mu.T @ phi
    if cfg.alignment_mass == "mean":
        s = s / t
    kern = np.clip(np.exp(np.clip(s / cfg.tau_align, -50, 50)), 1e-9, 1e9)
    p = kern
    for _ in range(cfg.sinkhorn_iters):
        p = p / (p.sum(1, keepdims=True) + 1e-9)
        p = p * (cfg.regimes / k) / (p.sum(0, keepdims=True) + 1e-9)
    b = mu @ p @ phi.T
    i = np.arange(t)
    dist = np.abs(i[:, None] - i[None, :]) / max(t - 1, 1)
    b = (1 - cfg.posmix) * b + cfg.posmix * (-max(beta, 0.0) * dist)
    b = (b - b.mean()) / (b.std(ddof=1) + 1e-6)
    b = b / min(max(tau, cfg.bias_tau_min), cfg.tau_max)
    return np.clip(b, -cfg.bias_clip, cfg.bias_clip) * scale


@pytest.mark.parametrize(
    "cfg",
    [
        rpa.RPAConfig(),
        rpa.RPAConfig(regimes=3, basis=5, alignment_mass="mean", posmix=0.3, sinkhorn_iters=8),
        rpa.RPAConfig(posmix=0.0, bias_clip=1.0),
    ],
)
def test_bias_follows_the_paper_steps(cfg):
    gen = torch.Generator().manual_seed(2)
    mu = torch.softmax(3 * torch.randn(24, cfg.regimes, generator=gen, dtype=torch.float64), -1)
    got = rpa.rpa_bias(mu.float(), config=cfg, pos_beta=0.35, tau=0.9, scale=0.7)
    want = reference_bias(mu.float(), cfg, 0.35, 0.9, 0.7)
    assert got.shape == (24, 24)
    np.testing.assert_allclose(got.numpy(), want, atol=2e-5)


def test_bias_shape_clipping_temperature_and_warm_in():
    gen = torch.Generator().manual_seed(3)
    mu = torch.softmax(5 * torch.randn(32, 4, generator=gen), -1)
    cfg = rpa.RPAConfig(bias_clip=1.5)
    b = rpa.rpa_bias(mu, config=cfg, tau=0.6)
    assert b.shape == (32, 32)
    assert float(b.abs().max()) == pytest.approx(1.5)  # clipped
    # tau below the bias-path floor acts like the floor; scale 0 switches the prior off
    torch.testing.assert_close(rpa.rpa_bias(mu, config=cfg, tau=0.3), b)
    assert float(rpa.rpa_bias(mu, config=cfg, scale=0.0).abs().max()) == 0.0
    half = rpa.rpa_bias(mu, config=cfg, tau=0.6, scale=0.5)
    torch.testing.assert_close(half, 0.5 * b)
    # without clipping the bias is the z-score divided by tau
    free = rpa.rpa_bias(mu, config=rpa.RPAConfig(bias_clip=1e6), tau=1.0)
    assert float(free.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(free.std()) == pytest.approx(1.0, abs=1e-4)
    # a constant bias has no spread: it standardises to 0, not NaN; T = 1 works
    assert torch.isfinite(rpa.rpa_bias(torch.full((1, 4), 0.25))).all()


def test_gaussian_fuzzy_memberships():
    fz = rpa.GaussianFuzzy(6, 3)
    mu = fz(torch.randn(2, 5, 6))
    assert mu.shape == (2, 5, 3)
    torch.testing.assert_close(mu.sum(-1), torch.ones(2, 5))
    with torch.no_grad():
        fz.log_sigma.fill_(-20.0)  # inverse variance clamped to 1e3, logits to [-30, 30]
    assert torch.isfinite(fz(1e3 * torch.randn(2, 5, 6))).all()


def test_bad_configs_raise():
    with pytest.raises(rpa.RPAError, match="regimes"):
        rpa.RPAConfig(regimes=0)
    with pytest.raises(rpa.RPAError, match="tau"):
        rpa.RPAConfig(tau_init=2.0)
    with pytest.raises(rpa.RPAError, match="alignment_mass"):
        rpa.RPAConfig(alignment_mass="max")  # type: ignore[arg-type]
    with pytest.raises(rpa.RPAError, match="shape"):
        rpa.rpa_bias(torch.rand(5, 3))


# --------------------------------------------------------------------------------------------
# the plug-in equals an explicit additive bias


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_prior_equals_a_custom_4d_mask(family):
    model, prior = calibrated(family, layers=1)
    ids = ids_for(model, 16)
    with torch.no_grad(), rpa.attached(model, prior):
        got = model(input_ids=ids).logits
    mask = causal_float_mask(prior.inference_bias(0, 16)).expand(2, 1, 16, 16)
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    assert float((plain - got).abs().max()) > 1e-2  # the prior does something


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_prior_equals_explicit_per_layer_bias(family):
    model, prior = calibrated(family, layers=2)
    ids = ids_for(model, 16)
    with torch.no_grad(), rpa.attached(model, prior):
        got = model(input_ids=ids).logits
    masks = [causal_float_mask(prior.inference_bias(i, 16)) for i in range(2)]
    model.set_attn_implementation("eager")
    handles = per_layer_masks(model, masks)
    try:
        with torch.no_grad():
            want = model(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_prior_equals_explicit_bias_from_memberships(family):
    """Training path: B from this batch's memberships of the block input, added before softmax."""
    model = zoo.tiny_twin(family, num_hidden_layers=1)
    prior = rpa.RPAPrior.for_model(model, seed=1)
    ids = ids_for(model, 12)
    with torch.no_grad(), rpa.attached(model, prior, mode="batch"):
        got = model(input_ids=ids).logits
    # explicit: the input residual of block 0 is the embedding output
    with torch.no_grad():
        if family == "gpt2":
            tr = model.transformer
            h0 = tr.wte(ids) + tr.wpe(torch.arange(12))[None]
        else:
            h0 = model.model.embed_tokens(ids)
        mu = prior.fuzzy[0](h0)
        bias = rpa.rpa_bias(
            mu.mean(0), config=prior.config, pos_beta=prior.pos_beta[0], tau=prior.tau[0]
        )
        torch.testing.assert_close(prior.last_memberships[0], mu)
        want = model(input_ids=ids, attention_mask=causal_float_mask(bias).expand(2, 1, 12, 12))
    torch.testing.assert_close(got, want.logits, atol=2e-5, rtol=1e-5)


def test_gradients_reach_the_prior_and_model():
    model = zoo.tiny_twin("llama")
    prior = rpa.RPAPrior.for_model(model)
    ids = ids_for(model, 16)
    model.train()
    with rpa.attached(model, prior):
        loss = model(input_ids=ids, labels=ids).loss + prior.regularizer()
    loss.backward()
    assert prior.pos_beta.grad is not None and prior.pos_beta.grad.abs().sum() > 0
    assert prior.fuzzy[1].proj.weight.grad.abs().sum() > 0
    assert prior.has_statistics(16) and not prior.has_statistics(17)
    assert set(prior.last_stats) == {"mu_entropy", "sat_frac", "clip_frac"}


def test_entropy_floor_is_active_only_below_the_floor():
    model = zoo.tiny_twin("llama")
    prior = rpa.RPAPrior.for_model(model, rpa.RPAConfig(entropy_floor_frac=1.0))
    ids = ids_for(model, 8)
    model.train()
    with rpa.attached(model, prior):
        model(input_ids=ids)
    reg = prior.regularizer()
    h = [
        float(-(m * m.log()).sum(-1).mean())
        for m in map(torch.Tensor.detach, prior.last_memberships.values())
    ]  # entropies below log R, so the floor is active
    want = sum(0.01 * (math.log(4) - x) for x in h)
    assert float(reg.detach()) == pytest.approx(want, rel=1e-4)
    prior2 = rpa.RPAPrior.for_model(model, rpa.RPAConfig(entropy_floor_frac=0.0))
    with rpa.attached(model, prior2):
        model(input_ids=ids)
    assert float(prior2.regularizer().detach()) == 0.0


def test_inference_bias_is_cached_per_length_and_state():
    _, prior = calibrated("llama", length=16)
    b1 = prior.inference_bias(0, 16)
    assert prior.inference_bias(0, 16) is b1
    assert prior.inference_bias(0, 12).shape == (12, 12)
    assert prior.inference_bias(0, 16) is b1  # other lengths do not evict it
    prior.set_controls(tau=1.2)
    b2 = prior.inference_bias(0, 16)
    assert b2 is not b1 and not torch.allclose(b1, b2)
    with torch.no_grad():
        prior.pos_beta.add_(1.0)  # an optimizer step changes the cache key too
    assert prior.inference_bias(0, 16) is not b2


def test_eval_forward_does_not_recompute_the_bias(monkeypatch):
    model, prior = calibrated("gpt2", length=16)
    ids = ids_for(model, 16)
    calls = []
    real = rpa.rpa_bias
    monkeypatch.setattr(rpa, "rpa_bias", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad(), rpa.attached(model, prior):
        first = model(input_ids=ids).logits
        n = len(calls)
        second = model(input_ids=ids).logits
    assert n == 2 and len(calls) == 2  # one per layer, then cached
    torch.testing.assert_close(first, second)
    # eval mode computes no memberships (no controller, no extra parameters in use)
    assert prior.last_memberships == {}


def test_cached_bias_needs_statistics():
    model = zoo.tiny_twin("llama")
    prior = rpa.RPAPrior.for_model(model)
    with pytest.raises(rpa.RPAError, match="calibrate"), rpa.attached(model, prior):
        model(input_ids=ids_for(model, 8))
    prior.calibrate(model, [ids_for(model, 8)])
    with pytest.raises(rpa.RPAError, match="positions up to 10"):
        prior.inference_bias(0, 10)


def test_model_is_left_as_it_was():
    model, prior = calibrated("llama")
    ids = ids_for(model, 16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(input_ids=ids).logits
    with pytest.raises(RuntimeError, match="boom"), rpa.attached(model, prior):
        assert model.config._attn_implementation == ATTENTION_NAME
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert not rpa.is_attached(model)
    with torch.no_grad():
        after = model(input_ids=ids).logits
    torch.testing.assert_close(before, after, atol=0, rtol=0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not any(n.startswith("rpa") or "fuzzy" in n for n, _ in model.named_parameters())


def test_attach_errors():
    model = zoo.tiny_twin("llama")
    prior = rpa.RPAPrior.for_model(model)
    other = rpa.RPAPrior.for_model(zoo.tiny_twin("llama", num_hidden_layers=3))
    with pytest.raises(rpa.RPAError, match="layers"), rpa.attached(model, other):
        pass
    with pytest.raises(rpa.RPAError, match="causal"), rpa.attached(zoo.tiny_twin("bert"), prior):
        pass
    with rpa.attached(model, prior):
        with pytest.raises(rpa.RPAError, match="already attached"), rpa.attached(model, prior):
            pass
    with pytest.raises(rpa.RPAError, match="mode"):
        rpa.RPAPlugin(model, prior, mode="sometimes")  # type: ignore[arg-type]


def test_left_padding_mask_is_respected():
    model, prior = calibrated("llama", length=12)
    batch = zoo.tiny_batch(model, length=12, left_padding=True)
    with torch.no_grad(), rpa.attached(model, prior):
        padded = model(**batch).logits
    # the first (unpadded) sample equals its own forward with the same bias
    with torch.no_grad(), rpa.attached(model, prior):
        single = model(input_ids=batch["input_ids"][:1]).logits
    torch.testing.assert_close(padded[:1], single, atol=2e-5, rtol=1e-5)
    assert torch.isfinite(padded).all()


def test_generation_with_kv_cache_uses_the_last_bias_row():
    model, prior = calibrated("llama", length=16, layers=1)
    ids = ids_for(model, 10, batch=1)
    with torch.no_grad(), rpa.attached(model, prior):
        out = model(input_ids=ids[:, :9], use_cache=True)
        step = model(input_ids=ids[:, 9:], cache=out.cache, use_cache=True).logits[:, -1]
        full = model(input_ids=ids).logits[:, -1]
        gen = model.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
    # one layer: the cached keys do not depend on the prior, so the steps agree exactly
    torch.testing.assert_close(step, full, atol=2e-5, rtol=1e-5)
    assert gen.shape == (1, 8)
    model.train()
    with pytest.raises(rpa.RPAError, match="full sequences"), rpa.attached(model, prior):
        out = model(input_ids=ids[:, :9], use_cache=True)
        model(input_ids=ids[:, 9:], cache=out.cache, use_cache=True)


def test_calibrate_gives_exact_means():
    model = zoo.tiny_twin("gpt2")
    prior = rpa.RPAPrior.for_model(model)
    a, b = ids_for(model, 8, seed=1), ids_for(model, 8, seed=2)
    prior.calibrate(model, [a, b])
    with torch.no_grad(), rpa.attached(model, prior, mode="batch"):
        model(input_ids=torch.cat([a, b]))
        mu = prior.last_memberships[0].mean(0)  # layer 0 sees no prior upstream
    torch.testing.assert_close(prior.mu_stat[0, :8], mu, atol=1e-6, rtol=1e-5)
    assert float(prior.mu_stat_weight[0, :8].min()) == 1.0


def test_checkpoint_round_trip(tmp_path):
    model, prior = calibrated("gpt2")
    prior.set_controls(tau=1.1, lambda_sat=0.2)
    path = rpa_checkpoints.save_checkpoint(tmp_path / "c.pt", model, prior, step=7)
    ck = rpa_checkpoints.load_checkpoint(path)
    assert ck.meta == {"step": 7} and ck.prior is not None
    ids = ids_for(model, 16)
    with torch.no_grad():
        with rpa.attached(model, prior):
            want = model(input_ids=ids).logits
        with rpa.attached(ck.model, ck.prior):
            got = ck.model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert float(ck.prior.tau[0]) == pytest.approx(1.1)
    with pytest.raises(FileNotFoundError):
        rpa_checkpoints.load_checkpoint(tmp_path / "missing.pt")


# --------------------------------------------------------------------------------------------
# Guardian, context game, schedules, averaging


def test_guardian_respects_its_bounds():
    cfg = rpa_train.GuardianConfig(tau_step=0.5, lambda_step=0.5, ramp_steps=1)
    g = rpa_train.Guardian(cfg, tau=0.68, seed=0)
    with torch.no_grad():
        g.log_std.fill_(3.0)  # wild actions
    model = zoo.tiny_twin("llama")
    prior = rpa.RPAPrior.for_model(model)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(200):
        sig = rpa_train.GuardianSignals(*rng.normal(0, 10, 3), val_loss=float(rng.uniform(0, 20)))
        c = g.step(sig)
        g.apply_to(prior)
        seen.append((c["tau"], c["lambda_sat"], c["lambda_delta"]))
        lo, hi = float(prior.tau.min()), float(prior.tau.max())
        assert cfg.tau_min - 1e-6 <= lo <= hi <= cfg.tau_max + 1e-6  # float32 buffer
    tau, lsat, ldelta = np.array(seen).T
    assert tau.min() >= 0.3 and tau.max() <= 1.6
    assert lsat.min() >= 0.0 and lsat.max() <= 0.6
    assert ldelta.min() >= 0.0 and ldelta.max() <= 1.0
    assert tau.min() == 0.3 and tau.max() == 1.6  # the bounds were reached, not just respected
    prior.set_controls(tau=99.0, lambda_sat=-1.0, lambda_delta=5.0, bias_scale=3.0)
    assert float(prior.tau[0]) == pytest.approx(1.6) and float(prior.lambda_sat) == 0.0
    assert float(prior.lambda_delta) == 1.0 and float(prior.bias_scale) == 1.0
    with pytest.raises(ValueError, match="non-finite"):
        g.step(rpa_train.GuardianSignals(0, 0, 0, float("nan")))


def test_guardian_reward_and_learning():
    g = rpa_train.Guardian(seed=1)
    assert g.reward(5.0) == -5.0  # no history yet
    g.step(rpa_train.GuardianSignals(0.0, 0.0, 0.5, 5.0))
    assert g.reward(4.0) > -4.0 + 0.99  # gain bonus
    before = [p.clone() for p in g.policy.parameters()]
    g.step(rpa_train.GuardianSignals(0.0, 0.0, 0.5, 4.0))
    g.step(rpa_train.GuardianSignals(0.0, 0.0, 0.5, 4.5))
    assert any(not torch.equal(a, b) for a, b in zip(before, g.policy.parameters(), strict=True))
    # the same seed gives the same controls
    a, b = rpa_train.Guardian(seed=3), rpa_train.Guardian(seed=3)
    for ce in (6.0, 5.5, 5.7):
        assert a.step(rpa_train.GuardianSignals(0, 0, 0, ce)) == b.step(
            rpa_train.GuardianSignals(0, 0, 0, ce)
        )


def test_context_game_replicator_dynamics():
    game = rpa_train.ContextGame(
        rpa_train.ContextGameConfig(lengths=(32, 64, 128), min_share=0.05), seed=0
    )
    assert game.mixture() == pytest.approx({32: 1 / 3, 64: 1 / 3, 128: 1 / 3})
    for _ in range(5):
        game.observe(32, ce=6.0)
        game.observe(64, ce=5.5)
        game.observe(128, ce=5.3, sat=0.9)  # u = -5.3 - (0.9 - 0.5) = -5.7 < u(64) = -5.5
        q = game.update()
    assert sum(q.values()) == pytest.approx(1.0)
    assert q[64] > q[128] > q[32] and min(q.values()) >= 0.05
    assert game.sample() in (32, 64, 128)
    with pytest.raises(ValueError):
        rpa_train.ContextGameConfig(lengths=())


def test_lr_schedules():
    f = [
        rpa_train.lr_factor(s, 100, schedule="floor", warmup_frac=0.05, flat_frac=0.2, floor=0.1)
        for s in range(101)
    ]
    assert f[0] == pytest.approx(0.2) and f[10] == 1.0 and f[20] == 1.0
    assert f[100] == pytest.approx(0.1) and min(f[5:]) >= 0.1
    assert all(a >= b for a, b in itertools.pairwise(f[20:]))
    assert rpa_train.lr_factor(100, 100, schedule="cosine") == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        rpa_train.lr_factor(1, 10, schedule="linear")  # type: ignore[arg-type]
    c = rpa_train.Chaos(time_scale=100.0)
    vals = [c.factor(s) for s in range(200)]
    assert min(vals) >= 0.75 and max(vals) <= 1.0 and abs(vals[-1] - 1.0) < 1e-3


def test_selective_averaging_rules():
    swa = rpa_train.SelectiveAveraging(
        rpa_train.SWASelectConfig(start_frac=0.5, band=0.01, min_gain=0.01)
    )
    w = lambda v: {"a": torch.full((2,), float(v))}  # noqa: E731
    assert not swa.offer(4, 10, w(0), 5.0)  # before the start
    assert not swa.offer(5, 10, w(1), 5.0)  # zone entry: no gain over itself
    assert swa.offer(6, 10, w(2), 4.90)
    assert not swa.offer(7, 10, w(3), 4.97)  # a gain over entry, but outside the helpful band
    assert swa.offer(8, 10, w(4), 4.88)
    assert swa.accepted == [6, 8]
    torch.testing.assert_close(swa.average()["a"], torch.full((2,), 3.0))
    assert rpa_train.SelectiveAveraging().average() is None


def test_weight_ema():
    lin = torch.nn.Linear(2, 1)
    ema = rpa_train.WeightEMA([lin], decay=0.5)
    w0 = lin.weight.detach().clone()
    with torch.no_grad():
        lin.weight.add_(2.0)
    ema.update()
    with ema.applied():
        torch.testing.assert_close(lin.weight.detach(), w0 + 1.0)
    torch.testing.assert_close(lin.weight.detach(), w0 + 2.0)


# --------------------------------------------------------------------------------------------
# training


def pattern_data(length=16, seed=0):
    """A learnable stream: a few repeated phrases in random order."""
    gen = np.random.default_rng(seed)
    phrases = [gen.integers(4, 100, size=int(n)) for n in gen.integers(3, 8, size=12)]
    stream = np.concatenate([phrases[i] for i in gen.integers(0, 12, size=600)])
    t = torch.as_tensor(stream, dtype=torch.long)
    n = 8 * length
    ctrl = t[:n].view(8, length)
    val = t[n : 2 * n].view(8, length)
    return rpa_train.TokenData(t[2 * n :], ctrl, val)


def full_config(**kw):
    base = dict(
        steps=30,
        context=16,
        tokens_per_step=128,
        lr=3e-3,
        schedule="floor",
        label_smoothing=0.015,
        chaos=True,
        ema=True,
        guardian=rpa_train.GuardianConfig(),
        context_game=rpa_train.ContextGameConfig(lengths=(8, 16), every=5),
        swa_select=rpa_train.SWASelectConfig(start_frac=0.5, band=0.05, min_gain=0.0),
        control_every=5,
        control_chunks=4,
        checkpoints=3,
        seed=0,
    )
    base.update(kw)
    return rpa_train.TrainConfig(**base)


def run(seed, out_dir=None, with_prior=True, **kw):
    model = zoo.tiny_twin("llama", seed=seed)
    prior = rpa.RPAPrior.for_model(model, seed=seed) if with_prior else None
    cfg = (
        full_config(seed=seed, **kw)
        if with_prior
        else full_config(seed=seed, guardian=None, context_game=None, **kw)
    )
    res = rpa_train.train(model, prior, pattern_data(), cfg, out_dir=out_dir, progress=False)
    return res, model, prior


def test_short_training_lowers_the_loss_and_is_reproducible(tmp_path):
    res, _, prior = run(0, out_dir=tmp_path / "a")
    losses = res.losses
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert set(res.val_ce) == {"raw", "ema", "swa_select"}
    assert all(math.isfinite(v) for v in res.val_ce.values())
    assert res.val_ce["raw"] < math.log(128)  # better than uniform over the vocabulary
    assert res.guardian and 0.3 <= res.guardian[-1]["tau"] <= 1.6
    assert sum(res.context_mixture.values()) == pytest.approx(1.0)
    res2, _, prior2 = run(0)
    assert res2.losses == losses  # bitwise reproducible from the seed
    assert res2.val_ce == res.val_ce
    torch.testing.assert_close(prior2.tau, prior.tau)
    res3, _, _ = run(1)
    assert res3.losses != losses
    # what the run wrote
    out = tmp_path / "a"
    saved = json.loads((out / "result.json").read_text())
    assert saved["val_ce"] == pytest.approx(res.val_ce)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step000000.pt",
        "step000015.pt",
        "step000030.pt",
    ]
    for name in ("final.pt", "final_raw.pt", "final_ema.pt", "final_swa.pt", "audit_ids.pt"):
        assert (out / name).is_file()


def test_baseline_training_has_no_plugin(tmp_path):
    res, model, _ = run(0, with_prior=False, out_dir=tmp_path / "b")
    assert np.mean(res.losses[-5:]) < np.mean(res.losses[:5])
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="Guardian"):
        rpa_train.train(model, None, pattern_data(), full_config(), progress=False)


def test_a_run_folder_is_checked_before_training_and_swapped_in_whole(tmp_path, monkeypatch):
    """``out_dir`` is refused before any training when it holds files of the user's; a run
    replaces an earlier run only with ``overwrite``; an interrupted run leaves the earlier one
    untouched and no staging debris; ``on_complete``'s files become part of the run."""
    import attncoda as ac

    cfg = full_config(
        seed=0,
        steps=4,
        checkpoints=1,
        guardian=None,
        context_game=None,
        swa_select=None,
        control_every=2,
    )
    model = zoo.tiny_twin("llama", seed=0)
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    steps: list[int] = []
    monkeypatch.setattr(rpa_train, "evaluate", lambda *a, **k: steps.append(1) or 1.0)
    with pytest.raises(ac.OutputExistsError, match=r"notes\.txt"):
        rpa_train.train(
            model, None, pattern_data(), cfg, out_dir=users, overwrite=True, progress=False
        )
    assert steps == [] and sorted(p.name for p in users.iterdir()) == ["notes.txt"]
    monkeypatch.undo()

    out = tmp_path / "run"
    added = lambda run, res: run.summary.write_text(json.dumps(res.val_ce))  # noqa: E731
    first = rpa_train.train(
        model, None, pattern_data(), cfg, out_dir=out, on_complete=added, progress=False
    )
    assert json.loads((out / "summary.json").read_text()) == pytest.approx(first.val_ce)
    stamp = json.loads((out / ".attncoda.json").read_text())
    assert "summary.json" in stamp["files"] and "final.pt" in stamp["files"]
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ac.OutputExistsError, match="overwrite"):
        rpa_train.train(model, None, pattern_data(), cfg, out_dir=out, progress=False)

    def interrupted(run, res):
        assert (run.path / "final.pt").is_file()  # the new run was complete in its staging
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rpa_train.train(
            model,
            None,
            pattern_data(),
            cfg,
            out_dir=out,
            overwrite=True,
            on_complete=interrupted,
            progress=False,
        )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]  # no debris
    rpa_train.train(model, None, pattern_data(), cfg, out_dir=out, overwrite=True, progress=False)
    assert not (out / "summary.json").exists()  # the earlier run was replaced whole
    with pytest.raises(ValueError, match="Guardian"):  # a refused config stages nothing
        rpa_train.train(
            model, None, pattern_data(), full_config(), out_dir=tmp_path / "g", progress=False
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]
    with pytest.raises(ValueError, match="out_dir"):
        rpa_train.train(model, None, pattern_data(), cfg, on_complete=added, progress=False)


def test_save_checkpoint_replaces_only_a_checkpoint_and_leaves_no_debris(tmp_path, monkeypatch):
    import attncoda as ac

    model = zoo.tiny_twin("llama", seed=0)
    path = rpa_checkpoints.save_checkpoint(tmp_path / "c.pt", model, step=1)
    rpa_checkpoints.save_checkpoint(path, model, step=2)  # a checkpoint is replaced
    assert rpa_checkpoints.load_checkpoint(path).meta == {"step": 2}
    (tmp_path / "weights.pt").write_bytes(b"someone else's file")
    with pytest.raises(ac.OutputExistsError, match="not an attncoda RPA checkpoint"):
        rpa_checkpoints.save_checkpoint(tmp_path / "weights.pt", model, step=3)
    assert (tmp_path / "weights.pt").read_bytes() == b"someone else's file"

    def interrupted(obj, f, *a, **k):
        Path(f).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rpa_checkpoints.save_checkpoint(path, model, step=4)
    monkeypatch.undo()
    assert rpa_checkpoints.load_checkpoint(path).meta == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "weights.pt"]


# --------------------------------------------------------------------------------------------
# audit


def test_prior_is_a_perturbation_of_each_row():
    model, prior = calibrated("llama", length=12)
    ids = ids_for(model, 12)
    ds = rpa_audit.prior_perturbation(model, prior, ids)
    assert ds.attrs["perturbation_max_error"] < 1e-5
    assert set(ds.sizes.items()) == {("layer", 2), ("head", 4)}
    frac = ds.sink_fraction.values
    assert ((frac >= 0) & (frac <= 1)).all()
    # the Aitchison size of the perturbation is head-independent (one bias for all heads)
    sink = ds.aitchison_sink.values
    np.testing.assert_allclose(sink, np.broadcast_to(sink[:, :1], sink.shape), rtol=1e-6)
    np.testing.assert_allclose(
        ds.delta_entropy_sink + ds.delta_entropy_content, ds.delta_entropy, atol=1e-10
    )
    np.testing.assert_allclose(ds.entropy_with - ds.entropy_without, ds.delta_entropy, atol=1e-10)


def test_rows_without_prior_match_layer0_without_plugin():
    """Layer 0 sees the same input with or without the prior: rows differ only by softmax(B)."""
    from attncoda.hooks import capture

    model, prior = calibrated("gpt2", length=12)
    ids = ids_for(model, 12)
    without, with_prior, _ = rpa_audit._audit_rows(model, prior, ids)
    with torch.no_grad(), capture(model, layers=[0], what="rows") as cap:
        model(input_ids=ids)
    plain = cap.dataset.log_attn.values[:, 0]
    np.testing.assert_allclose(np.exp(without[:, 0]), np.exp(plain), atol=1e-6)
    assert np.abs(np.exp(with_prior[:, 0]) - np.exp(plain)).max() > 1e-3


def test_entropy_trajectory_splits_the_change(tmp_path):
    model, prior = calibrated("llama", length=12)
    ids = ids_for(model, 12)
    p = rpa_checkpoints.save_checkpoint(tmp_path / "x.pt", model, prior)
    ck = [("plain", model), ("rpa", p), ("other", lambda: zoo.tiny_twin("llama", seed=5))]
    ds = rpa_audit.entropy_trajectory(ck, ids)
    assert list(ds.checkpoint.values) == ["plain", "rpa", "other"]
    assert float(abs(ds.delta_entropy.isel(checkpoint=0)).max()) == 0.0
    np.testing.assert_allclose(ds.delta_sink + ds.delta_content, ds.delta_entropy, atol=1e-10)
    # the path split telescopes to the same total
    np.testing.assert_allclose(
        ds.delta_sink_path + ds.delta_content_path, ds.delta_entropy, atol=1e-10
    )
    # without a prior the *_no_prior rows are the rows; with it they remove the bias only
    plain = ds.sel(checkpoint="plain")
    np.testing.assert_array_equal(plain.entropy, plain.entropy_no_prior)
    pert = rpa_audit.prior_perturbation(model, prior, ids)
    with_ = ds.sel(checkpoint="rpa")
    np.testing.assert_allclose(
        with_.entropy - with_.entropy_no_prior, pert.delta_entropy, atol=1e-6
    )
    # layer 0 has the same input with or without the prior (later layers do not)
    np.testing.assert_allclose(with_.entropy_no_prior[0], plain.entropy[0], atol=1e-6)
    with pytest.raises(rpa.RPAError):
        rpa_audit.entropy_trajectory([], ids)


def test_audit_rpa_on_a_run_folder(tmp_path):
    run(0, out_dir=tmp_path / "rpa", steps=10, checkpoints=2, swa_select=None, ema=False)
    run(0, out_dir=tmp_path / "base", with_prior=False, steps=10, checkpoints=2)
    out = rpa_audit.audit_rpa(
        tmp_path / "rpa", baseline_dir=tmp_path / "base", out=tmp_path / "audit"
    )
    assert set(out) == {"trajectory", "perturbation", "baseline_trajectory"}
    assert out["trajectory"].sizes["checkpoint"] == 2
    text = (tmp_path / "audit" / "audit.md").read_text()
    assert "sink fraction" in text and "perturbation identity" in text
    assert (tmp_path / "audit" / "perturbation.nc").is_file()
    with pytest.raises(FileNotFoundError, match="audit_ids"):
        rpa_audit.audit_rpa(tmp_path)


def test_audit_rpa_cli_runs_the_checkpoints_in_the_dtype_asked(tmp_path, capsys, monkeypatch):
    """`attncoda audit rpa --device cpu --dtype bfloat16`: the checkpoints run in bfloat16 (their
    trajectory moves by bfloat16's rounding, no more), float32 by default."""
    from attncoda.cli import main

    run(0, out_dir=tmp_path / "rpa", steps=10, checkpoints=2, swa_select=None, ema=False)
    loaded = []
    real = rpa_checkpoints.load_checkpoint

    def spy(path, **kw):
        ck = real(path, **kw)
        loaded.append(next(ck.model.parameters()).dtype)
        return ck

    monkeypatch.setattr(rpa_audit, "load_checkpoint", spy)  # the audit's own name for it
    for dtype in ("float32", "bfloat16"):
        argv = ["audit", "rpa", str(tmp_path / "rpa"), "--out", str(tmp_path / dtype)]
        assert main([*argv, "--device", "cpu", "--dtype", dtype, "-q"]) == 0
    capsys.readouterr()
    assert loaded == [torch.float32] * 3 + [torch.bfloat16] * 3  # 2 steps + final, each run
    f32, bf16 = (xr.open_dataset(tmp_path / d / "trajectory.nc") for d in ("float32", "bfloat16"))
    diff = float(abs(f32.entropy - bf16.entropy).max())
    assert 0 < diff < 0.05


def test_run_folder_names_what_the_trainer_writes_and_the_audit_reads(tmp_path):
    run(0, out_dir=tmp_path / "r", steps=4, checkpoints=2, swa_select=None, ema=False)
    folder = rpa_checkpoints.RunFolder(tmp_path / "r")
    assert folder.step_checkpoints() == [folder.checkpoint(0), folder.checkpoint(4)]
    for path in (folder.final(), folder.final("raw"), folder.audit_ids, folder.result):
        assert path.is_file(), path
    assert folder.train_config.is_file() and not folder.final("ema").exists()
    assert folder.final_checkpoint() == folder.final()
    folder.final().unlink()
    assert folder.final_checkpoint() == folder.final("raw")
    folder.final("raw").unlink()
    assert folder.final_checkpoint() == folder.checkpoint(4)
    with pytest.raises(FileNotFoundError, match="no final weights"):
        rpa_checkpoints.RunFolder(tmp_path / "empty").final_checkpoint()


@pytest.mark.slow
def test_the_prior_imports_neither_its_trainer_nor_its_audit():
    """One way: rpa_train, rpa_checkpoints and rpa_audit import rpa, never the reverse."""
    import subprocess
    import sys

    code = (
        "import sys, attncoda.hooks.rpa; "
        "print(sorted(m for m in sys.modules if m.startswith('attncoda.hooks.rpa_')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
