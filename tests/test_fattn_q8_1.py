"""The attention builds that end with q8_1 rows (fattn_vec.cu, HX_ATTN_Q8_1) on the CPU (g++ shim).

``fattn_vec_{q1,qn,shared}_q8_1`` replace three launches of a decode step or verify pass (the
attention kernel, ``fattn_combine`` when P > 1, ``quantize_q8_1`` of its rows) by one: with P == 1
each normalised row is quantized where it is formed; with P > 1 the last of the P CUDA blocks of
its rows to finish merges the partials and quantizes. Their q8_1 bytes must equal, byte for byte,
the unfused launches' (the same kernels compiled without the epilogue, the combine, then
``quantize_q8_1``) and the emulators' (attention emulator, then the quantize emulator), in every
q8_1 layout; every merge counter must be zero again after the launch (the next launch reuses them).
The shim runs CUDA blocks one after the other, so "last block" is the last in launch order here;
on the GPU any block can be last (tests/test_fused_gpu.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.kernels.attention.emulate import attention_scale, emulate
from hiraishin.kernels.quantize.emulate import emulate as emulate_quantize
from hiraishin.kernels.quantize.launch import output_shape, quantize_defines
from hiraishin.plans import AttentionPlan

from cuda_shim import GXX, ShimBuilder, run
from fattn_inputs import make_inputs

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not on PATH")

SOURCES = ("quantize/quantize_q8_1.cu", "attention/fattn_vec.cu")

# argv: q k v pos T H Hkv kv_len_arg kv_attended chunk P kind(0 q1, 1 qn, 2 shared) scale_bits nq
#       out_q_fused out_q_unfused out_counters
MAIN = r'''
int main(int argc, char** argv) {
    auto q = hx_read(argv[1]); auto k = hx_read(argv[2]); auto v = hx_read(argv[3]); auto pos = hx_read(argv[4]);
    const int T = atoi(argv[5]), H = atoi(argv[6]), Hkv = atoi(argv[7]), kv_len = atoi(argv[8]);
    const int kv_att = atoi(argv[9]), chunk = atoi(argv[10]), P = atoi(argv[11]), kind = atoi(argv[12]);
    const unsigned scale_bits = (unsigned)strtoul(argv[13], nullptr, 10);
    const size_t nq = (size_t)atoll(argv[14]);
    float scale; std::memcpy(&scale, &scale_bits, 4);
    const size_t rows = (size_t)T * H;
    std::vector<float> dst(rows * HX_D), parts(rows * P * HX_D), meta(rows * P * 2);
    std::vector<unsigned char> qf(nq, 0xAB), qu(nq, 0xCD);
    std::vector<unsigned> counters(4096, 0);
    const float* Q = (const float*)q.data();
    const unsigned short* K = (const unsigned short*)k.data();
    const unsigned short* V = (const unsigned short*)v.data();
    const int* QP = (const int*)pos.data();
    const unsigned G = (unsigned)(H / Hkv);
    const dim3 grid = kind == 2 ? dim3{(T * G + FV_SHARED_Q - 1) / FV_SHARED_Q, (unsigned)P, (unsigned)Hkv}
                    : kind == 1 ? dim3{(unsigned)(T + 1) / 2, (unsigned)P, (unsigned)H}
                                : dim3{(unsigned)T, (unsigned)P, (unsigned)H};
    // fused: twice, so a launch after a launch (counters zeroed by the last blocks) is checked too;
    // partials and meta start as NaN each time, so a merge before every block wrote them shows
    bool counters_zero = true;
    for (int rep = 0; rep < 2; ++rep) {
        std::memset(qf.data(), 0xAB, nq);
        std::memset(parts.data(), 0xFF, parts.size() * 4);
        std::memset(meta.data(), 0xFF, meta.size() * 4);
        hx_launch(grid, {32, 4, 1}, 0, [&] {
            if (kind == 2) fattn_vec_shared_q8_1(Q, K, V, QP, nullptr, parts.data(), meta.data(), T, H, Hkv, kv_len,
                                                 kv_att, chunk, scale, qf.data(), counters.data());
            else if (kind == 1) fattn_vec_qn_q8_1(Q, K, V, QP, nullptr, parts.data(), meta.data(), T, H, Hkv, kv_len,
                                                  kv_att, chunk, scale, qf.data(), counters.data());
            else fattn_vec_q1_q8_1(Q, K, V, QP, nullptr, parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att,
                                   chunk, scale, qf.data(), counters.data()); });
        for (unsigned c : counters) counters_zero = counters_zero && c == 0;
    }
    if (!counters_zero) counters[0] = 1;  // reported through the counters file
    // unfused: the plain build of the same kernel, the combine, quantize_q8_1's own launch
    hx_launch(grid, {32, 4, 1}, 0, [&] {
        if (kind == 2) fattn_vec_shared(Q, K, V, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att,
                                        chunk, scale);
        else if (kind == 1) fattn_vec_qn(Q, K, V, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att,
                                         chunk, scale);
        else fattn_vec_q1(Q, K, V, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, kv_len, kv_att, chunk,
                          scale); });
    if (P > 1) hx_launch({(unsigned)T, (unsigned)H, 1}, {HX_D, 1, 1}, 8 * P, [&] {
        fattn_combine(parts.data(), meta.data(), dst.data(), P); });
    const int kk = H * HX_D;
    hx_launch({(unsigned)((kk / 32 + 7) / 8), (unsigned)T, 1}, {256, 1, 1}, 0,
              [&] { quantize_q8_1(dst.data(), qu.data(), kk, kk); });
    hx_write(argv[15], qf.data(), nq);
    hx_write(argv[16], qu.data(), nq);
    hx_write(argv[17], counters.data(), counters.size() * 4);
}'''

KINDS = {"q1": 0, "qn": 1, "shared": 2}

CASES = [
    # (kernel, P, n_head, n_head_kv, T, kv_len, head_dim, shared queries, layout)
    ("q1", 1, 4, 2, 1, 100, 128, 4, "Q4_K"),      # a decode step, P == 1: quantized where normalised
    ("q1", 3, 4, 2, 2, 300, 128, 4, "Q6_K"),      # 3 blocks over 3 chunks, the last one merges
    ("q1", 2, 4, 1, 3, 1, 64, 4, None),           # KV length 1: block 1 is empty (max -FLT_MAX/2, sum 0)
    ("qn", 2, 4, 2, 3, 260, 64, 4, "Q4_K"),       # 2 queries per block, the second missing in the last
    ("shared", 3, 8, 2, 5, 300, 128, 4, "Q4_K"),  # GQA 4: 20 queries in blocks of 4 of one KV head
    ("shared", 1, 8, 2, 3, 129, 128, 8, "Q6_K"),  # P == 1, 8 queries per block, 2 of them missing
    ("shared", 2, 6, 2, 5, 200, 64, 8, None),     # GQA 3: blocks straddle tokens and heads
]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("fattn-q8-shim"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-P{c[1]}-H{c[2]}x{c[3]}-T{c[4]}-kv{c[5]}-D{c[6]}-{c[8]}")
def test_q8_1_build_equals_attention_combine_quantize_and_emulator(shim, tmp_path, case):
    kind, P, H, Hkv, T, kv_len, D, shared_q, layout = case
    if layout is not None and (H * D) % 256:
        pytest.skip("the mat-vec layouts hold whole super-blocks of 256 values")
    queries = {"q1": 1, "qn": 2, "shared": shared_q}[kind]
    plan = AttentionPlan("vec", queries, P, kv_attended=-(-kv_len // 256) * 256, kv_len=kv_len, n_head=H,
                         n_head_kv=Hkv, n_queries=T, head_dim=D, shared_kv=kind == "shared")
    exe = shim.build(SOURCES, {**quantize_defines(layout), "HX_D": D, "HX_ATTN_Q8_1": 1, "FV_SHARED_Q": shared_q},
                     MAIN, f"attn_q8_{layout}_{D}_{shared_q}")
    q, k, v = make_inputs(seed=T * 7 + kv_len + D + P, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D, n_q=T)
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32) if kv_len >= T else np.zeros(T, np.int32)
    paths = {}
    for name, a in (("q", q), ("k", k.view(np.uint16)), ("v", v.view(np.uint16)), ("pos", q_pos)):
        paths[name] = tmp_path / f"{name}.bin"
        np.ascontiguousarray(a).tofile(paths[name])
    outs = [tmp_path / f"{n}.bin" for n in ("qf", "qu", "counters")]
    nq = int(np.prod(output_shape(T, H * D, layout)))
    run(exe, paths["q"], paths["k"], paths["v"], paths["pos"], T, H, Hkv, -1, plan.kv_attended, plan.chunk_cells, P,
        KINDS[kind], int(attention_scale(D).view(np.uint32)), nq, *outs)
    fused, unfused = (np.fromfile(p, np.uint8) for p in outs[:2])
    counters = np.fromfile(outs[2], np.uint32)
    want = np.asarray(emulate_quantize(emulate(q, k, v, q_pos, plan).reshape(T, H * D), layout)).reshape(-1)
    assert np.array_equal(unfused, want), "unfused launches != emulators (the reference itself)"
    assert np.array_equal(fused, unfused), "q8_1-ending build != attention, combine, quantize_q8_1"
    assert not counters.any(), "a merge counter was left non-zero"
