"""The benchmark's speculative loops under the oracle schedule (``hiraishin bench``; see :mod:`hiraishin.benchmark`).

:func:`speculative_decode` is :func:`hiraishin.decode.speculative.speculative_decode`'s loop and
:func:`speculative_decode_ahead` :func:`hiraishin.decode.ahead.speculative_decode_ahead`'s, every draft pass and
verify pass run for real, with one change: which guesses are right comes from the oracle (synthetic weights do
not agree like trained ones), so the verify passes take the oracle's tokens while the draft's cache holds its
own guesses, as a real run's would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .bench_timing import timed_feed, timed_pass
from .decode.ahead import drafting_seconds, next_chain, run_ahead
from .decode.oracle import REPORT, OracleSchedule
from .decode.passes import draft_and_verify

__all__ = ["SpecRun", "speculative_decode", "speculative_decode_ahead", "agreement", "first_divergence",
           "WRONG_TOKEN_STEP"]

WRONG_TOKEN_STEP = 1  # the deliberately wrong draft token: the right one + this, mod n_vocab


@dataclass
class SpecRun:
    """One timed speculative run under the oracle schedule."""

    tokens: list[int] = field(default_factory=list)
    drafting_s: list[float] = field(default_factory=list)
    verifying_s: list[float] = field(default_factory=list)
    cycle_s: list[float] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    scheduled: list[int] = field(default_factory=list)
    verify_widths: list[int] = field(default_factory=list)
    ahead: list[bool] = field(default_factory=list)  # (speculative_decode_ahead) guesses made ahead

    def record(self, cycle_s: float, drafting_s: float, verifying_s: float, drafted: int, accepted: int,
               scheduled: int, ahead: bool = False) -> None:
        """One cycle's figures (its verify pass took ``drafted + 1`` tokens)."""
        self.cycle_s.append(cycle_s)
        self.drafting_s.append(drafting_s)
        self.verifying_s.append(verifying_s)
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.scheduled.append(scheduled)
        self.verify_widths.append(drafted + 1)
        self.ahead.append(ahead)

    @property
    def total_s(self) -> float:
        return sum(self.cycle_s)

    @property
    def emitted(self) -> int:
        """Tokens the cycles emitted (each cycle: its accepted guesses and the target's next token)."""
        return sum(self.accepted) + len(self.cycle_s)


def speculative_decode(target, draft, prompt, n_tokens: int, order, draft_order, schedule: OracleSchedule,
                       reference: list[int]) -> SpecRun:
    """Exact speculative decoding of ``n_tokens`` tokens after ``prompt`` with the oracle ``schedule``.

    ``reference``: the target's plain greedy tokens after ``prompt`` (at least ``n_tokens`` +
    the schedule's largest k long), from which the oracle takes the right guesses. The first
    token comes from the prefill (not timed); every later one from a timed cycle.
    """
    n_vocab = target.config.n_vocab
    target.reset()
    draft.reset()
    best, _ = timed_feed(target, prompt, 0, order)
    timed_feed(draft, prompt, 0, draft_order)
    seq = list(prompt) + [int(best[-1])]  # the last token is not in either cache yet
    base = len(prompt)  # position of reference[0]
    run = SpecRun(tokens=[seq[-1]])
    sync = target.backend.synchronize
    i = 0
    sync()  # then no synchronization inside the loop: a cycle ends when the host has the verify's tokens (the
    # device idle behind them), as in hiraishin.decode.speculative's loop
    t_cycle = time.perf_counter()
    while len(run.tokens) < n_tokens:
        p = len(seq) - 1  # position of the pending token
        k, right = schedule.cycle(i)
        k = min(k, n_tokens - len(run.tokens))  # no drafting past the end
        k = max(0, min(k, order.verify_limit(p, k + 1) - 1))  # the verify pass stops at the KV boundary
        right = min(right, k)
        guesses = []
        for j in range(k):
            ref = reference[p + 1 + j - base] if p + 1 + j - base < len(reference) else 0
            guesses.append(ref if j < right else (ref + WRONG_TOKEN_STEP) % n_vocab if j == right else ref)
        # drafting: catch the draft's cache up to p in one pass (it lacks the pending token, and after
        # a cycle that accepted every guess also the last guess: one or two tokens, fed together as
        # hiraishin.decode.speculative does), whose last argmax is guess 0; then k - 1 one-token passes
        # of the draft's own guesses, chained as hiraishin.decode.speculative chains them (the oracle's
        # guesses go to the verifier; the draft's cache holds its own, as in a real run)
        # verifying: one pass of the pending token and the k guesses, enqueued behind the draft's
        # passes on the device as the library's loop does it (draft_and_verify); its ids are the
        # oracle's, uploaded behind the draft's passes where a real run copies the draft's own
        batch = [seq[-1]] + guesses
        feed_tokens = seq[draft.kv_len:p + 1] if k else []
        if feed_tokens:
            _, best, t_draft, t_verify = draft_and_verify(draft, target, feed_tokens, draft.kv_len, k, seq[-1], p,
                                                          order, draft_order, verify_tokens=batch)
        else:
            t_draft = 0.0
            best, t_verify = timed_pass(target, batch, p, order)
        # bookkeeping: acceptance against the target's own argmax, emit, roll both caches back
        n_acc = _accept(target, guesses, best, p, seq, run)
        if draft.kv_len > p + n_acc + 1:
            draft.rollback(p + n_acc + 1)
        now = time.perf_counter()
        run.record(now - t_cycle, t_draft, t_verify, k, n_acc, right)
        t_cycle = now
        i += 1
    sync()
    run.tokens = run.tokens[:n_tokens]
    return run


