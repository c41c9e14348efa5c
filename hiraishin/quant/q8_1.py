"""block_q8_1: fp16 d, fp16 s, 32 int8 quants.

``quantize_q8_1_ref`` mirrors the CPU reference ``quantize_row_q8_1_ref`` (s = h(d * sum(qs))).
The CUDA activation quantizer stores a different s (sum of the unquantized floats) and a
different d arithmetic; that lives in ``hiraishin.kernels.quantize_q8_1``, not here.
"""

from __future__ import annotations

import numpy as np

from .formats import BLOCK_Q8_1, QK8_1, blocks_as_bytes
from .q8_0 import absmax_scale
from .rounding import c_float_to_int8, fp16_bits, roundf


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) with n % 32 == 0 -> uint8 (..., n/32*36), as quantize_row_q8_1_ref."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // QK8_1, QK8_1)
    d, inv = absmax_scale(xb)
    q = c_float_to_int8(roundf(xb * inv[..., None]))
    # The C sums the int8 quants into an int (exact in any order), then multiplies by the fp32 d.
    qsum = q.astype(np.int32).sum(axis=-1).astype(np.float32)
    out = np.empty(xb.shape[:-1], dtype=BLOCK_Q8_1)
    out["d"] = fp16_bits(d).view(np.float16)
    out["s"] = fp16_bits(qsum * d).view(np.float16)
    out["qs"] = q
    return blocks_as_bytes(out)


def dequantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    """Structured q8_1 blocks (..., nb) -> float32 (..., nb*32): ``x = f(d) * qs`` (s is not used)."""
    d = blocks["d"].astype(np.float32)
    q = blocks["qs"].astype(np.float32)
    y = q * d[..., None]
    return y.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK8_1)
