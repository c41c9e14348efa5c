"""Compile-check the mat-vec and elementwise CUDA sources with a local nvcc (no GPU needed): no errors, no spills.

NVRTC (what CuPy uses at run time) and nvcc share the front end and ptxas, so
this catches syntax errors and register spills before a GPU run; the register
counts a GPU run records (tests/test_mmvq_gpu.py) are the authoritative ones.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hiraishin.kernels.compile import NVRTC_OPTIONS, defines_text, load_source
from hiraishin.kernels.fused.launch import SOURCE as FUSED_SOURCE
from hiraishin.kernels.fused.launch import SOURCE_EMBED
from hiraishin.kernels.mmvq.launch import SOURCE as MMVQ_SOURCE
from hiraishin.kernels.mmvq.launch import capped_compile, kernel_defines, preset_kernel_defines
from hiraishin.kernels.mmvq_swiglu.launch import SOURCE as MMVQ_SWIGLU_SOURCE
from hiraishin.kernels.norm_mmvq.launch import SOURCE as NORM_MMVQ_SOURCE
from hiraishin.kernels.norm_mmvq.launch import MIXED_SOURCE as NORM_MIXED_SOURCE
from hiraishin.kernels.norm_mmvq.launch import norm_mixed_defines, norm_mmvq_defines, norm_mmvq_geometry
from hiraishin.kernels.quantize.launch import SOURCE as QUANTIZE_SOURCE
from hiraishin.kernels.swiglu_down.launch import SOURCE as SWIGLU_DOWN_SOURCE
from hiraishin.kernels.swiglu_down.launch import swiglu_down_compile
from hiraishin.kernels.quantize.launch import quantize_defines
from hiraishin.kernels.quantize.layout import LAYOUT_BYTES
from hiraishin.kernels.tiled.launch import SOURCE as TILED_SOURCE
from hiraishin.kernels.tiled.launch import tiled_defines

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs a local nvcc")

def _mmvq(qtype, ncols, rows, nwarps, nblocks, unroll=None):
    return (MMVQ_SOURCE, kernel_defines(qtype, ncols, rows, nwarps, nblocks, unroll))


CASES = [
    (QUANTIZE_SOURCE, quantize_defines(None)),
    (QUANTIZE_SOURCE, quantize_defines("Q4_K")),
    (QUANTIZE_SOURCE, quantize_defines("Q6_K")),
    _mmvq("Q4_K", 1, 1, 4, 16),
    _mmvq("Q4_K", 1, 2, 4, 48),
    _mmvq("Q4_K", 16, 2, 4, 16),
    _mmvq("Q6_K", 1, 1, 4, 16),
    _mmvq("Q6_K", 1, 1, 4, 48),
    _mmvq("Q6_K", 8, 2, 2, 48),
    _mmvq("Q6_K", 4, 8, 3, 10, 1),
    _mmvq("Q8_0", 8, 4, 1, 41),
    (MMVQ_SOURCE, kernel_defines("Q4_K", 1, 2, 4, 16, ahead=132 * 16)),  # the prefetch a wave ahead (H200)
    # the output heads with their argmax (mmvq_argmax): the 0.6B's (4 short rows a block), the 8B's (2 long rows)
    (MMVQ_SOURCE, {**kernel_defines("Q6_K", 1, 4, 4, 4), "HX_ARGMAX": 1, "HX_ARGMAX_SLOTS": 64}),
    (MMVQ_SOURCE, {**kernel_defines("Q6_K", 1, 2, 4, 16), "HX_ARGMAX": 1, "HX_ARGMAX_SLOTS": 64}),
    (TILED_SOURCE, tiled_defines("Q4_K")),
    (TILED_SOURCE, tiled_defines("Q6_K")),
    (TILED_SOURCE, tiled_defines("Q8_0")),
    ("elementwise/elementwise.cu", {}),
    # the fused kernels, the norms writing a second layout (Q/K's and V's in one launch)
    (FUSED_SOURCE, {**quantize_defines("Q4_K"), "HX_LAYOUT2": 14, "HX_LAYOUT2_BYTES": LAYOUT_BYTES["Q6_K"]}),
    (FUSED_SOURCE, quantize_defines(None)),
    # the embedding and the first norm in one launch: the 0.6B's played tree (256 threads), the 8B's own block
    (SOURCE_EMBED, {**quantize_defines("Q4_K"), "HX_NORM_PER": 4, "HX_NORM_VALS": 1, "HX_NORM_W_EARLY": 1,
                    "HX_LAYOUT2": 14, "HX_LAYOUT2_BYTES": LAYOUT_BYTES["Q6_K"]}),
    (SOURCE_EMBED, {**quantize_defines("Q4_K"), "HX_NORM_W_EARLY": 1}),
]
# the norm inside the mat-vec (norm_mmvq): Qwen3-0.6B's and -8B's rows, one and four tokens, each weight type
CASES += [(NORM_MMVQ_SOURCE, norm_mmvq_defines(q, k, ncols, rows, 4, None if q == "Q8_0" else q,
                                               norm_mmvq_geometry(k, 4)))
          for q, k, ncols, rows in (("Q4_K", 1024, 1, 4), ("Q4_K", 4096, 1, 2), ("Q4_K", 4096, 4, 2),
                                    ("Q6_K", 1024, 1, 4), ("Q6_K", 4096, 3, 2), ("Q8_0", 1024, 1, 4))]

# a pass's end in one launch (hx_norm_mmvq_argmax): the 0.6B's head (four short Q6_K rows a block), the 8B's (two)
CASES += [(NORM_MMVQ_SOURCE, {**norm_mmvq_defines("Q6_K", k, 1, rows, 4, "Q6_K", norm_mmvq_geometry(k, 4)),
                              "HX_ARGMAX": 1, "HX_ARGMAX_SLOTS": 64, "HX_PREFETCH_AHEAD": 0})
          for k, rows in ((1024, 4), (4096, 2))]
# the same with a Q6_K V beside Q4_K Q and K (hx_norm_mmvq_mixed): the 0.6B's and the 8B's rows, one and three tokens
CASES += [(NORM_MIXED_SOURCE, norm_mixed_defines(("Q4_K", "Q6_K"), rows, k, ncols, 4, 2, norm_mmvq_geometry(k, 4)))
          for k, ncols, rows in ((1024, 1, (1, 1)), (4096, 1, (4, 2)), (4096, 3, (2, 2)))]

# gate/up with SwiGLU as their epilogue (mmvq_swiglu): the 0.6B's and 8B's one-token launches (a Q6_K and a Q4_K
# down projection's layout), a verify pass's three columns
CASES += [(MMVQ_SWIGLU_SOURCE, {**kernel_defines("Q4_K", ncols, rows, 4, nblocks), **quantize_defines(down)})
          for ncols, rows, nblocks, down in ((1, 1, 4, "Q6_K"), (1, 1, 16, "Q4_K"), (3, 2, 16, "Q6_K"))]

def _compile(tmp_path, source, defines) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "kernel.cu"
    sources = (source,) if isinstance(source, str) else source  # one source key or several, concatenated
    path.write_text(defines_text(defines) + load_source(*sources))  # what compile.get_module compiles
    # --std is spelled -std for nvcc; the float options are the same as NVRTC's.
    opts = ["-std=c++17" if o == "--std=c++17" else o for o in NVRTC_OPTIONS]
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "-Xptxas", "-v", "-cubin", "-o", str(tmp_path / "k.cubin"), *opts, str(path)],
        capture_output=True, text=True, timeout=120,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert re.search(r"Used \d+ registers", log), log
    return log


def _spills(log) -> bool:
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    assert spills, log
    return any(spills)


@pytest.mark.parametrize("source, defines", CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_compiles_without_spills(tmp_path, source, defines):
    if source in (MMVQ_SOURCE, NORM_MMVQ_SOURCE, NORM_MIXED_SOURCE):
        # the register rule mmvq.launch.mmvq_kernel follows on the GPU (a cap that spills is relaxed)
        def at(d):
            out = _compile(tmp_path / f"cap{d.get('HX_MIN_BLOCKS', 1)}", source, d)
            return out, int(_spills(out))
        log, _ = capped_compile(defines, at)
    else:
        log = _compile(tmp_path, source, defines)
    assert not _spills(log), log
    warnings = [line for line in log.splitlines() if "warning" in line and "#pragma once" not in line]
    assert not warnings, log


# SwiGLU inside the down projection (swiglu_down): the 0.6B's rows of 3,072 values and the 8B's of 12,288, one and
# two tokens, Q4_K and Q6_K down weights, at the rows per CUDA block of the library's one-column plans; the row
# groups a CUDA block as the launch picks them (halved while the kernel spills)
SWIGLU_DOWN_CASES = [("Q4_K", 3072, 1, 1, 4), ("Q6_K", 3072, 1, 1, 4), ("Q4_K", 12288, 1, 4, 4),
                     ("Q6_K", 12288, 2, 2, 4)]


@pytest.mark.parametrize("args", SWIGLU_DOWN_CASES, ids=str)
def test_swiglu_down_compiles_without_spills(tmp_path, args):
    def at(d):
        out = _compile(tmp_path / f"g{d['HX_SWIGLU_GROUPS']}-cap{d['HX_MIN_BLOCKS']}", SWIGLU_DOWN_SOURCE, d)
        return out, int(_spills(out))

    log, defines = swiglu_down_compile(*args, at)
    assert not _spills(log), (defines, log)


def test_preset_launches_compile_without_spills(tmp_path):
    """Every launch the presets make for 1..16 columns at the Qwen3 row lengths, register caps included."""
    seen = {}
    for qtype in ("Q4_K", "Q6_K"):
        for k in (1024, 4096, 12288):
            seen.update(preset_kernel_defines(qtype, k))
    for i, d in enumerate(seen.values()):
        test_compiles_without_spills(tmp_path / str(i), MMVQ_SOURCE, d)
    assert len(seen) > 40
