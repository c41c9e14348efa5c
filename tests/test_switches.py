"""hiraishin.switches: the one parser of the numeric environment switches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hiraishin.switches import env_int

VAR = "HIRAISHIN_TEST_SWITCH"


@pytest.mark.parametrize("text,allowed,want", [
    (None, range(4), 2), ("", range(4), 2), ("  ", (0, 1), 2), ("3", range(4), 3), (" 0 ", range(4), 0),
    ("1", {0: {}, 1: {}}, 1), ("4", range(4), None), ("-1", range(4), None), ("2", (0, 1), None), ("1.0", range(4), None),
    ("one", range(4), None)])
def test_env_int(monkeypatch, text, allowed, want):
    if text is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, text)
    if want is None:
        with pytest.raises(ValueError, match=rf"{VAR}={text.strip()!r}: the level must be "):
            env_int(VAR, allowed, 2, "the level")
    else:
        assert env_int(VAR, allowed, 2, "the level") == want


def test_the_error_states_the_allowed_values(monkeypatch):
    monkeypatch.setenv(VAR, "9")
    with pytest.raises(ValueError, match=r"an integer in 1\.\.4"):
        env_int(VAR, range(1, 5), 1)
    with pytest.raises(ValueError, match=r"one of \[0, 2\]"):
        env_int(VAR, (2, 0), 0)


@given(st.text(max_size=8))
def test_any_text_is_a_value_allowed_or_an_error(text):
    import os

    if "\x00" in text:
        return  # the environment cannot hold it
    os.environ[VAR] = text
    try:
        try:
            value = env_int(VAR, range(8), 5)
        except ValueError as e:
            assert VAR in str(e)
        else:
            assert value in range(8)
            assert value == (int(text.strip()) if text.strip() else 5)
    finally:
        del os.environ[VAR]
