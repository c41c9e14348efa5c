"""CPU emulators of the elementwise kernels (RMSNorm, RoPE, SwiGLU, add, get_rows), through the CPU backend."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.backends import get_backend
from hiraishin.errors import BackendError
from hiraishin.kernels.rmsnorm.emulate import block_threads
from hiraishin.kernels.rope import rope_tables
from hiraishin.quant import dequantize, quantize

CPU = get_backend("cpu")  # its ops run the kernels' emulators

# float32 round-off bounds against float64 (relative to the row scale): RMSNorm's sum over n
# terms and a handful of products stay well below 1e-5 for the sizes tested here.
RMS_RTOL = 1e-5
ROPE_ATOL = 4e-7  # two products and one add of |x| <= ~4: a few ulps
SWIGLU_RTOL = 4e-6  # exp from explicit fmaf ops (<= 2 ulp) + div + mul


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("n", [128, 96, 1024, 1056])
def test_rms_norm_matches_float64(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((5, n)) * rng.uniform(0.1, 30, (5, 1))).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    eps = 1e-6
    got = CPU.rms_norm(x, w, eps)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * w
    np.testing.assert_allclose(got, ref, rtol=RMS_RTOL, atol=RMS_RTOL * np.abs(ref).max())


def test_rms_norm_rows_are_independent_of_the_batch():
    # one row alone and the same row among others: identical bits (the order depends on n only)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 1024)).astype(np.float32)
    w = rng.standard_normal(1024).astype(np.float32)
    full = CPU.rms_norm(x, w, 1e-6)
    for i in (0, 4, 8):
        assert np.array_equal(_bits(CPU.rms_norm(x[i:i + 1], w, 1e-6)), _bits(full[i:i + 1]))


def test_rms_norm_fixed_tree_is_the_documented_one():
    # 256 threads for n < 1024: rebuild the documented tree in numpy float32 and compare bits
    rng = np.random.default_rng(2)
    n = 200
    x = rng.standard_normal((1, n)).astype(np.float32)
    w = np.ones(n, np.float32)
    assert block_threads(n) == 256 and block_threads(1024) == 1024
    part = np.zeros(256, np.float32)
    for t in range(256):
        for i in range(t, n, 256):
            part[t] = np.float32(np.float64(x[0, i]) * x[0, i] + part[t])  # exact fma: product fits in float64

    def butterfly(v):
        v = v.copy()
        for off in (16, 8, 4, 2, 1):
            v = (v + v[np.arange(32) ^ off]).astype(np.float32)
        return v[0]

    warps = np.zeros(32, np.float32)
    warps[:8] = [butterfly(part[32 * k:32 * k + 32]) for k in range(8)]
    total = butterfly(warps)
    scale = np.float32(1.0) / np.sqrt(total / np.float32(n) + np.float32(1e-6))
    expect = (scale * x) * w
    assert np.array_equal(_bits(CPU.rms_norm(x, w, 1e-6)), _bits(expect))


def test_rms_norm_rejects_bad_shapes():
    with pytest.raises(BackendError, match="rms_norm"):
        CPU.rms_norm(np.zeros((2, 8), np.float32), np.zeros(7, np.float32), 1e-6)
    with pytest.raises(BackendError, match="float32"):
        CPU.rms_norm(np.zeros((2, 8), np.float64), np.zeros(8, np.float64), 1e-6)


def test_rope_tables_and_rotation_match_float64():
    D, base = 128, 1e6
    cos_t, sin_t = rope_tables(64, D, base)
    assert cos_t.dtype == np.float32 and cos_t.shape == (64, 64)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, D)).astype(np.float32)
    pos = np.array([0, 5, 17, 63], np.int32)
    got = CPU.rope(x, pos, cos_t, sin_t)
    theta = pos[:, None] * np.power(base, -2.0 * np.arange(64) / D)
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    x64 = x.astype(np.float64)
    ref = np.concatenate([x64[..., :64] * c - x64[..., 64:] * s, x64[..., :64] * s + x64[..., 64:] * c], -1)
    np.testing.assert_allclose(got, ref, atol=ROPE_ATOL * 8)
    assert np.array_equal(_bits(got[0]), _bits(x[0]))  # position 0: cos 1, sin 0 -> identity
    # the emulator is the documented float32 formula, op for op
    c32, s32 = cos_t[pos][:, None], sin_t[pos][:, None]
    x0, x1 = x[..., :64], x[..., 64:]
    expect = np.concatenate([x0 * c32 - x1 * s32, x0 * s32 + x1 * c32], -1)
    assert np.array_equal(_bits(got), _bits(expect))


def test_rope_rejects_positions_outside_the_table():
    cos_t, sin_t = rope_tables(8, 16, 1e4)
    with pytest.raises(BackendError, match="outside the table"):
        CPU.rope(np.zeros((1, 1, 16), np.float32), np.array([8]), cos_t, sin_t)


def test_swiglu_matches_float64():
    rng = np.random.default_rng(4)
    g = np.concatenate([rng.standard_normal(4000) * 4, [-100.0, -88.5, -87.0, 0.0, 30.0, 100.0]]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    got = CPU.swiglu(g, u)
    g64 = g.astype(np.float64)
    ref = g64 / (1.0 + np.exp(-g64)) * u
    np.testing.assert_allclose(got, ref, rtol=SWIGLU_RTOL, atol=1e-30)
    assert np.isfinite(got).all()


def test_add_is_the_float32_add():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 3, 7)).astype(np.float32)
    assert np.array_equal(_bits(CPU.add(a, b)), _bits(a + b))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_get_rows_equals_dequantize_bitwise(qtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((11, 512)).astype(np.float32) * rng.uniform(0.01, 3, (11, 1)).astype(np.float32)
    table = quantize(x, qtype)
    ids = np.array([10, 0, 3, 3, 7])
    got = CPU.get_rows(table, qtype, ids)
    assert np.array_equal(_bits(got), _bits(dequantize(table[ids], qtype)))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["Q4_K", "Q6_K", "Q8_0"]), st.binary(min_size=420, max_size=420))
def test_get_rows_of_arbitrary_bytes_equals_dequantize(qtype, raw):
    # random block bytes (any scales, any fp16 d including subnormals), finite results compared bitwise
    from hiraishin.quant import BLOCK_BYTES

    nb = BLOCK_BYTES[qtype]
    row = np.frombuffer(raw[: (420 // nb) * nb], np.uint8).reshape(1, -1)
    got = CPU.get_rows(row, qtype, [0])
    ref = dequantize(row, qtype)
    finite = np.isfinite(ref)
    assert np.array_equal(_bits(got[finite]), _bits(ref[finite]))
    assert np.array_equal(np.isnan(got), np.isnan(ref))


def test_get_rows_f32_and_f16_tables():
    rng = np.random.default_rng(7)
    t32 = rng.standard_normal((5, 8)).astype(np.float32)
    assert np.array_equal(CPU.get_rows(t32, "F32", [4, 1]), t32[[4, 1]])
    t16 = t32.astype(np.float16)
    assert np.array_equal(CPU.get_rows(t16, "F16", [2]), t16[[2]].astype(np.float32))


def test_get_rows_rejects_bad_ids_and_types():
    table = np.zeros((4, 34), np.uint8)
    with pytest.raises(BackendError, match="outside"):
        CPU.get_rows(table, "Q8_0", [4])
    with pytest.raises(BackendError, match="unsupported"):
        CPU.get_rows(table, "Q5_K", [0])


# ---- hx_argmax_rows (the device argmax of Qwen3.forward_argmax), through the g++ shim -------------

MAIN_ARGMAX = r'''
int main(int argc, char** argv) {
    // argv: x, rows, n, threads, blocks per row, out; launched twice (the counters must come back to 0)
    int rows = atoi(argv[2]), n = atoi(argv[3]), nt = atoi(argv[4]), nblk = atoi(argv[5]);
    auto x = hx_read(argv[1]);
    std::vector<int> out(rows, -7), again(rows, -9);
    std::vector<unsigned long long> partials((size_t)rows * nblk, 0xdeadbeefull);
    std::vector<unsigned> counters(rows, 0);
    for (int* o : {out.data(), again.data()})
        hx_launch({(unsigned)nblk, (unsigned)rows, 1}, {(unsigned)nt, 1, 1}, 0,
                  [&] { hx_argmax_rows((const float*)x.data(), o, partials.data(), counters.data(), n,
                                       nullptr, nullptr, nullptr, 0); });
    for (int t = 0; t < rows; ++t) if (again[t] != out[t] || counters[t] != 0) return 3;
    // the advance: the last row's token at its position + 1, into a separate buffer and the log
    std::vector<int> pos(rows), adv(2, -5), log(2 * (rows + 40), -1), third(rows, -11);
    for (int t = 0; t < rows; ++t) pos[t] = 30 + t;
    hx_launch({(unsigned)nblk, (unsigned)rows, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_argmax_rows((const float*)x.data(), third.data(), partials.data(), counters.data(), n,
                                   pos.data(), adv.data(), log.data(), rows + 40); });
    for (int t = 0; t < rows; ++t) if (third[t] != out[t]) return 4;
    const float best = ((const float*)x.data())[(size_t)(rows - 1) * n + out[rows - 1]];  // the last row's largest
    int best_bits;
    memcpy(&best_bits, &best, 4);
    const int at = 30 + rows;
    if (adv[0] != out[rows - 1] || adv[1] != at || log[2 * at] != out[rows - 1] || log[2 * at + 1] != best_bits)
        return 5;
    for (int i = 0; i < (int)log.size(); ++i) if (i / 2 != at && log[i] != -1) return 6;
    // a one-token pass's [id, position] buffer is its own advance (they alias); no log
    std::vector<int> io = {123, 77}, one(1, -1);
    hx_launch({(unsigned)nblk, 1, 1}, {(unsigned)nt, 1, 1}, 0,
              [&] { hx_argmax_rows((const float*)x.data(), one.data(), partials.data(), counters.data(), n,
                                   io.data() + 1, io.data(), nullptr, 0); });
    if (one[0] != out[0] || io[0] != out[0] || io[1] != 78) return 7;
    hx_write(argv[6], out.data(), out.size() * 4);
}'''


def _argmax_rows_cases(n: int) -> np.ndarray:
    """Rows that test the rule: ties (first index wins, across threads and warps), NaN (largest,
    first of several), -0.0 beside +0.0, all -inf, the maximum in the last element, and noise."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, n)).astype(np.float32)
    x[0, [5, 700, 1500]] = 9.0  # a tie between three threads of different warps
    x[1, [3, n - 1]] = np.nan
    x[1, 10] = np.inf
    x[2, :] = -1.0
    x[2, 40] = -0.0  # -0.0 == +0.0: index 40 comes first
    x[2, 1029] = 0.0
    x[3, :] = -np.inf
    x[4, n - 1] = 50.0
    x[5, :] = 0.0
    x[6, 1023] = x[6, 1024] = 8.0  # a tie across threads, passes and CUDA blocks
    x[6, 2999] = 8.0
    x[7, ::2] = 3.0
    return x


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
@pytest.mark.parametrize("n,threads,blocks", [(3000, 256, 2), (3000, 96, 5), (3000, 64, 1), (17, 64, 3)])
def test_argmax_rows_source_equals_numpy(tmp_path, n, threads, blocks):
    from cuda_shim import ShimBuilder, run

    from hiraishin.kernels.elementwise import emulate_argmax_rows

    if n >= 1600:
        x = _argmax_rows_cases(n)
    else:  # a row shorter than the block: most threads see nothing
        x = np.array([[1, 3, 3, -0.0] + [0] * (n - 4), [np.nan] * n, [-np.inf] * (n - 1) + [-1]], np.float32)
    (tmp_path / "x.bin").write_bytes(np.ascontiguousarray(x).tobytes())
    exe = ShimBuilder(tmp_path).build("elementwise/elementwise.cu", {}, MAIN_ARGMAX, "argmax")
    run(exe, tmp_path / "x.bin", x.shape[0], n, threads, blocks, tmp_path / "out.bin")
    got = np.fromfile(tmp_path / "out.bin", np.int32)
    want = np.argmax(x, axis=1)
    assert got.tolist() == want.tolist()
    assert emulate_argmax_rows(x).tolist() == want.tolist()
    if n > 40:
        assert want[1] == 3 and want[2] == 40 and want[3] == 0 and want[0] == 5


