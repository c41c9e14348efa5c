"""Tiled dp4a mat-mat for wide batches: the stand-in for llama.cpp's MMQ.

llama.cpp leaves the mat-vec kernel for batches wider than
``MMVQ_MAX_BATCH_SIZE = 8`` columns and runs MMQ (int8 tensor-core tiles, its
own q8_1 layout and summation structure; reference sections 3.2 and 5). We do
not reproduce MMQ's internals (they are not documented in the reference); this
kernel only has to add in an order of its own, deterministic and emulable, so
that the batch-variant policy changes order past 8 columns like llama.cpp does.

Order of adds, per output element (row r, column c): ONE thread walks K from
start to end; there is no reduction across threads::

    Q4_K, per super-block:  sd = sm = 0
                            for sub-block j = 0..7 (32 values):
                                sd = fma(d8_j, float(dot_j * sc_j), sd)
                                sm = fma(d8_j, float(sum8_j * m_j), sm)
                            acc = acc + fma(d, sd, -(dmin * sm))
    Q6_K, per super-block:  s = 0
                            for sub-block t = 0..15 (16 values):
                                s = fma(d8_{t/2}, float(dot_t * sc_t), s)
                            acc = fma(d6, s, acc)
    Q8_0, per block:        acc = fma(d_w * d8, float(dot), acc)

(``dot`` is the exact integer dot product of weight quants with q8_1 quants,
``sum8`` the exact sum of the q8_1 quants, ``d8`` the q8_1 block's fp16 scale.)
The mat-vec kernel instead gives each thread a few values of every
``blocks_per_iter``-th block and sums threads through shared memory and a warp
butterfly, so the two kernels round differently.

Tiling does not touch that arithmetic: a CUDA block of 128 threads computes
``TILE_ROWS`` x ``TILE_COLS`` outputs, staging 256 values of K per step (weight
bytes of 32 rows, q8_1 blocks of 16 columns) in shared memory. Each output is
therefore independent of the batch width: the tiled kernel is itself batch
invariant; what differs is that it is not the mat-vec kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..fp import fmaf
from ..quant import BLOCK_BYTES, GGML_TYPE_ID

__all__ = [
    "TILE_ROWS",
    "TILE_COLS",
    "TILE_THREADS",
    "emulate_tiled",
    "launch_tiled",
]

TILE_ROWS = 32  # rows per CUDA block (threadIdx.x)
COLS_PER_THREAD = 4
TILE_COLS = 16  # columns per CUDA block: 4 groups (threadIdx.y) of COLS_PER_THREAD
TILE_THREADS = TILE_ROWS * (TILE_COLS // COLS_PER_THREAD)  # 128

@njit(cache=True, inline="always")
def _u16(a, i, o):
    return np.int64(a[i, o]) | (np.int64(a[i, o + 1]) << 8)


@njit(cache=True, inline="always")
def _block_q4_k(acc, w, r, kb, y, ys, j, h2f, sc, mn):
    """One Q4_K super-block of row r times column j, added to acc (sc, mn: scratch of 8)."""
    wo = kb * 144
    for sb in range(8):  # get_scale_min_k4
        if sb < 4:
            sc[sb] = w[r, wo + 4 + sb] & 63
            mn[sb] = w[r, wo + 8 + sb] & 63
        else:
            sc[sb] = (w[r, wo + 8 + sb] & 0x0F) | ((w[r, wo + sb] >> 6) << 4)
            mn[sb] = (w[r, wo + 8 + sb] >> 4) | ((w[r, wo + 4 + sb] >> 6) << 4)
    sd = np.float32(0.0)
    sm = np.float32(0.0)
    for sb in range(8):
        yo = (kb * 8 + sb) * 36
        shift = 4 * (sb % 2)
        qo = wo + 16 + 32 * (sb // 2)
        dot = 0
        ysum = 0
        for l in range(32):
            q8 = np.int64(ys[j, yo + 4 + l])
            dot += ((np.int64(w[r, qo + l]) >> shift) & 15) * q8
            ysum += q8
        d8 = h2f[_u16(y, j, yo)]
        sd = fmaf(d8, np.float32(dot * sc[sb]), sd)
        sm = fmaf(d8, np.float32(ysum * mn[sb]), sm)
    d = h2f[_u16(w, r, wo)]
    dmin = h2f[_u16(w, r, wo + 2)]
    return acc + fmaf(d, sd, -(dmin * sm))


@njit(cache=True, inline="always")
def _block_q6_k(acc, w, ws, r, kb, y, ys, j, h2f):
    """One Q6_K super-block of row r times column j, multiplied into acc with one fma."""
    wo = kb * 210
    s = np.float32(0.0)
    for t in range(16):
        h = t // 8
        sg = (t % 8) // 2
        l0 = 16 * (t % 2)
        yo = (kb * 8 + t // 2) * 36
        dot = 0
        for l in range(l0, l0 + 16):
            lo = (np.int64(w[r, wo + 64 * h + 32 * (sg & 1) + l]) >> (4 * (sg >> 1))) & 15
            hi = (np.int64(w[r, wo + 128 + 32 * h + l]) >> (2 * sg)) & 3
            dot += ((lo | (hi << 4)) - 32) * np.int64(ys[j, yo + 4 + l])
        d8 = h2f[_u16(y, j, yo)]
        s = fmaf(d8, np.float32(dot * np.int64(ws[r, wo + 192 + t])), s)
    return fmaf(h2f[_u16(w, r, wo + 208)], s, acc)


@njit(cache=True, inline="always")
def _block_q8_0(acc, w, ws, r, b, y, ys, j, h2f):
    """One Q8_0 block of row r times column j, added to acc with one fma."""
    wo = b * 34
    yo = b * 36
    dot = 0
    for l in range(32):
        dot += np.int64(ws[r, wo + 2 + l]) * np.int64(ys[j, yo + 4 + l])
    d = h2f[_u16(w, r, wo)] * h2f[_u16(y, j, yo)]
    return fmaf(d, np.float32(dot), acc)


@njit(cache=True, parallel=True, error_model="numpy")
def _tiled_emulate(type_id, block_bytes, w, ws, y, ys, h2f, out):
    nb = w.shape[1] // block_bytes
    for r in prange(w.shape[0]):
        sc = np.empty(8, dtype=np.int64)
        mn = np.empty(8, dtype=np.int64)
        for j in range(y.shape[0]):
            acc = np.float32(0.0)
            for kb in range(nb):  # one thread per output, blocks in order
                if type_id == 12:
                    acc = _block_q4_k(acc, w, r, kb, y, ys, j, h2f, sc, mn)
                elif type_id == 14:
                    acc = _block_q6_k(acc, w, ws, r, kb, y, ys, j, h2f)
                else:
                    acc = _block_q8_0(acc, w, ws, r, kb, y, ys, j, h2f)
            out[j, r] = acc


def emulate_tiled(w: np.ndarray, qtype: str, xq: np.ndarray, h2f: np.ndarray) -> np.ndarray:
    """CPU emulation of :func:`launch_tiled`: float32 (ncols, N), same bits as the kernel.

    Arguments are already validated and contiguous (see ``mmvq.mul_mat_vec``).
    """
    out = np.empty((xq.shape[0], w.shape[0]), dtype=np.float32)
    _tiled_emulate(GGML_TYPE_ID[qtype], BLOCK_BYTES[qtype], w, w.view(np.int8), xq, xq.view(np.int8), h2f, out)
    return out


def launch_tiled(w, qtype: str, xq, out, k: int) -> None:
    """Launch the tiled kernel on cupy arrays: ``out`` (ncols, N) float32 gets w @ x.

    ``w`` (N, row_bytes) uint8, ``xq`` (ncols, K/32*36) uint8, both C-contiguous.
    """
    from ._cuda import get_kernel

    nrows, row_bytes = w.shape
    ncols = xq.shape[0]
    kernel = get_kernel("mmq_tiled.cu", "mmq_tiled", {"HX_QTYPE": GGML_TYPE_ID[qtype]})
    grid = ((nrows + TILE_ROWS - 1) // TILE_ROWS, (ncols + TILE_COLS - 1) // TILE_COLS, 1)
    block = (TILE_ROWS, TILE_COLS // COLS_PER_THREAD, 1)
    kernel(grid, block, (w, xq, out, np.int32(nrows), np.int32(ncols), np.int32(k),
                         np.int64(row_bytes), np.int64(xq.shape[1]), np.int64(out.shape[1])))
