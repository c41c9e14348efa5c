"""The q8_1 activations re-ordered for the mat-vec kernel's threads (Q4_K and Q6_K weights).

In llama.cpp's layout (:mod:`hiraishin.kernels.quantize`: blocks of fp16 d, fp16 s, 32 int8) a mat-vec
thread gathers its activation ints from two or four q8_1 blocks with one 4-byte load each, plus
two fp16 scale loads and conversions, for every column. The kernel's *float* operations are
fixed (they decide the bits); where the integers come from is not. So on the GPU the
activations of a Q4_K or Q6_K mat-vec are stored in the order the threads read them: per
weight super-block (256 values, 8 q8_1 blocks), each thread's ints side by side, the block
scales as float32 (exactly the fp16 value), and for Q4_K the integer sums the dot product
needs (what llama.cpp computes with two ``dp4a(0x01010101, u, .)`` per block). A thread then
makes one 8- or 16-byte load per kind of data and column. Same values, same results:
``mmvq.cu`` on this layout equals the emulator on llama.cpp's, bit for bit.

Per super-block (block ``b`` = 0..7 of its 8 q8_1 blocks; ``int m`` = values 4m..4m+3)::

    Q6_K, 288 bytes: lane L = 16h + 8r + m (h, r in 0..1, m in 0..7) of vec_dot_q6_K_q8_1
      [0, 256)    lane L: int m of block 4h+r, int m of block 4h+r+2        (8 bytes per lane)
      [256, 288)  float32 d of blocks 0, 2, 1, 3, 4, 6, 5, 7   (lane L reads the pair L // 8)

    Q4_K, 416 bytes: thread T = 4c + p (c, p in 0..3) of vec_dot_q4_K_q8_1
      [0, 256)    T: ints p, p+4 of block 2c, ints p, p+4 of block 2c+1   (16 bytes per thread)
      [256, 288)  float32 d of blocks 0..7                      (thread T reads the pair c)
      [288, 416)  T: int32 sum of the 8 values of ints p, p+4 of block 2c, the same of 2c+1

The int8 tensor-core kernels of the sub-block order (``hiraishin/kernels/mmq``) read their own pair of
layouts, ``MMA_Q4_K`` and ``MMA_Q6_K``, 288 bytes per super-block like llama.cpp's 8 blocks, so that
lane (g, t) of an MMA warp fetches its B fragments of a column with one 16-byte load per two q8_1
blocks and the fp16 scales of a column with one 16-byte load per four (llama.cpp's layout costs a
4-byte load per int and per scale: on the H200 those loads kept L1 the busiest unit of the several-
column launches, bench/results/2026-12-03-h200-session9)::

    MMA_Q6_K / MMA_Q4_K, 288 bytes:
      [0, 32)          the ds word (fp16 d | fp16 s << 16, llama.cpp's 4 bytes) of blocks 0..7
      [32 + 64k + 16t, +16)   lane t (0..3), blocks 2k and 2k+1 (k = 0..3): ints u0, u1 of block 2k,
                       then ints u0, u1 of block 2k+1, with (u0, u1) = (t, t+4) for MMA_Q6_K (the
                       m16n8k16 fragments of its two 16-value halves) and (2t, 2t+1) for MMA_Q4_K
                       (values 8t..8t+7: the kernel takes a Q4_K row's bytes 8t..8t+7 of each
                       32-byte chunk for the same MMA k slots, so every product pairs the same two
                       values and the exact integer dot product is unchanged)

``MMA8_Q4_K`` / ``MMA8_Q6_K`` hold the same 288-byte records with the columns of each n-tile of 8 (columns
8j..8j+7) interleaved, so that one 16-byte load per lane of an MMA warp, whose lanes read 8 columns at once,
covers 512 contiguous bytes (4 cache lines, where per-column records put the 8 columns 8 lines apart; on the
H200 L1/TEX is the busiest unit of the 9-16-column launches, bench/results/2026-12-03-h200-session11). Per
group of 8 columns and super-block, 2304 bytes::

    MMA8_Q6_K / MMA8_Q4_K, 2304 bytes (c = column % 8):
      [32c, +32)                  column c's 32 bytes of ds words ([0, 32) of its MMA record)
      [256 + 512k + 64c, +64)     column c's 64 bytes of pair k ([32 + 64k, +64) of its MMA record)

The buffer holds ceil(ncols / 8) whole groups; the columns past the last real one (padding) are never
read (the kernels clamp their column to the last real one), :func:`to_layout` fills them with copies of the
last column and the CUDA writers leave them as they find them: :func:`mma8_columns` gives the real columns'
per-column records back, which is what tests compare.

Rows of weights with K values have K / 256 super-blocks, so a column is K/256 * 288 (Q6_K and the
MMA layouts) or K/256 * 416 (Q4_K) bytes. The quantize kernel writes these layouts directly
(``quantize.launch(x, out, layout=...)``); :func:`to_layout` converts llama.cpp-layout bytes
(numpy or cupy).
"""

