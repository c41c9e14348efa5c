"""Exact (greedy) speculative decoding: a draft guesses, the target verifies in one batch.

Each cycle the draft model guesses up to ``n_draft`` tokens greedily, one
token per pass, and stops early when it is unsure (its top-two logits closer
than ``p_min_gap``). The target then runs ONE pass over the last accepted token
plus the guesses; a guess survives only if it equals the target's own argmax
at that position, and the target's argmax after the last survivor is emitted
too. Both KV caches roll back the rejected cells.

The emitted tokens are the target's argmaxes, so the output equals plain
greedy decoding exactly when the target's logits do not depend on how many
tokens share a pass: under ``BATCH_INVARIANT`` it must; under
``BATCH_VARIANT`` any difference is the batch-variance bug. Self-speculation
(the target as its own draft, a second instance with its own cache) makes the
check sharp: every guess must then be accepted.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HiraishinError
from ..order import ReductionOrder
from .inputs import (ArgumentTypeError, backend_name, check_int, check_order, eos_ids, model_name,
                     prompt_tokens)
from .ahead import MIN_AHEAD_PASSES, speculative_decode_ahead
from .cycles import Cycle, new_tokens, prefill, room_for_guesses
from .passes import draft_and_verify, feed, greedy_chain, greedy_tokens, progress_bar
from .report import POSITION_NOTE, dump_json, top_two

__all__ = [
    "speculative_decode",
    "generate_speculative",
    "SpeculativeResult",
    "Cycle",
    "first_divergence",
    "DEFAULT_P_MIN_GAP",
    "DEFAULT_P_MIN",
    "LLAMA_CPP_DRAFT_P_MIN",
]

# The draft stops guessing when its top-two logits are closer than this (the confidence cut of
# the patched llama.cpp fork the project measures), or when its top token's probability is below
# ``p_min`` (llama.cpp's ``--draft-p-min``); the unsure guess is dropped. Both default to 0: the
# draft always guesses ``n_draft`` tokens. A positive cut often drafts nothing on the synthetic
# models, whose logits are close together, and a run that drafts nothing checks nothing.
DEFAULT_P_MIN_GAP = 0.0
DEFAULT_P_MIN = 0.0
# llama.cpp's own default for --draft-p-min (common/common.h, common_params_speculative.p_min).
LLAMA_CPP_DRAFT_P_MIN = 0.75
# Largest accepted p_min_gap: a finite bound (the test suite's "never draft" value is 1e9).
MAX_P_MIN_GAP = 1e30


def _top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the largest logit (float64, max-subtracted)."""
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.sum(np.exp(z - z.max())))


def _draft_guesses(draft, pending, start, n, order, gap_min, p_min=0.0):
    """Feed ``pending`` (accepted tokens the draft has not seen) at ``start``; guess up to ``n``.

    Returns the guesses and the draft's KV length afterwards. Without a confidence cut
    (``gap_min`` and ``p_min`` 0, the defaults) the host needs no guess before the last: the
    draft's passes run as one chain (:func:`~hiraishin.decode.passes.greedy_chain`; one host wait
    on CUDA graphs), the same passes and guesses as the loop below.
    """
    if gap_min <= 0 and p_min <= 0:
        guesses = greedy_chain(draft, pending, start, n, order)
        return guesses, start + len(pending) + n - 1
    logits = feed(draft, pending, start, order)
    pos = start + len(pending)
    guesses = []
    while True:
        best, _, gap = top_two(logits)
        if gap < gap_min or (p_min > 0 and _top_probability(logits) < p_min):
            break
        guesses.append(best)
        if len(guesses) == n:
            break
        logits = np.asarray(draft.forward([best], pos, order=order))[-1]
        pos += 1
    return guesses, pos


