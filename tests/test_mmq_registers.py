"""Registers of the sub-block kernels for sm_90, from ptxas here (no GPU): the launches the library makes,
and those of the warp-split tuning file, compile without spills (bench/regs_mmq.py's compile)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")


@pytest.fixture(scope="module")
def regs():
    sys.path.insert(0, str(REPO / "bench"))
    import regs_mmq

    return regs_mmq


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 4096, 12288), ("Q6_K", 12288, 4096), ("Q6_K", 4096, 151936)])
def test_library_launches_compile_without_spills(tmp_path, regs, qtype, k, n):
    from hiraishin.plans.subblock import subblock_plan

    for wd in (1, 3, 6, 16):  # (6: the fewest columns of the MMA8 layouts)
        report, _ = regs.library_kernel(subblock_plan(wd, qtype, k, n=n), "default", str(tmp_path))
        assert report["hx_mmq"][1] == 0, (qtype, k, n, wd, report)


def test_warp_split_file_fits_80_registers_where_two_n_tiles_take_128(tmp_path, regs, monkeypatch):
    """bench/tuning/split-wide.json's launches of 16 columns: at most 80 registers, no spill, 3 blocks of 8 warps
    per SM (Q4_K), where the library's two-n-tile block spills at 80 and takes more (128 with nvcc 13.0: 2
    blocks): what the split is for."""
    import hiraishin.plans.subblock as sb

    base = sb.subblock_plan(16, "Q4_K", 4096, n=12288)
    two_tiles, blocks = regs.library_kernel(base, "default", str(tmp_path))
    assert two_tiles["hx_mmq"][0] > 80 and two_tiles["hx_mmq"][1] == 0 and blocks <= 2
    monkeypatch.setattr(sb, "SUBBLOCK_MMA_TUNING", sb._read_tuning(str(REPO / "bench/tuning/split-wide.json")))
    split = sb.subblock_plan(16, "Q4_K", 4096, n=12288)
    assert split == dataclasses.replace(base, warp_split=2, max_regs=80, prefetch_x=0)
    report, blocks = regs.library_kernel(split, "default", str(tmp_path))
    assert report["hx_mmq"][0] <= 80 and report["hx_mmq"][1] == 0 and report["hx_mmq_multi"][1] == 0
    assert blocks == 3


@pytest.mark.parametrize("switch", [("HIRAISHIN_MMQ_XLAYOUT", "2"), ("HIRAISHIN_MMQ_STAGE_W", "wide")])
def test_wide_switches_keep_two_blocks_per_sm(tmp_path, regs, monkeypatch, switch):
    """The MMA8 layouts (the default from 6 columns) and the opt-in staging of the 9..16-column launches, each
    alone, keep the Q4_K two-n-tile launch at the library's register cap without spills (2 blocks of 8 warps per
    SM), what their A/B on a GPU assumed."""
    import importlib

    from hiraishin.plans.subblock import subblock_plan

    var, value = switch
    monkeypatch.setenv(var, value)
    mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")
    # (read at import) the MMA8 layouts alone, or the staging with the MMA layouts (the two together: 180 registers)
    monkeypatch.setattr(mmq_launch, "MMQ_XLAYOUT", int(value) if var == mmq_launch.ENV_MMQ_XLAYOUT else 1)
    plan = subblock_plan(16, "Q4_K", 4096, n=12288)
    key = "HX_XLAYOUT" if var == mmq_launch.ENV_MMQ_XLAYOUT else "HX_STAGE_W"
    assert mmq_launch.kernel_defines(plan)[key] == (2 if key == "HX_XLAYOUT" else 1)  # the switch took
    report, blocks = regs.library_kernel(plan, "default", str(tmp_path))
    assert report["hx_mmq"][1] == 0 and blocks == 2, report
