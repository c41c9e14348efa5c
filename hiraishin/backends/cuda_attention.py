"""The CUDA ops of attention and the KV cache: a part of :class:`~hiraishin.backends.cuda.CudaOps`.

A mixin, so ``cuda.py`` stays readable: these methods use the ops' scratch buffers (``scratch``,
``_q8_1_scratch``), the backend's attention plans and the prepared mat-vecs of the output projection
(``_layouts``, ``_run_matvecs``, ``mul_mat``) that :class:`CudaOps` defines. The same promises as
every CudaOps method: CuPy arrays as documented, no checks.
"""

from __future__ import annotations

import numpy as np

from ..kernels import attention, elementwise
from ..kernels.attention.launch import launch_combine, launch_partials
from ..kernels.fused import launch as fused_launch
from ..kernels.fused.launch import (
    launch_attention_q8_1,
    launch_combine_q8_1,
    launch_qk_norm_rope_kv,
    launch_rope_attention,
)

__all__ = ["CudaAttentionOps"]

_F32 = np.dtype(np.float32)


class CudaAttentionOps:
    """Attention, the q/k norms with RoPE and the KV store, and the attention's output projection."""

    def attention_scratch(self, plan, T: int, H: int, D: int):
        """The partials and meta scratch of a ``plan`` launch for T queries of H heads (None, None
        when P == 1); allocated on first use, so a CUDA-graph capture can allocate them before."""
        P = plan.parallel_blocks
        if P == 1:
            return None, None
        return self.scratch("attn_parts", (T, H, P, D)), self.scratch("attn_meta", (T, H, P, 2))

    def qk_norm_rope_store(self, q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, cache, layer: int,
                           out=None):
        """Head norms and RoPE of q (T, H, D) and k, k and v stored as f16 at the cells of the device
        positions ``pos`` (one fused launch); returns the roped q."""
        q_out = self._empty(q.shape, _F32) if out is None else out
        return launch_qk_norm_rope_kv(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, q_out, cache.k(layer),
                                      cache.v(layer))

    def flash_attn(self, q, k_cache, v_cache, q_pos, plan, out=None, kv_from_positions=False):
        T, H, D = q.shape
        parts, meta = self.attention_scratch(plan, T, H, D)
        return attention.launch(q, k_cache, v_cache, q_pos, plan, self._empty(q.shape, _F32) if out is None else out,
                                parts, meta, kv_from_positions)

    def causal_attention(self, q, k_cache, v_cache, pos, kv_len: int, order, out=None):
        """Attention of a forward pass: ``pos`` are the device positions ``kv_len-T .. kv_len-1``,
        and the kernel reads the KV length from them (graph-replayable at any position whose plan
        is the same). The same launch, hence the same bits, as :meth:`attention`."""
        T, H, D = q.shape
        plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
        return self.flash_attn(q, k_cache, v_cache, pos, plan, out, kv_from_positions=True)

    def attention_matvec(self, q, k_cache, v_cache, pos, kv_len: int, order, weight, out=None, plan=None):
        """:meth:`causal_attention`, then the output projection ``weight`` (data, qtype) of its rows
        (T, H*D). With more than one parallel block the combine quantizes straight into the
        projection's q8_1 layout (``fattn_combine_q8_1``: one launch instead of two, the same bits);
        with one (normalised inside the kernel) the vector kernel does (``HX_ATTN_Q8_1``, unless
        ``HIRAISHIN_ATTN_Q8_1=0``): again the bits of a quantize launch after it."""
        T, H, D = q.shape
        if plan is None:  # (the caller's, when it has made it: rope_attention_matvec)
            plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
        if plan.parallel_blocks == 1 and (plan.kernel == "tile" or not fused_launch.ATTN_Q8_1):
            a = self.flash_attn(q, k_cache, v_cache, pos, plan, self.scratch("attn", (T, H, D)),
                                kv_from_positions=True)
            return self.mul_mat(weight[0], weight[1], a.reshape(T, H * D), order, out)
        mvs, (layout,) = self._layouts((weight,), T, order)
        if plan.parallel_blocks == 1:
            xq = self._q8_1_scratch(T, H * D, layout)
            launch_attention_q8_1(q, k_cache, v_cache, pos, plan, xq, None, layout, kv_from_positions=True)
            return self._run_matvecs((weight,), mvs, {layout: xq}, T, (out,))[0]
        parts, meta = self.attention_scratch(plan, T, H, D)
        # dst is not written when P > 1: the partials stand in for it
        launch_partials(q, k_cache, v_cache, pos, plan, parts, parts, meta, kv_from_positions=True)
        xq = self._q8_1_scratch(T, H * D, layout)
        launch_combine_q8_1(parts, meta, xq, None, layout)
        return self._run_matvecs((weight,), mvs, {layout: xq}, T, (out,))[0]

    def rope_attention_matvec(self, q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, cache,
                              layer: int, kv_len: int, order, weight, out=None, q_out=None):
        """:meth:`qk_norm_rope_store` of the projections' raw rows ``q`` (T, H, D), ``k``, ``v`` (T, Hkv, D)
        (the roped q into ``q_out``), then :meth:`attention_matvec`. A pass of at most ``HIRAISHIN_ATTN_ROPE``
        tokens (``kernels.fused.launch.ATTN_ROPE_TOKENS``, default 4) whose plan runs the one-query vector kernel
        does the first inside its attention launch (``fattn_vec_q1_rope``: the same bits, one launch fewer;
        ``q_out`` is then not written)."""
        T, H, D = q.shape
        k_cache, v_cache = cache.k(layer), cache.v(layer)
        plan = None
        if T <= fused_launch.ATTN_ROPE_TOKENS:
            plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
            if fused_launch.rope_attention_runs(plan) and (plan.parallel_blocks > 1 or fused_launch.ATTN_Q8_1):
                mvs, (layout,) = self._layouts((weight,), T, order)
                xq = self._q8_1_scratch(T, H * D, layout)
                parts, meta = self.attention_scratch(plan, T, H, D)
                launch_rope_attention(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, k_cache, v_cache, plan,
                                      parts, meta, xq, None, layout)
                if plan.parallel_blocks > 1:
                    launch_combine_q8_1(parts, meta, xq, None, layout)
                return self._run_matvecs((weight,), mvs, {layout: xq}, T, (out,))[0]
        q = self.qk_norm_rope_store(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, cache, layer, out=q_out)
        return self.attention_matvec(q, k_cache, v_cache, pos, kv_len, order, weight, out, plan)

    def store_kv(self, cache, layer: int, pos, k, v) -> None:
        """Store float32 ``k``, ``v`` (T, n_head_kv, D) as f16 at the cells of the device positions ``pos``."""
        elementwise.launch_kv_store(k, v, pos, cache.k(layer), cache.v(layer))

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        T, H, D = q.shape
        plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
        return self.flash_attn(q, k_cache, v_cache, q_pos, plan, out)

    def attention_partials(self, q, k_cache, v_cache, q_pos, plan):
        T, H, D = q.shape
        P = plan.parallel_blocks
        parts = self._empty((T, H, P, D), _F32)
        meta = self._empty((T, H, P, 2), _F32)
        launch_partials(q, k_cache, v_cache, q_pos, plan, self._empty(q.shape, _F32), parts, meta)
        return parts, meta

    def attention_combine(self, parts, meta):
        T, H, P, D = parts.shape
        return launch_combine(parts, meta, self._empty((T, H, D), _F32))

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        # One CuPy copy kernel per tensor, rounding float32 to float16 straight into the cache
        # cells: the conversion KVCache.write makes, minus a temporary and a copy.
        T = k.shape[0]
        cache.k(layer)[start_pos:start_pos + T] = k
        cache.v(layer)[start_pos:start_pos + T] = v
