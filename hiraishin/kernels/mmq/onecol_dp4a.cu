// hiraishin: the sub-block order on dp4a for one column (or a few, HX_DCOLS), one warp per weight row (compiled
// after mma_rows.cu).
//
// The order is mmq.cu's (hiraishin/kernels/mmq/__init__.py): per K-segment s a chain of float operations over its
// q8_1 blocks in k order, then the segments added in order 0..HX_NSEG-1. Only the exact integers C of the blocks,
// and which thread makes which float operation, differ from the MMA kernel's one-column form: here lane L of a
// warp owns the 128-value halves L*HX_UNITS .. L*HX_UNITS + HX_UNITS - 1 of its row (HX_NSEG = 16 segments, two
// lanes each, so a segment is the halves of lanes 2s and 2s+1), computes their C with __dp4a, and the chain of
// segment s runs through lane 2s, then, handed over by one shuffle, through lane 2s+1; the 16 segment values are
// then gathered by shuffles and added in order. MMA's one-column launch puts 16 rows in a warp, so a 1,024-row
// projection fills 64 CUDA blocks on 132 SMs (bench/results/2026-12-03-h200-session12: attn_k 1.27x the
// BATCH_VARIANT one-column mat-vec); a warp per row gives it 1,024 warps, as llama.cpp's one-column mat-vec.
//
// Defines (launch.py dp4a_defines): HX_QTYPE (12 Q4_K, 14 Q6_K), HX_BLOCK_BYTES, HX_Q8_BYTES, HX_NB (super-blocks
// per row, a multiple of 16), HX_NSEG (16), HX_NWARPS (rows per CUDA block), HX_MIN_BLOCKS, and for mma_rows.cu
// HX_NT 1, HX_XLAYOUT 1: the activations come in the MMA layouts of quantize/layout.py (per super-block the ds
// words of its 8 q8_1 blocks, then per pair k of blocks 2k, 2k+1 four 16-byte slots, slot t = MMA_Q4_K: ints 2t,
// 2t+1 of block 2k, the same of block 2k+1; MMA_Q6_K: ints t, t+4 of block 2k, the same of block 2k+1).
// Every weight load is issued before the PDL wait (weights are never written; mmvq.cu's one-column kernel does the
// same), the activations' after it.
// HX_DCOLS (plans/subblock.py SUBBLOCK_DP4A_COLS; default 1): columns of the launch. A lane's weights, loaded once,
// serve every column, and each column is summed as the one column is: the same float operations in the same order
// at every width, as the order asks. The columns share each phase (loads, chains, sums), so their latencies overlap;
// summed one after another (session 28's build) a launch of C columns cost about C one-column launches.
// HX_WSTAGE (launch.py DP4A_WSTAGE; 0 or 1): the CUDA block copies its HX_NWARPS weight rows (contiguous bytes) into
// shared memory with cp.async before the PDL wait, in coalesced 16-byte chunks, and each lane reads its half from
// there after the block's barrier. Read straight from global memory, a lane's 16-byte weight loads touch a line of
// their own too (lanes 2i, 2i + 1 read super-block i). A copy only: no bit changes.
// HX_WTILE (launch.py; Q4_K or Q6_K): the weight in mma_rows.cu's 16-row tile records, read where each lane's bytes
// sit there (the same bytes: no bit changes).
// HX_XSTAGE (launch.py DP4A_XSTAGE; 0 or 1): 1 copies the CUDA block's columns of activations into shared memory
// first, in coalesced 16-byte loads, and the lanes read them there. Read straight from global memory (0), each of a
// lane's nine 16-byte loads a column touches a cache line of its own (a lane reads its half's 128 contiguous bytes),
// so a warp's load is 32 L1 wavefronts where 4 would do, and every row (warp) reads the whole column again. A copy
// only: the same integers and float operations, no bit changes. H100, session 30: the 8B's one-token pass 2.597 ->
// 2.530 ms (2.469 at 8 rows a block); launches of 2-4 columns still cost about their columns' share more each (the
// extra columns' L1 reads were not what bounds them), so they stay off (plans/subblock.py SUBBLOCK_DP4A_COLS).

