// hiraishin: dp4a mat-vec of a quantized weight (Q4_K, Q6_K, Q8_0) with q8_1 activations.
//
// The geometry of llama.cpp's mul_mat_vec_q (ggml/src/ggml-cuda/mmvq.cu, vecdotq.cuh;
// reference sections 4.1-4.4), written anew with every order-relevant float op explicit:
//
//   block (32, HX_NWARPS); tid = 32*threadIdx.y + threadIdx.x
//   a CUDA block computes rows row0 .. row0+HX_RPB-1 for HX_NCOLS columns
//   thread tid walks weight blocks kbx = tid / HX_TPB, += HX_BPI (= 32*nwarps / HX_TPB)
//   and handles the ints iqs = HX_VDR * (tid % HX_TPB) of each block;
//   tmp[j][i] (column j, row i) accumulates one vec-dot per kbx;
//   warps 1..nwarps-1 hand tmp over through shared memory, warp 0 adds them in warp order,
//   then a 32-lane xor butterfly (hx_warp_sum); lane i writes row row0+i.
//
// Only the float operations fix the result. How a thread gets its integers is free, and is
// written for few instructions per weight byte (written plainly, a one-column mat-vec on an H200
// was bound by instruction issue, not by memory; bench/NOTES_mmvq.md):
//   * geometry and row length are compile-time, so every load is a per-thread pointer plus an
//     immediate offset (no 64-bit address arithmetic per load) and the kbx loop unrolls;
//   * a thread's block-invariant offsets and Q4_K scale-byte selectors are computed once;
//   * Q4_K reads a super-block's d, dmin and 12 scale bytes with one 16-byte load, Q6_K its
//     quant ints with 4-byte loads, where the weight's alignment allows it (checked at run time;
//     otherwise narrower loads of the same bytes);
//   * Q4_K and Q6_K activations come in the threads' own layout (hiraishin/kernels/quantize/layout.py): one 8/16-byte
//     load per column and kind of data, scales already float32, Q4_K's value sums precomputed.
//
// Compile-time: HX_QTYPE (HX_Q4_K | HX_Q6_K | HX_Q8_0), HX_NCOLS (1..16), HX_RPB (1..8),
// HX_NWARPS (1..16), HX_NBLOCKS (weight blocks per row), HX_UNROLL (kbx iterations per unrolled
// step), HX_MIN_BLOCKS (register cap as resident blocks per SM). Rows of the weight and columns
// of the activations are contiguous.
// Run-time: nrows, stride_dst (floats between output columns).
// Dynamic shared memory (HX_NWARPS-1)*HX_NCOLS*HX_RPB*32 floats. Grid: (ceil(nrows / HX_RPB), 1, 1).

// Block facts come from Python (hiraishin/kernels/mmvq/launch.py kernel_defines, from hiraishin.quant
// and the plan's traits): HX_QK (values per block), HX_BLOCK_BYTES, HX_VDR (VDR_MMVQ, ints per
// thread per call), HX_TPB (qi/vdr, threads per weight block), HX_Y_STEP (activation bytes per
// weight block in the layout the kernel reads); the ggml type ids HX_Q4_K/HX_Q6_K/HX_Q8_0 come
// with every source (hiraishin/kernels/compile.py).
#if !defined(HX_QK) || !defined(HX_BLOCK_BYTES) || !defined(HX_VDR) || !defined(HX_TPB) || !defined(HX_Y_STEP)
#error "mmvq.cu needs HX_QK, HX_BLOCK_BYTES, HX_VDR, HX_TPB and HX_Y_STEP from kernel_defines"
#endif
#if HX_QTYPE != HX_Q4_K && HX_QTYPE != HX_Q6_K && HX_QTYPE != HX_Q8_0
#error "HX_QTYPE must be HX_Q4_K, HX_Q6_K or HX_Q8_0"
#endif

#ifndef HX_UNROLL
#define HX_UNROLL 1
#endif
constexpr int hx_unroll = HX_UNROLL;  // #pragma unroll takes a constant, not a macro

#define HX_BPI (32 * HX_NWARPS / HX_TPB)                                  // weight blocks per kbx step
#define HX_COL_BYTES (HX_NBLOCKS * HX_Y_STEP)                             // q8_1 bytes per column
#define HX_ROW_BYTES ((long long)HX_NBLOCKS * HX_BLOCK_BYTES)

typedef unsigned char u8;

// Read-only loads (__ldg: the non-coherent path; weights and activations never change in a launch).
__device__ __forceinline__ int hx_ld_i32(const u8* p) {  // 4-byte aligned
    return __ldg((const int*)p);
}
__device__ __forceinline__ int hx_ld_i32_b2(const u8* p) {  // 2-byte aligned (get_int_b2)
    const unsigned short* q = (const unsigned short*)p;
    return (int)((unsigned int)__ldg(q) | ((unsigned int)__ldg(q + 1) << 16));
}
__device__ __forceinline__ unsigned short hx_ld_u16(const u8* p) {
    return __ldg((const unsigned short*)p);
}
__device__ __forceinline__ int hx_ld_s8(const u8* p) {
    return (int)__ldg((const signed char*)p);
}

