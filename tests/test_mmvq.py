"""Mat-vec plans and the CPU emulator: accuracy, batch (in)variance, custom geometry, errors.

Tolerances (stated once):
* vs a float64 product of the dequantized weights and the dequantized q8_1
  activations: |emu - ref| <= RTOL_F64 * sum|w_i x_i| (float32 accumulation
  error; observed <= 2.4e-8 for K up to 12288).
* vs the unquantized activations: additionally the q8_1 rounding,
  |f(h(d)) q - x| <= 0.57 * amax / 127 per value (see test_quantize_q8_1).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from hiraishin.devices import DeviceProfile
from hiraishin.errors import BackendError, PlanError, QuantError
from hiraishin.backends import get_backend
from hiraishin.kernels import mmvq, tiled
from hiraishin.order import ReductionOrder
from hiraishin.plans import MatVecPlan, matvec_plan
from hiraishin.plans.matvec import LONG_ROW_ROWS, SHORT_ROW_ROWS
from hiraishin.quant import dequantize
from hiraishin.quant import random_blocks as random_weights

RTOL_F64 = 2e-7
QTYPES = ["Q4_K", "Q6_K", "Q8_0"]
_GGML = {"Q4_K": gguf.GGMLQuantizationType.Q4_K, "Q6_K": gguf.GGMLQuantizationType.Q6_K,
         "Q8_0": gguf.GGMLQuantizationType.Q8_0}
CPU = get_backend("cpu")
VARIANT = ReductionOrder.BATCH_VARIANT
INVARIANT = ReductionOrder.BATCH_INVARIANT


def _dequant(w: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(w, _GGML[qtype]).astype(np.float64).reshape(w.shape[0], -1)


def dequantize_q8_1(xq: np.ndarray) -> np.ndarray:
    return dequantize(xq, "Q8_1").astype(np.float64)


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    return CPU.quantize_q8_1(x)


def mul_mat(w, qtype, x, order, backend="cpu"):
    return get_backend(backend).mul_mat(w, qtype, x, order)


def mul_mat_vec(w, qtype, xq, plan, backend="cpu"):
    return get_backend(backend).mul_mat_q8_1(w, qtype, xq, plan)


def emulate_mmvq(w, qtype, xq, nwarps):
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=1, cols_per_launch=1, ncols=xq.shape[0])
    return mmvq.emulate(w, qtype, xq, plan)


def _activations(seed: int, ncols: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((ncols, k)) * rng.uniform(0.1, 4.0, size=(ncols, 1))).astype(np.float32)


def _check_f64(out, w, qtype, xq):
    wf = _dequant(w, qtype)
    xd = dequantize_q8_1(xq)
    ref = xd @ wf.T
    mag = np.abs(xd) @ np.abs(wf).T
    err = np.abs(out.astype(np.float64) - ref)
    assert (err <= RTOL_F64 * mag).all(), f"max err/mag {float((err / mag).max()):.3g}"
    return wf


# --------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("order", [VARIANT, INVARIANT], ids=["variant", "invariant"])
def test_mul_mat_close_to_float64(qtype, order):
    seed = QTYPES.index(qtype)
    n, k = 37, 2048  # an odd row count
    w = random_weights(qtype, n, k, seed=seed)
    for ncols in (1, 5, 11):  # 11 columns: the tiled kernel (Q8_0) under the variant order
        if order is VARIANT and ncols > 8 and qtype != "Q8_0":
            continue  # llama.cpp's MMQ order (fp16 scale products): its own test, tests/test_mmq_stock.py
        x = _activations(seed + ncols, ncols, k)
        out = mul_mat(w, qtype, x, order, "cpu")
        assert out.shape == (ncols, n) and out.dtype == np.float32
        xq = quantize_q8_1(x)
        wf = _check_f64(out, w, qtype, xq)
        # against the unquantized activations
        amax = np.abs(x.reshape(ncols, -1, 32)).max(-1).astype(np.float64)
        q_bound = (0.57 * amax / 127.0) @ np.abs(wf).reshape(n, -1, 32).sum(-1).T
        exact = x.astype(np.float64) @ wf.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(wf).T
        assert (np.abs(out - exact) <= q_bound + RTOL_F64 * mag).all()


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("nwarps", [1, 2, 3, 4, 8])
def test_custom_nwarps_close_to_float64(qtype, nwarps):
    n, k = 19, 1536 if qtype != "Q8_0" else 1504  # Q8_0: K not a multiple of 256
    w = random_weights(qtype, n, k, seed=10 + nwarps)
    x = _activations(20 + nwarps, 3, k)
    order = ReductionOrder.custom(nwarps=nwarps)
    out = mul_mat(w, qtype, x, order, "cpu")
    _check_f64(out, w, qtype, quantize_q8_1(x))


@pytest.mark.parametrize("qtype", QTYPES)
def test_tiled_close_to_float64(qtype):
    n, k = 21, 2048
    w = random_weights(qtype, n, k, seed=30)
    xq = quantize_q8_1(_activations(31, 4, k))
    out = tiled.emulate(w, qtype, xq)
    _check_f64(out, w, qtype, xq)


# --------------------------------------------------------------------------- batch (in)variance


@pytest.mark.parametrize("qtype", QTYPES)
def test_batch_invariant_columns_equal_single_column(qtype):
    n, k = 24, 4096
    w = random_weights(qtype, n, k, seed=40)
    x = _activations(41, 16, k)
    alone = np.stack([mul_mat(w, qtype, x[j:j + 1], INVARIANT, "cpu")[0] for j in range(16)])
    for b in range(1, 17):
        batch = mul_mat(w, qtype, x[:b], INVARIANT, "cpu")
        np.testing.assert_array_equal(batch.view(np.uint32), alone[:b].view(np.uint32), err_msg=f"b={b}")


@pytest.mark.parametrize("qtype", QTYPES)
def test_batch_variant_reproduces_the_bug(qtype):
    """Stock geometry: batches of 1-4 agree bit for bit, 5-8 (2 warps) and 9+ (tiled) do not."""
    n, k = 64, 4096 if qtype != "Q6_K" else 12288  # Qwen3-8B hidden / ffn widths
    w = random_weights(qtype, n, k, seed=50)
    x = _activations(51, 16, k)
    alone = mul_mat(w, qtype, x[:1], VARIANT, "cpu")[0]
    differs = {}
    for b in range(2, 17):
        first = mul_mat(w, qtype, x[:b], VARIANT, "cpu")[0]
        differs[b] = not np.array_equal(first.view(np.uint32), alone.view(np.uint32))
    assert not any(differs[b] for b in (2, 3, 4)), differs
    assert all(differs[b] for b in range(5, 17)), differs


def test_results_depend_only_on_nwarps():
    """Rows per block and columns per launch change which outputs share a CUDA block, not bits."""
    qtype, n, k = "Q4_K", 16, 2048
    w = random_weights(qtype, n, k, seed=60)
    xq = quantize_q8_1(_activations(61, 6, k))
    base = emulate_mmvq(w, qtype, xq, 3)
    for rows, cols in ((1, 1), (4, 2), (2, 6)):
        plan = MatVecPlan("mmvq", qtype, nwarps=3, rows_per_block=rows, cols_per_launch=cols, ncols=6)
        np.testing.assert_array_equal(mul_mat_vec(w, qtype, xq, plan, "cpu").view(np.uint32),
                                      base.view(np.uint32))
    other = emulate_mmvq(w, qtype, xq, 4)
    assert not np.array_equal(other.view(np.uint32), base.view(np.uint32))


# --------------------------------------------------------------------------- plans


def test_variant_plans_follow_the_generic_table():
    for ncols, nwarps, rows in [(1, 4, 2), (2, 4, 2), (4, 4, 2), (5, 2, 2), (8, 2, 2)]:
        p = matvec_plan(VARIANT, ncols, "Q4_K")
        assert (p.kernel, p.nwarps, p.rows_per_block, p.cols_per_launch) == ("mmvq", nwarps, rows, ncols)
    p = matvec_plan(VARIANT, 9, "Q6_K")  # past 8 columns: llama.cpp's MMQ order (tests/test_mmq_stock.py)
    assert p.kernel == "mmq_stock" and p.launches() == [(0, 9)]
    p = matvec_plan(VARIANT, 9, "Q8_0")
    assert p.kernel == "tiled" and p.launches() == [(0, 9)]


def test_invariant_plans_split_wide_batches():
    p = matvec_plan(INVARIANT, 9, "Q4_K")
    assert (p.kernel, p.nwarps, p.cols_per_launch) == ("mmvq", 4, 5)
    assert p.launches() == [(0, 5), (5, 4)]
    assert matvec_plan(INVARIANT, 16, "Q8_0").launches() == [(0, 8), (8, 8)]
    assert matvec_plan(INVARIANT, 17, "Q8_0").launches() == [(0, 6), (6, 6), (12, 5)]
    assert matvec_plan(INVARIANT, 1, "Q6_K").rows_per_block == 1
    assert matvec_plan(INVARIANT, 1, "Q4_K").rows_per_block == 2  # faster on the H200, same bits
    # one column is one launch under every policy: the variant takes the same (bit-neutral) rows per
    # block, not llama.cpp's 1
    for q, k in (("Q4_K", None), ("Q4_K", 1024), ("Q4_K", 2048), ("Q4_K", 4096), ("Q4_K", 12288),
                 ("Q6_K", None), ("Q6_K", 1024), ("Q6_K", 4096), ("Q6_K", 12288), ("Q8_0", 4096)):
        assert matvec_plan(VARIANT, 1, q, k=k) == matvec_plan(INVARIANT, 1, q, k=k), (q, k)
    # short rows (the row length given): llama.cpp's small_k puts nwarps rows in a block (Q4_K K=1024:
    # 4 super-blocks < 8 per kbx step); one block per thread (Q6_K K=1024: 4 super-blocks, 4 per step),
    # which llama.cpp leaves at one row, gets SHORT_ROW_ROWS
    assert matvec_plan(VARIANT, 1, "Q4_K", k=1024).rows_per_block == 4
    assert matvec_plan(VARIANT, 1, "Q6_K", k=1024).rows_per_block == SHORT_ROW_ROWS
    assert matvec_plan(VARIANT, 2, "Q4_K", k=1024).rows_per_block == 2  # small_k is one column only
    assert matvec_plan(INVARIANT, 1, "Q4_K", k=1024).rows_per_block == 4
    assert matvec_plan(INVARIANT, 1, "Q6_K", k=1024).rows_per_block == SHORT_ROW_ROWS
    assert matvec_plan(INVARIANT, 1, "Q4_K", k=2048).rows_per_block == SHORT_ROW_ROWS  # 8 blocks, 8 per step
    # long rows (K >= LONG_ROW_K: the 8B's), measured faster with more rows per block (same bits)
    assert matvec_plan(INVARIANT, 1, "Q4_K", k=4096).rows_per_block == LONG_ROW_ROWS["Q4_K"] == 4
    assert matvec_plan(INVARIANT, 1, "Q6_K", k=12288).rows_per_block == LONG_ROW_ROWS["Q6_K"] == 2
    assert matvec_plan(INVARIANT, 1, "Q4_K", k=3072).rows_per_block == 2  # the 0.6B's ffn_down: as before
    assert matvec_plan(INVARIANT, 1, "Q6_K", k=3072).rows_per_block == 1
    assert matvec_plan(INVARIANT, 3, "Q4_K", k=1024).rows_per_block == 2
    assert {matvec_plan(INVARIANT, b, "Q6_K").nwarps for b in range(1, 40)} == {4}


def test_device_tables():
    turing = DeviceProfile(name="t4", compute_capability=750, sm_count=40, mmvq_table="TURING")
    assert matvec_plan(VARIANT, 1, "Q6_K", turing).nwarps == 2
    assert matvec_plan(VARIANT, 1, "Q8_0", turing).nwarps == 4
    assert matvec_plan(VARIANT, 6, "Q4_K", turing).nwarps == 2
    assert matvec_plan(INVARIANT, 7, "Q4_K", turing).nwarps == 2
    gcn = DeviceProfile(name="mi50", compute_capability=0, sm_count=60, mmvq_table="GCN")
    assert [matvec_plan(VARIANT, c, "Q4_K", gcn).nwarps for c in (1, 4, 5, 8)] == [2, 2, 1, 1]
    with pytest.raises(PlanError, match="RDNA9"):
        matvec_plan(VARIANT, 1, "Q4_K", DeviceProfile(name="x", compute_capability=0, sm_count=1,
                                                       mmvq_table="RDNA9"))


def test_custom_plans():
    p = matvec_plan(ReductionOrder.custom(nwarps=3), 1, "Q4_K")
    # rows per CUDA block (no bit changes) as the invariant policy picks them for that nwarps
    assert (p.nwarps, p.rows_per_block, p.blocks_per_iter) == (3, 2, 6)
    assert matvec_plan(ReductionOrder.custom(nwarps=2), 1, "Q4_K", k=1024).rows_per_block == SHORT_ROW_ROWS
    assert matvec_plan(ReductionOrder.custom(nwarps=4), 1, "Q4_K", k=1024).rows_per_block == 4  # small_k
    assert matvec_plan(ReductionOrder.custom(nwarps=1), 2, "Q4_K").rows_per_block == 2
    p = matvec_plan(ReductionOrder.custom(rows_per_block=8, nwarps=1), 16, "Q6_K")
    assert p.rows_per_block == 8 and p.cols_per_launch == 4 and len(p.launches()) == 4
    with pytest.raises(PlanError, match="nwarps"):
        matvec_plan(ReductionOrder.custom(nwarps=17), 1, "Q4_K")
    with pytest.raises(PlanError, match="rows_per_block"):
        matvec_plan(ReductionOrder.custom(rows_per_block=9), 1, "Q4_K")


@pytest.mark.parametrize("kwargs, match", [
    (dict(kernel="mmvq", qtype="Q5_K", nwarps=4, rows_per_block=1, cols_per_launch=1, ncols=1), "Q5_K"),
    (dict(kernel="mmvq", qtype="Q4_K", nwarps=0, rows_per_block=1, cols_per_launch=1, ncols=1), "nwarps"),
    (dict(kernel="mmvq", qtype="Q4_K", nwarps=4, rows_per_block=1, cols_per_launch=2, ncols=1), "cols_per_launch"),
    (dict(kernel="mmvq", qtype="Q4_K", nwarps=4, rows_per_block=4, cols_per_launch=16, ncols=16), "accumulators"),
    (dict(kernel="mmvq", qtype="Q4_K", nwarps=16, rows_per_block=2, cols_per_launch=16, ncols=16), "shared"),
    (dict(kernel="tiled", qtype="Q4_K", nwarps=2, rows_per_block=32, cols_per_launch=9, ncols=9), "tile"),
    (dict(kernel="gemm", qtype="Q4_K", nwarps=4, rows_per_block=1, cols_per_launch=1, ncols=1), "kernel"),
    (dict(kernel="mmvq", qtype="Q4_K", nwarps=4, rows_per_block=1, cols_per_launch=1, ncols=0), "ncols"),
])
def test_impossible_geometry_raises(kwargs, match):
    with pytest.raises(PlanError, match=match):
        MatVecPlan(**kwargs)


def test_thread_blocks_and_describe():
    p = matvec_plan(VARIANT, 1, "Q4_K")
    tb = p.thread_blocks(20)
    assert len(tb) == 128
    assert tb[0] == [0, 8, 16] and tb[15] == [0, 8, 16] and tb[16] == [1, 9, 17] and tb[127] == [7, 15]
    # every super-block is shared by exactly 16 threads
    counts = np.bincount([b for blocks in tb.values() for b in blocks], minlength=20)
    assert (counts == 16).all()
    text = p.describe()
    for phrase in ("Q4_K", "4 warps", "16 threads per super-block", "8 super-blocks per iteration",
                   "warps 1..3 in order", "32-lane xor butterfly", "0–1, 8–9, 16–17"):
        assert phrase in text, (phrase, text)

    q6 = matvec_plan(ReductionOrder.custom(nwarps=3), 2, "Q6_K")
    tb = q6.thread_blocks(7)
    assert tb[0] == [0, 3, 6] and tb[32] == [1, 4] and tb[95] == [2, 5]
    assert "3 warps" in q6.describe() and "32 threads per super-block" in q6.describe()

    q8 = matvec_plan(ReductionOrder.custom(nwarps=1), 1, "Q8_0")
    assert q8.thread_blocks(10)[5] == [1, 9] and "no shared-memory hand-over" in q8.describe()

    inv = matvec_plan(INVARIANT, 9, "Q4_K")
    assert "2 launches of 5+4" in inv.describe()
    tiled_plan = matvec_plan(VARIANT, 12, "Q8_0")  # (Q4_K/Q6_K: llama.cpp's MMQ order, tests/test_mmq_stock.py)
    assert tiled_plan.thread_blocks(3) == {0: [0, 1, 2]}
    assert "one thread per output" in tiled_plan.describe() and "tiled" in tiled_plan.describe()


# --------------------------------------------------------------------------- runner errors


def test_runner_validates_inputs():
    w = random_weights("Q4_K", 8, 512, seed=70)
    x = _activations(71, 2, 512)
    with pytest.raises(QuantError, match=r"Q4_K weight .*\(8, 287\)"):
        mul_mat(w[:, :287], "Q4_K", x, INVARIANT, "cpu")
    with pytest.raises(QuantError, match=r"\(2, 256\)"):
        mul_mat(w, "Q4_K", x[:, :256], INVARIANT, "cpu")
    with pytest.raises(QuantError, match="float32"):
        mul_mat(w, "Q4_K", x.astype(np.float64), INVARIANT, "cpu")
    with pytest.raises(QuantError, match="Q5_0"):
        mul_mat(w, "Q5_0", x, INVARIANT, "cpu")
    xq = quantize_q8_1(x)
    plan = matvec_plan(INVARIANT, 2, "Q4_K")
    with pytest.raises(QuantError, match=r"\(ncols, 576\)"):
        mul_mat_vec(w, "Q4_K", xq[:, :540], plan, "cpu")
    with pytest.raises(PlanError, match="3 columns"):
        mul_mat_vec(w, "Q4_K", xq, matvec_plan(INVARIANT, 3, "Q4_K"), "cpu")
    with pytest.raises(PlanError, match="Q6_K"):
        mul_mat_vec(w, "Q4_K", xq, matvec_plan(INVARIANT, 2, "Q6_K"), "cpu")
    with pytest.raises(BackendError, match="backend"):
        mul_mat_vec(w, "Q4_K", xq, plan, "metal")
    assert mul_mat(w, "Q4_K", x[:0], INVARIANT, "cpu").shape == (0, 8)


def test_random_weights_are_valid_blocks():
    for qtype in QTYPES:
        w = random_weights(qtype, 3, 512, seed=80)
        wf = _dequant(w, qtype)
        assert np.isfinite(wf).all() and 0.01 < np.abs(wf).max() < 10
    with pytest.raises(QuantError, match="multiple of 256"):
        random_weights("Q4_K", 2, 100)


def test_multi_weight_launch_arguments_follow_the_kernel_signature():
    """mmvq_multi(y, w0, dst0, nrows0, nblk0, w1, dst1, nrows1, nblk1, w2, dst2, nrows2): what the
    prepared launches pass (checked on the CPU with a recording kernel; missing weights repeat the last
    with 0 rows). norm_mmvq's launch passes the same weight arguments after its own."""
    import numpy as np

    from hiraishin.kernels.mmvq.launch import MultiMatVecLaunch, multi_weight_args
    from hiraishin.kernels.norm_mmvq.launch import NormMatVecLaunch

    calls = []

    class Kernel:
        def __call__(self, grid, block, args, shared_mem=0):
            calls.append(args)

    ns, nblk = (np.int32(11), np.int32(5)), (np.int32(3), np.int32(2))
    zero = np.int32(0)
    assert multi_weight_args(["w0", "w1"], ["o0", "o1"], ns, nblk) == [
        "w0", "o0", ns[0], nblk[0], "w1", "o1", ns[1], nblk[1], "w1", "o1", zero]
    multi = MultiMatVecLaunch.__new__(MultiMatVecLaunch)
    multi.kernel, multi.grid, multi.block, multi.shared = Kernel(), (5, 1, 1), (32, 4, 1), 0
    multi.ns, multi.nblk = ns, nblk
    assert multi(["w0", "w1"], "xq", ["o0", "o1"]) == ["o0", "o1"]
    assert calls[-1] == ("xq", "w0", "o0", ns[0], nblk[0], "w1", "o1", ns[1], nblk[1], "w1", "o1", zero)
    fused = NormMatVecLaunch.__new__(NormMatVecLaunch)
    fused.kernel, fused.grid, fused.block, fused.shared = Kernel(), (2, 1, 1), (32, 4, 4), 0
    fused.ns, fused.nblk, fused.scalars = ns[:1], nblk[:1], (np.int32(1024), np.float32(1e-6))
    fused("x", None, "nw", None, ["w0"], ["o0"])
    null = np.uint64(0)
    assert calls[-1] == ("x", null, "nw", null, np.int32(1024), np.float32(1e-6),
                         "w0", "o0", ns[0], nblk[0], "w0", "o0", zero, zero, "w0", "o0", zero)


