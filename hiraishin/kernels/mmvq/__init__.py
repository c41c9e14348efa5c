"""dp4a mat-vec (Q4_K, Q6_K, Q8_0 weights x q8_1 activations): llama.cpp's ``mul_mat_vec_q``.

The geometry is llama.cpp's (reference sections 4.1-4.4, ``ggml/src/ggml-cuda/mmvq.cu`` and
``vecdotq.cuh``); the arithmetic is IEEE with every rounding-relevant op explicit, so the Numba
emulator reproduces the kernel's bits. Which thread sums which weight blocks, and how warps hand
their partials over, is the plan's (:mod:`hiraishin.plans.matvec`, where the order is written
out); only ``nwarps`` changes a result.

Files, side by side:

* ``mmvq.cu``: the kernel; geometry, row length and block facts are compile-time ``#define``\\ s;
  on the GPU it reads Q4_K/Q6_K activations in its own per-thread layout
  (:mod:`hiraishin.kernels.quantize.layout`), same values, same bits;
* ``mixed.cu`` (with ``type_a.cuh``, ``type_b.cuh``, ``type_end.cuh``): ``mmvq_mixed``, weights of two
  types that read one input in one launch (Q4_K attn_q/attn_k beside a Q6_K attn_v), each type's rows
  ``mmvq.cu``'s own code compiled in a namespace of its own: the same bits as a launch per type;
* :mod:`.launch`: ``launch(w, qtype, y, plan, out)`` and the prepared launches behind it, with the
  measured compile-time tuning (unroll, register caps) as named constants;
* :mod:`.emulate`: ``emulate(w, qtype, xq, plan)`` on numpy arrays (llama.cpp's q8_1 layout).
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
