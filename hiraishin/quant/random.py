"""Random but valid weight blocks, for tests, benchmarks and notebooks (no quantizer needed)."""

from __future__ import annotations

import numpy as np

from hiraishin.errors import QuantError

from .formats import BLOCK_BYTES, BLOCK_ELEMS

__all__ = ["random_blocks"]

_RANDOM_TYPES = ("Q4_K", "Q6_K", "Q8_0")


def random_blocks(qtype: str, n_rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random VALID weight blocks (N, row_bytes) for tests and benchmarks.

    Quant bytes and 6-bit/8-bit scales are uniform random; the fp16 scale
    fields are finite and of a realistic size (|w| up to about 2), so no
    quantizer is needed and any (N, K) is cheap to make.
    """
    if qtype not in _RANDOM_TYPES:
        raise QuantError(f"random_blocks supports {list(_RANDOM_TYPES)}, got {qtype!r}")
    qk, block_bytes = BLOCK_ELEMS[qtype], BLOCK_BYTES[qtype]
    if k % qk or k <= 0 or n_rows < 0:
        raise QuantError(f"random_blocks: K={k} must be a positive multiple of {qk} for {qtype}")
    rng = np.random.default_rng(seed)
    nb = k // qk
    blocks = rng.integers(0, 256, size=(n_rows, nb, block_bytes), dtype=np.uint8)

    def f16(lo, hi, shape, signed=False):
        v = rng.uniform(lo, hi, size=shape)
        if signed:
            v *= rng.choice([-1.0, 1.0], size=shape)
        return v.astype(np.float16).view(np.uint8).reshape(*shape, 2)

    if qtype == "Q4_K":
        blocks[:, :, 0:2] = f16(2e-4, 2e-3, (n_rows, nb))  # d
        blocks[:, :, 2:4] = f16(2e-4, 2e-3, (n_rows, nb))  # dmin
    elif qtype == "Q6_K":
        blocks[:, :, 208:210] = f16(1e-4, 5e-4, (n_rows, nb), signed=True)
    else:  # Q8_0
        blocks[:, :, 0:2] = f16(2e-4, 2e-3, (n_rows, nb), signed=True)
    return blocks.reshape(n_rows, nb * block_bytes)