def test_one_col_rows_override_names_bad_items():
    """HIRAISHIN_ONE_COL_ROWS (an A/B switch): a bad item names itself."""
    from hiraishin.plans import matvec as mv

    saved = (dict(mv.INVARIANT_ONE_COL_ROWS), dict(mv.LONG_ROW_ROWS), mv.SHORT_ROW_ROWS, mv.SMALL_K_ROWS,
             mv.MULTI_COL_ROWS, mv.WIDE_ROWS)
    head = (ReductionOrder.BATCH_INVARIANT, 1, "Q6_K")
    try:
        assert mv.matvec_plan(*head, k=1024, n=151936).rows_per_block == mv.SHORT_ROW_ROWS
        mv._rows_from_env("Q4_K=3, short=2,small=8,multi=8,wide=6")
        assert (mv.INVARIANT_ONE_COL_ROWS["Q4_K"], mv.LONG_ROW_ROWS["Q4_K"], mv.SHORT_ROW_ROWS, mv.SMALL_K_ROWS) == (
            3, 3, 2, 8)
        # wide: weights of WIDE_N+ rows (the output head) only, at one column
        assert [mv.matvec_plan(*head, k=1024, n=n).rows_per_block for n in (151936, 1024, None)] == [6, 2, 2]
        assert mv.matvec_plan(ReductionOrder.BATCH_INVARIANT, 2, "Q6_K", k=1024, n=151936).rows_per_block == 8
        # multi: capped at the accumulators a thread may hold (rows x columns <= MAX_ACCUMULATORS)
        assert [mv._default_rows_per_block(c) for c in (1, 2, 3, 5, 8)] == [1, 8, 8, 6, 4]
        for bad, match in (("Q4_K=9", "Q4_K=9"), ("Q5_K=2", "Q5_K"), ("short=x", "short=x")):
            with pytest.raises(PlanError, match=match):
                mv._rows_from_env(bad)
    finally:
        mv.INVARIANT_ONE_COL_ROWS.clear()
        mv.INVARIANT_ONE_COL_ROWS.update(saved[0])
        mv.LONG_ROW_ROWS.clear()
        mv.LONG_ROW_ROWS.update(saved[1])
        mv.SHORT_ROW_ROWS, mv.SMALL_K_ROWS, mv.MULTI_COL_ROWS, mv.WIDE_ROWS = saved[2:]