// Activation loads: read-only global memory (__ldg), or, compiled with HX_Y_SHARED, the q8_1 rows a
// kernel built them in shared memory (norm_mmvq/norm_mmvq.cu): plain generic loads.
template <class T>
__device__ __forceinline__ T hx_ldy(const u8* p) {
#ifdef HX_Y_SHARED
    return *(const T*)p;
#else
    return __ldg((const T*)p);
#endif
}

__device__ __forceinline__ int hx_dp4a(int a, int b, int c) {
    return __dp4a(a, b, c);
}

// Every type below defines
//   hx_sites: this thread's pointers into its first weight block of each row (one per place it
//             loads from) and into the matching q8_1 blocks of column 0, made once by hx_sites_init;
//   hx_wblock hx_load_w<FAST>(sites, row, woff): the thread's share of weight block
//             kbx0 + woff / HX_BLOCK_BYTES of that row, decoded to integers and floats;
//   hx_wraw hx_load_raw<FAST>, hx_decode(raw, sites): the same in two halves, the words as loaded
//             and then decoded (HX_W_EARLY: loads before the wait, decoding after). Q4_K's and Q8_0's
//             hx_load_w is the two in a row (the same SASS); Q6_K keeps a one-piece hx_load_w, which
//             ptxas fits under the 32-register cap of its long rows where the two halves spill;
//   float hx_dot(acc, wblock, sites, yoff): acc + that share times the q8_1 data yoff bytes on;
//   bool hx_fast(sites): whether the wide loads are aligned for this thread (warp-uniform).
// Loads are "site + offset" with offsets that are compile-time constants once the kbx loop
// is unrolled.

