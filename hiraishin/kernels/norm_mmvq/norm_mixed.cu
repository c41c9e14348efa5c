// hiraishin: hx_norm_mmvq for weights of two types that read one normed row (Qwen3 Q4_K_M's Q4_K attn_q
// and attn_k beside a Q6_K attn_v in half of its layers): every CUDA block makes the norm once, in both
// types' q8_1 layouts (fused.cu hx_norm_value's second layout), then strides over its rows, each type's
// rows by mmvq.cu's own code for that type (compiled twice in namespaces, as mmvq/mixed.cu does).
//
// Weight slots below HX_B_FIRST are of type A (rows HX_A_RPB a row block, activations ya in HX_LAYOUT), the
// others of type B (HX_B_RPB, yb in HX_LAYOUT2). Type A's row blocks fill the first ceil(A's / HX_NORM_GROUPS)
// CUDA blocks and type B's start at a CUDA block of their own, so the groups of one CUDA block always run
// one type's row code (its block barrier is the same instruction for all of them). The bits: those of the
// norm launch (writing both layouts) followed by mmvq_mixed (tests/test_norm_mmvq.py on the CPU,
// tests/test_norm_mmvq_gpu.py on a GPU).
//
// Compiled after rmsnorm.cu, quantize_q8_1.cu, fused.cu and mmvq/type_a.cuh, mmvq.cu, type_end.cuh, type_b.cuh,
// mmvq.cu, type_end.cuh (launch.py MIXED_SOURCE) with mmvq_mixed's defines (HX_A_*, HX_B_*, HX_NCOLS,
// HX_NWARPS, HX_MIN_BLOCKS, HX_B_FIRST), HX_Y_SHARED, the two layouts (HX_LAYOUT, HX_LAYOUT2 and their bytes)
// and norm_mmvq.cu's HX_NORM_GROUPS, HX_NORM_PLAY, HX_NORM_VALS.
// Dynamic shared memory: HX_NORM_GROUPS * HX_MIXED_HAND_OVER floats. Grid: the CUDA blocks of both types, or
// fewer (each then strides over them).
#if !defined(HX_B_FIRST) || !defined(HX_NORM_GROUPS) || !defined(HX_Y_SHARED) || HX_LAYOUT2 < 0
#error "norm_mixed.cu needs mmvq_mixed's defines, HX_NORM_GROUPS, HX_Y_SHARED and HX_LAYOUT2 (launch.py)"
#endif
#define HX_NORM_THREADS (32 * HX_NWARPS * HX_NORM_GROUPS)
typedef unsigned char u8;  // (mmvq.cu's is inside its namespaces here)
#define HX_MIXED_RPB_MAX (HX_A_RPB > HX_B_RPB ? HX_A_RPB : HX_B_RPB)
#define HX_MIXED_HAND_OVER ((HX_NWARPS - 1) * HX_NCOLS * HX_MIXED_RPB_MAX * 32)

struct hx_mixed_rows {  // one group's row block: its weight, output, rows, index among the weight's row blocks
    const unsigned char* w;
    float* out;
    int nrows;
    int index;
    bool a;  // of type A
};

// CUDA block b's rows for group threadIdx.z, type A's row blocks (slots 0 .. HX_B_FIRST-1) in the first
// na_blocks CUDA blocks, type B's (the other slots) after them. Past a type's last row block the group takes
// that type's last weight at an index past its rows (the last row recomputed, nothing written); slot 2 with
// no rows (a launch of two weights) is nobody's. Branches on compile-time slots only (no array in local memory).
__device__ __forceinline__ hx_mixed_rows hx_mixed_pick(const hx_weights3& ws, const int b, const int na_blocks) {
    const bool a = b < na_blocks;
    const int g = (a ? b : b - na_blocks) * HX_NORM_GROUPS + threadIdx.z;  // among the type's row blocks
    if (a) {
        if (HX_B_FIRST == 1 || g < ws.nblk0) return {ws.w0, ws.dst0, ws.nrows0, g, true};
        return {ws.w1, ws.dst1, ws.nrows1, g - ws.nblk0, true};
    }
    if (HX_B_FIRST == 2) return {ws.w2, ws.dst2, ws.nrows2, g, false};
    if (g < ws.nblk1 || ws.nrows2 == 0) return {ws.w1, ws.dst1, ws.nrows1, g, false};
    return {ws.w2, ws.dst2, ws.nrows2, g - ws.nblk1, false};
}

