"""Registers and local memory of the sub-block kernels' launches, compiled here with nvcc for sm_90: no GPU needed.

    python3 bench/regs_mmq.py [--widths 1,3,9,16] [--layouts library,interleave,split] [--caps default,none]

For each Qwen3-8B mat-vec shape (``bench/benchlib.py``), width and launch layout, the library's plan
(``subblock_plan``; ``interleave``: 9..16 columns as two one-tile CUDA blocks side by side, ``split``: one
CUDA block whose warps split over two one-tile column groups) is turned into the very source the library
compiles (``kernel_defines``, ``defines_text`` + ``load_source``) and compiled by ``nvcc -cubin`` with
ptxas's report. Prints registers, local bytes (the stack frame, spills included: what CuPy's
``local_size_bytes`` counts) and resident CUDA blocks per SM by registers for ``hx_mmq`` and
``hx_mmq_multi``, at the register cap the library asks (``default``: the tuning tables; then relaxed one
resident block at a time while it uses local memory, as ``mmq_kernel`` does on the device) or with none.
ptxas is the same back end NVRTC uses, so the counts are the device's (checked against the GPU runs of session 10: the
two-n-tile launches 128 registers).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import QWEN3_8B_MATVECS  # noqa: E402

ARCH = "sm_90"  # the H200
# the stack frame, not only spill stores: CuPy's local_size_bytes (what mmq_kernel relaxes the cap on) counts both,
# and an array indexed by a runtime value lives there with no spill (session 28: the dp4a Q4_K kernel's 56 bytes)
_PROPS = re.compile(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame.*?Used (\d+) registers", re.S)


def compile_report(defines: dict, workdir: str, source: tuple | None = None) -> dict:
    """{kernel name: (registers, local bytes: the stack frame, spills included)} of ``mmq.cu`` (or ``source``,
    e.g. the dp4a kernel's ``DP4A_SOURCE``, whose entry points are reported under the names of the ``hx_mmq`` ones they stand in for)
    under ``defines``."""
    from hiraishin.kernels.compile import NVRTC_OPTIONS, defines_text, load_source
    from hiraishin.kernels.mmq.launch import SOURCE

    src = os.path.join(workdir, "mmq.cu")
    with open(src, "w") as f:
        f.write(defines_text(defines) + load_source(*(source or SOURCE)))
    run = subprocess.run(["nvcc", f"-arch={ARCH}", "-cubin", "-o", os.path.join(workdir, "mmq.cubin"),
                          *NVRTC_OPTIONS, "-Xptxas", "-v", src], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed for {defines}:\n{run.stderr[-3000:]}")
    return {name.replace("_dp4a", ""): (int(regs), int(spill)) for name, spill, regs in _PROPS.findall(run.stderr)}


def library_kernel(plan, cap, workdir: str):
    """As ``mmq_kernel`` (``relax_register_cap``: one resident block fewer while ``hx_mmq`` spills).
    -> (report, resident blocks it was compiled for)."""
    from hiraishin.kernels.compile import relax_register_cap
    from hiraishin.kernels.mmq.launch import kernel_defines, kernel_source

    def compile_spills(defines):
        report = compile_report(defines, workdir, kernel_source(plan))
        return report, report["hx_mmq"][1]

    report, defines = relax_register_cap(kernel_defines(plan, cap), compile_spills)
    return report, defines["HX_MIN_BLOCKS"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="1,3,9,16")
    ap.add_argument("--layouts", default="library,interleave,split")
    ap.add_argument("--caps", default="default,none", help="'default' (the library's cap), 'none', or numbers")
    args = ap.parse_args(argv)
    if shutil.which("nvcc") is None:
        ap.error("needs nvcc (the CUDA toolkit) on PATH")
    from hiraishin.kernels.compile import REGISTERS_PER_SM
    from hiraishin.plans.subblock import subblock_plan

    widths = [int(w) for w in args.widths.split(",")]
    caps = ["default" if c == "default" else None if c == "none" else int(c) for c in args.caps.split(",")]
    print(f"{'shape':<36} {'cols':>4} {'layout':<10} {'warps':>5} {'cap':>7} | hx_mmq regs local | multi regs local"
          " | blocks/SM")
    with tempfile.TemporaryDirectory() as tmp:
        for label, qtype, k, n in QWEN3_8B_MATVECS:
            for wd in widths:
                base = subblock_plan(wd, qtype, k, n=n)
                for layout in args.layouts.split(","):
                    if layout != "library" and not 8 < wd <= 16:
                        continue
                    plan = base
                    if layout == "interleave":
                        plan = dataclasses.replace(base, cols_per_block=8, interleave=2)
                    elif layout == "split":
                        plan = dataclasses.replace(base, warp_split=2)  # the same warps, two per K-segment
                    for cap in caps:
                        report, blocks = library_kernel(plan, cap, tmp)
                        (r, s), (rm, sm) = report["hx_mmq"], report["hx_mmq_multi"]
                        by_regs = REGISTERS_PER_SM // (r * 32 * plan.nwarps)
                        print(f"{label:<36} {wd:>4} {layout:<10} {plan.nwarps:>5} {cap!s:>7} | {r:>11} {s:>5} | "
                              f"{rm:>10} {sm:>5} | {by_regs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
