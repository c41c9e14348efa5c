"""Prepared launches of ``fused.cu`` (what each kernel equals: the package docstring).

Each launch object is built once per shape (everything but the arrays: kernel handle, grid,
block, scalar arguments) and called with the arrays, writing into given ``out`` buffers, like
:class:`hiraishin.kernels.quantize.launch.QuantizeLaunch`. Calls are unchecked: arrays must be
C-contiguous CuPy arrays of the documented dtypes and shapes, outputs not overlapping inputs.
No argument changes per decode step (positions are read from a device array), so a CUDA graph
that captured a call replays it for any position.
"""

from __future__ import annotations

import functools

import numpy as np

from ..attention.emulate import attention_scale
from ..attention.launch import SOURCE_VEC, launch_partials
from ..compile import get_kernel
from ..elementwise.launch import GET_ROWS_KERNELS
from ..pdl import trigger_defines
from ..quantize.launch import QUANTIZE_WARPS_PER_BLOCK, output_shape, quantize_defines
from ..rmsnorm.emulate import block_threads
from ...plans.attention import KERNEL_Q1, NTHREADS
from ...switches import env_flag, env_int

__all__ = ["SOURCE", "SOURCE_EMBED", "EMBED_NORM", "EMBED_NORM_KERNELS", "EmbedRmsNormQ8_1Launch",
           "launch_embed_rms_norm_q8_1", "NULL", "NORM_BLOCK_THREADS", "NORM_PLAYED_MAX_VALUES", "fused_kernel", "norm_geometry",
           "norm_slices", "RmsNormQ8_1Launch", "AddRmsNormQ8_1Launch", "SwigluQ8_1Launch", "QkNormRopeKvLaunch",
           "launch_rms_norm_q8_1", "launch_add_rms_norm_q8_1", "launch_swiglu_q8_1", "launch_qk_norm_rope_kv",
           "SOURCE_COMBINE", "CombineQ8_1Launch", "launch_combine_q8_1", "ATTN_Q8_1", "attention_q8_1_epilogue",
           "launch_attention_q8_1", "ATTN_ROPE_TOKENS", "ROPE_MAX_TOKENS", "RopeAttentionLaunch", "rope_attention_runs", "launch_rope_attention"]

