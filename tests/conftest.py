"""Shared fixtures and optional-dependency markers (xarray's ``_importorskip`` pattern)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest


def _importorskip(modname: str) -> tuple[bool, pytest.MarkDecorator]:
    try:
        importlib.import_module(modname)
        has = True
    except ImportError:
        has = False
    return has, pytest.mark.skipif(
        not has, reason=f"requires {modname} (pip install attncoda[test])"
    )


has_torch, requires_torch = _importorskip("torch")
has_skbio, requires_skbio = _importorskip("skbio")
has_composition_stats, requires_composition_stats = _importorskip("composition_stats")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests skip cleanly where CUDA is absent."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def need(*names: str) -> None:
    """Skip the calling test unless every named offline asset is fetched (real tests)."""
    from attncoda.hooks import assets

    for name in names:
        if not assets.is_fetched(name):
            pytest.skip(f"asset {name!r} is not fetched; run `attncoda fetch {name}`")


def per_layer_masks(model, masks):
    """Pre-hooks on the attention modules that replace each layer's mask (an explicit reference
    for plug-ins that change masks); the caller removes the returned handles."""
    from attncoda.hooks._registry import attention_modules

    handles = []
    for layer, module in enumerate(attention_modules(model)):

        def hook(_m, args, kwargs, layer=layer):
            kwargs["attention_mask"] = masks[layer]
            return args, kwargs

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """Six paragraphs of fifty words: passages for capture and demo on tiny twins."""
    paras = [f"Paragraph {i}. " + " ".join(f"word{j}" for j in range(50)) for i in range(6)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(paras), encoding="utf-8")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)


@pytest.fixture
def old_style_model():
    """A tiny random GPT-Neo: its modelling code computes attention itself (no registry path)."""
    torch = pytest.importorskip("torch")
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=32,
    )
    model = GPTNeoForCausalLM(config).eval()
    if type(model)._can_set_attn_implementation():
        pytest.skip("GPT-Neo learned to switch implementations; pick another old-style model")
    return model