#if HX_NB >= 16 ? (HX_NSEG != 16 || HX_NB % 16) : (HX_NSEG != HX_NB || 16 % HX_NB)
#error "onecol_dp4a.cu: 16 K-segments of whole super-blocks (HX_NB a multiple of 16), or short rows of 1, 2, 4 or 8"
#endif
#ifndef HX_DCOLS
#define HX_DCOLS 1
#endif
#ifndef HX_XSTAGE
#define HX_XSTAGE 0
#endif
#ifndef HX_WSTAGE
#define HX_WSTAGE 0
#endif
// Rows of 16+ super-blocks: a warp per row, HX_UNITS halves a lane. Short rows (HX_NB = 1, 2, 4 or 8 super-blocks:
// one segment each, HX_NSEG = HX_NB): HX_RPW rows a warp, each on a group of HX_LPR = 2 * HX_NB lanes, one half a lane;
// the same per-segment chains through two lanes and the same in-order sum of the segments, within the group.
#define HX_UNITS (HX_NB >= 16 ? HX_NB / 16 : 1)  // 128-value halves of the row per lane
#define HX_LPR (HX_NB >= 16 ? 32 : 2 * HX_NB)    // lanes per row
#define HX_RPW (32 / HX_LPR)                      // rows per warp
#define HX_BLOCK_ROWS_DP4A (HX_NWARPS * HX_RPW)   // rows per CUDA block (launch.py: the plan's tile_rows)
#define HX_XCOL_BYTES ((size_t)HX_NB * 8 * HX_Q8_BYTES)  // one column of activations in the MMA layout
#define HX_UNIT_BLOCKS 4        // q8_1 blocks per half

// The 16 ints (values 4u..4u+3 of the half's blocks 4n + b, b = 0..3, u = 0..7) of a lane's half n of super-block
// i of one column in the MMA layout, as int x[b][u]; q: the half's 128 bytes (its pairs 2n, 2n + 1, 64 bytes each).
__device__ __forceinline__ void hx_dp4a_x(const unsigned char* q, int x[4][8]) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // pair k = 2n + p: blocks 4n + 2p, 4n + 2p + 1
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int4 v = *(const int4*)(q + 64 * p + 16 * t);
#if HX_QTYPE == 12
            x[2 * p][2 * t] = v.x; x[2 * p][2 * t + 1] = v.y; x[2 * p + 1][2 * t] = v.z; x[2 * p + 1][2 * t + 1] = v.w;
#else
            x[2 * p][t] = v.x; x[2 * p][t + 4] = v.y; x[2 * p + 1][t] = v.z; x[2 * p + 1][t + 4] = v.w;
#endif
        }
    }
}

#if HX_QTYPE == 12
// ---- Q4_K: a half is qs chunks 2n, 2n+1 (32 bytes each: sub-block 2k in the low nibbles, 2k+1 in the high) ----
struct hx_dp4a_w {
    uint4 h;      // d, dmin, scales[12] of the super-block
    int q[2][8];  // the two chunks' ints
};

// A half's bytes from its super-block's header and its two 32-byte qs chunks (c0: chunk 2n, c1: chunk 2n + 1).
__device__ __forceinline__ void hx_dp4a_fetch_at(const unsigned char* hdr, const unsigned char* c0,
                                                 const unsigned char* c1, hx_dp4a_w& r) {
    r.h = *(const uint4*)hdr;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const int4 q = *(const int4*)((p ? c1 : c0) + 16 * v);
            r.q[p][4 * v] = q.x; r.q[p][4 * v + 1] = q.y; r.q[p][4 * v + 2] = q.z; r.q[p][4 * v + 3] = q.w;
        }
    }
}

// sb: the row's super-block (HX_WTILE: HX_W_ROW's place in the record, rr the row within the tile; mma_rows.cu)
__device__ __forceinline__ void hx_dp4a_fetch(const unsigned char* sb, const int rr, const int n, hx_dp4a_w& r) {
    hx_dp4a_fetch_at(HX_Q4_HDR(sb, rr), HX_Q4_QS(sb, rr, 2 * n), HX_Q4_QS(sb, rr, 2 * n + 1), r);
}

