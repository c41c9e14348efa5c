"""The L2-ahead schedule (``HIRAISHIN_L2_AHEAD``) and the spans its kernel is given (CPU only; the
GPU test in test_engine_gpu.py checks that passes keep every bit with it)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hiraishin import Qwen3, ReductionOrder
from hiraishin.errors import HiraishinError
from hiraishin.kernels.l2ahead import trimmed_span
from hiraishin.model.l2_ahead import ENV_L2_AHEAD, L2Ahead, parse_l2_ahead

MIB = 1 << 20


def test_specs_parse():
    assert not parse_l2_ahead("") and not parse_l2_ahead("off") and not parse_l2_ahead("off/line")
    s = parse_l2_ahead("o, ffn24,down12,qkv16")
    assert s == L2Ahead(o=True, ffn=24 * MIB, down=12 * MIB, qkv=16 * MIB, bulk=True) and s
    assert parse_l2_ahead("qkv8/line") == L2Ahead(qkv=8 * MIB, bulk=False)


@pytest.mark.parametrize("bad", ["o3", "ffn", "qkv-1", "up4", "o,,qkv1", "qkv1/lines"])
def test_bad_specs_name_the_item(bad):
    with pytest.raises(HiraishinError, match=ENV_L2_AHEAD):
        parse_l2_ahead(bad)


def _weight(nbytes):
    return types.SimpleNamespace(data=np.zeros(nbytes, np.uint8))


def test_spans_follow_the_launch_order_and_stop_at_the_limit():
    layer = types.SimpleNamespace(attn_output=_weight(100), ffn_gate=_weight(3 * MIB), ffn_up=_weight(3 * MIB),
                                  ffn_down=_weight(2 * MIB))
    s = parse_l2_ahead("o,ffn4,down1,qkv2")
    spans = s.after_qkv(layer)
    assert [(a is b, n) for (a, n), b in zip(spans, (layer.attn_output.data, layer.ffn_gate.data,
                                                     layer.ffn_up.data))] == [(True, None), (True, 3 * MIB),
                                                                              (True, MIB)]
    q, k, v = np.zeros(MIB + 5, np.uint8), np.zeros(MIB, np.uint8), np.zeros(MIB, np.uint8)
    spans = s.after_gate_up(layer, (q, k, v))
    assert [n for _, n in spans] == [MIB, MIB + 5, MIB - 5] and spans[1][0] is q and spans[2][0] is k
    assert parse_l2_ahead("o").after_gate_up(layer, (q,)) == []


@given(st.integers(0, 1 << 40), st.integers(0, 1 << 20), st.one_of(st.none(), st.integers(-5, 1 << 20)))
def test_trimmed_spans_are_aligned_and_inside(ptr, nbytes, limit):
    start, n = trimmed_span(ptr, nbytes, limit)
    end = ptr + (nbytes if limit is None else max(0, min(nbytes, limit)))
    assert start % 16 == 0 and n % 16 == 0 and n >= 0
    assert n == 0 or (ptr <= start and start + n <= end)
    assert n >= end - ptr - 30 if end - ptr >= 32 else True  # at most 15 bytes cut at either end


def test_cpu_passes_ignore_the_schedule(monkeypatch, tiny_model_path):
    m = Qwen3.from_gguf(tiny_model_path, device="cpu", progress=False, n_ctx=64)
    want = m.forward([1, 2, 3], 0, ReductionOrder.BATCH_INVARIANT)
    monkeypatch.setenv(ENV_L2_AHEAD, "o,ffn1,down1,qkv1")
    m.reset()
    got = m.forward([1, 2, 3], 0, ReductionOrder.BATCH_INVARIANT)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
