"""Fused kernels for what runs between the mat-vecs: fewer launches, the same bits.

Each kernel performs exactly the float operations of the unfused sequence it replaces, in the
same order (no new reduction order: every sum keeps the unfused kernel's tree), so its outputs
equal that sequence's bit for bit; tests/test_fused.py (the CUDA source on the CPU, through the
g++ shim) and tests/test_fused_gpu.py (on a GPU) check it against the unfused kernels and the
emulators. ``layout`` is the q8_1 activation layout written: ``None`` (llama.cpp's blocks),
``"Q4_K"`` or ``"Q6_K"`` (the mat-vec's, :mod:`hiraishin.kernels.quantize.layout`).

============================  ===========================================================================
fused kernel (``fused.cu``)   equals, bit for bit
============================  ===========================================================================
``hx_rms_norm_q8_1``          ``y = rmsnorm.cu hx_rms_norm_f32(x, w, eps)`` (rows, n), then
                              ``quantize_q8_1.cu quantize_q8_1(y)`` in ``layout``; optionally ``y`` too,
                              and ``quantize_q8_1(y)`` in a second ``layout2`` (``yq2``)
``hx_add_rms_norm_q8_1``      ``s = elementwise.cu hx_add_f32(a, b)`` (written: the next residual),
                              then ``hx_rms_norm_q8_1(s, w, eps)``
``hx_embed_rms_norm_q8_1_*``   ``s = elementwise.cu hx_get_rows_*(table, ids)`` (written: the embedding, the
(in ``embed_norm.cu``)        first residual), then ``hx_rms_norm_q8_1(s, w, eps)``: a pass's first launch
``hx_swiglu_q8_1``            ``m = elementwise.cu hx_swiglu_f32(g, u)``, then ``quantize_q8_1(m)`` in
                              ``layout``; optionally ``m`` too
``hx_qk_norm_rope_kv``        ``hx_rms_norm_f32`` of every head of q (T, H, D) with ``q_norm_w`` and of k
                              (T, Hkv, D) with ``k_norm_w``; ``rope.cu hx_rope_neox_f32`` of both at
                              ``pos`` (a device int32 (T,)); q out as float32; k (after RoPE) and v
                              rounded f32 -> f16 (nearest even) into the KV-cache cells ``pos[t]`` of one
                              layer (``model/kv_cache.py``: (n_ctx, Hkv, D) float16), what
                              ``KVCache.write`` / the backend's ``write_kv`` store; optionally k float32
``fattn_combine_q8_1``        ``o = attention/fattn_vec.cu fattn_combine(parts, meta)`` (T, H, D), then
(in ``fattn_vec.cu``)         ``quantize_q8_1(o)`` of its rows (T, H*D) in ``layout`` (the output
                              projection's input); optionally ``o`` too
``fattn_vec_*`` with          one parallel block (``P = 1``): ``o = fattn_vec_*(q, K, V)`` (T, H, D), then
``HX_ATTN_Q8_1``              ``quantize_q8_1(o)`` of its rows in ``layout``, stored by the threads that
(in ``fattn_vec.cu``)         normalise ``o``; optionally ``o`` too (``launch_attention_q8_1``)
``fattn_vec_q1_rope``         T <= 16 tokens: ``hx_qk_norm_rope_kv`` of their raw q, k, v, then ``fattn_vec_q1``
(``HX_ATTN_ROPE``, in         of the roped q (with ``HX_ATTN_Q8_1``'s q8_1 when ``P = 1``; partials for the
``fattn_vec.cu``)             combine when ``P > 1``); each block norms its own q head and stores the pass's
                              cells in its chunks (``launch_rope_attention``; the backend
                              takes it for passes of at most ``HIRAISHIN_ATTN_ROPE`` tokens,
                              default 1: measured faster there, slower at 3)
============================  ===========================================================================

Geometry: the norm kernels run rmsnorm's tree of ``block_threads(n)`` threads, in a block of that
many or, for rows of one value per tree thread, in a smaller block whose threads each play several
tree threads (``launch.norm_geometry``; the same adds), several blocks per row each computing the
scale, and quantize inside it (one q8_1 block per warp); SwiGLU
runs the quantize launch (one warp per q8_1 block). Nothing per step is a scalar argument.

Files: ``fused.cu``, ``embed_norm.cu`` (and ``fattn_combine_q8_1`` in ``attention/fattn_vec.cu``, beside the combine it
extends); :mod:`.launch` (prepared launches ``RmsNormQ8_1Launch``, ``AddRmsNormQ8_1Launch``,
``SwigluQ8_1Launch``, ``QkNormRopeKvLaunch``, ``CombineQ8_1Launch``, ``RopeAttentionLaunch`` and cached ``launch_*``
functions); :mod:`.emulate` (``emulate_*``, the compositions of the unfused emulators).
"""

from .emulate import (
    emulate_add_rms_norm_q8_1,
    emulate_attention_q8_1,
    emulate_combine_q8_1,
    emulate_embed_rms_norm_q8_1,
    emulate_qk_norm_rope_kv,
    emulate_rms_norm_q8_1,
    emulate_swiglu_q8_1,
)

__all__ = ["emulate_rms_norm_q8_1", "emulate_add_rms_norm_q8_1", "emulate_embed_rms_norm_q8_1", "emulate_swiglu_q8_1", "emulate_qk_norm_rope_kv",
           "emulate_combine_q8_1", "emulate_attention_q8_1"]