def _accept(target, guesses: list[int], best, p: int, seq: list[int], run: SpecRun) -> int:
    """The guesses the target's argmaxes ``best`` accept (a prefix), emitted with the target's next token into
    ``seq`` and ``run.tokens``; the target's cache rolled back past them (the pending token at ``p`` and the
    accepted guesses stay). Returns how many were accepted."""
    n_acc = 0
    while n_acc < len(guesses) and int(best[n_acc]) == guesses[n_acc]:
        n_acc += 1
    emitted = guesses[:n_acc] + [int(best[n_acc])]
    seq.extend(emitted)
    run.tokens.extend(emitted)
    target.rollback(p + n_acc + 1)
    return n_acc


def first_divergence(a, b) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is a prefix of the other), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(schedule: OracleSchedule, n_tokens: int, seed: int, p_right: float = REPORT["acceptance"]) -> list[bool]:
    """Whether the draft is right about each token of the output (index 0: the prefill's), as the oracle decides
    it per position for a loop whose cycles are not the schedule's (:func:`speculative_decode_ahead`). The
    schedule's cycles, played as :func:`speculative_decode` plays them (uncut by a KV boundary or the run's end),
    fix every token one of their guesses covers: right for the first ``a`` guesses of a cycle, wrong for the
    next. A token no guess covers there (the target's own token after a cycle whose guesses were all
    right) is right with the schedule's acceptance ``p_right`` (seeded): what a draft running ahead guesses."""
    rng = np.random.default_rng(seed)
    agree = [bool(v) for v in rng.random(n_tokens + 64) < p_right]
    t, i = 1, 0
    while t < len(agree):
        k, right = schedule.cycle(i)
        for j in range(min(k, len(agree) - t)):
            if j < right:
                agree[t + j] = True
            elif j == right:
                agree[t + j] = False
        t += min(right, k) + 1
        i += 1
    return agree


def _oracle_guesses(agree, reference, start: int, n: int, n_vocab: int) -> list[int]:
    """The oracle's guesses of output tokens ``start .. start + n - 1``: the reference token where the draft is
    right, a wrong one where not."""
    out = []
    for j in range(start, start + n):
        ref = reference[j] if j < len(reference) else 0
        out.append(ref if j < len(agree) and agree[j] else (ref + WRONG_TOKEN_STEP) % n_vocab)
    return out


def speculative_decode_ahead(target, draft, prompt, n_tokens: int, order, draft_order, schedule: OracleSchedule,
                             reference: list[int], agree: list[bool], ahead_passes: int | None = None) -> SpecRun:
    """:func:`speculative_decode` with the draft running ahead (:mod:`hiraishin.decode.ahead`): once a cycle's
    verify pass is enqueued, the draft's next chain (the schedule's next draft length, plus the token after this
    cycle's guesses) goes on beside it; when the oracle says every guess of the cycle and the draft's guess of
    the target's next token are right (``agree``), the next cycle verifies those at once. ``run.ahead``: the
    cycles whose guesses were made ahead. Draft lengths are the schedule's, rightness per token ``agree``'s;
    ``ahead_passes`` caps the chain made ahead (None: the schedule's next draft length + 1), and a cycle verifying
    guesses made ahead takes those only."""
    n_vocab = target.config.n_vocab
    n_ctx_d = getattr(draft, "n_ctx", None)
    target.reset()
    draft.reset()
    best, _ = timed_feed(target, prompt, 0, order)
    timed_feed(draft, prompt, 0, draft_order)
    seq = list(prompt) + [int(best[-1])]
    base = len(prompt)
    run = SpecRun(tokens=[seq[-1]])
    sync = target.backend.synchronize
    i = 0
    ahead = None  # the draft's chain made ahead: c_0 (fed at the pending token's position) and the guesses after
    sync()
    t_cycle = time.perf_counter()
    while len(run.tokens) < n_tokens:
        p = len(seq) - 1
        k = min(schedule.cycle(i)[0], n_tokens - len(run.tokens))
        k = max(0, min(k, order.verify_limit(p, k + 1) - 1))
        t0 = time.perf_counter()
        k, chain, made, fed = next_chain(draft, ahead, seq[draft.kv_len:p + 1], draft.kv_len, p, k, draft_order)
        guesses = _oracle_guesses(agree, reference, p + 1 - base, k, n_vocab)
        right = 0  # the oracle's right guesses: the target must accept exactly these
        while right < k and agree[p + 1 - base + right]:
            right += 1
        t1 = time.perf_counter()
        more = None
        if len(run.tokens) + k + 1 < n_tokens:  # a next cycle: its chain beside this verify
            m = schedule.cycle(i + 1)[0] + 1
            more = run_ahead(draft, made, fed, m if ahead_passes is None else min(m, ahead_passes), draft_order,
                             n_ctx_d)
        if chain is not None:
            best = target.verify_chain(seq[-1], chain, p, order=order, tokens=[seq[-1]] + guesses)
        else:
            best, _ = timed_pass(target, [seq[-1]], p, order)
        t2 = time.perf_counter()
        n_acc = _accept(target, guesses, best, p, seq, run)
        bonus = p + n_acc + 1 - base  # the output index of the target's token: c_0 guessed it
        if more is not None and n_acc == k and bonus < len(agree) and agree[bonus]:
            ahead = more
        else:
            ahead = None
            if draft.kv_len > p + n_acc + 1:
                draft.rollback(p + n_acc + 1)
        draft_s = drafting_seconds(chain, made, t0, t1, t2)
        now = time.perf_counter()
        run.record(now - t_cycle, draft_s, t2 - t0 - draft_s, k, n_acc, right, chain is not None and chain is not made)
        t_cycle = now
        i += 1
    sync()
    run.tokens = run.tokens[:n_tokens]
    return run
