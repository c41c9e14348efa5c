// hiraishin: a pass's first launch, the token embedding and the first layer's norm in one kernel.
//
//   hx_embed_rms_norm_q8_1_<type>   elementwise/elementwise.cu's hx_get_rows_<type> (the row of each
//                                   token id, dequantized), then fused.cu's hx_rms_norm_q8_1 of it
//
// Every value is dequantized by the very element function get_rows uses (hx_row_<type>: the same
// float operations, so the same bits) where the norm kernel would load it, and stored to s (the
// pass's embedding, the first residual) by the one CUDA block that quantizes it, as
// hx_add_rms_norm_q8_1 stores its sum. The norm is hx_rms_norm_q8_1's tree, scale, weight multiply
// and q8_1 store. So the outputs equal get_rows followed by the norm bit for bit (tests/test_fused.py
// on the CPU, tests/test_fused_gpu.py on a GPU), one dependent launch fewer per pass.
//
// Compiled after rmsnorm.cu, quantize_q8_1.cu, fused.cu and elementwise.cu (launch.py SOURCE_EMBED),
// with the norm kernels' defines (HX_LAYOUT, HX_LAYOUT2, HX_NORM_PER / HX_NORM_VALS, HX_NORM_W_EARLY).
// Token ids are read from device memory after the wait on the previous kernel: a CUDA graph of the
// pass replays it for any token.

// After the wait (the token ids may come from the previous pass's argmax): the rows and their norm.
// wpre: what the kernel read of the norm weights before the wait (HX_NORM_W_PRE).
template <float (*ELEMENT)(const unsigned char*, int), class WPre>
__device__ __forceinline__ void hx_embed_norm(const unsigned char* __restrict__ table, const int* __restrict__ ids,
                                              const long long row_bytes, const float* __restrict__ w, float* s,
                                              unsigned char* __restrict__ yq, float* __restrict__ y,
                                              unsigned char* __restrict__ yq2, const int n, const float eps,
                                              const WPre& wpre) {
    __shared__ float warp_partial[32];
    const int row = blockIdx.y;
    const unsigned char* tr = table + (long long)ids[row] * row_bytes;
    const auto load = [&](const int i) { return ELEMENT(tr, i); };
#ifdef HX_NORM_PER
    hx_norm_played(load, w, eps, warp_partial, yq, y, yq2, s, row, n, wpre);
#else
    const float scale = hx_rms_scale_of(load, n, eps, warp_partial);
    hx_norm_store(load, w, scale, yq, y, yq2, s, row, n, wpre);
#endif
}

// Grid (slices, rows) and block as hx_rms_norm_q8_1 (launch.py norm_slices / norm_geometry). table:
// the embedding's rows of row_bytes bytes; ids: int32 (rows,); s: float32 (rows, n), the dequantized
// rows; yq (yq2: a second layout, or NULL) the q8_1 bytes of their norm; y the float32 norm, or NULL.
// One kernel per table type; kernels/pdl.py finds each one's wait (HX_PDL_ENTRY) through the macro.
#define HX_EMBED_NORM_KERNEL(NAME, ELEMENT)                                                                  \
    extern "C" __global__ void NAME(const unsigned char* __restrict__ table, const int* __restrict__ ids,    \
                                    const long long row_bytes, const float* __restrict__ w, float* s,         \
                                    unsigned char* __restrict__ yq, float* __restrict__ y,                    \
                                    unsigned char* __restrict__ yq2, const int n, const float eps) {          \
        hx_prefetch_lines(w, 4LL * n, threadIdx.x, blockDim.x); /* the norm weight, read after the reduction */ \
        HX_NORM_W_PRE(w, n);                                                                                  \
        HX_PDL_ENTRY();                                                                                       \
        hx_embed_norm<ELEMENT>(table, ids, row_bytes, w, s, yq, y, yq2, n, eps, HX_NORM_W_ARG);               \
    }
HX_EMBED_NORM_KERNEL(hx_embed_rms_norm_q8_1_q4_K, hx_row_q4_K)
HX_EMBED_NORM_KERNEL(hx_embed_rms_norm_q8_1_q6_K, hx_row_q6_K)
HX_EMBED_NORM_KERNEL(hx_embed_rms_norm_q8_1_q8_0, hx_row_q8_0)
HX_EMBED_NORM_KERNEL(hx_embed_rms_norm_q8_1_f16, hx_row_f16)
HX_EMBED_NORM_KERNEL(hx_embed_rms_norm_q8_1_f32, hx_row_f32)
