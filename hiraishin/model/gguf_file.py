"""Open a Qwen3 GGUF file: parse with ``gguf.GGUFReader``, validate, hand out memory-mapped tensors.

Every way a file can be unusable ends in one ``GGUFError`` whose message names the file and the
key or tensor at fault: not a GGUF, truncated, corrupt header, wrong architecture, unsupported
tensor type, missing or unexpected tensor, wrong shape, inconsistent metadata.

Tensor data are never copied: each ``GGUFTensor.data`` is an ``np.memmap`` view of the file, so
opening an 8B model maps 4.7 GiB but reads only the header.
"""

from __future__ import annotations

import os
import struct
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import GGUFError
from .config import ARCHITECTURE, KEY_ARCHITECTURE, KEY_FILE_TYPE, KEY_TOKENS, Qwen3Config

GGUF_MAGIC = b"GGUF"
# Versions gguf-py's reader accepts (gguf_reader.READER_SUPPORTED_VERSIONS).
SUPPORTED_VERSIONS = (2, 3)
# magic u32, version u32, tensor_count u64, kv_count u64.
HEADER_BYTES = 24
# Smallest possible key/value entry (u64 key length, u32 value type) and tensor info
# (u64 name length, u32 n_dims, u32 type, u64 offset): bounds the counts a file can claim.
MIN_KV_BYTES = 12
MIN_TENSOR_INFO_BYTES = 24
# ggml tensors have at most 4 dimensions (GGML_MAX_DIMS, ggml/include/ggml.h).
MAX_DIMS = 4

# The tensor types this library computes with (reference §2); anything else is rejected at open.
SUPPORTED_QTYPES = ("F32", "F16", "BF16", "Q4_K", "Q6_K", "Q8_0")
FLOAT_QTYPES = ("F32", "F16", "BF16")
# numpy element type of the unquantized types (BF16 is kept as its raw uint16 bits).
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

KEY_ALIGNMENT = "general.alignment"
KEY_NAME = "general.name"
KEY_TOKENIZER_MODEL = "tokenizer.ggml.model"
KEY_TOKENIZER_PRE = "tokenizer.ggml.pre"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_BOS_ID = "tokenizer.ggml.bos_token_id"
KEY_EOS_ID = "tokenizer.ggml.eos_token_id"
KEY_PAD_ID = "tokenizer.ggml.padding_token_id"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# GGUFValueType.ARRAY as a plain int: an enum attribute lookup per value is slow in Python 3.11.
_ARRAY = int(GGUFValueType.ARRAY)
_STRING = int(GGUFValueType.STRING)
_VALUE_TYPES = frozenset(int(t) for t in GGUFValueType)
_U64 = struct.Struct("<Q")
# Qwen3 is a byte-level BPE ("gpt2") vocabulary (reference §9).
TOKENIZER_MODEL = "gpt2"


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of the file.

    ``shape`` is in ggml order: ``(ne0,)`` or ``(ne0, ne1)`` with ne0 the number of columns.
    ``data`` is a read-only memory map: for Q4_K/Q6_K/Q8_0 a uint8 array ``(ne1, row_bytes)``;
    for F32/F16 a float32/float16 array ``(ne1, ne0)``; for BF16 the raw uint16 bits. 1-D tensors
    have 1-D data.
    """

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    n_bytes: int
    data: np.ndarray

    @property
    def n_elements(self) -> int:
        n = 1
        for ne in self.shape:
            n *= ne
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of ne0 elements."""
        block_elems, block_bytes = _block_size(self.qtype)
        return self.shape[0] // block_elems * block_bytes

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.qtype}, shape={self.shape}, {self.n_bytes} bytes)"


