// hiraishin: activation quantization to q8_1 for the dp4a mat-vec kernels.
//
// Geometry of llama.cpp's quantize_q8_1 (ggml/src/ggml-cuda/quantize.cu): one
// warp per block of 32 values, lane L owns value L. amax by a butterfly max,
// the block sum of the UNQUANTIZED floats by the xor butterfly 16, 8, 4, 2, 1.
// Arithmetic is IEEE (llama.cpp's fast-math build multiplies by an approximate
// reciprocal instead): d = amax / 127 and q = roundf(x / d), both correctly
// rounded divisions, q = 0 when amax == 0.
//
// Layout (HX_LAYOUT): 0 (default), llama.cpp's: y is (ncols, K/32) blocks of 36 bytes:
// fp16 d, fp16 s, int8 qs[32]. HX_Q6_K / HX_Q4_K: the same values in the order the mat-vec
// threads for that weight type read them (hiraishin/kernels/quantize/layout.py has the tables):
// per 8 blocks (one weight super-block) a record of 288 / 416 bytes with the ints regrouped per
// thread, d as float32 (the fp16 value, exactly) and, for Q4_K, per-thread integer sums.
// 112 / 114 (MMA_Q4_K / MMA_Q6_K: 100 + the type id): the sub-block MMA kernel's records of
// 288 bytes: the 8 blocks' ds words, then per pair of blocks the ints of each MMA lane side by side.
// 212 / 214 (MMA8_Q4_K / MMA8_Q6_K: 200 + the type id): the same records with the columns of each group of
// 8 interleaved (per group and super-block: the 8 columns' ds words, then per pair the 8 columns' 64 bytes);
// y then holds whole groups of 8 columns (the padding columns are not written).
// Launch: grid (ceil(K/32 / HX_Q8_WARPS), ncols), block (32 * HX_Q8_WARPS).

// HX_Q8_1_BYTES (36) and the type ids come from hiraishin.quant (compile.py format_defines).
#ifndef HX_LAYOUT
#define HX_LAYOUT 0
#endif
// HX_LAYOUT_BYTES: bytes of one record (8 q8_1 blocks) of the layout (quantize/layout.py LAYOUT_BYTES).

#ifndef HX_LAYOUT_BYTES
#define HX_LAYOUT_BYTES 0
#endif

// One q8_1 block: lane `lane` of a warp holds value `xi` of block ib (of nb per row) of row col,
// stored in layout LAYOUT (records of RECORD_BYTES bytes per 8 blocks). The quantize kernel's work
// after its load (also fused/fused.cu's, and the attention combine's). Every lane of the warp must
// call it (butterflies).
template <int LAYOUT, int RECORD_BYTES>
__device__ __forceinline__ void hx_q8_1_store_as(unsigned char* __restrict__ y, const int col, const int nb,
                                                 const int ib, const int lane, const float xi) {
    static_assert(LAYOUT == 0 || LAYOUT == 12 || LAYOUT == 14 || LAYOUT == 112 || LAYOUT == 114 || LAYOUT == 212 ||
                  LAYOUT == 214, "layout must be 0, 12 (Q4_K), 14 (Q6_K), 112 / 114 (MMA_*) or 212 / 214 (MMA8_*)");
    const float amax = hx_warp_max(fabsf(xi));
    const float d = __fdiv_rn(amax, 127.0f);
    const float q = amax == 0.0f ? 0.0f : roundf(__fdiv_rn(xi, d));

    const int qi = (int)q;
    if constexpr (LAYOUT == 0 || LAYOUT >= 100) {
        const float sum = hx_warp_sum(xi);  // all lanes take part in the butterfly
        const unsigned int ds = (unsigned int)hx_f2h(d) | ((unsigned int)hx_f2h(sum) << 16);
        if constexpr (LAYOUT == 0) {
            unsigned char* blk = y + ((long long)col * nb + ib) * HX_Q8_1_BYTES;
            blk[4 + lane] = (unsigned char)(signed char)qi;
            if (lane == 0) *(unsigned int*)blk = ds;
        } else {  // quantize/layout.py: int m = lane / 4 goes to MMA lane t, slot u of block b's pair
            const int b = ib % 8, m = lane / 4;
            const int t = LAYOUT % 100 == 14 ? m % 4 : m / 2;
            const int u = LAYOUT % 100 == 14 ? m / 4 : m % 2;
            const int at = 16 * t + 8 * (b % 2) + 4 * u + lane % 4;  // in the pair's 64 bytes of this column
            if constexpr (LAYOUT < 200) {
                unsigned char* rec = y + ((long long)col * (nb / 8) + ib / 8) * RECORD_BYTES;
                rec[32 + 64 * (b / 2) + at] = (unsigned char)(signed char)qi;
                if (lane == 0) *(unsigned int*)(rec + 4 * b) = ds;
            } else {  // the record of super-block ib / 8 of column group col / 8, column col % 8 in it
                unsigned char* grp = y + ((long long)(col / 8) * (nb / 8) + ib / 8) * (8 * RECORD_BYTES);
                const int c = col % 8;
                grp[256 + 512 * (b / 2) + 64 * c + at] = (unsigned char)(signed char)qi;
                if (lane == 0) *(unsigned int*)(grp + 32 * c + 4 * b) = ds;
            }
        }
    } else {
        const int b = ib % 8;
        const int m = lane / 4;
        const int e = lane % 4;
        const float dq = hx_h2f(hx_f2h(d));
        unsigned char* rec = y + ((long long)col * (nb / 8) + ib / 8) * RECORD_BYTES;
        if constexpr (LAYOUT == 14) {  // Q6_K
            const int h = b / 4, r = b % 2, i = (b % 4) / 2;
            rec[8 * (16 * h + 8 * r + m) + 4 * i + e] = (unsigned char)(signed char)qi;
            if (lane == 0) {
                *(float*)(rec + 256 + 4 * (4 * h + 2 * r + i)) = dq;
            }
        } else {  // Q4_K
            const int c = b / 2, i = b % 2, p = m % 4;
            rec[16 * (4 * c + p) + 4 * (2 * i + m / 4) + e] = (unsigned char)(signed char)qi;
            if (lane == 0) {
                *(float*)(rec + 256 + 4 * b) = dq;
            }
            int s = qi;
            s += __shfl_xor_sync(0xffffffffu, s, 1, 32);
            s += __shfl_xor_sync(0xffffffffu, s, 2, 32);
            s += __shfl_xor_sync(0xffffffffu, s, 16, 32);
            if (lane < 16 && e == 0) {
                *(int*)(rec + 288 + 8 * (4 * c + p) + 4 * i) = s;
            }
        }
    }
}

// hx_q8_1_store_as in the layout this source is compiled for (HX_LAYOUT, HX_LAYOUT_BYTES).
__device__ __forceinline__ void hx_q8_1_store(unsigned char* __restrict__ y, const int col, const int nb,
                                              const int ib, const int lane, const float xi) {
    hx_q8_1_store_as<HX_LAYOUT, HX_LAYOUT_BYTES>(y, col, nb, ib, lane, xi);
}

extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, unsigned char* __restrict__ y,
                                         const int k, const long long x_row_stride) {
    HX_PDL_ENTRY();
    const int nb = k / 32;
    const int col = blockIdx.y;
    const int ib = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (ib >= nb) {
        return;  // uniform per warp: the whole warp leaves together
    }
    const int lane = threadIdx.x % 32;

    hx_q8_1_store(y, col, nb, ib, lane, x[col * x_row_stride + ib * 32 + lane]);
}
