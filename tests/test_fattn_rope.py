"""fattn_vec_q1_rope on the CPU (g++ shim): one launch with the bits of hx_qk_norm_rope_kv then fattn_vec_q1.

``HIRAISHIN_ATTN_ROPE``'s kernel takes a one-token pass's raw q, k and v rows: every block norms and
ropes its q head, the blocks holding the token's cell also store its k and v, then each attends as
fattn_vec_q1. The two-launch sequence it replaces runs from the same build; the outputs (normalised
rows and their q8_1 with one parallel block, partials and block maxima and sums with several) and
both caches must be equal byte for byte, and equal the emulators. The token's cell starts as NaN, so
a block that read it before its own store (or a store by the wrong block) fails the comparison; the
positions cover the first cell, both sides of a chunk boundary, a fixed 256-cell split and a block
walking two chunks, GQA ratios 1, 2, 4 and 8, D = 64 and 128.
"""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.kernels.attention.emulate import attention_scale, emulate, emulate_partials
from hiraishin.kernels.fused.emulate import emulate_qk_norm_rope_kv
from hiraishin.kernels.fused.launch import (ATTN_ROPE_KERNEL, ATTN_ROPE_PRELUDE, launch_rope_attention,
                                            rope_attention_runs)
from hiraishin.kernels.quantize import emulate as quantize_emulate
from hiraishin.kernels.quantize.launch import output_shape, quantize_defines
from hiraishin.kernels.rmsnorm.emulate import block_threads
from hiraishin.kernels.rope.emulate import rope_tables
from hiraishin.plans import AttentionPlan

from cuda_shim import GXX, ShimBuilder, bits, run
from fattn_inputs import rope_inputs

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not on PATH")

SOURCES = ATTN_ROPE_PRELUDE + ("fused/fused.cu", "attention/fattn_vec.cu")
EPS = np.float32(1e-6)
ROPE_BASE = 1e6

