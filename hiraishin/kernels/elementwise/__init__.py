"""Elementwise kernels: SwiGLU, residual add, and embedding-row lookup (get_rows).

None of them reduces, so none has an order to plan; what must match across backends is the
sequence of float ops per element, written explicitly on both sides:

* SwiGLU: ``silu(g) * u`` with ``silu(g) = g / (1 + exp(-g))``; ``exp`` is the library's own
  (``hx_expf`` / :func:`hiraishin.fp.expf`), the division IEEE.
* add: ``a + b``.
* get_rows: dequantize whole rows of a quantized table (the token embedding) to float32, with
  gguf-py's formula order (``gguf/quants.py`` ``dequantize_blocks``): Q8_0 ``q * d``;
  Q4_K ``(d * sc) * q - (dmin * m)`` (no fma); Q6_K ``(d * sc) * q``. The result equals
  :func:`hiraishin.quant.dequantize` of those rows bit for bit.

Files: ``elementwise.cu`` (the three kernels), :mod:`.launch` (``launch_swiglu``, ``launch_add``,
``launch_get_rows``, ``launch_kv_store``: the KV-cache store at device positions, ``launch_argmax_rows``:
each row's argmax, greedy decoding's token without the logits' copy to the host; ``TopKRow``: the k largest
values of a row, what decoding shows beside each token), :mod:`.emulate` (``emulate_swiglu``, ``emulate_add``,
``emulate_get_rows``, ``emulate_argmax_rows``, ``emulate_topk_row``).
"""

from .emulate import emulate_add, emulate_argmax_rows, emulate_get_rows, emulate_swiglu, emulate_topk_row
from .launch import argmax_scratch, launch_add, launch_argmax_rows, launch_get_rows, launch_kv_store, launch_swiglu

__all__ = ["emulate_swiglu", "emulate_add", "emulate_get_rows", "emulate_argmax_rows", "emulate_topk_row",
           "launch_swiglu", "launch_add",
           "launch_get_rows", "launch_kv_store", "launch_argmax_rows", "argmax_scratch"]
