"""Tiled dp4a mat-mat: the variant order's path past 8 columns for Q8_0 weights.

llama.cpp leaves the mat-vec kernel for batches wider than
``MMVQ_MAX_BATCH_SIZE = 8`` columns and runs MMQ (int8 tensor-core tiles, its
own q8_1 layout and summation structure; reference sections 3.2 and 5). For
Q4_K and Q6_K weights the variant order reproduces MMQ's float sequence
(``hiraishin/kernels/mmq_stock``). This kernel, once the stand-in for all three
types (1.7-8x slower than ``mmq_stock`` at 9-16 columns on an H200:
bench/results/2026-12-01-h200-mmq-stock/), remains the Q8_0 path: an order of
its own, deterministic and emulable, so that the variant policy still changes
order past 8 columns for Q8_0 weights.

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

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