# argv: q k v wq wk pos cos sin kcache vcache H Hkv D eps P kv_attended chunk fused(0/1) yq_bytes scale_bits
#       tree_threads, then outputs: kcache vcache dst parts meta yq
MAIN = r'''
int main(int argc, char** argv) {
    auto q = hx_read(argv[1]); auto k = hx_read(argv[2]); auto v = hx_read(argv[3]);
    auto wq = hx_read(argv[4]); auto wk = hx_read(argv[5]); auto pos = hx_read(argv[6]);
    auto cs = hx_read(argv[7]); auto sn = hx_read(argv[8]); auto kc = hx_read(argv[9]); auto vc = hx_read(argv[10]);
    const int H = atoi(argv[11]), Hkv = atoi(argv[12]), D = atoi(argv[13]);
    const float eps = strtof(argv[14], nullptr);
    const int P = atoi(argv[15]), kv_att = atoi(argv[16]), chunk = atoi(argv[17]), fused = atoi(argv[18]);
    const size_t yq_bytes = (size_t)atoll(argv[19]);
    const unsigned scale_bits = (unsigned)strtoul(argv[20], nullptr, 10);
    const int tree = atoi(argv[21]);
    float scale; std::memcpy(&scale, &scale_bits, 4);
    const size_t cache_bytes = kc.size() - 64;  // hx_read pads by 64 bytes
    std::vector<float> dst((size_t)H * D), parts((size_t)H * P * D), meta((size_t)H * P * 2);
    std::memset(dst.data(), 0xFF, dst.size() * 4); std::memset(parts.data(), 0xFF, parts.size() * 4);
    std::memset(meta.data(), 0xFF, meta.size() * 4);
    std::vector<unsigned char> yq(yq_bytes, 0xAB);
    unsigned char* yqp = P == 1 ? yq.data() : nullptr;
    const float* Q = (const float*)q.data(); const float* Kr = (const float*)k.data();
    const float* Vr = (const float*)v.data(); const int* QP = (const int*)pos.data();
    unsigned short* KC = (unsigned short*)kc.data(); unsigned short* VC = (unsigned short*)vc.data();
    if (fused) {
        hx_launch({1, (unsigned)P, (unsigned)H}, {32, 4, 1}, 0, [&] {
            fattn_vec_q1_rope(Q, Kr, Vr, (const float*)wq.data(), (const float*)wk.data(), (const float*)cs.data(),
                              (const float*)sn.data(), KC, VC, QP, dst.data(), parts.data(), meta.data(), H, Hkv,
                              kv_att, chunk, scale, eps, yqp); });
    } else {
        std::vector<float> qo((size_t)H * D);
        hx_launch({(unsigned)(H + 2 * Hkv), 1, 1}, {(unsigned)tree, 1, 1}, 0, [&] {
            hx_qk_norm_rope_kv(Q, Kr, Vr, (const float*)wq.data(), (const float*)wk.data(), QP, (const float*)cs.data(),
                               (const float*)sn.data(), qo.data(), nullptr, KC, VC, H, Hkv, D, eps); });
        hx_launch({1, (unsigned)P, (unsigned)H}, {32, 4, 1}, 0, [&] {
            fattn_vec_q1(qo.data(), KC, VC, QP, dst.data(), parts.data(), meta.data(), 1, H, Hkv, -1, kv_att, chunk,
                         scale, yqp); });
    }
    hx_write(argv[22], kc.data(), cache_bytes); hx_write(argv[23], vc.data(), cache_bytes);
    hx_write(argv[24], dst.data(), dst.size() * 4); hx_write(argv[25], parts.data(), parts.size() * 4);
    hx_write(argv[26], meta.data(), meta.size() * 4); hx_write(argv[27], yq.data(), yq.size());
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("fattn-rope-shim"))


def launch(shim, tmp_path, case, fused, layout, edit=None, tag=""):
    H, Hkv, D, pos, P, chunk, kv_att = case
    q, k, v, wq, wk, kc, vc = rope_inputs(H, Hkv, D, pos, kv_att, seed=H * 1000 + D + pos)
    cos_t, sin_t = rope_tables(kv_att, D, ROPE_BASE)
    exe = shim.build(SOURCES, {**quantize_defines(layout), "HX_D": D, "HX_ATTN_ROPE": 1, "HX_ATTN_Q8_1": 1}, MAIN,
                     f"rope_d{D}_{layout}{tag}", edit=edit)
    paths = []
    for name, a in (("q", q), ("k", k), ("v", v), ("wq", wq), ("wk", wk), ("pos", np.array([pos], np.int32)),
                    ("cos", cos_t), ("sin", sin_t), ("kc", kc.view(np.uint16)), ("vc", vc.view(np.uint16))):
        paths.append(tmp_path / f"{name}.bin")
        np.ascontiguousarray(a).tofile(paths[-1])
    yq_shape = output_shape(1, H * D, layout)
    outs = [tmp_path / f"{n}_{int(fused)}.bin" for n in ("kc", "vc", "dst", "parts", "meta", "yq")]
    run(exe, *paths, H, Hkv, D, repr(float(EPS)), P, kv_att, chunk, int(fused), int(np.prod(yq_shape)),
        int(attention_scale(D).view(np.uint32)), block_threads(D), *outs)
    got = {"kc": np.fromfile(outs[0], np.uint16).reshape(kc.shape), "vc": np.fromfile(outs[1], np.uint16).reshape(kc.shape),
           "dst": np.fromfile(outs[2], np.float32).reshape(1, H, D),
           "parts": np.fromfile(outs[3], np.float32).reshape(1, H, P, D),
           "meta": np.fromfile(outs[4], np.float32).reshape(1, H, P, 2), "yq": np.fromfile(outs[5], np.uint8)}
    return got, (q, k, v, wq, wk, kc, vc, cos_t, sin_t)


CASES = [
    # (H, Hkv, D, position, P, chunk cells, attended cells, q8_1 layout)
    (16, 8, 128, 40, 1, 128, 256, "Q4_K"),   # the 0.6B's shape on a short cache: one block, q8_1 out
    (2, 1, 128, 0, 1, 128, 256, None),       # the first token: its own cell only
    (4, 1, 128, 300, 3, 128, 512, None),     # GQA 4; the cell in chunk 2 = block 2
    (8, 2, 64, 127, 2, 128, 256, None),      # the last cell of chunk 0 (block 0)
    (4, 4, 64, 128, 2, 128, 256, None),      # the first cell of chunk 1 (block 1), GQA 1
    (8, 2, 128, 273, 2, 256, 512, "Q6_K"),   # a fixed 256-cell split: block 1
    (8, 1, 64, 700, 4, 128, 768, None),      # GQA 8; chunk 5: block 1, which walks chunks 1 and 5
]


def _plan(case):
    H, Hkv, D, pos, P, chunk, kv_att, _ = case
    return AttentionPlan("vec", 1, P, chunk_cells=chunk, kv_attended=kv_att, split_cells=chunk if chunk > 128 else None,
                         kv_len=pos + 1, n_head=H, n_head_kv=Hkv, n_queries=1, head_dim=D)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}x{c[1]}-D{c[2]}-pos{c[3]}-P{c[4]}-chunk{c[5]}")
def test_fused_launch_equals_qk_norm_rope_kv_then_attention(shim, tmp_path, case):
    layout = case[7]
    fused, inputs = launch(shim, tmp_path, case[:7], True, layout)
    unfused, _ = launch(shim, tmp_path, case[:7], False, layout)
    for name in ("kc", "vc", "yq"):
        assert np.array_equal(fused[name], unfused[name]), name
    for name in ("dst", "parts", "meta"):
        assert np.array_equal(bits(fused[name]), bits(unfused[name])), name

    # and the emulators: the q/k norms, RoPE and store, then the attention of the plan
    q, k, v, wq, wk, kc, vc, cos_t, sin_t = inputs
    pos = np.array([case[3]], np.int32)
    kc, vc = kc.copy(), vc.copy()
    q_roped, _ = emulate_qk_norm_rope_kv(q, k, v, wq, wk, EPS, pos, cos_t, sin_t, kc, vc)
    assert np.array_equal(fused["kc"], kc.view(np.uint16)) and np.array_equal(fused["vc"], vc.view(np.uint16))
    plan = _plan(case)
    if plan.parallel_blocks == 1:
        want = emulate(q_roped, kc, vc, pos, plan)
        assert np.array_equal(bits(fused["dst"]), bits(want))
        assert np.array_equal(fused["yq"], quantize_emulate(want.reshape(1, -1), layout).reshape(-1))
    else:
        parts, meta = emulate_partials(q_roped, kc, vc, pos, plan)
        assert np.array_equal(bits(fused["parts"]), bits(parts))
        assert np.array_equal(bits(fused["meta"]), bits(meta))


def test_a_block_that_does_not_store_the_cell_fails_the_comparison(shim, tmp_path):
    """The owner block reads the cell it stored: with no block storing, the NaN cell reaches the sums."""
    case = CASES[2][:7]

    def no_store(text):
        old = "== (int)blockIdx.y;  // uniform per block"
        assert old in text
        return text.replace(old, "== -1;")

    broken, _ = launch(shim, tmp_path, case, True, None, edit=no_store, tag="-nostore")
    unfused, _ = launch(shim, tmp_path, case, False, None)
    assert not np.array_equal(bits(broken["parts"]), bits(unfused["parts"]))


def test_the_launch_takes_only_one_query_vector_plans():
    shared = AttentionPlan("vec", 4, 2, kv_attended=512, shared_kv=True, kv_len=300, n_head=8, n_head_kv=2,
                           n_queries=4, head_dim=128)
    assert rope_attention_runs(_plan(CASES[2])) and not rope_attention_runs(shared)
    with pytest.raises(ValueError, match=ATTN_ROPE_KERNEL):
        launch_rope_attention(*[None] * 11, shared, None, None, None)


class _Cache:
    def k(self, layer):
        return np.zeros((256, 2, 64), np.float16)

    v = k


@pytest.mark.parametrize("switch,T,P,attn_q8_1,fused", [
    (True, 1, 1, True, True), (True, 1, 3, True, True), (True, 1, 3, False, True),
    (True, 1, 1, False, False),  # one block without the q8_1 epilogue: the unfused kernels
    (True, 3, 1, True, False),   # a wider pass: other blocks store its other cells
    (False, 1, 1, True, False)])
def test_the_cuda_ops_take_the_fused_launch_where_it_runs(monkeypatch, switch, T, P, attn_q8_1, fused):
    """``CudaOps.rope_attention_matvec`` (host logic, no GPU): the fused launch for a one-token pass of a
    one-query vector plan with the switch on (the combine behind it when P > 1), else the two ops."""
    from hiraishin.backends import cuda as cuda_backend
    from hiraishin.backends import cuda_attention
    from hiraishin.kernels.fused import launch as fused_launch

    monkeypatch.setattr(fused_launch, "ATTN_ROPE", switch)
    monkeypatch.setattr(fused_launch, "ATTN_Q8_1", attn_q8_1)
    calls = []
    monkeypatch.setattr(cuda_attention, "launch_rope_attention", lambda *a: calls.append("rope_attention"))
    monkeypatch.setattr(cuda_attention, "launch_combine_q8_1", lambda *a: calls.append("combine"))
    ops = object.__new__(cuda_backend.CudaOps)
    plan = AttentionPlan("vec", 1 if T == 1 else 4, P, kv_attended=512, shared_kv=T > 1, kv_len=300, n_head=4,
                         n_head_kv=2, n_queries=T, head_dim=64)
    ops.backend = type("B", (), {"attention_plan": lambda self, *a: plan})()
    ops._layouts = lambda weights, T, order: ([None], ["Q4_K"])
    ops._q8_1_scratch = lambda *a: "xq"
    ops.attention_scratch = lambda *a: ("parts", "meta")
    ops._run_matvecs = lambda *a: calls.append("matvec") or ["o"]
    ops.qk_norm_rope_store = lambda *a, **kw: calls.append("qk_norm_rope_store") or "q"
    ops.attention_matvec = lambda *a: calls.append("attention_matvec") or "o"
    q, kv = np.zeros((T, 4, 64), np.float32), np.zeros((T, 2, 64), np.float32)
    assert ops.rope_attention_matvec(q, kv, kv, None, None, 1e-6, None, None, None, _Cache(), 0, 300, None,
                                     ("w", "Q4_K")) == "o"
    if fused:
        assert calls == ["rope_attention"] + (["combine"] if P > 1 else []) + ["matvec"]
    else:
        assert calls == ["qk_norm_rope_store", "attention_matvec"]
