"""One speculative cycle's record (draft + verify), shared by :mod:`.speculative` and :mod:`.ahead`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cycle"]


@dataclass
class Cycle:
    """One draft + verify cycle."""

    pos: int  # position of the last accepted token, fed first in the verify pass
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float
    ahead: bool = False  # its guesses were made during the verify before (hiraishin.decode.ahead)

    @property
    def verify_batch(self) -> int:
        return self.drafted + 1
