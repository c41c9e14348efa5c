"""Launchers of ``elementwise.cu`` (1-D launches; no reduction, so the block size changes no bit)."""

from __future__ import annotations

import functools

import numpy as np

from ..compile import get_kernel

__all__ = ["launch_swiglu", "launch_add", "launch_get_rows", "launch_kv_store", "launch_argmax_rows",
           "argmax_scratch", "argmax_blocks", "GET_ROWS_KERNELS", "TOPK_MAX", "TopKRow"]

ELEMENTWISE_THREADS = 256  # block size of the 1-D elementwise launches (no reduction: any size is exact)
GET_ROWS_THREADS = 256
# hx_argmax_rows (comparisons only: no launch geometry changes the index): threads per CUDA block,
# and CUDA blocks per row, about ARGMAX_VALUES_PER_THREAD values per thread, at most
# ARGMAX_MAX_BLOCKS. A 151,936-logit row (Qwen3) gets 64 blocks; one 1024-thread block per row
# took 53-60 us on the H200 (bench/results/2026-12-01-h200-session3), about 2% of an 8B step.
ARGMAX_THREADS = 256
ARGMAX_VALUES_PER_THREAD = 8
ARGMAX_MAX_BLOCKS = 64
SOURCE = "elementwise/elementwise.cu"
# The get_rows kernel of each table type (one kernel body, per-type element functions).
GET_ROWS_KERNELS = {"Q4_K": "hx_get_rows_q4_K", "Q6_K": "hx_get_rows_q6_K", "Q8_0": "hx_get_rows_q8_0",
                    "F16": "hx_get_rows_f16", "F32": "hx_get_rows_f32"}


@functools.cache
def _kernel(name: str):
    return get_kernel(SOURCE, name)


def _binary(kernel_name: str, a, b, out):
    n = a.size
    if n:
        blocks = (n + ELEMENTWISE_THREADS - 1) // ELEMENTWISE_THREADS
        _kernel(kernel_name)((blocks,), (ELEMENTWISE_THREADS,), (a, b, out, np.int64(n)))
    return out


def launch_swiglu(g, u, out):
    """``hx_swiglu_f32`` into ``out``, unchecked: float32 C-contiguous CuPy arrays of one size,
    ``out`` overlapping neither input. Returns ``out``."""
    return _binary("hx_swiglu_f32", g, u, out)


def launch_add(a, b, out):
    """``hx_add_f32`` into ``out``, unchecked (as :func:`launch_swiglu`). Returns ``out``."""
    return _binary("hx_add_f32", a, b, out)


def launch_get_rows(table, qtype: str, ids, out):
    """``hx_get_rows_<qtype>`` into ``out``, unchecked: grid (len(ids), ceil(K/256)).

    ``table`` uint8 C-contiguous (N, row_bytes) CuPy array of ``qtype`` blocks, ``ids`` int32
    C-contiguous (T,) on the device, each in ``0..N-1``, ``out`` float32 C-contiguous (T, K).
    """
    n_cols = out.shape[1]
    if ids.size:
        grid = (ids.size, (n_cols + GET_ROWS_THREADS - 1) // GET_ROWS_THREADS)
        _kernel(GET_ROWS_KERNELS[qtype])(grid, (GET_ROWS_THREADS,),
                                         (table, ids, out, np.int32(n_cols), np.int64(table.shape[1])))
    return out


def launch_kv_store(k, v, pos, k_cache, v_cache):
    """``hx_kv_store``: float32 ``k``, ``v`` (T, n_head_kv, D) rounded to f16 into the cache rows at
    the device positions ``pos`` (int32 (T,)), unchecked. Caches float16 C-contiguous (n_ctx, n_head_kv, D)."""
    T = k.shape[0]
    row = k.shape[1] * k.shape[2]
    if T:
        _kernel("hx_kv_store")((T, (row + ELEMENTWISE_THREADS - 1) // ELEMENTWISE_THREADS), (ELEMENTWISE_THREADS,),
                               (k, v, pos, k_cache, v_cache, np.int32(row)))


def argmax_blocks(n: int) -> int:
    """CUDA blocks per row of ``hx_argmax_rows`` for rows of ``n`` values."""
    return max(1, min(ARGMAX_MAX_BLOCKS, -(-n // (ARGMAX_THREADS * ARGMAX_VALUES_PER_THREAD))))


def argmax_scratch(xp, T: int, n: int):
    """``(partials, counters)`` for :func:`launch_argmax_rows` of (T, n): uint64 (T, blocks) and
    uint32 (T,) zeros; the kernel leaves the counters at zero, so the pair is reused launch after launch."""
    return xp.empty((T, argmax_blocks(n)), np.uint64), xp.zeros((T,), np.uint32)


_NULL = np.uint64(0)  # a null device pointer argument


def launch_argmax_rows(x, out, partials, counters, pos=None, advance=None, log=None):
    """``hx_argmax_rows``: the first index of each row's largest value (NaN largest, as numpy's
    argmax) of float32 C-contiguous ``x`` (T, n) into int32 ``out`` (T,), unchecked; scratch from
    :func:`argmax_scratch` (T, n), not shared with a launch running at the same time.

    ``advance`` (int32 (2,) on the device, with ``pos``, the pass's int32 (T,) positions): the last
    row's token and its position + 1 are written there (the inputs of the next one-token pass of a
    chain, :mod:`hiraishin.backends.graphs`), and the token with its logit's bits into row position + 1
    of ``log`` (int32 (n_log, 2); optional). Comparisons and copies only: no bit of ``out`` depends on it."""
    T, n = x.shape
    if T:
        if advance is None:
            tail = (_NULL, _NULL, _NULL, np.int32(0))
        else:
            tail = (pos, advance, _NULL if log is None else log, np.int32(0 if log is None else log.shape[0]))
        _kernel("hx_argmax_rows")((partials.shape[1], T), (ARGMAX_THREADS,),
                                  (x, out, partials, counters, np.int32(n)) + tail)
    return out


# hx_topk_row: the k largest values of one row (what plain decoding shows beside each token, --n-probs) in k
# rounds of a block-wide largest key, per CUDA block and then over the blocks' keys: at most TOPK_MAX (a
# display's handful; more is a host-side job). Blocks and threads as hx_argmax_rows'.
TOPK_MAX = 32


class TopKRow:
    """``hx_topk_row`` for rows of ``n`` values and ``k`` <= :data:`TOPK_MAX`: call ``(x_row, out)`` with a
    float32 C-contiguous (n,) row and an int32 (k, 2) ``out`` ([index, the value's bits] per place, best first,
    index -1 past the row's end; hiraishin.decode.greedy.top_k_of's rule). Keeps its own scratch (its counter
    reset by each launch): one stream at a time."""

    __slots__ = ("grid", "n", "k", "partials", "counter")

    def __init__(self, xp, n: int, k: int):
        if not 1 <= k <= TOPK_MAX:
            raise ValueError(f"hx_topk_row takes 1..{TOPK_MAX} places, got {k}")
        blocks = argmax_blocks(n)
        self.grid = (blocks,)
        self.n, self.k = np.int32(n), np.int32(k)
        self.partials = xp.empty((blocks * k,), np.uint64)
        self.counter = xp.zeros((1,), np.uint32)

    def __call__(self, x_row, out):
        _kernel("hx_topk_row")(self.grid, (ARGMAX_THREADS,), (x_row, self.n, self.k, self.partials, self.counter, out))
        return out
