"""Byte layouts of the ggml block formats (``ggml/src/ggml-common.h``) as numpy dtypes.

A quantized row is a uint8 array of ``row_bytes`` bytes; viewing it with the block dtype
below gives one structured element per block with named fields.
"""

from __future__ import annotations

import numpy as np

from hiraishin.errors import QuantError

QK_K = 256  # super-block size of the k-quants (QK_K, ggml-common.h)
QK8_0 = 32  # QK8_0
QK8_1 = 32  # QK8_1
K_SCALE_SIZE = 12  # packed 6-bit scales+mins of block_q4_K

BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])  # 34 B
BLOCK_Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK8_1,))])  # 36 B
BLOCK_Q4_K = np.dtype(
    [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (K_SCALE_SIZE,)), ("qs", "u1", (QK_K // 2,))]
)  # 144 B
BLOCK_Q6_K = np.dtype(
    [("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)), ("scales", "i1", (QK_K // 16,)), ("d", "<f2")]
)  # 210 B

BLOCK_DTYPES: dict[str, np.dtype] = {
    "Q8_0": BLOCK_Q8_0,
    "Q8_1": BLOCK_Q8_1,
    "Q4_K": BLOCK_Q4_K,
    "Q6_K": BLOCK_Q6_K,
}

# Element dtypes of the unquantized types; BF16 is carried as its raw uint16 bits.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}

QUANTIZED_TYPES = tuple(BLOCK_DTYPES)
FLOAT_TYPES = tuple(FLOAT_DTYPES)
QTYPES = QUANTIZED_TYPES + FLOAT_TYPES

BLOCK_ELEMS: dict[str, int] = {"Q8_0": QK8_0, "Q8_1": QK8_1, "Q4_K": QK_K, "Q6_K": QK_K, "F32": 1, "F16": 1, "BF16": 1}
BLOCK_BYTES: dict[str, int] = {
    **{name: dt.itemsize for name, dt in BLOCK_DTYPES.items()},
    **{name: dt.itemsize for name, dt in FLOAT_DTYPES.items()},
}

# enum ggml_type values (ggml.h); identical to gguf.GGMLQuantizationType.
GGML_TYPE_ID: dict[str, int] = {"F32": 0, "F16": 1, "Q8_0": 8, "Q8_1": 9, "Q4_K": 12, "Q6_K": 14, "BF16": 30}
_NAME_BY_ID = {v: k for k, v in GGML_TYPE_ID.items()}


def qtype_name(qtype) -> str:
    """Normalize a qtype given as a name ("Q4_K"), a ggml type id, or a
    ``gguf.GGMLQuantizationType`` to its name; raise QuantError for anything unsupported."""
    if isinstance(qtype, str):
        if qtype in GGML_TYPE_ID:
            return qtype
        raise QuantError(f"unknown qtype {qtype!r}; supported: {', '.join(QTYPES)}")
    if isinstance(qtype, (int, np.integer)) and not isinstance(qtype, bool):
        # gguf.GGMLQuantizationType is an IntEnum, so it lands here too.
        name = _NAME_BY_ID.get(int(qtype))
        if name is not None:
            return name
    raise QuantError(f"unsupported qtype {qtype!r}; supported: {', '.join(QTYPES)}")


def to_gguf_type(qtype):
    """The ``gguf.GGMLQuantizationType`` member for a qtype name."""
    import gguf

    return gguf.GGMLQuantizationType(GGML_TYPE_ID[qtype_name(qtype)])


def from_gguf_type(gtype) -> str:
    """The qtype name for a ``gguf.GGMLQuantizationType`` (or ggml type id)."""
    return qtype_name(gtype)


def row_bytes(n_elems: int, qtype) -> int:
    """Bytes of one row of ``n_elems`` values stored as ``qtype``."""
    name = qtype_name(qtype)
    if not isinstance(n_elems, (int, np.integer)) or isinstance(n_elems, bool) or n_elems < 0:
        raise QuantError(f"{name}: row length must be a non-negative integer, got {n_elems!r}")
    qk = BLOCK_ELEMS[name]
    if n_elems % qk:
        raise QuantError(f"{name}: row length {n_elems} is not a multiple of the block size {qk}")
    return int(n_elems) // qk * BLOCK_BYTES[name]


def n_elems_of(nbytes: int, qtype) -> int:
    """Values in a row of ``nbytes`` bytes of ``qtype`` (inverse of :func:`row_bytes`)."""
    name = qtype_name(qtype)
    bb = BLOCK_BYTES[name]
    if nbytes % bb:
        raise QuantError(f"{name}: row of {nbytes} bytes is not a multiple of the block size {bb} B")
    return nbytes // bb * BLOCK_ELEMS[name]


def as_blocks(data: np.ndarray, qtype) -> np.ndarray:
    """View uint8 rows ``(..., row_bytes)`` as structured blocks ``(..., n_blocks)``."""
    name = qtype_name(qtype)
    if name not in BLOCK_DTYPES:
        raise QuantError(f"{name} is not a block format")
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise QuantError(f"{name}: quantized data must be uint8 (..., row_bytes), got dtype {data.dtype}")
    if data.ndim == 0:
        raise QuantError(f"{name}: quantized data must have at least one axis, got a scalar")
    n_elems_of(data.shape[-1], name)  # validates the row length
    data = np.ascontiguousarray(data)
    return data.view(BLOCK_DTYPES[name])


def blocks_as_bytes(blocks: np.ndarray) -> np.ndarray:
    """Structured blocks ``(..., n_blocks)`` back to uint8 rows ``(..., row_bytes)``."""
    blocks = np.ascontiguousarray(blocks)
    return blocks.view(np.uint8).reshape(*blocks.shape[:-1], blocks.shape[-1] * blocks.dtype.itemsize)


def quantize_superblocks_in_chunks(x: np.ndarray, block_dtype: np.dtype, quantize_chunk,
                                   chunk_blocks: int) -> np.ndarray:
    """float32 (..., n), n a multiple of 256 -> uint8 bytes of ``block_dtype`` super-blocks.

    ``quantize_chunk`` maps float32 (b, 256) to b structured blocks; it runs on at most
    ``chunk_blocks`` super-blocks at a time, so its work arrays stay small.
    """
    lead = x.shape[:-1]
    flat = x.reshape(-1, QK_K)
    out = np.empty(flat.shape[0], dtype=block_dtype)
    for s in range(0, flat.shape[0], chunk_blocks):
        out[s : s + chunk_blocks] = quantize_chunk(flat[s : s + chunk_blocks])
    return blocks_as_bytes(out.reshape(*lead, x.shape[-1] // QK_K))
