"""Assertions for a user's own test suite: gate CI on batch invariance.

>>> from hiraishin.testing import assert_batch_invariant
>>> def test_my_model_is_batch_invariant(model):
...     assert_batch_invariant(model, model.tokenizer.encode("Hello"), batch_sizes=[2, 5, 9, 16], n_new=16)

The same check as ``hiraishin replay --check``: every logit of every batched pass must equal,
bit for bit, the logit of the one-token pass at the same position (vLLM's bitwise batch-invariance
test and SGLang's ``test_deterministic`` make the same demand).
"""

from __future__ import annotations

from collections.abc import Sequence

from .decode.replay import DEFAULT_BATCH_SIZES, replay
from .decode.report import ReplayReport
from .order import ReductionOrder

__all__ = ["assert_batch_invariant", "assert_speculative_exact", "greedy_loop"]


def assert_batch_invariant(model, tokens, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                           order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, *, n_new: int = 0,
                           start: int = 0) -> ReplayReport:
    """Fail (``AssertionError`` with the replay's table) unless every logit is bit-identical.

    Replays ``tokens`` (ids or text), plus ``n_new`` greedy tokens, in passes of each batch size
    under ``order`` and compares with one-token passes from position ``start`` on. Returns the
    report when it passes.
    """
    report = replay(model, tokens, batch_sizes, order=order, n_new=n_new, start=start)
    if not report.identical:
        raise AssertionError(f"{order.name} is not batch-invariant on {report.model}: logits differ "
                             f"from position {report.first_divergence}\n{report}")
    return report


def assert_speculative_exact(model, prompt, draft, n_draft: int = 8,
                             order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, *,
                             max_new_tokens: int = 32, min_drafted: int = 1):
    """Fail unless speculative decoding with ``draft`` emits plain greedy decoding's tokens.

    A run whose draft proposed fewer than ``min_drafted`` tokens fails too: it would pass
    without testing a single batched verify pass. Returns the speculative result.
    """
    plain = model.generate(prompt, max_new_tokens=max_new_tokens, order=order, stop_at_eos=False)
    from .decode.speculative import generate_speculative

    res = generate_speculative(model, prompt, draft, n_draft=n_draft, order=order, max_new_tokens=max_new_tokens,
                               stop_at_eos=False, plain_tokens=plain.tokens)
    if res.drafted < min_drafted:
        raise AssertionError(f"the draft proposed {res.drafted} tokens (< {min_drafted}): the check is vacuous\n{res}")
    if not res.matches_plain:
        raise AssertionError(f"speculative decoding under {order.name} differs from plain decoding\n{res}")
    return res


def greedy_loop(model, tokens, start_pos: int, n: int,
                order: ReductionOrder = ReductionOrder.BATCH_INVARIANT) -> list[int]:
    """The ``n`` greedy tokens after ``tokens`` made one ``forward_argmax`` at a time (a pass of
    ``tokens`` at ``start_pos``, then one-token passes): the reference ``Qwen3.greedy_chain`` must equal."""
    out = [int(model.forward_argmax(tokens, start_pos, order)[-1])]
    pos = start_pos + len(tokens)
    while len(out) < n:
        out.append(int(model.forward_argmax([out[-1]], pos, order)[-1]))
        pos += 1
    return out
