// hiraishin: the sub-block order on int8 tensor cores (see hiraishin/kernels/mmq/__init__.py).
//
// One CUDA block = one tile of 16 weight rows x HX_BLOCK_COLS columns; warp w sums K-segments
// w, w + HX_NWARPS, ... of those 16 rows (HX_WSPLIT 2: see below) (each segment in k order, its own accumulators), writes
// each segment's partials to shared memory, and after one barrier the block adds the segments in
// order 0..HX_NSEG-1. The exact integer dot product of every q8_1 block of 32 values comes from
// mma.sync (Q4_K: m16n8k32 per 32-value sub-block; Q6_K: m16n8k16 per 16-value sub-block); the
// float work per output is the same at every width. HX_ONECOL: the same float operations, done
// only for the one column that exists (the other 7 MMA columns are ignored). Wider launches do
// the float work for all 8 or 16 columns of a CUDA block (columns past ncols read column
// ncols-1 and are not written): skipping it per column was measured slower on the H200 (more
// registers; bench/results/2026-12-01-h200-mmq/README.md, run 2).
//
// Defines (launch.py): HX_QTYPE (ggml id: 12 Q4_K, 14 Q6_K), HX_BLOCK_BYTES, HX_Q8_BYTES,
// HX_NB (super-blocks per row), HX_NSEG, HX_NWARPS, HX_NT (n-tiles of 8 columns per CUDA block),
// HX_ONECOL (0/1), HX_MIN_BLOCKS (register cap as resident blocks per SM), HX_PREFETCH_X (0/1,
// one n-tile only: a super-block's activations loaded before its weights), HX_CGROUPS (column groups
// of HX_BLOCK_COLS per row tile along blockIdx.x, launch.py launch_grid: the CUDA blocks that read one
// weight tile for different columns run side by side, so all but the first find it in L2).
//
// Weights: ggml's rows, or (HX_WTILE 1; mma_rows.cu) 16-row tile records whose loads read contiguous
// bytes across a warp.
//
// Activations: llama.cpp's q8_1 blocks (fp16 d, fp16 s, int8 q[32]; 36 bytes), one row of
// K/32 blocks per column; or, HX_XLAYOUT 1, the same bytes regrouped per super-block so that a lane
// loads its B fragments of two blocks in one 16-byte load and the ds words of four blocks in another
// (quantize/layout.py MMA_Q4_K / MMA_Q6_K; Q4_K rows then read with mma_rows.cu's 8-byte k slots); or,
// HX_XLAYOUT 2, those records with each group of 8 columns interleaved (MMA8_*), so that the 8 lanes of a
// load that read 8 columns read 512 contiguous bytes.
// Only where the integers and fp16 scales are fetched from changes: no float operation does.
// Fragment facts (PTX ISA, mma.m16n8k32 / m16n8k16 .s8; lane = 4g + t):
// A regs a0 (row g, k 4t..4t+3), a1 (row g+8, same k), [k32: a2 (row g, k 16+4t..), a3 (row
// g+8, k 16+4t..)]; B regs b0 (k 4t..4t+3, column g) [k32: b1 (k 16+4t.., column g)];
// C c0 (row g, column 2t), c1 (row g, 2t+1), c2 (row g+8, 2t), c3 (row g+8, 2t+1).

