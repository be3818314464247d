"""Every SDPA call attncoda adds runs on CUDA's flash or memory-efficient kernel, never the math one.

Two halves:

- CPU (always run): the calls of each path (capture's fast summaries, head gates, ARACH's fast
  path, RPA's bias) are recorded with :class:`~attncoda.hooks._kernels.SDPARecorder` and
  checked against the CUDA kernels' rules (head sizes multiples of 8, contiguous last
  dimensions, mask dtypes and shapes the memory-efficient kernel takes, full aligned biases for
  ARACH's direct calls), so the eligibility cannot rot on a machine without a GPU. The rules
  themselves are checked to flag the layouts that used to fall back.
- ``gpu``: each path runs inside ``sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])``, where
  a fallback to the math kernel raises, in fp32, bf16 and fp16, and is compared with the
  CPU / fp32 reference. ``benchmarks/gpu_check`` runs these (and a benchmark) in one command.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attncoda import SUMMARY_VARIABLES  # noqa: E402
from attncoda.hooks import _kernels as K  # noqa: E402
from attncoda.hooks import arach, capture, rpa  # noqa: E402
from attncoda.hooks._capture import _fast_summaries, _LayerContext  # noqa: E402
from attncoda.hooks.gates import gates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ["float32", "bfloat16", "float16"]
CAPTURE = "attncoda.hooks._capture"
ARACH = "attncoda.hooks.arach"
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def fused_only():
    """SDPA may use flash or memory-efficient attention only: a math fallback raises."""
    return sdpa_kernel(FUSED)


def assert_eligible(calls):
    bad = [(c.site, c.op, c.shapes, c.problems) for c in calls if not c.eligible]
    assert not bad, f"calls no fused CUDA kernel would take: {bad}"


# --------------------------------------------------------------------------------------------
# the rules and the helpers


def test_padding_keeps_every_logit():
    torch.manual_seed(0)
    q, k = (
        torch.randn(2, 3, 5, 10, dtype=torch.float64),
        torch.randn(2, 3, 7, 10, dtype=torch.float64),
    )
    size = K.kernel_head_size(10)
    assert size == 16 and K.kernel_head_size(64 + 2) == 72 and K.kernel_head_size(128 + 2) == 136
    qp, kp = K.pad_head(q, size), K.pad_head(k, size)
    assert qp.is_contiguous() and kp.shape[-1] == 16
    # zero columns add exact zeros; only the BLAS summation order may differ
    torch.testing.assert_close(
        qp @ kp.transpose(-1, -2), q @ k.transpose(-1, -2), rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match="cannot pad"):
        K.pad_head(q, 8)


def test_aligned_bias_is_a_view_with_aligned_rows():
    bias = torch.randn(2, 1, 13, 13)
    out = K.aligned_bias(bias, (2, 4, 13, 13))
    assert out.shape == (2, 4, 13, 13) and out.stride()[1] == 0
    assert out.stride()[2] % K.BIAS_ALIGN == 0 and out.stride()[0] % K.BIAS_ALIGN == 0
    torch.testing.assert_close(out, bias.expand(2, 4, 13, 13), rtol=0, atol=0)
    again = K.aligned_bias(out[:, :1], (2, 4, 13, 13))
    assert again.data_ptr() == out.data_ptr()  # already aligned: no second copy


def test_rules_flag_the_layouts_that_used_to_fall_back():
    """What capture (head size d + 2), ARACH (an unexpanded bias) and bad masks looked like."""
    old_capture = torch.zeros(1, 2, 8, 64 + 2)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    assert not any(
        not p for p in K.fused_problems(old_capture, old_capture, old_capture, mask).values()
    )
    causal = K.fused_problems(old_capture, old_capture, old_capture, is_causal=True)
    assert causal["efficient"] == ["head sizes (66, 66, 66) are not multiples of 8"]
    assert causal["flash"] == ["dtype torch.float32 (flash: fp16 or bf16)"]

    q = torch.zeros(2, 4, 8, 16, dtype=torch.bfloat16)
    problems = K.fused_problems(q, q, q, torch.zeros(1, 1, 8, 8))["efficient"]
    assert problems == [
        "mask dtype torch.float32 is neither bool nor the query dtype torch.bfloat16"
    ]
    along_keys = torch.ones(2, 1, 8, 1, dtype=torch.bool).expand(2, 1, 8, 8)
    assert "not contiguous" in K.fused_problems(q, q, q, along_keys)["efficient"][0]
    wrong_batch = torch.ones(3, 1, 8, 8, dtype=torch.bool)
    assert "does not broadcast" in K.fused_problems(q, q, q, wrong_batch)["efficient"][0]
    grouped = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    assert K.fused_problems(q, grouped, grouped)["efficient"]
    assert not K.fused_problems(q, grouped, grouped, enable_gqa=True)["flash"]
    strided = torch.zeros(2, 4, 8, 32)[..., ::2]
    assert "not contiguous" in K.fused_problems(strided, strided, strided)["efficient"][0]

    old_arach_bias = torch.zeros(4, 1, 8, 8, dtype=torch.bfloat16)  # (2b, 1, T, T)
    problems = K.direct_efficient_problems(
        q.repeat(2, 1, 1, 1), *(q.repeat(2, 1, 1, 1),) * 2, old_arach_bias
    )
    assert any("is not (B, H, Q, K)" in p for p in problems)
    ok = K.aligned_bias(old_arach_bias, (4, 4, 8, 8))
    assert K.direct_efficient_problems(*(q.repeat(2, 1, 1, 1),) * 3, ok) == []
    odd = torch.zeros(1, 2, 8, 12, dtype=torch.bfloat16)
    assert K.direct_flash_problems(odd, odd, odd)


def test_recorder_sees_calls_and_restores_sdpa():
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(1, 2, 4, 10)
    with K.SDPARecorder() as rec:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    torch.testing.assert_close(out, sdpa(q, q, q, is_causal=True))
    (call,) = rec.calls
    assert call.site == __name__ and not call.eligible and call.head_size == 10


# --------------------------------------------------------------------------------------------
# the calls each path makes, on the CPU, checked by the CUDA rules


def _twin(family="llama", dtype="float32", **overrides):
    return zoo.tiny_twin(family, dtype=dtype, **overrides)


CAPTURE_CASES = {
    "causal": ("llama", {}, {}, False),
    "padded": ("llama", {}, {}, True),
    "queries": ("llama", {}, {"queries": [1, 5, -1]}, False),
    "head12": ("llama", {"head_dim": 12}, {}, True),
    "sliding": ("gemma3", {}, {}, True),
    "bidirectional": ("bert", {}, {}, True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CAPTURE_CASES))
def test_capture_summaries_calls_are_eligible(case, dtype, monkeypatch):
    # the route CUDA takes: summaries in one pass over blocks of logits are for CPU only
    from attncoda.hooks import _capture

    monkeypatch.setattr(_capture, "_one_pass_pays_off", lambda device: False)
    family, overrides, options, padded = CAPTURE_CASES[case]
    model = _twin(family, dtype, **overrides)
    batch = zoo.tiny_batch(model, length=12, left_padding=padded)
    with torch.no_grad(), K.SDPARecorder() as plain:
        model(**batch)
    with torch.no_grad(), K.SDPARecorder() as rec, capture(model, **options) as cap:
        model(**batch)
    ours = rec.from_site(CAPTURE)
    assert len(ours) == model.config.num_hidden_layers  # one fused call per captured layer
    for call in ours:
        assert call.head_size % 8 == 0
        assert call.dtypes["query"] == call.dtypes["value"] == torch.float32  # see _fast_summaries
        assert call.dtypes["mask"] in (None, torch.bool)
    assert_eligible(ours)
    # the model's own calls are left as they were (head size 12 is the twin's, not ours)
    theirs = [c for c in rec.calls if c not in ours]
    assert [(c.site, c.shapes, c.dtypes, c.is_causal) for c in theirs] == [
        (c.site, c.shapes, c.dtypes, c.is_causal) for c in plain.calls
    ]
    assert np.isfinite(cap.dataset.sink_share.values[..., -1]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gates_add_no_call_and_leave_the_models_call_alone(dtype):
    model = _twin("llama", dtype)
    for padded in (False, True):
        batch = zoo.tiny_batch(model, length=12, left_padding=padded)
        with torch.no_grad(), K.SDPARecorder() as plain:
            model(**batch)
        with torch.no_grad(), K.SDPARecorder() as gated, gates(model, {0: [1], 1: [0, 3]}):
            model(**batch)
        assert [(c.site, c.shapes, c.dtypes, c.is_causal) for c in gated.calls] == [
            (c.site, c.shapes, c.dtypes, c.is_causal) for c in plain.calls
        ]
        assert len(gated.calls) == 2 and not gated.from_site("attncoda")
        assert_eligible(gated.calls)


ARACH_CASES = {
    "causal": ("llama", {}, False),
    "padded": ("llama", {}, True),
    "head12": ("llama", {"head_dim": 12}, True),
    "sliding": ("gemma3", {}, False),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(ARACH_CASES))
def test_arach_fast_path_calls_are_eligible(case, dtype):
    family, overrides, padded = ARACH_CASES[case]
    model = _twin(family, dtype, **overrides)
    batch = zoo.tiny_batch(model, length=12, left_padding=padded)
    with torch.no_grad(), K.SDPARecorder() as rec:
        arach.Arach(model)(**batch)
    ours = rec.from_site(ARACH)
    assert len(ours) == model.config.num_hidden_layers
    for call in ours:
        assert call.op == (
            "flash" if call.shapes["mask"] is None and dtype != "float32" else "efficient"
        )
        assert call.head_size % 8 == 0
        if call.shapes["mask"] is not None:
            assert call.shapes["mask"] == call.shapes["query"][:3] + call.shapes["key"][2:3]
            assert call.dtypes["mask"] == call.dtypes["query"]
    assert_eligible(rec.calls)


def test_arach_padded_heads_give_the_same_outputs():
    """Head size 12 is padded to 16 for the kernels: fast still equals dense."""
    model = _twin("llama", head_dim=12)
    for padded in (False, True):
        batch = zoo.tiny_batch(model, length=12, left_padding=padded)
        with torch.no_grad():
            fast = arach.Arach(model)(**batch).logits
            dense = arach.Arach(model, mode="dense")(**batch).logits
        valid = batch["attention_mask"].bool()
        torch.testing.assert_close(fast[valid], dense[valid], rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["batch", "cached"])
def test_rpa_bias_calls_are_eligible(mode, dtype):
    model = _twin("llama", dtype)
    prior = rpa.RPAPrior.for_model(model, seed=0)
    if mode == "cached":
        prior.calibrate(model, [zoo.tiny_batch(model, length=12)["input_ids"]])
    for padded in (False, True):
        batch = zoo.tiny_batch(model, length=12, left_padding=padded)
        with torch.no_grad(), K.SDPARecorder() as rec, rpa.attached(model, prior, mode=mode):
            model(**batch)
        assert len(rec.calls) == 2
        for call in rec.calls:
            assert call.dtypes["mask"] == call.dtypes["query"]  # the additive float bias
        assert_eligible(rec.calls)


def test_cached_rpa_mask_is_stored_with_aligned_rows():
    model = _twin("llama")
    prior = rpa.RPAPrior.for_model(model, seed=0)
    prior.calibrate(model, [zoo.tiny_batch(model, length=12)["input_ids"]])
    with torch.no_grad(), rpa.attached(model, prior, mode="cached"):
        model(**zoo.tiny_batch(model, length=12))
    masks = [v for key, v in prior._cache.items() if key[0] == "mask"]
    assert masks and all(m.stride(-2) % K.BIAS_ALIGN == 0 and m.stride(-1) == 1 for m in masks)


# --------------------------------------------------------------------------------------------
# ARACH never falls back silently


def _refuse(*args, **kwargs):
    raise RuntimeError("the kernel says no\nsecond line")


def test_arach_refusal_raises_when_math_attention_is_off(monkeypatch):
    model = _twin("llama")
    batch = zoo.tiny_batch(model, length=8)
    monkeypatch.setattr(arach, "_fused_with_lse", _refuse)
    with torch.no_grad(), fused_only(), pytest.raises(arach.ArachError, match="the kernel says no"):
        arach.Arach(model)(**batch)


def test_arach_refusal_warns_once_and_matches(monkeypatch):
    model = _twin("llama")
    batch = zoo.tiny_batch(model, length=8)
    with torch.no_grad():
        fused = arach.Arach(model)(**batch).logits
    monkeypatch.setattr(arach, "_fused_with_lse", _refuse)
    monkeypatch.setattr(arach, "_KERNEL_WARNED", set())
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="fell back.*the kernel says no"):
        reference = arach.Arach(model)(**batch).logits
    torch.testing.assert_close(reference, fused, rtol=0, atol=2e-5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        arach.Arach(model)(**batch)  # the same refusal is not repeated


# --------------------------------------------------------------------------------------------
# the prepared GPU check can run here (its CPU-safe parts)


@pytest.mark.slow  # a fresh interpreter importing torch: ~8 CPU-s
def test_gpu_check_dry_run():
    script = ROOT / "benchmarks" / "gpu_check"
    assert os.access(script, os.X_OK)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run(
        [sys.executable, str(script), "--dry"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "| llama-1b (tiny) |" in out and "| qwen2.5-1.5b (tiny) |" in out
    assert "eligible" in out and "NOT ELIGIBLE" not in out
    assert "summaries / SDPA" in out


# --------------------------------------------------------------------------------------------
# on a GPU: the fused kernels only, compared with the CPU / fp32 reference


def _gpu_model(dtype, head_dim=64):
    # GQA where flash serves the model's own causal call; MHA in fp32, whose own call only the
    # memory-efficient kernel takes (the test is about attncoda's calls, not the model's)
    kv = 4 if dtype == "float32" else 2
    model = _twin(
        "llama",
        dtype,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=256,
    )
    return model.to("cuda")


def _on_cpu_fp32(model):
    return copy.deepcopy(model).to("cpu", torch.float32)


def _cpu(batch):
    return {k: v.cpu() for k, v in batch.items()}


def _close(a, b, atol, rtol=1e-3):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], atol=atol, rtol=rtol)


def _own_error(model, cpu, batch):
    """The model's own rounding: its plain forward (GPU, its dtype) against the CPU in fp32."""
    valid = batch["attention_mask"].bool().cpu()
    with torch.no_grad(), fused_only():
        own = model(**batch).logits.float().cpu()
    with torch.no_grad():
        ref = cpu(**_cpu(batch)).logits
    d = (own - ref)[valid].abs()
    return float(d.mean()), float(d.max())