def speculative_decode(target, draft, prompt_tokens, max_new_tokens: int, *, n_draft: int = 8,
                       order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                       p_min_gap: float = DEFAULT_P_MIN_GAP, eos_ids=(), on_cycle=None,
                       p_min: float = DEFAULT_P_MIN, draft_min: int = 0,
                       draft_order: ReductionOrder | None = None):
    """The core loop. Returns ``(new tokens, cycles, prefill seconds)``.

    ``draft_order``: the order of the draft's passes (default ``order``). Only the target's order decides
    which tokens come out: a guess is kept only where the target's own argmax equals it.

    ``target`` and ``draft`` need ``forward(tokens, start_pos, order=)``, ``rollback(pos)``,
    ``reset()``. Drafts shorter than ``draft_min`` are dropped (the verify pass then takes the
    last token alone, llama.cpp's ``--draft-min``). Like plain decoding, the run stops when the
    target's KV cache (``target.n_ctx``) is full: at most ``n_ctx - len(prompt) + 1`` new tokens.
    """
    n_ctx_d = getattr(draft, "n_ctx", None)
    draft_order = order if draft_order is None else draft_order
    seq, limit, prefill_s = prefill(target, draft, prompt_tokens, max_new_tokens, order, draft_order)
    n_prompt, eos, cycles = len(seq) - 1, set(eos_ids), []
    draft_len = n_prompt  # the draft's KV length: it lags the accepted tokens by one or two
    while len(seq) - n_prompt < limit and seq[-1] not in eos:
        pos = len(seq) - 1  # the last accepted token: in no KV cache yet
        # guesses the verify pass may take: the tokens still wanted, the KV boundary, and the
        # draft's cache (it feeds positions up to pos + room - 1)
        room = room_for_guesses(order, seq, n_prompt, limit, n_draft, n_ctx_d)
        t0 = time.perf_counter()
        guesses, draft_end = [], draft_len
        if room > 0 and room >= draft_min and p_min_gap <= 0 and p_min <= 0:
            # no confidence cut: the draft's passes and the verify pass as one device-side sequence
            # (draft_and_verify: the verify's ids copied on the device from the draft's argmaxes)
            pending = seq[draft_len:]
            guesses, best, draft_s, verify_s = draft_and_verify(draft, target, pending, draft_len, room,
                                                                seq[-1], pos, order, draft_order)
            draft_end = draft_len + len(pending) + room - 1
            t2 = time.perf_counter()
            t1 = t2 - verify_s  # the split draft_and_verify reports (device time of the draft chain)
        else:
            if room > 0:
                guesses, draft_end = _draft_guesses(draft, seq[draft_len:], draft_len, room, draft_order,
                                                    p_min_gap, p_min)
                if len(guesses) < draft_min:
                    guesses = []
            t1 = time.perf_counter()
            best = greedy_tokens(target, [seq[-1]] + guesses, pos, order)
            t2 = time.perf_counter()
        k = 0
        while k < len(guesses) and guesses[k] == best[k]:
            k += 1
        seq += guesses[:k] + [int(best[k])]
        target.rollback(pos + k + 1)  # keep the last accepted token and the k survivors
        draft_len = min(draft_end, pos + k + 1)
        draft.rollback(draft_len)
        cycles.append(Cycle(pos, len(guesses), k, t1 - t0, t2 - t1, time.perf_counter() - t2))
        if on_cycle is not None:
            on_cycle(k + 1)
    return new_tokens(seq, n_prompt, eos, limit), cycles, prefill_s


