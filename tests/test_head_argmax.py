"""The output head with its greedy token in one launch (mmvq.cu ``mmvq_argmax``, HX_ARGMAX) on the CPU.

The CUDA source runs through the g++ shim (tests/cuda_shim.py, CUDA blocks one at a time): its logits
must be the emulator's (the mat-vec's bits) and its token ``hx_argmax_rows``' rule (the first index of
the largest logit, NaN largest), with the advance and token log of a chained pass, across more CUDA
blocks than key slots and fewer, ties between blocks, and a second launch on the same scratch (each
launch's last block sets the slots and counters back to zero).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_shim import GXX, ShimBuilder, bits, run

from hiraishin.kernels import mmvq, quantize
from hiraishin.kernels.elementwise.emulate import emulate_argmax_rows
from hiraishin.kernels.mmvq.launch import ARGMAX_SLOTS, kernel_defines
from hiraishin.kernels.quantize.layout import to_layout
from hiraishin.plans import MatVecPlan
from hiraishin.plans.matvec import MATVEC_TRAITS
from hiraishin.quant import BLOCK_BYTES
from hiraishin.quant import random_blocks as random_weights

pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20)")

MAIN = r'''
int main(int argc, char** argv) {
    // argv: weights, q8_1, nrows, position, n_log, out logits, out ints; two launches on one scratch, the
    // second at the position the first advanced to (pos points into the advance buffer, as in a chain)
    int nrows = atoi(argv[3]), position = atoi(argv[4]), n_log = atoi(argv[5]);
    auto w = hx_read(argv[1]); auto y = hx_read(argv[2]);
    std::vector<float> out(nrows, -12345.0f);
    std::vector<unsigned long long> keys(HX_ARGMAX_SLOTS, 0);
    std::vector<unsigned> counters(HX_ARGMAX_SLOTS + 1, 0);
    std::vector<int> io = {-1, position}, log((size_t)2 * n_log, -1), tokens;
    int token = -1;
    for (int round = 0; round < 2; ++round) {
        hx_launch({(unsigned)((nrows + HX_RPB - 1) / HX_RPB), 1, 1}, {32, (unsigned)HX_NWARPS, 1},
                  (size_t)(HX_NWARPS - 1) * HX_RPB * 32 * 4,
                  [&] { mmvq_argmax(w.data(), y.data(), out.data(), nrows, keys.data(), counters.data(), &token,
                                    io.data() + 1, io.data(), log.data(), n_log); });
        tokens.push_back(token);
    }
    std::vector<int> ints = {tokens[0], tokens[1], io[0], io[1]};
    for (auto k : keys) ints.push_back(k != 0);
    for (auto c : counters) ints.push_back((int)c);
    ints.insert(ints.end(), log.begin(), log.end());
    hx_write(argv[6], out.data(), out.size() * 4);
    hx_write(argv[7], ints.data(), ints.size() * 4);
}'''

N_LOG = 40
POSITION = 17


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return ShimBuilder(tmp_path_factory.mktemp("head-argmax-shim"))


def _with_ties_and_nan(w: np.ndarray, qtype: str, logits: np.ndarray, nan_row: int | None) -> tuple[np.ndarray, int]:
    """The weights with the largest row copied into an earlier and a later row (a tie across CUDA blocks:
    the earlier copy must win), or one row's first scale made an f16 NaN (its logit NaN: the largest)."""
    w = w.copy()
    if nan_row is not None:
        w[nan_row, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # d of super-block 0
        return w, nan_row
    best = int(np.argmax(logits))
    first = max(0, best - 37) if best > 0 else 0
    for row in {first, min(len(w) - 1, best + 70)}:
        w[row] = w[best]
    return w, min(first, best)


@pytest.mark.parametrize("qtype,n,k,rows,nwarps,nan_row", [
    ("Q6_K", 300, 1024, 1, 4, None),   # 300 CUDA blocks: every key slot shared
    ("Q6_K", 151, 1024, 4, 4, None),   # the head's own geometry (4 short rows a block), blocks < slots
    ("Q4_K", 257, 2048, 2, 4, 200),    # a NaN logit wins
    ("Q4_K", 9, 1024, 4, 4, None),     # three CUDA blocks
])
def test_head_argmax_source_equals_mat_vec_and_argmax_emulators(shim, tmp_path, qtype, n, k, rows, nwarps, nan_row):
    t = MATVEC_TRAITS[qtype]
    w = random_weights(qtype, n, k, seed=n + k)
    xq = quantize.emulate((np.random.default_rng(k).standard_normal((1, k)) * 2).astype(np.float32))
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=rows, cols_per_launch=1, ncols=1)
    w, want_token = _with_ties_and_nan(w, qtype, mmvq.emulate(w, qtype, xq, plan)[0], nan_row)
    want = mmvq.emulate(w, qtype, xq, plan)
    assert int(emulate_argmax_rows(want)[0]) == want_token
    assert w.shape[1] == k // t.qk * BLOCK_BYTES[qtype]
    w.tofile(tmp_path / "w.bin")
    to_layout(xq, qtype).tofile(tmp_path / "y.bin")
    defines = {**kernel_defines(qtype, 1, rows, nwarps, k // t.qk), "HX_ARGMAX": 1, "HX_ARGMAX_SLOTS": ARGMAX_SLOTS}
    exe = shim.build("mmvq/mmvq.cu", defines, MAIN, "head_argmax")
    run(exe, tmp_path / "w.bin", tmp_path / "y.bin", n, POSITION, N_LOG, tmp_path / "o.bin", tmp_path / "i.bin")
    got = np.fromfile(tmp_path / "o.bin", np.float32).reshape(1, n)
    np.testing.assert_array_equal(bits(got), bits(want))
    ints = np.fromfile(tmp_path / "i.bin", np.int32)
    tokens, io = ints[:2], ints[2:4]
    keys_left = ints[4:4 + ARGMAX_SLOTS]
    counters = ints[4 + ARGMAX_SLOTS:5 + 2 * ARGMAX_SLOTS]
    log = ints[5 + 2 * ARGMAX_SLOTS:].reshape(N_LOG, 2)
    assert tokens.tolist() == [want_token, want_token]
    assert io.tolist() == [want_token, POSITION + 2]  # two advances: the second launch read the first's position
    assert not keys_left.any() and not counters.any()  # ready for the next launch
    logit_bits = int(bits(want)[0, want_token])
    for cell in (POSITION + 1, POSITION + 2):
        assert log[cell, 0] == want_token and np.uint32(log[cell, 1]) == logit_bits
    assert (np.delete(log, [POSITION + 1, POSITION + 2], axis=0) == -1).all()


def test_head_argmax_fails_on_a_wrong_slot_count(shim, tmp_path):
    """The test above can fail: a kernel whose last block miscounts a slot's blocks (one slot too few)
    leaves counters set and misses keys."""
    qtype, n, k = "Q6_K", 300, 1024
    w = random_weights(qtype, n, k, seed=5)
    xq = quantize.emulate((np.random.default_rng(5).standard_normal((1, k)) * 2).astype(np.float32))
    w.tofile(tmp_path / "w.bin")
    to_layout(xq, qtype).tofile(tmp_path / "y.bin")
    defines = {**kernel_defines(qtype, 1, 1, 4, k // 256), "HX_ARGMAX": 1, "HX_ARGMAX_SLOTS": ARGMAX_SLOTS}
    exe = shim.build("mmvq/mmvq.cu", defines, MAIN, "head_argmax_broken",
                     edit=lambda s: s.replace("== slots - 1;", "== slots - 2;"))
    run(exe, tmp_path / "w.bin", tmp_path / "y.bin", n, POSITION, N_LOG, tmp_path / "o.bin", tmp_path / "i.bin")
    ints = np.fromfile(tmp_path / "i.bin", np.int32)
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=1, cols_per_launch=1, ncols=1)
    want_token = int(emulate_argmax_rows(mmvq.emulate(w, qtype, xq, plan))[0])
    counters = ints[4 + ARGMAX_SLOTS:5 + 2 * ARGMAX_SLOTS]
    assert ints[0] != want_token or counters.any()


def test_the_cuda_backend_reads_the_head_argmax_switch(monkeypatch):
    # The switch lives on the launch module, which the package's `launch` function hides from
    # `from hiraishin.kernels.mmvq import launch` (a backend that read it so found a function: session 22).
    import sys

    from hiraishin.backends.cuda import CudaOps

    launch_module = sys.modules["hiraishin.kernels.mmvq.launch"]
    for on in (False, True):
        monkeypatch.setattr(launch_module, "HEAD_ARGMAX", on)
        assert CudaOps._head_argmax(None, [object()], 2) is None  # never for a pass of two tokens
        assert CudaOps._head_argmax(None, [object(), object()], 1) is None  # nor for two weights
    monkeypatch.setattr(launch_module, "HEAD_ARGMAX", False)
    assert CudaOps._head_argmax(None, [object()], 1) is None


MAIN_NORM = r'''
int main(int argc, char** argv) {
    // argv: x, r, norm weight, eps, weights, nrows, position, n_log, CUDA blocks (0: one per HX_NORM_GROUPS row
    // blocks), out logits, out ints; two launches on one scratch as above
    const int k = HX_NBLOCKS * HX_QK;
    int nrows = atoi(argv[6]), position = atoi(argv[7]), n_log = atoi(argv[8]);
    const float eps = strtof(argv[4], nullptr);
    auto x = hx_read(argv[1]); auto r = hx_read(argv[2]); auto nw = hx_read(argv[3]); auto w = hx_read(argv[5]);
    std::vector<float> out(nrows, -12345.0f), s(k, -1.0f);
    std::vector<unsigned long long> keys(HX_ARGMAX_SLOTS, 0);
    std::vector<unsigned> counters(HX_ARGMAX_SLOTS + 1, 0);
    std::vector<int> io = {-1, position}, log((size_t)2 * n_log, -1), tokens;
    int token = -1;
    const unsigned all = ((nrows + HX_RPB - 1) / HX_RPB + HX_NORM_GROUPS - 1) / HX_NORM_GROUPS;
    const unsigned grid = atoi(argv[9]);
    for (int round = 0; round < 2; ++round) {
        hx_launch({grid ? grid : all, 1, 1}, {32, (unsigned)HX_NWARPS, (unsigned)HX_NORM_GROUPS},
                  (size_t)HX_NORM_GROUPS * (HX_NWARPS - 1) * HX_RPB * 32 * 4,
                  [&] { hx_norm_mmvq_argmax((const float*)x.data(), (const float*)r.data(), (const float*)nw.data(),
                                            s.data(), k, eps, w.data(), out.data(), nrows, keys.data(),
                                            counters.data(), &token, io.data() + 1, io.data(), log.data(), n_log); });
        tokens.push_back(token);
    }
    std::vector<int> ints = {tokens[0], tokens[1], io[0], io[1]};
    for (auto kk : keys) ints.push_back(kk != 0);
    for (auto c : counters) ints.push_back((int)c);
    ints.insert(ints.end(), log.begin(), log.end());
    hx_write(argv[10], out.data(), out.size() * 4);
    hx_write(argv[11], ints.data(), ints.size() * 4);
}'''


@pytest.mark.parametrize("qtype,n,k,rows,groups,nan_row,grid", [
    ("Q6_K", 151, 1024, 4, 4, None, 0),   # the 0.6B head's geometry, one CUDA block per four row blocks
    ("Q6_K", 151, 1024, 4, 4, None, 3),   # three CUDA blocks striding over ten
    ("Q4_K", 300, 1024, 1, 4, 77, 70),    # a NaN logit; more CUDA blocks than key slots
    ("Q4_K", 300, 1024, 1, 4, None, 65),  # a tie across CUDA blocks
])
def test_norm_head_argmax_source_equals_norm_matvec_and_argmax_emulators(shim, tmp_path, qtype, n, k, rows, groups,
                                                                         nan_row, grid):
    """hx_norm_mmvq_argmax (norm_mmvq.cu): the norm, the head and the greedy token in one launch, striding or not:
    the norm launch's and mmvq's logits, hx_argmax_rows' token, advance and log, the scratch back to zero."""
    from hiraishin.kernels.norm_mmvq import emulate as norm_emulate
    from hiraishin.kernels.norm_mmvq.launch import SOURCE, norm_mmvq_defines, norm_mmvq_geometry

    rng = np.random.default_rng(n + k)
    x = (rng.standard_normal((1, k)) * 2).astype(np.float32)
    r = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    nw = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    eps = np.float32(1e-6)
    plan = MatVecPlan("mmvq", qtype, nwarps=4, rows_per_block=rows, cols_per_launch=1, ncols=1)
    w = random_weights(qtype, n, k, seed=n + k)
    (logits,), _ = norm_emulate(x, r, nw, eps, [(w, qtype)], plan)
    w, want_token = _with_ties_and_nan(w, qtype, logits[0], nan_row)
    (want,), _ = norm_emulate(x, r, nw, eps, [(w, qtype)], plan)
    assert int(emulate_argmax_rows(want)[0]) == want_token
    for name, a in (("x", x), ("r", r), ("nw", nw), ("w", w)):
        a.tofile(tmp_path / f"{name}.bin")
    geometry = norm_mmvq_geometry(k, 4, groups)
    defines = {**norm_mmvq_defines(qtype, k, 1, rows, 4, qtype, geometry), "HX_ARGMAX": 1,
               "HX_ARGMAX_SLOTS": ARGMAX_SLOTS, "HX_PREFETCH_AHEAD": 0}
    exe = shim.build(SOURCE, defines, MAIN_NORM, "norm_head_argmax")
    run(exe, tmp_path / "x.bin", tmp_path / "r.bin", tmp_path / "nw.bin", repr(float(eps)), tmp_path / "w.bin", n,
        POSITION, N_LOG, grid, tmp_path / "o.bin", tmp_path / "i.bin")
    np.testing.assert_array_equal(bits(np.fromfile(tmp_path / "o.bin", np.float32).reshape(1, n)), bits(want))
    ints = np.fromfile(tmp_path / "i.bin", np.int32)
    assert ints[:4].tolist() == [want_token, want_token, want_token, POSITION + 2]
    assert not ints[4:5 + 2 * ARGMAX_SLOTS].any()  # keys and counters ready for the next launch
    log = ints[5 + 2 * ARGMAX_SLOTS:].reshape(N_LOG, 2)
    for cell in (POSITION + 1, POSITION + 2):
        assert log[cell, 0] == want_token and np.uint32(log[cell, 1]) == int(bits(want)[0, want_token])


def test_argmax_launches_pass_null_pointers_for_no_advance_and_the_logs_length():
    from hiraishin.kernels.mmvq.launch import argmax_token_args

    log = np.zeros((40, 2), np.int32)
    assert argmax_token_args("t", "p") == ("t", "p", np.uint64(0), np.uint64(0), np.int32(0))
    args = argmax_token_args("t", "p", "adv", log)
    assert args[:3] == ("t", "p", "adv") and args[3] is log and args[4] == np.int32(40)