def _within(out, ref, batch, own):
    """``out`` is as close to ``ref`` as the model's own forward is to its fp32 self.

    Mean error at most 1.75x the model's own, the largest at most 4x (floors of 1e-5 and 1e-4
    for fp32, whose own error is ~1e-6). Calibrated with the CPU's bf16/fp16 kernels on these
    models, where every path's ratio was 0.8-1.2x (mean) and at most 2.2x (max), while a wrong
    gated head gave 6-90x and a wrong ARACH offset 1.3-18x the model's own mean error.
    """
    valid = batch["attention_mask"].bool().cpu()
    d = (out.float().cpu() - ref.float().cpu())[valid].abs()
    mean, worst = float(d.mean()), float(d.max())
    assert mean <= 1.75 * own[0] + 1e-5, f"mean error {mean:.3g}, the model's own {own[0]:.3g}"
    assert worst <= 4 * own[1] + 1e-4, f"largest error {worst:.3g}, the model's own {own[1]:.3g}"


# capture's sink shares on the GPU in the model's dtype against the CPU in fp32 (mean, max):
# about 3x what the CPU's bf16/fp16 kernels give on this model (bf16 0.0016 / 0.12)
SHARE_VS_CPU = {"float32": (1e-5, 2e-4), "bfloat16": (5e-3, 0.4), "float16": (1e-3, 0.1)}


