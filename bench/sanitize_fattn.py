"""Launch every flash attention kernel once on small inputs, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 3 python bench/sanitize_fattn.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python bench/sanitize_fattn.py

The CuPy memory pool is switched off so every array is its own cudaMalloc and an out-of-bounds
read past the cache shows up; the caches hold exactly ``kv_len`` cells while the kernels walk a
padded range, odd query counts leave the second query of a 2-query block (and most of an 8-query
tile, and the tail of the last fattn_vec_shared block) empty. Each result is also checked against the emulator.
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
    from hiraishin.plans import AttentionPlan

    print(f"commit {git_commit()}")
    cuda, cpu = get_backend("cuda"), get_backend("cpu")

    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(0)
    cases = [
        # plan, n_head, n_head_kv, T, kv_len, head_dim
        (AttentionPlan("vec", 1, 1, kv_attended=256), 4, 2, 1, 200, 128),
        (AttentionPlan("vec", 1, 3, kv_attended=512), 4, 2, 2, 300, 128),
        (AttentionPlan("vec", 2, 2, kv_attended=256), 4, 1, 3, 130, 128),
        (AttentionPlan("vec", 2, 3, chunk_cells=256, split_cells=256, kv_attended=768), 4, 4, 5, 700, 128),
        (AttentionPlan("tile", 8, 1, chunk_cells=64, split_cells=256, kv_attended=256), 4, 2, 3, 100, 128),
        (AttentionPlan("tile", 8, 3, chunk_cells=64, split_cells=128, kv_attended=384), 4, 2, 9, 333, 128),
        (AttentionPlan("vec", 1, 2, kv_attended=256), 2, 1, 1, 256, 64),
        (AttentionPlan("vec", 2, 1, kv_attended=256), 2, 1, 3, 77, 64),
        (AttentionPlan("tile", 8, 2, chunk_cells=64, split_cells=128, kv_attended=256), 2, 1, 2, 150, 64),
        # fattn_vec_shared at the edges: T = 1 and 16, KV 1, 127, 128, 129, 256; a last block with missing
        # queries; an empty parallel block
        (AttentionPlan("vec", 4, 2, kv_attended=256, shared_kv=True), 8, 2, 1, 1, 128),
        (AttentionPlan("vec", 8, 2, kv_attended=256, shared_kv=True), 8, 2, 16, 127, 128),
        (AttentionPlan("vec", 8, 1, kv_attended=256, shared_kv=True), 32, 8, 16, 128, 128),
        (AttentionPlan("vec", 2, 2, kv_attended=256, shared_kv=True), 4, 4, 3, 129, 128),
        (AttentionPlan("vec", 8, 3, kv_attended=512, shared_kv=True), 6, 2, 16, 256, 128),
        (AttentionPlan("vec", 8, 2, chunk_cells=256, split_cells=256, kv_attended=512, shared_kv=True), 8, 1, 16,
         257, 64),
        (AttentionPlan("vec", 4, 1, kv_attended=256, shared_kv=True), 2, 1, 1, 1, 64),
        (AttentionPlan("vec", 8, 2, kv_attended=256, shared_kv=True), 4, 1, 16, 129, 64),
    ]
    failures = 0
    for base, H, Hkv, T, kv_len, D in cases:
        plan = AttentionPlan(**{**base.__dict__, "kv_len": kv_len, "head_dim": D})
        q = rng.standard_normal((T, H, D)).astype(np.float32)
        k = rng.standard_normal((kv_len, Hkv, D)).astype(np.float16)
        v = rng.standard_normal((kv_len, Hkv, D)).astype(np.float16)
        q_pos = np.arange(kv_len - T, kv_len, dtype=np.int32)
        got = cuda.flash_attn(cp.asarray(q), cp.asarray(k), cp.asarray(v), q_pos, plan)
        cp.cuda.Device().synchronize()
        want = cpu.flash_attn(q, k, v, q_pos, plan)
        same = np.array_equal(got.get().view(np.uint32), want.view(np.uint32))
        failures += not same
        print(f"{plan.kernel_name:13s} Q/block={plan.queries_per_block} P={plan.parallel_blocks} T={T} kv_len={kv_len} D={D}: "
              f"{'bit-exact' if same else 'MISMATCH vs emulator'}", flush=True)
    print("done" if not failures else f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
