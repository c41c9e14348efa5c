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
    out[i] = hx_swiglu(g[i], u[i]);
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

// One kernel per table type: grid (n_ids, ceil(n_cols / blockDim.x)), one thread per element. Each waits
// (HX_PDL_ENTRY) before it reads the ids: a pass's first launch follows the previous pass's argmax (whose
// advance writes the token id) where passes share a graph (PassGraphs.graph_passes). kernels/pdl.py finds
// that wait through the macro (pdl.body_has_entry).
template <float (*ELEMENT)(const unsigned char*, int)>
__device__ __forceinline__ void hx_get_rows(const unsigned char* __restrict__ table, const int* __restrict__ ids,
                                            float* __restrict__ out, const int n_cols, const long long row_bytes) {
    const int t = blockIdx.x;
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= n_cols) return;
    out[(long long)t * n_cols + col] = ELEMENT(table + (long long)ids[t] * row_bytes, col);
}
#define HX_GET_ROWS_KERNEL(NAME, ELEMENT)                                                                  \
    extern "C" __global__ void NAME(const unsigned char* __restrict__ table, const int* __restrict__ ids,  \
                                    float* __restrict__ out, const int n_cols, const long long row_bytes) { \
        HX_PDL_ENTRY();                                                                                     \
        hx_get_rows<ELEMENT>(table, ids, out, n_cols, row_bytes);                                           \
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
// among threads and CUDA blocks changes no result. Each candidate is one 64-bit key whose unsigned
// order is that rule: high word the value's bits mapped to an unsigned order (every NaN above +inf,
// -0.0 as +0.0), low word 0xffffffff - index (the first index wins a tie), so the answer is the
// largest key. Grid (B, T): block b of row t takes i = b*blockDim.x + tid, then + B*blockDim.x, ...,
// writes its block's largest key to partials[t*B + b]; the last block of row t to finish (a counter
// per row, reset to 0 by that block for the next launch) takes the largest of the B keys.
// (hx_argmax_key and hx_key_max: fp.cuh, shared with the output head that finds its argmax, mmvq.cu.)

// The largest key of the block (valid in thread 0). Every thread must call it.
__device__ __forceinline__ unsigned long long hx_block_key_max(unsigned long long key, unsigned long long* warp_keys) {
    for (int off = 16; off > 0; off >>= 1) {
        const unsigned int hi = __shfl_xor_sync(0xffffffffu, (unsigned int)(key >> 32), off, 32);
        const unsigned int lo = __shfl_xor_sync(0xffffffffu, (unsigned int)key, off, 32);
        key = hx_key_max(key, ((unsigned long long)hi << 32) | lo);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_keys[warp] = key;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)blockDim.x / 32; ++k) key = hx_key_max(key, warp_keys[k]);
    }
    return key;
}

// advance (may be NULL; hiraishin.backends.graphs): where the next one-token pass of a chain of passes
// reads its inputs. The greedy token of the last row t = T - 1 (at position pos[t]) becomes the token
// id advance[0] at position advance[1] = pos[t] + 1, and row pos[t] + 1 of log (n_log rows of two ints
// indexed by position, or NULL): the token and the bits of its logit, so CUDA graphs of one-token passes replay back to back with no copy between
// them, each feeding the token the one before made. advance may be the buffer pos points into: this
// kernel runs last in its pass, after every kernel that reads it (each waits for the one before).
extern "C" __global__ void hx_argmax_rows(const float* __restrict__ x, int* __restrict__ out,
                                          unsigned long long* partials, unsigned int* counters, const int n,
                                          const int* pos, int* advance, int* log, const int n_log) {
    HX_PDL_ENTRY();
    __shared__ unsigned long long warp_keys[32];
    __shared__ bool last;
    const int t = blockIdx.y, B = gridDim.x;
    const float* row = x + (long long)t * n;
    unsigned long long key = 0;  // below every value's key
#pragma unroll 4
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += B * blockDim.x) {
        key = hx_key_max(key, hx_argmax_key(row[i], i));
    }
    key = hx_block_key_max(key, warp_keys);
    if (threadIdx.x == 0) {
        partials[(long long)t * B + blockIdx.x] = key;
        __threadfence();  // the key is visible before the counter says so
        last = atomicAdd(&counters[t], 1u) == (unsigned int)(B - 1);
    }
    __syncthreads();
    if (!last) return;  // uniform per block
    __threadfence();
    key = 0;
    for (int b = threadIdx.x; b < B; b += blockDim.x) {
        key = hx_key_max(key, ((volatile unsigned long long*)partials)[(long long)t * B + b]);
    }
    key = hx_block_key_max(key, warp_keys);
    if (threadIdx.x == 0) {
        const unsigned int index = 0xffffffffu - (unsigned int)key;
        const int best = key == 0 || (int)index >= n ? 0 : (int)index;
        out[t] = best;
        counters[t] = 0;  // ready for the next launch (a CUDA graph replays this one)
        if (advance != nullptr && t == (int)gridDim.y - 1) {
            const int next = pos[t] + 1;  // read before advance[1] is written (they may alias)
            advance[0] = best;
            advance[1] = next;
            if (log != nullptr && next < n_log) {
                log[2 * next] = best;
                log[2 * next + 1] = (int)__float_as_uint(row[best]);
            }
        }
    }
}