// Block b of the half (sub-block jj = 4n + b): its exact C, (d*sc) * dx and dmin*m, sx (the chain's operands).
__device__ __forceinline__ void hx_dp4a_block(const hx_dp4a_w& w, const hx_row_sb& r, const int n, const int b,
                                              const int x[8], const unsigned int ds, int& c, float& mul, float& wm,
                                              float& sx) {
    const int sh = 4 * (b & 1);
    c = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) c = __dp4a((w.q[b >> 1][u] >> sh) & 0x0F0F0F0F, x[u], c);
    // sub-block 4n + b's d*sc and dmin*m, the float operations of hx_q4_ws / hx_q4_wm; the packed word is picked
    // by a select, not by r.sc[n]: n is the lane's, and an index by it put hx_row_sb on the stack (56 bytes of
    // local memory, 234 registers once the cap was relaxed for it under NVRTC; H100, session 28)
    const unsigned int scw = n ? r.sc[1] : r.sc[0], mw = n ? r.m[1] : r.m[0];
    const float ws = HX_Q4_SCALE(__fmul_rn(r.d, (float)((scw >> (8 * b)) & 0xFF)));
    mul = __fmul_rn(ws, hx_h2f((unsigned short)(ds & 0xFFFF)));
    wm = HX_Q4_SCALE(__fmul_rn(r.dmin, (float)((mw >> (8 * b)) & 0xFF)));
    sx = hx_h2f((unsigned short)(ds >> 16));
}
#else
// ---- Q6_K: half n is ql bytes [64n, +64), qh bytes [128 + 32n, +32), scales [192 + 8n, +8), d at 208; its
// blocks b = 0..3 are the quarters of the half (ql chunk b & 1, nibble b >> 1; qh bits 2b, 2b+1). Blocks of 210
// bytes: a super-block starts 2-byte aligned when its index is odd, so words are read aligned and funnel-shifted.
struct hx_dp4a_w {
    int ql[16], qh[8], sc[2];
    float d;
};

__device__ __forceinline__ void hx_dp4a_words(const unsigned char* p, const int sh, int* out, const int nw) {
    unsigned int lo = *(const unsigned int*)p;
    for (int u = 0; u < nw; ++u) {
        const unsigned int hi = *(const unsigned int*)(p + 4 * u + 4);
        out[u] = (int)__funnelshift_r(lo, hi, sh);
        lo = hi;
    }
}

// A half's words from 16-byte-aligned pieces: ql groups 4n .. 4n + 3 at ql[0..3], qh groups 8 + 2n, 9 + 2n at qh[0..1],
// the scales' group at sc (its bytes 8n .. 8n + 7 are the half's), d at d (tiles, from global or shared memory).
__device__ __forceinline__ void hx_dp4a_fetch6_at(const unsigned char* const ql[4], const unsigned char* const qh[2],
                                                  const unsigned char* sc, const unsigned char* d, const int n,
                                                  hx_dp4a_w& r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int4 v = *(const int4*)ql[j];
        r.ql[4 * j] = v.x; r.ql[4 * j + 1] = v.y; r.ql[4 * j + 2] = v.z; r.ql[4 * j + 3] = v.w;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int4 v = *(const int4*)qh[j];
        r.qh[4 * j] = v.x; r.qh[4 * j + 1] = v.y; r.qh[4 * j + 2] = v.z; r.qh[4 * j + 3] = v.w;
    }
    const int2 v = *(const int2*)(sc + 8 * n);
    r.sc[0] = v.x; r.sc[1] = v.y;
    r.d = hx_h2f(*(const unsigned short*)d);
}

__device__ __forceinline__ void hx_dp4a_fetch(const unsigned char* sb, const int rr, const int n, hx_dp4a_w& r) {
#if HX_WTILE  // (mma_rows.cu HX_Q6_G / HX_Q6_D: every group 16-byte aligned)
    const unsigned char* const ql[4] = {HX_Q6_G(sb, 4 * n), HX_Q6_G(sb, 4 * n + 1), HX_Q6_G(sb, 4 * n + 2),
                                        HX_Q6_G(sb, 4 * n + 3)};
    const unsigned char* const qh[2] = {HX_Q6_G(sb, 8 + 2 * n), HX_Q6_G(sb, 9 + 2 * n)};
    hx_dp4a_fetch6_at(ql, qh, HX_Q6_G(sb, 12), HX_Q6_D(sb, rr), n, r);
#else
    (void)rr;
    const int mis = (int)((size_t)sb & 2);  // 0 or 2 bytes past a word
    const unsigned char* a = sb - mis;
    hx_dp4a_words(a + 64 * n, 8 * mis, r.ql, 16);
    hx_dp4a_words(a + 128 + 32 * n, 8 * mis, r.qh, 8);
    hx_dp4a_words(a + 192 + 8 * n, 8 * mis, r.sc, 2);
    r.d = hx_h2f(*(const unsigned short*)(sb + 208));
#endif
}

