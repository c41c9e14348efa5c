"""Qwen3Config: reading GGUF metadata like llama.cpp, and refusing inconsistent values by key."""

from __future__ import annotations

import pytest

from hiraishin.errors import GGUFError
from hiraishin.model.config import Qwen3Config

PATH = "/models/some-model.gguf"


def qwen3_8b_metadata() -> dict:
    """The keys of a Qwen3-8B GGUF (reference §8.1), with a stand-in token list."""
    return {
        "general.architecture": "qwen3",
        "qwen3.block_count": 36,
        "qwen3.context_length": 40960,
        "qwen3.embedding_length": 4096,
        "qwen3.feed_forward_length": 12288,
        "qwen3.attention.head_count": 32,
        "qwen3.attention.head_count_kv": 8,
        "qwen3.attention.key_length": 128,
        "qwen3.attention.value_length": 128,
        "qwen3.rope.freq_base": 1000000.0,
        "qwen3.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.tokens": ["x"] * 151936,
    }


def test_reads_the_8b_keys():
    c = Qwen3Config.from_metadata(qwen3_8b_metadata(), PATH)
    assert (c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == (
        4096, 36, 32, 8, 128, 12288, 151936)
    assert (c.rope_base, c.rms_eps, c.n_ctx_train, c.tied_embeddings) == (1e6, 1e-6, 40960, False)
    assert (c.n_gqa, c.q_dim, c.kv_dim, c.size_label) == (4, 4096, 1024, "8B")


def test_tensor_shapes_follow_the_reference_table_for_0_6b():
    meta = qwen3_8b_metadata()
    meta.update({"qwen3.block_count": 28, "qwen3.embedding_length": 1024, "qwen3.feed_forward_length": 3072,
                 "qwen3.attention.head_count": 16})
    c = Qwen3Config.from_metadata(meta, PATH, tied_embeddings=True)
    assert c.size_label == "0.6B"
    shapes = c.tensor_shapes()
    assert len(shapes) == 1 + 28 * 11 + 1 and "output.weight" not in shapes
    assert shapes["token_embd.weight"] == (1024, 151936)
    assert shapes["blk.27.attn_q.weight"] == (1024, 2048)  # n_head*128 rows, not n_embd
    assert shapes["blk.27.attn_k.weight"] == shapes["blk.27.attn_v.weight"] == (1024, 1024)
    assert shapes["blk.27.attn_output.weight"] == (2048, 1024)
    assert shapes["blk.0.ffn_gate.weight"] == shapes["blk.0.ffn_up.weight"] == (1024, 3072)
    assert shapes["blk.0.ffn_down.weight"] == (3072, 1024)
    assert shapes["blk.0.attn_q_norm.weight"] == shapes["blk.0.attn_k_norm.weight"] == (128,)
    assert shapes["output_norm.weight"] == shapes["blk.3.ffn_norm.weight"] == (1024,)


def test_llama_cpp_defaults_apply_to_optional_keys():
    meta = qwen3_8b_metadata()
    for key in ("qwen3.attention.head_count_kv", "qwen3.attention.key_length", "qwen3.attention.value_length",
                "qwen3.rope.freq_base"):
        del meta[key]
    c = Qwen3Config.from_metadata(meta, PATH)
    assert c.n_head_kv == 32 and c.head_dim == 4096 // 32 and c.rope_base == 10000.0


@pytest.mark.parametrize(
    "change, key",
    [
        ({"general.architecture": "llama"}, "general.architecture"),
        ({"general.architecture": None}, "general.architecture"),
        ({"qwen3.block_count": None}, "qwen3.block_count"),
        ({"qwen3.block_count": "36"}, "qwen3.block_count"),
        ({"qwen3.block_count": 0}, "qwen3.block_count"),
        ({"qwen3.block_count": True}, "qwen3.block_count"),
        ({"qwen3.embedding_length": -4096}, "qwen3.embedding_length"),
        ({"qwen3.attention.head_count": 0}, "qwen3.attention.head_count"),
        ({"qwen3.attention.head_count": [32] * 36}, "qwen3.attention.head_count"),
        ({"qwen3.attention.head_count_kv": 5}, "qwen3.attention.head_count_kv"),
        ({"qwen3.attention.value_length": 64}, "qwen3.attention.value_length"),
        ({"qwen3.attention.key_length": 127, "qwen3.attention.value_length": 127}, "qwen3.attention.key_length"),
        ({"qwen3.rope.dimension_count": 64}, "qwen3.rope.dimension_count"),
        ({"qwen3.rope.freq_base": float("nan")}, "qwen3.rope.freq_base"),
        ({"qwen3.rope.freq_base": "1e6"}, "qwen3.rope.freq_base"),
        ({"qwen3.attention.layer_norm_rms_epsilon": None}, "qwen3.attention.layer_norm_rms_epsilon"),
        ({"qwen3.attention.layer_norm_rms_epsilon": -1e-6}, "qwen3.attention.layer_norm_rms_epsilon"),
        ({"qwen3.context_length": None}, "qwen3.context_length"),
        ({"qwen3.feed_forward_length": 0}, "qwen3.feed_forward_length"),
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
        ({"qwen3.vocab_size": 1000}, "qwen3.vocab_size"),
    ],
)
def test_bad_metadata_names_file_and_key(change, key):
    meta = qwen3_8b_metadata()
    for k, v in change.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    with pytest.raises(GGUFError) as err:
        Qwen3Config.from_metadata(meta, PATH)
    assert PATH in str(err.value) and key in str(err.value)


def test_direct_construction_is_validated_too():
    good = Qwen3Config.from_metadata(qwen3_8b_metadata(), PATH)
    fields = {f: getattr(good, f) for f in good.__dataclass_fields__}
    with pytest.raises(GGUFError, match="n_head_kv"):
        Qwen3Config(**{**fields, "n_head_kv": 3})
    with pytest.raises(GGUFError, match="head_dim"):
        Qwen3Config(**{**fields, "head_dim": 127})
