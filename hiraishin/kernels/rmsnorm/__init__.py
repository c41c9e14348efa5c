"""RMSNorm fused with the weight multiply: ``y = (scale * x) * w``.

``scale = 1 / sqrt(sum(x**2) / n + eps)`` in IEEE float32 (division and square root correctly
rounded; llama.cpp's ``rsqrtf`` is an approximation the CPU cannot reproduce).

Order of the sum of squares (one fixed tree per row length, never per batch): a block of
:func:`block_threads` ``(n)`` threads; thread ``t`` accumulates ``fma(x[i], x[i], s)`` for
``i = t, t + nthreads, ...``; each warp folds its 32 partials with the xor butterfly
(16, 8, 4, 2, 1); lane ``i`` of a warp then takes warp ``i``'s partial (0 past the last warp)
and butterflies again. Files: ``rmsnorm.cu`` (the kernel, one block per row), :mod:`.launch` (``launch``), :mod:`.emulate`
(``emulate``, same bits).
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
