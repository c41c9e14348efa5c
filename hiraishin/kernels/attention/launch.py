"""Launchers of ``fattn_vec.cu`` and ``fattn_tile.cu``, and the occupancy the variant plan needs.

``launch`` runs one attention launch of a plan (the combine included when ``P > 1``) on CuPy
arrays, unchecked, writing into given buffers. :func:`measure_occupancy` asks the driver how many
blocks of our compiled kernels fit on an SM: stock llama.cpp sizes ``P`` from exactly that, so a
device profile made from it (:func:`current_profile`) reproduces this GPU's variant plans.
"""

from __future__ import annotations

import functools

import numpy as np

from ...devices import DeviceProfile, current_device
from ...plans.attention import (KERNEL_COMBINE, KERNEL_Q1, KERNEL_QN, KERNEL_SHARED, KERNEL_TILE, NTHREADS,
                                SHARED_QUERIES, TILE_CELLS, TILE_QUERIES, AttentionPlan, shared_occupancy_key)
from ..compile import get_kernel, kernel_attributes, require_cupy
from .emulate import attention_scale

__all__ = ["launch", "launch_partials", "launch_combine", "measure_occupancy", "current_profile",
           "kernel_report"]

SOURCE_VEC = "attention/fattn_vec.cu"
SOURCE_TILE = "attention/fattn_tile.cu"
_NULL = np.uint64(0)  # a null device pointer argument


# fattn_vec_shared's build per queries per block: (cells of a step each thread's loop unrolls,
# 1 if the scaled queries sit in registers rather than shared memory). Scheduling only, no value
# changes. Full unrolling of 8 queries spills at D = 128; these keep nvcc sm_90 spill-free
# (tests/test_fattn_compile.py) and were the fastest builds timed on the H200
# (bench/results/2026-12-01-h200-verify-attention: 4 queries u4 over u8, 8 queries u2 over u1; and
# bench/results/2026-12-04-h200-session15: 4 queries u4 with the queries in registers took 0.61-1.05x
# (median 0.77x) the time of the shared-memory build at 2-16 tokens and 1024-4096 cells; it is the build
# the exact plans use, plans.attention.SHARED_PICK).
SHARED_BUILDS = {2: (8, 0), 4: (4, 1), 8: (2, 0)}


def shared_defines(queries: int, build: tuple[int, int] | None = None) -> dict:
    """The #defines fattn_vec_shared is compiled with for ``queries`` per block (``build``: another
    (unroll, queries in registers) than :data:`SHARED_BUILDS`)."""
    unroll, qreg = SHARED_BUILDS[queries] if build is None else build
    return {"FV_SHARED_Q": queries, "FV_SHARED_UNROLL": unroll, "FV_SHARED_QREG": qreg}


@functools.cache
def _kernel(name: str, head_dim: int, queries: int = 0, build: tuple[int, int] | None = None,
            epilogue: tuple = ((), ())):
    """The compiled kernel; ``epilogue`` = (sources compiled before fattn_vec.cu, extra #define items):
    the vector kernels' optional q8_1 output (``HX_ATTN_Q8_1``, see :mod:`hiraishin.kernels.fused`)."""
    if name == KERNEL_TILE:
        return get_kernel(SOURCE_TILE, name, defines={"HX_D": head_dim, "FT_TILE_Q": TILE_QUERIES,
                                                      "FT_TILE_KV": TILE_CELLS, "FT_NTHREADS": NTHREADS})
    prelude, extra = epilogue
    source = (*prelude, SOURCE_VEC) if prelude else SOURCE_VEC
    defines = {"HX_D": head_dim, **(shared_defines(queries, build) if name == KERNEL_SHARED else {}), **dict(extra)}
    return get_kernel(source, name, defines=defines)


@functools.cache
def _scale(head_dim: int) -> np.float32:
    return attention_scale(head_dim)


def _kv_len(plan: AttentionPlan) -> int:
    return plan.kv_len if plan.kv_len is not None else plan.kv_attended


# The kernels' kv_len argument meaning "the last query's position + 1, read from q_pos".
KV_LEN_FROM_POSITIONS = -1


