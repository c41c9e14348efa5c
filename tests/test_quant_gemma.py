"""Dequantization of every Q4_K, Q6_K and Q8_0 tensor of a real llama.cpp-quantized GGUF
(Gemma 3 270M Q4_K_M) is bit-identical to gguf-py's.

Every row of every Q4_K / Q6_K tensor (35M values) is compared; of the Q8_0 token embedding
(262144 x 640, 168M values) every 16th row, which keeps the test to a few seconds."""

from __future__ import annotations

import gguf
import numpy as np

from hiraishin import quant as Q

ROW_CHUNK = 8192
BIG_TENSOR_ROWS = 65536  # above this, compare a row stride (only token_embd here)
BIG_TENSOR_STRIDE = 16


def test_every_quantized_tensor_dequantizes_like_gguf(gemma_gguf_path):
    reader = gguf.GGUFReader(gemma_gguf_path)
    seen = {"Q4_K": 0, "Q6_K": 0, "Q8_0": 0}
    for t in reader.tensors:
        name = t.tensor_type.name
        if name not in seen:
            continue
        data = t.data
        assert data.dtype == np.uint8 and data.shape[-1] == Q.row_bytes(int(t.shape[0]), name), t.name
        if data.shape[0] > BIG_TENSOR_ROWS:
            assert name == "Q8_0", t.name  # every K-quant tensor is checked in full
            data = data[::BIG_TENSOR_STRIDE]
        for r in range(0, data.shape[0], ROW_CHUNK):
            rows = data[r : r + ROW_CHUNK]
            got = Q.dequantize(rows, t.tensor_type)
            want = gguf.quants.dequantize(rows, t.tensor_type)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{t.name} rows {r}.."
        seen[name] += 1
    # the Q4_K_M recipe of this file: 27 Q4_K, 9 Q6_K, 10 Q8_0 tensors
    assert seen == {"Q4_K": 27, "Q6_K": 9, "Q8_0": 10}
