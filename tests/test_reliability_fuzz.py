"""Fuzz the header, metadata (vocabulary and merges included) and tensor-info bytes of a ``micro``
file through the whole public path: every mutated file either loads AND runs a one-token forward
on the CPU, or fails with the library's own error (a ``HiraishinError`` naming the file), within
a time limit. Never another exception, never a hang.

A seeded loop rather than hypothesis: thousands of cases of ~20-80 ms each must fit in about a
minute, and every case is reproducible from its index (``CASE_SEED``, i).
"""

from __future__ import annotations

import contextlib
import signal
import struct
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from hiraishin.errors import HiraishinError

# Cases in one run: thousands, within about a minute on one core (most cases fail at parse time,
# a few tens of ms; those that load also run a forward pass of ~15 ms).
N_CASES = 2000
CASE_SEED = 20261201
# A case takes well under a second; one that takes this long is a hang (or a runaway allocation).
PER_CASE_S = 10.0
# KV cells of the loaded model: a one-token forward needs one; small keeps each load cheap.
N_CTX = 16
# Where mutations go, and how often: the first 24 bytes (magic, version, counts), the structure
# of the key/value entries (lengths, types, counts), scalar values, the vocabulary (token and
# merge strings and their lengths, token types) and the tensor infos (name, dims, type, offset).
REGION_WEIGHTS = {"header": 1, "kv structure": 3, "kv values": 2, "vocabulary": 3, "tensor info": 3}
# Values that hit edge cases of lengths, counts, types and offsets.
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 12, 13, 31, 32, 33, 255, 256, 4095, 4096, 1 << 16, (1 << 31) - 1,
               1 << 31, (1 << 32) - 1, 1 << 40, 1 << 63, (1 << 64) - 1]
VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def _regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges ``(start, end)`` of each region of the file, from gguf-py's stock reader."""
    reader = GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]

    def span(part: np.ndarray) -> tuple[int, int]:
        start = part.__array_interface__["data"][0] - base
        return start, start + part.nbytes

    regions: dict[str, list[tuple[int, int]]] = {name: [] for name in REGION_WEIGHTS}
    regions["header"].append((0, 24))
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        data_parts = set(field.data)
        for i, part in enumerate(field.parts):
            if i in data_parts:  # a value (or one array element)
                region = "vocabulary" if key in VOCAB_KEYS else "kv values"
            elif key in VOCAB_KEYS and i > 4:  # the length of one token or merge string
                region = "vocabulary"
            else:  # key length, key bytes, value type, array item type and count
                region = "kv structure"
            regions[region].append(span(part))
    for t in reader.tensors:
        regions["tensor info"] += [span(part) for part in t.field.parts]
    return regions


