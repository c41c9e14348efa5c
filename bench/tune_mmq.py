"""Sweep the launch facts of the sub-block MMA kernel at verify widths and write a tuning file.

    python3 bench/tune_mmq.py --out DIR [--widths 2,4 | --widths 9,16] [--only LABEL] [--reps 20] [--batches 7]

For each Qwen3-8B mat-vec shape (both ffn_down and attn_v types) and every launch the order allows at
``--widths`` (all of 2..8 columns, or all of 9..16: the "/wide" entries) (warps per CUDA block 4 / 8 / 16,
register caps 64 / 80 / 96 / 128, the activation prefetch on or off; at 9..16 columns also one two-tile
CUDA block per row tile, two one-tile blocks side by side (``cols_per_block`` 8) or one block whose warps
split over two one-tile column groups (``warp_split`` 2); session 8 also
swept HX_LIVE here, at 1f3f1d9: it never won), the
bits of every width are compared with the Numba emulator (a fixed subset of rows), then the launch
is timed as ``bench/bench_mmq.py`` times it (CUDA events over back-to-back launches, weights rotated
through copies of >= 4x the L2). Per shape the variant with the least summed time over ``--widths``
is kept if it beats the library's own launch by more than :data:`MIN_GAIN` and every bit equals the
emulator's. The weights are in the layout SUBBLOCK passes read (``--layout``, default as
``Qwen3.weight_layout_for`` picks: tiles of the types ``hiraishin.kernels.mmq.wtile.tile_qtypes`` takes, unless
``HIRAISHIN_MMQ_WTILE=0``), so the sweep times the launches a pass makes. ``DIR/mmq-tuning.json`` (the library's
table with those entries replaced: the file ``HIRAISHIN_MMQ_TUNING`` reads, for a whole-pass A/B
with and without it) and ``DIR/tune-mmq.json`` (every time) are written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import QWEN3_8B_MATVECS, git_commit, median_event_time, subblock_case, timing_setup  # noqa: E402

SHAPES = QWEN3_8B_MATVECS + [("ffn_down (Q4_K layers) 12288->4096", "Q4_K", 12288, 4096),
                             ("attn_v (Q6_K layers) 4096->1024", "Q6_K", 4096, 1024)]
NWARPS = (4, 8, 16)
CAPS = (64, 80, 96, 128)
MIN_GAIN = 0.03  # a variant must be this much faster than the library's launch to be kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--widths", default="2,4")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--only", help="sweep only the shapes whose label contains this text")
    ap.add_argument("--layout", choices=("rows", "tiles"), default=None,
                    help="the weights' layout (default: what SUBBLOCK passes read, HIRAISHIN_MMQ_WTILE)")
    args = ap.parse_args(argv)
    shapes = [s for s in SHAPES if args.only is None or args.only in s[0]]
    if not shapes:
        ap.error(f"--only {args.only!r}: no shape; labels: {', '.join(s[0] for s in SHAPES)}")
    widths = [int(w) for w in args.widths.split(",")]
    wide = widths[0] > 8
    if not (all(2 <= w <= 8 for w in widths) or all(9 <= w <= 16 for w in widths)):
        ap.error("--widths: launches of 2..8 columns or of 9..16 columns, not both (one tuning key each)")

    import cupy as cp

    from hiraishin.atomic import atomic_write
    from hiraishin.kernels.compile import precompile
    from hiraishin.kernels.mmq.launch import SOURCE, MMQLaunch, kernel_defines
    from hiraishin.kernels.mmq.wtile import subblock_prefers_tiles, tile_qtypes
    from hiraishin.plans.subblock import SUBBLOCK_MMA_TUNING, subblock_plan, tuning_key

    layout = args.layout or ("tiles" if subblock_prefers_tiles() else "rows")

    def tiled(qtype):
        return layout == "tiles" and qtype in tile_qtypes()

    _, dev_name, l2, spin, cycles = timing_setup(cp)
    variants = {}  # shape label -> [(nwarps, cap, prefetch)]
    jobs = []
    def variant_plan(wd, qtype, k, n, nw, cpb, split):
        """The library's plan of ``wd`` columns with ``nw`` warps, ``cpb`` columns per CUDA block and its warps
        split over ``split`` column groups."""
        p = dataclasses.replace(subblock_plan(wd, qtype, k, n=n), nwarps=nw)
        return dataclasses.replace(p, cols_per_block=cpb, interleave=-(-wd // cpb), warp_split=split) if wide else p

    # (columns per CUDA block, warp split): 2..8 columns one n-tile; 9..16 two n-tiles in one warp, two blocks
    # of one n-tile side by side, or two warps of one n-tile each per K-segment
    layouts = ((16, 1), (8, 1), (16, 2)) if wide else ((8, 1),)
    for label, qtype, k, n in shapes:
        base = subblock_plan(widths[0], qtype, k, n=n)
        vs = [(nw, cap, pre, cpb, split) for cpb, split in layouts for nw in NWARPS if nw <= base.nseg * split
              and nw % split == 0 for cap in CAPS for pre in ((0, 1) if cpb // split == 8 else (0,))]
        variants[label] = vs
        jobs += [(SOURCE, kernel_defines(variant_plan(wd, qtype, k, n, nw, cpb, split), cap, pre, tiled(qtype)))
                 for nw, cap, pre, cpb, split in vs for wd in sorted({widths[0], widths[-1]})]
    print(f"device {dev_name}; weights in {layout}; compiling {len(jobs)} variants", flush=True)
    precompile(jobs)

    rng = np.random.default_rng(0)
    rows_out = []
    table = dict(SUBBLOCK_MMA_TUNING)  # the library's table, with what this sweep keeps over it
    for label, qtype, k, n in shapes:
        rows, ref, ws, x, acts, _ = subblock_case(cp, rng, qtype, k, n, max(widths), l2, tiled(qtype))
        wtile = tiled(qtype)

        def timed(make, ws=ws, acts=acts, ref=ref, rows=rows, n=n):
            total, equal = 0.0, True
            per = {}
            for wd in widths:
                launch = make(wd)
                out = cp.empty((wd, n), dtype=cp.float32)
                xq = acts(wd, launch.layout)  # in the layout it reads
                launch(ws[0], xq, out)
                equal &= bool(np.array_equal(cp.asnumpy(out)[:, rows].view(np.uint32), ref[:wd].view(np.uint32)))
                fn = (lambda i, lw=launch, o=out, xq=xq: lw(ws[i % len(ws)], xq, o))
                for i in range(3):
                    fn(i)
                per[wd] = median_event_time(cp, fn, args.reps, args.batches, spin, cycles) * 1e6
                total += per[wd]
            return total, per, equal, launch

        key = tuning_key(qtype, n, k, widths[0])
        t_lib, per_lib, eq_lib, lw = timed(lambda wd: MMQLaunch(n, subblock_plan(wd, qtype, k, n=n), wtile=wtile))
        lib = subblock_plan(widths[0], qtype, k, n=n)
        rows_out.append(dict(shape=label, key=key, variant="library", layout="tiles" if wtile else "rows",
                             nwarps=lib.nwarps,
                             cols_per_block=lib.cols_per_block, num_regs=int(lw.kernel.num_regs), us=per_lib,
                             bits_equal_emulator=eq_lib))
        print(f"\n{label} ({key}): library {lib.nwarps} warps {lib.cols_per_block} columns per CUDA block "
              f"{int(lw.kernel.num_regs)} regs: "
              + " ".join(f"{wd}:{t:.1f}" for wd, t in per_lib.items()) + " us", flush=True)
        best = None
        for nw, cap, pre, cpb, split in variants[label]:
            t, per, eq, lw = timed(lambda wd: MMQLaunch(n, variant_plan(wd, qtype, k, n, nw, cpb, split),
                                                        max_regs=cap, prefetch=pre, wtile=wtile))
            regs, spill = int(lw.kernel.num_regs), int(lw.kernel.local_size_bytes)
            rows_out.append(dict(shape=label, key=key, variant="sweep", nwarps=nw, max_regs=cap, prefetch_x=pre,
                                 cols_per_block=cpb, warp_split=split, num_regs=regs, spill_bytes=spill, us=per,
                                 bits_equal_emulator=eq))
            print(f"  {nw:2d} warps cap {cap:3d} pre {pre} cols {cpb:2d} split {split} regs {regs:3d} spill {spill}: "
                  + " ".join(f"{wd}:{v:.1f}" for wd, v in per.items()) + f" us {'equal' if eq else 'DIFFER'}",
                  flush=True)
            if eq and spill == 0 and (best is None or t < best[0]):
                best = (t, nw, cap, pre, cpb, split)
        if best is not None and best[0] < (1 - MIN_GAIN) * t_lib and eq_lib:
            table[key] = {"nwarps": best[1], "max_regs": best[2], "prefetch_x": best[3]}
            if wide:
                table[key].update(cols_per_block=best[4], warp_split=best[5])
            print(f"  kept {table[key]}: {best[0]:.1f} vs {t_lib:.1f} us", flush=True)
        del ws, x, acts
        cp.get_default_memory_pool().free_all_blocks()

    all_equal = all(r["bits_equal_emulator"] for r in rows_out)
    os.makedirs(args.out, exist_ok=True)
    with atomic_write(os.path.join(args.out, "mmq-tuning.json"), "w") as f:
        json.dump(table, f, indent=1)
    with atomic_write(os.path.join(args.out, "tune-mmq.json"), "w") as f:
        json.dump(dict(device=dev_name, date=_dt.datetime.now(_dt.timezone.utc).isoformat(), commit=git_commit(),
                       command=" ".join(sys.argv), widths=widths, min_gain=MIN_GAIN, tuning=table, rows=rows_out,
                       all_bits_equal=all_equal), f, indent=1)
    print(f"\ntuning: {json.dumps(table)}\nbits equal to the emulator everywhere: {all_equal}")
    return 0 if all_equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
