// Multi-query flash attention with its own work split: the stand-in for llama.cpp's tile/MMA kernels
// (ggml/src/ggml-cuda/fattn-tile.cuh, fattn-mma-f16.cuh), which stock llama.cpp launches for batches
// of more than one query on Ada/Hopper. Same inputs as fattn_vec.cu, different reduction order:
//   * block (128 threads) = a tile of FT_TILE_Q queries of one head; grid (ceil(n_tokens/FT_TILE_Q),
//     P, n_head);
//   * block y walks ONE contiguous cell range [y*split_cells, min((y+1)*split_cells, kv_attended)) in
//     tiles of FT_TILE_KV cells (K and V tiles staged in shared memory);
//   * K.Q of a (query, cell): one thread, D sequential fmas over dims 0..D-1;
//   * softmax per query and tile: one max over the 64 cells (no offset), exp of differences below
//     SOFTMAX_FTZ_THRESHOLD flushed to 0 (as the MMA kernel does), tile sum = butterfly of
//     p[lane] + p[lane+32], running sum S = fma(S, scale, tile_sum);
//   * V: thread owns (query, dim) outputs and adds the 64 cells of a tile in order.
// P == 1: dst = o / S.  P > 1: parts = o, meta = (max, S), merged by fattn_combine (fattn_vec.cu).
// Every rounding-relevant op is an explicit intrinsic; the emulator in emulate_tile.py mirrors them.
// Needs fp.cuh prepended and HX_D (64 or 128) defined.

#ifndef HX_D
#error "define HX_D (head dimension, 64 or 128)"
#endif
static_assert(HX_D == 64 || HX_D == 128, "fattn_tile supports head dimensions 64 and 128");

// FT_NTHREADS (128), FT_TILE_Q (queries per block, 8) and FT_TILE_KV (cells per shared-memory
// tile, 64) come from hiraishin/plans/attention.py (NTHREADS, TILE_QUERIES, TILE_CELLS).
#if !defined(FT_NTHREADS) || !defined(FT_TILE_Q) || !defined(FT_TILE_KV)
#error "fattn_tile.cu needs FT_NTHREADS, FT_TILE_Q and FT_TILE_KV from the launcher"
#endif
// llama.cpp SOFTMAX_FTZ_THRESHOLD (fattn-common.cuh): exp of differences below it are flushed to 0
#define FT_FTZ_THRESHOLD (-20.0f)
#define FT_NEG_HALF_FLT_MAX __int_as_float(0xfeffffff)
#define FT_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ft_exp_ftz(const float x) {
    return x >= FT_FTZ_THRESHOLD ? hx_expf(x) : 0.0f;
}

