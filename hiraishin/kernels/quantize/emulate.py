"""Numba emulator of ``quantize_q8_1.cu`` (same bytes as the kernel; see the package docstring)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...fp import f32_to_f16_bits, roundf
from ...quant import BLOCK_BYTES, BLOCK_ELEMS
from .layout import to_layout

__all__ = ["emulate"]

_QK = BLOCK_ELEMS["Q8_1"]
_BLOCK_BYTES = BLOCK_BYTES["Q8_1"]


# One thread: a column of K values takes microseconds, and a parallel region waits for every thread
# to be scheduled (measured 8 ms per call against 7 us serial on a 2-core machine other processes use).
@njit(cache=True, error_model="numpy")
def _quantize_q8_1(x, out):
    ncols, k = x.shape
    nb = k // 32
    for c in range(ncols):
        s = np.empty(32, dtype=np.float32)
        for ib in range(nb):
            base = ib * 32
            amax = np.float32(0.0)
            for lane in range(32):
                s[lane] = x[c, base + lane]
                a = abs(s[lane])
                if a > amax:  # max is exact; the butterfly order cannot change it
                    amax = a
            # xor butterfly, lane L: s_L + s_{L^off}. Lanes off..2*off-1 hold the same
            # values as lanes 0..off-1 after the previous step (a + b == b + a), so
            # lane 0's result is this in-place halving.
            off = 16
            while off > 0:
                for lane in range(off):
                    s[lane] = s[lane] + s[lane + off]
                off //= 2
            total = s[0]
            d = amax / np.float32(127.0)
            o = ib * 36
            for lane in range(32):
                if amax == np.float32(0.0):
                    q = 0
                else:
                    q = np.int32(roundf(x[c, base + lane] / d))
                out[c, o + 4 + lane] = np.uint8(q & 0xFF)
            hd = f32_to_f16_bits(d)
            hs = f32_to_f16_bits(total)
            out[c, o] = np.uint8(hd & 0xFF)
            out[c, o + 1] = np.uint8(hd >> 8)
            out[c, o + 2] = np.uint8(hs & 0xFF)
            out[c, o + 3] = np.uint8(hs >> 8)


def emulate(x: np.ndarray, layout: str | None = None) -> np.ndarray:
    """q8_1 bytes of float32 ``x`` (ncols, K), K a multiple of 32, as the kernel writes them.

    Inputs are not checked (the CPU backend checks them); ``layout`` as in the package docstring.
    """
    x = np.ascontiguousarray(x)
    out = np.empty((x.shape[0], x.shape[1] // _QK * _BLOCK_BYTES), dtype=np.uint8)
    if x.shape[0]:
        _quantize_q8_1(x, out)
    return out if layout is None else to_layout(out, layout)
