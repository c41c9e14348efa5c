"""Prototype timing for a draft-only order: the mat-vec quantizes its own activations and applies the norm after.

A one-token pass of the 0.6B draft is a chain of ~228 dependent launches, and under programmatic dependent launch
each costs its place in the chain whatever it computes (bench/NOTES_speculation.md, sessions 13, 22, 25). The two
add + RMSNorm + q8_1 launches of a layer cost the 0.6B ~98 µs a pass (H200, session 13's ablation). Every way of
moving that norm into the next mat-vec tried so far lost, because each put a block-wide reduction and its barriers
between the wait and the first dot product (sessions 6 and 25). Here, instead, with RMSNorm(v) = v * g / rms(v):

    W @ q8_1(v * g / rms)  ->  (W @ q8_1(v * g)) / rms,   v = x + r

the mat-vec reads v's floats itself, and each group of four lanes quantizes the q8_1 blocks it multiplies (their
absmax by two shuffles: no barrier, no shared memory), its first weights already in registers before the wait;
the sum of squares for rms runs beside the dot products and joins the rows' reduction at the end. The launch
removed is the norm launch, not replaced. The sums differ from the library's orders (q8_1 of the unscaled row,
the scale after the dot), so this would be a new order, for drafting only; this script only times whether the
inline quantization costs less than the launch it removes:

    python3 bench/proto_inline_norm.py [--steps 56] [--replays 20] [--json F]

For each shape (the 0.6B's attn_q and ffn_up, the 8B's attn_q; Q4_K, BATCH_VARIANT's one-column geometry), three
chains of ``--steps`` dependent steps captured in one CUDA graph under PDL, each step reading its own copy of the
weight (so that the weights stream from DRAM as in a pass): the library's add + RMSNorm + q8_1 launch then its
mat-vec; the mat-vec alone on a q8_1 row (the ablation: what removing the norm launch saves at most); and the inline
kernel. Prints µs a step; checks first that the inline rows match a float64 reference as closely as the library's
pair does (a q8_1 of a differently scaled row: not the same bits).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Compiled after fp.cuh and mmvq/mmvq.cu (HX_MMVQ_NO_KERNELS; Q4_K; mmvq's defines for one column): mmvq.cu's
# Q4_K weight loads and decode, and hx_dot's float operations with activations quantized in registers.
# Thread tid takes super-blocks kbx = tid / 16 + HX_BPI * it; in each, values 64c + pos + {0..3, 16..19} of
# q8_1 block 2c and 64c + 32 + pos + {0..3, 16..19} of block 2c + 1 (c = (tid % 16) / 4, pos = 4 * (tid % 4)),
# the values whose weights mmvq.cu's Q4_K thread holds; the four lanes of one c hold a block's 32 values.
KERNEL = r"""
#if HX_QTYPE != HX_Q4_K || HX_NCOLS != 1
#error "hx_mmvq_inline: Q4_K, one column"
#endif
struct hx_f4 { float a, b, c, d; };
__device__ __forceinline__ hx_f4 hx_ld_f4(const float* p) {
    hx_f4 v; v.a = __ldg(p); v.b = __ldg(p + 1); v.c = __ldg(p + 2); v.d = __ldg(p + 3); return v;
}
// q8_1 of a 32-value block whose values 4 neighbouring lanes hold, 8 each (v: this lane's, as its two ints take
// them): d = absmax / 127 over the 4 lanes, round(v / d) packed 4 to a word; sum: this lane's share of the
// block's value sum (dp4a with ones), as the quantize kernel's layout holds it. Returns d.
__device__ __forceinline__ float hx_inline_q8(const float (&v)[8], int& u0, int& u1, int& sum) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1, 32));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2, 32));
    const float d = __fdiv_rn(amax, 127.0f);
    int q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = amax == 0.0f ? 0 : __float2int_rn(__fdiv_rn(v[i], d));
    u0 = (q[0] & 0xFF) | ((q[1] & 0xFF) << 8) | ((q[2] & 0xFF) << 16) | (int)((unsigned)(q[3] & 0xFF) << 24);
    u1 = (q[4] & 0xFF) | ((q[5] & 0xFF) << 8) | ((q[6] & 0xFF) << 16) | (int)((unsigned)(q[7] & 0xFF) << 24);
    sum = __dp4a(0x01010101, u1, __dp4a(0x01010101, u0, 0));
    return d;
}

