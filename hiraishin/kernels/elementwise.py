"""Elementwise kernels: SwiGLU, residual add, and embedding-row lookup (get_rows).

None of them reduces, so none has an order to plan; what must match across backends is the
sequence of float ops per element, written explicitly on both sides:

* SwiGLU: ``silu(g) * u`` with ``silu(g) = g / (1 + exp(-g))``; ``exp`` is the library's own
  (``hx_expf`` / :func:`hiraishin.fp.expf`), the division IEEE.
* add: ``a + b``.
* get_rows: dequantize whole rows of a quantized table (the token embedding) to float32, with
  gguf-py's formula order (``gguf/quants.py`` ``dequantize_blocks``): Q8_0 ``q * d``;
  Q4_K ``(d * sc) * q - (dmin * m)`` (no fma); Q6_K ``(d * sc) * q``. The result equals
  :func:`hiraishin.quant.dequantize` of those rows bit for bit.

CUDA sources in ``elementwise.cu``; the ``*_cpu`` functions are the emulators.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..errors import BackendError
from ..fp import expf
from ..quant import dequantize

__all__ = ["swiglu", "swiglu_cpu", "swiglu_cuda", "add", "add_cpu", "add_cuda", "launch_binary",
           "get_rows", "get_rows_cpu", "get_rows_cuda", "launch_get_rows", "GET_ROWS_TYPES"]

# Elements per block and bytes per block of the table types get_rows reads
# (ggml-common.h: QK_K = 256, block_q4_K 144 B, block_q6_K 210 B, QK8_0 = 32, block_q8_0 34 B).
GET_ROWS_TYPES = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34), "F16": (1, 2), "F32": (1, 4)}
ELEMENTWISE_THREADS = 256  # block size of the 1-D elementwise launches (no reduction: any size is exact)
GET_ROWS_THREADS = 256


# ---- SwiGLU -------------------------------------------------------------------------------

@njit(cache=True)
def _swiglu_flat(g, u, out):
    one = np.float32(1.0)
    for i in range(g.size):
        gi = g[i]
        out[i] = (gi / (one + expf(-gi))) * u[i]


def _check_pair(name, a, b):
    if a.shape != b.shape or a.dtype != np.float32 or b.dtype != np.float32:
        raise BackendError(f"{name}: needs two float32 arrays of one shape, got {a.dtype}{a.shape}, {b.dtype}{b.shape}")


def swiglu_cpu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Emulator: ``silu(g) * u`` elementwise on float32 numpy arrays."""
    _check_pair("swiglu", g, u)
    g = np.ascontiguousarray(g)
    u = np.ascontiguousarray(u)
    out = np.empty_like(g)
    _swiglu_flat(g.reshape(-1), u.reshape(-1), out.reshape(-1))
    return out


