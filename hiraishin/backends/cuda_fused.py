"""The CUDA ops' launches that do one step's work inside a neighbour's launch: a part of
:class:`~hiraishin.backends.cuda.CudaOps`.

Which fused launch replaces which sequence, planned and cached per shape: the output head with its greedy token
(``mmvq_argmax``), the norm made inside the mat-vecs that read it (``norm_mmvq``: one type of weight, two types
as ``mmvq_mixed`` takes them, the head with its token), SwiGLU as the gate/up launch's epilogue
(``mmvq_swiglu``) or the down launch's prologue (``swiglu_down``). Every fused launch gives the bits of the
sequence it replaces; the switches that turn them on live with their kernels. A mixin, as
:mod:`.cuda_attention` is: these methods use the ops' caches (``_token_scratch``, ``_norm_multis``) and
``_layouts``, which :class:`CudaOps` defines.
"""

from __future__ import annotations

from ..kernels.mmvq.launch import MULTI_MAX_WEIGHTS, ArgmaxMatVecLaunch, head_argmax_enabled
from ..kernels.mmvq_swiglu.launch import SwigluMatVecLaunch, swiglu_epilogue_fits
from ..kernels.norm_mmvq import launch as norm_mmvq
from ..kernels.swiglu_down import launch as swiglu_down
from ..kernels.swiglu_down.launch import SwigluDownLaunch, swiglu_down_fits
from ..plans.matvec import MatVecPlan, matvec_traits
from .cuda_matvec import mixed_groups

__all__ = ["CudaFusedOps"]