#if HX_QTYPE == HX_Q4_K
// One thread's share of a Q4_K super-block (vec_dot_q4_K_q8_1): 8 values of sub-block 2c
// (low nibbles) and 8 of sub-block 2c+1 (high nibbles), c = (tid % 16) / 4, at ints
// pos/4 and pos/4 + 4 of the sub-block pair (pos = 4 * (tid % 4)).
struct hx_sites {
    const u8* blk[HX_RPB];  // the super-block (d, dmin, scales)
    const u8* q[HX_RPB];    // its quant int 16 + 32c + pos
    const u8* yq;           // activations, Q4_K layout: thread T = tid % 16's 4 ints,
    const u8* yd;           // the float32 d of q8_1 blocks 2c and 2c+1,
    const u8* ys;           // and T's two integer sums
    // 6-bit scales/mins of sub-blocks 2c, 2c+1 (get_scale_min_k4), as byte pairs:
    //   c < 2:  sc = bytes 2c,2c+1 of scales & 63,  m = bytes 2c+4,2c+5 & 63
    //   c >= 2: sc = low nibbles of bytes 2c+4,2c+5 | top 2 bits of bytes 2c-4,2c-3 << 4
    //           m  = high nibbles of bytes 2c+4,2c+5 | top 2 bits of bytes 2c,2c+1 << 4
    // One byte_perm of (scales 0..3, 8..11) resp. (4..7, 8..11) puts the low-part bytes in the
    // low half and the top-bit bytes in the high half, with the same selector for both.
    unsigned int sel, mlo, mtop, mshift;
};
__device__ __forceinline__ hx_sites hx_sites_init(const u8* const* wrow, const u8* y, const int tid) {
    const int kbx0 = tid / HX_TPB;
    const unsigned int c = (tid % 16) / 4;
    const unsigned int pos = 4 * (tid % 4);
    hx_sites s;
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        s.blk[i] = wrow[i] + kbx0 * HX_BLOCK_BYTES;
        s.q[i] = s.blk[i] + 16 + 32 * c + pos;
    }
    s.yq = y + kbx0 * HX_Y_STEP + 16 * (tid % 16);
    s.yd = y + kbx0 * HX_Y_STEP + 256 + 8 * c;
    s.ys = y + kbx0 * HX_Y_STEP + 288 + 8 * (tid % 16);
    s.sel = (2 * c) | ((2 * c + 1) << 4) | (((2 * c + 4) & 7) << 8) | (((2 * c + 5) & 7) << 12);
    s.mlo = c >= 2 ? 0x0F0Fu : 0x3F3Fu;
    s.mtop = c >= 2 ? 0x3030u : 0u;
    s.mshift = c >= 2 ? 4u : 0u;
    return s;
}
struct hx_wblock {
    int a[2][2];  // nibbles of sub-blocks 2c (a[0]) and 2c+1 (a[1]), ints pos/4 and pos/4 + 4
    int sc[2], m[2];
    float d, dmin;
};
struct hx_wraw {  // the loaded words, before decoding
    unsigned int dm, t0, t1, t2;
    int v0, v1;
};
template <bool FAST>  // FAST: the super-blocks are 16-byte aligned
__device__ __forceinline__ hx_wraw hx_load_raw(const hx_sites& s, const int i, const int woff) {
    hx_wraw r;
    if (FAST) {
        const uint4 h = __ldg((const uint4*)(s.blk[i] + woff));  // d, dmin, scales[0..11]
        r.dm = h.x; r.t0 = h.y; r.t1 = h.z; r.t2 = h.w;
    } else {
        r.dm = (unsigned int)hx_ld_i32(s.blk[i] + woff);
        r.t0 = (unsigned int)hx_ld_i32(s.blk[i] + woff + 4);
        r.t1 = (unsigned int)hx_ld_i32(s.blk[i] + woff + 8);
        r.t2 = (unsigned int)hx_ld_i32(s.blk[i] + woff + 12);
    }
    r.v0 = hx_ld_i32(s.q[i] + woff);
    r.v1 = hx_ld_i32(s.q[i] + woff + 16);
    return r;
}
__device__ __forceinline__ hx_wblock hx_decode(const hx_wraw& r, const hx_sites& s) {
    const unsigned int dm = r.dm, t0 = r.t0, t1 = r.t1, t2 = r.t2;
    const int v0 = r.v0, v1 = r.v1;
    const unsigned int x = __byte_perm(t0, t2, s.sel);
    const unsigned int y = __byte_perm(t1, t2, s.sel);
    const unsigned int pair_sc = (x & s.mlo) | ((x >> 18) & s.mtop);
    const unsigned int pair_m = ((y >> s.mshift) & s.mlo) | ((y >> 18) & s.mtop);
    hx_wblock b;
    b.a[0][0] = v0 & 0x0F0F0F0F;
    b.a[0][1] = v1 & 0x0F0F0F0F;
    b.a[1][0] = (v0 >> 4) & 0x0F0F0F0F;
    b.a[1][1] = (v1 >> 4) & 0x0F0F0F0F;
    b.sc[0] = (int)(pair_sc & 0xFF);
    b.sc[1] = (int)(pair_sc >> 8);
    b.m[0] = (int)(pair_m & 0xFF);
    b.m[1] = (int)(pair_m >> 8);
    b.d = hx_h2f((unsigned short)(dm & 0xFFFF));
    b.dmin = hx_h2f((unsigned short)(dm >> 16));
    return b;
}
template <bool FAST>  // FAST: the super-blocks are 16-byte aligned
__device__ __forceinline__ hx_wblock hx_load_w(const hx_sites& s, const int i, const int woff) {
    return hx_decode(hx_load_raw<FAST>(s, i, woff), s);
}
__device__ __forceinline__ float hx_dot(float acc, const hx_wblock& b, const hx_sites& s, const int yoff) {
    // u: ints pos/4, pos/4 + 4 of q8_1 block 2c, then of 2c+1; sums: dp4a(0x01010101, .) of each
    // pair (what llama.cpp computes as dot2), exact integers from the quantize kernel.
    const int4 u = hx_ldy<int4>(s.yq + yoff);
    const float2 d8 = hx_ldy<float2>(s.yd + yoff);
    const int2 sums = hx_ldy<int2>(s.ys + yoff);
    float sumf_d = 0.0f;
    float sumf_m = 0.0f;
    {
        const int dot1 = hx_dp4a(b.a[0][1], u.y, hx_dp4a(b.a[0][0], u.x, 0));
        sumf_d = __fmaf_rn(d8.x, __int2float_rn(dot1 * b.sc[0]), sumf_d);
        sumf_m = __fmaf_rn(d8.x, __int2float_rn(sums.x * b.m[0]), sumf_m);
    }
    {
        const int dot1 = hx_dp4a(b.a[1][1], u.w, hx_dp4a(b.a[1][0], u.z, 0));
        sumf_d = __fmaf_rn(d8.y, __int2float_rn(dot1 * b.sc[1]), sumf_d);
        sumf_m = __fmaf_rn(d8.y, __int2float_rn(sums.y * b.m[1]), sumf_m);
    }
    const float ret = __fmaf_rn(b.d, sumf_d, -__fmul_rn(b.dmin, sumf_m));
    return __fadd_rn(acc, ret);
}
__device__ __forceinline__ bool hx_fast(const hx_sites& s) {
    // Super-blocks are 144 bytes (a multiple of 16) apart in and across rows: one check for all.
    return ((unsigned long long)s.blk[0] & 15) == 0;
}

