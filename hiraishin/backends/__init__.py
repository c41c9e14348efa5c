"""Backends the forward pass runs on: ``cpu`` (Numba emulators) and ``cuda`` (CuPy RawKernels)."""

from __future__ import annotations

from ..errors import BackendError
from .base import Backend

__all__ = ["Backend", "get_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("cpu", "cuda", "auto")


def get_backend(name: str | Backend = "auto", device=None) -> Backend:
    """The backend called ``name``: ``"cpu"``, ``"cuda"``, or ``"auto"`` (cuda when CuPy sees a GPU).

    Asking for ``"cuda"`` without CuPy or a GPU raises :class:`~hiraishin.errors.BackendError`.
    ``device`` is the device profile plans are made for (see :class:`Backend`).
    """
    if isinstance(name, Backend):
        return name
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(device)
    if name == "cuda":
        from .cuda import CudaBackend

        return CudaBackend(device)
    if name == "auto":
        from .cuda import cuda_available

        return get_backend("cuda" if cuda_available() else "cpu", device)
    raise BackendError(f"unknown backend {name!r}; choose one of {BACKEND_NAMES}")
