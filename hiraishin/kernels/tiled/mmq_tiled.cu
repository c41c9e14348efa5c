// hiraishin: tiled dp4a mat-mat, the variant order's Q8_0 path past 8 columns (Q4_K/Q6_K: mmq_stock/).
//
// Order of adds (different from mmvq.cu on purpose): ONE thread owns one output element
// (row r, column c) and walks K from the start to the end, one 256-value step at a time;
// there is no reduction across threads.
//   Q4_K, per super-block: sd = 0, sm = 0; for sub-block j = 0..7 (32 values each):
//            sd = fma(d8_j, float(dot_j * sc_j), sd); sm = fma(d8_j, float(sum8_j * m_j), sm)
//         acc = acc + fma(d, sd, -(dmin * sm))
//   Q6_K, per super-block: s = 0; for sub-block t = 0..15 (16 values each):
//            s = fma(d8_{t/2}, float(dot_t * sc_t), s)
//         acc = fma(d6, s, acc)
//   Q8_0, per block b (32 values): acc = fma(d_b * d8_b, float(dot_b), acc)
// (dot = exact integer dot product of the block's quants with the q8_1 quants, sum8 =
// exact sum of the q8_1 quants, d8 = the q8_1 block's fp16 scale.)
//
// Tiling (no effect on the arithmetic above): a CUDA block of 128 threads computes a tile of
// HX_TILE_ROWS (32) rows x HX_TILE_COLS (16) columns; threadIdx.x = row in the tile,
// threadIdx.y = group of HX_COLS_PER_THREAD (4) columns. Per 256-value step the tile's weight
// bytes and q8_1 blocks are staged in shared memory (coalesced loads), then each thread
// computes its 4 outputs from shared memory.
// Grid: (ceil(nrows / 32), ceil(ncols / 16)).
//
// Compile-time: HX_QTYPE (HX_Q4_K | HX_Q6_K | HX_Q8_0).

// The tile (HX_TILE_ROWS, HX_COLS_PER_THREAD, HX_COL_GROUPS) comes from hiraishin/plans/matvec.py
// and the block facts (type ids, HX_Q8_1_BYTES, HX_STEP_BYTES = weight bytes per 256 values)
// from hiraishin.quant, as #defines (hiraishin/kernels/tiled/launch.py).
#define HX_TILE_COLS (HX_COLS_PER_THREAD * HX_COL_GROUPS)
#define HX_THREADS (HX_TILE_ROWS * HX_COL_GROUPS)
#define HX_STEP_VALUES HX_QK_K                // values of K per step
#define HX_Y_BLOCK_BYTES HX_Q8_1_BYTES        // block_q8_1
#define HX_Y_STEP_WORDS (HX_STEP_VALUES / HX_QK8_1 * HX_Y_BLOCK_BYTES / 4)  // 8 q8_1 blocks = 72 ints per column

// Bytes of one row per step, and the shared-memory row stride in 16-bit units, padded so
// that the stride in 32-bit words is odd (32 rows read the same offset without bank conflicts).
#if HX_QTYPE == HX_Q4_K
#define HX_SH_STRIDE 74
#elif HX_QTYPE == HX_Q6_K
#define HX_SH_STRIDE 106
#elif HX_QTYPE == HX_Q8_0
#define HX_SH_STRIDE 138
#else
#error "HX_QTYPE must be HX_Q4_K, HX_Q6_K or HX_Q8_0"
#endif

typedef unsigned char u8;
typedef unsigned short u16;

// An int from shared 16-bit units at (any) 16-bit offset.
__device__ __forceinline__ int hx_sh_i32(const u16* p) {
    return (int)((unsigned int)p[0] | ((unsigned int)p[1] << 16));
}