__device__ __forceinline__ void hx_dp4a_block(const hx_dp4a_w& w, const int n, const int b, const int x[8],
                                              const unsigned int ds, int& c, float& mul) {
    int c01[2] = {0, 0};
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const unsigned int lo = ((unsigned int)w.ql[8 * (b & 1) + u] >> (4 * (b >> 1))) & 0x0F0F0F0Fu;
        const unsigned int hi = (((unsigned int)w.qh[u] >> (2 * b)) & 0x03030303u) << 4;
        c01[u >> 2] = __dp4a(hx_sub32_bytes((int)(lo | hi)), x[u], c01[u >> 2]);
    }
    c = hx_sbyte(w.sc[b >> 1], 2 * (b & 1)) * c01[0] + hx_sbyte(w.sc[b >> 1], 2 * (b & 1) + 1) * c01[1];
    mul = __fmul_rn(w.d, hx_h2f((unsigned short)(ds & 0xFFFF)));
}
#endif

#if HX_XSTAGE
// The shared copy (HX_XSTAGE): per column and super-block i its 8 ds words at ds[32 i] and its halves' 128 bytes of
// quants at q[HX_XS_REC i + HX_XS_HALF n]. With 288 (32 mod 128) and 144 (16 mod 128) the 8 lanes of a quarter warp
// (4 super-blocks, 2 halves at K = 4096; 8 halves 3 apart at K = 12288) read 8 different 16-byte bank groups.
#if HX_Q8_BYTES != 36
#error "HX_XSTAGE: records of 8 q8_1 blocks of 36 bytes (288 = 18 chunks of 16)"
#endif
#define HX_XS_REC 288
#define HX_XS_HALF 144
#define HX_XS_CHUNKS (HX_NB * 18)  // 16-byte chunks of a column: per super-block 2 of ds words, then 16 of quants

// Every thread of the CUDA block copies its share of the HX_DCOLS columns, then waits for the others.
__device__ __forceinline__ void hx_dp4a_stage(const unsigned char* __restrict__ xq, unsigned char* xs_q,
                                              unsigned char* xs_ds) {
    for (int j = threadIdx.x; j < HX_DCOLS * HX_XS_CHUNKS; j += blockDim.x) {
        const int col = j / HX_XS_CHUNKS, r = j - col * HX_XS_CHUNKS, i = r / 18, t = r - 18 * i;
        const int4 v = *(const int4*)(xq + col * HX_XCOL_BYTES + 16 * (size_t)r);
        unsigned char* dst = t < 2 ? xs_ds + col * (HX_NB * 32) + 32 * i + 16 * t
                                   : xs_q + col * (HX_NB * HX_XS_REC) + HX_XS_REC * i + HX_XS_HALF * ((t - 2) >> 3)
                                         + 16 * ((t - 2) & 7);
        *(int4*)dst = v;
    }
    __syncthreads();
}
#endif

