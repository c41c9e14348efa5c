"""CPU: the stock MMQ order (hiraishin/plans/mmq_stock.py, hiraishin/kernels/mmq_stock).

* the stream-k pieces and the fixup order against a line-by-line transcription of upstream's
  ``mul_mat_q`` / ``mul_mat_q_stream_k_fixup`` loops (mmq.cuh), empty CUDA blocks included;
* upstream's tile width J (``mul_mat_q_switch_J``);
* the emulator against a plain Python reference of the stated float sequence (exact fma with
  ``fractions``, fp16 rounding with numpy), on real Q4_K/Q6_K blocks (Gemma 3 GGUF) and random
  ones, rows not a multiple of the 128-row tile, widths 9..16 and a prefill width, devices with
  few SMs (so that tiles split into several pieces);
* the plans the variant order gives, the backends' dispatch;
* ``mmq_stock.cu`` on the CPU (g++ shim with a software mma.sync) == the emulator, and nvcc:
  every qtype and columns-per-warp compiles without spills.
(Kernel == emulator on the GPU: tests/test_mmq_stock_gpu.py.)
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hiraishin import ReductionOrder
from hiraishin.devices import DeviceProfile
from hiraishin.errors import PlanError
from hiraishin.kernels import quantize
from hiraishin.kernels.mmq_stock import emulate
from hiraishin.plans import MMQStockPlan, matvec_plan
from hiraishin.plans.mmq_stock import (
    MMQ_J,
    MMQ_J_FALLBACK,
    mmq_stock_plan,
    mmq_tile_cols,
    stream_k_grid,
    stream_k_pieces,
)
from hiraishin.quant import random_blocks

sys.path.insert(0, str(Path(__file__).parent))

VARIANT = ReductionOrder.BATCH_VARIANT


def _device(sm: int) -> DeviceProfile:
    return DeviceProfile(name=f"test-{sm}sm", compute_capability=900, sm_count=sm)


def _inputs(qtype, k, n, ncols, seed=0):
    w = random_blocks(qtype, n, k, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((ncols, k)).astype(np.float32)
    return w, quantize.emulate(x)


# ---- the stream-k split: upstream's loops, transcribed (nsamples = nchannels = 1, blocks_per_iter = 1)

def _upstream_schedule(ntiles: int, nb: int, grid: int):
    """Per tile: the pieces in the order mul_mat_q writes them, and how the output is formed.

    Returns {tile: ("direct", (kb0, kb1))} plus, per fixup, the pieces it adds in its order.
    """
    total = ntiles * nb
    direct, fixup_buf = {}, {}
    for b in range(grid):
        kbc, kbc_stop = b * total // grid, (b + 1) * total // grid
        kb0_start = kbc % nb
        kb0_stop = min(nb, kb0_start + kbc_stop - kbc)
        while kbc < kbc_stop and kb0_stop == nb:
            direct[kbc // nb] = (kb0_start, kb0_stop)
            kbc += nb
            kbc -= kbc % nb
            kb0_start = 0
            kb0_stop = min(nb, kbc_stop - kbc)
        if kbc >= kbc_stop:
            continue
        fixup_buf[b] = (kbc // nb, (kb0_start, kb0_stop))
    adds = {}
    for b0 in range(grid):
        kbc0, kbc0_stop = b0 * total // grid, (b0 + 1) * total // grid
        if kbc0 == kbc0_stop or kbc0 % nb == 0 or (kbc0 // nb == kbc0_stop // nb and kbc0_stop % nb != 0):
            continue
        seq, bidx, kbc_stop = [], b0 - 1, kbc0
        while True:
            kbc = bidx * total // grid
            if kbc == kbc_stop:
                bidx -= 1
                kbc_stop = kbc
                continue
            tile, piece = fixup_buf[bidx]
            assert tile == kbc0 // nb
            seq.append(piece)
            if kbc % nb == 0 or kbc // nb < kbc0 // nb:
                break
            bidx -= 1
            kbc_stop = kbc
        adds[kbc0 // nb] = seq
    return direct, adds


@pytest.mark.parametrize("ntiles,nb,grid", [(32, 16, 132), (8, 16, 132), (96, 16, 132), (32, 48, 132),
                                            (3, 4, 5), (7, 3, 5), (2, 9, 4), (5, 1, 3), (4, 16, 4)])
def test_pieces_follow_upstream_stream_k(ntiles, nb, grid):
    direct, adds = _upstream_schedule(ntiles, nb, grid)
    pieces = stream_k_pieces(ntiles, nb, grid)
    for t, ps in enumerate(pieces):
        assert ps[0][0] == 0 and ps[-1][1] == nb and all(a[1] == b[0] for a, b in itertools.pairwise(ps))
        assert direct[t] == ps[-1]  # the last piece is written to the output
        assert adds.get(t, []) == list(reversed(ps[:-1]))  # the fixup adds the others, newest first


def test_grid_and_tile_cols():
    assert stream_k_grid(32, 132) == 132 and stream_k_grid(128, 132) == 128  # 97 % of the SMs: tiles
    assert stream_k_grid(1187, 132) == 1187 and stream_k_grid(384, 132) == 384  # 97 % of 3 waves
    assert stream_k_grid(200, 132) == 132  # 75 % of 2 waves
    for ncols in range(1, 600):
        for nrows, choices in ((4096, MMQ_J), (200, MMQ_J_FALLBACK)):
            best = min(-(-ncols // j) for j in choices)
            assert mmq_tile_cols(ncols, nrows) == min(j for j in choices if -(-ncols // j) == best)
    assert [mmq_tile_cols(c, 4096) for c in (9, 16, 17, 64, 512)] == [16, 16, 24, 64, 128]
    assert mmq_tile_cols(17, 200) == 32


# ---- the plain reference of the stated float sequence

def _fma(a, b, c):
    """fmaf(a, b, c) exactly: the float32 nearest a*b + c (ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):
        err = abs(Fraction(float(cand)) - exact)
        if best is None or err < best[0] or (err == best[0] and int(cand.view(np.uint32)) % 2 == 0):
            best = (err, cand)
    return np.float32(best[1])


