"""Opt-in: the model properties on a real Qwen3 GGUF.

    HIRAISHIN_TEST_GGUF=/path/to/Qwen3-0.6B-Q4_K_M.gguf [HIRAISHIN_TEST_DEVICE=cuda] python -m pytest tests/test_replay_real_gguf.py

Skipped unless ``HIRAISHIN_TEST_GGUF`` names a file. Checks, on that file: the invariant order's
replay is bit-identical at batch sizes 2..16 and across the 256/384/512 KV boundaries, and
speculative decoding (the model as its own draft) emits plain greedy decoding's tokens.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hiraishin.order import ReductionOrder
from hiraishin.testing import assert_batch_invariant, assert_speculative_exact

GGUF = os.environ.get("HIRAISHIN_TEST_GGUF")
DEVICE = os.environ.get("HIRAISHIN_TEST_DEVICE", "auto")
PROMPT = "Explain a hash map in one paragraph."
N_NEW = 24
# positions 240..559: passes of 9 and 16 meet cell 256 and 512 (cut there) and cross 384
LONG_LEN, LONG_FROM = 560, 240

pytestmark = pytest.mark.skipif(not GGUF, reason="set HIRAISHIN_TEST_GGUF=/path/to/a/qwen3.gguf to run")


@pytest.fixture(scope="module")
def model():
    from hiraishin.model.qwen3 import Qwen3

    return Qwen3.from_gguf(GGUF, device=DEVICE, n_ctx=1024, progress=False)


def test_invariant_replay_is_bit_identical(model):
    assert_batch_invariant(model, PROMPT, [2, 3, 5, 9, 16], ReductionOrder.BATCH_INVARIANT, n_new=N_NEW)


def test_invariant_replay_across_the_kv_boundaries(model):
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.config.n_vocab, LONG_LEN)]
    assert_batch_invariant(model, tokens, [9, 16], ReductionOrder.BATCH_INVARIANT, start=LONG_FROM)


def test_self_speculation_equals_plain_decoding(model):
    assert_speculative_exact(model, PROMPT, "self", n_draft=8, max_new_tokens=N_NEW, min_drafted=N_NEW // 2)
