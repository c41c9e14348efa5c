"""Launch the mat-vec and quantize kernels on small inputs, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 3 python bench/sanitize_mmvq.py

The CuPy memory pool is switched off so every array is its own cudaMalloc: a read past the end
of a weight, of the q8_1 activations (in either layout) or a write past the output shows up.
Weights come exactly sized and also 2 or 4 bytes into a buffer (the narrow-load paths); row
lengths that nwarps does not divide exercise the unrolled loop's tail step. Each result is
checked against the emulator too.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import cupy as cp

    from hiraishin.kernels.mmvq import emulate_mmvq, mul_mat, mul_mat_vec, random_weights
    from hiraishin.kernels.quantize_q8_1 import quantize_q8_1
    from hiraishin.order import ReductionOrder

    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(0)
    failures = 0
    launches = 0
    for qtype, k in (("Q4_K", 2560), ("Q6_K", 2560), ("Q6_K", 4096), ("Q8_0", 1312)):
        n = 37
        w = random_weights(qtype, n, k, seed=1)
        x = (rng.standard_normal((9, k)) * 2).astype(np.float32)
        xq = quantize_q8_1(x)
        for shift in (0, 4 if qtype == "Q4_K" else 2):
            buf = cp.empty(w.nbytes + shift, dtype=cp.uint8)  # exactly sized after the shift
            wg = buf[shift:].reshape(w.shape)
            wg[...] = cp.asarray(w)
            for nwarps, rows, width in ((4, 1, 1), (4, 2, 1), (4, 2, 5), (2, 2, 8), (3, 4, 3), (1, 1, 2)):
                plan = ReductionOrder.custom(nwarps=nwarps, rows_per_block=rows).matvec_plan(width, qtype)
                got = cp.asnumpy(mul_mat_vec(wg, qtype, cp.asarray(xq[:width]), plan, "cuda"))
                launches += len(plan.launches())
                want = emulate_mmvq(w, qtype, xq[:width], nwarps)
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    failures += 1
                    print(f"MISMATCH {qtype} K={k} shift={shift} nwarps={nwarps} rows={rows} width={width}")
            for order in (ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT):
                got = cp.asnumpy(mul_mat(wg, qtype, cp.asarray(x), order, "cuda"))  # quantize-in-layout path
                want = mul_mat(w, qtype, x, order, "cpu")
                launches += 2
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    failures += 1
                    print(f"MISMATCH mul_mat {qtype} K={k} shift={shift} {order.name}")
    cp.cuda.runtime.deviceSynchronize()
    print(f"{launches} mat-vec launches, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