class Qwen3GGUF:
    """A validated Qwen3 GGUF file: config, metadata, memory-mapped tensors and tokenizer fields."""

    def __init__(self, path: Path, config: Qwen3Config, metadata: dict[str, Any], tensors: dict[str, GGUFTensor]):
        self.path = path
        self.config = config
        self.metadata = metadata
        self.tensors = tensors
        self._tokenizer = None  # built by tokenizer.validate_tokenizer at open, reused by Qwen3

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor called ``name``; ``GGUFError`` naming file and tensor if there is none."""
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None

    def weight_for_output(self) -> GGUFTensor:
        """The lm-head matrix: ``output.weight``, or ``token_embd.weight`` when embeddings are tied."""
        return self.tensor("token_embd.weight" if self.config.tied_embeddings else "output.weight")

    # --- tokenizer fields (reference §9) -------------------------------------------------
    @property
    def tokens(self) -> list[str]:
        return self.metadata[KEY_TOKENS]

    @property
    def token_types(self) -> list[int]:
        """Per-token type: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE."""
        types = self.metadata.get(KEY_TOKEN_TYPE)
        return types if types is not None else [1] * len(self.tokens)  # llama.cpp: absent = all NORMAL

    @property
    def merges(self) -> list[str]:
        return self.metadata[KEY_MERGES]

    @property
    def bos_id(self) -> int | None:
        return self.metadata.get(KEY_BOS_ID)

    @property
    def eos_id(self) -> int | None:
        return self.metadata.get(KEY_EOS_ID)

    @property
    def pad_id(self) -> int | None:
        return self.metadata.get(KEY_PAD_ID)

    @property
    def model(self) -> str:
        return self.metadata[KEY_TOKENIZER_MODEL]

    @property
    def pre(self) -> str | None:
        return self.metadata.get(KEY_TOKENIZER_PRE)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get(KEY_CHAT_TEMPLATE)

    def summary(self) -> dict[str, Any]:
        """Plain data for ``hiraishin inspect``: config, tokenizer, tensor table, bytes per type."""
        per_type: dict[str, list[int]] = {}
        for t in self.tensors.values():
            entry = per_type.setdefault(t.qtype, [0, 0])
            entry[0] += 1
            entry[1] += t.n_bytes
        return {
            "path": str(self.path),
            "file_bytes": os.path.getsize(self.path),
            "architecture": self.metadata.get(KEY_ARCHITECTURE),
            "name": self.metadata.get(KEY_NAME),
            "file_type": self.metadata.get(KEY_FILE_TYPE),
            "size_label": self.config.size_label,
            "config": asdict(self.config),
            "tied_embeddings": self.config.tied_embeddings,
            "output_tensor": self.weight_for_output().name,
            "tokenizer": {
                "model": self.model,
                "pre": self.pre,
                "n_tokens": len(self.tokens),
                "n_merges": len(self.merges),
                "token_type_counts": dict(sorted(Counter(self.token_types).items())),
                "bos_id": self.bos_id,
                "eos_id": self.eos_id,
                "pad_id": self.pad_id,
                "chat_template": self.chat_template is not None,
            },
            "tensors": [(t.name, t.qtype, t.shape, t.n_bytes) for t in self.tensors.values()],
            "bytes_per_type": {q: tuple(v) for q, v in sorted(per_type.items())},
            "tensor_bytes": sum(t.n_bytes for t in self.tensors.values()),
        }

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Qwen3GGUF({str(self.path)!r}, n_embd={c.n_embd}, n_layer={c.n_layer}, "
            f"n_vocab={c.n_vocab}, tied={c.tied_embeddings}, {len(self.tensors)} tensors)"
        )


def open_qwen3_gguf(path: str | os.PathLike[str], validate_tokenizer: bool = True) -> Qwen3GGUF:
    """Open and validate a Qwen3 GGUF file; tensors stay memory-mapped.

    Raises ``GGUFError`` (naming the file and the key or tensor) for anything unusable. With
    ``validate_tokenizer`` (the default) the BPE tokenizer is built from the vocabulary and merges
    now (see :func:`hiraishin.model.tokenizer.validate_tokenizer`); ``False`` skips that for
    callers that never tokenize (e.g. a tool that copies tensors).
    """
    path = Path(path)
    header = _check_header(path)
    reader = _read(path, header)
    metadata = _plain_metadata(reader, path)
    _check_architecture(metadata, path)  # first: a file of another model says so, whatever else is wrong
    tensors = _tensors(reader, path)
    config = Qwen3Config.from_metadata(metadata, path, tied_embeddings="output.weight" not in tensors,
                                       tensor_count=len(tensors))
    _check_tensors(tensors, config, path)
    _check_tokenizer(metadata, config, path)
    gguf = Qwen3GGUF(path, config, metadata, tensors)
    if validate_tokenizer:
        from .tokenizer import validate_tokenizer as build_and_check

        build_and_check(gguf)  # a corrupt vocabulary fails here, not after the weights are loaded
    return gguf


# --- header and parsing ------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    version: int
    tensor_count: int
    kv_count: int
    file_size: int


def _check_header(path: Path) -> _Header:
    """Magic, version and plausible counts, before gguf-py sees the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (starts with {head[:4]!r}, expected {GGUF_MAGIC!r})")
    if len(head) < HEADER_BYTES:
        raise GGUFError(f"{path}: truncated header ({size} bytes, a GGUF header has {HEADER_BYTES})")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", head, 4)
    if version & 0xFFFF == 0 and version != 0:
        raise GGUFError(f"{path}: GGUF.version: big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF.version: unsupported version {version} (supported: {SUPPORTED_VERSIONS})")
    room = size - HEADER_BYTES
    if kv_count * MIN_KV_BYTES > room:
        raise GGUFError(f"{path}: GGUF.kv_count: {kv_count} keys cannot fit in a {size}-byte file (corrupt or truncated)")
    if tensor_count * MIN_TENSOR_INFO_BYTES > room:
        raise GGUFError(
            f"{path}: GGUF.tensor_count: {tensor_count} tensors cannot fit in a {size}-byte file (corrupt or truncated)"
        )
    return _Header(version, tensor_count, kv_count, size)


