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
from hiraishin.kernels.fused.launch import (ATTN_EARLY_LEVELS, ATTN_ROPE_KERNEL, ATTN_ROPE_PRELUDE, attn_early_build,
                                            launch_rope_attention, rope_attention_runs)
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
#       tree_threads T, then outputs: kcache vcache dst parts meta yq
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
    const int tree = atoi(argv[21]), T = atoi(argv[22]);
    float scale; std::memcpy(&scale, &scale_bits, 4);
    const size_t cache_bytes = kc.size() - 64;  // hx_read pads by 64 bytes
    std::vector<float> dst((size_t)T * H * D), parts((size_t)T * H * P * D), meta((size_t)T * H * P * 2);
    std::memset(dst.data(), 0xFF, dst.size() * 4); std::memset(parts.data(), 0xFF, parts.size() * 4);
    std::memset(meta.data(), 0xFF, meta.size() * 4);
    std::vector<unsigned char> yq(yq_bytes, 0xAB);
    unsigned char* yqp = P == 1 ? yq.data() : nullptr;
    const float* Q = (const float*)q.data(); const float* Kr = (const float*)k.data();
    const float* Vr = (const float*)v.data(); const int* QP = (const int*)pos.data();
    unsigned short* KC = (unsigned short*)kc.data(); unsigned short* VC = (unsigned short*)vc.data();
    if (fused) {
        hx_launch({(unsigned)T, (unsigned)P, (unsigned)H}, {32, 4, 1}, 0, [&] {
            fattn_vec_q1_rope(Q, Kr, Vr, (const float*)wq.data(), (const float*)wk.data(), (const float*)cs.data(),
                              (const float*)sn.data(), KC, VC, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv,
                              kv_att, chunk, scale, eps, yqp); });
    } else {
        std::vector<float> qo((size_t)T * H * D);
        hx_launch({(unsigned)(T * (H + 2 * Hkv)), 1, 1}, {(unsigned)tree, 1, 1}, 0, [&] {
            hx_qk_norm_rope_kv(Q, Kr, Vr, (const float*)wq.data(), (const float*)wk.data(), QP, (const float*)cs.data(),
                               (const float*)sn.data(), qo.data(), nullptr, KC, VC, H, Hkv, D, eps); });
        hx_launch({(unsigned)T, (unsigned)P, (unsigned)H}, {32, 4, 1}, 0, [&] {
            fattn_vec_q1(qo.data(), KC, VC, QP, dst.data(), parts.data(), meta.data(), T, H, Hkv, -1, kv_att, chunk,
                         scale, yqp); });
    }
    hx_write(argv[23], kc.data(), cache_bytes); hx_write(argv[24], vc.data(), cache_bytes);
    hx_write(argv[25], dst.data(), dst.size() * 4); hx_write(argv[26], parts.data(), parts.size() * 4);
    hx_write(argv[27], meta.data(), meta.size() * 4); hx_write(argv[28], yq.data(), yq.size());
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("fattn-rope-shim"))


def launch(shim, tmp_path, case, fused, layout, edit=None, tag="", early=0):
    """``early``: the build of ``ATTN_EARLY_LEVELS`` (how early the fused kernel issues its loads)."""
    H, Hkv, D, pos, T, P, chunk, kv_att = case
    q, k, v, wq, wk, kc, vc = rope_inputs(H, Hkv, D, pos, kv_att, seed=H * 1000 + D + pos, T=T)
    cos_t, sin_t = rope_tables(kv_att, D, ROPE_BASE)
    defines = {**quantize_defines(layout), "HX_D": D, "HX_ATTN_ROPE": 1, "HX_ATTN_Q8_1": 1,
               **attn_early_build(early, T)}
    exe = shim.build(SOURCES, defines, MAIN, f"rope_d{D}_{layout}_early{early}_t{min(T, 2)}{tag}", edit=edit)
    paths = []
    positions = np.arange(pos, pos + T, dtype=np.int32)
    for name, a in (("q", q), ("k", k), ("v", v), ("wq", wq), ("wk", wk), ("pos", positions),
                    ("cos", cos_t), ("sin", sin_t), ("kc", kc.view(np.uint16)), ("vc", vc.view(np.uint16))):
        paths.append(tmp_path / f"{name}.bin")
        np.ascontiguousarray(a).tofile(paths[-1])
    yq_shape = output_shape(T, H * D, layout)
    outs = [tmp_path / f"{n}_{int(fused)}.bin" for n in ("kc", "vc", "dst", "parts", "meta", "yq")]
    run(exe, *paths, H, Hkv, D, repr(float(EPS)), P, kv_att, chunk, int(fused), int(np.prod(yq_shape)),
        int(attention_scale(D).view(np.uint32)), block_threads(D), T, *outs)
    got = {"kc": np.fromfile(outs[0], np.uint16).reshape(kc.shape), "vc": np.fromfile(outs[1], np.uint16).reshape(kc.shape),
           "dst": np.fromfile(outs[2], np.float32).reshape(T, H, D),
           "parts": np.fromfile(outs[3], np.float32).reshape(T, H, P, D),
           "meta": np.fromfile(outs[4], np.float32).reshape(T, H, P, 2), "yq": np.fromfile(outs[5], np.uint8)}
    return got, (q, k, v, wq, wk, kc, vc, cos_t, sin_t, positions)


