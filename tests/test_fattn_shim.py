"""fattn_vec.cu on the CPU (g++ shim, tests/cuda_shim.py): the shared-KV kernel equals the one-query kernel.

``fattn_vec_shared`` gives the queries of one KV head one K/V load per block but must leave each
query's float operations and their order those of ``fattn_vec_q1``: its partials, block maxima and
sums (P > 1) or normalised outputs (P == 1) equal the one-query kernel's bit for bit, and both equal
the Numba emulator (which thereby stays the emulator of the exact orders' verify passes). The edge
shapes: KV length 1, 128 +- 1, 256, a chunk boundary inside the pass, empty parallel blocks, GQA
ratios 1, 3, 4 and 8, a last block with missing queries, positions read from device memory.
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.kernels.attention.emulate import attention_scale, emulate, emulate_partials
from hiraishin.plans import AttentionPlan

from cuda_shim import GXX, ShimBuilder, bits, run
from fattn_inputs import make_inputs

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not on PATH")

SOURCE = "attention/fattn_vec.cu"

# argv: q k v pos T H Hkv kv_len_arg kv_attended chunk P shared(0/1) scale_bits dst parts meta
MAIN = r'''
int main(int argc, char** argv) {
    auto q = hx_read(argv[1]); auto k = hx_read(argv[2]); auto v = hx_read(argv[3]); auto pos = hx_read(argv[4]);
    const int T = atoi(argv[5]), H = atoi(argv[6]), Hkv = atoi(argv[7]), kv_len = atoi(argv[8]);
    const int kv_att = atoi(argv[9]), chunk = atoi(argv[10]), P = atoi(argv[11]), shared = atoi(argv[12]);
    const unsigned scale_bits = (unsigned)strtoul(argv[13], nullptr, 10);
    float scale; std::memcpy(&scale, &scale_bits, 4);
    const size_t rows = (size_t)T * H;
    // 0xFF bytes (NaN) where nothing is written
    std::vector<float> dst(rows * HX_D), parts(rows * P * HX_D), meta(rows * P * 2);
    std::memset(dst.data(), 0xFF, dst.size() * 4); std::memset(parts.data(), 0xFF, parts.size() * 4);
    std::memset(meta.data(), 0xFF, meta.size() * 4);
    const float* Q = (const float*)q.data();
    const unsigned short* K = (const unsigned short*)k.data();
    const unsigned short* V = (const unsigned short*)v.data();
    const int* QP = (const int*)pos.data();
    if (shared) {
        const unsigned nblk = (unsigned)((T * (H / Hkv) + FV_SHARED_Q - 1) / FV_SHARED_Q);
        hx_launch({nblk, (unsigned)P, (unsigned)Hkv}, {32, 4, 1}, 0, [&] {
            fattn_vec_shared(Q, K, V, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att, chunk,
                             scale, nullptr); });
    } else {
        hx_launch({(unsigned)T, (unsigned)P, (unsigned)H}, {32, 4, 1}, 0, [&] {
            fattn_vec_q1(Q, K, V, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att, chunk,
                         scale, nullptr); });
    }
    if (P > 1) {
        hx_launch({(unsigned)T, (unsigned)H, 1}, {HX_D, 1, 1}, 8 * P, [&] {
            fattn_combine(parts.data(), meta.data(), dst.data(), P); });
    }
    hx_write(argv[14], dst.data(), dst.size() * 4);
    hx_write(argv[15], parts.data(), parts.size() * 4);
    hx_write(argv[16], meta.data(), meta.size() * 4);
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("fattn-shim"))


def launch(shim, tmp_path, shared_q, qreg, q, k, v, q_pos, plan, shared, from_positions, skip=1):
    """One launch of fattn_vec_q1 (shared=False) or fattn_vec_shared (scaled queries in registers if
    ``qreg``, else in shared memory), the combine after it when P > 1. ``skip`` 0: the kernel also walks
    the steps past the filled cells (FV_SKIP_PAST_FILLED)."""
    T, H, D = q.shape
    P = plan.parallel_blocks
    exe = shim.build(SOURCE, {"HX_D": D, "FV_SHARED_Q": shared_q, "FV_SHARED_QREG": qreg, "FV_SKIP_PAST_FILLED": skip},
                     MAIN, f"fattn_d{D}_q{shared_q}_r{qreg}_s{skip}")
    paths = {}
    for name, a in (("q", q), ("k", k.view(np.uint16)), ("v", v.view(np.uint16)), ("pos", q_pos.astype(np.int32))):
        paths[name] = tmp_path / f"{name}.bin"
        np.ascontiguousarray(a).tofile(paths[name])
    outs = [tmp_path / f"{n}_{int(shared)}.bin" for n in ("dst", "parts", "meta")]
    kv_arg = -1 if from_positions else plan.kv_len
    run(exe, paths["q"], paths["k"], paths["v"], paths["pos"], T, H, k.shape[1], kv_arg, plan.kv_attended,
        plan.chunk_cells, P, int(shared), int(attention_scale(D).view(np.uint32)), *outs)
    dst, parts, meta = (np.fromfile(p, np.float32) for p in outs)
    return dst.reshape(T, H, D), parts.reshape(T, H, P, D), meta.reshape(T, H, P, 2)


CASES = [
    # (plan without shape fields, queries per shared block, n_head, n_head_kv, T, kv_len, head_dim, positions,
    #  scaled queries in registers)
    # 16 tokens x GQA 4 over a chunk boundary (256 + 44), 3 interleaved blocks over 4 chunks
    (AttentionPlan("vec", 8, 3, kv_attended=512, shared_kv=True), 8, 4, 1, 16, 300, 128, "last", 0),
    # GQA 1, 128 + 1 cells, P == 1 (normalised in the kernel), a 4-query block with 3 missing queries,
    # the KV length read from the positions (CUDA graphs)
    (AttentionPlan("vec", 4, 1, kv_attended=256, shared_kv=True), 4, 4, 4, 5, 129, 128, "device", 1),
    # 128 - 1 cells, sorted random positions (the causal mask differs per token), GQA 4
    (AttentionPlan("vec", 4, 2, kv_attended=256, shared_kv=True), 4, 8, 2, 6, 127, 128, "random", 0),
    # KV length 1, one token, GQA 8: block 1 holds no cell (its max -FLT_MAX/2 and sum 0 go to the combine)
    (AttentionPlan("vec", 8, 2, kv_attended=256, shared_kv=True), 8, 8, 1, 1, 1, 64, "last", 0),
    # GQA 3 (blocks straddle tokens), exactly 256 cells in a fixed 256-cell split: block 1 empty
    (AttentionPlan("vec", 8, 2, chunk_cells=256, split_cells=256, kv_attended=512, shared_kv=True), 8, 6, 2, 16,
     256, 64, "last", 0),
    # 2 queries per block, odd query count, a 256-cell fixed split cut by the pass
    (AttentionPlan("vec", 2, 2, chunk_cells=256, split_cells=256, kv_attended=512, shared_kv=True), 2, 2, 1, 7,
     260, 64, "device", 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"Q{c[1]}{'reg' if c[8] else ''}-H{c[2]}x{c[3]}-T{c[4]}-kv{c[5]}-D{c[6]}-P{c[0].parallel_blocks}-{c[7]}"))
def test_shared_kernel_equals_one_query_kernel_and_emulator(shim, tmp_path, case):
    base, shared_q, H, Hkv, T, kv_len, D, positions, qreg = case
    plan = AttentionPlan(**{**base.__dict__, "kv_len": kv_len, "n_head": H, "n_head_kv": Hkv, "n_queries": T,
                            "head_dim": D})
    # the cache holds exactly kv_len cells: a read past it would be out of bounds (the GPU run checks)
    q, k, v = make_inputs(seed=T * 31 + kv_len + D, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    if positions == "random":
        q_pos = np.sort(np.random.default_rng(kv_len).integers(0, kv_len, size=T)).astype(np.int32)
        q_pos[-1] = kv_len - 1
    else:
        q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    from_positions = positions == "device"
    one = launch(shim, tmp_path, shared_q, qreg, q, k, v, q_pos, plan, False, from_positions)
    shared = launch(shim, tmp_path, shared_q, qreg, q, k, v, q_pos, plan, True, from_positions)
    want_out = emulate(q, k, v, q_pos, plan)
    assert np.array_equal(bits(shared[0]), bits(one[0])), "output: shared vs one-query kernel"
    assert np.array_equal(bits(shared[0]), bits(want_out)), "output: shared kernel vs emulator"
    if plan.parallel_blocks > 1:
        parts, meta = emulate_partials(q, k, v, q_pos, plan)
        for got, want, what in ((shared[1], one[1], "partials vs one-query"), (shared[2], one[2], "meta vs one-query"),
                                (shared[1], parts, "partials vs emulator"), (shared[2], meta, "meta vs emulator")):
            assert np.array_equal(bits(got), bits(want)), what


# (kv_len, kv_attended, chunk cells, P, T): the padded range far past the filled cells, blocks with no
# filled cell, a fixed 256-cell split whose second step is empty
SKIP_CASES = [(1, 256, 128, 2, 1), (40, 1024, 128, 8, 3), (129, 512, 128, 4, 16), (200, 512, 256, 2, 5),
              (300, 1024, 256, 4, 9), (255, 256, 128, 1, 2)]


@pytest.mark.parametrize("shared", [False, True], ids=["q1", "shared"])
@pytest.mark.parametrize("case", SKIP_CASES, ids=lambda c: f"kv{c[0]}-att{c[1]}-chunk{c[2]}-P{c[3]}-T{c[4]}")
def test_skipping_steps_past_the_filled_cells_changes_no_bit(shim, tmp_path, case, shared):
    """The kernels skip 128-cell steps that lie wholly past the filled cache (FV_SKIP_PAST_FILLED): the
    same bits as walking their masked cells, for the outputs, partials and block maxima and sums."""
    kv_len, kv_att, chunk, P, T = case
    H, Hkv, D = 8, 2, 64
    plan = AttentionPlan("vec", 4 if shared else 1, P, chunk_cells=chunk, kv_attended=kv_att, shared_kv=shared,
                         kv_len=kv_len, n_head=H, n_head_kv=Hkv, n_queries=T, head_dim=D,
                         split_cells=chunk if chunk > 128 else None)
    q, k, v = make_inputs(seed=kv_len + 7 * T, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32) if kv_len >= T else np.zeros(T, np.int32)
    walked = launch(shim, tmp_path, 4, 0, q, k, v, q_pos, plan, shared, False, skip=0)
    skipped = launch(shim, tmp_path, 4, 0, q, k, v, q_pos, plan, shared, False, skip=1)
    for got, want, what in zip(skipped, walked, ("output", "partials", "meta")):
        assert np.array_equal(bits(got), bits(want)), what
    assert np.array_equal(bits(skipped[0]), bits(emulate(q, k, v, q_pos, plan))), "output vs emulator"


@pytest.mark.parametrize("P", [1, 2])
def test_non_finite_scores_give_the_kernels_nan_not_an_error(shim, tmp_path, P):
    """Scores of -inf for every cell of a query (a -inf query value times positive keys): the kernel's
    sum is 0 and its IEEE division gives NaN; the emulator must give the same bits, not raise
    ZeroDivisionError (it did: Numba's default error model raises on a float division by zero).
    Synthetic timing models with random blocks reach such values; so does a diverging real one."""
    H, Hkv, T, kv_len, D = 4, 2, 3, 40, 64
    plan = AttentionPlan("vec", 1, P, kv_attended=256, kv_len=kv_len, n_head=H, n_head_kv=Hkv, n_queries=T,
                         head_dim=D)
    q, k, v = make_inputs(seed=5, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    k = np.abs(k.astype(np.float32)).astype(np.float16) + np.float16(0.5)
    q[1, 2, :] = 0.0
    q[1, 2, 0] = -np.inf  # every score of this query: -inf
    q[2, 0, 3] = np.nan  # and a NaN query
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    got = launch(shim, tmp_path, 4, 0, q, k, v, q_pos, plan, False, False)[0]
    want = emulate(q, k, v, q_pos, plan)
    assert np.isnan(want[1, 2]).all() and np.isnan(want[2, 0]).all()
    assert np.array_equal(bits(got), bits(want))