#define HX_ROW_BYTES (HX_NB * HX_BLOCK_BYTES)
#if HX_WSTAGE
#if HX_NB != 16 || HX_ROW_BYTES % 16
#error "HX_WSTAGE: rows of 16 super-blocks (whole 16-byte chunks; launch.py keeps the copy within 48 KB)"
#endif
#if HX_WTILE && HX_QTYPE == 12
#if 16 % HX_NWARPS || HX_NWARPS < 4
#error "HX_WSTAGE of Q4_K tiles: 4, 8 or 16 rows a CUDA block (a whole part of each 16-row tile)"
#endif
// The copy of tiles (HX_WTILE): the block's HX_NWARPS rows hold, in each tile record, one contiguous piece of every
// qs chunk (HX_NWARPS * 32 bytes: HX_TS_P 16-byte units) and one of the headers (HX_NWARPS units). In shared memory
// record i starts at unit HX_TS_R * i, chunk q at HX_TS_O(q), the headers at HX_TS_H. A lane (super-block i, half n)
// reads chunks 2n and 2n + 1; with HX_TS_R = 2 (mod 8) and chunk 2 + p one unit past a multiple of 8 from chunk p, the
// 8 lanes of a quarter warp (4 super-blocks, 2 halves) read 8 different 16-byte bank groups, as the activations do.
#define HX_TS_P (2 * HX_NWARPS)
#define HX_TS_O(q) ((q) * HX_TS_P + ((q) >> 1))
#define HX_TS_H (4 * HX_TS_P + 2)
#define HX_TS_R (((HX_TS_H + HX_NWARPS + 5) / 8) * 8 + 2)
#define HX_TS_UNITS (4 * HX_TS_P + HX_NWARPS)  // a record's 16-byte units of this block
#elif HX_WTILE
#if HX_NWARPS != 8 && HX_NWARPS != 16
#error "HX_WSTAGE of Q6_K tiles: 8 or 16 rows a CUDA block (its rows' fp16 d whole 16-byte units)"
#endif
// Q6_K: the block's rows hold one piece of each of the 13 groups (HX_NWARPS units) and one of the d's (HX_NWARPS / 8
// units). Group q at HX_TS_O(q) (q = 13: the d's): a lane (super-block i, half n) reads ql groups 4n + j and qh groups
// 8 + 2n + p, one unit past a multiple of 8 from the other half's; with HX_TS_R = 2 (mod 8) a quarter warp's 8 lanes
// read 8 bank groups; both halves read the scales' group (8 bytes each) and the row's d.
#define HX_TS_O(q) ((q) * HX_NWARPS + ((q) >= 4) + ((q) >= 10))
#define HX_TS_H HX_TS_O(13)
#define HX_TS_R (((HX_TS_H + HX_NWARPS / 8 + 5) / 8) * 8 + 2)
#define HX_TS_UNITS (13 * HX_NWARPS + HX_NWARPS / 8)
#endif
// The block's rows row0 .. row0 + HX_NWARPS - 1 (each clamped to the last row) into ws, before the PDL wait: cp.async
// of 16-byte chunks where the weight is 16-byte aligned (a GGUF tensor is), else 2-byte copies of the same bytes
// (Q6_K super-blocks are 2-byte aligned; the copy then starts at ws + (w & 15), so that every super-block keeps its
// word alignment for hx_dp4a_fetch). Returns where the copy's first row starts. It reads the weight only (never
// written, so it may run before the PDL wait) and writes only the block's own shared memory (tests/test_pdl.py).
// HX_WTILE: the block's pieces of the records of its tile (HX_TS_*; rows row0 .. row0 + HX_NWARPS - 1 all exist: only
// weights of whole tiles are tiled), 16-byte aligned as the device buffer a tiled weight is made in.
__device__ __forceinline__ const unsigned char* hx_dp4a_wcopy(const unsigned char* __restrict__ w, const int nrows,
                                                             const int row0) {
#if HX_WTILE
    __shared__ __align__(16) unsigned char ws[HX_NB * HX_TS_R * 16];
    unsigned char* dst = ws;
    (void)nrows;
    const size_t tile = (size_t)(row0 & ~15) * HX_ROW_BYTES;
    const int rr0 = row0 & 15;
    for (int j = threadIdx.x; j < HX_NB * HX_TS_UNITS; j += blockDim.x) {
        const int i = j / HX_TS_UNITS, u = j - i * HX_TS_UNITS;
        const size_t rec = tile + (size_t)i * (16 * HX_BLOCK_BYTES);
#if HX_QTYPE == 12
        const int q = u / HX_TS_P;
        if (q < 4) {
            const int k = u - q * HX_TS_P;
            hx_cp_async16(dst + 16 * (HX_TS_R * i + HX_TS_O(q) + k), w + rec + 512 * q + 32 * rr0 + 16 * k);
        } else {
            const int k = u - 4 * HX_TS_P;
            hx_cp_async16(dst + 16 * (HX_TS_R * i + HX_TS_H + k), w + rec + 2048 + 16 * rr0 + 16 * k);
        }
#else
        const int q = u / HX_NWARPS, k = u - q * HX_NWARPS;  // q = 13: the d's
        if (q < 13) {
            hx_cp_async16(dst + 16 * (HX_TS_R * i + HX_TS_O(q) + k), w + rec + 256 * q + 16 * rr0 + 16 * k);
        } else {
            hx_cp_async16(dst + 16 * (HX_TS_R * i + HX_TS_H + k), w + rec + 3328 + 2 * rr0 + 16 * k);
        }
#endif
    }
    hx_cp_async_commit();
    return dst;
#else
    __shared__ __align__(16) unsigned char ws[HX_NWARPS * HX_ROW_BYTES + 16];
    const int mis = (int)((size_t)w & 15);
    unsigned char* dst = ws + mis;
    if (mis == 0) {
        constexpr int CHUNKS = HX_ROW_BYTES / 16;
        for (int j = threadIdx.x; j < HX_NWARPS * CHUNKS; j += blockDim.x) {
            const int r = j / CHUNKS, q = j - r * CHUNKS;
            hx_cp_async16(dst + r * HX_ROW_BYTES + 16 * q, w + (size_t)min(row0 + r, nrows - 1) * HX_ROW_BYTES + 16 * q);
        }
        hx_cp_async_commit();
    } else {
        constexpr int HALFWORDS = HX_ROW_BYTES / 2;
        for (int j = threadIdx.x; j < HX_NWARPS * HALFWORDS; j += blockDim.x) {
            const int r = j / HALFWORDS, q = j - r * HALFWORDS;
            *(unsigned short*)(dst + r * HX_ROW_BYTES + 2 * q) =
                *(const unsigned short*)(w + (size_t)min(row0 + r, nrows - 1) * HX_ROW_BYTES + 2 * q);
        }
    }
    return dst;
#endif
}
#endif