@pytest.mark.gpu
@pytest.mark.parametrize("queries", ["all", "every third"])
def test_fast_summaries_kernel_matches_the_cpu(queries):
    """The fused fp32 call on CUDA against the same call on the CPU, shares near 0 and 1 included
    (all queries: ``is_causal``; every third: a boolean mask)."""
    gen = torch.Generator().manual_seed(0)
    b, h, t, d = 2, 3, 300, 64
    u = torch.randn(d, generator=gen)
    q = torch.randn(b, h, t, d, generator=gen) + 1.5 * u
    k = torch.randn(b, h, t, d, generator=gen)
    k[:, :, 0] = torch.linspace(-1.0, 3.0, h)[None, :, None] * u  # weak to dominant sinks
    results = {}
    for device in ("cpu", "cuda"):
        ctx = _LayerContext(
            q=q.to(device),
            k=k.to(device),
            mask=None,
            offset=0,
            scale=d**-0.5,
            softcap=None,
            sliding=None,
            causal=True,
            sinks_logit=None,
            sink_index=torch.zeros(b, dtype=torch.long, device=device),
        )
        pos = torch.arange(0, t, 1 if queries == "all" else 3, device=device)
        with fused_only():
            out, redo = _fast_summaries(ctx, pos, 64)
        results[device] = ({n: v.cpu().numpy() for n, v in out.items()}, redo.cpu().numpy())
    (cpu, redo_cpu), (gpu, redo_gpu) = results["cpu"], results["cuda"]
    np.testing.assert_array_equal(redo_cpu, redo_gpu)
    kept = ~redo_cpu  # rows the explicit path recomputes in capture are not the kernel's
    share = cpu["sink_share"][..., kept]
    assert share.max() > 0.99 and share.min() < 0.01  # the test reaches both ends
    for name in SUMMARY_VARIABLES:
        _close(gpu[name][..., kept], cpu[name][..., kept], atol=2e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["causal", "padded", "queries"])
