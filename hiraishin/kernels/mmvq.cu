// hiraishin: dp4a mat-vec of a quantized weight (Q4_K, Q6_K, Q8_0) with q8_1 activations.
//
// The geometry of llama.cpp's mul_mat_vec_q (ggml/src/ggml-cuda/mmvq.cu, vecdotq.cuh;
// reference sections 4.1-4.4), written anew with every order-relevant float op explicit:
//
//   block (32, nwarps); tid = 32*threadIdx.y + threadIdx.x
//   a CUDA block computes rows row0 .. row0+HX_RPB-1 for HX_NCOLS columns
//   thread tid walks weight blocks kbx = tid / HX_TPB, += blocks_per_iter (= 32*nwarps / HX_TPB)
//   and handles the ints iqs = HX_VDR * (tid % HX_TPB) of each block;
//   tmp[j][i] (column j outer, row i inner) accumulates one vec-dot per kbx;
//   warps 1..nwarps-1 hand tmp over through shared memory, warp 0 adds them in warp order,
//   then a 32-lane xor butterfly (hx_warp_sum); lane i writes row row0+i.
//
// Compile-time: HX_QTYPE (HX_Q4_K | HX_Q6_K | HX_Q8_0), HX_NCOLS (1..16), HX_RPB (1..8).
// Run-time: nwarps = blockDim.y; dynamic shared memory (nwarps-1)*HX_NCOLS*HX_RPB*32 floats.
// Grid: (ceil(nrows / HX_RPB), 1, 1).

#define HX_Q4_K 12  // ggml type ids
#define HX_Q6_K 14
#define HX_Q8_0 8

// Per type (reference section 2 table, vecdotq.cuh): values per block, bytes per block,
// VDR_MMVQ (ints per thread per call) and qi/vdr (threads per weight block).
#if HX_QTYPE == HX_Q4_K
#define HX_QK 256
#define HX_BLOCK_BYTES 144
#define HX_VDR 2
#define HX_TPB 16
#elif HX_QTYPE == HX_Q6_K
#define HX_QK 256
#define HX_BLOCK_BYTES 210
#define HX_VDR 1
#define HX_TPB 32
#elif HX_QTYPE == HX_Q8_0
#define HX_QK 32
#define HX_BLOCK_BYTES 34
#define HX_VDR 2
#define HX_TPB 4
#else
#error "HX_QTYPE must be HX_Q4_K, HX_Q6_K or HX_Q8_0"
#endif

#define HX_Y_BLOCK_BYTES 36  // block_q8_1

typedef unsigned char u8;

__device__ __forceinline__ int hx_ld_i32(const u8* __restrict__ p) {  // 4-byte aligned
    return *(const int*)p;
}
__device__ __forceinline__ int hx_ld_i32_b2(const u8* __restrict__ p) {  // 2-byte aligned (get_int_b2)
    const unsigned short* q = (const unsigned short*)p;
    return (int)((unsigned int)q[0] | ((unsigned int)q[1] << 16));
}
__device__ __forceinline__ unsigned short hx_ld_u16(const u8* __restrict__ p) {
    return *(const unsigned short*)p;
}

__device__ __forceinline__ int hx_dp4a(int a, int b, int c) {
    return __dp4a(a, b, c);
}

