// hiraishin: float32 helpers shared by every kernel.
//
// Kernels are compiled WITHOUT fast-math, and every float operation whose
// rounding matters is written as an explicit intrinsic (__fmaf_rn, __fmul_rn,
// __fadd_rn) so the compiler cannot contract or reorder it differently from
// the Numba emulator (hiraishin/fp.py).
#pragma once

// fp16 <-> fp32 through PTX cvt: no header needed under NVRTC, and cvt.rn is the
// IEEE round-to-nearest-even conversion the emulator implements. (The CPU shim in
// tests/test_mmvq_shim.py defines HX_HALF_PTX and supplies its own versions.)
#ifndef HX_HALF_PTX
#define HX_HALF_PTX
__device__ __forceinline__ float hx_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short hx_f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// Programmatic dependent launch (sm_90+). Inside a CUDA graph the library may launch a kernel with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (hiraishin/kernels/compile.py): its blocks
// can then start while the previous kernel still runs. HX_PDL_ENTRY() comes before a kernel touches
// anything another kernel writes: griddepcontrol.wait returns once every earlier grid has finished
// and its writes are visible; launch_dependents then lets the next kernel's blocks become resident
// (they wait in their own HX_PDL_ENTRY). Launched without the attribute both are no-ops. Scheduling
// only: no value and no float operation changes. compile.py launches a kernel this way only if its
// body names HX_PDL_ENTRY (tests/test_pdl.py checks every kernel does).
// HX_PDL_EARLY (hiraishin/kernels/pdl.py, HIRAISHIN_PDL_TRIGGER=early) lets the next kernel launch
// before the wait: its blocks then become resident while this one still waits on its predecessor,
// two kernels of a chain in flight instead of one. Correct either way: a kernel completes only
// after its own wait returned, so waiting on it is waiting on every earlier one.
#ifndef HX_PDL_EARLY
#define HX_PDL_EARLY 0
#endif
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && HX_PDL_EARLY
#define HX_PDL_ENTRY() asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory")
#define HX_PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" :: "l"(p))
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define HX_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#define HX_PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" :: "l"(p))
#else
#define HX_PDL_ENTRY() ((void)0)
#define HX_PREFETCH_L2(p) ((void)(p))
#endif
#define HX_L2_LINE 128  // bytes per L2 cache line (Hopper)

// Ask L2 for the lines of [p, p + bytes): thread `first` of `step` threads takes lines first,
// first + step, ..., and thread 0 also the line of the last byte when the span is not line-aligned.
// For weights (never written) a kernel may call it before HX_PDL_ENTRY, so their DRAM latency
// overlaps the previous kernel. A cache hint only: no value changes.
__device__ __forceinline__ void hx_prefetch_lines(const void* p, const long long bytes, const int first,
                                                  const int step) {
    const unsigned char* b = (const unsigned char*)p;
    for (long long off = (long long)first * HX_L2_LINE; off < bytes; off += (long long)HX_L2_LINE * step) {
        HX_PREFETCH_L2(b + off);
    }
    // a span that starts or ends inside a line has one more line than bytes / HX_L2_LINE rounded up
    if (first == 0 && bytes > 0 && (((unsigned long long)b | (unsigned long long)bytes) % HX_L2_LINE) != 0) {
        HX_PREFETCH_L2(b + bytes - 1);
    }
}

// e**x from explicit correctly-rounded operations; the same sequence as
// hiraishin.fp.expf. Below HX_EXP_LO the result is 0, above HX_EXP_HI +inf.
#define HX_EXP_LO (-87.0f)
#define HX_EXP_HI (88.0f)

__device__ __forceinline__ float hx_expf(float x) {
    if (x != x) return x;
    if (x < HX_EXP_LO) return 0.0f;
    if (x > HX_EXP_HI) return __int_as_float(0x7f800000);
    float j = __fmaf_rn(x, 1.44269504088896341f, 12582912.0f);
    j = __fsub_rn(j, 12582912.0f);
    const int n = (int)j;
    float r = __fmaf_rn(j, -0.693359375f, x);
    r = __fmaf_rn(j, 2.12194440e-4f, r);
    float p = __fmaf_rn(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = __fmaf_rn(p, r, 8.3334519073e-3f);
    p = __fmaf_rn(p, r, 4.1665795894e-2f);
    p = __fmaf_rn(p, r, 1.6666665459e-1f);
    p = __fmaf_rn(p, r, 5.0000001201e-1f);
    const float z = __fmul_rn(r, r);
    float y = __fmaf_rn(p, z, r);
    y = __fadd_rn(y, 1.0f);
    return __fmul_rn(y, __int_as_float((n + 127) << 23));
}

// SwiGLU's product silu(g) * u with silu(g) = g / (1 + e**-g): the one sequence of every kernel that
// computes it (elementwise.cu, fused.cu, mmvq_swiglu.cu, swiglu_down.cu) and of their emulators.
__device__ __forceinline__ float hx_swiglu(const float g, const float u) {
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, hx_expf(-g)));
    return __fmul_rn(silu, u);
}