# fused.cu is compiled after the unfused sources whose device functions it calls (hx_rms_scale,
# hx_q8_1_store): one copy of that code for the fused and the unfused kernels.
SOURCE = ("rmsnorm/rmsnorm.cu", "quantize/quantize_q8_1.cu", "fused/fused.cu")
# The embedding and the first norm in one launch (embed_norm.cu): the norm kernels' code after get_rows'
# element functions (elementwise.cu). Off: measured no faster on the H200 (bench/results/2026-12-05-h200-session22,
# graph replays, logits digests equal: every pass within +-0.5%, e.g. the 0.6B's one token 0.630 -> 0.632 ms, the
# 8B's 2.334 -> 2.344; the pass's first launch waits on nothing in a replay, so removing it saves nothing).
# HIRAISHIN_EMBED_NORM=1 repeats the A/B.
SOURCE_EMBED = SOURCE + ("elementwise/elementwise.cu", "fused/embed_norm.cu")
# one per get_rows table type, named after get_rows' kernel of that type
EMBED_NORM_KERNELS = {q: name.replace("hx_get_rows_", "hx_embed_rms_norm_q8_1_") for q, name in GET_ROWS_KERNELS.items()}
ENV_EMBED_NORM = "HIRAISHIN_EMBED_NORM"
EMBED_NORM = env_flag(ENV_EMBED_NORM, False, "the embedding lookup with the first norm")
# The attention combine with the q8_1 store behind it: fattn_vec.cu's fattn_combine_q8_1 (compiled
# with HX_COMBINE_Q8_1) after quantize_q8_1.cu, whose hx_q8_1_store it calls.
SOURCE_COMBINE = ("quantize/quantize_q8_1.cu", "attention/fattn_vec.cu")
# The one-block (P == 1) vector attention with the q8_1 store of its normalised rows: fattn_vec.cu
# compiled with HX_ATTN_Q8_1 after quantize_q8_1.cu, like the combine. On by default; HIRAISHIN_ATTN_Q8_1=0 keeps
# the attention's float rows and a quantize launch of its own (the A/B). H200, FIXED_SPLIT graph replays, same
# digests (bench/results/2026-12-04-h200-session14/a-attn-q8-q6k-tests), 0 -> 1: the 0.6B 0.712 -> 0.691 /
# 0.883 -> 0.874 / 0.914 -> 0.906 ms at 1 / 2 / 3 tokens; the 8B within 0.3% (that launch was off its critical path).
ATTN_Q8_1_PRELUDE = ("quantize/quantize_q8_1.cu",)
ENV_ATTN_Q8_1 = "HIRAISHIN_ATTN_Q8_1"
ATTN_Q8_1 = env_flag(ENV_ATTN_Q8_1, True, "the attention's own q8_1 store")
# A pass's q/k head norms, RoPE and KV store inside its attention launch (fattn_vec.cu fattn_vec_q1_rope,
# compiled with HX_ATTN_ROPE after rmsnorm.cu; plans of the one-query kernel of up to ROPE_MAX_TOKENS tokens):
# one launch a layer fewer, the same bits. Each block redoes its head's norm (and, in the blocks holding the
# pass's cells, its KV head's), work the separate launch spreads over more blocks. Measured on the H200
# (bench/results/2026-12-05-h200-session22, graph replays, logits digests equal): faster for one token (the
# 0.6B 0.632 -> 0.617 ms, the 8B 2.339 -> 2.329 under BATCH_INVARIANT; the bench's draft step 0.624 -> 0.610),
# slower for three (0.818 -> 0.862, 3.341 -> 3.391: every token's block norms every cell's k). So the backend
# fuses passes of at most ATTN_ROPE_TOKENS tokens: HIRAISHIN_ATTN_ROPE (0: never; at most 16), default below.
# Since session 24 a block loads every stored token's k and v at once (one L2 round trip a pass, where the
# measured kernel made two a token, one after another). Still slower past one token, on an H100
# (bench/results/2026-12-05-h100-session25/b-attn-rope-bench, HIRAISHIN_ATTN_ROPE 1 -> 16, digests equal): the
# 8B under SUBBLOCK 3.095 -> 3.234 / 3.777 -> 4.033 / 3.964 -> 4.802 ms at 3 / 9 / 16 tokens, BATCH_INVARIANT
# 3.396 -> 3.545 at 3; the 0.6B alike. The separate launch's spread of the norms over blocks wins there.
# With the cache's first step loaded before the wait at every width (ATTN_EARLY 3, session 29) it wins up to four
# tokens: H100 replays under SUBBLOCK, digests equal (bench/results/2026-12-06-h100-session29), HIRAISHIN_ATTN_ROPE
# 1 -> 16, the 8B 2.983 -> 2.933 / 3.103 -> 3.069 / 3.157 -> 3.132 ms at 2 / 3 / 4 tokens, the 0.6B 0.781 -> 0.735 /
# 0.787 -> 0.754 / 0.812 -> 0.797; 4 -> 16: the 8B 3.192 -> 3.184 / 3.787 -> 4.209 / 3.982 -> 4.791 at 6 / 9 / 16,
# the 0.6B 0.799 -> 0.815 / 0.889 -> 0.951 / 0.940 -> 1.150. Default 4.
ATTN_ROPE_PRELUDE = ("rmsnorm/rmsnorm.cu", "quantize/quantize_q8_1.cu")
ATTN_ROPE_KERNEL = "fattn_vec_q1_rope"
ROPE_MAX_TOKENS = 16  # fattn_vec.cu FV_ROPE_MAX_TOKENS: the passes it takes (a verify pass has at most 16)
ENV_ATTN_ROPE = "HIRAISHIN_ATTN_ROPE"
ATTN_ROPE_DEFAULT_TOKENS = 4  # the measurements above: faster up to four tokens (session 29), slower from nine


def _rope_tokens_from_env() -> int:
    return env_int(ENV_ATTN_ROPE, range(ROPE_MAX_TOKENS + 1), ATTN_ROPE_DEFAULT_TOKENS,
                   "the most tokens a pass may have to take the fused attention launch")


