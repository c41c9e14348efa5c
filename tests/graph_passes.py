"""A helper the GPU tests share: passes of several widths after a prompt, each run eagerly, captured and replayed."""

from __future__ import annotations

import numpy as np


def replayed_passes(model, prompt, steps, order) -> list:
    """The logits of each pass of ``steps`` (token lists) after ``prompt``, from a fresh cache: every pass runs
    three times at its position (an eager warm-up, the CUDA-graph capture, a replay) and the last output is
    kept; the positions advance by each step's tokens."""
    model.reset()
    model.forward(prompt, 0, order)
    pos, outs = len(prompt), []
    for tokens in steps:
        for _ in range(3):  # eager warm-up, capture, replay
            out = model.forward(tokens, pos, order)
        outs.append(out)
        pos += len(tokens)
    return outs


def greedy_outputs(model, prompt, n: int, order) -> tuple:
    """What a model decodes greedily after ``prompt`` by each of its paths: ``(first, chain, stream, logits)``:
    the prompt pass's token, ``n`` tokens of ``greedy_chain`` after it, the ``(token, logit bits)`` of
    ``greedy_stream`` over the same steps, and the bits of one eager-or-graph pass's logits after the chain."""
    first = int(model.forward_argmax(prompt, 0, order)[-1])
    chain = model.greedy_chain([first], len(prompt), n, order).tolist()
    stream = [(t, int(np.float32(v).view(np.uint32))) for t, v in model.greedy_stream(first, len(prompt), n, order)]
    logits = model.forward([chain[-1]], model.kv_len, order)
    return first, chain, stream, np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32)


def assert_same_decoding(a: tuple, b: tuple) -> None:
    """Two :func:`greedy_outputs` agree bit for bit, and each stream's tokens are its chain."""
    (f0, c0, s0, l0), (f1, c1, s1, l1) = a, b
    assert f0 == f1 and c0 == c1 and [t for t, _ in s0] == c0, "tokens differ"
    assert s0 == s1, "the stream's tokens or logit bits differ"
    assert np.array_equal(l0, l1), "logits differ"