extern "C" __global__ void __launch_bounds__(HX_THREADS)
mmq_tiled(const u8* __restrict__ w, const u8* __restrict__ y, float* __restrict__ dst,
          const int nrows, const int ncols, const int k, const long long row_bytes,
          const long long col_bytes_y, const long long stride_dst) {
    HX_PDL_ENTRY();
    __shared__ u16 sh_w[HX_TILE_ROWS * HX_SH_STRIDE];
    __shared__ int sh_y[HX_TILE_COLS * HX_Y_STEP_WORDS];
#if HX_QTYPE == HX_Q4_K
    __shared__ int sh_ysum[HX_TILE_COLS * 8];  // sum of the q8_1 quants per (column, block)
#endif

    const int tid = threadIdx.y * HX_TILE_ROWS + threadIdx.x;
    const int row0 = blockIdx.x * HX_TILE_ROWS;
    const int col0 = blockIdx.y * HX_TILE_COLS;
    const int r = threadIdx.x;
    const int cbase = threadIdx.y * HX_COLS_PER_THREAD;
    const int nblocks32 = k / 32;  // q8_1 blocks per column
    const int nsteps = (k + HX_STEP_VALUES - 1) / HX_STEP_VALUES;

    float acc[HX_COLS_PER_THREAD];
#pragma unroll
    for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
        acc[c] = 0.0f;
    }

    for (int step = 0; step < nsteps; ++step) {
        // Blocks of 32 values in this step (8, except a short last step of Q8_0).
        const int nb32 = min(8, nblocks32 - 8 * step);
#if HX_QTYPE == HX_Q8_0
        const int step_halves = nb32 * 17;
#else
        const int step_halves = HX_STEP_BYTES / 2;
#endif
        // Stage the weights: 32 rows x step bytes, as 16-bit units (rows are 2-byte aligned).
        for (int idx = tid; idx < HX_TILE_ROWS * step_halves; idx += HX_THREADS) {
            const int rr = idx / step_halves;
            const int hh = idx - rr * step_halves;
            const int row = min(row0 + rr, nrows - 1);  // rows past the end: never written
            const u16* src = (const u16*)(w + row * row_bytes + (long long)step * HX_STEP_BYTES);
            sh_w[rr * HX_SH_STRIDE + hh] = src[hh];
        }
        // Stage the activations: 16 columns x 8 q8_1 blocks (ints; blocks are 4-byte aligned).
        for (int idx = tid; idx < HX_TILE_COLS * HX_Y_STEP_WORDS; idx += HX_THREADS) {
            const int cc = idx / HX_Y_STEP_WORDS;
            const int ww = idx - cc * HX_Y_STEP_WORDS;
            const int col = min(col0 + cc, ncols - 1);  // columns past the end: never written
            int v = 0;
            if (ww < nb32 * (HX_Y_BLOCK_BYTES / 4)) {
                const int* src = (const int*)(y + col * col_bytes_y + (long long)step * 8 * HX_Y_BLOCK_BYTES);
                v = src[ww];
            }
            sh_y[idx] = v;
        }
        __syncthreads();
#if HX_QTYPE == HX_Q4_K
        {  // one thread per (column, block): the integer sum of its 32 quants
            const int cc = tid / 8;
            const int b = tid % 8;
            int s = 0;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                s = __dp4a(0x01010101, sh_y[cc * HX_Y_STEP_WORDS + b * 9 + 1 + n], s);
            }
            sh_ysum[cc * 8 + b] = s;
        }
        __syncthreads();
#endif

        const u16* wr = sh_w + r * HX_SH_STRIDE;
#if HX_QTYPE == HX_Q4_K
        {
            const float d = hx_h2f(wr[0]);
            const float dmin = hx_h2f(wr[1]);
            const unsigned int s0 = (unsigned int)hx_sh_i32(wr + 2);
            const unsigned int s1 = (unsigned int)hx_sh_i32(wr + 4);
            const unsigned int s2 = (unsigned int)hx_sh_i32(wr + 6);
            float sd[HX_COLS_PER_THREAD], sm[HX_COLS_PER_THREAD];
#pragma unroll
            for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                sd[c] = 0.0f;
                sm[c] = 0.0f;
            }
