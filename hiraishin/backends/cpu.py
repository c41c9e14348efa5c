"""The CPU backend: numpy arrays, every op run by its kernel's Numba emulator (same float ops,
same order as the CUDA kernel), so its logits are the GPU's bits computed on the CPU."""

from __future__ import annotations

import numpy as np

from .base import Backend

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    name = "cpu"
    xp = np

    def to_device(self, a):
        return np.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def upload_weight(self, a):
        # GGUF tensors are memory-mapped: keep them mapped (no copy, pages load on first use).
        return np.asarray(a)
