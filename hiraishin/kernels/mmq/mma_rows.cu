// hiraishin: what the int8 MMA kernels share (hiraishin/kernels/mmq/mmq.cu, hiraishin/kernels/mmq_stock/
// mmq_stock.cu; each is compiled after this file): mma.sync m16n8k32 / m16n8k16 (.s8.s8.s32), the
// weight-row loads of one lane (rows g and g+8 of a 16-row tile, ints 4t.. of each block) and the
// Q6_K bytewise q - 32. Defines: HX_QTYPE (12 Q4_K, 14 Q6_K); HX_Q4_SCALE_FP16 (0/1): Q4_K's
// scale products d*sc and dmin*m kept in float (exact) or rounded to fp16 as llama.cpp's MMQ
// packs them (load_tiles_q4_K's half2).

#ifndef HX_Q4_SCALE_FP16
#define HX_Q4_SCALE_FP16 0
#endif
// HX_XLAYOUT (0/1/2; mmq.cu): 1 when the activations come in the MMA layouts of quantize/layout.py, 2 in their
// columns-interleaved forms (MMA8_*: the same bytes, each group of 8 columns' records interleaved).
// Q4_K rows are then read 8 bytes at a time: lane t takes bytes 8t..8t+7 of each 32-byte chunk of qs
// (values 8t..8t+7 of two sub-blocks) for the MMA k slots 4t..4t+3 and 16+4t..16+4t+3, and MMA_Q4_K
// puts the activation values 8t..8t+7 in the same slots: each product pairs the same two values.
#ifndef HX_XLAYOUT
#define HX_XLAYOUT 0
#endif
#if HX_Q4_SCALE_FP16
#define HX_Q4_SCALE(v) hx_h2f(hx_f2h(v))
#else
#define HX_Q4_SCALE(v) (v)
#endif

