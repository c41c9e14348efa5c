"""The CPU backend: numpy arrays, every op run by its kernel's Numba emulator (same float ops,
same order as the CUDA kernel), so its logits are the GPU's bits computed on the CPU."""

from __future__ import annotations

import numpy as np

from ..errors import BackendError
from ..kernels import attention, elementwise, mmq, mmvq, quantize, rmsnorm, rope, tiled
from ..kernels.attention.emulate import emulate_combine, emulate_partials
from ..kernels.fused import emulate_qk_norm_rope_kv
from ..kernels.mmq_stock import emulate as mmq_stock_emulate
from ..plans import MMQStockPlan, SubBlockPlan
from .base import Backend, feed_forward_steps

__all__ = ["CpuBackend", "CpuOps"]


class CpuOps:
    """The ops without checks, on numpy arrays: each calls its op's emulator (``out`` is ignored)."""

    def __init__(self, backend: "CpuBackend"):
        self.backend = backend

    def positions(self, start_pos: int, n: int):
        return np.arange(start_pos, start_pos + n, dtype=np.int32)

    def l2_ahead(self, spans, bulk: bool = True) -> None:
        """Cache hints of the CUDA backend (``hiraishin/kernels/l2ahead``): nothing to do here."""

    def l2_ahead_join(self) -> None:
        """Nothing to join (see :meth:`l2_ahead`)."""

    def get_rows(self, table, qtype: str, ids, out=None):
        return elementwise.emulate_get_rows(table, qtype, ids)

    def rms_norm(self, x, w, eps: float, out=None):
        return rmsnorm.emulate(x, w, eps)

    def rope(self, x, pos, cos_table, sin_table, out=None):
        return rope.emulate(x, pos, cos_table, sin_table)

    def swiglu(self, g, u, out=None):
        return elementwise.emulate_swiglu(g, u)

    def add(self, a, b, out=None):
        return elementwise.emulate_add(a, b)

    def argmax_rows(self, x, out=None):
        return elementwise.emulate_argmax_rows(x)

    def quantize(self, x, layout: str | None = None):
        return quantize.emulate(x, layout)

    def mul_mat_q8_1(self, w, qtype: str, xq, plan):
        if isinstance(plan, SubBlockPlan):
            return mmq.emulate(w, qtype, xq, plan)
        if isinstance(plan, MMQStockPlan):
            return mmq_stock_emulate(w, qtype, xq, plan)
        if plan.kernel == "tiled":
            return tiled.emulate(w, qtype, xq, plan)
        return mmvq.emulate(w, qtype, xq, plan)

    def mul_mat(self, w, qtype: str, x, order, out=None):
        return self.mul_mats(((w, qtype),), x, order)[0]

    def mul_mats(self, weights, x, order, outs=None) -> list:
        # one quantization shared by every weight (the emulators read llama.cpp's layout)
        xq = quantize.emulate(x)
        return [self.mul_mat_q8_1(w, qtype, xq, self.backend.matvec_plan(order, x.shape[0], qtype, x.shape[1],
                                                                        w.shape[0]))
                for w, qtype in weights]

    # ---- fused sequences (the unfused emulators composed: the same float ops in the same order)
    def norm_matvecs(self, x, norm_w, eps: float, weights, order, outs=None, residual=None, out_sum=None,
                     argmax=None):
        """``rms_norm(x [+ residual])`` times every weight; with ``residual`` also returns the sum.

        Returns ``(results, s)``: the mat-vec outputs, and ``x + residual`` (None without one). ``argmax``
        (the CUDA ops' tokens written into a device buffer) has no CPU form: ask :meth:`argmax_rows`.
        """
        if argmax is not None:
            raise BackendError("the CPU ops write no token buffer: take argmax_rows of the logits")
        s = None
        if residual is not None:
            s = x = self.add(x, residual)
        return self.mul_mats(weights, self.rms_norm(x, norm_w, eps), order), s

    def embed_norm_matvecs(self, table, qtype: str, ids, norm_w, eps: float, weights, order, outs=None,
                           out_rows=None):
        """The rows of the embedding ``table`` at ``ids``, then :meth:`norm_matvecs` of them: ``(results, rows)``."""
        rows = self.get_rows(table, qtype, ids)
        return self.norm_matvecs(rows, norm_w, eps, weights, order, outs)[0], rows

    def swiglu_matvec(self, g, u, weight, order, out=None):
        """``silu(g) * u`` times ``weight`` (the FFN down projection)."""
        return self.mul_mats((weight,), self.swiglu(g, u), order)[0]

    def norm_swiglu_matvec(self, x, norm_w, eps: float, gate, up, down, order, outs=None, residual=None,
                           out_sum=None, between=None):
        """A feed-forward block: :meth:`norm_matvecs` of ``gate`` and ``up``, ``between()`` (if given), then
        :meth:`swiglu_matvec` into ``down``. ``outs``: (gate's, up's, down's output) or None. Returns
        ``(d, s)`` (``s``: ``x + residual``, None without one). The CUDA ops may do SwiGLU inside the gate/up
        launch: the same bits."""
        return feed_forward_steps(self, x, norm_w, eps, gate, up, down, order, outs or (None, None, None), residual,
                                  out_sum, between)

    def qk_norm_rope_store(self, q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, cache, layer: int,
                           out=None):
        """Head norms and RoPE of q (T, H, D) and k (T, Hkv, D), k and v stored as f16 at cells ``pos``
        of ``cache`` layer ``layer``; returns the roped q."""
        q_out, _ = emulate_qk_norm_rope_kv(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, cache.k(layer),
                                           cache.v(layer))
        return q_out

    def flash_attn(self, q, k_cache, v_cache, q_pos, plan, out=None):
        return attention.emulate(q, k_cache, v_cache, q_pos, plan)

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        T, H, D = q.shape
        plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
        return attention.emulate(q, k_cache, v_cache, q_pos, plan)

    def causal_attention(self, q, k_cache, v_cache, pos, kv_len: int, order, out=None):
        return self.attention(q, k_cache, v_cache, pos, kv_len, order)

    def attention_matvec(self, q, k_cache, v_cache, pos, kv_len: int, order, weight, out=None):
        """:meth:`causal_attention`, then the output projection ``weight`` (data, qtype) of its rows."""
        T, H, D = q.shape
        a = self.causal_attention(q, k_cache, v_cache, pos, kv_len, order)
        return self.mul_mats((weight,), np.ascontiguousarray(a).reshape(T, H * D), order)[0]

    def rope_attention_matvec(self, q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, cache,
                              layer: int, kv_len: int, order, weight, out=None, q_out=None):
        """:meth:`qk_norm_rope_store` of the raw rows, then :meth:`attention_matvec` (the CUDA ops may do
        both in one attention launch: the same bits)."""
        q = self.qk_norm_rope_store(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, cache, layer)
        return self.attention_matvec(q, cache.k(layer), cache.v(layer), pos, kv_len, order, weight)

    def store_kv(self, cache, layer: int, pos, k, v) -> None:
        cache.write(layer, int(pos[0]), k, v)  # a pass's positions are consecutive

    def attention_partials(self, q, k_cache, v_cache, q_pos, plan):
        return emulate_partials(q, k_cache, v_cache, q_pos, plan)

    def attention_combine(self, parts, meta):
        return emulate_combine(parts, meta)

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        cache.write(layer, start_pos, k, v)


class CpuBackend(Backend):
    name = "cpu"
    xp = np

    def __init__(self, device=None):
        super().__init__(device)
        self.ops = CpuOps(self)

    def to_device(self, a):
        return np.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def upload_weight(self, a):
        # GGUF tensors are memory-mapped: keep them mapped (no copy, pages load on first use).
        return np.asarray(a)
