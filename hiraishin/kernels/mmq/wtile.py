"""Q4_K and Q6_K weights in 16-row tile records: the layout SUBBLOCK's kernels read fastest.

ggml stores a weight row by row, each row its super-blocks (Q4_K: 144 bytes, a 16-byte header of d, dmin and 12
scale bytes, then 128 bytes of qs in four 32-byte chunks; Q6_K: 210 bytes, 128 of ql, 64 of qh, 16 int8 scales, the
fp16 d). The MMA kernel's lanes read 16 rows at once (rows g and g + 8 of a tile, g = lane / 4), so each of a warp's
weight loads touches 8 rows a row's length apart (2,304 bytes for Q4_K at K = 4096): 8 cache lines for 128-256
bytes (bench/NOTES_speculation.md, session 11: L1 the busiest unit). Here the tile's super-block i is one record of
16 super-blocks' bytes, cut into pieces that every row has, each piece stored for the 16 rows together::

    Q4_K  [chunk jp = 0..3][row 0..15][32 bytes]  then  [row 0..15][16 bytes: the header]       16 * 144 bytes
    Q6_K  [group q = 0..12][row 0..15][16 bytes]  then  [row 0..15][2 bytes: d]                 16 * 210 bytes
          (groups 0..7: ql, 8..11: qh, 12: the scales; 16 bytes each)

records in order (tile, super-block). A load of one piece by rows g = 0..7 then reads contiguous bytes (Q4_K 256,
Q6_K 128), and Q6_K's pieces are all 16-byte aligned where its rows were 2-byte aligned. The bytes are ggml's,
regrouped (:data:`PIECES`), so a weight's tiles take exactly its bytes, and the tile of rows 16 T .. 16 T + 15
occupies the same byte range as those rows did (the kernels' L2 prefetch of a tile is unchanged). Where bytes sit
changes no float operation: the kernels give the same bits (tests/test_mmq_wtile.py).

A model's layout is a choice (``Qwen3.set_weight_layout("rows" | "tiles")``, ``Qwen3.use_weight_layout_for(order)``),
made on the device in place. Only matrices whose rows come in whole tiles (N a multiple of 16; every Qwen3
projection) are tiled, Q6_K ones only under ``HIRAISHIN_MMQ_WTILE_Q6K=1`` (untimed), and only the sub-block
kernels read tiles: the backend refuses another order's mat-vec of a tiled weight.
"""

from __future__ import annotations

import numpy as np

from ...quant import BLOCK_BYTES, QK_K
from ...switches import env_flag

__all__ = ["ENV_MMQ_WTILE", "ENV_MMQ_WTILE_Q6K", "WTILE_ROWS", "PIECES", "WEIGHT_LAYOUTS", "SUBBLOCK_TILES",
           "TILE_QTYPES", "subblock_prefers_tiles", "tile_qtypes", "tiles_weight", "tile_weight",
           "untile_weight"]

WTILE_ROWS = 16  # the M of mma.m16n8k32: the rows one warp's MMA reads (plans/subblock.py SUBBLOCK_TILE_ROWS)
# A record's pieces in order, as (byte offset in the super-block, bytes): each stored for the tile's 16 rows together.
PIECES = {
    "Q4_K": tuple((16 + 32 * jp, 32) for jp in range(4)) + ((0, 16),),  # qs chunks, then d, dmin, scales
    "Q6_K": tuple((16 * q, 16) for q in range(13)) + ((208, 2),),       # ql, qh, scales in 16-byte groups, then d
}
TILE_QTYPES = tuple(PIECES)

WEIGHT_LAYOUTS = ("rows", "tiles")  # a model's projections: ggml's rows, or these tile records
# Whether SUBBLOCK passes read tiles (Qwen3.use_weight_layout_for). H100, session 31 (bench/results/
# 2026-12-06-h100-session31/h-tiles-no-spill), SUBBLOCK graph replays of the 8B shape, same logits digests: rows ->
# tiles 2.478 -> 2.440 / 2.893 -> 2.647 / 3.034 -> 2.756 / 3.107 -> 2.813 ms at 1 / 2 / 3 / 4 tokens, the 0.6B 4-6%
# faster; the bench's exact speculation 1.36x -> 1.47x. The one-token pass needs the dp4a block's copy of its pieces of
# the records (launch.py DP4A_WSTAGE): read from global memory, 2.475 -> 2.637 (a-wtile-first). HIRAISHIN_MMQ_WTILE=0:
# SUBBLOCK keeps ggml's rows (the A/B).
ENV_MMQ_WTILE = "HIRAISHIN_MMQ_WTILE"
SUBBLOCK_TILES = True
# Q6_K in tiles too (attn_v and ffn_down in half of a Q4_K_M model's layers, the output head): the MMA kernel's loads
# of a piece read 128 contiguous 16-byte-aligned bytes where they read 8 rows 2-byte aligned (funnel-shifted words),
# and the dp4a kernel copies its block's pieces (8 rows a block). CPU-tested (tests/test_mmq_wtile.py), not yet timed:
# off unless HIRAISHIN_MMQ_WTILE_Q6K=1 (the A/B: final_session.sh STEPS=ab AB_VAR=HIRAISHIN_MMQ_WTILE_Q6K
# AB_VALUES="0 1" AB_ORDERS=subblock AB_WIDTHS=1,2,3,4).
ENV_MMQ_WTILE_Q6K = "HIRAISHIN_MMQ_WTILE_Q6K"


