"""Activation quantization to q8_1: the input of the dp4a mat-vec kernels.

Geometry of llama.cpp's CUDA ``quantize_q8_1`` (reference section 3.1,
``ggml/src/ggml-cuda/quantize.cu``): one warp per block of 32 values. Per block, ``amax`` is a
butterfly max of ``|x|`` and ``sum`` is the xor butterfly (offsets 16, 8, 4, 2, 1) of the
*unquantized* floats. Arithmetic is IEEE (llama.cpp's fast-math build uses an approximate
reciprocal instead)::

    d = amax / 127                         (correctly rounded)
    q = 0 if amax == 0 else roundf(x / d)  (correctly rounded division, half away from zero)
    block = fp16 h(d), fp16 h(sum), int8 q[32]

The order is fixed per block: no plan. Output: uint8 (ncols, K/32 * 36), one row per column
(token), in llama.cpp's layout, or with ``layout="Q4_K"`` / ``"Q6_K"`` the same values in the
order the mat-vec kernel's threads read them (:mod:`.layout`).

Files: ``quantize_q8_1.cu`` (the kernel), :mod:`.launch` (``launch``), :mod:`.emulate`
(``emulate``, the Numba emulator; same bytes).
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
