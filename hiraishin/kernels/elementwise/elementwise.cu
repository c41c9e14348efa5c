// Elementwise kernels of the Qwen3 forward pass: SwiGLU, residual add, and embedding-row lookup
// (ggml get_rows) that dequantizes Q4_K / Q6_K / Q8_0 / F16 / F32 rows to float32.
// None of them reduces, so none has an order to plan; each float op is written as an explicit
// correctly rounded intrinsic so that the Numba emulator (elementwise.py) gets the same bits.
// Requires fp.cuh prepended (hx_expf, hx_h2f).

__device__ __forceinline__ float hx_load_half(const unsigned char* p) {
    return hx_h2f((unsigned short)(p[0] | (p[1] << 8)));  // exact (fp.cuh)
}

// m = silu(g) * u,  silu(g) = g / (1 + exp(-g)).
extern "C" __global__ void hx_swiglu_f32(const float* __restrict__ g, const float* __restrict__ u,
                                         float* __restrict__ out, const long long n) {
    HX_PDL_ENTRY();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gi = g[i];
    const float silu = __fdiv_rn(gi, __fadd_rn(1.0f, hx_expf(-gi)));
    out[i] = __fmul_rn(silu, u[i]);
}

// out = a + b
extern "C" __global__ void hx_add_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ out, const long long n) {
    HX_PDL_ENTRY();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __fadd_rn(a[i], b[i]);
}

// ---- get_rows: out[t, :] = dequantize(table[ids[t], :]) -------------------------------------
// The float formulas follow gguf-py's dequantize_blocks (and ggml's CPU dequantize_row_*), op for op:
//   Q8_0: q * d
//   Q4_K: (d * sc) * q - (dmin * m)        two products, then one subtraction (no fma)
//   Q6_K: (d * sc) * q

// HX_QK_K, HX_Q4_K_BYTES, HX_Q6_K_BYTES, HX_QK8_0, HX_Q8_0_BYTES: block facts every source gets
// from hiraishin.quant (hiraishin/kernels/compile.py format_defines).

