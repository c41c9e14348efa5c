// hiraishin: fused kernels for what runs between the mat-vecs of a decode step. Each one performs
// exactly the float operations of the unfused kernels it replaces, in the same order, so its
// bits equal the unfused sequence's (checked in tests/test_fused.py and tests/test_fused_gpu.py):
//
//   hx_rms_norm_q8_1       rmsnorm/rmsnorm.cu (hx_rms_norm_f32), then quantize/quantize_q8_1.cu
//   hx_add_rms_norm_q8_1   elementwise/elementwise.cu (hx_add_f32), then the two above
//   hx_swiglu_q8_1         elementwise/elementwise.cu (hx_swiglu_f32), then quantize_q8_1.cu
//   hx_qk_norm_rope_kv     hx_rms_norm_f32 per head of q and of k, rope/rope.cu (hx_rope_neox_f32),
//                          and the f32 -> f16 cast (round to nearest even) of k and v into the
//                          KV-cache cells at the token positions (model/kv_cache.py layout)
//
// HX_LAYOUT selects the q8_1 layout written, as in quantize_q8_1.cu: 0 llama.cpp's blocks,
// 12 the Q4_K mat-vec's, 14 the Q6_K mat-vec's (hiraishin/kernels/quantize/layout.py).
// Requires fp.cuh prepended (hx_warp_sum, hx_warp_max, hx_expf, hx_f2h).
// Nothing per step is a scalar argument: token positions are read from device memory, so a
// CUDA graph replays these launches unchanged across steps.

// Compiled after rmsnorm/rmsnorm.cu and quantize/quantize_q8_1.cu (hiraishin/kernels/fused/launch.py
// SOURCES): their device functions hx_rms_scale(_of) and hx_q8_1_store are the very code the unfused
// kernels run, not a copy; HX_LAYOUT and HX_Q8_1_BYTES come with them.

// A second q8_1 layout the norm kernels may write beside HX_LAYOUT (yq2): when a Q6_K weight's
// mat-vec reads the same normed rows as Q4_K ones (Qwen3 Q4_K_M: attn_v beside attn_q/attn_k in
// half the layers), both layouts come from one launch instead of a norm and a quantize.
#ifndef HX_LAYOUT2
#define HX_LAYOUT2 -1
#define HX_LAYOUT2_BYTES 0
#endif

// Value i = 32 * ib + lane of the row, x: stored (s, or NULL: the add kernel's next residual, each
// value by the one block that quantizes it), normed, y = (scale * x) * w (rmsnorm.cu's last loop; y,
// or NULL), quantized as value `lane` of q8_1 block ib (yq; yq2, or NULL, in HX_LAYOUT2). Every lane
// of the warp must call it (hx_q8_1_store's butterflies).
__device__ __forceinline__ void hx_norm_value(const float x, const float wi, const float scale,
                                              unsigned char* __restrict__ yq, float* __restrict__ y,
                                              unsigned char* __restrict__ yq2, float* s, const int row,
                                              const int n, const int ib, const int lane) {
    const size_t at = (size_t)row * n + ib * 32 + lane;
    if (s) s[at] = x;
    const float v = __fmul_rn(__fmul_rn(scale, x), wi);
    if (y) y[at] = v;
    hx_q8_1_store(yq, row, n / 32, ib, lane, v);
    if constexpr (HX_LAYOUT2 >= 0) {
        if (yq2) hx_q8_1_store_as<(HX_LAYOUT2 < 0 ? 0 : HX_LAYOUT2), HX_LAYOUT2_BYTES>(yq2, row, n / 32, ib, lane, v);
    }
}

// HX_NORM_W_EARLY (launch.py ENV_NORM_W_EARLY): a thread reads the norm weights of the values it will
// store before it waits for the previous kernel (the weights are never written), so the read after
// the reduction is gone from the chain. The same values, the same bits.
#ifndef HX_NORM_W_EARLY
#define HX_NORM_W_EARLY 0
#endif