ATTN_ROPE_TOKENS = _rope_tokens_from_env()  # read at import, as the other switches; a test may set it here
# How early fattn_vec_q1_rope asks memory for what it reads (fattn_vec.cu; scheduling only, the same bits):
# 0 as sessions 24-25 measured it; 1 (FV_ROPE_EARLY) the pass's k and v rows together with the positions, not
# after them, and the RoPE table values as soon as the positions arrive, not after the norms' reduction;
# 2 (also FV_V_WITH_K) each step's V cells with its K cells, not after the softmax; 3 (also FV_CACHE_EARLY, while
# PDL triggers after the wait; level 2 otherwise) the cache's cells of the block's first step before the wait (K
# and V for one token, K only for more: registers), the pass's own cells from shared memory, in a build made for
# the pass's width (FV_ROPE_MAX_TOKENS). Each removes dependent memory round trips from
# the one-token pass's longest kernel (session 26's Nsight Compute times of the draft step: 7.9 us for each of
# its 28 attention launches against 3.6-4.8 for a mat-vec). HIRAISHIN_ATTN_EARLY (read at import); default 3:
# H100 replays, same digests at every level (bench/results/2026-12-06-h100-session28), one-token pass of the
# 0.6B 0.641 -> 0.632 / 0.618 / 0.610 ms at levels 1 / 2 / 3, the 8B 2.735 -> 2.707 / 2.671 / 2.534 ms; passes
# of 3 tokens (then level 2 there) unchanged. Level 3 at every width since session 29: 3-token passes with the fused
# launch (HIRAISHIN_ATTN_ROPE=16), level 2 -> 3, the 8B 3.196 -> 3.071 ms, the 0.6B 0.794 -> 0.758, digests equal
# (H100, bench/results/2026-12-06-h100-session29).
ENV_ATTN_EARLY = "HIRAISHIN_ATTN_EARLY"
ATTN_EARLY_LEVELS = {0: {}, 1: {"FV_ROPE_EARLY": 1}, 2: {"FV_ROPE_EARLY": 1, "FV_V_WITH_K": 1},
                     3: {"FV_ROPE_EARLY": 1, "FV_V_WITH_K": 1, "FV_CACHE_EARLY": 1}}
ATTN_EARLY_DEFAULT = 3


def attn_early_build(level: int, tokens: int) -> dict:
    """The #defines of early-loads ``level`` for passes of ``tokens`` tokens: level 3 only where it is sound
    (PDL letting a kernel's dependents launch only after its own wait, so that the writers of the cache's
    earlier cells have finished when its blocks start; level 2 otherwise), built for ``tokens``."""
    if level == 3 and trigger_defines()["HX_PDL_EARLY"]:
        level = 2
    if level == 3:
        return {**ATTN_EARLY_LEVELS[3], "FV_ROPE_MAX_TOKENS": tokens}
    return dict(ATTN_EARLY_LEVELS[level])


def _attn_early_from_env() -> int:
    return env_int(ENV_ATTN_EARLY, ATTN_EARLY_LEVELS, ATTN_EARLY_DEFAULT, "the early-loads level")


ATTN_EARLY = _attn_early_from_env()
# A null device pointer: the optional float outputs are skipped when given this.
NULL = np.uint64(0)
_Q8_1_VALUES = 32  # values per q8_1 block (one warp's lanes)


# Real threads per CUDA block of the norm kernels, which play rmsnorm's tree of block_threads(n)
# threads (fused.cu hx_norm_played: the same adds, so the same bits) when it has more, for rows of
# at most NORM_PLAYED_MAX_VALUES values per tree thread. None: always the tree's own block. H200,
# one-token / three-token passes (bench/results/2026-12-02-h200-session5/d-norm-played): Qwen3-0.6B
# (1024 values, one per tree thread) 0.745 / 0.916 ms with the tree's 1024 threads, 0.726 / 0.902
# with 256, 0.769 / 0.955 with 128; Qwen3-8B (4096 values, four per tree thread) 2.570 ms with 1024,
# 2.796 with 256, 3.459 with 128: only rows of one value per tree thread are played.
NORM_BLOCK_THREADS: int | None = 256
NORM_PLAYED_MAX_VALUES = 1


