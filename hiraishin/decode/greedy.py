"""Plain greedy decoding: prefill the prompt, then one token per pass, argmax every time.

>>> for step in model.stream("Hello", max_new_tokens=8):
...     print(step.text, end="", flush=True)
>>> result = model.generate("Hello", max_new_tokens=8)      # GenerationResult
>>> result.tokens, result.text, result.top_k_ids, result.prefill_s

The prompt is fed in passes cut at the order's KV boundary (``order.verify_limit``), as a
speculative verifier under the same order cuts its batches, so plain and speculative decoding
see the same passes over the prompt. Ties in the argmax go to the lowest token id (numpy).

On CUDA graphs the one-token passes come from ``model.greedy_stream``: each is enqueued before the
host reads the token of the one before, so the GPU does not wait for the host between tokens; a
step's ``seconds`` is then the time between two tokens reaching the host. With ``top_k`` > 1 (up to
``TOPK_MAX``) the ``top_k`` largest logits are found on the device behind each pass (``top_k_of``'s
rule). The same passes, hence the same tokens (a NaN logit aside: the device's argmax takes it as the
largest, numpy's ``argmax`` rule, where ``top_k_of`` sorts it last).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..errors import HiraishinError
from ..order import ReductionOrder
from .inputs import check_int, check_order, prompt_tokens
from .passes import feed, progress_bar

__all__ = ["Step", "GenerationResult", "stream", "generate", "prefill", "top_k_of"]


@dataclass
class Step:
    """One generated token."""

    index: int  # 0 for the token the prefill produced
    token: int
    text: str  # the text this token completes ("" inside a multi-byte character)
    top_k_ids: np.ndarray  # (k,) ids of the k largest logits, best first
    top_k_logits: np.ndarray  # (k,) float32
    seconds: float  # wall time of the pass that produced it (the prefill for index 0)
    stop_reason: str | None = None  # set on the last step: "eos", "max_tokens" or "context"


@dataclass
class GenerationResult:
    """What :func:`generate` produced. ``tokens`` are the new tokens (an end-of-generation token
    that stopped decoding included); ``text`` is their text without that final token."""

    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    top_k_ids: np.ndarray  # (n_new, k) int64
    top_k_logits: np.ndarray  # (n_new, k) float32
    prefill_s: float
    step_s: list[float] = field(default_factory=list)  # one decode pass per token after the first
    stop_reason: str = "max_tokens"
    order: str = ""

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second of the one-token passes (nan when there were none)."""
        return len(self.step_s) / sum(self.step_s) if self.step_s and sum(self.step_s) > 0 else float("nan")

    @property
    def prefill_tokens_per_s(self) -> float:
        return len(self.prompt_tokens) / self.prefill_s if self.prefill_s > 0 else float("nan")

    def to_dict(self) -> dict:
        """Plain data (lists, numbers) for JSON; non-finite numbers stay floats (see ``report.json_ready``)."""
        return {
            "prompt_tokens": list(self.prompt_tokens), "tokens": list(self.tokens), "text": self.text,
            "top_k_ids": self.top_k_ids.tolist(), "top_k_logits": self.top_k_logits.tolist(),
            "prefill_s": self.prefill_s, "step_s": list(self.step_s), "stop_reason": self.stop_reason,
            "order": self.order, "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
        }


