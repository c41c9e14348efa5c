"""Run the CUDA C sources of the kernels on the CPU with g++: the harness the shim tests share.

No GPU in CI, so the kernels' index math and order of operations are checked by compiling the
very same ``.cu`` text (``fp.cuh`` prepended, as NVRTC gets it) with g++ against a small shim:
one ``std::thread`` per CUDA thread, one CUDA block at a time, ``std::barrier`` for
``__syncthreads`` and for warp shuffles, ``std::fmaf`` for ``__fmaf_rn`` (``-ffp-contract=off``),
IEEE ``/`` and ``std::sqrt`` for ``__fdiv_rn`` / ``__fsqrt_rn``, and ``_Float16`` for the fp16
conversions (the sources let a shim replace their PTX ``cvt`` helpers through ``HX_HALF_PTX``).
What the shim cannot check (NVRTC, alignment, real warp scheduling) only a GPU run can.

Used by tests/test_mmvq_shim.py and tests/test_fused.py::

    builder = ShimBuilder(tmp_dir)
    exe = builder.build(("rmsnorm/rmsnorm.cu", "fused/fused.cu"), {"HX_LAYOUT": 0}, MAIN)   # MAIN: a main() text
    run(exe, "x.bin", 3, "out.bin")
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from hiraishin.kernels.compile import defines_text, load_source

__all__ = ["GXX", "SHIM", "MAIN_QUANTIZE", "ShimBuilder", "run", "bits"]

GXX = shutil.which("g++")
# Seconds one g++ compile or one shim run may take (a 1024-thread block is 1024 OS threads).
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300

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
#define __align__(n) __attribute__((aligned(n)))
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline int hx_ltid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_barriers[hx_ltid() / 32]->arrive_and_wait(); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int off, int) {
    int t = hx_ltid(), warp = t / 32, lane = t % 32;
    std::memcpy(&g_shfl[t], &v, 4);
    g_warp_barriers[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &g_shfl[warp * 32 + (lane ^ off)], 4);
    g_warp_barriers[warp]->arrive_and_wait();
    return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width) {
    int t = hx_ltid(), warp = t / 32, lane = t % 32;
    std::memcpy(&g_shfl[t], &v, 4);
    g_warp_barriers[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &g_shfl[warp * 32 + (lane / width) * width + src % width], 4);
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
template <class T> inline T __ldcg(const T* p) { return *p; }
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
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __int2float_rn(int a) { return (float)a; }
inline float __int_as_float(int a) { float f; std::memcpy(&f, &a, 4); return f; }
inline unsigned __float_as_uint(float a) { unsigned u; std::memcpy(&u, &a, 4); return u; }
// CUDA blocks run one at a time here, and only one thread per block calls these
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p = old + v; return old; }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p; if (v > old) *p = v; return old; }
inline void __threadfence() {}
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
            ts.emplace_back([&, t] { threadIdx = {(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y),
                                                  (unsigned)(t / (block.x * block.y))}; f(); });
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


class ShimBuilder:
    """Compiles (source, defines, main) programs into ``folder``, each distinct program once."""

    def __init__(self, folder):
        self.folder = Path(folder)
        (self.folder / "cuda_shim.h").write_text(SHIM)
        self._built: dict[str, Path] = {}

    def build(self, source, defines: dict, main: str, tag: str = "prog", edit=None) -> Path:
        """The executable of ``source`` (a path under hiraishin/kernels, or a tuple of them, concatenated
        as NVRTC gets them) with ``defines`` and ``main``; ``edit(text)``, if given, changes the source
        text first (a test's deliberate change, to see its comparison fail)."""
        text = defines_text(defines) + load_source(*((source,) if isinstance(source, str) else source))
        if edit is not None:
            text = edit(text)
        # dynamic shared memory (extern __shared__ float name[];) -> the shim's buffer
        text = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?float (\w+)\[\];", r"float* \1 = (float*)g_dyn_shared.data();",
                      text)
        text = text.replace('extern "C"', "")
        prog = '#include "cuda_shim.h"\n' + text + main
        key = hashlib.sha1(prog.encode()).hexdigest()[:12]
        if key not in self._built:
            src = self.folder / f"{tag}_{key}.cpp"
            src.write_text(prog)
            exe = self.folder / f"{tag}_{key}"
            proc = subprocess.run([GXX, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-strict-aliasing",
                                   "-pthread", "-w", "-I", str(self.folder), str(src), "-o", str(exe)],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
            assert proc.returncode == 0, proc.stderr[-4000:]
            self._built[key] = exe
        return self._built[key]


def run(exe, *args) -> None:
    """Run a shim executable with ``args`` (paths and numbers); fail the test on a non-zero exit."""
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr


def bits(a) -> np.ndarray:
    """The uint32 bit patterns of a float32 array (for bit-for-bit comparisons)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# main() for quantize_q8_1.cu as quantize.launch launches it (8 warps per block).
# argv: x (float32), rows, k, out, out bytes.
MAIN_QUANTIZE = r'''
int main(int argc, char** argv) {
    int ncols = atoi(argv[2]), k = atoi(argv[3]);
    auto x = hx_read(argv[1]);
    std::vector<unsigned char> out((size_t)atoll(argv[5]), 0xAB);
    hx_launch({(unsigned)((k / 32 + 7) / 8), (unsigned)ncols, 1}, {256, 1, 1}, 0,
              [&] { quantize_q8_1((const float*)x.data(), out.data(), k, k); });
    hx_write(argv[4], out.data(), out.size());
}'''
