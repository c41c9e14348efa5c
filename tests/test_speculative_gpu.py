"""Replay and speculative decoding on the CUDA backend: the same properties as on the CPU.

With ``HIRAISHIN_RESULTS_DIR`` set, the replay and speculative reports are saved there as JSON.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hiraishin.decode.draft import write_draft
from hiraishin.decode.localize import localize
from hiraishin.decode.replay import replay
from hiraishin.decode.speculative import generate_speculative
from hiraishin.order import ReductionOrder

pytestmark = pytest.mark.gpu

VAR = ReductionOrder.BATCH_VARIANT
INV = ReductionOrder.BATCH_INVARIANT
PROMPT = "The order of floating-point additions"
N_NEW = 32


def _save(report, name: str):
    out = os.environ.get("HIRAISHIN_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        report.save(Path(out) / name)


@pytest.fixture(scope="module", params=["micro", "tiny"])
def shape_and_path(request, micro_model_path, tiny_model_path):
    return request.param, {"micro": micro_model_path, "tiny": tiny_model_path}[request.param]


@pytest.fixture(scope="module")
def cuda_models(shape_and_path, tmp_path_factory):
    from hiraishin.model.qwen3 import Qwen3

    shape, path = shape_and_path
    load = lambda p: Qwen3.from_gguf(p, device="cuda", n_ctx=1024, progress=False)  # noqa: E731
    noisy = None
    if shape == "micro":  # a noisy tiny draft costs a minute of CPU requantization; micro's takes seconds
        noisy = load(write_draft(path, tmp_path_factory.mktemp("draft") / f"{shape}-draft.gguf", noise=0.05, seed=1))
    return shape, load(path), load(path), noisy


def test_cuda_variant_replay_reproduces_the_bug(cuda_models):
    shape, target, _, _ = cuda_models
    rep = replay(target, PROMPT, [2, 3, 5, 9, 16], order=VAR, n_new=N_NEW)
    localize(target, rep)  # (stored in rep.localization)
    _save(rep, f"replay-cuda-{shape}-batch_variant.json")
    print(rep)
    assert not rep.identical and rep.localization.name is not None


def test_cuda_invariant_replay_is_bit_identical(cuda_models):
    shape, target, _, _ = cuda_models
    rep = replay(target, PROMPT, [2, 3, 5, 9, 16], order=INV, n_new=N_NEW)
    _save(rep, f"replay-cuda-{shape}-batch_invariant.json")
    assert rep.identical, str(rep)


def test_cuda_invariant_replay_across_kv_boundaries(cuda_models):
    shape, target, _, _ = cuda_models
    # 560 positions, compared from 240: passes meet cells 256 and 512 (cut there) and cross 384
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, target.config.n_vocab, 560)]
    rep = replay(target, tokens, [9, 16], order=INV, start=240)
    _save(rep, f"replay-cuda-{shape}-batch_invariant-boundaries.json")
    assert rep.identical, str(rep)


@pytest.mark.parametrize("n_draft", [1, 3, 8])
def test_cuda_speculative_equals_plain(cuda_models, n_draft):
    shape, target, twin, noisy = cuda_models
    plain = target.generate(PROMPT, max_new_tokens=N_NEW, order=INV, stop_at_eos=False).tokens
    for name, draft in (("self", twin), ("noisy", noisy)):
        if draft is None:
            continue
        res = generate_speculative(target, PROMPT, draft, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                                   p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain)
        _save(res, f"speculative-cuda-{shape}-{name}-n{n_draft}-batch_invariant.json")
        print(res)
        assert res.tokens == plain
        if name == "self":
            assert res.acceptance_rate == 1.0


def test_cuda_speculative_across_the_256_cell_boundary(cuda_models):
    # a 250-token prompt: verify batches meet cell 256 and are cut there
    shape, target, twin, noisy = cuda_models
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, target.config.n_vocab, 250)]
    plain = target.generate(prompt, max_new_tokens=N_NEW, order=INV, stop_at_eos=False).tokens
    for name, draft in (("self", twin), ("noisy", noisy)):
        if draft is None:
            continue
        res = generate_speculative(target, prompt, draft, n_draft=8, order=INV, max_new_tokens=N_NEW,
                                   p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain)
        _save(res, f"speculative-cuda-{shape}-{name}-boundary-batch_invariant.json")
        assert res.tokens == plain
        assert all(c.pos // 256 == (c.pos + c.drafted) // 256 for c in res.cycles)


def test_cuda_self_speculation_under_the_variant_order(cuda_models):
    # a measurement, not a pass/fail property: saved for the results table
    shape, target, twin, _ = cuda_models
    plain = target.generate(PROMPT, max_new_tokens=N_NEW, order=VAR, stop_at_eos=False).tokens
    res = generate_speculative(target, PROMPT, twin, n_draft=8, order=VAR, max_new_tokens=N_NEW,
                               p_min_gap=0.0, stop_at_eos=False, plain_tokens=plain)
    _save(res, f"speculative-cuda-{shape}-self-n8-batch_variant.json")
    print(res)
    assert res.mean_verify_batch > 1  # batched verify passes ran


@pytest.mark.parametrize("n_draft", [1, 3, 8])
def test_cuda_speculative_with_the_draft_ahead_equals_plain(cuda_models, n_draft):
    """hiraishin.decode.ahead on CUDA graphs: the draft's next chain on its stream beside the target's verify
    (greedy_chain_more), a verify behind a chain made ahead (a tail of it): plain tokens; the twin's guesses
    all accepted and, after the first cycle, all made ahead."""
    shape, target, twin, noisy = cuda_models
    plain = target.generate(PROMPT, max_new_tokens=N_NEW, order=INV, stop_at_eos=False).tokens
    for name, draft in _drafts(twin, noisy):
        res = generate_speculative(target, PROMPT, draft, n_draft=n_draft, order=INV, max_new_tokens=N_NEW,
                                   stop_at_eos=False, plain_tokens=plain, draft_ahead=True)
        _save(res, f"speculative-cuda-{shape}-{name}-n{n_draft}-ahead-batch_invariant.json")
        assert res.tokens == plain
        if name == "self":
            assert res.acceptance_rate == 1.0 and all(c.ahead for c in res.cycles[1:-1])


@pytest.mark.parametrize("draft_ahead", [False, True])
def test_cuda_draft_under_its_own_order_equals_plain(cuda_models, draft_ahead):
    """The draft's chains under BATCH_VARIANT (its own graphs), the target's verify passes under BATCH_INVARIANT
    behind them on the device: plain tokens."""
    shape, target, twin, noisy = cuda_models
    plain = target.generate(PROMPT, max_new_tokens=N_NEW, order=INV, stop_at_eos=False).tokens
    for name, draft in _drafts(twin, noisy):
        res = generate_speculative(target, PROMPT, draft, n_draft=3, order=INV, max_new_tokens=N_NEW,
                                   stop_at_eos=False, plain_tokens=plain, draft_ahead=draft_ahead, draft_order=VAR)
        assert res.tokens == plain and res.drafted > 0, str(res)


def _drafts(twin, noisy):
    """(name, draft) of the twin and, where the shape has one, the noisy draft."""
    return [(name, d) for name, d in (("self", twin), ("noisy", noisy)) if d is not None]