extern "C" __global__ void __launch_bounds__(FT_NTHREADS, 1)
fattn_tile(const float* __restrict__ Q,            // (n_tokens, n_head, D) float32
           const unsigned short* __restrict__ K,   // (n_ctx, n_head_kv, D) f16 bits
           const unsigned short* __restrict__ V,   // (n_ctx, n_head_kv, D) f16 bits
           const int* __restrict__ q_pos,          // (n_tokens,)
           float* __restrict__ dst, float* __restrict__ parts, float* __restrict__ meta,
           const int n_tokens, const int n_head, const int n_head_kv, const int kv_len_arg,
           const int kv_attended, const int split_cells, const float scale) {
    HX_PDL_ENTRY();
    constexpr int D = HX_D;
    // kv_len_arg < 0: the last query's position + 1 (as in fattn_vec.cu)
    const int kv_len = kv_len_arg >= 0 ? kv_len_arg : q_pos[n_tokens - 1] + 1;
    constexpr int K_STRIDE = D / 2 + 1;  // words per K row in shared (padded: conflict-free dots)
    constexpr int OUTS = FT_TILE_Q * D / FT_NTHREADS;  // (query, dim) outputs per thread
    constexpr int QPW = FT_TILE_Q / 4;                 // queries whose softmax each warp runs

    __shared__ float Qs[FT_TILE_Q][D];
    __shared__ unsigned int Ks[FT_TILE_KV * K_STRIDE];  // half2 words
    __shared__ __align__(16) unsigned short Vs[FT_TILE_KV][D];
    __shared__ float Ps[FT_TILE_Q][FT_TILE_KV];
    __shared__ float scale_sh[FT_TILE_Q];
    __shared__ float M_sh[FT_TILE_Q];
    __shared__ float S_sh[FT_TILE_Q];
    __shared__ int pos_sh[FT_TILE_Q];

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int w = tid / 32;
    const int P = gridDim.y;
    const int y = blockIdx.y;
    const int head = blockIdx.z;
    const int t0 = blockIdx.x * FT_TILE_Q;
    const int kv_head = head / (n_head / n_head_kv);
    const size_t cell_stride = (size_t)n_head_kv * D;
    const unsigned short* Kh = K + (size_t)kv_head * D;
    const unsigned short* Vh = V + (size_t)kv_head * D;

    for (int i = tid; i < FT_TILE_Q * D; i += FT_NTHREADS) {
        const int j = i / D;
        const int d = i % D;
        const int t = t0 + j;
        Qs[j][d] = t < n_tokens ? __fmul_rn(Q[((size_t)t * n_head + head) * D + d], scale) : 0.0f;
    }
    if (tid < FT_TILE_Q) pos_sh[tid] = t0 + tid < n_tokens ? q_pos[t0 + tid] : -1;

    // running max and sum of the queries this warp's softmax handles (same value in every lane)
    float M[QPW], S[QPW];
#pragma unroll
    for (int jj = 0; jj < QPW; ++jj) {
        M[jj] = FT_NEG_HALF_FLT_MAX;
        S[jj] = 0.0f;
    }
    float O[OUTS];
#pragma unroll
    for (int i = 0; i < OUTS; ++i) O[i] = 0.0f;

    const int begin = y * split_cells;
    const int end = min(begin + split_cells, kv_attended);
    for (int base = begin; base < end; base += FT_TILE_KV) {
        __syncthreads();  // previous tile fully consumed (and Qs/pos_sh written on the first pass)
        for (int i = tid; i < FT_TILE_KV * (D / 2); i += FT_NTHREADS) {
            const int c = i / (D / 2);
            const int k = i % (D / 2);
            const int n = base + c;
            Ks[c * K_STRIDE + k] =
                n < kv_len ? reinterpret_cast<const unsigned int*>(Kh + (size_t)n * cell_stride)[k] : 0u;
        }
        for (int i = tid; i < FT_TILE_KV * (D / 8); i += FT_NTHREADS) {
            const int c = i / (D / 8);
            const int k = i % (D / 8);
            const int n = base + c;
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
            reinterpret_cast<uint4*>(&Vs[c][0])[k] =
                n < kv_len ? reinterpret_cast<const uint4*>(Vh + (size_t)n * cell_stride)[k] : zero;
        }
        __syncthreads();

        // scores: (query j, cell c) for idx = tid + 128*i
#pragma unroll
        for (int i = 0; i < FT_TILE_Q * FT_TILE_KV / FT_NTHREADS; ++i) {
            const int idx = tid + FT_NTHREADS * i;
            const int j = idx / FT_TILE_KV;
            const int c = idx % FT_TILE_KV;
            const int n = base + c;
            float acc = 0.0f;
#pragma unroll 16
            for (int k = 0; k < D / 2; ++k) {
                const unsigned int word = Ks[c * K_STRIDE + k];
                acc = __fmaf_rn(hx_h2f((unsigned short)(word & 0xffffu)), Qs[j][2 * k + 0], acc);
                acc = __fmaf_rn(hx_h2f((unsigned short)(word >> 16)), Qs[j][2 * k + 1], acc);
            }
            Ps[j][c] = (n < kv_len && n <= pos_sh[j]) ? acc : FT_NEG_INF;
        }
        __syncthreads();

        // online softmax: warp w handles queries QPW*w .. QPW*w + QPW-1
#pragma unroll
        for (int jj = 0; jj < QPW; ++jj) {
            const int j = QPW * w + jj;
            const float s0 = Ps[j][lane];
            const float s1 = Ps[j][lane + 32];
            const float m = hx_warp_max(fmaxf(s0, s1));
            const float Mn = fmaxf(M[jj], m);
            const float a = ft_exp_ftz(__fsub_rn(M[jj], Mn));
            const float p0 = ft_exp_ftz(__fsub_rn(s0, Mn));
            const float p1 = ft_exp_ftz(__fsub_rn(s1, Mn));
            Ps[j][lane] = p0;
            Ps[j][lane + 32] = p1;
            const float tile_sum = hx_warp_sum(__fadd_rn(p0, p1));
            S[jj] = __fmaf_rn(S[jj], a, tile_sum);
            M[jj] = Mn;
            if (lane == 0) scale_sh[j] = a;
        }
        __syncthreads();

        // V: output i of this thread is (query j, dim d) with j*D + d = tid + 128*i
#pragma unroll
        for (int i = 0; i < OUTS; ++i) {
            const int j = (tid + FT_NTHREADS * i) / D;
            O[i] = __fmul_rn(O[i], scale_sh[j]);
        }
        for (int c = 0; c < FT_TILE_KV; ++c) {
#pragma unroll
            for (int i = 0; i < OUTS; ++i) {
                const int idx = tid + FT_NTHREADS * i;
                const int j = idx / D;
                const int d = idx % D;
                O[i] = __fmaf_rn(hx_h2f(Vs[c][d]), Ps[j][c], O[i]);
            }
        }
    }

    if (lane == 0) {
#pragma unroll
        for (int jj = 0; jj < QPW; ++jj) {
            M_sh[QPW * w + jj] = M[jj];
            S_sh[QPW * w + jj] = S[jj];
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < OUTS; ++i) {
        const int idx = tid + FT_NTHREADS * i;
        const int j = idx / D;
        const int d = idx % D;
        const int t = t0 + j;
        if (t >= n_tokens) continue;
        const size_t row = (size_t)t * n_head + head;
        if (P == 1) {
            dst[row * D + d] = __fdiv_rn(O[i], S_sh[j]);
        } else {
            parts[(row * P + y) * D + d] = O[i];
            if (d == 0) {
                meta[2 * (row * P + y) + 0] = M_sh[j];
                meta[2 * (row * P + y) + 1] = S_sh[j];
            }
        }
    }
}