CASES = [
    # (H, Hkv, D, first position, tokens, P, chunk cells, attended cells, q8_1 layout)
    (16, 8, 128, 40, 1, 1, 128, 256, "Q4_K"),   # the 0.6B's shape on a short cache: one block, q8_1 out
    (2, 1, 128, 0, 1, 1, 128, 256, None),       # the first token: its own cell only
    (4, 1, 128, 300, 1, 3, 128, 512, None),     # GQA 4; the cell in chunk 2 = block 2
    (8, 2, 64, 127, 1, 2, 128, 256, None),      # the last cell of chunk 0 (block 0)
    (4, 4, 64, 128, 1, 2, 128, 256, None),      # the first cell of chunk 1 (block 1), GQA 1
    (8, 2, 128, 273, 1, 2, 256, 512, "Q6_K"),   # a fixed 256-cell split: block 1
    (8, 1, 64, 700, 1, 4, 128, 768, None),      # GQA 8; chunk 5: block 1, which walks chunks 1 and 5
    # verify passes: the pass's cells on both sides of a chunk boundary (blocks 0 and 1 store theirs), 16 tokens
    # at the cache's start, 3 tokens with one block and the q8_1 store
    (4, 2, 64, 125, 6, 2, 128, 256, None),
    (4, 1, 128, 0, 16, 2, 128, 256, None),
    (16, 8, 128, 60, 3, 1, 128, 256, "Q4_K"),
]


def _plan(case):
    H, Hkv, D, pos, T, P, chunk, kv_att, _ = case
    return AttentionPlan("vec", 1, P, chunk_cells=chunk, kv_attended=kv_att, split_cells=chunk if chunk > 128 else None,
                         kv_len=pos + T, n_head=H, n_head_kv=Hkv, n_queries=T, head_dim=D)