#ifdef HX_SHIM
// CPU shim (tests/test_mmq.py, tests/test_mmq_stock.py): a software mma.sync with the same
// fragment layout, and __funnelshift_r; NVRTC never sees this branch.
#include "hx_mma_shim.h"
#else
__device__ __forceinline__ void hx_mma_k32(int c[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void hx_mma_k16(int c[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}
// cp.async (sm_80+): 16 bytes global -> shared without passing through registers; a commit closes a group,
// wait<N> waits until at most N groups of this thread are in flight.
__device__ __forceinline__ void hx_cp_async16(void* smem, const void* gmem) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void hx_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void hx_cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
#endif

__device__ __forceinline__ int hx_ld32(const unsigned char* p) { return *(const int*)p; }

// 4 bytes at a 2-byte aligned address: two aligned words and a funnel shift (Q6_K blocks are
// 210 bytes). sh = 0 or 16 (bits).
__device__ __forceinline__ int hx_ld32_a2(const unsigned char* base4, int off, int sh) {
    const unsigned int lo = *(const unsigned int*)(base4 + off);
    const unsigned int hi = *(const unsigned int*)(base4 + off + 4);
    return (int)__funnelshift_r(lo, hi, sh);
}

__device__ __forceinline__ int hx_sbyte(int word, int i) { return (int)(signed char)(word >> (8 * i)); }

// HX_WTILE (0/1; launch.py, kernels/mmq/wtile.py): the weight's rows in 16-row tiles, each tile's super-block i one
// record of 16 super-blocks' bytes cut into pieces, each piece stored for the 16 rows together. Q4_K: the four
// 32-byte qs chunks jp as [jp][row][32], then the rows' 16-byte headers (d, dmin, scales) as [row][16]; Q6_K: its 13
// 16-byte groups q (ql 0..7, qh 8..11, the scales 12) as [q][row][16], then the rows' fp16 d as [row][2]. The same
// bytes as ggml's rows, regrouped: lane (g, t)'s loads of one piece for rows g = 0..7 read contiguous bytes (Q4_K
// 256, 2 cache lines, not 8 of rows 2,304 bytes apart; Q6_K 128, every word 4-byte aligned, where its rows were
// 2-byte aligned). Where the bytes sit only: no bit changes. Row r's super-block i is addressed by
// p = HX_W_ROW(w, r) + i * HX_SB_STRIDE, the row's place in the record's first piece (row rr = r % 16 of the tile),
// and rr: Q4_K's header is 2048 - 16 rr bytes past p, Q6_K's d 3328 - 14 rr. (Addressed from the record instead, the
// MMA kernel held a lane offset per row for its headers and one for its qs: at 2-4 columns it spilled at its
// 64-register cap, ptxas for sm_90.)
#ifndef HX_WTILE
#define HX_WTILE 0
#endif
#if HX_WTILE
#define HX_WTILE_ROWS 16
#define HX_SB_STRIDE (HX_WTILE_ROWS * HX_BLOCK_BYTES)
#if HX_QTYPE == 12
#define HX_WPIECE 32  // a row's bytes of the record's first piece
#define HX_Q4_HDR(p, rr) ((p) + 4 * 32 * HX_WTILE_ROWS - 16 * (rr))
#define HX_Q4_QS(p, rr, jp) ((p) + 32 * HX_WTILE_ROWS * (jp))
#else
#define HX_WPIECE 16
#define HX_Q6_G(p, q) ((p) + 16 * HX_WTILE_ROWS * (q))                 // the row's 16-byte group q
#define HX_Q6_D(p, rr) ((p) + 13 * 16 * HX_WTILE_ROWS - 14 * (rr))      // the row's fp16 d
#endif
// row r's place in its tile's first record, and r's place in the tile
#define HX_W_ROW(w, r) \
    ((w) + (size_t)((r) & ~(HX_WTILE_ROWS - 1)) * HX_NB * HX_BLOCK_BYTES + HX_WPIECE * ((r) & (HX_WTILE_ROWS - 1)))
#define HX_W_RR(r) ((r) & (HX_WTILE_ROWS - 1))
#else
#define HX_SB_STRIDE HX_BLOCK_BYTES
#define HX_WPIECE 0
#define HX_Q4_HDR(p, rr) (p)
#define HX_Q4_QS(p, rr, jp) ((p) + 16 + 32 * (jp))
#define HX_W_ROW(w, r) ((w) + (size_t)(r) * HX_NB * HX_BLOCK_BYTES)
#define HX_W_RR(r) 0
#endif

#if HX_QTYPE == 12
// ---- Q4_K: d, dmin (fp16), scales[12], qs[128]; 144 bytes ----
struct hx_row_sb {
    float d, dmin;        // fp16 d, dmin as floats
    unsigned int sc[2];   // 6-bit scales of sub-blocks 0..3 (sc[0]) and 4..7 (sc[1]), one per byte
    unsigned int m[2];    // 6-bit mins, the same way
    int q[8];             // qs ints at 32*jp + 4t and 32*jp + 16 + 4t, jp = 0..3 (HX_XLAYOUT: 32*jp + 8t, + 4)
};

// Sub-block jj's d*sc and dmin*m (exact products; HX_Q4_SCALE_FP16: rounded to fp16), made where they are
// used rather than all eight at once when the row is loaded: the same float operations, 4 packed words per
// row instead of 16 decoded floats. H200 SUBBLOCK replays, same digests (bench/results/2026-12-03-h200-
// session10/b-lazy-scales-stage-w): the 8B 2.766 -> 2.745 ms one token, 3.12 / 4.35 / 5.08 unchanged at 3 / 9
// / 16 tokens (the two-n-tile launches still take 128 registers); the 0.6B 0.810 -> 0.831 one token.
__device__ __forceinline__ float hx_q4_ws(const hx_row_sb& r, const int jj) {
    return HX_Q4_SCALE(__fmul_rn(r.d, (float)((r.sc[jj >> 2] >> (8 * (jj & 3))) & 0xFF)));
}
__device__ __forceinline__ float hx_q4_wm(const hx_row_sb& r, const int jj) {
    return HX_Q4_SCALE(__fmul_rn(r.dmin, (float)((r.m[jj >> 2] >> (8 * (jj & 3))) & 0xFF)));
}

// A lane's bytes of one row's super-block as loaded (hx_fetch_row: loads only, nothing waits on them),
// then its scales unpacked (hx_decode_row); hx_load_row is the two back to back.
struct hx_row_raw {
    uint4 h;     // d, dmin, scales[12]
    int q[8];
};

// p: the row's super-block (HX_WTILE: its tile's record, the row rr within it; else rr is unused)
__device__ __forceinline__ void hx_fetch_row(const unsigned char* p, int rr, int t, hx_row_raw& r) {
    r.h = *(const uint4*)HX_Q4_HDR(p, rr);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
        const unsigned char* qs = HX_Q4_QS(p, rr, jp);
#if HX_XLAYOUT
        const int2 v = *(const int2*)(qs + 8 * t);
        r.q[2 * jp] = v.x;
        r.q[2 * jp + 1] = v.y;
#else
        r.q[2 * jp] = hx_ld32(qs + 4 * t);
        r.q[2 * jp + 1] = hx_ld32(qs + 16 + 4 * t);
#endif
    }
}

__device__ __forceinline__ void hx_decode_row(const hx_row_raw& w, hx_row_sb& r) {
    const uint4 h = w.h;
    r.d = hx_h2f((unsigned short)(h.x & 0xFFFF));
    r.dmin = hx_h2f((unsigned short)(h.x >> 16));
    // get_scale_min_k4 for all 8 sub-blocks at once (bytes q[0..3] = h.y, q[4..7] = h.z, q[8..11] = h.w)
    r.sc[0] = h.y & 0x3F3F3F3Fu;
    r.m[0] = h.z & 0x3F3F3F3Fu;
    r.sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    r.m[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
#pragma unroll
    for (int k = 0; k < 8; ++k) r.q[k] = w.q[k];
}

__device__ __forceinline__ void hx_load_row(const unsigned char* p, int rr, int t, hx_row_sb& r) {
    hx_row_raw w;
    hx_fetch_row(p, rr, t, w);
    hx_decode_row(w, r);
}
__device__ __forceinline__ void hx_load_row(const unsigned char* p, int t, hx_row_sb& r) { hx_load_row(p, 0, t, r); }
#else
// ---- Q6_K: ql[128], qh[64], scales[16] (int8), d (fp16); 210 bytes ----
struct hx_row_sb {
    float d;
    int ql[8];   // ql ints at 64n + 16m + 4t (n = 0..1, m = 0..3), index 4n + m
    int qh[4];   // qh ints at 128 + 32n + 16h + 4t, index 2n + h
    int sc[4];   // the 16 int8 scales
};

__device__ __forceinline__ void hx_load_row(const unsigned char* p, int t, hx_row_sb& r) {
    r.d = hx_h2f(*(const unsigned short*)(p + 208));
    const size_t a = (size_t)p;
    if ((a & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) r.ql[i] = hx_ld32(p + 64 * (i >> 2) + 16 * (i & 3) + 4 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.qh[i] = hx_ld32(p + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.sc[i] = hx_ld32(p + 192 + 4 * i);
    } else {
        const unsigned char* b = p - 2;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.ql[i] = hx_ld32_a2(b, 64 * (i >> 2) + 16 * (i & 3) + 4 * t, 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.qh[i] = hx_ld32_a2(b, 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t, 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.sc[i] = hx_ld32_a2(b, 192 + 4 * i, 16);
    }
}

// p: the row's super-block (HX_WTILE: HX_W_ROW's place in the record, rr the row within the tile; else rr is unused)
__device__ __forceinline__ void hx_load_row(const unsigned char* p, int rr, int t, hx_row_sb& r) {
#if HX_WTILE  // every piece 16-byte aligned: ql[i] in group i, qh[i] in group 8 + i, the scales in group 12
    r.d = hx_h2f(*(const unsigned short*)HX_Q6_D(p, rr));
#pragma unroll
    for (int i = 0; i < 8; ++i) r.ql[i] = hx_ld32(HX_Q6_G(p, i) + 4 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.qh[i] = hx_ld32(HX_Q6_G(p, 8 + i) + 4 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.sc[i] = hx_ld32(HX_Q6_G(p, 12) + 4 * i);
#else
    (void)rr;
    hx_load_row(p, t, r);
#endif
}

// int8 values q - 32 of q8_1 block bb (0..3) of 128-half n, half h, from a row's ints.
__device__ __forceinline__ int hx_q6_vals(const hx_row_sb& r, int n, int bb, int h) {
    const unsigned int lo = ((unsigned int)r.ql[4 * n + 2 * (bb & 1) + h] >> (4 * (bb >> 1))) & 0x0F0F0F0Fu;
    const unsigned int hi = (((unsigned int)r.qh[2 * n + h] >> (2 * bb)) & 0x03030303u) << 4;
    return hx_sub32_bytes((int)(lo | hi));
}
#endif

// Where lane (g, t) of an MMA warp reads: its two weight rows (row0 + g and row0 + g + 8, clamped to
// the last row), and per n-tile of 8 columns from col0 the activations of B column g and of C columns
// 2t, 2t + 1 (clamped to the last column, or under HX_XLAYOUT 2 to the last group's padding; what such a
// column computes is never written back).
// Where column col's activations begin in xq: its ints (the B fragments; ints = true) and its ds words.
// Per-column records (HX_XLAYOUT 0, 1): both at the column's record; HX_XLAYOUT 2: inside its group of 8
// columns (quantize/layout.py MMA8_*: per super-block the 8 columns' ds words, 32 bytes each, then per pair of
// q8_1 blocks the 8 columns' 64 bytes). mmq.cu's HX_X_DS / HX_X_INT offsets are relative to these.
__device__ __forceinline__ const unsigned char* hx_x_col(const unsigned char* xq, const int col, const bool ints) {
#if HX_XLAYOUT == 2
    const unsigned char* grp = xq + (size_t)(col >> 3) * HX_NB * (8 * 8 * HX_Q8_BYTES);
    return grp + (ints ? 8 * 32 + 64 * (col & 7) : 32 * (col & 7));
#else
    return xq + (size_t)col * HX_NB * 8 * HX_Q8_BYTES;
#endif
}

struct hx_mma_ptrs {
    const unsigned char* wA;
    const unsigned char* wB;
    const unsigned char* xb[HX_NT];
    const unsigned char* xc[HX_NT][2];
};

__device__ __forceinline__ hx_mma_ptrs hx_mma_pointers(const unsigned char* w, const unsigned char* xq,
                                                       const int nrows, const int ncols, const int row0,
                                                       const int col0, const int g, const int t) {
    const size_t row_bytes = (size_t)HX_NB * HX_BLOCK_BYTES;
    hx_mma_ptrs p;
#if HX_WTILE  // rows g and g + 8 of the tile (launch.py tiles only weights of whole tiles)
    (void)row_bytes;
    p.wA = HX_W_ROW(w, row0 + g);
    p.wB = HX_W_ROW(w, row0 + g + 8);
#else
    p.wA = w + (size_t)min(row0 + g, nrows - 1) * row_bytes;
    p.wB = w + (size_t)min(row0 + g + 8, nrows - 1) * row_bytes;
#endif
#pragma unroll
    for (int nt = 0; nt < HX_NT; ++nt) {
#if HX_XLAYOUT == 2
        // n-tile nt is one group of 8 columns (col0 is a multiple of 8): its record base, the group index
        // clamped to the last group; inside it the columns are not clamped, so C columns 2t and 2t + 1 are 32
        // bytes apart and one pointer serves both, and a column past ncols - 1 reads the group's padding,
        // never written back (fewer live pointers: ptxas keeps the two-n-tile Q6_K launch at 128 registers).
        // Skipping the padding columns' loads (zeros instead; the same bits) was tried: 3-5% slower SUBBLOCK
        // passes of 9-16 tokens on the H200 (bench/results/2026-12-04-h200-session14/b-xskip-bench-tests).
        const unsigned char* grp = hx_x_col(xq, 8 * min((col0 >> 3) + nt, (ncols - 1) >> 3), false);
        p.xb[nt] = hx_x_col(grp, g, true);           // column g of the group
        p.xc[nt][0] = hx_x_col(grp, 2 * t, false);   // columns 2t and 2t + 1
        p.xc[nt][1] = hx_x_col(grp, 2 * t + 1, false);
#else
        p.xb[nt] = hx_x_col(xq, min(col0 + 8 * nt + g, ncols - 1), true);
        p.xc[nt][0] = hx_x_col(xq, min(col0 + 8 * nt + 2 * t, ncols - 1), false);
        p.xc[nt][1] = hx_x_col(xq, min(col0 + 8 * nt + 2 * t + 1, ncols - 1), false);
#endif
    }
    return p;
}
