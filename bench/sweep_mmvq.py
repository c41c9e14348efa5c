"""Sweep mat-vec launch variants that keep every output's bits (GPU; a tuning tool).

    python bench/sweep_mmvq.py [--out DIR] [--shapes 0,2,3] [--one-col 1:4,2:4] [--multi 9:5+4:2:2]

For Qwen3-8B shapes it times the mmvq kernel with the per-column geometry fixed
(nwarps 4, the one-column table entry) while varying what cannot change a
result: rows per CUDA block, columns per launch, the loop unroll (HX_UNROLL) and, for
Q6_K, where the "- 32" of the 6-bit values is applied (HX_Q6_SUB_IN_DOT). Each variant's
output is compared bit for bit with the first variant of its column count. (Kernel
variants tried this way and dropped are in bench/NOTES_mmvq.md.) Prints one line per
variant; ``--out`` writes ``sweep_mmvq.json``. Before any timing, every variant's output (first
rows) is checked bit for bit against the CPU emulator (and the q8_1 activations too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mmvq import SHAPES, copy_bandwidth  # noqa: E402
from benchlib import (VALIDATE_ROWS, assert_same_bits, git_commit, median_event_time,  # noqa: E402
                      rotating_copies, spin_cycles, spin_kernel)

NWARPS = 4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="0,2,3,4")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--one-col", default="1:1,1:4,2:1,2:2,2:4",
                    help="rows:unroll[:min blocks per SM] variants for one column (no min blocks: the library's)")
    ap.add_argument("--multi", default="9:5+4:2:2,9:5+4:1:2,9:5+4:2:1,9:9:2:2,9:9:1:1,16:8+8:2:2",
                    help="ncols:launch split:rows:unroll[:min blocks per SM] variants")
    ap.add_argument("--q6-sub", default="", help="also run Q6_K with HX_Q6_SUB_IN_DOT forced to 0 and 1")
    args = ap.parse_args(argv)

    import cupy as cp

    from hiraishin.backends import get_backend
    from hiraishin.kernels import mmvq, quantize
    from hiraishin.kernels.compile import get_kernel, kernel_attributes
    from hiraishin.kernels.mmvq.launch import SOURCE as MMVQ_SOURCE
    from hiraishin.kernels.mmvq.launch import kernel_defines
    from hiraishin.kernels.quantize.layout import layout_for
    from hiraishin.plans import MatVecPlan
    from hiraishin.plans.matvec import MATVEC_TRAITS
    from hiraishin.quant import random_blocks as random_weights

    cuda = get_backend("cuda")
    commit = git_commit()
    print(f"commit {commit}")

    t0 = time.time()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    l2 = int(props.get("l2CacheSize", 60 * 2**20)) or 60 * 2**20
    spin = spin_kernel(cp)
    cycles = spin_cycles(cp, 3e-3)
    bw_copy, _ = copy_bandwidth(cp, 1 << 30, 10, args.batches, spin, cycles)
    print(f"copy bandwidth {bw_copy / 1e9:.0f} GB/s")

    variants = []
    for v in args.one_col.split(","):
        rows, unroll, *minb = v.split(":")
        variants.append((1, [1], int(rows), int(unroll), int(minb[0]) if minb else None))
    for m in args.multi.split(","):
        nc, split, rows, unroll, *minb = m.split(":")
        variants.append((int(nc), [int(s) for s in split.split("+")], int(rows), int(unroll),
                         int(minb[0]) if minb else None))

    records = []
    rng = np.random.default_rng(0)
    for si in [int(s) for s in args.shapes.split(",")]:
        label, qtype, k, n = SHAPES[si]
        t = MATVEC_TRAITS[qtype]
        w_host = random_weights(qtype, n, k, seed=1)
        wbytes = w_host.nbytes
        ws = rotating_copies(cp, w_host, l2)
        ncopies = len(ws)
        w_check = w_host[:VALIDATE_ROWS].copy()
        del w_host
        x_host = rng.standard_normal((16, k)).astype(np.float32)
        # the kernel's own activation layout, written by the quantize kernel (a copy: a reused scratch buffer)
        xq = cuda.quantize_q8_1(cp.asarray(x_host), layout_for(qtype)).copy()
        xq_check = quantize.emulate(x_host)  # llama.cpp's layout, what the emulator reads
        assert_same_bits(f"{label} quantize_q8_1 layout={layout_for(qtype)}", cp.asnumpy(xq),
                         quantize.emulate(x_host, layout_for(qtype)))
        emu = {}  # ncols -> the emulator's first rows (nwarps fixed: every variant must give these bits)
        reps = args.reps if wbytes < 100e6 else max(3, args.reps // 4)
        ref = {}
        base_t = {}
        print(f"\n{label} {qtype}: {wbytes / 1e6:.1f} MB")
        subs = [None] + ([0, 1] if args.q6_sub and qtype == "Q6_K" else [])
        for (ncols, split, rows, unroll, minb), sub in [(v, sub) for v in variants for sub in subs]:
            if max(split) * rows > 32:
                continue
            out = cp.empty((ncols, n), dtype=cp.float32)
            calls = []
            start = 0
            attrs = None
            for count in split:
                defines = kernel_defines(qtype, count, rows, NWARPS, k // t.qk, unroll, minb)
                if sub is not None:
                    defines["HX_Q6_SUB_IN_DOT"] = sub
                kern = get_kernel(MMVQ_SOURCE, "mmvq", defines)
                attrs = kernel_attributes(kern)
                calls.append((kern, start, count))
                start += count

            def fn(i, calls=calls, rows=rows, out=out):
                w = ws[i % ncopies]
                for kern, s, c in calls:
                    kern(((n + rows - 1) // rows, 1, 1), (32, NWARPS, 1),
                         (w, xq[s:s + c], out[s:s + c], np.int32(n), np.int64(n)),
                         shared_mem=(NWARPS - 1) * c * rows * 128)
            fn(0)
            got = cp.asnumpy(out).view(np.uint32)
            if ncols not in emu:
                plan = MatVecPlan("mmvq", qtype, nwarps=NWARPS, rows_per_block=1, cols_per_launch=1, ncols=ncols)
                emu[ncols] = mmvq.emulate(w_check, qtype, xq_check[:ncols], plan)
            assert_same_bits(f"{label} cols {ncols} split {split} rows {rows} unroll {unroll} sub {sub}",
                             got[:, :VALIDATE_ROWS].view(np.float32), emu[ncols])
            same = None
            if ncols not in ref:
                ref[ncols] = got
            else:
                same = bool(np.array_equal(ref[ncols], got))
            sec = median_event_time(cp, fn, reps, args.batches, spin, cycles)
            if ncols == 1 and 1 not in base_t:
                base_t[1] = sec
            frac = (wbytes + ncols * xq.shape[1]) / sec / bw_copy
            rec = dict(shape=label, qtype=qtype, ncols=ncols, split=split, rows=rows, unroll=unroll, q6_sub=sub,
                       min_blocks=defines["HX_MIN_BLOCKS"],
                       time_us=sec * 1e6, fraction_of_copy=frac, ratio_to_first_one_col=sec / base_t[1],
                       bits_equal_first=same, num_regs=attrs["num_regs"], spill=attrs["local_size_bytes"])
            records.append(rec)
            print(f"  cols {ncols:2d} split {'+'.join(map(str, split)):>5} rows {rows} unroll {unroll}"
                  f"{'' if sub is None else f' sub {sub}'}{f' minblocks {minb}' if minb else ''}: "
                  f"{sec * 1e6:8.1f} us {frac:6.1%} of copy  x{sec / base_t[1]:.2f}  regs {attrs['num_regs']}"
                  f" spill {attrs['local_size_bytes']} bits {'ref' if same is None else same}")
        ws = xq = None  # released before the next shape's copies
        cp.get_default_memory_pool().free_all_blocks()
    print(f"sweep took {time.time() - t0:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sweep_mmvq.json"), "w") as f:
            json.dump(dict(commit=commit, validated_rows=VALIDATE_ROWS, copy_bytes_per_s=bw_copy,
                           records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
