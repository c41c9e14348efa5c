"""A plain numpy float64 Qwen3 forward pass: the accuracy reference for tests, not a backend.

Weights are dequantized (the same float32 values the kernels see), everything after that is
float64: exact RMSNorm, RoPE angles and cos/sin in float64, a float64 softmax over the whole
causal prefix, SiLU in float64, no activation quantization and no f16 KV cache. The distance of
a backend's logits from these is the error the kernels' float32 + q8_1 + f16 arithmetic adds.
"""

from __future__ import annotations

import numpy as np

from ..errors import GGUFError
from ..quant import dequantize
from .config import LAYER_TENSORS

__all__ = ["ReferenceQwen3", "reference_logits"]


class ReferenceQwen3:
    """Float64 Qwen3 over the dequantized weights of an open GGUF (or a path to one).

    Weights are kept dequantized as float32 and widened per use, so the memory is the float32
    size of the model: use it on small (synthetic) models.
    """

    def __init__(self, model):
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from .gguf_file import open_qwen3_gguf

            model = open_qwen3_gguf(model)
        self.config = cfg = model.config
        self._w: dict[str, np.ndarray] = {}

        def get(name: str) -> np.ndarray:
            if name not in model.tensors:
                raise GGUFError(f"{getattr(model, 'path', '<gguf>')}: tensor {name!r} is missing")
            t = model.tensors[name]
            return dequantize(t.data, t.qtype).reshape(tuple(reversed(t.shape)))

        self.token_embd = get("token_embd.weight")  # (n_vocab, n_embd)
        self.output = self.token_embd if cfg.tied_embeddings else get("output.weight")
        self.output_norm = get("output_norm.weight")
        self.layers = [{part: get(f"blk.{i}.{part}.weight") for part in LAYER_TENSORS} for i in range(cfg.n_layer)]

    @staticmethod
    def _rms_norm(x, w, eps):
        x = np.asarray(x, np.float64)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)

    def _rope(self, x, pos):
        # x (T, H, D) float64; NEOX: d rotates with d + D/2, theta = pos * base^(-2d/D)
        D = x.shape[-1]
        half = D // 2
        inv = np.power(float(self.config.rope_base), -2.0 * np.arange(half) / D)
        theta = pos[:, None].astype(np.float64) * inv[None, :]  # (T, half)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def forward(self, tokens) -> np.ndarray:
        """Logits float64 (T, n_vocab) of every position of ``tokens`` (a sequence from position 0)."""
        cfg = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        T = tokens.size
        if T < 1 or tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise ValueError(f"reference forward needs 1+ token ids in [0, {cfg.n_vocab}), got {tokens.tolist()}")
        D, H, Hkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv
        pos = np.arange(T)
        causal = np.tril(np.ones((T, T), dtype=bool))
        x = self.token_embd[tokens].astype(np.float64)  # (T, n_embd)
        for L in self.layers:
            h = self._rms_norm(x, L["attn_norm"], cfg.rms_eps)
            q = (h @ L["attn_q"].T.astype(np.float64)).reshape(T, H, D)
            k = (h @ L["attn_k"].T.astype(np.float64)).reshape(T, Hkv, D)
            v = (h @ L["attn_v"].T.astype(np.float64)).reshape(T, Hkv, D)
            q = self._rope(self._rms_norm(q, L["attn_q_norm"], cfg.rms_eps), pos)
            k = self._rope(self._rms_norm(k, L["attn_k_norm"], cfg.rms_eps), pos)
            kv_head = np.arange(H) // (H // Hkv)  # GQA: query head i reads KV head i // n_gqa
            scores = np.einsum("thd,shd->hts", q, k[:, kv_head]) / np.sqrt(D)  # (H, T, T)
            scores = np.where(causal[None], scores, -np.inf)
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            a = np.einsum("hts,shd->thd", p, v[:, kv_head]).reshape(T, H * D)
            x = x + a @ L["attn_output"].T.astype(np.float64)
            h = self._rms_norm(x, L["ffn_norm"], cfg.rms_eps)
            g = h @ L["ffn_gate"].T.astype(np.float64)
            u = h @ L["ffn_up"].T.astype(np.float64)
            x = x + (g / (1.0 + np.exp(-g)) * u) @ L["ffn_down"].T.astype(np.float64)
        h = self._rms_norm(x, self.output_norm, cfg.rms_eps)
        return h @ self.output.T.astype(np.float64)


def reference_logits(model, tokens) -> np.ndarray:
    """Float64 logits (T, n_vocab) of ``tokens`` from position 0 (``model``: open GGUF or path)."""
    return ReferenceQwen3(model).forward(tokens)
