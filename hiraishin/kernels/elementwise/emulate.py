"""Emulators of ``elementwise.cu``: SwiGLU, add, get_rows (the op sequences are in the package docstring)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ...fp import expf
from ...quant import dequantize

__all__ = ["emulate_swiglu", "emulate_add", "emulate_get_rows", "emulate_argmax_rows"]


@njit(cache=True)
def _swiglu_flat(g, u, out):
    one = np.float32(1.0)
    for i in range(g.size):
        gi = g[i]
        out[i] = (gi / (one + expf(-gi))) * u[i]


def emulate_swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``silu(g) * u`` elementwise on float32 numpy arrays of one shape; unchecked."""
    g = np.ascontiguousarray(g)
    u = np.ascontiguousarray(u)
    out = np.empty_like(g)
    _swiglu_flat(g.reshape(-1), u.reshape(-1), out.reshape(-1))
    return out


def emulate_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` (numpy's float32 add is the same single IEEE op); unchecked."""
    return np.add(a, b, dtype=np.float32)


def emulate_get_rows(table: np.ndarray, qtype: str, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of a uint8 (N, row_bytes) ``qtype`` table as float32 (len(ids), K); unchecked.

    The kernels' per-element formulas are the block formats' dequantization (gguf-py's order, op
    for op), so the emulator is :func:`hiraishin.quant.dequantize` of the selected rows.
    """
    rows = np.ascontiguousarray(table[np.asarray(ids, dtype=np.int64)])
    return dequantize(rows, qtype).reshape(len(ids), -1)


def emulate_argmax_rows(x: np.ndarray) -> np.ndarray:
    """``hx_argmax_rows``: int32 (T,) first index of each row's largest value of float32 (T, n);
    numpy's argmax has the kernel's rule (a NaN counts as the largest; -0.0 == +0.0)."""
    return np.argmax(np.asarray(x, dtype=np.float32), axis=1).astype(np.int32)


def emulate_topk_row(x: np.ndarray, k: int) -> np.ndarray:
    """``hx_topk_row``: int32 (k, 2), per place (best first) the index of one of the ``k`` largest values of the
    float32 row ``x`` and the value's bits; index -1 (bits 0) past the row's end. The rule of
    hiraishin.decode.greedy.top_k_of: numpy's stable argsort of -x (NaN last, ties to the lower index)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    ids = np.argsort(-x, kind="stable")[:k]
    out = np.zeros((k, 2), np.int32)
    out[:, 0] = -1
    out[:len(ids), 0] = ids
    out[:len(ids), 1] = x[ids].view(np.int32)
    return out
