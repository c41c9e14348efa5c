"""Launch the one-column mat-vec a few times for Nsight Compute (``ncu``) to profile.

Run on a GPU, e.g.::

    ncu --clock-control none --kernel-name mmvq --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats python3 bench/ncu_mmvq.py Q6_K 151936 4096

Arguments: qtype, rows, K, columns (defaults: the Qwen3-8B output head, Q6_K 151936 x 4096,
one column). More than one column runs the invariant geometry with every column in one launch.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import VALIDATE_ROWS, assert_same_bits, git_commit  # noqa: E402


def main(argv=None) -> None:
    import cupy as cp

    from hiraishin.backends import get_backend
    from hiraishin.order import ReductionOrder
    from hiraishin.plans import matvec_plan
    from hiraishin.quant import random_blocks as random_weights

    cuda, cpu = get_backend("cuda"), get_backend("cpu")

    args = (argv if argv is not None else sys.argv[1:]) or ["Q6_K", "151936", "4096"]
    qtype, n, k = args[0], int(args[1]), int(args[2])
    ncols = int(args[3]) if len(args) > 3 else 1
    w_host = random_weights(qtype, n, k, seed=0)
    w = cp.asarray(w_host)
    x = cp.asarray(np.random.default_rng(1).standard_normal((ncols, k)).astype(np.float32))
    xq = cuda.quantize_q8_1(x).copy()  # (a copy: small passes get a reused scratch buffer)
    plan = matvec_plan(ReductionOrder.custom(name="invariant16", max_cols_per_launch=16), ncols, qtype)
    # the bits first (these launches are profiled): GPU vs the emulator on the first rows
    got = cp.asnumpy(cuda.mul_mat_q8_1(w, qtype, xq, plan))[:, :VALIDATE_ROWS]
    assert_same_bits(f"{qtype} {n}x{k} ncols={ncols}", got,
                     cpu.mul_mat_q8_1(w_host[:VALIDATE_ROWS], qtype, cp.asnumpy(xq), plan))
    for _ in range(4):
        cuda.mul_mat_q8_1(w, qtype, xq, plan)
    cp.cuda.get_current_stream().synchronize()
    print(f"commit {git_commit()}")
    print(f"{qtype} {n}x{k}: {plan.describe()}")


if __name__ == "__main__":
    main()