__device__ __forceinline__ void hx_mixed_prefetch(const hx_mixed_rows& p) {
    if (p.a) {
        hx_ta::hx_prefetch_rows(p.w, p.nrows, HX_A_RPB * p.index);
    } else {
        hx_tb::hx_prefetch_rows(p.w, p.nrows, HX_B_RPB * p.index);
    }
}

extern "C" __global__ void __launch_bounds__(HX_NORM_THREADS, HX_MIN_BLOCKS)
hx_norm_mmvq_mixed(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ nw, float* s,
                   const int n, const float eps,
                   const u8* __restrict__ w0, float* __restrict__ dst0, const int nrows0, const int nblk0,
                   const u8* __restrict__ w1, float* __restrict__ dst1, const int nrows1, const int nblk1,
                   const u8* __restrict__ w2, float* __restrict__ dst2, const int nrows2) {
    const hx_weights3 ws = {w0, dst0, nrows0, nblk0, w1, dst1, nrows1, nblk1, w2, dst2, nrows2};
    const int n2 = (nrows2 + HX_B_RPB - 1) / HX_B_RPB;  // slot 2 is always type B (HX_B_FIRST is 1 or 2)
    const int na = HX_B_FIRST == 1 ? nblk0 : nblk0 + nblk1;  // row blocks of type A, of type B
    const int nb = (HX_B_FIRST == 1 ? nblk1 : 0) + n2;
    const int na_blocks = (na + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS;
    const int nblocks = na_blocks + (nb + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS;
    const int tid = threadIdx.x + 32 * (threadIdx.y + HX_NWARPS * threadIdx.z);
#pragma unroll 1
    for (int b = blockIdx.x, k = 0; b < nblocks && k < HX_STRIDE_AHEAD; b += gridDim.x, ++k) {
        hx_mixed_prefetch(hx_mixed_pick(ws, b, na_blocks));  // the first rows into L2 before the wait
    }
    hx_prefetch_lines(nw, 4LL * n, tid, HX_NORM_THREADS);
    HX_PDL_ENTRY();

    __shared__ __align__(16) u8 ya[HX_NCOLS * HX_A_NBLOCKS * HX_A_Y_STEP];
    __shared__ __align__(16) u8 yb[HX_NCOLS * HX_B_NBLOCKS * HX_B_Y_STEP];
    __shared__ float warp_partial[32];
    hx_norm_columns<HX_NORM_PLAY, HX_NORM_VALS>(x, r, nw, eps, blockIdx.x == 0 ? s : nullptr, n, HX_NCOLS, ya, yb,
                                                warp_partial, tid, HX_NORM_THREADS);  // both layouts
    extern __shared__ float tmp_shared[];
    float* hand_over = tmp_shared + threadIdx.z * HX_MIXED_HAND_OVER;
#pragma unroll 1
    for (int b = blockIdx.x; b < nblocks; b += gridDim.x) {
        const int ahead = b + HX_STRIDE_AHEAD * gridDim.x;
        if (ahead < nblocks) hx_mixed_prefetch(hx_mixed_pick(ws, ahead, na_blocks));
        const hx_mixed_rows p = hx_mixed_pick(ws, b, na_blocks);
        if (p.a) {  // uniform per CUDA block
            hx_ta::hx_mmvq_rows(p.w, ya, p.out, p.nrows, p.nrows, HX_A_RPB * p.index, threadIdx.y, hand_over);
        } else {
            hx_tb::hx_mmvq_rows(p.w, yb, p.out, p.nrows, p.nrows, HX_B_RPB * p.index, threadIdx.y, hand_over);
        }
        if (b + gridDim.x < nblocks) {
            __syncthreads();  // warp 0 has read the hand-over before the next rows' warps write it
        }
    }
}
