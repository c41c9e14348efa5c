"""bench/proto_inline_norm.py's kernel on the CPU (the g++ shim): the rows it times are the rows it claims.

The prototype quantizes the unscaled row (x + r) * g to q8_1 inside the mat-vec, four lanes a block, and scales
the dot products by 1 / rms(x + r) at the end. Its rows are compared with a NumPy model of exactly that (q8_1 of
the unscaled row, the dequantized weight, the scale after), which agrees to float32 rounding only if every lane
reads the values its weights multiply; the residual sum it writes must be x + r bit for bit.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_shim import GXX, ShimBuilder
from cuda_shim import run as _run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

# shim stand-ins for what the prototype uses beyond the library kernels, then the kernel, then main()
MAIN = r'''
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
%s
int main(int argc, char** argv) {
    // argv: weights, x, r, g, nrows, out, s
    int nrows = atoi(argv[5]);
    auto w = hx_read(argv[1]); auto x = hx_read(argv[2]); auto r = hx_read(argv[3]); auto g = hx_read(argv[4]);
    const int k = 256 * HX_NBLOCKS;
    std::vector<float> out(nrows, -12345.0f), s(k, -1.0f);
    hx_launch({(unsigned)((nrows + HX_RPB - 1) / HX_RPB), 1, 1}, {32, (unsigned)HX_NWARPS, 1},
              (size_t)(HX_NWARPS - 1) * (HX_RPB + 1) * 32 * 4,
              [&] { hx_mmvq_inline(w.data(), (const float*)x.data(), (const float*)r.data(), (const float*)g.data(),
                                   s.data(), out.data(), nrows, 1e-6f); });
    hx_write(argv[6], out.data(), (size_t)nrows * 4);
    hx_write(argv[7], s.data(), (size_t)k * 4);
}'''


def _model(w_blocks, x, r, g, eps):
    """q8_1 of (x + r) * g (d = absmax / 127, round half to even), through the dequantized weight, / rms."""
    from hiraishin.quant import dequantize

    v = (x + r).astype(np.float32)
    y = (v * g).astype(np.float32).reshape(-1, 32)
    amax = np.abs(y).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    q = np.where(amax == 0, 0, np.rint(y / np.where(d == 0, 1, d)))
    yq = (q * d).reshape(-1).astype(np.float64)
    rms = np.sqrt(np.mean(v.astype(np.float64) ** 2) + eps)
    return dequantize(w_blocks, "Q4_K").astype(np.float64) @ yq / rms


@pytest.mark.parametrize("k,n", [(1024, 37), (4096, 9)])  # a partial kbx step; two full steps; rows past a block
def test_inline_rows_match_their_model_and_s_is_x_plus_r(tmp_path, k, n):
    import proto_inline_norm as proto

    defines = proto.inline_defines(k, 4096)  # the launch geometry of a 4096-row weight, on fewer rows
    kernel = re.sub(r"extern __shared__ float (\w+)\[\];", r"float* \1 = (float*)g_dyn_shared.data();", proto.KERNEL)
    exe = ShimBuilder(tmp_path).build("mmvq/mmvq.cu", defines, MAIN % kernel.replace('extern "C"', ""), tag="inline")
    w, x, r, g = proto.case(k + n, k, n)
    x[:32] = -r[:32]  # one q8_1 block of zeros (absmax 0)
    for name, a in (("w", w), ("x", x), ("r", r), ("g", g)):
        np.ascontiguousarray(a).tofile(tmp_path / f"{name}.bin")
    _run(exe, tmp_path / "w.bin", tmp_path / "x.bin", tmp_path / "r.bin", tmp_path / "g.bin", n,
         tmp_path / "out.bin", tmp_path / "s.bin")
    out = np.fromfile(tmp_path / "out.bin", np.float32)
    s = np.fromfile(tmp_path / "s.bin", np.float32)
    assert np.array_equal(s.view(np.uint32), (x + r).view(np.uint32))
    want = _model(w, x, r, g, proto.EPS)
    assert np.max(np.abs(out - want)) <= 1e-4 * np.max(np.abs(want)), np.max(np.abs(out - want))