class CudaFusedOps:
    """Planning and caching of the fused launches (see the module docstring)."""

    def _head_argmax(self, mvs, T: int):
        """The ``mmvq_argmax`` launch of a one-token output head (cached), or None (see :meth:`norm_matvecs`)."""
        if not head_argmax_enabled() or T != 1 or len(mvs) != 1:
            return None
        mv = mvs[0]
        plan = mv.plan
        if not (isinstance(plan, MatVecPlan) and plan.kernel == "mmvq" and plan.cols_per_launch == 1
                and mv.group is not None):
            return None
        t = matvec_traits(mv.qtype)
        k = mv.group[1] // t.block_bytes * t.qk  # the group key holds the row's bytes
        key = ("head_argmax", mv.qtype, mv.n, k, plan)
        hit = self._token_scratch.get(key)
        if hit is None:
            hit = self._token_scratch[key] = ArgmaxMatVecLaunch(mv.qtype, mv.n, k, plan.rows_per_block, plan.nwarps)
        return hit

    def _norm_mmvq_launches(self, mvs, T: int, n: int, eps: float, head: bool = False):
        """The ``hx_norm_mmvq`` launches that replace a norm launch and these mat-vecs, each with the
        indices of its weights (grouped as :meth:`_run_matvecs` groups them); for a pass's ``head`` (one weight,
        one token) under ``HIRAISHIN_HEAD_ARGMAX=1``, the ``hx_norm_mmvq_argmax`` launch that picks the greedy
        token too (:class:`~hiraishin.kernels.norm_mmvq.launch.NormArgmaxLaunch`). None when the pass is
        wider than ``NORM_MMVQ_MAX_TOKENS``, a mat-vec is not a one-launch mmvq plan, weights of two types
        are not what ``mmvq_mixed`` takes (:meth:`_plan_norm_mixed`), the row length has no geometry, or a
        launch has more than ``NORM_MMVQ_MAX_BLOCKS`` CUDA blocks (the limits are read per call, so a
        benchmark may change them)."""
        if not 0 < T <= norm_mmvq.NORM_MMVQ_MAX_TOKENS:  # the default (off): no key to build per call
            return None
        limits = (norm_mmvq.NORM_MMVQ_MAX_TOKENS, norm_mmvq.NORM_MMVQ_MAX_BLOCKS, norm_mmvq.NORM_MMVQ_GROUPS,
                  norm_mmvq.NORM_MMVQ_PER_SM)
        head = head and head_argmax_enabled() and T == 1 and len(mvs) == 1
        key = (tuple((mv.group, mv.n) for mv in mvs), T, n, float(eps), limits, head)
        if key in self._norm_multis:
            return self._norm_multis[key]
        self._norm_multis[key] = fused = self._plan_norm_mmvq(mvs, T, n, eps, limits[0], limits[1], head)
        return fused

    @staticmethod
    def _plan_norm_mmvq(mvs, T: int, n: int, eps: float, max_tokens: int, max_blocks: int, head: bool = False):
        if not 0 < T <= max_tokens or any(mv.group is None or not isinstance(mv.plan, MatVecPlan) for mv in mvs):
            return None
        groups: dict = {}
        for i, mv in enumerate(mvs):
            groups.setdefault(mv.group, []).append(i)
        if len(groups) > 1:  # weights of two types (Q4_K Q and K beside a Q6_K V): one mixed launch or none
            return CudaFusedOps._plan_norm_mixed(mvs, groups, T, n, eps, max_blocks)
        parts = []  # (qtype, plan, weight indices) of each launch
        for (qtype, row_bytes, plan), idx in groups.items():
            t = matvec_traits(qtype)
            geometry = norm_mmvq.norm_mmvq_geometry(n, plan.nwarps)
            if row_bytes // t.block_bytes * t.qk != n or geometry is None or not norm_mmvq.norm_mmvq_fits(
                    (qtype,), n, T, plan.rows_per_block, plan.nwarps, geometry[0]):
                return None
            for start in range(0, len(idx), MULTI_MAX_WEIGHTS):
                part = idx[start:start + MULTI_MAX_WEIGHTS]
                if norm_mmvq.norm_mmvq_blocks([mvs[i].n for i in part], plan.rows_per_block, geometry) > max_blocks:
                    return None
                parts.append((qtype, plan, part))
        if head:  # one weight, one token: the norm, the head and its greedy token
            (qtype, plan, part), = parts
            return [(norm_mmvq.NormArgmaxLaunch(qtype, mvs[0].n, n, plan.rows_per_block, plan.nwarps, mvs[0].layout,
                                                eps), part)]
        return [(norm_mmvq.NormMatVecLaunch(qtype, tuple(mvs[i].n for i in part), n, T, plan.rows_per_block,
                                            plan.nwarps, mvs[part[0]].layout, eps), part)
                for qtype, plan, part in parts]

    @staticmethod
    def _plan_norm_mixed(mvs, groups: dict, T: int, n: int, eps: float, max_blocks: int):
        """``[(hx_norm_mmvq_mixed launch, weight indices)]`` for weights of two types that ``mmvq_mixed`` would
        take (:func:`~.cuda_matvec.mixed_groups`), or None: a fused launch per type would make the norm twice in
        as many launches as the norm launch and mmvq_mixed."""
        pair = mixed_groups(groups, len(mvs))
        if pair is None:
            return None
        (ka, ia), (kb, ib) = pair
        pa, pb = ka[2], kb[2]
        geometry = norm_mmvq.norm_mmvq_geometry(n, pa.nwarps)
        if geometry is None or any(
                row_bytes // matvec_traits(q).block_bytes * matvec_traits(q).qk != n for q, row_bytes, _ in (ka, kb)):
            return None
        idx = ia + ib
        rows = tuple(pa.rows_per_block for _ in ia) + tuple(pb.rows_per_block for _ in ib)
        ns = tuple(mvs[i].n for i in idx)
        if norm_mmvq.norm_mixed_blocks(ns, rows, len(ia), geometry) > max_blocks or not norm_mmvq.norm_mmvq_fits(
                (ka[0], kb[0]), n, T, max(rows), pa.nwarps, geometry[0]):
            return None
        qtypes = tuple(mvs[i].qtype for i in idx)
        return [(norm_mmvq.NormMixedMatVecLaunch(qtypes, ns, rows, n, T, pa.nwarps, eps), idx)]

    def _swiglu_launch(self, mvs, down, T: int, order):
        """``(SwigluMatVecLaunch, down's prepared mat-vec)`` (cached) when gate and up (``mvs``) share one
        mmvq launch whose geometry fits the kernel (:func:`swiglu_epilogue_fits`), else None."""
        gate, up = mvs
        plan = gate.plan
        if not (gate.group is not None and gate.group == up.group and isinstance(plan, MatVecPlan)
                and gate.n == up.n and swiglu_epilogue_fits(gate.n, plan.rows_per_block)):
            return None
        (down_mv,), _ = self._layouts((down,), T, order)
        key = ("swiglu", gate.group, gate.n, T, down_mv.layout)
        hit = self._token_scratch.get(key)
        if hit is None:
            qtype, row_bytes, _ = gate.group
            t = matvec_traits(qtype)
            hit = self._token_scratch[key] = SwigluMatVecLaunch(qtype, gate.n, row_bytes // t.block_bytes * t.qk, T,
                                                                plan.rows_per_block, plan.nwarps, down_mv.layout)
        return hit, down_mv

    def _swiglu_down_launch(self, mv, T: int, k: int):
        """The ``hx_swiglu_down`` launch of a down mat-vec ``mv`` (cached), or None where its plan is not one
        mmvq launch or the product rows do not fit the kernel (:func:`swiglu_down_fits`)."""
        key = ("swiglu_down", mv.group, mv.n, T, k, swiglu_down.SWIGLU_DOWN_PER_SM, swiglu_down.SWIGLU_DOWN_GROUPS)
        if key in self._token_scratch:
            return self._token_scratch[key]
        plan = mv.plan
        hit = None
        if mv.group is not None and isinstance(plan, MatVecPlan) and swiglu_down_fits(
                mv.qtype, k, T, plan.rows_per_block, plan.nwarps, swiglu_down.SWIGLU_DOWN_GROUPS):
            hit = SwigluDownLaunch(mv.qtype, mv.n, k, T, plan.rows_per_block, plan.nwarps)
        self._token_scratch[key] = hit
        return hit