// The normed row quantized block by block: warp w of CUDA block g (of gridDim.x per row) takes
// q8_1 blocks g*nwarps + w, then + gridDim.x*nwarps, ... n % 32 == 0. load(i): value i of the row.
// w_first: w at the thread's first value, read by hx_norm_w_first (HX_NORM_W_EARLY).
template <class Load>
__device__ __forceinline__ void hx_norm_store(Load load, const float* __restrict__ w, const float scale,
                                              unsigned char* __restrict__ yq, float* __restrict__ y,
                                              unsigned char* __restrict__ yq2, float* s, const int row,
                                              const int n, const float w_first = 0.0f) {
    const int lane = threadIdx.x % 32;
    const int nwarps = blockDim.x / 32;
    bool first = true;
    for (int ib = blockIdx.x * nwarps + threadIdx.x / 32; ib < n / 32; ib += gridDim.x * nwarps) {  // uniform per warp
        const int i = ib * 32 + lane;
        const float wi = HX_NORM_W_EARLY && first ? w_first : w[i];
        first = false;
        hx_norm_value(load(i), wi, scale, yq, y, yq2, s, row, n, ib, lane);
    }
}
__device__ __forceinline__ float hx_norm_w_first(const float* __restrict__ w, const int n) {
    const int ib = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    return ib < n / 32 ? __ldg(w + ib * 32 + threadIdx.x % 32) : 0.0f;
}

// A block smaller than rmsnorm's tree plays it: each of its nthreads threads (tid) plays PER tree
// threads, 32 * (warp + j * nwarps) + lane for j < PER (every tree warp's 32 lanes at the same lanes
// of one real warp, so its butterfly is that warp's butterfly), and holds their VALS values each
// (tree thread t's m-th value is t + m * tree_threads), all loaded before the first add. Step 1 of
// rmsnorm's tree per tree thread in m order, step 2 per tree warp, step 3 as there: the same adds in
// the same order, so the same bits (PER = 1: the tree itself). Then store(x, w[i], scale, i, slot)
// for every value i < n, slot = j * VALS + m. Every thread of the block must call it (one
// __syncthreads); n % 32 == 0, so every condition below is uniform per warp.
template <int PER, int VALS, class Load, class Store>
__device__ __forceinline__ void hx_norm_play(Load load, const float* __restrict__ w, const float eps,
                                             float* warp_partial, const int tid, const int nthreads,
                                             const int n, Store store) {
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int nwarps = nthreads / 32;
    const int tree = PER * nthreads;
    float x[PER][VALS];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
#pragma unroll
        for (int m = 0; m < VALS; ++m) {
            const int i = 32 * (warp + j * nwarps) + lane + m * tree;
            x[j][m] = i < n ? load(i) : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        float sj = 0.0f;
#pragma unroll
        for (int m = 0; m < VALS; ++m) {
            if (32 * (warp + j * nwarps) + lane + m * tree < n) sj = __fmaf_rn(x[j][m], x[j][m], sj);
        }
        sj = hx_warp_sum(sj);
        if (lane == 0) warp_partial[warp + j * nwarps] = sj;
    }
    __syncthreads();
    const float scale = hx_rms_scale_from_partials(warp_partial, tree / 32, n, eps);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
#pragma unroll
        for (int m = 0; m < VALS; ++m) {
            const int i = 32 * (warp + j * nwarps) + lane + m * tree;
            if (i < n) store(x[j][m], w[i], scale, i, j * VALS + m);  // uniform per warp
        }
    }
}

