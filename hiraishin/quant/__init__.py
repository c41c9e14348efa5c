"""ggml block formats: byte layouts, dequantization and llama.cpp's reference quantizers.

Quantized rows are uint8 arrays ``(..., row_bytes)``; unquantized tensors are float32 (F32),
float16 (F16) or uint16 bits (BF16).  qtypes are names ("Q4_K", "Q6_K", "Q8_0", "Q8_1", "F32",
"F16", "BF16"); a ``gguf.GGMLQuantizationType`` or a ggml type id is accepted too.

The quantizers reproduce the bytes of ``quantize_row_{q4_K,q6_K,q8_0,q8_1}_ref``
(``ggml/src/ggml-quants.c``) with every float32 operation rounded separately, i.e. the C
compiled without FMA contraction.  A GCC/Clang build with ``-march=native`` on an FMA machine
may fuse ``a*b + c`` (GCC's default ``-ffp-contract=fast``) in the error and least-squares
sums, which can flip a candidate choice in rare near-ties.  Inputs must be finite: NaN or inf
raise QuantError (the C reference gives order-dependent garbage for them).  gguf-py 0.19 has
Q8_0 quantize (byte-identical to ours) but no Q4_K / Q6_K / Q8_1 quantize.
"""

from __future__ import annotations

import numpy as np

from hiraishin.errors import QuantError

from . import floats
from .formats import (
    BLOCK_BYTES,
    BLOCK_DTYPES,
    BLOCK_ELEMS,
    FLOAT_TYPES,
    GGML_TYPE_ID,
    QK_K,
    QTYPES,
    as_blocks,
    from_gguf_type,
    qtype_name,
    row_bytes,
    to_gguf_type,
)
from .q4_k import dequantize_q4_k, quantize_q4_k
from .q6_k import dequantize_q6_k, quantize_q6_k
from .q8_0 import dequantize_q8_0, quantize_q8_0
from .q8_1 import dequantize_q8_1, quantize_q8_1
from .random import random_blocks

__all__ = [
    "random_blocks",
    "BLOCK_BYTES",
    "BLOCK_DTYPES",
    "BLOCK_ELEMS",
    "GGML_TYPE_ID",
    "QK_K",
    "QTYPES",
    "as_blocks",
    "dequantize",
    "from_gguf_type",
    "quantize",
    "quantize_q8_1_ref",
    "qtype_name",
    "row_bytes",
    "to_gguf_type",
]

_DEQUANTIZERS = {
    "Q4_K": dequantize_q4_k,
    "Q6_K": dequantize_q6_k,
    "Q8_0": dequantize_q8_0,
    "Q8_1": dequantize_q8_1,
}
_QUANTIZERS = {
    "Q4_K": quantize_q4_k,
    "Q6_K": quantize_q6_k,
    "Q8_0": quantize_q8_0,
    "Q8_1": quantize_q8_1,
}
_FLOAT_BYTES_DTYPE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


def _float_input(x, name: str) -> np.ndarray:
    """Validate quantizer input: a real floating array with a last axis, all finite."""
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise QuantError(f"{name}: quantize needs floating-point input, got dtype {arr.dtype} shape {arr.shape}")
    if arr.ndim == 0:
        raise QuantError(f"{name}: quantize needs an array with a row axis, got a scalar")
    return np.ascontiguousarray(arr, dtype=np.float32)


def quantize(x, qtype) -> np.ndarray:
    """Quantize float rows ``x (..., n)`` to ``qtype``.

    Block types (Q4_K, Q6_K, Q8_0, Q8_1) return uint8 ``(..., row_bytes(n, qtype))`` with the
    bytes of llama.cpp's reference quantizer; n must be a multiple of the block size and every
    value finite.  F32 / F16 / BF16 return float32 / float16 / uint16 (bf16 bits) arrays.
    Any floating input dtype is first converted to float32 (as llama.cpp's converters do)."""
    name = qtype_name(qtype)
    arr = _float_input(x, name)
    if name == "F32":
        return floats.to_f32(arr)
    if name == "F16":
        return floats.to_f16(arr)
    if name == "BF16":
        return floats.to_bf16(arr)
    row_bytes(arr.shape[-1], name)  # validates the row length
    if not np.isfinite(arr).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise QuantError(
            f"{name}: cannot quantize non-finite value {arr[bad]} at index {bad} of an array of shape {arr.shape}"
        )
    with np.errstate(all="ignore"):  # over/underflow inside the reference arithmetic is expected
        return _QUANTIZERS[name](arr)


def quantize_q8_1_ref(x) -> np.ndarray:
    """CPU reference q8_1 (``quantize_row_q8_1_ref``): float rows (..., n), n % 32 == 0 -> uint8
    (..., n/32*36).  Per block: d = amax/127, qs = roundf(x/d), s = h(d * sum(qs)).
    (The CUDA activation quantizer stores s = h(sum(x)) instead.)"""
    return quantize(x, "Q8_1")


def dequantize(data, qtype) -> np.ndarray:
    """Dequantize rows to float32 ``(..., n_elems)``.

    Block types take uint8 ``(..., row_bytes)``.  F32 / F16 / BF16 take either their typed
    array (float32 / float16 / uint16 bf16 bits) or raw little-endian bytes as uint8."""
    name = qtype_name(qtype)
    arr = np.asarray(data)
    if name in FLOAT_TYPES:
        dt = _FLOAT_BYTES_DTYPE[name]
        if arr.dtype == np.uint8:
            if arr.ndim == 0 or arr.shape[-1] % dt.itemsize:
                raise QuantError(f"{name}: raw bytes of shape {arr.shape} are not whole {dt.itemsize}-byte values")
            arr = np.ascontiguousarray(arr).view(dt)
        elif arr.dtype != dt:
            raise QuantError(f"{name}: expected dtype {dt} (or uint8 bytes), got {arr.dtype} shape {arr.shape}")
        if name == "F32":
            return np.array(arr, dtype=np.float32, copy=True)
        if name == "F16":
            return floats.f16_to_f32(arr)
        return floats.bf16_to_f32(arr)
    blocks = as_blocks(arr, name)
    with np.errstate(over="ignore", invalid="ignore"):  # huge fp16 scales overflow like the C does
        return _DEQUANTIZERS[name](blocks)