#elif HX_QTYPE == HX_Q6_K
// One thread's share of a Q6_K super-block (vec_dot_q6_K_q8_1): 4 values of each of two
// 32-value groups, 64 elements apart. The block's d multiplies into the accumulator (one fma).
// With few accumulators the "- 32" of the 6-bit values is folded into the integer dot product
// (dot(q - 32, u) = dot(q, u) + dot(-32, u), exact); with many it is applied once to the weights.
#ifndef HX_Q6_SUB_IN_DOT
#define HX_Q6_SUB_IN_DOT (HX_NCOLS <= 2 * HX_RPB)
#endif
struct hx_sites {
    const u8* blk[HX_RPB];  // the super-block (d at byte 208)
    const u8* ql[HX_RPB];   // low-bit int iqs
    const u8* qh[HX_RPB];   // high-bit int 8h + r%8
    const u8* sc[HX_RPB];   // scale 8h + r/4 (and + 4)
    const u8* yq;           // activations, Q6_K layout: lane iqs's 2 ints,
    const u8* yd;           // and the float32 d of their q8_1 blocks 4h + r/8, 4h + r/8 + 2
    unsigned int vh_shift;
};
__device__ __forceinline__ hx_sites hx_sites_init(const u8* const* wrow, const u8* y, const int tid) {
    const int kbx0 = tid / HX_TPB;
    const unsigned int iqs = tid % 32;
    const unsigned int h = iqs / 16;
    const unsigned int r = iqs % 16;
    hx_sites s;
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        s.blk[i] = wrow[i] + kbx0 * HX_BLOCK_BYTES;
        s.ql[i] = s.blk[i] + 4 * iqs;
        s.qh[i] = s.blk[i] + 128 + 4 * (8 * h + r % 8);
        s.sc[i] = s.blk[i] + 192 + 8 * h + r / 4;
    }
    s.yq = y + kbx0 * HX_Y_STEP + 8 * iqs;
    s.yd = y + kbx0 * HX_Y_STEP + 256 + 8 * (iqs / 8);
    s.vh_shift = 2 * (r / 8);
    return s;
}
struct hx_wblock {
    int vi[2];
    int sc[2];
    float d;
};
template <bool FAST>  // FAST: the super-blocks are 4-byte aligned
__device__ __forceinline__ hx_wblock hx_load_w(const hx_sites& s, const int i, const int woff) {
    const int vl = FAST ? hx_ld_i32(s.ql[i] + woff) : hx_ld_i32_b2(s.ql[i] + woff);
    const int vh = (FAST ? hx_ld_i32(s.qh[i] + woff) : hx_ld_i32_b2(s.qh[i] + woff)) >> s.vh_shift;
    hx_wblock b;
    const int q0 = (vl & 0x0F0F0F0F) | ((vh << 4) & 0x30303030);
    const int q1 = ((vl >> 4) & 0x0F0F0F0F) | (vh & 0x30303030);
    b.vi[0] = HX_Q6_SUB_IN_DOT ? q0 : hx_sub32_bytes(q0);
    b.vi[1] = HX_Q6_SUB_IN_DOT ? q1 : hx_sub32_bytes(q1);
    b.sc[0] = hx_ld_s8(s.sc[i] + woff);
    b.sc[1] = hx_ld_s8(s.sc[i] + woff + 4);
    b.d = hx_h2f(hx_ld_u16(s.blk[i] + woff + 208));
    return b;
}
struct hx_wraw {  // the loaded words, before decoding
    int vl, vh, sc0, sc1;
    unsigned short d;
};
template <bool FAST>  // FAST: the super-blocks are 4-byte aligned
__device__ __forceinline__ hx_wraw hx_load_raw(const hx_sites& s, const int i, const int woff) {
    hx_wraw r;
    r.vl = FAST ? hx_ld_i32(s.ql[i] + woff) : hx_ld_i32_b2(s.ql[i] + woff);
    r.vh = FAST ? hx_ld_i32(s.qh[i] + woff) : hx_ld_i32_b2(s.qh[i] + woff);
    r.sc0 = hx_ld_s8(s.sc[i] + woff);
    r.sc1 = hx_ld_s8(s.sc[i] + woff + 4);
    r.d = hx_ld_u16(s.blk[i] + woff + 208);
    return r;
}
__device__ __forceinline__ hx_wblock hx_decode(const hx_wraw& r, const hx_sites& s) {
    const int vl = r.vl;
    const int vh = r.vh >> s.vh_shift;
    hx_wblock b;
    const int q0 = (vl & 0x0F0F0F0F) | ((vh << 4) & 0x30303030);
    const int q1 = ((vl >> 4) & 0x0F0F0F0F) | (vh & 0x30303030);
    b.vi[0] = HX_Q6_SUB_IN_DOT ? q0 : hx_sub32_bytes(q0);
    b.vi[1] = HX_Q6_SUB_IN_DOT ? q1 : hx_sub32_bytes(q1);
    b.sc[0] = r.sc0;
    b.sc[1] = r.sc1;
    b.d = hx_h2f(r.d);
    return b;
}
__device__ __forceinline__ float hx_dot(float acc, const hx_wblock& b, const hx_sites& s, const int yoff) {
    const int2 u2 = hx_ldy<int2>(s.yq + yoff);
    const float2 d2 = hx_ldy<float2>(s.yd + yoff);
    const int u[2] = {u2.x, u2.y};
    const float d8[2] = {d2.x, d2.y};
    float sumf = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int dot = HX_Q6_SUB_IN_DOT ? hx_dp4a(b.vi[i], u[i], hx_dp4a((int)0xE0E0E0E0, u[i], 0))
                                         : hx_dp4a(b.vi[i], u[i], 0);
        sumf = __fmaf_rn(d8[i], __int2float_rn(dot * b.sc[i]), sumf);
    }
    return __fmaf_rn(b.d, sumf, acc);
}
__device__ __forceinline__ bool hx_fast(const hx_sites& s) {
    // 4-byte loads need every super-block this thread reads 4-byte aligned: its first one in
    // each row, and the step between them (HX_BPI blocks of 210 bytes). kbx0 is the warp
    // index, so the answer is the same for the whole warp.
    if ((HX_BPI * HX_BLOCK_BYTES) % 4 != 0) {
        return false;
    }
    bool ok = true;
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        ok = ok && ((unsigned long long)s.blk[i] & 3) == 0;
    }
    return ok;
}

