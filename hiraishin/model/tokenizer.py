"""Qwen2/Qwen3 tokenizer rebuilt from a GGUF file's ``tokenizer.ggml.*`` keys.

The GGUF stores a byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``): token strings,
token types and merges (reference section 9). We rebuild it with the ``tokenizers`` library the
way Qwen's own ``tokenizer.json`` is built: NFC normalization, a ``Split`` pre-tokenizer with the
Qwen2 regex (isolated matches), then ``ByteLevel`` (no prefix space, no regex of its own), a BPE
model without unknown token, and the CONTROL / USER_DEFINED tokens as added tokens (CONTROL ones
``special``). No BOS is added (llama.cpp's default for BPE vocabularies; Qwen's ``add_bos_token``
is false).

Text is encoded raw by default; :meth:`Tokenizer.apply_chat_template` renders the file's chat
template (jinja2) when a chat prompt is wanted.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import GGUFError, PromptError, TemplateError

__all__ = ["Tokenizer", "validate_tokenizer", "check_text", "QWEN2_PRETOKENIZER_REGEX", "TOKEN_TYPE",
           "END_OF_GENERATION_TEXTS", "CHATML_TEMPLATE"]

KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# The Qwen2 pre-tokenizer regex as written in Qwen's tokenizer.json (reference section 9; llama.cpp
# stores an expanded form without the (?i:...) group and matches it with a hand-written splitter).
# Note \p{N} takes ONE digit at a time.
QWEN2_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre values llama.cpp maps to LLAMA_VOCAB_PRE_TYPE_QWEN2 (reference section 9); None: key absent.
QWEN2_PRE_NAMES = (None, "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez")

# tokenizer.ggml.token_type values (gguf-py TokenType / llama.cpp llama_token_type).
TOKEN_TYPE = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}

# Token texts llama.cpp treats as end of generation besides the EOS id (llama-vocab.cpp, by text).
END_OF_GENERATION_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                           "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|return|>")

# Used when a file carries no tokenizer.chat_template: plain ChatML, as Qwen models expect.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class Tokenizer:
    """Byte-level BPE tokenizer built from GGUF vocabulary lists.

    ``tokens``: token strings by id (GPT-2 byte-to-unicode form); ``token_types``: one
    :data:`TOKEN_TYPE` value per token (or ``None``: all NORMAL); ``merges``: ``"left right"``
    strings in rank order.
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None = None,
                 bos_id: int | None = None, eos_id: int | None = None, chat_template: str | None = None,
                 pre: str | None = "qwen2", source: str = "<lists>"):
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if pre not in QWEN2_PRE_NAMES:
            raise GGUFError(f"{source}: tokenizer.ggml.pre = {pre!r} is not a Qwen2-style pre-tokenizer")
        if token_types is not None and len(token_types) != len(tokens):
            raise GGUFError(f"{source}: tokenizer.ggml.token_type has {len(token_types)} entries "
                            f"for {len(tokens)} tokens")
        self.tokens = list(tokens)
        self.token_types = list(token_types) if token_types is not None else [TOKEN_TYPE["NORMAL"]] * len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template
        self.source = source

        vocab: dict[str, int] = {}
        for i, tok in enumerate(self.tokens):
            vocab.setdefault(tok, i)  # a repeated string keeps its first id
        pairs = []
        for rank, merge in enumerate(merges):
            left, sep, right = merge.partition(" ")
            if not sep or not left or not right:
                raise GGUFError(f"{source}: {KEY_MERGES}[{rank}] = {_short(merge)!r} is not 'left right'")
            # The BPE model needs both parts and their concatenation in the vocabulary; checked
            # here, so that the error names the merge (tokenizers says only "out of vocabulary").
            for part in (left, right, left + right):
                if part not in vocab:
                    raise GGUFError(f"{source}: {KEY_MERGES}[{rank}] = {_short(merge)!r}: {_short(part)!r} "
                                    f"is not in {KEY_TOKENS} (corrupt vocabulary or merges)")
            pairs.append((left, right))

        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None, continuing_subword_prefix="",
                             end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
        except Exception as exc:  # tokenizers raises a bare Exception for a vocabulary it refuses
            raise GGUFError(f"{source}: {KEY_TOKENS}: the BPE vocabulary is unusable: {_short(str(exc), 200)}") from None
        tk = HFTokenizer(bpe)
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZER_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        added = []
        for i, (tok, kind) in enumerate(zip(self.tokens, self.token_types)):
            if kind in (TOKEN_TYPE["CONTROL"], TOKEN_TYPE["USER_DEFINED"]) and vocab.get(tok) == i:
                added.append(AddedToken(tok, special=kind == TOKEN_TYPE["CONTROL"], normalized=False,
                                        single_word=False, lstrip=False, rstrip=False))
        if added:
            try:
                tk.add_tokens(added)
            except Exception as exc:
                raise GGUFError(f"{source}: {KEY_TOKENS}: cannot add the special tokens: "
                                f"{_short(str(exc), 200)}") from None
        self._tk = tk
        self.eog_ids = frozenset(
            ([eos_id] if eos_id is not None else [])
            + [vocab[t] for t in END_OF_GENERATION_TEXTS if t in vocab]
        )

    @classmethod
    def from_gguf(cls, model) -> "Tokenizer":
        """From an open :class:`~hiraishin.model.gguf_file.Qwen3GGUF` (``open_qwen3_gguf(path)``).

        An open file that was validated (:func:`validate_tokenizer`) hands back the tokenizer
        built then, rather than building it again. (The reader imports this module, so this one
        takes the open file rather than a path: no import cycle.)
        """
        if not hasattr(model, "tokens"):
            raise GGUFError(f"Tokenizer.from_gguf takes an open Qwen3 GGUF "
                            f"(hiraishin.model.gguf_file.open_qwen3_gguf(path)), got {type(model).__name__}")
        built = getattr(model, "_tokenizer", None)
        if isinstance(built, cls):
            return built
        if not model.tokens:
            raise GGUFError(f"{getattr(model, 'path', '<gguf>')}: no tokenizer.ggml.tokens")
        return cls(model.tokens, model.merges, getattr(model, "token_types", None), bos_id=model.bos_id,
                   eos_id=model.eos_id, chat_template=getattr(model, "chat_template", None),
                   pre=getattr(model, "pre", "qwen2"), source=str(getattr(model, "path", "<gguf>")))

    # ---- encode / decode --------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS). With ``parse_special`` (the default, as Hugging Face
        does) special-token texts such as ``<|im_start|>`` become their ids; without it they are
        BPE-tokenized like any other text."""
        check_text(text, "text to encode")
        self._tk.encode_special_tokens = not parse_special
        try:
            return self._tk.encode(text, add_special_tokens=False).ids
        finally:
            self._tk.encode_special_tokens = False

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids``; bytes that do not form UTF-8 come out as U+FFFD."""
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        """The decoded text of one token."""
        return self.decode([token_id])

    def stream_decoder(self):
        """A callable ``step(token_id) -> str`` that returns the text each new token completes
        (empty while a multi-byte UTF-8 character is still incomplete)."""
        try:
            from tokenizers.decoders import DecodeStream  # tokenizers >= 0.21
        except ImportError:
            DecodeStream = None
        if DecodeStream is not None:
            stream = DecodeStream(skip_special_tokens=False)

            def step(token_id: int) -> str:
                return stream.step(self._tk, int(token_id)) or ""

            return step
        ids: list[int] = []
        shown = [0]  # characters of the decoded text already returned

        def step_by_redecoding(token_id: int) -> str:
            ids.append(int(token_id))
            text = self.decode(ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more bytes
                return ""
            piece, shown[0] = text[shown[0]:], len(text)
            return piece

        return step_by_redecoding

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation (EOS and the end-of-generation tokens), sorted."""
        return tuple(sorted(self.eog_ids))

    def is_end_of_generation(self, token_id: int) -> bool:
        return int(token_id) in self.eog_ids

    # ---- chat -------------------------------------------------------------------------------
    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        """Render the file's chat template (``tokenizer.chat_template``; plain ChatML if absent).

        ``messages`` is a list of ``{"role", "content"}`` dicts or a single user message string.
        Extra keyword arguments (e.g. ``enable_thinking=False``) are passed to the template.
        """
        import jinja2

        if isinstance(messages, str):
            check_text(messages, "chat message")
            messages = [{"role": "user", "content": messages}]
        elif isinstance(messages, (list, tuple)):
            for i, m in enumerate(messages):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise PromptError(f"chat message {i} must be a dict with a 'role' string, got {_short(repr(m))}")
                if isinstance(m.get("content"), (str, bytes, bytearray)):  # others (None, parts) are the template's
                    check_text(m["content"], f"chat message {i} content")
        else:
            raise PromptError(f"chat messages must be a str or a list of {{'role', 'content'}} dicts, "
                              f"got {type(messages).__name__}")
        template = self._chat_template()
        bos = self.tokens[self.bos_id] if self.bos_id is not None and self.bos_id < len(self.tokens) else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None and self.eos_id < len(self.tokens) else ""
        where = self._template_source()
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=bos, eos_token=eos, **kwargs)
        except _TemplateRaised as exc:
            raise TemplateError(f"{where}: the template refused the messages: {_short(str(exc), 200)}") from None
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"{where}: undefined name while rendering: {_short(str(exc), 200)}") from None
        except Exception as exc:  # a template is a program: any error in it is the file's problem
            raise TemplateError(f"{where}: cannot render: {type(exc).__name__}: {_short(str(exc), 200)}") from None

    def _template_source(self) -> str:
        return f"{self.source}: {KEY_CHAT_TEMPLATE}" if self.chat_template else "built-in ChatML template"

    def _chat_template(self):
        """The compiled chat template (jinja2, sandboxed as transformers does); ``TemplateError``
        naming the file and the line for a syntax error."""
        cached = getattr(self, "_compiled_template", None)
        if cached is not None:
            return cached
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise _TemplateRaised(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            template = env.from_string(self.chat_template or CHATML_TEMPLATE)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{self._template_source()}: syntax error at line {exc.lineno}: "
                                f"{_short(exc.message or str(exc), 200)}") from None
        except Exception as exc:
            raise TemplateError(f"{self._template_source()}: cannot compile: {type(exc).__name__}: "
                                f"{_short(str(exc), 200)}") from None
        self._compiled_template = template
        return template

    def check_chat_template(self) -> None:
        """Compile the chat template now: ``TemplateError`` naming the file if it cannot be compiled."""
        self._chat_template()

    def encode_chat(self, messages, add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Ids of the rendered chat prompt (special tokens parsed)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs), parse_special=True)

    def __repr__(self) -> str:
        return f"Tokenizer(n_vocab={self.n_vocab}, eos_id={self.eos_id}, source={self.source!r})"


class _TemplateRaised(Exception):
    """The chat template called ``raise_exception(message)``."""


def validate_tokenizer(gguf, chat_template: bool = False) -> None:
    """Build the tokenizer of an open :class:`~hiraishin.model.gguf_file.Qwen3GGUF` now, so that a
    corrupt vocabulary or merge list fails at open, not after the weights are loaded.

    Raises :class:`~hiraishin.errors.GGUFError` naming the file and the bad token or merge. The
    tokenizer built is kept on ``gguf`` and reused by :meth:`Tokenizer.from_gguf`. With
    ``chat_template``, also compiles ``tokenizer.chat_template`` (:class:`~hiraishin.errors.TemplateError`
    naming the file and the line if it cannot be compiled).
    """
    tokenizer = getattr(gguf, "_tokenizer", None)
    if not isinstance(tokenizer, Tokenizer):
        gguf._tokenizer = None  # a failed build leaves nothing half made
        tokenizer = Tokenizer.from_gguf(gguf)
        gguf._tokenizer = tokenizer
    if chat_template:
        tokenizer.check_chat_template()


def check_text(text, what: str = "text") -> str:
    """``text`` itself if it is a ``str`` that can be UTF-8, else :class:`~hiraishin.errors.PromptError`
    saying what is wrong with ``what`` (bytes, another type, a lone surrogate and where)."""
    if not isinstance(text, str):
        hint = " (decode it first, e.g. b.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise PromptError(f"{what} must be a str, got {type(text).__name__}{hint}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start:exc.end]
            raise PromptError(f"{what} is not valid text: {bad!r} at character {exc.start} is a lone surrogate "
                              f"(bytes that are not UTF-8, e.g. from a command line in another encoding?)") from None
    return text


def _short(text: str, limit: int = 80) -> str:
    """Names from a corrupt file can be long garbage: keep messages to one short line."""
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."
