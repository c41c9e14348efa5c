// hiraishin bench: a prototype of the sub-block order's Q4_K mat-vec on sm_90a's warpgroup MMA (wgmma), for
// timing against hiraishin/kernels/mmq (bench/proto_wgmma.py). Not a kernel of the library.
//
// Why: at 9-16 columns the library's mma.sync kernel loads every super-block's activations into the registers
// of each warp of 16 rows, once per n-tile of 8 columns; those loads are most of what the second n-tile costs
// (bench/results/2026-12-04-h200-session17). wgmma.m64nNk32 reads its B operand (N columns x 32 values) from
// shared memory for 64 rows at once, and N = 16 is one instruction: a warpgroup stages a super-block's
// activations once for 64 rows.
//
// The float operations are the sub-block order's (hiraishin/kernels/mmq/emulate.py, _mmq_q4_k): per (row,
// column, sub-block) acc = fma(d*sc * dx, (float)c, acc); acc = fma(-(dmin*m), sx, acc), each K-segment from 0
// in k order, the segments added in order. One CUDA block = one warpgroup = 64 rows x HX_N columns and the whole
// row: it walks the segments in order, so v = part[0] + part[1] + ... is summed as they finish.
//
// Defines: HX_N (8 or 16), HX_NB (super-blocks per row), HX_NSEG, HX_LBO / HX_SBO (the B descriptor's leading /
// stride byte offsets; the staging layout below puts K-halves of a core matrix 128 bytes apart and groups of 8
// columns 256 bytes apart).
//
// Compile: nvcc -arch=sm_90a -cubin -fmad=false -ftz=false -prec-div=true -prec-sqrt=true -DHX_N=16 ...

#define QK_BYTES 144
#define Q8_BYTES 36
#define SUB_BYTES (HX_N * 32)  // one sub-block's B operand: HX_N columns x 32 int8
#ifndef HX_LBO
#define HX_LBO 128
#endif
#ifndef HX_SBO
#define HX_SBO 256
#endif

typedef unsigned char u8;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

struct Row {
    float d, dmin;
    unsigned int sc[2], m[2];
    int q[8];
};

__device__ __forceinline__ void load_row(const u8* p, int t, Row& r) {
    const uint4 h = *(const uint4*)p;
    r.d = h2f((unsigned short)(h.x & 0xFFFF));
    r.dmin = h2f((unsigned short)(h.x >> 16));
    r.sc[0] = h.y & 0x3F3F3F3Fu;
    r.m[0] = h.z & 0x3F3F3F3Fu;
    r.sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    r.m[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
        r.q[2 * jp] = *(const int*)(p + 16 + 32 * jp + 4 * t);
        r.q[2 * jp + 1] = *(const int*)(p + 16 + 32 * jp + 16 + 4 * t);
    }
}

__device__ __forceinline__ float scale_of(const unsigned int* v, int jj, float x) {
    return __fmul_rn(x, (float)((v[jj >> 2] >> (8 * (jj & 3))) & 0xFF));
}

__device__ __forceinline__ u64 b_desc(const void* p) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    return (u64)((a & 0x3FFFF) >> 4) | ((u64)(HX_LBO >> 4) << 16) | ((u64)(HX_SBO >> 4) << 32);
}

// D (HX_N / 2 ints per thread) = A (4 regs: rows g, g+8 of this warp's 16, k 4t.., 16+4t..) x B (shared memory)
__device__ __forceinline__ void wgmma_k32(int* d, int a0, int a1, int a2, int a3, u64 desc) {
#if HX_N == 16
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0));
#else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0));
#endif
}

#define WORDS_PER_THREAD (HX_N * 64 / 128)  // a super-block's activation ints: HX_N columns x 8 blocks x 8 words

