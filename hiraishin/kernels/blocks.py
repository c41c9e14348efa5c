"""Block facts the Numba emulators use as module constants (Numba folds them into compiled code).

Taken from :mod:`hiraishin.quant`, so no emulator repeats a block size or a type id.
"""

from __future__ import annotations

from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID, QK_K

__all__ = ["Q8_1_BYTES", "Q4_K_BYTES", "Q6_K_BYTES", "Q8_0_BYTES", "Q4_K_ID", "Q6_K_ID", "Q8_1_PER_SUPER"]

Q8_1_BYTES = BLOCK_BYTES["Q8_1"]
Q4_K_BYTES = BLOCK_BYTES["Q4_K"]
Q6_K_BYTES = BLOCK_BYTES["Q6_K"]
Q8_0_BYTES = BLOCK_BYTES["Q8_0"]
Q4_K_ID = GGML_TYPE_ID["Q4_K"]
Q6_K_ID = GGML_TYPE_ID["Q6_K"]
Q8_1_PER_SUPER = QK_K // BLOCK_ELEMS["Q8_1"]  # q8_1 blocks of 32 values per 256-value super-block