def launch_partials(q, k_cache, v_cache, q_pos, plan: AttentionPlan, out, parts, meta, kv_from_positions=False,
                    build: tuple[int, int] | None = None, yq=None, epilogue: tuple = ((), ())):
    """The plan's attention kernel only. With ``P == 1`` it normalises in place into ``out`` (and
    writes no partials); with ``P > 1`` it writes ``parts`` (T, H, P, D) and ``meta`` (T, H, P, 2).

    ``kv_from_positions``: the kernel takes the KV length from the device positions (the last
    query's position + 1, which it is in a forward pass) instead of ``plan.kv_len``, so a CUDA
    graph of the launch replays at any position whose plan is the same. ``build``: the shared
    kernel's (unroll, queries in registers) instead of :data:`SHARED_BUILDS` (benchmarks; no bit
    depends on it). ``yq`` with ``epilogue`` (vector kernels, ``P == 1``; :mod:`hiraishin.kernels.fused`):
    the normalised rows are also written as q8_1 into ``yq`` (``out`` may then be None: not written).
    """
    T, H, D = q.shape
    P = plan.parallel_blocks
    if P == 1:
        parts = meta = out  # not written by the kernel when P == 1
    kv_len = KV_LEN_FROM_POSITIONS if kv_from_positions else _kv_len(plan)
    scale = _scale(D)
    n_head_kv = k_cache.shape[1]
    args = (q, k_cache, v_cache, q_pos, _NULL if out is None else out, _NULL if parts is None else parts,
            _NULL if meta is None else meta, np.int32(T), np.int32(H), np.int32(n_head_kv), np.int32(kv_len),
            np.int32(plan.kv_attended))
    if plan.kernel == "tile":
        if yq is not None:
            raise ValueError("the tile kernel has no q8_1 output")
        grid = ((T + TILE_QUERIES - 1) // TILE_QUERIES, P, H)
        _kernel(KERNEL_TILE, D)(grid, (NTHREADS, 1, 1), args + (np.int32(plan.split_cells), np.float32(scale)))
        return out
    if yq is not None and P != 1:
        raise ValueError(f"the q8_1 output needs one parallel block, the plan has P = {P}")
    if plan.shared_kv:  # the T * G queries of each KV head, queries_per_block per block
        kernel = _kernel(KERNEL_SHARED, D, plan.queries_per_block, build, epilogue)
        grid = (-(-T * (H // n_head_kv) // plan.queries_per_block), P, n_head_kv)
    else:
        kernel, grid = _kernel(plan.kernel_name, D, 0, None, epilogue), (-(-T // plan.queries_per_block), P, H)
    kernel(grid, (32, NTHREADS // 32, 1),
           args + (np.int32(plan.chunk_cells), np.float32(scale), _NULL if yq is None else yq))
    return out


def launch_combine(parts, meta, out):
    """``fattn_combine``: merge the ``P`` partials (T, H, P, D) in block order into ``out`` (T, H, D)."""
    T, H, P, D = parts.shape
    _kernel(KERNEL_COMBINE, D)((T, H, 1), (D, 1, 1), (parts, meta, out, np.int32(P)), shared_mem=8 * P)
    return out


def launch(q, k_cache, v_cache, q_pos, plan: AttentionPlan, out, parts=None, meta=None, kv_from_positions=False,
           build: tuple[int, int] | None = None):
    """Run ``plan`` on CuPy arrays, unchecked (with the combine when ``P > 1``); returns ``out``.

    ``q`` float32 C-contiguous (T, H, D); caches float16 C-contiguous (n_ctx, n_head_kv, D)
    holding at least the plan's filled cells; ``q_pos`` int32 C-contiguous (T,) on the device,
    each in ``0..kv_len-1``; ``plan`` made for exactly these shapes. ``out`` (T, H, D) and, when
    ``P > 1``, the scratch ``parts`` (T, H, P, D) and ``meta`` (T, H, P, 2): float32 C-contiguous
    (allocated here when None). ``kv_from_positions``, ``build``: see :func:`launch_partials`.
    """
    P = plan.parallel_blocks
    if P > 1 and (parts is None or meta is None):
        cp = require_cupy()
        T, H, D = q.shape
        parts = cp.empty((T, H, P, D), cp.float32) if parts is None else parts
        meta = cp.empty((T, H, P, 2), cp.float32) if meta is None else meta
    launch_partials(q, k_cache, v_cache, q_pos, plan, out, parts, meta, kv_from_positions, build)
    return out if P == 1 else launch_combine(parts, meta, out)


def _kernels(head_dim: int) -> dict:
    kernels = {name: _kernel(name, head_dim) for name in (KERNEL_Q1, KERNEL_QN, KERNEL_TILE, KERNEL_COMBINE)}
    kernels.update({shared_occupancy_key(n): _kernel(KERNEL_SHARED, head_dim, n) for n in SHARED_QUERIES})
    return kernels


def _occupancy(kernel) -> int:
    cp = require_cupy()
    return int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, NTHREADS, 0))


def measure_occupancy(head_dim: int = 128) -> dict[str, int]:
    """Blocks per SM of our compiled attention kernels, asked from the driver (CuPy).

    ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` with 128 threads and no dynamic shared memory,
    as llama.cpp asks for its vec kernel. Keys are the :class:`DeviceProfile` occupancy names.
    """
    kernels = _kernels(head_dim)
    return {name: _occupancy(kernels[name]) for name in
            (KERNEL_Q1, KERNEL_QN, KERNEL_TILE) + tuple(shared_occupancy_key(n) for n in SHARED_QUERIES)}


@functools.lru_cache(maxsize=None)
def current_profile(head_dim: int = 128) -> DeviceProfile:
    """The CUDA device's profile with our kernels' measured occupancy (cached)."""
    return current_device(measure_occupancy(head_dim))


def kernel_report(head_dim: int = 128) -> dict:
    """Registers, spills, shared memory and occupancy of every attention kernel (for results JSON)."""
    return {name: dict(kernel_attributes(kernel), blocks_per_sm=_occupancy(kernel))
            for name, kernel in _kernels(head_dim).items()}
