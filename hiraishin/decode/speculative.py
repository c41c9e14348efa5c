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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HiraishinError
from ..order import ReductionOrder
from .replay import _backend_name, _model_name, feed
from .report import top_two

__all__ = [
    "speculative_decode",
    "generate_speculative",
    "SpeculativeResult",
    "Cycle",
    "first_divergence",
    "DEFAULT_P_MIN_GAP",
]

# The draft stops guessing when its top-two logits are closer than this, and the
# unsure guess is dropped: the confidence cut of the patched llama.cpp fork the
# project measures (llama.cpp's own ``--draft-p-min`` is a probability instead).
DEFAULT_P_MIN_GAP = 3.0


@dataclass
class Cycle:
    """One draft + verify cycle."""

    pos: int  # position of the last accepted token, fed first in the verify pass
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float

    @property
    def verify_batch(self) -> int:
        return self.drafted + 1


def _draft_guesses(draft, pending, start, n, order, gap_min):
    """Feed ``pending`` (accepted tokens the draft has not seen) at ``start``; guess up to ``n``.

    Returns the guesses and the draft's KV length afterwards.
    """
    logits = feed(draft, pending, start, order)
    pos = start + len(pending)
    guesses = []
    while True:
        best, _, gap = top_two(logits)
        if gap < gap_min:
            break
        guesses.append(best)
        if len(guesses) == n:
            break
        logits = np.asarray(draft.forward([best], pos, order=order))[-1]
        pos += 1
    return guesses, pos


