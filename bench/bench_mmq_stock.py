"""Benchmark the stock MMQ kernel (hiraishin/kernels/mmq_stock): BATCH_VARIANT's path past 8 columns.

    python bench/bench_mmq_stock.py [--out DIR] [--reps 20] [--batches 5] [--sweep]

For the Qwen3-8B shapes (Q4_K 4096->4096, 4096->1024, 4096->12288; Q6_K 12288->4096,
4096->151936) and widths 9, 12, 16, 64, 512: the stock MMQ kernel's bits are first compared with
its Numba emulator (rows 0..129 and the last 40), then timed beside the old tiled dp4a kernel
(the variant's wide path before) and BATCH_VARIANT's one column (dp4a mat-vec): median over
batches of CUDA-event timed runs of ``--reps`` back-to-back launches (fewer for slow kernels), a
spin kernel hiding the host, weights rotated through copies of together >= 4x the L2 (the stock
kernel does upstream's fixup inside its one launch). Prints us, GB/s (weight + activation bytes),
the ratio to the variant's one column and the speed-up over the tiled kernel. ``--sweep``: launch facts (warps per
CUDA block, columns per warp; same bits) at 16 and 512 columns. ``--out DIR``: bench_mmq_stock.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (
    QWEN3_8B_MATVECS,
    git_commit,
    median_event_time,
    rotating_copies,
    timing_setup,
)

SHAPES = QWEN3_8B_MATVECS
WIDTHS = [9, 12, 16, 64, 512]
SLOW_S = 2e-3  # a first call slower than this is timed with 3 reps per batch


def _rotating(ws, launch, *args):
    """fn(i): ``launch`` on the i-th weight copy (round robin) and ``args``."""
    return lambda i: launch(ws[i % len(ws)], *args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-tiled", action="store_true", help="skip the old tiled kernel")
    args = ap.parse_args(argv)

    import cupy as cp

    from hiraishin.kernels import quantize, tiled
    from hiraishin.kernels.mmq_stock import emulate
    from hiraishin.kernels.mmq_stock.launch import MMQStockLaunch
    from hiraishin.kernels.mmvq.launch import launch as mmvq_launch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for
    from hiraishin.order import ReductionOrder
    from hiraishin.plans import matvec_plan
    from hiraishin.plans.matvec import TILE_ROWS, TILE_THREADS, MatVecPlan
    from hiraishin.quant import random_blocks

    props, dev_name, l2, spin, cycles = timing_setup(cp)
    print(f"device {dev_name}, {props['multiProcessorCount']} SMs")
    VAR = ReductionOrder.BATCH_VARIANT

    def timed(fn):
        for i in range(2):
            fn(i)
        t0 = median_event_time(cp, fn, 1, 1, spin, cycles)
        reps = 3 if t0 > SLOW_S else args.reps
        return median_event_time(cp, fn, reps, args.batches, spin, cycles)

    rng = np.random.default_rng(0)
    results = []
    for label, qtype, k, n in SHAPES:
        w_host = random_blocks(qtype, n, k, seed=1)
        w_bytes = w_host.nbytes
        x_host = rng.standard_normal((max(WIDTHS), k)).astype(np.float32)
        xq_host = quantize.emulate(x_host)
        ws = rotating_copies(cp, w_host, l2)
        x = cp.asarray(x_host)
        xq = cp.empty((x.shape[0], k // 32 * 36), dtype=cp.uint8)
        quantize.launch(x, xq)
        print(f"\n{label} {qtype}: {w_bytes / 1e6:.1f} MB, {len(ws)} rotating copies")
        print(f"{'kernel':>12} {'cols':>4} {'us':>9} {'GB/s':>6} {'x var 1':>8} {'tiled/stock':>11} bits")

        vplan = matvec_plan(VAR, 1, qtype)
        lay = layout_for(qtype)
        y = cp.empty(output_shape(1, k, lay), dtype=cp.uint8)
        quantize.launch(x[:1], y, lay)
        vout = cp.empty((1, n), dtype=cp.float32)
        t_var = timed(_rotating(ws, mmvq_launch, qtype, y, vplan, vout))
        results.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel="variant-mmvq", ncols=1,
                            time_us=t_var * 1e6, gb_per_s=(w_bytes + y.nbytes) / t_var / 1e9))
        print(f"{'variant mmvq':>12} {1:>4} {t_var * 1e6:>9.1f} {(w_bytes + y.nbytes) / t_var / 1e9:>6.0f} {1.0:>8.2f}")

        def check(out, plan, wd, n=n, qtype=qtype, w_host=w_host, xq_host=xq_host):
            got = cp.asnumpy(out)
            ok = True
            for a, b in ((0, min(n, 130)), (max(0, n - 40), n)):
                ref = emulate(w_host[a:b], qtype, xq_host[:wd], plan, row0=a)
                ok &= bool(np.array_equal(got[:, a:b].view(np.uint32), ref.view(np.uint32)))
            return ok

        for wd in WIDTHS:
            plan = matvec_plan(VAR, wd, qtype, k=k, n=n)
            lw = MMQStockLaunch(plan)
            out = cp.empty((wd, n), dtype=cp.float32)
            lw(ws[0], xq[:wd], out)
            equal = check(out, plan, wd)
            sec = timed(_rotating(ws, lw, xq[:wd], out))
            t_tiled = None
            if not args.no_tiled:
                tplan = MatVecPlan(kernel="tiled", qtype=qtype, nwarps=TILE_THREADS // 32, rows_per_block=TILE_ROWS,
                                   cols_per_launch=wd, ncols=wd)
                tout = cp.empty((wd, n), dtype=cp.float32)
                t_tiled = timed(_rotating(ws, tiled.launch, qtype, xq[:wd], tplan, tout))
            bw = (w_bytes + wd * xq.shape[1]) / sec
            results.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel="mmq_stock", ncols=wd, time_us=sec * 1e6,
                                gb_per_s=bw / 1e9, ratio_to_variant_one_col=sec / t_var,
                                tiled_time_us=None if t_tiled is None else t_tiled * 1e6,
                                speedup_over_tiled=None if t_tiled is None else t_tiled / sec,
                                bits_equal_emulator=equal, tile_cols=plan.tile_cols, grid=plan.grid,
                                pieces=sorted({len(p) for p in plan.pieces()}), nwarps=plan.nwarps,
                                cols_per_warp=plan.cols_per_warp, num_regs=int(lw.kernel.num_regs),
                                spill_bytes=int(lw.kernel.local_size_bytes)))
            print(f"{'mmq_stock':>12} {wd:>4} {sec * 1e6:>9.1f} {bw / 1e9:>6.0f} {sec / t_var:>8.2f} "
                  f"{'' if t_tiled is None else f'{t_tiled / sec:.1f}x':>11} {'equal' if equal else 'DIFFER'}"
                  f"  (tiled {'' if t_tiled is None else f'{t_tiled * 1e6:.1f}'} us; J={plan.tile_cols} "
                  f"grid={plan.grid} pieces={sorted({len(p) for p in plan.pieces()})})")
            if args.sweep and wd in (16, 512):
                for nw in (2, 4, 8):
                    for cpw in ((16,) if wd == 16 else (16, 32)):
                        sp = dataclasses.replace(plan, nwarps=nw, cols_per_warp=cpw)
                        sl = MMQStockLaunch(sp)
                        sl(ws[0], xq[:wd], out)
                        eq = check(out, sp, wd)
                        s2 = timed(_rotating(ws, sl, xq[:wd], out))
                        results.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel="sweep-mmq_stock", ncols=wd,
                                            nwarps=nw, cols_per_warp=cpw, time_us=s2 * 1e6,
                                            num_regs=int(sl.kernel.num_regs), bits_equal_emulator=eq))
                        print(f"   sweep {wd:>3} cols nwarps {nw} cols/warp {cpw}: {s2 * 1e6:9.1f} us "
                              f"regs {int(sl.kernel.num_regs)} {'equal' if eq else 'DIFFER'}")
        del ws, x, xq
        cp.get_default_memory_pool().free_all_blocks()

    all_equal = all(r.get("bits_equal_emulator", True) for r in results)
    print(f"\nbits equal to the emulator everywhere: {all_equal}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_mmq_stock.json"), "w") as f:
            json.dump(dict(device=dev_name, sm_count=int(props["multiProcessorCount"]),
                           date=_dt.datetime.now(_dt.timezone.utc).isoformat(), commit=git_commit(),
                           host=platform.node(), command=" ".join(sys.argv), reps=args.reps,
                           batches=args.batches, results=results, all_bits_equal=all_equal), f, indent=1)
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