#else  // HX_Q8_0
// One thread's share of a Q8_0 block (vec_dot_q8_0_q8_1): 8 values (ints iqs, iqs+1).
// Blocks are 34 bytes, so the quants are only 2-byte aligned.
struct hx_sites {
    const u8* blk[HX_RPB];  // the block (d)
    const u8* q[HX_RPB];    // its int iqs
    const u8* yd;           // the q8_1 block (d)
    const u8* yq;           // its int iqs
};
__device__ __forceinline__ hx_sites hx_sites_init(const u8* const* wrow, const u8* y, const int tid) {
    const int kbx0 = tid / HX_TPB;
    const unsigned int iqs = HX_VDR * (tid % HX_TPB);
    hx_sites s;
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        s.blk[i] = wrow[i] + kbx0 * HX_BLOCK_BYTES;
        s.q[i] = s.blk[i] + 2 + 4 * iqs;
    }
    s.yd = y + kbx0 * HX_Y_STEP;
    s.yq = s.yd + 4 + 4 * iqs;
    return s;
}
struct hx_wblock {
    int v[2];
    float d;
};
struct hx_wraw {  // the loaded words, before decoding
    int v0, v1;
    unsigned short d;
};
template <bool FAST>
__device__ __forceinline__ hx_wraw hx_load_raw(const hx_sites& s, const int i, const int woff) {
    hx_wraw r;
    r.v0 = hx_ld_i32_b2(s.q[i] + woff);
    r.v1 = hx_ld_i32_b2(s.q[i] + woff + 4);
    r.d = hx_ld_u16(s.blk[i] + woff);
    return r;
}
__device__ __forceinline__ hx_wblock hx_decode(const hx_wraw& r, const hx_sites& s) {
    hx_wblock b;
    b.v[0] = r.v0;
    b.v[1] = r.v1;
    b.d = hx_h2f(r.d);
    return b;
}
template <bool FAST>
__device__ __forceinline__ hx_wblock hx_load_w(const hx_sites& s, const int i, const int woff) {
    return hx_decode(hx_load_raw<FAST>(s, i, woff), s);
}
__device__ __forceinline__ float hx_dot(float acc, const hx_wblock& b, const hx_sites& s, const int yoff) {
    const int u0 = hx_ldy<int>(s.yq + yoff);
    const int u1 = hx_ldy<int>(s.yq + yoff + 4);
    const int sumi = hx_dp4a(b.v[1], u1, hx_dp4a(b.v[0], u0, 0));
    const float d = __fmul_rn(b.d, hx_h2f(hx_ldy<unsigned short>(s.yd + yoff)));
    return __fmaf_rn(d, __int2float_rn(sumi), acc);
}
__device__ __forceinline__ bool hx_fast(const hx_sites& s) {
    return false;
}
#endif

// One kbx step: weight blocks kbx0 + it*HX_BPI of every row, times every column.
template <bool FAST>
__device__ __forceinline__ void hx_step(float (&tmp)[HX_NCOLS][HX_RPB], const hx_sites& s, const int it) {
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        const hx_wblock b = hx_load_w<FAST>(s, i, it * (HX_BPI * HX_BLOCK_BYTES));
#pragma unroll
        for (int j = 0; j < HX_NCOLS; ++j) {
            tmp[j][i] = hx_dot(tmp[j][i], b, s, it * (HX_BPI * HX_Y_STEP) + j * HX_COL_BYTES);
        }
    }
}

// The kbx loop: every thread takes HX_NBLOCKS / HX_BPI full steps; when HX_BPI does not divide
// HX_NBLOCKS the threads with kbx0 < HX_NBLOCKS % HX_BPI take one more.
template <bool FAST>
__device__ __forceinline__ void hx_accumulate(float (&tmp)[HX_NCOLS][HX_RPB], const hx_sites& s, const int kbx0) {
    constexpr int full = HX_NBLOCKS / HX_BPI;
#pragma unroll hx_unroll
    for (int it = 0; it < full; ++it) {
        hx_step<FAST>(tmp, s, it);
    }
    if (HX_NBLOCKS % HX_BPI != 0 && kbx0 < HX_NBLOCKS % HX_BPI) {
        hx_step<FAST>(tmp, s, full);
    }
}

