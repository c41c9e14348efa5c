"""Speculative decoding's loop against a small fake model (fast; the real-model checks are in test_speculative.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decode_fakes import FakeModel

from hiraishin.decode.inputs import ArgumentTypeError
from hiraishin.decode.replay import feed
from hiraishin.decode.speculative import (
    SpeculativeResult,
    first_divergence,
    generate_speculative,
    speculative_decode,
)
from hiraishin.errors import HiraishinError
from hiraishin.order import ReductionOrder

INV = ReductionOrder.BATCH_INVARIANT
VAR = ReductionOrder.BATCH_VARIANT
PROMPTS = ["hello world", "a", "the quick brown fox jumps"]


@pytest.mark.parametrize("n_draft", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_noisy_draft_gives_plain_tokens_and_both_paths_run(prompt, n_draft):
    target, draft = FakeModel(), FakeModel(noise=0.3)
    plain = target.generate(prompt, 30, order=INV, stop_at_eos=False).tokens
    res = generate_speculative(target, prompt, draft, n_draft=n_draft, order=INV, max_new_tokens=30,
                               p_min_gap=0.0, plain_tokens=plain, stop_at_eos=False)
    assert res.tokens == plain
    assert res.first_divergence is None
    assert 0 < res.accepted < res.drafted  # accept and reject paths both ran


@pytest.mark.parametrize("order", [INV, VAR])
def test_self_speculation_accepts_everything_when_logits_are_batch_invariant(order):
    # the fake's variant reorder changes last bits only, too little to flip an argmax here
    target, draft = FakeModel(), FakeModel()
    res = generate_speculative(target, "hello world", draft, n_draft=8, order=order, max_new_tokens=40,
                               p_min_gap=0.0)
    assert res.acceptance_rate == 1.0
    assert res.drafted > 30


def test_self_speculation_under_a_variant_order_measures_the_bug():
    target, draft = FakeModel(variant_shift=0.5), FakeModel(variant_shift=0.5)
    plain = target.generate("hello world", 40, order=VAR).tokens
    res = generate_speculative(target, "hello world", draft, n_draft=8, order=VAR, max_new_tokens=40,
                               p_min_gap=0.0, plain_tokens=plain)
    assert res.acceptance_rate < 1.0
    assert res.first_divergence is not None
    assert res.tokens[:res.first_divergence] == plain[:res.first_divergence]
    # the same pair under the invariant order is exact
    plain = target.generate("hello world", 40, order=INV).tokens
    res = generate_speculative(target, "hello world", draft, n_draft=8, order=INV, max_new_tokens=40,
                               p_min_gap=0.0, plain_tokens=plain)
    assert res.matches_plain and res.acceptance_rate == 1.0


@pytest.mark.parametrize("loop", ["chain", "confidence cut", "ahead"])
def test_the_draft_runs_its_own_order_and_only_the_targets_decides(loop, tmp_path):
    """draft_order: every draft pass under it, every target pass under ``order``; the tokens are plain decoding's
    under the target's order even though the draft's order changes its guesses' bits (variant_shift)."""
    target, draft = FakeModel(variant_shift=0.5), FakeModel(variant_shift=0.5, noise=0.3)
    plain = target.generate("hello world", 30, order=INV, stop_at_eos=False).tokens
    target.orders.clear()
    kwargs = {"chain": {}, "confidence cut": {"p_min_gap": 0.5}, "ahead": {"draft_ahead": True}}[loop]
    res = generate_speculative(target, "hello world", draft, n_draft=4, order=INV, max_new_tokens=30,
                               stop_at_eos=False, plain_tokens=plain, draft_order=VAR, **kwargs)
    assert res.tokens == plain and 0 < res.accepted < res.drafted
    assert set(target.orders) == {INV.name} and set(draft.orders) == {VAR.name}
    assert res.draft_order == VAR.name and f"under {VAR.name}" in str(res)
    assert SpeculativeResult.load(res.save(tmp_path / "r.json")).draft_order == VAR.name
    same = generate_speculative(target, "hello world", draft, n_draft=4, order=INV, max_new_tokens=8,
                                draft_order=INV)
    assert same.draft_order is None  # the target's own order is no separate draft order
    with pytest.raises(ArgumentTypeError, match="draft_order must be a ReductionOrder"):
        generate_speculative(target, "hi", draft, draft_order="variant")


