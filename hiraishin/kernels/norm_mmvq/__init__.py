"""A norm and the mat-vecs that read it, in one launch: every CUDA block of the mat-vec makes its own
q8_1 activations.

``hx_norm_mmvq`` (``norm_mmvq.cu``) performs, in each CUDA block, the float operations of the fused
norm kernel (``fused.cu`` ``hx_add_rms_norm_q8_1``: the residual add, rmsnorm's tree, the scale, the
weight multiply, the q8_1 store) into shared memory, then ``mmvq.cu``'s rows of up to three weights
(as ``mmvq_multi``). No new order: its outputs equal the norm launch followed by the mat-vec launch
bit for bit (:func:`emulate` is that composition of emulators; tests/test_norm_mmvq.py runs the CUDA
source on the CPU through the g++ shim, tests/test_norm_mmvq_gpu.py on a GPU). What it saves is one
dependent launch in a pass's chain per norm (a one-token pass's norm launches cost 137 us of the
0.6B's 0.75 ms on an H200, bench/results/2026-12-02-h200-session5, the ablation); what it pays is
the norm repeated by every CUDA block before its first dot product. Measured, it pays more than it
saves (the 0.6B's one-token pass 0.711 -> 0.825 ms, the 8B's 2.553 -> 3.088;
bench/results/2026-12-02-h200-session6), so the backend does not fuse by default
(:data:`.launch.NORM_MMVQ_MAX_TOKENS` = 0): the kernel is kept as that measured alternative. That
measurement launched one CUDA block per four row blocks; with :data:`.launch.NORM_MMVQ_PER_SM` the grid is at
most what the SMs hold at once and every block strides over several blocks' rows, so the norm is made once
per resident block (the same bits). Measured slower as well (an H100, bench/results/2026-12-05-h100-session25:
the 0.6B 0.639 -> 0.82-0.93 ms, the 8B 2.74 -> 3.45), so that grid too stays an opt-in alternative.

Weights of two types (Qwen3 Q4_K_M's Q4_K Q and K beside a Q6_K V) take ``hx_norm_mmvq_mixed``
(``norm_mixed.cu``): the norm once in both types' layouts, each type's rows by mmvq.cu's code for that type
(the bits of the norm launch then ``mmvq_mixed``).

Files: ``norm_mmvq.cu``, ``norm_mixed.cu``; :mod:`.launch` (``NormMatVecLaunch``, ``NormMixedMatVecLaunch``, the
geometry and the limits); :mod:`.emulate`.
"""

from .emulate import emulate

__all__ = ["emulate"]
