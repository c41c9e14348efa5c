"""The gate and up mat-vecs of a feed-forward block with SwiGLU and its q8_1 as their epilogue, in one launch.

``mmvq_swiglu`` (``mmvq_swiglu.cu``) computes the rows of both weights as ``mmvq_multi`` does (``mmvq.cu``'s
code, the same geometry); the last CUDA block of each 32-row group then computes ``silu(g) * u`` of the
group's rows (``fp.cuh`` ``hx_swiglu``, the sequence of ``hx_swiglu_q8_1``) and stores that q8_1 block in the
layout the down projection reads. No new order: the outputs equal ``mmvq_multi`` then ``hx_swiglu_q8_1`` bit
for bit (:func:`emulate` is that composition of emulators; tests/test_mmvq_swiglu.py runs the CUDA source on
the CPU through the g++ shim, tests/test_mmvq_swiglu_gpu.py on a GPU). What it saves is one dependent launch
in a pass's chain per layer; what it adds is a counter atomic per CUDA block and one warp's SwiGLU per group
in the launch's blocks. Measured on the H200, it costs more than it saves (the 0.6B's one-token pass 0.631 ->
0.679 ms, the 8B's 2.340 -> 2.453), so it is off (:data:`.launch.SWIGLU_EPILOGUE`,
``HIRAISHIN_SWIGLU_EPILOGUE=1`` to repeat the A/B).

Files: ``mmvq_swiglu.cu``; :mod:`.launch` (``SwigluMatVecLaunch``, the switch and the fit); :mod:`.emulate`.
"""

from .emulate import emulate

__all__ = ["emulate"]
