// hiraishin: the down projection of a feed-forward block whose CUDA blocks make their own activations:
// silu(g) * u and its q8_1 quantization, into shared memory, then mmvq.cu's rows.
//
// A one-token pass is a chain of small dependent launches, and each costs its place in the chain
// (bench/NOTES_speculation.md, session 13: ~1.5-1.8 us on the 0.6B whatever it computes). The SwiGLU
// launch between gate/up and down is one of them. Here every CUDA block of the down mat-vec computes the
// whole product row itself, by the SwiGLU launch's own device code (fp.cuh hx_swiglu, then
// quantize_q8_1.cu's hx_q8_1_store: the operations of fused.cu hx_swiglu_q8_1, one warp per q8_1 block),
// and then runs mmvq.cu's rows over a grid that is at most what the SMs hold at once (mmvq/strided.cuh:
// the product is made once per resident block). The bits equal hx_swiglu_q8_1 followed by mmvq
// (tests/test_swiglu_down.py on the CPU, tests/test_swiglu_down_gpu.py on a GPU).
//
// Compiled after quantize_q8_1.cu, mmvq.cu and mmvq/strided.cuh (launch.py SOURCE) with mmvq.cu's defines
// for the down weight (HX_NBLOCKS * HX_QK = the product's length), HX_Y_SHARED, the q8_1 layout the
// mat-vec reads (HX_LAYOUT, HX_LAYOUT_BYTES) and HX_SWIGLU_GROUPS (mat-vec row blocks per CUDA block:
// block (32, HX_NWARPS, HX_SWIGLU_GROUPS)).
// Dynamic shared memory: HX_SWIGLU_GROUPS * (HX_NWARPS-1)*HX_NCOLS*HX_RPB*32 floats (the groups'
// hand-over). Static: the HX_NCOLS product rows in the mat-vec's layout (HX_NCOLS * HX_COL_BYTES).
#if !defined(HX_SWIGLU_GROUPS) || !defined(HX_Y_SHARED)
#error "swiglu_down.cu needs HX_SWIGLU_GROUPS and HX_Y_SHARED (launch.py swiglu_down_defines)"
#endif
#define HX_SWIGLU_THREADS (32 * HX_NWARPS * HX_SWIGLU_GROUPS)
#ifndef HX_SWIGLU_BATCH
#define HX_SWIGLU_BATCH 8  // q8_1 blocks a warp loads before it computes any (registers: 2 per block)
#endif

// g, u: HX_NCOLS rows of k = HX_NBLOCKS * HX_QK floats (the gate and up outputs); w: the down weight,
// nrows rows of k values; dst: HX_NCOLS rows of nrows floats.
extern "C" __global__ void __launch_bounds__(HX_SWIGLU_THREADS, HX_MIN_BLOCKS)
hx_swiglu_down(const float* __restrict__ g, const float* __restrict__ u, const u8* __restrict__ w,
               float* __restrict__ dst, const int nrows) {
    const int nblk = (nrows + HX_RPB - 1) / HX_RPB;
    const hx_weights3 ws = {w, dst, nrows, nblk, w, dst, 0, 0, w, dst, 0};  // one weight
    hx_strided_prefetch(ws, HX_SWIGLU_GROUPS, 0, HX_STRIDE_AHEAD);  // the first rows into L2 before the wait
    HX_PDL_ENTRY();

    __shared__ __align__(16) u8 yq[HX_NCOLS * HX_COL_BYTES];
    constexpr int k = HX_NBLOCKS * HX_QK;
    constexpr int nb = k / 32;  // q8_1 blocks a row
    constexpr int nwarps = HX_NWARPS * HX_SWIGLU_GROUPS;
    const int warp = threadIdx.y + HX_NWARPS * threadIdx.z;
    const int lane = threadIdx.x;
    // Warp w takes q8_1 blocks w, w + nwarps, ...: their g and u values are loaded SWIGLU_BATCH blocks at a
    // time before any is computed (one L2 round trip per batch, not per block), then each is stored.
    constexpr int per_warp = (nb + nwarps - 1) / nwarps;
    constexpr int batch = per_warp < HX_SWIGLU_BATCH ? per_warp : HX_SWIGLU_BATCH;
#pragma unroll 1
    for (int j = 0; j < HX_NCOLS; ++j) {
#pragma unroll 1
        for (int first = 0; first < per_warp; first += batch) {
            float gv[batch], uv[batch];
#pragma unroll
            for (int m = 0; m < batch; ++m) {
                const int ib = warp + (first + m) * nwarps;
                const size_t i = (size_t)j * k + ib * 32 + lane;
                gv[m] = ib < nb ? g[i] : 0.0f;
                uv[m] = ib < nb ? u[i] : 0.0f;
            }
#pragma unroll
            for (int m = 0; m < batch; ++m) {
                const int ib = warp + (first + m) * nwarps;
                if (ib < nb) hx_q8_1_store(yq, j, nb, ib, lane, hx_swiglu(gv[m], uv[m]));  // uniform per warp
            }
        }
    }
    __syncthreads();  // every product column is in yq
    extern __shared__ float tmp_shared[];
    hx_strided_rows(ws, HX_SWIGLU_GROUPS, yq, tmp_shared);
}
