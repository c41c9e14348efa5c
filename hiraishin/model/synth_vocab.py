"""The Qwen3 tokenizer laid out in GGUF keys the way llama.cpp's converter writes it (reference §9).

The tokenizer files ship with the package, xz-compressed, in ``hiraishin/model/qwen3_tokenizer/``
(Qwen3's own ``tokenizer.json`` and ``tokenizer_config.json``, Apache-2.0: see the LICENSE and
NOTICE files there).

Layout (``conversion/base.py`` ``_set_vocab_gpt2`` + ``gguf-py/gguf/vocab.py`` ``SpecialVocab``):
tokens by id, ids missing from the HF vocabulary filled with ``[PAD<id>]`` of type UNUSED;
added tokens flagged ``special``, or that look special (``<|...|>``), are CONTROL, other added
tokens USER_DEFINED, the rest NORMAL; merges as ``"left right"`` strings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import TokenType

from ..errors import HiraishinError

# Qwen3's tokenizer.json / tokenizer_config.json, xz-compressed, shipped as package data.
TOKENIZER_DATA_DIR = Path(__file__).with_name("qwen3_tokenizer")
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
# sha256 of the decompressed files, as published with Qwen3 (also listed in qwen3_tokenizer/NOTICE):
# the synthetic models' bytes depend on them, so a changed file is an error, not a new vocabulary.
TOKENIZER_SHA256 = {
    TOKENIZER_JSON: "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    TOKENIZER_CONFIG_JSON: "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
}

# Qwen3's config.json vocab_size: the embedding has more rows than the tokenizer has tokens.
QWEN3_N_VOCAB = 151936
# config.json bos_token_id is 151643 = <|endoftext|> (tokenizer_config.json has bos_token null).
BOS_TOKEN = "<|endoftext|>"
TOKENIZER_MODEL = "gpt2"
TOKENIZER_PRE = "qwen2"

# The `micro` vocabulary: the first MICRO_BPE_TOKENS ids of the BPE vocabulary (the 256 byte
# tokens and the first merges), then Qwen's added tokens renumbered after them, then [PAD] rows
# up to MICRO_N_VOCAB (a round embedding size, like the real 151936).
MICRO_BPE_TOKENS = 4000
MICRO_N_VOCAB = 4096


@dataclass(frozen=True)
class GGUFVocab:
    """Values of the ``tokenizer.*`` GGUF keys."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    pad_id: int
    add_bos: bool | None
    chat_template: str | None
    model: str = TOKENIZER_MODEL
    pre: str = TOKENIZER_PRE


def tokenizer_data_path(name: str) -> Path:
    """Path of a shipped tokenizer file (``name`` + ``.xz``) in ``hiraishin/model/qwen3_tokenizer/``."""
    return TOKENIZER_DATA_DIR / f"{name}.xz"


@functools.lru_cache(maxsize=4)
def tokenizer_file_text(name: str = TOKENIZER_JSON) -> str:
    """Text of Qwen3's ``tokenizer.json`` or ``tokenizer_config.json`` (decompressed from the package)."""
    if name not in TOKENIZER_SHA256:
        raise HiraishinError(f"no shipped tokenizer file {name!r}; choose one of {', '.join(TOKENIZER_SHA256)}")
    path = tokenizer_data_path(name)
    try:
        with lzma.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise HiraishinError(f"{path}: the Qwen3 tokenizer file is missing from the installed package") from None
    except (lzma.LZMAError, EOFError) as exc:
        raise HiraishinError(f"{path}: corrupt package data ({exc}); reinstall hiraishin") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != TOKENIZER_SHA256[name]:
        raise HiraishinError(f"{path}: sha256 {digest} differs from Qwen3's {name} "
                             f"({TOKENIZER_SHA256[name]}); reinstall hiraishin")
    return raw.decode("utf-8")


def tokenizer_file_json(name: str = TOKENIZER_JSON) -> dict:
    """Qwen3's ``tokenizer.json`` or ``tokenizer_config.json`` as parsed JSON (a fresh copy)."""
    return json.loads(tokenizer_file_text(name))


