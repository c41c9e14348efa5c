"""The f16 KV cache: one K and one V array per layer, cell-major like llama.cpp.

Each layer holds ``K`` and ``V`` of shape ``(n_ctx, n_head_kv, head_dim)`` in
float16 (numpy for the ``cpu`` backend, cupy for ``cuda``). :meth:`KVCache.write`
stores a pass's float32 keys/values, rounded to nearest even; ``length`` counts
the valid cells. Attention reads only cells below the ``kv_len`` it is given,
so :meth:`KVCache.rollback` (speculative decoding discarding rejected draft
positions) just moves ``length`` back: stale cells are overwritten by the next
write and never read before that.
"""

from __future__ import annotations

import numpy as np

from ..errors import BackendError, HiraishinError

__all__ = ["KVCache", "KVCacheError", "cache_bytes"]


class KVCacheError(HiraishinError, ValueError):
    """A KV cache operation got a bad layer, position or tensor."""


def _array_module(backend: str):
    if backend == "cpu":
        return np
    if backend == "cuda":
        from ..kernels.compile import require_cupy

        return require_cupy()
    raise BackendError(f"unknown backend {backend!r}; use 'cpu' or 'cuda'")


def cache_bytes(n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> int:
    """Bytes of an f16 K and V cache of ``n_ctx`` cells (2 tensors x 2 bytes per value)."""
    return 2 * n_layer * n_ctx * n_head_kv * head_dim * 2


class KVCache:
    """Per-layer f16 K/V storage of ``n_ctx`` cells with a valid length.

    ``write`` does not change ``length``; a pass writes every layer at
    ``start_pos`` and the caller then calls ``commit(start_pos + n_tokens)``.
    """

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int, backend: str = "cpu"):
        for name, value in (("n_layer", n_layer), ("n_ctx", n_ctx), ("n_head_kv", n_head_kv),
                            ("head_dim", head_dim)):
            if int(value) != value or value < 1:
                raise KVCacheError(f"KVCache: {name} must be a positive integer, got {value!r}")
        self.n_layer = int(n_layer)
        self.n_ctx = int(n_ctx)
        self.n_head_kv = int(n_head_kv)
        self.head_dim = int(head_dim)
        self.backend = backend
        self._xp = _array_module(backend)
        shape = (self.n_ctx, self.n_head_kv, self.head_dim)
        self._k, self._v = [], []
        try:
            for _ in range(self.n_layer):
                self._k.append(self._xp.zeros(shape, dtype=self._xp.float16))
                self._v.append(self._xp.zeros(shape, dtype=self._xp.float16))
        except Exception as exc:  # noqa: BLE001 - MemoryError, or CuPy's OutOfMemoryError (not a MemoryError)
            if not _is_out_of_memory(exc):
                raise
            self._k, self._v = [], []  # release what was allocated before saying so
            per_cell = cache_bytes(self.n_layer, 1, self.n_head_kv, self.head_dim)
            raise KVCacheError(
                f"KVCache: {self.n_ctx} cells need {per_cell * self.n_ctx / 2**30:.2f} GiB "
                f"({per_cell} bytes per cell) on {backend}, which is not available{_fits(self._xp, per_cell)}"
            ) from None
        self._length = 0

    @property
    def length(self) -> int:
        """Number of valid cells (positions ``0 .. length-1``)."""
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by all K and V arrays."""
        return cache_bytes(self.n_layer, self.n_ctx, self.n_head_kv, self.head_dim)

    def _check_layer(self, layer: int) -> int:
        if int(layer) != layer or not 0 <= layer < self.n_layer:
            raise KVCacheError(f"KVCache: layer must be in 0..{self.n_layer - 1}, got {layer!r}")
        return int(layer)

    def k(self, layer: int):
        """K of ``layer``: float16 ``(n_ctx, n_head_kv, head_dim)`` (the whole buffer)."""
        return self._k[self._check_layer(layer)]

    def v(self, layer: int):
        """V of ``layer``: float16 ``(n_ctx, n_head_kv, head_dim)`` (the whole buffer)."""
        return self._v[self._check_layer(layer)]

    def write(self, layer: int, start_pos: int, k, v) -> None:
        """Store float32 ``k``, ``v`` of shape ``(T, n_head_kv, head_dim)`` at cells ``start_pos ..``.

        Values are rounded to float16 (nearest even; beyond +-65504 they become
        +-inf). ``start_pos`` may not be
        past ``length`` (no holes) and ``start_pos + T`` may not pass ``n_ctx``.
        """
        layer = self._check_layer(layer)
        want = (self.n_head_kv, self.head_dim)
        for name, arr in (("k", k), ("v", v)):
            shape = tuple(getattr(arr, "shape", ()))
            if len(shape) != 3 or shape[1:] != want:
                raise KVCacheError(f"KVCache.write: {name} must have shape (T, {want[0]}, {want[1]}), "
                                   f"got {shape}")
            if getattr(arr, "dtype", None) != np.float32:
                raise KVCacheError(f"KVCache.write: {name} must be float32, got {getattr(arr, 'dtype', None)}")
        if tuple(k.shape) != tuple(v.shape):
            raise KVCacheError(f"KVCache.write: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
        n = k.shape[0]
        if int(start_pos) != start_pos or start_pos < 0:
            raise KVCacheError(f"KVCache.write: start_pos must be a non-negative integer, got {start_pos!r}")
        if start_pos > self._length:
            raise KVCacheError(f"KVCache.write: start_pos {start_pos} is past the valid length "
                               f"{self._length} (would leave a hole; commit the previous pass first)")
        if start_pos + n > self.n_ctx:
            raise KVCacheError(f"KVCache.write: cells {start_pos}..{start_pos + n - 1} do not fit in "
                               f"n_ctx = {self.n_ctx}")
        xp = self._xp
        with np.errstate(over="ignore"):  # beyond the f16 range -> +-inf, as a GPU cast gives
            self._k[layer][start_pos:start_pos + n] = xp.asarray(k).astype(xp.float16)
            self._v[layer][start_pos:start_pos + n] = xp.asarray(v).astype(xp.float16)

    def commit(self, end_pos: int) -> None:
        """Mark cells ``0 .. end_pos-1`` valid (after a pass wrote them in every layer)."""
        if int(end_pos) != end_pos or not self._length <= end_pos <= self.n_ctx:
            raise KVCacheError(f"KVCache.commit: end_pos must be in {self._length}..{self.n_ctx} "
                               f"(use rollback to shorten), got {end_pos!r}")
        self._length = int(end_pos)

    def rollback(self, pos: int) -> None:
        """Discard cells ``pos ..`` (e.g. rejected draft tokens); ``length`` becomes ``pos``."""
        if int(pos) != pos or not 0 <= pos <= self._length:
            raise KVCacheError(f"KVCache.rollback: pos must be in 0..{self._length}, got {pos!r}")
        self._length = int(pos)

    def reset(self) -> None:
        """Forget every cell (length 0)."""
        self._length = 0

    def __repr__(self) -> str:
        return (f"KVCache(n_layer={self.n_layer}, n_ctx={self.n_ctx}, n_head_kv={self.n_head_kv}, "
                f"head_dim={self.head_dim}, backend={self.backend!r}, length={self._length})")


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def _fits(xp, per_cell: int) -> str:
    """', at most N cells fit now' for a GPU (free memory / bytes per cell), else ''."""
    if xp is np:
        return ""
    try:
        xp.get_default_memory_pool().free_all_blocks()
        free, _ = xp.cuda.runtime.memGetInfo()
    except Exception:  # noqa: BLE001 - only for the message
        return ""
    return f"; at most {free // per_cell} cells fit in the {free / 2**30:.2f} GiB free now"