extern "C" __global__ void __launch_bounds__(128, 1)
wg_mmq(const u8* __restrict__ w, const u8* __restrict__ xq, float* __restrict__ out, const int nrows,
       const int ncols, const long long out_stride) {
    __shared__ __align__(128) u8 bbuf[2][8][SUB_BYTES];
    __shared__ unsigned int dsbuf[2][8][HX_N];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 64, col0 = blockIdx.y * HX_N;
    const size_t row_bytes = (size_t)HX_NB * QK_BYTES;
    const size_t col_bytes = (size_t)HX_NB * 8 * Q8_BYTES;
    const u8* wA = w + (size_t)min(row0 + 16 * warp + g, nrows - 1) * row_bytes;
    const u8* wB = w + (size_t)min(row0 + 16 * warp + g + 8, nrows - 1) * row_bytes;

    // this thread's staging words: word u -> column, block within the super-block, 4-byte k offset
    const u8* src[WORDS_PER_THREAD];
    int dst[WORDS_PER_THREAD];
#pragma unroll
    for (int u = 0; u < WORDS_PER_THREAD; ++u) {
        const int wi = tid + 128 * u, col = wi >> 6, jj = (wi >> 3) & 7, wk = wi & 7;
        src[u] = xq + (size_t)min(col0 + col, ncols - 1) * col_bytes + (size_t)jj * Q8_BYTES + 4 + 4 * wk;
        dst[u] = jj * SUB_BYTES + (col >> 3) * 256 + (wk >> 2) * 128 + (col & 7) * 16 + (wk & 3) * 4;
    }
    const bool ds_thread = tid < 8 * HX_N;
    const u8* ds_src = xq + (size_t)min(col0 + (tid >> 3), ncols - 1) * col_bytes + (size_t)(tid & 7) * Q8_BYTES;
    const int ds_dst = (tid & 7) * HX_N + (tid >> 3);

    unsigned int xw[WORDS_PER_THREAD], xds = 0;
#pragma unroll
    for (int u = 0; u < WORDS_PER_THREAD; ++u) xw[u] = *(const unsigned int*)src[u];
    if (ds_thread) xds = *(const unsigned int*)ds_src;
#pragma unroll
    for (int u = 0; u < WORDS_PER_THREAD; ++u) *(unsigned int*)(&bbuf[0][0][0] + dst[u]) = xw[u];
    if (ds_thread) (&dsbuf[0][0][0])[ds_dst] = xds;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    float v[HX_N / 2];
    int buf = 0;
    for (int s = 0; s < HX_NSEG; ++s) {
        const int sb0 = s * HX_NB / HX_NSEG, sb1 = (s + 1) * HX_NB / HX_NSEG;
        float acc[HX_N / 2];
#pragma unroll
        for (int e = 0; e < HX_N / 2; ++e) acc[e] = 0.0f;
        for (int i = sb0; i < sb1; ++i) {
            const bool more = i + 1 < HX_NB;
            if (more) {  // the next super-block's activations into registers, stored after this one's MMAs
#pragma unroll
                for (int u = 0; u < WORDS_PER_THREAD; ++u)
                    xw[u] = *(const unsigned int*)(src[u] + (size_t)(i + 1) * 8 * Q8_BYTES);
                if (ds_thread) xds = *(const unsigned int*)(ds_src + (size_t)(i + 1) * 8 * Q8_BYTES);
            }
            Row rA, rB;
            load_row(wA + (size_t)i * QK_BYTES, t, rA);
            load_row(wB + (size_t)i * QK_BYTES, t, rB);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                const int jp = jj >> 1, sh = 4 * (jj & 1);
                const int a0 = (rA.q[2 * jp] >> sh) & 0x0F0F0F0F, a1 = (rB.q[2 * jp] >> sh) & 0x0F0F0F0F;
                const int a2 = (rA.q[2 * jp + 1] >> sh) & 0x0F0F0F0F, a3 = (rB.q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
                int c[HX_N / 2];
#pragma unroll
                for (int e = 0; e < HX_N / 2; ++e) c[e] = 0;
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
                wgmma_k32(c, a0, a1, a2, a3, b_desc(&bbuf[buf][jj][0]));
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                const float wsA = scale_of(rA.sc, jj, rA.d), wmA = scale_of(rA.m, jj, rA.dmin);
                const float wsB = scale_of(rB.sc, jj, rB.d), wmB = scale_of(rB.m, jj, rB.dmin);
#pragma unroll
                for (int e = 0; e < HX_N / 2; ++e) {
                    const int col = 8 * (e >> 2) + 2 * t + (e & 1);
                    const unsigned int ds = dsbuf[buf][jj][col];
                    const float dx = h2f((unsigned short)(ds & 0xFFFF)), sx = h2f((unsigned short)(ds >> 16));
                    const bool hi = (e & 2) != 0;  // row g + 8
                    acc[e] = __fmaf_rn(__fmul_rn(hi ? wsB : wsA, dx), (float)c[e], acc[e]);
                    acc[e] = __fmaf_rn(-(hi ? wmB : wmA), sx, acc[e]);
                }
            }
            if (more) {
#pragma unroll
                for (int u = 0; u < WORDS_PER_THREAD; ++u) *(unsigned int*)(&bbuf[buf ^ 1][0][0] + dst[u]) = xw[u];
                if (ds_thread) (&dsbuf[buf ^ 1][0][0])[ds_dst] = xds;
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            }
            __syncthreads();
            buf ^= 1;
        }
#pragma unroll
        for (int e = 0; e < HX_N / 2; ++e) v[e] = s == 0 ? acc[e] : __fadd_rn(v[e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < HX_N / 2; ++e) {
        const int row = row0 + 16 * warp + g + 8 * ((e >> 1) & 1);
        const int col = col0 + 8 * (e >> 2) + 2 * t + (e & 1);
        if (row < nrows && col < ncols) out[(size_t)col * out_stride + row] = v[e];
    }
}
