"""Passes of up to 16 tokens replayed from CUDA graphs: decode steps and speculative verify passes.

A pass is ``n_layer + 1`` segments of fixed launches (everything between two attentions: the
output projection, feed-forward, the next layer's norms, Q/K/V and RoPE) separated by the two
ops that take the pass's position as host values: the KV-cache store and the attention (its KV
length and plan). The segments are captured once per (order, width) into CUDA graphs and
replayed at every position; the KV stores and attentions are launched as usual between them. The
token ids and positions live in device buffers (filled before the replay), and every segment
reads and writes the model's fixed activation buffers of that width, so a replay runs exactly
the launches of the eager pass (same kernels, arguments, order): the same bits.

Per (order, width) the first pass runs the segments without capturing (kernels compiled,
launches prepared, scratch allocated), the second captures them, later passes replay. Everything
runs on a stream of its own (capture needs a non-default stream) and is synchronized by the
logits copy at the end, like an eager pass. If a capture fails, that (order, width) falls back
to eager passes with a warning.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["PassGraphs"]

_COLD, _WARM, _FAILED = "cold", "warm", None


class PassGraphs:
    """CUDA-graph replay of a model's passes of ``1..max_tokens`` tokens (see the module docstring).

    ``model`` provides ``pass_buffers(T)``, ``embed``, ``attention_inputs``, ``attend``,
    ``layer_output``, ``head``, ``config``, ``cache`` and ``backend`` (a CUDA backend).
    """

    def __init__(self, model, max_tokens: int):
        cp = model.backend.xp
        self.model = model
        self.max_tokens = int(max_tokens)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._ids = {}  # T -> int32 (T,) device token ids
        self._pos = {}  # T -> int32 (T,) device positions
        self._state: dict = {}  # (order, T) -> "cold" | "warm" | list of graphs | None (capture failed)

    def _inputs(self, T: int):
        ids = self._ids.get(T)
        if ids is None:
            cp = self.model.backend.xp
            ids = self._ids[T] = cp.zeros((T,), np.int32)
            self._pos[T] = cp.zeros((T,), np.int32)
        return ids, self._pos[T]

    def run(self, tokens: np.ndarray, start_pos: int, order) -> np.ndarray | None:
        """Logits (T, n_vocab) of ``tokens`` (int32, T <= max_tokens) at ``start_pos`` (the cache is
        not committed), or None when this (order, width) has no graphs: run an eager pass instead."""
        T = int(tokens.size)
        key = (order, T)
        state = self._state.get(key, _COLD)
        if state is _FAILED:
            return None
        m = self.model
        ids, pos = self._inputs(T)
        buf = m.pass_buffers(T)
        with self.stream:
            ids.set(tokens)  # host -> device on this stream, before the launches that read it
            pos.set(np.arange(start_pos, start_pos + T, dtype=np.int32))
            m.embed(ids, out=buf["embd"])
            if state == _COLD:
                self._run(order, T, start_pos, None)
                self._state[key] = _WARM
            elif state == _WARM:
                graphs: list = []
                try:
                    self._run(order, T, start_pos, graphs)
                except Exception as exc:  # noqa: BLE001 - any capture failure: eager passes for this key
                    self._abandon_capture()
                    self._state[key] = _FAILED
                    warnings.warn(f"CUDA-graph capture of a {T}-token pass failed under {order.name} "
                                  f"({type(exc).__name__}: {exc}); using eager passes", RuntimeWarning, stacklevel=3)
                    return None
                self._state[key] = graphs
            else:
                for il in range(m.config.n_layer):
                    state[il].launch(self.stream)
                    self._attend(il, T, start_pos, order)
                state[-1].launch(self.stream)
            return m.backend.to_host(buf["logits"])

    def _segment(self, i: int, T: int, order) -> None:
        """Segment ``i``: layer ``i-1``'s output half (i > 0), then layer ``i``'s attention inputs
        (i < n_layer), or the output norm and projection (i == n_layer)."""
        m = self.model
        buf = m.pass_buffers(T)
        n_layer = m.config.n_layer
        x = buf["embd"] if i == 0 else buf["l_out"]
        if i > 0:
            prev_in = buf["embd"] if i == 1 else buf["l_out"]
            x = m.layer_output(i - 1, buf["attn"], prev_in, order, buf)
        if i < n_layer:
            m.attention_inputs(i, x, self._pos[T], order, buf)
        else:
            m.head(x, order, buf)

    def _attend(self, il: int, T: int, start_pos: int, order) -> None:
        m = self.model
        buf = m.pass_buffers(T)
        c = m.config
        m.attend(il, buf["q_rope"], buf["k_rope"], buf["v"].reshape(T, c.n_head_kv, c.head_dim), self._pos[T],
                 start_pos, order, buf)

    def _run(self, order, T: int, start_pos: int, graphs: list | None) -> None:
        """Run the pass segment by segment; with ``graphs`` (a list), capture each segment into a
        graph appended to it and launch that graph."""
        n_layer = self.model.config.n_layer
        for i in range(n_layer + 1):
            if graphs is None:
                self._segment(i, T, order)
            else:
                self.stream.synchronize()  # capture begins on an idle stream
                self.stream.begin_capture()
                try:
                    self._segment(i, T, order)
                finally:
                    graph = self.stream.end_capture()
                graphs.append(graph)
                graph.launch(self.stream)
            if i < n_layer:
                self._attend(i, T, start_pos, order)

    def _abandon_capture(self) -> None:
        try:
            if self.stream.is_capturing():
                self.stream.end_capture()
        except Exception:  # noqa: BLE001 - the capture is invalid anyway
            pass
        try:
            self.stream.synchronize()
        except Exception:  # noqa: BLE001
            pass