def _f16(v):
    return np.float32(np.float16(np.float32(v)))


def _q8(xq, j, b):
    blk = xq[j, 36 * b:36 * b + 36]
    d, s = blk[:4].view(np.float16).astype(np.float32)
    return d, s, blk[4:].view(np.int8).astype(np.int64)


def _reference_piece(w, r, qtype, xq, j, kb0, kb1):
    acc = np.float32(0.0)
    for i in range(kb0, kb1):
        if qtype == "Q4_K":
            blk = w[r, 144 * i:144 * i + 144]
            d, dmin = blk[:4].view(np.float16).astype(np.float32)
            sc_b = blk[4:16].astype(np.int64)
            for b in range(8):  # get_scale_min_k4
                if b < 4:
                    sc, m = sc_b[b] & 63, sc_b[b + 4] & 63
                else:
                    sc = (sc_b[b + 4] & 0xF) | ((sc_b[b - 4] >> 6) << 4)
                    m = (sc_b[b + 4] >> 4) | ((sc_b[b] >> 6) << 4)
                q = (blk[16 + 32 * (b // 2):48 + 32 * (b // 2)].astype(np.int64) >> (4 * (b % 2))) & 0xF
                dx, sx, qx = _q8(xq, j, 8 * i + b)
                c = int(q @ qx)
                acc = _fma(np.float32(_f16(d * np.float32(sc)) * dx), np.float32(c), acc)
                acc = _fma(-_f16(dmin * np.float32(m)), sx, acc)
        else:
            blk = w[r, 210 * i:210 * i + 210]
            ql, qh = blk[:128].astype(np.int64), blk[128:192].astype(np.int64)
            scales = blk[192:208].view(np.int8).astype(np.int64)
            d = blk[208:210].view(np.float16).astype(np.float32)[0]
            vals = np.empty(256, dtype=np.int64)  # dequantize_row_q6_K's value order
            for n in range(2):
                for l in range(32):
                    a, h = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32]
                    vals[128 * n + l] = (a[l] & 0xF) | (((h[l] >> 0) & 3) << 4)
                    vals[128 * n + l + 32] = (a[l + 32] & 0xF) | (((h[l] >> 2) & 3) << 4)
                    vals[128 * n + l + 64] = (a[l] >> 4) | (((h[l] >> 4) & 3) << 4)
                    vals[128 * n + l + 96] = (a[l + 32] >> 4) | (((h[l] >> 6) & 3) << 4)
            vals -= 32
            for half in range(2):
                tmp = np.float32(0.0)
                for b in range(4 * half, 4 * half + 4):
                    dx, _, qx = _q8(xq, j, 8 * i + b)
                    v = vals[32 * b:32 * b + 32]
                    c = int(scales[2 * b] * (v[:16] @ qx[:16]) + scales[2 * b + 1] * (v[16:] @ qx[16:]))
                    tmp = _fma(np.float32(c), dx, tmp)
                acc = _fma(tmp, d, acc)
    return acc


def _reference(w, r, qtype, xq, j, plan):
    """Output (row r, column j): the tile's pieces, then out = P_m + (((0 + P_m-1) + ...) + P_0)."""
    _, ntx = plan.tiles
    parts = [_reference_piece(w, r, qtype, xq, j, a, b)
             for a, b in plan.pieces()[(r // 128) * ntx + j // plan.tile_cols]]
    s = np.float32(0.0)
    for p in reversed(parts[:-1]):
        s = np.float32(s + p)
    return parts[-1] if len(parts) == 1 else np.float32(parts[-1] + s)


def _check_against_reference(w, qtype, xq, plan, rows, cols):
    got = emulate(w, qtype, xq, plan)
    for r in rows:
        for j in cols:
            want = _reference(w, r, qtype, xq, j, plan)
            assert got[j, r].view(np.uint32) == want.view(np.uint32), (qtype, r, j, got[j, r], want)
    return got


# (qtype, K, rows, SM count): rows across a partial second tile; few SMs split tiles into pieces
REF_CASES = [("Q4_K", 1024, 200, 3), ("Q6_K", 1024, 200, 3), ("Q4_K", 768, 130, 5), ("Q6_K", 512, 129, 132)]


@pytest.mark.parametrize("qtype,k,n,sm", REF_CASES)
def test_emulator_equals_the_stated_sequence(qtype, k, n, sm):
    w, xq = _inputs(qtype, k, n, 16, seed=3)
    for ncols in range(9, 17):
        plan = mmq_stock_plan(ncols, qtype, k, n, _device(sm))
        assert max(len(p) for p in plan.pieces()) > 1 or sm == 132
        _check_against_reference(w, qtype, xq[:ncols], plan, rows=(0, 127, 128, n - 1), cols=(0, ncols - 1))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_prefill_width(qtype):
    k, n, ncols = 512, 200, 160  # J = 128 (fallback set): two column tiles
    w, xq = _inputs(qtype, k, n, ncols, seed=5)
    plan = mmq_stock_plan(ncols, qtype, k, n, _device(3))
    assert plan.tile_cols == 128 and plan.tiles == (2, 2) and {len(p) for p in plan.pieces()} != {1}
    _check_against_reference(w, qtype, xq, plan, rows=(1, 150), cols=(0, 127, 128, 159))


def test_real_gemma_blocks(gemma_gguf_path):
    import gguf

    reader = gguf.GGUFReader(gemma_gguf_path)
    seen = set()
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in ("Q4_K", "Q6_K") or qtype in seen:
            continue
        seen.add(qtype)
        w = np.ascontiguousarray(t.data[:160])
        k = w.shape[1] // (144 if qtype == "Q4_K" else 210) * 256
        x = np.random.default_rng(7).standard_normal((12, k)).astype(np.float32)
        plan = mmq_stock_plan(12, qtype, k, 160, _device(4))
        _check_against_reference(w, qtype, quantize.emulate(x), plan, rows=(0, 131), cols=(0, 11))
    assert seen == {"Q4_K", "Q6_K"}


def _scaled_parts(w, qtype, k):
    """float64 (scale part, min part) per value / per q8_1 block of the weights MMQ multiplies by:
    Q4_K ``half(d*sc)*q`` and ``half(dmin*m)`` (load_tiles_q4_K), Q6_K ``d*sc*(q-32)`` and none."""
    from hiraishin.quant import dequantize

    n = w.shape[0]
    if qtype == "Q6_K":
        return dequantize(w, qtype).reshape(n, k).astype(np.float64), None
    b = w.reshape(n, -1, 144)
    d, dmin = (b[..., 0:4].copy().view(np.float16).astype(np.float32)[..., i:i + 1] for i in (0, 1))
    sc8 = b[..., 4:16].astype(np.int64)
    sc = np.concatenate([sc8[..., 0:4] & 63, (sc8[..., 8:12] & 0xF) | ((sc8[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([sc8[..., 4:8] & 63, (sc8[..., 8:12] >> 4) | ((sc8[..., 4:8] >> 6) << 4)], -1)
    ws = (d * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
    wm = (dmin * m.astype(np.float32)).astype(np.float16).astype(np.float64)
    qs = b[..., 16:].reshape(n, -1, 4, 32).astype(np.int64)
    q = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(n, -1, 8, 32)
    return (ws[..., None] * q).reshape(n, k), wm.reshape(n, k // 32)


@pytest.mark.parametrize("qtype,k,n", [("Q4_K", 2048, 150), ("Q6_K", 3072, 131)])
def test_accuracy_against_float64(qtype, k, n):
    """Within the rounding bound of its chain of fmas, of the weights with fp16 scale products and
    (Q4_K) the min term on the q8_1 ``s`` field: the order computes what upstream's does."""
    w, xq = _inputs(qtype, k, n, 12, seed=17)
    plan = mmq_stock_plan(12, qtype, k, n, _device(5))
    got = emulate(w, qtype, xq, plan).astype(np.float64)
    blocks = xq.reshape(12, k // 32, 36)
    dx = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    sx = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    xd = (dx[:, :, None] * blocks[:, :, 4:].view(np.int8)).reshape(12, k)
    W, mins = _scaled_parts(w, qtype, k)
    ref, mag = xd @ W.T, np.abs(xd) @ np.abs(W).T
    if mins is not None:
        ref, mag = ref - sx @ mins.T, mag + np.abs(sx) @ mins.T
    terms = (2 if qtype == "Q4_K" else 1) * (k // 32) + k // 128 + max(map(len, plan.pieces())) + 2
    assert (np.abs(got - ref) <= terms * 2.0**-24 * mag).all()


def test_row_slices_and_float_inputs():
    w, xq = _inputs("Q4_K", 1024, 300, 12, seed=9)
    plan = mmq_stock_plan(12, "Q4_K", 1024, 300, _device(7))
    full = emulate(w, "Q4_K", xq, plan)
    part = emulate(w[100:260], "Q4_K", xq, plan, row0=100)
    assert np.array_equal(full[:, 100:260].view(np.uint32), part.view(np.uint32))
    x = np.random.default_rng(10).standard_normal((12, 1024)).astype(np.float32)
    assert np.array_equal(emulate(w, "Q4_K", x, plan), emulate(w, "Q4_K", quantize.emulate(x), plan))
    with pytest.raises(ValueError):
        emulate(w, "Q4_K", xq[:11], plan)


# ---- plans and dispatch

def test_variant_plans_past_eight_columns():
    p = matvec_plan(VARIANT, 9, "Q4_K", k=4096, n=4096)
    assert isinstance(p, MMQStockPlan) and p.kernel == "mmq_stock" and p.launches() == [(0, 9)]
    assert p.sm_count == 132 and p.grid == 132 and {len(x) for x in p.pieces()} == {4, 5}
    assert "stream-k over 132 CUDA blocks" in p.describe() and "FP16" in p.describe()
    assert matvec_plan(VARIANT, 8, "Q4_K", k=4096, n=4096).kernel == "mmvq"
    assert matvec_plan(VARIANT, 9, "Q8_0").kernel == "tiled"  # Q8_0 keeps the tiled kernel
    assert not matvec_plan(VARIANT, 12, "Q6_K").shaped  # no weight: it describes, cannot run
    assert "depends on the weight's shape" in matvec_plan(VARIANT, 12, "Q6_K").describe()
    # prefill: J = 128, 4 column tiles of 128 row tiles fill 97 % of 132 SMs: one piece per tile
    wide = matvec_plan(VARIANT, 512, "Q4_K", k=4096, n=4096)
    assert (wide.tile_cols, wide.grid, {len(x) for x in wide.pieces()}) == (128, 128, {1})
    assert matvec_plan(ReductionOrder.BATCH_INVARIANT, 12, "Q4_K", k=4096, n=4096).kernel == "mmvq"
    with pytest.raises(PlanError):
        mmq_stock_plan(9, "Q8_0", 4096, 4096)
    with pytest.raises(PlanError):
        mmq_stock_plan(9, "Q4_K", 1000, 4096)
    with pytest.raises(PlanError):
        _ = matvec_plan(VARIANT, 12, "Q6_K").pieces()


def test_cpu_backend_runs_the_stock_order():
    from hiraishin.backends.cpu import CpuBackend

    be = CpuBackend()
    w = random_blocks("Q6_K", 140, 512, seed=12)
    x = np.random.default_rng(13).standard_normal((10, 512)).astype(np.float32)
    got = be.mul_mat(w, "Q6_K", x, VARIANT)
    plan = matvec_plan(VARIANT, 10, "Q6_K", k=512, n=140)
    assert np.array_equal(got.view(np.uint32), emulate(w, "Q6_K", quantize.emulate(x), plan).view(np.uint32))
    one = np.concatenate([be.mul_mat(w, "Q6_K", x[j:j + 1], VARIANT) for j in range(10)])
    assert not np.array_equal(one, got)  # past 8 columns the sums differ from the mat-vec's


def test_launcher_arguments_without_a_gpu(monkeypatch):
    """The prepared launch's grids, arguments and scratch policy, with numpy standing in for CuPy."""
    import importlib
    import types

    L = importlib.import_module("hiraishin.kernels.mmq_stock.launch")  # the module, not the function

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=np.asarray, empty=np.empty,
                                                                   float32=np.float32))
    calls = []

    def kernel(name):
        def run(grid, block, args):
            calls.append((name, grid, block, args))
        return run

    monkeypatch.setattr(L, "_kernels", lambda plan, max_regs="default": (kernel("main"), kernel("fixup")))
    for ncols, kept in ((12, True), (200, False)):
        plan = mmq_stock_plan(ncols, "Q4_K", 1024, 300, _device(5))
        items, fixups = plan.tables()
        lw = L.MMQStockLaunch(plan)
        scratches = []
        for _ in range(2):
            calls.clear()
            out = lw("w", "xq", "out")
            main, fix = calls
            assert out == "out" and main[0] == "main" and fix[0] == "fixup"
            assert main[1] == (len(items) * (128 // plan.rows_per_block), -(-plan.tile_cols // plan.cols_per_warp), 1)
            assert main[2] == (32 * plan.nwarps, 1, 1) and fix[1] == (len(fixups), plan.tile_cols, 1)
            assert main[3][:3] == ("w", "xq", "out") and main[3][5:] == (300, ncols, 300)
            assert fix[3][0] == "out" and fix[3][1] is main[3][3]  # the fixup reads the pieces just written
            assert main[3][3].size == max(1, int((items[:, 4] >= 0).sum()) * plan.tile_cols * 128)
            scratches.append(main[3][3])
        assert (scratches[0] is scratches[1]) == kept  # prefills take scratch per call


# ---- the CUDA source on the CPU (g++ shim) and nvcc

STOCK_MAIN = r"""
int main(int argc, char** argv) {
    // argv: weights, q8_1, items, fixups, nrows, ncols, n_items, n_fixups, grid y, scratch floats, out
    int nrows = atoi(argv[5]), ncols = atoi(argv[6]), n_items = atoi(argv[7]), n_fix = atoi(argv[8]);
    unsigned gy = atoi(argv[9]);
    auto w = hx_read(argv[1]); auto x = hx_read(argv[2]); auto it = hx_read(argv[3]); auto fx = hx_read(argv[4]);
    std::vector<float> scratch(atoi(argv[10]) + 1, 0.0f);
    std::vector<float> out((size_t)ncols * nrows, -12345.0f);
    hx_launch({(unsigned)(n_items * HX_SUBROWS), gy, 1}, {32u * HX_NWARPS, 1, 1}, 0, [&] {
        hx_mmq_stock(w.data(), x.data(), out.data(), scratch.data(), (const int*)it.data(), nrows, ncols,
                     (long long)nrows); });
    if (n_fix)
        hx_launch({(unsigned)n_fix, (unsigned)HX_J, 1}, {HX_TILE_ROWS, 1, 1}, 0, [&] {
            hx_mmq_stock_fixup(out.data(), scratch.data(), (const int*)fx.data(), nrows, ncols, (long long)nrows); });
    hx_write(argv[11], out.data(), out.size() * 4);
}"""


@pytest.mark.parametrize("qtype,k,n,ncols,sm,nwarps,cpw", [("Q4_K", 1024, 150, 9, 3, 4, 16),
                                                         ("Q6_K", 1024, 150, 12, 3, 8, 16),
                                                         ("Q6_K", 512, 130, 40, 5, 2, 32)])
def test_source_equals_emulator_on_cpu(tmp_path, qtype, k, n, ncols, sm, nwarps, cpw):
    import dataclasses

    from cuda_shim import GXX, ShimBuilder, run
    from test_mmq import MMA_SHIM_H

    from hiraishin.kernels.mmq_stock.launch import SOURCE, kernel_defines

    if GXX is None:
        pytest.skip("needs g++ (C++20)")
    plan = dataclasses.replace(mmq_stock_plan(ncols, qtype, k, n, _device(sm)), nwarps=nwarps, cols_per_warp=cpw)
    items, fixups = plan.tables()
    assert len(fixups)  # some tiles are split: the fixup kernel runs
    w, xq = _inputs(qtype, k, n, ncols, seed=21)
    for name, a in (("w", w), ("x", xq), ("i", items), ("f", fixups)):
        np.ascontiguousarray(a).tofile(tmp_path / f"{name}.bin")
    builder = ShimBuilder(tmp_path)
    (tmp_path / "hx_mma_shim.h").write_text(MMA_SHIM_H)
    exe = builder.build(SOURCE, dict(kernel_defines(plan, None), HX_SHIM=1), STOCK_MAIN, "mmq_stock")
    nslots = int((items[:, 4] >= 0).sum())
    run(exe, *(tmp_path / f"{s}.bin" for s in "wxif"), n, ncols, len(items), len(fixups),
        -(-plan.tile_cols // cpw), nslots * plan.tile_cols * 128, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
    np.testing.assert_array_equal(got.view(np.uint32), emulate(w, qtype, xq, plan).view(np.uint32))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("ncols", [12, 512])
def test_nvcc_compiles_without_spills(tmp_path, qtype, ncols):
    from test_mmvq_compile import NVCC, _compile, _spills

    from hiraishin.kernels.mmq_stock.launch import SOURCE, kernel_defines

    if NVCC is None:
        pytest.skip("needs a local nvcc")
    for k in (4096, 12288):
        defines = kernel_defines(mmq_stock_plan(ncols, qtype, k, 4096))
        log = _compile(tmp_path / str(k), SOURCE, defines)
        if _spills(log) and defines["HX_MIN_BLOCKS"] > 1:  # what launch._kernel does: relax the cap
            log = _compile(tmp_path / f"{k}u", SOURCE, {**defines, "HX_MIN_BLOCKS": 1})
        assert not _spills(log), log
