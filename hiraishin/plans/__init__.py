"""Plans: the geometry every kernel sums its floats with, for one order and one pass shape.

Pure Python, below the kernels: ``plan(order, pass shape, device profile) -> Plan``. Notebooks
and the CPU use plans without touching a kernel; an op (``hiraishin/kernels/<op>/``) takes a plan
and runs it, on the GPU or in its emulator.

* :func:`matvec_plan` -> :class:`MatVecPlan` (``plans/matvec.py``): nwarps, rows per block,
  columns per launch, mat-vec or tiled kernel; under the sub-block order a :class:`SubBlockPlan`
  (``plans/subblock.py``) for Q4_K/Q6_K weights; under the variant order past 8 columns a
  :class:`MMQStockPlan` (``plans/mmq_stock.py``, llama.cpp's MMQ order) for Q4_K/Q6_K weights;
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
from .mmq_stock import MMQStockPlan
from .subblock import SUBBLOCK_QTYPES, SubBlockPlan, subblock_plan

__all__ = [
    "matvec_plan",
    "attention_plan",
    "MatVecPlan",
    "SubBlockPlan",
    "MMQStockPlan",
    "AttentionPlan",
    "matvec_traits",
    "parallel_blocks_for",
    "CHUNK_CELLS",
    "KV_PAD",
    "MMVQ_MAX_BATCH_SIZE",
    "PLAN_CACHE_SIZE",
    "ATTENTION_PLAN_CACHE_SIZE",
]

# Plans kept per kind. A decode step needs ~10 mat-vec plans; attention plans are keyed by the KV
# length, which grows by one per token, so their cache is bounded by the recent lengths a
# speculative run revisits (about 90 bytes each: a long generation's host memory stays flat).
PLAN_CACHE_SIZE = 8192
ATTENTION_PLAN_CACHE_SIZE = 1024


def _check_device(device):
    if device is not None and not isinstance(device, (str, DeviceProfile)):
        raise PlanError(f"device must be None, a profile name or a DeviceProfile, got {type(device).__name__}")


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _matvec_cached(order, ncols, qtype, device, k, n):
    if order.matvec == "subblock" and qtype in SUBBLOCK_QTYPES:
        if k is None:
            raise PlanError(f"order {order.name!r}: the sub-block order's plan needs the row length k")
        return subblock_plan(ncols, qtype, k, device, n)
    return _matvec.matvec_plan(order, ncols, qtype, device, k, n)


@functools.lru_cache(maxsize=ATTENTION_PLAN_CACHE_SIZE)
def _attention_cached(order, n_queries, kv_len, n_head, n_head_kv, head_dim, device):
    return _attention.attention_plan(order, n_queries, kv_len, n_head, n_head_kv, head_dim, device)


def matvec_plan(order, ncols: int, qtype: str, device=None, k: int | None = None,
                n: int | None = None) -> MatVecPlan | SubBlockPlan | MMQStockPlan:
    """The mat-vec plan ``order`` gives to ``ncols`` columns of a ``qtype`` weight (cached).

    ``device``: a profile name, a :class:`~hiraishin.devices.DeviceProfile` or ``None``
    (``order.device``, else the default profile); it picks llama.cpp's nwarps table. ``k`` (values
    per row) and ``n`` (rows) of the weight: the sub-block order needs ``k`` (its K split) and
    uses ``n`` for a launch fact; the variant order's Q4_K/Q6_K plans past 8 columns need both (the
    stock MMQ K split); the mat-vec plans use ``k`` for the rows per CUDA block of short rows (no
    bit depends on it).
    """
    _check_device(device)
    if order.matvec != "subblock" and not (order.matvec == "variant" and ncols > MMVQ_MAX_BATCH_SIZE):
        n = None  # one cached plan per (order, ncols, qtype, device, k), whatever the number of rows
    return _matvec_cached(order, ncols, qtype, order.device if device is None else device, k, n)


def attention_plan(order, n_queries: int, kv_len: int, n_head: int, n_head_kv: int, head_dim: int = 128,
                   device=None) -> AttentionPlan:
    """The attention plan ``order`` picks for ``n_queries`` queries over ``kv_len`` filled KV cells (cached)."""
    _check_device(device)
    return _attention_cached(order, n_queries, kv_len, n_head, n_head_kv, head_dim,
                             order.device if device is None else device)
