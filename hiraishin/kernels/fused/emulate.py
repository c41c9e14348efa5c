"""Emulators of ``fused.cu``: the compositions of the unfused kernels' emulators.

A fused kernel performs the unfused kernels' float operations in the same order (see the package
docstring), so its emulator *is* the composition of their emulators; tests/test_fused.py and
tests/test_fused_gpu.py check the CUDA source against these bit for bit.
"""

from __future__ import annotations

import numpy as np

from .. import quantize
from ..attention.emulate import emulate as _attention
from ..attention.emulate import emulate_combine as _combine
from ..elementwise.emulate import emulate_add as _add
from ..elementwise.emulate import emulate_get_rows as _get_rows
from ..elementwise.emulate import emulate_swiglu as _swiglu
from ..rmsnorm.emulate import emulate as _rms_norm
from ..rope.emulate import emulate as _rope

__all__ = ["emulate_rms_norm_q8_1", "emulate_add_rms_norm_q8_1", "emulate_embed_rms_norm_q8_1", "emulate_swiglu_q8_1", "emulate_qk_norm_rope_kv",
           "emulate_combine_q8_1", "emulate_attention_q8_1"]


def emulate_rms_norm_q8_1(x: np.ndarray, w: np.ndarray, eps: float, layout: str | None = None):
    """``(xq, y)``: ``y = rms_norm(x, w, eps)`` (float32 (rows, n)) and ``xq`` its q8_1 bytes in ``layout``."""
    y = _rms_norm(x, w, eps)
    return quantize.emulate(y, layout), y


def emulate_add_rms_norm_q8_1(a: np.ndarray, b: np.ndarray, w: np.ndarray, eps: float, layout: str | None = None):
    """``(s, xq, y)``: ``s = a + b``, then :func:`emulate_rms_norm_q8_1` of ``s``."""
    s = _add(a, b)
    xq, y = emulate_rms_norm_q8_1(s, w, eps, layout)
    return s, xq, y


def emulate_embed_rms_norm_q8_1(table: np.ndarray, qtype: str, ids, w: np.ndarray, eps: float,
                                layout: str | None = None):
    """``(rows, xq, y)``: ``rows`` = the embedding ``table``'s rows at ``ids``, dequantized (get_rows), then
    :func:`emulate_rms_norm_q8_1` of them."""
    rows = _get_rows(table, qtype, np.asarray(ids, dtype=np.int32))
    xq, y = emulate_rms_norm_q8_1(rows, w, eps, layout)
    return rows, xq, y


def emulate_swiglu_q8_1(g: np.ndarray, u: np.ndarray, layout: str | None = None):
    """``(xq, m)``: ``m = silu(g) * u`` (float32 (rows, k)) and ``xq`` its q8_1 bytes in ``layout``."""
    m = _swiglu(g, u)
    return quantize.emulate(m, layout), m


def emulate_qk_norm_rope_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_norm_w: np.ndarray,
                            k_norm_w: np.ndarray, eps: float, pos, cos_t: np.ndarray, sin_t: np.ndarray,
                            k_cache: np.ndarray, v_cache: np.ndarray):
    """Per-head RMSNorm of ``q`` (T, H, D) and ``k`` (T, Hkv, D), NEOX RoPE at ``pos`` (T,), and the
    f16 store of k and ``v`` (T, Hkv, D) into cells ``pos`` of ``k_cache`` / ``v_cache`` (float16
    (n_ctx, Hkv, D), written in place). Returns ``(q_out, k_rope)`` (float32 (T, H, D), (T, Hkv, D)).
    """
    T, H, D = q.shape
    Hkv = k.shape[1]
    pos = np.ascontiguousarray(pos, dtype=np.int32)
    qn = _rms_norm(np.ascontiguousarray(q).reshape(T * H, D), q_norm_w, eps).reshape(T, H, D)
    kn = _rms_norm(np.ascontiguousarray(k).reshape(T * Hkv, D), k_norm_w, eps).reshape(T, Hkv, D)
    q_out = _rope(qn, pos, cos_t, sin_t)
    k_rope = _rope(kn, pos, cos_t, sin_t)
    with np.errstate(over="ignore"):  # beyond the f16 range -> +-inf, as the GPU cast gives
        k_cache[pos] = k_rope.astype(np.float16)
        v_cache[pos] = np.asarray(v, dtype=np.float32).astype(np.float16)
    return q_out, k_rope


def emulate_combine_q8_1(parts: np.ndarray, meta: np.ndarray, layout: str | None = None):
    """``(xq, o)``: ``o`` = the attention combine of ``parts`` (T, H, P, D) and ``meta`` (T, H, P, 2),
    float32 (T, H, D), and ``xq`` the q8_1 bytes of its rows (T, H*D) in ``layout``."""
    o = _combine(parts, meta)
    T, H, D = o.shape
    return quantize.emulate(np.ascontiguousarray(o).reshape(T, H * D), layout), o


def emulate_attention_q8_1(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, q_pos: np.ndarray, plan,
                           layout: str | None = None):
    """``(xq, o)``: ``o`` = the attention of a one-parallel-block vector ``plan`` (float32 (T, H, D)) and
    ``xq`` the q8_1 bytes of its rows (T, H*D) in ``layout``: what fattn_vec.cu's kernels compiled with
    HX_ATTN_Q8_1 write."""
    if plan.parallel_blocks != 1:
        raise ValueError(f"the attention's q8_1 output needs one parallel block, the plan has {plan.parallel_blocks}")
    o = _attention(q, k_cache, v_cache, q_pos, plan)
    T, H, D = o.shape
    return quantize.emulate(np.ascontiguousarray(o).reshape(T, H * D), layout), o