// Rows row0 .. row0 + HX_RPB - 1 of w (Q4_K, k = 256 * HX_NBLOCKS) times RMSNorm(x + r) * g, as
// (w @ q8_1((x + r) * g)) / sqrt(mean((x + r)^2) + eps). CUDA block 0 writes s = x + r. Dynamic shared memory:
// (HX_NWARPS - 1) * (HX_RPB + 1) * 32 floats. Grid: ceil(nrows / HX_RPB) blocks of (32, HX_NWARPS).
extern "C" __global__ void __launch_bounds__(32 * HX_NWARPS, 1)
hx_mmvq_inline(const u8* __restrict__ w, const float* __restrict__ x, const float* __restrict__ r,
               const float* __restrict__ g, float* __restrict__ s_out, float* __restrict__ dst, const int nrows,
               const float eps) {
    const int lane = threadIdx.x, wy = threadIdx.y, tid = 32 * wy + lane;
    const int row0 = HX_RPB * blockIdx.x;
    hx_prefetch_rows(w, nrows, row0);
    hx_prefetch_lines(g, 4LL * 256 * HX_NBLOCKS, tid, 32 * HX_NWARPS);  // the norm weight is never written either
    const u8* wrow[HX_RPB];
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) wrow[i] = w + (long long)min(row0 + i, nrows - 1) * HX_ROW_BYTES;
    const hx_sites s = hx_sites_init(wrow, (const u8*)x, tid);  // (its activation pointers go unused)
    const int e0 = (tid / HX_TPB) * 256 + 64 * ((tid % 16) / 4) + 4 * (tid % 4);
    // A thread's kbx steps: every thread takes the same count (the shuffles of a step need whole warps); in the
    // last, the threads past the row's super-blocks quantize zeros and add nothing.
    constexpr int steps = (HX_NBLOCKS + HX_BPI - 1) / HX_BPI;
    const int kbx0 = tid / HX_TPB;
    hx_wraw first[HX_RPB];  // the first step's weights before the wait (weights are never written)
    if (kbx0 < HX_NBLOCKS) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) first[i] = hx_load_raw<true>(s, i, 0);
    }
    HX_PDL_ENTRY();

    float acc[HX_RPB], ssq = 0.0f;
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int it = 0; it < steps; ++it) {
        const bool active = kbx0 + it * HX_BPI < HX_NBLOCKS;  // the same for the 16 lanes of a super-block
        const int e = e0 + it * HX_BPI * 256;
        float v[2][8];  // q8_1 blocks 2c and 2c + 1: values pos + {0..3}, pos + 16 + {0..3}
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                const int o = e + 32 * h + 16 * part;
                hx_f4 xa = {0.0f, 0.0f, 0.0f, 0.0f}, ra = xa, ga = xa;
                if (active) {
                    xa = hx_ld_f4(x + o); ra = hx_ld_f4(r + o); ga = hx_ld_f4(g + o);
                }
                const float sa[4] = {__fadd_rn(xa.a, ra.a), __fadd_rn(xa.b, ra.b), __fadd_rn(xa.c, ra.c),
                                     __fadd_rn(xa.d, ra.d)};
                const float gg[4] = {ga.a, ga.b, ga.c, ga.d};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    ssq = __fmaf_rn(sa[j], sa[j], ssq);
                    v[h][4 * part + j] = __fmul_rn(sa[j], gg[j]);
                    if (blockIdx.x == 0 && active) s_out[o + j] = sa[j];
                }
            }
        }
        int u[4], sums[2];
        const float d8x = hx_inline_q8(v[0], u[0], u[1], sums[0]);
        const float d8y = hx_inline_q8(v[1], u[2], u[3], sums[1]);
        if (!active) continue;  // (after the shuffles)
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) {
            const hx_wblock b = it == 0 ? hx_decode(first[i], s) : hx_load_w<true>(s, i, it * (HX_BPI * HX_BLOCK_BYTES));
            float sumf_d = 0.0f, sumf_m = 0.0f;
            {
                const int dot1 = hx_dp4a(b.a[0][1], u[1], hx_dp4a(b.a[0][0], u[0], 0));
                sumf_d = __fmaf_rn(d8x, __int2float_rn(dot1 * b.sc[0]), sumf_d);
                sumf_m = __fmaf_rn(d8x, __int2float_rn(sums[0] * b.m[0]), sumf_m);
            }
            {
                const int dot1 = hx_dp4a(b.a[1][1], u[3], hx_dp4a(b.a[1][0], u[2], 0));
                sumf_d = __fmaf_rn(d8y, __int2float_rn(dot1 * b.sc[1]), sumf_d);
                sumf_m = __fmaf_rn(d8y, __int2float_rn(sums[1] * b.m[1]), sumf_m);
            }
            acc[i] = __fadd_rn(acc[i], __fmaf_rn(b.d, sumf_d, -__fmul_rn(b.dmin, sumf_m)));
        }
    }

    extern __shared__ float tmp_shared[];  // [nwarps - 1][HX_RPB + 1][32]: the rows, then the sum of squares
    if (wy > 0) {
#pragma unroll
        for (int i = 0; i < HX_RPB; ++i) tmp_shared[((wy - 1) * (HX_RPB + 1) + i) * 32 + lane] = acc[i];
        tmp_shared[((wy - 1) * (HX_RPB + 1) + HX_RPB) * 32 + lane] = ssq;
    }
    __syncthreads();
    if (wy > 0) return;
