// hiraishin: mmvq.cu's rows of up to three weights (mmvq_multi's mapping) for kernels whose CUDA blocks
// make their own activations in shared memory first (norm_mmvq.cu, swiglu_down.cu), over a grid that may
// hold fewer CUDA blocks than the rows need.
//
// Group g = threadIdx.z of CUDA block b computes row block b * groups + g (HX_RPB rows): the row blocks
// of weight 0, then weight 1's, then weight 2's. A grid of fewer CUDA blocks strides: block b also takes
// b + gridDim.x, ... So a kernel that makes its activations per CUDA block makes them once per resident
// block, not once per wave of blocks. Which CUDA block sums a row changes no bit of it (mmvq.cu).
// Compiled after mmvq.cu with HX_Y_SHARED (the activations are read from shared memory).

// hx_weights3 (fp.cuh): mmvq_multi's weight arguments; HX_STRIDE_AHEAD (fp.cuh): how far ahead rows go to L2.

// CUDA blocks whose rows a launch has (its grid when nothing strides).
__device__ __forceinline__ int hx_strided_blocks(const hx_weights3& ws, const int groups) {
    return (ws.nblk0 + ws.nblk1 + (ws.nrows2 + HX_RPB - 1) / HX_RPB + groups - 1) / groups;
}

// This group's row block of CUDA block b. Past the last row block the group recomputes the last row of
// the last weight and writes nothing (its row0 is past that weight's rows); every group still reaches the
// one block barrier of hx_mmvq_rows. A launch of one or two weights leaves slot 2 empty (0 rows): its
// past-the-end groups take the last weight that has rows, never row -1.
__device__ __forceinline__ hx_weight_of_block hx_strided_pick(const hx_weights3& ws, const int b, const int groups) {
    hx_weight_of_block p = hx_pick_weight(b * groups + threadIdx.z, ws.w0, ws.dst0, ws.nrows0, ws.nblk0, ws.w1,
                                          ws.dst1, ws.nrows1, ws.nblk1, ws.w2, ws.dst2, ws.nrows2);
    if (p.nrows == 0) {
        p = ws.nblk1 > 0 ? hx_weight_of_block{ws.w1, ws.dst1, ws.nrows1, ws.nblk1}
                         : hx_weight_of_block{ws.w0, ws.dst0, ws.nrows0, ws.nblk0};
    }
    return p;
}

// The rows of this CUDA block's strides first .. first + count - 1 into L2.
__device__ __forceinline__ void hx_strided_prefetch(const hx_weights3& ws, const int groups, const int first,
                                                    const int count) {
    const int nblocks = hx_strided_blocks(ws, groups);
#pragma unroll 1
    for (int s = first; s < first + count; ++s) {
        const int b = blockIdx.x + s * gridDim.x;
        if (b >= nblocks) break;
        const hx_weight_of_block p = hx_strided_pick(ws, b, groups);
        hx_prefetch_rows(p.w, p.nrows, HX_RPB * p.index);
    }
}

// The rows of every CUDA block this one takes, from the HX_NCOLS activation columns yq (shared memory, the
// mat-vec's layout). tmp_shared: groups * (HX_NWARPS-1)*HX_NCOLS*HX_RPB*32 floats (each group's hand-over).
// Every thread of the CUDA block calls it, after hx_strided_prefetch(ws, groups, 0, HX_STRIDE_AHEAD). key (or
// NULL): warp 0 of each group max-es its rows' argmax keys into *key (mmvq.cu hx_mmvq_rows).
__device__ __forceinline__ void hx_strided_rows(const hx_weights3& ws, const int groups, const u8* yq,
                                                float* tmp_shared, unsigned long long* key = nullptr) {
    const int nblocks = hx_strided_blocks(ws, groups);
    float* hand_over = tmp_shared + threadIdx.z * ((HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32);
#pragma unroll 1
    for (int s = 0, b = blockIdx.x; b < nblocks; ++s, b += gridDim.x) {
        hx_strided_prefetch(ws, groups, s + HX_STRIDE_AHEAD, 1);
        const hx_weight_of_block p = hx_strided_pick(ws, b, groups);
        hx_mmvq_rows(p.w, yq, p.out, p.nrows, p.nrows, HX_RPB * p.index, threadIdx.y, hand_over, key);
        if (b + gridDim.x < nblocks) {
            __syncthreads();  // warp 0 has read the hand-over before the next rows' warps write it
        }
    }
}
