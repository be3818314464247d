"""Evaluation (attncoda.hooks.evaluate): the one next-token loss equals every copy it replaced,
the special-prefix rule, perplexity equal to the model's own loss, text windows, token scores,
paired bootstrap intervals and the cloze task."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("attncoda.hooks.zoo")
from attncoda import InputError  # noqa: E402
from attncoda.hooks import arach  # noqa: E402
from attncoda.hooks.evaluate import (  # noqa: E402
    PerplexityError,
    cloze_accuracy,
    cloze_items,
    next_token_loss,
    paired_bootstrap,
    perplexity,
    perplexity_interval,
    perplexity_of_nll,
    score_tokens,
    special_prefix,
    text_windows,
    window_nll,
)

NEG_INF = float("-inf")
F = torch.nn.functional


def ids_for(model, batch=2, length=12, seed=0, **kw):
    return zoo.tiny_batch(model, batch=batch, length=length, seed=seed, **kw)


# --------------------------------------------------------------------------------------------
# the next-token loss


def _logits_and_ids(dtype=torch.float32, vocab=97, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 11, vocab, generator=gen) * 4).to(dtype)
    ids = torch.randint(0, vocab, (3, 11), generator=gen)
    return logits, ids


def test_next_token_loss_equals_each_copy_it_replaced_bit_for_bit():
    """The four former copies, written out as they were: ARACH's ``labels=`` loss, the RPA
    trainer's (label-smoothed) loss, the perplexity's per-window sum, the token scores'
    log-softmax gather."""
    logits, ids = _logits_and_ids()
    v = logits.shape[-1]
    labels = ids.clone()
    labels[0, 3] = labels[2, 7] = -100
    arach_copy = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, v), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    assert torch.equal(next_token_loss(logits, labels), arach_copy)
    for smoothing in (0.0, 0.015):
        trainer_copy = F.cross_entropy(
            logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1), label_smoothing=smoothing
        )
        assert torch.equal(next_token_loss(logits, ids, label_smoothing=smoothing), trainer_copy)
    window_copy = (
        F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1), reduction="none")
        .view(3, 10)
        .double()
        .sum(-1)
    )
    assert torch.equal(window_nll(logits, ids), window_copy)
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    scores_copy = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.equal(next_token_loss(logits, ids, reduction="none"), scores_copy)
    per_token = next_token_loss(logits, labels, reduction="none")
    assert per_token.shape == (3, 10) and per_token[0, 2] == 0 and per_token[2, 6] == 0
    total = next_token_loss(logits, ids, reduction="sum")
    torch.testing.assert_close(total, next_token_loss(logits, ids) * 30)


def test_next_token_loss_precision_and_the_models_own_loss():
    half, ids = _logits_and_ids(torch.bfloat16)
    got = next_token_loss(half, ids)
    assert got.dtype == torch.float32  # half precision is upcast, as transformers does
    assert torch.equal(got, next_token_loss(half.float(), ids))
    double, _ = _logits_and_ids(torch.float64)
    assert next_token_loss(double, ids).dtype == torch.float64  # float64 keeps its precision
    model = zoo.tiny_twin("gemma3_text")
    batch = ids_for(model, batch=2, length=9)["input_ids"]
    with torch.no_grad():
        out = model(input_ids=batch, labels=batch)
    torch.testing.assert_close(next_token_loss(out.logits, batch), out.loss, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# the special prefix


class _TemplateTok:
    """A tokenizer whose template puts ``before`` and ``after`` around the text's ids."""

    def __init__(self, before=(), after=(), bos=None, eos=None, plain=(7,)):
        self.before, self.after, self.plain = list(before), list(after), list(plain)
        self.bos_token_id, self.eos_token_id = bos, eos

    def __call__(self, text, add_special_tokens=True):
        words = [7] * len(text.split())  # every word is id 7
        if text == "a":  # the probe special_prefix encodes
            ids = [*self.before, *self.plain, *self.after] if add_special_tokens else [7]
        else:
            ids = [*self.before, *words, *self.after] if add_special_tokens else words
        return type("Enc", (), {"input_ids": ids})()


@pytest.mark.parametrize(
    ("tok", "want"),
    [
        (_TemplateTok(bos=1, eos=2), []),  # SmolLM2: a BOS id its template never adds
        (_TemplateTok(before=[2], bos=2, eos=1), [2]),  # Gemma-3: <bos> first
        (_TemplateTok(before=[101], after=[102]), [101]),  # MiniLM / BERT: [CLS] text [SEP]
        (_TemplateTok(after=[0], bos=0, eos=0), []),  # BOS == EOS, appended only
        (_TemplateTok(before=[1], after=[2], bos=1, eos=2), [1]),  # BOS and EOS both added
        (_TemplateTok(before=[5, 6]), [5, 6]),  # a longer prefix
        (_TemplateTok(before=[1], plain=(8,)), []),  # the plain ids do not appear: no prefix
    ],
)
def test_special_prefix_is_what_the_template_puts_before_the_text(tok, want):
    assert special_prefix(tok) == want


