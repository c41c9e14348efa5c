"""Launch the mat-vec and quantize kernels on small inputs, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 3 python bench/sanitize_mmvq.py

The CuPy memory pool is switched off so every array is its own cudaMalloc: a read past the end
of a weight, of the q8_1 activations (in either layout) or a write past the output shows up.
Weights come exactly sized and also 2 or 4 bytes into a buffer (the narrow-load paths); row
lengths that nwarps does not divide exercise the unrolled loop's tail step. Each result is
checked against the emulator too.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import git_commit  # noqa: E402


def main() -> int:
    import cupy as cp

    from hiraishin.backends import get_backend
    from hiraishin.kernels import mmvq, quantize
    from hiraishin.order import ReductionOrder
    from hiraishin.plans import matvec_plan
    from hiraishin.quant import random_blocks as random_weights

    print(f"commit {git_commit()}")
    cuda, cpu = get_backend("cuda"), get_backend("cpu")

    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(0)
    failures = 0
    launches = 0
    for qtype, k in (("Q4_K", 2560), ("Q6_K", 2560), ("Q6_K", 4096), ("Q8_0", 1312)):
        n = 37
        w = random_weights(qtype, n, k, seed=1)
        x = (rng.standard_normal((9, k)) * 2).astype(np.float32)
        xq = quantize.emulate(x)
        for shift in (0, 4 if qtype == "Q4_K" else 2):
            buf = cp.empty(w.nbytes + shift, dtype=cp.uint8)  # exactly sized after the shift
            wg = buf[shift:].reshape(w.shape)
            wg[...] = cp.asarray(w)
            for nwarps, rows, width in ((4, 1, 1), (4, 2, 1), (4, 2, 5), (2, 2, 8), (3, 4, 3), (1, 1, 2)):
                plan = matvec_plan(ReductionOrder.custom(nwarps=nwarps, rows_per_block=rows), width, qtype)
                got = cp.asnumpy(cuda.mul_mat_q8_1(wg, qtype, cp.asarray(xq[:width]), plan))
                launches += len(plan.launches())
                want = mmvq.emulate(w, qtype, xq[:width], plan)  # (only plan.nwarps changes bits)
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    failures += 1
                    print(f"MISMATCH {qtype} K={k} shift={shift} nwarps={nwarps} rows={rows} width={width}")
            for order in (ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT):
                got = cp.asnumpy(cuda.mul_mat(wg, qtype, cp.asarray(x), order))  # quantize-in-layout path
                want = cpu.mul_mat(w, qtype, x, order)
                launches += 2
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    failures += 1
                    print(f"MISMATCH mul_mat {qtype} K={k} shift={shift} {order.name}")
    cp.cuda.runtime.deviceSynchronize()
    print(f"{launches} mat-vec launches, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
