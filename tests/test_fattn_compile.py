"""Compile-check the attention CUDA sources with the local nvcc (sm_90): no errors, no spills.

Skipped where nvcc is missing. Register counts are printed (``pytest -s``); the runtime numbers
(NVRTC + the driver) are recorded by tests/test_fattn_gpu.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hiraishin.kernels.attention.launch import SOURCE_TILE, SOURCE_VEC, shared_defines
from hiraishin.kernels.compile import defines_text, load_source
from hiraishin.plans.attention import NTHREADS, SHARED_QUERIES, TILE_CELLS, TILE_QUERIES

NVCC = shutil.which("nvcc")
# nvcc spelling of the NVRTC options in hiraishin.kernels.compile (IEEE arithmetic, no contraction)
FLAGS = ["-arch=sm_90", "-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true",
         "-Xptxas", "-v", "-c"]
EXPECTED = {SOURCE_VEC: {"fattn_vec_q1", "fattn_vec_qn", "fattn_vec_shared", "fattn_combine"},
            SOURCE_TILE: {"fattn_tile"}}
STATIC_SHARED_LIMIT = 48 * 1024  # bytes of static shared memory a CUDA block may declare
# the #defines hiraishin.kernels.attention.launch compiles each source with (besides HX_D): one
# build of fattn_vec.cu per fattn_vec_shared queries-per-block choice
# the shared kernel's default builds, and the queries-in-registers builds the benchmark times
SHARED_BUILDS = [(n, None) for n in SHARED_QUERIES] + [(2, (8, 1)), (4, (2, 1)), (4, (4, 1))]
BUILDS = [(SOURCE_VEC, shared_defines(n, b)) for n, b in SHARED_BUILDS] + [
    (SOURCE_TILE, {"FT_TILE_Q": TILE_QUERIES, "FT_TILE_KV": TILE_CELLS, "FT_NTHREADS": NTHREADS})]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("source,defines", BUILDS, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}{v}" for k, v in x.items()) or "plain")
def test_compiles_without_spills(tmp_path, source, defines, head_dim):
    src = tmp_path / f"{source.split('/')[-1][:-3]}_d{head_dim}.cu"
    src.write_text(defines_text({"HX_D": head_dim, **defines}) + load_source(source))
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
    # static shared memory only (no opt-in attribute is set): within the 48 KiB every launch gets
    assert all(int(b) <= STATIC_SHARED_LIMIT for b in re.findall(r"(\d+) bytes smem", log)), log


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_combine_q8_1_compiles_without_spills(tmp_path):
    """The combine with the q8_1 store (fused/launch.py SOURCE_COMBINE, the mat-vec's Q4_K layout)."""
    from hiraishin.kernels.fused.launch import SOURCE_COMBINE
    from hiraishin.kernels.quantize.launch import quantize_defines

    src = tmp_path / "combine_q8_1.cu"
    src.write_text(defines_text({"HX_D": 128, "HX_COMBINE_Q8_1": 1, **quantize_defines("Q4_K"), **shared_defines(4, None)})
                   + load_source(*SOURCE_COMBINE))
    proc = subprocess.run([NVCC, *FLAGS, str(src), "-o", str(tmp_path / "out.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr + proc.stdout
    assert "fattn_combine_q8_1" in re.findall(r"Compiling entry function '(\w+)'", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("layout", [None, "MMA8_Q4_K"])
@pytest.mark.parametrize("queries,build", SHARED_BUILDS[:len(SHARED_QUERIES)])
def test_attention_q8_1_compiles_without_spills(tmp_path, layout, queries, build):
    """The vector kernels with their q8_1 output (fused/launch.py attention_q8_1_epilogue): the same
    register budget as without it, no spills, at every shared-kernel build the plans use."""
    from hiraishin.kernels.fused.launch import attention_q8_1_epilogue

    prelude, extra = attention_q8_1_epilogue(layout)
    src = tmp_path / "attention_q8_1.cu"
    src.write_text(defines_text({"HX_D": 128, **dict(extra), **shared_defines(queries, build)})
                   + load_source(*prelude, SOURCE_VEC))
    proc = subprocess.run([NVCC, *FLAGS, str(src), "-o", str(tmp_path / "out.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr + proc.stdout
    functions = re.findall(r"Compiling entry function '(\w+)'", log)
    assert {"fattn_vec_q1", "fattn_vec_qn", "fattn_vec_shared"} <= set(functions)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log
    regs = dict(zip(functions, re.findall(r"Used (\d+) registers", log)))
    print(f"attention q8_1 {layout}: registers {regs}")


# (early loads level, pass width): each level's one-token build, and the wider builds of levels 2 and 3 (3's is
# made per width, its arrays sized by it)
ROPE_BUILDS = [(0, 1), (1, 1), (2, 1), (3, 1), (2, 16), (3, 2), (3, 3), (3, 16)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("early,tokens", ROPE_BUILDS)
@pytest.mark.parametrize("head_dim,one_block", [(128, True), (128, False), (64, True)])
def test_rope_attention_compiles_without_spills_and_reads_the_cache_coherently(tmp_path, monkeypatch, head_dim,
                                                                                 one_block, early, tokens):
    """fattn_vec_q1_rope (fused/launch.py RopeAttentionLaunch's builds, ATTN_EARLY_LEVELS at the widths above): no
    spills, and no K/V load through the non-coherent read-only path (ld.global.nc), which is undefined for memory
    the kernel writes (it stores the pass's cells, then reads them). Its float loads of q, k, v and the tables may
    use that path."""
    from hiraishin.kernels.fused.launch import ATTN_ROPE_KERNEL, ATTN_ROPE_PRELUDE, attn_early_build
    from hiraishin.kernels.pdl import ENV_PDL_TRIGGER
    from hiraishin.kernels.quantize.launch import quantize_defines

    monkeypatch.setenv(ENV_PDL_TRIGGER, "after_wait")  # the trigger under which level 3 is built
    build = attn_early_build(early, tokens)
    assert ("FV_CACHE_EARLY" in build) == (early == 3)
    defines = {**quantize_defines("Q4_K"), "HX_D": head_dim, "HX_ATTN_ROPE": 1, **build,
               **({"HX_ATTN_Q8_1": 1} if one_block else {})}
    src = tmp_path / "rope_attention.cu"
    src.write_text(defines_text(defines) + load_source(*ATTN_ROPE_PRELUDE, SOURCE_VEC))
    proc = subprocess.run([NVCC, *FLAGS, str(src), "-o", str(tmp_path / "out.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr + proc.stdout
    assert ATTN_ROPE_KERNEL in re.findall(r"Compiling entry function '(\w+)'", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log
    ptx = tmp_path / "rope_attention.ptx"
    proc = subprocess.run([NVCC, *[f for f in FLAGS if f not in ("-Xptxas", "-v", "-c")], "-ptx", str(src), "-o", str(ptx)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    body = re.search(r"\.entry %s\(.*?\n}\n" % ATTN_ROPE_KERNEL, ptx.read_text(), re.S).group(0)
    loads = re.findall(r"\bld\.global[.\w]*", body)
    assert "ld.global.v4.u32" in loads  # the cells' 8 halves at a time
    assert not [ld for ld in loads if ".nc" in ld and ".v4" in ld], loads
