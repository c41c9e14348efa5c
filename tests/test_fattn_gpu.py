"""Flash attention on a GPU: every kernel equals its Numba emulator bit for bit, and the
batch-invariance properties hold on the real kernels. Skipped without CuPy + a CUDA device.

Writes the compiled kernels' registers/spills/occupancy to $HIRAISHIN_RESULTS_DIR/fattn_kernels.json
when that variable is set.
"""

from __future__ import annotations

import datetime
import json
import os

import numpy as np
import pytest

from hiraishin.devices import DeviceProfile
from hiraishin.backends import get_backend
from hiraishin.kernels.attention.launch import current_profile, kernel_report
from hiraishin.order import ReductionOrder
from hiraishin.plans import AttentionPlan, attention_plan
from hiraishin.plans.attention import HEAD_DIMS, KERNEL_Q1, KERNEL_QN, KERNEL_TILE

from fattn_inputs import bits, make_inputs

pytestmark = pytest.mark.gpu

TINY_GPU = DeviceProfile(name="tiny-test-gpu", compute_capability=900, sm_count=3,
                         occupancy={KERNEL_Q1: 1, KERNEL_QN: 1, KERNEL_TILE: 1})


def attention(q, k, v, q_pos, kv_len, order, backend, device=None):
    return get_backend(backend, device).attention(q, k, v, q_pos, kv_len, order)


def flash_attn(q, k, v, q_pos, plan, backend):
    return get_backend(backend).flash_attn(q, k, v, q_pos, plan)


def partials(q, k, v, q_pos, plan, backend):
    return get_backend(backend).attention_partials(q, k, v, q_pos, plan)


def combine(parts, meta, backend):
    return get_backend(backend).attention_combine(parts, meta)


def on_gpu(*arrays):
    import cupy as cp

    return [cp.asarray(a) for a in arrays]


def assert_same_bits(a, b, what):
    a, b = bits(a), bits(b)
    if not np.array_equal(a, b):
        bad = np.argwhere(a != b)
        raise AssertionError(f"{what}: {len(bad)} of {a.size} values differ, first at {bad[0].tolist()}")


PLANS = [
    # (plan without shape fields, n_head, n_head_kv, T, kv_len, head_dim)
    (AttentionPlan("vec", 1, 1, kv_attended=256), 4, 4, 1, 1, 128),
    (AttentionPlan("vec", 1, 3, kv_attended=512), 8, 2, 1, 300, 128),
    (AttentionPlan("vec", 1, 4, kv_attended=512), 8, 2, 5, 512, 128),
    (AttentionPlan("vec", 1, 7, kv_attended=1024), 32, 8, 16, 1000, 128),
    (AttentionPlan("vec", 2, 1, kv_attended=256), 4, 2, 3, 129, 128),
    (AttentionPlan("vec", 2, 5, kv_attended=1024), 32, 8, 16, 777, 128),
    (AttentionPlan("vec", 2, 4, chunk_cells=256, split_cells=256, kv_attended=1024), 16, 4, 7, 1000, 128),
    (AttentionPlan("vec", 1, 6, chunk_cells=128, kv_attended=768), 4, 1, 2, 700, 64),
    (AttentionPlan("tile", 8, 1, chunk_cells=64, split_cells=512, kv_attended=512), 8, 2, 16, 400, 128),
    (AttentionPlan("tile", 8, 3, chunk_cells=64, split_cells=192, kv_attended=512), 8, 2, 9, 512, 128),
    (AttentionPlan("tile", 8, 8, chunk_cells=64, split_cells=256, kv_attended=2048), 32, 8, 4, 2000, 128),
    (AttentionPlan("tile", 8, 2, chunk_cells=64, split_cells=128, kv_attended=256), 4, 2, 3, 200, 64),
    (AttentionPlan("vec", 8, 7, kv_attended=1024, shared_kv=True), 32, 8, 16, 1000, 128),
    (AttentionPlan("vec", 4, 1, kv_attended=256, shared_kv=True), 4, 4, 5, 129, 128),
    (AttentionPlan("vec", 2, 3, kv_attended=512, shared_kv=True), 8, 2, 3, 300, 128),
    (AttentionPlan("vec", 8, 4, chunk_cells=256, split_cells=256, kv_attended=1024, shared_kv=True), 16, 2, 9, 1000,
     128),
    (AttentionPlan("vec", 8, 2, kv_attended=256, shared_kv=True), 6, 2, 16, 256, 64),
    (AttentionPlan("vec", 4, 3, kv_attended=512, shared_kv=True), 8, 1, 1, 1, 64),
]


