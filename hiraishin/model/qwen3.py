"""Qwen3 forward pass over GGUF weights, written once against a :class:`~hiraishin.backends.Backend`.

>>> model = Qwen3.from_gguf("Qwen3-0.6B-Q4_K_M.gguf", device="cpu")
>>> logits = model.forward(model.tokenizer.encode("Hello"), start_pos=0)   # (T, n_vocab) float32
>>> model.generate("Hello", max_new_tokens=16).text

Graph order per layer (reference section 8.3, llama.cpp src/models/qwen3.cpp): RMSNorm, Q/K/V
mat-muls, per-head Q/K RMSNorm, NEOX RoPE, KV-cache write, attention, output mat-mul, residual,
RMSNorm, gate/up mat-muls, SwiGLU, down mat-mul, residual. One
:class:`~hiraishin.order.ReductionOrder` applies to every kernel of a pass.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..backends import Backend, get_backend
from ..errors import HiraishinError
from ..kernels.rope import rope_tables
from ..order import ReductionOrder
from .weights import LayerWeights, load_weights

__all__ = ["Qwen3", "DEFAULT_N_CTX"]

DEFAULT_N_CTX = 4096
# Passes of at most this many tokens (decode steps, speculative verify batches) reuse activation
# buffers on backends that write into given buffers; wider passes (prompt prefill) allocate.
BUFFER_MAX_TOKENS = 8
# "1" turns on the (experimental) CUDA-graph replay of one-token passes for models loaded without
# an explicit ``cuda_graphs`` argument.
CUDA_GRAPHS_ENV = "HIRAISHIN_CUDA_GRAPHS"

Recorder = Callable[[str, np.ndarray], None]


class Qwen3:
    """A Qwen3 model on one backend, with its tokenizer and KV cache.

    Attributes: ``config`` (:class:`~hiraishin.model.config.Qwen3Config`), ``tokenizer``,
    ``backend``, ``weights``, ``cache`` (the KV cache), ``n_ctx``, ``path``, ``name``.
    """

    def __init__(self, gguf, backend: Backend, n_ctx: int = DEFAULT_N_CTX, progress: bool = True,
                 cuda_graphs: bool | None = None):
        from .tokenizer import Tokenizer

        cfg = gguf.config
        if n_ctx < 1:
            raise HiraishinError(f"n_ctx must be >= 1, got {n_ctx}")
        self.config = cfg
        self.path = Path(getattr(gguf, "path", "model.gguf"))
        self.name = self.path.name
        self.backend = backend
        self.n_ctx = int(n_ctx)
        self.weights = load_weights(gguf, backend, progress=progress)
        self.tokenizer = Tokenizer.from_gguf(gguf) if getattr(gguf, "tokens", None) else None
        cos, sin = rope_tables(self.n_ctx, cfg.head_dim, cfg.rope_base)
        self.rope_cos, self.rope_sin = backend.to_device(cos), backend.to_device(sin)
        self.cache = backend.kv_cache(cfg.n_layer, self.n_ctx, cfg.n_head_kv, cfg.head_dim)
        self._pass_buffers: dict[int, dict] = {}  # T -> activation buffers (see _buffers)
        if cuda_graphs is None:
            cuda_graphs = os.environ.get(CUDA_GRAPHS_ENV, "") == "1"
        self._graphs = _DecodeGraphs(self) if cuda_graphs and backend.name == "cuda" else None

    @classmethod
    def from_gguf(cls, path, device: str | Backend = "auto", n_ctx: int = DEFAULT_N_CTX,
                  progress: bool = True, profile=None, cuda_graphs: bool | None = None) -> "Qwen3":
        """Load a Qwen3 GGUF (Q4_K / Q6_K / Q8_0 matrices, F32 norms) onto a backend.

        ``device``: ``"cuda"``, ``"cpu"`` (the Numba emulators) or ``"auto"``; ``n_ctx``: KV cache
        cells; ``profile``: the device profile plans are made for (see ``hiraishin.devices``).
        ``cuda_graphs`` (experimental, CUDA only): replay one-token passes from CUDA graphs
        (see :class:`_DecodeGraphs`); ``None``: on when ``$HIRAISHIN_CUDA_GRAPHS`` is ``1``.
        """
        from .gguf_file import open_qwen3_gguf

        gguf = open_qwen3_gguf(path)
        return cls(gguf, get_backend(device, profile), n_ctx=n_ctx, progress=progress, cuda_graphs=cuda_graphs)

    @property
    def cuda_graphs(self) -> bool:
        """Whether one-token passes replay CUDA graphs (experimental; see :class:`_DecodeGraphs`)."""
        return self._graphs is not None

    @cuda_graphs.setter
    def cuda_graphs(self, on: bool) -> None:
        if on and self._graphs is None:
            if self.backend.name != "cuda":
                raise HiraishinError(f"CUDA graphs need the cuda backend, not {self.backend.name!r}")
            self._graphs = _DecodeGraphs(self)
        elif not on:
            self._graphs = None

    # ---- KV cache -------------------------------------------------------------------------------
    @property
    def kv_len(self) -> int:
        """KV cells filled (the position the next pass starts at when continuing)."""
        return int(self.cache.length)

    def reset(self) -> None:
        """Empty the KV cache."""
        self.cache.reset()

    def rollback(self, pos: int) -> None:
        """Forget KV cells ``pos`` and after."""
        self.cache.rollback(pos)

    # ---- forward --------------------------------------------------------------------------------
    def forward(self, tokens, start_pos: int, order: ReductionOrder = ReductionOrder.BATCH_INVARIANT,
                record: Mapping | Recorder | None = None) -> np.ndarray:
        """Run ``tokens`` at positions ``start_pos..`` and return logits float32 (T, n_vocab) (numpy).

        Writes the tokens' K/V into the cache (cells from ``start_pos``; a ``start_pos`` below the
        cache length overwrites, i.e. rolls back first) and commits it. ``order`` sets the
        reduction order of every kernel in the pass. ``record`` (a dict, or a callable
        ``(name, array)``) receives a host copy of every intermediate tensor, named like
        ``"blk.3.ffn_down"``, first axis = token.
        """
        cfg, W = self.config, self.weights
        # inputs of every op below are right by construction (weights checked at load, activations
        # made by the kernels): the ops without per-call checks
        be = getattr(self.backend, "unchecked", self.backend)
        start_pos = int(start_pos)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = tokens.size
        if T < 1:
            raise HiraishinError("forward needs at least one token")
        if not 0 <= start_pos <= self.kv_len:
            raise HiraishinError(f"forward at start_pos {start_pos}, but the KV cache holds {self.kv_len} cells "
                                 "(a pass may continue or overwrite the cache, not leave a gap)")
        if start_pos + T > self.n_ctx:
            raise HiraishinError(f"positions {start_pos}..{start_pos + T - 1} exceed n_ctx {self.n_ctx}")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise HiraishinError(f"token ids must be in [0, {cfg.n_vocab}), got {tokens.min()}..{tokens.max()}")
        if start_pos < self.kv_len:
            self.cache.rollback(start_pos)
        if T == 1 and record is None and self._graphs is not None:
            logits = self._graphs.step(int(tokens[0]), start_pos, order)
            if logits is not None:
                self.cache.commit(start_pos + 1)
                return logits
        rec = _recorder(record, self.backend)

        ids = tokens.astype(np.int32)
        pos = be.positions(start_pos, T)  # int32 (T,) on the backend
        buf = self._buffers(T)
        x = be.get_rows(W.token_embd.data, W.token_embd.qtype, ids)  # (T, n_embd)
        rec("token_embd", x)
        for il, layer in enumerate(W.layers):
            x = self._layer(il, layer, x, pos, start_pos, order, rec, buf)  # (T, n_embd)
        h = be.rms_norm(x, W.output_norm.data, cfg.rms_eps, out=buf.get("h"))  # (T, n_embd)
        rec("output_norm", h)
        logits = be.mul_mat(W.output.data, W.output.qtype, h, order)  # (T, n_vocab)
        rec("output", logits)
        self.cache.commit(start_pos + T)
        return be.to_host(logits)

    def _buffers(self, T: int) -> dict:
        """Activation buffers the ops of a ``T``-token pass write into (empty: let the ops allocate).

        Kept for passes of at most :data:`BUFFER_MAX_TOKENS` tokens on a backend that writes into
        given buffers (CUDA): a decode step then allocates nothing. One set per model and width,
        reused by every layer; which op writes which buffer is laid out in :meth:`_pre_attention`
        and :meth:`_post_attention` so that no op's output overlaps its inputs or a value still
        needed.
        """
        be = self.backend
        if not getattr(be, "writes_out", False) or T > BUFFER_MAX_TOKENS:
            return {}
        buf = self._pass_buffers.get(T)
        if buf is None:
            c = self.config
            qd, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
            shapes = {"h": (T, c.n_embd), "q": (T, qd), "k": (T, kvd), "v": (T, kvd),
                      "q_norm": (T * c.n_head, c.head_dim), "k_norm": (T * c.n_head_kv, c.head_dim),
                      "q_rope": (T, c.n_head, c.head_dim), "k_rope": (T, c.n_head_kv, c.head_dim),
                      "attn": (T, c.n_head, c.head_dim), "attn_output": (T, c.n_embd),
                      "ffn_inp": (T, c.n_embd), "ffn_gate": (T, c.n_ff), "ffn_up": (T, c.n_ff),
                      "ffn_swiglu": (T, c.n_ff), "ffn_down": (T, c.n_embd), "l_out": (T, c.n_embd)}
            buf = self._pass_buffers[T] = {name: be.xp.empty(shape, np.float32) for name, shape in shapes.items()}
        return buf

    def _layer(self, il: int, L: LayerWeights, x, pos, start_pos: int, order, rec, buf):
        be = getattr(self.backend, "unchecked", self.backend)
        T = x.shape[0]
        q, k, v = self._pre_attention(il, L, x, pos, order, rec, buf)
        be.write_kv(self.cache, il, start_pos, k, v)                               # f16 cells start_pos..+T-1
        a = be.attention(q, self.cache.k(il), self.cache.v(il), pos, start_pos + T, order, out=buf.get("attn"))
        return self._post_attention(il, L, a, x, order, rec, buf)

    # A layer in two halves around the KV-cache write and the attention (the only ops whose
    # arguments change with the position: a decode-step CUDA graph captures the halves).
    # Buffers: x is the previous layer's "l_out" (or the embedding); "h" is free again once
    # Q/K/V are made, "l_out" once "ffn_inp" is made.
    def _pre_attention(self, il: int, L: LayerWeights, x, pos, order, rec, buf):
        """RMSNorm, Q/K/V, per-head norms, RoPE -> (q (T, H, D), k (T, Hkv, D), v (T, Hkv, D))."""
        cfg, be = self.config, getattr(self.backend, "unchecked", self.backend)
        T, D, H, Hkv, eps = x.shape[0], cfg.head_dim, cfg.n_head, cfg.n_head_kv, cfg.rms_eps
        b = buf.get  # b(name): the buffer an op writes (None: the op allocates)
        r = _layer_recorder(rec, il)
        h = r("attn_norm", be.rms_norm(x, L.attn_norm.data, eps, out=b("h")))     # (T, n_embd)
        q, k, v = be.mul_mats(((L.attn_q.data, L.attn_q.qtype), (L.attn_k.data, L.attn_k.qtype),
                               (L.attn_v.data, L.attn_v.qtype)), h, order, (b("q"), b("k"), b("v")))
        q = r("attn_q", q).reshape(T * H, D)                                       # (T*H, D)
        k = r("attn_k", k).reshape(T * Hkv, D)                                     # (T*Hkv, D)
        v = r("attn_v", v).reshape(T, Hkv, D)                                      # (T, Hkv, D)
        q = r("attn_q_norm", be.rms_norm(q, L.attn_q_norm.data, eps, out=b("q_norm")).reshape(T, H, D))
        k = r("attn_k_norm", be.rms_norm(k, L.attn_k_norm.data, eps, out=b("k_norm")).reshape(T, Hkv, D))
        q = r("attn_q_rope", be.rope(q, pos, self.rope_cos, self.rope_sin, out=b("q_rope")))  # (T, H, D)
        k = r("attn_k_rope", be.rope(k, pos, self.rope_cos, self.rope_sin, out=b("k_rope")))  # (T, Hkv, D)
        return q, k, v

    def _post_attention(self, il: int, L: LayerWeights, a, x, order, rec, buf):
        """Output projection, residual, feed-forward, residual -> the layer's output (T, n_embd)."""
        cfg, be = self.config, getattr(self.backend, "unchecked", self.backend)
        T = x.shape[0]
        b = buf.get
        r = _layer_recorder(rec, il)
        a = r("attn", a).reshape(T, cfg.n_head * cfg.head_dim)                    # (T, H*D)
        o = r("attn_output", be.mul_mat(L.attn_output.data, L.attn_output.qtype, a, order,
                                        out=b("attn_output")))                     # (T, n_embd)
        x = r("ffn_inp", be.add(o, x, out=b("ffn_inp")))                           # residual
        h = r("ffn_norm", be.rms_norm(x, L.ffn_norm.data, cfg.rms_eps, out=b("h")))  # (T, n_embd)
        g, u = be.mul_mats(((L.ffn_gate.data, L.ffn_gate.qtype), (L.ffn_up.data, L.ffn_up.qtype)), h, order,
                           (b("ffn_gate"), b("ffn_up")))
        g, u = r("ffn_gate", g), r("ffn_up", u)                                    # (T, n_ff)
        m = r("ffn_swiglu", be.swiglu(g, u, out=b("ffn_swiglu")))                  # (T, n_ff)
        d = r("ffn_down", be.mul_mat(L.ffn_down.data, L.ffn_down.qtype, m, order,
                                     out=b("ffn_down")))                           # (T, n_embd)
        return r("l_out", be.add(d, x, out=b("l_out")))                            # residual

    # ---- generation -----------------------------------------------------------------------------
    def generate(self, prompt_or_tokens, max_new_tokens: int = 64,
                 order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, stop_at_eos: bool = True,
                 on_token=None, top_k: int = 5, progress: bool = False, chat: bool = False):
        """Greedy decoding; see :func:`hiraishin.decode.greedy.generate`."""
        from ..decode.greedy import generate

        return generate(self, prompt_or_tokens, max_new_tokens=max_new_tokens, order=order,
                        stop_at_eos=stop_at_eos, on_token=on_token, top_k=top_k, progress=progress, chat=chat)

    def stream(self, prompt_or_tokens, max_new_tokens: int = 64,
               order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, stop_at_eos: bool = True,
               top_k: int = 5, chat: bool = False):
        """Greedy decoding as an iterator of :class:`~hiraishin.decode.greedy.Step`."""
        from ..decode.greedy import stream

        return stream(self, prompt_or_tokens, max_new_tokens=max_new_tokens, order=order,
                      stop_at_eos=stop_at_eos, top_k=top_k, chat=chat)

    def generate_speculative(self, prompt, draft="self", n_draft: int = 8,
                             order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, **kwargs):
        """Greedy speculative decoding with ``draft`` (a model, or ``"self"``); see
        :func:`hiraishin.decode.speculative.generate_speculative`."""
        from ..decode.speculative import generate_speculative

        return generate_speculative(self, prompt, draft, n_draft=n_draft, order=order, **kwargs)

    def replay(self, tokens, batch_sizes=(2, 3, 5, 9, 16),
               order: ReductionOrder = ReductionOrder.BATCH_VARIANT, **kwargs):
        """Push ``tokens`` back through in batches and compare with one-at-a-time logits; see
        :func:`hiraishin.decode.replay.replay`."""
        from ..decode.replay import replay

        return replay(self, tokens, batch_sizes, order=order, **kwargs)

    def __repr__(self) -> str:
        c = self.config
        return (f"Qwen3({self.name!r}, backend={self.backend.name}, n_layer={c.n_layer}, n_embd={c.n_embd}, "
                f"n_vocab={c.n_vocab}, n_ctx={self.n_ctx})")


