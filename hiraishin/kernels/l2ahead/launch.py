"""Launcher of ``l2ahead.cu``: L2 prefetches of weight spans on a stream beside the pass."""

from __future__ import annotations

import functools

import numpy as np

from ..compile import get_kernel

__all__ = ["AHEAD_MAX_SPANS", "AHEAD_THREADS", "AHEAD_CHUNK", "trimmed_span", "launch"]

AHEAD_MAX_SPANS = 4  # the kernel's pointer/length pairs
AHEAD_THREADS = 128
# Bytes a thread asks for at a time: one bulk prefetch (the copy engine walks it), or that many bytes
# of 128-byte line prefetches. Not tuned beyond "a few thousand chunks for a layer's small weights".
AHEAD_CHUNK = {True: 16384, False: 4096}
AHEAD_MAX_BLOCKS = 128  # about one block per SM of an H100/H200: the chunks are spread over many SMs


@functools.cache
def _kernel(bulk: bool):
    return get_kernel("l2ahead/l2ahead.cu", "hx_l2_ahead",
                      {"HX_BULK": int(bulk), "HX_CHUNK": AHEAD_CHUNK[bool(bulk)]})


def trimmed_span(ptr: int, nbytes: int, limit: int | None = None) -> tuple[int, int]:
    """``(start, length)`` of the 16-byte-aligned bytes inside ``[ptr, ptr + min(nbytes, limit))``
    (what a bulk prefetch accepts; the few bytes cut at either end are simply not prefetched)."""
    end = ptr + (nbytes if limit is None else max(0, min(nbytes, int(limit))))
    start = (ptr + 15) // 16 * 16
    end = end // 16 * 16
    return start, max(0, end - start)


def launch(spans, stream, bulk: bool = True) -> int:
    """Launch ``hx_l2_ahead`` on ``stream`` for up to :data:`AHEAD_MAX_SPANS` ``(array, limit)``
    spans (the first ``limit`` bytes of each device array's data, ``None``: all of it), in the
    order they will be read; returns the bytes asked for (0: nothing launched)."""
    spans = list(spans)
    if len(spans) > AHEAD_MAX_SPANS:
        raise ValueError(f"hx_l2_ahead takes at most {AHEAD_MAX_SPANS} spans, got {len(spans)}")
    args, total, chunks = [], 0, 0
    for a, limit in spans:
        start, n = trimmed_span(int(a.data.ptr), int(a.nbytes), limit)
        args += [np.uint64(start), np.int64(n)]
        total += n
        chunks += -(-n // AHEAD_CHUNK[bool(bulk)])
    args += [np.uint64(0), np.int64(0)] * (AHEAD_MAX_SPANS - len(spans))
    if total == 0:
        return 0
    blocks = max(1, min(AHEAD_MAX_BLOCKS, -(-chunks // AHEAD_THREADS)))
    _kernel(bool(bulk))((blocks,), (AHEAD_THREADS,), tuple(args), stream=stream)
    return total
