"""norm_mmvq.cu on the CPU (the g++ shim, tests/cuda_shim.py) == the fused norm then the mat-vec, bit for bit.

``hx_norm_mmvq`` norms its input rows in every CUDA block and then runs mmvq.cu's rows; its outputs
(and the residual sum block 0 writes) must equal the emulators of the unfused launches it replaces
(hx_add_rms_norm_q8_1 / hx_rms_norm_q8_1 into the mat-vec's layout, then mmvq) for every weight of a
group, with and without the residual, for trees played 1:1 and several to a thread, and rows the
rows per block do not divide. Also: the geometry chosen for each row length, and a deliberate change
of the norm's order is seen.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, ShimBuilder, bits, run

from hiraishin.kernels import quantize
from hiraishin.kernels.mmvq import emulate as mmvq_emulate
from hiraishin.kernels.norm_mmvq import emulate
from hiraishin.kernels.norm_mmvq.launch import SOURCE, norm_mmvq_defines, norm_mmvq_geometry
from hiraishin.kernels.quantize.layout import layout_for
from hiraishin.plans import MatVecPlan
from hiraishin.quant import random_blocks

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

EPS = np.float32(1e-6)
EPS_ARG = repr(float(EPS))

MAIN = r'''
int main(int argc, char** argv) {
    // argv: x, r ("-": none), norm weight, weights (three row counts one after another), n0, n1, n2,
    // eps, out, s out ("-": none), CUDA blocks (0: one per HX_NORM_GROUPS row blocks; fewer: they stride)
    const int k = HX_NBLOCKS * HX_QK;
    int n[3] = {atoi(argv[5]), atoi(argv[6]), atoi(argv[7])};
    const float eps = strtof(argv[8], nullptr);
    auto x = hx_read(argv[1]); auto nw = hx_read(argv[3]); auto w = hx_read(argv[4]);
    const bool has_r = std::strcmp(argv[2], "-") != 0, has_s = std::strcmp(argv[10], "-") != 0;
    std::vector<unsigned char> r = has_r ? hx_read(argv[2]) : std::vector<unsigned char>();
    int nb[3]; unsigned rblocks = 0;
    for (int i = 0; i < 3; ++i) { nb[i] = (n[i] + HX_RPB - 1) / HX_RPB; rblocks += nb[i]; }
    const unsigned char* wp[3] = {w.data(), w.data() + (size_t)n[0] * HX_ROW_BYTES,
                                  w.data() + (size_t)(n[0] + n[1]) * HX_ROW_BYTES};
    std::vector<float> out((size_t)HX_NCOLS * (n[0] + n[1] + n[2]), -12345.0f);
    std::vector<float> s((size_t)HX_NCOLS * k, -12345.0f);
    float* op[3] = {out.data(), out.data() + (size_t)HX_NCOLS * n[0], out.data() + (size_t)HX_NCOLS * (n[0] + n[1])};
    const unsigned grid = atoi(argv[11]);
    hx_launch({grid ? grid : (rblocks + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS, 1, 1},
              {32, (unsigned)HX_NWARPS, (unsigned)HX_NORM_GROUPS},
              (size_t)HX_NORM_GROUPS * (HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
              [&] { hx_norm_mmvq((const float*)x.data(), has_r ? (const float*)r.data() : nullptr,
                                 (const float*)nw.data(), has_s ? s.data() : nullptr, k, eps,
                                 wp[0], op[0], n[0], nb[0], wp[1], op[1], n[1], nb[1], wp[2], op[2], n[2]); });
    hx_write(argv[9], out.data(), out.size() * 4);
    if (has_s) hx_write(argv[10], s.data(), s.size() * 4);
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("norm-mmvq-shim"))


def _inputs(rng, T, k):
    x = (rng.standard_normal((T, k)) * 2).astype(np.float32)
    x[0, :32] = 0.0
    r = (rng.standard_normal((T, k)) * 3).astype(np.float32)
    r[0, :32] = 0.0  # with x: a zero q8_1 block
    nw = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    return x, r, nw


# (qtype, k, columns, rows per block, warps, groups, residual): trees played 1:1 (k=256: a tree of
# 256 threads, 2 groups of 4 warps) and several to a thread (k=1024: 512 threads playing 1024;
# k=4096: four values per tree thread), one and several columns, with and without the residual.
CASES = [("Q4_K", 1024, 1, 4, 4, 4, True), ("Q4_K", 256, 2, 2, 4, 2, False), ("Q6_K", 1024, 3, 2, 4, 2, True),
         ("Q4_K", 4096, 2, 2, 4, 2, True), ("Q8_0", 1024, 1, 4, 4, 4, True)]


# A grid of fewer CUDA blocks than row groups (launch.py NORM_MMVQ_PER_SM): each block makes the norm once and
# strides over the rows of several blocks, the last of them past the end of the last weight.
STRIDED = [("Q4_K", 1024, 1, 4, 4, 4, True, 1), ("Q6_K", 1024, 3, 2, 4, 2, True, 2),
           ("Q4_K", 256, 2, 2, 4, 2, False, 3)]


@pytest.mark.parametrize("qtype,k,ncols,rpb,nwarps,groups,residual,grid",
                         [case + (0,) for case in CASES] + STRIDED)
def test_norm_mmvq_source_equals_norm_then_matvec(shim, tmp_path, qtype, k, ncols, rpb, nwarps, groups, residual,
                                                 grid):
    rng = np.random.default_rng(k + ncols)
    ns = (11, 5, 7)  # row counts the rows per block do not divide
    ws = [random_blocks(qtype, n, k, seed=20 + i) for i, n in enumerate(ns)]
    x, r, nw = _inputs(rng, ncols, k)
    geometry = norm_mmvq_geometry(k, nwarps, groups)
    assert geometry is not None and geometry[0] == groups
    defines = norm_mmvq_defines(qtype, k, ncols, rpb, nwarps, layout_for(qtype), geometry)
    for name, a in (("x", x), ("r", r), ("nw", nw)):
        a.tofile(tmp_path / f"{name}.bin")
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    run(shim.build(SOURCE, defines, MAIN, "norm_mmvq"), tmp_path / "x.bin", tmp_path / "r.bin" if residual else "-",
        tmp_path / "nw.bin", tmp_path / "w.bin", *ns, EPS_ARG, tmp_path / "o.bin",
        tmp_path / "s.bin" if residual else "-", grid)
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rpb, cols_per_launch=ncols, ncols=ncols)
    want, s = emulate(x, r if residual else None, nw, EPS, [(w, qtype) for w in ws], plan)
    at = 0
    for n, part in zip(ns, want):
        np.testing.assert_array_equal(bits(got[at:at + ncols * n].reshape(ncols, n)), bits(part),
                                      err_msg=f"{defines} weight of {n} rows")
        at += ncols * n
    if residual:
        np.testing.assert_array_equal(bits(np.fromfile(tmp_path / "s.bin", np.float32).reshape(ncols, k)), bits(s))


def test_norm_mmvq_source_sees_a_broken_hand_over(shim, tmp_path):
    """The comparison above can fail: the same kernel with every row group handing its warps' partials
    over through the first group's shared memory (a plausible slip of the offset) gives other outputs.
    (A norm summed in another order would mostly not show here: the q8_1 values scale with the norm,
    and the fp16 block scale hides its last bits.)"""
    qtype, k, ns = "Q4_K", 1024, (11, 5, 7)
    ws = [random_blocks(qtype, n, k, seed=30 + i) for i, n in enumerate(ns)]
    x, r, nw = _inputs(np.random.default_rng(5), 1, k)
    geometry = norm_mmvq_geometry(k, 4, 4)
    defines = norm_mmvq_defines(qtype, k, 1, 4, 4, layout_for(qtype), geometry)
    for name, a in (("x", x), ("r", r), ("nw", nw)):
        a.tofile(tmp_path / f"{name}.bin")
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=4, cols_per_launch=1, ncols=1)
    want, _ = emulate(x, r, nw, EPS, [(w, qtype) for w in ws], plan)
    old = "tmp_shared + threadIdx.z * ("
    new = "tmp_shared + 0 * ("

    def edit(text):
        assert text.count(old) == 1
        return text.replace(old, new)

    exe = shim.build(SOURCE, defines, MAIN, "norm_mmvq_changed", edit=edit)
    run(exe, tmp_path / "x.bin", tmp_path / "r.bin", tmp_path / "nw.bin", tmp_path / "w.bin", *ns, EPS_ARG,
        tmp_path / "o.bin", "-", 0)
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    assert not np.array_equal(bits(got), bits(np.concatenate([p.ravel() for p in want])))


def test_norm_mmvq_geometry():
    # Qwen3-0.6B rows (1024 values, a tree of 1024 threads with one value each): 4 groups of 4 warps
    # play it two tree threads to a thread; the 8B's 4096 values: four values per tree thread.
    assert norm_mmvq_geometry(1024, 4) == (4, 2, 1)
    assert norm_mmvq_geometry(4096, 4) == (4, 2, 4)
    assert norm_mmvq_geometry(4096, 4, groups=8) == (8, 1, 4)
    assert norm_mmvq_geometry(256, 4) == (2, 1, 1)  # a tree of 256 threads holds two groups of 128
    assert norm_mmvq_geometry(1000, 4) is None  # not a multiple of 32
    assert norm_mmvq_geometry(64, 4) == (2, 1, 1)  # short rows: a 256-thread tree, most threads idle
    assert norm_mmvq_geometry(256, 16) is None  # one group of 16 warps is more than the 256-thread tree


def test_emulator_is_norm_then_matvec():
    """The emulator is literally the composition (a check of its plumbing, both residual forms)."""
    qtype, k = "Q4_K", 256
    w = random_blocks(qtype, 9, k, seed=3)
    x, r, nw = _inputs(np.random.default_rng(9), 2, k)
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=2, cols_per_launch=2, ncols=2)
    (out,), s = emulate(x, r, nw, EPS, [(w, qtype)], plan)
    from hiraishin.kernels.fused.emulate import emulate_add_rms_norm_q8_1

    s2, xq, y = emulate_add_rms_norm_q8_1(x, r, nw, EPS)
    np.testing.assert_array_equal(bits(s), bits(s2))
    np.testing.assert_array_equal(bits(out), bits(mmvq_emulate(w, qtype, quantize.emulate(y), plan)))
    (out0,), none = emulate(x, None, nw, EPS, [(w, qtype)], plan)
    assert none is None and out0.shape == (2, 9)


def test_resident_grid_caps_blocks_per_sm_by_what_fits():
    from hiraishin.kernels.mmvq.launch import resident_grid

    assert resident_grid(1024, 0, 4, 132) == 1024  # no cap: one CUDA block per row groups
    assert resident_grid(1024, 2, 4, 132) == 264
    assert resident_grid(1024, 8, 3, 132) == 396  # never more than fit at once
    assert resident_grid(100, 2, 4, 132) == 100  # fewer blocks than the cap
    assert resident_grid(1024, 1, 0, 132) == 132  # a driver answer of 0 still launches a block per SM


def test_sweep_variants_start_from_the_library_limits():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import sweep_norm

    from hiraishin.kernels.fused import launch as fused_launch
    from hiraishin.kernels.norm_mmvq import launch as norm_mmvq

    saved = {name: getattr(norm_mmvq, name) for name in sweep_norm._MMVQ_LIMITS}
    threads = fused_launch.NORM_BLOCK_THREADS
    try:
        knobs = sweep_norm._apply("256/mmvq=1:100000:4:2")
        assert (knobs["norm_mmvq_max_tokens"], knobs["norm_mmvq_per_sm"]) == (1, 2)
        knobs = sweep_norm._apply("256/mmvq=4:1024:4")  # no S: no cap, not the variant before's
        assert (knobs["norm_mmvq_max_tokens"], knobs["norm_mmvq_per_sm"]) == (4, saved["NORM_MMVQ_PER_SM"])
        knobs = sweep_norm._apply("256")  # no "/mmvq=": the library's limits (the fusion off)
        assert {name.upper(): v for name, v in knobs.items() if name.startswith("norm_mmvq")} == saved
    finally:
        for name, value in saved.items():
            setattr(norm_mmvq, name, value)
        fused_launch.NORM_BLOCK_THREADS = threads
        fused_launch._launches.clear()


def test_limits_from_the_environment(monkeypatch):
    from hiraishin.errors import BackendError
    from hiraishin.kernels.norm_mmvq.launch import ENV_NORM_MMVQ, limits_from_env

    assert limits_from_env("") == {}
    assert limits_from_env("1:100000") == {"NORM_MMVQ_MAX_TOKENS": 1, "NORM_MMVQ_MAX_BLOCKS": 100000}
    monkeypatch.setenv(ENV_NORM_MMVQ, "1:1024:4:2")
    assert limits_from_env()["NORM_MMVQ_PER_SM"] == 2
    for bad in ("1:2:3:4:5", "on", "1:-2"):
        with pytest.raises(BackendError, match=ENV_NORM_MMVQ):
            limits_from_env(bad)


def test_the_backend_fuses_a_norm_into_one_launch_of_every_weight(monkeypatch):
    """Q, K and V of one type: one hx_norm_mmvq launch; a Q6_K V beside Q4_K Q and K (half of Qwen3 Q4_K_M's
    layers): one hx_norm_mmvq_mixed launch where mmvq_mixed would take them, else none (a fused launch per type
    would make the norm twice in as many launches as the norm launch and mmvq_mixed)."""
    import importlib
    from types import SimpleNamespace

    from hiraishin.backends.cuda import CudaOps
    from hiraishin.kernels.norm_mmvq import launch as norm_mmvq

    mmvq_launch = importlib.import_module("hiraishin.kernels.mmvq.launch")  # (the package's `launch` is a function)
    from hiraishin.plans.matvec import matvec_traits

    monkeypatch.setattr(norm_mmvq, "NormMatVecLaunch", lambda *args: ("one type",) + args)
    monkeypatch.setattr(norm_mmvq, "NormMixedMatVecLaunch", lambda *args: ("mixed",) + args)
    monkeypatch.setattr(norm_mmvq, "NormArgmaxLaunch", lambda *args: ("head and token",) + args)

    def mv(qtype, n, k=1024, rows=1):
        plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=rows, cols_per_launch=1, ncols=1)
        t = matvec_traits(qtype)
        return SimpleNamespace(group=(qtype, k // t.qk * t.block_bytes, plan), n=n, plan=plan, layout=qtype,
                               qtype=qtype)

    def plan(mvs, max_blocks=1024):
        return CudaOps._plan_norm_mmvq(mvs, 1, 1024, 1e-6, 1, max_blocks)

    head = CudaOps._plan_norm_mmvq([mv("Q6_K", 5000, rows=4)], 1, 1024, 1e-6, 1, 1 << 30, head=True)
    assert [(args[:3], idx) for args, idx in head] == [(("head and token", "Q6_K", 5000), [0])]
    one_type = plan([mv("Q4_K", 2048), mv("Q4_K", 1024), mv("Q4_K", 1024)])
    assert [(args[:3], idx) for args, idx in one_type] == [(("one type", "Q4_K", (2048, 1024, 1024)), [0, 1, 2])]
    qkv = [mv("Q4_K", 2048), mv("Q4_K", 1024), mv("Q6_K", 1024, rows=2)]
    (args, idx), = plan(qkv)
    assert args[:4] == ("mixed", ("Q4_K", "Q4_K", "Q6_K"), (2048, 1024, 1024), (1, 1, 2)) and idx == [0, 1, 2]
    assert plan(qkv, max_blocks=768) is None  # 768 + 128 CUDA blocks of four row blocks
    assert plan([mv("Q6_K", 1024), mv("Q4_K", 2048), mv("Q6_K", 1024)]) is None  # types interleaved: no mmvq_mixed
    from hiraishin.backends.cuda_matvec import mixed_groups
    assert mixed_groups({("alone", 0): [0], qkv[2].group: [1]}, 2) is None  # a weight launched alone pairs with none
    monkeypatch.setattr(mmvq_launch, "MIXED", False)
    assert plan(qkv) is None  # HIRAISHIN_MMVQ_MIXED=0: a launch per type, and so the norm launch
    assert plan([mv("Q4_K", 3072), mv("Q4_K", 3072)]) is None  # more CUDA blocks than NORM_MMVQ_MAX_BLOCKS


def test_norm_launches_fit_a_blocks_shared_memory():
    from hiraishin.kernels.norm_mmvq.launch import norm_mmvq_fits

    # Qwen3-8B rows (4,096 values): Q4_K's layout 416 bytes and Q6_K's 288 a super-block, a token
    assert norm_mmvq_fits(("Q4_K",), 4096, 4, 2, 4, 4)  # 26.6 KiB of rows + 12 KiB of hand-over
    assert norm_mmvq_fits(("Q4_K", "Q6_K"), 4096, 2, 4, 4, 4)
    assert not norm_mmvq_fits(("Q4_K", "Q6_K"), 4096, 3, 4, 4, 4)  # 33.8 + 18 KiB
    with pytest.raises(ValueError, match="shared memory"):
        from hiraishin.kernels.norm_mmvq.launch import NormMixedMatVecLaunch
        NormMixedMatVecLaunch(("Q4_K", "Q4_K", "Q6_K"), (4096, 1024, 1024), (4, 4, 2), 4096, 3, 4, 1e-6)


MAIN_MIXED = r'''
int main(int argc, char** argv) {
    // argv: x, r ("-": none), norm weight, weights (the slots' rows one after another), n0, n1, n2, eps, out,
    // s out ("-": none), CUDA blocks (0: every CUDA block of both types; fewer: they stride)
    const int k = HX_A_NBLOCKS * HX_A_QK;
    int n[3] = {atoi(argv[5]), atoi(argv[6]), atoi(argv[7])};
    const float eps = strtof(argv[8], nullptr);
    auto x = hx_read(argv[1]); auto nw = hx_read(argv[3]); auto w = hx_read(argv[4]);
    const bool has_r = std::strcmp(argv[2], "-") != 0, has_s = std::strcmp(argv[10], "-") != 0;
    std::vector<unsigned char> r = has_r ? hx_read(argv[2]) : std::vector<unsigned char>();
    int nb[3]; int na = 0, nbb = 0; size_t at = 0; const unsigned char* wp[3];
    for (int i = 0; i < 3; ++i) {
        const bool a = i < HX_B_FIRST;
        const int rpb = a ? HX_A_RPB : HX_B_RPB;
        nb[i] = (n[i] + rpb - 1) / rpb; (a ? na : nbb) += nb[i];
        wp[i] = w.data() + at;
        at += (size_t)n[i] * (a ? HX_A_NBLOCKS * HX_A_BLOCK_BYTES : HX_B_NBLOCKS * HX_B_BLOCK_BYTES);
    }
    std::vector<float> out((size_t)HX_NCOLS * (n[0] + n[1] + n[2]), -12345.0f);
    std::vector<float> s((size_t)HX_NCOLS * k, -12345.0f);
    float* op[3] = {out.data(), out.data() + (size_t)HX_NCOLS * n[0], out.data() + (size_t)HX_NCOLS * (n[0] + n[1])};
    const unsigned all = (na + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS + (nbb + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS;
    const unsigned grid = atoi(argv[11]);
    const int rmax = HX_A_RPB > HX_B_RPB ? HX_A_RPB : HX_B_RPB;
    hx_launch({grid ? grid : all, 1, 1}, {32, (unsigned)HX_NWARPS, (unsigned)HX_NORM_GROUPS},
              (size_t)HX_NORM_GROUPS * (HX_NWARPS - 1) * HX_NCOLS * rmax * 32 * 4,
              [&] { hx_norm_mmvq_mixed((const float*)x.data(), has_r ? (const float*)r.data() : nullptr,
                                       (const float*)nw.data(), has_s ? s.data() : nullptr, k, eps,
                                       wp[0], op[0], n[0], nb[0], wp[1], op[1], n[1], nb[1], wp[2], op[2], n[2]); });
    hx_write(argv[9], out.data(), out.size() * 4);
    if (has_s) hx_write(argv[10], s.data(), s.size() * 4);
}'''

# (types of the weights, their row counts, rows per CUDA block of type A and of B, k, columns, residual, grid):
# Q4_K Q and K beside a Q6_K V (the Qwen3 Q4_K_M layers), type B first at slot 1, two weights (slot 2 empty);
# row counts the rows per block and the four groups do not divide (CUDA blocks with past-the-end groups of
# each type); full grids (0) and strided ones.
MIXED = [(("Q4_K", "Q4_K", "Q6_K"), (11, 5, 7), (2, 1), 1024, 1, True, 0),
         (("Q4_K", "Q4_K", "Q6_K"), (11, 5, 7), (2, 1), 1024, 1, True, 2),
         (("Q4_K", "Q6_K", "Q6_K"), (9, 6, 3), (1, 2), 256, 2, False, 1),
         (("Q4_K", "Q6_K"), (13, 10), (4, 2), 512, 3, True, 3)]


@pytest.mark.parametrize("qtypes,ns,rows,k,ncols,residual,grid", MIXED)
def test_norm_mmvq_mixed_source_equals_norm_then_each_types_matvec(shim, tmp_path, qtypes, ns, rows, k, ncols,
                                                                   residual, grid):
    from hiraishin.kernels.norm_mmvq.launch import MIXED_SOURCE, norm_mixed_defines

    kinds = list(dict.fromkeys(qtypes))
    b_first = qtypes.index(kinds[1])
    full = tuple(ns) + (0,) * (3 - len(ns))
    ws = [random_blocks(q, n, k, seed=70 + i) for i, (q, n) in enumerate(zip(qtypes, ns))]
    x, r, nw = _inputs(np.random.default_rng(k + ncols), ncols, k)
    defines = norm_mixed_defines(tuple(kinds), rows, k, ncols, 4, b_first, norm_mmvq_geometry(k, 4))
    for name, a in (("x", x), ("r", r), ("nw", nw)):
        a.tofile(tmp_path / f"{name}.bin")
    np.concatenate([w.reshape(-1) for w in ws]).tofile(tmp_path / "w.bin")  # rows of two byte lengths
    exe = shim.build(MIXED_SOURCE, defines, MAIN_MIXED, "norm_mmvq_mixed")
    run(exe, tmp_path / "x.bin", tmp_path / "r.bin" if residual else "-", tmp_path / "nw.bin", tmp_path / "w.bin",
        *full, EPS_ARG, tmp_path / "o.bin", tmp_path / "s.bin" if residual else "-", grid)
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    at = 0
    for i, (q, n, w) in enumerate(zip(qtypes, ns, ws)):
        plan = MatVecPlan("mmvq", q, nwarps=4, rows_per_block=rows[0 if i < b_first else 1], cols_per_launch=ncols,
                          ncols=ncols)
        (want,), s = emulate(x, r if residual else None, nw, EPS, [(w, q)], plan)
        np.testing.assert_array_equal(bits(got[at:at + ncols * n].reshape(ncols, n)), bits(want),
                                      err_msg=f"{defines}, grid {grid}, weight {i} ({q}, {n} rows)")
        at += ncols * n
    if residual:
        np.testing.assert_array_equal(bits(np.fromfile(tmp_path / "s.bin", np.float32).reshape(ncols, k)), bits(s))
