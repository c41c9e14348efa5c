"""A seeded oracle schedule of speculative decoding: which drafted tokens are right, per cycle.

Synthetic weights do not agree like trained ones (a synthetic draft almost never guesses the
target's token), so a benchmark of exact speculative decoding on synthetic models takes *which*
guesses are right from a schedule with the original report's profile (:data:`REPORT`), while every
draft step and verify pass runs for real (``hiraishin.benchmark``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import HiraishinError

__all__ = ["REPORT", "ORACLE_SEED", "OracleSchedule"]

# The original report (laptop RTX 5060, 286 GB/s; ../shared/reference/performance.md §1): plain
# 61.4 tok/s, exact speculative 92.3 tok/s = 1.50x; per cycle 8.5 ms drafting, 19.0 ms verifying
# (mean verify batch 2.97 tokens), 0.4 ms bookkeeping, 2.52 tokens out; 77.3% of drafted tokens
# accepted; a plain step 16.1 ms.
REPORT = {
    "device": "laptop RTX 5060 (286 GB/s)",
    "plain_ms_per_token": 16.1,
    "plain_tok_s": 61.4,
    "speculative_tok_s": 92.3,
    "speedup": 1.50,
    "cycle_ms": {"drafting": 8.5, "verifying": 19.0, "bookkeeping": 0.4},
    "tokens_per_cycle": 2.52,
    "acceptance": 0.773,
    "mean_verify_batch": 2.97,
}
ORACLE_SEED = 20261201
# Drafted tokens per cycle before the profile's mean is imposed: probabilities of k = 1, 2, 3, 4
# (mean 1.97 = the report's mean verify batch 2.97 minus the one token the target adds).
_K_PROBS = (0.35, 0.40, 0.18, 0.07)


@dataclass
class OracleSchedule:
    """Seeded (drafted, right) counts per cycle with the report's profile, exactly on average.

    ``k[i]`` tokens are drafted in cycle ``i`` and the first ``a[i]`` of them are scheduled right
    (the draft's token ``a[i] + 1``, if any, is wrong). Over the schedule the mean of ``k`` is the
    report's mean verify batch minus one and ``sum(a) / sum(k)`` its acceptance, to rounding.
    """

    k: list[int]
    a: list[int]
    seed: int

    @classmethod
    def make(cls, cycles: int, seed: int = ORACLE_SEED, n_draft: int = 4,
             mean_verify_batch: float = REPORT["mean_verify_batch"],
             acceptance: float = REPORT["acceptance"]) -> "OracleSchedule":
        if cycles < 1 or not 1 <= n_draft <= 16:
            raise HiraishinError(f"an oracle schedule needs cycles >= 1 and n_draft in 1..16, got {cycles}, {n_draft}")
        rng = np.random.default_rng(seed)
        probs = np.asarray(_K_PROBS[:n_draft], np.float64)
        k = list(rng.choice(np.arange(1, len(probs) + 1), size=cycles, p=probs / probs.sum()))
        # (between 1 and n_draft per cycle, or the nudging below could not end)
        want_drafted = min(max(cycles, round((mean_verify_batch - 1.0) * cycles)), n_draft * cycles)
        while sum(k) > want_drafted:  # impose the mean exactly: nudge random cycles
            i = int(rng.integers(cycles))
            if k[i] > 1:
                k[i] -= 1
        while sum(k) < want_drafted:
            i = int(rng.integers(cycles))
            if k[i] < n_draft:
                k[i] += 1
        a = list(k)
        want_right = round(acceptance * sum(k))
        while sum(a) > want_right:  # reject from random cycles: a prefix stays right
            i = int(rng.integers(cycles))
            if a[i] > 0:
                a[i] -= 1
        return cls([int(v) for v in k], [int(v) for v in a], seed)

    @classmethod
    def for_tokens(cls, n_tokens: int, seed: int = ORACLE_SEED, n_draft: int = 4) -> "OracleSchedule":
        """The schedule a run of ``n_tokens`` tokens uses up (about ``(n_tokens - 1) / 2.52`` cycles: the first
        token comes from the prefill), so the run itself has the profile, not just the schedule."""
        return cls.make(max(1, math.ceil((n_tokens - 1) / REPORT["tokens_per_cycle"])), seed, n_draft)

    def cycle(self, i: int) -> tuple[int, int]:
        """(drafted, scheduled right) of cycle ``i`` (the schedule repeats past its end)."""
        return self.k[i % len(self.k)], self.a[i % len(self.a)]

    def first_pass_widths(self) -> list[int]:
        """Tokens in the draft's first pass of each cycle, as the oracle loops feed it: one (the target's
        token) after a cycle that rejected a guess, whose rollback leaves the draft's cache just short of
        it; two after a cycle that accepted every guess (the draft's last guess, never fed, and the
        target's token). The first cycle follows the prompt's prefill: one."""
        return [1] + [2 if a == k else 1 for k, a in zip(self.k[:-1], self.a[:-1])]

    def profile(self) -> dict:
        drafted, right = sum(self.k), sum(self.a)
        return {"cycles": len(self.k), "acceptance": right / drafted, "mean_verify_batch": 1 + drafted / len(self.k),
                "tokens_per_cycle": 1 + right / len(self.k)}
