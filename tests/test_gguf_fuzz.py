"""Corrupt header bytes of a valid file: opening it either succeeds or raises GGUFError, never
another exception (KeyError, IndexError, struct.error, ValueError from gguf-py) and never a hang."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiraishin.errors import GGUFError
from hiraishin.model.gguf_file import open_qwen3_gguf

FUZZ_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values that hit edge cases of lengths, counts, types and offsets.
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 12, 13, 31, 32, 33, 255, 256, 4096, 1 << 16, (1 << 31) - 1, 1 << 31,
               (1 << 32) - 1, 1 << 40, 1 << 63, (1 << 64) - 1]


def header_offsets(path: Path) -> list[int]:
    """Offsets of the header's structural fields: magic, version, counts, each key's length, name,
    value type, array item type and count, the first array elements, and each tensor info's parts."""
    reader = GGUFReader(path)
    offsets = list(range(0, 24, 4))
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        klen = int(field.parts[0][0])
        start = field.offset
        offsets += [start, start + 8, start + 8 + klen]  # key length, key bytes, value type
        value_at = start + 8 + klen + 4
        offsets.append(value_at)
        if field.types[0] == GGUFValueType.ARRAY:
            offsets += [value_at + 4, value_at + 12, value_at + 20]  # count, first elements
    for t in reader.tensors:
        start = t.field.offset
        nlen = int(t.field.parts[0][0])
        n_dims_at = start + 8 + nlen
        type_at = n_dims_at + 4 + 8 * len(t.shape)
        offsets += [start, start + 8, n_dims_at, n_dims_at + 4, n_dims_at + 12, type_at, type_at + 4]
    return sorted(set(offsets))


@pytest.fixture(scope="module")
def valid(micro_model_path):
    data = Path(micro_model_path).read_bytes()
    return data, header_offsets(micro_model_path)


_names = itertools.count()


def check_opens_or_gguf_error(path: Path) -> None:
    try:
        m = open_qwen3_gguf(path)
    except GGUFError as exc:
        assert str(path) in str(exc)
        return
    assert m.config.n_vocab == len(m.tokens) and set(m.tensors) == set(m.config.tensor_shapes())


@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_header_bytes(valid, tmp_path, data):
    raw, offsets = valid
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        at = data.draw(st.sampled_from(offsets), label="field") + data.draw(st.integers(0, 3), label="shift")
        width = data.draw(st.sampled_from([1, 4, 8]), label="width")
        value = data.draw(st.one_of(st.sampled_from(INTERESTING), st.integers(0, (1 << 64) - 1)), label="value")
        patch = struct.pack("<Q", value % (1 << 64))[:width]
        if data.draw(st.booleans(), label="random bytes instead"):
            patch = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        mutated[at : at + len(patch)] = patch
    path = tmp_path / f"fuzz{next(_names)}.gguf"
    path.write_bytes(bytes(mutated[: len(raw)]))
    try:
        check_opens_or_gguf_error(path)
    finally:
        path.unlink()


@FUZZ_SETTINGS
@given(data=st.data())
def test_truncated_anywhere(valid, tmp_path, data):
    raw, offsets = valid
    header_end = offsets[-1] + 16
    cut = data.draw(st.one_of(st.integers(0, header_end), st.integers(0, len(raw) - 1)), label="cut")
    path = tmp_path / f"cut{next(_names)}.gguf"
    path.write_bytes(raw[:cut])
    try:
        with pytest.raises(GGUFError) as err:
            open_qwen3_gguf(path)
        assert str(path) in str(err.value)
    finally:
        path.unlink()
