"""Speculative decoding on the synthetic micro Qwen3 (CPU emulator): exactly plain greedy decoding
under BATCH_INVARIANT, with a noisy draft and with the target as its own draft."""

from __future__ import annotations

import pytest

from hiraishin.decode.draft import write_draft
from hiraishin.decode.speculative import generate_speculative
from hiraishin.order import ReductionOrder

INV = ReductionOrder.BATCH_INVARIANT
N_NEW = 16
PROMPTS = ["The order of floating-point additions", "Hello", "a b c d e f g h i j k l m n o p"]
# noise of the draft's weights, as a fraction of each tensor's std: the micro draft then
# agrees with the target on most tokens but not all (both paths run)
DRAFT_NOISE = 0.05


@pytest.fixture(scope="module")
def models(micro_model_path, tmp_path_factory):
    from hiraishin.model.qwen3 import Qwen3

    draft_path = write_draft(micro_model_path, tmp_path_factory.mktemp("draft") / "draft.gguf",
                             noise=DRAFT_NOISE, seed=1)
    load = lambda p: Qwen3.from_gguf(p, device="cpu", n_ctx=256, progress=False)  # noqa: E731
    return load(micro_model_path), load(micro_model_path), load(draft_path)


@pytest.fixture(scope="module")
def plain(models):
    target = models[0]
    return {p: target.generate(p, max_new_tokens=N_NEW, order=INV, stop_at_eos=False).tokens for p in PROMPTS}


@pytest.mark.parametrize("n_draft", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_noisy_draft_emits_plain_tokens(models, plain, prompt, n_draft):
    target, _, noisy = models
    res = generate_speculative(target, prompt, noisy, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                               p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain[prompt])
    assert res.tokens == plain[prompt], str(res)
    assert res.drafted > 0


def test_noisy_draft_runs_both_paths(models, plain):
    target, _, noisy = models
    results = [generate_speculative(target, p, noisy, n_draft=3, order=INV, max_new_tokens=N_NEW,
                                    p_min_gap=0.0, stop_at_eos=False) for p in PROMPTS[:2]]
    accepted = sum(r.accepted for r in results)
    drafted = sum(r.drafted for r in results)
    assert 0 < accepted < drafted


@pytest.mark.parametrize("n_draft", [1, 3, 8])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_self_speculation_accepts_every_guess(models, plain, prompt, n_draft):
    target, twin, _ = models
    res = generate_speculative(target, prompt, twin, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                               p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain[prompt])
    assert res.tokens == plain[prompt]
    assert res.acceptance_rate == 1.0 and res.drafted >= N_NEW - 1 - len(res.cycles)
    assert res.mean_verify_batch > 1


def test_draft_self_loads_a_twin(models, plain):
    target = models[0]
    prompt = PROMPTS[0]
    res = generate_speculative(target, prompt, "self", n_draft=4, order=INV, max_new_tokens=N_NEW,
                               p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain[prompt])
    assert res.matches_plain and res.acceptance_rate == 1.0 and res.draft_name == target.name


@pytest.mark.parametrize("n_draft", [1, 3])
def test_the_draft_running_ahead_emits_plain_tokens(models, plain, n_draft):
    """hiraishin.decode.ahead on the micro Qwen3: the twin's guesses made during the verify before are all
    accepted (its cache in step with the target's), the noisy draft's both ways; plain tokens either way."""
    target, twin, noisy = models
    prompt = PROMPTS[0]
    same = generate_speculative(target, prompt, twin, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                                stop_at_eos=False, plain_tokens=plain[prompt], draft_ahead=True)
    assert same.tokens == plain[prompt] and same.acceptance_rate == 1.0
    assert sum(c.ahead for c in same.cycles) >= len(same.cycles) - 2
    res = generate_speculative(target, prompt, noisy, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                               stop_at_eos=False, plain_tokens=plain[prompt], draft_ahead=True)
    assert res.tokens == plain[prompt]


def test_a_draft_under_another_order_emits_plain_tokens(models, plain):
    """The micro Qwen3 target under BATCH_INVARIANT, its noisy draft under BATCH_VARIANT (other bits in its
    batched passes): the target's order alone decides the tokens."""
    target, _, noisy = models
    prompt = PROMPTS[2]
    res = generate_speculative(target, prompt, noisy, n_draft=3, order=INV, max_new_tokens=N_NEW,
                               stop_at_eos=False, plain_tokens=plain[prompt],
                               draft_order=ReductionOrder.BATCH_VARIANT)
    assert res.tokens == plain[prompt] and res.drafted > 0 and res.draft_order == "batch_variant"