#define HX_TILE_ROWS 16
// HX_MT (1 or 2): row tiles of 16 per warp, so a CUDA block is HX_MT * 16 rows. The activations a warp loads
// for a super-block (its B fragments and fp16 scales) then serve two row tiles instead of one: at 9..16 columns
// those loads are most of what keeps L1 busy (Nsight Compute, bench/results/2026-12-03-h200-session11: L1/TEX
// 71-81%, the busiest unit). Each row's float operations are the same whatever tile it sits in. Measured slower
// on the H200 (222 registers, half the warps per SM; hiraishin/plans/subblock.py ENV_MMQ_MTILES): off by default.
#ifndef HX_MT
#define HX_MT 1
#endif
#define HX_BLOCK_ROWS (HX_TILE_ROWS * HX_MT)
#ifndef HX_CGROUPS
#define HX_CGROUPS 1
#endif
#ifndef HX_PREFETCH_X
#define HX_PREFETCH_X 0
#endif
#if HX_PREFETCH_X && HX_NT != 1
#error "HX_PREFETCH_X needs HX_NT == 1"
#endif
#define HX_COLS (8 * HX_NT)  // columns of one warp
// HX_WSPLIT (1 or 2): the warps of a CUDA block split over column groups of HX_COLS: warp w takes columns
// col0 + HX_COLS * (w % HX_WSPLIT) .. and segments w / HX_WSPLIT, + HX_SEG_WARPS, ... So 16 columns can be
// two warps of one n-tile each that read the same weight rows at the same time (the second from L1), in
// place of one warp holding two n-tiles (registers). Which warp sums what changes no float operation.
#ifndef HX_WSPLIT
#define HX_WSPLIT 1
#endif
#if HX_NWARPS % HX_WSPLIT
#error "HX_NWARPS must be a multiple of HX_WSPLIT"
#endif
#define HX_SEG_WARPS (HX_NWARPS / HX_WSPLIT)  // warps per column group: each takes every HX_SEG_WARPS-th segment
#define HX_BLOCK_COLS (HX_COLS * HX_WSPLIT)   // columns of a CUDA block
// HX_LIVE (0, 2 or 4; one n-tile, not HX_ONECOL, not HX_PREFETCH_X): launches of at most HX_LIVE
// columns move each MMA's C fragment across the lanes of the warp (__shfl_sync) so that the float
// work of the live columns is shared by all 32 lanes: HX_LIVE_NE outputs per lane instead of 4, each
// with the very float operations, in the very order, it gets without HX_LIVE (the integer C is
// exact wherever it sits). Lane (g, t) then owns row g + 8 * live_half and columns live_col[u],
// u < HX_LIVE_NE:
//   HX_LIVE 2: half t >> 1, column t & 1        (C element t of lane (g, 0))
//   HX_LIVE 4: half t & 1, columns 2(t >> 1)+u   (C elements 2*half+u of lane (g, t >> 1))
#ifndef HX_LIVE
#define HX_LIVE 0
#endif
#if HX_LIVE != 0 && HX_LIVE != 2 && HX_LIVE != 4
#error "HX_LIVE must be 0, 2 or 4"
#endif
#if HX_LIVE && (HX_NT != 1 || HX_ONECOL || HX_PREFETCH_X || HX_WSPLIT != 1)
#error "HX_LIVE needs one n-tile, the several-column kernel, no HX_PREFETCH_X and no HX_WSPLIT"
#endif
#if HX_ONECOL && HX_WSPLIT != 1
#error "HX_WSPLIT: several columns only"
#endif
#define HX_LIVE_NE (HX_LIVE == 2 ? 1 : 2)
// columns of a CUDA block's partial sums in shared memory
#define HX_PCOLS (HX_ONECOL ? 1 : HX_LIVE ? HX_LIVE : HX_BLOCK_COLS)
// HX_PREFETCH_W (0/1): the CUDA block's 16 weight rows asked of L2 before it waits on the previous
// kernel (HX_PDL_ENTRY), as mmvq.cu's blocks do: weights are never written, so under programmatic
// dependent launch their DRAM latency overlaps the previous kernel's tail. A cache hint only.
#ifndef HX_PREFETCH_W
#define HX_PREFETCH_W 0
#endif

// HX_PREFETCH_NEXT (0/1): at each super-block a warp asks L2 for the tile's 16 rows of the super-block
// it reads next (the next one of its K-segment, else the first of its next segment), so that the
// DRAM latency of those loads overlaps this super-block's MMAs. A cache hint only: no bit changes.
#ifndef HX_PREFETCH_NEXT
#define HX_PREFETCH_NEXT 0
#endif

// HX_PIPELINE_W (0/1; Q4_K): a warp issues the loads of the super-block it multiplies next (the next one
// of its K-segment, else the first of its next segment) before the MMAs of the current one, into
// registers (mma_rows.cu hx_fetch_row), and decodes them when it gets there: the same loads and the
// same float operations, only the loads earlier. Its first fetch goes before the PDL wait (weights are
// never written), as the dp4a kernel's and mmvq.cu's one-column loads do, so under programmatic dependent
// launch it overlaps the previous kernel's tail. (Q6_K's 2-byte aligned rows shift their words as they
// arrive, so a fetch there would wait on its own loads.)
#ifndef HX_PIPELINE_W
#define HX_PIPELINE_W 0
#endif
#if HX_PIPELINE_W && HX_QTYPE != 12
#error "HX_PIPELINE_W: Q4_K rows only"
#endif

