"""The SUBBLOCK preset end to end on the CPU: plans, backend dispatch, a model's batch invariance."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin import ReductionOrder
from hiraishin.backends import get_backend
from hiraishin.errors import PlanError
from hiraishin.plans import MatVecPlan, SubBlockPlan, matvec_plan
from hiraishin.quant import random_blocks

SUB = ReductionOrder.SUBBLOCK


def test_plans_of_the_subblock_order():
    plan = matvec_plan(SUB, 5, "Q4_K", k=4096, n=1024)
    assert isinstance(plan, SubBlockPlan) and plan.nseg == 16 and plan.k == 4096
    # the K split depends on K alone: every width gets the same segments
    assert {matvec_plan(SUB, w, "Q6_K", k=12288).segment_bounds() == matvec_plan(SUB, 1, "Q6_K", k=12288)
            .segment_bounds() for w in range(1, 17)} == {True}
    assert "sub-block order" in plan.describe()
    # weight types the order does not cover walk the invariant one-column geometry
    q8 = matvec_plan(SUB, 9, "Q8_0", k=4096)
    assert isinstance(q8, MatVecPlan) and q8 == matvec_plan(ReductionOrder.BATCH_INVARIANT, 9, "Q8_0")
    with pytest.raises(PlanError, match="row length"):
        matvec_plan(SUB, 1, "Q4_K")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_backend_columns_equal_single_columns(qtype):
    be = get_backend("cpu")
    w = random_blocks(qtype, 37, 1024, seed=3)  # 37 rows: not a multiple of the 16-row tile
    x = np.random.default_rng(4).standard_normal((16, 1024)).astype(np.float32)
    alone = np.concatenate([be.mul_mat(w, qtype, x[i:i + 1], SUB) for i in range(16)])
    for width in (2, 3, 9, 16):
        got = be.mul_mat(w, qtype, x[:width], SUB)
        np.testing.assert_array_equal(got.view(np.uint32), alone[:width].view(np.uint32), err_msg=f"width {width}")


def test_model_batches_equal_one_token_passes(micro_model_path):
    from hiraishin import Qwen3

    model = Qwen3.from_gguf(micro_model_path, device="cpu", progress=False)
    tokens = [5, 17, 300, 42, 9, 1000, 7]
    single = np.concatenate([model.forward([t], i, SUB) for i, t in enumerate(tokens)])
    model.reset()
    batched = np.concatenate([model.forward(tokens[:3], 0, SUB), model.forward(tokens[3:], 3, SUB)])
    np.testing.assert_array_equal(batched.view(np.uint32), single.view(np.uint32))
    model.reset()
    other = np.concatenate([model.forward([t], i, ReductionOrder.BATCH_INVARIANT) for i, t in enumerate(tokens)])
    assert not np.array_equal(other, single)  # its own order: other bits than the invariant preset


def test_mma_warps_override_changes_only_the_warps_of_one_tile_launches(monkeypatch):
    """HIRAISHIN_SUBBLOCK_MMA_NWARPS (an A/B switch, read at import) sets the warps of mma launches of up
    to 8 columns, over the tuning table's entry; the order (nseg) does not move; a bad value is an error
    naming it."""
    from hiraishin.errors import PlanError
    from hiraishin.plans import subblock

    base = {w: subblock.subblock_plan(w, "Q4_K", 4096, n=4096) for w in (1, 3, 9)}
    assert (base[3].nwarps, base[3].max_regs) == (16, 64)  # SUBBLOCK_FEW_COLS_TUNING's entry
    monkeypatch.setattr(subblock, "SUBBLOCK_MMA_FEW_COLS_NWARPS", "8")
    got = {w: subblock.subblock_plan(w, "Q4_K", 4096, n=4096) for w in (1, 3, 9)}
    assert got[3].nwarps == 8 and got[3].nseg == base[3].nseg and got[3].kernel == "mma"
    assert got[3].max_regs is None and got[3].prefetch_x is None  # the switch wins over the whole entry
    assert got[1] == base[1] and got[9] == base[9]  # one column, two n-tiles: the table
    assert subblock.subblock_plan(3, "Q4_K", 1024).nwarps == 4  # never more warps than segments
    for bad in ("17", "x", "-1"):
        monkeypatch.setattr(subblock, "SUBBLOCK_MMA_FEW_COLS_NWARPS", bad)
        with pytest.raises(PlanError, match="HIRAISHIN_SUBBLOCK_MMA_NWARPS"):
            subblock.subblock_plan(3, "Q4_K", 4096)
