// RoPE, NEOX layout (Qwen3: LLAMA_ROPE_TYPE_NEOX): dimension d is rotated with d + head_dim/2.
//   y[d]          = x[d] * cos - x[d + half] * sin
//   y[d + half]   = x[d] * sin + x[d + half] * cos
// cos/sin come from tables (n_ctx, half) computed once on the host in float64 and rounded to float32,
// so the CPU emulator and this kernel read identical bits. No reduction: every output is two
// products and one add/sub, each an explicit correctly rounded op (no contraction to fma).
//
// Grid: one block per (token, head) row; block: half threads, one rotation pair each.

extern "C" __global__ void hx_rope_neox_f32(const float* __restrict__ x,
                                            float* __restrict__ y,
                                            const int* __restrict__ pos,
                                            const float* __restrict__ cos_table,
                                            const float* __restrict__ sin_table,
                                            const int n_head,
                                            const int head_dim) {
    HX_PDL_ENTRY();
    const int row = blockIdx.x;            // token * n_head + head
    const int token = row / n_head;
    const int half = head_dim / 2;
    const int d = threadIdx.x;
    if (d >= half) return;
    const size_t cell = (size_t)pos[token] * half + d;
    const float c = cos_table[cell];
    const float s = sin_table[cell];
    const float* xr = x + (size_t)row * head_dim;
    float* yr = y + (size_t)row * head_dim;
    const float x0 = xr[d];
    const float x1 = xr[d + half];
    hx_rope_pair(x0, x1, c, s, yr[d], yr[d + half]);
}
