"""The gate/up mat-vecs with SwiGLU and its q8_1 as their epilogue (``mmvq_swiglu.cu``) on the CPU.

The CUDA source runs through the g++ shim (tests/cuda_shim.py, CUDA blocks one at a time): gate and up must
be the mat-vec emulator's bits, the product and its q8_1 bytes (in the down projection's layout, which need
not be the gate/up weights' own) ``hx_swiglu_q8_1``'s emulator's, for one and several columns, groups made of
one and of several CUDA blocks; a second launch on the same counters must give the same (each group's last
block sets its counter back to 0). A kernel that miscounts a group's blocks fails it.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, ShimBuilder, bits, run

from hiraishin.kernels import quantize
from hiraishin.kernels.mmvq.launch import kernel_defines
from hiraishin.kernels.mmvq_swiglu import emulate
from hiraishin.kernels.mmvq_swiglu.launch import SOURCE, swiglu_epilogue_fits
from hiraishin.kernels.quantize.launch import output_shape, quantize_defines
from hiraishin.kernels.quantize.layout import layout_for, to_layout
from hiraishin.plans import MatVecPlan
from hiraishin.plans.matvec import MATVEC_TRAITS
from hiraishin.quant import random_blocks as random_weights

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

MAIN = r'''
int main(int argc, char** argv) {
    // argv: gate, up, q8_1, nrows, ncols, yq bytes, out g, out u, out yq, out m, out counters.
    // Two launches on one set of counters; the outputs are spoiled in between, the second's are written.
    auto wg = hx_read(argv[1]); auto wu = hx_read(argv[2]); auto y = hx_read(argv[3]);
    int nrows = atoi(argv[4]), ncols = atoi(argv[5]), yq_bytes = atoi(argv[6]);
    std::vector<float> g((size_t)ncols * nrows), u(g.size()), m(g.size());
    std::vector<unsigned char> yq(yq_bytes);
    std::vector<unsigned> counters(nrows / 32, 0);
    for (int round = 0; round < 2; ++round) {
        std::fill(g.begin(), g.end(), -12345.0f); std::fill(u.begin(), u.end(), -12345.0f);
        std::fill(m.begin(), m.end(), -12345.0f); std::fill(yq.begin(), yq.end(), 0xAB);
        hx_launch({(unsigned)(2 * nrows / HX_RPB), 1, 1}, {32, (unsigned)HX_NWARPS, 1},
                  (size_t)(HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
                  [&] { mmvq_swiglu(y.data(), wg.data(), wu.data(), g.data(), u.data(), nrows, counters.data(),
                                    yq.data(), m.data()); });
    }
    hx_write(argv[7], g.data(), g.size() * 4);
    hx_write(argv[8], u.data(), u.size() * 4);
    hx_write(argv[9], yq.data(), yq.size());
    hx_write(argv[10], m.data(), m.size() * 4);
    hx_write(argv[11], counters.data(), counters.size() * 4);
}'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("mmvq-swiglu-shim"))


def _run(shim, tmp_path, qtype, n, k, rows, nwarps, ncols, down_qtype, edit=None):
    t = MATVEC_TRAITS[qtype]
    rng = np.random.default_rng(n + k + ncols)
    wg = random_weights(qtype, n, k, seed=n + k)
    wu = random_weights(qtype, n, k, seed=n + k + 1)
    xq = quantize.emulate((rng.standard_normal((ncols, k)) * 2).astype(np.float32))
    layout = layout_for(down_qtype)
    wg.tofile(tmp_path / "wg.bin")
    wu.tofile(tmp_path / "wu.bin")
    to_layout(xq, qtype).tofile(tmp_path / "y.bin")
    yq_bytes = int(np.prod(output_shape(ncols, n, layout)))
    defines = {**kernel_defines(qtype, ncols, rows, nwarps, k // t.qk), **quantize_defines(layout)}
    exe = shim.build(SOURCE, defines, MAIN, "mmvq_swiglu", edit=edit)
    out = [tmp_path / f"{name}.bin" for name in ("g", "u", "yq", "m", "c")]
    run(exe, tmp_path / "wg.bin", tmp_path / "wu.bin", tmp_path / "y.bin", n, ncols, yq_bytes, *out)
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=ncols, ncols=ncols)
    want = emulate(wg, wu, qtype, xq, plan, layout)
    got = (np.fromfile(out[0], np.float32).reshape(ncols, n), np.fromfile(out[1], np.float32).reshape(ncols, n),
           np.fromfile(out[2], np.uint8).reshape(output_shape(ncols, n, layout)),
           np.fromfile(out[3], np.float32).reshape(ncols, n))
    return want, got, np.fromfile(out[4], np.uint32)


@pytest.mark.parametrize("qtype,n,k,rows,nwarps,ncols,down_qtype", [
    ("Q4_K", 256, 512, 1, 4, 1, "Q6_K"),    # the draft's geometry: one row a block, a Q6_K down projection
    ("Q4_K", 512, 1024, 2, 4, 1, "Q4_K"),   # down in the gate/up weights' own layout
    ("Q4_K", 256, 512, 4, 2, 3, "Q6_K"),    # a verify pass's three columns
    ("Q6_K", 256, 512, 8, 1, 2, "Q4_K"),    # Q6_K gate/up, four CUDA blocks a group
    ("Q4_K", 32, 512, 1, 4, 1, None),       # one group; llama.cpp's q8_1 blocks (the down projection's
                                            # layouts hold whole super-blocks: 256 rows)
])
def test_mmvq_swiglu_source_equals_mat_vec_and_swiglu_emulators(shim, tmp_path, qtype, n, k, rows, nwarps, ncols,
                                                                  down_qtype):
    assert swiglu_epilogue_fits(n, rows)
    (g, u, yq, m), got, counters = _run(shim, tmp_path, qtype, n, k, rows, nwarps, ncols, down_qtype)
    for name, want, have in zip("g u yq m".split(), (g, u, yq, m), got):
        np.testing.assert_array_equal(have if name == "yq" else bits(have), want if name == "yq" else bits(want),
                                      err_msg=name)
    assert not counters.any()  # every group's last block reset its counter


def test_mmvq_swiglu_fails_on_a_miscounted_group(shim, tmp_path):
    """The test above can fail: a kernel that takes a group's second-last block for its last computes that
    group's product before the last block's rows exist (and leaves the counter set)."""
    edit = lambda text: text.replace("== HX_GROUP_BLOCKS - 1;", "== HX_GROUP_BLOCKS - 2;")  # noqa: E731
    (g, u, yq, m), got, counters = _run(shim, tmp_path, "Q4_K", 256, 512, 2, 4, 1, "Q6_K", edit=edit)
    np.testing.assert_array_equal(bits(got[0]), bits(g))  # the rows themselves are right
    assert not np.array_equal(bits(got[3]), bits(m)) and counters.any()


def test_swiglu_epilogue_fits_whole_groups_of_whole_blocks():
    assert swiglu_epilogue_fits(3072, 1) and swiglu_epilogue_fits(12288, 2) and swiglu_epilogue_fits(64, 8)
    assert not swiglu_epilogue_fits(3072 + 16, 1)  # a part group
    assert not swiglu_epilogue_fits(96, 3)  # a CUDA block across two groups
    assert not swiglu_epilogue_fits(0, 1)
