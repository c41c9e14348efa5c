"""Correctly rounded float32 operations for the Numba emulators.

Bit-exact emulation of a CUDA kernel needs each float operation on the CPU to be
the same IEEE operation, in the same order, as on the GPU. Numba keeps float32
arithmetic in float32 (add, mul, div and sqrt of two float32 are single
correctly rounded ops, and Numba never contracts ``a*b+c`` without fastmath),
so the one missing piece is a true fused multiply-add: :func:`fmaf` emits
LLVM's ``llvm.fma.f32``. Emulating fma as a float64 multiply-add rounded to
float32 is *not* exact (double rounding, about one op in 2**29).

:func:`expf` is the library's own exponential, written from explicit
correctly-rounded operations so that the CUDA side (``kernels/fp.cuh``,
``hx_expf``) and the CPU side produce the same bits. CUDA's ``expf``/``__expf``
are approximations the CPU cannot reproduce.

Rules for emulator code: keep every value float32 (``np.float32(...)`` on
literals; an int or Python float operand silently promotes to float64), and
write ``fmaf(a, b, c)`` exactly where the kernel writes ``__fmaf_rn``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = ["fmaf", "expf", "roundf", "warp_sum32", "EXP_LO", "EXP_HI", "expf_array", "F16_TO_F32",
           "f32_to_f16_bits", "u16le"]

# fp16 bits -> float32 value, for all 65536 patterns (exact conversion; a table is the fastest
# way for the emulators to read fp16 scale fields).
F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@intrinsic
def fmaf(typingctx, a, b, c):
    """``fmaf(a, b, c)``: a*b+c with one rounding (float32 only)."""
    if not all(t == types.float32 for t in (a, b, c)):
        raise TypingError(f"fmaf needs three float32 arguments, got ({a}, {b}, {c})")
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fnty = ir.FunctionType(f32, [f32, f32, f32])
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], fnty)
        return builder.call(fn, args)

    return sig, codegen


# expf range: below EXP_LO the result is flushed to 0 (e^-87 ~ 1.6e-38 is still
# normal, so no subnormal scaling is needed); above EXP_HI it is +inf. Softmax
# arguments are <= 0, so only the lower cut ever matters, and -inf gives 0.
EXP_LO = np.float32(-87.0)
EXP_HI = np.float32(88.0)

_LOG2E = np.float32(1.44269504088896341)
_ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer (half to even)
_LN2_HI = np.float32(-0.693359375)  # Cody-Waite split of -ln 2 (exact in 10 bits)
_LN2_LO = np.float32(2.12194440e-4)
# Cephes expf minimax coefficients on [-ln2/2, ln2/2].
_P0 = np.float32(1.9875691500e-4)
_P1 = np.float32(1.3981999507e-3)
_P2 = np.float32(8.3334519073e-3)
_P3 = np.float32(4.1665795894e-2)
_P4 = np.float32(1.6666665459e-1)
_P5 = np.float32(5.0000001201e-1)
_ONE = np.float32(1.0)
# 2**n for n in [-127, 127], exact powers of two (index n + 127).
_POW2 = np.array([2.0**n for n in range(-127, 128)], dtype=np.float64).astype(np.float32)


@njit(cache=True, inline="always")
def expf(x):
    """e**x in float32, the same op sequence as ``hx_expf`` in ``kernels/fp.cuh``."""
    if x != x:
        return x
    if x < EXP_LO:
        return np.float32(0.0)
    if x > EXP_HI:
        return np.float32(np.inf)
    j = fmaf(x, _LOG2E, _ROUND_MAGIC)
    j = j - _ROUND_MAGIC
    n = int(j)
    r = fmaf(j, _LN2_HI, x)
    r = fmaf(j, _LN2_LO, r)
    p = fmaf(_P0, r, _P1)
    p = fmaf(p, r, _P2)
    p = fmaf(p, r, _P3)
    p = fmaf(p, r, _P4)
    p = fmaf(p, r, _P5)
    z = r * r
    y = fmaf(p, z, r)
    y = y + _ONE
    return y * _POW2[n + 127]


@njit(cache=True)
def expf_array(x):
    """Elementwise :func:`expf` over a float32 array (for tests and notebooks)."""
    out = np.empty_like(x)
    flat_in = x.ravel()
    flat_out = out.ravel()
    for i in range(flat_in.size):
        flat_out[i] = expf(flat_in[i])
    return out


@njit(cache=True, inline="always")
def roundf(x):
    """Round half away from zero, as CUDA's ``roundf`` (numpy rounds half to even)."""
    t = np.float32(np.trunc(x))  # exact
    frac = x - t  # exact: the fractional part of a float32 is representable
    if frac >= np.float32(0.5):
        return t + np.float32(1.0)
    if frac <= np.float32(-0.5):
        return t - np.float32(1.0)
    return t


@njit(cache=True, inline="always")
def warp_sum32(x):
    """``hx_warp_sum`` over 32 lane values (xor 16, 8, 4, 2, 1): the value every lane ends with.

    Lane L adds lane L^off at each step; since a + b == b + a, lanes L and L^off hold the same
    sum, so lanes 0..off-1 carry all distinct values and the result is lane 0's.
    """
    a = np.empty(16, np.float32)
    for i in range(16):
        a[i] = x[i] + x[i + 16]
    for i in range(8):
        a[i] = a[i] + a[i + 8]
    for i in range(4):
        a[i] = a[i] + a[i + 4]
    for i in range(2):
        a[i] = a[i] + a[i + 2]
    return a[0] + a[1]


@njit(cache=True, inline="always")
def u16le(a, i, o):
    """The little-endian 16-bit word at bytes ``a[i, o], a[i, o+1]`` (an fp16 field's bits)."""
    return np.int64(a[i, o]) | (np.int64(a[i, o + 1]) << 8)


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE bit pattern of a float32, as uint32 (an LLVM bitcast)."""
    if x != types.float32:
        raise TypingError(f"_f32_bits needs a float32, got {x}")

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@njit(cache=True, inline="always")
def f32_to_f16_bits(x):
    """IEEE fp32 -> fp16 conversion, round to nearest even (CUDA ``cvt.rn.f16.f32``); returns the bits."""
    bits = np.int64(_f32_bits(x))
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    if exp == 0xFF:  # inf or nan (nan keeps a quiet payload bit)
        return sign | 0x7C00 | (0x200 if mant != 0 else 0)
    e = exp - 112  # rebias 127 -> 15
    if e >= 31:
        return sign | 0x7C00
    if e <= 0:  # fp16 subnormal (or zero): value = m * 2**-24
        shift = 14 - e
        if shift > 24:
            return sign
        full = mant | 0x800000
        r = full >> shift
        rem = full & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (r & 1) == 1):
            r += 1
        return sign | r
    r = (e << 10) | (mant >> 13)
    rem = mant & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (r & 1) == 1):
        r += 1  # may carry into the exponent, up to inf: that is the correct rounding
    return sign | r
