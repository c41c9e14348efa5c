"""The sub-block order's Q4_K mat-vec on warpgroup MMA (``bench/proto_wgmma.cu``) against the library's (GPU).

    python3 bench/proto_wgmma.py [--widths 1,8,9,16] [--json FILE]

A prototype, not a kernel of the library: compiled here with nvcc for sm_90a (wgmma needs the arch-specific
target, which the library's NVRTC path does not ask for) after the library's prelude and ``mmq/mma_rows.cu``,
loaded as a cubin, checked bit for bit against the sub-block order's emulator on the rows
``benchlib.subblock_case`` picks, and timed as ``bench_mmq.py`` times the library's launch (weights rotated
through copies of >= 4x the L2, CUDA events over back-to-back launches). Widths up to 8 take the m64n8k32 build,
9-16 the m64n16k32 one; ``CONFIGS`` lists the builds timed (warpgroups per CUDA block, CUDA blocks per cluster,
sub-blocks per batch of MMAs, weight rows loaded ahead or not).

How it got here (session 17, ``bench/results/2026-12-04-h200-session17/`` e): the first build (``5aea85c``, one
warpgroup per 64 rows walking the whole row) tried both readings of the B descriptor's offsets (the leading byte
offset is the distance between the two K-halves of a core matrix; the other reading gave other bits); then
warpgroups splitting the K-segments, thread-block clusters splitting them further (partial sums added through
distributed shared memory), batches of MMAs before one wait, the next weight rows loaded ahead. Exact everywhere,
1.3-1.6x slower than the library's launch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from benchlib import median_event_time, subblock_case, timing_setup, write_rows_json  # noqa: E402

SHAPES = [("attn_q/attn_output 4096->4096", 4096, 4096), ("attn_k/attn_v 4096->1024", 4096, 1024),
          ("ffn_up/ffn_gate 4096->12288", 4096, 12288), ("ffn_down (Q4_K layers) 12288->4096", 12288, 4096)]
# (warpgroups per CUDA block, CUDA blocks per cluster, sub-blocks per MMA batch)
# and whether the next super-block's weight rows are loaded ahead (HX_ROWS_AHEAD)
CONFIGS = ((4, 2, 4, 0), (4, 2, 4, 1), (2, 2, 4, 1), (2, 1, 4, 1), (4, 1, 4, 1), (2, 4, 4, 1), (4, 4, 2, 1),
           (2, 2, 8, 1), (1, 2, 8, 1), (1, 4, 8, 1))
NVCC_FLAGS = ["-std=c++17", "-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]  # the library's options


def smem_bytes(n: int, nseg: int, wg: int) -> int:
    """The dynamic shared memory a launch gives (proto_wgmma.cu SMEM_BYTES; a static_assert there checks it)."""
    return wg * 2 * (8 * n * 32 + 8 * n * 4) + nseg * 64 * n * 4


def cubin_path(tmp: str, n: int, nb: int, nseg: int, cfg) -> str:
    return os.path.join(tmp, f"wg-{n}-{nb}-{nseg}-{'-'.join(map(str, cfg))}.cubin")


def source(n: int, nb: int, nseg: int, cfg) -> str:
    """The prototype's CUDA text: its defines, the library's prelude (fp.cuh) and ``mmq/mma_rows.cu`` (the weight
    rows' loads and scales, Q4_K, llama.cpp's q8_1 layout), then ``proto_wgmma.cu``."""
    from hiraishin.kernels.compile import defines_text, load_source
    from hiraishin.quant import BLOCK_BYTES, GGML_TYPE_ID

    wg, cl, batch, ahead = cfg
    defines = {"HX_QTYPE": GGML_TYPE_ID["Q4_K"], "HX_BLOCK_BYTES": BLOCK_BYTES["Q4_K"], "HX_Q8_BYTES": BLOCK_BYTES["Q8_1"],
               "HX_XLAYOUT": 0, "HX_NT": n // 8, "HX_NB": nb, "HX_N": n, "HX_NSEG": nseg, "HX_WG": wg, "HX_CL": cl,
               "HX_BATCH": batch, "HX_ROWS_AHEAD": ahead, "HX_SMEM_BYTES": smem_bytes(n, nseg, wg)}
    return defines_text(defines) + load_source("mmq/mma_rows.cu") + (HERE / "proto_wgmma.cu").read_text()


def compile_cubin(tmp: str, n: int, nb: int, nseg: int, cfg) -> str:
    cubin = cubin_path(tmp, n, nb, nseg, cfg)
    src = cubin[:-len(".cubin")] + ".cu"
    with open(src, "w") as f:
        f.write(source(n, nb, nseg, cfg))
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", *NVCC_FLAGS, "-o", cubin, src], check=True)
    return cubin


def build(cp, tmp: str, n: int, nb: int, nseg: int, cfg):
    wg = cfg[0]
    kern = cp.RawModule(path=cubin_path(tmp, n, nb, nseg, cfg)).get_function("wg_mmq")
    kern.max_dynamic_shared_size_bytes = smem_bytes(n, nseg, wg)
    return kern


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="1,8,9,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if shutil.which("nvcc") is None:
        ap.error("needs nvcc (the CUDA toolkit) on PATH: the prototype is compiled for sm_90a with it")

    import cupy as cp

    from hiraishin.kernels.mmq.launch import MMQLaunch
    from hiraishin.plans.subblock import subblock_plan

    _, dev_name, l2, spin, cycles = timing_setup(cp)
    print(f"device {dev_name}", flush=True)
    rng = np.random.default_rng(0)
    out_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {(hn, k // 256, subblock_plan(1, "Q4_K", k, n=n).nseg, cfg) for _, k, n in SHAPES
                for hn in {8 if wd <= 8 else 16 for wd in widths} for cfg in CONFIGS}
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda j: compile_cubin(tmp, *j), sorted(jobs)))
        print(f"compiled {len(jobs)} builds", flush=True)
        for label, k, n in SHAPES:
            rows, ref, ws, x, acts, _ = subblock_case(cp, rng, "Q4_K", k, n, max(widths), l2)
            print(f"\n{label}", flush=True)
            for wd in widths:
                plan = subblock_plan(wd, "Q4_K", k, n=n)
                line = []
                lib = MMQLaunch(n, plan)
                out = cp.empty((wd, n), dtype=cp.float32)
                xl = acts(wd, lib.layout)
                lib(ws[0], xl, out)
                eq = bool(np.array_equal(cp.asnumpy(out)[:, rows].view(np.uint32), ref[:wd].view(np.uint32)))
                fn = (lambda i, o=out, xl=xl: lib(ws[i % len(ws)], xl, o))
                us = median_event_time(cp, fn, args.reps, args.batches, spin, cycles) * 1e6
                out_rows.append(dict(shape=label, k=k, n=n, width=wd, variant="library", us=us, bits_equal_emulator=eq))
                line.append(f"library {us:7.1f}{'' if eq else ' DIFFERS'}")
                hn = 8 if wd <= 8 else 16
                xq = acts(wd, None)  # llama.cpp's q8_1 blocks
                for cfg in CONFIGS:
                    wg, cl, _, _ = cfg
                    name = "wg{}cl{}b{}r{}".format(*cfg)
                    kern = build(cp, tmp, hn, k // 256, plan.nseg, cfg)
                    grid, block = (-(-n // 64) * cl, -(-wd // hn), 1), (128 * wg, 1, 1)
                    smem = smem_bytes(hn, plan.nseg, wg)
                    out2 = cp.zeros((wd, n), dtype=cp.float32)
                    scal = (np.int32(n), np.int32(wd), np.int64(n))
                    kern(grid, block, (ws[0], xq, out2) + scal, shared_mem=smem)
                    cp.cuda.runtime.deviceSynchronize()
                    eq = bool(np.array_equal(cp.asnumpy(out2)[:, rows].view(np.uint32), ref[:wd].view(np.uint32)))
                    fn = (lambda i, o=out2, kern=kern, grid=grid, block=block, smem=smem, scal=scal:
                          kern(grid, block, (ws[i % len(ws)], xq, o) + scal, shared_mem=smem))
                    us = median_event_time(cp, fn, args.reps, args.batches, spin, cycles) * 1e6
                    out_rows.append(dict(shape=label, k=k, n=n, width=wd, variant=f"wgmma-{name}", us=us,
                                         bits_equal_emulator=eq, nseg=plan.nseg, num_regs=int(kern.num_regs),
                                         warpgroups=wg, cluster=cl, batch=cfg[2], rows_ahead=cfg[3]))
                    line.append(f"{name} {us:6.1f} {'equal' if eq else 'DIFFER'}")
                print(f"  {wd:2d} columns: " + " | ".join(line), flush=True)
            del ws, x, acts
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        write_rows_json(args.json, out_rows, device=dev_name, widths=widths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
