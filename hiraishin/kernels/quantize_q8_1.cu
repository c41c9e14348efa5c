// hiraishin: activation quantization to q8_1 for the dp4a mat-vec kernels.
//
// Geometry of llama.cpp's quantize_q8_1 (ggml/src/ggml-cuda/quantize.cu): one
// warp per block of 32 values, lane L owns value L. amax by a butterfly max,
// the block sum of the UNQUANTIZED floats by the xor butterfly 16, 8, 4, 2, 1.
// Arithmetic is IEEE (llama.cpp's fast-math build multiplies by an approximate
// reciprocal instead): d = amax / 127 and q = roundf(x / d), both correctly
// rounded divisions, q = 0 when amax == 0.
//
// Layout: y is (ncols, K/32) blocks of 36 bytes: fp16 d, fp16 s, int8 qs[32].
// Launch: grid (ceil(K/32 / HX_Q8_WARPS), ncols), block (32 * HX_Q8_WARPS).

#define HX_Q8_1_BYTES 36

extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, unsigned char* __restrict__ y,
                                         const int k, const long long x_row_stride) {
    const int nb = k / 32;
    const int col = blockIdx.y;
    const int ib = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (ib >= nb) {
        return;  // uniform per warp: the whole warp leaves together
    }
    const int lane = threadIdx.x % 32;

    const float xi = x[col * x_row_stride + ib * 32 + lane];
    const float amax = hx_warp_max(fabsf(xi));
    const float sum = hx_warp_sum(xi);
    const float d = __fdiv_rn(amax, 127.0f);
    const float q = amax == 0.0f ? 0.0f : roundf(__fdiv_rn(xi, d));

    unsigned char* blk = y + ((long long)col * nb + ib) * HX_Q8_1_BYTES;
    blk[4 + lane] = (unsigned char)(signed char)(int)q;
    if (lane == 0) {
        const unsigned int ds = (unsigned int)hx_f2h(d) | ((unsigned int)hx_f2h(sum) << 16);
        *(unsigned int*)blk = ds;
    }
}