// Bytewise x - 32 for bytes in 0..63, no borrow between bytes (what __vsubss4(x, 0x20202020)
// gives in this range): set bit 7 of each byte, subtract, flip bit 7 back.
__device__ __forceinline__ int hx_sub32_bytes(int x) {
    return (int)((((unsigned int)x | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

#if HX_QTYPE == HX_Q4_K
// One thread's share of a Q4_K super-block (vec_dot_q4_K_q8_1): 8 values of sub-block 2c
// (low nibbles) and 8 of sub-block 2c+1 (high nibbles). bq8 = first of the 8 q8_1 blocks.
__device__ __forceinline__ float hx_step(float acc, const u8* __restrict__ bq4, const u8* __restrict__ bq8,
                                         const unsigned int iqs) {
    const unsigned int c = iqs / 8;
    const unsigned int pos = 4 * ((iqs / 2) % 4);
    const int v0 = hx_ld_i32(bq4 + 16 + 32 * c + pos);
    const int v1 = hx_ld_i32(bq4 + 16 + 32 * c + pos + 16);

    // 6-bit scales/mins of sub-blocks 2c and 2c+1 (get_scale_min_k4), two at a time as byte
    // pairs and without a branch (threads of one warp have both c < 2 and c >= 2):
    //   c < 2:  sc = bytes 2c,2c+1 of scales & 63,  m = bytes 2c+4,2c+5 & 63
    //   c >= 2: sc = low nibbles of bytes 2c+4,2c+5 | top 2 bits of bytes 2c-4,2c-3 << 4
    //           m  = high nibbles of bytes 2c+4,2c+5 | top 2 bits of bytes 2c,2c+1 << 4
    const unsigned int sh = 16 * (c & 1);
    const bool hi = c >= 2;
    const unsigned int t0 = (unsigned int)hx_ld_i32(bq4 + 4) >> sh;   // scales bytes 0..3
    const unsigned int t1 = (unsigned int)hx_ld_i32(bq4 + 8) >> sh;   // bytes 4..7
    const unsigned int t2 = (unsigned int)hx_ld_i32(bq4 + 12) >> sh;  // bytes 8..11
    const unsigned int mlo = hi ? 0x0F0Fu : 0x3F3Fu;
    const unsigned int mhi = hi ? 0xC0C0u : 0u;
    const unsigned int pair_sc = ((hi ? t2 : t0) & mlo) | ((t0 & mhi) >> 2);
    const unsigned int pair_m = ((hi ? (t2 >> 4) : t1) & mlo) | ((t1 & mhi) >> 2);
    const int sc[2] = {(int)(pair_sc & 0xFF), (int)((pair_sc >> 8) & 0xFF)};
    const int m[2] = {(int)(pair_m & 0xFF), (int)((pair_m >> 8) & 0xFF)};

    float sumf_d = 0.0f;
    float sumf_m = 0.0f;
#pragma unroll
    for (unsigned int i = 0; i < 2; ++i) {
        const u8* b = bq8 + (2 * c + i) * HX_Y_BLOCK_BYTES;
        const float d8 = hx_h2f(hx_ld_u16(b));
        const int u0 = hx_ld_i32(b + 4 + pos);
        const int u1 = hx_ld_i32(b + 4 + pos + 16);
        const int a0 = (v0 >> (4 * i)) & 0x0F0F0F0F;
        const int a1 = (v1 >> (4 * i)) & 0x0F0F0F0F;
        const int dot1 = hx_dp4a(a1, u1, hx_dp4a(a0, u0, 0));
        const int dot2 = hx_dp4a(0x01010101, u1, hx_dp4a(0x01010101, u0, 0));
        sumf_d = __fmaf_rn(d8, __int2float_rn(dot1 * sc[i]), sumf_d);
        sumf_m = __fmaf_rn(d8, __int2float_rn(dot2 * m[i]), sumf_m);
    }
    const unsigned int dm = (unsigned int)hx_ld_i32(bq4);  // fp16 d, fp16 dmin
    const float d = hx_h2f((unsigned short)(dm & 0xFFFF));
    const float dmin = hx_h2f((unsigned short)(dm >> 16));
    const float ret = __fmaf_rn(d, sumf_d, -__fmul_rn(dmin, sumf_m));
    return __fadd_rn(acc, ret);
}
#elif HX_QTYPE == HX_Q6_K
// One thread's share of a Q6_K super-block (vec_dot_q6_K_q8_1): 4 values of each of two
// 32-value groups, 64 elements apart. The block's d multiplies into the accumulator (one fma).
__device__ __forceinline__ float hx_step(float acc, const u8* __restrict__ bq6, const u8* __restrict__ bq8,
                                         const unsigned int iqs) {
    const unsigned int h = iqs / 16;
    const unsigned int r = iqs % 16;
    const unsigned int bq8_offset = 4 * h + r / 8;
    const unsigned int scale_offset = 8 * h + r / 4;
    const unsigned int vh_shift = 2 * (r / 8);
    const int vl = hx_ld_i32_b2(bq6 + 4 * iqs);
    const int vh = hx_ld_i32_b2(bq6 + 128 + 4 * (8 * h + r % 8)) >> vh_shift;

    float sumf = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int sc = (int)(signed char)bq6[192 + scale_offset + 4 * i];
        const int vil = (vl >> (4 * i)) & 0x0F0F0F0F;
        const int vih = ((vh >> (4 * i)) << 4) & 0x30303030;
        const int vi = hx_sub32_bytes(vil | vih);
        const u8* b = bq8 + (bq8_offset + 2 * i) * HX_Y_BLOCK_BYTES;
        const int u = hx_ld_i32(b + 4 + 4 * (iqs % 8));
        const float d8 = hx_h2f(hx_ld_u16(b));
        sumf = __fmaf_rn(d8, __int2float_rn(hx_dp4a(vi, u, 0) * sc), sumf);
    }
    const float d = hx_h2f(hx_ld_u16(bq6 + 208));
    return __fmaf_rn(d, sumf, acc);
}
#else  // HX_Q8_0
// One thread's share of a Q8_0 block (vec_dot_q8_0_q8_1): 8 values (ints iqs, iqs+1).
__device__ __forceinline__ float hx_step(float acc, const u8* __restrict__ bq80, const u8* __restrict__ bq8,
                                         const unsigned int iqs) {
    const int v0 = hx_ld_i32_b2(bq80 + 2 + 4 * iqs);
    const int v1 = hx_ld_i32_b2(bq80 + 2 + 4 * (iqs + 1));
    const int u0 = hx_ld_i32(bq8 + 4 + 4 * iqs);
    const int u1 = hx_ld_i32(bq8 + 4 + 4 * (iqs + 1));
    const int sumi = hx_dp4a(v1, u1, hx_dp4a(v0, u0, 0));
    const float d = __fmul_rn(hx_h2f(hx_ld_u16(bq80)), hx_h2f(hx_ld_u16(bq8)));
    return __fmaf_rn(d, __int2float_rn(sumi), acc);
}
#endif

extern "C" __global__ void mmvq(const u8* __restrict__ w, const u8* __restrict__ y, float* __restrict__ dst,
                                const int nrows, const int nblocks, const long long row_bytes,
                                const long long col_bytes_y, const long long stride_dst) {
    const int nwarps = blockDim.y;
    const int lane = threadIdx.x;
    const int tid = 32 * threadIdx.y + lane;
    const int row0 = HX_RPB * blockIdx.x;
    const int blocks_per_iter = 32 * nwarps / HX_TPB;
    const unsigned int iqs = HX_VDR * (tid % HX_TPB);

    float tmp[HX_NCOLS][HX_RPB];
#pragma unroll
    for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            tmp[j][i] = 0.0f;
        }
    }
    // Rows past the end recompute the last row; their results are never written.
    // Pointers advance by a constant stride per iteration (cheap 64-bit address math).
    const int kbx0 = tid / HX_TPB;
    const u8* wb[HX_RPB];
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        wb[i] = w + (long long)min(row0 + i, nrows - 1) * row_bytes + (long long)kbx0 * HX_BLOCK_BYTES;
    }
    const u8* yb = y + (long long)kbx0 * ((HX_QK / 32) * HX_Y_BLOCK_BYTES);
    const long long w_stride = (long long)blocks_per_iter * HX_BLOCK_BYTES;
    const long long y_stride = (long long)blocks_per_iter * ((HX_QK / 32) * HX_Y_BLOCK_BYTES);

    for (int kbx = kbx0; kbx < nblocks; kbx += blocks_per_iter) {
#pragma unroll
        for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
            for (int i = 0; i < HX_RPB; ++i) {
                tmp[j][i] = hx_step(tmp[j][i], wb[i], yb + j * col_bytes_y, iqs);
            }
        }
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            wb[i] += w_stride;
        }
        yb += y_stride;
    }

    extern __shared__ float tmp_shared[];  // [nwarps-1][HX_NCOLS][HX_RPB][32]
    if (threadIdx.y > 0) {
#pragma unroll
        for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
            for (int i = 0; i < HX_RPB; ++i) {
                tmp_shared[(((threadIdx.y - 1) * HX_NCOLS + j) * HX_RPB + i) * 32 + lane] = tmp[j][i];
            }
        }
    }
    __syncthreads();
    if (threadIdx.y > 0) {
        return;
    }

#pragma unroll
    for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            float s = tmp[j][i];
            for (int wp = 0; wp < nwarps - 1; ++wp) {  // warps 1, 2, ... in order
                s = __fadd_rn(s, tmp_shared[((wp * HX_NCOLS + j) * HX_RPB + i) * 32 + lane]);
            }
            s = hx_warp_sum(s);
            if (lane == i && row0 + i < nrows) {
                dst[j * stride_dst + row0 + i] = s;
            }
        }
    }
}