// The normed rows of a mat-vec that makes its own activations (norm_mmvq.cu, norm_mixed.cu): for each of ncols
// columns, rmsnorm of x (+ r, one __fadd_rn) played by this CUDA block's nthreads threads (thread tid), each
// value's q8_1 stored into yq (and yq2, or NULL, in HX_LAYOUT2): shared memory; s_out (or NULL) gets x + r.
// The operations of hx_add_rms_norm_q8_1 / hx_rms_norm_q8_1 in their order. Every thread calls it.
template <int PER, int VALS>
__device__ __forceinline__ void hx_norm_columns(const float* __restrict__ x, const float* __restrict__ r,
                                                const float* __restrict__ nw, const float eps, float* s_out,
                                                const int n, const int ncols, unsigned char* yq, unsigned char* yq2,
                                                float* warp_partial, const int tid, const int nthreads) {
    const int lane = tid % 32;
#pragma unroll 1
    for (int j = 0; j < ncols; ++j) {
        const size_t base = (size_t)j * n;
        const auto load = [&](const int i) { return r ? __fadd_rn(x[base + i], r[base + i]) : x[base + i]; };
        hx_norm_play<PER, VALS>(load, nw, eps, warp_partial, tid, nthreads, n,
                                [&](const float v, const float wi, const float scale, const int i, const int) {
                                    hx_norm_value(v, wi, scale, yq, nullptr, yq2, s_out, j, n, i / 32, lane);
                                });
        __syncthreads();  // column j is complete; warp_partial is free for the next column
    }
}

// The norm kernels' played tree (launch.py NORM_BLOCK_THREADS; HX_NORM_PER and HX_NORM_VALS defined):
// the block's threads play the tree, and slot (j, m) of every thread is stored by CUDA block
// (j * HX_NORM_VALS + m) % gridDim.x of the row (each value once; the q8_1 block of a slot is
// warp + j * nwarps + m * tree_threads / 32).
#ifdef HX_NORM_PER
// The norm weights at the values of the slots this CUDA block stores (HX_NORM_W_EARLY: read before the wait).
struct hx_norm_wslots {
    float v[HX_NORM_PER * HX_NORM_VALS];
};
__device__ __forceinline__ hx_norm_wslots hx_norm_w_slots(const float* __restrict__ w, const int n) {
    hx_norm_wslots out;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    const int tree = HX_NORM_PER * blockDim.x;
#pragma unroll
    for (int j = 0; j < HX_NORM_PER; ++j) {
#pragma unroll
        for (int m = 0; m < HX_NORM_VALS; ++m) {
            const int i = 32 * (warp + j * nwarps) + lane + m * tree;
            const int slot = j * HX_NORM_VALS + m;
            out.v[slot] = slot % (int)gridDim.x == (int)blockIdx.x && i < n ? __ldg(w + i) : 0.0f;
        }
    }
    return out;
}
template <class Load>
__device__ __forceinline__ void hx_norm_played(Load load, const float* __restrict__ w, const float eps,
                                               float* warp_partial, unsigned char* __restrict__ yq,
                                               float* __restrict__ y, unsigned char* __restrict__ yq2, float* s,
                                               const int row, const int n, const hx_norm_wslots& ws) {
    const int lane = threadIdx.x % 32;
    hx_norm_play<HX_NORM_PER, HX_NORM_VALS>(
        load, w, eps, warp_partial, threadIdx.x, blockDim.x, n,
        [&](const float x, const float wi, const float scale, const int i, const int slot) {
            if (slot % (int)gridDim.x == (int)blockIdx.x) {
                hx_norm_value(x, HX_NORM_W_EARLY ? ws.v[slot] : wi, scale, yq, y, yq2, s, row, n, i / 32, lane);
            }
        });
}
#endif

// What a norm kernel reads of its weights before the wait (HX_NORM_W_EARLY; nothing otherwise).
#ifdef HX_NORM_PER
#define HX_NORM_W_PRE(w, n) const hx_norm_wslots hx_wpre = HX_NORM_W_EARLY ? hx_norm_w_slots(w, n) : hx_norm_wslots{}
#define HX_NORM_W_ARG hx_wpre
#else
#define HX_NORM_W_PRE(w, n) const float hx_wpre = HX_NORM_W_EARLY ? hx_norm_w_first(w, n) : 0.0f
#define HX_NORM_W_ARG hx_wpre
#endif

