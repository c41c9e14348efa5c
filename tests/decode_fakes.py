"""A small fake model with the Qwen3 interface, for fast tests of the decode layer.

Its one "attention" op sums the KV cells in an order that depends on the pass:
under a variant order a pass of 5 or more tokens sums them backwards (last-bit
differences, like a changed warp count), and every pass splits the cells into
partial sums whose count comes from the KV length padded to 256 (so a pass
that straddles a 256-cell boundary changes its earlier rows, like the
attention kernel's parallel blocks). ``variant_shift`` adds a visible shift to
variant batched passes, so that argmaxes flip.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from hiraishin.order import ReductionOrder

KV_PAD = 256
CELLS_PER_CHUNK = 32


class FakeTokenizer:
    def __init__(self, n_vocab: int, eos_ids=()):
        self.n_vocab = n_vocab
        self.eos_ids = tuple(eos_ids)

    def encode(self, text: str) -> list[int]:
        return [(ord(c) * 7 + 3) % self.n_vocab for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


class FakeModel:
    backend = "cpu"

    def __init__(self, seed: int = 0, n_vocab: int = 48, dim: int = 16, n_ctx: int = 1024,
                 noise: float = 0.0, noise_seed: int = 1, variant_shift: float = 0.0, eos_ids=(),
                 name: str = "fake"):
        rng = np.random.default_rng(seed)
        self.emb = rng.standard_normal((n_vocab, dim)).astype(np.float32)
        self.out = (rng.standard_normal((dim, n_vocab)) * 3).astype(np.float32)
        self.pos_emb = rng.standard_normal((13, dim)).astype(np.float32)  # keeps outputs from looping
        if noise:
            nrng = np.random.default_rng(noise_seed)
            self.emb += (nrng.standard_normal(self.emb.shape) * noise).astype(np.float32)
            self.out += (nrng.standard_normal(self.out.shape) * noise * 3).astype(np.float32)
        self.variant_shift = np.float32(variant_shift)
        self.kv = np.zeros((n_ctx, dim), dtype=np.float32)
        self.n = 0
        self.n_ctx = n_ctx
        self.config = SimpleNamespace(n_vocab=n_vocab, n_embd=dim, n_layer=1)
        self.tokenizer = FakeTokenizer(n_vocab, eos_ids)
        self.name = name
        self.passes: list[tuple[int, int]] = []  # (start_pos, n_tokens) of every forward
        self.orders: list[str] = []  # the order of every forward (its name)

    # --- the interface ---------------------------------------------------------------------

    def reset(self):
        self.n = 0

    def rollback(self, pos: int):
        if not 0 <= pos <= self.n:
            raise ValueError(f"rollback to {pos} outside 0..{self.n}")
        self.n = pos

    def forward(self, tokens, start_pos, order=ReductionOrder.BATCH_INVARIANT, record=None):
        tokens = [int(t) for t in tokens]
        T = len(tokens)
        if not 0 <= start_pos <= self.n:
            raise ValueError(f"forward at {start_pos} but the cache holds {self.n} cells")
        if start_pos + T > self.n_ctx:
            raise ValueError("past n_ctx")
        self.passes.append((start_pos, T))
        self.orders.append(order.name)
        rec = record if record is not None else {}
        x = self.emb[tokens] + self.pos_emb[np.arange(start_pos, start_pos + T) % len(self.pos_emb)]
        rec["token_embd"] = x.copy()
        self.kv[start_pos:start_pos + T] = x
        rec["blk.0.attn_k"] = x.copy()
        n_kv = -(-(start_pos + T) // KV_PAD) * KV_PAD
        backwards = order.matvec == "variant" and T >= 5
        h = np.stack([self._attend(start_pos + i, n_kv, backwards) for i in range(T)])
        if backwards and self.variant_shift:
            h = h + self.variant_shift * np.sin(np.arange(h.shape[1], dtype=np.float32) + h[:, :1])
        rec["blk.0.attn_out"] = h.copy()
        y = np.tanh(h).astype(np.float32)
        rec["blk.0.ffn_out"] = y.copy()
        logits = np.stack([np.dot(y[i], self.out) for i in range(T)]).astype(np.float32)
        rec["output"] = logits.copy()
        self.n = start_pos + T
        return logits

    def _attend(self, pos, n_kv, backwards):
        n_partial = max(1, n_kv // (4 * CELLS_PER_CHUNK))
        partial = np.zeros((n_partial, self.kv.shape[1]), dtype=np.float32)
        cells = range(pos, -1, -1) if backwards else range(pos + 1)
        for c in cells:
            w = np.float32(1.0) / np.float32(1 + pos - c)
            j = (c // CELLS_PER_CHUNK) % n_partial
            partial[j] = partial[j] + w * self.kv[c]
        total = np.zeros(self.kv.shape[1], dtype=np.float32)
        for j in range(n_partial):
            total = total + partial[j]
        return total

    def generate(self, prompt_or_tokens, max_new_tokens, order=ReductionOrder.BATCH_INVARIANT,
                 stop_at_eos=True):
        """Plain greedy decoding: the prompt in passes cut at the KV boundary, then one token per pass."""
        from hiraishin.decode.replay import feed

        tokens = (self.tokenizer.encode(prompt_or_tokens) if isinstance(prompt_or_tokens, str)
                  else list(prompt_or_tokens))
        self.reset()
        logits = feed(self, tokens, 0, order)
        out = []
        pos = len(tokens)
        while True:
            t = int(np.argmax(logits))
            out.append(t)
            if len(out) == max_new_tokens or (stop_at_eos and t in self.tokenizer.eos_ids):
                break
            logits = self.forward([t], pos, order=order)[-1]
            pos += 1
        return SimpleNamespace(tokens=out, text=self.tokenizer.decode(out))