def _no_record(name, a) -> None:
    pass


def _layer_recorder(rec, il: int):
    """``r(op, a)``: record ``a`` as ``"blk.<il>.<op>"`` and return it (no name built when not recording)."""
    if rec is _no_record:
        return _pass_through

    def r(op, a):
        rec(f"blk.{il}.{op}", a)
        return a

    return r


def _pass_through(op, a):
    return a


def _recorder(record, backend) -> Recorder:
    """A ``rec(name, array)`` that stores host copies into ``record`` (or does nothing)."""
    if record is None:
        return _no_record
    if callable(record) and not isinstance(record, Mapping):
        return lambda name, a: record(name, np.array(backend.to_host(a)))

    def store(name, a):
        record[name] = np.array(backend.to_host(a))

    return store


class _DecodeGraphs:
    """One-token forward passes replayed from CUDA graphs (experimental; opt-in).

    A decode step is ``n_layer + 1`` segments of fixed launches (everything between two
    attentions: output projection, feed-forward, next layer's norms, Q/K/V and RoPE) separated by
    the two ops whose arguments change with the position: the KV-cache store and the attention
    (its KV length and plan). The segments are captured once per order into CUDA graphs and
    replayed; the KV stores and attentions are launched as usual between them. The position and
    the token id live in device buffers (filled before the replay), and every segment reads and
    writes the model's fixed one-token activation buffers, so a replay runs exactly the launches
    of the plain pass (same kernels, arguments, order): the same bits.

    Per order the first step runs the segments without capturing (kernels compiled, launches
    prepared, scratch allocated), the second captures them, later steps replay. Everything runs
    on one stream of its own (capture needs a non-default stream), synchronized by the logits
    copy at the end like a plain pass. If a capture fails, that order falls back to plain passes
    with a warning.
    """

    def __init__(self, model: Qwen3):
        be = model.backend
        cp = be.xp
        c = model.config
        self.model = model
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pos = cp.zeros((1,), np.int32)
        self.ids = cp.zeros((1,), np.int32)
        self.embd = cp.empty((1, c.n_embd), np.float32)
        self.logits = cp.empty((1, c.n_vocab), np.float32)
        self._state: dict = {}  # id(order) -> (order, "warm" | list of graphs | None when capture failed)

    def step(self, token: int, start_pos: int, order) -> np.ndarray | None:
        """Logits (1, n_vocab) of ``token`` at ``start_pos`` (the cache is not committed), or None
        when this order has no graphs (capture failed): run a plain pass instead."""
        from ..kernels.elementwise import launch_get_rows

        key = id(order)
        hit = self._state.get(key)
        state = hit[1] if hit is not None and hit[0] is order else "cold"
        if state is None:
            return None
        m = self.model
        be = m.backend.unchecked
        W = m.weights
        with self.stream:
            self.pos.fill(start_pos)
            self.ids.fill(token)
            launch_get_rows(W.token_embd.data, W.token_embd.qtype, self.ids, self.embd)
            if state == "cold":
                self._run(order, start_pos, None)
                self._state[key] = (order, "warm")
            elif state == "warm":
                graphs = []
                try:
                    self._run(order, start_pos, graphs)
                except Exception as exc:  # noqa: BLE001 - any capture failure: plain passes for this order
                    self._abandon_capture()
                    self._state[key] = (order, None)
                    warnings.warn(f"CUDA-graph capture of the decode step failed under {order.name} "
                                  f"({type(exc).__name__}: {exc}); using plain passes", RuntimeWarning, stacklevel=3)
                    return None
                self._state[key] = (order, graphs)
            else:
                for il in range(m.config.n_layer):
                    state[il].launch(self.stream)
                    self._attention(il, start_pos, order)
                state[-1].launch(self.stream)
            return be.to_host(self.logits)

    def _segment(self, i: int, order) -> None:
        """Segment ``i``: layer ``i-1``'s post-attention half (i > 0), then layer ``i``'s
        pre-attention half (i < n_layer) or the output norm and projection (i == n_layer)."""
        m = self.model
        layers, buf = m.weights.layers, m._buffers(1)
        if i > 0:
            m._post_attention(i - 1, layers[i - 1], buf["attn"], self._x(i - 1), order, _no_record, buf)
        if i < len(layers):
            m._pre_attention(i, layers[i], self._x(i), self.pos, order, _no_record, buf)
        else:
            be, W = m.backend.unchecked, m.weights
            h = be.rms_norm(buf["l_out"], W.output_norm.data, m.config.rms_eps, out=buf["h"])
            be.mul_mat(W.output.data, W.output.qtype, h, order, out=self.logits)

    def _x(self, il: int):
        """Input of layer ``il``: the embedding, or the previous layer's output buffer."""
        return self.embd if il == 0 else self.model._buffers(1)["l_out"]

    def _attention(self, il: int, start_pos: int, order) -> None:
        m = self.model
        be, buf = m.backend.unchecked, m._buffers(1)
        be.write_kv(m.cache, il, start_pos, buf["k_rope"], buf["v"].reshape(1, m.config.n_head_kv, -1))
        be.attention(buf["q_rope"], m.cache.k(il), m.cache.v(il), self.pos, start_pos + 1, order, out=buf["attn"])

    def _run(self, order, start_pos: int, graphs: list | None) -> None:
        """Run the step segment by segment; with ``graphs`` (a list), capture each segment into a
        graph appended to it and launch that graph."""
        n_layer = self.model.config.n_layer
        for i in range(n_layer + 1):
            if graphs is None:
                self._segment(i, order)
            else:
                self.stream.synchronize()  # capture begins on an idle stream
                self.stream.begin_capture()
                try:
                    self._segment(i, order)
                finally:
                    graph = self.stream.end_capture()
                graphs.append(graph)
                graph.launch(self.stream)
            if i < n_layer:
                self._attention(i, start_pos, order)

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