@pytest.mark.parametrize("case", PLANS, ids=lambda c: (
    f"{c[0].kernel_name}{c[0].queries_per_block if c[0].shared_kv else ''}-P{c[0].parallel_blocks}"
    f"-H{c[1]}x{c[2]}-T{c[3]}-kv{c[4]}-D{c[5]}"))
def test_kernel_equals_emulator(case):
    base, H, Hkv, T, kv_len, D = case
    plan = AttentionPlan(**{**base.__dict__, "kv_len": kv_len, "n_head": H, "n_head_kv": Hkv,
                            "n_queries": T, "head_dim": D})
    q, k, v = make_inputs(seed=T * 7 + kv_len, n_ctx=kv_len + 33, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    rng = np.random.default_rng(kv_len)
    q_pos = np.sort(rng.integers(0, kv_len, size=T)).astype(np.int32)
    q_pos[-1] = kv_len - 1
    qg, kg, vg = on_gpu(q, k, v)
    if plan.parallel_blocks > 1:
        parts_c, meta_c = partials(q, k, v, q_pos, plan, "cpu")
        parts_g, meta_g = partials(qg, kg, vg, q_pos, plan, "cuda")
        assert_same_bits(meta_g.get(), meta_c, "meta (block max, sum)")
        assert_same_bits(parts_g.get(), parts_c, "partials")
        assert_same_bits(combine(parts_g, meta_g, "cuda").get(), combine(parts_c, meta_c, "cpu"),
                         "combine")
    out_c = flash_attn(q, k, v, q_pos, plan, "cpu")
    out_g = flash_attn(qg, kg, vg, q_pos, plan, "cuda").get()
    assert_same_bits(out_g, out_c, "output")


def test_combine_kernel_alone_on_awkward_partials():
    """Large P, empty blocks (max -FLT_MAX/2, sum 0), widely spread maxima."""
    import cupy as cp

    rng = np.random.default_rng(2)
    T, H, P, D = 3, 5, 37, 128
    parts = rng.standard_normal((T, H, P, D)).astype(np.float32)
    meta = np.stack([rng.uniform(-30, 10, (T, H, P)), rng.uniform(0.5, 40, (T, H, P))], -1).astype(np.float32)
    meta[:, :, 5] = [np.float32(-np.finfo(np.float32).max / 2), 0.0]
    parts[:, :, 5] = 0
    want = combine(parts, meta, "cpu")
    got = combine(cp.asarray(parts), cp.asarray(meta), "cuda").get()
    assert_same_bits(got, want, "combine")


def test_two_query_kernel_has_the_one_query_arithmetic():
    q, k, v = make_inputs(seed=3, n_ctx=900, n_head=8, n_head_kv=2, n_q=11)
    q_pos = np.arange(889, 900, dtype=np.int32)
    qg, kg, vg = on_gpu(q, k, v)
    outs = []
    for qpb in (1, 2):
        plan = AttentionPlan("vec", qpb, 5, kv_attended=1024, kv_len=900)
        outs.append(flash_attn(qg, kg, vg, q_pos, plan, "cuda").get())
    assert_same_bits(outs[1], outs[0], "qn vs q1")


@pytest.mark.parametrize("D,H,Hkv", [(128, 32, 8), (64, 8, 1), (128, 4, 4), (64, 6, 2)])
def test_shared_kernel_has_the_one_query_arithmetic(D, H, Hkv):
    """fattn_vec_shared == fattn_vec_q1 bit for bit at widths 1..16, every queries-per-block choice
    (and the queries-in-registers builds),
    KV lengths 1, 128 +- 1, 256, 257 and 1000, with the KV length from the plan and from the device
    positions (CUDA graphs)."""
    import cupy as cp

    from hiraishin.kernels.attention.launch import launch
    from hiraishin.plans.attention import SHARED_QUERIES

    q, k, v = make_inputs(seed=D + H, n_ctx=1000, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=16)
    qg, kg, vg = on_gpu(q, k, v)
    profile = current_profile(D)
    for kv_len in (1, 127, 128, 129, 256, 257, 1000):
        for T in range(1, min(16, kv_len) + 1):
            q_pos = cp.arange(kv_len - T, kv_len, dtype=cp.int32)
            base = attention_plan(ReductionOrder.BATCH_INVARIANT, T, kv_len, H, Hkv, D, device=profile)
            one = AttentionPlan(**{**base.__dict__, "queries_per_block": 1, "shared_kv": False})
            want = launch(qg[:T], kg[:kv_len], vg[:kv_len], q_pos, one, cp.empty((T, H, D), cp.float32)).get()
            for nq, build in [(n, None) for n in SHARED_QUERIES] + [(2, (8, 1)), (4, (2, 1))]:
                plan = AttentionPlan(**{**one.__dict__, "queries_per_block": nq, "shared_kv": True})
                for from_positions in (False, True):
                    got = launch(qg[:T], kg[:kv_len], vg[:kv_len], q_pos, plan, cp.full((T, H, D), cp.nan, cp.float32),
                                 kv_from_positions=from_positions, build=build).get()
                    assert_same_bits(got, want, f"shared q{nq} {build} vs q1 at kv {kv_len} T {T} (from positions: "
                                                f"{from_positions})")


def _alone(order, qg, kg, vg, positions, device):
    return np.stack([
        attention(qg[p:p + 1], kg, vg, np.array([p], np.int32), p + 1, order, "cuda", device).get()[0]
        for p in positions
    ])


def _batched(order, qg, kg, vg, start, sizes, device, guard=True):
    outs, pos = [], start
    for size in sizes:
        n = order.verify_limit(pos, size) if guard else size
        q_pos = np.arange(pos, pos + n, dtype=np.int32)
        outs.append(attention(qg[pos:pos + n], kg, vg, q_pos, pos + n, order, "cuda", device).get())
        pos += n
    return np.concatenate(outs), pos


def _prefix_reaching(sizes, start, end):
    """The shortest prefix of ``sizes`` whose batches carry ``start`` past ``end``
    (the verify guard may cut batches, so count conservatively by the guard too)."""
    order, pos, out = ReductionOrder.BATCH_INVARIANT, start, []
    for size in sizes:
        if pos >= end:
            break
        out.append(int(size))
        pos += order.verify_limit(pos, int(size))
    assert pos >= end, "not enough batch sizes to cross the boundaries"
    return out


@pytest.mark.parametrize("device", [TINY_GPU, "current"], ids=["tiny-profile", "this-gpu"])
def test_invariant_order_on_the_gpu(device):
    order = ReductionOrder.BATCH_INVARIANT
    q, k, v = make_inputs(seed=11, n_ctx=1200, n_head=32, n_head_kv=8)
    qg, kg, vg = on_gpu(q, k, v)
    rng = np.random.default_rng(3)
    sizes = list(range(1, 17)) + list(rng.integers(1, 17, size=60))
    sizes += list(rng.integers(1, 17, size=120))
    sizes = _prefix_reaching(sizes, 236, 1040)
    got, end = _batched(order, qg, kg, vg, 236, sizes, device)
    assert end > 1030  # crossed 256, 384, 512, 768, 1024
    want = _alone(order, qg, kg, vg, range(236, end), device)
    assert_same_bits(got, want, "invariant: batched vs alone")


def test_fixed_split_on_the_gpu():
    order = ReductionOrder.FIXED_SPLIT
    q, k, v = make_inputs(seed=14, n_ctx=900, n_head=32, n_head_kv=8)
    qg, kg, vg = on_gpu(q, k, v)
    rng = np.random.default_rng(4)
    sizes = list(range(16, 0, -1)) + list(rng.integers(1, 17, size=30))
    got, end = _batched(order, qg, kg, vg, 230, sizes, "current", guard=False)
    want = _alone(order, qg, kg, vg, range(230, end), "current")
    assert_same_bits(got, want, "fixed split: batched vs alone")


def test_position_384_effect_on_the_gpu():
    n = 512
    q, k, v = make_inputs(seed=16, n_ctx=n, n_head=8, n_head_kv=2)
    qg, kg, vg = on_gpu(q, k, v)
    q_pos = np.arange(n, dtype=np.int32)
    a = flash_attn(qg, kg, vg, q_pos, AttentionPlan("vec", 1, 4, kv_attended=n, kv_len=n), "cuda").get()
    b = flash_attn(qg, kg, vg, q_pos, AttentionPlan("vec", 1, 3, kv_attended=n, kv_len=n), "cuda").get()
    same = np.all(bits(a) == bits(b), axis=(1, 2))
    assert same[:384].all() and not same[384:].all()


def test_variant_order_on_the_gpu_is_batch_dependent_and_emulated():
    order = ReductionOrder.BATCH_VARIANT
    q, k, v = make_inputs(seed=15, n_ctx=2100, n_head=32, n_head_kv=8, n_q=8)
    qg, kg, vg = on_gpu(q, k, v)
    q_pos = np.arange(2092, 2100, dtype=np.int32)
    batch = attention(qg, kg, vg, q_pos, 2100, order, "cuda", "current").get()
    plan = attention_plan(order, 8, 2100, 32, 8, device=current_profile())
    assert plan.kernel == "tile"
    assert_same_bits(batch, flash_attn(q, k, v, q_pos, plan, "cpu"), "variant batch vs emulator")
    last = attention(qg[7:], kg, vg, q_pos[7:], 2100, order, "cuda", "current").get()
    assert not np.array_equal(bits(last[0]), bits(batch[7]))


def test_kv_cache_on_the_gpu():
    import cupy as cp

    from hiraishin.backends.kv_cache import KVCache

    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 8, 128)).astype(np.float32)
    gpu, cpu = KVCache(2, 64, 8, 128, backend="cuda"), KVCache(2, 64, 8, 128)
    for c in (gpu, cpu):
        c.write(1, 0, cp.asarray(x) if c is gpu else x, cp.asarray(-x) if c is gpu else -x)
        c.commit(40)
        c.rollback(33)
    assert isinstance(gpu.k(1), cp.ndarray)
    assert np.array_equal(gpu.k(1).get().view(np.uint16), cpu.k(1).view(np.uint16))
    q = rng.standard_normal((2, 32, 128)).astype(np.float32)
    q_pos = np.array([31, 32], np.int32)
    order = ReductionOrder.BATCH_INVARIANT
    got = attention(cp.asarray(q), gpu.k(1), gpu.v(1), q_pos, gpu.length, order, "cuda").get()
    want = attention(q, cpu.k(1), cpu.v(1), q_pos, cpu.length, order, "cpu")
    assert_same_bits(got, want, "attention over the KV cache")


