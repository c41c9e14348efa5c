"""Would a super-block order pay? Time the sub-block MMA kernel against a prototype of one (GPU).

    python3 bench/proto_superblock.py [--widths 1,4,8,9,16] [--json FILE]

The sub-block order (SUBBLOCK) does its float operations once per (row, column, 32-value sub-block): at
9-16 columns that epilogue, not the MMAs or DRAM, is what each extra n-tile costs (bench/NOTES_speculation.md,
sessions 11-16). A super-block order on q8_K-like activations (one scale per 256 values, integer sub-block
sums) would move that work into integers and run its float operations once per super-block. Before such an
order is built (activation format, quantizers, emulator, plans, tests), ``mmq.cu``'s ``HX_PROTO_SUPER``
prototype times the change inside the library's own kernel and launch facts, reading the library's q8_1
bytes (one ds word per super-block as its scale, the high half as an integer sum):

* ``proto1``: each sub-block's integer dot product scaled by its 6-bit scale and min in integers (Q6_K: its
  16-value scales, as now), summed over the super-block; the float operations at its end;
* ``proto2`` (Q4_K): the scales folded into the A fragments (q * (sc >> 3), q * (sc & 7), and rows of the min),
  so three MMAs accumulate the super-block and nothing runs per element until its end.

two diagnostics of the second n-tile at 9-16 columns (``mmq.cu`` ``HX_DIAG``): ``diag1`` without its
activation loads (it reuses the first n-tile's registers), ``diag2`` with its loads but without its MMAs and
float work (at 1-8 columns both are the library's launch); and exact launches of the sub-block order itself with
two row tiles of 16 per warp at 9-16 columns (``mt2``: the activation loads of a super-block serve 32 rows;
``wjp``: Q4_K rows' ints loaded per sub-block pair, ``mmq.cu`` ``HX_WJP``; ``cap``: compiled for 128 registers,
spills allowed, instead of the library's rule of relaxing the cap until nothing spills).

The prototype's outputs are not any order's (only their time means something); the library's launch is checked
against the emulator as ``tune_mmq.py`` does. Weights rotate through copies of >= 4x the L2; times are CUDA
events over back-to-back launches (``benchlib.median_event_time``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import QWEN3_8B_MATVECS, median_event_time, subblock_case, timing_setup, write_rows_json  # noqa: E402

SHAPES = QWEN3_8B_MATVECS + [("ffn_down (Q4_K layers) 12288->4096", "Q4_K", 12288, 4096)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="1,4,8,9,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--json", help="write every time here")
    ap.add_argument("--variants", default="proto1,proto2,diag1,diag2",
                    help="beside the library: proto1, proto2, diag1, diag2, mt2, mt2cap, mt2wjp, mt2wjpcap")
    ap.add_argument("--q4k-only", action="store_true", help="the variants on the Q4_K shapes only")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]

    import cupy as cp

    from hiraishin.kernels.compile import get_kernel, precompile, relax_register_cap
    from hiraishin.kernels.mmq.launch import SOURCE, MMQLaunch, kernel_defines
    from hiraishin.plans.subblock import subblock_plan

    _, dev_name, l2, spin, cycles = timing_setup(cp)

    def variant_plan(wd, qtype, k, n, v):
        plan = subblock_plan(wd, qtype, k, n=n)
        if v.startswith("mt2") and plan.kernel == "mma" and plan.cols_per_block == 16:
            plan = dataclasses.replace(plan, tile_rows=32)
        return plan

    def variant_defines(plan, v):
        d = kernel_defines(plan)
        if v.startswith("mt2") and plan.tile_rows == 32:
            d.update(HX_WJP=int("wjp" in v and plan.qtype == "Q4_K"))
            if v.endswith("cap"):
                d.update(HX_MIN_BLOCKS=2)  # 128 registers for 8 warps, spills allowed
        if v.startswith("proto"):
            d.update(HX_PROTO_SUPER=int(v[-1]), HX_LIVE=0, HX_PREFETCH_X=0)
        elif v.startswith("diag") and d["HX_NT"] == 2:
            d.update(HX_DIAG=int(v[-1]))
        return d

    variants = {label: (["library"] + args.variants.split(",")) if qtype == "Q4_K" or not args.q4k_only
                else ["library"] for label, qtype, _, _ in SHAPES}
    variants = {label: [v for v in vs if v != "proto2" or qtype == "Q4_K"] for (label, qtype, _, _), vs
                in zip(SHAPES, variants.values())}
    jobs = [(SOURCE, variant_defines(variant_plan(wd, qtype, k, n, v), v))
            for label, qtype, k, n in SHAPES for v in variants[label] for wd in widths]
    print(f"device {dev_name}; compiling {len(jobs)} kernels", flush=True)
    precompile(jobs)

    rng = np.random.default_rng(0)
    rows_out = []
    for label, qtype, k, n in SHAPES:
        rows, ref, ws, x, acts, _ = subblock_case(cp, rng, qtype, k, n, max(widths), l2)
        line = {}
        for v in variants[label]:
            proto = v.startswith(("proto", "diag"))  # outputs of no order
            per = {}
            for wd in widths:
                plan = variant_plan(wd, qtype, k, n, v)
                launch = MMQLaunch(n, plan)
                if v.endswith("cap") and plan.tile_rows == 32:
                    launch.kernel = get_kernel(SOURCE, "hx_mmq", variant_defines(plan, v))
                elif v != "library":
                    def compile_spills(d):
                        kern = get_kernel(SOURCE, "hx_mmq", d)
                        return kern, int(kern.local_size_bytes)
                    launch.kernel, _ = relax_register_cap(variant_defines(plan, v), compile_spills)
                out = cp.empty((wd, n), dtype=cp.float32)
                xq = acts(wd, launch.layout)
                launch(ws[0], xq, out)
                equal = bool(np.array_equal(cp.asnumpy(out)[:, rows].view(np.uint32), ref[:wd].view(np.uint32)))
                fn = (lambda i, lw=launch, o=out, xq=xq: lw(ws[i % len(ws)], xq, o))
                for i in range(3):
                    fn(i)
                us = median_event_time(cp, fn, args.reps, args.batches, spin, cycles) * 1e6
                per[wd] = us
                rows_out.append(dict(shape=label, qtype=qtype, k=k, n=n, variant=v, width=wd, us=us,
                                     num_regs=int(launch.kernel.num_regs),
                                     spill_bytes=int(launch.kernel.local_size_bytes),
                                     bits_equal_emulator=equal if not proto else None))
                if not proto and not equal:
                    print(f"  {label} {wd} columns: {v} DIFFERS from the emulator", flush=True)
            line[v] = per
        print(f"\n{label}", flush=True)
        for v, per in line.items():
            rel = " ".join(f"{wd}:{t:7.1f}" for wd, t in per.items())
            ratio = " ".join(f"{wd}:{t / line['library'][wd]:.2f}" for wd, t in per.items())
            print(f"  {v:<8} us {rel}   / library {ratio}", flush=True)
        del ws, x, acts
        cp.get_default_memory_pool().free_all_blocks()

    if args.json:
        write_rows_json(args.json, rows_out, device=dev_name, widths=widths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