def test_text_windows_start_with_the_prefix_but_not_the_suffix():
    tok = _TemplateTok(before=[1], after=[2], bos=1, eos=2)
    text = " ".join(["w"] * 20)
    ids = text_windows(tok, text, window=5, n_windows=2)
    assert ids.tolist() == [[1, 7, 7, 7, 7], [1, 7, 7, 7, 7]]


# --------------------------------------------------------------------------------------------
# perplexity


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2"])
def test_perplexity_equals_the_models_own_loss(family):
    model = zoo.tiny_twin(family)
    ids = zoo.tiny_batch(model, batch=3, length=16, seed=5)["input_ids"]
    one = perplexity(model, ids[:1])
    with torch.no_grad():
        loss = model(input_ids=ids[:1], labels=ids[:1]).loss
    assert one.n_tokens.tolist() == [15]
    assert abs(one.loss - float(loss)) < 1e-5
    assert math.isclose(one.value, math.exp(float(loss)), rel_tol=1e-5)
    # several windows: token-weighted, so the mean of equal-length window losses
    many = perplexity(model, ids, batch_size=2)
    with torch.no_grad():
        losses = [float(model(input_ids=w[None], labels=w[None]).loss) for w in ids]
    assert abs(many.loss - float(np.mean(losses))) < 1e-5
    np.testing.assert_allclose(many.nll.numpy() / 15, losses, atol=1e-5)
    assert abs(many.subset([1]).loss - losses[1]) < 1e-5


def test_perplexity_bad_input():
    model = zoo.tiny_twin("llama")
    with pytest.raises(PerplexityError, match="T >= 2"):
        perplexity(model, torch.tensor([[5]]))
    with pytest.raises(PerplexityError, match="batch_size"):
        perplexity(model, torch.tensor([[5, 6]]), batch_size=0)


class _Tok:
    """A word-level stand-in for a HuggingFace tokenizer, optionally with a BOS."""

    def __init__(self, bos: int | None) -> None:
        self.bos = bos

    def __call__(self, text, add_special_tokens=True):
        ids = [10 + len(w) for w in text.split()]
        if add_special_tokens and self.bos is not None:
            ids = [self.bos, *ids]

        class Out:
            input_ids = ids

        return Out()


def test_text_windows_cut_the_same_tokens_with_the_prefix():
    text = " ".join(["a", "bb", "ccc", "dddd"] * 10)  # 40 words
    plain = text_windows(_Tok(None), text, window=8)
    assert plain.shape == (5, 8)
    assert plain[0].tolist() == [11, 12, 13, 14] * 2
    bos = text_windows(_Tok(2), text, window=5, n_windows=3)
    assert bos[:, 0].tolist() == [2, 2, 2]
    assert bos[:, 1:].flatten().tolist() == plain.flatten()[:12].tolist()
    assert text_windows(_Tok(None), text, window=8, n_tokens=9).shape == (2, 8)
    with pytest.raises(PerplexityError, match="5 windows of 8, 6 were asked for"):
        text_windows(_Tok(None), text, window=8, n_windows=6)
    with pytest.raises(PerplexityError, match="at least one token"):
        text_windows(_Tok(2), text, window=1)
    with pytest.raises(PerplexityError, match="not both"):
        text_windows(_Tok(2), text, n_windows=1, n_tokens=3)


# --------------------------------------------------------------------------------------------
# token scores, paired statistics, cloze


def test_score_tokens_windows_and_pairing():
    model = zoo.tiny_twin("llama")
    ids = ids_for(model, batch=1, length=50)["input_ids"][0]
    off = score_tokens(model, ids, context=16)
    assert off.position.tolist() == [p for p in range(1, 50) if p % 16]  # windows' last 15
    with torch.no_grad():
        ref = model(input_ids=ids[None, 16:32], labels=ids[None, 16:32]).loss
    assert math.isclose(off.nll[15:30].mean(), float(ref), rel_tol=1e-5)
    strided = score_tokens(model, ids, context=16, stride=8, batch_size=3)
    assert strided.position.tolist() == list(range(1, 50))
    assert strided.context.min() >= 1 and strided.context[20:].min() >= 8
    minus_inf = score_tokens(model, ids, context=16, wrapper=arach.Arach(model, offset=NEG_INF))
    np.testing.assert_allclose(minus_inf.nll, off.nll, atol=1e-5)
    on = score_tokens(model, ids, context=16, wrapper=arach.Arach(model))
    r = perplexity_interval(off, on, block=8, n_boot=200)
    assert r.low <= r.diff <= r.high
    assert math.isclose(r.off, off.perplexity) and math.isclose(r.on, on.perplexity)


