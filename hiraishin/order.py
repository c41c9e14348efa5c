"""Reduction orders: the order of float adds as data.

A :class:`ReductionOrder` is a policy, the lowest layer of the library: plain data. Given the
shape of one pass (how many columns a mat-vec gets, how many queries an attention launch gets,
how long the KV cache is, which device), :mod:`hiraishin.plans` turns it into a *plan*: the
geometry every kernel uses to group its float additions. The kernels (``hiraishin.kernels``)
and their CPU emulators both execute plans, so batch-variant and batch-invariant orders are one
argument, not two code paths.

Presets:

* ``BATCH_VARIANT``: stock llama.cpp choices (nwarps from the column count,
  llama.cpp's MMQ order on int8 tensor cores past 8 columns, attention parallel
  blocks from the occupancy of whichever kernel is launched).
* ``BATCH_INVARIANT``: every column walks the single-token geometry, batches
  are split into launches of at most 8 columns, attention parallel blocks come
  from the one-query kernel, and verify batches stop at multiples of 256 KV cells.
* ``FIXED_SPLIT``: invariant mat-vec, and attention that splits the KV cache
  at fixed cell positions (SGLang's deterministic mode, Thinking Machines'
  kernels) instead of into a fixed number of blocks.
* ``SUBBLOCK``: an exact order built for the batch. Q4_K/Q6_K mat-vecs scale and accumulate each
  32-value sub-block's exact integer dot product in k order, in K-segments fixed by the row
  length alone (``hiraishin/plans/subblock.py``), so 1 and 16 columns do the same float work and
  int8 tensor cores (``hiraishin/kernels/mmq``) take the extra columns; attention and the 256-cell
  guard as ``BATCH_INVARIANT``. Its plain decoding is its own reference: its bits differ from
  ``BATCH_VARIANT``'s (and ``BATCH_INVARIANT``'s) one-token bits, as any other order's would.
* :meth:`ReductionOrder.custom`: any explicit geometry, for teaching.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar, Literal

from .errors import PlanError

__all__ = ["ReductionOrder"]

MatVecPolicy = Literal["variant", "invariant", "subblock", "custom"]
AttentionPolicy = Literal["variant", "invariant", "fixed_split", "custom"]

# Verify batches of the invariant policy end at multiples of this many KV cells:
# llama.cpp pads the attended KV range to a multiple of 256 (FATTN_KQ_STRIDE and
# llama_kv_cache::get_n_kv), so crossing one changes the chunk count, hence P.
KV_PAD = 256


@dataclass(frozen=True)
class ReductionOrder:
    """A policy that turns the shape of a pass into kernel geometry.

    Fields left ``None`` are chosen by the policy; set them (through
    :meth:`custom`) to force a geometry.
    """

    name: str
    matvec: MatVecPolicy = "variant"
    attention: AttentionPolicy = "variant"
    # mat-vec geometry overrides (custom)
    nwarps: int | None = None
    rows_per_block: int | None = None
    max_cols_per_launch: int = 8
    # attention geometry overrides (custom / fixed_split)
    parallel_blocks: int | None = None
    split_cells: int | None = None
    # speculative verify batches end at multiples of this many KV cells (None: no guard)
    kv_boundary: int | None = None
    # device profile name used when no GPU is asked (None: the default profile)
    device: str | None = None

    BATCH_VARIANT: ClassVar["ReductionOrder"]
    BATCH_INVARIANT: ClassVar["ReductionOrder"]
    FIXED_SPLIT: ClassVar["ReductionOrder"]
    SUBBLOCK: ClassVar["ReductionOrder"]

    def __post_init__(self):
        if self.nwarps is not None and not 1 <= self.nwarps <= 32:
            raise PlanError(f"{self.name}: nwarps must be in 1..32, got {self.nwarps}")
        if not 1 <= self.max_cols_per_launch <= 16:
            raise PlanError(
                f"{self.name}: max_cols_per_launch must be in 1..16, got {self.max_cols_per_launch}"
            )
        if self.parallel_blocks is not None and self.parallel_blocks < 1:
            raise PlanError(f"{self.name}: parallel_blocks must be >= 1, got {self.parallel_blocks}")
        if self.split_cells is not None and (self.split_cells < 128 or self.split_cells % 128):
            raise PlanError(
                f"{self.name}: split_cells must be a positive multiple of 128, got {self.split_cells}"
            )
        if self.kv_boundary is not None and self.kv_boundary < 1:
            raise PlanError(f"{self.name}: kv_boundary must be >= 1, got {self.kv_boundary}")
        # Orders key every plan cache and prepared launch: hash the fields once, not per lookup.
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def custom(cls, name: str = "custom", **geometry) -> "ReductionOrder":
        """An explicit geometry, e.g. ``ReductionOrder.custom(nwarps=3)``.

        Fields not given keep the batch-invariant defaults; giving ``nwarps``
        or ``rows_per_block`` makes the mat-vec policy ``custom``, giving
        ``parallel_blocks`` makes the attention policy ``custom``.
        """
        base = dict(matvec="invariant", attention="invariant", kv_boundary=KV_PAD)
        if "nwarps" in geometry or "rows_per_block" in geometry:
            base["matvec"] = "custom"
        if "parallel_blocks" in geometry:
            base["attention"] = "custom"
        base.update(geometry)
        return cls(name=name, **base)

    def with_device(self, device: str) -> "ReductionOrder":
        """The same policy, planning for the named device profile."""
        return replace(self, device=device)

    def verify_limit(self, start_pos: int, n_tokens: int) -> int:
        """How many of ``n_tokens`` tokens starting at ``start_pos`` one verify pass may take.

        With a ``kv_boundary`` the pass stops at the next multiple of it, so
        that no batch straddles a padding boundary of the attended KV range.
        """
        if n_tokens < 1:
            raise PlanError(f"verify_limit needs n_tokens >= 1, got {n_tokens}")
        if self.kv_boundary is None:
            return n_tokens
        next_boundary = (start_pos // self.kv_boundary + 1) * self.kv_boundary
        return max(1, min(n_tokens, next_boundary - start_pos))

    def __str__(self) -> str:
        return self.name


ReductionOrder.BATCH_VARIANT = ReductionOrder(name="batch_variant", matvec="variant", attention="variant")
ReductionOrder.BATCH_INVARIANT = ReductionOrder(
    name="batch_invariant", matvec="invariant", attention="invariant", kv_boundary=KV_PAD
)
ReductionOrder.FIXED_SPLIT = ReductionOrder(
    name="fixed_split", matvec="invariant", attention="fixed_split", split_cells=256
)
ReductionOrder.SUBBLOCK = ReductionOrder(
    name="subblock", matvec="subblock", attention="invariant", kv_boundary=KV_PAD
)
