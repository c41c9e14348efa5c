// hiraishin: a mat-vec whose CUDA blocks make their own activations: RMSNorm of x (or of a + b, the
// residual add) and its q8_1 quantization, into shared memory, then mmvq.cu's rows.
//
// A one-token pass is a chain of small launches, and a norm launch costs its place in the chain
// (about 2.5 us a launch on an H200 beside ~1 us of work; bench/results/2026-12-02-h200-session5,
// the ablation). Here every CUDA block of the mat-vec computes the whole normed row itself, by the
// norm kernels' own device code: the add (one __fadd_rn), rmsnorm's tree (fused.cu hx_norm_play,
// the tree's threads played by this block's), the scale and hx_norm_value's multiply and q8_1 store.
// Those are the operations of hx_add_rms_norm_q8_1 / hx_rms_norm_q8_1 in the same order, and the
// rows then are mmvq_multi's: the bits equal the norm launch followed by the mat-vec launch
// (tests/test_norm_mmvq.py on the CPU, tests/test_norm_mmvq_gpu.py on a GPU). Only the work is
// repeated, once per CUDA block, on a row that is in L2.
//
// Compiled after rmsnorm.cu, quantize_q8_1.cu, fused.cu, mmvq.cu and mmvq/strided.cuh (launch.py SOURCE) with
// mmvq.cu's defines (HX_Y_SHARED: it reads its activations from shared memory), the q8_1 layout the
// mat-vec reads (HX_LAYOUT, HX_LAYOUT_BYTES) and:
//   HX_NORM_GROUPS  mat-vec row blocks per CUDA block: block (32, HX_NWARPS, HX_NORM_GROUPS), group
//                   g = threadIdx.z computes mmvq_multi's row block blockIdx.x * HX_NORM_GROUPS + g;
//   HX_NORM_PLAY    tree threads of rmsnorm's tree (block_threads(n)) per thread of the CUDA block;
//   HX_NORM_VALS    values of the row per tree thread (ceil(n / tree threads)).
// Dynamic shared memory: HX_NORM_GROUPS * (HX_NWARPS-1)*HX_NCOLS*HX_RPB*32 floats (the groups'
// hand-over). Static: the HX_NCOLS normed rows in the mat-vec's layout (HX_NCOLS * HX_COL_BYTES).
// Grid: ceil(row blocks / HX_NORM_GROUPS) CUDA blocks, or fewer (each then strides: mmvq/strided.cuh).
#if !defined(HX_NORM_GROUPS) || !defined(HX_NORM_PLAY) || !defined(HX_NORM_VALS) || !defined(HX_Y_SHARED)
#error "norm_mmvq.cu needs HX_NORM_GROUPS, HX_NORM_PLAY, HX_NORM_VALS and HX_Y_SHARED (launch.py norm_mmvq_defines)"
#endif
#define HX_NORM_THREADS (32 * HX_NWARPS * HX_NORM_GROUPS)

// x: HX_NCOLS rows of n floats (the ffn_down output, or the row to norm), r: the residual added to
// x (NULL: none), nw: the norm weight (n), s: x + r, written by CUDA block 0 (NULL: not written; s
// overlaps neither x nor r). Weights 0..2 as mmvq_multi's (row blocks 0..nblk0-1 weight 0, ...).
extern "C" __global__ void __launch_bounds__(HX_NORM_THREADS, HX_MIN_BLOCKS)
hx_norm_mmvq(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ nw, float* s,
             const int n, const float eps,
             const u8* __restrict__ w0, float* __restrict__ dst0, const int nrows0, const int nblk0,
             const u8* __restrict__ w1, float* __restrict__ dst1, const int nrows1, const int nblk1,
             const u8* __restrict__ w2, float* __restrict__ dst2, const int nrows2) {
    // the rows: mmvq_multi's, HX_NORM_GROUPS row blocks a CUDA block, striding when the grid is smaller
    // (launch.py NORM_MMVQ_PER_SM): the norm is then made once per resident block (mmvq/strided.cuh)
    const hx_weights3 ws = {w0, dst0, nrows0, nblk0, w1, dst1, nrows1, nblk1, w2, dst2, nrows2};
    const int tid = threadIdx.x + 32 * (threadIdx.y + HX_NWARPS * threadIdx.z);
    hx_strided_prefetch(ws, HX_NORM_GROUPS, 0, HX_STRIDE_AHEAD);  // the first rows into L2 before the wait
    hx_prefetch_lines(nw, 4LL * n, tid, HX_NORM_THREADS);
    HX_PDL_ENTRY();

    __shared__ __align__(16) u8 yq[HX_NCOLS * HX_COL_BYTES];
    __shared__ float warp_partial[32];
    hx_norm_columns<HX_NORM_PLAY, HX_NORM_VALS>(x, r, nw, eps, blockIdx.x == 0 ? s : nullptr, n, HX_NCOLS, yq, nullptr,
                                                warp_partial, tid, HX_NORM_THREADS);
    extern __shared__ float tmp_shared[];
    hx_strided_rows(ws, HX_NORM_GROUPS, yq, tmp_shared);
}

