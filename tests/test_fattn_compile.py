"""Compile-check the attention CUDA sources with the local nvcc (sm_90): no errors, no spills.

Skipped where nvcc is missing. Register counts are printed (``pytest -s``); the runtime numbers
(NVRTC + the driver) are recorded by tests/test_fattn_gpu.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hiraishin.kernels._cuda import load_source

NVCC = shutil.which("nvcc")
# nvcc spelling of the NVRTC options in hiraishin.kernels._cuda (IEEE arithmetic, no contraction)
FLAGS = ["-arch=sm_90", "-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true",
         "-Xptxas", "-v", "-c"]
EXPECTED = {"fattn_vec.cu": {"fattn_vec_q1", "fattn_vec_qn", "fattn_combine"},
            "fattn_tile.cu": {"fattn_tile"}}


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("source", sorted(EXPECTED))
def test_compiles_without_spills(tmp_path, source, head_dim):
    src = tmp_path / f"{source[:-3]}_d{head_dim}.cu"
    src.write_text(f"#define HX_D {head_dim}\n" + load_source(source))
    proc = subprocess.run([NVCC, *FLAGS, str(src), "-o", str(tmp_path / "out.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr + proc.stdout
    functions = re.findall(r"Compiling entry function '(\w+)'", log)
    assert set(functions) == EXPECTED[source]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log
    regs = dict(zip(functions, re.findall(r"Used (\d+) registers", log)))
    print(f"{source} D={head_dim}: registers {regs}")
    assert all(int(r) <= 255 for r in regs.values())
