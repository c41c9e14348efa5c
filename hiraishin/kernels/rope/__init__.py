"""Rotary position embedding, NEOX layout (Qwen3), from float64-built cos/sin tables.

Dimension ``d`` is rotated together with ``d + head_dim/2`` (llama.cpp rope.cu, ``rope_neox``):
``y[d] = x[d]*cos - x[d+h]*sin``, ``y[d+h] = x[d]*sin + x[d+h]*cos`` with
``theta = pos * base**(-2d/head_dim)``. The angle tables are computed once on the host in
float64 and rounded to float32 (:func:`rope_tables`); both backends read the same table, so
there is no transcendental function on the device whose bits could differ. (llama.cpp computes
the angle with fast-math ``powf``/``cosf``/``sinf`` on the device; we trade that for exactness.)
No reduction: nothing to plan. Files: ``rope.cu`` (one block per (token, head)), :mod:`.launch`
(``launch``), :mod:`.emulate` (``emulate``, and :func:`rope_tables`, the shared tables).
"""

from .emulate import emulate, rope_tables
from .launch import launch

__all__ = ["emulate", "launch", "rope_tables"]
