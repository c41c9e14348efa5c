"""The output head with its greedy token in one launch (``mmvq_argmax``) on a GPU (needs CuPy, ``-m gpu``).

The launch must give the one-column mat-vec's logits bit for bit and hx_argmax_rows' token, advance and
token log; a model with ``HIRAISHIN_HEAD_ARGMAX``'s launch (``HEAD_ARGMAX``) the same greedy tokens, chains
and logits as one without.
"""

from __future__ import annotations

import numpy as np
import pytest
from graph_passes import assert_same_decoding, greedy_outputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qtype,n,k,rows", [("Q6_K", 20011, 1024, 4), ("Q6_K", 3001, 4096, 2), ("Q4_K", 777, 2048, 2)])
def test_head_argmax_launch_equals_the_mat_vec_then_argmax(qtype, n, k, rows):
    import cupy as cp

    from hiraishin.kernels import quantize
    from hiraishin.kernels.elementwise.emulate import emulate_argmax_rows
    from hiraishin.kernels.mmvq.launch import ArgmaxMatVecLaunch, prepared_launch
    from hiraishin.kernels.quantize.layout import to_layout
    from hiraishin.quant import random_blocks

    w = random_blocks(qtype, n, k, seed=n)
    xq = quantize.emulate((np.random.default_rng(k).standard_normal((1, k)) * 2).astype(np.float32))
    wd, yd = cp.asarray(w), cp.asarray(to_layout(xq, qtype))
    want = prepared_launch(qtype, n, k, 1, rows, 4)(wd, yd, cp.empty((1, n), cp.float32)).get()
    token = int(emulate_argmax_rows(want)[0])
    head = ArgmaxMatVecLaunch(qtype, n, k, rows, 4)
    io = cp.asarray(np.array([-1, 40], np.int32))
    log = cp.full((64, 2), -1, cp.int32)
    out, tok = cp.empty((1, n), cp.float32), cp.full((1,), -1, cp.int32)
    for _ in range(2):  # the second launch on the scratch the first left (and at the position it advanced to)
        head(wd, yd, out, tok, io[1:], io, log)
    assert np.array_equal(out.get().view(np.uint32), want.view(np.uint32))
    assert int(tok.get()[0]) == token and io.get().tolist() == [token, 42]
    got_log = log.get()
    for cell in (41, 42):
        assert got_log[cell, 0] == token and np.uint32(got_log[cell, 1]) == want.view(np.uint32)[0, token]
    assert not head.slot_keys.get().any() and not head.counters.get().any()
    head(wd, yd, out, tok, io[1:])  # no advance
    assert int(tok.get()[0]) == token and io.get().tolist() == [token, 42]


@pytest.mark.parametrize("order_name", ["BATCH_INVARIANT", "FIXED_SPLIT", "BATCH_VARIANT"])
def test_models_with_the_head_argmax_launch_decode_the_same(tiny_model_path, monkeypatch, order_name):
    from hiraishin import Qwen3, ReductionOrder
    import sys

    mmvq_launch = sys.modules["hiraishin.kernels.mmvq.launch"]  # the package's `launch` is a function

    order = getattr(ReductionOrder, order_name)
    prompt = list(range(5, 45))
    runs = []
    for on in (False, True):
        monkeypatch.setattr(mmvq_launch, "HEAD_ARGMAX", on)
        m = Qwen3.from_gguf(tiny_model_path, device="cuda", progress=False, cuda_graphs=True, n_ctx=256)
        runs.append(greedy_outputs(m, prompt, 10, order))
    assert_same_decoding(*runs)
