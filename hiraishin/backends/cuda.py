"""The CUDA backend: CuPy arrays, every op a hand-written RawKernel (hiraishin/kernels/*.cu).

A one-token decode step is a few hundred small launches, so the host time per launch is the
speed limit (a Q4_K 4096x4096 mat-vec runs in ~30 us on an H200). Two sets of ops:

* the backend's own ops (:class:`CudaBackend`) check their inputs cheaply and, when anything is
  unusual (a host array, a non-contiguous view, a wrong dtype or shape), hand over to the
  checked kernel-module functions, which convert or raise the clear error;
* :attr:`CudaBackend.unchecked` (:class:`UncheckedCudaOps`) has the same ops without any
  checks, for callers whose arrays are right by construction: the forward pass, whose weights
  are validated at load and whose activations come from these kernels.

Both end in the same launches: the kernel modules' unchecked launchers with cached kernel
handles, cached plans and prepared mat-vec launches. Every launch is the one the checked path
makes (same kernel, geometry and arguments), so the results are the same bits.

Scratch buffers (q8_1 activations, attention partials) of passes of at most
:data:`SCRATCH_MAX_TOKENS` tokens are kept and reused: launches run in order on the current
stream, so a buffer is never rewritten before the kernels reading it have run. (Use one stream
per backend.)
"""

from __future__ import annotations

import numpy as np

from ..kernels import elementwise, fattn_vec, mmvq, rmsnorm, rope
from ..kernels._cuda import cupy_available, require_cupy
from ..kernels.q8_1_layout import LAYOUT_BYTES, layout_for
from ..kernels.quantize_q8_1 import Q8_1_BLOCK_BYTES, QUANTIZE_WARPS_PER_BLOCK, quantize_kernel
from .base import Backend, _fits_all

__all__ = ["CudaBackend", "UncheckedCudaOps", "cuda_available", "SCRATCH_MAX_TOKENS"]

# Passes up to this many tokens (decode steps, speculative verify batches) reuse scratch buffers;
# wider ones (prompt prefill) allocate per call, so the memory held stays small.
SCRATCH_MAX_TOKENS = 8

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return cupy_available()