#pragma unroll
    for (int wp = 0; wp < HX_NWARPS - 1; ++wp) ssq = __fadd_rn(ssq, tmp_shared[(wp * (HX_RPB + 1) + HX_RPB) * 32 + lane]);
    ssq = hx_warp_sum(ssq);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ssq, (float)(256 * HX_NBLOCKS)), eps)));
#pragma unroll
    for (int i = 0; i < HX_RPB; ++i) {
        float t = acc[i];
#pragma unroll
        for (int wp = 0; wp < HX_NWARPS - 1; ++wp) t = __fadd_rn(t, tmp_shared[(wp * (HX_RPB + 1) + i) * 32 + lane]);
        t = hx_warp_sum(t);
        if (lane == i && row0 + i < nrows) dst[row0 + i] = __fmul_rn(t, scale);
    }
}
"""

# (label, k, n): Q4_K shapes of the 0.6B's and the 8B's one-token passes
SHAPES = (("0.6B attn_q 1024->2048", 1024, 2048), ("0.6B ffn_up 1024->3072", 1024, 3072),
          ("8B attn_q 4096->4096", 4096, 4096))
EPS = 1e-6


def inline_defines(k: int, n: int) -> dict:
    """mmvq.cu's defines of BATCH_VARIANT's one-column Q4_K launch for k values (no early weights: the kernel
    loads its first step itself), and HX_MMVQ_NO_KERNELS."""
    from hiraishin import ReductionOrder
    from hiraishin.kernels.mmvq.launch import kernel_defines
    from hiraishin.plans import matvec_plan

    plan = matvec_plan(ReductionOrder.BATCH_VARIANT, 1, "Q4_K", k=k, n=n)
    d = kernel_defines("Q4_K", 1, plan.rows_per_block, plan.nwarps, k // 256)
    d.pop("HX_W_EARLY", None)
    return {**d, "HX_MMVQ_NO_KERNELS": 1}


def source(defines: dict) -> str:
    """The whole CUDA text of the inline kernel for ``defines`` (as the library's compile builds its sources)."""
    from hiraishin.kernels.compile import defines_text, load_source

    return defines_text(defines) + load_source("mmvq/mmvq.cu") + KERNEL


def inline_kernel(defines: dict):
    """hx_mmvq_inline compiled for ``defines``, launching under PDL inside ``pdl_scope``."""
    import cupy

    from hiraishin.kernels.compile import NVRTC_OPTIONS
    from hiraishin.kernels.pdl import PdlKernel

    mod = cupy.RawModule(code=source(defines), options=NVRTC_OPTIONS, backend="nvrtc")
    return PdlKernel(mod.get_function("hx_mmvq_inline"), True)


def reference(w_blocks: np.ndarray, x, r, g) -> np.ndarray:
    """RMSNorm(x + r) * g through the dequantized weight, in float64."""
    from hiraishin.quant import dequantize

    v = x.astype(np.float64) + r
    y = v / np.sqrt(np.mean(v * v) + EPS) * g
    return dequantize(w_blocks, "Q4_K").astype(np.float64) @ y


def case(seed: int, k: int, n: int):
    """A Q4_K weight (n, k) and x, r, g of k values."""
    from hiraishin.quant import random_blocks

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(k) * 2).astype(np.float32)
    r = (rng.standard_normal(k) * 3).astype(np.float32)
    g = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    return random_blocks("Q4_K", n, k, seed=seed), x, r, g


