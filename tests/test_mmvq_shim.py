"""Run the CUDA C sources of the mat-vec, quantize and elementwise kernels on the CPU; compare with the emulators.

No GPU here, so the kernels' index math and order of operations are checked by
compiling the very same ``.cu`` text with g++ against a small shim: one
``std::thread`` per CUDA thread, ``std::barrier`` for ``__syncthreads`` and for
warp shuffles, ``std::fmaf`` for ``__fmaf_rn`` (``-ffp-contract=off``), and
``_Float16`` for the fp16 conversions (the ``.cu`` files let a shim replace
their PTX ``cvt`` helpers through ``HX_HALF_PTX``). Bit equality with the Numba
emulators here plus kernel == emulator on a GPU (tests/test_mmvq_gpu.py) pin
the kernels from both sides; what the shim cannot check (NVRTC, alignment,
real warp scheduling) only the GPU run can.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import numpy as np
import pytest

from hiraishin.kernels import mmq_tiled
from hiraishin.kernels._cuda import _defines_text, load_source
from hiraishin.kernels.mmvq import TYPE_TRAITS, emulate_mmvq, kernel_defines, random_weights
from hiraishin.kernels.q8_1_layout import layout_for, to_layout
from hiraishin.kernels.quantize_q8_1 import F16_TO_F32, quantize_defines, quantize_q8_1

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

SHIM = r"""// Run CUDA C kernels on the CPU: one std::thread per CUDA thread, one CUDA block at a time.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
using std::min;
using std::max;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
static thread_local dim3 threadIdx;
static dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static float g_shfl[1024];
static std::vector<unsigned char> g_dyn_shared;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline int hx_ltid() { return threadIdx.x + threadIdx.y * blockDim.x; }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int off, int) {
    int t = hx_ltid(), warp = t / 32, lane = t % 32;
    std::memcpy(&g_shfl[t], &v, 4);
    g_warp_barriers[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &g_shfl[warp * 32 + (lane ^ off)], 4);
    g_warp_barriers[warp]->arrive_and_wait();
    return r;
}
inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
    return c;
}
struct uint4 { unsigned x, y, z, w; };
struct int4 { int x, y, z, w; };
struct int2 { int x, y; };
struct float2 { float x, y; };
template <class T> inline T __ldg(const T* p) { T v; std::memcpy(&v, p, sizeof(T)); return v; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) r |= (unsigned)((b >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k);
    return r;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int2float_rn(int a) { return (float)a; }
inline float __int_as_float(int a) { float f; std::memcpy(&f, &a, 4); return f; }
#define HX_HALF_PTX
inline float hx_h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
inline unsigned short hx_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h; }

