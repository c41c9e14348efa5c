"""The interface the Qwen3 forward pass is written against, once, for both backends.

A :class:`Backend` owns where arrays live (``xp`` is numpy or cupy) and two sets of the same ops:

* the backend's own methods (``backend.rms_norm(...)``, ...) check their inputs once
  (:mod:`.checks`), move host arrays to the device where that is cheap and unambiguous, and call
* :attr:`Backend.ops`, the same ops without any checks, for callers whose arrays are right by
  construction (the forward pass: weights validated at load, activations made by the kernels).
  The CPU's ops run the kernels' Numba emulators (same float ops, same order as the CUDA
  kernels), the CUDA ops launch the kernels.

Every op that sums floats takes its order from the :class:`~hiraishin.order.ReductionOrder` passed
in (through :mod:`hiraishin.plans`, cached there) or a plan; the others have no order to choose.
Ops take an optional ``out``: a buffer of the result's shape and dtype, not overlapping the
inputs, that a backend MAY write the result into (the CUDA backend does; the CPU emulators
allocate); always use the returned array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BackendError, HiraishinError, PlanError, QuantError
from ..plans import attention_plan, matvec_plan
from ..switches import env_flag
from . import checks
from .kv_cache import KVCache

__all__ = ["Backend", "ENV_ATTN_TRIM", "ATTN_TRIM", "feed_forward_steps"]

# The parallel blocks of an attention launch that would sum no filled cell are not launched
# (AttentionPlan.launched: the same bits; a short cache then needs no combine launch).
# HIRAISHIN_ATTN_TRIM=0 launches the order's plan as it is (A/B measurements).
ENV_ATTN_TRIM = "HIRAISHIN_ATTN_TRIM"
ATTN_TRIM = env_flag(ENV_ATTN_TRIM, True, "attention without the blocks past the filled cells")


def feed_forward_steps(ops, x, norm_w, eps: float, gate, up, down, order, outs, residual, out_sum, between):
    """A feed-forward block as its steps, on either backend's ``ops`` (the CPU's whole ``norm_swiglu_matvec``,
    the CUDA ops' where they fuse nothing): ``norm_matvecs`` of ``gate`` and ``up``, ``between()`` (if given),
    then ``swiglu_matvec`` into ``down``. ``outs``: (gate's, up's, down's output). Returns ``(d, s)``."""
    (g, u), s = ops.norm_matvecs(x, norm_w, eps, (gate, up), order, outs[:2], residual, out_sum)
    if between is not None:
        between()
    return ops.swiglu_matvec(g, u, down, order, out=outs[2]), s


class Backend:
    """Ops of the forward pass on one backend. Subclasses set ``name``, ``xp`` and ``ops``.

    ``device`` is the device profile the plans are made for: ``None`` (the order's profile, else
    the default ``h200`` — on both backends, so CPU and GPU run the same plans), a profile name or
    :class:`~hiraishin.devices.DeviceProfile`, or on ``cuda`` ``"current"`` (this GPU, measured).
    """

    name: str = "?"
    xp: Any = np
    writes_out: bool = False  # True when the ops write into a given ``out`` buffer
    ops: Any = None  # the unchecked ops (see the module docstring)

    def __init__(self, device=None):
        self.device = device

    @property
    def unchecked(self):
        """The ops without input checks (:attr:`ops`)."""
        return self.ops

    # ---- plans ----------------------------------------------------------------------------------
    def matvec_plan(self, order, ncols: int, qtype: str, k: int | None = None, n: int | None = None):
        """The mat-vec plan ``order`` gives ``ncols`` columns of a (``n``, ``k``) ``qtype`` weight here."""
        return matvec_plan(order, ncols, qtype, self.device, k, n)

    def attention_plan(self, order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int, head_dim: int):
        """The attention plan of ``order`` for one launch on this device, as launched: without the
        parallel blocks past the filled cells (:meth:`~hiraishin.plans.AttentionPlan.launched`, the
        same bits; unless ``HIRAISHIN_ATTN_TRIM=0``). ``hiraishin.plans.attention_plan`` gives the
        order's plan itself."""
        plan = attention_plan(order, n_queries, kv_len, n_head, n_head_kv, head_dim, self.device)
        return plan.launched() if ATTN_TRIM else plan

    # ---- arrays ---------------------------------------------------------------------------------
    def to_device(self, a):
        """A host (numpy) array on this backend."""
        raise NotImplementedError

    def to_host(self, a) -> np.ndarray:
        """A backend array as a numpy array."""
        raise NotImplementedError

    def upload_weight(self, a):
        """A weight tensor (possibly a read-only memmap) on this backend, without needless copies."""
        raise NotImplementedError

    def relayout_weight(self, data, name: str, qtype: str, shape: tuple, tiles: bool) -> bool:
        """Lay weight ``name``'s ``data`` out as 16-row tile records (``tiles``) or ggml's rows, in place; True if its
        bytes moved. Tiles are a CUDA layout (:mod:`hiraishin.kernels.mmq.wtile`): here only rows."""
        if tiles:
            raise HiraishinError(f"weight tiles are read by the CUDA sub-block kernels only, not on {self.name}")
        return False

    def synchronize(self) -> None:
        """Wait for queued work (for timings); a no-op on the CPU."""

    def _arr(self, a, dtype=None):
        """``a`` as a C-contiguous array of this backend (a host array is uploaded on CUDA; a CuPy
        array given to the CPU backend is an error, not a silent download)."""
        if self.xp is np and checks.is_cupy(a):
            raise BackendError(f"the cpu backend got a CuPy array ({tuple(a.shape)}); use backend 'cuda' "
                               "or move it to the host")
        a = self.xp.asarray(a) if dtype is None else self.xp.asarray(a, dtype=dtype)
        return self.xp.ascontiguousarray(a)

    # ---- checked ops ----------------------------------------------------------------------------
    def positions(self, start_pos: int, n: int):
        """Absolute positions ``start_pos .. start_pos+n-1`` as an int32 (n,) array on this backend."""
        return self.ops.positions(start_pos, n)

    def get_rows(self, table, qtype: str, ids):
        """Rows ``ids`` (T,) of a quantized (or F16/F32) table, dequantized: float32 (T, K)."""
        table = self._arr(table)
        if table.dtype != np.uint8:  # F32/F16 tables may arrive as float arrays; the kernels read bytes
            table = table.view(np.uint8).reshape(table.shape[0], -1)
        if isinstance(ids, np.ndarray) or not checks.is_cupy(ids):
            ids = np.ascontiguousarray(ids, dtype=np.int32)
        checks.check_get_rows(table, qtype, ids)
        return self.ops.get_rows(table, qtype, self._arr(ids, np.int32))

    def rms_norm(self, x, w, eps: float, out=None):
        """``(scale * x) * w`` per row of ``x`` (rows, n)."""
        x, w = self._arr(x), self._arr(w)
        checks.check_rms_norm(x, w)
        return self.ops.rms_norm(x, w, eps, self._out(out, x.shape))

    def rope(self, x, pos, cos_table, sin_table, out=None):
        """NEOX RoPE of ``x`` (T, n_head, D) at absolute positions ``pos`` (T,)."""
        x, cos_table, sin_table = self._arr(x), self._arr(cos_table, np.float32), self._arr(sin_table, np.float32)
        if not checks.is_cupy(pos):
            pos = np.ascontiguousarray(pos, dtype=np.int32)
            checks.check_rope_positions(pos, cos_table.shape[0])
        pos = self._arr(pos, np.int32)
        checks.check_rope(x, pos, cos_table, sin_table)
        return self.ops.rope(x, pos, cos_table, sin_table, self._out(out, x.shape))

    def swiglu(self, g, u, out=None):
        """``silu(g) * u``."""
        checks.check_pair("swiglu", g, u)
        g, u = self._arr(g), self._arr(u)
        return self.ops.swiglu(g, u, self._out(out, g.shape))

    def add(self, a, b, out=None):
        """``a + b`` (residual)."""
        checks.check_pair("add", a, b)
        a, b = self._arr(a), self._arr(b)
        return self.ops.add(a, b, self._out(out, a.shape))

    def argmax_rows(self, x):
        """int32 (T,): the first index of each row's largest value of float32 ``x`` (T, n) (NaN
        counts as largest, as numpy's argmax): greedy decoding's tokens, computed where ``x`` is."""
        x = self._arr(x)
        if x.ndim != 2 or x.dtype != np.float32:
            raise BackendError(f"argmax_rows needs a float32 (T, n) array, got {x.dtype} {x.shape}")
        return self.ops.argmax_rows(x)

    def quantize_q8_1(self, x, layout: str | None = None):
        """q8_1 bytes (ncols, K/32*36) of float32 ``x`` (ncols, K); ``layout`` ``"Q4_K"``/``"Q6_K"``:
        the mat-vec kernel's own layout for that weight type, ``"MMA_Q4_K"``/``"MMA_Q6_K"`` the sub-block
        MMA kernel's, ``"MMA8_Q4_K"``/``"MMA8_Q6_K"`` those with each group of 8 columns interleaved (rows
        rounded up to whole groups: ``quantize.layout.layout_rows``) (K a multiple of 256)."""
        from ..kernels.quantize.layout import LAYOUT_BYTES, SUPER_BLOCK

        x = self._arr(x)
        checks.check_activations(x, what="quantize_q8_1")
        if layout is not None:
            if layout not in LAYOUT_BYTES:
                raise QuantError(f"quantize_q8_1: unknown layout {layout!r}; expected None or one of "
                                        f"{sorted(LAYOUT_BYTES)}")
            if x.shape[1] % SUPER_BLOCK:
                raise QuantError(f"quantize_q8_1: layout {layout} needs K a multiple of {SUPER_BLOCK}, "
                                        f"got K={x.shape[1]} (activations {tuple(x.shape)})")
        return self.ops.quantize(x, layout)

    def mul_mat(self, w, qtype: str, x, order, out=None):
        """``x @ W.T``: x float32 (T, K), W quantized (N, row_bytes) -> float32 (T, N)."""
        return self.mul_mats(((w, qtype),), x, order, (out,))[0]

    def mul_mats(self, weights, x, order, outs=None) -> list:
        """``x @ W.T`` for every ``(W, qtype)`` of ``weights`` (one input, e.g. Q/K/V or gate/up).

        ``x`` is quantized to q8_1 once per activation layout and shared: the same bytes each
        separate :meth:`mul_mat` would make (quantization is deterministic), so the same results.
        ``outs``: one optional output buffer per weight.
        """
        weights = [(self._arr(w), qtype) for w, qtype in weights]
        x = self._arr(x)
        for w, qtype in weights:
            n, k = checks.check_weight(w, qtype)
            checks.check_activations(x, k, what=f"activations for a {qtype} weight of shape {tuple(w.shape)}")
        if x.shape[0] == 0:
            return [self.xp.empty((0, w.shape[0]), np.float32) for w, _ in weights]
        outs = [self._out(o, (x.shape[0], w.shape[0])) for o, (w, _) in zip(outs or [None] * len(weights), weights)]
        return self.ops.mul_mats(weights, x, order, outs)

    def mul_mat_q8_1(self, w, qtype: str, xq, plan):
        """``w`` (N, row_bytes) times q8_1 activations ``xq`` (ncols, K/32*36, llama.cpp's layout),
        with an explicit ``plan`` (:func:`hiraishin.plans.matvec_plan`) -> float32 (ncols, N)."""
        w, xq = self._arr(w), self._arr(xq)
        n, k = checks.check_weight(w, qtype)
        ncols = checks.check_q8_1(xq, qtype, k, w.shape)
        checks.check_matvec_plan(plan, qtype, ncols, xq.shape, k)
        return self.ops.mul_mat_q8_1(w, qtype, xq, plan)

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        """Causal attention of ``q`` (T, n_head, D) over the first ``kv_len`` cache cells."""
        q, q_pos = self._attention_inputs(q, k_cache, v_cache, q_pos, kv_len)
        T, H, D = q.shape
        plan = self.attention_plan(order, T, int(kv_len), H, k_cache.shape[1], D)
        return self.ops.flash_attn(q, k_cache, v_cache, q_pos, plan, self._out(out, q.shape))

    def flash_attn(self, q, k_cache, v_cache, q_pos, plan, out=None):
        """One attention launch with an explicit ``plan`` -> float32 (T, n_head, D)."""
        q, q_pos = self._attention_inputs(q, k_cache, v_cache, q_pos, self._plan_kv_len(plan))
        checks.check_attention_plan(plan, q, k_cache)
        return self.ops.flash_attn(q, k_cache, v_cache, q_pos, plan, self._out(out, q.shape))

    def attention_partials(self, q, k_cache, v_cache, q_pos, plan):
        """First stage of a launch with ``P > 1``: unnormalised partials (T, H, P, D) and their
        ``(max, sum)`` meta (T, H, P, 2)."""
        if plan.parallel_blocks == 1:
            raise PlanError("plan has parallel_blocks == 1: the kernel normalises in place and writes no "
                            "partials; use flash_attn")
        q, q_pos = self._attention_inputs(q, k_cache, v_cache, q_pos, self._plan_kv_len(plan))
        checks.check_attention_plan(plan, q, k_cache)
        return self.ops.attention_partials(q, k_cache, v_cache, q_pos, plan)

    def attention_combine(self, parts, meta):
        """Second stage: merge ``P`` partials in block order (``fattn_combine``) -> (T, H, D) float32."""
        checks.check_combine(parts, meta)
        return self.ops.attention_combine(self._arr(parts, np.float32), self._arr(meta, np.float32))

    def _attention_inputs(self, q, k_cache, v_cache, q_pos, kv_len):
        for name, arr in (("k_cache", k_cache), ("v_cache", v_cache)):
            if self.xp is not np and not checks.is_cupy(arr):
                raise BackendError(f"{name} must be a CuPy array for backend 'cuda' (got {type(arr).__name__})")
            if self.xp is np and checks.is_cupy(arr):
                raise BackendError(f"{name} is a CuPy array but backend is 'cpu'")
        q = self._arr(q) if hasattr(q, "shape") else q
        if not checks.is_cupy(q_pos):
            q_pos = np.asarray(q_pos)
        checks.check_attention(q, k_cache, v_cache, q_pos, kv_len)
        return q, self._arr(q_pos, np.int32)

    @staticmethod
    def _plan_kv_len(plan) -> int:
        """The filled KV length an attention plan was made for (a non-plan: 0, refused by the checks)."""
        return plan.kv_len if getattr(plan, "kv_len", None) is not None else getattr(plan, "kv_attended", 0)

    def kv_cache(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> KVCache:
        """An f16 KV cache on this backend."""
        return KVCache(n_layer, n_ctx, n_head_kv, head_dim, backend=self.name)

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        """Store float32 ``k``, ``v`` (T, n_head_kv, D) in ``cache`` at cells ``start_pos..`` (f16)."""
        cache.write(layer, start_pos, k, v)  # checks, and raises the clear error

    def _out(self, out, shape):
        """``out`` when it is a C-contiguous float32 buffer of this backend of ``shape``, else None."""
        if (out is not None and isinstance(out, self.xp.ndarray) and tuple(out.shape) == tuple(shape)
                and out.dtype == np.float32 and out.flags.c_contiguous):
            return out
        return None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"
