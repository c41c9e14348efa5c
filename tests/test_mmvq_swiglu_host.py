"""``CudaOps.norm_swiglu_matvec``'s choice between the SwiGLU epilogue launch and the unfused ops (host logic,
no GPU: the launches are recorders)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hiraishin.plans import MatVecPlan


class _MatVec:
    """What the backend's prepared mat-vec offers the dispatch: plan, group, rows, layout."""

    def __init__(self, plan, n, layout, grouped=True, row_bytes=144 * 4):
        self.plan, self.n, self.layout, self.qtype = plan, n, layout, plan.qtype
        self.group = (plan.qtype, row_bytes, plan) if grouped else None


def _ops(monkeypatch, on, gate_up, calls):
    from hiraishin.backends import cuda as cuda_backend
    from hiraishin.backends import cuda_fused

    monkeypatch.setattr(sys.modules["hiraishin.kernels.mmvq_swiglu.launch"], "SWIGLU_EPILOGUE", on)

    class Launch:
        def __init__(self, *args):
            calls.append(("new swiglu launch", args))

        def __call__(self, wg, wu, xq, g, u, yq):
            calls.append(("swiglu launch", wg, wu, xq, g.shape, u.shape, yq))

    monkeypatch.setattr(cuda_fused, "SwigluMatVecLaunch", Launch)  # (the fused launches are planned there)
    monkeypatch.setattr(cuda_backend, "launch_add_rms_norm_q8_1",
                        lambda x, r, w, eps, s, xq, normed, first, xq2, second: calls.append(("norm", xq, xq2)))
    down = _MatVec(MatVecPlan("mmvq", "Q6_K", nwarps=4, rows_per_block=1, cols_per_launch=1, ncols=1), 64, "Q6_K")
    ops = object.__new__(cuda_backend.CudaOps)
    ops._token_scratch = {}
    ops._layouts = lambda weights, T, order: ((gate_up, ["Q4_K"]) if len(weights) == 2 else ([down], ["Q6_K"]))
    ops._empty = lambda shape, dtype: np.zeros(shape, dtype)
    ops._q8_1_scratch = lambda T, K, layout: f"q8_1 {T}x{K} {layout}"
    ops._run_matvecs = lambda weights, mvs, xqs, T, outs: calls.append(("down", weights[0], xqs)) or ["d"]
    ops.norm_matvecs = lambda x, nw, eps, w, order, outs, residual, out_sum: (calls.append(("norm_matvecs",))
                                                                             or (("g", "u"), out_sum))
    ops.swiglu_matvec = lambda g, u, w, order, out=None: calls.append(("swiglu_matvec", g, u, w)) or "d"
    return ops


def _plan(rows=1, kind="mmvq"):
    return MatVecPlan(kind, "Q4_K", nwarps=4, rows_per_block=rows, cols_per_launch=1, ncols=1)


@pytest.mark.parametrize("on,gate_up,fused", [
    (True, [_MatVec(_plan(), 64, "Q4_K"), _MatVec(_plan(), 64, "Q4_K")], True),
    (True, [_MatVec(_plan(2), 64, "Q4_K"), _MatVec(_plan(2), 64, "Q4_K")], True),
    (False, [_MatVec(_plan(), 64, "Q4_K"), _MatVec(_plan(), 64, "Q4_K")], False),   # the switch off
    (True, [_MatVec(_plan(3), 96, "Q4_K"), _MatVec(_plan(3), 96, "Q4_K")], False),  # a block across two groups
    (True, [_MatVec(_plan(), 80, "Q4_K"), _MatVec(_plan(), 80, "Q4_K")], False),    # a part group
    (True, [_MatVec(_plan(), 64, "Q4_K", grouped=False), _MatVec(_plan(), 64, "Q4_K", grouped=False)], False),
])
def test_norm_swiglu_matvec_takes_the_epilogue_where_it_fits(monkeypatch, on, gate_up, fused):
    calls = []
    ops = _ops(monkeypatch, on, gate_up, calls)
    x = np.zeros((1, 32), np.float32)
    for _ in range(2):  # the second call reuses the launch
        d, s = ops.norm_swiglu_matvec(x, "nw", 1e-6, ("wg", "Q4_K"), ("wu", "Q4_K"), ("wd", "Q6_K"), None,
                                      residual=x, out_sum="sum", between=lambda: calls.append(("between",)))
        assert d == "d" and s == "sum"
    if not fused:
        assert calls == [("norm_matvecs",), ("between",), ("swiglu_matvec", "g", "u", ("wd", "Q6_K"))] * 2
        return
    n, plan = gate_up[0].n, gate_up[0].plan
    assert calls[0] == ("new swiglu launch", ("Q4_K", n, 4 * 256, 1, plan.rows_per_block, 4, "Q6_K"))
    yq = f"q8_1 1x{n} Q6_K"
    one = [("norm", "q8_1 1x32 Q4_K", None), ("swiglu launch", "wg", "wu", "q8_1 1x32 Q4_K", (1, n), (1, n), yq),
           ("between",), ("down", ("wd", "Q6_K"), {"Q6_K": yq})]
    assert calls[1:] == one * 2