// HX_STAGE_W (0/1; Q4_K; its stages in dynamic shared memory, launch.py stage_bytes): each warp copies the tile's
// 16 rows of the super-block it multiplies next into its own shared-memory stage with cp.async (no register
// holds them in flight) while it multiplies the current one from the other stage, and the first copy is
// issued before the wait on the previous kernel (weights are never written). The same bytes reach the same
// registers: no float operation changes.
#ifndef HX_STAGE_W
#define HX_STAGE_W 0
#endif
#if HX_WTILE && (HX_STAGE_W || HX_PREFETCH_NEXT)
#error "HX_WTILE: not with HX_STAGE_W or HX_PREFETCH_NEXT (both address ggml's rows)"
#endif
#if HX_STAGE_W && (HX_QTYPE != 12 || HX_PIPELINE_W || HX_PREFETCH_NEXT)
#error "HX_STAGE_W: Q4_K rows, without HX_PIPELINE_W and HX_PREFETCH_NEXT"
#endif
#define HX_STAGE_ROWS_BYTES (HX_TILE_ROWS * HX_BLOCK_BYTES)  // one stage: the tile's 16 rows of one super-block
// dynamic shared memory a launch gives the kernel (launch.py stage_bytes computes the same)
#define HX_STAGE_BYTES (HX_STAGE_W ? HX_NWARPS * 2 * HX_STAGE_ROWS_BYTES : 0)
#if HX_MT != 1 && HX_MT != 2
#error "HX_MT must be 1 or 2"
#endif
#if HX_MT > 1 && (HX_ONECOL || HX_LIVE || HX_PREFETCH_X || HX_STAGE_W || HX_PIPELINE_W || HX_PREFETCH_NEXT || HX_WSPLIT != 1)
#error "HX_MT 2: the several-column kernel without HX_LIVE, HX_PREFETCH_X, HX_STAGE_W, HX_PIPELINE_W, HX_PREFETCH_NEXT, HX_WSPLIT"
#endif

// mma.sync helpers and the weight-row loads: mma_rows.cu (compiled before this file; HX_XLAYOUT there).

// Byte offsets, in a column's activations, of block jj (0..7) of super-block i: its ds word, and its
// int for the MMA k slots 4t.. (h = 0) or 16 + 4t.. (h = 1) of lane (g, t).
#define HX_X_REC (8 * HX_Q8_BYTES)
#if HX_XLAYOUT == 2  // (relative to mma_rows.cu hx_x_col: a group's super-block records are 8 columns' worth)
#define HX_X_DS(i, jj) ((size_t)(i) * 8 * HX_X_REC + 4 * (jj))
#define HX_X_INT(i, jj, t, h) ((size_t)(i) * 8 * HX_X_REC + 512 * ((jj) >> 1) + 16 * (t) + 8 * ((jj) & 1) + 4 * (h))
#elif HX_XLAYOUT
#define HX_X_DS(i, jj) ((size_t)(i) * HX_X_REC + 4 * (jj))
#define HX_X_INT(i, jj, t, h) ((size_t)(i) * HX_X_REC + 32 + 64 * ((jj) >> 1) + 16 * (t) + 8 * ((jj) & 1) + 4 * (h))
#else
#define HX_X_DS(i, jj) ((size_t)(8 * (i) + (jj)) * HX_Q8_BYTES)
#define HX_X_INT(i, jj, t, h) ((size_t)(8 * (i) + (jj)) * HX_Q8_BYTES + 4 + 16 * (h) + 4 * (t))
#endif

