"""Flash attention on the CPU backend (the Numba emulator of fattn_vec / fattn_tile / fattn_combine).

Accuracy against a float64 softmax reference, and the batch (in)variance properties the orders
promise. Bit-exactness claims compare ``.view(np.uint32)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.devices import DeviceProfile
from hiraishin.errors import BackendError, PlanError
from hiraishin.backends import get_backend
from hiraishin.kernels.attention.emulate import KQ_MAX_OFFSET, attention_scale
from hiraishin.order import ReductionOrder
from hiraishin.plans import AttentionPlan, attention_plan
from hiraishin.plans.attention import KERNEL_Q1, KERNEL_QN, KERNEL_TILE

from fattn_inputs import bits, make_inputs

# A small made-up GPU on which the efficiency loop gives P < number of chunks (3 SMs, 1 block/SM):
# 4 heads over 512 cells -> P = 3, so chunk 3 joins block 0. Keeps the invariance tests stringent.
TINY_GPU = DeviceProfile(name="tiny-test-gpu", compute_capability=900, sm_count=3,
                         occupancy={KERNEL_Q1: 1, KERNEL_QN: 1, KERNEL_TILE: 1})
# 5 SMs: 4 heads get P = 1 for 512 attended cells but P = 5 for 768.
FIVE_SM_GPU = DeviceProfile(name="five-sm-test-gpu", compute_capability=900, sm_count=5,
                            occupancy={KERNEL_Q1: 1, KERNEL_QN: 1, KERNEL_TILE: 1})

ORDERS = [ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT]


def attention(q, k, v, q_pos, kv_len, order, backend, device=None):
    return get_backend(backend, device).attention(q, k, v, q_pos, kv_len, order)


def flash_attn(q, k, v, q_pos, plan, backend):
    return get_backend(backend).flash_attn(q, k, v, q_pos, plan)


def reference(q, k, v, q_pos):
    """float64 causal softmax attention over the f16 cache values."""
    T, H, D = q.shape
    ratio = H // k.shape[1]
    scale = 1.0 / np.sqrt(D)
    out = np.empty((T, H, D))
    for t in range(T):
        for h in range(H):
            kk = k[: q_pos[t] + 1, h // ratio].astype(np.float64)
            vv = v[: q_pos[t] + 1, h // ratio].astype(np.float64)
            s = kk @ (q[t, h].astype(np.float64) * scale)
            p = np.exp(s - s.max())
            out[t, h] = p @ vv / p.sum()
    return out


# Emulator error vs float64: float32 dots of 128 terms and softmax sums over a few hundred cells give
# ~1e-7 on outputs of order 1; the tile kernel's exp flush (< e^-20) adds at most ~2e-9 relative.
TOL = 2e-6


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
@pytest.mark.parametrize("n_head,n_head_kv", [(4, 4), (4, 2), (8, 2), (6, 1)])
@pytest.mark.parametrize("T,kv_len", [(1, 1), (1, 300), (3, 129), (16, 520)])
def test_emulator_matches_float64_reference(order, n_head, n_head_kv, T, kv_len):
    q, k, v = make_inputs(seed=T * 1000 + kv_len + n_head, n_ctx=kv_len + 7, n_head=n_head,
                          n_head_kv=n_head_kv, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    out = attention(q, k, v, q_pos, kv_len, order, "cpu")
    assert out.dtype == np.float32 and out.shape == q.shape
    err = np.abs(out - reference(q, k, v, q_pos)).max()
    assert err < TOL, f"{order.name}: max abs error {err:.3g}"


@pytest.mark.parametrize("plan", [
    AttentionPlan("vec", 1, 3, head_dim=64, kv_attended=384),
    AttentionPlan("vec", 2, 2, chunk_cells=256, split_cells=256, kv_attended=512, head_dim=64),
    AttentionPlan("tile", 8, 3, chunk_cells=64, split_cells=192, kv_attended=512, head_dim=64),
], ids=["vec-P3", "vec-fixed256", "tile-split192"])
def test_head_dim_64(plan):
    kv_len = 333
    plan = AttentionPlan(**{**plan.__dict__, "kv_len": kv_len})
    q, k, v = make_inputs(seed=64, n_ctx=400, n_head=4, n_head_kv=2, head_dim=64, n_q=5)
    q_pos = np.array([0, 100, 200, 331, 332], dtype=np.int32)
    out = flash_attn(q, k, v, q_pos, plan, "cpu")
    assert np.abs(out - reference(q, k, v, q_pos)).max() < TOL


def test_rows_are_independent_of_the_other_rows():
    """A (query, head) row depends only on its own inputs: permuting queries permutes outputs bitwise."""
    q, k, v = make_inputs(seed=5, n_ctx=512, n_head=4, n_head_kv=2, n_q=6)
    q_pos = np.array([511, 20, 300, 384, 255, 256], dtype=np.int32)
    for order in ORDERS:
        plan = attention_plan(order, 6, 512, 4, 2)
        out = flash_attn(q, k, v, q_pos, plan, "cpu")
        perm = np.array([3, 0, 5, 1, 4, 2])
        out_p = flash_attn(q[perm], k, v, q_pos[perm], plan, "cpu")
        assert np.array_equal(bits(out[perm]), bits(out_p)), order.name


# ------------------------------------------------------------------------------------ invariance

def alone(order, q, k, v, positions, device):
    """Each position computed by itself: one query, kv_len = position + 1 (plain decoding)."""
    return np.stack([
        attention(q[p:p + 1], k, v, np.array([p], np.int32), p + 1, order, "cpu", device)[0]
        for p in positions
    ])


def batched(order, q, k, v, start, sizes, device, guard=True):
    """Positions from ``start`` in consecutive batches of the given sizes (verify passes)."""
    outs, pos = [], start
    for size in sizes:
        n = order.verify_limit(pos, size) if guard else size
        q_pos = np.arange(pos, pos + n, dtype=np.int32)
        outs.append(attention(q[pos:pos + n], k, v, q_pos, pos + n, order, "cpu", device))
        pos += n
    return np.concatenate(outs), pos


@pytest.mark.parametrize("device", [TINY_GPU, "h200"], ids=["tiny-gpu", "h200"])
def test_invariant_order_bit_exact_across_batches_and_boundaries(device):
    order = ReductionOrder.BATCH_INVARIANT
    q, k, v = make_inputs(seed=11, n_ctx=700, n_head=4, n_head_kv=2)
    start = 236  # the run crosses 256, 384 and 512
    rng = np.random.default_rng(3)
    sizes = list(range(1, 17)) + list(rng.integers(1, 17, size=40))
    got, end = batched(order, q, k, v, start, sizes, device)
    assert end > 560
    want = alone(order, q, k, v, range(start, end), device)
    assert np.array_equal(bits(got), bits(want))


def test_invariant_every_batch_size_and_end_within_a_256_block():
    """Position p alone == p inside any batch of b <= 16 queries ending at e, same 256-cell block."""
    order = ReductionOrder.BATCH_INVARIANT
    q, k, v = make_inputs(seed=12, n_ctx=520, n_head=4, n_head_kv=2)
    want = {}
    for b in range(1, 17):
        for end in (383 + b % 3, 511 - b % 5, 270 + b):  # last position of the batch
            first = end - b + 1
            assert first // 256 == end // 256
            q_pos = np.arange(first, end + 1, dtype=np.int32)
            got = attention(q[first:end + 1], k, v, q_pos, end + 1, order, "cpu", TINY_GPU)
            for i, p in enumerate(q_pos):
                if p not in want:
                    want[p] = alone(order, q, k, v, [p], TINY_GPU)[0]
                assert np.array_equal(bits(got[i]), bits(want[p])), (b, end, p)


def test_invariant_needs_the_verify_guard():
    """Without stopping at 256-cell boundaries, a batch straddling one changes P for its early queries."""
    order = ReductionOrder.BATCH_INVARIANT
    q, k, v = make_inputs(seed=13, n_ctx=800, n_head=4, n_head_kv=2)
    # positions 500..519 in one batch: kv_len 520 -> 768 attended cells, P = 5;
    # alone, positions below 512 attend 512 cells with P = 1
    assert attention_plan(order, 20, 520, 4, 2, device=FIVE_SM_GPU).parallel_blocks == 5
    assert attention_plan(order, 1, 501, 4, 2, device=FIVE_SM_GPU).parallel_blocks == 1
    q_pos = np.arange(500, 520, dtype=np.int32)
    got = attention(q[500:520], k, v, q_pos, 520, order, "cpu", FIVE_SM_GPU)
    want = alone(order, q, k, v, range(500, 520), FIVE_SM_GPU)
    early = q_pos < 512
    assert not np.array_equal(bits(got[early]), bits(want[early]))
    assert np.array_equal(bits(got[~early]), bits(want[~early]))


def test_fixed_split_invariant_across_batches_and_kv_lengths():
    order = ReductionOrder.FIXED_SPLIT
    q, k, v = make_inputs(seed=14, n_ctx=700, n_head=4, n_head_kv=1)
    rng = np.random.default_rng(4)
    sizes = list(range(16, 0, -1)) + list(rng.integers(1, 17, size=20))
    # no verify guard needed: batches may straddle 256 and 512
    got, end = batched(order, q, k, v, 230, sizes, TINY_GPU, guard=False)
    want = alone(order, q, k, v, range(230, end), TINY_GPU)
    assert np.array_equal(bits(got), bits(want))
    # and a query's bits do not depend on how many cells are filled after it
    p = 300
    late = attention(q[p:p + 1], k, v, np.array([p], np.int32), 690, order, "cpu")
    assert np.array_equal(bits(late[0]), bits(want[p - 230]))


def test_variant_order_is_batch_dependent():
    """Stock policy: one query takes the vec kernel, several the tile kernel -> different bits."""
    order = ReductionOrder.BATCH_VARIANT
    q, k, v = make_inputs(seed=15, n_ctx=400, n_head=4, n_head_kv=2)
    got, end = batched(order, q, k, v, 300, [4] * 10, "h200")
    want = alone(order, q, k, v, range(300, end), "h200")
    differing = np.mean(np.any(bits(got) != bits(want), axis=(1, 2)))
    assert differing > 0.5
    assert np.abs(got - want).max() < 1e-5  # same maths, different rounding


def test_position_384_effect_p4_vs_p3():
    """512 cells = 4 chunks. P=4: one chunk per block. P=3: chunk 3 joins block 0.

    A query below 384 has no real cell in chunk 3: block 0 runs an all-masked chunk, which leaves its
    max, sum and accumulators bit-identical, and the empty block of P=4 adds exact zeros in the
    combine. From position 384 on, chunk 3 holds real cells and the in-block merge order differs.
    """
    n = 512
    q, k, v = make_inputs(seed=16, n_ctx=n, n_head=2, n_head_kv=1)
    q_pos = np.arange(n, dtype=np.int32)
    p4 = AttentionPlan("vec", 1, 4, kv_attended=n, kv_len=n)
    p3 = AttentionPlan("vec", 1, 3, kv_attended=n, kv_len=n)
    assert p3.chunks_of_block(0) == [(0, 128), (384, 512)]
    a = flash_attn(q, k, v, q_pos, p4, "cpu")
    b = flash_attn(q, k, v, q_pos, p3, "cpu")
    same = np.all(bits(a) == bits(b), axis=(1, 2))
    assert same[:384].all()
    assert not same[384:].all()
    assert (~same[384:]).mean() > 0.5


@settings(max_examples=30, deadline=None, derandomize=True)
@given(kv_len=st.integers(1, 700), T=st.integers(1, 3), P=st.integers(2, 7), chunk=st.sampled_from([128, 256]),
       fixed=st.booleans(), qpb=st.sampled_from([1, 2]))
def test_launched_plan_drops_the_blocks_past_the_cache_same_bits(kv_len, T, P, chunk, fixed, qpb):
    """AttentionPlan.launched: the parallel blocks that sum no filled cell are dropped (down to one, the
    in-kernel normalisation instead of the combine), bit for bit the full plan's output."""
    T = min(T, kv_len)
    kv_attended = -(-kv_len // chunk) * chunk + chunk * (P % 2)  # sometimes one wholly empty chunk more
    plan = AttentionPlan("vec", qpb, P, chunk_cells=chunk, kv_attended=kv_attended, kv_len=kv_len,
                         split_cells=chunk if fixed else None)
    launched = plan.launched()
    assert launched.parallel_blocks == min(P, -(-kv_len // chunk)) == plan.filled_blocks
    assert (launched is plan) == (launched.parallel_blocks == P)
    assert launched.launched() is launched
    q, k, v = make_inputs(seed=kv_len, n_ctx=kv_len, n_head=2, n_head_kv=1, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    want = flash_attn(q, k, v, q_pos, plan, "cpu")
    got = flash_attn(q, k, v, q_pos, launched, "cpu")
    assert np.array_equal(bits(got), bits(want))


def test_backend_launches_the_trimmed_plan(monkeypatch):
    """The backends plan with AttentionPlan.launched (BATCH_INVARIANT's P = 2 at 33 cells becomes one
    block, no combine), unless HIRAISHIN_ATTN_TRIM=0; the output is the order's plan's either way."""
    from hiraishin.backends import base

    be = get_backend("cpu")
    order = ReductionOrder.BATCH_INVARIANT
    full = attention_plan(order, 1, 33, 4, 2)
    assert full.parallel_blocks >= 2 and be.attention_plan(order, 1, 33, 4, 2, 128).parallel_blocks == 1
    q, k, v = make_inputs(seed=19, n_ctx=33, n_head=4, n_head_kv=2, n_q=1)
    q_pos = np.array([32], np.int32)
    trimmed = attention(q, k, v, q_pos, 33, order, "cpu")
    monkeypatch.setattr(base, "ATTN_TRIM", False)
    assert be.attention_plan(order, 1, 33, 4, 2, 128) == full
    assert np.array_equal(bits(trimmed), bits(attention(q, k, v, q_pos, 33, order, "cpu")))
    assert np.array_equal(bits(trimmed), bits(flash_attn(q, k, v, q_pos, full, "cpu")))


def test_custom_parallel_blocks_changes_bits_not_values():
    q, k, v = make_inputs(seed=17, n_ctx=1024, n_head=2, n_head_kv=2, n_q=1)
    q_pos = np.array([1000], np.int32)
    outs = [attention(q, k, v, q_pos, 1001, ReductionOrder.custom(parallel_blocks=p), "cpu")
            for p in (1, 2, 3, 5, 8)]
    ref = reference(q, k, v, q_pos)
    for o in outs:
        assert np.abs(o - ref).max() < TOL
    assert len({bits(o).tobytes() for o in outs}) > 1


# ----------------------------------------------------------------------------- stages & plumbing

def test_partials_then_combine_equals_flash_attn():
    q, k, v = make_inputs(seed=18, n_ctx=600, n_head=4, n_head_kv=2, n_q=3)
    q_pos = np.array([100, 400, 599], np.int32)
    for plan in (AttentionPlan("vec", 1, 3, kv_attended=768, kv_len=600),
                 AttentionPlan("tile", 8, 4, chunk_cells=64, split_cells=192, kv_attended=768, kv_len=600)):
        parts, meta = get_backend("cpu").attention_partials(q, k, v, q_pos, plan)
        assert parts.shape == (3, 4, plan.parallel_blocks, 128) and meta.shape == (3, 4, plan.parallel_blocks, 2)
        out = get_backend("cpu").attention_combine(parts, meta)
        assert np.array_equal(bits(out), bits(flash_attn(q, k, v, q_pos, plan, "cpu")))


def test_attention_scale_is_llama_cpp_host_value():
    assert attention_scale(128).view(np.uint32) == 0x3DB504F3
    assert float(KQ_MAX_OFFSET) == 2.0792999267578125


@pytest.mark.parametrize("bad,match", [
    (dict(q=np.zeros((2, 4, 128), np.float64)), "q must be float32"),
    (dict(k=np.zeros((64, 2, 128), np.float32)), "k_cache must be float16"),
    (dict(q=np.zeros((2, 4, 96), np.float32)), "head.dim"),
    (dict(q=np.zeros((2, 3, 128), np.float32)), "multiple of n_head_kv"),
    (dict(q_pos=np.array([0, 64], np.int32)), "q_pos must lie in"),
    (dict(q_pos=np.array([0], np.int32)), r"shape \(2,\)"),
    (dict(kv_len=65), "kv_len must be in"),
    (dict(backend="metal"), "unknown backend"),
])
def test_bad_inputs_name_the_problem(bad, match):
    args = dict(q=np.zeros((2, 4, 128), np.float32), k=np.zeros((64, 2, 128), np.float16),
                v=np.zeros((64, 2, 128), np.float16), q_pos=np.array([0, 1], np.int32), kv_len=64,
                backend="cpu")
    args.update(bad)
    with pytest.raises((PlanError, BackendError), match=match):
        attention(args["q"], args["k"], args["v"], args["q_pos"], args["kv_len"],
                  ReductionOrder.BATCH_INVARIANT, args["backend"])


def test_plan_must_match_inputs():
    q, k, v = make_inputs(seed=19, n_ctx=300, n_head=4, n_head_kv=2, n_q=2)
    plan = attention_plan(ReductionOrder.BATCH_INVARIANT, 3, 300, 4, 2)
    with pytest.raises(PlanError, match="n_queries"):
        flash_attn(q, k, v, np.array([1, 2], np.int32), plan, "cpu")
    with pytest.raises(PlanError, match="no partials"):
        get_backend("cpu").attention_partials(q, k, v, np.array([1, 2], np.int32),
                                              AttentionPlan("vec", 1, 1, kv_attended=256, kv_len=200))