// HX_W_EARLY (launch.py ENV_EARLY): the kernels wait for the previous kernel (HX_PDL_ENTRY) inside
// the row code, after a thread has loaded its weight words of its first HX_W_EARLY steps (at most
// HX_UNROLL; and of the partial step when that is all there is): weights are never written, so under programmatic
// dependent launch they come from L2 / DRAM into registers while the previous kernel runs, and
// only the activations are read after the wait. The same dots in the same order per accumulator.
#ifndef HX_W_EARLY
#define HX_W_EARLY 0
#endif
template <bool FAST>
__device__ __forceinline__ void hx_accumulate_early(float (&tmp)[HX_NCOLS][HX_RPB], const hx_sites& s,
                                                    const int kbx0) {
    constexpr int full = HX_NBLOCKS / HX_BPI;
    constexpr int rem = HX_NBLOCKS % HX_BPI;
    constexpr int ahead = HX_W_EARLY < hx_unroll ? HX_W_EARLY : hx_unroll;
    constexpr int pre = full < ahead ? full : ahead;        // full steps loaded before the wait
    constexpr bool pre_part = rem != 0 && full < ahead;     // the partial step too (no loop left)
    const bool has_part = rem != 0 && kbx0 < rem;
    hx_wraw wb[pre > 0 ? pre : 1][HX_RPB];  // loaded, decoded after the wait (fewer registers)
    hx_wraw wp[HX_RPB];
#pragma unroll
    for (int it = 0; it < pre; ++it) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            wb[it][i] = hx_load_raw<FAST>(s, i, it * (HX_BPI * HX_BLOCK_BYTES));
        }
    }
    if (pre_part && has_part) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            wp[i] = hx_load_raw<FAST>(s, i, full * (HX_BPI * HX_BLOCK_BYTES));
        }
    }
    HX_PDL_ENTRY();
#pragma unroll
    for (int it = 0; it < pre; ++it) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            const hx_wblock b = hx_decode(wb[it][i], s);
#pragma unroll
            for (int j = 0; j < HX_NCOLS; ++j) {
                tmp[j][i] = hx_dot(tmp[j][i], b, s, it * (HX_BPI * HX_Y_STEP) + j * HX_COL_BYTES);
            }
        }
    }
#pragma unroll hx_unroll
    for (int it = pre; it < full; ++it) {
        hx_step<FAST>(tmp, s, it);
    }
    if (has_part) {
        if (pre_part) {
#pragma unroll
            for (int i = 0; i < HX_RPB; ++i) {
                const hx_wblock b = hx_decode(wp[i], s);
#pragma unroll
                for (int j = 0; j < HX_NCOLS; ++j) {
                    tmp[j][i] = hx_dot(tmp[j][i], b, s, full * (HX_BPI * HX_Y_STEP) + j * HX_COL_BYTES);
                }
            }
        } else {
            hx_step<FAST>(tmp, s, full);
        }
    }
}

// Minimum resident CUDA blocks per SM the compiler must allow (register cap); 1 = no cap.
#ifndef HX_MIN_BLOCKS
#define HX_MIN_BLOCKS 1
#endif

// Ask L2 for the weight bytes of this CUDA block's rows before waiting on the previous kernel
// (HX_PDL_ENTRY): weights are never written, so under programmatic dependent launch their DRAM
// latency overlaps the previous kernel's tail. A block also asks for the rows of the block
// HX_PREFETCH_AHEAD indices later (about one wave of resident blocks; opt-in: launch.py), so a matrix
// larger than one wave streams from DRAM a wave ahead of the blocks that read it. Cache hints
// only: no value and no float operation changes.
#ifndef HX_PREFETCH_AHEAD
#define HX_PREFETCH_AHEAD 0
#endif
__device__ __forceinline__ void hx_prefetch_rows(const u8* __restrict__ w, const int nrows, const int row0) {
    const long long first = (long long)min(row0, nrows - 1) * HX_ROW_BYTES;
    const long long bytes = (long long)(min(row0 + HX_RPB, nrows) - min(row0, nrows - 1)) * HX_ROW_BYTES;
    hx_prefetch_lines(w + first, bytes, 32 * threadIdx.y + threadIdx.x, 32 * HX_NWARPS);
}

// The rows row0 .. row0+HX_RPB-1 of one weight for every column: the work of HX_NWARPS warps
// (lane threadIdx.x, warp wy of them), which hand over through tmp_shared
// ((HX_NWARPS-1)*HX_NCOLS*HX_RPB*32 floats of their own). Every thread of the CUDA block calls it
// (one __syncthreads). EARLY: the thread waits for the previous kernel itself, once its first
// weights are in registers (HX_W_EARLY); else its caller has waited. key (warp 0, or NULL): the
// largest argmax key (fp.cuh hx_argmax_key) of column 0's rows that exist, max-ed into *key.
template <bool EARLY = false>
__device__ __forceinline__ void hx_mmvq_rows(const u8* __restrict__ w, const u8* __restrict__ y,
                                             float* __restrict__ dst, const int nrows,
                                             const long long stride_dst, const int row0, const int wy,
                                             float* tmp_shared, unsigned long long* key = nullptr) {
    const int lane = threadIdx.x;
    const int tid = 32 * wy + lane;
    const int kbx0 = tid / HX_TPB;

    float tmp[HX_NCOLS][HX_RPB];
#pragma unroll
    for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            tmp[j][i] = 0.0f;
        }
    }
    // Rows past the end recompute the last row; their results are never written.
    const u8* wrow[HX_RPB];
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        wrow[i] = w + (long long)min(row0 + i, nrows - 1) * HX_ROW_BYTES;
    }
    const hx_sites s = hx_sites_init(wrow, y, tid);
    if (EARLY) {
        if (hx_fast(s)) {
            hx_accumulate_early<true>(tmp, s, kbx0);
        } else {
            hx_accumulate_early<false>(tmp, s, kbx0);
        }
    } else if (hx_fast(s)) {
        hx_accumulate<true>(tmp, s, kbx0);
    } else {
        hx_accumulate<false>(tmp, s, kbx0);
    }

    // tmp_shared: [nwarps-1][HX_NCOLS][HX_RPB][32]
    if (wy > 0) {
#pragma unroll
        for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
            for (int i = 0; i < HX_RPB; ++i) {
                tmp_shared[(((wy - 1) * HX_NCOLS + j) * HX_RPB + i) * 32 + lane] = tmp[j][i];
            }
        }
    }
    __syncthreads();
    if (wy > 0) {
        return;
    }

