"""Plans: the geometry every kernel sums its floats with, for one order and one pass shape.

Pure Python, below the kernels: ``plan(order, pass shape, device profile) -> Plan``. Notebooks
and the CPU use plans without touching a kernel; an op (``hiraishin/kernels/<op>/``) takes a plan
and runs it, on the GPU or in its emulator.

* :func:`matvec_plan` -> :class:`MatVecPlan` (``plans/matvec.py``): nwarps, rows per block,
  columns per launch, mat-vec or tiled kernel;
* :func:`attention_plan` -> :class:`AttentionPlan` (``plans/attention.py``): kernel, parallel
  blocks, chunk size, attended KV range.

Both are cached (a decode step asks for the same few dozen plans every token). Every plan has
``describe()``: the order of adds in words.

>>> from hiraishin import ReductionOrder
>>> from hiraishin.plans import matvec_plan
>>> print(matvec_plan(ReductionOrder.BATCH_VARIANT, ncols=5, qtype="Q6_K").describe())  # doctest: +SKIP
"""

from __future__ import annotations

import functools

from ..devices import DeviceProfile
from ..errors import PlanError
from . import attention as _attention
from . import matvec as _matvec
from .attention import CHUNK_CELLS, KV_PAD, AttentionPlan, parallel_blocks_for
from .matvec import MMVQ_MAX_BATCH_SIZE, MatVecPlan, matvec_traits

__all__ = [
    "matvec_plan",
    "attention_plan",
    "MatVecPlan",
    "AttentionPlan",
    "matvec_traits",
    "parallel_blocks_for",
    "CHUNK_CELLS",
    "KV_PAD",
    "MMVQ_MAX_BATCH_SIZE",
    "PLAN_CACHE_SIZE",
]

# Plans kept per kind. A decode step needs ~10 mat-vec plans; attention plans are keyed by the KV
# length, which grows by one per token, so their cache must be bounded.
PLAN_CACHE_SIZE = 8192


def _check_device(device):
    if device is not None and not isinstance(device, (str, DeviceProfile)):
        raise PlanError(f"device must be None, a profile name or a DeviceProfile, got {type(device).__name__}")


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _matvec_cached(order, ncols, qtype, device):
    return _matvec.matvec_plan(order, ncols, qtype, device)


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _attention_cached(order, n_queries, kv_len, n_head, n_head_kv, head_dim, device):
    return _attention.attention_plan(order, n_queries, kv_len, n_head, n_head_kv, head_dim, device)


def matvec_plan(order, ncols: int, qtype: str, device=None) -> MatVecPlan:
    """The mat-vec plan ``order`` gives to ``ncols`` columns of a ``qtype`` weight (cached).

    ``device``: a profile name, a :class:`~hiraishin.devices.DeviceProfile` or ``None``
    (``order.device``, else the default profile); it picks llama.cpp's nwarps table.
    """
    _check_device(device)
    return _matvec_cached(order, ncols, qtype, order.device if device is None else device)


def attention_plan(order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int, head_dim: int = 128,
                   device=None) -> AttentionPlan:
    """The attention plan ``order`` picks for ``n_queries`` queries over ``kv_len`` filled KV cells (cached)."""
    _check_device(device)
    return _attention_cached(order, n_queries, kv_len, n_head, n_head_kv, head_dim,
                             order.device if device is None else device)
