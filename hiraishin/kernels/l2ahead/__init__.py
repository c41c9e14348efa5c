"""L2 prefetches of weights a later kernel of the pass reads, from a stream beside it.

No value is read or written, so there is nothing to emulate: the CPU backend skips the op. Files:
``l2ahead.cu`` (``hx_l2_ahead``), :mod:`.launch` (``launch``).
"""

from .launch import launch, trimmed_span

__all__ = ["launch", "trimmed_span"]
