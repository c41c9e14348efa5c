"""The CUDA backend: CuPy arrays, every op a hand-written RawKernel (hiraishin/kernels/*.cu)."""

from __future__ import annotations

import numpy as np

from ..kernels._cuda import cupy_available, require_cupy
from .base import Backend

__all__ = ["CudaBackend", "cuda_available"]


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return cupy_available()


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device=None):
        self.xp = require_cupy()  # BackendError naming what is missing (CuPy, driver, device)
        if isinstance(device, str) and device == "current":
            # this GPU's SM count and our kernels' measured occupancy, as one DeviceProfile that
            # both the mat-vec and the attention planners accept
            from ..kernels.fattn_vec import current_profile

            device = current_profile()
        super().__init__(device)

    def to_device(self, a):
        return self.xp.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return self.xp.asnumpy(a)

    def upload_weight(self, a):
        return self.xp.asarray(np.ascontiguousarray(a))

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def memory_used(self) -> int:
        """Bytes held by CuPy's default memory pool."""
        return int(self.xp.get_default_memory_pool().used_bytes())
