"""The interface the Qwen3 forward pass is written against, once, for both backends.

A :class:`Backend` owns where arrays live (``xp`` is numpy or cupy) and forwards every op to the
kernel module that implements it, naming itself (``"cpu"`` runs the Numba emulator, ``"cuda"``
the CuPy RawKernel). Every op that sums floats takes its order from the
:class:`~hiraishin.order.ReductionOrder` passed in; the others have no order to choose.

Plans are pure functions of (order, shape, device), so a backend caches them (a decode step asks
for the same few dozen plans every token). Ops take an optional ``out``: a buffer of the
result's shape and dtype, not overlapping the inputs, that a backend MAY write the result into
(the CUDA backend does; the CPU emulators allocate); always use the returned array.
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
    writes_out: bool = False  # True when the ops write into a given ``out`` buffer

    # bound on each plan cache (attention plans are keyed by the KV length, which grows)
    _PLAN_CACHE_MAX = 8192

    def __init__(self, device=None):
        self.device = device
        self._matvec_plans: dict = {}
        self._attention_plans: dict = {}
        # The same ops without per-call input checks, for callers whose arrays are right by
        # construction (the forward pass). Here: the backend itself; the CUDA backend has its own.
        self.unchecked = self

    # ---- plans (cached) -------------------------------------------------------------------------
    def matvec_plan(self, order, ncols: int, qtype: str):
        """``order.matvec_plan(ncols, qtype, self.device)``, cached per (order, ncols, qtype)."""
        key = (id(order), ncols, qtype)  # id: hashing a frozen dataclass rehashes every field
        hit = self._matvec_plans.get(key)
        if hit is not None and hit[0] is order:
            return hit[1]
        plan = order.matvec_plan(ncols, qtype, self.device)
        if len(self._matvec_plans) >= self._PLAN_CACHE_MAX:
            self._matvec_plans.clear()
        self._matvec_plans[key] = (order, plan)  # holding ``order`` keeps its id from being reused
        return plan

    def attention_plan(self, order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int,
                       head_dim: int):
        """``order.attention_plan(...)`` for ``self.device``, cached per (order, shape, kv_len)."""
        key = (id(order), n_queries, kv_len, n_head, n_head_kv, head_dim)
        hit = self._attention_plans.get(key)
        if hit is not None and hit[0] is order:
            return hit[1]
        plan = order.attention_plan(n_queries, kv_len, n_head, n_head_kv, head_dim, self.device)
        if len(self._attention_plans) >= self._PLAN_CACHE_MAX:
            self._attention_plans.clear()
        self._attention_plans[key] = (order, plan)
        return plan

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
    def positions(self, start_pos: int, n: int):
        """Absolute positions ``start_pos .. start_pos+n-1`` as an int32 (n,) array on this backend."""
        return self.to_device(np.arange(start_pos, start_pos + n, dtype=np.int32))

    def get_rows(self, table, qtype: str, ids):
        """Rows ``ids`` (T,) of a quantized table, dequantized: float32 (T, K)."""
        from ..kernels.elementwise import get_rows

        return get_rows(table, qtype, ids, backend=self.name)

    def rms_norm(self, x, w, eps: float, out=None):
        """``(scale * x) * w`` per row of ``x`` (rows, n)."""
        from ..kernels.rmsnorm import rms_norm

        return rms_norm(x, w, eps, backend=self.name)

    def rope(self, x, pos, cos_table, sin_table, out=None):
        """NEOX RoPE of ``x`` (T, n_head, D) at absolute positions ``pos`` (T,)."""
        from ..kernels.rope import rope_neox

        return rope_neox(x, pos, cos_table, sin_table, backend=self.name)

    def swiglu(self, g, u, out=None):
        """``silu(g) * u``."""
        from ..kernels.elementwise import swiglu

        return swiglu(g, u, backend=self.name)

    def add(self, a, b, out=None):
        """``a + b`` (residual)."""
        from ..kernels.elementwise import add

        return add(a, b, backend=self.name)

    def mul_mat(self, w, qtype: str, x, order, out=None):
        """``x @ W.T``: x float32 (T, K), W quantized (N, row_bytes) -> float32 (T, N)."""
        return self.mul_mats(((w, qtype),), x, order, (out,))[0]

    def mul_mats(self, weights, x, order, outs=None) -> list:
        """``x @ W.T`` for every ``(W, qtype)`` of ``weights`` (one input, e.g. Q/K/V or gate/up).

        ``x`` is quantized to q8_1 once and shared: the same bytes each separate
        :meth:`mul_mat` would make (quantization is deterministic), so the same results.
        ``outs``: one optional output buffer per weight.
        """
        from ..kernels.mmvq import mul_mat, mul_mat_vec
        from ..kernels.quantize_q8_1 import quantize_q8_1

        if not _fits_all(weights, x):  # unusual input: the checked runner, once per weight, says what is wrong
            return [mul_mat(w, qtype, x, order, backend=self.name, device=self.device) for w, qtype in weights]
        xq = quantize_q8_1(x, self.name)
        return [mul_mat_vec(w, qtype, xq, self.matvec_plan(order, x.shape[0], qtype), self.name)
                for w, qtype in weights]

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        """Causal attention of ``q`` (T, n_head, D) over the first ``kv_len`` cache cells."""
        from ..kernels.fattn_vec import attention, flash_attn

        if len(getattr(q, "shape", ())) != 3 or len(getattr(k_cache, "shape", ())) != 3:
            return attention(q, k_cache, v_cache, q_pos, kv_len, order, backend=self.name, device=self.device)
        T, H, D = q.shape
        plan = self.attention_plan(order, T, int(kv_len), H, k_cache.shape[1], D)
        return flash_attn(q, k_cache, v_cache, q_pos, plan, self.name)

    def kv_cache(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int):
        """An f16 KV cache on this backend."""
        from ..model.kv_cache import KVCache

        return KVCache(n_layer, n_ctx, n_head_kv, head_dim, backend=self.name)

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        """Store float32 ``k``, ``v`` (T, n_head_kv, D) in ``cache`` at cells ``start_pos..`` (f16)."""
        cache.write(layer, start_pos, k, v)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"


def _fits_all(weights, x) -> bool:
    """True when ``x`` is a (T >= 1, K) float32 array and every weight a uint8 block matrix of K columns."""
    from ..kernels.mmvq import TYPE_TRAITS

    shape = getattr(x, "shape", ())
    if len(shape) != 2 or shape[0] < 1 or x.dtype != np.float32:
        return False
    for w, qtype in weights:
        t = TYPE_TRAITS.get(qtype)
        if (t is None or len(w.shape) != 2 or w.dtype != np.uint8 or w.shape[1] % t.block_bytes
                or w.shape[1] // t.block_bytes * t.qk != shape[1]):
            return False
    return True
