"""The GGUF-built tokenizer against Qwen's own tokenizer.json (shipped xz-compressed in hiraishin/model/qwen3_tokenizer)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.errors import GGUFError
from hiraishin.model.tokenizer import TOKEN_TYPE, Tokenizer

N_VOCAB = 151936  # Qwen3's padded vocabulary (reference section 8.1)

TRICKY = [
    "Hello world!",
    "1234567890 3.14159 1,000,000 0x1F",  # \p{N}: one digit per token
    "你好，世界！日本語のテキスト、한국어",  # CJK, fullwidth punctuation
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇯🇵",  # ZWJ sequences, skin tone, regional indicators
    "  lots   of\n\n\n spaces\t\ttabs  \r\n\r\n  trailing   ",  # whitespace runs
    "I'm, you're, he'll, they'd, it's, WE'VE, I'D, O'Neil's",  # contractions, both cases
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>",  # special and added tokens
    "café naïve Ångström Straße",
    "def f(x):\n    return x**2  # comment\n",
    "https://example.com/path?q=a&b=1#frag",
    "",
    " ",
    "ſ ﬁ µ ℃",
    "a" * 300,
]


def _qwen_file(name: str) -> str:
    from hiraishin.model.synth_vocab import tokenizer_file_text

    return tokenizer_file_text(name)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_str(_qwen_file("tokenizer.json"))


@pytest.fixture(scope="module")
def gguf_lists():
    """The vocabulary laid out as the GGUF converter writes it (reference section 9)."""
    t = json.loads(_qwen_file("tokenizer.json"))
    tokens = [f"[PAD{i}]" for i in range(N_VOCAB)]
    types = [TOKEN_TYPE["UNUSED"]] * N_VOCAB
    for text, i in t["model"]["vocab"].items():
        tokens[i], types[i] = text, TOKEN_TYPE["NORMAL"]
    for a in t["added_tokens"]:
        special = a["special"] or (a["content"].startswith("<|") and a["content"].endswith("|>"))
        tokens[a["id"]] = a["content"]
        types[a["id"]] = TOKEN_TYPE["CONTROL"] if special else TOKEN_TYPE["USER_DEFINED"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]
    config = json.loads(_qwen_file("tokenizer_config.json"))
    return dict(tokens=tokens, merges=merges, token_types=types, bos_id=151643, eos_id=151645,
                chat_template=config["chat_template"])


@pytest.fixture(scope="module")
def tokenizer(gguf_lists):
    return Tokenizer(**gguf_lists)


@pytest.mark.parametrize("text", TRICKY)
def test_same_ids_as_qwen_tokenizer_json(tokenizer, hf_tokenizer, text):
    expect = hf_tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == expect
    assert tokenizer.decode(expect) == hf_tokenizer.decode(expect, skip_special_tokens=False)


def test_digits_are_split_one_by_one(tokenizer):
    ids = tokenizer.encode("2024")
    assert [tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_special_tokens_and_eos(tokenizer):
    assert tokenizer.encode("<|im_end|>") == [151645]
    assert len(tokenizer.encode("<|im_end|>", parse_special=False)) > 1
    assert tokenizer.eos_id == 151645
    assert {151643, 151645} <= set(tokenizer.eos_ids)
    assert tokenizer.is_end_of_generation(151645) and not tokenizer.is_end_of_generation(9707)
    assert tokenizer.decode([151644, 872], skip_special=True) == "user"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_round_trip(tokenizer, text):
    norm = unicodedata.normalize("NFC", text)  # the tokenizer NFC-normalizes, as Qwen's does
    assert tokenizer.decode(tokenizer.encode(norm, parse_special=False)) == norm


@pytest.mark.parametrize("decode_stream", [True, False], ids=["DecodeStream", "re-decoding"])
def test_stream_decoder_pieces_add_up(tokenizer, decode_stream, monkeypatch):
    if not decode_stream:  # the fallback for tokenizers < 0.21
        import tokenizers.decoders

        monkeypatch.delattr(tokenizers.decoders, "DecodeStream", raising=False)
    text = "Ünïcödé 😀 字 and more"
    ids = tokenizer.encode(text)
    step = tokenizer.stream_decoder()
    assert "".join(step(i) for i in ids) == text


def test_chat_template(tokenizer):
    rendered = tokenizer.apply_chat_template("Why is the sky blue?")
    assert rendered == "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    no_think = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tokenizer.encode_chat("hi")
    assert ids[0] == 151644 and ids[-3:] == tokenizer.encode("<|im_start|>assistant\n")[-3:]


def test_chat_template_matches_transformers(gguf_lists, tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_text(_qwen_file("tokenizer.json"), encoding="utf-8")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    hf.chat_template = gguf_lists["chat_template"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]
    expect = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expect


def test_plain_chatml_without_a_template(gguf_lists):
    tok = Tokenizer(**{**gguf_lists, "chat_template": None})
    assert tok.apply_chat_template("x") == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_bad_vocabulary_lists_fail_clearly():
    with pytest.raises(GGUFError, match="merges"):
        Tokenizer(["a", "b", "ab"], ["ab"])
    with pytest.raises(GGUFError, match="token_type"):
        Tokenizer(["a", "b"], [], token_types=[1])
    with pytest.raises(GGUFError, match="pre"):
        Tokenizer(["a"], [], pre="llama-bpe")


def test_from_tiny_gguf_matches_tokenizer_json(tiny_model_path, hf_tokenizer):
    from hiraishin.model.gguf_file import open_qwen3_gguf

    tok = Tokenizer.from_gguf(open_qwen3_gguf(tiny_model_path))
    assert tok.n_vocab == N_VOCAB
    for text in TRICKY:
        assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False).ids, text


def test_small_vocabulary_round_trip():
    # a toy byte-level vocabulary: every single byte plus two merges
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = alphabet + ["ab", "abc", "<|im_end|>"]
    types = [TOKEN_TYPE["NORMAL"]] * (len(tokens) - 1) + [TOKEN_TYPE["CONTROL"]]
    tok = Tokenizer(tokens, ["a b", "ab c"], types, eos_id=len(tokens) - 1)
    ids = tok.encode("abc ab<|im_end|>")
    assert [tok.tokens[i] for i in ids] == ["abc", "Ġ", "ab", "<|im_end|>"]
    assert tok.decode(ids) == "abc ab<|im_end|>"
    assert np.all(np.asarray(ids) < len(tokens))