#pragma unroll
    for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            float s = tmp[j][i];
#pragma unroll
            for (int wp = 0; wp < HX_NWARPS - 1; ++wp) {  // warps 1, 2, ... in order
                s = __fadd_rn(s, tmp_shared[((wp * HX_NCOLS + j) * HX_RPB + i) * 32 + lane]);
            }
            s = hx_warp_sum(s);
            if (lane == i && row0 + i < nrows) {
                dst[j * stride_dst + row0 + i] = s;
            }
            if (key != nullptr && j == 0 && row0 + i < nrows) *key = hx_key_max(*key, hx_argmax_key(s, row0 + i));
        }
    }
}

// The kernels. mixed.cu compiles this file twice, once per weight type in a namespace of its own, for
// the device functions above only (HX_MMVQ_NO_KERNELS): extern "C" names cannot be namespaced.
#ifndef HX_MMVQ_NO_KERNELS
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
mmvq(const u8* __restrict__ w, const u8* __restrict__ y, float* __restrict__ dst, const int nrows,
     const long long stride_dst) {
    hx_prefetch_rows(w, nrows, HX_RPB * blockIdx.x);
    if (HX_PREFETCH_AHEAD > 0 && blockIdx.x + HX_PREFETCH_AHEAD < gridDim.x) {
        hx_prefetch_rows(w, nrows, HX_RPB * (blockIdx.x + HX_PREFETCH_AHEAD));
    }
#if !HX_W_EARLY
    HX_PDL_ENTRY();
#endif
    extern __shared__ float tmp_shared[];
    hx_mmvq_rows<(HX_W_EARLY > 0)>(w, y, dst, nrows, stride_dst, HX_RPB * blockIdx.x, threadIdx.y, tmp_shared);
}