__device__ __forceinline__ unsigned int hx_u4_at(const uint4& v, const int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint4 hx_u4_zero() {
    uint4 v;
    v.x = v.y = v.z = v.w = 0u;
    return v;
}

// Rows row0 .. row0+HX_BLOCK_ROWS-1 (those that exist) of the weight into L2 (fp.cuh hx_prefetch_lines).
__device__ __forceinline__ void hx_prefetch_tile(const unsigned char* w, const int nrows, const int row0) {
    const long long row_bytes = (long long)HX_NB * HX_BLOCK_BYTES;
    const int rows = min(HX_BLOCK_ROWS, nrows - row0);
    hx_prefetch_lines(w + row0 * row_bytes, rows * row_bytes, threadIdx.x, blockDim.x);
}

// The super-block a warp multiplies after super-block i of its segment s (ending at sb1): the next one of
// the segment, else the first of its next segment, else -1 (HX_PREFETCH_NEXT, HX_PIPELINE_W, HX_STAGE_W).
__device__ __forceinline__ int hx_next_sb(const int s, const int i, const int sb1) {
    const int s2 = s + HX_SEG_WARPS;
    return i + 1 < sb1 ? i + 1 : (s2 < HX_NSEG ? s2 * HX_NB / HX_NSEG : -1);
}

// The CUDA block's column group (launch.py launch_grid): its first column.
__device__ __forceinline__ int hx_col0() {
    return ((int)blockIdx.y * HX_CGROUPS + (int)blockIdx.x % HX_CGROUPS) * HX_BLOCK_COLS;
}

// One CUDA block's work: the rows row0 .. row0+HX_BLOCK_ROWS-1 of weight w, columns col0 .. col0+HX_BLOCK_COLS-1
// (every thread of the block calls it; one barrier).
__device__ __forceinline__ void hx_mmq_tile(const unsigned char* __restrict__ w, const unsigned char* __restrict__ xq,
                                            float* __restrict__ out, const int nrows, const int ncols,
                                            const long long out_stride, const int row0, const int col0) {
    __shared__ float part[HX_NSEG][HX_BLOCK_ROWS][HX_PCOLS];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wcg = warp % HX_WSPLIT, wseg = warp / HX_WSPLIT;  // the warp's column group, first segment
    const hx_mma_ptrs ptr = hx_mma_pointers(w, xq, nrows, ncols, row0, col0 + HX_COLS * wcg, g, t);
    const unsigned char* wA = ptr.wA;
    const unsigned char* wB = ptr.wB;
    const unsigned char* wAm[HX_MT];  // rows g and g + 8 of each row tile (clamped to the last row)
    const unsigned char* wBm[HX_MT];
#pragma unroll
    for (int m = 0; m < HX_MT; ++m) {
        const size_t row_bytes = (size_t)HX_NB * HX_BLOCK_BYTES;
#if HX_WTILE  // row tile m's rows g, g + 8 (a tile past the last: the last)
        (void)row_bytes;
        const int tm = min(row0 + HX_TILE_ROWS * m, nrows - 1) & ~(HX_TILE_ROWS - 1);
        wAm[m] = m == 0 ? wA : HX_W_ROW(w, tm + g);
        wBm[m] = m == 0 ? wB : HX_W_ROW(w, tm + g + 8);
#else
        wAm[m] = m == 0 ? wA : w + (size_t)min(row0 + HX_TILE_ROWS * m + g, nrows - 1) * row_bytes;
        wBm[m] = m == 0 ? wB : w + (size_t)min(row0 + HX_TILE_ROWS * m + g + 8, nrows - 1) * row_bytes;
#endif
    }
#if HX_LIVE
    const int live_half = HX_LIVE == 2 ? t >> 1 : t & 1;            // row g + 8 * live_half
    const int live_src = 4 * g + (HX_LIVE == 2 ? 0 : t >> 1);        // the lane whose C holds them
    int live_col[HX_LIVE_NE];
    const unsigned char* live_x[HX_LIVE_NE];                         // q8_1 rows of those columns
#pragma unroll
    for (int u = 0; u < HX_LIVE_NE; ++u) {
        live_col[u] = HX_LIVE == 2 ? t & 1 : 2 * (t >> 1) + u;
        live_x[u] = hx_x_col(xq, min(col0 + live_col[u], ncols - 1), false);
    }
#endif

#if HX_STAGE_W
    // the stages live in dynamic shared memory (HX_STAGE_BYTES, launch.py stage_bytes): 8 warps of two-n-tile
    // launches need 36 KB of them beside 16 KB of partial sums, more than a block may declare statically
    extern __shared__ __align__(16) float hx_stage_mem[];
    unsigned char* const stage_warp = reinterpret_cast<unsigned char*>(hx_stage_mem) + warp * 2 * HX_STAGE_ROWS_BYTES;
    // copy super-block i of the tile's rows (clamped to the last, as hx_mma_pointers) into stage b of this warp
    const auto stage_issue = [&](const int i, const int b) {
        constexpr int CHUNKS = HX_BLOCK_BYTES / 16;  // 9 per Q4_K row
        const size_t row_bytes = (size_t)HX_NB * HX_BLOCK_BYTES;
        for (int c = lane; c < HX_TILE_ROWS * CHUNKS; c += 32) {
            const int r = c / CHUNKS, q = c % CHUNKS;
            hx_cp_async16(stage_warp + b * HX_STAGE_ROWS_BYTES + r * HX_BLOCK_BYTES + 16 * q,
                          w + (size_t)min(row0 + r, nrows - 1) * row_bytes + (size_t)i * HX_BLOCK_BYTES + 16 * q);
        }
        hx_cp_async_commit();
    };
    int stage_b = 0;
    if (wseg < HX_NSEG) stage_issue(wseg * HX_NB / HX_NSEG, 0);
    HX_PDL_ENTRY();  // (hx_mmq and hx_mmq_multi leave it here: the first copy goes before it)
#endif
#if HX_PIPELINE_W
    hx_row_raw nA, nB;  // the next super-block's bytes, in flight
    if (wseg < HX_NSEG) {
        const size_t sb = (size_t)(wseg * HX_NB / HX_NSEG) * HX_SB_STRIDE;
        hx_fetch_row(wA + sb, g, t, nA);
        hx_fetch_row(wB + sb, g + 8, t, nB);
    }
    HX_PDL_ENTRY();  // (hx_mmq and hx_mmq_multi leave it here: the first fetch goes before it)
#endif
    for (int s = wseg; s < HX_NSEG; s += HX_SEG_WARPS) {
        const int sb0 = s * HX_NB / HX_NSEG, sb1 = (s + 1) * HX_NB / HX_NSEG;
        float acc[HX_MT][HX_NT][4];
#pragma unroll
        for (int m = 0; m < HX_MT; ++m)
#pragma unroll
            for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[m][nt][e] = 0.0f;  // HX_LIVE: acc[0][0][u], u < HX_LIVE_NE

        for (int i = sb0; i < sb1; ++i) {
#if HX_PREFETCH_NEXT
            {
                const int nxt = hx_next_sb(s, i, sb1);
                if (nxt >= 0) {  // uniform per warp; lines of bytes 0, 128 and the last of each row's block
                    const size_t row_bytes = (size_t)HX_NB * HX_BLOCK_BYTES;
                    for (int j = lane; j < 3 * HX_TILE_ROWS; j += 32) {
                        const int r = min(row0 + j % HX_TILE_ROWS, nrows - 1), which = j / HX_TILE_ROWS;
                        const int off = which == 0 ? 0 : which == 1 ? 128 : HX_BLOCK_BYTES - 1;
                        const size_t at = r * row_bytes + (size_t)nxt * HX_BLOCK_BYTES + off;
                        if (off < HX_BLOCK_BYTES) HX_PREFETCH_L2(w + at);
                    }
                }
            }
#endif
#if HX_PREFETCH_X
            // the super-block's activation ints and fp16 scales loaded ahead of the weights
            // (one n-tile only: 24-32 more live registers); changes no bit
            int bxp[8][2];
            unsigned int dsp[8][2];
#if HX_XLAYOUT
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int4 v = *(const int4*)(ptr.xb[0] + HX_X_INT(i, 2 * k, t, 0));
                bxp[2 * k][0] = v.x; bxp[2 * k][1] = v.y; bxp[2 * k + 1][0] = v.z; bxp[2 * k + 1][1] = v.w;
            }
#pragma unroll
            for (int q = 0; q < 2; ++q) {
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const uint4 v = (HX_ONECOL && e2) ? hx_u4_zero()
                                                      : *(const uint4*)(ptr.xc[0][e2] + HX_X_DS(i, 4 * q));
#pragma unroll
                    for (int c = 0; c < 4; ++c) dsp[4 * q + c][e2] = hx_u4_at(v, c);
                }
            }
#else
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                bxp[jj][0] = hx_ld32(ptr.xb[0] + HX_X_INT(i, jj, t, 0));
                bxp[jj][1] = hx_ld32(ptr.xb[0] + HX_X_INT(i, jj, t, 1));
                dsp[jj][0] = *(const unsigned int*)(ptr.xc[0][0] + HX_X_DS(i, jj));
                dsp[jj][1] = HX_ONECOL ? 0u : *(const unsigned int*)(ptr.xc[0][1] + HX_X_DS(i, jj));
            }
#endif
#elif HX_XLAYOUT
            // this super-block's activations: per n-tile, the lane's ints of each pair of blocks (one
            // 16-byte load, at the pair's first block) and the ds words of columns 2t, 2t+1 of each
            // four blocks (one 16-byte load each, at the four's first block)
            int4 xv[HX_NT];
            uint4 dv[HX_NT][2];
#endif
            hx_row_sb rAm[HX_MT], rBm[HX_MT];  // row tile m's rows g, g + 8 (the paths below HX_MT 1 fill [0] only)
            hx_row_sb& rA = rAm[0];
            hx_row_sb& rB = rBm[0];
#if HX_PIPELINE_W
            hx_decode_row(nA, rA);
            hx_decode_row(nB, rB);
            {   // every segment has a super-block (NSEG <= NB), so each one's first was fetched ahead
                const int nxt = hx_next_sb(s, i, sb1);
                if (nxt >= 0) {  // uniform per warp
                    hx_fetch_row(wA + (size_t)nxt * HX_SB_STRIDE, g, t, nA);
                    hx_fetch_row(wB + (size_t)nxt * HX_SB_STRIDE, g + 8, t, nB);
                }
            }
#elif HX_STAGE_W
            {
                const int nxt = hx_next_sb(s, i, sb1);
                if (nxt >= 0) {  // uniform per warp: the next copy in flight, this one landed
                    stage_issue(nxt, stage_b ^ 1);
                    hx_cp_async_wait<1>();
                } else {
                    hx_cp_async_wait<0>();
                }
                __syncwarp();  // every lane's copies of this stage are visible to the warp
                const unsigned char* st = stage_warp + stage_b * HX_STAGE_ROWS_BYTES;
                hx_load_row(st + g * HX_BLOCK_BYTES, t, rA);
                hx_load_row(st + (g + 8) * HX_BLOCK_BYTES, t, rB);
                __syncwarp();  // read by every lane before the next super-block's copy refills it
                stage_b ^= 1;
            }
#else
#pragma unroll
            for (int m = 0; m < HX_MT; ++m) {
#if HX_WTILE  // (row g + 8's pieces: 8 rows' worth past row g's; one pointer a tile)
                hx_load_row(wAm[m] + (size_t)i * HX_SB_STRIDE, g, t, rAm[m]);
                hx_load_row(wAm[m] + (size_t)i * HX_SB_STRIDE + 8 * HX_WPIECE, g + 8, t, rBm[m]);
#else
                hx_load_row(wAm[m] + (size_t)i * HX_SB_STRIDE, g, t, rAm[m]);
                hx_load_row(wBm[m] + (size_t)i * HX_SB_STRIDE, g + 8, t, rBm[m]);
#endif
            }
#endif
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {   // q8_1 block 8i + jj, in k order
                // per row tile m: the A fragments and scales of this sub-block (rows g: A, g + 8: B)
#if HX_QTYPE == 12
                const int jp = jj >> 1, sh = 4 * (jj & 1);
                int a0[HX_MT], a1[HX_MT], a2[HX_MT], a3[HX_MT];
                float wsAm[HX_MT], wmAm[HX_MT], wsBm[HX_MT], wmBm[HX_MT];
#pragma unroll
                for (int m = 0; m < HX_MT; ++m) {
                    a0[m] = (rAm[m].q[2 * jp] >> sh) & 0x0F0F0F0F;
                    a1[m] = (rBm[m].q[2 * jp] >> sh) & 0x0F0F0F0F;
                    a2[m] = (rAm[m].q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
                    a3[m] = (rBm[m].q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
                    wsAm[m] = hx_q4_ws(rAm[m], jj); wmAm[m] = hx_q4_wm(rAm[m], jj);  // this sub-block's scale products
                    wsBm[m] = hx_q4_ws(rBm[m], jj); wmBm[m] = hx_q4_wm(rBm[m], jj);
                }
                const float wsA = wsAm[0], wmA = wmAm[0], wsB = wsBm[0], wmB = wmBm[0];  // (HX_LIVE: one row tile)
#else
                const int n = jj >> 2, bb = jj & 3;
                const int si = 2 * jj;  // scale index of the first 16-value half
                int lA0[HX_MT], lB0[HX_MT], lA1[HX_MT], lB1[HX_MT], scA0[HX_MT], scA1[HX_MT], scB0[HX_MT], scB1[HX_MT];
#pragma unroll
                for (int m = 0; m < HX_MT; ++m) {
                    lA0[m] = hx_q6_vals(rAm[m], n, bb, 0); lB0[m] = hx_q6_vals(rBm[m], n, bb, 0);
                    lA1[m] = hx_q6_vals(rAm[m], n, bb, 1); lB1[m] = hx_q6_vals(rBm[m], n, bb, 1);
                    scA0[m] = hx_sbyte(rAm[m].sc[si >> 2], si & 3); scA1[m] = hx_sbyte(rAm[m].sc[si >> 2], (si & 3) + 1);
                    scB0[m] = hx_sbyte(rBm[m].sc[si >> 2], si & 3); scB1[m] = hx_sbyte(rBm[m].sc[si >> 2], (si & 3) + 1);
                }
#endif
#pragma unroll
                for (int nt = 0; nt < HX_NT; ++nt) {
#if HX_PREFETCH_X
                    const int b0 = bxp[jj][0], b1 = bxp[jj][1];
#elif HX_XLAYOUT
                    if ((jj & 1) == 0) xv[nt] = *(const int4*)(ptr.xb[nt] + HX_X_INT(i, jj, t, 0));
                    if ((jj & 3) == 0) {
                        dv[nt][0] = *(const uint4*)(ptr.xc[nt][0] + HX_X_DS(i, jj));
                        dv[nt][1] = HX_ONECOL ? hx_u4_zero() : *(const uint4*)(ptr.xc[nt][1] + HX_X_DS(i, jj));
                    }
                    const int b0 = (jj & 1) ? xv[nt].z : xv[nt].x;
                    const int b1 = (jj & 1) ? xv[nt].w : xv[nt].y;
#else
                    const int b0 = hx_ld32(ptr.xb[nt] + HX_X_INT(i, jj, t, 0));
                    const int b1 = hx_ld32(ptr.xb[nt] + HX_X_INT(i, jj, t, 1));
#endif
#pragma unroll
                    for (int m = 0; m < HX_MT; ++m) {  // the same B fragments and scales for every row tile
                    int c[4];
#if HX_QTYPE == 12
                    hx_mma_k32(c, a0[m], a1[m], a2[m], a3[m], b0, b1);
#else
                    int c1[4];
                    hx_mma_k16(c, lA0[m], lB0[m], b0);
                    hx_mma_k16(c1, lA1[m], lB1[m], b1);
                    c[0] = scA0[m] * c[0] + scA1[m] * c1[0];
                    c[1] = scA0[m] * c[1] + scA1[m] * c1[1];
                    c[2] = scB0[m] * c[2] + scB1[m] * c1[2];
                    c[3] = scB0[m] * c[3] + scB1[m] * c1[3];
#endif
#if HX_LIVE
                    // every lane of the warp takes part (the loops above are uniform per warp)
                    int cv[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) cv[e] = __shfl_sync(0xffffffffu, c[e], live_src, 32);
#pragma unroll
                    for (int u = 0; u < HX_LIVE_NE; ++u) {
                        const int ce = HX_LIVE == 2 ? (t == 0 ? cv[0] : t == 1 ? cv[1] : t == 2 ? cv[2] : cv[3])
                                                    : (live_half ? cv[2 + u] : cv[u]);
                        const unsigned int ds = *(const unsigned int*)(live_x[u] + HX_X_DS(i, jj));
                        const float dx = hx_h2f((unsigned short)(ds & 0xFFFF));
#if HX_QTYPE == 12
                        const float sx = hx_h2f((unsigned short)(ds >> 16));
                        const float ws = live_half ? wsB : wsA;
                        const float wm = live_half ? wmB : wmA;
                        acc[0][0][u] = __fmaf_rn(__fmul_rn(ws, dx), (float)ce, acc[0][0][u]);
                        acc[0][0][u] = __fmaf_rn(-wm, sx, acc[0][0][u]);
#else
                        const float dw = live_half ? rB.d : rA.d;
                        acc[0][0][u] = __fmaf_rn(__fmul_rn(dw, dx), (float)ce, acc[0][0][u]);
#endif
                    }
#else
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (HX_ONECOL && (e & 1)) continue;  // column 2t+1 >= 1 does not exist
                        if (HX_ONECOL && t != 0) continue;   // column 2t >= 1 does not exist
#if HX_PREFETCH_X
                        const unsigned int ds = dsp[jj][e & 1];
#elif HX_XLAYOUT
                        const unsigned int ds = hx_u4_at(dv[nt][e & 1], jj & 3);
#else
                        const unsigned int ds = *(const unsigned int*)(ptr.xc[nt][e & 1] + HX_X_DS(i, jj));
#endif
                        const float dx = hx_h2f((unsigned short)(ds & 0xFFFF));
#if HX_QTYPE == 12
                        const float sx = hx_h2f((unsigned short)(ds >> 16));
                        const float ws = e < 2 ? wsAm[m] : wsBm[m];
                        const float wm = e < 2 ? wmAm[m] : wmBm[m];
                        acc[m][nt][e] = __fmaf_rn(__fmul_rn(ws, dx), (float)c[e], acc[m][nt][e]);
                        acc[m][nt][e] = __fmaf_rn(-wm, sx, acc[m][nt][e]);
#else
                        const float dw = e < 2 ? rAm[m].d : rBm[m].d;
                        acc[m][nt][e] = __fmaf_rn(__fmul_rn(dw, dx), (float)c[e], acc[m][nt][e]);
#endif
                    }
#endif  // HX_LIVE
                    }  // row tiles
                }
            }
        }
#if HX_LIVE
#pragma unroll
        for (int u = 0; u < HX_LIVE_NE; ++u) part[s][g + 8 * live_half][live_col[u]] = acc[0][0][u];
#else
#pragma unroll
        for (int m = 0; m < HX_MT; ++m)
#pragma unroll
            for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (HX_ONECOL && ((e & 1) || t != 0)) continue;
                    const int rr = HX_TILE_ROWS * m + g + 8 * (e >> 1);
                    const int cc = HX_ONECOL ? 0 : HX_COLS * wcg + 8 * nt + 2 * t + (e & 1);
                    part[s][rr][cc] = acc[m][nt][e];
                }
