"""SwiGLU, its q8_1 and the down projection in one launch: every CUDA block of the down mat-vec makes its own
activations.

``hx_swiglu_down`` (``swiglu_down.cu``) computes, in each CUDA block, ``silu(g) * u`` of the gate and up
outputs and its q8_1 blocks (``fp.cuh`` ``hx_swiglu`` and ``quantize_q8_1.cu``'s store: the operations of
``fused.cu`` ``hx_swiglu_q8_1``) into shared memory, then ``mmvq.cu``'s rows of the down weight over a grid of
at most what the SMs hold at once (``mmvq/strided.cuh``: each block strides over several blocks' rows, so the
product is made once per resident block). No new order: its output equals the SwiGLU launch followed by the
mat-vec launch bit for bit (:func:`emulate` is that composition of emulators; tests/test_swiglu_down.py runs
the CUDA source on the CPU through the g++ shim, tests/test_swiglu_down_gpu.py on a GPU). What it saves is
one dependent launch per layer in a pass's chain; what it pays is the product repeated by every resident
block before its first dot product. Measured, it pays more (an H100, bench/results/2026-12-05-h100-session25: the
0.6B's one-token pass 0.639 -> 0.744 ms, the 8B's 2.74 -> 3.21), so it is off: an opt-in alternative for the A/B
(``HIRAISHIN_SWIGLU_DOWN=1``: one-token passes; :data:`.launch.SWIGLU_DOWN_TOKENS`).

Files: ``swiglu_down.cu``; :mod:`.launch` (``SwigluDownLaunch``, the switch, the fit); :mod:`.emulate`.
"""

from .emulate import emulate

__all__ = ["emulate"]