MAIN_TOPK = r'''
int main(int argc, char** argv) {
    // argv: x (one row), n, k, threads, blocks, out; launched twice (the counter must come back to 0)
    int n = atoi(argv[2]), k = atoi(argv[3]), nt = atoi(argv[4]), nblk = atoi(argv[5]);
    auto x = hx_read(argv[1]);
    std::vector<int> out(2 * k, -7), again(2 * k, -9);
    std::vector<unsigned long long> partials((size_t)nblk * k, 0xdeadbeefull);
    unsigned counter = 0;
    for (int* o : {out.data(), again.data()})
        hx_launch({(unsigned)nblk, 1, 1}, {(unsigned)nt, 1, 1}, 0,
                  [&] { hx_topk_row((const float*)x.data(), n, k, partials.data(), &counter, o); });
    if (out != again || counter != 0) return 3;
    hx_write(argv[6], out.data(), out.size() * 4);
}'''


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
@pytest.mark.parametrize("n,k,threads,blocks", [(3000, 5, 256, 2), (3000, 16, 96, 5), (3000, 1, 64, 1),
                                                 (9, 12, 64, 3)])
def test_topk_row_source_equals_top_k_of(tmp_path, n, k, threads, blocks):
    """hx_topk_row: hiraishin.decode.greedy.top_k_of's places (ties to the lower index, -0.0 == +0.0, NaN last,
    index -1 past a short row's end) and the values' bits, over any split of the row."""
    from cuda_shim import ShimBuilder, run

    from hiraishin.decode.greedy import top_k_of
    from hiraishin.kernels.elementwise import emulate_topk_row

    rng = np.random.default_rng(n + k)
    x = rng.standard_normal(n).astype(np.float32)
    if n > 100:
        x[[10, 700, 2999]] = 4.0  # a three-way tie across threads and blocks
        x[[20, 21]] = [-0.0, 0.0]
        x[[5, 1500]] = np.nan
        x[[30, 31]] = [np.inf, -np.inf]
    else:
        x[:] = [1, np.nan, 3, 3, -0.0, 0.0, -np.inf, 2, 3][:n]
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    exe = ShimBuilder(tmp_path).build("elementwise/elementwise.cu", {}, MAIN_TOPK, "topk")
    run(exe, tmp_path / "x.bin", n, k, threads, blocks, tmp_path / "out.bin")
    got = np.fromfile(tmp_path / "out.bin", np.int32).reshape(k, 2)
    want = emulate_topk_row(x, k)
    np.testing.assert_array_equal(got, want)
    ids, vals = top_k_of(x, k)
    real = got[:, 0] >= 0
    assert got[real, 0].tolist() == ids.tolist() and np.array_equal(got[real, 1], vals.view(np.int32))
