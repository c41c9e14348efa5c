"""Activation quantization to q8_1 (the input of the dp4a mat-vec kernels).

Geometry of llama.cpp's CUDA ``quantize_q8_1`` (reference section 3.1,
``ggml/src/ggml-cuda/quantize.cu``): one warp per block of 32 values. Per
block, ``amax`` is a butterfly max of ``|x|`` and ``sum`` is the xor butterfly
(offsets 16, 8, 4, 2, 1) of the *unquantized* floats. Arithmetic is IEEE
(llama.cpp's fast-math build uses an approximate reciprocal instead)::

    d = amax / 127                       (correctly rounded)
    q = 0 if amax == 0 else roundf(x / d)  (correctly rounded division, half away from zero)
    block = fp16 h(d), fp16 h(sum), int8 q[32]

Layout: uint8 array (ncols, K/32 * 36), one row per column (token). With ``layout="Q4_K"`` or
``"Q6_K"`` the same values come in the order the mat-vec kernel's threads read them for that
weight type (:mod:`.q8_1_layout`).

:func:`quantize_q8_1` runs the kernel (``backend="cuda"``) or its Numba
emulator (``backend="cpu"``); both give the same bytes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..errors import BackendError, QuantError
from ..fp import roundf
from ..quant import GGML_TYPE_ID

__all__ = [
    "Q8_1_BLOCK_ELEMS",
    "Q8_1_BLOCK_BYTES",
    "QUANTIZE_WARPS_PER_BLOCK",
    "quantize_q8_1",
    "quantize_kernel",
    "quantize_defines",
    "dequantize_q8_1",
    "f32_to_f16_bits",
    "F16_TO_F32",
]

Q8_1_BLOCK_ELEMS = 32  # QK8_1 (ggml-common.h)
Q8_1_BLOCK_BYTES = 36  # fp16 d, fp16 s, int8 qs[32]
# llama.cpp launches CUDA_QUANTIZE_BLOCK_SIZE = 256 threads (quantize.cuh), i.e. 8 warps,
# one q8_1 block per warp. The block size does not change any result.
QUANTIZE_WARPS_PER_BLOCK = 8

# fp16 bits -> float32 value, for all 65536 patterns (exact conversion, a table is the
# fastest way for the emulators to read fp16 scale fields).
F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


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


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_q8_1_emulate(x, out):
    ncols, k = x.shape
    nb = k // 32
    for c in prange(ncols):
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


def _check_x(x, xp) -> None:
    if x.ndim != 2 or x.dtype != np.float32:
        raise QuantError(
            f"quantize_q8_1 needs float32 activations of shape (ncols, K); got {x.dtype} {tuple(x.shape)}"
        )
    if x.shape[1] % Q8_1_BLOCK_ELEMS or x.shape[1] == 0:
        raise QuantError(
            f"quantize_q8_1: K = {x.shape[1]} (activations {tuple(x.shape)}) is not a positive multiple of 32"
        )


def quantize_q8_1(x, backend: str = "cpu", layout: str | None = None):
    """Quantize float32 activations ``x`` (ncols, K) to q8_1 bytes (ncols, K/32*36).

    ``backend="cpu"`` takes and returns numpy arrays (Numba emulator);
    ``backend="cuda"`` takes and returns cupy arrays (the CUDA kernel).
    ``layout`` ``"Q4_K"`` / ``"Q6_K"``: the mat-vec input layout for that weight type instead
    (:mod:`.q8_1_layout`; K a multiple of 256), written directly by the kernel.
    """
    if layout is not None:
        from .q8_1_layout import LAYOUT_BYTES, to_layout

        if layout not in LAYOUT_BYTES:
            raise QuantError(f"quantize_q8_1: unknown layout {layout!r}; expected None or one of "
                             f"{sorted(LAYOUT_BYTES)}")
        if backend == "cpu":
            return to_layout(quantize_q8_1(x, "cpu"), layout)
    if backend == "cpu":
        if not isinstance(x, np.ndarray):
            raise BackendError(f"backend 'cpu' needs a numpy array for x, got {type(x).__name__}")
        _check_x(x, np)
        x = np.ascontiguousarray(x)
        out = np.empty((x.shape[0], x.shape[1] // 32 * Q8_1_BLOCK_BYTES), dtype=np.uint8)
        if x.shape[0]:
            _quantize_q8_1_emulate(x, out)
        return out
    if backend == "cuda":
        return _quantize_q8_1_cuda(x, layout)
    raise BackendError(f"unknown backend {backend!r}; expected 'cpu' or 'cuda'")




def quantize_defines(layout: str | None = None) -> dict:
    """``#define``\\ s of quantize_q8_1.cu: HX_LAYOUT is 0 (llama.cpp's blocks) or the ggml type id of
    the weight whose mat-vec reads the layout."""
    return {"HX_LAYOUT": 0 if layout is None else GGML_TYPE_ID[layout]}


def quantize_kernel(layout: str | None = None):
    """The compiled quantize kernel writing ``layout`` (None: llama.cpp's blocks)."""
    from ._cuda import get_kernel

    return get_kernel("quantize_q8_1.cu", "quantize_q8_1", quantize_defines(layout))


def _quantize_q8_1_cuda(x, layout=None):
    from ._cuda import require_cupy

    cp = require_cupy()
    if not isinstance(x, cp.ndarray):
        raise BackendError(f"backend 'cuda' needs a cupy array for x, got {type(x).__name__}")
    _check_x(x, cp)
    x = cp.ascontiguousarray(x)
    ncols, k = x.shape
    nb = k // 32
    if layout is None:
        out = cp.empty((ncols, nb * Q8_1_BLOCK_BYTES), dtype=cp.uint8)
    else:
        from .q8_1_layout import LAYOUT_BYTES

        if k % 256:
            raise QuantError(f"quantize_q8_1: layout {layout} needs K a multiple of 256, got K={k} "
                             f"(activations {tuple(x.shape)})")
        out = cp.empty((ncols, k // 256 * LAYOUT_BYTES[layout]), dtype=cp.uint8)
    if ncols == 0:
        return out
    kernel = quantize_kernel(layout)
    grid = ((nb + QUANTIZE_WARPS_PER_BLOCK - 1) // QUANTIZE_WARPS_PER_BLOCK, ncols, 1)
    block = (32 * QUANTIZE_WARPS_PER_BLOCK, 1, 1)
    kernel(grid, block, (x, out, np.int32(k), np.int64(k)))
    return out


def dequantize_q8_1(xq) -> np.ndarray:
    """q8_1 bytes (ncols, nb*36) -> float64 values ``f(d) * q`` (for tests and notebooks)."""
    xq = np.asarray(xq)
    if xq.ndim != 2 or xq.dtype != np.uint8 or xq.shape[1] % Q8_1_BLOCK_BYTES:
        raise QuantError(f"q8_1 data must be uint8 (ncols, nb*36); got {xq.dtype} {tuple(xq.shape)}")
    blocks = xq.reshape(xq.shape[0], -1, Q8_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    q = blocks[..., 4:].view(np.int8).astype(np.float64)
    return (d[..., None] * q).reshape(xq.shape[0], -1)
