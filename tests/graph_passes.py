"""A helper the GPU tests share: passes of several widths after a prompt, each run eagerly, captured and replayed."""

from __future__ import annotations


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