def relative_error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def time_shape(label: str, k: int, n: int, steps: int, replays: int) -> dict:
    import cupy as cp

    from benchlib import capture_chain, replay_seconds
    from hiraishin.kernels.fused.launch import AddRmsNormQ8_1Launch
    from hiraishin.kernels.mmvq.launch import MatVecLaunch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for

    defines = inline_defines(k, n)
    rpb, nwarps = defines["HX_RPB"], defines["HX_NWARPS"]
    inline = inline_kernel(defines)
    w0, x, r, g = case(k + n, k, n)
    ws = [cp.asarray(w0) for _ in range(steps)]  # a copy a step: the weights stream from DRAM, as in a pass
    assert all(int(a.data.ptr) % 16 == 0 for a in ws), "hx_load_raw<true> needs 16-byte aligned super-blocks"
    xd, rd, gd = cp.asarray(x), cp.asarray(r), cp.asarray(g)
    s = cp.empty(k, cp.float32)
    layout = layout_for("Q4_K")
    xq = cp.zeros(output_shape(1, k, layout), cp.uint8)
    norm = AddRmsNormQ8_1Launch(1, k, EPS, layout)
    matvec = MatVecLaunch("Q4_K", n, k, 1, rpb, nwarps)
    outs = [cp.empty((1, n), cp.float32) for _ in range(steps)]
    grid, block, shared = ((n + rpb - 1) // rpb,), (32, nwarps), 4 * (nwarps - 1) * (rpb + 1) * 32

    def pair(i):
        norm(xd[None], rd[None], gd, s[None], xq)
        matvec(ws[i], xq, outs[i])

    def alone(i):
        matvec(ws[i], xq, outs[i])

    def fused(i):
        inline(grid, block, (ws[i], xd, rd, gd, s, outs[i], np.int32(n), np.float32(EPS)), shared_mem=shared)

    want = reference(w0, x, r, g)
    pair(0)
    base_err = relative_error(outs[0].get()[0], want)
    fused(0)
    inline_err = relative_error(outs[0].get()[0], want)
    if not np.array_equal(s.get(), x + r):
        raise RuntimeError(f"{label}: the inline kernel's s != x + r")
    if not inline_err <= 2 * base_err + 1e-4:
        raise RuntimeError(f"{label}: inline rows off the reference by {inline_err:.2e} (the library's pair "
                           f"{base_err:.2e})")
    row = {"shape": label, "k": k, "n": n, "rows_per_block": rpb, "nwarps": nwarps, "steps": steps,
           "error_library_pair": base_err, "error_inline": inline_err,
           "inline_registers": int(inline.num_regs), "inline_local_bytes": int(inline.local_size_bytes)}
    stream = cp.cuda.Stream(non_blocking=True)
    for name, step in (("norm launch + mat-vec", pair), ("mat-vec alone", alone), ("inline", fused)):
        graph = capture_chain(stream, step, steps)
        graph.launch(stream)
        row[f"us_a_step {name}"] = 1e6 * min(replay_seconds(graph, stream, replays)) / steps
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=56, help="dependent steps a chain (the 0.6B pass has 56 norms)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from benchlib import device_name, write_rows_json
    from hiraishin.kernels.compile import cupy_available

    if not cupy_available():
        ap.error("needs CuPy and a CUDA GPU (the kernel's CPU check is tests/test_proto_inline_norm.py)")

    rows = []
    for label, k, n in SHAPES:
        row = time_shape(label, k, n, args.steps, args.replays)
        rows.append(row)
        print(f"{label}: norm launch + mat-vec {row['us_a_step norm launch + mat-vec']:.2f} us, mat-vec alone "
              f"{row['us_a_step mat-vec alone']:.2f}, inline {row['us_a_step inline']:.2f} us a step "
              f"(errors {row['error_library_pair']:.1e} / {row['error_inline']:.1e}; "
              f"{row['inline_registers']} registers, {row['inline_local_bytes']} local bytes)", flush=True)
    if args.json:
        import cupy

        write_rows_json(args.json, rows, command=" ".join(sys.argv), device=device_name(cupy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
