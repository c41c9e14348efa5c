// hiraishin: llama.cpp MMQ's float sequence on int8 tensor cores (see hiraishin/kernels/mmq_stock/__init__.py).
//
// hx_mmq_stock: one CUDA block = HX_NWARPS warps, warp w = 16 rows x HX_COLS columns of one work
// item (an upstream tile it, jt of 128 rows x HX_J columns and one piece [kb0, kb1) of its
// super-blocks; hiraishin/plans/mmq_stock.py). blockIdx.x = item * HX_SUBROWS + the item's 16 *
// HX_NWARPS-row part, blockIdx.y = the HX_COLS-column part of the tile. Each output accumulates
// its piece in k order with upstream's operations; the tile's last piece goes to the output, the
// others to scratch. hx_mmq_stock_fixup (mul_mat_q_stream_k_fixup): out += sum of the scratch
// pieces, newest first, one thread per (row, column).
//
// Defines (launch.py): HX_QTYPE (12 Q4_K, 14 Q6_K), HX_BLOCK_BYTES, HX_Q8_BYTES, HX_NB
// (super-blocks per row), HX_NWARPS, HX_NT (n-tiles of 8 columns per warp), HX_J (upstream's
// tile width), HX_TILE_ROWS (128), HX_MIN_BLOCKS, HX_Q4_SCALE_FP16 = 1.
//
// Activations: llama.cpp's q8_1 blocks (fp16 d, fp16 s, int8 q[32]; 36 bytes), K/32 blocks per
// column. Fragments (PTX ISA mma.m16n8k32 / m16n8k16 .s8, lane = 4g + t): A a0 (row g, k 4t..),
// a1 (row g+8), [k32: a2 (row g, k 16+4t..), a3 (row g+8, k 16+4t..)]; B b0 (k 4t.., column g)
// [k32: b1 (k 16+4t..)]; C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).

#define HX_COLS (8 * HX_NT)
#define HX_SUBROWS (HX_TILE_ROWS / (16 * HX_NWARPS))

// mma.sync helpers and the weight-row loads (Q4_K's scale products rounded to fp16 here:
// HX_Q4_SCALE_FP16 = 1, load_tiles_q4_K's half2(d*sc, -dmin*m)): ../mmq/mma_rows.cu, compiled first.

extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
hx_mmq_stock(const unsigned char* __restrict__ w, const unsigned char* __restrict__ xq, float* __restrict__ out,
             float* __restrict__ scratch, const int* __restrict__ items, const int nrows, const int ncols,
             const long long out_stride) {
    HX_PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int* item = items + 5 * (blockIdx.x / HX_SUBROWS);
    const int it = item[0], jt = item[1], kb0 = item[2], kb1 = item[3], slot = item[4];
    const int trow0 = (blockIdx.x % HX_SUBROWS) * 16 * HX_NWARPS + 16 * warp;  // first row in the tile
    const int row0 = it * HX_TILE_ROWS + trow0;
    const int tcol0 = blockIdx.y * HX_COLS;                                     // first column in the tile
    const int col0 = jt * HX_J + tcol0;
    const int col_end = min(ncols, (jt + 1) * HX_J);
    if (row0 >= nrows || col0 >= col_end) return;  // warp-uniform
    const hx_mma_ptrs ptr = hx_mma_pointers(w, xq, nrows, ncols, row0, col0, g, t);
    const unsigned char* wA = ptr.wA;
    const unsigned char* wB = ptr.wB;

    float acc[HX_NT][4];
#pragma unroll
    for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

    for (int i = kb0; i < kb1; ++i) {
        hx_row_sb rA, rB;
        hx_load_row(wA + (size_t)i * HX_BLOCK_BYTES, t, rA);
        hx_load_row(wB + (size_t)i * HX_BLOCK_BYTES, t, rB);
#if HX_QTYPE == 12
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {  // sub-block jj = q8_1 block 8i + jj, in k order
            const size_t xo = (size_t)(8 * i + jj) * HX_Q8_BYTES;
            const int jp = jj >> 1, sh = 4 * (jj & 1);
            const int a0 = (rA.q[2 * jp] >> sh) & 0x0F0F0F0F;
            const int a1 = (rB.q[2 * jp] >> sh) & 0x0F0F0F0F;
            const int a2 = (rA.q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
            const int a3 = (rB.q[2 * jp + 1] >> sh) & 0x0F0F0F0F;
#pragma unroll
            for (int nt = 0; nt < HX_NT; ++nt) {
                int c[4];
                hx_mma_k32(c, a0, a1, a2, a3, hx_ld32(ptr.xb[nt] + xo + 4 + 4 * t), hx_ld32(ptr.xb[nt] + xo + 20 + 4 * t));
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned int ds = *(const unsigned int*)(ptr.xc[nt][e & 1] + xo);
                    const float dx = hx_h2f((unsigned short)(ds & 0xFFFF));
                    const float sx = hx_h2f((unsigned short)(ds >> 16));
                    const float ws = e < 2 ? hx_q4_ws(rA, jj) : hx_q4_ws(rB, jj);
                    const float wm = e < 2 ? hx_q4_wm(rA, jj) : hx_q4_wm(rB, jj);
                    // sum += dmA.x*dsB.x*C; sum += dmA.y*dsB.y (vec_dot_q8_1_q8_1_mma)
                    acc[nt][e] = __fmaf_rn(__fmul_rn(ws, dx), (float)c[e], acc[nt][e]);
                    acc[nt][e] = __fmaf_rn(-wm, sx, acc[nt][e]);  // -half(dmin*m) = half(-dmin*m)
                }
            }
        }
#else
#pragma unroll
        for (int n = 0; n < 2; ++n) {  // 128-value half n of the super-block (one vec_dot call)
            float tmp[HX_NT][4];
#pragma unroll
            for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) tmp[nt][e] = 0.0f;
#pragma unroll
            for (int bb = 0; bb < 4; ++bb) {  // q8_1 block 8i + 4n + bb, in k order
                const int jj = 4 * n + bb;
                const size_t xo = (size_t)(8 * i + jj) * HX_Q8_BYTES;
                const int lA0 = hx_q6_vals(rA, n, bb, 0), lB0 = hx_q6_vals(rB, n, bb, 0);
                const int lA1 = hx_q6_vals(rA, n, bb, 1), lB1 = hx_q6_vals(rB, n, bb, 1);
                const int si = 2 * jj;
                const int scA0 = hx_sbyte(rA.sc[si >> 2], si & 3), scA1 = hx_sbyte(rA.sc[si >> 2], (si & 3) + 1);
                const int scB0 = hx_sbyte(rB.sc[si >> 2], si & 3), scB1 = hx_sbyte(rB.sc[si >> 2], (si & 3) + 1);
#pragma unroll
                for (int nt = 0; nt < HX_NT; ++nt) {
                    int c0[4], c1[4];
                    hx_mma_k16(c0, lA0, lB0, hx_ld32(ptr.xb[nt] + xo + 4 + 4 * t));
                    hx_mma_k16(c1, lA1, lB1, hx_ld32(ptr.xb[nt] + xo + 20 + 4 * t));
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int ci = e < 2 ? scA0 * c0[e] + scA1 * c1[e] : scB0 * c0[e] + scB1 * c1[e];
                        const float dx = hx_h2f(*(const unsigned short*)(ptr.xc[nt][e & 1] + xo));
                        // tmp += (C0*sc0 + C1*sc1)*dB (vec_dot_q6_K_q8_1_mma)
                        tmp[nt][e] = __fmaf_rn((float)ci, dx, tmp[nt][e]);
                    }
                }
            }
#pragma unroll
            for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)  // sum += tmp*dA
                    acc[nt][e] = __fmaf_rn(tmp[nt][e], e < 2 ? rA.d : rB.d, acc[nt][e]);
        }
#endif
    }
#pragma unroll
    for (int nt = 0; nt < HX_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = row0 + g + 8 * (e >> 1);
            const int c = col0 + 8 * nt + 2 * t + (e & 1);
            if (r >= nrows || c >= col_end) continue;
            if (slot < 0) {
                out[(size_t)c * out_stride + r] = acc[nt][e];
            } else {  // scratch slot: the tile's 128 rows x HX_J columns, column-major like out
                scratch[((size_t)slot * HX_J + (c - jt * HX_J)) * HX_TILE_ROWS + (r - it * HX_TILE_ROWS)] = acc[nt][e];
            }
        }
}

// mul_mat_q_stream_k_fixup: sum = 0; sum += P_{m-1}, ..., P_0 (newest first); out += sum.
// fixups[f] = it, jt, first slot, count. One thread per row of the tile, blockIdx.y = column.
extern "C" __global__ void __launch_bounds__(HX_TILE_ROWS)
hx_mmq_stock_fixup(float* __restrict__ out, const float* __restrict__ scratch, const int* __restrict__ fixups,
                   const int nrows, const int ncols, const long long out_stride) {
    HX_PDL_ENTRY();
    const int* f = fixups + 4 * blockIdx.x;
    const int it = f[0], jt = f[1], slot0 = f[2], count = f[3];
    const int r = it * HX_TILE_ROWS + threadIdx.x;
    const int cj = blockIdx.y;
    const int c = jt * HX_J + cj;
    if (r >= nrows || c >= ncols) return;
    float sum = 0.0f;
    for (int p = count - 1; p >= 0; --p)
        sum = __fadd_rn(sum, scratch[((size_t)(slot0 + p) * HX_J + cj) * HX_TILE_ROWS + threadIdx.x]);
    float* o = out + (size_t)c * out_stride + r;
    *o = __fadd_rn(*o, sum);
}
