"""Split-KV vector flash attention over an f16 KV cache, and the multi-query tile kernel.

One query (or two) of one head per CUDA block; the KV cache is walked in 128-cell chunks spread
over ``P`` parallel blocks (block ``y`` takes chunks ``y, y+P, y+2P, ...``), each block keeping
its own running max and sum; a combine kernel then merges the ``P`` partial results in block
order. The geometry is llama.cpp's ``flash_attn_ext_vec`` (reference section 6.3), the
arithmetic IEEE. For multi-query launches under the variant order, ``fattn_tile.cu`` (the stand-in
for llama.cpp's MMA kernel) groups everything differently: contiguous splits, one sequential dot
product per score. ``fattn_vec_shared`` is the vector kernel's arithmetic for several queries of one
KV head per block (they share each K/V load; per query the order, hence the bits, of the one-query
kernel). What sets the order is the plan (:mod:`hiraishin.plans.attention`).

Files, side by side: ``fattn_vec.cu`` (vector kernels + combine), ``fattn_tile.cu``,
:mod:`.launch` (``launch``; occupancy measurement for device profiles), :mod:`.emulate`
(``emulate``; partials and combine separately for tests and notebooks) and :mod:`.emulate_tile`.
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
