// RMSNorm fused with the weight multiply (llama.cpp fuses RMS_NORM + MUL the same way, norm.cu):
//   y = (scale * x) * w,   scale = 1 / sqrt(sum(x^2) / n + eps)
//
// One block per row; blockDim.x threads (a multiple of 32, at most 1024) chosen by the launcher from
// the row length only, so the order of adds never depends on how many rows (tokens) a pass has.
// The sum of squares has ONE fixed tree:
//   1. thread t: s = fma(x[i], x[i], s) for i = t, t + nthreads, ... (ascending);
//   2. each warp: xor butterfly 16, 8, 4, 2, 1 (hx_warp_sum);
//   3. lane i of every warp loads warp i's partial (0 past the last warp) and butterflies again.
// The emulator in rmsnorm.py performs the same operations in the same order.
// Requires fp.cuh prepended (hx_warp_sum).

// The scale of a row of n floats by the tree above, for a tree of `tree_threads` threads (the
// launcher's block_threads(n)) played by a block of blockDim.x real threads (a multiple of 32 that
// divides tree_threads, at most HX_TREE_MAX_PER_THREAD times fewer): real thread (warp r, lane L)
// plays tree threads 32 * (r + j * nwarps) + L, j = 0, 1, ...; every tree warp's 32 lanes sit at
// the same lanes of one real warp, so its butterfly is that warp's butterfly, the same adds in the
// same order. (A smaller block than the tree fits beside a running kernel's blocks, so under PDL
// it starts early: hiraishin/kernels/fused/launch.py NORM_BLOCK_THREADS.) Also fused/fused.cu's.
// IEEE division and square root (no rsqrtf: the CPU cannot reproduce its bits).
// Every thread of the block must call it (one __syncthreads).
#define HX_TREE_MAX_PER_THREAD 8
template <class Load>  // load(i): value i of the row (a read, or fused/fused.cu's a[i] + b[i])
__device__ __forceinline__ float hx_rms_scale_tree(Load load, const int n, const float eps, float* warp_partial,
                                                   const int tree_threads) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int nwarps = blockDim.x / 32;
    const int per_thread = tree_threads / blockDim.x;
    float s[HX_TREE_MAX_PER_THREAD];
#pragma unroll
    for (int j = 0; j < HX_TREE_MAX_PER_THREAD; ++j) {  // step 1, each tree thread's strided sum
        s[j] = 0.0f;
        if (j < per_thread) {
            for (int i = 32 * (warp + j * nwarps) + lane; i < n; i += tree_threads) {
                const float xi = load(i);
                s[j] = __fmaf_rn(xi, xi, s[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < HX_TREE_MAX_PER_THREAD; ++j) {  // step 2, each tree warp's butterfly
        if (j < per_thread) {
            const float w = hx_warp_sum(s[j]);
            if (lane == 0) warp_partial[warp + j * nwarps] = w;
        }
    }
    __syncthreads();
    float total = lane < tree_threads / 32 ? warp_partial[lane] : 0.0f;  // step 3
    total = hx_warp_sum(total);
    const float mean = __fdiv_rn(total, (float)n);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// The tree played by as many threads as it has (the unfused kernel's launch).
template <class Load>
__device__ __forceinline__ float hx_rms_scale_of(Load load, const int n, const float eps, float* warp_partial) {
    return hx_rms_scale_tree(load, n, eps, warp_partial, blockDim.x);
}

__device__ __forceinline__ float hx_rms_scale(const float* xr, const int n, const float eps,
                                              float* warp_partial) {
    return hx_rms_scale_of([&](const int i) { return xr[i]; }, n, eps, warp_partial);
}

extern "C" __global__ void hx_rms_norm_f32(const float* __restrict__ x,
                                           const float* __restrict__ w,
                                           float* __restrict__ y,
                                           const int n,
                                           const float eps) {
    HX_PDL_ENTRY();
    __shared__ float warp_partial[32];
    const int row = blockIdx.x;
    const float* xr = x + (size_t)row * n;
    float* yr = y + (size_t)row * n;
    const float scale = hx_rms_scale(xr, n, eps, warp_partial);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        yr[i] = __fmul_rn(__fmul_rn(scale, xr[i]), w[i]);
    }
}
