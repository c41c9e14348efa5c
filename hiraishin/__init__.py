"""hiraishin: the order of floating-point adds inside GPU kernels, and what it does to LLM output.

>>> from hiraishin import Qwen3, ReductionOrder
"""

from __future__ import annotations

from .errors import BackendError, GGUFError, HiraishinError, PlanError, QuantError
from .order import ReductionOrder

__version__ = "0.1.0"

__all__ = [
    "Qwen3",
    "ReductionOrder",
    "HiraishinError",
    "GGUFError",
    "QuantError",
    "PlanError",
    "BackendError",
    "__version__",
]


def __getattr__(name):
    # The model pulls in Numba kernels; import it only when asked for.
    if name == "Qwen3":
        from .model.qwen3 import Qwen3

        return Qwen3
    raise AttributeError(f"module 'hiraishin' has no attribute {name!r}")