def test_kernel_facts_recorded():
    import cupy as cp

    report = {f"D{d}": kernel_report(d) for d in HEAD_DIMS}
    for per_dim in report.values():
        for name, facts in per_dim.items():
            assert facts["local_size_bytes"] == 0, f"{name} spills: {facts}"
            if name != "fattn_combine":
                assert facts["blocks_per_sm"] >= 1
    profile = current_profile()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    record = {
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "compute_capability": profile.compute_capability,
        "sm_count": profile.sm_count,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "pytest -m gpu tests/test_fattn_gpu.py",
        "occupancy_for_profile": dict(profile.occupancy),
        "kernels": report,
        "cupy": cp.__version__,
    }
    out_dir = os.environ.get("HIRAISHIN_RESULTS_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "fattn_kernels.json"), "w") as f:
            json.dump(record, f, indent=2)
    print(json.dumps(record, indent=2))


@pytest.mark.parametrize("kv_len,T", [(33, 1), (128, 1), (40, 3), (300, 2), (600, 1)])
@pytest.mark.parametrize("shared", [False, True])
def test_launched_plan_equals_the_full_plan_on_the_gpu(kv_len, T, shared):
    """AttentionPlan.launched drops the parallel blocks past the filled cells: the same bits as the full
    plan's launch (its combine included), on the kernels (one-query and shared-KV builds)."""
    plan = AttentionPlan("vec", 4 if shared else 1, 6, kv_attended=768, kv_len=kv_len, shared_kv=shared)
    launched = plan.launched()
    assert launched.parallel_blocks == min(6, -(-kv_len // 128)) < plan.parallel_blocks
    q, k, v = make_inputs(seed=kv_len + T, n_ctx=kv_len, n_head=8, n_head_kv=2, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    full = flash_attn(*on_gpu(q, k, v, q_pos), plan, "cuda").get()
    got = flash_attn(*on_gpu(q, k, v, q_pos), launched, "cuda").get()
    assert_same_bits(got, full, f"launched P={launched.parallel_blocks} vs P=6")
    assert_same_bits(got, flash_attn(q, k, v, q_pos, plan, "cpu"), "launched plan vs the emulator")