def test_capture_summaries_run_on_fused_kernels(dtype, variant):
    model = _gpu_model(dtype)
    batch = zoo.tiny_batch(model, length=40, left_padding=variant == "padded")
    options = {"queries": [0, 7, 21, -1]} if variant == "queries" else {}
    with torch.no_grad(), fused_only():
        with capture(model, what="summaries", **options) as fast:
            model(**batch)
        with capture(model, what="both", **options) as explicit:  # recomputed logits, no SDPA
            model(**batch)
    for name in SUMMARY_VARIABLES:
        _close(fast.dataset[name].values, explicit.dataset[name].values, atol=2e-4, rtol=1e-4)
    cpu = _on_cpu_fp32(model)
    with torch.no_grad(), capture(cpu, what="summaries", **options) as ref:
        cpu(**_cpu(batch))
    a, b = fast.dataset.sink_share.values, ref.dataset.sink_share.values
    assert np.array_equal(np.isnan(a), np.isnan(b))
    d = np.abs(a - b)[~np.isnan(b)]
    assert d.mean() <= SHARE_VS_CPU[dtype][0] and d.max() <= SHARE_VS_CPU[dtype][1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gates_run_on_fused_kernels(dtype):
    model = _gpu_model(dtype)
    heads = {0: [1], 1: [0, 2]}
    batch = zoo.tiny_batch(model, length=40, left_padding=True)
    zeroed = copy.deepcopy(model)
    d = model.config.head_dim
    with torch.no_grad():
        for layer, hs in heads.items():
            for h in hs:
                zeroed.model.layers[layer].self_attn.o_proj.weight[:, h * d : (h + 1) * d] = 0
    with torch.no_grad(), fused_only():
        with gates(model, heads) as g:
            gated = model(**batch).logits
        expected = zeroed(**batch).logits
    assert g.calls == 2
    cpu = _on_cpu_fp32(model)
    own = _own_error(model, cpu, batch)
    _within(gated, expected, batch, own)
    with torch.no_grad(), gates(cpu, heads):
        reference = cpu(**_cpu(batch)).logits
    _within(gated, reference, batch, own)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 12])
