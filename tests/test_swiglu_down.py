"""swiglu_down.cu on the CPU (the g++ shim, tests/cuda_shim.py) == the SwiGLU launch then the mat-vec, bit for bit.

``hx_swiglu_down`` makes ``silu(g) * u`` and its q8_1 in every CUDA block and then runs mmvq.cu's rows of the
down weight, striding when the grid has fewer blocks than the rows need; its output must equal the emulators of
the launches it replaces (``hx_swiglu_q8_1`` into the mat-vec's layout, then ``mmvq``) for Q4_K and Q6_K
weights, one and several tokens, rows the rows per block do not divide, full and strided grids. Also: a product
taken in another order is seen, and the launch's limits.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, ShimBuilder, bits, run

from hiraishin.errors import BackendError
from hiraishin.kernels.swiglu_down import emulate
from hiraishin.kernels.swiglu_down import launch as swiglu_down
from hiraishin.kernels.swiglu_down.launch import SOURCE, swiglu_down_defines, swiglu_down_fits
from hiraishin.plans import MatVecPlan
from hiraishin.quant import random_blocks

MAIN = r'''
int main(int argc, char** argv) {
    // argv: g, u, weight, rows, out, CUDA blocks (0: one per HX_SWIGLU_GROUPS row blocks; fewer: they stride)
    const int nrows = atoi(argv[4]);
    auto g = hx_read(argv[1]); auto u = hx_read(argv[2]); auto w = hx_read(argv[3]);
    std::vector<float> out((size_t)HX_NCOLS * nrows, -12345.0f);
    const unsigned rblocks = (nrows + HX_RPB - 1) / HX_RPB;
    const unsigned grid = atoi(argv[6]);
    hx_launch({grid ? grid : (rblocks + HX_SWIGLU_GROUPS - 1) / HX_SWIGLU_GROUPS, 1, 1},
              {32, (unsigned)HX_NWARPS, (unsigned)HX_SWIGLU_GROUPS},
              (size_t)HX_SWIGLU_GROUPS * (HX_NWARPS - 1) * HX_NCOLS * HX_RPB * 32 * 4,
              [&] { hx_swiglu_down((const float*)g.data(), (const float*)u.data(), w.data(), out.data(), nrows); });
    hx_write(argv[5], out.data(), out.size() * 4);
}'''

needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("swiglu-down-shim"))


def _inputs(rng, T, k):
    g = (rng.standard_normal((T, k)) * 3).astype(np.float32)
    u = (rng.standard_normal((T, k)) * 2).astype(np.float32)
    g[0, :32] = 0.0  # a zero q8_1 block
    g[-1, 40] = -100.0  # silu's far tail (e**100 is inf; silu -> -0.0)
    return g, u


def _run(shim, tmp_path, qtype, k, T, rpb, nwarps, groups, n, grid, edit=None, name="swiglu_down"):
    rng = np.random.default_rng(k + 7 * T + n)
    w = random_blocks(qtype, n, k, seed=50 + T)
    g, u = _inputs(rng, T, k)
    for label, a in (("g", g), ("u", u), ("w", w)):
        a.tofile(tmp_path / f"{label}.bin")
    defines = swiglu_down_defines(qtype, k, T, rpb, nwarps, groups)
    exe = shim.build(SOURCE, defines, MAIN, name, **({"edit": edit} if edit else {}))
    run(exe, tmp_path / "g.bin", tmp_path / "u.bin", tmp_path / "w.bin", n, tmp_path / "o.bin", grid)
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(T, n)
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rpb, cols_per_launch=T, ncols=T)
    return got, emulate(g, u, w, qtype, plan), defines


# (qtype, k, tokens, rows per block, warps, groups, rows, grid): one and several tokens, rows the rows per block
# do not divide (past-the-end groups recompute the last row and write nothing), full grids (0) and grids of
# fewer CUDA blocks than the rows need (each strides).
CASES = [("Q4_K", 512, 1, 1, 4, 4, 23, 0), ("Q4_K", 512, 1, 1, 4, 4, 23, 2), ("Q6_K", 768, 2, 2, 4, 2, 19, 0),
         ("Q6_K", 768, 2, 2, 4, 2, 19, 3), ("Q4_K", 256, 3, 4, 2, 2, 37, 1),
         # 64 q8_1 blocks a row over 2 warps: four batches of loads a warp; 24 over 16 warps: warps past the last
         ("Q4_K", 2048, 1, 1, 1, 2, 13, 2), ("Q6_K", 768, 1, 1, 4, 4, 9, 0)]


@needs_gxx
@pytest.mark.parametrize("qtype,k,T,rpb,nwarps,groups,n,grid", CASES)
def test_swiglu_down_source_equals_swiglu_then_matvec(shim, tmp_path, qtype, k, T, rpb, nwarps, groups, n, grid):
    got, want, defines = _run(shim, tmp_path, qtype, k, T, rpb, nwarps, groups, n, grid)
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{defines}, grid {grid}")


@needs_gxx
def test_swiglu_down_source_sees_another_product(shim, tmp_path):
    """The comparison above can fail: the same kernel with silu taken of u instead of g gives other outputs."""
    old = "hx_swiglu(gv[m], uv[m])"

    def edit(text):
        assert text.count(old) == 1
        return text.replace(old, "hx_swiglu(uv[m], gv[m])")

    got, want, _ = _run(shim, tmp_path, "Q4_K", 512, 1, 1, 4, 4, 23, 2, edit=edit, name="swiglu_down_changed")
    assert not np.array_equal(bits(got), bits(want))


def test_swiglu_down_fits_the_shared_memory():
    assert swiglu_down_fits("Q4_K", 3072, 1) and swiglu_down_fits("Q6_K", 12288, 2)  # the 0.6B's and 8B's rows
    assert not swiglu_down_fits("Q4_K", 12288, 4)  # four 8B product rows: more than 48 KiB
    assert not swiglu_down_fits("Q4_K", 1000, 1)  # not whole super-blocks
    assert swiglu_down_fits("Q4_K", 12288, 2, 2, 4, 4)  # 39 KiB of rows + 6 KiB of hand-over
    assert not swiglu_down_fits("Q4_K", 12288, 2, 4, 4, 4)  # + 12 KiB


def test_swiglu_down_defines_and_switch(monkeypatch):
    d = swiglu_down_defines("Q6_K", 3072, 1, 1, 4, 2)
    assert d["HX_Y_SHARED"] == 1 and d["HX_SWIGLU_GROUPS"] == 2 and "HX_W_EARLY" not in d
    assert d["HX_LAYOUT"] != 0  # the Q6_K mat-vec's own layout, not llama.cpp's blocks
    assert swiglu_down.settings_from_env("") == {}
    assert swiglu_down.settings_from_env("2") == {"SWIGLU_DOWN_TOKENS": 2}
    monkeypatch.setenv(swiglu_down.ENV_SWIGLU_DOWN, "1:2:3")
    assert swiglu_down.settings_from_env() == {"SWIGLU_DOWN_TOKENS": 1, "SWIGLU_DOWN_GROUPS": 2,
                                               "SWIGLU_DOWN_PER_SM": 3}
    for bad in ("on", "1:2:3:4", "1:-1"):
        with pytest.raises(BackendError, match="HIRAISHIN_SWIGLU_DOWN"):
            swiglu_down.settings_from_env(bad)
    assert swiglu_down.swiglu_down_tokens() == swiglu_down.SWIGLU_DOWN_TOKENS


def test_compile_rule_halves_the_groups_while_it_spills():
    tried = []

    def compile_spills(defines):
        tried.append(defines["HX_SWIGLU_GROUPS"])
        return "kernel", 8 if defines["HX_SWIGLU_GROUPS"] > 1 else 0

    _, defines = swiglu_down.swiglu_down_compile("Q4_K", 12288, 1, 4, 4, compile_spills, groups=4)
    assert defines["HX_SWIGLU_GROUPS"] == 1 and tried[-1] == 1 and set(tried) == {4, 2, 1}