def top_k_of(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and values of the ``k`` largest logits, best first (ties: lower id first)."""
    logits = np.asarray(logits)
    k = min(k, logits.size)
    ids = np.argsort(-logits, kind="stable")[:k]
    return ids.astype(np.int64), logits[ids].astype(np.float32)


def prefill(model, tokens, order: ReductionOrder, start_pos: int = 0) -> np.ndarray:
    """Feed ``tokens`` from ``start_pos`` in passes cut at the order's KV boundary; last row's logits."""
    return feed(model, tokens, start_pos, order)


def _sync(model):
    be = getattr(model, "backend", None)
    if hasattr(be, "synchronize"):
        be.synchronize()


def stream(model, prompt_or_tokens, max_new_tokens: int = 64,
           order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, stop_at_eos: bool = True,
           top_k: int = 5, chat: bool = False, system: str | None = None,
           think: bool | None = None) -> Iterator[Step]:
    """Greedy decoding as an iterator of :class:`Step`; the model's KV cache is reset first.

    Stops after ``max_new_tokens``, after an end-of-generation token (``stop_at_eos``), or when
    the KV cache is full; the last step carries the reason. The arguments are checked when
    ``stream`` is called, before the first pass. ``chat`` renders a text prompt through the
    model's chat template, with an optional ``system`` message and Qwen3's thinking switch
    ``think`` (the template's ``enable_thinking``; None: the template's default).
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    top_k = check_int("top_k", top_k, 1)
    order = check_order(order)
    prompt = prompt_tokens(model, prompt_or_tokens, chat, system, think)
    n_ctx = getattr(model, "n_ctx", None)
    if n_ctx is not None and len(prompt) >= n_ctx:
        raise HiraishinError(f"the prompt has {len(prompt)} tokens; the KV cache holds {n_ctx}")
    return _steps(model, prompt, max_new_tokens, order, stop_at_eos, top_k, n_ctx)


def _steps(model, prompt, max_new_tokens, order, stop_at_eos, top_k, n_ctx) -> Iterator[Step]:
    tok = getattr(model, "tokenizer", None)
    text_of = tok.stream_decoder() if tok is not None else (lambda t: "")
    eog = set(getattr(tok, "eos_ids", ()) or ()) if stop_at_eos else set()

    model.reset()
    t0 = time.perf_counter()
    logits = prefill(model, prompt, order)
    _sync(model)
    seconds = time.perf_counter() - t0
    pos = len(prompt)
    ids, vals = top_k_of(logits, top_k)
    ahead = None  # on CUDA graphs: the model's greedy_stream, a pass enqueued ahead of the host
    try:
        for index in range(max_new_tokens):
            token = int(ids[0])
            reason = None
            if token in eog:
                reason = "eos"
            elif index + 1 == max_new_tokens:
                reason = "max_tokens"
            elif n_ctx is not None and pos >= n_ctx:
                reason = "context"
            yield Step(index, token, text_of(token), ids, vals, seconds, reason)
            if reason is not None:
                return
            t0 = time.perf_counter()
            if index == 0 and hasattr(model, "greedy_stream"):
                more = max_new_tokens - 1 if n_ctx is None else min(max_new_tokens - 1, n_ctx - pos)
                ahead = model.greedy_stream(token, pos, more, order, top_k=top_k)  # None: not on graphs
            got = next(ahead, None) if ahead is not None else None
            if got is not None and top_k > 1:  # the token, and the top_k places, of the pass that fed `token`
                ids, vals = _with_token_first(got)
            elif got is not None:
                ids, vals = np.array([got[0]], np.int64), np.array([got[1]], np.float32)
            else:  # one pass at a time (no graphs; or the stream stopped early: a failed capture)
                ahead = None
                logits = np.asarray(model.forward([token], pos, order=order))[-1]
                _sync(model)
                ids, vals = top_k_of(logits, top_k)
            seconds = time.perf_counter() - t0
            pos += 1
    finally:
        if ahead is not None:
            ahead.close()  # waits for the passes enqueued past the last token taken


def _with_token_first(got) -> tuple[np.ndarray, np.ndarray]:
    """A streamed pass's ``(token, logit, ids, values)`` as the step's ids and values: the token decoding
    continues with first (the device's argmax; ``ids[0]`` but for a NaN logit, which top_k_of puts last)."""
    token, logit, ids, vals = got
    if ids.size and int(ids[0]) == token:
        return ids, vals
    keep = ids != token
    return (np.concatenate([[token], ids[keep]])[:ids.size or 1].astype(np.int64),
            np.concatenate([[np.float32(logit)], vals[keep]])[:ids.size or 1].astype(np.float32))


def generate(model, prompt_or_tokens, max_new_tokens: int = 64,
             order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, stop_at_eos: bool = True,
             on_token: Callable[[Step], None] | None = None, top_k: int = 5, progress: bool = False,
             chat: bool = False, system: str | None = None, think: bool | None = None) -> GenerationResult:
    """Greedy decoding of ``prompt_or_tokens`` (text, or token ids) into a :class:`GenerationResult`.

    ``on_token(step)`` is called for each new token as it is produced; ``progress`` shows a tqdm
    bar; ``chat``, ``system`` and ``think`` as in :func:`stream`. ``top_k`` is how many of the
    largest logits to keep per token (llama-server's ``n_probs``); decoding is greedy.
    """
    steps: list[Step] = []
    prompt = prompt_tokens(model, prompt_or_tokens, chat, system, think)
    it = stream(model, prompt, max_new_tokens, order, stop_at_eos, top_k)
    with progress_bar(max_new_tokens, "generating", progress) as bar:
        for step in it:
            steps.append(step)
            bar.update(1)
            if on_token is not None:
                on_token(step)
    tokens = [s.token for s in steps]
    stop_reason = steps[-1].stop_reason or "max_tokens"
    shown = tokens[:-1] if stop_reason == "eos" else tokens
    tok = getattr(model, "tokenizer", None)
    text = tok.decode(shown) if tok is not None else ""
    k = max(len(s.top_k_ids) for s in steps)
    return GenerationResult(
        prompt_tokens=prompt,
        tokens=tokens,
        text=text,
        top_k_ids=np.stack([np.pad(s.top_k_ids, (0, k - len(s.top_k_ids)), constant_values=-1) for s in steps]),
        top_k_logits=np.stack([np.pad(s.top_k_logits, (0, k - len(s.top_k_logits)), constant_values=np.nan)
                               for s in steps]),
        prefill_s=steps[0].seconds,
        step_s=[s.seconds for s in steps[1:]],
        stop_reason=stop_reason,
        order=str(order),
    )