class _MatVecLaunch:
    """One prepared mat-vec: the plan and, for the mat-vec kernel, its launches
    (``mmvq.prepared_plan``, the ones ``mmvq.mul_mat_vec`` makes); tiled plans run through
    ``mmvq.mul_mat_vec``.
    """

    __slots__ = ("order", "plan", "launch", "n", "layout")

    def __init__(self, order, plan, qtype: str, n: int, row_bytes: int):
        t = mmvq.TYPE_TRAITS[qtype]
        self.order, self.plan, self.n = order, plan, n
        self.launch = None
        self.layout = None  # of the q8_1 activations this mat-vec reads (None: llama.cpp's)
        if plan.kernel == "mmvq":
            self.launch = mmvq.prepared_plan(qtype, n, row_bytes // t.block_bytes * t.qk, plan)
            self.layout = layout_for(qtype)


class _QuantizeLaunch:
    """The q8_1 quantization of (T, K) activations into ``layout``, as ``quantize_q8_1`` launches it."""

    __slots__ = ("kernel", "grid", "block", "scalars", "shape")

    def __init__(self, T: int, K: int, layout: str | None):
        nb = K // 32
        self.kernel = quantize_kernel(layout)
        self.grid = ((nb + QUANTIZE_WARPS_PER_BLOCK - 1) // QUANTIZE_WARPS_PER_BLOCK, T, 1)
        self.block = (32 * QUANTIZE_WARPS_PER_BLOCK, 1, 1)
        self.scalars = (np.int32(K), np.int64(K))
        self.shape = (T, nb * Q8_1_BLOCK_BYTES if layout is None else K // 256 * LAYOUT_BYTES[layout])


class UncheckedCudaOps:
    """The CUDA backend's ops with no input checks (see the module docstring).

    Callers promise: CuPy arrays, C-contiguous, of the dtypes and shapes the op documents on
    :class:`~hiraishin.backends.base.Backend`; ``out`` (when given) of the result's shape,
    float32, C-contiguous and overlapping no input; device positions within the RoPE table and
    below ``kv_len``. A broken promise is undefined behaviour on the GPU, not an error.
    """

    def __init__(self, backend: "CudaBackend"):
        self.backend = backend
        self._empty = backend.xp.empty
        self._matvec_launches: dict = {}
        self._quantize_launches: dict = {}
        self._scratch: dict = {}
        # not per token, or checked cheaply enough: the backend's own
        self.positions = backend.positions
        self.get_rows = backend.get_rows
        self.to_host = backend.to_host

    def _scratch_buffer(self, name: str, shape: tuple, dtype=_F32):
        """A buffer reused across calls for small passes (see the module docstring), else a new one."""
        if shape[0] > SCRATCH_MAX_TOKENS:
            return self._empty(shape, dtype)
        key = (name, shape)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = self._empty(shape, dtype)
        return buf

    def rms_norm(self, x, w, eps: float, out=None):
        return rmsnorm.launch_rms_norm(x, w, eps, self._empty(x.shape, _F32) if out is None else out)

    def rope(self, x, pos, cos_table, sin_table, out=None):
        return rope.launch_rope_neox(x, pos, cos_table, sin_table,
                                     self._empty(x.shape, _F32) if out is None else out)

    def swiglu(self, g, u, out=None):
        return elementwise.launch_binary("hx_swiglu_f32", g, u, self._empty(g.shape, _F32) if out is None else out)

    def add(self, a, b, out=None):
        return elementwise.launch_binary("hx_add_f32", a, b, self._empty(a.shape, _F32) if out is None else out)

    def matvec_launch(self, order, ncols: int, qtype: str, w) -> _MatVecLaunch:
        """The prepared launch for ``ncols`` columns times weight ``w`` under ``order`` (cached)."""
        n, row_bytes = w.shape
        key = (id(order), ncols, qtype, n, row_bytes)
        hit = self._matvec_launches.get(key)
        if hit is None or hit.order is not order:
            hit = _MatVecLaunch(order, self.backend.matvec_plan(order, ncols, qtype), qtype, n, row_bytes)
            if len(self._matvec_launches) >= Backend._PLAN_CACHE_MAX:
                self._matvec_launches.clear()
            self._matvec_launches[key] = hit
        return hit

    def quantize(self, x, layout: str | None = None):
        """q8_1 bytes of float32 ``x`` (T, K) in ``layout`` (None: llama.cpp's), in a scratch
        buffer: the launch ``quantize_q8_1`` makes."""
        T, K = x.shape
        q = self._quantize_launches.get((T, K, layout))
        if q is None:
            q = self._quantize_launches[(T, K, layout)] = _QuantizeLaunch(T, K, layout)
        xq = self._scratch_buffer(f"q8_1 {layout}", q.shape, _U8)
        q.kernel(q.grid, q.block, (x, xq) + q.scalars)
        return xq

    def mul_mat(self, w, qtype: str, x, order, out=None):
        return self.mul_mats(((w, qtype),), x, order, (out,))[0]

    def mul_mats(self, weights, x, order, outs=None) -> list:
        # x is quantized once per layout the launches read: the mat-vec kernel's own for Q4_K /
        # Q6_K weights, llama.cpp's for Q8_0 and for the tiled kernel.
        T = x.shape[0]
        quantized = {}
        results = []
        for i, (w, qtype) in enumerate(weights):
            launch = self.matvec_launch(order, T, qtype, w)
            xq = quantized.get(launch.layout)
            if xq is None:
                xq = quantized[launch.layout] = self.quantize(x, launch.layout)
            if launch.launch is None:  # the tiled kernel
                results.append(mmvq.mul_mat_vec(w, qtype, xq, launch.plan, "cuda"))
                continue
            out = outs[i] if outs is not None else None
            if out is None:
                out = self._empty((T, launch.n), _F32)
            results.append(launch.launch(w, xq, out))
        return results

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        T, H, D = q.shape
        plan = self.backend.attention_plan(order, T, kv_len, H, k_cache.shape[1], D)
        parts = meta = None
        P = plan.parallel_blocks
        if P > 1:
            parts = self._scratch_buffer("attn_parts", (T, H, P, D))
            meta = self._scratch_buffer("attn_meta", (T, H, P, 2))
        return fattn_vec.launch_attention(q, k_cache, v_cache, q_pos, plan,
                                          self._empty(q.shape, _F32) if out is None else out, parts, meta)

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        # One CuPy copy kernel per tensor, rounding float32 to float16 straight into the cache
        # cells: the conversion kernel KVCache.write runs (it casts with astype, then copies the
        # f16 bytes), minus a temporary and a copy.
        T = k.shape[0]
        cache.k(layer)[start_pos:start_pos + T] = k
        cache.v(layer)[start_pos:start_pos + T] = v


class CudaBackend(Backend):
    name = "cuda"
    writes_out = True

    def __init__(self, device=None):
        self.xp = require_cupy()  # BackendError naming what is missing (CuPy, driver, device)
        if isinstance(device, str) and device == "current":
            # this GPU's SM count and our kernels' measured occupancy, as one DeviceProfile that
            # both the mat-vec and the attention planners accept
            device = fattn_vec.current_profile()
        super().__init__(device)
        self._ndarray = self.xp.ndarray
        self.unchecked = UncheckedCudaOps(self)

    def to_device(self, a):
        return self.xp.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return self.xp.asnumpy(a)

    def upload_weight(self, a):
        return self.xp.asarray(np.ascontiguousarray(a))

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def memory_used(self) -> int:
        """Bytes held by CuPy's default memory pool."""
        return int(self.xp.get_default_memory_pool().used_bytes())

    # ---- checked ops: cheap checks, then the unchecked launch; anything unusual goes to the
    # ---- checked kernel-module functions (base class), which convert or raise the clear error
    def _is_c(self, a, dtype, ndim: int) -> bool:
        """``a`` is a C-contiguous CuPy array of ``dtype`` with ``ndim`` dimensions."""
        return type(a) is self._ndarray and a.ndim == ndim and a.dtype == dtype and a.flags.c_contiguous

    def _out(self, out, shape):
        """``out`` when it is a C-contiguous float32 CuPy buffer of ``shape``, else None (allocate)."""
        if (out is not None and type(out) is self._ndarray and out.shape == shape and out.dtype == _F32
                and out.flags.c_contiguous):
            return out
        return None

    def positions(self, start_pos: int, n: int):
        return self.xp.arange(start_pos, start_pos + n, dtype=np.int32)

    def rms_norm(self, x, w, eps: float, out=None):
        if not (self._is_c(x, _F32, 2) and self._is_c(w, _F32, 1) and w.shape[0] == x.shape[1]):
            return super().rms_norm(x, w, eps)
        return self.unchecked.rms_norm(x, w, eps, self._out(out, x.shape))

    def rope(self, x, pos, cos_table, sin_table, out=None):
        # positions on the device are not range-checked (reading them back would sync), as in
        # rope_neox_cuda; host positions take the checked path, which checks them
        if not (self._is_c(x, _F32, 3) and self._is_c(pos, _I32, 1) and pos.shape[0] == x.shape[0]
                and x.shape[2] % 2 == 0 and self._is_c(cos_table, _F32, 2) and self._is_c(sin_table, _F32, 2)
                and cos_table.shape == sin_table.shape and cos_table.shape[1] * 2 == x.shape[2]):
            return super().rope(x, pos, cos_table, sin_table)
        return self.unchecked.rope(x, pos, cos_table, sin_table, self._out(out, x.shape))

    def _pair_ok(self, a, b) -> bool:
        return (type(a) is self._ndarray and type(b) is self._ndarray and a.shape == b.shape
                and a.dtype == _F32 and b.dtype == _F32 and a.flags.c_contiguous and b.flags.c_contiguous)

    def swiglu(self, g, u, out=None):
        if not self._pair_ok(g, u):
            return super().swiglu(g, u)
        return self.unchecked.swiglu(g, u, self._out(out, g.shape))

    def add(self, a, b, out=None):
        if not self._pair_ok(a, b):
            return super().add(a, b)
        return self.unchecked.add(a, b, self._out(out, a.shape))

    def mul_mats(self, weights, x, order, outs=None) -> list:
        ok = self._is_c(x, _F32, 2) and x.shape[1] % 32 == 0 and _fits_all(weights, x)
        if ok:
            for w, qtype in weights:
                if not (type(w) is self._ndarray and w.flags.c_contiguous
                        and w.data.ptr % (4 if qtype == "Q4_K" else 2) == 0):
                    ok = False
                    break
        if not ok:
            return super().mul_mats(weights, x, order, outs)
        T = x.shape[0]
        if outs is not None:
            outs = [self._out(o, (T, w.shape[0])) for o, (w, _) in zip(outs, weights)]
        return self.unchecked.mul_mats(weights, x, order, outs)

    def attention(self, q, k_cache, v_cache, q_pos, kv_len: int, order, out=None):
        if not (self._is_c(q, _F32, 3) and self._is_c(k_cache, _F16, 3) and self._is_c(v_cache, _F16, 3)
                and self._is_c(q_pos, _I32, 1) and k_cache.shape == v_cache.shape
                and q_pos.shape[0] == q.shape[0] and q.shape[2] == k_cache.shape[2]
                and 1 <= kv_len <= k_cache.shape[0]):
            return super().attention(q, k_cache, v_cache, q_pos, kv_len, order)
        # the plan checks the head counts and head_dim (PlanError)
        return self.unchecked.attention(q, k_cache, v_cache, q_pos, int(kv_len), order, self._out(out, q.shape))

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        T = k.shape[0] if len(getattr(k, "shape", ())) == 3 else -1
        if not (getattr(cache, "backend", None) == "cuda" and self._is_c(k, _F32, 3) and self._is_c(v, _F32, 3)
                and k.shape == v.shape and k.shape[1:] == (cache.n_head_kv, cache.head_dim)
                and isinstance(start_pos, int) and 0 <= start_pos <= cache.length
                and start_pos + T <= cache.n_ctx):
            return cache.write(layer, start_pos, k, v)  # checks, and raises the clear error
        self.unchecked.write_kv(cache, layer, start_pos, k, v)
