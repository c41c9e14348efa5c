"""The package's environment switches, parsed one way: numbers by :func:`env_int`, on/off by :func:`env_flag`.

A switch (``HIRAISHIN_*``) is an A/B knob of a launch fact: which kernel, how early it loads, how many
tokens a fusion takes. Each is read once, where its module defines it, and changes no bit of any order. This
module only parses; it imports nothing of the package, so every layer may use it. A value it cannot read is
an error that names the variable, never a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Collection

__all__ = ["env_int", "env_flag", "whole_number"]

# The words an on/off switch takes (any case); blank or unset is its default.
FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")


def whole_number(text: str) -> int | None:
    """``text`` (stripped) as a whole number written in ASCII digits, else None. (``str.isdigit`` alone also
    passes "²", which ``int`` cannot read.)"""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def env_int(var: str, allowed: Collection[int], default: int, what: str = "") -> int:
    """The whole number the environment variable ``var`` holds, ``default`` when it is unset or blank.

    ``allowed``: its values (a ``range`` or a tuple). Otherwise a ValueError names ``var``, its text and
    ``what`` it means (e.g. ``"the early-loads level"``)."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    value = whole_number(text)
    if value is not None and value in allowed:
        return value
    values = (f"an integer in {allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) and allowed.step == 1
              else f"one of {sorted(allowed)}")
    raise ValueError(f"{var}={text!r}: {what + ' ' if what else ''}must be {values}")


def env_flag(var: str, default: bool, what: str = "") -> bool:
    """Whether the on/off switch ``var`` is on: ``default`` when it is unset or blank.

    It takes 1 / 0 (or true / false, yes / no, on / off, any case); otherwise a ValueError names ``var``, its
    text and ``what`` it turns on."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    if text.lower() in FLAG_ON:
        return True
    if text.lower() in FLAG_OFF:
        return False
    raise ValueError(f"{var}={text!r}: {what + ' ' if what else ''}must be 1 or 0 (or true/false, yes/no, on/off)")
