"""The mat-vec activation layouts: the vectorized conversion follows the written definition."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.errors import QuantError
from hiraishin.fp import F16_TO_F32
from hiraishin.kernels.quantize import emulate as quantize_q8_1
from hiraishin.kernels.quantize.layout import LAYOUT_BYTES, to_layout


def _reference(xq, qtype):
    """The layout byte by byte, from the module docstring's table, with plain loops."""
    ncols, nbytes = xq.shape
    nsb = nbytes // 288
    out = np.zeros((ncols, nsb * LAYOUT_BYTES[qtype]), np.uint8)
    for c in range(ncols):
        for sb in range(nsb):
            blk = [xq[c, (8 * sb + b) * 36:(8 * sb + b + 1) * 36] for b in range(8)]

            def qint(b, m):
                return blk[b][4 + 4 * m:8 + 4 * m]

            def d32(b):
                return np.float32(F16_TO_F32[int(blk[b][0]) | int(blk[b][1]) << 8]).tobytes()

            rec = bytearray()
            if qtype.startswith("MMA_"):  # ds words, then per pair k and lane t: ints u0, u1 of 2k, of 2k+1
                for b in range(8):
                    rec += bytes(blk[b][0:4])
                for k in range(4):
                    for t in range(4):
                        u = (t, t + 4) if qtype == "MMA_Q6_K" else (2 * t, 2 * t + 1)
                        for b in (2 * k, 2 * k + 1):
                            rec += bytes(qint(b, u[0])) + bytes(qint(b, u[1]))
            elif qtype == "Q6_K":
                for lane in range(32):
                    h, r, m = lane // 16, (lane // 8) % 2, lane % 8
                    rec += bytes(qint(4 * h + r, m)) + bytes(qint(4 * h + r + 2, m))
                for b in (0, 2, 1, 3, 4, 6, 5, 7):
                    rec += d32(b)
            else:
                for t in range(16):
                    cc, p = t // 4, t % 4
                    for b in (2 * cc, 2 * cc + 1):
                        rec += bytes(qint(b, p)) + bytes(qint(b, p + 4))
                for b in range(8):
                    rec += d32(b)
                for t in range(16):
                    cc, p = t // 4, t % 4
                    for b in (2 * cc, 2 * cc + 1):
                        s = int(qint(b, p).view(np.int8).sum()) + int(qint(b, p + 4).view(np.int8).sum())
                        rec += np.int32(s).tobytes()
            base = sb * LAYOUT_BYTES[qtype]
            out[c, base:base + len(rec)] = np.frombuffer(bytes(rec), np.uint8)
    return out


@pytest.mark.parametrize("qtype", sorted(LAYOUT_BYTES))
def test_to_layout_follows_the_definition(qtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 768)) * rng.uniform(0.1, 9.0, (3, 1))).astype(np.float32)
    x[1, :256] = 0.0  # an all-zero super-block: d = 0, sums 0
    xq = quantize_q8_1(x)
    got = to_layout(xq, qtype)
    assert got.shape == (3, 3 * LAYOUT_BYTES[qtype])
    np.testing.assert_array_equal(got, _reference(xq, qtype))


def test_to_layout_bad_inputs_name_the_problem():
    xq = quantize_q8_1(np.ones((2, 256), np.float32))
    with pytest.raises(QuantError, match="Q8_0"):
        to_layout(xq, "Q8_0")
    with pytest.raises(QuantError, match=r"\(2, 36\)"):
        to_layout(xq[:, :36], "Q6_K")
    assert to_layout(xq[:0], "Q4_K").shape == (0, 416)
