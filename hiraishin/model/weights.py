"""Qwen3 weights on a backend, kept in their GGUF block format.

Quantized matrices stay quantized (uint8 (N, row_bytes), exactly the file's bytes): the mat-vec
kernels read the blocks, and the embedding lookup dequantizes only the rows it needs. So device
memory is the file's tensor bytes plus the KV cache plus activations. On the CPU backend the
tensors stay memory-mapped (no copy). Tied embeddings share one array.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFError
from ..quant import dequantize
from .config import LAYER_TENSORS

__all__ = ["Weight", "LayerWeights", "Qwen3Weights", "load_weights", "MATMUL_TYPES", "NORM_TYPES"]

# Block types the mat-vec kernels read (hiraishin.kernels.mmvq). Norm weights are F32 in llama.cpp
# files (every 1-D tensor stays F32 when quantizing, reference section 8.4); F16/BF16 ones are
# widened to float32 at load (exact).
MATMUL_TYPES = ("Q4_K", "Q6_K", "Q8_0")
NORM_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Weight:
    """One tensor on a backend: ``data`` is uint8 (N, row_bytes) for block types, float32 (n,) for norms.

    ``shape`` is the ggml shape (ne0 = K columns, ne1 = N rows).
    """

    name: str
    qtype: str
    shape: tuple[int, ...]
    data: object

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: Weight
    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    attn_q_norm: Weight
    attn_k_norm: Weight
    ffn_norm: Weight
    ffn_gate: Weight
    ffn_up: Weight
    ffn_down: Weight


@dataclass(frozen=True)
class Qwen3Weights:
    token_embd: Weight
    output_norm: Weight
    output: Weight  # token_embd itself when the embeddings are tied
    layers: tuple[LayerWeights, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of weight data held on the backend (a tied table counted once)."""
        seen, total = set(), 0
        for w in self._all():
            if id(w.data) not in seen:
                seen.add(id(w.data))
                total += w.nbytes
        return total

    def _all(self):
        yield self.token_embd
        yield self.output_norm
        yield self.output
        for layer in self.layers:
            for part in LAYER_TENSORS:
                yield getattr(layer, part)


def _expected(config) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    shapes = config.tensor_shapes()
    return {name: (shape, NORM_TYPES if len(shape) == 1 else MATMUL_TYPES) for name, shape in shapes.items()}


def load_weights(gguf, backend, progress: bool = True) -> Qwen3Weights:
    """Every tensor of an open :class:`~hiraishin.model.gguf_file.Qwen3GGUF` on ``backend``.

    Checks each tensor's presence, shape and type against the config and raises
    :class:`~hiraishin.errors.GGUFError` naming the file and the tensor. ``progress`` shows a
    tqdm bar over the bytes moved.
    """
    from tqdm.auto import tqdm

    where = str(getattr(gguf, "path", "<gguf>"))
    expected = _expected(gguf.config)
    for name, (shape, types) in expected.items():
        if name not in gguf.tensors:
            raise GGUFError(f"{where}: tensor {name!r} is missing")
        t = gguf.tensors[name]
        if tuple(t.shape) != shape:
            raise GGUFError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if t.qtype not in types:
            what = "the mat-vec kernels read" if types is MATMUL_TYPES else "norm weights may have"
            raise GGUFError(f"{where}: tensor {name!r} has type {t.qtype}; {what} only {', '.join(types)}")

    total = sum(int(gguf.tensors[n].data.nbytes) for n in expected)
    loaded: dict[str, Weight] = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc="loading weights", disable=not progress,
              leave=False) as bar:
        for name, (shape, _) in expected.items():
            t = gguf.tensors[name]
            data = t.data
            if len(shape) == 1:
                data = dequantize(data, t.qtype).reshape(shape)  # float32 (n,)
            qtype = "F32" if len(shape) == 1 else t.qtype
            loaded[name] = Weight(name, qtype, shape, backend.upload_weight(data))
            bar.update(int(t.data.nbytes))

    layers = tuple(
        LayerWeights(**{part: loaded[f"blk.{i}.{part}.weight"] for part in LAYER_TENSORS})
        for i in range(gguf.config.n_layer)
    )
    token_embd = loaded["token_embd.weight"]
    output = token_embd if gguf.config.tied_embeddings else loaded["output.weight"]
    return Qwen3Weights(token_embd=token_embd, output_norm=loaded["output_norm.weight"], output=output,
                        layers=layers)
