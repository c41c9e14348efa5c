"""open_qwen3_gguf: a valid file loads with memory-mapped tensors; every bad file is one GGUFError
that names the file and the key or tensor at fault."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from hiraishin.errors import GGUFError
from hiraishin.model.gguf_file import Qwen3GGUF, open_qwen3_gguf


@functools.lru_cache(maxsize=2)
def _contents(src: Path):
    """Keys (value, type, item type) and tensors (array, type) of a file, read once by gguf-py."""
    reader = GGUFReader(src)
    keys = {}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            vtype = field.types[0]
            keys[key] = (field.contents(), vtype, field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    floats = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    tensors = {t.name: (np.array(t.data), None if t.tensor_type in floats else t.tensor_type) for t in reader.tensors}
    return keys, tensors


def rewrite(src: Path, dst: Path, *, arch: str = "qwen3", set_keys: dict | None = None, drop_keys=(),
            drop_tensors=(), tensors: dict | None = None) -> Path:
    """Copy ``src`` with changes. ``set_keys``: key -> (value, GGUFValueType[, array item type]);
    ``tensors``: name -> (array, GGMLQuantizationType or None), replacing or adding tensors."""
    set_keys, tensors = dict(set_keys or {}), dict(tensors or {})
    keys, source_tensors = _contents(Path(src))
    writer = GGUFWriter(dst, arch)
    for key, (value, vtype, sub) in keys.items():
        if key not in drop_keys and key not in set_keys:
            writer.add_key_value(key, value, vtype, sub)
    for key, (value, vtype, *sub) in set_keys.items():
        writer.add_key_value(key, value, vtype, sub[0] if sub else None)
    for name, (data, raw_dtype) in source_tensors.items():
        if name not in drop_tensors and name not in tensors:
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
    for name, (data, raw_dtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def open_error(path: Path) -> str:
    with pytest.raises(GGUFError) as err:
        open_qwen3_gguf(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    return message


# --- a valid file ---------------------------------------------------------------------------


def test_micro_loads(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    assert isinstance(m, Qwen3GGUF) and m.path == Path(micro_model_path)
    c = m.config
    assert (c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == (256, 2, 2, 1, 128, 768, 4096)
    assert set(m.tensors) == set(c.tensor_shapes())
    q = m.tensor("blk.0.attn_q.weight")
    assert (q.qtype, q.shape, q.data.dtype, q.data.shape) == ("Q4_K", (256, 256), np.uint8, (256, 144))
    down = m.tensor("blk.1.ffn_down.weight")  # use_more_bits(1, 2): the last eighth
    assert (down.qtype, down.shape, down.data.shape, down.row_bytes) == ("Q6_K", (768, 256), (256, 630), 630)
    norm = m.tensor("blk.0.attn_q_norm.weight")
    assert (norm.qtype, norm.shape, norm.data.dtype, norm.data.shape) == ("F32", (128,), np.float32, (128,))
    assert m.metadata["general.file_type"] == 15 and isinstance(m.metadata["qwen3.rope.freq_base"], float)


def test_tensor_data_are_read_only_memory_maps_of_the_file(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    raw = Path(micro_model_path).read_bytes()
    for t in m.tensors.values():
        assert isinstance(t.data, np.memmap) and Path(t.data.filename) == Path(micro_model_path).resolve()
        assert not t.data.flags.writeable
        assert t.data.nbytes == t.n_bytes and t.offset % 32 == 0
        assert raw[t.offset : t.offset + t.n_bytes] == t.data.tobytes()


def test_tied_embeddings_use_token_embd_for_output(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    assert m.config.tied_embeddings and "output.weight" not in m.tensors
    assert m.weight_for_output() is m.tensor("token_embd.weight")
    assert m.weight_for_output().qtype == "Q6_K"  # the output rule applies to a tied token_embd


def test_untied_embeddings_use_output_weight(tiny_model_path):
    m = open_qwen3_gguf(tiny_model_path)
    assert not m.config.tied_embeddings
    assert m.weight_for_output() is m.tensor("output.weight")
    assert (m.tensor("output.weight").qtype, m.tensor("token_embd.weight").qtype) == ("Q6_K", "Q4_K")
    assert m.tensor("output.weight").shape == m.tensor("token_embd.weight").shape == (512, 151936)


def test_tokenizer_fields(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    assert (m.model, m.pre) == ("gpt2", "qwen2")
    assert len(m.tokens) == len(m.token_types) == 4096
    assert m.tokens[m.bos_id] == m.tokens[m.pad_id] == "<|endoftext|>" and m.tokens[m.eos_id] == "<|im_end|>"
    assert m.merges[0] == "Ġ Ġ" and "<|im_start|>" in m.chat_template


def test_summary_counts_every_byte(micro_model_path):
    s = open_qwen3_gguf(micro_model_path).summary()
    assert s["tensor_bytes"] == sum(n for *_, n in s["tensors"]) == sum(b for _, b in s["bytes_per_type"].values())
    assert s["tensor_bytes"] < s["file_bytes"] and s["output_tensor"] == "token_embd.weight"
    assert s["tokenizer"]["token_type_counts"] == {1: 4000, 3: 20, 4: 6, 5: 70}


def test_unknown_tensor_name_is_a_clear_error(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    with pytest.raises(GGUFError, match=r"no tensor named 'blk\.7\.attn_q\.weight'") as err:
        m.tensor("blk.7.attn_q.weight")
    assert str(micro_model_path) in str(err.value)


def test_rewrite_helper_round_trips(micro_model_path, tmp_path):
    copy = open_qwen3_gguf(rewrite(micro_model_path, tmp_path / "copy.gguf"))
    m = open_qwen3_gguf(micro_model_path)
    assert copy.metadata == m.metadata and copy.config == m.config
    assert all(np.array_equal(copy.tensors[n].data, t.data) for n, t in m.tensors.items())


# --- files that are not GGUF or are cut short -----------------------------------------------


@pytest.mark.parametrize("content", [b"", b"GG", b"GGUF", b"ggml" + bytes(40), b"[build-system]\nrequires = []\n"])
def test_not_a_gguf(tmp_path, content):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    message = open_error(path)
    assert "not a GGUF" in message or "truncated" in message


def test_missing_file(tmp_path):
    assert "no such file" in open_error(tmp_path / "absent.gguf")


def test_a_directory(tmp_path):
    open_error(tmp_path)


@pytest.mark.parametrize("version, word", [(1, "version 1"), (4, "version 4"), (3 << 24, "big-endian")])
def test_bad_version(micro_model_path, tmp_path, version, word):
    data = bytearray(Path(micro_model_path).read_bytes())
    data[4:8] = struct.pack("<I", version)
    (path := tmp_path / "v.gguf").write_bytes(data)
    message = open_error(path)
    assert "GGUF.version" in message and word in message


@pytest.mark.parametrize("offset, key", [(8, "GGUF.tensor_count"), (16, "GGUF.kv_count")])
def test_impossible_counts(micro_model_path, tmp_path, offset, key):
    data = bytearray(Path(micro_model_path).read_bytes())
    data[offset : offset + 8] = struct.pack("<Q", 1 << 40)
    (path := tmp_path / "c.gguf").write_bytes(data)
    assert key in open_error(path)


def test_truncated_in_metadata_names_the_key(micro_model_path, tmp_path):
    data = Path(micro_model_path).read_bytes()
    tokens_at = data.index(b"tokenizer.ggml.tokens")
    (path := tmp_path / "t.gguf").write_bytes(data[: tokens_at + 5000])
    message = open_error(path)
    assert "truncated" in message and "'tokenizer.ggml.tokens'" in message


def test_truncated_inside_a_key_name_names_the_key_before(micro_model_path, tmp_path):
    data = Path(micro_model_path).read_bytes()
    (path := tmp_path / "t.gguf").write_bytes(data[: data.index(b"tokenizer.ggml.tokens") + 3])
    message = open_error(path)
    assert "truncated" in message and "after 'tokenizer.ggml.pre'" in message


def test_truncated_in_tensor_data_names_the_tensor(micro_model_path, tmp_path):
    data = Path(micro_model_path).read_bytes()
    (path := tmp_path / "t.gguf").write_bytes(data[:-100])
    message = open_error(path)
    assert "output_norm.weight" in message and "truncated" in message


def test_huge_array_count_fails_fast(micro_model_path, tmp_path):
    data = bytearray(Path(micro_model_path).read_bytes())
    key = b"tokenizer.ggml.token_type"
    count_at = data.index(key) + len(key) + 4 + 4  # value type, item type, then the u64 count
    assert struct.unpack_from("<Q", data, count_at)[0] == 4096
    data[count_at : count_at + 8] = struct.pack("<Q", 1 << 50)
    (path := tmp_path / "a.gguf").write_bytes(data)
    assert "tokenizer.ggml.token_type" in open_error(path)


# --- well-formed GGUF files that are not usable Qwen3 models -------------------------------


def test_wrong_architecture(micro_model_path, tmp_path):
    message = open_error(rewrite(micro_model_path, tmp_path / "llama.gguf", arch="llama"))
    assert "general.architecture" in message and "llama" in message


def test_unsupported_tensor_type(micro_model_path, tmp_path):
    q5_0 = np.zeros((256, 256 // 32 * 22), np.uint8)
    path = rewrite(micro_model_path, tmp_path / "q5.gguf",
                   tensors={"blk.0.attn_q.weight": (q5_0, GGMLQuantizationType.Q5_0)})
    message = open_error(path)
    assert "blk.0.attn_q.weight" in message and "Q5_0" in message


def test_missing_tensor(micro_model_path, tmp_path):
    path = rewrite(micro_model_path, tmp_path / "m.gguf", drop_tensors={"blk.1.ffn_up.weight"})
    message = open_error(path)
    assert "blk.1.ffn_up.weight" in message and "missing" in message


def test_unexpected_tensor(micro_model_path, tmp_path):
    extra = np.zeros((384, 144), np.uint8)
    path = rewrite(micro_model_path, tmp_path / "e.gguf",
                   tensors={"blk.0.attn_qkv.weight": (extra, GGMLQuantizationType.Q4_K)})
    assert "blk.0.attn_qkv.weight" in open_error(path)


def test_wrong_shape(micro_model_path, tmp_path):
    m = open_qwen3_gguf(micro_model_path)
    q = np.array(m.tensor("blk.0.attn_q.weight").data)  # 256 rows where attn_k has 128
    path = rewrite(micro_model_path, tmp_path / "s.gguf", tensors={"blk.0.attn_k.weight": (q, GGMLQuantizationType.Q4_K)})
    message = open_error(path)
    assert "blk.0.attn_k.weight" in message and "(256, 256)" in message and "(256, 128)" in message


def test_quantized_norm(micro_model_path, tmp_path):
    norm = np.zeros(256 // 32 * 34, np.uint8)
    path = rewrite(micro_model_path, tmp_path / "n.gguf", tensors={"output_norm.weight": (norm, GGMLQuantizationType.Q8_0)})
    message = open_error(path)
    assert "output_norm.weight" in message and "Q8_0" in message


def test_f16_and_bf16_tensors_are_accepted(micro_model_path, tmp_path):
    m = open_qwen3_gguf(micro_model_path)
    f16_matrix = (np.arange(256 * 256) % 2048).reshape(256, 256).astype(np.float16)  # numpy (ne1, ne0)
    bf16_matrix = np.arange(128 * 256, dtype=np.uint16).reshape(128, 256)  # raw bf16 bits
    f16_norm = np.ones(128, np.float16)
    path = rewrite(micro_model_path, tmp_path / "f16.gguf", tensors={
        "blk.0.attn_q.weight": (f16_matrix, None),
        "blk.0.attn_k.weight": (bf16_matrix, GGMLQuantizationType.BF16),
        "blk.0.attn_q_norm.weight": (f16_norm, None),
    })
    copy = open_qwen3_gguf(path)
    q, k = copy.tensor("blk.0.attn_q.weight"), copy.tensor("blk.0.attn_k.weight")
    assert (q.qtype, q.shape, q.data.dtype) == ("F16", (256, 256), np.float16) and np.array_equal(q.data, f16_matrix)
    assert (k.qtype, k.shape, k.data.dtype) == ("BF16", (256, 128), np.uint16) and np.array_equal(k.data, bf16_matrix)
    assert copy.tensor("blk.0.attn_q_norm.weight").qtype == "F16" and copy.config == m.config


U32, I32, F32, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                           GGUFValueType.STRING, GGUFValueType.ARRAY)


@pytest.mark.parametrize(
    "set_keys, drop_keys, key",
    [
        ({"qwen3.attention.head_count_kv": (3, U32)}, (), "qwen3.attention.head_count_kv"),
        ({"qwen3.embedding_length": (512, U32)}, (), "token_embd.weight"),  # shapes no longer match
        ({"qwen3.block_count": (3, U32)}, (), "qwen3.block_count"),  # 33 layer tensors, the file has 23
        ({"qwen3.block_count": ("two", STR)}, (), "qwen3.block_count"),
        ({}, ("qwen3.attention.layer_norm_rms_epsilon",), "qwen3.attention.layer_norm_rms_epsilon"),
        ({"qwen3.attention.value_length": (64, U32)}, (), "qwen3.attention.value_length"),
        ({"qwen3.vocab_size": (151936, U32)}, (), "qwen3.vocab_size"),
        ({"tokenizer.ggml.bos_token_id": (99999, U32)}, (), "tokenizer.ggml.bos_token_id"),
        ({"tokenizer.ggml.token_type": ([1] * 100, ARR, I32)}, (), "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.model": ("llama", STR)}, (), "tokenizer.ggml.model"),
        ({}, ("tokenizer.ggml.merges",), "tokenizer.ggml.merges"),
        ({}, ("tokenizer.ggml.tokens",), "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": ([7] * 4096, ARR, I32)}, (), "tokenizer.ggml.tokens"),
        ({"general.alignment": (48, U32)}, (), "general.alignment"),
        ({"general.alignment": (32.0, F32)}, (), "general.alignment"),
    ],
)
def test_inconsistent_metadata(micro_model_path, tmp_path, set_keys, drop_keys, key):
    path = rewrite(micro_model_path, tmp_path / "k.gguf", set_keys=set_keys, drop_keys=drop_keys)
    assert key in open_error(path)


# --- the parser itself ----------------------------------------------------------------------


def test_fields_and_tensors_parse_exactly_as_gguf_py_parses_them(micro_model_path):
    from hiraishin.model.gguf_file import _CheckedReader

    ours = _CheckedReader(Path(micro_model_path), Path(micro_model_path).stat().st_size)
    stock = GGUFReader(micro_model_path)
    assert list(ours.fields) == list(stock.fields)
    for key, field in stock.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.types, mine.data, len(mine.parts)) == (field.offset, field.types, field.data, len(field.parts))
        assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(mine.parts, field.parts)), key
    assert [(t.name, t.data_offset, t.n_bytes, t.shape.tolist()) for t in ours.tensors] == [
        (t.name, t.data_offset, t.n_bytes, t.shape.tolist()) for t in stock.tensors]


def test_a_real_llama_cpp_file_of_another_architecture(gemma_gguf_path):
    message = open_error(gemma_gguf_path)
    assert "general.architecture" in message and "'gemma3'" in message


def test_the_gguf_reader_methods_we_extend_have_the_signatures_we_expect():
    """gguf_file._CheckedReader extends these GGUFReader methods (gguf-py has no public hook for
    bounded reads); a gguf release that renames or reshapes one must fail here, by name."""
    import inspect

    expected = {
        "_get": ["self", "offset", "dtype", "count", "override_order"],
        "_get_str": ["self", "offset"],
        "_get_field_parts": ["self", "orig_offs", "raw_type"],
        "_push_field": ["self", "field", "skip_sum"],
        "_build_tensor_info": ["self", "offs", "count"],
        "_get_tensor_info_field": ["self", "orig_offs"],
        "_build_tensors": ["self", "start_offs", "fields"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(GGUFReader, name)).parameters) == params, name
