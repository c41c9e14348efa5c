"""Attention plans: llama.cpp's parallel-blocks loop, the policies of each ReductionOrder, plan data."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.devices import DeviceProfile
from hiraishin.errors import PlanError
from hiraishin.order import ReductionOrder
from hiraishin.plans import AttentionPlan, attention_plan, parallel_blocks_for
from hiraishin.plans.attention import (KERNEL_Q1, KERNEL_QN, KERNEL_SHARED, KERNEL_TILE, SHARED_MIN_KV,
                                       SHARED_PICK, SHARED_QUERIES, shared_queries_for)

H200_LIKE = DeviceProfile(name="h200-like", compute_capability=900, sm_count=132,
                          occupancy={KERNEL_Q1: 3, KERNEL_QN: 2, KERNEL_TILE: 2})
AMPERE_LIKE = DeviceProfile(name="a100-like", compute_capability=800, sm_count=108,
                            occupancy={KERNEL_Q1: 3, KERNEL_QN: 2, KERNEL_TILE: 2})


# reference section 6.6: H200 (132 SMs, 3 blocks/SM), one token
@pytest.mark.parametrize("n_kv,p06b,p8b", [
    (256, 2, 2), (512, 4, 4), (768, 6, 6), (1024, 8, 8), (1280, 10, 10), (1536, 12, 12),
    (2048, 16, 12), (2560, 20, 12), (3072, 24, 12), (8192, 24, 12), (32768, 24, 12),
])
def test_parallel_blocks_table_of_the_reference(n_kv, p06b, p8b):
    assert parallel_blocks_for(n_kv // 128, 16, 3, 132) == p06b
    assert parallel_blocks_for(n_kv // 128, 32, 3, 132) == p8b


def test_parallel_blocks_for_rejects_nonsense():
    with pytest.raises(PlanError, match="positive"):
        parallel_blocks_for(0, 32, 3, 132)


@pytest.mark.parametrize("kv_len", [1, 255, 256, 257, 384, 511, 513, 2000, 9000])
def test_invariant_plan_ignores_the_query_count(kv_len):
    plans = {n: attention_plan(ReductionOrder.BATCH_INVARIANT, n, kv_len, 32, 8, device=H200_LIKE)
             for n in range(1, 17)}
    first = plans[1]
    assert first.kernel == "vec" and first.queries_per_block == 1 and not first.shared_kv
    assert first.kv_attended % 256 == 0 and first.kv_attended - 256 < kv_len <= first.kv_attended
    geometry = ("kernel", "parallel_blocks", "chunk_cells", "kv_attended", "split_cells")
    for n, plan in plans.items():
        # the order's geometry is the one-query plan's; only how queries share loads changes
        assert [getattr(plan, f) for f in geometry] == [getattr(first, f) for f in geometry]
        nq = shared_queries_for(n, kv_len)
        assert plan.kernel_name == (KERNEL_SHARED if nq else KERNEL_Q1)
        assert plan.queries_per_block == (nq or 1) and plan.shared_kv == bool(nq)


@pytest.mark.parametrize("order", [ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK,
                                   ReductionOrder.custom(parallel_blocks=3)],
                         ids=lambda o: o.name)
def test_exact_orders_share_kv_loads_in_multi_query_passes(order):
    for n in range(1, 17):
        for n_head, n_head_kv in ((32, 8), (16, 16), (64, 8), (12, 4)):
            plan = attention_plan(order, n, 1700, n_head, n_head_kv, device=H200_LIKE)
            alone = attention_plan(order, 1, 1700, n_head, n_head_kv, device=H200_LIKE)
            assert (plan.parallel_blocks, plan.chunk_cells, plan.kv_attended) == (
                alone.parallel_blocks, alone.chunk_cells, alone.kv_attended)
            assert plan.queries_per_block in ((1,) if not plan.shared_kv else SHARED_QUERIES)
    assert attention_plan(order, 16, 1700, 32, 8, device=H200_LIKE).shared_kv
    variant = attention_plan(ReductionOrder.BATCH_VARIANT, 4, 1700, 32, 8, device=H200_LIKE)
    assert variant.kernel == "tile" and not variant.shared_kv  # stock llama.cpp keeps its kernel


def test_shared_queries_per_block_as_measured():
    """The H200 measurement's rule: 4 queries a block from 2 queries and SHARED_MIN_KV filled cells on,
    whatever the heads or P; one query, or a short cache, keeps fattn_vec_q1."""
    assert SHARED_PICK in SHARED_QUERIES and SHARED_MIN_KV % 256 == 0
    assert [shared_queries_for(n, SHARED_MIN_KV) for n in (1, 2, 3, 9, 16)] == [0] + 4 * [SHARED_PICK]
    assert [shared_queries_for(n, SHARED_MIN_KV - 1) for n in (1, 2, 16)] == [0, 0, 0]
    plan = attention_plan(ReductionOrder.BATCH_INVARIANT, 9, 40000, 64, 8, device=H200_LIKE)
    assert plan.queries_per_block == SHARED_PICK and plan.shared_kv


def test_variant_plan_switches_kernel_and_split_with_the_batch():
    order = ReductionOrder.BATCH_VARIANT
    one = attention_plan(order, 1, 2048, 32, 8, device=H200_LIKE)
    assert (one.kernel, one.kernel_name, one.parallel_blocks) == ("vec", "fattn_vec_q1", 12)
    inv = attention_plan(ReductionOrder.BATCH_INVARIANT, 1, 2048, 32, 8, device=H200_LIKE)
    geometry = ("kernel", "queries_per_block", "parallel_blocks", "chunk_cells", "kv_attended", "split_cells")
    assert [getattr(one, f) for f in geometry] == [getattr(inv, f) for f in geometry]
    two = attention_plan(order, 2, 2048, 32, 8, device=H200_LIKE)
    nine = attention_plan(order, 9, 2048, 32, 8, device=H200_LIKE)
    assert two.kernel == nine.kernel == "tile"
    # ntiles_dst doubles from 8 to 9 queries (two 8-query tiles), so the split changes
    assert (two.parallel_blocks, two.split_cells) == (8, 256)
    assert (nine.parallel_blocks, nine.split_cells) == (4, 512)


def test_variant_single_query_kernel_choice_follows_llama_cpp():
    order = ReductionOrder.BATCH_VARIANT
    assert attention_plan(order, 1, 1000, 32, 8, device=AMPERE_LIKE).kernel == "tile"  # cc < 890
    assert attention_plan(order, 1, 1000, 32, 32, device=AMPERE_LIKE).kernel == "vec"  # no GQA opt
    assert attention_plan(order, 1, 7000, 64, 8, device=H200_LIKE).kernel == "vec"  # pads to 7168
    assert attention_plan(order, 1, 7937, 64, 8, device=H200_LIKE).kernel == "tile"  # pads to 8192, gqa 8
    assert attention_plan(order, 1, 9000, 32, 8, device=H200_LIKE).kernel == "vec"  # gqa 4


def test_fixed_split_plan():
    order = ReductionOrder.FIXED_SPLIT
    for n in (1, 5, 16):
        plan = attention_plan(order, n, 1000, 32, 8, device=H200_LIKE)
        assert (plan.kernel, plan.parallel_blocks, plan.kv_attended, plan.split_cells) == ("vec", 4, 1024, 256)
        assert plan.queries_per_block == (1 if n == 1 else 2) and not plan.shared_kv  # measured faster there
        assert [plan.chunks_of_block(y) for y in range(4)] == [[(256 * y, 256 * y + 256)] for y in range(4)]
    # the split size, not the number of splits, is fixed
    assert attention_plan(order, 1, 5000, 32, 8).parallel_blocks == 20
    wide = ReductionOrder.custom(attention="fixed_split", split_cells=512)
    assert attention_plan(wide, 3, 1000, 32, 8).chunks_of_block(1) == [(512, 1024)]


def test_custom_plan_and_its_errors():
    plan = attention_plan(ReductionOrder.custom(parallel_blocks=5), 3, 700, 8, 2)
    assert (plan.kernel, plan.parallel_blocks, plan.kv_attended) == ("vec", 5, 768)
    assert plan.chunks_of_block(0) == [(0, 128), (640, 768)]
    assert plan.chunks_of_block(4) == [(512, 640)]
    with pytest.raises(PlanError, match="parallel_blocks"):
        attention_plan(ReductionOrder(name="broken", attention="custom"), 1, 100, 8, 2)
    with pytest.raises(PlanError, match="multiple of n_head_kv"):
        attention_plan(ReductionOrder.BATCH_INVARIANT, 1, 100, 6, 4, 128, None)
    with pytest.raises(PlanError, match="kv_len"):
        attention_plan(ReductionOrder.BATCH_INVARIANT, 1, 0, 8, 2, 128, None)
    with pytest.raises(PlanError, match="unknown device profile"):
        attention_plan(ReductionOrder.BATCH_INVARIANT, 1, 10, 8, 2, 128, "no-such-gpu")


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel="mma", queries_per_block=1, parallel_blocks=1), "kernel"),
    (dict(kernel="vec", queries_per_block=3, parallel_blocks=1), "1 or 2 queries"),
    (dict(kernel="vec", queries_per_block=1, parallel_blocks=0), "parallel_blocks"),
    (dict(kernel="vec", queries_per_block=1, parallel_blocks=2, chunk_cells=100), "multiple of 128"),
    (dict(kernel="vec", queries_per_block=1, parallel_blocks=2, kv_attended=300), "kv_attended"),
    (dict(kernel="tile", queries_per_block=8, parallel_blocks=2, chunk_cells=64), "split_cells"),
    (dict(kernel="tile", queries_per_block=4, parallel_blocks=2, chunk_cells=64, split_cells=128), "8 queries"),
    (dict(kernel="vec", queries_per_block=1, parallel_blocks=2, kv_len=300), "kv_len"),
    (dict(kernel="vec", queries_per_block=1, parallel_blocks=2, head_dim=80), "head_dim"),
    (dict(kernel="vec", queries_per_block=3, parallel_blocks=1, shared_kv=True), "queries per block"),
    (dict(kernel="tile", queries_per_block=8, parallel_blocks=1, chunk_cells=64, split_cells=256,
          kv_attended=256, shared_kv=True), "shared_kv needs the vec kernel"),
])
def test_attention_plan_validation(kwargs, match):
    with pytest.raises(PlanError, match=match):
        AttentionPlan(**kwargs)


plans = st.one_of(
    st.builds(lambda p, n: AttentionPlan("vec", 1, p, kv_attended=128 * n),
              st.integers(1, 40), st.integers(1, 64)),
    st.builds(lambda c, p, n: AttentionPlan("vec", 2, p, chunk_cells=128 * c, split_cells=128 * c,
                                            kv_attended=128 * c * n),
              st.integers(1, 4), st.integers(1, 20), st.integers(1, 20)),
    st.builds(lambda s, n: AttentionPlan("tile", 8, -(-n // s), chunk_cells=64, split_cells=64 * s,
                                         kv_attended=64 * n),
              st.integers(1, 16), st.integers(1, 128)),
)


@settings(max_examples=60, deadline=None)
@given(plans)
def test_every_cell_is_read_by_exactly_one_block(plan):
    seen = []
    for y in range(plan.parallel_blocks):
        for a, b in plan.chunks_of_block(y):
            assert 0 <= a < b <= plan.kv_attended
            seen.extend(range(a, b))
            assert {plan.block_of_cell(c) for c in (a, b - 1)} == {y}
    assert sorted(seen) == list(range(plan.kv_attended))


def test_describe_names_kernel_blocks_and_combine():
    plan = attention_plan(ReductionOrder.custom(parallel_blocks=3), 1, 512, 32, 8)
    text = plan.describe()
    assert "fattn_vec_q1" in text and "P=3" in text
    assert "block 0: [0,128), [384,512)" in text
    assert "3 partials merged in block order" in text
    tile = attention_plan(ReductionOrder.BATCH_VARIANT, 4, 3000, 32, 8, device=H200_LIKE).describe()
    assert "fattn_tile" in tile and "contiguous split" in tile
    shared = attention_plan(ReductionOrder.BATCH_INVARIANT, 5, 3000, 32, 8).describe()
    assert "fattn_vec_shared" in shared and "4 queries of one KV head/block" in shared
    assert "order of fattn_vec_q1 is unchanged" in shared


def test_current_device_needs_cupy():
    # plans no longer know the GPU: "this GPU" is a profile measured through CuPy
    # (current_profile), or the cuda backend's device="current"; both need CuPy
    try:
        import cupy  # noqa: F401
    except ImportError:
        from hiraishin.backends import get_backend
        from hiraishin.errors import BackendError
        from hiraishin.kernels.attention.launch import current_profile

        with pytest.raises(BackendError):
            attention_plan(ReductionOrder.BATCH_VARIANT, 1, 100, 8, 2, 128, current_profile())
        with pytest.raises(BackendError):
            get_backend("cuda", "current")
    else:
        pytest.skip("CuPy present: covered by tests/test_fattn_gpu.py")


def test_short_caches_keep_the_one_query_kernel():
    # a few L2-resident cells: sharing K/V loads saves nothing and the shared kernel was slower (H200)
    for order in (ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK, ReductionOrder.custom(parallel_blocks=3)):
        for n in range(1, 17):
            short = attention_plan(order, n, SHARED_MIN_KV - 1, 32, 8, device=H200_LIKE)
            assert short.kernel_name == KERNEL_Q1 and not short.shared_kv
        assert attention_plan(order, 16, SHARED_MIN_KV, 32, 8, device=H200_LIKE).shared_kv
