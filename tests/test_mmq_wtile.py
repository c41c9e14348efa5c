"""CPU: Q4_K weights in 16-row tile records (hiraishin/kernels/mmq/wtile.py, HX_WTILE in mma_rows.cu, mmq.cu and
onecol_dp4a.cu): the regrouping is a permutation of the bytes, the kernels reading tiles give the emulator's bits
(on the g++ shim: the MMA kernel's one-column, one- and two-n-tile, two-row-tile and pipelined forms, the multi
launch, the dp4a kernel with and without its activation copy), a kernel reading tiles from ggml's rows is seen to be
wrong, and the switch reaches only what it should. On a GPU: tests/test_mmq_gpu.py."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from cuda_shim import run  # noqa: E402
from test_mmq import MMQ_MAIN, MMQ_MULTI_MAIN, _activations, _inputs  # noqa: E402
from test_mmq_dp4a import MAIN as DP4A_MAIN  # noqa: E402
from test_mmq_dp4a import _dp4a_plan, builder  # noqa: E402,F401  (builder: the shim fixture)

from hiraishin.kernels.mmq import emulate  # noqa: E402
from hiraishin.kernels.mmq.wtile import (  # noqa: E402
    ENV_MMQ_WTILE,
    ENV_MMQ_WTILE_Q6K,
    SUBBLOCK_TILES,
    TILE_QTYPES,
    WTILE_ROWS,
    subblock_prefers_tiles,
    tile_qtypes,
    tile_weight,
    tiles_weight,
    untile_weight,
)
from hiraishin.plans.subblock import subblock_plan  # noqa: E402
from hiraishin.quant import BLOCK_BYTES, random_blocks  # noqa: E402

mmq_launch = importlib.import_module("hiraishin.kernels.mmq.launch")  # (the package's `launch` is a function)
SB = BLOCK_BYTES["Q4_K"]


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(TILE_QTYPES), tiles=st.integers(1, 4), nb=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_tiles_are_a_permutation_of_the_bytes_and_untile_inverts_it(qtype, tiles, nb, seed):
    bb = BLOCK_BYTES[qtype]
    rows = np.random.default_rng(seed).integers(0, 256, (WTILE_ROWS * tiles, nb * bb), dtype=np.uint8)
    t = tile_weight(rows, qtype)
    assert t.shape == rows.shape and t.dtype == np.uint8
    np.testing.assert_array_equal(np.sort(t, axis=None), np.sort(rows, axis=None))
    np.testing.assert_array_equal(untile_weight(t, qtype), rows)
    # where the module docstring says each byte goes: record (tile T, super-block i) of 16 super-blocks, each piece
    # (Q4_K: 4 qs chunks of 32 bytes, the 16-byte header; Q6_K: 13 groups of 16 bytes, the 2-byte d) for 16 rows
    pieces = [(16 + 32 * jp, 32) for jp in range(4)] + [(0, 16)] if qtype == "Q4_K" else \
        [(16 * q, 16) for q in range(13)] + [(208, 2)]
    flat = t.reshape(-1)
    for r in (0, WTILE_ROWS - 1, WTILE_ROWS * tiles - 1):
        for i in (0, nb - 1):
            rec = ((r // WTILE_ROWS) * nb + i) * WTILE_ROWS * bb
            rr = r % WTILE_ROWS
            sb = rows[r, i * bb:(i + 1) * bb]
            at = rec
            for off, size in pieces:
                np.testing.assert_array_equal(flat[at + size * rr:at + size * (rr + 1)], sb[off:off + size])
                at += WTILE_ROWS * size
            assert at == rec + WTILE_ROWS * bb


@pytest.mark.parametrize("shape,dtype", [((15, SB), np.uint8), ((16, SB + 1), np.uint8), ((16, SB), np.int8),
                                         ((16 * SB,), np.uint8)])
def test_rows_that_are_not_whole_tiles_are_refused(shape, dtype):
    with pytest.raises(ValueError, match="^tile_weight: "):
        tile_weight(np.zeros(shape, dtype), "Q4_K")
    with pytest.raises(ValueError, match="^untile_weight: "):
        untile_weight(np.zeros(shape, dtype), "Q4_K")
    with pytest.raises(ValueError, match="tiles are of Q4_K, Q6_K weights, not Q8_0"):
        tile_weight(np.zeros((16, 34), np.uint8), "Q8_0")


def test_only_layer_projections_of_whole_tiles_are_tiled_and_the_switch_is_read(monkeypatch):
    assert tiles_weight("blk.0.ffn_up.weight", "Q4_K", (4096, 12288))
    assert not tiles_weight("blk.0.ffn_down.weight", "Q6_K", (12288, 4096))
    assert not tiles_weight("token_embd.weight", "Q4_K", (4096, 151936))  # rows looked up, not multiplied
    assert not tiles_weight("blk.0.attn_q.weight", "Q4_K", (4096, 1000))  # not whole tiles
    assert tiles_weight("output.weight", "Q4_K", (4096, 151936))  # the head multiplies
    monkeypatch.delenv(ENV_MMQ_WTILE_Q6K, raising=False)
    assert tile_qtypes() == ("Q4_K",)  # Q6_K: opt-in until timed
    monkeypatch.setenv(ENV_MMQ_WTILE_Q6K, "1")
    assert tile_qtypes() == ("Q4_K", "Q6_K")
    assert tiles_weight("blk.0.ffn_down.weight", "Q6_K", (12288, 4096))
    assert tiles_weight("output.weight", "Q6_K", (4096, 151936))
    monkeypatch.delenv(ENV_MMQ_WTILE, raising=False)
    assert subblock_prefers_tiles() is SUBBLOCK_TILES
    monkeypatch.setenv(ENV_MMQ_WTILE, "0")
    assert not subblock_prefers_tiles()
    monkeypatch.setenv(ENV_MMQ_WTILE, "tiles")
    with pytest.raises(ValueError, match=ENV_MMQ_WTILE):
        subblock_prefers_tiles()


def test_a_model_off_cuda_keeps_rows_and_refuses_tiles_by_name(tiny_model_path):
    from hiraishin import Qwen3, ReductionOrder
    from hiraishin.errors import HiraishinError

    m = Qwen3.from_gguf(tiny_model_path, device="cpu", progress=False, n_ctx=64)
    assert m.weight_layout == "rows" and m.weight_layout_for(ReductionOrder.SUBBLOCK) == "rows"
    assert m.use_weight_layout_for(ReductionOrder.SUBBLOCK) == "rows"
    with pytest.raises(HiraishinError, match="CUDA sub-block kernels only, not on cpu"):
        m.set_weight_layout("tiles")
    assert m.weight_layout == "rows"
    with pytest.raises(HiraishinError, match="weight_layout must be one of 'rows', 'tiles', got 'tiled'"):
        m.set_weight_layout("tiled")
    with pytest.raises(HiraishinError, match="not on cpu"):
        Qwen3.from_gguf(tiny_model_path, device="cpu", progress=False, n_ctx=64, weight_layout="tiles")


def test_tiles_turn_off_what_reads_ggml_rows_and_the_copy_is_asked_where_it_fits(monkeypatch):
    monkeypatch.setenv(mmq_launch.ENV_MMQ_STAGE_W, "1")
    monkeypatch.setenv(mmq_launch.ENV_MMQ_PREFETCH_NEXT, "1")
    monkeypatch.setattr(mmq_launch, "DP4A_WSTAGE", True)
    d = mmq_launch.kernel_defines(subblock_plan(3, "Q4_K", 4096), wtile=True)
    assert d["HX_WTILE"] == 1 and d["HX_STAGE_W"] == 0 and d["HX_PREFETCH_NEXT"] == 0
    dp = mmq_launch.kernel_defines(_dp4a_plan("Q4_K", 4096), wtile=True)
    assert dp["HX_WTILE"] == 1 and dp["HX_WSTAGE"] == 1  # the copy of the block's pieces of its tile records
    two = dataclasses.replace(_dp4a_plan("Q4_K", 4096), nwarps=2, tile_rows=2)
    assert mmq_launch.kernel_defines(two, wtile=True)["HX_WSTAGE"] == 0  # (pieces of 4, 8 or 16 rows only)
    assert mmq_launch.kernel_defines(_dp4a_plan("Q4_K", 12288), wtile=True)["HX_WSTAGE"] == 0  # rows of 16 blocks
    assert mmq_launch.kernel_defines(subblock_plan(3, "Q6_K", 4096), wtile=True)["HX_WTILE"] == 1
    dp6 = mmq_launch.kernel_defines(_dp4a_plan("Q6_K", 4096), wtile=True)
    assert dp6["HX_WTILE"] == 1 and dp6["HX_WSTAGE"] == 1  # Q6_K's copy: 8 (or 16) rows a block
    four = dataclasses.replace(_dp4a_plan("Q6_K", 4096), nwarps=4, tile_rows=4)
    assert mmq_launch.kernel_defines(four, wtile=True)["HX_WSTAGE"] == 0  # (its d's would not fill 16-byte units)
    sixteen = dataclasses.replace(_dp4a_plan("Q6_K", 4096), nwarps=16, tile_rows=16)
    assert mmq_launch.kernel_defines(sixteen, wtile=True)["HX_WSTAGE"] == 0  # (55 KB: past the 48 KB a block declares)
    d = mmq_launch.kernel_defines(subblock_plan(3, "Q4_K", 4096))  # ggml's rows: the options as before
    assert d["HX_WTILE"] == 0 and d["HX_STAGE_W"] == 1 and d["HX_PREFETCH_NEXT"] == 0  # (staging excludes the hint)
    assert mmq_launch.kernel_defines(_dp4a_plan("Q4_K", 4096))["HX_WSTAGE"] == 1


def _mma_plans(qtype, k):
    """The MMA kernel's forms over ``qtype`` rows of K = ``k`` (name, plan, extra defines)."""
    def base(wd):
        return dataclasses.replace(subblock_plan(wd, qtype, k), nwarps=4)

    forms = [("one-column", dataclasses.replace(subblock_plan(1, qtype, 1024), nwarps=4), {}),
             ("three-columns", base(3), {}),
             ("two-n-tiles", base(9), {}),
             ("two-row-tiles", dataclasses.replace(base(3), tile_rows=32), {}),
             ("llama-layout", base(3), {"HX_XLAYOUT": 0})]
    return forms + ([("pipelined", base(2), {"HX_PIPELINE_W": 1})] if qtype == "Q4_K" else [])


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 1024, 48), ("Q4_K", 5120, 32), ("Q6_K", 1024, 48), ("Q6_K", 768, 32)])
def test_mma_kernel_reading_tiles_equals_emulator_on_cpu(builder, tmp_path, qtype, k, n):
    w, xq = _inputs(qtype, k, n, ncols=9, seed=21)
    tile_weight(w, qtype).tofile(tmp_path / "w.bin")
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    for name, plan, extra in _mma_plans(qtype, k):
        if plan.k != k:
            continue
        defines = dict(mmq_launch.kernel_defines(plan, None, 0, wtile=True), HX_SHIM=1, **extra)
        exe = builder.build(mmq_launch.SOURCE, defines, MMQ_MAIN, "mmq_wtile")
        layout = None if extra.get("HX_XLAYOUT") == 0 else mmq_launch.activation_layout(plan)
        _activations(xq, plan.ncols, layout).tofile(tmp_path / "x.bin")
        run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, plan.ncols, 0, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(plan.ncols, n)
        np.testing.assert_array_equal(got.view(np.uint32), ref[:plan.ncols].view(np.uint32), err_msg=name)