// ---- the k largest values of one row (the tokens plain decoding shows beside each one) --------------
// Rule of hiraishin.decode.greedy.top_k_of (numpy's stable argsort of -x): larger values first, -0.0 as
// +0.0, a tie to the lower index, every NaN below every number (its order among NaNs: by index). As for
// hx_argmax_rows, one 64-bit key per candidate whose unsigned order is that rule, all distinct (the index
// is in them), so "the k largest keys" is one answer however the row is split: comparisons only.
__device__ __forceinline__ unsigned long long hx_topk_key(const float v, const int i) {
    unsigned int u = __float_as_uint(v);
    if (v != v) {
        u = 0u;  // every NaN: below -inf (0x007fffff once mapped)
    } else if (v == 0.0f) {
        u = 0x80000000u;  // -0.0 and +0.0 alike
    } else {
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned int)i);
}

// The largest key below `below` of the candidates load(j), j = first, first + step, ... < count, in the
// whole block (every thread gets it, through *bcast: not warp_keys, which a fast warp's next call may
// write while a slow one still reads). Every thread must call it (two __syncthreads).
template <class Load>
__device__ __forceinline__ unsigned long long hx_block_key_below(Load load, const int first, const int step,
                                                                 const int count, const unsigned long long below,
                                                                 unsigned long long* warp_keys,
                                                                 unsigned long long* bcast) {
    unsigned long long key = 0;
    for (int j = first; j < count; j += step) {
        const unsigned long long c = load(j);
        if (c < below) key = hx_key_max(key, c);
    }
    key = hx_block_key_max(key, warp_keys);  // thread 0 holds it
    if (threadIdx.x == 0) *bcast = key;
    __syncthreads();
    return *bcast;
}

// Grid (B): block b takes i = b * blockDim.x + tid, then + B * blockDim.x, ... of row x (n values) and
// finds its k largest keys in k rounds (round r: the largest below round r - 1's), into
// partials[b * k + r] (0: fewer than r + 1 values); the last block to finish (counter, reset to 0 by it
// for the next launch) takes the k largest of the B * k keys the same way and writes out[2 * r] = the
// index, out[2 * r + 1] = the value's bits (the token log's row format), index -1 past the row's end.
extern "C" __global__ void hx_topk_row(const float* __restrict__ x, const int n, const int k,
                                       unsigned long long* partials, unsigned int* counter, int* __restrict__ out) {
    HX_PDL_ENTRY();
    __shared__ unsigned long long warp_keys[32], bcast;
    __shared__ bool last;
    const int B = gridDim.x, b = blockIdx.x;
    unsigned long long below = ~0ull;
    for (int r = 0; r < k; ++r) {
        below = hx_block_key_below([&](const int i) { return hx_topk_key(x[i], i); }, b * blockDim.x + threadIdx.x,
                                   B * blockDim.x, n, below, warp_keys, &bcast);
        if (threadIdx.x == 0) partials[(long long)b * k + r] = below;
    }
    if (threadIdx.x == 0) {
        __threadfence();  // the keys are visible before the counter says so
        last = atomicAdd(counter, 1u) == (unsigned int)(B - 1);
    }
    __syncthreads();
    if (!last) return;  // uniform per block
    __threadfence();
    below = ~0ull;
    const volatile unsigned long long* keys = partials;
    for (int r = 0; r < k; ++r) {
        below = hx_block_key_below([&](const int j) { return keys[j]; }, threadIdx.x, blockDim.x, B * k, below,
                                   warp_keys, &bcast);
        if (threadIdx.x == 0) {
            const unsigned int index = 0xffffffffu - (unsigned int)below;
            const bool real = below != 0 && (int)index < n;
            out[2 * r] = real ? (int)index : -1;
            out[2 * r + 1] = real ? (int)__float_as_uint(x[index]) : 0;
        }
    }
    if (threadIdx.x == 0) *counter = 0;
}