// Butterfly sum over the 32 lanes of a warp (xor 16, 8, 4, 2, 1); every lane
// ends with the same value because a + b == b + a in IEEE arithmetic.
__device__ __forceinline__ float hx_warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, off, 32));
    }
    return x;
}

// NEOX RoPE of one pair (x0, x1) = (dim d, dim d + head_dim/2) by the table's (c, s): two products
// and one subtraction or addition, each correctly rounded. rope.cu, fused.cu's hx_qk_norm_rope_kv and
// fattn_vec.cu's fattn_vec_q1_rope all rotate through this one function (the same bits by construction).
__device__ __forceinline__ void hx_rope_pair(const float x0, const float x1, const float c, const float s,
                                             float& y0, float& y1) {
    y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__device__ __forceinline__ float hx_warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off, 32));
    }
    return x;
}

// Bytewise x - 32 for bytes in 0..63 (Q6_K's 6-bit values to int8), no borrow between bytes (what
// __vsubss4(x, 0x20202020) gives in this range): set bit 7 of each byte, subtract, flip bit 7 back.
// Integer only: the mat-vec kernels of every Q6_K order share it.
__device__ __forceinline__ int hx_sub32_bytes(int x) {
    return (int)((((unsigned int)x | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

// A launch of up to three weights that read the same activations (hx_mmq_multi, hx_norm_mmvq): CUDA
// blocks (or row blocks) 0..n0-1 are weight 0's, the next n1 weight 1's, the rest weight 2's. Which
// weight block b is, its output and rows, and b's index among that weight's blocks (past the last: an
// index past weight 2's rows, whose results the kernels never write). mmvq_multi keeps one branch per
// weight: with this pick its Q6_K one-column form spills at its 40-register cap (nvcc, sm_90).
struct hx_weight_of_block {
    const unsigned char* w;
    float* out;
    int nrows;
    int index;
};
__device__ __forceinline__ hx_weight_of_block hx_pick_weight(const int b, const unsigned char* w0, float* out0,
                                                              const int nrows0, const int n0,
                                                              const unsigned char* w1, float* out1,
                                                              const int nrows1, const int n1,
                                                              const unsigned char* w2, float* out2,
                                                              const int nrows2) {
    if (b < n0) return {w0, out0, nrows0, b};
    if (b < n0 + n1) return {w1, out1, nrows1, b - n0};
    return {w2, out2, nrows2, b - n0 - n1};
}
// Kernels whose CUDA blocks stride over a launch's row blocks (mmvq/strided.cuh, norm_mmvq/norm_mixed.cu) ask L2
// for their weight rows this many of the block's strides ahead: the first HX_STRIDE_AHEAD strides before the
// PDL wait (as mmvq's kernels ask for their rows), then stride s + HX_STRIDE_AHEAD while stride s runs. Not all
// at once: a wide matrix striding over one wave of blocks (the output head: 128 MB on Qwen3-8B, more than L2)
// would evict its own lines before they are read. Cache hints only: no value changes.
#ifndef HX_STRIDE_AHEAD
#define HX_STRIDE_AHEAD 2
#endif
// Such a launch's weight arguments in one value.
struct hx_weights3 {
    const unsigned char* w0; float* dst0; int nrows0; int nblk0;
    const unsigned char* w1; float* dst1; int nrows1; int nblk1;
    const unsigned char* w2; float* dst2; int nrows2;
};

// The argmax rule (elementwise.cu hx_argmax_rows; also mmvq.cu mmvq_argmax): one 64-bit key per candidate
// whose unsigned order is the rule, the largest key the answer (see hx_argmax_rows).
__device__ __forceinline__ unsigned long long hx_argmax_key(const float v, const int i) {
    unsigned int u = __float_as_uint(v);
    if (v != v) {
        u = 0xffffffffu;  // every NaN: above +inf (0xff800000 once mapped)
    } else if (v == 0.0f) {
        u = 0x80000000u;  // -0.0 and +0.0 alike
    } else {
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned int)i);
}

__device__ __forceinline__ unsigned long long hx_key_max(const unsigned long long a, const unsigned long long b) {
    return a > b ? a : b;
}
