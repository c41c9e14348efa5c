"""Launch the one-column mat-vec a few times for Nsight Compute (``ncu``) to profile.

Run on a GPU, e.g.::

    ncu --clock-control none --kernel-name mmvq --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats python3 bench/ncu_mmvq.py Q6_K 151936 4096

Arguments: qtype, rows, K, columns (defaults: the Qwen3-8B output head, Q6_K 151936 x 4096,
one column). More than one column runs the invariant geometry with every column in one launch.
"""

from __future__ import annotations

import sys

import numpy as np


def main(argv=None) -> None:
    import cupy as cp

    from hiraishin.kernels.mmvq import mul_mat_vec, random_weights
    from hiraishin.kernels.quantize_q8_1 import quantize_q8_1
    from hiraishin.order import ReductionOrder

    args = (argv if argv is not None else sys.argv[1:]) or ["Q6_K", "151936", "4096"]
    qtype, n, k = args[0], int(args[1]), int(args[2])
    ncols = int(args[3]) if len(args) > 3 else 1
    w = cp.asarray(random_weights(qtype, n, k, seed=0))
    x = cp.asarray(np.random.default_rng(1).standard_normal((ncols, k)).astype(np.float32))
    xq = quantize_q8_1(x, "cuda")
    plan = ReductionOrder.custom(name="invariant16", max_cols_per_launch=16).matvec_plan(ncols, qtype)
    for _ in range(4):
        mul_mat_vec(w, qtype, xq, plan, "cuda")
    cp.cuda.get_current_stream().synchronize()
    print(f"{qtype} {n}x{k}: {plan.describe()}")


if __name__ == "__main__":
    main()