def norm_geometry(n: int) -> tuple[int, int, int]:
    """(real threads per CUDA block, tree threads each plays, values each tree thread holds) of the
    norm kernels for rows of ``n`` floats; (block_threads(n), 1, 0) when the tree plays itself."""
    tree = block_threads(n)
    threads = tree if NORM_BLOCK_THREADS is None else max(32, min(tree, NORM_BLOCK_THREADS))
    vals = -(-n // tree)
    if threads == tree or tree % threads or vals > NORM_PLAYED_MAX_VALUES:
        return tree, 1, 0
    return threads, tree // threads, vals


# HX_NORM_W_EARLY (fused.cu): the norm kernels read the norm weights of the values a thread stores before
# they wait for the previous kernel. The same bits. HIRAISHIN_NORM_W_EARLY (read at import): "1" (default) on,
# "0" off. H200 graph replays, same logits digests (bench/results/2026-12-04-h200-session18/d-norm-early-gpu-tests):
# one token, the 8B 2.490 -> 2.464 ms (BATCH_INVARIANT), 2.448 -> 2.425 (FIXED_SPLIT), the 0.6B 0.673 -> 0.669
# and 0.629 -> 0.627; three tokens 0.8-1.2% faster.
ENV_NORM_W_EARLY = "HIRAISHIN_NORM_W_EARLY"
NORM_W_EARLY = env_flag(ENV_NORM_W_EARLY, True, "the norm weights loaded before the PDL wait")


def fused_kernel(name: str, layout: str | None = None, layout2: str | None = None, norm_n: int | None = None,
                 source: tuple = SOURCE):
    """The compiled kernel ``name`` of fused.cu writing q8_1 ``layout`` (None: llama.cpp's blocks) and,
    for the norm kernels, optionally a second layout ``layout2`` (their ``yq2`` output); ``norm_n``:
    the norm kernels' row length (their played tree, :func:`norm_geometry`); ``source``: the sources
    (:data:`SOURCE_EMBED` for the embedding norms)."""
    defines = quantize_defines(layout)
    if norm_n is not None:
        _, per, vals = norm_geometry(norm_n)
        if vals:
            defines = {**defines, "HX_NORM_PER": per, "HX_NORM_VALS": vals}
        if NORM_W_EARLY:
            defines = {**defines, "HX_NORM_W_EARLY": 1}
    if layout2 is not None:
        second = quantize_defines(layout2)
        defines = {**defines, "HX_LAYOUT2": second["HX_LAYOUT"], "HX_LAYOUT2_BYTES": second["HX_LAYOUT_BYTES"]}
    return get_kernel(source, name, defines)


def _ptr(a):
    return NULL if a is None else a


def norm_slices(n: int) -> int:
    """CUDA blocks per row of the fused norm kernels: enough for one q8_1 block per warp. Each of
    them computes the row's scale by rmsnorm's one tree (the same bits), so the count changes no
    bit; it only spares one CUDA block from quantizing a long row alone (Qwen3-8B's 4096 values:
    4 blocks of 32 warps; on the H200 one block took 7.5 us per launch, 16% of a decode step,
    bench/results/2026-12-01-h200-session3)."""
    warps = norm_geometry(n)[0] // _Q8_1_VALUES
    return max(1, -(-(n // _Q8_1_VALUES) // warps))


class _NormLaunch:
    """What the norm launches share: the kernel of ``name`` (from ``source``), grid (:func:`norm_slices` ``(n)``,
    rows), block :func:`norm_geometry` ``(n)[0]`` threads (the rmsnorm tree), the scalars (n, eps) and the q8_1
    output's shape; a launch of no rows launches nothing."""

    __slots__ = ("kernel", "grid", "block", "scalars", "shape", "rows")

    def __init__(self, name: str, rows: int, n: int, eps: float, layout: str | None, layout2: str | None,
                 source: tuple = SOURCE):
        self.kernel = fused_kernel(name, layout, layout2, n, source)
        self.rows = rows
        self.grid = (norm_slices(n), rows, 1)
        self.block = (norm_geometry(n)[0], 1, 1)
        self.scalars = (np.int32(n), np.float32(eps))
        self.shape = output_shape(rows, n, layout)

    def _launch(self, args: tuple) -> None:
        if self.rows:
            self.kernel(self.grid, self.block, args + self.scalars)


class RmsNormQ8_1Launch(_NormLaunch):
    """``rms_norm`` of float32 (rows, n) then q8_1 in ``layout``: call ``(x, w, out_q, out_norm=None,
    out_q2=None)``.

    ``w`` float32 (n,); ``out_q`` uint8 :func:`~hiraishin.kernels.quantize.launch.output_shape`
    ``(rows, n, layout)``; ``out_norm`` float32 (rows, n) or None; ``out_q2`` (with ``layout2``) the
    same q8_1 values in ``layout2``, or None. n % 32 == 0 (% 256 with a layout). Grid
    (:func:`norm_slices` ``(n)``, rows), block :func:`norm_geometry` ``(n)[0]`` threads: the rmsnorm tree.
    """

    __slots__ = ()

    def __init__(self, rows: int, n: int, eps: float, layout: str | None = None, layout2: str | None = None):
        super().__init__("hx_rms_norm_q8_1", rows, n, eps, layout, layout2)

    def __call__(self, x, w, out_q, out_norm=None, out_q2=None):
        self._launch((x, w, out_q, _ptr(out_norm), _ptr(out_q2)))
        return out_q


class AddRmsNormQ8_1Launch(_NormLaunch):
    """``s = a + b`` then :class:`RmsNormQ8_1Launch` of ``s``: call ``(a, b, w, out_sum, out_q, out_norm=None,
    out_q2=None)``.

    ``a``, ``b``, ``out_sum`` float32 (rows, n) (``out_sum``, the next residual, overlapping neither).
    """

    __slots__ = ()

    def __init__(self, rows: int, n: int, eps: float, layout: str | None = None, layout2: str | None = None):
        super().__init__("hx_add_rms_norm_q8_1", rows, n, eps, layout, layout2)

    def __call__(self, a, b, w, out_sum, out_q, out_norm=None, out_q2=None):
        self._launch((a, b, w, out_sum, out_q, _ptr(out_norm), _ptr(out_q2)))
        return out_q


class EmbedRmsNormQ8_1Launch(_NormLaunch):
    """The rows of an embedding ``table`` (``qtype`` rows of ``row_bytes`` bytes) at the token ``ids``,
    dequantized into ``out_rows``, then :class:`RmsNormQ8_1Launch` of them: call ``(table, ids, w, out_rows,
    out_q, out_norm=None, out_q2=None)``; ``ids`` int32 (rows,) on the device, ``out_rows`` float32 (rows, n).
    """

    __slots__ = ("row_bytes",)

    def __init__(self, qtype: str, row_bytes: int, rows: int, n: int, eps: float, layout: str | None = None,
                 layout2: str | None = None):
        super().__init__(EMBED_NORM_KERNELS[qtype], rows, n, eps, layout, layout2, SOURCE_EMBED)
        self.row_bytes = np.int64(row_bytes)

    def __call__(self, table, ids, w, out_rows, out_q, out_norm=None, out_q2=None):
        self._launch((table, ids, self.row_bytes, w, out_rows, out_q, _ptr(out_norm), _ptr(out_q2)))
        return out_q


class SwigluQ8_1Launch:
    """``silu(g) * u`` of float32 (rows, k) then q8_1 in ``layout``: call ``(g, u, out_q, out_m=None)``.

    ``out_q`` uint8 ``output_shape(rows, k, layout)``; ``out_m`` float32 (rows, k) or None.
    Grid and block of the quantize launch (one warp per q8_1 block).
    """

    __slots__ = ("kernel", "grid", "block", "scalars", "shape", "rows")

    def __init__(self, rows: int, k: int, layout: str | None = None):
        nb = k // _Q8_1_VALUES
        self.kernel = fused_kernel("hx_swiglu_q8_1", layout)
        self.rows = rows
        self.grid = ((nb + QUANTIZE_WARPS_PER_BLOCK - 1) // QUANTIZE_WARPS_PER_BLOCK, rows, 1)
        self.block = (32 * QUANTIZE_WARPS_PER_BLOCK, 1, 1)
        self.scalars = (np.int32(k),)
        self.shape = output_shape(rows, k, layout)

    def __call__(self, g, u, out_q, out_m=None):
        if self.rows:
            self.kernel(self.grid, self.block, (g, u, out_q, _ptr(out_m)) + self.scalars)
        return out_q


class QkNormRopeKvLaunch:
    """Q/K head norms, NEOX RoPE and the KV store of ``T`` tokens.

    Call ``(q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, q_out, k_cache, v_cache, k_out=None)``:
    ``q`` float32 (T, n_head, D) (or (T, n_head*D)), ``k``, ``v`` float32 (T, n_head_kv, D);
    norm weights float32 (D,); ``pos`` int32 (T,) on the device, each in 0..n_ctx-1;
    ``cos_t``/``sin_t`` float32 (n_ctx, D/2); ``q_out`` float32 (T, n_head, D); ``k_cache``,
    ``v_cache`` one layer's float16 (n_ctx, n_head_kv, D), written at cells ``pos``; ``k_out``
    float32 (T, n_head_kv, D) (the roped k) or None. Grid T * (n_head + 2 n_head_kv) blocks of
    rmsnorm's ``block_threads(D)`` threads.
    """

    __slots__ = ("kernel", "grid", "block", "scalars", "T")

    def __init__(self, T: int, n_head: int, n_head_kv: int, head_dim: int, eps: float):
        self.kernel = fused_kernel("hx_qk_norm_rope_kv")
        self.T = T
        self.grid = (T * (n_head + 2 * n_head_kv), 1, 1)
        self.block = (block_threads(head_dim), 1, 1)
        self.scalars = (np.int32(n_head), np.int32(n_head_kv), np.int32(head_dim), np.float32(eps))

    def __call__(self, q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, q_out, k_cache, v_cache, k_out=None):
        if self.T:
            self.kernel(self.grid, self.block, (q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, q_out,
                                                _ptr(k_out), k_cache, v_cache) + self.scalars)
        return q_out


class CombineQ8_1Launch:
    """The attention combine of (T, H, P, D) partials and their (T, H, P, 2) meta, its output rows
    (T, H*D) quantized to q8_1 in ``layout``: call ``(parts, meta, out_q, out=None)``.

    ``out_q`` uint8 :func:`~hiraishin.kernels.quantize.launch.output_shape` ``(T, H*D, layout)``;
    ``out`` float32 (T, H, D) or None. P > 1 (with one block the attention kernel normalises in
    place and nothing is combined). Grid (T, H), D threads: the combine's launch.
    """

    __slots__ = ("kernel", "grid", "block", "shared", "P", "shape")

    def __init__(self, T: int, H: int, P: int, D: int, layout: str | None = None):
        if P < 2:
            raise ValueError(f"the combine merges P > 1 partials, got P = {P}")
        self.kernel = get_kernel(SOURCE_COMBINE, "fattn_combine_q8_1",
                                 {**quantize_defines(layout), "HX_D": D, "HX_COMBINE_Q8_1": 1})
        self.grid = (T, H, 1)
        self.block = (D, 1, 1)
        self.shared = 8 * P
        self.P = np.int32(P)
        self.shape = output_shape(T, H * D, layout)

    def __call__(self, parts, meta, out_q, out=None):
        self.kernel(self.grid, self.block, (parts, meta, _ptr(out), self.P, out_q), shared_mem=self.shared)
        return out_q


_launches: dict = {}


def _cached(cls, *key):
    hit = _launches.get((cls, key))
    if hit is None:
        hit = _launches[(cls, key)] = cls(*key)
    return hit


def launch_rms_norm_q8_1(x, w, eps: float, out_q, out_norm=None, layout: str | None = None, out_q2=None,
                         layout2: str | None = None):
    """:class:`RmsNormQ8_1Launch` for ``x``'s shape (cached), unchecked. Returns ``out_q``."""
    rows, n = x.shape
    return _cached(RmsNormQ8_1Launch, rows, n, float(eps), layout, layout2)(x, w, out_q, out_norm, out_q2)


def launch_add_rms_norm_q8_1(a, b, w, eps: float, out_sum, out_q, out_norm=None, layout: str | None = None,
                             out_q2=None, layout2: str | None = None):
    """:class:`AddRmsNormQ8_1Launch` for ``a``'s shape (cached), unchecked. Returns ``out_q``."""
    rows, n = a.shape
    return _cached(AddRmsNormQ8_1Launch, rows, n, float(eps), layout, layout2)(a, b, w, out_sum, out_q, out_norm,
                                                                              out_q2)


def launch_embed_rms_norm_q8_1(table, qtype: str, ids, w, eps: float, out_rows, out_q, out_norm=None,
                               layout: str | None = None, out_q2=None, layout2: str | None = None):
    """:class:`EmbedRmsNormQ8_1Launch` for these shapes (cached), unchecked. Returns ``out_q``."""
    rows, n = out_rows.shape
    launch = _cached(EmbedRmsNormQ8_1Launch, qtype, int(table.shape[1]), rows, n, float(eps), layout, layout2)
    return launch(table, ids, w, out_rows, out_q, out_norm, out_q2)


def launch_swiglu_q8_1(g, u, out_q, out_m=None, layout: str | None = None):
    """:class:`SwigluQ8_1Launch` for ``g``'s shape (cached), unchecked. Returns ``out_q``."""
    rows, k = g.shape
    return _cached(SwigluQ8_1Launch, rows, k, layout)(g, u, out_q, out_m)


def launch_qk_norm_rope_kv(q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, q_out, k_cache, v_cache,
                           k_out=None):
    """:class:`QkNormRopeKvLaunch` for these shapes (cached), unchecked. Returns ``q_out``."""
    T, n_head_kv, D = k.shape
    n_head = q_out.shape[1]
    launch = _cached(QkNormRopeKvLaunch, T, n_head, n_head_kv, D, float(eps))
    return launch(q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, q_out, k_cache, v_cache, k_out)


def launch_combine_q8_1(parts, meta, out_q, out=None, layout: str | None = None):
    """:class:`CombineQ8_1Launch` for ``parts``' shape (cached), unchecked. Returns ``out_q``."""
    T, H, P, D = parts.shape
    return _cached(CombineQ8_1Launch, T, H, P, D, layout)(parts, meta, out_q, out)


@functools.cache
def attention_q8_1_epilogue(layout: str | None = None) -> tuple:
    """The (prelude sources, #define items) that give fattn_vec.cu's vector kernels their q8_1 output in
    ``layout`` (:func:`hiraishin.kernels.attention.launch.launch_partials`' ``epilogue``)."""
    return ATTN_Q8_1_PRELUDE, tuple(sorted({**quantize_defines(layout), "HX_ATTN_Q8_1": 1}.items()))


class RopeAttentionLaunch:
    """A pass's q/k head norms, RoPE, KV store and vector attention, one query per CUDA block
    (``fattn_vec_q1_rope``): call ``(q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, k_cache, v_cache, parts, meta,
    out_q, out=None)``.

    ``q`` float32 (T, H, D) (or (T, H*D)), ``k``, ``v`` (T, Hkv, D): the projections' raw rows, T <=
    :data:`ROPE_MAX_TOKENS`; norm weights float32 (D,); ``pos`` int32 (T,) on the device, consecutive; RoPE tables
    float32 (n_ctx, D/2); caches one layer's float16 (n_ctx, Hkv, D), written at cells ``pos`` and read up to the
    last (the KV length is read from ``pos``: graph-replayable). ``P`` parallel blocks over ``kv_attended`` cells
    in chunks of ``chunk_cells`` (a one-query vector plan's fields, :func:`launch_rope_attention`). With ``P == 1``
    the normalised rows go to ``out_q`` as q8_1 in ``layout`` (and to ``out`` float32 (T, H, D) unless None);
    with ``P > 1`` the partials ``parts`` (T, H, P, D) and ``meta`` (T, H, P, 2), which
    :class:`CombineQ8_1Launch` merges. The bits of :class:`QkNormRopeKvLaunch` then the plan's attention.
    """

    __slots__ = ("kernel", "grid", "scalars", "P")

    def __init__(self, T: int, H: int, n_head_kv: int, D: int, P: int, chunk_cells: int, kv_attended: int,
                 eps: float, layout: str | None = None, early: int | None = None):
        if D > NTHREADS or D > block_threads(D):  # the kernel's tree argument (fattn_vec.cu)
            raise ValueError(f"{ATTN_ROPE_KERNEL} needs one value per thread of its block and of rmsnorm's, "
                             f"D <= {NTHREADS}, got D = {D}")
        if not 1 <= T <= ROPE_MAX_TOKENS:
            raise ValueError(f"{ATTN_ROPE_KERNEL} takes 1..{ROPE_MAX_TOKENS} tokens, got {T}")
        self.P = P
        early = ATTN_EARLY if early is None else early  # the build (ATTN_EARLY_LEVELS); the same bits in each
        defines = {**quantize_defines(layout), "HX_D": D, "HX_ATTN_ROPE": 1, **attn_early_build(early, T)}
        if P == 1:
            defines["HX_ATTN_Q8_1"] = 1
        self.kernel = get_kernel(ATTN_ROPE_PRELUDE + (SOURCE_VEC,), ATTN_ROPE_KERNEL, defines)
        self.grid = (T, P, H)
        self.scalars = (np.int32(T), np.int32(H), np.int32(n_head_kv), np.int32(kv_attended), np.int32(chunk_cells),
                        np.float32(attention_scale(D)), np.float32(eps))

    def __call__(self, q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, k_cache, v_cache, parts, meta, out_q,
                 out=None):
        one = self.P == 1
        self.kernel(self.grid, (32, NTHREADS // 32, 1),
                    (q, k, v, q_norm_w, k_norm_w, cos_t, sin_t, k_cache, v_cache, pos, _ptr(out),
                     NULL if one else parts, NULL if one else meta) + self.scalars + (out_q if one else NULL,))
        return out_q if one else parts


def rope_attention_runs(plan) -> bool:
    """Whether ``fattn_vec_q1_rope`` can run ``plan``: the one-query vector kernel, at most
    :data:`ROPE_MAX_TOKENS` queries."""
    return plan.kernel_name == KERNEL_Q1 and plan.n_queries <= ROPE_MAX_TOKENS


def launch_rope_attention(q, k, v, q_norm_w, k_norm_w, eps: float, pos, cos_t, sin_t, k_cache, v_cache, plan,
                          parts, meta, out_q, out=None, layout: str | None = None):
    """:class:`RopeAttentionLaunch` of the one-query vector ``plan`` (cached per geometry), unchecked but
    for the plan: a ValueError names any other."""
    if not rope_attention_runs(plan):
        raise ValueError(f"{ATTN_ROPE_KERNEL} runs {KERNEL_Q1} plans of at most {ROPE_MAX_TOKENS} queries, got "
                         f"{plan.kernel_name} with {plan.n_queries}")
    launch = _cached(RopeAttentionLaunch, plan.n_queries, plan.n_head, plan.n_head_kv, plan.head_dim,
                     plan.parallel_blocks, plan.chunk_cells, plan.kv_attended, float(eps), layout, ATTN_EARLY)
    return launch(q, k, v, q_norm_w, k_norm_w, pos, cos_t, sin_t, k_cache, v_cache, parts, meta, out_q, out)


def launch_attention_q8_1(q, k_cache, v_cache, q_pos, plan, out_q, out=None, layout: str | None = None,
                          kv_from_positions: bool = False):
    """The attention of a one-parallel-block vector ``plan`` whose kernel also quantizes its normalised
    rows (T, H*D) to q8_1 in ``layout`` (``out_q``: :func:`output_shape`), what a quantize launch after it
    would write; ``out`` float32 (T, H, D) or None (not written). Unchecked, like the other launches.
    Returns ``out_q``."""
    launch_partials(q, k_cache, v_cache, q_pos, plan, out, None, None, kv_from_positions, yq=out_q,
                    epilogue=attention_q8_1_epilogue(layout))
    return out_q
