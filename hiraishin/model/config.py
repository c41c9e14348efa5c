"""Qwen3 hyper-parameters, read from GGUF metadata the way llama.cpp reads them.

Keys, defaults and the tensor table follow the reference, section 8 (src/llama-arch.cpp,
src/llama-model.cpp, src/models/qwen3.cpp).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Integral, Real
from os import PathLike
from typing import Any

from ..errors import GGUFError

ARCHITECTURE = "qwen3"

# Metadata keys (prefix "qwen3." for the architecture's own keys).
KEY_ARCHITECTURE = "general.architecture"
KEY_FILE_TYPE = "general.file_type"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_VOCAB_SIZE = "qwen3.vocab_size"
KEY_EMBEDDING_LENGTH = "qwen3.embedding_length"
KEY_BLOCK_COUNT = "qwen3.block_count"
KEY_HEAD_COUNT = "qwen3.attention.head_count"
KEY_HEAD_COUNT_KV = "qwen3.attention.head_count_kv"
KEY_KEY_LENGTH = "qwen3.attention.key_length"
KEY_VALUE_LENGTH = "qwen3.attention.value_length"
KEY_FEED_FORWARD_LENGTH = "qwen3.feed_forward_length"
KEY_CONTEXT_LENGTH = "qwen3.context_length"
KEY_ROPE_FREQ_BASE = "qwen3.rope.freq_base"
KEY_ROPE_DIMENSION_COUNT = "qwen3.rope.dimension_count"
KEY_RMS_EPS = "qwen3.attention.layer_norm_rms_epsilon"

# llama.cpp's default when qwen3.rope.freq_base is absent (hparams.rope_freq_base_train).
DEFAULT_ROPE_FREQ_BASE = 10000.0
# llama.cpp refuses more layers than LLAMA_MAX_LAYERS = 512 (src/llama-hparams.h); a block count
# beyond it is a corrupt file, and tensor_shapes() must not build a table for it.
MAX_N_LAYER = 512
# Tensors outside the layers: token_embd.weight and output_norm.weight (+ output.weight if untied).
N_GLOBAL_TENSORS = 2

# The GGUF key each field comes from, for error messages about a config built by hand.
FIELD_KEYS = {
    "n_embd": KEY_EMBEDDING_LENGTH,
    "n_layer": KEY_BLOCK_COUNT,
    "n_head": KEY_HEAD_COUNT,
    "n_head_kv": KEY_HEAD_COUNT_KV,
    "head_dim": KEY_KEY_LENGTH,
    "n_ff": KEY_FEED_FORWARD_LENGTH,
    "n_vocab": KEY_TOKENS,
    "rope_base": KEY_ROPE_FREQ_BASE,
    "rms_eps": KEY_RMS_EPS,
    "n_ctx_train": KEY_CONTEXT_LENGTH,
}

LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@dataclass(frozen=True)
class Qwen3Config:
    """Shape and constants of a Qwen3 model (one GGUF's ``qwen3.*`` keys).

    ``tied_embeddings`` is not a metadata key: llama.cpp decides it from the absence of
    ``output.weight`` (then ``token_embd.weight`` is also the output matrix).
    """

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_base: float
    rms_eps: float
    n_ctx_train: int
    tied_embeddings: bool

    def __post_init__(self):
        problem = _find_problem(asdict(self))
        if problem is not None:
            field, message = problem
            raise GGUFError(f"Qwen3Config: {field} ({FIELD_KEYS.get(field, field)}): {message}")

    # --- derived sizes -------------------------------------------------------------------
    @property
    def n_gqa(self) -> int:
        """Query heads per KV head (Q head i reads KV head i // n_gqa)."""
        return self.n_head // self.n_head_kv

    @property
    def q_dim(self) -> int:
        """Rows of attn_q, columns of attn_output: n_head * head_dim (need not equal n_embd)."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Rows of attn_k and attn_v: n_head_kv * head_dim."""
        return self.n_head_kv * self.head_dim

    @property
    def size_label(self) -> str:
        """llama.cpp's model type for this shape (src/models/qwen3.cpp), or "?" if it has none."""
        if self.n_layer == 28:
            return "0.6B" if self.n_embd == 1024 else "1.7B"
        if self.n_layer == 36:
            return "4B" if self.n_embd == 2560 else "8B"
        return "?"

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the model → its ggml shape (ne0, ne1), in file order.

        ``output.weight`` is left out when the embeddings are tied.
        """
        e, d, q, kv, ff = self.n_embd, self.head_dim, self.q_dim, self.kv_dim, self.n_ff
        layer = {
            "attn_norm": (e,),
            "attn_q": (e, q),
            "attn_k": (e, kv),
            "attn_v": (e, kv),
            "attn_output": (q, e),
            "attn_q_norm": (d,),
            "attn_k_norm": (d,),
            "ffn_norm": (e,),
            "ffn_gate": (e, ff),
            "ffn_up": (e, ff),
            "ffn_down": (ff, e),
        }
        shapes = {"token_embd.weight": (e, self.n_vocab)}
        for i in range(self.n_layer):
            for part in LAYER_TENSORS:
                shapes[f"blk.{i}.{part}.weight"] = layer[part]
        shapes["output_norm.weight"] = (e,)
        if not self.tied_embeddings:
            shapes["output.weight"] = (e, self.n_vocab)
        return shapes

    # --- construction from a file --------------------------------------------------------
    @property
    def n_tensors(self) -> int:
        """How many tensors a file of this config holds (the length of :meth:`tensor_shapes`)."""
        return N_GLOBAL_TENSORS + (0 if self.tied_embeddings else 1) + self.n_layer * len(LAYER_TENSORS)

    @classmethod
    def from_metadata(
        cls, meta: dict[str, Any], path: str | PathLike[str], *, tied_embeddings: bool = False,
        tensor_count: int | None = None,
    ) -> "Qwen3Config":
        """Read the config from plain-python GGUF metadata (as in ``Qwen3GGUF.metadata``).

        Defaults mirror llama.cpp: head_count_kv = head_count, key_length = n_embd / head_count,
        rope.freq_base = 10000. The vocabulary size is the length of ``tokenizer.ggml.tokens``.
        ``tensor_count``: the tensors the file holds; a block count that needs more is refused
        before anything is built from it. Raises ``GGUFError`` naming ``path`` and the offending key.
        """
        where = str(path)

        def fail(key: str, message: str):
            raise GGUFError(f"{where}: {key}: {message}")

        arch = meta.get(KEY_ARCHITECTURE)
        if arch is None:
            fail(KEY_ARCHITECTURE, "missing")
        if arch != ARCHITECTURE:
            fail(KEY_ARCHITECTURE, f"is {arch!r}, expected {ARCHITECTURE!r}")

        def integer(key: str, default: int | None = None) -> int:
            value = meta.get(key, default)
            if value is None:
                fail(key, "missing")
            if isinstance(value, list):
                fail(key, "per-layer arrays are not supported (need one value for all layers)")
            if isinstance(value, bool) or not isinstance(value, Integral):
                fail(key, f"must be an integer, got {value!r}")
            return int(value)

        def real(key: str, default: float | None = None) -> float:
            value = meta.get(key, default)
            if value is None:
                fail(key, "missing")
            if isinstance(value, bool) or not isinstance(value, Real):
                fail(key, f"must be a number, got {value!r}")
            return float(value)

        n_embd = integer(KEY_EMBEDDING_LENGTH)
        n_head = integer(KEY_HEAD_COUNT)
        if n_head <= 0:
            fail(KEY_HEAD_COUNT, f"must be positive, got {n_head}")
        if n_embd <= 0:
            fail(KEY_EMBEDDING_LENGTH, f"must be positive, got {n_embd}")
        head_dim = integer(KEY_KEY_LENGTH, n_embd // n_head)
        value_length = integer(KEY_VALUE_LENGTH, head_dim)
        if value_length != head_dim:
            fail(KEY_VALUE_LENGTH, f"{value_length} differs from {KEY_KEY_LENGTH} {head_dim}")
        if KEY_ROPE_DIMENSION_COUNT in meta:
            n_rot = integer(KEY_ROPE_DIMENSION_COUNT)
            if n_rot != head_dim:  # llama.cpp asserts n_rot == head size for qwen3
                fail(KEY_ROPE_DIMENSION_COUNT, f"{n_rot} differs from head size {head_dim}")

        tokens = meta.get(KEY_TOKENS)
        if not isinstance(tokens, list):
            fail(KEY_TOKENS, "missing (the vocabulary size comes from it)")
        n_vocab = len(tokens)
        if KEY_VOCAB_SIZE in meta and integer(KEY_VOCAB_SIZE) != n_vocab:
            fail(KEY_VOCAB_SIZE, f"{meta[KEY_VOCAB_SIZE]} differs from the {n_vocab} entries of {KEY_TOKENS}")

        values = dict(
            n_embd=n_embd,
            n_layer=integer(KEY_BLOCK_COUNT),
            n_head=n_head,
            n_head_kv=integer(KEY_HEAD_COUNT_KV, n_head),
            head_dim=head_dim,
            n_ff=integer(KEY_FEED_FORWARD_LENGTH),
            n_vocab=n_vocab,
            rope_base=real(KEY_ROPE_FREQ_BASE, DEFAULT_ROPE_FREQ_BASE),
            rms_eps=real(KEY_RMS_EPS),
            n_ctx_train=integer(KEY_CONTEXT_LENGTH),
            tied_embeddings=bool(tied_embeddings),
        )
        problem = _find_problem(values)
        if problem is not None:
            field, message = problem
            fail(FIELD_KEYS[field], message)
        config = cls(**values)
        # Bound by what the file holds before anything is built per layer. Only the layer tensors
        # count here: a file short of a few tensors gets the error naming the missing one.
        layer_tensors = config.n_layer * len(LAYER_TENSORS)
        if tensor_count is not None and layer_tensors > tensor_count:
            fail(KEY_BLOCK_COUNT, f"{config.n_layer} layers need {layer_tensors} tensors, the file has {tensor_count}")
        return config


def _find_problem(v: dict[str, Any]) -> tuple[str, str] | None:
    """The first inconsistency in a set of config values, as (field, message), or None."""
    for field in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "n_ctx_train"):
        value = v[field]
        if isinstance(value, bool) or not isinstance(value, Integral):
            return field, f"must be an integer, got {value!r}"
        if value <= 0:
            return field, f"must be positive, got {value}"
    if v["n_layer"] > MAX_N_LAYER:
        return "n_layer", f"{v['n_layer']} layers, more than llama.cpp's limit of {MAX_N_LAYER} (corrupt?)"
    if v["n_head"] % v["n_head_kv"] != 0:
        return "n_head_kv", f"{v['n_head_kv']} KV heads do not divide {v['n_head']} query heads"
    if v["head_dim"] % 2 != 0:  # NEOX RoPE pairs dimension d with d + head_dim/2
        return "head_dim", f"must be even for NEOX RoPE, got {v['head_dim']}"
    for field in ("rope_base", "rms_eps"):
        value = v[field]
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            return field, f"must be a finite positive number, got {value!r}"
    return None