#endif
    }
    __syncthreads();
    constexpr int NOUT = HX_BLOCK_ROWS * HX_PCOLS;
    for (int o = threadIdx.x; o < NOUT; o += 32 * HX_NWARPS) {
        const int rr = o / HX_PCOLS;
        const int cc = o % HX_PCOLS;
        float v = part[0][rr][cc];
#pragma unroll
        for (int s = 1; s < HX_NSEG; ++s) v = __fadd_rn(v, part[s][rr][cc]);
        if (row0 + rr < nrows && col0 + cc < ncols) out[(size_t)(col0 + cc) * out_stride + row0 + rr] = v;
    }
}

extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
hx_mmq(const unsigned char* __restrict__ w, const unsigned char* __restrict__ xq, float* __restrict__ out,
       const int nrows, const int ncols, const long long out_stride) {
    const int row0 = (int)(blockIdx.x / HX_CGROUPS) * HX_BLOCK_ROWS;
    const int col0 = hx_col0();
    if (HX_PREFETCH_W && col0 == 0) hx_prefetch_tile(w, nrows, row0);
    if (!HX_STAGE_W && !HX_PIPELINE_W) HX_PDL_ENTRY();  // (else in hx_mmq_tile, after the first weight loads)
    hx_mmq_tile(w, xq, out, nrows, ncols, out_stride, row0, col0);
}

