"""Benchmark the sub-block order kernels (hiraishin/kernels/mmq) against BATCH_VARIANT's one column.

    python bench/bench_mmq.py [--out DIR] [--reps 20] [--batches 7] [--all-orders] [--sweep]

For the Qwen3-8B shapes (Q4_K 4096->4096, 4096->1024, 4096->12288; Q6_K 12288->4096,
4096->151936) and widths 1, 2, 3, 4, 8, 9, 16: the bits of every width are first compared with the
Numba emulator (a fixed subset of rows), then timed: median over batches of CUDA-event timed runs
of ``--reps`` back-to-back launches, a spin kernel hiding the host, weights rotated through copies
of together >= 4x the L2. Beside it BATCH_VARIANT's one-column dp4a kernel (mmvq) of the same
shape, and the one-column form the library does not pick for the shape (MMA or dp4a, ``other-mmq-*`` rows:
``plans/subblock.py`` HIRAISHIN_SUBBLOCK_DP4A) where it has both. Prints us, GB/s (weight + activation bytes),
fraction of the copy bandwidth, the ratio to the kernel's own one column and to the variant's one column.
``--out DIR``: bench_mmq.json.

``--all-orders``: also every order's mat-vec at every width 1..16 as a forward pass launches it (the
CUDA backend's prepared mat-vec of the order: ``BATCH_VARIANT``'s mat-vec up to 8 columns and llama.cpp's
MMQ order beyond, ``BATCH_INVARIANT``'s one-token geometry in launches of up to 8 columns, ``SUBBLOCK``;
``FIXED_SPLIT``'s mat-vec is ``BATCH_INVARIANT``'s), timed the same way, and for each order whether every
width's columns have the bits of the same columns at width 16 (the exact orders must: it fails the run
otherwise; ``BATCH_VARIANT`` is reported, not checked). The price-of-exactness table reads these rows.

Targets (issue 12): one column no slower than the variant's one column; 3 / 9 / 16 columns
<= 1.15x / 1.3x / 1.5x the variant's one column.
"""

from __future__ import annotations

import argparse
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
    subblock_case,
    timing_setup,
)

SHAPES = QWEN3_8B_MATVECS
WIDTHS = [1, 2, 3, 4, 8, 9, 16]
TARGETS = {1: 1.0, 3: 1.15, 9: 1.3, 16: 1.5}  # x the variant's one column


ALL_WIDTHS = range(1, 17)


def other_one_column(qtype: str, k: int, n: int):
    """The one-column plan of the form ``subblock_plan`` does not pick for this shape (the MMA kernel's one-column
    form or the dp4a kernel, the same bits), or None where the shape has only one."""
    import hiraishin.plans.subblock as sb

    picked, saved = sb.subblock_plan(1, qtype, k, n=n), sb.SUBBLOCK_DP4A
    try:
        for level in sb.SUBBLOCK_DP4A_LEVELS:
            sb.SUBBLOCK_DP4A = level
            plan = sb.subblock_plan(1, qtype, k, n=n)
            if plan.kernel != picked.kernel:
                return plan
    finally:
        sb.SUBBLOCK_DP4A = saved
    return None
EXACT_ORDERS = ("batch_invariant", "subblock")  # (fixed_split's mat-vec is batch_invariant's)


def time_orders(cp, label, qtype, k, n, ws, ws_sb, x, w_bytes, t_var, args, spin, cycles) -> list:
    """Every order's prepared mat-vec (the CUDA backend's, as a forward pass launches it) at widths 1..16:
    µs, and whether each width's columns have the bits of the same columns at width 16 (SUBBLOCK's of ``ws_sb``,
    the layout its passes read; the others' of ``ws``, ggml's rows)."""
    from hiraishin.backends import get_backend
    from hiraishin.order import ReductionOrder

    ops = get_backend("cuda").ops
    ws_rows, rows = ws, []
    print(f"{'order':>16} " + " ".join(f"{w:>6}" for w in ALL_WIDTHS) + "  (us)")
    for order in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK):
        ws = ws_sb if order.matvec == "subblock" else ws_rows
        wide = None  # the order's outputs at width 16
        line = []
        for wd in sorted(ALL_WIDTHS, reverse=True):
            mv = ops.matvec(order, wd, qtype, ws[0])
            xq = ops.quantize(x[:wd], mv.layout).copy()  # (the backend's scratch is shared)
            out = cp.empty((wd, n), dtype=cp.float32)
            mv(ws[0], xq, out)
            got = cp.asnumpy(out).view(np.uint32)
            wide = got if wide is None else wide
            fn = _rotating(ws, mv, xq, out)
            for i in range(3):
                fn(i)
            sec = median_event_time(cp, fn, args.reps, args.batches, spin, cycles)
            rows.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel="order-matvec", order=order.name, ncols=wd,
                             time_us=sec * 1e6, gb_per_s=(w_bytes + xq.nbytes) / sec / 1e9,
                             ratio_to_variant_one_col=sec / t_var,
                             bits_equal_width16=bool(np.array_equal(got, wide[:wd]))))
            line.append(sec * 1e6)
        same = all(r["bits_equal_width16"] for r in rows if r["order"] == order.name)
        print(f"{order.name:>16} " + " ".join(f"{t:>6.1f}" for t in reversed(line))
              + f"  columns {'equal' if same else 'DIFFER'} across widths")
    return rows


