"""Qwen3 forward pass over GGUF weights, written once against a :class:`~hiraishin.backends.Backend`.

>>> model = Qwen3.from_gguf("Qwen3-0.6B-Q4_K_M.gguf", device="cpu")
>>> logits = model.forward(model.tokenizer.encode("Hello"), start_pos=0)   # (T, n_vocab) float32
>>> model.forward_argmax([model.tokenizer.encode("!")[0]], start_pos=model.kv_len)  # greedy ids, (T,)
>>> model.generate("Hello", max_new_tokens=16).text

Graph order per layer (reference section 8.3, llama.cpp src/models/qwen3.cpp): RMSNorm, Q/K/V
mat-muls, per-head Q/K RMSNorm, NEOX RoPE, KV-cache write, attention, output mat-mul, residual,
RMSNorm, gate/up mat-muls, SwiGLU, down mat-mul, residual. One
:class:`~hiraishin.order.ReductionOrder` applies to every kernel of a pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..backends import Backend, get_backend
from ..errors import HiraishinError
from ..kernels.rope import rope_tables
from ..order import ReductionOrder
from ..switches import env_flag
from .chains import ChainMethods, ChainTokens
from .l2_ahead import l2_ahead_from_env
from .weights import check_memory_fits, is_out_of_memory, load_weights, release_cached_memory

__all__ = ["Qwen3", "ChainTokens", "DEFAULT_N_CTX"]

DEFAULT_N_CTX = 4096
# Passes of at most this many tokens (decode steps, speculative verify batches of up to 16) reuse
# activation buffers on backends that write into given buffers, and replay CUDA graphs; wider
# passes (prompt prefill) allocate and launch eagerly.
BUFFER_MAX_TOKENS = 16
# "0" turns the CUDA-graph replay of passes off for models loaded without an explicit
# ``cuda_graphs`` argument (it is on by default on CUDA).
CUDA_GRAPHS_ENV = "HIRAISHIN_CUDA_GRAPHS"

Recorder = Callable[[str, np.ndarray], None]


class Qwen3(ChainMethods):
    """A Qwen3 model on one backend, with its tokenizer and KV cache.

    Attributes: ``config`` (:class:`~hiraishin.model.config.Qwen3Config`), ``tokenizer``,
    ``backend``, ``weights``, ``cache`` (the KV cache), ``n_ctx``, ``path``, ``name``.
    """

    def __init__(self, gguf, backend: Backend, n_ctx: int = DEFAULT_N_CTX, progress: bool = True,
                 cuda_graphs: bool | None = None, weight_layout: str = "rows"):
        from .tokenizer import Tokenizer

        cfg = gguf.config
        if n_ctx < 1:
            raise HiraishinError(f"n_ctx must be >= 1, got {n_ctx}")
        self.config = cfg
        self.path = Path(getattr(gguf, "path", "model.gguf"))
        self.name = self.path.name
        self.backend = backend
        self.n_ctx = int(n_ctx)
        # RoPE tables: cos and sin, float32 (n_ctx, head_dim/2) each
        rope_bytes = 2 * self.n_ctx * (cfg.head_dim // 2) * 4
        check_memory_fits(gguf, backend, self.n_ctx, extra_bytes=rope_bytes)  # before anything is allocated
        self.weights = load_weights(gguf, backend, progress=progress)
        self.tokenizer = Tokenizer.from_gguf(gguf) if getattr(gguf, "tokens", None) else None
        try:
            cos, sin = rope_tables(self.n_ctx, cfg.head_dim, cfg.rope_base)
            self.rope_cos, self.rope_sin = backend.to_device(cos), backend.to_device(sin)
            self.cache = backend.kv_cache(cfg.n_layer, self.n_ctx, cfg.n_head_kv, cfg.head_dim)
        except Exception as exc:  # noqa: BLE001 - out of memory past the check: release, then say so
            if not is_out_of_memory(exc) and not isinstance(exc, HiraishinError):
                raise
            self.weights = self.rope_cos = self.rope_sin = None  # what this model holds goes back to the pool
            release_cached_memory(backend)
            raise
        # inputs of every op of a pass are right by construction (weights checked at load,
        # activations made by the kernels): the forward runs the backend's unchecked ops
        self.ops = backend.ops
        self._pass_buffers: dict[int, dict] = {}  # T -> activation buffers (see pass_buffers)
        if cuda_graphs is None:
            cuda_graphs = env_flag(CUDA_GRAPHS_ENV, True, "CUDA graphs")
        self._graphs = None
        self._weight_layout = "rows"
        self.set_weight_layout(weight_layout)
        self.cuda_graphs = bool(cuda_graphs) and backend.name == "cuda"

    @classmethod
    def from_gguf(cls, path, device: str | Backend = "auto", n_ctx: int = DEFAULT_N_CTX,
                  progress: bool = True, profile=None, cuda_graphs: bool | None = None,
                  weight_layout: str = "rows") -> "Qwen3":
        """Load a Qwen3 GGUF (Q4_K / Q6_K / Q8_0 matrices, F32 norms) onto a backend.

        ``device``: ``"cuda"``, ``"cpu"`` (the Numba emulators) or ``"auto"``; ``n_ctx``: KV cache
        cells; ``profile``: the device profile plans are made for (see ``hiraishin.devices``).
        ``cuda_graphs`` (CUDA only): replay passes of up to ``BUFFER_MAX_TOKENS`` tokens from CUDA
        graphs (:class:`hiraishin.backends.graphs.PassGraphs`; the same launches, the same bits);
        ``None``: on unless ``$HIRAISHIN_CUDA_GRAPHS`` is off (``0``, ``false``, ``no``, ``off``; another value
        is an error). ``weight_layout``: ``"rows"`` (ggml's, every order reads them) or ``"tiles"`` (CUDA; the
        projections as 16-row tile records, which only SUBBLOCK reads: :meth:`set_weight_layout`).
        """
        from .gguf_file import open_qwen3_gguf

        gguf = open_qwen3_gguf(path)
        return cls(gguf, get_backend(device, profile), n_ctx=n_ctx, progress=progress, cuda_graphs=cuda_graphs,
                   weight_layout=weight_layout)

    # ---- weight layout --------------------------------------------------------------------------
    @property
    def weight_layout(self) -> str:
        """How the projections lie on the device: ``"rows"`` (ggml's) or ``"tiles"`` (:meth:`set_weight_layout`)."""
        return self._weight_layout

    def set_weight_layout(self, layout: str) -> None:
        """Lay the projections out as ``layout``, in place on the device, between passes.

        ``"rows"``: ggml's rows, read by every order. ``"tiles"`` (CUDA only): the Q4_K layer projections (and, under
        ``HIRAISHIN_MMQ_WTILE_Q6K=1``, the Q6_K ones and the output head) as 16-row tile records
        (:mod:`hiraishin.kernels.mmq.wtile`), whose loads a warp of the sub-block kernels reads contiguously: faster
        SUBBLOCK passes, the same bits; another order's pass of a model in tiles is refused. The same bytes move, so
        memory does not grow (one tensor's worth, briefly). Captured CUDA graphs are dropped when bytes move (they
        would read the old layout) and are captured anew.
        """
        from ..kernels.mmq.wtile import WEIGHT_LAYOUTS

        if layout not in WEIGHT_LAYOUTS:
            raise HiraishinError(f"weight_layout must be one of {', '.join(map(repr, WEIGHT_LAYOUTS))}, got {layout!r}")
        if layout == self._weight_layout:
            return
        self.backend.synchronize()  # (passes already queued read the old layout)
        moved = False
        for w in self.weights._all():
            moved |= self.backend.relayout_weight(w.data, w.name, w.qtype, w.shape, layout == "tiles")
        self.backend.synchronize()
        self._weight_layout = layout
        if moved and self._graphs is not None:
            self._graphs = None
            self.cuda_graphs = True

    def weight_layout_for(self, order: ReductionOrder) -> str:
        """The layout ``order``'s passes read fastest here: ``"tiles"`` for SUBBLOCK on CUDA (unless
        ``HIRAISHIN_MMQ_WTILE=0``; :data:`hiraishin.kernels.mmq.wtile.SUBBLOCK_TILES` has the measurement), else
        ``"rows"``."""
        from ..kernels.mmq.wtile import subblock_prefers_tiles

        if self.backend.name == "cuda" and order.matvec == "subblock" and subblock_prefers_tiles():
            return "tiles"
        return "rows"

    def use_weight_layout_for(self, order: ReductionOrder) -> str:
        """:meth:`set_weight_layout` to :meth:`weight_layout_for` ``order``; returns the layout."""
        layout = self.weight_layout_for(order)
        self.set_weight_layout(layout)
        return layout

    @property
    def cuda_graphs(self) -> bool:
        """Whether passes of up to ``BUFFER_MAX_TOKENS`` tokens replay CUDA graphs (CUDA only)."""
        return self._graphs is not None

    @cuda_graphs.setter
    def cuda_graphs(self, on: bool) -> None:
        if on and self._graphs is None:
            if self.backend.name != "cuda":
                raise HiraishinError(f"CUDA graphs need the cuda backend, not {self.backend.name!r}")
            from ..backends.graphs import PassGraphs

            self._graphs = PassGraphs(self, BUFFER_MAX_TOKENS)
        elif not on:
            self._graphs = None

    @property
    def pass_graphs(self):
        """The :class:`~hiraishin.backends.graphs.PassGraphs` replaying this model's passes (its ``captures``
        count, ``graph_count()``), or None."""
        return self._graphs

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
        ``"blk.3.ffn_down"``, first axis = token (such passes never replay a CUDA graph).
        """
        return self._forward(tokens, start_pos, order, record, "logits")

    def forward_argmax(self, tokens, start_pos: int,
                       order: ReductionOrder = ReductionOrder.BATCH_INVARIANT) -> np.ndarray:
        """:meth:`forward`, returning only each position's greedy token: int64 (T,), the argmax of
        its logits (first index of the largest; numpy's rule), computed on the device, so the
        logits (600 KB per token for Qwen3's vocabulary) never travel to the host. The same pass,
        hence the same tokens as ``forward(...).argmax(axis=1)``."""
        return self._forward(tokens, start_pos, order, None, "argmax").astype(np.int64)


    def _forward(self, tokens, start_pos: int, order, record, want: str) -> np.ndarray:
        if not isinstance(order, ReductionOrder):
            raise HiraishinError(f"order must be a ReductionOrder (e.g. ReductionOrder.BATCH_INVARIANT), "
                                 f"got {type(order).__name__}")
        tokens = self._check_tokens(tokens)
        start_pos = self._check_start(start_pos, tokens.size)
        T = tokens.size
        if start_pos < self.kv_len:
            self.cache.rollback(start_pos)
        if record is None and self._graphs is not None and T <= self._graphs.max_tokens:
            out = self._graphs.run(tokens.astype(np.int32), start_pos, order, want)
            if out is not None:
                self.cache.commit(start_pos + T)
                return out
        ids = self.backend.to_device(tokens.astype(np.int32))                      # int32 (T,)
        pos = self.ops.positions(start_pos, T)                                      # int32 (T,)
        # record=None runs the fused pass (what a graph captures); a recording pass runs the unfused ops
        rec = None if record is None else _recorder(record, self.backend)
        buf = self.pass_buffers(T)
        logits = self.run_pass(ids, pos, start_pos, order, buf, rec)
        self.cache.commit(start_pos + T)
        if want == "argmax":
            return self.backend.to_host(buf["argmax"] if "argmax" in buf else self.ops.argmax_rows(logits))
        return self.backend.to_host(logits)

    def run_pass(self, ids, pos, start_pos: int, order, buf: dict, rec=None):
        """One pass on the backend: token ids and positions (T,) int32 arrays of the backend ->
        logits (T, n_vocab) of the backend (``buf["logits"]`` when given). Writes the cache cells
        ``pos``; does not commit them (see :meth:`forward`). What a CUDA graph of the pass captures."""
        if rec is None:
            return self._fused_pass(ids, pos, start_pos, order, buf)
        x = self.embed(ids, out=buf.get("embd"))                                    # (T, n_embd)
        rec("token_embd", x)
        for il in range(self.config.n_layer):
            q, k, v = self.attention_inputs(il, x, pos, order, buf, rec)
            a = self.attend(il, q, k, v, pos, start_pos, order, buf)
            x = self.layer_output(il, a, x, order, buf, rec)                        # (T, n_embd)
        return self.head(x, order, buf, rec)                                        # (T, n_vocab)

    def _check_tokens(self, tokens) -> np.ndarray:
        """Token ids as int64 (T,), each in ``[0, n_vocab)``; a :class:`HiraishinError` otherwise."""
        if isinstance(tokens, (str, bytes, bytearray)):
            raise HiraishinError(f"forward takes token ids, not {type(tokens).__name__}; encode text with "
                                 "model.tokenizer.encode first")
        if isinstance(tokens, list) and tokens and all(type(t) is int for t in tokens):
            ids = np.asarray(tokens)  # the common case (a decoding loop's ids), without the object path
            if ids.dtype.kind not in "iu":  # beyond 64 bits: numpy made objects
                ids = np.array(tokens, dtype=object)
        elif isinstance(tokens, np.ndarray) and tokens.dtype.kind in "iu":
            ids = tokens.reshape(-1)
        else:  # Python ints of any size (2**63 must be an error, not an OverflowError)
            flat = np.asarray(tokens, dtype=object).reshape(-1)
            if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in flat):
                raise HiraishinError(f"token ids must be integers, got {tokens!r:.80}")
            ids = np.array([int(t) for t in flat], dtype=object)
        if ids.size < 1:
            raise HiraishinError("forward needs at least one token")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.n_vocab:
            raise HiraishinError(f"token ids must be in [0, {self.config.n_vocab}), got {lo}..{hi}")
        return ids.astype(np.int64)

    def _check_start(self, start_pos, T: int) -> int:
        if isinstance(start_pos, bool) or int(start_pos) != start_pos:
            raise HiraishinError(f"start_pos must be an integer, got {start_pos!r}")
        start_pos = int(start_pos)
        if not 0 <= start_pos <= self.kv_len:
            raise HiraishinError(f"forward at start_pos {start_pos}, but the KV cache holds {self.kv_len} cells "
                                 "(a pass may continue or overwrite the cache, not leave a gap)")
        if start_pos + T > self.n_ctx:
            raise HiraishinError(f"positions {start_pos}..{start_pos + T - 1} exceed n_ctx {self.n_ctx}")
        return start_pos

    def pass_buffers(self, T: int) -> dict:
        """Activation buffers the ops of a ``T``-token pass write into (empty: let the ops allocate).

        Kept for passes of at most :data:`BUFFER_MAX_TOKENS` tokens on a backend that writes into
        given buffers (CUDA): a decode step or verify pass then allocates nothing, and a CUDA graph
        of the pass reads and writes fixed addresses. One set per width, reused by every layer;
        which op writes which buffer is laid out in :meth:`attention_inputs` and
        :meth:`layer_output` so that no op's output overlaps its inputs or a value still needed.
        """
        if not self.backend.writes_out or T > BUFFER_MAX_TOKENS:
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
                      "ffn_swiglu": (T, c.n_ff), "ffn_down": (T, c.n_embd), "l_out": (T, c.n_embd),
                      "embd": (T, c.n_embd), "logits": (T, c.n_vocab)}
            xp = self.backend.xp
            buf = self._pass_buffers[T] = {name: xp.empty(shape, np.float32) for name, shape in shapes.items()}
            buf["argmax"] = xp.empty((T,), np.int32)  # the greedy token of each position
        return buf

    def _fused_pass(self, ids, pos, start_pos: int, order, buf: dict):
        """The embedding, layers and head with the fused ops: the same float operations in the same order
        as the segments below (which a recording pass runs, to see every intermediate), fewer launches.

        Per layer: [residual + RMSNorm + q8_1] Q/K/V (the first layer: [embedding + RMSNorm + q8_1], one
        launch where the backend fuses them), [q/k norms + RoPE + KV store], attention with
        [combine + q8_1] the output projection (the first two in one launch where the backend fuses them), [residual + RMSNorm + q8_1] gate/up, [SwiGLU + q8_1]
        down; the layer's last residual add is fused into the next layer's (or the head's) norm.
        """
        cfg, ops, W = self.config, self.ops, self.weights
        T, eps, b = ids.size, cfg.rms_eps, buf.get
        carry = None  # (ffn_down, ffn_inp) of the previous layer: its output is their sum
        ahead = l2_ahead_from_env()  # L2 prefetches beside the pass (cache hints: no bit changes)
        for il, L in enumerate(W.layers):
            qkv = ((L.attn_q.data, L.attn_q.qtype), (L.attn_k.data, L.attn_k.qtype), (L.attn_v.data, L.attn_v.qtype))
            if carry is None:
                (q, k, v), x = ops.embed_norm_matvecs(W.token_embd.data, W.token_embd.qtype, ids, L.attn_norm.data,
                                                      eps, qkv, order, (b("q"), b("k"), b("v")), out_rows=b("embd"))
            else:
                (q, k, v), x = ops.norm_matvecs(carry[0], L.attn_norm.data, eps, qkv, order, (b("q"), b("k"), b("v")),
                                                residual=carry[1], out_sum=b("l_out"))
            if ahead:
                ops.l2_ahead(ahead.after_qkv(L), ahead.bulk)
            o = ops.rope_attention_matvec(q.reshape(T, cfg.n_head, cfg.head_dim), k.reshape(T, cfg.n_head_kv, cfg.head_dim),
                                          v.reshape(T, cfg.n_head_kv, cfg.head_dim), L.attn_q_norm.data,
                                          L.attn_k_norm.data, eps, pos, self.rope_cos, self.rope_sin, self.cache, il,
                                          start_pos + T, order, (L.attn_output.data, L.attn_output.qtype),
                                          out=b("attn_output"), q_out=b("q_rope"))
            between = None
            if ahead:  # the next weights into L2 while SwiGLU and the down projection run
                nxt = W.layers[il + 1] if il + 1 < len(W.layers) else None
                after = ahead.after_gate_up(L, (W.output.data,) if nxt is None else
                                            (nxt.attn_q.data, nxt.attn_k.data, nxt.attn_v.data))
                between = lambda after=after: ops.l2_ahead(after, ahead.bulk)  # noqa: E731
            d, x = ops.norm_swiglu_matvec(o, L.ffn_norm.data, eps, (L.ffn_gate.data, L.ffn_gate.qtype),
                                          (L.ffn_up.data, L.ffn_up.qtype), (L.ffn_down.data, L.ffn_down.qtype),
                                          order, (b("ffn_gate"), b("ffn_up"), b("ffn_down")), residual=x,
                                          out_sum=b("ffn_inp"), between=between)
            carry = (d, x)
        # each position's greedy token on the device (forward_argmax), with a chain's advance (CUDA graphs: the
        # next one-token pass's inputs and the token log), from the head's launch where the backend can
        argmax = (buf["argmax"], buf.get("advance"), pos) if "argmax" in buf else None
        (logits,), _ = ops.norm_matvecs(carry[0], W.output_norm.data, eps, ((W.output.data, W.output.qtype),), order,
                                        (b("logits"),), residual=carry[1], out_sum=b("l_out"), argmax=argmax)
        if ahead:
            ops.l2_ahead_join()  # the pass ends with its side stream (a graph capture must join it)
        return logits

    # One layer in three segments (the unfused ops; a recording pass runs these). Every op reads the pass's positions from the device array
    # ``pos`` (the KV store writes the cells ``pos``, attention takes the KV length from
    # ``pos[-1] + 1``); only the attention *plan* depends on the host's ``start_pos``, so a CUDA
    # graph of a pass replays unchanged at any position with the same plan.
    # Buffers: x is the previous layer's "l_out" (or the embedding); "h" is free again once
    # Q/K/V are made, "l_out" once "ffn_inp" is made.
    def attention_inputs(self, il: int, x, pos, order, buf: dict, rec=None):
        """RMSNorm, Q/K/V, per-head norms, RoPE of layer ``il`` -> q (T, H, D), k (T, Hkv, D), v (T, Hkv, D)."""
        cfg, ops, L = self.config, self.ops, self.weights.layers[il]
        T, D, H, Hkv, eps = x.shape[0], cfg.head_dim, cfg.n_head, cfg.n_head_kv, cfg.rms_eps
        b = buf.get  # b(name): the buffer an op writes (None: the op allocates)
        r = _layer_recorder(rec, il)
        h = r("attn_norm", ops.rms_norm(x, L.attn_norm.data, eps, out=b("h")))    # (T, n_embd)
        q, k, v = ops.mul_mats(((L.attn_q.data, L.attn_q.qtype), (L.attn_k.data, L.attn_k.qtype),
                                (L.attn_v.data, L.attn_v.qtype)), h, order, (b("q"), b("k"), b("v")))
        q = r("attn_q", q).reshape(T * H, D)                                       # (T*H, D)
        k = r("attn_k", k).reshape(T * Hkv, D)                                     # (T*Hkv, D)
        v = r("attn_v", v).reshape(T, Hkv, D)                                      # (T, Hkv, D)
        q = r("attn_q_norm", ops.rms_norm(q, L.attn_q_norm.data, eps, out=b("q_norm")).reshape(T, H, D))
        k = r("attn_k_norm", ops.rms_norm(k, L.attn_k_norm.data, eps, out=b("k_norm")).reshape(T, Hkv, D))
        q = r("attn_q_rope", ops.rope(q, pos, self.rope_cos, self.rope_sin, out=b("q_rope")))  # (T, H, D)
        k = r("attn_k_rope", ops.rope(k, pos, self.rope_cos, self.rope_sin, out=b("k_rope")))  # (T, Hkv, D)
        return q, k, v

    def attend(self, il: int, q, k, v, pos, start_pos: int, order, buf: dict):
        """Store k, v in layer ``il``'s cache cells ``start_pos..`` and attend -> (T, H, D)."""
        ops = self.ops
        T = q.shape[0]
        ops.store_kv(self.cache, il, pos, k, v)                                   # f16 cells start_pos..+T-1
        return ops.causal_attention(q, self.cache.k(il), self.cache.v(il), pos, start_pos + T, order,
                                    out=buf.get("attn"))

    def layer_output(self, il: int, a, x, order, buf: dict, rec=None):
        """Output projection, residual, feed-forward, residual of layer ``il`` -> (T, n_embd)."""
        cfg, ops, L = self.config, self.ops, self.weights.layers[il]
        T = x.shape[0]
        b = buf.get
        r = _layer_recorder(rec, il)
        a = r("attn", a).reshape(T, cfg.n_head * cfg.head_dim)                    # (T, H*D)
        o = r("attn_output", ops.mul_mat(L.attn_output.data, L.attn_output.qtype, a, order,
                                         out=b("attn_output")))                    # (T, n_embd)
        x = r("ffn_inp", ops.add(o, x, out=b("ffn_inp")))                          # residual
        h = r("ffn_norm", ops.rms_norm(x, L.ffn_norm.data, cfg.rms_eps, out=b("h")))  # (T, n_embd)
        g, u = ops.mul_mats(((L.ffn_gate.data, L.ffn_gate.qtype), (L.ffn_up.data, L.ffn_up.qtype)), h, order,
                            (b("ffn_gate"), b("ffn_up")))
        g, u = r("ffn_gate", g), r("ffn_up", u)                                    # (T, n_ff)
        m = r("ffn_swiglu", ops.swiglu(g, u, out=b("ffn_swiglu")))                 # (T, n_ff)
        d = r("ffn_down", ops.mul_mat(L.ffn_down.data, L.ffn_down.qtype, m, order,
                                      out=b("ffn_down")))                          # (T, n_embd)
        return r("l_out", ops.add(d, x, out=b("l_out")))                           # residual

    def head(self, x, order, buf: dict, rec=None):
        """Output norm and projection -> logits (T, n_vocab) on the backend."""
        W, rec = self.weights, rec or _no_record
        h = self.ops.rms_norm(x, W.output_norm.data, self.config.rms_eps, out=buf.get("h"))  # (T, n_embd)
        rec("output_norm", h)
        logits = self.ops.mul_mat(W.output.data, W.output.qtype, h, order, out=buf.get("logits"))
        rec("output", logits)
        return logits

    def embed(self, ids, out=None):
        """Token embeddings of device ids (T,) int32 -> (T, n_embd)."""
        W = self.weights
        return self.ops.get_rows(W.token_embd.data, W.token_embd.qtype, ids, out=out)

    # ---- generation -----------------------------------------------------------------------------
    # Convenience methods: the decoding functions of hiraishin.decode, which take the model.
    def generate(self, prompt_or_tokens, max_new_tokens: int = 64,
                 order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, **kwargs):
        """Greedy decoding; see :func:`hiraishin.decode.greedy.generate` (``stop_at_eos``,
        ``on_token``, ``top_k``, ``progress``, ``chat``, ``system``, ``think``)."""
        from ..decode.greedy import generate

        return generate(self, prompt_or_tokens, max_new_tokens=max_new_tokens, order=order, **kwargs)

    def stream(self, prompt_or_tokens, max_new_tokens: int = 64,
               order: ReductionOrder = ReductionOrder.BATCH_INVARIANT, **kwargs):
        """Greedy decoding as an iterator of :class:`~hiraishin.decode.greedy.Step`; see
        :func:`hiraishin.decode.greedy.stream`."""
        from ..decode.greedy import stream

        return stream(self, prompt_or_tokens, max_new_tokens=max_new_tokens, order=order, **kwargs)

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
    if rec is None or rec is _no_record:
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