@functools.lru_cache(maxsize=2)
def qwen3_vocab(size: str = "full") -> GGUFVocab:
    """Qwen3's vocabulary as GGUF keys: ``"full"`` (151,936 entries) or ``"micro"`` (4,096)."""
    if size not in ("full", "micro"):
        raise ValueError(f"vocabulary size {size!r}: expected 'full' or 'micro'")
    tokenizer = tokenizer_file_json(TOKENIZER_JSON)
    config = tokenizer_file_json(TOKENIZER_CONFIG_JSON)
    folder = TOKENIZER_DATA_DIR
    config_path = tokenizer_data_path(TOKENIZER_CONFIG_JSON)

    by_id = {i: text for text, i in tokenizer["model"]["vocab"].items()}
    added = sorted(tokenizer["added_tokens"], key=lambda a: a["id"])
    merges = [_merge_string(m) for m in tokenizer["model"]["merges"]]

    if size == "full":
        n_vocab = QWEN3_N_VOCAB
        if sorted(by_id) != list(range(len(by_id))):
            raise HiraishinError(f"{tokenizer_data_path(TOKENIZER_JSON)}: vocabulary ids are not 0..{len(by_id) - 1}")
        entries = [(by_id[i], TokenType.NORMAL) for i in range(len(by_id))]
        first_added = len(by_id)
    else:
        n_vocab = MICRO_N_VOCAB
        entries = [(by_id[i], TokenType.NORMAL) for i in range(MICRO_BPE_TOKENS)]
        kept = {text for text, _ in entries}
        merges = [m for m in merges if _merge_within(m, kept)]
        first_added = MICRO_BPE_TOKENS
    for k, a in enumerate(added):
        if size == "full" and a["id"] != first_added + k:
            raise HiraishinError(f"{tokenizer_data_path(TOKENIZER_JSON)}: added token {a['content']!r} has id {a['id']}, "
                                 f"expected {first_added + k}")
        entries.append((a["content"], _added_token_type(a)))
    if len(entries) > n_vocab:
        raise HiraishinError(f"{folder}: {len(entries)} tokens do not fit a vocabulary of {n_vocab}")
    entries += [(f"[PAD{i}]", TokenType.UNUSED) for i in range(len(entries), n_vocab)]

    tokens = [text for text, _ in entries]
    index = {text: i for i, text in enumerate(tokens)}

    def token_id(text: str | None, key: str) -> int:
        if text not in index:
            raise HiraishinError(f"{config_path}: {key} {text!r} is not a token")
        return index[text]

    add_bos = config.get("add_bos_token")
    return GGUFVocab(
        tokens=tuple(tokens),
        token_types=tuple(int(t) for _, t in entries),
        merges=tuple(merges),
        bos_id=token_id(BOS_TOKEN, "bos token"),
        eos_id=token_id(_token_text(config.get("eos_token")), "eos_token"),
        pad_id=token_id(_token_text(config.get("pad_token")), "pad_token"),
        add_bos=add_bos if isinstance(add_bos, bool) else None,  # SpecialVocab writes only a boolean
        chat_template=config.get("chat_template"),
    )


def _merge_string(merge) -> str:
    """tokenizer.json merge → GGUF merge string, as SpecialVocab does.

    New-style merges are [left, right] pairs; a literal space inside a part is written as U+0120.
    """
    if isinstance(merge, str):
        return merge
    left, right = merge
    return f"{left.replace(' ', chr(0x120))} {right.replace(' ', chr(0x120))}"


def _merge_within(merge: str, kept: set[str]) -> bool:
    left, right = merge.split(" ")
    return left in kept and right in kept and left + right in kept


def _added_token_type(added: dict) -> TokenType:
    text = added["content"]
    looks_special = text.startswith("<|") and text.endswith("|>")
    return TokenType.CONTROL if added.get("special") or looks_special else TokenType.USER_DEFINED


def _token_text(value) -> str | None:
    # tokenizer_config.json gives special tokens as a string or as {"content": ...}.
    return value.get("content") if isinstance(value, dict) else value
