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

// Step 3 and the scale, after the tree's warps stored their partials (tree_warps of them, at most
// 32) and the block synchronized: IEEE division and square root (no rsqrtf: the CPU cannot reproduce
// its bits). Every lane of the calling warp must call it (a butterfly). Also fused/fused.cu's.
__device__ __forceinline__ float hx_rms_scale_from_partials(const float* warp_partial, const int tree_warps,
                                                            const int n, const float eps) {
    const int lane = threadIdx.x % 32;
    float total = lane < tree_warps ? warp_partial[lane] : 0.0f;
    total = hx_warp_sum(total);
    const float mean = __fdiv_rn(total, (float)n);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// The scale of a row xr of n floats by the tree above (also fused/fused.cu's).
// Every thread of the block must call it (one __syncthreads).
template <class Load>  // load(i): value i of the row (a read, or fused/fused.cu's a[i] + b[i])
__device__ __forceinline__ float hx_rms_scale_of(Load load, const int n, const float eps, float* warp_partial) {
    const int tid = threadIdx.x;
    const int nthreads = blockDim.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    float s = 0.0f;
    for (int i = tid; i < n; i += nthreads) {
        const float xi = load(i);
        s = __fmaf_rn(xi, xi, s);
    }
    s = hx_warp_sum(s);
    if (lane == 0) warp_partial[warp] = s;
    __syncthreads();
    return hx_rms_scale_from_partials(warp_partial, nthreads / 32, n, eps);
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