// A lane's weights of its row: its HX_UNITS halves.
struct hx_dp4a_lane {
    hx_dp4a_w u[HX_UNITS];
};

// A lane's weights of row `row` (clamped to the last row; only an existing row is written): loads only, issued
// before the PDL wait.
__device__ __forceinline__ void hx_dp4a_load(const unsigned char* __restrict__ w, const int nrows, const int row,
                                             hx_dp4a_lane& wl) {
    const int lane = threadIdx.x & (HX_LPR - 1);  // (its place in the row's group of lanes)
    const int r = min(row, nrows - 1);
    const unsigned char* wr = HX_W_ROW(w, r);
#pragma unroll
    for (int u = 0; u < HX_UNITS; ++u) {
        const int half = lane * HX_UNITS + u;
        hx_dp4a_fetch(wr + (size_t)(half >> 1) * HX_SB_STRIDE, HX_W_RR(r), half & 1, wl.u[u]);
    }
}

// Row `row` of the weight whose lane's part is wl, against the HX_DCOLS columns of xq (HX_XCOL_BYTES apart), into
// out[c * out_stride + row]. Each phase runs over every column before the next: all columns' activation loads and
// integer work, then the chains (the columns' in turn at each block: independent chains, each in its own order),
// then the segment sums; one column's float operations are the same whatever the width.
// (HX_WSTAGE: wl is unused; the lane's weights come from the block's copy ws after the barrier.)
__device__ __forceinline__ void hx_dp4a_cols(const hx_dp4a_lane& wl_loaded, const unsigned char* ws,
                                             const unsigned char* __restrict__ xq, float* __restrict__ out,
                                             const long long out_stride, const int nrows, const int row) {
    constexpr int C = HX_DCOLS;
    const int lane = threadIdx.x & 31;
    const int l = lane & (HX_LPR - 1), gbase = lane - l;  // the lane's place in its row's group, the group's first
#if HX_XSTAGE
    __shared__ __align__(16) unsigned char xs_q[C * HX_NB * HX_XS_REC];
    __shared__ __align__(16) unsigned char xs_ds[C * HX_NB * 32];
    hx_dp4a_stage(xq, xs_q, xs_ds);  // (its barrier also shows every thread's weight copies to the block)
#elif HX_WSTAGE
    __syncthreads();
#endif
#if HX_WSTAGE && HX_WTILE
    hx_dp4a_lane wl;  // the warp's row of the copy of tiles (HX_TS_*)
    {
        const int rr = (int)(threadIdx.x >> 5);
#pragma unroll
        for (int u = 0; u < HX_UNITS; ++u) {
            const int half = lane * HX_UNITS + u, n = half & 1;
            const unsigned char* rec = ws + 16 * HX_TS_R * (half >> 1);
#if HX_QTYPE == 12
            hx_dp4a_fetch_at(rec + 16 * HX_TS_H + 16 * rr, rec + 16 * HX_TS_O(2 * n) + 32 * rr,
                             rec + 16 * HX_TS_O(2 * n + 1) + 32 * rr, wl.u[u]);
#else
            const unsigned char* const ql[4] = {
                rec + 16 * (HX_TS_O(4 * n) + rr), rec + 16 * (HX_TS_O(4 * n + 1) + rr),
                rec + 16 * (HX_TS_O(4 * n + 2) + rr), rec + 16 * (HX_TS_O(4 * n + 3) + rr)};
            const unsigned char* const qh[2] = {
                rec + 16 * (HX_TS_O(8 + 2 * n) + rr), rec + 16 * (HX_TS_O(9 + 2 * n) + rr)};
            hx_dp4a_fetch6_at(ql, qh, rec + 16 * (HX_TS_O(12) + rr), rec + 16 * HX_TS_H + 2 * rr, n, wl.u[u]);
#endif
        }
    }
#elif HX_WSTAGE
    hx_dp4a_lane wl;
    hx_dp4a_load(ws, HX_NWARPS, (int)(threadIdx.x >> 5), wl);  // the warp's row of the copy
#else
    const hx_dp4a_lane& wl = wl_loaded;
    (void)ws;
#endif
    // every block's operands first (loads and integer work, independent of the chains)
    int c[C][HX_UNITS][HX_UNIT_BLOCKS];
    float mul[C][HX_UNITS][HX_UNIT_BLOCKS];
#if HX_QTYPE == 12
    float wm[C][HX_UNITS][HX_UNIT_BLOCKS], sx[C][HX_UNITS][HX_UNIT_BLOCKS];
#endif
#pragma unroll
    for (int u = 0; u < HX_UNITS; ++u) {
        const int half = l * HX_UNITS + u, i = half >> 1, n = half & 1;
#if HX_QTYPE == 12
        hx_row_raw raw;
        raw.h = wl.u[u].h;
        hx_row_sb r;
        hx_decode_row(raw, r);  // (its q[] are not used)
#endif
#pragma unroll
        for (int col = 0; col < C; ++col) {
#if HX_XSTAGE
            const unsigned char* q = xs_q + col * (HX_NB * HX_XS_REC) + HX_XS_REC * i + HX_XS_HALF * n;
            const uint4 dsv = *(const uint4*)(xs_ds + col * (HX_NB * 32) + 32 * i + 16 * n);
#else
            const unsigned char* rec = xq + col * HX_XCOL_BYTES + (size_t)i * (8 * HX_Q8_BYTES);
            const unsigned char* q = rec + 32 + 128 * n;
            const uint4 dsv = *(const uint4*)(rec + 16 * n);  // ds words of blocks 4n .. 4n + 3
#endif
            int x[4][8];
            hx_dp4a_x(q, x);
#pragma unroll
            for (int b = 0; b < HX_UNIT_BLOCKS; ++b) {
                const unsigned int ds = b == 0 ? dsv.x : b == 1 ? dsv.y : b == 2 ? dsv.z : dsv.w;
#if HX_QTYPE == 12
                hx_dp4a_block(wl.u[u], r, n, b, x[b], ds, c[col][u][b], mul[col][u][b], wm[col][u][b], sx[col][u][b]);
#else
                hx_dp4a_block(wl.u[u], n, b, x[b], ds, c[col][u][b], mul[col][u][b]);
#endif
            }
        }
    }

    // each segment's chain: lane 2s from 0, then lane 2s + 1 from where lane 2s stopped
    float acc[C];
#pragma unroll
    for (int col = 0; col < C; ++col) acc[col] = 0.0f;
#pragma unroll
    for (int turn = 0; turn < 2; ++turn) {
        if ((lane & 1) == turn) {
#pragma unroll
            for (int u = 0; u < HX_UNITS; ++u)
#pragma unroll
                for (int b = 0; b < HX_UNIT_BLOCKS; ++b)
#pragma unroll
                    for (int col = 0; col < C; ++col) {
                        acc[col] = __fmaf_rn(mul[col][u][b], (float)c[col][u][b], acc[col]);
#if HX_QTYPE == 12
                        acc[col] = __fmaf_rn(-wm[col][u][b], sx[col][u][b], acc[col]);
#endif
                    }
        }
        if (turn == 0) {
#pragma unroll
            for (int col = 0; col < C; ++col) acc[col] = __shfl_sync(0xffffffffu, acc[col], lane & ~1, 32);  // to 2s + 1
        }
    }
    // out = seg[0] + seg[1] + ... + seg[HX_NSEG - 1], in order (seg[s] is the group's lane 2s + 1's)
    float v[C];
#pragma unroll
    for (int col = 0; col < C; ++col) v[col] = __shfl_sync(0xffffffffu, acc[col], gbase + 1, 32);
#pragma unroll
    for (int s = 1; s < HX_NSEG; ++s)
#pragma unroll
        for (int col = 0; col < C; ++col)
            v[col] = __fadd_rn(v[col], __shfl_sync(0xffffffffu, acc[col], gbase + 2 * s + 1, 32));
    if (l == 0 && row < nrows) {
#pragma unroll
        for (int col = 0; col < C; ++col) out[col * out_stride + row] = v[col];
    }
}

