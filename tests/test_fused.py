"""The fused kernels' CUDA source == their emulators == the unfused kernels' sources, bit for bit (CPU).

``fused.cu`` and the unfused kernels it replaces (``rmsnorm.cu``, ``quantize_q8_1.cu``,
``elementwise.cu``, ``rope.cu``) are compiled with g++ against the CUDA shim (tests/cuda_shim.py)
and run on the same inputs; the fused outputs must equal both the unfused sequence's outputs and
the emulators (hiraishin.kernels.fused.emulate), byte for byte. Shapes are awkward on purpose:
row counts not a multiple of anything, n = 1024 and 4096 (1024-thread blocks), n = 800 (256
threads, 25 q8_1 blocks: not a multiple of the 8 warps), every q8_1 layout, zero blocks, values
on rounding ties, RoPE positions at the end of the table, and an f16 overflow into the KV cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, MAIN_QUANTIZE, ShimBuilder, bits, run

from hiraishin.kernels.fused.emulate import (
    emulate_add_rms_norm_q8_1,
    emulate_embed_rms_norm_q8_1,
    emulate_qk_norm_rope_kv,
    emulate_rms_norm_q8_1,
    emulate_swiglu_q8_1,
)
from hiraishin.kernels.fused.launch import EMBED_NORM_KERNELS, SOURCE, SOURCE_EMBED, norm_geometry, norm_slices
from hiraishin.kernels.quantize.launch import output_shape, quantize_defines
from hiraishin.kernels.quantize.layout import LAYOUT_COLUMN_GROUP, mma8_columns
from hiraishin.kernels.rmsnorm.emulate import block_threads
from hiraishin.kernels.rope.emulate import rope_tables

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

EPS = np.float32(1e-6)  # Qwen3's rms_eps as stored in its GGUF (float32)
ROPE_BASE = 1e6  # Qwen3's rope_freq_base
EPS_ARG = repr(float(EPS))  # the shim reads it with strtof: the same float32

# C++ mains; "-" as an optional output path passes a null pointer.
_OPT = "static float* hx_opt(const char* a, std::vector<float>& v) { return a[0] == '-' ? nullptr : v.data(); }\n"
_OPT_WRITE = "static void hx_opt_write(const char* a, std::vector<float>& v) { if (a[0] != '-') hx_write(a, v.data(), v.size() * 4); }\n"

# a second q8_1 output (the norm kernels' yq2): its byte count and path, "0 -" for none
_Q2 = r'''
static unsigned char* hx_q2(const char* bytes, std::vector<unsigned char>& v) {
    v.assign((size_t)atoll(bytes), 0xEF); return v.empty() ? nullptr : v.data(); }
static void hx_q2_write(const char* a, std::vector<unsigned char>& v) { if (a[0] != '-') hx_write(a, v.data(), v.size()); }
'''

MAIN_RMS_Q8 = _OPT + _OPT_WRITE + _Q2 + r'''
int main(int argc, char** argv) {
    // argv: x, w, rows, n, eps, q bytes, out q, out y ("-": none), threads, q2 bytes, out q2 ("-": none)[, slices]
    int rows = atoi(argv[3]), n = atoi(argv[4]), nt = atoi(argv[9]); float eps = strtof(argv[5], nullptr);
    unsigned slices = argc > 12 ? (unsigned)atoi(argv[12]) : 1;
    auto x = hx_read(argv[1]); auto w = hx_read(argv[2]);
    std::vector<unsigned char> q((size_t)atoll(argv[6]), 0xAB), q2; std::vector<float> y((size_t)rows * n, -12345.0f);
    float* yp = hx_opt(argv[8], y);
    unsigned char* q2p = hx_q2(argv[10], q2);
    hx_launch({slices, (unsigned)rows, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_rms_norm_q8_1((const float*)x.data(), (const float*)w.data(), q.data(), yp, q2p, n, eps); });
    hx_write(argv[7], q.data(), q.size()); hx_opt_write(argv[8], y); hx_q2_write(argv[11], q2);
}'''

MAIN_ADD_RMS_Q8 = _OPT + _OPT_WRITE + _Q2 + r'''
int main(int argc, char** argv) {
    // argv: a, b, w, rows, n, eps, q bytes, out s, out q, out y ("-": none), threads, q2 bytes, out q2 ("-": none)[, slices]
    int rows = atoi(argv[4]), n = atoi(argv[5]), nt = atoi(argv[11]); float eps = strtof(argv[6], nullptr);
    unsigned slices = argc > 14 ? (unsigned)atoi(argv[14]) : 1;
    auto a = hx_read(argv[1]); auto b = hx_read(argv[2]); auto w = hx_read(argv[3]);
    std::vector<unsigned char> q((size_t)atoll(argv[7]), 0xAB), q2;
    std::vector<float> s((size_t)rows * n, -12345.0f), y((size_t)rows * n, -12345.0f);
    float* yp = hx_opt(argv[10], y);
    unsigned char* q2p = hx_q2(argv[12], q2);
    hx_launch({slices, (unsigned)rows, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_add_rms_norm_q8_1((const float*)a.data(), (const float*)b.data(), (const float*)w.data(),
                                         s.data(), q.data(), yp, q2p, n, eps); });
    hx_write(argv[8], s.data(), s.size() * 4); hx_write(argv[9], q.data(), q.size()); hx_opt_write(argv[10], y);
    hx_q2_write(argv[13], q2);
}'''

MAIN_EMBED_RMS_Q8 = _OPT + _OPT_WRITE + _Q2 + r'''
int main(int argc, char** argv) {
    // argv: table, int32 ids, rows, n, row bytes, w, eps, q bytes, out s, out q, out y ("-": none), threads, slices;
    // HX_SHIM_KERNEL names the kernel
    int rows = atoi(argv[3]), n = atoi(argv[4]), nt = atoi(argv[12]); float eps = strtof(argv[7], nullptr);
    long long row_bytes = atoll(argv[5]); unsigned slices = (unsigned)atoi(argv[13]);
    auto table = hx_read(argv[1]); auto ids = hx_read(argv[2]); auto w = hx_read(argv[6]);
    std::vector<unsigned char> q((size_t)atoll(argv[8]), 0xAB), q2;
    std::vector<float> s((size_t)rows * n, -12345.0f), y((size_t)rows * n, -12345.0f);
    float* yp = hx_opt(argv[11], y);
    hx_launch({slices, (unsigned)rows, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL(table.data(), (const int*)ids.data(), row_bytes, (const float*)w.data(), s.data(),
                                   q.data(), yp, nullptr, n, eps); });
    hx_write(argv[9], s.data(), s.size() * 4); hx_write(argv[10], q.data(), q.size()); hx_opt_write(argv[11], y);
}'''

MAIN_SWIGLU_Q8 = _OPT + _OPT_WRITE + r'''
int main(int argc, char** argv) {
    // argv: g, u, rows, k, q bytes, out q, out m ("-": none); the quantize launch: 8 warps per block
    int rows = atoi(argv[3]), k = atoi(argv[4]);
    auto g = hx_read(argv[1]); auto u = hx_read(argv[2]);
    std::vector<unsigned char> q((size_t)atoll(argv[5]), 0xAB); std::vector<float> m((size_t)rows * k, -12345.0f);
    float* mp = hx_opt(argv[7], m);
    hx_launch({(unsigned)((k / 32 + 7) / 8), (unsigned)rows, 1}, {256, 1, 1}, 0,
              [&] { hx_swiglu_q8_1((const float*)g.data(), (const float*)u.data(), q.data(), mp, k); });
    hx_write(argv[6], q.data(), q.size()); hx_opt_write(argv[7], m);
}'''

MAIN_QK = _OPT + _OPT_WRITE + r'''
int main(int argc, char** argv) {
    // argv: q, k, v, wq, wk, pos, cos, sin, T, H, Hkv, D, eps, threads, k cache, v cache (in/out),
    //       out q, out k ("-": none)
    int T = atoi(argv[9]), H = atoi(argv[10]), Hkv = atoi(argv[11]), D = atoi(argv[12]), nt = atoi(argv[14]);
    float eps = strtof(argv[13], nullptr);
    auto q = hx_read(argv[1]); auto k = hx_read(argv[2]); auto v = hx_read(argv[3]);
    auto wq = hx_read(argv[4]); auto wk = hx_read(argv[5]); auto pos = hx_read(argv[6]);
    auto cs = hx_read(argv[7]); auto sn = hx_read(argv[8]);
    auto kc = hx_read(argv[15]); auto vc = hx_read(argv[16]);
    size_t cache_bytes = kc.size() - 64;  // hx_read pads by 64 bytes
    std::vector<float> qo((size_t)T * H * D, -12345.0f), ko((size_t)T * Hkv * D, -12345.0f);
    float* kp = hx_opt(argv[18], ko);
    hx_launch({(unsigned)(T * (H + 2 * Hkv)), 1, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_qk_norm_rope_kv((const float*)q.data(), (const float*)k.data(), (const float*)v.data(),
                                       (const float*)wq.data(), (const float*)wk.data(), (const int*)pos.data(),
                                       (const float*)cs.data(), (const float*)sn.data(), qo.data(), kp,
                                       (unsigned short*)kc.data(), (unsigned short*)vc.data(), H, Hkv, D, eps); });
    hx_write(argv[15], kc.data(), cache_bytes); hx_write(argv[16], vc.data(), cache_bytes);
    hx_write(argv[17], qo.data(), qo.size() * 4); hx_opt_write(argv[18], ko);
}'''

# The unfused kernels, launched as their launchers launch them.
MAIN_RMS = r'''
int main(int argc, char** argv) {
    // argv: x, w, rows, n, eps, out, threads
    int rows = atoi(argv[3]), n = atoi(argv[4]), nt = atoi(argv[7]); float eps = strtof(argv[5], nullptr);
    auto x = hx_read(argv[1]); auto w = hx_read(argv[2]);
    std::vector<float> y((size_t)rows * n, -12345.0f);
    hx_launch({(unsigned)rows, 1, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_rms_norm_f32((const float*)x.data(), (const float*)w.data(), y.data(), n, eps); });
    hx_write(argv[6], y.data(), y.size() * 4);
}'''

MAIN_BINARY = r'''
int main(int argc, char** argv) {
    // argv: a, b, n, out (elementwise launch: 256 threads per block)
    long long n = atoll(argv[3]);
    auto a = hx_read(argv[1]); auto b = hx_read(argv[2]);
    std::vector<float> out(n, -12345.0f);
    hx_launch({(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL((const float*)a.data(), (const float*)b.data(), out.data(), n); });
    hx_write(argv[4], out.data(), out.size() * 4);
}'''

MAIN_ROPE = r'''
int main(int argc, char** argv) {
    // argv: x, pos, cos, sin, T, H, D, out (rope launch: one block per (token, head), D/2 threads)
    int T = atoi(argv[5]), H = atoi(argv[6]), D = atoi(argv[7]);
    auto x = hx_read(argv[1]); auto pos = hx_read(argv[2]); auto cs = hx_read(argv[3]); auto sn = hx_read(argv[4]);
    std::vector<float> y((size_t)T * H * D, -12345.0f);
    hx_launch({(unsigned)(T * H), 1, 1}, {(unsigned)(D / 2), 1, 1}, 0,
              [&] { hx_rope_neox_f32((const float*)x.data(), y.data(), (const int*)pos.data(), (const float*)cs.data(),
                                     (const float*)sn.data(), H, D); });
    hx_write(argv[8], y.data(), y.size() * 4);
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("fused-shim"))


class Files:
    """Writes arrays to ``folder`` and reads outputs back."""

    def __init__(self, folder):
        self.folder = folder

    def put(self, name, a):
        p = self.folder / name
        np.ascontiguousarray(a).tofile(p)
        return p

    def path(self, name):
        return self.folder / name

    def get(self, name, dtype, shape):
        return np.fromfile(self.folder / name, dtype).reshape(shape)


def _activations(rng, rows, n, scale=3.0):
    """float32 (rows, n) with a zero q8_1 block, a block of rounding ties, and large values."""
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    x[0, :32] = 0.0
    if rows > 1:
        x[1, 32:40] = [127.0, 63.5, -63.5, 2.5, -2.5, 0.5, -0.5, 1.5]
        x[-1, -32:] *= 1000.0
    return x


def _unfused_rms_q8(shim, f, x, w, layout, tag):
    """rmsnorm.cu then quantize_q8_1.cu through the shim: (q bytes, normed floats)."""
    rows, n = x.shape
    xp, wp = f.put(f"{tag}x.bin", x), f.put(f"{tag}w.bin", w)
    run(shim.build("rmsnorm/rmsnorm.cu", {}, MAIN_RMS, "rmsnorm"), xp, wp, rows, n, EPS_ARG,
        f.path(f"{tag}uy.bin"), block_threads(n))
    y = f.get(f"{tag}uy.bin", np.float32, (rows, n))
    qshape = output_shape(rows, n, layout)
    run(shim.build("quantize/quantize_q8_1.cu", quantize_defines(layout), MAIN_QUANTIZE, "quantize"),
        f.path(f"{tag}uy.bin"), rows, n, f.path(f"{tag}uq.bin"), qshape[0] * qshape[1])
    return f.get(f"{tag}uq.bin", np.uint8, qshape), y


def _real(q, layout, rows):
    """The bytes of the ``rows`` real columns (an interleaving layout's padding columns are not written)."""
    return mma8_columns(q, rows) if layout in LAYOUT_COLUMN_GROUP else q


# (rows, n, layouts): 1024 and 4096 (1024 threads), 800 (not a multiple of 256: llama.cpp's layout only);
# the interleaved MMA8 layouts for one group of columns and for two (9 rows: the second holds one).
NORM_CASES = [(3, 1024, (None, "Q4_K", "Q6_K", "MMA_Q4_K", "MMA_Q6_K", "MMA8_Q4_K")), (1, 4096, ("Q4_K", "Q6_K", "MMA_Q6_K")),
              (5, 800, (None,)), (9, 256, ("MMA8_Q4_K", "MMA8_Q6_K"))]


@pytest.mark.parametrize("rows,n,layouts", NORM_CASES)
def test_rms_norm_q8_1_source_equals_unfused_and_emulator(shim, tmp_path, rows, n, layouts):
    f = Files(tmp_path)
    rng = np.random.default_rng(n + rows)
    x = _activations(rng, rows, n)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    for layout in layouts:
        uq, uy = _unfused_rms_q8(shim, f, x, w, layout, "u")
        eq, ey = emulate_rms_norm_q8_1(x, w, EPS, layout)
        exe = shim.build(SOURCE, quantize_defines(layout), MAIN_RMS_Q8, "rms_q8")
        # the null pointer once; CUDA blocks per row: the launcher's, one, and three (no bit depends on it)
        for with_y, slices in [(True, norm_slices(n)), (False, 1), (True, 3)] if layout is None else \
                [(True, norm_slices(n)), (True, 1), (True, 3)]:
            run(exe, f.put("x.bin", x), f.put("w.bin", w), rows, n, EPS_ARG, uq.size, f.path("q.bin"),
                f.path("y.bin") if with_y else "-", block_threads(n), 0, "-", slices)
            got_q = _real(f.get("q.bin", np.uint8, uq.shape), layout, rows)
            np.testing.assert_array_equal(got_q, _real(uq, layout, rows), err_msg=f"fused vs unfused q8_1, layout {layout}")
            np.testing.assert_array_equal(got_q, _real(eq, layout, rows), err_msg=f"fused vs emulator q8_1, layout {layout}")
            if with_y:
                got_y = f.get("y.bin", np.float32, (rows, n))
                np.testing.assert_array_equal(bits(got_y), bits(uy))
                np.testing.assert_array_equal(bits(got_y), bits(ey))


@pytest.mark.parametrize("rows,n,layout", [(3, 1024, "Q4_K"), (1, 4096, "Q6_K"), (5, 800, None)])
def test_add_rms_norm_q8_1_source_equals_unfused_and_emulator(shim, tmp_path, rows, n, layout):
    f = Files(tmp_path)
    rng = np.random.default_rng(10 * n + rows)
    a = _activations(rng, rows, n)
    b = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    b[0, :32] = -a[0, :32]  # a zero block of s
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    # unfused: hx_add_f32, then rmsnorm + quantize
    run(shim.build("elementwise/elementwise.cu", {"HX_SHIM_KERNEL": "hx_add_f32"}, MAIN_BINARY, "add"),
        f.put("a.bin", a), f.put("b.bin", b), a.size, f.path("us.bin"))
    us = f.get("us.bin", np.float32, (rows, n))
    uq, uy = _unfused_rms_q8(shim, f, us, w, layout, "u")
    es, eq, ey = emulate_add_rms_norm_q8_1(a, b, w, EPS, layout)
    for slices in sorted({1, 3, norm_slices(n)}):  # CUDA blocks per row: no bit depends on it
        run(shim.build(SOURCE, quantize_defines(layout), MAIN_ADD_RMS_Q8, "add_rms_q8"), f.path("a.bin"),
            f.path("b.bin"), f.put("w.bin", w), rows, n, EPS_ARG, uq.size, f.path("s.bin"), f.path("q.bin"),
            f.path("y.bin"), block_threads(n), 0, "-", slices)
        got_s, got_q = f.get("s.bin", np.float32, (rows, n)), f.get("q.bin", np.uint8, uq.shape)
        got_y = f.get("y.bin", np.float32, (rows, n))
        for want_s, want_q, want_y in ((us, uq, uy), (es, eq, ey)):
            np.testing.assert_array_equal(bits(got_s), bits(want_s), err_msg=f"{slices} blocks per row")
            np.testing.assert_array_equal(got_q, want_q, err_msg=f"{slices} blocks per row")
            np.testing.assert_array_equal(bits(got_y), bits(want_y), err_msg=f"{slices} blocks per row")


def _norm_case(rng, rows: int, n: int, layout):
    """Inputs (a, b, w) of the norm kernels and the emulators' outputs: (s, q, y) of the add + norm,
    (q, y) of the norm of a."""
    a = _activations(rng, rows, n)
    b = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    return (a, b, w), emulate_add_rms_norm_q8_1(a, b, w, EPS, layout), emulate_rms_norm_q8_1(a, w, EPS, layout)


def _check_norm_kernels(f, add_exe, rms_exe, inputs, want_add, want_rms, threads, slices, msg):
    """The add + norm and the norm kernel (built executables) on ``inputs`` (a, b, w) in blocks of
    ``threads`` threads, ``slices`` per row: their s, q8_1 and normed rows equal ``want_add`` (s, q, y) and
    ``want_rms`` (q, y of the norm of a)."""
    a, b, w = inputs
    (es, eq, ey), (rq, ry) = want_add, want_rms
    rows, n = a.shape
    run(add_exe, f.put("a.bin", a), f.put("b.bin", b), f.put("w.bin", w), rows, n, EPS_ARG, eq.size,
        f.path("s.bin"), f.path("q.bin"), f.path("y.bin"), threads, 0, "-", slices)
    np.testing.assert_array_equal(bits(f.get("s.bin", np.float32, (rows, n))), bits(es), err_msg=msg)
    np.testing.assert_array_equal(f.get("q.bin", np.uint8, eq.shape), eq, err_msg=msg)
    np.testing.assert_array_equal(bits(f.get("y.bin", np.float32, (rows, n))), bits(ey), err_msg=msg)
    run(rms_exe, f.path("a.bin"), f.path("w.bin"), rows, n, EPS_ARG, rq.size, f.path("q.bin"), f.path("y.bin"),
        threads, 0, "-", slices)
    np.testing.assert_array_equal(f.get("q.bin", np.uint8, rq.shape), rq, err_msg=msg)
    np.testing.assert_array_equal(bits(f.get("y.bin", np.float32, (rows, n))), bits(ry), err_msg=msg)


@pytest.mark.parametrize("rows,n,layout", [(3, 1024, "Q4_K"), (1, 4096, "Q6_K"), (2, 800, None)])
def test_norm_kernels_in_blocks_smaller_than_their_tree(shim, tmp_path, rows, n, layout):
    """hx_norm_played (HX_NORM_PER real-thread blocks of rmsnorm's tree): the unfused bits at every
    block size and slice count."""
    f = Files(tmp_path)
    inputs, want_add, want_rms = _norm_case(np.random.default_rng(7 * n + rows), rows, n, layout)
    tree = block_threads(n)
    vals = -(-n // tree)
    for per in sorted({2, 8, norm_geometry(n)[1]} - {1}):  # and the launcher's, where it plays the tree
        defines = {**quantize_defines(layout), "HX_NORM_PER": per, "HX_NORM_VALS": vals}
        add_exe = shim.build(SOURCE, defines, MAIN_ADD_RMS_Q8, "add_rms_q8_played")
        rms_exe = shim.build(SOURCE, defines, MAIN_RMS_Q8, "rms_q8_played")
        for slices in sorted({1, 3, per * vals}):
            _check_norm_kernels(f, add_exe, rms_exe, inputs, want_add, want_rms, tree // per, slices,
                                f"{tree // per} threads playing {tree}, {slices} blocks per row")


@pytest.mark.parametrize("rows,n,layout,per", [(3, 1024, "Q4_K", 4), (2, 1024, None, 1), (1, 4096, "Q6_K", 1),
                                                (2, 800, None, 1)])
def test_norm_kernels_with_weights_read_before_the_wait(shim, tmp_path, rows, n, layout, per):
    """HX_NORM_W_EARLY (each thread's norm weights read before its wait): the emulator's bits, in the
    tree's own block and in a played one (per > 1), at one, three and the launcher's blocks per row."""
    f = Files(tmp_path)
    inputs, want_add, want_rms = _norm_case(np.random.default_rng(11 * n + rows), rows, n, layout)
    tree = block_threads(n)
    defines = {**quantize_defines(layout), "HX_NORM_W_EARLY": 1}
    if per > 1:
        defines.update(HX_NORM_PER=per, HX_NORM_VALS=-(-n // tree))
    add_exe = shim.build(SOURCE, defines, MAIN_ADD_RMS_Q8, "add_rms_q8_early")
    rms_exe = shim.build(SOURCE, defines, MAIN_RMS_Q8, "rms_q8_early")
    for slices in sorted({1, 3, norm_slices(n) if per == 1 else per}):
        _check_norm_kernels(f, add_exe, rms_exe, inputs, want_add, want_rms, tree // per, slices,
                            f"{tree // per} threads, {slices} blocks per row")


def test_norm_geometry_plays_the_tree_only_for_one_value_per_tree_thread():
    # Qwen3-0.6B's 1024 values: 256 threads playing the 1024-thread tree, one q8_1 block per warp
    assert norm_geometry(1024) == (256, 4, 1) and norm_slices(1024) == 4
    # Qwen3-8B's 4096 (four values per tree thread: slower played, on the H200) and short rows
    assert norm_geometry(4096) == (1024, 1, 0) and norm_slices(4096) == 4
    assert norm_geometry(800) == (block_threads(800), 1, 0)


def _second_layout_defines(layout, layout2):
    second = quantize_defines(layout2)
    return {**quantize_defines(layout), "HX_LAYOUT2": second["HX_LAYOUT"], "HX_LAYOUT2_BYTES": second["HX_LAYOUT_BYTES"]}


# (rows, n, first layout, second layout): Q/K's layout with V's (Qwen3 Q4_K_M), and the reverse
@pytest.mark.parametrize("rows,n,layout,layout2", [(3, 1024, "Q4_K", "Q6_K"), (1, 4096, "Q6_K", "Q4_K"),
                                                   (2, 1024, None, "Q6_K"), (2, 1024, "MMA_Q4_K", "MMA_Q6_K")])
def test_norm_kernels_write_a_second_layout_equal_to_its_own_quantize(shim, tmp_path, rows, n, layout, layout2):
    f = Files(tmp_path)
    rng = np.random.default_rng(3 * n + rows)
    a = _activations(rng, rows, n)
    b = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    defines = _second_layout_defines(layout, layout2)
    q1_bytes = int(np.prod(output_shape(rows, n, layout)))
    q2_shape = output_shape(rows, n, layout2)
    # rms_norm_q8_1 of a: both layouts against the unfused kernels and the emulator
    uq, _ = _unfused_rms_q8(shim, f, a, w, layout, "u")
    uq2, _ = _unfused_rms_q8(shim, f, a, w, layout2, "v")
    run(shim.build(SOURCE, defines, MAIN_RMS_Q8, "rms_q8_two"), f.put("x.bin", a), f.put("w.bin", w), rows, n,
        EPS_ARG, q1_bytes, f.path("q.bin"), "-", block_threads(n), uq2.size, f.path("q2.bin"), norm_slices(n))
    eq2, _ = emulate_rms_norm_q8_1(a, w, EPS, layout2)
    np.testing.assert_array_equal(f.get("q.bin", np.uint8, uq.shape), uq, err_msg="first layout")
    np.testing.assert_array_equal(f.get("q2.bin", np.uint8, q2_shape), uq2, err_msg="second layout vs quantize")
    np.testing.assert_array_equal(f.get("q2.bin", np.uint8, q2_shape), eq2, err_msg="second layout vs emulator")
    # add_rms_norm_q8_1 of (a, b): the second layout of s's norm
    es, eq, _ = emulate_add_rms_norm_q8_1(a, b, w, EPS, layout)
    _, eq2, _ = emulate_add_rms_norm_q8_1(a, b, w, EPS, layout2)
    run(shim.build(SOURCE, defines, MAIN_ADD_RMS_Q8, "add_rms_q8_two"), f.path("x.bin"), f.put("b.bin", b),
        f.path("w.bin"), rows, n, EPS_ARG, q1_bytes, f.path("s.bin"), f.path("q.bin"), "-", block_threads(n),
        uq2.size, f.path("q2.bin"), norm_slices(n))
    np.testing.assert_array_equal(bits(f.get("s.bin", np.float32, (rows, n))), bits(es))
    np.testing.assert_array_equal(f.get("q.bin", np.uint8, eq.shape), eq)
    np.testing.assert_array_equal(f.get("q2.bin", np.uint8, q2_shape), eq2)


# (rows, k, layouts): 800 = 25 q8_1 blocks (a partial CUDA block of warps); 768 = 24 (3 super-blocks).
SWIGLU_CASES = [(3, 800, (None,)), (2, 768, ("Q4_K", "Q6_K"))]


@pytest.mark.parametrize("rows,k,layouts", SWIGLU_CASES)
def test_swiglu_q8_1_source_equals_unfused_and_emulator(shim, tmp_path, rows, k, layouts):
    f = Files(tmp_path)
    rng = np.random.default_rng(20 * k + rows)
    g = (rng.standard_normal((rows, k)) * 6).astype(np.float32)
    g[0, :4] = [-100.0, -88.5, 88.5, 1e30]  # exp() under- and overflow
    u = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
    u[0, 32:64] = 0.0  # a zero block of m
    run(shim.build("elementwise/elementwise.cu", {"HX_SHIM_KERNEL": "hx_swiglu_f32"}, MAIN_BINARY, "swiglu"),
        f.put("g.bin", g), f.put("u.bin", u), g.size, f.path("um.bin"))
    um = f.get("um.bin", np.float32, (rows, k))
    for layout in layouts:
        qshape = output_shape(rows, k, layout)
        run(shim.build("quantize/quantize_q8_1.cu", quantize_defines(layout), MAIN_QUANTIZE, "quantize"),
            f.path("um.bin"), rows, k, f.path("uq.bin"), qshape[0] * qshape[1])
        uq = f.get("uq.bin", np.uint8, qshape)
        eq, em = emulate_swiglu_q8_1(g, u, layout)
        run(shim.build(SOURCE, quantize_defines(layout), MAIN_SWIGLU_Q8, "swiglu_q8"), f.path("g.bin"),
            f.path("u.bin"), rows, k, uq.size, f.path("q.bin"), f.path("m.bin"))
        got_q, got_m = f.get("q.bin", np.uint8, qshape), f.get("m.bin", np.float32, (rows, k))
        np.testing.assert_array_equal(got_q, uq, err_msg=f"layout {layout}")
        np.testing.assert_array_equal(got_q, eq, err_msg=f"layout {layout}")
        np.testing.assert_array_equal(bits(got_m), bits(um))
        np.testing.assert_array_equal(bits(got_m), bits(em))


# (T, H, Hkv, D, positions, n_ctx): the last cells of the RoPE table, out of order; a one-token step.
QK_CASES = [(3, 4, 2, 128, [61, 63, 62], 64), (1, 2, 1, 64, [40], 41), (2, 16, 8, 128, [0, 255], 256)]


@pytest.mark.parametrize("T,H,Hkv,D,positions,n_ctx", QK_CASES)
def test_qk_norm_rope_kv_source_equals_unfused_and_emulator(shim, tmp_path, T, H, Hkv, D, positions, n_ctx):
    f = Files(tmp_path)
    rng = np.random.default_rng(T * 100 + D)
    q = (rng.standard_normal((T, H, D)) * 4).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, D)) * 4).astype(np.float32)
    v = (rng.standard_normal((T, Hkv, D)) * 3).astype(np.float32)
    v[0, 0, :3] = [1e5, -7e4, 65519.0]  # beyond the f16 range: +-inf; a rounding tie at the top
    wq = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    wk = (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    wk[:4] *= 1e6  # k beyond the f16 range after the norm
    pos = np.array(positions, np.int32)
    cos_t, sin_t = rope_tables(n_ctx, D, ROPE_BASE)
    cache0 = rng.integers(0, 0x7C00, (n_ctx, Hkv, D), dtype=np.uint16).view(np.float16)  # stale cells
    nt = block_threads(D)

    # unfused: rmsnorm of the q and k heads, rope of both, the f16 cast into the cells (KVCache.write)
    run(shim.build("rmsnorm/rmsnorm.cu", {}, MAIN_RMS, "rmsnorm"), f.put("q.bin", q), f.put("wq.bin", wq),
        T * H, D, EPS_ARG, f.path("uqn.bin"), nt)
    run(shim.build("rmsnorm/rmsnorm.cu", {}, MAIN_RMS, "rmsnorm"), f.put("k.bin", k), f.put("wk.bin", wk),
        T * Hkv, D, EPS_ARG, f.path("ukn.bin"), nt)
    rope = shim.build("rope/rope.cu", {}, MAIN_ROPE, "rope")
    args = (f.put("pos.bin", pos), f.put("cos.bin", cos_t), f.put("sin.bin", sin_t))
    run(rope, f.path("uqn.bin"), *args, T, H, D, f.path("uq.bin"))
    run(rope, f.path("ukn.bin"), *args, T, Hkv, D, f.path("uk.bin"))
    uq, uk = f.get("uq.bin", np.float32, (T, H, D)), f.get("uk.bin", np.float32, (T, Hkv, D))
    ukc, uvc = cache0.copy(), cache0.copy()
    with np.errstate(over="ignore"):
        ukc[pos], uvc[pos] = uk.astype(np.float16), v.astype(np.float16)

    ekc, evc = cache0.copy(), cache0.copy()
    eq, ek = emulate_qk_norm_rope_kv(q, k, v, wq, wk, EPS, pos, cos_t, sin_t, ekc, evc)

    exe = shim.build(SOURCE, {}, MAIN_QK, "qk")
    for with_k in (True, False):
        run(exe, f.path("q.bin"), f.path("k.bin"), f.put("v.bin", v), f.path("wq.bin"), f.path("wk.bin"), *args,
            T, H, Hkv, D, EPS_ARG, nt, f.put("kc.bin", cache0), f.put("vc.bin", cache0), f.path("oq.bin"),
            f.path("ok.bin") if with_k else "-")
        got_q = f.get("oq.bin", np.float32, (T, H, D))
        got_kc = f.get("kc.bin", np.uint16, cache0.shape)
        got_vc = f.get("vc.bin", np.uint16, cache0.shape)
        for want_q, want_kc, want_vc in ((uq, ukc, uvc), (eq, ekc, evc)):
            np.testing.assert_array_equal(bits(got_q), bits(want_q))
            np.testing.assert_array_equal(got_kc, want_kc.view(np.uint16))  # untouched cells too
            np.testing.assert_array_equal(got_vc, want_vc.view(np.uint16))
        if with_k:
            got_k = f.get("ok.bin", np.float32, (T, Hkv, D))
            np.testing.assert_array_equal(bits(got_k), bits(uk))
            np.testing.assert_array_equal(bits(got_k), bits(ek))
    assert np.isinf(ekc[pos].astype(np.float32)).any() and np.isinf(evc[pos].astype(np.float32)).any()


# ---- attention combine + q8_1 (fattn_vec.cu fattn_combine_q8_1, compiled after quantize_q8_1.cu)

MAIN_COMBINE_Q8 = _OPT + _OPT_WRITE + r'''
int main(int argc, char** argv) {
    // argv: parts, meta, T, H, P, q bytes, out q fused, out o fused ("-": none), out q unfused, out o unfused
    int T = atoi(argv[3]), H = atoi(argv[4]), P = atoi(argv[5]);
    auto parts = hx_read(argv[1]); auto meta = hx_read(argv[2]);
    const size_t nq = (size_t)atoll(argv[6]), no = (size_t)T * H * HX_D;
    std::vector<unsigned char> q((size_t)nq, 0xAB), q2((size_t)nq, 0xCD);
    std::vector<float> o(no, -12345.0f), o2(no, -54321.0f);
    float* op = hx_opt(argv[8], o);
    const float* pp = (const float*)parts.data(); const float* mp = (const float*)meta.data();
    hx_launch({(unsigned)T, (unsigned)H, 1}, {HX_D, 1, 1}, 8 * P, [&] { fattn_combine_q8_1(pp, mp, op, P, q.data()); });
    // the unfused sequence: the combine, then quantize_q8_1's own launch (8 warps per block)
    hx_launch({(unsigned)T, (unsigned)H, 1}, {HX_D, 1, 1}, 8 * P, [&] { fattn_combine(pp, mp, o2.data(), P); });
    const int k = H * HX_D;
    hx_launch({(unsigned)((k / 32 + 7) / 8), (unsigned)T, 1}, {256, 1, 1}, 0,
              [&] { quantize_q8_1(o2.data(), q2.data(), k, k); });
    hx_write(argv[7], q.data(), q.size()); hx_opt_write(argv[8], o);
    hx_write(argv[9], q2.data(), q2.size()); hx_write(argv[10], o2.data(), o2.size() * 4);
}'''


def _combine_inputs(T, H, P, D, seed):
    rng = np.random.default_rng(seed)
    parts = (rng.standard_normal((T, H, P, D)) * 3).astype(np.float32)
    meta = np.empty((T, H, P, 2), np.float32)
    meta[..., 0] = rng.standard_normal((T, H, P)).astype(np.float32) * 4
    meta[..., 1] = rng.uniform(0.5, 40.0, (T, H, P)).astype(np.float32)
    meta[0, 0, -1] = (-np.finfo(np.float32).max / 2, 0.0)  # an empty parallel block (no cell)
    parts[-1, -1] = 0.0  # a head whose output is all zero: q8_1 blocks with amax 0
    return parts, meta


@pytest.mark.parametrize("layout", [None, "Q4_K", "Q6_K"])
@pytest.mark.parametrize("T,H,P,D", [(1, 16, 6, 128), (5, 2, 2, 128), (3, 8, 3, 64)])
def test_combine_q8_1_equals_combine_then_quantize_and_emulator(shim, tmp_path, layout, T, H, P, D):
    from hiraishin.kernels.fused.emulate import emulate_combine_q8_1
    from hiraishin.kernels.fused.launch import SOURCE_COMBINE

    if layout is not None and (H * D) % 256:
        pytest.skip("the mat-vec layouts hold whole super-blocks of 256 values")
    parts, meta = _combine_inputs(T, H, P, D, seed=T * 100 + H * 10 + P)
    exe = shim.build(SOURCE_COMBINE, {**quantize_defines(layout), "HX_D": D, "HX_COMBINE_Q8_1": 1},
                        MAIN_COMBINE_Q8, f"combine_q8_{layout}_{D}")
    paths = {n: tmp_path / f"{n}.bin" for n in ("parts", "meta", "q", "o", "q2", "o2")}
    parts.tofile(paths["parts"])
    meta.tofile(paths["meta"])
    nq = int(np.prod(output_shape(T, H * D, layout)))
    for with_o in (True, False):
        run(exe, paths["parts"], paths["meta"], T, H, P, nq, paths["q"], paths["o"] if with_o else "-",
            paths["q2"], paths["o2"])
        q, q2 = np.fromfile(paths["q"], np.uint8), np.fromfile(paths["q2"], np.uint8)
        o2 = np.fromfile(paths["o2"], np.float32)
        want_q, want_o = emulate_combine_q8_1(parts, meta, layout)
        assert np.array_equal(q, q2), "fused q8_1 != combine then quantize_q8_1"
        assert np.array_equal(q, np.asarray(want_q).reshape(-1)), "fused q8_1 != emulator"
        assert np.array_equal(bits(o2), bits(want_o.reshape(-1))), "combine != emulator"
        if with_o:
            assert np.array_equal(bits(np.fromfile(paths["o"], np.float32)), bits(o2)), "fused o != combine"


# ---- one-block vector attention + q8_1 (fattn_vec.cu compiled with HX_ATTN_Q8_1 after quantize_q8_1.cu)
MAIN_ATTN_Q8 = _OPT + _OPT_WRITE + r'''
int main(int argc, char** argv) {
    // argv: q k v pos T H Hkv kv_att kind(0 q1, 1 qn, 2 shared) scale_bits q_bytes out_q out_o ("-": none)
    //       out_q_unfused out_o_unfused
    auto q = hx_read(argv[1]); auto k = hx_read(argv[2]); auto v = hx_read(argv[3]); auto pos = hx_read(argv[4]);
    const int T = atoi(argv[5]), H = atoi(argv[6]), Hkv = atoi(argv[7]), kv_att = atoi(argv[8]), kind = atoi(argv[9]);
    const unsigned scale_bits = (unsigned)strtoul(argv[10], nullptr, 10);
    float scale; std::memcpy(&scale, &scale_bits, 4);
    const size_t nq = (size_t)atoll(argv[11]), no = (size_t)T * H * HX_D;
    // the same fill in both q8_1 buffers: bytes neither writes (an MMA8 group's padding columns) compare equal
    std::vector<unsigned char> yq(nq, 0xAB), yq2(nq, 0xAB);
    std::vector<float> o(no, -12345.0f), o2(no, -54321.0f);
    float* op = hx_opt(argv[13], o);
    const float* Q = (const float*)q.data();
    const unsigned short* K = (const unsigned short*)k.data();
    const unsigned short* V = (const unsigned short*)v.data();
    const int* QP = (const int*)pos.data();
    // kv_len from the positions (-1), as a forward pass launches it; P = 1: parts and meta are not written
    auto attend = [&](float* dst, unsigned char* y) {
        if (kind == 2) {
            const unsigned nblk = (unsigned)((T * (H / Hkv) + FV_SHARED_Q - 1) / FV_SHARED_Q);
            hx_launch({nblk, 1, (unsigned)Hkv}, {32, 4, 1}, 0, [&] {
                fattn_vec_shared(Q, K, V, QP, dst, nullptr, nullptr, T, H, Hkv, -1, kv_att, 256, scale, y); });
        } else if (kind == 1) {
            hx_launch({(unsigned)((T + 1) / 2), 1, (unsigned)H}, {32, 4, 1}, 0, [&] {
                fattn_vec_qn(Q, K, V, QP, dst, nullptr, nullptr, T, H, Hkv, -1, kv_att, 256, scale, y); });
        } else {
            hx_launch({(unsigned)T, 1, (unsigned)H}, {32, 4, 1}, 0, [&] {
                fattn_vec_q1(Q, K, V, QP, dst, nullptr, nullptr, T, H, Hkv, -1, kv_att, 256, scale, y); });
        }
    };
    attend(op, yq.data());
    attend(o2.data(), nullptr);  // the unfused sequence: the attention, then quantize_q8_1's own launch
    const int kk = H * HX_D;
    hx_launch({(unsigned)((kk / 32 + 7) / 8), (unsigned)T, 1}, {256, 1, 1}, 0,
              [&] { quantize_q8_1(o2.data(), yq2.data(), kk, kk); });
    hx_write(argv[12], yq.data(), yq.size()); hx_opt_write(argv[13], o);
    hx_write(argv[14], yq2.data(), yq2.size()); hx_write(argv[15], o2.data(), o2.size() * 4);
}'''

ATTN_KINDS = {0: "fattn_vec_q1", 1: "fattn_vec_qn", 2: "fattn_vec_shared"}


@pytest.mark.parametrize("layout", [None, "Q4_K", "Q6_K", "MMA_Q4_K", "MMA8_Q4_K", "MMA8_Q6_K"])
@pytest.mark.parametrize("kind,T,H,Hkv,kv_len,D", [
    (0, 1, 16, 8, 33, 128),   # a decode step: one query, GQA 2
    (1, 3, 4, 2, 200, 128),   # two queries per block, the last block half empty
    (2, 5, 8, 2, 129, 64),    # shared K/V loads (4 queries of a KV head per block), 128 + 1 cells
    (0, 1, 2, 1, 1, 128),     # one cell: a position-0 query sees only itself
])
def test_attention_q8_1_equals_attention_then_quantize_and_emulator(shim, tmp_path, layout, kind, T, H, Hkv,
                                                                    kv_len, D):
    """P = 1: the vector kernels' q8_1 store equals their float rows quantized by quantize_q8_1's own
    launch, in every layout (the MMA8 group's padding columns left as they were), and the emulators."""
    from fattn_inputs import make_inputs

    from hiraishin.kernels.attention.emulate import attention_scale
    from hiraishin.kernels.fused.emulate import emulate_attention_q8_1
    from hiraishin.kernels.fused.launch import ATTN_Q8_1_PRELUDE
    from hiraishin.plans.attention import AttentionPlan

    if layout is not None and (H * D) % 256:
        pytest.skip("the mat-vec layouts hold whole super-blocks of 256 values")
    kv_attended = -(-kv_len // 256) * 256
    plan = AttentionPlan("vec", 2 if kind == 1 else (4 if kind == 2 else 1), 1, chunk_cells=256, split_cells=256,
                         kv_attended=kv_attended, shared_kv=kind == 2, kv_len=kv_len, n_head=H, n_head_kv=Hkv,
                         n_queries=T, head_dim=D)
    q, k, v = make_inputs(seed=kind * 1000 + T * 31 + kv_len, n_ctx=kv_len, n_head=H, n_head_kv=Hkv, head_dim=D,
                          n_q=T)
    q[0, 0] = 0.0  # a head of uniform weights
    q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
    exe = shim.build((*ATTN_Q8_1_PRELUDE, "attention/fattn_vec.cu"),
                     {**quantize_defines(layout), "HX_D": D, "HX_ATTN_Q8_1": 1, "FV_SHARED_Q": 4},
                     MAIN_ATTN_Q8, f"attn_q8_{layout}_{D}")
    paths = {n: tmp_path / f"{n}.bin" for n in ("q", "k", "v", "pos", "yq", "o", "yq2", "o2")}
    for name, a in (("q", q), ("k", k.view(np.uint16)), ("v", v.view(np.uint16)), ("pos", q_pos)):
        np.ascontiguousarray(a).tofile(paths[name])
    nq = int(np.prod(output_shape(T, H * D, layout)))
    want_q, want_o = emulate_attention_q8_1(q, k, v, q_pos, plan, layout)
    want_q = np.asarray(want_q).reshape(-1)
    group = LAYOUT_COLUMN_GROUP.get(layout)
    for with_o in (True, False):
        run(exe, paths["q"], paths["k"], paths["v"], paths["pos"], T, H, Hkv, kv_attended, kind,
            int(attention_scale(D).view(np.uint32)), nq, paths["yq"], paths["o"] if with_o else "-", paths["yq2"],
            paths["o2"])
        yq, yq2 = np.fromfile(paths["yq"], np.uint8), np.fromfile(paths["yq2"], np.uint8)
        o2 = np.fromfile(paths["o2"], np.float32)
        assert np.array_equal(yq, yq2), f"{ATTN_KINDS[kind]} q8_1 != its rows, then quantize_q8_1"
        assert np.array_equal(bits(o2), bits(want_o.reshape(-1))), "attention != emulator"
        if group is None:
            assert np.array_equal(yq, want_q), "fused q8_1 != emulator"
        else:  # the emulator's padding columns are its own; compare the real ones
            real = mma8_columns(yq.reshape(output_shape(T, H * D, layout)), T)
            assert np.array_equal(real, mma8_columns(want_q.reshape(output_shape(T, H * D, layout)), T))
        if with_o:
            assert np.array_equal(bits(np.fromfile(paths["o"], np.float32)), bits(o2)), "fused o != attention"


@pytest.mark.parametrize("qtype,n,layout,early", [("Q6_K", 1024, "Q4_K", True), ("Q4_K", 1024, "MMA_Q4_K", False),
                                                   ("Q4_K", 4096, "Q4_K", True), ("Q8_0", 800, None, False),
                                                   ("F16", 1024, None, True), ("F32", 256, "Q6_K", False)])
def test_embed_rms_norm_q8_1_source_equals_get_rows_then_norm(shim, tmp_path, qtype, n, layout, early):
    """hx_embed_rms_norm_q8_1_*: the embedding rows of the token ids (repeated and unordered ids) and the q8_1
    and floats of their norm, equal to get_rows then the norm (the emulators; their sources equal them in
    tests/test_mmvq_shim.py and above), in the launcher's geometry (played or the tree's own block) at one,
    three and the launcher's blocks per row, with the norm weights read before or after the wait."""
    from hiraishin import quant

    f = Files(tmp_path)
    rng = np.random.default_rng(n + len(qtype))
    table = np.ascontiguousarray(quant.quantize((rng.standard_normal((11, n)) * 2).astype(np.float32), qtype))
    table = table.view(np.uint8).reshape(11, -1)
    ids = np.array([7, 0, 10, 7], np.int32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    es, eq, ey = emulate_embed_rms_norm_q8_1(table, qtype, ids, w, EPS, layout)
    threads, per, vals = norm_geometry(n)
    defines = {**quantize_defines(layout), "HX_SHIM_KERNEL": EMBED_NORM_KERNELS[qtype]}
    if vals:
        defines.update(HX_NORM_PER=per, HX_NORM_VALS=vals)
    if early:
        defines["HX_NORM_W_EARLY"] = 1
    exe = shim.build(SOURCE_EMBED, defines, MAIN_EMBED_RMS_Q8, "embed_rms_q8")
    rows = ids.size
    for slices in sorted({1, 3, norm_slices(n)}):
        run(exe, f.put("t.bin", table), f.put("i.bin", ids), rows, n, table.shape[1], f.put("w.bin", w), EPS_ARG,
            eq.size, f.path("s.bin"), f.path("q.bin"), f.path("y.bin"), threads, slices)
        msg = f"{qtype} n={n} layout {layout}: {threads} threads, {slices} blocks per row"
        np.testing.assert_array_equal(bits(f.get("s.bin", np.float32, (rows, n))), bits(es), err_msg=msg)
        np.testing.assert_array_equal(f.get("q.bin", np.uint8, eq.shape), eq, err_msg=msg)
        np.testing.assert_array_equal(bits(f.get("y.bin", np.float32, (rows, n))), bits(ey), err_msg=msg)