#ifdef HX_ARGMAX
// mmvq_argmax (HX_ARGMAX, one column): the output head of a one-token pass with its greedy token, one launch
// fewer than mmvq then elementwise.cu's hx_argmax_rows. The logits are mmvq's (the same rows, the same
// bits); the token is hx_argmax_rows' (the first index of the largest logit, NaN largest; a largest key
// over every row is the same key however the rows were split), with its advance and token log. Each CUDA
// block max-es its rows' key into one of HX_ARGMAX_SLOTS slots (blockIdx.x % slots: the atomics of tens
// of thousands of blocks spread over that many addresses) and counts itself in the slot's counter; the
// last block of a slot counts the slot in counters[HX_ARGMAX_SLOTS], and the last slot's block takes the
// largest slot key, writes the token (out, advance, log as hx_argmax_rows) and sets every key and counter
// back to 0 for the next launch (a CUDA graph replays this one). slot_keys: HX_ARGMAX_SLOTS uint64,
// counters: HX_ARGMAX_SLOTS + 1 uint32, zero before the first launch.
#if HX_NCOLS != 1
#error "mmvq_argmax: one column"
#endif
// The end of an argmax launch (mmvq_argmax, norm_mmvq.cu hx_norm_mmvq_argmax), by warp 0 of one CUDA block
// holding the block's largest key in every lane: max it into slot blockIdx.x % HX_ARGMAX_SLOTS, count the
// block in; the last block of the launch takes the largest slot key, writes the token (out, advance, log as
// hx_argmax_rows) and sets every key and counter back to 0. dst: the logits (nrows), any block's.
__device__ __forceinline__ void hx_argmax_finish(const unsigned long long key, const float* dst, const int nrows,
                                                 unsigned long long* slot_keys, unsigned int* counters,
                                                 int* __restrict__ out, const int* pos, int* advance, int* log,
                                                 const int n_log) {
    const int lane = threadIdx.x;
    const unsigned int slots = min(gridDim.x, (unsigned int)HX_ARGMAX_SLOTS);
    int last = 0;
    __threadfence();  // every lane's rows visible on the device before the count says so (the last block reads
    __syncwarp();     // the token's logit, which any lane of any block may have stored; as mmvq_swiglu.cu)
    if (lane == 0) {
        const unsigned int slot = blockIdx.x % HX_ARGMAX_SLOTS;
        atomicMax(&slot_keys[slot], key);
        __threadfence();  // the key visible before the count says so
        const unsigned int in_slot = (gridDim.x - slot + HX_ARGMAX_SLOTS - 1) / HX_ARGMAX_SLOTS;
        if (atomicAdd(&counters[slot], 1u) == in_slot - 1) {
            __threadfence();
            last = atomicAdd(&counters[HX_ARGMAX_SLOTS], 1u) == slots - 1;
        }
    }
    if (!__shfl_sync(0xffffffffu, last, 0, 32)) return;  // uniform per warp
    __threadfence();
    unsigned long long best = 0;
    for (unsigned int k = lane; k < slots; k += 32) best = hx_key_max(best, ((volatile unsigned long long*)slot_keys)[k]);
    for (int off = 16; off > 0; off >>= 1) {
        const unsigned int hi = __shfl_xor_sync(0xffffffffu, (unsigned int)(best >> 32), off, 32);
        const unsigned int lo = __shfl_xor_sync(0xffffffffu, (unsigned int)best, off, 32);
        best = hx_key_max(best, ((unsigned long long)hi << 32) | lo);
    }
    for (unsigned int k = lane; k < HX_ARGMAX_SLOTS; k += 32) {  // ready for the next launch
        slot_keys[k] = 0;
        counters[k] = 0;
    }
    if (lane == 0) {
        counters[HX_ARGMAX_SLOTS] = 0;
        const unsigned int index = 0xffffffffu - (unsigned int)best;
        const int token = best == 0 || (int)index >= nrows ? 0 : (int)index;
        out[0] = token;
        if (advance != nullptr) {
            const int next = pos[0] + 1;  // read before advance[1] is written (they may alias)
            advance[0] = token;
            advance[1] = next;
            if (log != nullptr && next < n_log) {
                log[2 * next] = token;
                log[2 * next + 1] = (int)__float_as_uint(((volatile float*)dst)[token]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
mmvq_argmax(const u8* __restrict__ w, const u8* __restrict__ y, float* dst, const int nrows,
            unsigned long long* slot_keys, unsigned int* counters, int* __restrict__ out, const int* pos,
            int* advance, int* log, const int n_log) {
    hx_prefetch_rows(w, nrows, HX_RPB * blockIdx.x);
#if !HX_W_EARLY
    HX_PDL_ENTRY();
#endif
    extern __shared__ float tmp_shared[];
    unsigned long long key = 0;  // below every value's key
    hx_mmvq_rows<(HX_W_EARLY > 0)>(w, y, dst, nrows, nrows, HX_RPB * blockIdx.x, threadIdx.y, tmp_shared, &key);
    if (threadIdx.y != 0) return;  // warp 0 holds the rows' sums and the key (every lane the same)
    hx_argmax_finish(key, dst, nrows, slot_keys, counters, out, pos, advance, log, n_log);
}
#endif  // HX_ARGMAX

// The rows of mmvq_multi's CUDA block b (whichever weight it maps to) into L2.
__device__ __forceinline__ void hx_multi_prefetch(const int b, const u8* w0, const int nrows0, const int nblk0,
                                                  const u8* w1, const int nrows1, const int nblk1,
                                                  const u8* w2, const int nrows2) {
    if (b < nblk0) {
        hx_prefetch_rows(w0, nrows0, HX_RPB * b);
    } else if (b < nblk0 + nblk1) {
        hx_prefetch_rows(w1, nrows1, HX_RPB * (b - nblk0));
    } else {
        hx_prefetch_rows(w2, nrows2, HX_RPB * (b - nblk0 - nblk1));
    }
}

// Up to three weights of one type and row length that read the same activations (Q, K and V;
// gate and up) in one launch: CUDA blocks 0..nblk0-1 take weight 0, the next nblk1 weight 1,
// the rest weight 2. Each row is summed exactly as by mmvq (which outputs share a CUDA block
// changes no bit); weight i writes its own output dst_i (ncols rows of nrows_i floats).
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
mmvq_multi(const u8* __restrict__ y, const u8* __restrict__ w0, float* __restrict__ dst0, const int nrows0,
           const int nblk0, const u8* __restrict__ w1, float* __restrict__ dst1, const int nrows1,
           const int nblk1, const u8* __restrict__ w2, float* __restrict__ dst2, const int nrows2) {
    const int b = blockIdx.x;
    hx_multi_prefetch(b, w0, nrows0, nblk0, w1, nrows1, nblk1, w2, nrows2);
    if (HX_PREFETCH_AHEAD > 0 && b + HX_PREFETCH_AHEAD < gridDim.x) {
        hx_multi_prefetch(b + HX_PREFETCH_AHEAD, w0, nrows0, nblk0, w1, nrows1, nblk1, w2, nrows2);
    }
#if !HX_W_EARLY
    HX_PDL_ENTRY();
#endif
    extern __shared__ float tmp_shared[];
    if (b < nblk0) {
        hx_mmvq_rows<(HX_W_EARLY > 0)>(w0, y, dst0, nrows0, nrows0, HX_RPB * b, threadIdx.y, tmp_shared);
    } else if (b < nblk0 + nblk1) {
        hx_mmvq_rows<(HX_W_EARLY > 0)>(w1, y, dst1, nrows1, nrows1, HX_RPB * (b - nblk0), threadIdx.y, tmp_shared);
    } else {
        hx_mmvq_rows<(HX_W_EARLY > 0)>(w2, y, dst2, nrows2, nrows2, HX_RPB * (b - nblk0 - nblk1), threadIdx.y, tmp_shared);
    }
}
#endif  // HX_MMVQ_NO_KERNELS