// Element col of a row, per type: row points at the row's first block.
__device__ __forceinline__ float hx_row_q4_K(const unsigned char* row, const int col) {
    const unsigned char* block = row + (long long)(col / HX_QK_K) * HX_Q4_K_BYTES;
    const int e = col % HX_QK_K;
    const int j = e / 32;                 // sub-block 0..7
    const int chunk = e / 64;             // 32-byte chunk of qs
    const int l = e % 32;
    const unsigned char* scales = block + 4;
    int sc, m;
    if (j < 4) {
        sc = scales[j] & 63;
        m = scales[j + 4] & 63;
    } else {
        sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
    const unsigned char byte = block[16 + 32 * chunk + l];
    const int q = (j & 1) ? (byte >> 4) : (byte & 0x0F);
    const float d1 = __fmul_rn(hx_load_half(block), (float)sc);
    const float m1 = __fmul_rn(hx_load_half(block + 2), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

__device__ __forceinline__ float hx_row_q6_K(const unsigned char* row, const int col) {
    const unsigned char* block = row + (long long)(col / HX_QK_K) * HX_Q6_K_BYTES;
    const int e = col % HX_QK_K;
    const int h = e / 128;
    const int s = (e % 128) / 32;
    const int l = e % 32;
    const unsigned char low_byte = block[64 * h + 32 * (s & 1) + l];
    const int low = s < 2 ? (low_byte & 0x0F) : (low_byte >> 4);
    const int high = (block[128 + 32 * h + l] >> (2 * s)) & 3;
    const int q = (low | (high << 4)) - 32;
    const int sc = (int)(signed char)block[192 + e / 16];
    const float d = hx_load_half(block + 208);
    return __fmul_rn(__fmul_rn(d, (float)sc), (float)q);
}

__device__ __forceinline__ float hx_row_q8_0(const unsigned char* row, const int col) {
    const unsigned char* block = row + (long long)(col / HX_QK8_0) * HX_Q8_0_BYTES;
    const int q = (int)(signed char)block[2 + col % HX_QK8_0];
    return __fmul_rn((float)q, hx_load_half(block));
}

__device__ __forceinline__ float hx_row_f16(const unsigned char* row, const int col) {
    return hx_load_half(row + 2 * col);
}

__device__ __forceinline__ float hx_row_f32(const unsigned char* row, const int col) {
    return ((const float*)row)[col];
}

// One kernel per table type: grid (n_ids, ceil(n_cols / blockDim.x)), one thread per element.
#define HX_GET_ROWS_KERNEL(name, element)                                                             \
    extern "C" __global__ void name(const unsigned char* __restrict__ table, const int* __restrict__ ids, \
                                    float* __restrict__ out, const int n_cols, const long long row_bytes) { \
        HX_PDL_ENTRY();                                                                                     \
        const int t = blockIdx.x;                                                                     \
        const int col = blockIdx.y * blockDim.x + threadIdx.x;                                        \
        if (col >= n_cols) return;                                                                    \
        out[(long long)t * n_cols + col] = element(table + (long long)ids[t] * row_bytes, col);       \
    }

HX_GET_ROWS_KERNEL(hx_get_rows_q4_K, hx_row_q4_K)
HX_GET_ROWS_KERNEL(hx_get_rows_q6_K, hx_row_q6_K)
HX_GET_ROWS_KERNEL(hx_get_rows_q8_0, hx_row_q8_0)
HX_GET_ROWS_KERNEL(hx_get_rows_f16, hx_row_f16)
HX_GET_ROWS_KERNEL(hx_get_rows_f32, hx_row_f32)

// ---- KV store: cache[pos[t], h, d] = f16(kv[t, h, d]) for the K and the V of one layer ---------
// Positions come from the device (the pass's int32 positions), so a CUDA graph of a pass replays
// at any position. The cast is f32 -> f16, round to nearest even (hx_f2h), as the host-side
// KVCache.write's astype(float16) and CuPy's cast round. Grid (T, ceil(row / 256)), row =
// n_head_kv * head_dim values.
extern "C" __global__ void hx_kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                       const int* __restrict__ pos, unsigned short* __restrict__ k_cache,
                                       unsigned short* __restrict__ v_cache, const int row) {
    HX_PDL_ENTRY();
    const int t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= row) return;
    const long long dst = (long long)pos[t] * row + i;
    const long long src = (long long)t * row + i;
    k_cache[dst] = hx_f2h(k[src]);
    v_cache[dst] = hx_f2h(v[src]);
}

// ---- argmax of each row (greedy decoding's token, without copying the logits to the host) ------
// out[t] = the first index of the largest value of row t, NaN counting as larger than any number
// (numpy's argmax; -0.0 == +0.0). A comparison is no float operation, so how the row is split
// among threads changes no result: each thread scans i = tid, tid + blockDim.x, ... keeping its
// best, then warps and the block merge by the same rule. Grid (T,), block HX_ARGMAX_THREADS.
__device__ __forceinline__ bool hx_argmax_better(const float v, const int i, const float bv, const int bi) {
    const bool nv = v != v;
    const bool nb = bv != bv;
    if (nv != nb) return nv;
    if (!nv && v != bv) return v > bv;
    return i < bi;  // equal values (or both NaN): the first index
}

extern "C" __global__ void hx_argmax_rows(const float* __restrict__ x, int* __restrict__ out, const int n) {
    HX_PDL_ENTRY();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float* row = x + (long long)blockIdx.x * n;
    float bv = __int_as_float(0xff800000);  // -inf: an all -inf row gives index 0 by the index rule
    int bi = 0x7fffffff;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (hx_argmax_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off, 32);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off, 32);
        if (hx_argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const int nwarps = blockDim.x / 32;
        bv = lane < nwarps ? best_v[lane] : __int_as_float(0xff800000);
        bi = lane < nwarps ? best_i[lane] : 0x7fffffff;
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off, 32);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off, 32);
            if (hx_argmax_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) out[blockIdx.x] = bi < n ? bi : 0;
    }
}