#pragma unroll
            for (int ch = 0; ch < 4; ++ch) {  // 32-byte chunk ch: sub-blocks 2ch (low), 2ch+1 (high)
                int q[8];
#pragma unroll
                for (int n = 0; n < 8; ++n) {
                    q[n] = hx_sh_i32(wr + 8 + 16 * ch + 2 * n);
                }
                int sc[2], m[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int j = 2 * ch + i;
                    if (j < 4) {
                        sc[i] = (s0 >> (8 * j)) & 63;
                        m[i] = (s1 >> (8 * j)) & 63;
                    } else {
                        const int kk = j - 4;
                        sc[i] = ((s2 >> (8 * kk)) & 0x0F) | (((s0 >> (8 * kk + 6)) & 3) << 4);
                        m[i] = ((s2 >> (8 * kk + 4)) & 0x0F) | (((s1 >> (8 * kk + 6)) & 3) << 4);
                    }
                }
#pragma unroll
                for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                    const int* yc = sh_y + (cbase + c) * HX_Y_STEP_WORDS;
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int* yb = yc + (2 * ch + i) * 9;
                        int dot = 0;
#pragma unroll
                        for (int n = 0; n < 8; ++n) {
                            dot = __dp4a((q[n] >> (4 * i)) & 0x0F0F0F0F, yb[1 + n], dot);
                        }
                        const float d8 = hx_h2f((u16)(yb[0] & 0xFFFF));
                        const int ysum = sh_ysum[(cbase + c) * 8 + 2 * ch + i];
                        sd[c] = __fmaf_rn(d8, __int2float_rn(dot * sc[i]), sd[c]);
                        sm[c] = __fmaf_rn(d8, __int2float_rn(ysum * m[i]), sm[c]);
                    }
                }
            }
#pragma unroll
            for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                acc[c] = __fadd_rn(acc[c], __fmaf_rn(d, sd[c], -__fmul_rn(dmin, sm[c])));
            }
        }
#elif HX_QTYPE == HX_Q6_K
        {
            float s[HX_COLS_PER_THREAD];
#pragma unroll
            for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                s[c] = 0.0f;
            }
#pragma unroll 2
            for (int t = 0; t < 16; ++t) {  // sub-block of 16 values: elements 16t .. 16t+15
                const int h = t / 8;
                const int sg = (t % 8) / 2;      // 32-value group inside the half
                const int l0 = 16 * (t % 2);     // first index inside the group
                const int ql_half = (64 * h + 32 * (sg & 1) + l0) / 2;
                const int qh_half = (128 + 32 * h + l0) / 2;
                const int lshift = 4 * (sg >> 1);
                const int hshift = 2 * sg;
                int vi[4];
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    const int lo = (hx_sh_i32(wr + ql_half + 2 * n) >> lshift) & 0x0F0F0F0F;
                    const int hi = ((hx_sh_i32(wr + qh_half + 2 * n) >> hshift) & 0x03030303) << 4;
                    vi[n] = hx_sub32_bytes(lo | hi);
                }
                const int sc = (int)(signed char)(wr[(192 + t) / 2] >> (8 * (t % 2)));
#pragma unroll
                for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                    const int* yb = sh_y + (cbase + c) * HX_Y_STEP_WORDS + (t / 2) * 9;
                    int dot = 0;
#pragma unroll
                    for (int n = 0; n < 4; ++n) {
                        dot = __dp4a(vi[n], yb[1 + 4 * (t % 2) + n], dot);
                    }
                    const float d8 = hx_h2f((u16)(yb[0] & 0xFFFF));
                    s[c] = __fmaf_rn(d8, __int2float_rn(dot * sc), s[c]);
                }
            }
            const float d6 = hx_h2f(wr[104]);
#pragma unroll
            for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                acc[c] = __fmaf_rn(d6, s[c], acc[c]);
            }
        }
#else  // HX_Q8_0
        for (int b = 0; b < nb32; ++b) {
            const float dw = hx_h2f(wr[17 * b]);
            int q[8];
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                q[n] = hx_sh_i32(wr + 17 * b + 1 + 2 * n);
            }
#pragma unroll
            for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
                const int* yb = sh_y + (cbase + c) * HX_Y_STEP_WORDS + b * 9;
                int dot = 0;
#pragma unroll
                for (int n = 0; n < 8; ++n) {
                    dot = __dp4a(q[n], yb[1 + n], dot);
                }
                const float d8 = hx_h2f((u16)(yb[0] & 0xFFFF));
                acc[c] = __fmaf_rn(__fmul_rn(dw, d8), __int2float_rn(dot), acc[c]);
            }
        }
#endif
        __syncthreads();  // the next step overwrites the staged tiles
    }

    const int row = row0 + r;
    if (row < nrows) {
#pragma unroll
        for (int c = 0; c < HX_COLS_PER_THREAD; ++c) {
            const int col = col0 + cbase + c;
            if (col < ncols) {
                dst[col * stride_dst + row] = acc[c];
            }
        }
    }
}