def speculative_decode(target, draft, prompt_tokens, max_new_tokens: int, *, n_draft: int = 8,
                       order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                       p_min_gap: float = DEFAULT_P_MIN_GAP, eos_ids=(), on_cycle=None):
    """The core loop. Returns ``(new tokens, cycles, prefill seconds)``.

    ``target`` and ``draft`` need ``forward(tokens, start_pos, order=)``, ``rollback(pos)``, ``reset()``.
    """
    seq = [int(t) for t in prompt_tokens]
    n_prompt, eos, cycles = len(seq), set(eos_ids), []
    t0 = time.perf_counter()
    target.reset()
    draft.reset()
    feed(draft, seq, 0, order)
    seq.append(int(np.argmax(feed(target, seq, 0, order))))  # prefill; the first new token
    draft_len = n_prompt  # the draft's KV length: it lags the accepted tokens by one or two
    prefill_s = time.perf_counter() - t0
    while len(seq) - n_prompt < max_new_tokens and seq[-1] not in eos:
        pos = len(seq) - 1  # the last accepted token: in no KV cache yet
        # guesses the verify pass may take: the tokens still wanted, the KV boundary
        room = min(n_draft, max_new_tokens - (len(seq) - n_prompt) - 1)
        room = order.verify_limit(pos, room + 1) - 1
        t0 = time.perf_counter()
        guesses, draft_end = [], draft_len
        if room > 0:
            guesses, draft_end = _draft_guesses(draft, seq[draft_len:], draft_len, room, order, p_min_gap)
        t1 = time.perf_counter()
        best = np.asarray(target.forward([seq[-1]] + guesses, pos, order=order)).argmax(axis=1)
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
    new = seq[n_prompt:]
    hit = next((i for i, t in enumerate(new) if t in eos), None)
    if hit is not None:
        new = new[:hit + 1]
    return new[:max_new_tokens], cycles, prefill_s


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

    @property
    def drafted(self) -> int:
        return sum(c.drafted for c in self.cycles)

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.cycles)

    @property
    def acceptance_rate(self) -> float:
        """Accepted guesses / drafted guesses (1.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 1.0

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
        """First generated position where these tokens differ from ``plain_tokens`` (None: same)."""
        if self.plain_tokens is None:
            return None
        return first_divergence(self.tokens, self.plain_tokens)

    @property
    def matches_plain(self) -> bool | None:
        return None if self.plain_tokens is None else self.tokens == self.plain_tokens

    def __str__(self) -> str:
        split = self.time_split
        lines = [
            f"speculative ({self.order}, draft {self.draft_name or '?'}, n_draft {self.n_draft}, "
            f"gap >= {self.p_min_gap:g}): {len(self.tokens)} tokens in {len(self.cycles)} cycles, "
            f"{self.total_s:.2f} s",
            f"  acceptance {self.acceptance_rate:.1%} ({self.accepted}/{self.drafted}), "
            f"mean verify batch {self.mean_verify_batch:.2f}, tokens/cycle {self.tokens_per_cycle:.2f}",
            f"  per cycle: draft {split['draft'] * 1e3:.1f} ms, verify {split['verify'] * 1e3:.1f} ms, "
            f"bookkeeping {split['bookkeeping'] * 1e3:.2f} ms",
        ]
        if self.plain_tokens is not None:
            fd = self.first_divergence
            lines.append("  identical to plain greedy decoding" if fd is None
                         else f"  differs from plain greedy decoding at generated position {fd}")
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
        }
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeResult":
        d = dict(d)
        d.pop("summary", None)
        d["cycles"] = [Cycle(**c) for c in d["cycles"]]
        return cls(**d)

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        return path

    @classmethod
    def load(cls, path) -> "SpeculativeResult":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _eos_ids(model) -> tuple[int, ...]:
    tok = getattr(model, "tokenizer", None)
    for attr in ("eos_ids", "eos_token_ids", "eos_id"):
        v = getattr(tok, attr, None)
        if v is not None:
            return tuple(int(x) for x in (v if isinstance(v, (list, tuple, set, frozenset)) else [v]))
    return ()


def _twin(model):
    """A second instance of ``model`` (same file, backend and context), with its own KV cache."""
    path = getattr(model, "path", None)
    if path is None or not hasattr(type(model), "from_gguf"):
        raise HiraishinError(f"draft='self' needs a model loaded from a GGUF file; {type(model).__name__} "
                             "is not: pass a second instance as draft")
    return type(model).from_gguf(path, device=model.backend, n_ctx=model.n_ctx, progress=False)


def generate_speculative(model, prompt, draft, n_draft: int = 8,
                         order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                         max_new_tokens: int = 64, p_min_gap: float = DEFAULT_P_MIN_GAP,
                         stop_at_eos: bool = True, plain_tokens=None,
                         progress: bool = False) -> SpeculativeResult:
    """Greedy speculative decoding of ``prompt`` with ``model`` as target (usable as a method).

    Args:
        model: the target.
        prompt: text (encoded with ``model.tokenizer``) or token ids.
        draft: the draft model, a separate instance with its own KV cache, or
            ``"self"``: a second instance of the target loaded from its file.
        n_draft: most guesses per cycle.
        order: the reduction order of every pass, draft and target.
        max_new_tokens: tokens to generate.
        p_min_gap: the draft stops when its top-two logits are closer than this
            (0 disables the cut).
        stop_at_eos: stop after an end-of-sequence token of the target's tokenizer.
        plain_tokens: plain greedy decoding's tokens, to report the first divergence.
        progress: show a tqdm progress bar.
    """
    if isinstance(draft, str) and draft == "self":
        draft = _twin(model)
    if draft is model:
        raise HiraishinError("the draft must be a separate model instance with its own KV cache "
                             "(for self-speculation, load the same GGUF a second time)")
    if n_draft < 1:
        raise HiraishinError(f"n_draft must be >= 1, got {n_draft}")
    if max_new_tokens < 1:
        raise HiraishinError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    tokens = model.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not tokens:
        raise HiraishinError("the prompt encodes to no tokens")
    t_vocab = model.config.n_vocab
    d_vocab = getattr(getattr(draft, "config", None), "n_vocab", t_vocab)
    if d_vocab != t_vocab:
        raise HiraishinError(f"draft vocabulary ({d_vocab}) differs from the target's ({t_vocab})")
    from tqdm import tqdm

    with tqdm(total=max_new_tokens, desc="speculative", unit="tok", disable=not progress, leave=False) as bar:
        new, cycles, prefill_s = speculative_decode(
            model, draft, tokens, max_new_tokens, n_draft=n_draft, order=order, p_min_gap=p_min_gap,
            eos_ids=_eos_ids(model) if stop_at_eos else (), on_cycle=bar.update)
    tokenizer = getattr(model, "tokenizer", None)
    text = tokenizer.decode(new) if tokenizer is not None else ""
    return SpeculativeResult(
        tokens=new, text=text, prompt_tokens=tokens, order=order.name, n_draft=n_draft,
        p_min_gap=float(p_min_gap), cycles=cycles, prefill_s=prefill_s,
        plain_tokens=None if plain_tokens is None else [int(t) for t in plain_tokens],
        draft_name=_model_name(draft), meta={"target": _model_name(model), "backend": _backend_name(model)},
    )