template <class F> void hx_launch(dim3 grid, dim3 block, size_t shmem, F f) {
    blockDim = block; gridDim = grid;
    g_dyn_shared.assign(shmem + 16, 0);
    const int nt = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = {bx, by, bz};
        std::barrier<> bb(nt);
        g_block_barrier = &bb;
        g_warp_barriers.clear();
        for (int w = 0; w < (nt + 31) / 32; ++w) g_warp_barriers.emplace_back(new std::barrier<>(32));
        std::vector<std::thread> ts;
        for (int t = 0; t < nt; ++t)
            ts.emplace_back([&, t] { threadIdx = {(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y), 0}; f(); });
        for (auto& th : ts) th.join();
    }
}
static std::vector<unsigned char> hx_read(const char* path) {
    FILE* fp = std::fopen(path, "rb"); std::vector<unsigned char> v;
    std::fseek(fp, 0, SEEK_END); long n = std::ftell(fp); std::fseek(fp, 0, SEEK_SET);
    v.resize(n + 64); if (n) std::fread(v.data(), 1, n, fp); std::fclose(fp); return v;
}
static void hx_write(const char* path, const void* p, size_t n) {
    FILE* fp = std::fopen(path, "wb"); std::fwrite(p, 1, n, fp); std::fclose(fp);
}
"""

MAINS = {
"mmvq": r'''
int main(int argc, char** argv) {
    // argv: weights, q8_1, nrows, byte offset of the weights in their buffer (alignment), out
    int nrows = atoi(argv[3]), shift = atoi(argv[4]);
    auto w0 = hx_read(argv[1]); auto y = hx_read(argv[2]);
    std::vector<unsigned char> w(w0.size() + 16);  // hx_read's buffer is 16-byte aligned
    std::memcpy(w.data() + shift, w0.data(), w0.size());
    std::vector<float> out((size_t)HX_NCOLS * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + HX_RPB - 1) / HX_RPB), 1, 1}, {32, (unsigned)HX_NWARPS, 1},
              (size_t)(HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
              [&] { mmvq(w.data() + shift, y.data(), out.data(), nrows, (long long)nrows); });
    hx_write(argv[5], out.data(), out.size() * 4);
}''',
"mmq_tiled": r'''
int main(int argc, char** argv) {
    int nrows = atoi(argv[3]), ncols = atoi(argv[4]), k = atoi(argv[5]);
    long long row_bytes = atoll(argv[6]), col_bytes = atoll(argv[7]);
    auto w = hx_read(argv[1]); auto y = hx_read(argv[2]);
    std::vector<float> out((size_t)ncols * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + 31) / 32), (unsigned)((ncols + 15) / 16), 1}, {32, 4, 1}, 0,
              [&] { mmq_tiled(w.data(), y.data(), out.data(), nrows, ncols, k, row_bytes, col_bytes, nrows); });
    hx_write(argv[8], out.data(), out.size() * 4);
}''',
"get_rows": r'''
int main(int argc, char** argv) {
    // argv: table, int32 ids, n_ids, n_cols, row_bytes, out; HX_SHIM_KERNEL names the kernel
    int n_ids = atoi(argv[3]), n_cols = atoi(argv[4]);
    long long row_bytes = atoll(argv[5]);
    auto table = hx_read(argv[1]); auto ids = hx_read(argv[2]);
    std::vector<float> out((size_t)n_ids * n_cols, -12345.0f);
    hx_launch({(unsigned)n_ids, (unsigned)((n_cols + 63) / 64), 1}, {64, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL(table.data(), (const int*)ids.data(), out.data(), n_cols, row_bytes); });
    hx_write(argv[6], out.data(), out.size() * 4);
}''',
"binary": r'''
int main(int argc, char** argv) {
    // argv: a, b (float32), n, out; HX_SHIM_KERNEL names the kernel
    long long n = atoll(argv[3]);
    auto a = hx_read(argv[1]); auto b = hx_read(argv[2]);
    std::vector<float> out(n, -12345.0f);
    hx_launch({(unsigned)((n + 127) / 128), 1, 1}, {128, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL((const float*)a.data(), (const float*)b.data(), out.data(), n); });
    hx_write(argv[4], out.data(), out.size() * 4);
}''',
"quantize_q8_1": r'''
int main(int argc, char** argv) {
    int ncols = atoi(argv[2]), k = atoi(argv[3]);
    auto x = hx_read(argv[1]);
    std::vector<unsigned char> out((size_t)atoll(argv[5]), 0xAB);
    hx_launch({(unsigned)((k / 32 + 7) / 8), (unsigned)ncols, 1}, {256, 1, 1}, 0,
              [&] { quantize_q8_1((const float*)x.data(), out.data(), k, k); });
    hx_write(argv[4], out.data(), out.size());
}''',
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cuda-shim")
    (out_dir / "cuda_shim.h").write_text(SHIM)
    built = {}

    def _build(source, defines, kind):
        text = _defines_text(defines) + load_source(source)
        text = text.replace("extern __shared__ float tmp_shared[];",
                            "float* tmp_shared = (float*)g_dyn_shared.data();")
        text = text.replace('extern "C"', "")
        prog = '#include "cuda_shim.h"\n' + text + MAINS[kind]
        key = hashlib.sha1(prog.encode()).hexdigest()[:12]
        if key not in built:
            src = out_dir / f"{kind}_{key}.cpp"
            src.write_text(prog)
            exe = out_dir / f"{kind}_{key}"
            proc = subprocess.run([GXX, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-strict-aliasing",
                                   "-pthread", "-w", "-I", str(out_dir), str(src), "-o", str(exe)],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-4000:]
            built[key] = exe
        return built[key]

    return _build


def _run(exe, *args):
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("layout", [None, "Q4_K", "Q6_K"])
def test_quantize_source_equals_emulator(build, tmp_path, layout):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 768)) * 3).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 32:64] = 0.0
    x[1, 32:40] = [127.0, 63.5, -63.5, 2.5, -2.5, 0.5, -0.5, 1.5]
    x.tofile(tmp_path / "x.bin")
    want = quantize_q8_1(x, layout=layout)
    _run(build("quantize_q8_1.cu", quantize_defines(layout), "quantize_q8_1"),
         tmp_path / "x.bin", 3, 768, tmp_path / "q.bin", want.size)
    got = np.fromfile(tmp_path / "q.bin", np.uint8).reshape(3, -1)
    np.testing.assert_array_equal(got, want)


# (columns, rows per block, nwarps, unroll, byte offset of the weights): every kernel path —
# wide and narrow loads (offset 0 vs 2/4 bytes), a row length that nwarps does not divide
# (K=2560: 10 super-blocks), full and partial unrolling, one and many accumulators.
MMVQ_SHIM_CASES = [(1, 1, 4, 4, 0), (1, 2, 4, 1, 4), (5, 4, 1, 2, 2), (5, 4, 2, 2, 0), (5, 4, 3, 1, 0),
                   (5, 4, 4, 4, 4), (5, 4, 8, 2, 2), (3, 1, 4, 2, 0)]


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_mmvq_source_equals_emulator(build, tmp_path, qtype):
    t = TYPE_TRAITS[qtype]
    n, k = 11, 2560 if qtype != "Q8_0" else 1312
    w = random_weights(qtype, n, k, seed=1)
    x = (np.random.default_rng(2).standard_normal((5, k)) * 2).astype(np.float32)
    xq = quantize_q8_1(x)
    w.tofile(tmp_path / "w.bin")
    for ncols, rows, nwarps, unroll, shift in MMVQ_SHIM_CASES:
        if qtype == "Q4_K":
            shift -= shift % 4  # Q4_K weights must be 4-byte aligned (the launcher checks)
        defines = kernel_defines(qtype, ncols, rows, nwarps, k // t.qk, unroll)
        (to_layout(xq[:ncols], qtype) if layout_for(qtype) else xq[:ncols]).tofile(tmp_path / "y.bin")
        _run(build("mmvq.cu", defines, "mmvq"), tmp_path / "w.bin", tmp_path / "y.bin", n, shift,
             tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
        emu = emulate_mmvq(w, qtype, xq[:ncols], nwarps)
        np.testing.assert_array_equal(_bits(got), _bits(emu), err_msg=f"{defines} weight offset {shift}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_tiled_source_equals_emulator(build, tmp_path, qtype):
    t = TYPE_TRAITS[qtype]
    n, k, ncols = 37, 1024 if qtype != "Q8_0" else 1312, 17  # partial row and column tiles
    w = random_weights(qtype, n, k, seed=3)
    xq = quantize_q8_1((np.random.default_rng(4).standard_normal((ncols, k))).astype(np.float32))
    w.tofile(tmp_path / "w.bin")
    xq.tofile(tmp_path / "y.bin")
    exe = build("mmq_tiled.cu", {"HX_QTYPE": t.type_id}, "mmq_tiled")
    _run(exe, tmp_path / "w.bin", tmp_path / "y.bin", n, ncols, k, w.shape[1], xq.shape[1], tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
    np.testing.assert_array_equal(_bits(got), _bits(mmq_tiled.emulate_tiled(w, qtype, xq, F16_TO_F32)))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16", "F32"])
def test_get_rows_source_equals_emulator(build, tmp_path, qtype):
    from hiraishin import quant
    from hiraishin.kernels.elementwise import _GET_ROWS_KERNEL, get_rows_cpu

    rng = np.random.default_rng(6)
    k = 512
    x = (rng.standard_normal((9, k)) * 2).astype(np.float32)
    table = np.ascontiguousarray(quant.quantize(x, qtype)).view(np.uint8).reshape(9, -1)
    ids = np.array([3, 0, 8, 3], np.int32)
    table.tofile(tmp_path / "t.bin")
    ids.tofile(tmp_path / "i.bin")
    exe = build("elementwise.cu", {"HX_SHIM_KERNEL": _GET_ROWS_KERNEL[qtype]}, "get_rows")
    _run(exe, tmp_path / "t.bin", tmp_path / "i.bin", ids.size, k, table.shape[1], tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ids.size, k)
    np.testing.assert_array_equal(_bits(got), _bits(get_rows_cpu(table, qtype, ids)))


@pytest.mark.parametrize("kernel", ["hx_swiglu_f32", "hx_add_f32"])
def test_binary_source_equals_emulator(build, tmp_path, kernel):
    from hiraishin.kernels.elementwise import add_cpu, swiglu_cpu

    rng = np.random.default_rng(7)
    a = (rng.standard_normal(1000) * 30).astype(np.float32)  # exp() over and underflow included
    b = rng.standard_normal(1000).astype(np.float32)
    a.tofile(tmp_path / "a.bin")
    b.tofile(tmp_path / "b.bin")
    _run(build("elementwise.cu", {"HX_SHIM_KERNEL": kernel}, "binary"), tmp_path / "a.bin", tmp_path / "b.bin",
         a.size, tmp_path / "o.bin")
    want = swiglu_cpu(a, b) if kernel == "hx_swiglu_f32" else add_cpu(a, b)
    np.testing.assert_array_equal(_bits(np.fromfile(tmp_path / "o.bin", np.float32)), _bits(want))