def subblock_prefers_tiles() -> bool:
    """Whether SUBBLOCK passes on CUDA read tiles: :data:`SUBBLOCK_TILES` unless ``HIRAISHIN_MMQ_WTILE`` says
    otherwise (on/off; read at each call)."""
    return env_flag(ENV_MMQ_WTILE, SUBBLOCK_TILES, "SUBBLOCK's weights in 16-row tile records")


def tile_qtypes() -> tuple:
    """The weight types a model in tiles lays out as tiles: Q4_K, and Q6_K under ``HIRAISHIN_MMQ_WTILE_Q6K=1``."""
    return TILE_QTYPES if env_flag(ENV_MMQ_WTILE_Q6K, False, "Q6_K weights in tiles") else ("Q4_K",)


def tiles_weight(name: str, qtype: str, shape: tuple) -> bool:
    """Whether weight ``name`` (ggml ``shape`` (K, N)) is laid out as tiles in a model whose layout is "tiles": a
    matrix of :func:`tile_qtypes` whose rows only multiply (a layer's projection or the output head, not the token
    embedding, whose rows are looked up) and come in whole tiles."""
    return (qtype in tile_qtypes() and (name.startswith("blk.") or name == "output.weight") and len(shape) == 2
            and shape[1] % WTILE_ROWS == 0 and shape[0] % QK_K == 0)


def _check(data, qtype: str, what: str) -> tuple[int, int]:
    if qtype not in PIECES:
        raise ValueError(f"{what}: tiles are of {', '.join(PIECES)} weights, not {qtype}")
    if data.ndim != 2 or data.dtype != np.uint8:
        raise ValueError(f"{what}: expected uint8 (N, row_bytes) {qtype} rows, got {data.dtype} {data.shape}")
    n, row_bytes = data.shape
    if n % WTILE_ROWS or row_bytes % BLOCK_BYTES[qtype]:
        raise ValueError(f"{what}: {n} rows of {row_bytes} bytes are not whole tiles of {WTILE_ROWS} rows of "
                         f"{BLOCK_BYTES[qtype]}-byte super-blocks")
    return n, row_bytes // BLOCK_BYTES[qtype]


def tile_weight(data, qtype: str, xp=np):
    """ggml's ``qtype`` rows (uint8 (N, row_bytes), N a multiple of 16) as tile records, a new array of the same shape
    and bytes (``xp``: the array module of ``data``, numpy or cupy)."""
    n, nb = _check(data, qtype, "tile_weight")
    sb = xp.asarray(data).reshape(n // WTILE_ROWS, WTILE_ROWS, nb, BLOCK_BYTES[qtype]).transpose(0, 2, 1, 3)
    parts = [sb[..., off:off + size].reshape(n // WTILE_ROWS, nb, WTILE_ROWS * size) for off, size in PIECES[qtype]]
    return xp.ascontiguousarray(xp.concatenate(parts, axis=2)).reshape(data.shape)


def untile_weight(data, qtype: str, xp=np):
    """The inverse of :func:`tile_weight`: tile records back to ggml's rows (a new array)."""
    n, nb = _check(data, qtype, "untile_weight")
    rec = xp.asarray(data).reshape(n // WTILE_ROWS, nb, WTILE_ROWS * BLOCK_BYTES[qtype])
    parts, at = {}, 0
    for off, size in PIECES[qtype]:
        parts[off] = rec[..., at:at + WTILE_ROWS * size].reshape(n // WTILE_ROWS, nb, WTILE_ROWS, size)
        at += WTILE_ROWS * size
    sb = xp.concatenate([parts[off] for off in sorted(parts)], axis=3)  # the pieces back in super-block order
    return xp.ascontiguousarray(sb.transpose(0, 2, 1, 3)).reshape(data.shape)