def test_paired_bootstrap_is_deterministic_and_clustered():
    rng = np.random.default_rng(0)
    off = rng.integers(0, 2, 200).astype(float)
    on = np.where(rng.random(200) < 0.2, 1.0, off)
    a = paired_bootstrap(off, on, n_boot=400, seed=3)
    b = paired_bootstrap(off, on, n_boot=400, seed=3)
    assert a == b and a.low <= a.diff <= a.high and a.diff > 0
    c = paired_bootstrap(off, on, clusters=np.arange(200) // 10, n_boot=400)
    assert math.isclose(c.diff, a.diff)
    with pytest.raises(ValueError):
        paired_bootstrap(off, on[:10])
    for bad in ({"n_boot": 0}, {"n_boot": 2.5}, {"n_boot": True}, {"vectorized": "yes"}):
        with pytest.raises(InputError):
            paired_bootstrap(off, on, **bad)


def _bootstrap_one_resample_at_a_time(off, on, statistic, clusters, n_boot, level, seed):
    """The interval as paired_bootstrap computed it before its resamples were batched: one
    draw and one concatenation of clusters per resample (the oracle of the test below)."""
    rng = np.random.default_rng(seed)
    if clusters is None:
        index_sets = [np.array([i]) for i in range(len(off))]
    else:
        index_sets = [np.flatnonzero(clusters == u) for u in np.unique(clusters)]
    k = len(index_sets)
    diffs = np.empty(n_boot)
    for r in range(n_boot):
        idx = np.concatenate([index_sets[i] for i in rng.integers(0, k, size=k)])
        diffs[r] = statistic(on[idx]) - statistic(off[idx])
    alpha = (1 - level) / 2
    return tuple(float(q) for q in np.quantile(diffs, [alpha, 1 - alpha]))


def _exp_mean(x):  # no axis parameter: paired_bootstrap calls it once a resample
    return float(np.exp(x.mean()))


@pytest.mark.parametrize("n", [1, 7, 64, 301])
@pytest.mark.parametrize("clustering", ["none", "equal", "unequal", "shuffled"])
@pytest.mark.parametrize("statistic", ["mean", "perplexity", "callable"])
def test_paired_bootstrap_equals_one_resample_at_a_time_bit_for_bit(n, clustering, statistic):
    rng = np.random.default_rng(n)
    off = rng.gamma(2.0, 1.0, n)
    on = off + rng.normal(0.1, 0.5, n)
    clusters = {
        "none": None,
        "equal": np.arange(n) // 1 if n == 1 else (np.arange(n) // 7 if n % 7 == 0 else None),
        "unequal": np.arange(n) // 5,  # the last cluster is short
        "shuffled": rng.integers(0, max(1, n // 4), n),  # labels in any order, any sizes
    }[clustering]
    fn = {"mean": None, "perplexity": perplexity_of_nll, "callable": _exp_mean}[statistic]
    oracle = {"mean": lambda x: float(np.mean(x)), "perplexity": _exp_mean}.get(statistic, fn)
    got = paired_bootstrap(off, on, statistic=fn, clusters=clusters, n_boot=300, seed=n)
    want = _bootstrap_one_resample_at_a_time(off, on, oracle, clusters, 300, 0.95, n)
    assert (got.low, got.high) == want
    assert got.diff == oracle(on) - oracle(off)


def test_cloze_items_follow_the_recipe():
    words = "alpha beta gamma delta".split()
    text = " ".join(f"The {w} garden was quiet." for w in words * 12) + " She loved the garden."
    items = cloze_items({"a": text, "b": text}, n=5, window=20, seed=1)
    assert items == cloze_items({"a": text, "b": text}, n=5, window=20, seed=1)
    for it in items:
        assert len(it.context.split()) == 20
        assert len(it.target) >= 4 and it.target.isalpha()
        assert it.target.lower() in it.context.lower()
    assert [(i.source, i.index) for i in items] == sorted((i.source, i.index) for i in items)


class _WordTok:
    """A whitespace tokenizer over the tiny twins' vocabulary (ids 4..99)."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        ids = [4 + (sum(map(ord, w)) % 96) for w in text.split()]
        return type("Enc", (), {"input_ids": ids})()


def test_cloze_accuracy_at_minus_inf_equals_plain():
    model = zoo.tiny_twin("llama")
    words = "alpha beta gamma delta".split()
    text = " ".join(f"The {w} garden was quiet." for w in words * 12)
    items = cloze_items({"a": text}, n=6, window=10)
    tok = _WordTok()
    off = cloze_accuracy(model, tok, items, batch_size=4)
    inf = cloze_accuracy(
        model, tok, items, wrapper=arach.Arach(model, offset=NEG_INF), batch_size=4
    )
    np.testing.assert_allclose(inf.target_logprob, off.target_logprob, atol=1e-4)
    assert np.array_equal(inf.correct, off.correct)
