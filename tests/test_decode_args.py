"""The decode API checks its arguments before any pass, stops speculative decoding at the context
limit like plain decoding, says when a draft proposed nothing, and offers llama.cpp's draft cuts;
``hiraishin.testing`` gates a test suite on batch invariance."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from decode_fakes import FakeModel
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.decode.greedy import generate
from hiraishin.decode.inputs import ArgumentTypeError, prompt_tokens
from hiraishin.decode.replay import replay
from hiraishin.decode.speculative import SpeculativeResult, generate_speculative
from hiraishin.errors import HiraishinError
from hiraishin.order import ReductionOrder
from hiraishin.testing import assert_batch_invariant, assert_speculative_exact

INV = ReductionOrder.BATCH_INVARIANT
VAR = ReductionOrder.BATCH_VARIANT


class Counting(FakeModel):
    """A fake that counts passes, to prove that a refused call ran none."""


def test_bad_arguments_are_refused_before_any_pass():
    m = FakeModel()
    cases = [
        (lambda: generate(m, b"hi", 2), ArgumentTypeError, "bytes"),
        (lambda: generate(m, "hi", 2, order=None), ArgumentTypeError, "order must be a ReductionOrder"),
        (lambda: generate(m, "hi", 0), HiraishinError, "max_new_tokens must be >= 1"),
        (lambda: generate(m, "hi", 2, top_k=0), HiraishinError, "top_k"),
        (lambda: generate(m, [1, 2**63], 2), HiraishinError, "prompt token 1"),
        (lambda: generate(m, [1, 2.5], 2), ArgumentTypeError, "prompt token 1 must be an integer"),
        (lambda: generate(m, "", 2), HiraishinError, "empty"),
        (lambda: replay(m, "hi", [2], order=None), ArgumentTypeError, "order"),
        (lambda: replay(m, b"hi", [2]), ArgumentTypeError, "bytes"),
        (lambda: replay(m, "hi", [2], n_new=-5), HiraishinError, "n_new"),
        (lambda: replay(m, "hi", "2,3"), HiraishinError, "batch_sizes"),
        (lambda: replay(m, "hi", [2], n_new=2000), HiraishinError, "KV cells"),
        (lambda: generate_speculative(m, "hi", "bogus"), HiraishinError, "'self'"),
        (lambda: generate_speculative(m, "hi", 42), ArgumentTypeError, "draft must be a model"),
        (lambda: generate_speculative(m, "hi", FakeModel(), order=None), ArgumentTypeError, "order"),
        (lambda: generate_speculative(m, b"hi", FakeModel()), ArgumentTypeError, "bytes"),
        (lambda: generate_speculative(m, "hi", FakeModel(), p_min_gap=float("nan")), HiraishinError, "p_min_gap"),
        (lambda: generate_speculative(m, "hi", FakeModel(), p_min=1.5), HiraishinError, "p_min"),
        (lambda: generate_speculative(m, "hi", FakeModel(), n_draft=2, draft_min=3), HiraishinError,
         "draft_min"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind, match=words):
            call()
    assert m.passes == []  # nothing ran


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x) or x < 0),
                 st.none(), st.text(max_size=3), st.booleans()))
def test_p_min_gap_must_be_a_finite_non_negative_number(value):
    with pytest.raises(HiraishinError):
        generate_speculative(FakeModel(), "hi", FakeModel(), p_min_gap=value)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(min_size=1, max_size=8), st.integers(), st.floats(), st.none(),
                 st.lists(st.one_of(st.floats(), st.text(max_size=2), st.booleans()), min_size=1, max_size=3)))
def test_prompts_that_are_not_text_or_ids_are_refused(prompt):
    with pytest.raises(HiraishinError):
        prompt_tokens(FakeModel(), prompt)


def test_speculative_stops_at_the_context_limit_like_plain_decoding():
    n_ctx = 24
    target, draft = FakeModel(n_ctx=n_ctx), FakeModel(n_ctx=n_ctx, noise=0.2)
    prompt = target.tokenizer.encode("hello world")  # 11 tokens
    res = generate_speculative(target, prompt, draft, n_draft=5, order=INV, max_new_tokens=40, stop_at_eos=False)
    # plain decoding stops when the cache is full: n_ctx - len(prompt) + 1 tokens, the last one not fed
    want = FakeModel(n_ctx=1024).generate(prompt, n_ctx - len(prompt) + 1).tokens
    assert res.stop_reason == "context" and res.tokens == want
    assert all(s + n <= n_ctx for s, n in target.passes + draft.passes)
    full = generate_speculative(FakeModel(), prompt, FakeModel(), n_draft=5, order=INV, max_new_tokens=5)
    assert full.stop_reason == "max_tokens"


def test_a_draft_that_proposes_nothing_says_so():
    target, draft = FakeModel(), FakeModel()
    res = generate_speculative(target, "hello", draft, n_draft=8, order=INV, max_new_tokens=8, p_min_gap=1e9,
                               plain_tokens=target.generate("hello", 8).tokens)
    assert res.vacuous and res.drafted == 0 and math.isnan(res.acceptance_rate)
    text = str(res)
    assert "WARNING: the draft proposed no tokens" in text and "acceptance n/a (0 drafted)" in text


def test_the_default_cut_drafts():
    target, draft = FakeModel(), FakeModel()
    res = generate_speculative(target, "hello", draft, n_draft=4, order=INV, max_new_tokens=12)
    assert not res.vacuous and res.drafted >= 4 and res.acceptance_rate == 1.0


def test_draft_p_min_is_a_probability_cut():
    target = FakeModel()
    plain = target.generate("hello", 12).tokens
    # a probability no top token reaches: nothing drafted; a tiny one: every guess drafted
    never = generate_speculative(target, "hello", FakeModel(), n_draft=4, order=INV, max_new_tokens=12,
                                 p_min=1.0, plain_tokens=plain)
    assert never.drafted == 0 and never.matches_plain
    always = generate_speculative(target, "hello", FakeModel(), n_draft=4, order=INV, max_new_tokens=12,
                                  p_min=1e-9, plain_tokens=plain)
    assert always.drafted > 0 and always.matches_plain
    logits = [np.asarray(FakeModel().forward([t], 0))[-1] for t in range(3)]
    tops = sorted(float(1 / np.exp(z.astype(np.float64) - z.max()).sum()) for z in logits)
    middle = generate_speculative(target, "hello", FakeModel(), n_draft=4, order=INV, max_new_tokens=12,
                                  p_min=tops[1], plain_tokens=plain)
    assert middle.matches_plain and middle.p_min == tops[1]


def test_draft_min_drops_short_drafts():
    target = FakeModel()
    plain = target.generate("hello world", 20).tokens
    res = generate_speculative(target, "hello world", FakeModel(), n_draft=6, order=INV, max_new_tokens=20,
                               p_min_gap=3.0, draft_min=3, plain_tokens=plain)
    assert res.matches_plain
    assert all(c.drafted == 0 or c.drafted >= 3 for c in res.cycles)


def test_speculative_json_writes_nan_as_null_with_a_note(tmp_path):
    target, draft = FakeModel(), FakeModel()
    res = generate_speculative(target, "hello", draft, n_draft=8, order=INV, max_new_tokens=4, p_min_gap=1e9)
    path = res.save(tmp_path / "s.json")
    data = json.loads(path.read_text())
    assert data["summary"]["acceptance_rate"] is None
    note = data["meta"]["non_finite"]
    assert "$.summary.acceptance_rate = nan" in note["paths"] and "null" in note["note"]
    assert SpeculativeResult.load(path).tokens == res.tokens


def test_first_divergence_position_uses_the_replay_convention():
    model = FakeModel(variant_shift=0.5)
    prompt = model.tokenizer.encode("hello world")
    plain = model.generate(prompt, 25, order=VAR).tokens
    res = generate_speculative(model, prompt, FakeModel(variant_shift=0.5), n_draft=8, order=VAR,
                               max_new_tokens=25, plain_tokens=plain)
    if res.first_divergence is None:
        pytest.skip("no divergence with this fake")
    i = res.first_divergence
    assert res.first_divergence_position == len(prompt) + i - 1
    assert f"from position {res.first_divergence_position}" in str(res)


def test_assert_batch_invariant():
    rep = assert_batch_invariant(FakeModel(), "hello world", [2, 5, 9], n_new=10)
    assert rep.identical
    with pytest.raises(AssertionError, match="batch_variant is not batch-invariant") as e:
        assert_batch_invariant(FakeModel(), "hello world", [2, 5, 9], order=VAR, n_new=10)
    assert "max|Δlogit|" in str(e.value)


def test_assert_speculative_exact():
    res = assert_speculative_exact(FakeModel(), "hello", FakeModel(noise=0.1), n_draft=4, max_new_tokens=12)
    assert res.matches_plain
    with pytest.raises(AssertionError, match="vacuous"):
        assert_speculative_exact(FakeModel(), "hello", FakeModel(noise=0.1), max_new_tokens=12, min_drafted=10**6)
    with pytest.raises(AssertionError, match="differs from plain"):
        assert_speculative_exact(FakeModel(variant_shift=0.5), "hello world", FakeModel(variant_shift=0.5),
                                 order=VAR, max_new_tokens=25)


def test_replay_report_writes_nan_as_null(tmp_path):
    rep = replay(FakeModel(), "hello", [2], order=INV, n_new=2)
    rep.batches[0].max_abs_diff = float("nan")
    path = rep.save(tmp_path / "r.json")
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["batches"][0]["max_abs_diff"] is None
    assert data["meta"]["non_finite"]["paths"] == ["$.batches[0].max_abs_diff = nan"]
