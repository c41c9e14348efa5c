// hiraishin: mmvq_swiglu, the gate and up mat-vecs of a feed-forward block with SwiGLU and the q8_1
// quantization of its product as their epilogue: one launch where mmvq_multi then hx_swiglu_q8_1 were two.
//
// A one-token pass is a chain of dependent launches, and a launch between two mat-vecs costs its place
// in the chain (about 1.5 us on an H200 beyond its work). The SwiGLU launch's work is per 32-row group:
// q8_1 block j of the product needs rows 32j .. 32j+31 of gate and of up and nothing else. So here the
// CUDA blocks of one group (2 * 32 / HX_RPB of them: its gate rows, then its up rows) count themselves in
// the group's counter once their rows are stored; the group's last block has one warp compute
// hx_swiglu(g, u) of those 32 rows (fp.cuh: the sequence of elementwise.cu and fused.cu) and store them as
// q8_1 block j in the layout the down projection reads (quantize_q8_1.cu's hx_q8_1_store), then set the
// counter back to 0 for the next launch (a CUDA graph replays this one). The rows are mmvq.cu's (the same
// geometry, the same bits; which CUDA block computes a row changes no bit), the product and its q8_1 those
// of hx_swiglu_q8_1: the bits of the two launches (tests/test_mmvq_swiglu.py, tests/test_mmvq_swiglu_gpu.py).
// Unlike a norm as a mat-vec's epilogue (one block would reduce a whole row), the work stays spread over
// the groups, and the groups' epilogues over the launch (block b serves group b / HX_GROUP_BLOCKS, so
// gate and up blocks of one group are neighbours and a group completes early in the grid, not at its end).
//
// Compiled after quantize_q8_1.cu (HX_LAYOUT, HX_LAYOUT_BYTES: the down projection's q8_1 layout) and
// mmvq.cu (the gate/up weights' defines; launch.py SOURCE). Grid (2 * nrows / HX_RPB), block
// (32, HX_NWARPS), dynamic shared memory mmvq's hand-over. nrows % 32 == 0 (the launcher checks).
// counters: nrows / 32 uint32, zero before the first launch.
#if 32 % HX_RPB != 0
#error "mmvq_swiglu: HX_RPB must divide 32 (a CUDA block's rows lie in one q8_1 group)"
#endif
#define HX_GROUP_BLOCKS (2 * (32 / HX_RPB))

// g, u: (HX_NCOLS, nrows) float32, written by the mat-vecs and read back by each group's last block
// (so not __restrict__, and read through L2: __ldcg); yq: the product's q8_1 (HX_NCOLS rows of nrows
// values, HX_LAYOUT); m: the float32 product, or NULL.
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, HX_MIN_BLOCKS)
mmvq_swiglu(const u8* __restrict__ y, const u8* __restrict__ wg, const u8* __restrict__ wu, float* g, float* u,
            const int nrows, unsigned int* counters, u8* __restrict__ yq, float* __restrict__ m) {
    const int group = blockIdx.x / HX_GROUP_BLOCKS;
    const int at = blockIdx.x % HX_GROUP_BLOCKS;
    const bool is_up = at >= HX_GROUP_BLOCKS / 2;
    const int row0 = 32 * group + HX_RPB * (is_up ? at - HX_GROUP_BLOCKS / 2 : at);
    hx_prefetch_rows(is_up ? wu : wg, nrows, row0);
#if !HX_W_EARLY
    HX_PDL_ENTRY();
#endif
    extern __shared__ float tmp_shared[];
    // one branch per weight, as mmvq_multi (a shared pick of the pointers costs registers)
    if (is_up) {
        hx_mmvq_rows<(HX_W_EARLY > 0)>(wu, y, u, nrows, nrows, row0, threadIdx.y, tmp_shared);
    } else {
        hx_mmvq_rows<(HX_W_EARLY > 0)>(wg, y, g, nrows, nrows, row0, threadIdx.y, tmp_shared);
    }
    if (threadIdx.y != 0) return;  // warp 0's lanes 0 .. HX_RPB-1 stored the rows
    const int lane = threadIdx.x;
    __threadfence();  // every lane's rows visible on the device before the count says so
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(&counters[group], 1u) == HX_GROUP_BLOCKS - 1;
    if (!__shfl_sync(0xffffffffu, last, 0, 32)) return;  // uniform per warp
    __threadfence();  // the other blocks' rows are read after their counts
    const int nb = nrows / 32;
#pragma unroll 1
    for (int j = 0; j < HX_NCOLS; ++j) {
        const size_t i = (size_t)j * nrows + 32 * group + lane;
        const float v = hx_swiglu(__ldcg(g + i), __ldcg(u + i));
        if (m) m[i] = v;
        hx_q8_1_store(yq, j, nb, group, lane, v);
    }
    if (lane == 0) counters[group] = 0;  // ready for the next launch
}