class _CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise _CaseTimeout in this (main) thread after ``seconds`` of wall time."""

    def expire(signum, frame):
        raise _CaseTimeout(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _mutate(raw: bytes, regions, rng: np.random.Generator) -> tuple[bytes, list[str]]:
    """One to three mutations in randomly chosen regions; returns the bytes and what was done."""
    names = list(REGION_WEIGHTS)
    weights = np.array([REGION_WEIGHTS[n] for n in names], float)
    data = bytearray(raw)
    done = []
    for _ in range(int(rng.integers(1, 4))):
        region = names[rng.choice(len(names), p=weights / weights.sum())]
        start, end = regions[region][rng.integers(len(regions[region]))]
        kind = rng.integers(3)
        if kind == 0:  # flip one bit
            at = int(rng.integers(start, end))
            bit = int(rng.integers(8))
            data[at] ^= 1 << bit
            done.append(f"{region}: flip bit {bit} of byte {at}")
        elif kind == 1:  # one random byte
            at = int(rng.integers(start, end))
            data[at] = int(rng.integers(256))
            done.append(f"{region}: byte {at} = {data[at]:#04x}")
        else:  # an interesting integer over the start of the field
            value = INTERESTING[rng.integers(len(INTERESTING))]
            width = (1, 4, 8)[rng.integers(3)]
            patch = struct.pack("<Q", value)[:width]
            data[start : start + width] = patch
            done.append(f"{region}: {width} bytes at {start} = {value}")
    return bytes(data[: len(raw)]), done


def test_mutated_files_load_and_run_or_raise_library_errors(micro_model_path, tmp_path):
    from hiraishin import Qwen3

    raw = Path(micro_model_path).read_bytes()
    regions = _regions(Path(micro_model_path))
    Qwen3.from_gguf(micro_model_path, device="cpu", n_ctx=N_CTX, progress=False).forward([0], 0)  # compile once

    outcomes = {"ran": 0, "library error": 0}
    failures = []
    slowest = (0.0, None)
    t_start, cpu_start = time.perf_counter(), time.process_time()
    for case in range(N_CASES):
        rng = np.random.default_rng([CASE_SEED, case])
        mutated, done = _mutate(raw, regions, rng)
        path = tmp_path / f"case{case}.gguf"
        path.write_bytes(mutated)
        t0 = time.perf_counter()
        try:
            with _deadline(PER_CASE_S):
                try:
                    model = Qwen3.from_gguf(path, device="cpu", n_ctx=N_CTX, progress=False)
                    logits = model.forward([0], 0)
                    if np.shape(logits) != (1, model.config.n_vocab):
                        failures.append((case, done, f"logits of shape {np.shape(logits)}"))
                    outcomes["ran"] += 1
                    del model, logits
                except HiraishinError as exc:
                    message = str(exc)
                    if str(path) not in message or "\n" in message:
                        failures.append((case, done, f"error not one line naming the file: {message!r}"))
                    outcomes["library error"] += 1
        except Exception as exc:  # noqa: BLE001 -- anything else is what this test looks for
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append((case, done, f"{type(exc).__name__}: {exc} ({Path(tb.filename).name}:{tb.lineno})"))
        finally:
            path.unlink()
        took = time.perf_counter() - t0
        if took > slowest[0]:
            slowest = (took, case)
    elapsed, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start

    report = "\n".join(f"case {c} [{'; '.join(d)}]: {why}" for c, d, why in failures[:10])
    assert not failures, f"{len(failures)} of {N_CASES} cases failed (seed {CASE_SEED}):\n{report}"
    # The fuzzing reaches both outcomes in earnest: not every file rejected, not every one accepted.
    assert outcomes["ran"] >= N_CASES // 40 and outcomes["library error"] >= N_CASES // 2, outcomes
    assert slowest[0] < PER_CASE_S, slowest
    print(f"\n{N_CASES} cases in {elapsed:.1f} s ({cpu:.1f} s CPU): {outcomes}, "
          f"slowest case {slowest[1]} ({slowest[0]:.2f} s)")


def test_the_region_map_covers_what_it_claims(micro_model_path):
    regions = _regions(Path(micro_model_path))
    raw = Path(micro_model_path).read_bytes()
    assert all(regions.values())
    tokens_at = raw.index(b"tokenizer.ggml.tokens")
    assert any(s > tokens_at for s, _ in regions["vocabulary"])
    assert len(regions["vocabulary"]) > 2 * 4096  # token strings, their lengths, merges, types
    first_tensor = min(s for s, _ in regions["tensor info"])
    assert raw[first_tensor + 8 : first_tensor + 8 + len(b"token_embd.weight")] == b"token_embd.weight"


@pytest.mark.parametrize("case", range(5))
def test_mutations_are_reproducible(micro_model_path, case):
    raw = Path(micro_model_path).read_bytes()
    regions = _regions(Path(micro_model_path))
    one = _mutate(raw, regions, np.random.default_rng([CASE_SEED, case]))
    two = _mutate(raw, regions, np.random.default_rng([CASE_SEED, case]))
    assert one == two and one[0] != raw and len(one[0]) == len(raw)
