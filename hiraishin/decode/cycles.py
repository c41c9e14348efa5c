"""What the speculative loops (:mod:`.speculative`, :mod:`.ahead`) share: a cycle's record, the prefill, how
many guesses a cycle may take, the tokens a run returns."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .passes import feed

__all__ = ["Cycle", "prefill", "room_for_guesses", "new_tokens"]


@dataclass
class Cycle:
    """One draft + verify cycle."""

    pos: int  # position of the last accepted token, fed first in the verify pass
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float
    ahead: bool = False  # its guesses were made during the verify before (hiraishin.decode.ahead)

    @property
    def verify_batch(self) -> int:
        return self.drafted + 1


def prefill(target, draft, prompt_tokens, max_new_tokens: int, order, draft_order) -> tuple[list[int], int, float]:
    """Both caches reset and fed the prompt (the draft under ``draft_order``), the target's first token after it.
    Returns ``(seq, limit, seconds)``: the prompt and that token (in no cache yet), the new tokens a run may make
    (``max_new_tokens``, or fewer when the target's cache fills: as plain decoding stops), the time it took."""
    seq = [int(t) for t in prompt_tokens]
    n_ctx_t = getattr(target, "n_ctx", None)
    limit = max_new_tokens if n_ctx_t is None else min(max_new_tokens, n_ctx_t - len(seq) + 1)
    t0 = time.perf_counter()
    target.reset()
    draft.reset()
    feed(draft, seq, 0, draft_order)
    seq.append(int(np.argmax(feed(target, seq, 0, order))))
    return seq, limit, time.perf_counter() - t0


def room_for_guesses(order, seq: list[int], n_prompt: int, limit: int, n_draft: int, n_ctx_d: int | None) -> int:
    """Guesses the next verify pass may take after ``seq``'s last token: the tokens still wanted, the order's KV
    boundary (``order.verify_limit``) and the draft's cache (it feeds positions up to ``pos + room - 1``)."""
    pos = len(seq) - 1
    room = min(n_draft, limit - (len(seq) - n_prompt) - 1)
    room = order.verify_limit(pos, room + 1) - 1
    return room if n_ctx_d is None else min(room, n_ctx_d - pos)


def new_tokens(seq: list[int], n_prompt: int, eos, limit: int) -> list[int]:
    """The run's new tokens: up to and including the first EOS id, at most ``limit``."""
    new = seq[n_prompt:]
    hit = next((i for i, t in enumerate(new) if t in eos), None)
    if hit is not None:
        new = new[:hit + 1]
    return new[:limit]