from __future__ import annotations

import numpy as np

from ...errors import QuantError
from ...quant import BLOCK_BYTES, QK_K

__all__ = ["LAYOUT_TYPES", "LAYOUT_BYTES", "LAYOUT_COLUMN_GROUP", "LAYOUT_IDS", "MMA_LAYOUTS", "MMA8_LAYOUTS",
           "SUPER_BLOCK", "as_layout", "layout_for", "layout_rows", "mma8_columns", "to_layout"]

Q8_1_BLOCK_BYTES = BLOCK_BYTES["Q8_1"]
SUPER_BLOCK = QK_K  # values per layout unit: one Q4_K/Q6_K weight super-block

# Bytes per weight super-block (per 8 q8_1 blocks) of each layout.
LAYOUT_BYTES = {"Q6_K": 288, "Q4_K": 416, "MMA_Q6_K": 288, "MMA_Q4_K": 288, "MMA8_Q6_K": 288, "MMA8_Q4_K": 288}
LAYOUT_TYPES = ("Q6_K", "Q4_K")  # the mat-vec kernel's layouts, one per weight type
# The sub-block MMA kernel's layout per weight type (hiraishin/kernels/mmq), and its columns-interleaved form.
MMA_LAYOUTS = {"Q4_K": "MMA_Q4_K", "Q6_K": "MMA_Q6_K"}
MMA8_LAYOUTS = {"Q4_K": "MMA8_Q4_K", "Q6_K": "MMA8_Q6_K"}
# Columns whose records a layout interleaves (an MMA n-tile: the N of m16n8k32); 1 for the others.
LAYOUT_COLUMN_GROUP = {"MMA8_Q4_K": 8, "MMA8_Q6_K": 8}
# HX_LAYOUT of the kernels that write a layout (quantize_q8_1.cu): the mat-vec layouts by their
# weight's ggml type id, the MMA layouts by 100 + it, their interleaved forms by 200 + it.
LAYOUT_IDS = {"Q4_K": 12, "Q6_K": 14, "MMA_Q4_K": 112, "MMA_Q6_K": 114, "MMA8_Q4_K": 212, "MMA8_Q6_K": 214}
_BLOCKS_PER_SUPER = 8