// rms_norm then quantize_q8_1. Grid (slices, rows), block (launch.py norm_geometry: rmsnorm's
// block_threads(n), or fewer threads playing that tree under HX_NORM_PER): every CUDA
// block of a row computes the row's scale by rmsnorm's one tree (the same bits in each), then
// quantizes its slice of the q8_1 blocks (launch.py norm_slices: one q8_1 block per warp, so a
// long row is not quantized by one CUDA block alone).
// yq: q8_1 bytes of the normed rows in HX_LAYOUT; y: the float32 normed rows, or NULL; yq2: the
// q8_1 bytes in HX_LAYOUT2, or NULL.
extern "C" __global__ void hx_rms_norm_q8_1(const float* __restrict__ x, const float* __restrict__ w,
                                            unsigned char* __restrict__ yq, float* __restrict__ y,
                                            unsigned char* __restrict__ yq2, const int n, const float eps) {
    hx_prefetch_lines(w, 4LL * n, threadIdx.x, blockDim.x);  // the norm weight (read after the reduction) into L2
    HX_NORM_W_PRE(w, n);
    HX_PDL_ENTRY();
    __shared__ float warp_partial[32];
    const int row = blockIdx.y;
    const float* xr = x + (size_t)row * n;
    const auto load = [&](const int i) { return xr[i]; };
#ifdef HX_NORM_PER
    hx_norm_played(load, w, eps, warp_partial, yq, y, yq2, nullptr, row, n, HX_NORM_W_ARG);
    return;
#else
    const float scale = hx_rms_scale_of(load, n, eps, warp_partial);
    hx_norm_store(load, w, scale, yq, y, yq2, nullptr, row, n, HX_NORM_W_ARG);
#endif
}

// s = a + b (the next residual, written to s), then rms_norm of s, then quantize_q8_1.
// Grid (slices, rows) and block as hx_rms_norm_q8_1: every CUDA block of a row
// forms each a + b itself (one __fadd_rn, the same value in each), so no block reads another's
// writes; each value of s is written once, by the block that quantizes it. s must not overlap a or b.
extern "C" __global__ void hx_add_rms_norm_q8_1(const float* __restrict__ a, const float* __restrict__ b,
                                                const float* __restrict__ w, float* s,
                                                unsigned char* __restrict__ yq, float* __restrict__ y,
                                                unsigned char* __restrict__ yq2, const int n, const float eps) {
    hx_prefetch_lines(w, 4LL * n, threadIdx.x, blockDim.x);  // the norm weight (read after the reduction) into L2
    HX_NORM_W_PRE(w, n);
    HX_PDL_ENTRY();
    __shared__ float warp_partial[32];
    const int row = blockIdx.y;
    const size_t base = (size_t)row * n;
    const auto load = [&](const int i) { return __fadd_rn(a[base + i], b[base + i]); };
#ifdef HX_NORM_PER
    hx_norm_played(load, w, eps, warp_partial, yq, y, yq2, s, row, n, HX_NORM_W_ARG);
    return;
#else
    const float scale = hx_rms_scale_of(load, n, eps, warp_partial);
    hx_norm_store(load, w, scale, yq, y, yq2, s, row, n, HX_NORM_W_ARG);
#endif
}

// m = silu(g) * u (elementwise.cu's hx_swiglu_f32), then quantize_q8_1.
// Grid (ceil(k/32 / warps per block), rows), block (32 * warps per block): one warp per q8_1 block,
// as quantize_q8_1's launch. m: the float32 product, or NULL.
extern "C" __global__ void hx_swiglu_q8_1(const float* __restrict__ g, const float* __restrict__ u,
                                          unsigned char* __restrict__ yq, float* __restrict__ m,
                                          const int k) {
    HX_PDL_ENTRY();
    const int nb = k / 32;
    const int col = blockIdx.y;
    const int ib = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (ib >= nb) {
        return;  // uniform per warp
    }
    const int lane = threadIdx.x % 32;
    const size_t i = (size_t)col * k + ib * 32 + lane;
    const float v = hx_swiglu(g[i], u[i]);
    if (m) m[i] = v;
    hx_q8_1_store(yq, col, nb, ib, lane, v);
}

