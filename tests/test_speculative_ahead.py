"""Speculative decoding with the draft running ahead (``hiraishin.decode.ahead``) against the fake model.

The loop changes when the draft's passes run, never which tokens are emitted: every run must give plain
decoding's tokens. Self-speculation (an identical draft) makes the draft's bookkeeping sharp: its cache must
hold exactly the tokens the target accepted plus its own guesses at the right positions, or a guess would
differ from the target's token and the acceptance fall below 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from decode_fakes import FakeModel

from hiraishin.decode.ahead import speculative_decode_ahead
from hiraishin.decode.speculative import SpeculativeResult, generate_speculative
from hiraishin.errors import HiraishinError
from hiraishin.order import ReductionOrder

INV = ReductionOrder.BATCH_INVARIANT


@pytest.mark.parametrize("n_draft", [1, 3, 8])
@pytest.mark.parametrize("noise", [0.05, 0.3])
def test_a_noisy_draft_ahead_gives_plain_tokens(n_draft, noise):
    target, draft = FakeModel(), FakeModel(noise=noise)
    plain = target.generate("the quick brown fox", 40, order=INV, stop_at_eos=False).tokens
    res = generate_speculative(target, "the quick brown fox", draft, n_draft=n_draft, order=INV, max_new_tokens=40,
                               plain_tokens=plain, stop_at_eos=False, draft_ahead=True)
    assert res.tokens == plain and res.first_divergence is None
    assert res.meta["draft_ahead"] is True
    assert sum(c.accepted + 1 for c in res.cycles) + 1 == len(plain)


def test_with_a_noisy_draft_both_kinds_of_cycle_run():
    target, draft = FakeModel(), FakeModel(noise=0.05)
    res = generate_speculative(target, "hello world", draft, n_draft=2, order=INV, max_new_tokens=60,
                               stop_at_eos=False, draft_ahead=True)
    kinds = {c.ahead for c in res.cycles}
    assert kinds == {True, False}, [(c.drafted, c.accepted, c.ahead) for c in res.cycles]
    assert 0 < res.accepted < res.drafted


@pytest.mark.parametrize("n_draft", [1, 4, 8])
def test_self_speculation_ahead_accepts_everything_and_drafts_only_ahead(n_draft):
    target, draft = FakeModel(), FakeModel()
    plain = target.generate("hello world", 50, order=INV, stop_at_eos=False).tokens
    draft.passes.clear()
    new, cycles, _ = speculative_decode_ahead(target, draft, target.tokenizer.encode("hello world"), 50,
                                              n_draft=n_draft, order=INV)
    assert new == plain
    assert all(c.accepted == c.drafted for c in cycles)
    assert not cycles[0].ahead and all(c.ahead for c in cycles[1:-1])  # the last may be cut by max tokens
    # after the prompt and the first cycle's chain every draft pass is a one-token pass made ahead
    first_chain = 1 + (n_draft - 1)
    assert all(n == 1 for _, n in draft.passes[1 + first_chain:])


def test_the_verify_stops_at_the_kv_boundary_with_the_draft_ahead():
    target, draft = FakeModel(n_ctx=512), FakeModel(n_ctx=512)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 48, 250)]
    plain = target.generate(prompt, 24, order=INV).tokens
    target.passes.clear()
    new, cycles, _ = speculative_decode_ahead(target, draft, prompt, 24, n_draft=8, order=INV)
    assert new == plain and all(c.accepted == c.drafted for c in cycles)
    for start, n in target.passes[1:]:  # every target pass after the prefill
        assert start // 256 == (start + n - 1) // 256


@pytest.mark.parametrize("max_new", [1, 2, 3, 10])
@pytest.mark.parametrize("draft_ctx", [None, 20])
def test_exactly_max_new_tokens_and_a_short_draft_cache(max_new, draft_ctx):
    target = FakeModel()
    draft = FakeModel(noise=0.05) if draft_ctx is None else FakeModel(noise=0.05, n_ctx=draft_ctx)
    prompt = target.tokenizer.encode("hello")
    plain = target.generate(prompt, max_new).tokens
    new, cycles, _ = speculative_decode_ahead(target, draft, prompt, max_new, n_draft=8, order=INV)
    assert new == plain
    assert draft.n <= draft.n_ctx


def test_caches_end_consistent_with_the_tokens():
    target, draft = FakeModel(), FakeModel(noise=0.3)
    prompt = FakeModel().tokenizer.encode("hello world")
    new, cycles, _ = speculative_decode_ahead(target, draft, prompt, 25, n_draft=4, order=INV)
    assert target.n == len(prompt) + len(new) - 1
    assert sum(c.accepted + 1 for c in cycles) + 1 == len(new)


def test_a_confidence_cut_is_refused_and_results_round_trip(tmp_path):
    target, draft = FakeModel(), FakeModel(noise=0.05)
    with pytest.raises(HiraishinError, match="confidence cut"):
        generate_speculative(target, "hi", draft, p_min_gap=1.0, draft_ahead=True)
    with pytest.raises(HiraishinError, match="draft_ahead"):
        generate_speculative(target, "hi", draft, draft_ahead="yes")
    res = generate_speculative(target, "hello", draft, n_draft=3, max_new_tokens=12, draft_ahead=True)
    back = SpeculativeResult.load(res.save(tmp_path / "ahead.json"))
    assert back == res and any(c.ahead for c in back.cycles) == any(c.ahead for c in res.cycles)


@pytest.mark.parametrize("noise", [0.05, 0.2])
def test_the_drafts_cache_holds_the_emitted_tokens_at_their_positions(noise):
    """Every cell the draft keeps holds the token emitted at that position: a guess made ahead on a wrong
    token (the target emitted another than the draft's c_0) must not stay in its cache."""
    target, draft = FakeModel(), FakeModel(noise=noise)
    prompt = target.tokenizer.encode("hello world, again")
    new, cycles, _ = speculative_decode_ahead(target, draft, prompt, 80, n_draft=3, order=INV)
    seq = prompt + new
    kept = min(draft.n, len(seq))
    want = draft.emb[seq[:kept]] + draft.pos_emb[np.arange(kept) % len(draft.pos_emb)]
    assert np.array_equal(draft.kv[:kept], want)


def test_a_tail_of_a_chain_read_already_keeps_its_tokens():
    """ChainTokens.tail of a device chain whose tokens were read: the tail answers from them, not from the
    page-locked buffer (which the next chain_more of the same length overwrites)."""
    from hiraishin.model.chains import ChainTokens

    class Pending:  # a PendingChain stand-in whose buffer was overwritten since its tokens were read
        def __init__(self, host):
            self.n, self.host = len(host), np.asarray(host, np.int32)

        def tokens(self):
            return self.host.copy()

        def tail(self, start, stop=None):
            return Pending(self.host[start:stop])

    chain = ChainTokens(pending=Pending([5, 6, 7, 8]))
    assert chain.tokens().tolist() == [5, 6, 7, 8]
    chain.pending.host[:] = [1, 1, 1, 1]  # the next chain_more's copy
    tail = chain.tail(1, 3)
    assert tail.n == 2 and tail.tokens().tolist() == [6, 7] and tail.pending is not None
    assert ChainTokens(pending=Pending([5, 6, 7])).tail(1).tokens().tolist() == [6, 7]  # not read yet: the buffer


@pytest.mark.parametrize("ahead_passes", [2, 3])
@pytest.mark.parametrize("noise", [0.0, 0.05, 0.3])
def test_a_capped_run_ahead_gives_plain_tokens_and_short_ahead_cycles(ahead_passes, noise):
    """``ahead_passes`` caps the chain made ahead: a cycle verifying guesses made ahead takes at most
    ``ahead_passes - 1`` of them (the first pass is the guess of the target's token), every token stays plain's."""
    target, draft = FakeModel(), FakeModel(noise=noise)
    plain = target.generate("the quick brown fox", 50, order=INV, stop_at_eos=False).tokens
    res = generate_speculative(target, "the quick brown fox", draft, n_draft=6, order=INV, max_new_tokens=50,
                               plain_tokens=plain, stop_at_eos=False, draft_ahead=True, ahead_passes=ahead_passes)
    assert res.tokens == plain and res.meta["ahead_passes"] == ahead_passes
    ahead = [c for c in res.cycles if c.ahead]
    assert all(c.drafted <= ahead_passes - 1 for c in ahead)
    assert ahead or noise > 0.1  # a draft this good is right about whole cycles (a noisy one may never be)
    assert any(c.drafted > ahead_passes - 1 for c in res.cycles if not c.ahead)  # drafted ones take n_draft
    if noise == 0.0:  # self-speculation: every cycle after the first verifies guesses made ahead
        assert all(c.ahead for c in res.cycles[1:-1]) and all(c.accepted == c.drafted for c in res.cycles)


def test_ahead_passes_is_checked():
    target, draft = FakeModel(), FakeModel()
    with pytest.raises(HiraishinError, match="draft_ahead"):
        generate_speculative(target, "hi", draft, ahead_passes=2)
    with pytest.raises(HiraishinError, match="ahead_passes"):
        generate_speculative(target, "hi", draft, draft_ahead=True, ahead_passes=1)