@pytest.mark.parametrize("qtype", TILE_QTYPES)
def test_a_kernel_reading_tiles_from_ggml_rows_is_seen(builder, tmp_path, qtype):
    """The comparison can fail: the tile kernel fed ggml's rows (what a missed re-layout would do) is wrong."""
    k, n = 1024, 32
    w, xq = _inputs(qtype, k, n, ncols=3, seed=22)
    w.tofile(tmp_path / "w.bin")
    plan = dataclasses.replace(subblock_plan(3, qtype, k), nwarps=4)
    exe = builder.build(mmq_launch.SOURCE, dict(mmq_launch.kernel_defines(plan, None, 0), HX_SHIM=1, HX_WTILE=1),
                        MMQ_MAIN, "mmq_wtile")
    _activations(xq, 3, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, 3, 0, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(3, n)
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    assert not np.allclose(got, ref, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("qtype", TILE_QTYPES)
def test_mmq_multi_reading_tiles_equals_separate_emulators_on_cpu(builder, tmp_path, qtype):
    k, ns, widths = 1024, (32, 16, 48), (1, 3)
    ws = [random_blocks(qtype, n, k, seed=40 + i) for i, n in enumerate(ns)]
    _, xq = _inputs(qtype, k, 1, ncols=max(widths), seed=41)
    np.concatenate([tile_weight(w, qtype) for w in ws]).tofile(tmp_path / "w.bin")
    for wd in widths:
        plan = dataclasses.replace(subblock_plan(wd, qtype, k), nwarps=2)
        exe = builder.build(mmq_launch.SOURCE, dict(mmq_launch.kernel_defines(plan, None, wtile=True), HX_SHIM=1),
                            MMQ_MULTI_MAIN, "mmq_multi_wtile")
        _activations(xq, wd, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
        run(exe, tmp_path / "w.bin", tmp_path / "x.bin", *ns, wd, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32)
        at = 0
        for w, n in zip(ws, ns):
            ref = emulate(w, qtype, xq[:wd], plan)
            np.testing.assert_array_equal(got[at:at + wd * n].reshape(wd, n).view(np.uint32), ref.view(np.uint32),
                                          err_msg=f"{n} rows, {wd} columns")
            at += wd * n


# (type, K, rows, columns, activation copy, weight copy, rows a CUDA block): the copy of tiles (HX_WSTAGE with
# HX_WTILE) for Q4_K at 4, 8 and 16 rows a block and Q6_K at 8, with and without the activations' copy
@pytest.mark.parametrize("qtype,k,n,ncols,xstage,wstage,nwarps", [
    ("Q4_K", 4096, 32, 1, 1, 0, 8), ("Q4_K", 4096, 16, 1, 0, 0, 8), ("Q4_K", 12288, 16, 1, 1, 0, 8),
    ("Q4_K", 4096, 48, 3, 1, 0, 8), ("Q4_K", 4096, 48, 1, 1, 1, 8), ("Q4_K", 4096, 32, 2, 0, 1, 8),
    ("Q4_K", 4096, 32, 1, 1, 1, 4), ("Q4_K", 4096, 48, 1, 1, 1, 16),
    ("Q6_K", 4096, 32, 1, 1, 0, 8), ("Q6_K", 12288, 16, 1, 0, 0, 8), ("Q6_K", 4096, 48, 1, 1, 1, 8),
    ("Q6_K", 4096, 32, 2, 0, 1, 8), ("Q6_K", 4096, 32, 3, 1, 1, 8)])
def test_dp4a_kernel_reading_tiles_equals_emulator_on_cpu(builder, tmp_path, qtype, k, n, ncols, xstage, wstage,
                                                         nwarps, monkeypatch):
    from hiraishin.kernels.quantize.layout import as_layout

    monkeypatch.setattr(mmq_launch, "DP4A_XSTAGE", xstage)
    monkeypatch.setattr(mmq_launch, "DP4A_WSTAGE", bool(wstage))
    plan = dataclasses.replace(_dp4a_plan(qtype, k, ncols), nwarps=nwarps, tile_rows=nwarps)
    w, xq = _inputs(qtype, k, n, ncols=ncols, seed=23)
    tile_weight(w, qtype).tofile(tmp_path / "w.bin")
    as_layout(xq, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
    defines = dict(mmq_launch.kernel_defines(plan, wtile=True), HX_SHIM=1)
    assert (defines["HX_XSTAGE"], defines["HX_WSTAGE"]) == (xstage, wstage)  # (what the library would launch)
    exe = builder.build(mmq_launch.DP4A_SOURCE, defines, DP4A_MAIN, f"dp4a_wtile{xstage}{wstage}{nwarps}")
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", n, 0, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
    ref = emulate(w, qtype, xq, subblock_plan(1, qtype, k))
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype,piece", [("Q4_K", "512 * q + 32 * rr0"), ("Q6_K", "256 * q + 16 * rr0")])
def test_a_wrong_copy_of_tiles_is_seen(builder, tmp_path, qtype, piece, monkeypatch):
    """The comparison can fail: a copy of tiles that takes the other half tile's pieces is wrong."""
    from hiraishin.kernels.quantize.layout import as_layout

    def other_half(text: str) -> str:
        assert text.count(piece) == 1
        return text.replace(piece, piece.replace("rr0", "(rr0 ^ 8)"))

    monkeypatch.setattr(mmq_launch, "DP4A_XSTAGE", 1)
    monkeypatch.setattr(mmq_launch, "DP4A_WSTAGE", True)
    plan = _dp4a_plan(qtype, 4096)
    w, xq = _inputs(qtype, 4096, 32, ncols=1, seed=24)
    tile_weight(w, qtype).tofile(tmp_path / "w.bin")
    as_layout(xq, mmq_launch.activation_layout(plan)).tofile(tmp_path / "x.bin")
    defines = dict(mmq_launch.kernel_defines(plan, wtile=True), HX_SHIM=1)
    assert defines["HX_WSTAGE"] == 1
    exe = builder.build(mmq_launch.DP4A_SOURCE, defines, DP4A_MAIN, "dp4a_wtile_mutant", edit=other_half)
    run(exe, tmp_path / "w.bin", tmp_path / "x.bin", 32, 0, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    assert not np.allclose(got, emulate(w, qtype, xq, subblock_plan(1, qtype, 4096))[0], rtol=1e-3, atol=1e-2)