class _ShortRead(Exception):
    def __init__(self, offset: int, n_bytes: int, size: int):
        super().__init__(f"needs {n_bytes} bytes at offset {offset} but the file ends at {size} (truncated?)")


class _CheckedReader(GGUFReader):
    """``gguf.GGUFReader`` with bounded reads and progress notes for error messages.

    Stock ``_get`` returns a short array when a read runs past the end of the file; the reader then
    fails later with an IndexError or a reshape ValueError, or loops for ever over a huge array
    count of a scalar type. Here a short read raises at once, and the stage, entry number and name
    being read are kept for the error message.

    Speed: stock parsing of the 151,936-token vocabulary (tokens, types, merges: 455k values, one
    recursive call and several np.memmap views each) takes ~10 s; slicing a plain ndarray view of
    the map and reading flat arrays in one loop builds the same ``ReaderField`` parts in ~0.5 s.
    """

    def __init__(self, path: Path, file_size: int):
        self._size = file_size
        self._stage = "metadata"
        self._n_done = 0  # complete keys (or tensor infos) so far
        self._last = None  # name of the last complete one
        self._current = None  # name of the one being read, once its name is read
        self._depth = 0  # nesting of _get_field_parts: 0 = reading a key or tensor name
        super().__init__(path, mode="r")

    def _get(self, offset, dtype, count=1, override_order=None):
        try:
            flat = self._flat
        except AttributeError:
            flat = self._flat = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        end = offset + dt.itemsize * count
        if count < 0 or end > self._size:
            raise _ShortRead(offset, dt.itemsize * count, self._size)
        arr = flat[offset:end].view(dt)
        order = override_order or self.byte_order
        if order == "S" or (order == "<" and sys.byteorder != "little"):
            arr = arr.view(dt.newbyteorder("S"))
        return arr

    def _get_str(self, offset):
        if self._depth:
            return super()._get_str(offset)
        self._current = None
        slen, data = super()._get_str(offset)
        self._current = bytes(data).decode("utf-8", errors="replace")
        return slen, data

    def _get_field_parts(self, orig_offs, raw_type):
        self._depth += 1
        try:
            return self._field_parts(orig_offs, raw_type)
        finally:
            self._depth -= 1

    def _field_parts(self, orig_offs, raw_type):
        if raw_type not in _VALUE_TYPES:
            raise ValueError(f"unknown value type {int(raw_type)}")
        if raw_type != _ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        item_type, count = int(raw_itype[0]), int(alen[0])
        if item_type not in _VALUE_TYPES:
            raise ValueError(f"unknown array item type {item_type}")
        scalar = self.gguf_scalar_to_np.get(item_type)
        offs = orig_offs + 12
        # An array whose count cannot fit in the rest of the file is corrupt: say so now rather
        # than parse element by element up to the end of the file.
        min_item_bytes = np.dtype(scalar).itemsize if scalar is not None else 8  # str/array: u64 length
        if count * min_item_bytes > self._size - offs:
            raise _ShortRead(offs, count * min_item_bytes, self._size)
        if count == 0 or (scalar is None and item_type != _STRING):
            return super()._get_field_parts(orig_offs, raw_type)  # nested arrays: rare, keep gguf-py's path
        # Fast path for the big tokenizer arrays: the same parts gguf-py would build (one array
        # per element, in ReaderField's layout), without a recursive call per element.
        parts: list[np.ndarray] = [raw_itype, alen]
        flat = self._flat
        if scalar is not None:
            values = self._get(offs, scalar, count)
            parts += [values[i : i + 1] for i in range(count)]
            size = 12 + values.nbytes
            data_idxs = list(range(2, 2 + count))
        else:
            unpack, u64 = _U64.unpack_from, np.dtype(np.uint64)
            for _ in range(count):
                if offs + 8 > self._size:
                    raise _ShortRead(offs, 8, self._size)
                (n,) = unpack(flat, offs)
                if offs + 8 + n > self._size:
                    raise _ShortRead(offs + 8, n, self._size)
                parts.append(flat[offs : offs + 8].view(u64))
                parts.append(flat[offs + 8 : offs + 8 + n])
                offs += 8 + n
            size = offs - orig_offs
            data_idxs = list(range(3, len(parts), 2))  # the string bytes, after each length
        return size, parts, data_idxs, [GGUFValueType.ARRAY, GGUFValueType(item_type)]

    def _push_field(self, field, skip_sum=False):
        if field.name in self.fields:
            raise ValueError(f"duplicate key {field.name!r}")
        if self._stage == "metadata" and not field.name.startswith("GGUF."):
            self._n_done += 1
            self._last = field.name
        return super()._push_field(field, skip_sum)

    def _build_tensor_info(self, offs, count):
        self._stage, self._n_done, self._last, self._current = "tensor info", 0, None, None
        offs, fields = super()._build_tensor_info(offs, count)
        self._stage = KEY_ALIGNMENT  # the next thing GGUFReader checks
        # gguf-py checks this itself only from 0.19; the same check for every supported version.
        align = self.fields.get(KEY_ALIGNMENT)
        if align is not None and align.types == [GGUFValueType.UINT32]:
            value = int(align.parts[-1][0])
            if value == 0 or value & (value - 1):
                raise ValueError(f"invalid alignment {value}: must be a non-zero power of two")
        return offs, fields

    def _get_tensor_info_field(self, orig_offs):
        field = super()._get_tensor_info_field(orig_offs)
        self._n_done += 1
        self._last = field.name
        return field

    def _build_tensors(self, start_offs, fields):
        self._stage = "tensor data"
        seen = set()
        ranges = [_check_tensor_info(field, start_offs, self.alignment, self._size, seen) for field in fields]
        _check_no_overlap(ranges)
        super()._build_tensors(start_offs, fields)