def add_cpu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Emulator: ``a + b`` (numpy's float32 add is the same single IEEE op)."""
    _check_pair("add", a, b)
    return np.add(a, b, dtype=np.float32)


@functools.cache
def _kernel(name: str):
    from . import _cuda

    return _cuda.get_kernel("elementwise.cu", name)


def launch_binary(kernel_name: str, a, b, out):
    """Launch ``hx_swiglu_f32`` or ``hx_add_f32`` into ``out``, unchecked.

    For callers that validated once (the CUDA backend): ``a``, ``b``, ``out`` float32
    C-contiguous CuPy arrays of one size, ``out`` overlapping neither. Returns ``out``.
    """
    n = a.size
    if n:
        blocks = (n + ELEMENTWISE_THREADS - 1) // ELEMENTWISE_THREADS
        _kernel(kernel_name)((blocks,), (ELEMENTWISE_THREADS,), (a, b, out, np.int64(n)))
    return out


def _launch_binary(kernel_name, a, b):
    from . import _cuda

    cp = _cuda.require_cupy()
    _check_pair(kernel_name, a, b)
    a = cp.ascontiguousarray(cp.asarray(a))
    b = cp.ascontiguousarray(cp.asarray(b))
    return launch_binary(kernel_name, a, b, cp.empty_like(a))


def swiglu_cuda(g, u):
    """Launch ``hx_swiglu_f32`` on float32 CuPy arrays."""
    return _launch_binary("hx_swiglu_f32", g, u)


def add_cuda(a, b):
    """Launch ``hx_add_f32`` on float32 CuPy arrays."""
    return _launch_binary("hx_add_f32", a, b)


def swiglu(g, u, backend: str = "cpu"):
    """``silu(g) * u`` on the named backend."""
    if backend == "cpu":
        return swiglu_cpu(g, u)
    if backend == "cuda":
        return swiglu_cuda(g, u)
    raise BackendError(f"swiglu: unknown backend {backend!r}")


def add(a, b, backend: str = "cpu"):
    """``a + b`` on the named backend."""
    if backend == "cpu":
        return add_cpu(a, b)
    if backend == "cuda":
        return add_cuda(a, b)
    raise BackendError(f"add: unknown backend {backend!r}")


# ---- get_rows -----------------------------------------------------------------------------

def _n_cols(table_shape, qtype: str) -> int:
    if qtype not in GET_ROWS_TYPES:
        raise BackendError(f"get_rows: unsupported table type {qtype!r}; supported: {sorted(GET_ROWS_TYPES)}")
    elems, nbytes = GET_ROWS_TYPES[qtype]
    row_bytes = table_shape[1]
    if row_bytes % nbytes:
        raise BackendError(f"get_rows: {qtype} row of {row_bytes} bytes is not a whole number of blocks")
    return row_bytes // nbytes * elems


def _as_byte_table(table, xp):
    # F32/F16 tables may arrive as float arrays; the kernels read bytes.
    if table.dtype != xp.uint8:
        table = xp.ascontiguousarray(table).view(xp.uint8).reshape(table.shape[0], -1)
    return table


def _check_ids(ids, n_rows: int):
    if ids.ndim != 1:
        raise BackendError(f"get_rows: ids must be 1-D, got shape {ids.shape}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_rows):
        raise BackendError(f"get_rows: token ids {int(ids.min())}..{int(ids.max())} outside the table's {n_rows} rows")


def get_rows_cpu(table: np.ndarray, qtype: str, ids) -> np.ndarray:
    """Emulator: rows ``ids`` of ``table`` (uint8 (N, row_bytes), or F32/F16 (N, K)) as float32 (len(ids), K)."""
    table = _as_byte_table(np.asarray(table), np)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    _check_ids(ids, table.shape[0])
    n_cols = _n_cols(table.shape, qtype)
    # The kernels' per-element formulas are the block formats' dequantization (gguf-py's order,
    # op for op), so the emulator is hiraishin.quant.dequantize of the selected rows.
    return dequantize(np.ascontiguousarray(table[ids]), qtype).reshape(ids.size, n_cols)


_GET_ROWS_KERNEL = {"Q4_K": "hx_get_rows_q4_K", "Q6_K": "hx_get_rows_q6_K", "Q8_0": "hx_get_rows_q8_0",
                    "F16": "hx_get_rows_f16", "F32": "hx_get_rows_f32"}


def launch_get_rows(table, qtype: str, ids, out):
    """Launch ``hx_get_rows_<qtype>`` into ``out``, unchecked: grid (len(ids), ceil(K/256)).

    For callers that validated once: ``table`` uint8 C-contiguous (N, row_bytes) CuPy array of
    ``qtype`` blocks, ``ids`` int32 C-contiguous (T,) on the device, each in ``0..N-1``, ``out``
    float32 C-contiguous (T, K). Returns ``out``.
    """
    n_cols = out.shape[1]
    if ids.size:
        grid = (ids.size, (n_cols + GET_ROWS_THREADS - 1) // GET_ROWS_THREADS)
        _kernel(_GET_ROWS_KERNEL[qtype])(grid, (GET_ROWS_THREADS,),
                                         (table, ids, out, np.int32(n_cols), np.int64(table.shape[1])))
    return out


def get_rows_cuda(table, qtype: str, ids):
    """Launch ``hx_get_rows_<qtype>``: grid (len(ids), ceil(K/256)), one thread per element."""
    from . import _cuda

    cp = _cuda.require_cupy()
    if isinstance(ids, np.ndarray):
        _check_ids(ids, table.shape[0])  # range check on the host, before the upload
    table = _as_byte_table(cp.asarray(table), cp)
    ids = cp.ascontiguousarray(cp.asarray(ids), dtype=cp.int32)
    n_cols = _n_cols(table.shape, qtype)
    return launch_get_rows(table, qtype, ids, cp.empty((ids.size, n_cols), cp.float32))


def get_rows(table, qtype: str, ids, backend: str = "cpu"):
    """Dequantized rows ``ids`` of ``table`` as float32 (len(ids), K) on the named backend."""
    if backend == "cpu":
        return get_rows_cpu(table, qtype, ids)
    if backend == "cuda":
        return get_rows_cuda(table, qtype, ids)
    raise BackendError(f"get_rows: unknown backend {backend!r}")
