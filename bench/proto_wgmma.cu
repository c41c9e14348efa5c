// hiraishin bench: a prototype of the sub-block order's Q4_K mat-vec on sm_90a's warpgroup MMA (wgmma), for
// timing against hiraishin/kernels/mmq (bench/proto_wgmma.py). Not a kernel of the library.
//
// Why: at 9-16 columns the library's mma.sync kernel loads every super-block's activations into the registers
// of each warp of 16 rows, once per n-tile of 8 columns; those loads are most of what the second n-tile costs
// (bench/results/2026-12-04-h200-session17). wgmma.m64nNk32 reads its B operand (N columns x 32 values) from
// shared memory for 64 rows at once, and N = 16 is one instruction: a warpgroup stages a super-block's
// activations once for 64 rows. Measured (session 17, e): the emulator's bits in every build, width and shape,
// and 1.3-1.6x the library's launch time, with an 8 -> 16-column step no smaller than the library's.
//
// The float operations are the sub-block order's (hiraishin/kernels/mmq/emulate.py, _mmq_q4_k): per (row,
// column, sub-block) acc = fma(d*sc * dx, (float)c, acc); acc = fma(-(dmin*m), sx, acc), each K-segment from 0
// in k order, the segments added in order (v = part[0]; v += part[s]). One tile = 64 rows x HX_N columns, split
// over the HX_CL CUDA blocks of a cluster (HX_CL, below).
//
// Defines: HX_N (8 or 16), HX_NB (super-blocks per row), HX_NSEG, HX_WG (warpgroups per CUDA block: warpgroup w
// takes K-segments w, w + HX_WG, ..., writes each segment's partial sums to shared memory, and after one barrier
// the block adds them in order 0..HX_NSEG-1, as the library's mma.sync kernel does with its warps), HX_LBO /
// HX_SBO (the B descriptor's leading / stride byte offsets; the staging layout below puts the K-halves of a core
// matrix 128 bytes apart and groups of 8 columns 256 bytes apart; measured: the leading offset is the K-halves').
// Each warpgroup stages a super-block's activations into its own double buffer (the next one's words held in
// registers while this one's MMAs run), and the MMAs of HX_BATCH sub-blocks are issued before their float work.
//
// Compile: proto_wgmma.py (nvcc -arch=sm_90a -cubin, the library's IEEE options, its prelude and mma_rows.cu).

// The weight rows are read and their scales made by the library's own helpers (hiraishin/kernels/mmq/mma_rows.cu
// hx_load_row, hx_q4_ws, hx_q4_wm; proto_wgmma.py compiles fp.cuh and mma_rows.cu in front of this file, with
// HX_QTYPE 12 and HX_XLAYOUT 0: llama.cpp's q8_1 activations and Q4_K rows read 4 bytes at a time).

#define QK_BYTES HX_BLOCK_BYTES
#define Q8_BYTES HX_Q8_BYTES
#define SUB_BYTES (HX_N * 32)  // one sub-block's B operand: HX_N columns x 32 int8
#ifndef HX_LBO
#define HX_LBO 128
#endif
#ifndef HX_SBO
#define HX_SBO 256
#endif

typedef unsigned char u8;
typedef unsigned long long u64;
typedef hx_row_sb Row;

__device__ __forceinline__ u64 b_desc(const void* p) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    return (u64)((a & 0x3FFFF) >> 4) | ((u64)(HX_LBO >> 4) << 16) | ((u64)(HX_SBO >> 4) << 32);
}

// D (HX_N / 2 ints per thread) = A (4 regs: rows g, g+8 of this warp's 16, k 4t.., 16+4t..) x B (shared memory).
// scale-d false: D's old value is not read, so D is output only (no register written between the MMAs of a
// batch, which would make ptxas put a fence before each).
__device__ __forceinline__ void wgmma_k32(int* d, int a0, int a1, int a2, int a3, u64 desc) {
#if HX_N == 16
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p;\n}\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "n"(0));
#else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p;\n}\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "n"(0));
#endif
}