// hx_mmq's arguments (ncols is HX_DCOLS): CUDA block b holds rows HX_BLOCK_ROWS_DP4A * b + HX_RPW * warp + lane group.
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
hx_mmq_dp4a(const unsigned char* __restrict__ w, const unsigned char* __restrict__ xq, float* __restrict__ out,
            const int nrows, const int ncols, const long long out_stride) {
    const int row = ((int)blockIdx.x * HX_NWARPS + (int)(threadIdx.x >> 5)) * HX_RPW + (int)(threadIdx.x & 31) / HX_LPR;
    hx_dp4a_lane wl;
    const unsigned char* ws = nullptr;
#if HX_WSTAGE
    ws = hx_dp4a_wcopy(w, nrows, (int)blockIdx.x * HX_BLOCK_ROWS_DP4A);
#else
    hx_dp4a_load(w, nrows, row, wl);
#endif
    HX_PDL_ENTRY();  // the activations are the previous kernel's output
#if HX_WSTAGE
    hx_cp_async_wait<0>();  // this thread's copies landed (the barrier in hx_dp4a_cols shows them to the block)
#endif
    hx_dp4a_cols(wl, ws, xq, out, out_stride, nrows, row);
}

// hx_mmq_multi's arguments: up to three weights reading the same column, CUDA blocks 0..ntile0-1 weight 0's, ...
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
hx_mmq_dp4a_multi(const unsigned char* __restrict__ xq, const int ncols,
                  const unsigned char* __restrict__ w0, float* __restrict__ out0, const int nrows0, const int ntile0,
                  const unsigned char* __restrict__ w1, float* __restrict__ out1, const int nrows1, const int ntile1,
                  const unsigned char* __restrict__ w2, float* __restrict__ out2, const int nrows2) {
    const hx_weight_of_block p = hx_pick_weight(blockIdx.x, w0, out0, nrows0, ntile0, w1, out1, nrows1, ntile1, w2,
                                                out2, nrows2);
    const int row = (p.index * HX_NWARPS + (int)(threadIdx.x >> 5)) * HX_RPW + (int)(threadIdx.x & 31) / HX_LPR;
    hx_dp4a_lane wl;
    const unsigned char* ws = nullptr;
#if HX_WSTAGE
    ws = hx_dp4a_wcopy(p.w, p.nrows, p.index * HX_BLOCK_ROWS_DP4A);
#else
    hx_dp4a_load(p.w, p.nrows, row, wl);
#endif
    HX_PDL_ENTRY();
#if HX_WSTAGE
    hx_cp_async_wait<0>();
#endif
    hx_dp4a_cols(wl, ws, xq, p.out, p.nrows, p.nrows, row);  // weight i's out is (ncols, nrows_i)
}
