"""Block layouts, type ids, row sizes and dequantization vs gguf-py on random valid blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from hiraishin import quant as Q
from hiraishin.errors import QuantError
from hiraishin.quant import formats
from hiraishin.quant.q4_k import pack_scale_min, unpack_scale_min

GT = gguf.GGMLQuantizationType


def finite_fp16_bits(rng, shape) -> np.ndarray:
    """Random fp16 bit patterns with inf/NaN exponents (0x1f) remapped to finite ones."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
    special = (bits & 0x7C00) == 0x7C00
    return np.where(special, bits & np.uint16(0xBFFF), bits).astype(np.uint16)


def random_blocks(qtype: str, n_rows: int, n_blocks: int, seed: int) -> np.ndarray:
    """uint8 rows of random bytes whose fp16 scale fields are finite."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n_rows, n_blocks * Q.BLOCK_BYTES[qtype]), dtype=np.uint8)
    blocks = data.view(formats.BLOCK_DTYPES[qtype])
    for field, (dt, _) in formats.BLOCK_DTYPES[qtype].fields.items():
        if dt == np.dtype("<f2"):
            blocks[field] = finite_fp16_bits(rng, blocks.shape).view(np.float16)
    return data


def test_block_layouts_match_ggml_common_h():
    # offsets of every field, as in ggml-common.h (and the reference doc section 2)
    def offsets(dt):
        return {name: off for name, (_, off) in dt.fields.items()}

    assert offsets(formats.BLOCK_Q8_0) == {"d": 0, "qs": 2}
    assert offsets(formats.BLOCK_Q8_1) == {"d": 0, "s": 2, "qs": 4}
    assert offsets(formats.BLOCK_Q4_K) == {"d": 0, "dmin": 2, "scales": 4, "qs": 16}
    assert offsets(formats.BLOCK_Q6_K) == {"ql": 0, "qh": 128, "scales": 192, "d": 208}
    for name in Q.QTYPES:
        if name == "Q8_1":
            # gguf-py 0.19 still lists the old 40-byte q8_1 (float d, float s); ggml-common.h
            # has had half2 ds + qs[32] = 36 bytes since 2023, which is what the CUDA kernels use.
            assert gguf.GGML_QUANT_SIZES[GT.Q8_1] == (32, 40)
            assert (Q.BLOCK_ELEMS[name], Q.BLOCK_BYTES[name]) == (32, 36)
            continue
        block, size = gguf.GGML_QUANT_SIZES[Q.to_gguf_type(name)]
        assert (Q.BLOCK_ELEMS[name], Q.BLOCK_BYTES[name]) == (block, size), name


def test_type_ids_and_gguf_mapping():
    assert Q.GGML_TYPE_ID == {"F32": 0, "F16": 1, "Q8_0": 8, "Q8_1": 9, "Q4_K": 12, "Q6_K": 14, "BF16": 30}
    for name, tid in Q.GGML_TYPE_ID.items():
        g = Q.to_gguf_type(name)
        assert g == GT[name] and int(g) == tid
        assert Q.from_gguf_type(g) == name
        assert Q.qtype_name(tid) == name
    with pytest.raises(QuantError, match="Q5_0"):
        Q.from_gguf_type(GT.Q5_0)
    with pytest.raises(QuantError, match="Q4_Z"):
        Q.qtype_name("Q4_Z")


def test_row_bytes():
    assert Q.row_bytes(1024, "Q4_K") == 4 * 144
    assert Q.row_bytes(2048, "Q6_K") == 8 * 210
    assert Q.row_bytes(640, "Q8_0") == 20 * 34
    assert Q.row_bytes(640, "Q8_1") == 20 * 36
    assert Q.row_bytes(7, "F32") == 28 and Q.row_bytes(7, "F16") == 14 and Q.row_bytes(7, "BF16") == 14
    assert Q.row_bytes(0, "Q4_K") == 0
    assert Q.row_bytes(256, GT.Q4_K) == 144
    with pytest.raises(QuantError, match=r"Q4_K.*640.*256"):
        Q.row_bytes(640, "Q4_K")
    with pytest.raises(QuantError, match="Q8_0"):
        Q.row_bytes(-32, "Q8_0")


def test_scale_min_packing_round_trips_all_6bit_values():
    rng = np.random.default_rng(0)
    ls = rng.integers(0, 64, size=(4096, 8), dtype=np.uint8)
    lm = rng.integers(0, 64, size=(4096, 8), dtype=np.uint8)
    ls[0], lm[0] = 63, 63
    sc, m = unpack_scale_min(pack_scale_min(ls, lm))
    assert np.array_equal(sc, ls) and np.array_equal(m, lm)
    # and unpacking agrees with gguf's get_scale_min on arbitrary bytes
    raw = rng.integers(0, 256, size=(512, 12), dtype=np.uint8)
    assert all(np.array_equal(a, b) for a, b in zip(unpack_scale_min(raw), gguf.quants.Q4_K.get_scale_min(raw)))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_dequantize_bit_identical_to_gguf_on_random_blocks(qtype):
    data = random_blocks(qtype, n_rows=64, n_blocks=6, seed=Q.GGML_TYPE_ID[qtype])
    got = Q.dequantize(data, qtype)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(data, Q.to_gguf_type(qtype))
    assert got.dtype == np.float32 and got.shape == (64, 6 * Q.BLOCK_ELEMS[qtype])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_q8_1_is_d_times_qs():
    # gguf 0.19 has no Q8_1 dequantizer: check against the formula x = f(d) * qs directly.
    data = random_blocks("Q8_1", n_rows=8, n_blocks=5, seed=9)
    got = Q.dequantize(data, "Q8_1")
    raw = data.reshape(8, 5, 36)
    d = raw[..., 0:2].copy().view(np.float16).astype(np.float32)
    qs = raw[..., 4:].view(np.int8).astype(np.float32)
    with np.errstate(all="ignore"):
        want = (qs * d).reshape(8, 160)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_extra_leading_axes():
    data = random_blocks("Q6_K", n_rows=6, n_blocks=2, seed=1).reshape(2, 3, -1)
    got = Q.dequantize(data, "Q6_K")
    assert got.shape == (2, 3, 512)
    assert np.array_equal(got.reshape(6, 512), Q.dequantize(data.reshape(6, -1), "Q6_K"))


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_dequantize_float_types_match_gguf(qtype):
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=(16, 64), dtype=np.uint8)
    want = gguf.quants.dequantize(raw, GT[qtype]).reshape(16, -1)
    typed = raw.view(formats.FLOAT_DTYPES[qtype])
    for data in (raw, typed):
        got = Q.dequantize(data, qtype)
        assert got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_as_blocks_fields():
    x = np.linspace(-1, 1, 512, dtype=np.float32)[None]
    b = Q.as_blocks(Q.quantize(x, "Q8_0"), "Q8_0")
    assert b.shape == (1, 16) and b.dtype == formats.BLOCK_Q8_0
    assert np.abs(b["qs"]).max() == 127
