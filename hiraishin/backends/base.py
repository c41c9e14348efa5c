"""The interface the Qwen3 forward pass is written against, once, for both backends.

A :class:`Backend` owns where arrays live (``xp`` is numpy or cupy) and forwards every op to the
kernel module that implements it, naming itself (``"cpu"`` runs the Numba emulator, ``"cuda"``
the CuPy RawKernel). Every op that sums floats takes its order from the
:class:`~hiraishin.order.ReductionOrder` passed in; the others have no order to choose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Backend"]


class Backend:
    """Ops of the forward pass on one backend. Subclasses set ``name`` and ``xp`` and move arrays.

    ``device`` is the device profile the plans are made for: ``None`` (the order's profile, else
    the default ``h200`` — on both backends, so CPU and GPU run the same plans), a profile name or
    :class:`~hiraishin.devices.DeviceProfile`, or on ``cuda`` ``"current"`` (this GPU, measured).
    """

    name: str = "?"
    xp: Any = np

    def __init__(self, device=None):
        self.device = device

    # ---- arrays -----------------------------------------------------------------------------
    def to_device(self, a):
        """A host (numpy) array on this backend."""
        raise NotImplementedError

    def to_host(self, a) -> np.ndarray:
        """A backend array as a numpy array."""
        raise NotImplementedError

    def upload_weight(self, a):
        """A weight tensor (possibly a read-only memmap) on this backend, without needless copies."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued work (for timings); a no-op on the CPU."""

    # ---- ops ----------------------------------------------------------------------------------
    def get_rows(self, table, qtype: str, ids):
        """Rows ``ids`` (T,) of a quantized table, dequantized: float32 (T, K)."""
        from ..kernels.elementwise import get_rows

        return get_rows(table, qtype, ids, backend=self.name)

    def rms_norm(self, x, w, eps: float):
        """``(scale * x) * w`` per row of ``x`` (rows, n)."""
        from ..kernels.rmsnorm import rms_norm

        return rms_norm(x, w, eps, backend=self.name)

    def rope(self, x, pos, cos_table, sin_table):
        """NEOX RoPE of ``x`` (T, n_head, D) at absolute positions ``pos`` (T,)."""
        from ..kernels.rope import rope_neox

        return rope_neox(x, pos, cos_table, sin_table, backend=self.name)

    def swiglu(self, g, u):
        """``silu(g) * u``."""
        from ..kernels.elementwise import swiglu

        return swiglu(g, u, backend=self.name)

    def add(self, a, b):
        """``a + b`` (residual)."""
        from ..kernels.elementwise import add

        return add(a, b, backend=self.name)

    def mul_mat(self, w, qtype: str, x, order):
        """``x @ W.T``: x float32 (T, K), W quantized (N, row_bytes) -> float32 (T, N)."""
        from ..kernels.mmvq import mul_mat

        return mul_mat(w, qtype, x, order, backend=self.name, device=self.device)

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order):
        """Causal attention of ``q`` (T, n_head, D) over the first ``kv_len`` cache cells."""
        from ..kernels.fattn_vec import attention

        return attention(q, k_cache, v_cache, q_pos, kv_len, order, backend=self.name, device=self.device)

    def kv_cache(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int):
        """An f16 KV cache on this backend."""
        from ..model.kv_cache import KVCache

        return KVCache(n_layer, n_ctx, n_head_kv, head_dim, backend=self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"