def first_divergence(a, b) -> int | None:
    """The first index where two token lists differ (or one ends); None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class SpeculativeResult:
    """Tokens of a speculative run and how the cycles went."""

    tokens: list[int]  # the generated ids (prompt excluded)
    text: str
    prompt_tokens: list[int]
    order: str
    n_draft: int
    p_min_gap: float
    cycles: list[Cycle]
    prefill_s: float
    plain_tokens: list[int] | None = None  # plain greedy decoding's tokens, when given
    draft_name: str = ""
    meta: dict = field(default_factory=dict)
    p_min: float = DEFAULT_P_MIN
    draft_min: int = 0
    stop_reason: str = "max_tokens"  # "eos", "max_tokens" or "context", as plain decoding says
    draft_order: str | None = None  # the draft's order where it was not the target's

    @property
    def drafted(self) -> int:
        return sum(c.drafted for c in self.cycles)

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.cycles)

    @property
    def acceptance_rate(self) -> float:
        """Accepted guesses / drafted guesses; NaN when nothing was drafted (0/0 says nothing)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_verify_batch(self) -> float:
        """Mean tokens per verify pass (the last accepted token plus the guesses)."""
        return float(np.mean([c.verify_batch for c in self.cycles])) if self.cycles else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        """Generated tokens per draft+verify cycle (the prefill's first token excluded)."""
        return (len(self.tokens) - 1) / len(self.cycles) if self.cycles else 0.0

    @property
    def time_split(self) -> dict[str, float]:
        """Mean seconds per cycle spent drafting, verifying and on bookkeeping (rollback, compare)."""
        n = max(1, len(self.cycles))
        return {
            "draft": sum(c.draft_s for c in self.cycles) / n,
            "verify": sum(c.verify_s for c in self.cycles) / n,
            "bookkeeping": sum(c.bookkeeping_s for c in self.cycles) / n,
        }

    @property
    def total_s(self) -> float:
        return self.prefill_s + sum(c.draft_s + c.verify_s + c.bookkeeping_s for c in self.cycles)

    @property
    def first_divergence(self) -> int | None:
        """First generated index (0 = the first new token) where these tokens differ from
        ``plain_tokens`` (None: same). See :attr:`first_divergence_position` for the position."""
        if self.plain_tokens is None:
            return None
        return first_divergence(self.tokens, self.plain_tokens)

    @property
    def first_divergence_position(self) -> int | None:
        """The position whose logits chose the first differing token (the convention of replay
        reports: position p's logits choose the token at p + 1; 0 = the first prompt token)."""
        i = self.first_divergence
        return None if i is None else len(self.prompt_tokens) + i - 1

    @property
    def matches_plain(self) -> bool | None:
        return None if self.plain_tokens is None else self.tokens == self.plain_tokens

    @property
    def vacuous(self) -> bool:
        """True when the draft proposed nothing: every token came from one-token passes, so
        equality with plain decoding checks nothing about batching."""
        return self.drafted == 0

    def __str__(self) -> str:
        split = self.time_split
        cut = f"gap >= {self.p_min_gap:g}" + (f", p >= {self.p_min:g}" if self.p_min else "")
        lines = [
            f"speculative ({self.order}, draft {self.draft_name or '?'}"
            + (f" under {self.draft_order}" if self.draft_order else "") + f", n_draft {self.n_draft}, "
            f"{cut}): {len(self.tokens)} tokens in {len(self.cycles)} cycles, {self.total_s:.2f} s, "
            f"stopped: {self.stop_reason}",
            (f"  acceptance {self.acceptance_rate:.1%} ({self.accepted}/{self.drafted}), "
             if self.drafted else "  acceptance n/a (0 drafted), ")
            + f"mean verify batch {self.mean_verify_batch:.2f}, tokens/cycle {self.tokens_per_cycle:.2f}",
            f"  per cycle: draft {split['draft'] * 1e3:.1f} ms, verify {split['verify'] * 1e3:.1f} ms, "
            f"bookkeeping {split['bookkeeping'] * 1e3:.2f} ms",
        ]
        if self.meta.get("draft_ahead"):
            lines.append(f"  draft ahead: {sum(c.ahead for c in self.cycles)} of {len(self.cycles)} cycles' "
                         "guesses made during the verify before")
        if self.vacuous and self.cycles:
            lines.append("  WARNING: the draft proposed no tokens: every verify pass held one token, so "
                         "this run tests nothing about batching (lower --p-min-gap / --draft-p-min)")
        if self.plain_tokens is not None:
            p = self.first_divergence_position
            lines.append("  identical to plain greedy decoding" if p is None
                         else f"  differs from plain greedy decoding from position {p} ({POSITION_NOTE})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = {
            "acceptance_rate": self.acceptance_rate,
            "mean_verify_batch": self.mean_verify_batch,
            "tokens_per_cycle": self.tokens_per_cycle,
            "time_split": self.time_split,
            "total_s": self.total_s,
            "first_divergence": self.first_divergence,
            "first_divergence_position": self.first_divergence_position,
            "position_note": POSITION_NOTE,
            "vacuous": self.vacuous,
        }
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeResult":
        d = dict(d)
        d.pop("summary", None)
        d["cycles"] = [Cycle(**c) for c in d["cycles"]]
        return cls(**d)

    def save(self, path) -> Path:
        """Write the result as JSON, atomically."""
        return dump_json(self.to_dict(), path)

    @classmethod
    def load(cls, path) -> "SpeculativeResult":
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise HiraishinError(f"{path}: not a speculative result JSON ({e})") from e


