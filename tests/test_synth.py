"""Synthetic Qwen3 GGUF files: llama.cpp's layout and Q4_K_M type mix, seeded bytes, real tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hiraishin.errors import HiraishinError
from hiraishin.model.gguf_file import open_qwen3_gguf
from hiraishin.model.synth import SHAPES, SynthShape, q4_k_m_type, tensor_plan, use_more_bits, write_synthetic
from hiraishin.model.synth_vocab import tokenizer_file_json
from hiraishin.quant import dequantize

# Reference §8.4: layers whose attn_v and ffn_down are Q6_K in a Q4_K_M file.
Q6_K_LAYERS_8B = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35}
Q6_K_LAYERS_0_6B = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}

# Reference §8.2, 8B column: layer tensor -> (type unless attn_v/ffn_down, ggml shape).
LAYER_8B = {
    "attn_norm": ("F32", (4096,)),
    "attn_q": ("Q4_K", (4096, 4096)),
    "attn_k": ("Q4_K", (4096, 1024)),
    "attn_v": (None, (4096, 1024)),
    "attn_output": ("Q4_K", (4096, 4096)),
    "attn_q_norm": ("F32", (128,)),
    "attn_k_norm": ("F32", (128,)),
    "ffn_norm": ("F32", (4096,)),
    "ffn_gate": ("Q4_K", (4096, 12288)),
    "ffn_up": ("Q4_K", (4096, 12288)),
    "ffn_down": (None, (12288, 4096)),
}

TINY_RANDOM = SynthShape("tiny-random", n_embd=256, n_layer=3, n_head=2, n_head_kv=1, n_ff=512, vocab="micro",
                         tied=False, fill="random")


def test_use_more_bits_matches_the_reference_layer_lists():
    assert {i for i in range(36) if use_more_bits(i, 36)} == Q6_K_LAYERS_8B
    assert {i for i in range(28) if use_more_bits(i, 28)} == Q6_K_LAYERS_0_6B


def test_8b_plan_is_the_reference_table():
    plan = tensor_plan(SHAPES["qwen3-8b"].config())
    got = {t.name: (t.qtype, t.shape) for t in plan}
    want = {"token_embd.weight": ("Q4_K", (4096, 151936))}
    for i in range(36):
        for part, (qtype, shape) in LAYER_8B.items():
            qtype = qtype or ("Q6_K" if i in Q6_K_LAYERS_8B else "Q4_K")
            want[f"blk.{i}.{part}.weight"] = (qtype, shape)
    want["output_norm.weight"] = ("F32", (4096,))
    want["output.weight"] = ("Q6_K", (4096, 151936))
    assert got == want and len(plan) == 399
    assert plan[0].name == "token_embd.weight" and plan[-1].name == "output.weight"
    by_name = {t.name: t for t in plan}
    assert by_name["output.weight"].n_bytes == 151936 * 4096 // 256 * 210
    assert by_name["blk.0.ffn_down.weight"].n_bytes == 4096 * 12288 // 256 * 210
    assert by_name["blk.4.ffn_down.weight"].n_bytes == 4096 * 12288 // 256 * 144
    assert 4.5e9 < sum(t.n_bytes for t in plan) < 5.2e9


def test_0_6b_plan_is_tied_with_q6_k_embeddings():
    plan = tensor_plan(SHAPES["qwen3-0.6b"].config())
    by_name = {t.name: t for t in plan}
    assert len(plan) == 1 + 28 * 11 + 1 and "output.weight" not in by_name
    assert (by_name["token_embd.weight"].qtype, by_name["token_embd.weight"].shape) == ("Q6_K", (1024, 151936))
    assert {i for i in range(28) if by_name[f"blk.{i}.attn_v.weight"].qtype == "Q6_K"} == Q6_K_LAYERS_0_6B
    assert {i for i in range(28) if by_name[f"blk.{i}.ffn_down.weight"].qtype == "Q6_K"} == Q6_K_LAYERS_0_6B
    assert by_name["blk.0.attn_q.weight"].shape == (1024, 2048) and by_name["blk.0.attn_output.weight"].shape == (2048, 1024)
    assert {t.qtype for t in plan if len(t.shape) == 1} == {"F32"}


def test_type_rule_for_single_tensors():
    assert q4_k_m_type("token_embd.weight", (512, 10), 4, tied=False) == "Q4_K"
    assert q4_k_m_type("token_embd.weight", (512, 10), 4, tied=True) == "Q6_K"
    assert q4_k_m_type("output.weight", (512, 10), 4, tied=False) == "Q6_K"
    assert q4_k_m_type("blk.3.ffn_down.weight", (1536, 512), 4, tied=False) == "Q6_K"  # 3 >= 7*4//8
    assert q4_k_m_type("blk.1.attn_v.weight", (512, 256), 4, tied=False) == "Q4_K"
    assert q4_k_m_type("blk.1.attn_k_norm.weight", (128,), 4, tied=False) == "F32"


def test_written_files_follow_their_plan(micro_model_path, tiny_model_path):
    for path, shape in ((micro_model_path, "micro"), (tiny_model_path, "tiny")):
        m = open_qwen3_gguf(path)
        assert m.config == SHAPES[shape].config()
        written = [(t.name, t.qtype, t.shape, t.n_bytes) for t in m.tensors.values()]
        assert written == [(t.name, t.qtype, t.shape, t.n_bytes) for t in tensor_plan(m.config)]
        assert m.metadata["general.file_type"] == 15 and m.metadata["general.quantization_version"] == 2
        assert m.metadata["qwen3.rope.freq_base"] == 1e6 and m.metadata["qwen3.attention.key_length"] == 128


def test_same_seed_same_bytes_other_seed_other_bytes(micro_model_path, tmp_path):
    again = write_synthetic(tmp_path / "again.gguf", "micro", seed=0, progress=False)
    assert again.read_bytes() == Path(micro_model_path).read_bytes()
    other = write_synthetic(tmp_path / "other.gguf", "micro", seed=1, progress=False)
    a, b = open_qwen3_gguf(micro_model_path), open_qwen3_gguf(other)
    for name, t in a.tensors.items():  # every tensor differs, not just one
        assert not np.array_equal(t.data, b.tensors[name].data), name


def test_random_fill_is_seeded_and_decodes_to_finite_weights(tmp_path):
    one = write_synthetic(tmp_path / "r1.gguf", TINY_RANDOM, seed=5, progress=False)
    two = write_synthetic(tmp_path / "r2.gguf", TINY_RANDOM, seed=5, progress=False)
    assert one.read_bytes() == two.read_bytes()
    m = open_qwen3_gguf(one)
    for t in m.tensors.values():
        w = dequantize(t.data, t.qtype) if t.qtype != "F32" else np.asarray(t.data)
        assert np.isfinite(w).all(), t.name
        if t.qtype != "F32":
            assert 1e-3 < float(np.std(w)) < 1.0, t.name


def test_gaussian_weights_have_the_documented_scales(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    embd = dequantize(m.tensor("token_embd.weight").data, "Q6_K")
    q = dequantize(m.tensor("blk.0.attn_q.weight").data, "Q4_K")
    from hiraishin.model.synth import EMBD_STD, SHAPES

    assert abs(float(embd.std()) - EMBD_STD) < 0.002
    assert abs(float(q.std()) - SHAPES["micro"].matrix_std) < 0.002
    norm = np.asarray(m.tensor("blk.0.attn_norm.weight").data)
    assert abs(float(norm.mean()) - 1) < 0.02 and 0.02 < float(norm.std()) < 0.08


def test_tiny_tokenizer_is_laid_out_like_the_converter(tiny_model_path):
    m = open_qwen3_gguf(tiny_model_path)
    qwen = tokenizer_file_json("tokenizer.json")
    vocab = qwen["model"]["vocab"]
    assert len(m.tokens) == len(m.token_types) == 151936 and len(vocab) == 151643
    assert all(m.tokens[i] == text for text, i in vocab.items())
    assert set(m.token_types[:151643]) == {1}  # NORMAL
    added = tokenizer_file_json("tokenizer_config.json")["added_tokens_decoder"]
    for token_id, entry in added.items():
        token_id = int(token_id)
        assert m.tokens[token_id] == entry["content"]
    control = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_pad|>", "<|file_sep|>"}
    user_defined = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
    assert {m.tokens[i] for i in range(151643, 151669) if m.token_types[i] == 3} >= control
    assert {m.tokens[i] for i in range(151643, 151669) if m.token_types[i] == 4} == user_defined
    assert m.tokens[151669] == "[PAD151669]" and m.tokens[-1] == "[PAD151935]"
    assert set(m.token_types[151669:]) == {5}  # UNUSED
    assert (m.bos_id, m.eos_id, m.pad_id) == (151643, 151645, 151643)
    assert (m.model, m.pre) == ("gpt2", "qwen2") and m.metadata["tokenizer.ggml.add_bos_token"] is False
    assert m.merges == [" ".join(pair) for pair in qwen["model"]["merges"]]  # no merge part holds a space
    assert m.chat_template.startswith("{%- if tools %}")


def test_micro_vocabulary_is_closed_under_its_merges(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    tokens = set(m.tokens)
    assert len(m.merges) > 3000
    for merge in m.merges:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens and left + right in tokens
    assert m.tokens[4000:4003] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (m.bos_id, m.eos_id, m.pad_id) == (4000, 4002, 4000)
    assert m.tokens[-1] == "[PAD4095]" and m.token_types[-1] == 5


def test_bad_arguments(tmp_path):
    with pytest.raises(HiraishinError, match="huge"):
        write_synthetic(tmp_path / "x.gguf", "huge", progress=False)
    with pytest.raises(HiraishinError, match="seed"):
        write_synthetic(tmp_path / "x.gguf", "micro", seed=-1, progress=False)
    with pytest.raises(HiraishinError, match="n_ff"):
        SynthShape("odd", n_embd=256, n_layer=1, n_head=2, n_head_kv=1, n_ff=300, vocab="micro", tied=True,
                   fill="gaussian")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_random_blocks_decode_to_centred_weights(qtype):
    # The timing shapes' random blocks: finite weights of mean ~0. Q4_K's used to lean +0.04 (dmin in
    # d's range), which made their activations overflow the fp16 sums of q8_1 and their MMA passes NaN.
    from hiraishin.model.synth import _random_blocks
    from hiraishin.quant import BLOCK_BYTES

    qk = 32 if qtype == "Q8_0" else 256
    raw = _random_blocks(np.random.default_rng(3), 256, 1024 // qk * BLOCK_BYTES[qtype], qtype)
    w = dequantize(raw, qtype).astype(np.float64)
    assert np.isfinite(w).all()
    assert 1e-3 < w.std() < 0.2
    assert abs(w.mean()) < 0.05 * w.std(), (w.mean(), w.std())
