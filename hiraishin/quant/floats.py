"""Unquantized tensor types: F32, F16 and BF16 (carried as raw uint16 bits).

Conversions follow ggml: fp32 -> fp16 is round-to-nearest-even (F16C / ``GGML_FP32_TO_FP16``);
fp32 -> bf16 is ``ggml_compute_fp32_to_bf16`` (NaN -> quiet NaN, otherwise round-to-nearest-even).
"""

from __future__ import annotations

import numpy as np


def to_f32(x: np.ndarray) -> np.ndarray:
    return np.array(x, dtype=np.float32, copy=True)


def to_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), as ggml_compute_fp32_to_bf16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u.astype(np.uint64) + (np.uint64(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint64(16)
    quiet = (u >> np.uint32(16)) | np.uint32(64)  # force the NaN quiet bit
    return np.where(is_nan, quiet, rounded).astype(np.uint16)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    return np.asarray(h, dtype=np.float16).astype(np.float32)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