@pytest.mark.parametrize("early", sorted(ATTN_EARLY_LEVELS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}x{c[1]}-D{c[2]}-pos{c[3]}-T{c[4]}-P{c[5]}-chunk{c[6]}")
def test_fused_launch_equals_qk_norm_rope_kv_then_attention(shim, tmp_path, case, early):
    layout = case[8]
    fused, inputs = launch(shim, tmp_path, case[:8], True, layout, early=early)
    unfused, _ = launch(shim, tmp_path, case[:8], False, layout)
    for name in ("kc", "vc", "yq"):
        assert np.array_equal(fused[name], unfused[name]), name
    for name in ("dst", "parts", "meta"):
        assert np.array_equal(bits(fused[name]), bits(unfused[name])), name

    # and the emulators: the q/k norms, RoPE and store, then the attention of the plan
    q, k, v, wq, wk, kc, vc, cos_t, sin_t, pos = inputs
    kc, vc = kc.copy(), vc.copy()
    q_roped, _ = emulate_qk_norm_rope_kv(q, k, v, wq, wk, EPS, pos, cos_t, sin_t, kc, vc)
    assert np.array_equal(fused["kc"], kc.view(np.uint16)) and np.array_equal(fused["vc"], vc.view(np.uint16))
    plan = _plan(case)
    if plan.parallel_blocks == 1:
        want = emulate(q_roped, kc, vc, pos, plan)
        assert np.array_equal(bits(fused["dst"]), bits(want))
        assert np.array_equal(fused["yq"], quantize_emulate(want.reshape(want.shape[0], -1), layout).reshape(-1))
    else:
        parts, meta = emulate_partials(q_roped, kc, vc, pos, plan)
        assert np.array_equal(bits(fused["parts"]), bits(parts))
        assert np.array_equal(bits(fused["meta"]), bits(meta))


STORE = "        if (!(stores >> j & 1u)) continue;\n"
V_EARLY = "const int n = k0 + 32 * w + g + 4 * t;\n                    if (FV_PRELOAD_V && first) {"
ROPE_EARLY = "rope_c[j] = tid < half ? cos_table[at] : 0.0f;"
OWN_K, OWN_V = "pre->own_k, n - own_first, own_tokens", "pre->own_v, n - own_first, own_tokens"


@pytest.mark.parametrize("case,early,find,mutant", [
    (CASES[2], 0, STORE, "        continue;\n"),  # no block stores the cell: the NaN reaches the sums
    (CASES[2], 2, STORE, "        continue;\n"),
    # each block stores only its own token's and earlier cells: a later token's cell in its chunk stays NaN,
    # and a masked cell's 0 * v is NaN
    (CASES[7], 0, STORE, "        if (!(stores >> j & 1u) || j > t) continue;\n"),
    (CASES[7], 2, STORE, "        if (!(stores >> j & 1u) || j > t) continue;\n"),
    # the early loads: V loaded from the K phase's cells; every token's k roped at the query's table row
    (CASES[0], 2, V_EARLY, "const int n = k0 + 32 * w + 8 * g + t;\n                    if (FV_PRELOAD_V && first) {"),
    (CASES[7], 1, ROPE_EARLY, "rope_c[j] = tid < half ? cos_table[at_q] : 0.0f;"),
    # the cells loaded before the wait: the token's own cell taken from them (still NaN) instead of from the block's
    # shared copy, for K and for V; one parallel block, and the cell in block 2's first step
    (CASES[0], 3, OWN_K, "pre->own_k, -1, own_tokens"), (CASES[0], 3, OWN_V, "pre->own_v, -1, own_tokens"),
    (CASES[2], 3, OWN_K, "pre->own_k, -1, own_tokens"),
    # a verify pass's cells: all preloaded (NaN), only the last from the shared copy (the one-token rule), or each
    # from the next token's copy; 6 tokens across a chunk boundary, 3 in one block's step. (The shim runs blocks
    # one after another, so only the first block of a step sees the cells still NaN: token 0's, which masks the
    # cells after its own.)
    (CASES[7], 3, OWN_K, "pre->own_k, -1, own_tokens"), (CASES[9], 3, OWN_K, "pre->own_k, n - (kv_len - 1), 1"),
    (CASES[9], 3, OWN_K, "pre->own_k, n - own_first + 1, own_tokens"),
], ids=["no-store", "no-store-early", "earlier-cells-only", "earlier-cells-only-early", "v-early-cells",
        "rope-early-row", "own-k-preloaded", "own-v-preloaded", "own-k-preloaded-P3", "pass-k-preloaded",
        "pass-last-own-only", "pass-next-token-copy"])
def test_a_broken_build_fails_the_comparison(shim, tmp_path, case, early, find, mutant):
    def edit(text):
        assert find in text
        return text.replace(find, mutant)

    broken, _ = launch(shim, tmp_path, case[:8], True, case[8], edit=edit, tag=f"-{len(find)}-{len(mutant)}",
                       early=early)
    unfused, _ = launch(shim, tmp_path, case[:8], False, case[8])
    out = "parts" if case[5] > 1 else "dst"
    assert not np.array_equal(bits(broken[out]), bits(unfused[out]))


def test_the_launch_takes_only_one_query_vector_plans():
    shared = AttentionPlan("vec", 4, 2, kv_attended=512, shared_kv=True, kv_len=300, n_head=8, n_head_kv=2,
                           n_queries=4, head_dim=128)
    wide = AttentionPlan("vec", 1, 2, kv_attended=512, kv_len=300, n_head=8, n_head_kv=2, n_queries=17, head_dim=128)
    assert rope_attention_runs(_plan(CASES[2])) and rope_attention_runs(_plan(CASES[8]))
    assert not rope_attention_runs(shared) and not rope_attention_runs(wide)
    with pytest.raises(ValueError, match=ATTN_ROPE_KERNEL):
        launch_rope_attention(*[None] * 11, shared, None, None, None)


class _Cache:
    def k(self, layer):
        return np.zeros((256, 2, 64), np.float16)

    v = k


@pytest.mark.parametrize("limit,T,shared,P,attn_q8_1,fused", [
    (16, 1, False, 1, True, True), (16, 1, False, 3, True, True), (16, 1, False, 3, False, True),
    (16, 3, False, 2, True, True),    # a verify pass on a short cache: the one-query kernel too
    (1, 1, False, 1, True, True),     # the default: one-token passes
    (1, 3, False, 2, True, False),    # the default: not a verify pass (measured slower there)
    (16, 1, False, 1, False, False),  # one block without the q8_1 epilogue: the unfused kernels
    (16, 3, True, 1, True, False),    # queries sharing K/V loads (a long cache): the unfused kernels
    (16, 17, False, 2, True, False),  # past the 16 tokens the fused kernel takes
    (0, 1, False, 1, True, False)])   # HIRAISHIN_ATTN_ROPE=0
def test_the_cuda_ops_take_the_fused_launch_where_it_runs(monkeypatch, limit, T, shared, P, attn_q8_1, fused):
    """``CudaOps.rope_attention_matvec`` (host logic, no GPU): the fused launch for a pass of at most ``limit``
    tokens (``HIRAISHIN_ATTN_ROPE``) whose plan is the one-query vector kernel's (the combine behind it when
    P > 1), else the two ops."""
    from hiraishin.backends import cuda as cuda_backend
    from hiraishin.backends import cuda_attention
    from hiraishin.kernels.fused import launch as fused_launch

    monkeypatch.setattr(fused_launch, "ATTN_ROPE_TOKENS", limit)
    monkeypatch.setattr(fused_launch, "ATTN_Q8_1", attn_q8_1)
    calls = []
    monkeypatch.setattr(cuda_attention, "launch_rope_attention", lambda *a: calls.append("rope_attention"))
    monkeypatch.setattr(cuda_attention, "launch_combine_q8_1", lambda *a: calls.append("combine"))
    ops = object.__new__(cuda_backend.CudaOps)
    plan = AttentionPlan("vec", 4 if shared else 1, P, kv_attended=512, shared_kv=shared, kv_len=300, n_head=4,
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


@pytest.mark.parametrize("text,want", [("", 4), ("0", 0), ("1", 1), ("16", 16), ("17", None), ("yes", None),
                                       ("-1", None)])
def test_the_fused_attention_limit_from_the_environment(monkeypatch, text, want):
    from hiraishin.kernels.fused import launch as fused_launch

    monkeypatch.setenv(fused_launch.ENV_ATTN_ROPE, text)
    if want is None:
        with pytest.raises(ValueError, match=fused_launch.ENV_ATTN_ROPE):
            fused_launch._rope_tokens_from_env()
    else:
        assert fused_launch._rope_tokens_from_env() == want


@pytest.mark.parametrize("text,want", [(None, 3), ("0", 0), ("1", 1), (" 2 ", 2), ("3", 3), ("4", None), ("early", None),
                                       ("", 3)])
def test_the_early_loads_level_from_the_environment(monkeypatch, text, want):
    from hiraishin.kernels.fused import launch as fused_launch

    if text is None:
        monkeypatch.delenv(fused_launch.ENV_ATTN_EARLY, raising=False)
    else:
        monkeypatch.setenv(fused_launch.ENV_ATTN_EARLY, text)
    if want is None:
        with pytest.raises(ValueError, match=fused_launch.ENV_ATTN_EARLY):
            fused_launch._attn_early_from_env()
    else:
        assert fused_launch._attn_early_from_env() == want


@pytest.mark.parametrize("trigger,tokens,want", [("after_wait", 1, 3), ("after_wait", 2, 3), ("after_wait", 16, 3),
                                                  ("early", 1, 2), ("early", 3, 2)])
def test_cache_loads_before_the_wait_only_where_they_are_sound(monkeypatch, trigger, tokens, want):
    """Level 3 reads cache cells before the PDL wait: only while every kernel lets its dependents launch after its
    own wait (HIRAISHIN_PDL_TRIGGER=after_wait), in a build for the pass's width; level 2's build otherwise."""
    from hiraishin.kernels.pdl import ENV_PDL_TRIGGER

    monkeypatch.setenv(ENV_PDL_TRIGGER, trigger)
    width = {"FV_ROPE_MAX_TOKENS": tokens} if want == 3 else {}
    assert attn_early_build(3, tokens) == {**ATTN_EARLY_LEVELS[want], **width}
    assert attn_early_build(2, tokens) == ATTN_EARLY_LEVELS[2]
