"""block_q8_0: fp16 scale + 32 int8 quants (``quantize_row_q8_0_ref``, ``dequantize_row_q8_0``)."""

from __future__ import annotations

import numpy as np

from .formats import BLOCK_Q8_0, QK8_0, blocks_as_bytes
from .rounding import c_float_to_int8, fp16_bits, roundf

_Q8_MAX = np.float32(127.0)  # (1 << 7) - 1


def absmax_scale(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-block ``d = amax/127`` and ``id = d ? 1/d : 0`` in float32, blocks on axis -1.

    Shared by the q8_0 and q8_1 reference quantizers (identical arithmetic)."""
    amax = np.abs(xb).max(axis=-1)
    d = amax / _Q8_MAX
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    return d, inv


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) with n % 32 == 0 -> uint8 (..., n/32*34), as quantize_row_q8_0_ref."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // QK8_0, QK8_0)
    d, inv = absmax_scale(xb)
    out = np.empty(xb.shape[:-1], dtype=BLOCK_Q8_0)
    out["d"] = fp16_bits(d).view(np.float16)
    out["qs"] = c_float_to_int8(roundf(xb * inv[..., None]))
    return blocks_as_bytes(out)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Structured q8_0 blocks (..., nb) -> float32 (..., nb*32): ``x = f(d) * qs``."""
    d = blocks["d"].astype(np.float32)
    q = blocks["qs"].astype(np.float32)
    y = q * d[..., None]
    return y.reshape(*blocks.shape[:-1], blocks.shape[-1] * QK8_0)