#ifdef HX_ARGMAX
// hx_norm_mmvq_argmax (HX_ARGMAX): a one-token pass's end in one launch: the norm of the last layer's output,
// the output head's rows (one weight, striding as above) and the greedy token with its advance and log, as
// the norm launch, mmvq and hx_argmax_rows make them (the token: the first index of the largest logit, NaN
// largest, whichever blocks summed the rows). Each group's warp 0 max-es its rows' keys over the strides; the
// block's groups meet in shared memory, and group 0's warp 0 ends the launch (mmvq.cu hx_argmax_finish: one
// slot atomic and one count a CUDA block; the grid is at most what the SMs hold, not mmvq_argmax's tens of
// thousands of blocks). slot_keys, counters: as mmvq_argmax's, zero before the first launch.
extern "C" __global__ void __launch_bounds__(HX_NORM_THREADS, HX_MIN_BLOCKS)
hx_norm_mmvq_argmax(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ nw, float* s,
                    const int n, const float eps, const u8* __restrict__ w, float* dst, const int nrows,
                    unsigned long long* slot_keys, unsigned int* counters, int* __restrict__ out, const int* pos,
                    int* advance, int* log, const int n_log) {
    const hx_weights3 ws = {w, dst, nrows, (nrows + HX_RPB - 1) / HX_RPB, w, dst, 0, 0, w, dst, 0};  // one weight
    const int tid = threadIdx.x + 32 * (threadIdx.y + HX_NWARPS * threadIdx.z);
    hx_strided_prefetch(ws, HX_NORM_GROUPS, 0, HX_STRIDE_AHEAD);  // the first rows into L2 before the wait
    hx_prefetch_lines(nw, 4LL * n, tid, HX_NORM_THREADS);
    HX_PDL_ENTRY();

    __shared__ __align__(16) u8 yq[HX_COL_BYTES];
    __shared__ float warp_partial[32];
    __shared__ unsigned long long group_key[HX_NORM_GROUPS];
    hx_norm_columns<HX_NORM_PLAY, HX_NORM_VALS>(x, r, nw, eps, blockIdx.x == 0 ? s : nullptr, n, 1, yq, nullptr,
                                                warp_partial, tid, HX_NORM_THREADS);
    extern __shared__ float tmp_shared[];
    unsigned long long key = 0;  // below every value's key
    hx_strided_rows(ws, HX_NORM_GROUPS, yq, tmp_shared, &key);
    if (threadIdx.y == 0 && threadIdx.x == 0) group_key[threadIdx.z] = key;  // warp 0: every lane the same key
    __syncthreads();
    if (threadIdx.y != 0 || threadIdx.z != 0) return;
#pragma unroll
    for (int g = 1; g < HX_NORM_GROUPS; ++g) key = hx_key_max(key, group_key[g]);
    hx_argmax_finish(key, dst, nrows, slot_keys, counters, out, pos, advance, log, n_log);
}
#endif  // HX_ARGMAX
