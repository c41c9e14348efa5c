"""Checks of the decode functions' arguments, and the prompt -> token ids step they share.

Every public decode function checks its arguments here before it touches the model, so a bad
argument is one :class:`~hiraishin.errors.HiraishinError` naming it, never an ``AttributeError``
from deep inside a forward pass or a half-done run.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from ..errors import HiraishinError
from ..model.tokenizer import check_text
from ..order import ReductionOrder

__all__ = ["ArgumentTypeError", "check_order", "check_int", "prompt_tokens", "encode_text",
           "model_name", "backend_name", "eos_ids"]


class ArgumentTypeError(HiraishinError, TypeError):
    """A decode argument of the wrong type (bytes for a prompt, None for an order)."""


def check_order(order, name: str = "order") -> ReductionOrder:
    """``order`` itself when it is a :class:`ReductionOrder`; else an error naming ``name``."""
    if not isinstance(order, ReductionOrder):
        raise ArgumentTypeError(f"{name} must be a ReductionOrder (e.g. ReductionOrder.BATCH_INVARIANT), "
                                f"got {order!r}")
    return order


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int when it is an integer >= ``minimum`` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise HiraishinError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def encode_text(model, text: str, chat: bool = False, system: str | None = None,
                think: bool | None = None) -> list[int]:
    """Token ids of ``text`` with ``model.tokenizer``; ``chat`` renders the chat template first.

    ``system`` adds a system message, ``think`` sets the template's ``enable_thinking`` (Qwen3's
    thinking switch; None: the template's default). Text that is not valid Unicode (lone
    surrogates, which is how Python carries undecodable command-line bytes) is refused.
    """
    check_text(text, "the prompt")
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise HiraishinError(f"{model_name(model)} has no tokenizer: a text prompt cannot be encoded "
                             "(pass token ids)")
    if not chat:
        if system is not None or think is not None:
            raise HiraishinError("system and think apply to chat prompts only (chat=True)")
        return list(tok.encode(text))
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": text}]
    extra = {} if think is None else {"enable_thinking": bool(think)}
    try:
        return list(tok.encode_chat(messages, **extra))
    except HiraishinError:
        raise
    except Exception as e:  # jinja2's errors: a template that does not render is the file's fault
        source = getattr(tok, "source", model_name(model))
        raise HiraishinError(f"{source}: tokenizer.chat_template cannot be rendered "
                             f"({type(e).__name__}: {e})") from None


def prompt_tokens(model, prompt, chat: bool = False, system: str | None = None,
                  think: bool | None = None) -> list[int]:
    """Token ids of ``prompt``: text (see :func:`encode_text`) or a sequence of token ids.

    Token ids must be integers in ``0..n_vocab-1``; ``bytes`` are refused rather than read as
    ids. The result is never empty.
    """
    if isinstance(prompt, str):
        ids = encode_text(model, prompt, chat, system, think)
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"the prompt must be text (str) or a sequence of token ids, got "
                                f"{type(prompt).__name__} (decode bytes to str first)")
    else:
        if chat or system is not None or think is not None:
            raise HiraishinError("chat=True (and system, think) need a text prompt, not token ids")
        if not isinstance(prompt, (Sequence, np.ndarray)):
            raise ArgumentTypeError(f"the prompt must be text (str) or a sequence of token ids, got "
                                    f"{type(prompt).__name__}")
        ids = []
        n_vocab = getattr(getattr(model, "config", None), "n_vocab", None)
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ArgumentTypeError(f"prompt token {i} must be an integer id, got {t!r}")
            if t < 0 or (n_vocab is not None and t >= n_vocab):
                raise HiraishinError(f"prompt token {i} = {t} is outside the vocabulary 0..{n_vocab - 1}"
                                     if n_vocab is not None else f"prompt token {i} = {t} is negative")
            ids.append(int(t))
    if not ids:
        raise HiraishinError("the prompt is empty (no tokens)")
    return ids


def model_name(model) -> str:
    """A short name for reports: the model's name, else its file name, else its type."""
    for attr in ("name", "path"):
        value = getattr(model, attr, None)
        if value:
            return str(value).rsplit("/", 1)[-1]
    return type(model).__name__


def backend_name(model) -> str:
    """``model.backend.name`` (or the backend itself as text)."""
    backend = getattr(model, "backend", "?")
    return str(getattr(backend, "name", backend))


def eos_ids(model) -> tuple[int, ...]:
    """The ids that end generation for ``model``'s tokenizer (empty without one)."""
    tok = getattr(model, "tokenizer", None)
    for attr in ("eos_ids", "eos_token_ids", "eos_id"):
        v = getattr(tok, attr, None)
        if v is not None:
            return tuple(int(x) for x in (v if isinstance(v, (list, tuple, set, frozenset)) else [v]))
    return ()