#ifndef HX_WG
#define HX_WG 1
#endif
// HX_CL: CUDA blocks per cluster (sm_90 thread-block clusters) that split one 64-row tile's K-segments: block
// rank r's warpgroup w takes segments r * HX_WG + w, + HX_CL * HX_WG, ...; after a cluster barrier every block
// adds a share of the tile's outputs from all blocks' partial sums (distributed shared memory), in segment order.
#ifndef HX_CL
#define HX_CL 1
#endif
#define HX_Q (HX_CL * HX_WG)  // warpgroups per tile
// HX_ROWS_AHEAD (0/1): the weight rows of the super-block a warpgroup multiplies next loaded while it multiplies
// this one (registers)
#ifndef HX_ROWS_AHEAD
#define HX_ROWS_AHEAD 1
#endif
// HX_BATCH (1, 2, 4, 8): sub-blocks whose MMAs are issued back to back before one wait
#ifndef HX_BATCH
#define HX_BATCH 4
#endif
#define WORDS_PER_THREAD (HX_N * 64 / 128)  // a super-block's activation ints: HX_N columns x 8 blocks x 8 words
#define STAGE_BYTES (8 * SUB_BYTES + 8 * HX_N * 4)  // one buffer: 8 sub-blocks' B operands, then their ds words
// dynamic shared memory: per warpgroup two stages, then the partial sums [HX_NSEG][64][HX_N]
#define SMEM_BYTES (HX_WG * 2 * STAGE_BYTES + HX_NSEG * 64 * HX_N * 4)
// (the launch gives HX_SMEM_BYTES, proto_wgmma.py smem_bytes: the two must agree)
static_assert(SMEM_BYTES == HX_SMEM_BYTES, "proto_wgmma.py smem_bytes disagrees with SMEM_BYTES");

__device__ __forceinline__ void wg_bar(int wg) {  // the 128 threads of warpgroup wg (barrier 0 is __syncthreads)
    asm volatile("bar.sync %0, 128;" :: "r"(wg + 1) : "memory");
}

// The float work of one sub-block's MMA result c (HX_N / 2 ints of this thread) into acc.
__device__ __forceinline__ void epilogue(float* acc, const int* c, const unsigned int* ds_row, const Row& rA,
                                         const Row& rB, int jj, int t) {
    const float wsA = hx_q4_ws(rA, jj), wmA = hx_q4_wm(rA, jj);
    const float wsB = hx_q4_ws(rB, jj), wmB = hx_q4_wm(rB, jj);
#pragma unroll
    for (int e = 0; e < HX_N / 2; ++e) {
        const int col = 8 * (e >> 2) + 2 * t + (e & 1);
        const unsigned int ds = ds_row[col];
        const float dx = hx_h2f((unsigned short)(ds & 0xFFFF)), sx = hx_h2f((unsigned short)(ds >> 16));
        const bool hi = (e & 2) != 0;  // row g + 8
        acc[e] = __fmaf_rn(__fmul_rn(hi ? wsB : wsA, dx), (float)c[e], acc[e]);
        acc[e] = __fmaf_rn(-(hi ? wmB : wmA), sx, acc[e]);
    }
}

__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// a float at this block's shared address p, in the shared memory of cluster block r
__device__ __forceinline__ float ld_cluster(const float* p, unsigned int r) {
    unsigned int a = (unsigned int)__cvta_generic_to_shared(p), ra;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}

