"""The package's numeric environment switches, parsed one way.

A switch (``HIRAISHIN_*``) is an A/B knob of a launch fact: which kernel, how early it loads, how many
tokens a fusion takes. Each is read once, where its module defines it, and changes no bit of any order. This
module only parses; it imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import os
from collections.abc import Collection

__all__ = ["env_int"]


def env_int(var: str, allowed: Collection[int], default: int, what: str = "") -> int:
    """The whole number the environment variable ``var`` holds, ``default`` when it is unset or blank.

    ``allowed``: its values (a ``range`` or a tuple). Otherwise a ValueError names ``var``, its text and
    ``what`` it means (e.g. ``"the early-loads level"``)."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    if text.isdigit() and int(text) in allowed:
        return int(text)
    values = (f"an integer in {allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) and allowed.step == 1
              else f"one of {sorted(allowed)}")
    raise ValueError(f"{var}={text!r}: {what + ' ' if what else ''}must be {values}")