# (thread, slot) -> (q8_1 block, int) of the ints region.
_Q6_K_BLOCK = np.array([[4 * (L // 16) + (L // 8) % 2 + 2 * i for i in range(2)] for L in range(32)])
_Q6_K_INT = np.array([[L % 8] * 2 for L in range(32)])
_Q6_K_D_ORDER = np.array([0, 2, 1, 3, 4, 6, 5, 7])
_Q4_K_BLOCK = np.array([[2 * (T // 4) + i // 2 for i in range(4)] for T in range(16)])
_Q4_K_INT = np.array([[T % 4 + 4 * (i % 2) for i in range(4)] for T in range(16)])
# MMA layouts, ints region (bytes 32..288): int slot 16k + 4t + j (lane t, pair k, j = 0..3) holds
# int u_{j % 2}(t) of block 2k + j // 2.
_MMA_BLOCK = np.array([2 * k + j // 2 for k in range(4) for t in range(4) for j in range(4)])
_MMA_INT = {"MMA_Q6_K": np.array([t + 4 * (j % 2) for k in range(4) for t in range(4) for j in range(4)]),
            "MMA_Q4_K": np.array([2 * t + j % 2 for k in range(4) for t in range(4) for j in range(4)])}


def layout_for(qtype: str) -> str | None:
    """The activation layout the mat-vec kernel reads for ``qtype`` weights (None: llama.cpp's)."""
    return qtype if qtype in LAYOUT_TYPES else None


def layout_rows(ncols: int, layout: str | None) -> int:
    """Rows (columns of activations, padding included) of a buffer of ``ncols`` columns in ``layout``."""
    group = LAYOUT_COLUMN_GROUP.get(layout, 1)
    return -(-ncols // group) * group


def to_layout(xq, qtype: str):
    """q8_1 bytes (ncols, K/32*36) in llama.cpp's layout -> the ``qtype`` layout (:func:`layout_rows` rows,
    K/256*bytes each).

    Works on numpy and cupy arrays (the result is of the same kind).
    """
    if qtype in LAYOUT_COLUMN_GROUP:
        return _interleave(to_layout(xq, "MMA_" + qtype[len("MMA8_"):]), LAYOUT_COLUMN_GROUP[qtype])
    if qtype not in LAYOUT_BYTES:
        raise QuantError(f"no mat-vec activation layout for {qtype!r}; layouts exist for {list(LAYOUT_BYTES)}")
    xp = _array_module(xq)
    if xq.ndim != 2 or xq.dtype != np.uint8 or xq.shape[1] % (_BLOCKS_PER_SUPER * Q8_1_BLOCK_BYTES):
        raise QuantError(
            f"to_layout({qtype}) needs q8_1 bytes (ncols, K/32*36) with K a multiple of 256; "
            f"got {xq.dtype} {tuple(xq.shape)}"
        )
    ncols = xq.shape[0]
    nsb = xq.shape[1] // (_BLOCKS_PER_SUPER * Q8_1_BLOCK_BYTES)
    if ncols == 0 or nsb == 0:
        return xp.empty((ncols, nsb * LAYOUT_BYTES[qtype]), dtype=xp.uint8)
    blocks = xp.ascontiguousarray(xq).reshape(ncols, nsb, _BLOCKS_PER_SUPER, Q8_1_BLOCK_BYTES)
    ints = xp.ascontiguousarray(blocks[..., 4:]).view(xp.int32)  # (ncols, nsb, 8 blocks, 8 ints)
    d = xp.ascontiguousarray(blocks[..., 0:2]).view(xp.float16)[..., 0].astype(xp.float32)  # exact
    if qtype in _MMA_INT:
        ds = xp.ascontiguousarray(blocks[..., 0:4]).view(xp.uint32)[..., 0]  # (ncols, nsb, 8 blocks)
        parts = [ds, ints[:, :, xp.asarray(_MMA_BLOCK), xp.asarray(_MMA_INT[qtype])]]
    elif qtype == "Q6_K":
        parts = [ints[:, :, xp.asarray(_Q6_K_BLOCK), xp.asarray(_Q6_K_INT)], d[..., xp.asarray(_Q6_K_D_ORDER)]]
    else:
        vals = xp.ascontiguousarray(blocks[..., 4:]).view(xp.int8).reshape(ncols, nsb, _BLOCKS_PER_SUPER, 8, 4)
        int_sums = vals.astype(xp.int32).sum(axis=-1)  # (ncols, nsb, 8 blocks, 8 ints)
        pair_sums = int_sums[..., 0:4] + int_sums[..., 4:8]  # ints p and p+4
        sums = pair_sums.reshape(ncols, nsb, 4, 2, 4).transpose(0, 1, 2, 4, 3)  # [c, p, block 2c+i]
        parts = [ints[:, :, xp.asarray(_Q4_K_BLOCK), xp.asarray(_Q4_K_INT)], d, sums.astype(xp.int32)]
    out = xp.concatenate([xp.ascontiguousarray(p).reshape(ncols, nsb, -1).view(xp.uint8) for p in parts], axis=2)
    return out.reshape(ncols, nsb * LAYOUT_BYTES[qtype])


# An MMA record (per column and super-block): the ds words of its 8 q8_1 blocks, then 4 pairs of blocks.
_MMA_RECORD = LAYOUT_BYTES["MMA_Q4_K"]
_MMA_DS = 4 * _BLOCKS_PER_SUPER
_MMA_PAIRS, _MMA_PAIR = 4, 64


def _interleave(mma, group: int):
    """Per-column MMA records (ncols, nsb*288) -> the columns of each group of ``group`` interleaved, the last
    group padded with copies of the last column."""
    xp = _array_module(mma)
    ncols, width = mma.shape
    nsb, groups = width // _MMA_RECORD, -(-ncols // group)
    if ncols == 0:
        return mma
    pad = xp.concatenate([mma, xp.repeat(mma[-1:], groups * group - ncols, axis=0)])
    rec = pad.reshape(groups, group, nsb, _MMA_RECORD)
    ds = rec[..., :_MMA_DS].transpose(0, 2, 1, 3).reshape(groups, nsb, group * _MMA_DS)
    ints = rec[..., _MMA_DS:].reshape(groups, group, nsb, _MMA_PAIRS, _MMA_PAIR).transpose(0, 2, 3, 1, 4)
    out = xp.concatenate([ds, ints.reshape(groups, nsb, group * _MMA_PAIRS * _MMA_PAIR)], axis=2)
    return xp.ascontiguousarray(out).reshape(groups * group, width)


def mma8_columns(buf, ncols: int):
    """The per-column MMA records (``ncols``, nsb*288) of the real columns of an MMA8 buffer (the inverse of
    :func:`to_layout`'s interleaving; padding dropped)."""
    xp = _array_module(buf)
    rows, width = buf.shape
    group = LAYOUT_COLUMN_GROUP["MMA8_Q4_K"]
    if rows % group or width % _MMA_RECORD or rows < ncols:
        raise QuantError(f"mma8_columns needs ({group}j, K/256*{_MMA_RECORD}) bytes holding {ncols} columns; "
                         f"got {tuple(buf.shape)}")
    nsb, groups = width // _MMA_RECORD, rows // group
    g = xp.ascontiguousarray(buf).reshape(groups, nsb, group * _MMA_RECORD)
    ds = g[..., :group * _MMA_DS].reshape(groups, nsb, group, _MMA_DS).transpose(0, 2, 1, 3)
    ints = g[..., group * _MMA_DS:].reshape(groups, nsb, _MMA_PAIRS, group, _MMA_PAIR).transpose(0, 3, 1, 2, 4)
    rec = xp.concatenate([ds, ints.reshape(groups, group, nsb, _MMA_PAIRS * _MMA_PAIR)], axis=3)
    return xp.ascontiguousarray(rec).reshape(rows, width)[:ncols]


def as_layout(xq, layout: str | None):
    """q8_1 bytes in llama.cpp's layout as a kernel reading ``layout`` wants them: :func:`to_layout`, or
    ``xq`` itself when ``layout`` is None (llama.cpp's)."""
    return xq if layout is None else to_layout(xq, layout)


def _array_module(a):
    if isinstance(a, np.ndarray):
        return np
    try:
        import cupy

        if isinstance(a, cupy.ndarray):
            return cupy
    except ImportError:
        pass
    raise QuantError(f"to_layout needs a numpy or cupy array, got {type(a).__name__}")