def _rotating(ws, launch, *args):
    """fn(i): ``launch`` on the i-th weight copy (round robin) and ``args``."""
    return lambda i: launch(ws[i % len(ws)], *args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--all-orders", action="store_true",
                    help="also time every order's mat-vec at widths 1..16 (the backend's prepared mat-vecs)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time launch variants (warps per CUDA block, register caps; same bits)")
    args = ap.parse_args(argv)

    import cupy as cp

    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq.launch import precompile, prepared_launch
    from hiraishin.backends import get_backend
    from hiraishin.kernels.mmq.wtile import subblock_prefers_tiles, tile_qtypes
    from hiraishin.kernels.mmvq.launch import launch as mmvq_launch
    from hiraishin.kernels.quantize.launch import output_shape
    from hiraishin.kernels.quantize.layout import layout_for
    from hiraishin.order import ReductionOrder
    from hiraishin.plans import matvec_plan
    from hiraishin.plans.subblock import subblock_plan

    props, dev_name, l2, spin, cycles = timing_setup(cp)
    backend = get_backend("cuda")
    src = cp.ones(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    t_copy = median_event_time(cp, lambda i, d=dst, s=src: cp.copyto(d, s), 10, args.batches, spin, cycles)
    bw_copy = 2 * src.nbytes / t_copy
    del src, dst
    print(f"device {dev_name}; copy bandwidth {bw_copy / 1e9:.0f} GB/s")
    precompile([subblock_plan(wd, q, k, n=nn) for _, q, k, nn in SHAPES for wd in WIDTHS]
               + [p for _, q, k, nn in SHAPES if (p := other_one_column(q, k, nn)) is not None],
               wtile=lambda p: subblock_prefers_tiles() and p.qtype in tile_qtypes())

    rng = np.random.default_rng(0)
    results, checks = [], []
    for label, qtype, k, n in SHAPES:
        rows, ref, ws, x, acts, w_bytes = subblock_case(cp, rng, qtype, k, n, max(WIDTHS), l2)
        # the sub-block launches read the layout SUBBLOCK passes read (Qwen3.weight_layout_for; other orders: rows)
        wtile = subblock_prefers_tiles() and qtype in tile_qtypes()
        ws_sb = ws
        if wtile:  # copies laid out by the backend, as Qwen3.set_weight_layout does (its prepared mat-vecs see them)
            ws_sb = [w.copy() for w in ws]
            for w in ws_sb:
                assert backend.relayout_weight(w, "blk.0.bench.weight", qtype, (k, n), True)
        print(f"\n{label} {qtype}: {w_bytes / 1e6:.1f} MB, {len(ws)} rotating copies; sub-block launches read "
              f"{'tiles' if wtile else 'rows'}")
        print(f"{'kernel':>14} {'cols':>4} {'us':>8} {'GB/s':>6} {'copy':>6} {'x own 1':>7} {'x var 1':>7} bits")

        # BATCH_VARIANT one column (dp4a mmvq, its own activation layout)
        vplan = matvec_plan(ReductionOrder.BATCH_VARIANT, 1, qtype)
        lay = layout_for(qtype)
        y = cp.empty(output_shape(1, k, lay), dtype=cp.uint8)
        quantize.launch(x[:1], y, lay)
        vout = cp.empty((1, n), dtype=cp.float32)
        fn = _rotating(ws, mmvq_launch, qtype, y, vplan, vout)
        for i in range(3):
            fn(i)
        t_var = median_event_time(cp, fn, args.reps, args.batches, spin, cycles)
        bw = (w_bytes + y.nbytes) / t_var
        results.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel="variant-mmvq", ncols=1, time_us=t_var * 1e6,
                            gb_per_s=bw / 1e9, fraction_of_copy=bw / bw_copy, ratio_to_one_col=1.0,
                            ratio_to_variant_one_col=1.0))
        print(f"{'variant mmvq':>14} {1:>4} {t_var * 1e6:>8.1f} {bw / 1e9:>6.0f} {bw / bw_copy:>6.1%} "
              f"{1.0:>7.2f} {1.0:>7.2f}")
        t_one = None
        other = other_one_column(qtype, k, n)
        # (width, plan, whether the library launches it), the other one-column form last
        launches = [(wd, subblock_plan(wd, qtype, k, n=n), True) for wd in WIDTHS]
        launches += [(1, other, False)] if other else []
        for wd, plan, mine in launches:
            out = cp.empty((wd, n), dtype=cp.float32)
            lw = prepared_launch(n, plan, wtile)
            xq = acts(wd, lw.layout)  # in the layout it reads
            lw(ws_sb[0], xq, out)
            got = cp.asnumpy(out)[:, rows]
            equal = bool(np.array_equal(got.view(np.uint32), ref[:wd].view(np.uint32)))
            fn = _rotating(ws_sb, lw, xq, out)
            for i in range(3):
                fn(i)
            sec = median_event_time(cp, fn, args.reps, args.batches, spin, cycles)
            t_one = sec if wd == 1 and mine else t_one
            bw = (w_bytes + wd * xq.shape[1]) / sec
            kernel = f"{'' if mine else 'other-'}mmq-{plan.kernel}"
            rec = dict(shape=label, qtype=qtype, k=k, n=n, kernel=kernel, ncols=wd,
                       time_us=sec * 1e6, gb_per_s=bw / 1e9, fraction_of_copy=bw / bw_copy,
                       ratio_to_one_col=sec / t_one, ratio_to_variant_one_col=sec / t_var,
                       bits_equal_emulator=equal, nseg=plan.nseg, nwarps=plan.nwarps,
                       cols_per_block=plan.cols_per_block, weight_layout="tiles" if wtile else "rows")
            results.append(rec)
            print(f"{('mmq ' if mine else 'other ') + plan.kernel:>14} {wd:>4} {sec * 1e6:>8.1f} {bw / 1e9:>6.0f} "
                  f"{bw / bw_copy:>6.1%} {sec / t_one:>7.2f} {sec / t_var:>7.2f} {'equal' if equal else 'DIFFER'}")
            if wd in TARGETS and mine:
                checks.append(dict(shape=label, ncols=wd, target_x_variant_one_col=TARGETS[wd],
                                   value=sec / t_var, ok=sec / t_var <= TARGETS[wd]))
        if args.all_orders:
            results += time_orders(cp, label, qtype, k, n, ws, ws_sb, x, w_bytes, t_var, args, spin, cycles)
        if args.sweep:
            import dataclasses

            from hiraishin.kernels.mmq.launch import MMQLaunch
            for wd in (1, 4, 9, 16):
                base = subblock_plan(wd, qtype, k, n=n)
                caps = (64, 80) if wd == 1 else ((80, 96, 128) if wd > 8 else (80, 128))
                pres = (0, 1) if wd <= 8 else (0,)
                for nw, cap, pre in [(nw, cap, pre) for nw in sorted({min(16, base.nseg), min(8, base.nseg),
                                                                        min(4, base.nseg)}, reverse=True)
                                     for cap in caps for pre in pres]:
                        if wd > 1 and nw == 16:
                            continue
                        plan = dataclasses.replace(base, nwarps=nw)
                        lw = MMQLaunch(n, plan, max_regs=cap, prefetch=pre, wtile=wtile)
                        out = cp.empty((wd, n), dtype=cp.float32)
                        xq = acts(wd, lw.layout)
                        lw(ws_sb[0], xq, out)
                        equal = bool(np.array_equal(cp.asnumpy(out)[:, rows].view(np.uint32),
                                                    ref[:wd].view(np.uint32)))
                        fn = _rotating(ws_sb, lw, xq, out)
                        for i in range(3):
                            fn(i)
                        sec = median_event_time(cp, fn, args.reps, args.batches, spin, cycles)
                        regs = int(lw.kernel.num_regs)
                        spills = int(lw.kernel.local_size_bytes)
                        results.append(dict(shape=label, qtype=qtype, k=k, n=n, kernel=f"sweep-{plan.kernel}",
                                            ncols=wd, nwarps=nw, max_regs=cap, prefetch_x=pre, num_regs=regs,
                                            spill_bytes=spills,
                                            time_us=sec * 1e6, ratio_to_variant_one_col=sec / t_var,
                                            bits_equal_emulator=equal))
                        print(f"  sweep cols {wd:>2} nwarps {nw:>2} cap {cap!s:>4} pre {pre} regs {regs:>3} "
                              f"spill {spills:>3}: {sec * 1e6:8.1f} us  x var1 {sec / t_var:5.2f} "
                              f"{'equal' if equal else 'DIFFER'}")
        del ws, ws_sb, x, acts
        cp.get_default_memory_pool().free_all_blocks()

    print("\ntargets (x BATCH_VARIANT one column):")
    for c in checks:
        print(f"  {c['shape']:<32} {c['ncols']:>2} cols: {c['value']:.2f} <= {c['target_x_variant_one_col']}"
              f" {'ok' if c['ok'] else 'MISSED'}")
    all_equal = all(r.get("bits_equal_emulator", True) for r in results)
    if args.all_orders:
        invariant = all(r["bits_equal_width16"] for r in results
                        if r["kernel"] == "order-matvec" and r["order"] in EXACT_ORDERS)
        print(f"exact orders' columns equal to their width-16 bits at every width: {invariant}")
        all_equal = all_equal and invariant
    print(f"bits equal to the emulator at every width: {all_equal}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_mmq.json"), "w") as f:
            json.dump(dict(device=dev_name, date=_dt.datetime.now(_dt.timezone.utc).isoformat(),
                           commit=git_commit(), host=platform.node(), command=" ".join(sys.argv),
                           copy_bandwidth_gb_per_s=bw_copy / 1e9, reps=args.reps, batches=args.batches,
                           results=results, checks=checks, all_bits_equal=all_equal), f, indent=1)
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
