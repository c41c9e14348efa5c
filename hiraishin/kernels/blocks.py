"""Block facts the Numba emulators use as module constants (Numba folds them into compiled code),
and the two byte readers the tensor-core emulators share.

Taken from :mod:`hiraishin.quant`, so no emulator repeats a block size or a type id.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID, QK_K

__all__ = ["Q4_K_BYTES", "Q4_K_ID", "Q6_K_BYTES", "Q6_K_ID", "Q8_0_BYTES", "Q8_0_ELEMS", "Q8_1_BYTES",
           "Q8_1_ELEMS", "Q8_1_PER_SUPER", "QK_K", "half_at", "int8_of"]

Q8_1_BYTES = BLOCK_BYTES["Q8_1"]
Q4_K_BYTES = BLOCK_BYTES["Q4_K"]
Q6_K_BYTES = BLOCK_BYTES["Q6_K"]
Q8_0_BYTES = BLOCK_BYTES["Q8_0"]
Q4_K_ID = GGML_TYPE_ID["Q4_K"]
Q6_K_ID = GGML_TYPE_ID["Q6_K"]
Q8_1_PER_SUPER = QK_K // BLOCK_ELEMS["Q8_1"]  # q8_1 blocks of 32 values per 256-value super-block
Q8_0_ELEMS = BLOCK_ELEMS["Q8_0"]  # values per block (QK_K: per K-quant super-block)
Q8_1_ELEMS = BLOCK_ELEMS["Q8_1"]


@njit(cache=True, inline="always")
def half_at(b0, b1, f16):
    """The float32 value of the little-endian fp16 bytes ``b0``, ``b1`` (``f16``: the 65536-entry table)."""
    return f16[np.int64(b0) | (np.int64(b1) << 8)]


@njit(cache=True, inline="always")
def int8_of(b):
    """A uint8 byte read as int8."""
    v = np.int32(b)
    return v - 256 if v >= 128 else v