class _TensorInfoError(Exception):
    """A tensor's header entry is unusable; the message names the tensor."""


def _check_tensor_info(field, start_offs: int, alignment: int, file_size: int, seen: set) -> tuple[int, int, str]:
    """Check one tensor info entry; return its data range ``(start, end, name)`` in file offsets."""
    _name_len, _name, n_dims, dims, raw_type, rel_offset = field.parts
    name = field.name
    if name in seen:
        raise _TensorInfoError(f"tensor {name!r}: appears twice")
    seen.add(name)
    type_id = int(raw_type[0])
    try:
        gtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise _TensorInfoError(f"tensor {name!r}: unknown tensor type id {type_id}") from None
    shape = tuple(int(d) for d in dims.tolist())
    if not 1 <= int(n_dims[0]) <= MAX_DIMS:
        raise _TensorInfoError(f"tensor {name!r}: {int(n_dims[0])} dimensions (ggml allows 1..{MAX_DIMS})")
    if any(ne <= 0 for ne in shape):
        raise _TensorInfoError(f"tensor {name!r}: empty dimension in shape {shape}")
    block_elems, block_bytes = GGML_QUANT_SIZES[gtype]
    if shape[0] % block_elems:
        raise _TensorInfoError(
            f"tensor {name!r}: ne0 = {shape[0]} is not a multiple of the {gtype.name} block ({block_elems})"
        )
    n_elements = 1
    for ne in shape:
        n_elements *= ne
    n_bytes = n_elements // block_elems * block_bytes
    offset = int(rel_offset[0])
    if offset % alignment:
        raise _TensorInfoError(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment {alignment}")
    if start_offs + offset + n_bytes > file_size:
        raise _TensorInfoError(
            f"tensor {name!r}: data ({n_bytes} bytes at offset {start_offs + offset}) runs past the end "
            f"of the file ({file_size} bytes; truncated?)"
        )
    return start_offs + offset, start_offs + offset + n_bytes, name


def _check_no_overlap(ranges: list[tuple[int, int, str]]) -> None:
    """No two tensors share a byte of data: two weights read from one place are a corrupt file.

    (Offsets are unsigned and relative to the data section, which starts after the header and the
    tensor infos, so no range can reach back into the header.)
    """
    ordered = sorted(ranges)
    for (start_a, end_a, a), (start_b, end_b, b) in zip(ordered, ordered[1:]):
        if start_b < end_a:
            raise _TensorInfoError(
                f"tensors {_shorten(a)!r} (bytes {start_a}..{end_a}) and {_shorten(b)!r} "
                f"(bytes {start_b}..{end_b}) overlap"
            )


def _read(path: Path, header: _Header) -> _CheckedReader:
    """Run gguf-py's reader; turn whatever it raises on a bad file into one GGUFError."""
    # Create first and initialise second, so that a failure can still report how far it got.
    reader = _CheckedReader.__new__(_CheckedReader)
    try:
        with np.errstate(all="ignore"):
            reader.__init__(path, header.file_size)
        return reader
    except _TensorInfoError as exc:
        raise GGUFError(f"{path}: {exc}") from None
    except Exception as exc:  # gguf-py signals a corrupt file with KeyError/IndexError/ValueError/...
        stage, done, last, current = reader._stage, reader._n_done, reader._last, reader._current
        reason = str(exc) if isinstance(exc, (_ShortRead, ValueError)) else f"{type(exc).__name__}: {exc}"
        if stage in ("metadata", "tensor info"):
            what, count = ("key", header.kv_count) if stage == "metadata" else ("tensor info", header.tensor_count)
            where = f"{what} #{done + 1} of {count}"
            if current is not None:
                where += f" {_shorten(current)!r}"
            elif last is not None:
                where += f" (after {_shorten(last)!r})"
        else:
            where = stage
        raise GGUFError(f"{path}: corrupt GGUF at {where}: {reason}") from None


def _plain_metadata(reader: GGUFReader, path: Path) -> dict[str, Any]:
    """Every key → plain python value (str, int, float, bool, or a list of them)."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # gguf-py's own entries for the header counts
        try:
            value = field.contents()
        except UnicodeDecodeError:
            raise GGUFError(f"{path}: {key}: string is not valid UTF-8") from None
        except Exception as exc:
            raise GGUFError(f"{path}: {key}: cannot decode value ({type(exc).__name__}: {exc})") from None
        meta[key] = value
    return meta


def _tensors(reader: GGUFReader, path: Path) -> dict[str, GGUFTensor]:
    """Memory-mapped views of every tensor, shaped by the library's data conventions."""
    tensors: dict[str, GGUFTensor] = {}
    mapped = reader.data  # the np.memmap of the whole file
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in SUPPORTED_QTYPES:
            raise GGUFError(
                f"{path}: tensor {t.name!r}: unsupported tensor type {qtype} (supported: {', '.join(SUPPORTED_QTYPES)})"
            )
        shape = tuple(int(d) for d in t.shape.tolist())
        raw = mapped[t.data_offset : t.data_offset + t.n_bytes]
        numpy_shape = tuple(reversed(shape))
        if qtype in FLOAT_DTYPES:
            data = raw.view(FLOAT_DTYPES[qtype]).reshape(numpy_shape)
        else:
            block_elems, block_bytes = _block_size(qtype)
            data = raw.reshape(numpy_shape[:-1] + (shape[0] // block_elems * block_bytes,))
        tensors[t.name] = GGUFTensor(t.name, qtype, shape, int(t.data_offset), int(t.n_bytes), data)
    return tensors


# --- validation against the Qwen3 layout ---------------------------------------------------


def _check_architecture(meta: dict[str, Any], path: Path) -> None:
    arch = meta.get(KEY_ARCHITECTURE)
    if arch != ARCHITECTURE:
        found = "missing" if arch is None else f"is {arch!r}"
        raise GGUFError(f"{path}: {KEY_ARCHITECTURE}: {found}, expected {ARCHITECTURE!r}")


def _check_tensors(tensors: dict[str, GGUFTensor], config: Qwen3Config, path: Path) -> None:
    expected = config.tensor_shapes()
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            raise GGUFError(f"{path}: tensor {name!r} missing")
        if t.shape != shape:
            raise GGUFError(f"{path}: tensor {name!r}: ggml shape {t.shape}, expected {shape} from the metadata")
        if len(shape) == 1 and t.qtype not in FLOAT_QTYPES:
            raise GGUFError(f"{path}: tensor {name!r}: type {t.qtype} for a 1-D weight (expected F32, F16 or BF16)")
    for name in tensors:
        if name not in expected:
            raise GGUFError(f"{path}: tensor {name!r} is not part of a Qwen3 model")


def _check_tokenizer(meta: dict[str, Any], config: Qwen3Config, path: Path) -> None:
    def fail(key: str, message: str):
        raise GGUFError(f"{path}: {key}: {message}")

    model = meta.get(KEY_TOKENIZER_MODEL)
    if model is None:
        fail(KEY_TOKENIZER_MODEL, "missing")
    if model != TOKENIZER_MODEL:
        fail(KEY_TOKENIZER_MODEL, f"is {model!r}, expected {TOKENIZER_MODEL!r} (byte-level BPE)")
    for key in (KEY_TOKENIZER_PRE, KEY_CHAT_TEMPLATE):
        if key in meta and not isinstance(meta[key], str):
            fail(key, f"must be a string, got {type(meta[key]).__name__}")
    tokens = meta[KEY_TOKENS]
    if not all(isinstance(t, str) for t in tokens):
        fail(KEY_TOKENS, "must be an array of strings")
    merges = meta.get(KEY_MERGES)
    if merges is None:
        fail(KEY_MERGES, "missing (a BPE vocabulary needs its merges)")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        fail(KEY_MERGES, "must be an array of strings")
    types = meta.get(KEY_TOKEN_TYPE)
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
            fail(KEY_TOKEN_TYPE, "must be an array of integers")
        if len(types) != config.n_vocab:
            fail(KEY_TOKEN_TYPE, f"{len(types)} entries for {config.n_vocab} tokens")
    for key in (KEY_BOS_ID, KEY_EOS_ID, KEY_PAD_ID):
        if key in meta:
            value = meta[key]
            if isinstance(value, bool) or not isinstance(value, int):
                fail(key, f"must be an integer, got {value!r}")
            if not 0 <= value < config.n_vocab:
                fail(key, f"token id {value} outside the vocabulary of {config.n_vocab}")


# --- small helpers --------------------------------------------------------------------------


def _shorten(name: str, limit: int = 64) -> str:
    """A name read from a corrupt header can be long garbage: keep messages to one short line."""
    return name if len(name) <= limit else name[:limit] + "..."


def _block_size(qtype: str) -> tuple[int, int]:
    """(elements, bytes) of one block of ``qtype`` (gguf.constants.GGML_QUANT_SIZES)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
