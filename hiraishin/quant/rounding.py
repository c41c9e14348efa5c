"""Float32 rounding primitives used by ggml's reference quantizers, vectorized.

Each helper mirrors one C idiom from ``ggml/src/ggml-quants.c`` bit for bit on
float32 numpy arrays, so the quantizers built on them reproduce the reference bytes.
"""

from __future__ import annotations

import numpy as np

# nearest_int(): ``fval + 12582912.f`` (1.5 * 2^23) puts the rounded integer in the low
# mantissa bits; the float add rounds half to even.  Valid for |fval| <= 4194303.
_MAGIC = np.float32(12582912.0)
_MANTISSA_MASK = np.int32(0x007FFFFF)
_MANTISSA_BIAS = np.int32(0x00400000)


def nearest_int(f: np.ndarray) -> np.ndarray:
    """ggml ``nearest_int``: round-half-to-even of float32 values, as int32."""
    f = np.asarray(f, dtype=np.float32)
    bits = (f + _MAGIC).view(np.int32)
    return (bits & _MANTISSA_MASK) - _MANTISSA_BIAS


def roundf(x: np.ndarray) -> np.ndarray:
    """C ``roundf`` (half away from zero) of float32 values, exactly, as float32."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    fl = np.floor(a)  # inf/NaN pass through as NaN; c_float_to_int8 maps them like x86
    # a - floor(a) is exact in float32, so the comparison with 0.5 is exact too.
    r = fl + (a - fl >= np.float32(0.5)).astype(np.float32)
    return np.copysign(r, x)


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> fp16 round-to-nearest-even (``GGML_FP32_TO_FP16``), returned as uint16 bits."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def fp16_round(x: np.ndarray) -> np.ndarray:
    """f(h(x)): fp32 -> fp16 (RN) -> fp32, the scale value a dequantizer will read back."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


_INT32_INDEFINITE = np.int32(-(2**31))  # what x86 cvttss2si returns for NaN / out-of-range


def c_float_to_int8(r: np.ndarray) -> np.ndarray:
    """C ``(int8_t)float_value`` as compiled for x86-64: truncating convert to int32
    (``cvttss2si``; NaN, inf and out-of-range give INT32_MIN), then keep the low byte.

    Only matters for q8 blocks whose ``1/d`` overflows to inf (amax below ~3.7e-37): the
    C then converts ``roundf(+-inf or NaN)``, which is undefined behaviour in ISO C; x86
    gives 0.  Such blocks store d = fp16 0, so they dequantize to zeros either way."""
    r = np.asarray(r, dtype=np.float32)
    ok = np.isfinite(r) & (np.abs(r) < np.float32(2.0**31))
    i32 = np.where(ok, r, np.float32(0)).astype(np.int32)
    i32 = np.where(ok, i32, _INT32_INDEFINITE)
    return (i32 & np.int32(0xFF)).astype(np.uint8).view(np.int8)