extern "C" __global__ void __cluster_dims__(HX_CL, 1, 1) __launch_bounds__(128 * HX_WG)
wg_mmq(const u8* __restrict__ w, const u8* __restrict__ xq, float* __restrict__ out, const int nrows,
       const int ncols, const long long out_stride) {
    extern __shared__ __align__(128) u8 smem[];
    // the warpgroup index through a shuffle, so that ptxas sees it uniform (CUTLASS does the same): a branch on a
    // value it cannot prove uniform makes it serialize the wgmma instructions
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wt = tid & 127;
    const int lane = tid & 31, warp = wt >> 5, g = lane >> 2, t = lane & 3;
    const int rank = HX_CL > 1 ? (int)cluster_rank() : 0, q = rank * HX_WG + wg;  // this warpgroup in its tile
    const int row0 = (blockIdx.x / HX_CL) * 64, col0 = blockIdx.y * HX_N;
    const size_t row_bytes = (size_t)HX_NB * QK_BYTES;
    const size_t col_bytes = (size_t)HX_NB * 8 * Q8_BYTES;
    const u8* wA = w + (size_t)min(row0 + 16 * warp + g, nrows - 1) * row_bytes;
    const u8* wB = w + (size_t)min(row0 + 16 * warp + g + 8, nrows - 1) * row_bytes;
    u8* const stage0 = smem + wg * 2 * STAGE_BYTES;  // this warpgroup's stages: stage0 + b * STAGE_BYTES
    float* part = (float*)(smem + HX_WG * 2 * STAGE_BYTES);

    // this thread's staging words: word u -> column, block within the super-block, 4-byte k offset
    const u8* src[WORDS_PER_THREAD];
    int dst[WORDS_PER_THREAD];
#pragma unroll
    for (int u = 0; u < WORDS_PER_THREAD; ++u) {
        const int wi = wt + 128 * u, col = wi >> 6, jj = (wi >> 3) & 7, wk = wi & 7;
        src[u] = xq + (size_t)min(col0 + col, ncols - 1) * col_bytes + (size_t)jj * Q8_BYTES + 4 + 4 * wk;
        dst[u] = jj * SUB_BYTES + (col >> 3) * 256 + (wk >> 2) * 128 + (col & 7) * 16 + (wk & 3) * 4;
    }
    const bool ds_thread = wt < 8 * HX_N;
    const u8* ds_src = xq + (size_t)min(col0 + (wt >> 3), ncols - 1) * col_bytes + (size_t)(wt & 7) * Q8_BYTES;
    const int ds_dst = 8 * SUB_BYTES + 4 * ((wt & 7) * HX_N + (wt >> 3));

    unsigned int xw[WORDS_PER_THREAD], xds = 0;
    auto fetch = [&](int i) {  // super-block i's activation words into registers
#pragma unroll
        for (int u = 0; u < WORDS_PER_THREAD; ++u) xw[u] = *(const unsigned int*)(src[u] + (size_t)i * 8 * Q8_BYTES);
        if (ds_thread) xds = *(const unsigned int*)(ds_src + (size_t)i * 8 * Q8_BYTES);
    };
    auto put = [&](u8* st) {  // ... into a stage, visible to the MMAs after the warpgroup's barrier
#pragma unroll
        for (int u = 0; u < WORDS_PER_THREAD; ++u) *(unsigned int*)(st + dst[u]) = xw[u];
        if (ds_thread) *(unsigned int*)(st + ds_dst) = xds;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    };

    int buf = 0;
    Row rA, rB;  // the rows of the super-block being multiplied
    if (q < HX_NSEG) {
        fetch(q * HX_NB / HX_NSEG);
        put(stage0);
#if HX_ROWS_AHEAD
        hx_load_row(wA + (size_t)(q * HX_NB / HX_NSEG) * QK_BYTES, t, rA);
        hx_load_row(wB + (size_t)(q * HX_NB / HX_NSEG) * QK_BYTES, t, rB);
#endif
    }
    wg_bar(wg);
    for (int s = q; s < HX_NSEG; s += HX_Q) {
        const int sb0 = s * HX_NB / HX_NSEG, sb1 = (s + 1) * HX_NB / HX_NSEG;
        const int s2 = s + HX_Q;
        float acc[HX_N / 2];
#pragma unroll
        for (int e = 0; e < HX_N / 2; ++e) acc[e] = 0.0f;
        for (int i = sb0; i < sb1; ++i) {
            const int nxt = i + 1 < sb1 ? i + 1 : (s2 < HX_NSEG ? s2 * HX_NB / HX_NSEG : -1);
            if (nxt >= 0) fetch(nxt);
#if HX_ROWS_AHEAD
            Row nA, nB;  // the next super-block's rows, in flight while this one's MMAs run
            if (nxt >= 0) {
                hx_load_row(wA + (size_t)nxt * QK_BYTES, t, nA);
                hx_load_row(wB + (size_t)nxt * QK_BYTES, t, nB);
            }
#else
            hx_load_row(wA + (size_t)i * QK_BYTES, t, rA);
            hx_load_row(wB + (size_t)i * QK_BYTES, t, rB);
#endif
            const u8* st = stage0 + buf * STAGE_BYTES;
            const unsigned int* dsw = (const unsigned int*)(st + 8 * SUB_BYTES);
#pragma unroll
            for (int jb = 0; jb < 8; jb += HX_BATCH) {
                // HX_BATCH sub-blocks' MMAs into their own accumulators, one wait, then their float work (ptxas
                // waits for every MMA in flight before any use of an accumulator, so the float work of one
                // sub-block cannot overlap the next one's MMA)
                int c[HX_BATCH][HX_N / 2];
                u64 desc[HX_BATCH];
                int a[HX_BATCH][4];  // every A fragment of the batch made before the fence (none written between MMAs)
#pragma unroll
                for (int b = 0; b < HX_BATCH; ++b) {
                    const int jj = jb + b, jp = jj >> 1, sh = 4 * (jj & 1);
                    a[b][0] = (rA.q[2 * jp] >> sh) & 0x0F0F0F0F;
                    a[b][1] = (rB.q[2 * jp] >> sh) & 0x0F0F0F0F;
                    a[b][2] = (rA.q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
                    a[b][3] = (rB.q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
                    desc[b] = b_desc(st + jj * SUB_BYTES);
                }
#pragma unroll
                for (int b = 0; b < HX_BATCH; ++b)  // pin them before the fence (else they sink between the MMAs)
                    asm volatile("" :: "r"(a[b][0]), "r"(a[b][1]), "r"(a[b][2]), "r"(a[b][3]), "l"(desc[b]));
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int b = 0; b < HX_BATCH; ++b)
                    wgmma_k32(c[b], a[b][0], a[b][1], a[b][2], a[b][3], desc[b]);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
                for (int b = 0; b < HX_BATCH; ++b) epilogue(acc, c[b], dsw + (jb + b) * HX_N, rA, rB, jb + b, t);
            }
            if (nxt >= 0) put(stage0 + (buf ^ 1) * STAGE_BYTES);
            wg_bar(wg);
            buf ^= 1;
#if HX_ROWS_AHEAD
            rA = nA;
            rB = nB;
#endif
        }
#pragma unroll
        for (int e = 0; e < HX_N / 2; ++e) {
            const int rr = 16 * warp + g + 8 * ((e >> 1) & 1), cc = 8 * (e >> 2) + 2 * t + (e & 1);
            part[(s * 64 + rr) * HX_N + cc] = acc[e];
        }
    }
#if HX_CL > 1
    cluster_sync();  // every block's partial sums written and visible to the cluster
    constexpr int SHARE = 64 * HX_N / HX_CL;  // outputs each block adds up
    for (int o = rank * SHARE + tid; o < (rank + 1) * SHARE; o += 128 * HX_WG) {
        const int rr = o / HX_N, cc = o % HX_N;
        float v = ld_cluster(&part[rr * HX_N + cc], 0);  // segment s lives in block (s % HX_Q) / HX_WG
#pragma unroll 4
        for (int s = 1; s < HX_NSEG; ++s)
            v = __fadd_rn(v, ld_cluster(&part[(s * 64 + rr) * HX_N + cc], (unsigned int)((s % HX_Q) / HX_WG)));
        if (row0 + rr < nrows && col0 + cc < ncols) out[(size_t)(col0 + cc) * out_stride + row0 + rr] = v;
    }
    cluster_sync();  // no block leaves while another still reads its shared memory
#else
    __syncthreads();
    for (int o = tid; o < 64 * HX_N; o += 128 * HX_WG) {
        const int rr = o / HX_N, cc = o % HX_N;
        float v = part[rr * HX_N + cc];
#pragma unroll 4
        for (int s = 1; s < HX_NSEG; ++s) v = __fadd_rn(v, part[(s * 64 + rr) * HX_N + cc]);
        if (row0 + rr < nrows && col0 + cc < ncols) out[(size_t)(col0 + cc) * out_stride + row0 + rr] = v;
    }
#endif
}
