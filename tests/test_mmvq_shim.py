"""Run the CUDA C sources of the mat-vec, quantize and elementwise kernels on the CPU; compare with the emulators.

No GPU here, so the kernels' index math and order of operations are checked by
compiling the very same ``.cu`` text with g++ against a small shim: one
``std::thread`` per CUDA thread, ``std::barrier`` for ``__syncthreads`` and for
warp shuffles, ``std::fmaf`` for ``__fmaf_rn`` (``-ffp-contract=off``), and
``_Float16`` for the fp16 conversions (the ``.cu`` files let a shim replace
their PTX ``cvt`` helpers through ``HX_HALF_PTX``). Bit equality with the Numba
emulators here plus kernel == emulator on a GPU (tests/test_mmvq_gpu.py) pin
the kernels from both sides; what the shim cannot check (NVRTC, alignment,
real warp scheduling) only the GPU run can. The shim and its build harness live in
tests/cuda_shim.py (shared with tests/test_fused.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, MAIN_QUANTIZE, ShimBuilder
from cuda_shim import bits as _bits
from cuda_shim import run as _run

from hiraishin.kernels import mmvq, quantize, tiled
from hiraishin.kernels.mmvq.launch import kernel_defines
from hiraishin.kernels.quantize.launch import quantize_defines
from hiraishin.kernels.quantize.layout import layout_for, to_layout
from hiraishin.kernels.tiled.launch import tiled_defines
from hiraishin.plans import MatVecPlan
from hiraishin.plans.matvec import MATVEC_TRAITS
from hiraishin.quant import random_blocks as random_weights

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

MAINS = {
"mmvq": r'''
int main(int argc, char** argv) {
    // argv: weights, q8_1, nrows, byte offset of the weights in their buffer (alignment), out
    int nrows = atoi(argv[3]), shift = atoi(argv[4]);
    auto w0 = hx_read(argv[1]); auto y = hx_read(argv[2]);
    std::vector<unsigned char> w(w0.size() + 16);  // hx_read's buffer is 16-byte aligned
    std::memcpy(w.data() + shift, w0.data(), w0.size());
    std::vector<float> out((size_t)HX_NCOLS * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + HX_RPB - 1) / HX_RPB), 1, 1}, {32, (unsigned)HX_NWARPS, 1},
              (size_t)(HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
              [&] { mmvq(w.data() + shift, y.data(), out.data(), nrows, (long long)nrows); });
    hx_write(argv[5], out.data(), out.size() * 4);
}''',
"mmvq_multi": r'''
int main(int argc, char** argv) {
    // argv: weights of the three row counts one after another, q8_1, n0, n1, n2, out
    int n[3] = {atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
    auto w = hx_read(argv[1]); auto y = hx_read(argv[2]);
    int nb[3]; unsigned blocks = 0;
    for (int i = 0; i < 3; ++i) { nb[i] = (n[i] + HX_RPB - 1) / HX_RPB; blocks += nb[i]; }
    const unsigned char* wp[3] = {w.data(), w.data() + (size_t)n[0] * HX_ROW_BYTES,
                                  w.data() + (size_t)(n[0] + n[1]) * HX_ROW_BYTES};
    std::vector<float> out((size_t)HX_NCOLS * (n[0] + n[1] + n[2]), -12345.0f);
    float* op[3] = {out.data(), out.data() + (size_t)HX_NCOLS * n[0], out.data() + (size_t)HX_NCOLS * (n[0] + n[1])};
    hx_launch({blocks, 1, 1}, {32, (unsigned)HX_NWARPS, 1}, (size_t)(HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
              [&] { mmvq_multi(y.data(), wp[0], op[0], n[0], nb[0], wp[1], op[1], n[1], nb[1], wp[2], op[2], n[2]); });
    hx_write(argv[6], out.data(), out.size() * 4);
}''',
"mmvq_mixed": r'''
int main(int argc, char** argv) {
    // argv: weights 0, 1, 2 (one file each), q8_1 in type A's and in type B's layout, n0, n1, n2, out
    int n[3] = {atoi(argv[6]), atoi(argv[7]), atoi(argv[8])};
    auto w0 = hx_read(argv[1]); auto w1 = hx_read(argv[2]); auto w2 = hx_read(argv[3]);
    auto ya = hx_read(argv[4]); auto yb = hx_read(argv[5]);
    int nb[3]; unsigned blocks = 0;
    for (int i = 0; i < 3; ++i) {
        const int rpb = i < HX_B_FIRST ? HX_A_RPB : HX_B_RPB;
        nb[i] = (n[i] + rpb - 1) / rpb; blocks += nb[i];
    }
    std::vector<float> out((size_t)HX_NCOLS * (n[0] + n[1] + n[2]), -12345.0f);
    float* op[3] = {out.data(), out.data() + (size_t)HX_NCOLS * n[0], out.data() + (size_t)HX_NCOLS * (n[0] + n[1])};
    const int rmax = HX_A_RPB > HX_B_RPB ? HX_A_RPB : HX_B_RPB;
    hx_launch({blocks, 1, 1}, {32, (unsigned)HX_NWARPS, 1}, (size_t)(HX_NWARPS - 1) * HX_NCOLS * rmax * 32 * 4,
              [&] { mmvq_mixed(ya.data(), yb.data(), w0.data(), op[0], n[0], nb[0], w1.data(), op[1], n[1], nb[1],
                               w2.data(), op[2], n[2]); });
    hx_write(argv[9], out.data(), out.size() * 4);
}''',
"mmq_tiled": r'''
int main(int argc, char** argv) {
    int nrows = atoi(argv[3]), ncols = atoi(argv[4]), k = atoi(argv[5]);
    long long row_bytes = atoll(argv[6]), col_bytes = atoll(argv[7]);
    auto w = hx_read(argv[1]); auto y = hx_read(argv[2]);
    std::vector<float> out((size_t)ncols * nrows, -12345.0f);
    hx_launch({(unsigned)((nrows + 31) / 32), (unsigned)((ncols + 15) / 16), 1}, {32, 4, 1}, 0,
              [&] { mmq_tiled(w.data(), y.data(), out.data(), nrows, ncols, k, row_bytes, col_bytes, nrows); });
    hx_write(argv[8], out.data(), out.size() * 4);
}''',
"get_rows": r'''
int main(int argc, char** argv) {
    // argv: table, int32 ids, n_ids, n_cols, row_bytes, out; HX_SHIM_KERNEL names the kernel
    int n_ids = atoi(argv[3]), n_cols = atoi(argv[4]);
    long long row_bytes = atoll(argv[5]);
    auto table = hx_read(argv[1]); auto ids = hx_read(argv[2]);
    std::vector<float> out((size_t)n_ids * n_cols, -12345.0f);
    hx_launch({(unsigned)n_ids, (unsigned)((n_cols + 63) / 64), 1}, {64, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL(table.data(), (const int*)ids.data(), out.data(), n_cols, row_bytes); });
    hx_write(argv[6], out.data(), out.size() * 4);
}''',
"binary": r'''
int main(int argc, char** argv) {
    // argv: a, b (float32), n, out; HX_SHIM_KERNEL names the kernel
    long long n = atoll(argv[3]);
    auto a = hx_read(argv[1]); auto b = hx_read(argv[2]);
    std::vector<float> out(n, -12345.0f);
    hx_launch({(unsigned)((n + 127) / 128), 1, 1}, {128, 1, 1}, 0,
              [&] { HX_SHIM_KERNEL((const float*)a.data(), (const float*)b.data(), out.data(), n); });
    hx_write(argv[4], out.data(), out.size() * 4);
}''',
"quantize_q8_1": MAIN_QUANTIZE,
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    builder = ShimBuilder(tmp_path_factory.mktemp("cuda-shim"))

    def _build(source, defines, kind):
        return builder.build(source, defines, MAINS[kind], kind)

    return _build


@pytest.mark.parametrize("layout", [None, "Q4_K", "Q6_K"])
def test_quantize_source_equals_emulator(build, tmp_path, layout):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 768)) * 3).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 32:64] = 0.0
    x[1, 32:40] = [127.0, 63.5, -63.5, 2.5, -2.5, 0.5, -0.5, 1.5]
    x.tofile(tmp_path / "x.bin")
    want = quantize.emulate(x, layout)
    _run(build("quantize/quantize_q8_1.cu", quantize_defines(layout), "quantize_q8_1"),
         tmp_path / "x.bin", 3, 768, tmp_path / "q.bin", want.size)
    got = np.fromfile(tmp_path / "q.bin", np.uint8).reshape(3, -1)
    np.testing.assert_array_equal(got, want)


# (columns, rows per block, nwarps, unroll, byte offset of the weights): every kernel path —
# wide and narrow loads (offset 0 vs 2/4 bytes), a row length that nwarps does not divide
# (K=2560: 10 super-blocks), full and partial unrolling, one and many accumulators.
MMVQ_SHIM_CASES = [(1, 1, 4, 4, 0), (1, 2, 4, 1, 4), (5, 4, 1, 2, 2), (5, 4, 2, 2, 0), (5, 4, 3, 1, 0),
                   (5, 4, 4, 4, 4), (5, 4, 8, 2, 2), (3, 1, 4, 2, 0)]


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_mmvq_source_equals_emulator(build, tmp_path, qtype):
    t = MATVEC_TRAITS[qtype]
    n, k = 11, 2560 if qtype != "Q8_0" else 1312
    w = random_weights(qtype, n, k, seed=1)
    x = (np.random.default_rng(2).standard_normal((5, k)) * 2).astype(np.float32)
    xq = quantize.emulate(x)
    w.tofile(tmp_path / "w.bin")
    # the one-column cases once more with their weights loaded after the wait (HX_W_EARLY off)
    late = [(c, r, nw, u, sh, False) for c, r, nw, u, sh in MMVQ_SHIM_CASES if c == 1]
    for ncols, rows, nwarps, unroll, shift, *early in [(*c, True) for c in MMVQ_SHIM_CASES] + late:
        if qtype == "Q4_K":
            shift -= shift % 4  # Q4_K weights must be 4-byte aligned (the launcher checks)
        defines = kernel_defines(qtype, ncols, rows, nwarps, k // t.qk, unroll)
        if not early[0]:
            defines.pop("HX_W_EARLY", None)
        (to_layout(xq[:ncols], qtype) if layout_for(qtype) else xq[:ncols]).tofile(tmp_path / "y.bin")
        _run(build("mmvq/mmvq.cu", defines, "mmvq"), tmp_path / "w.bin", tmp_path / "y.bin", n, shift,
             tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
        plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
        emu = mmvq.emulate(w, qtype, xq[:ncols], plan)
        np.testing.assert_array_equal(_bits(got), _bits(emu), err_msg=f"{defines} weight offset {shift}")


def _extreme_weights(qtype: str, n: int, k: int) -> np.ndarray:
    """Rows whose integer dots and scales reach their bounds: Q4_K nibbles 15 or 0
    with 6-bit scales and mins 63 or 0; Q6_K 6-bit values 63 or 0 (-32 after the offset) with int8 scales
    -128, 127 or 0; per row a different mix, fp16 super-block scales 1."""
    w = random_weights(qtype, n, k, seed=7).copy()
    blocks = w.reshape(n, k // 256, -1)
    one = np.array([1.0], np.float16).view(np.uint8)
    for r in range(n):
        for sb in range(k // 256):
            b = blocks[r, sb]
            kind = (r + sb) % 4
            if qtype == "Q4_K":
                b[0:2] = one
                b[2:4] = one
                b[4:16] = (0xFF, 0xFF, 0x00, 0xFF, 0xFF, 0x00, 0xFF, 0xFF, 0xF0, 0x0F, 0xFF, 0x00)[::1 if kind % 2 else -1]
                b[16:144] = 0xFF if kind < 2 else np.where(np.arange(128) % 3 == 0, 0x00, 0xFF)
            else:
                b[0:128] = 0xFF if kind < 2 else 0x00  # ql
                b[128:192] = 0xFF if kind % 2 == 0 else 0x00  # qh
                b[192:208] = np.array([-128, 127, 0, -128, 127, 127, -128, 0] * 2, np.int8).view(np.uint8)
                b[208:210] = one
    return w


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_mmvq_source_equals_emulator_at_the_bounds(build, tmp_path, qtype):
    """Integer dots and scales at their largest (activations all +-127, the weights above) and zero
    activations: one- and several-column launches equal the emulator."""
    t = MATVEC_TRAITS[qtype]
    n, k = 8, 1024
    w = _extreme_weights(qtype, n, k)
    x = np.where(np.arange(k) % 5 == 0, -1.0, 1.0).astype(np.float32) * np.array([[1.0], [-1.0], [0.5]], np.float32)
    x[2, 512:] = 0.0  # zero activations: every product +0
    xq = quantize.emulate(x)
    w.tofile(tmp_path / "w.bin")
    for ncols in (1, 2, 3):
        defines = kernel_defines(qtype, ncols, 2, 4, k // t.qk)
        to_layout(xq[:ncols], qtype).tofile(tmp_path / "y.bin")
        _run(build("mmvq/mmvq.cu", defines, "mmvq"), tmp_path / "w.bin", tmp_path / "y.bin", n, 0, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
        plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=2, cols_per_launch=ncols, ncols=ncols)
        np.testing.assert_array_equal(_bits(got), _bits(mmvq.emulate(w, qtype, xq[:ncols], plan)),
                                      err_msg=f"{defines}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_mmvq_multi_source_equals_separate_emulators(build, tmp_path, qtype):
    """Q, K and V in one launch (mmvq_multi): each weight's rows give the bits of its own mat-vec."""
    t = MATVEC_TRAITS[qtype]
    k, ns = 1024, (11, 5, 7)  # row counts the rows per block do not divide
    ws = [random_weights(qtype, n, k, seed=10 + i) for i, n in enumerate(ns)]
    xq = quantize.emulate((np.random.default_rng(3).standard_normal((5, k)) * 2).astype(np.float32))
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    for ncols, rows, nwarps in ((1, 2, 4), (3, 2, 4), (5, 2, 2)):
        defines = kernel_defines(qtype, ncols, rows, nwarps, k // t.qk)
        to_layout(xq[:ncols], qtype).tofile(tmp_path / "y.bin")
        _run(build("mmvq/mmvq.cu", defines, "mmvq_multi"), tmp_path / "w.bin", tmp_path / "y.bin", *ns,
             tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32)
        plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
        at = 0
        for w, n in zip(ws, ns):
            part = got[at:at + ncols * n].reshape(ncols, n)
            at += ncols * n
            np.testing.assert_array_equal(_bits(part), _bits(mmvq.emulate(w, qtype, xq[:ncols], plan)),
                                          err_msg=f"{defines} weight of {n} rows")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_mmvq_weights_before_the_wait_equal_emulator(build, tmp_path, qtype):
    """HX_W_EARLY (a thread's first 1, 2 or 4 steps of weights loaded before it waits for the previous
    kernel): the emulator's bits for row lengths with several steps, one step, and only a partial step
    (short rows, threads with nothing to sum), in every kernel."""
    from hiraishin.kernels.mmvq.launch import MIXED_SOURCES, mixed_defines

    t = MATVEC_TRAITS[qtype]
    early = {"HX_W_EARLY": 1}
    n = 11
    for k, cases in ((2560, ((1, 1, 4, 4), (3, 2, 4, 2), (5, 4, 2, 1))), (1024, ((1, 4, 4, 4), (2, 2, 4, 2))),
                     (t.qk * 17, ((1, 2, 4, 2),))):
        w = random_weights(qtype, n, k, seed=60 + k % 97)
        w.tofile(tmp_path / "w.bin")
        xq = quantize.emulate((np.random.default_rng(k).standard_normal((5, k)) * 2).astype(np.float32))
        for (ncols, rows, nwarps, unroll), ahead in zip(cases, (1, 4, 2)):
            defines = {**kernel_defines(qtype, ncols, rows, nwarps, k // t.qk, unroll), "HX_W_EARLY": ahead}
            (to_layout(xq[:ncols], qtype) if layout_for(qtype) else xq[:ncols]).tofile(tmp_path / "y.bin")
            _run(build("mmvq/mmvq.cu", defines, "mmvq"), tmp_path / "w.bin", tmp_path / "y.bin", n, 0,
                 tmp_path / "o.bin")
            got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
            plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
            np.testing.assert_array_equal(_bits(got), _bits(mmvq.emulate(w, qtype, xq[:ncols], plan)),
                                          err_msg=f"{defines}")
    if qtype == "Q8_0":
        return
    k, ns = 1024, (11, 5, 7)
    xq = quantize.emulate((np.random.default_rng(6).standard_normal((3, k)) * 2).astype(np.float32))
    ws = [random_weights(qtype, m, k, seed=70 + i) for i, m in enumerate(ns)]
    np.concatenate(ws).tofile(tmp_path / "w.bin")
    defines = {**kernel_defines(qtype, 3, 2, 4, k // t.qk), **early}
    to_layout(xq, qtype).tofile(tmp_path / "y.bin")
    _run(build("mmvq/mmvq.cu", defines, "mmvq_multi"), tmp_path / "w.bin", tmp_path / "y.bin", *ns, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=2, cols_per_launch=3, ncols=3)
    at = 0
    for wi, m in zip(ws, ns):
        np.testing.assert_array_equal(_bits(got[at:at + 3 * m].reshape(3, m)), _bits(mmvq.emulate(wi, qtype, xq, plan)),
                                      err_msg=f"mmvq_multi {defines}, weight of {m} rows")
        at += 3 * m
    other = "Q6_K" if qtype == "Q4_K" else "Q4_K"
    qtypes = (qtype, qtype, other)
    ws = [random_weights(q, m, k, seed=80 + i) for i, (q, m) in enumerate(zip(qtypes, ns))]
    for i, wi in enumerate(ws):
        wi.tofile(tmp_path / f"w{i}.bin")
    defines = {**mixed_defines(qtype, 2, other, 1, 1, 4, k // 256, k // 256, 2), **early}
    to_layout(xq[:1], qtype).tofile(tmp_path / "ya.bin")
    to_layout(xq[:1], other).tofile(tmp_path / "yb.bin")
    _run(build(MIXED_SOURCES, defines, "mmvq_mixed"), *(tmp_path / f"w{i}.bin" for i in range(3)),
         tmp_path / "ya.bin", tmp_path / "yb.bin", *ns, tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32)
    at = 0
    for i, (wi, q, m) in enumerate(zip(ws, qtypes, ns)):
        plan = MatVecPlan("mmvq", q, nwarps=4, rows_per_block=2 if i < 2 else 1, cols_per_launch=1, ncols=1)
        np.testing.assert_array_equal(_bits(got[at:at + m].reshape(1, m)), _bits(mmvq.emulate(wi, q, xq[:1], plan)),
                                      err_msg=f"mmvq_mixed {defines}, weight {i} ({q})")
        at += m


@pytest.mark.parametrize("qtypes", [("Q4_K", "Q4_K", "Q6_K"), ("Q4_K", "Q6_K", "Q6_K"), ("Q6_K", "Q4_K", "Q4_K")])
def test_mmvq_mixed_source_equals_separate_emulators(build, tmp_path, qtypes):
    """Weights of two types in one launch (mmvq_mixed: Q4_K attn_q, attn_k beside a Q6_K attn_v): each
    weight's rows, read from its type's layout with its type's rows per block, give the bits of its own
    mat-vec."""
    from hiraishin.kernels.mmvq.launch import MIXED_SOURCES, mixed_defines

    k, ns = 1024, (11, 5, 7)  # row counts the rows per block do not divide
    ws = [random_weights(q, n, k, seed=20 + i) for i, (q, n) in enumerate(zip(qtypes, ns))]
    xq = quantize.emulate((np.random.default_rng(5).standard_normal((5, k)) * 2).astype(np.float32))
    for i, w in enumerate(ws):
        w.tofile(tmp_path / f"w{i}.bin")
    qa, qb = qtypes[0], qtypes[-1]
    b_first = qtypes.index(qb)
    for ncols, rows_a, rows_b, nwarps in ((1, 2, 1, 4), (1, 4, 4, 4), (3, 2, 2, 4), (5, 1, 2, 2)):
        defines = mixed_defines(qa, rows_a, qb, rows_b, ncols, nwarps, k // 256, k // 256, b_first)
        to_layout(xq[:ncols], qa).tofile(tmp_path / "ya.bin")
        to_layout(xq[:ncols], qb).tofile(tmp_path / "yb.bin")
        _run(build(MIXED_SOURCES, defines, "mmvq_mixed"), *(tmp_path / f"w{i}.bin" for i in range(3)),
             tmp_path / "ya.bin", tmp_path / "yb.bin", *ns, tmp_path / "o.bin")
        got = np.fromfile(tmp_path / "o.bin", np.float32)
        at = 0
        for i, (w, q, n) in enumerate(zip(ws, qtypes, ns)):
            rows = rows_a if i < b_first else rows_b
            plan = MatVecPlan("mmvq", q, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
            part = got[at:at + ncols * n].reshape(ncols, n)
            at += ncols * n
            np.testing.assert_array_equal(_bits(part), _bits(mmvq.emulate(w, q, xq[:ncols], plan)),
                                          err_msg=f"{defines} weight {i} ({q}, {n} rows)")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_tiled_source_equals_emulator(build, tmp_path, qtype):
    n, k, ncols = 37, 1024 if qtype != "Q8_0" else 1312, 17  # partial row and column tiles
    w = random_weights(qtype, n, k, seed=3)
    xq = quantize.emulate((np.random.default_rng(4).standard_normal((ncols, k))).astype(np.float32))
    w.tofile(tmp_path / "w.bin")
    xq.tofile(tmp_path / "y.bin")
    exe = build("tiled/mmq_tiled.cu", tiled_defines(qtype), "mmq_tiled")
    _run(exe, tmp_path / "w.bin", tmp_path / "y.bin", n, ncols, k, w.shape[1], xq.shape[1], tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ncols, n)
    np.testing.assert_array_equal(_bits(got), _bits(tiled.emulate(w, qtype, xq)))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16", "F32"])
def test_get_rows_source_equals_emulator(build, tmp_path, qtype):
    from hiraishin import quant
    from hiraishin.kernels.elementwise import emulate_get_rows
    from hiraishin.kernels.elementwise.launch import GET_ROWS_KERNELS

    rng = np.random.default_rng(6)
    k = 512
    x = (rng.standard_normal((9, k)) * 2).astype(np.float32)
    table = np.ascontiguousarray(quant.quantize(x, qtype)).view(np.uint8).reshape(9, -1)
    ids = np.array([3, 0, 8, 3], np.int32)
    table.tofile(tmp_path / "t.bin")
    ids.tofile(tmp_path / "i.bin")
    exe = build("elementwise/elementwise.cu", {"HX_SHIM_KERNEL": GET_ROWS_KERNELS[qtype]}, "get_rows")
    _run(exe, tmp_path / "t.bin", tmp_path / "i.bin", ids.size, k, table.shape[1], tmp_path / "o.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ids.size, k)
    np.testing.assert_array_equal(_bits(got), _bits(emulate_get_rows(table, qtype, ids)))


@pytest.mark.parametrize("kernel", ["hx_swiglu_f32", "hx_add_f32"])
def test_binary_source_equals_emulator(build, tmp_path, kernel):
    from hiraishin.kernels.elementwise import emulate_add, emulate_swiglu

    rng = np.random.default_rng(7)
    a = (rng.standard_normal(1000) * 30).astype(np.float32)  # exp() over and underflow included
    b = rng.standard_normal(1000).astype(np.float32)
    a.tofile(tmp_path / "a.bin")
    b.tofile(tmp_path / "b.bin")
    _run(build("elementwise/elementwise.cu", {"HX_SHIM_KERNEL": kernel}, "binary"), tmp_path / "a.bin", tmp_path / "b.bin",
         a.size, tmp_path / "o.bin")
    want = emulate_swiglu(a, b) if kernel == "hx_swiglu_f32" else emulate_add(a, b)
    np.testing.assert_array_equal(_bits(np.fromfile(tmp_path / "o.bin", np.float32)), _bits(want))
