// hiraishin: mmvq_mixed, the mat-vecs of weights of two types that read one input, in one launch.
//
// Qwen3 Q4_K_M stores attn_v (and ffn_down) as Q6_K in some layers and attn_q / attn_k as Q4_K:
// mmvq_multi takes weights of one type, so in those layers V was a launch of its own, one more
// dependent step in the pass's chain. Here CUDA blocks 0..nblk0-1 are weight 0's, the next nblk1
// weight 1's, the rest weight 2's; weights in slots below HX_B_FIRST are of type A and read the
// activations ya (type A's q8_1 layout), the others of type B with yb. Each type's rows are
// mmvq.cu's own code compiled with that type's defines (launch.py MIXED_SOURCES: type_a.cuh,
// mmvq.cu, type_end.cuh, then the same for B, then this file), so every row is summed exactly as
// by mmvq with that geometry: the same bits as separate launches (tests/test_mmvq_shim.py).
// Common defines: HX_NCOLS, HX_NWARPS (both types' blocks are (32, HX_NWARPS)), HX_MIN_BLOCKS,
// HX_B_FIRST (1 or 2). Dynamic shared memory: the larger of the two types' hand-over.

typedef unsigned char u8;

// Weight slot S's rows: one branch per slot (as mmvq_multi: a shared pick of the weight costs the
// one-column Q6_K form spills under its register cap).
template <int S>
__device__ __forceinline__ void hx_mixed_slot(const u8* __restrict__ ya, const u8* __restrict__ yb,
                                              const u8* __restrict__ w, float* __restrict__ dst,
                                              const int nrows, const int index, float* tmp_shared) {
    if (S < HX_B_FIRST) {
        hx_ta::hx_mmvq_rows<(HX_W_EARLY > 0)>(w, ya, dst, nrows, nrows, HX_A_RPB * index, threadIdx.y, tmp_shared);
    } else {
        hx_tb::hx_mmvq_rows<(HX_W_EARLY > 0)>(w, yb, dst, nrows, nrows, HX_B_RPB * index, threadIdx.y, tmp_shared);
    }
}

template <int S>
__device__ __forceinline__ void hx_mixed_prefetch(const u8* __restrict__ w, const int nrows, const int index) {
    if (S < HX_B_FIRST) {
        hx_ta::hx_prefetch_rows(w, nrows, HX_A_RPB * index);
    } else {
        hx_tb::hx_prefetch_rows(w, nrows, HX_B_RPB * index);
    }
}

extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
mmvq_mixed(const u8* __restrict__ ya, const u8* __restrict__ yb,
           const u8* __restrict__ w0, float* __restrict__ dst0, const int nrows0, const int nblk0,
           const u8* __restrict__ w1, float* __restrict__ dst1, const int nrows1, const int nblk1,
           const u8* __restrict__ w2, float* __restrict__ dst2, const int nrows2) {
    const int b = blockIdx.x;
    // weights are never written: their rows go to L2 before the wait (mmvq.cu's kernels do the same)
    if (b < nblk0) {
        hx_mixed_prefetch<0>(w0, nrows0, b);
    } else if (b < nblk0 + nblk1) {
        hx_mixed_prefetch<1>(w1, nrows1, b - nblk0);
    } else {
        hx_mixed_prefetch<2>(w2, nrows2, b - nblk0 - nblk1);
    }
#if !HX_W_EARLY
    HX_PDL_ENTRY();  // else in the row code, once the first weights are loaded (mmvq.cu)
#endif
    extern __shared__ float tmp_shared[];
    if (b < nblk0) {
        hx_mixed_slot<0>(ya, yb, w0, dst0, nrows0, b, tmp_shared);
    } else if (b < nblk0 + nblk1) {
        hx_mixed_slot<1>(ya, yb, w1, dst1, nrows1, b - nblk0, tmp_shared);
    } else {
        hx_mixed_slot<2>(ya, yb, w2, dst2, nrows2, b - nblk0 - nblk1, tmp_shared);
    }
}