// Per head: RMSNorm of q (T, n_head, D) with wq and of k (T, n_head_kv, D) with wk (rmsnorm.cu's
// tree over D), NEOX RoPE at pos[t] (rope.cu's ops), q written to q_out (float32, (T, n_head, D)),
// k rounded to f16 into k_cache[pos[t]] (and as float32 into k_out unless NULL), v rounded to f16
// into v_cache[pos[t]]. Caches: one layer's (n_ctx, n_head_kv, D) f16 cells.
// Grid (T * (n_head + 2 * n_head_kv)): per token its q heads, its k heads, its v heads;
// block (block_threads(D)) threads, the rmsnorm launch of a row of D.
extern "C" __global__ void hx_qk_norm_rope_kv(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v,
                                              const float* __restrict__ wq, const float* __restrict__ wk,
                                              const int* __restrict__ pos,
                                              const float* __restrict__ cos_table,
                                              const float* __restrict__ sin_table,
                                              float* __restrict__ q_out, float* __restrict__ k_out,
                                              unsigned short* __restrict__ k_cache,
                                              unsigned short* __restrict__ v_cache,
                                              const int n_head, const int n_head_kv, const int head_dim,
                                              const float eps) {
    HX_PDL_ENTRY();
    __shared__ float warp_partial[32];
    const int per_token = n_head + 2 * n_head_kv;
    const int token = blockIdx.x / per_token;
    const int r = blockIdx.x % per_token;
    const size_t cell = (size_t)pos[token];
    const int tid = threadIdx.x;
    const int nthreads = blockDim.x;
    if (r >= n_head + n_head_kv) {  // a v head: the cast only (the whole block leaves together)
        const int h = r - n_head - n_head_kv;
        const float* vr = v + ((size_t)token * n_head_kv + h) * head_dim;
        unsigned short* vc = v_cache + (cell * n_head_kv + h) * head_dim;
        for (int d = tid; d < head_dim; d += nthreads) vc[d] = hx_f2h(vr[d]);
        return;
    }
    const bool is_q = r < n_head;
    const int h = is_q ? r : r - n_head;
    const size_t row = is_q ? (size_t)token * n_head + h : (size_t)token * n_head_kv + h;
    const float* xr = (is_q ? q : k) + row * head_dim;
    const float* w = is_q ? wq : wk;
    const float scale = hx_rms_scale(xr, head_dim, eps, warp_partial);

    const int half = head_dim / 2;
    const float* cr = cos_table + cell * half;
    const float* sr = sin_table + cell * half;
    for (int d = tid; d < half; d += nthreads) {
        const float x0 = __fmul_rn(__fmul_rn(scale, xr[d]), w[d]);
        const float x1 = __fmul_rn(__fmul_rn(scale, xr[d + half]), w[d + half]);
        const float c = cr[d];
        const float sn = sr[d];
        float y0, y1;
        hx_rope_pair(x0, x1, c, sn, y0, y1);
        if (is_q) {
            float* qr = q_out + row * head_dim;
            qr[d] = y0;
            qr[d + half] = y1;
        } else {
            unsigned short* kc = k_cache + (cell * n_head_kv + h) * head_dim;
            kc[d] = hx_f2h(y0);
            kc[d + half] = hx_f2h(y1);
            if (k_out) {
                k_out[row * head_dim + d] = y0;
                k_out[row * head_dim + d + half] = y1;
            }
        }
    }
}
