"""The stock MMQ order: ``BATCH_VARIANT``'s mat-mat past 8 columns for Q4_K and Q6_K weights,
llama.cpp ``mul_mat_q``'s float sequence on int8 tensor cores, with its Numba emulator.

llama.cpp leaves the mat-vec kernel for batches wider than ``MMVQ_MAX_BATCH_SIZE`` = 8 columns
on Hopper (and Ampere) and runs MMQ, whose sums differ. This op reproduces MMQ's order per
output (``hiraishin/plans/mmq_stock.py`` states it in full): for Q4_K, per 32-value sub-block in
k order ``sum = fmaf(half(d*sc)*dx, C, sum); sum = fmaf(half(-dmin*m), sx, sum)`` with the FP16
scale products of ``load_tiles_q4_K``; for Q6_K, per 128 values ``tmp = sum_b fmaf(C_b, dx_b, tmp)``
then ``sum = fmaf(tmp, d, sum)``; each tile's K range in the pieces of upstream's stream-k split
(tiles of 128 rows x J columns, the SM count of the device profile), the pieces combined as
``mul_mat_q_stream_k_fixup`` does. What differs from upstream is its input, not its order: the
activations are the mat-vec's q8_1 blocks (llama.cpp ``quantize_q8_1``), not
``quantize_mmq_q8_1``'s, and all arithmetic is IEEE (no fast-math).

Why a new folder, not a mode of ``kernels/mmq``: that kernel's geometry *is* its order (K
segments per warp, summed in shared memory); this one has no K segments inside a CUDA block (one
accumulator per output and piece), a second kernel (the fixup), a work-item table and a different
Q6_K accumulation. The MMA fragments and weight loads are ``mmq.cu``'s (one copy: ``mmq/mma_rows.cu``).

Geometry (``mmq_stock.cu``): a work item = (tile, piece); a CUDA block = ``plan.nwarps`` warps of
16 rows each (m16n8k32 for Q4_K, two m16n8k16 per q8_1 block for Q6_K) x ``plan.cols_per_warp``
columns; the tile's last piece writes ``out``, the others a scratch buffer; the fixup kernel adds
them. Any batch width runs in one launch (plus the fixup); prefill widths take J = 128.

API: ``plan = hiraishin.plans.mmq_stock.mmq_stock_plan(ncols, qtype, k, n, device)``;
``emulate(w, qtype, xq, plan, row0=0)`` (CPU); ``launch(w, qtype, xq, plan, out)`` (cupy).
Measured on an H200: ``bench/results/2026-12-01-h200-mmq-stock/README.md``.
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