// Up to three weights of one type, row length and plan that read the same activations (Q, K and V;
// gate and up) in one launch, as mmvq.cu's mmvq_multi: row tiles 0..ntile0-1 (blockIdx.x) are weight
// 0's, the next ntile1 weight 1's, the rest weight 2's. Each tile is hx_mmq's (which weights share a
// launch changes no bit); weight i writes out_i, ncols rows of nrows_i floats.
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
hx_mmq_multi(const unsigned char* __restrict__ xq, const int ncols,
             const unsigned char* __restrict__ w0, float* __restrict__ out0, const int nrows0, const int ntile0,
             const unsigned char* __restrict__ w1, float* __restrict__ out1, const int nrows1, const int ntile1,
             const unsigned char* __restrict__ w2, float* __restrict__ out2, const int nrows2) {
    const hx_weight_of_block p = hx_pick_weight(blockIdx.x / HX_CGROUPS, w0, out0, nrows0, ntile0, w1, out1, nrows1,
                                                ntile1, w2, out2, nrows2);
    const int col0 = hx_col0();
    if (HX_PREFETCH_W && col0 == 0) hx_prefetch_tile(p.w, p.nrows, p.index * HX_BLOCK_ROWS);
    if (!HX_STAGE_W && !HX_PIPELINE_W) HX_PDL_ENTRY();  // (else in hx_mmq_tile, after the first weight loads)
    hx_mmq_tile(p.w, xq, p.out, p.nrows, ncols, p.nrows, p.index * HX_BLOCK_ROWS, col0);
}
