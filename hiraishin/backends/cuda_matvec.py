"""One prepared mat-vec of the CUDA backend: its plan, the q8_1 layout its activations must be in, and its
launch (:class:`PreparedMatVec`; ``CudaOps.matvec`` makes and caches them)."""

from __future__ import annotations

from ..kernels import tiled
from ..kernels.mmq.launch import multi_enabled as mmq_multi_enabled
from ..kernels.mmq.launch import prepared_launch as mmq_prepared_launch
from ..kernels.mmq_stock.launch import prepared_launch as mmq_stock_prepared_launch
from ..kernels.mmvq.launch import MULTI_MAX_WEIGHTS, prepared_plan
from ..kernels.mmvq.launch import mixed_enabled as mmvq_mixed_enabled
from ..kernels.quantize.layout import layout_for
from ..plans import MMQStockPlan, SubBlockPlan
from ..plans.matvec import MatVecPlan, matvec_traits

__all__ = ["PreparedMatVec", "mixed_groups"]


def mixed_groups(groups: dict, n_weights: int):
    """``((key_a, indices_a), (key_b, indices_b))`` where ``groups`` (group key -> weight indices, in weight
    order; a weight launched alone keyed ``("alone", i)``) are two groups of one-launch mmvq mat-vecs of two
    types with the same warps, the first group's weights before the second's, at most ``MULTI_MAX_WEIGHTS`` in
    all, and ``HIRAISHIN_MMVQ_MIXED`` allows one ``mmvq_mixed`` launch of them (or a norm fused into it); else
    None."""
    if len(groups) != 2 or n_weights > MULTI_MAX_WEIGHTS or not mmvq_mixed_enabled():
        return None
    (ka, ia), (kb, ib) = groups.items()
    if ka[0] == "alone" or kb[0] == "alone" or ka[0] == kb[0] or max(ia) > min(ib):
        return None
    pa, pb = ka[2], kb[2]
    if not (isinstance(pa, MatVecPlan) and isinstance(pb, MatVecPlan) and pa.nwarps == pb.nwarps):
        return None
    return (ka, ia), (kb, ib)


class PreparedMatVec:
    """One prepared mat-vec: the plan, the layout its activations must be in, and the launch
    (the mat-vec kernel's prepared plan, the sub-block or stock-MMQ MMA kernel, or the tiled kernel)."""

    __slots__ = ("plan", "launch", "n", "layout", "qtype", "group")

    def __init__(self, plan, qtype: str, n: int, row_bytes: int, wtile: bool = False):
        """``wtile``: the weight is in 16-row tile records (:mod:`hiraishin.kernels.mmq.wtile`; sub-block plans
        only)."""
        t = matvec_traits(qtype)
        self.plan, self.n, self.qtype = plan, n, qtype
        # mat-vecs with the same group key may share one mmvq_multi (or hx_mmq_multi) launch (same
        # kernel geometry and row length, one launch per plan); None: launched alone
        self.group = None
        if isinstance(plan, MatVecPlan) and plan.kernel == "mmvq" and len(plan.launches()) == 1:
            self.group = (qtype, row_bytes, plan)
        if isinstance(plan, SubBlockPlan):  # int8 MMA kernels reading their own q8_1 layout (or llama.cpp's)
            self.launch = mmq_prepared_launch(n, plan, wtile)
            self.layout = self.launch.layout
            if mmq_multi_enabled():  # hx_mmq_multi for weights of one plan and one weight layout
                self.group = (qtype, row_bytes, plan, bool(wtile))
        elif isinstance(plan, MMQStockPlan):  # llama.cpp's MMQ order (int8 MMA), same layout
            self.launch = mmq_stock_prepared_launch(plan)
            self.layout = None
        elif plan.kernel == "mmvq":
            self.launch = prepared_plan(qtype, n, row_bytes // t.block_bytes * t.qk, plan)
            self.layout = layout_for(qtype)  # of the q8_1 activations this mat-vec reads (None: llama.cpp's)
        else:
            self.launch = None
            self.layout = None

    def __call__(self, w, xq, out):
        if self.launch is None:
            return tiled.launch(w, self.qtype, xq, self.plan, out)
        return self.launch(w, xq, out)