@pytest.mark.parametrize("padded", [False, True])
def test_arach_fast_path_runs_on_fused_kernels(dtype, head_dim, padded):
    model = _gpu_model(dtype, head_dim=head_dim)
    batch = zoo.tiny_batch(model, length=40, left_padding=padded)
    with torch.no_grad(), fused_only():  # a refused fused call raises ArachError here
        fast = arach.Arach(model)(**batch).logits
        dense = arach.Arach(model, mode="dense")(**batch).logits
    cpu = _on_cpu_fp32(model)
    own = _own_error(model, cpu, batch)
    _within(fast, dense, batch, own)
    with torch.no_grad():
        reference = arach.Arach(cpu)(**_cpu(batch)).logits
    _within(fast, reference, batch, own)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["batch", "cached"])
def test_rpa_bias_runs_on_fused_kernels(dtype, mode):
    model = _gpu_model(dtype)
    prior = rpa.RPAPrior.for_model(model, seed=0)
    if mode == "cached":
        prior.calibrate(model, [zoo.tiny_batch(model, length=40)["input_ids"]])
    cpu, cpu_prior = _on_cpu_fp32(model), copy.deepcopy(prior).to("cpu")
    batch = zoo.tiny_batch(model, length=40, left_padding=True)
    with torch.no_grad(), fused_only(), rpa.attached(model, prior, mode=mode):
        out = model(**batch).logits
    with torch.no_grad(), rpa.attached(cpu, cpu_prior, mode=mode):
        reference = cpu(**_cpu(batch)).logits
    _within(out, reference, batch, _own_error(model, cpu, batch))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rpa_training_step_runs_on_fused_kernels(dtype):
    """The bias carries a gradient: the memory-efficient kernel's backward must take it."""
    model = _gpu_model(dtype)
    model.train()
    prior = rpa.RPAPrior.for_model(model, seed=0)
    ids = zoo.tiny_batch(model, length=40)["input_ids"]
    with fused_only(), rpa.attached(model, prior, mode="batch"):
        loss = model(input_ids=ids, labels=ids).loss + prior.regularizer()
        loss.backward()
    grad = prior.pos_beta.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
