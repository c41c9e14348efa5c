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
    if qtype.startswith("MMA8_"):  # per group of 8 columns and super-block: ds of each column, then per pair k
        mma = _reference(xq, "MMA_" + qtype[5:])
        ncols, width = mma.shape
        rows = -(-ncols // 8) * 8
        mma = np.concatenate([mma, np.repeat(mma[-1:], rows - ncols, axis=0)])
        out = np.zeros(rows * width, np.uint8)
        for col in range(rows):
            j, c = divmod(col, 8)
            for sb in range(width // 288):
                base = (j * (width // 288) + sb) * 2304
                out[base + 32 * c:base + 32 * c + 32] = mma[col, 288 * sb:288 * sb + 32]
                for k in range(4):
                    at = base + 256 + 512 * k + 64 * c
                    out[at:at + 64] = mma[col, 288 * sb + 32 + 64 * k:288 * sb + 96 + 64 * k]
        return out.reshape(rows, width)
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
    assert got.shape == (8 if qtype.startswith("MMA8_") else 3, 3 * LAYOUT_BYTES[qtype])
    np.testing.assert_array_equal(got, _reference(xq, qtype))


@pytest.mark.parametrize("ncols", [1, 8, 9, 17])
def test_mma8_columns_undo_the_interleaving(ncols):
    """mma8_columns(to_layout(xq, MMA8_*)) is the per-column MMA layout, for partial and whole groups."""
    from hiraishin.kernels.quantize.layout import mma8_columns

    xq = quantize_q8_1(np.random.default_rng(ncols).standard_normal((ncols, 512)).astype(np.float32))
    for qtype in ("Q4_K", "Q6_K"):
        inter = to_layout(xq, "MMA8_" + qtype)
        assert inter.shape == (-(-ncols // 8) * 8, 2 * 288)
        np.testing.assert_array_equal(mma8_columns(inter, ncols), to_layout(xq, "MMA_" + qtype))
    with pytest.raises(QuantError, match="mma8_columns"):
        mma8_columns(inter[:, :100], ncols)


def test_to_layout_bad_inputs_name_the_problem():
    xq = quantize_q8_1(np.ones((2, 256), np.float32))
    with pytest.raises(QuantError, match="Q8_0"):
        to_layout(xq, "Q8_0")
    with pytest.raises(QuantError, match=r"\(2, 36\)"):
        to_layout(xq[:, :36], "Q6_K")
    assert to_layout(xq[:0], "Q4_K").shape == (0, 416)