def test_verify_batches_stop_at_the_kv_boundary():
    # 250 prompt tokens: cycles around position 256 must not straddle it, or the fake's
    # attention split changes and the output leaves plain decoding
    target, draft = FakeModel(n_ctx=512), FakeModel(n_ctx=512)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 48, 250)]
    plain = target.generate(prompt, 24, order=INV).tokens
    res = generate_speculative(target, prompt, draft, n_draft=8, order=INV, max_new_tokens=24, p_min_gap=0.0,
                               plain_tokens=plain)
    assert res.tokens == plain and res.acceptance_rate == 1.0
    for c in res.cycles:
        assert c.pos // 256 == (c.pos + c.drafted) // 256
    assert any(c.pos + c.drafted == 255 for c in res.cycles)  # one cycle was cut short there
    for start, n in target.passes[1:]:  # every target pass after the prefill
        assert start // 256 == (start + n - 1) // 256


def test_the_fake_changes_earlier_rows_of_a_pass_across_the_boundary():
    # what makes the test above meaningful: rows before 256 of a pass that crosses it differ
    model = FakeModel(n_ctx=512)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 48, 250)]
    ext = [int(t) for t in rng.integers(0, 48, 12)]
    feed(model, prompt, 0, INV)
    across = model.forward(ext, 250, order=ReductionOrder.custom(kv_boundary=None))
    model.rollback(250)
    singles = np.stack([model.forward([t], 250 + i, order=INV)[-1] for i, t in enumerate(ext)])
    assert not np.array_equal(across[:6], singles[:6])
    assert np.array_equal(across[6:], singles[6:])


def test_the_gap_threshold_stops_drafting():
    target, draft = FakeModel(), FakeModel()
    plain = target.generate("hello", 12).tokens
    never = generate_speculative(target, "hello", draft, n_draft=8, order=INV, max_new_tokens=12,
                                 p_min_gap=1e9, plain_tokens=plain)
    assert never.drafted == 0 and never.matches_plain
    assert never.mean_verify_batch == 1.0 and len(never.cycles) == 11
    some = generate_speculative(target, "hello", draft, n_draft=8, order=INV, max_new_tokens=12,
                                p_min_gap=3.0, plain_tokens=plain)
    assert some.matches_plain and 0 < some.drafted < 8 * len(some.cycles)


@pytest.mark.parametrize("max_new", [1, 2, 9, 17])
def test_exactly_max_new_tokens(max_new):
    target, draft = FakeModel(), FakeModel()
    res = generate_speculative(target, "hello", draft, n_draft=8, order=INV, max_new_tokens=max_new,
                               p_min_gap=0.0)
    assert len(res.tokens) == max_new
    assert res.tokens == target.generate("hello", max_new).tokens


def test_stops_after_eos_like_plain_decoding():
    probe = FakeModel().generate("hello world", 30).tokens
    eos = probe[10]  # a token that plain decoding emits
    target, draft = FakeModel(eos_ids=[eos]), FakeModel(eos_ids=[eos], noise=0.1)
    plain = target.generate("hello world", 30).tokens
    assert plain[-1] == eos and len(plain) <= 11
    res = generate_speculative(target, "hello world", draft, n_draft=8, order=INV, max_new_tokens=30,
                               p_min_gap=0.0, plain_tokens=plain)
    assert res.tokens == plain


def test_caches_end_consistent_with_the_tokens():
    target, draft = FakeModel(), FakeModel(noise=0.3)
    prompt = FakeModel().tokenizer.encode("hello world")
    new, cycles, _ = speculative_decode(target, draft, prompt, 25, n_draft=4, order=INV, p_min_gap=0.0)
    # the target holds every token but the last (not fed yet); the draft lags by at most one more
    assert target.n == len(prompt) + len(new) - 1
    assert target.n - 1 <= draft.n <= target.n
    assert sum(c.accepted + 1 for c in cycles) + 1 == len(new)


def test_result_statistics_and_json_round_trip(tmp_path):
    target, draft = FakeModel(), FakeModel(noise=0.3)
    res = generate_speculative(target, "hello world", draft, n_draft=3, order=INV, max_new_tokens=20,
                               p_min_gap=0.0, plain_tokens=target.generate("hello world", 20).tokens)
    assert res.acceptance_rate == res.accepted / res.drafted
    assert res.mean_verify_batch == np.mean([c.drafted + 1 for c in res.cycles])
    assert set(res.time_split) == {"draft", "verify", "bookkeeping"}
    text = str(res)
    assert "acceptance" in text and "identical to plain" in text
    back = SpeculativeResult.load(res.save(tmp_path / "spec.json"))
    assert back == res


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_bad_arguments_are_named():
    target = FakeModel()
    with pytest.raises(HiraishinError, match="separate model instance"):
        generate_speculative(target, "hi", target)
    with pytest.raises(HiraishinError, match="needs a model loaded from a GGUF"):
        generate_speculative(target, "hi", "self")
    with pytest.raises(HiraishinError, match="n_draft"):
        generate_speculative(target, "hi", FakeModel(), n_draft=0)
    with pytest.raises(HiraishinError, match="vocabulary"):
        generate_speculative(target, "hi", FakeModel(n_vocab=40))
