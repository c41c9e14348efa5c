"""Which weights a pass asks L2 for ahead of their mat-vecs, and when (``HIRAISHIN_L2_AHEAD``).

A one-token pass of the 8B shape moves about 45% of the bytes the card could copy in its time:
its small kernels (norms, RoPE, attention, combine) leave DRAM nearly idle, and its small mat-vecs
(Q/K/V, the attention output) wait on DRAM latency. A schedule names weights to prefetch into L2
from a stream beside the pass (``hiraishin/kernels/l2ahead``) at two points of each layer ``l``:

* after the Q/K/V mat-vecs of ``l`` (while RoPE, attention and the combine run):
  ``o`` the attention output weight of ``l``; ``ffnN`` the first N MiB of gate then up of ``l``
  (the order their launch reads rows in);
* after the gate/up mat-vec of ``l`` (while SwiGLU and the down projection run):
  ``downN`` the first N MiB of down of ``l``; ``qkvN`` the first N MiB of Q, K, V of ``l + 1``
  (of the output head after the last layer).

A spec is a comma-separated list of these items, optionally ending in ``/line`` (128-byte line
prefetches instead of bulk ones); ``off`` or empty: none. Cache hints only: no result changes.

Off by default: on the H200 every schedule tried made graph-replayed passes slower, same digests
(bench/results/2026-12-04-h200-session16/a-l2-ahead): the 8B's BATCH_INVARIANT one-token pass 2.527 ->
2.581 ms with ``o,qkv16``, 2.611 with ``o,qkv16,ffn24``, 2.620 adding ``down12``, 2.678 with line
prefetches; SUBBLOCK's 16-token pass 4.080 -> 4.157-4.466; the 0.6B 0.701 -> 0.709-0.769. The small
mat-vecs are not waiting on DRAM latency that L2 could hide (their first wave already prefetches its rows
before the PDL wait), and the side kernels cost their launches and slots.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

from ..errors import HiraishinError

__all__ = ["ENV_L2_AHEAD", "L2Ahead", "l2_ahead_from_env", "parse_l2_ahead"]

ENV_L2_AHEAD = "HIRAISHIN_L2_AHEAD"
_MIB = 1 << 20
_ITEM = re.compile(r"^(o|ffn|down|qkv)(\d+)?$")


@dataclasses.dataclass(frozen=True)
class L2Ahead:
    """A parsed schedule: ``o`` the whole attention output weight, the others bytes (0: none)."""

    o: bool = False
    ffn: int = 0
    down: int = 0
    qkv: int = 0
    bulk: bool = True

    def __bool__(self) -> bool:
        return bool(self.o or self.ffn or self.down or self.qkv)

    def after_qkv(self, layer) -> list:
        """``(array, limit)`` spans to ask for after the Q/K/V mat-vecs of ``layer``."""
        spans = [(layer.attn_output.data, None)] if self.o else []
        return spans + _first_bytes((layer.ffn_gate.data, layer.ffn_up.data), self.ffn)

    def after_gate_up(self, layer, next_weights) -> list:
        """Spans to ask for after the gate/up mat-vec of ``layer``; ``next_weights``: the arrays the
        next mat-vec launch reads (Q, K, V of the next layer, or the output head after the last)."""
        return _first_bytes((layer.ffn_down.data,), self.down) + _first_bytes(next_weights, self.qkv)


def _first_bytes(arrays, limit: int) -> list:
    spans = []
    for a in arrays:
        if limit <= 0:
            break
        take = min(int(a.nbytes), limit)
        spans.append((a, take))
        limit -= take
    return spans


def parse_l2_ahead(spec: str) -> L2Ahead:
    """The schedule a spec names (module docstring); ``HiraishinError`` naming the bad item."""
    text = (spec or "").strip().lower()
    bulk = True
    if text.endswith("/line"):
        text, bulk = text[: -len("/line")], False
    elif text.endswith("/bulk"):
        text = text[: -len("/bulk")]
    if text in ("", "off", "0", "none"):
        return L2Ahead(bulk=bulk)
    fields = {}
    for item in text.split(","):
        m = _ITEM.match(item.strip())
        if m is None or (m.group(1) == "o") != (m.group(2) is None):
            raise HiraishinError(f"{ENV_L2_AHEAD}: bad item {item.strip()!r} in {spec!r} "
                                 "(o, ffnN, downN or qkvN, N in MiB; optional /line)")
        fields[m.group(1)] = True if m.group(1) == "o" else int(m.group(2)) * _MIB
    return L2Ahead(bulk=bulk, **fields)


@functools.lru_cache(maxsize=8)
def _cached(spec: str) -> L2Ahead:
    return parse_l2_ahead(spec)


def l2_ahead_from_env() -> L2Ahead:
    """The schedule ``HIRAISHIN_L2_AHEAD`` names (default: off)."""
    return _cached(os.environ.get(ENV_L2_AHEAD, ""))
