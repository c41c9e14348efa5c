"""Q4_K weights in 16-row tile records: the layout the sub-block kernels read under ``HIRAISHIN_MMQ_WTILE=1``.

ggml stores a Q4_K weight row by row, each row its super-blocks of 144 bytes (d, dmin and 12 scale bytes: a 16-byte
header; then 128 bytes of qs in four 32-byte chunks). The MMA kernel's lanes read 16 rows at once (rows g and g + 8
of a tile, g = lane / 4), so each of a warp's weight loads touches 8 rows 2,304 bytes (K = 4096) apart: 8 cache lines
for 256 bytes (bench/NOTES_speculation.md, session 11: L1 the busiest unit). Here the tile's super-block i is one
record of 16 * 144 bytes::

    [jp = 0..3][row 0..15][32 bytes]   qs chunk jp of each of the tile's rows   (2,048 bytes)
    [row 0..15][16 bytes]              each row's header                        (256 bytes)

records in order (tile, super-block). A load of chunk jp by rows g = 0..7 then reads 256 contiguous bytes; a header
load 128. The bytes are ggml's, regrouped, so a weight's tiles take exactly its bytes, and the tile of rows
16 T .. 16 T + 15 occupies the same byte range as those rows did (the kernels' L2 prefetch of a tile is unchanged).
Where bytes sit changes no float operation: the kernels give the same bits (tests/test_mmq_wtile.py).

A model's layout is a choice (``Qwen3.set_weight_layout("rows" | "tiles")``, ``Qwen3.use_weight_layout_for(order)``),
made on the device in place. Only weights whose rows come in whole tiles (N a multiple of 16; every Qwen3
projection) are tiled, and only the sub-block kernels read tiles: the backend refuses another order's mat-vec of a
tiled weight.
"""

from __future__ import annotations

import numpy as np

from ...quant import BLOCK_BYTES, QK_K
from ...switches import env_flag

__all__ = ["ENV_MMQ_WTILE", "WTILE_ROWS", "HEADER_BYTES", "CHUNK_BYTES", "WEIGHT_LAYOUTS", "SUBBLOCK_TILES",
           "subblock_prefers_tiles", "tiles_weight", "tile_q4k", "untile_q4k"]

WTILE_ROWS = 16  # the M of mma.m16n8k32: the rows one warp's MMA reads (plans/subblock.py SUBBLOCK_TILE_ROWS)
HEADER_BYTES = 16  # Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins
CHUNK_BYTES = 32  # one qs chunk: 32 bytes, values of two sub-blocks (low and high nibbles)
_CHUNKS = (BLOCK_BYTES["Q4_K"] - HEADER_BYTES) // CHUNK_BYTES  # 4

WEIGHT_LAYOUTS = ("rows", "tiles")  # a model's Q4_K projections: ggml's rows, or these tile records
# Whether SUBBLOCK passes read tiles (Qwen3.use_weight_layout_for). H100, session 31 (bench/results/
# 2026-12-06-h100-session31/h-tiles-no-spill), SUBBLOCK graph replays of the 8B shape, same logits digests: rows ->
# tiles 2.478 -> 2.440 / 2.893 -> 2.647 / 3.034 -> 2.756 / 3.107 -> 2.813 ms at 1 / 2 / 3 / 4 tokens, the 0.6B 4-6%
# faster; the bench's exact speculation 1.36x -> 1.47x. The one-token pass needs the dp4a block's copy of its pieces of
# the records (launch.py DP4A_WSTAGE): read from global memory, 2.475 -> 2.637 (a-wtile-first). HIRAISHIN_MMQ_WTILE=0:
# SUBBLOCK keeps ggml's rows (the A/B).
ENV_MMQ_WTILE = "HIRAISHIN_MMQ_WTILE"
SUBBLOCK_TILES = True


def subblock_prefers_tiles() -> bool:
    """Whether SUBBLOCK passes on CUDA read Q4_K tiles: :data:`SUBBLOCK_TILES` unless ``HIRAISHIN_MMQ_WTILE`` says
    otherwise (on/off; read at each call)."""
    return env_flag(ENV_MMQ_WTILE, SUBBLOCK_TILES, "SUBBLOCK's Q4_K weights in 16-row tile records")


def tiles_weight(name: str, qtype: str, shape: tuple) -> bool:
    """Whether weight ``name`` (ggml ``shape`` (K, N)) is laid out as tiles in a model whose layout is "tiles": a
    Q4_K projection of a layer (``blk.*``; not the token embedding, whose rows are looked up) of whole tiles."""
    return (qtype == "Q4_K" and name.startswith("blk.") and len(shape) == 2 and shape[1] % WTILE_ROWS == 0
            and shape[0] % QK_K == 0)


def _check(data, what: str) -> tuple[int, int]:
    if data.ndim != 2 or data.dtype != np.uint8:
        raise ValueError(f"{what}: expected uint8 (N, row_bytes) Q4_K rows, got {data.dtype} {data.shape}")
    n, row_bytes = data.shape
    if n % WTILE_ROWS or row_bytes % BLOCK_BYTES["Q4_K"]:
        raise ValueError(f"{what}: {n} rows of {row_bytes} bytes are not whole tiles of {WTILE_ROWS} rows of "
                         f"{BLOCK_BYTES['Q4_K']}-byte super-blocks")
    return n, row_bytes // BLOCK_BYTES["Q4_K"]


def tile_q4k(data, xp=np):
    """ggml's Q4_K rows (uint8 (N, row_bytes), N a multiple of 16) as tile records, a new array of the same shape and
    bytes (``xp``: the array module of ``data``, numpy or cupy)."""
    n, nb = _check(data, "tile_q4k")
    sb = xp.asarray(data).reshape(n // WTILE_ROWS, WTILE_ROWS, nb, BLOCK_BYTES["Q4_K"]).transpose(0, 2, 1, 3)
    qs = sb[..., HEADER_BYTES:].reshape(n // WTILE_ROWS, nb, WTILE_ROWS, _CHUNKS, CHUNK_BYTES).transpose(0, 1, 3, 2, 4)
    head = sb[..., :HEADER_BYTES]
    out = xp.concatenate([qs.reshape(n // WTILE_ROWS, nb, -1), head.reshape(n // WTILE_ROWS, nb, -1)], axis=2)
    return xp.ascontiguousarray(out).reshape(data.shape)


def untile_q4k(data, xp=np):
    """The inverse of :func:`tile_q4k`: tile records back to ggml's rows (a new array)."""
    n, nb = _check(data, "untile_q4k")
    rec = xp.asarray(data).reshape(n // WTILE_ROWS, nb, WTILE_ROWS * BLOCK_BYTES["Q4_K"])
    cut = _CHUNKS * WTILE_ROWS * CHUNK_BYTES
    qs = rec[..., :cut].reshape(n // WTILE_ROWS, nb, _CHUNKS, WTILE_ROWS, CHUNK_BYTES).transpose(0, 1, 3, 2, 4)
    head = rec[..., cut:].reshape(n // WTILE_ROWS, nb, WTILE_ROWS, HEADER_BYTES)
    sb = xp.concatenate([head, qs.reshape(n // WTILE_ROWS, nb, WTILE_ROWS, -1)], axis=3)
    return xp.ascontiguousarray(sb.transpose(0, 2, 1, 3)).reshape(data.shape)