def _twin(model):
    """A second instance of ``model`` (same file, backend and context), with its own KV cache."""
    path = getattr(model, "path", None)
    if path is None or not hasattr(type(model), "from_gguf"):
        raise HiraishinError(f"draft='self' needs a model loaded from a GGUF file; {type(model).__name__} "
                             "is not: pass a second instance as draft")
    return type(model).from_gguf(path, device=model.backend, n_ctx=model.n_ctx, progress=False)


def _check_float(name: str, value, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise HiraishinError(f"{name} must be a finite number in {lo:g}..{hi:g}, got {value}")
    return value


def generate_speculative(model, prompt, draft, n_draft: int = 8,
                         order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                         max_new_tokens: int = 64, p_min_gap: float = DEFAULT_P_MIN_GAP,
                         stop_at_eos: bool = True, plain_tokens=None,
                         progress: bool = False, *, p_min: float = DEFAULT_P_MIN, draft_min: int = 0,
                         chat: bool = False, system: str | None = None,
                         think: bool | None = None, draft_ahead: bool = False,
                         ahead_passes: int | None = None,
                         draft_order: ReductionOrder | None = None) -> SpeculativeResult:
    """Greedy speculative decoding of ``prompt`` with ``model`` as target (usable as a method).

    Args:
        model: the target.
        prompt: text (encoded with ``model.tokenizer``; ``chat``, ``system``, ``think`` as in
            :func:`hiraishin.decode.greedy.stream`) or token ids.
        draft: the draft model, a separate instance with its own KV cache, or
            ``"self"``: a second instance of the target loaded from its file.
        n_draft: most guesses per cycle (llama.cpp's ``--draft-max``).
        order: the reduction order of the target's passes, and of the draft's unless ``draft_order`` is given.
            It alone decides the tokens: under an exact order they are plain greedy decoding's.
        max_new_tokens: tokens to generate; fewer when the KV cache fills (``stop_reason``
            ``"context"``, as plain decoding stops).
        p_min_gap: the draft stops when its top-two logits are closer than this (0: never).
        p_min: the draft stops when its top token's probability is below this (llama.cpp's
            ``--draft-p-min``; 0: never).
        draft_min: drafts shorter than this are not verified (llama.cpp's ``--draft-min``).
        stop_at_eos: stop after an end-of-sequence token of the target's tokenizer.
        plain_tokens: plain greedy decoding's tokens, to report the first divergence.
        progress: show a tqdm progress bar.
        draft_ahead: the draft guesses the next cycle while the target verifies this one
            (:mod:`hiraishin.decode.ahead`; needs ``p_min_gap`` and ``p_min`` 0). The same tokens.
        ahead_passes: with ``draft_ahead``, the most passes the draft makes ahead (at least 2; default
            ``n_draft + 1``): fewer run beside the verify, and a cycle verifying them takes fewer guesses.
        draft_order: the order of the draft's passes (default ``order``): any order drafts, since the target
            keeps a guess only where its own argmax agrees; e.g. the draft's fastest (``hiraishin bench``
            picks it by the cost of a cycle's drafting). The same tokens, perhaps other guesses.

    Every argument is checked before any pass (and before ``draft="self"`` loads a twin).
    """
    order = check_order(order)
    if draft_order is not None:
        draft_order = check_order(draft_order, "draft_order")
    n_draft = check_int("n_draft", n_draft, 1)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    draft_min = check_int("draft_min", draft_min, 0)
    if draft_min > n_draft:
        raise HiraishinError(f"draft_min ({draft_min}) must be <= n_draft ({n_draft})")
    p_min_gap = _check_float("p_min_gap", p_min_gap, 0.0, MAX_P_MIN_GAP)
    p_min = _check_float("p_min", p_min, 0.0, 1.0)
    if not isinstance(draft_ahead, bool):
        raise ArgumentTypeError(f"draft_ahead must be True or False, got {draft_ahead!r}")
    if ahead_passes is not None:
        ahead_passes = check_int("ahead_passes", ahead_passes, MIN_AHEAD_PASSES)
        if not draft_ahead:
            raise HiraishinError("ahead_passes limits the draft running ahead: pass draft_ahead=True too")
    if draft_ahead and (p_min_gap > 0 or p_min > 0):
        raise HiraishinError("draft_ahead drafts a whole chain before the host sees a guess: it takes no "
                             f"confidence cut (p_min_gap {p_min_gap:g}, p_min {p_min:g}; set both to 0)")
    if isinstance(draft, str):
        if draft != "self":
            raise HiraishinError(f"draft must be a model instance or the string 'self', got {draft!r}")
    elif not all(callable(getattr(draft, m, None)) for m in ("forward", "reset", "rollback")):
        raise ArgumentTypeError(f"draft must be a model (with forward, reset, rollback) or 'self', "
                                f"got {type(draft).__name__}")
    if draft is model:
        raise HiraishinError("the draft must be a separate model instance with its own KV cache "
                             "(for self-speculation, load the same GGUF a second time)")
    tokens = prompt_tokens(model, prompt, chat, system, think)
    n_ctx = getattr(model, "n_ctx", None)
    if n_ctx is not None and len(tokens) >= n_ctx:
        raise HiraishinError(f"the prompt has {len(tokens)} tokens; the KV cache holds {n_ctx}")
    if plain_tokens is not None:
        plain_tokens = [check_int("plain_tokens item", t, 0) for t in plain_tokens]
    if isinstance(draft, str):
        draft = _twin(model)
    d_ctx = getattr(draft, "n_ctx", None)
    if d_ctx is not None and len(tokens) > d_ctx:
        raise HiraishinError(f"the prompt has {len(tokens)} tokens; the draft's KV cache holds {d_ctx}")
    t_vocab = model.config.n_vocab
    d_vocab = getattr(getattr(draft, "config", None), "n_vocab", t_vocab)
    if d_vocab != t_vocab:
        raise HiraishinError(f"draft vocabulary ({d_vocab}) differs from the target's ({t_vocab})")

    eos = eos_ids(model) if stop_at_eos else ()
    with progress_bar(max_new_tokens, "speculative", progress) as bar:
        if draft_ahead:
            new, cycles, prefill_s = speculative_decode_ahead(
                model, draft, tokens, max_new_tokens, n_draft=n_draft, order=order, eos_ids=eos,
                on_cycle=bar.update, draft_min=draft_min, ahead_passes=ahead_passes, draft_order=draft_order)
        else:
            new, cycles, prefill_s = speculative_decode(
                model, draft, tokens, max_new_tokens, n_draft=n_draft, order=order, p_min_gap=p_min_gap,
                eos_ids=eos, on_cycle=bar.update, p_min=p_min, draft_min=draft_min, draft_order=draft_order)
    if new and new[-1] in set(eos):
        reason = "eos"
    elif len(new) == max_new_tokens:
        reason = "max_tokens"
    else:
        reason = "context"
    tokenizer = getattr(model, "tokenizer", None)
    text = tokenizer.decode(new[:-1] if reason == "eos" else new) if tokenizer is not None else ""
    return SpeculativeResult(
        tokens=new, text=text, prompt_tokens=tokens, order=order.name, n_draft=n_draft,
        p_min_gap=p_min_gap, cycles=cycles, prefill_s=prefill_s, plain_tokens=plain_tokens,
        draft_name=model_name(draft), meta={"target": model_name(model), "backend": backend_name(model),
                                            **({"draft_ahead": True} if draft_ahead else {}),
                                            **({"ahead_passes": ahead_passes} if ahead_passes is not None else {})},
        p_min=p_min, draft_min=draft_min, stop_reason=reason,
        draft_order=draft_order.name if draft_order is not None and draft_order != order else None,
    )
