"""hiraishin.switches: the one parser of the numeric (env_int) and on/off (env_flag) environment switches."""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hiraishin.switches import FLAG_OFF, FLAG_ON, env_flag, env_int

VAR = "HIRAISHIN_TEST_SWITCH"


@pytest.mark.parametrize("text,allowed,want", [
    (None, range(4), 2), ("", range(4), 2), ("  ", (0, 1), 2), ("3", range(4), 3), (" 0 ", range(4), 0),
    ("1", {0: {}, 1: {}}, 1), ("4", range(4), None), ("-1", range(4), None), ("2", (0, 1), None), ("1.0", range(4), None),
    ("one", range(4), None), ("²", range(4), None), ("１", range(4), None)])
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


# any text the environment can hold (not NUL)
ENV_TEXT = st.text(max_size=8).filter(lambda t: "\x00" not in t)


@contextlib.contextmanager
def _switch_set_to(text):
    os.environ[VAR] = text
    try:
        yield
    finally:
        del os.environ[VAR]


@given(ENV_TEXT)
def test_any_text_is_a_value_allowed_or_an_error(text):
    with _switch_set_to(text):
        try:
            value = env_int(VAR, range(8), 5)
        except ValueError as e:
            assert VAR in str(e)
        else:
            assert value in range(8)
            assert value == (int(text.strip()) if text.strip() else 5)

@pytest.mark.parametrize("default", [False, True])
@pytest.mark.parametrize("text,want", [
    (None, None), ("", None), (" ", None), ("1", True), ("0", False), (" on ", True), ("OFF", False), ("True", True),
    ("no", False), ("2", "error"), ("enabled", "error"), ("-1", "error")])
def test_env_flag(monkeypatch, default, text, want):
    if text is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, text)
    if want == "error":
        with pytest.raises(ValueError, match=rf"{VAR}={text.strip()!r}: the fused launch must be 1 or 0"):
            env_flag(VAR, default, "the fused launch")
    else:
        assert env_flag(VAR, default, "the fused launch") is (default if want is None else want)


@given(ENV_TEXT)
def test_any_flag_text_is_on_off_default_or_an_error(text):
    word = text.strip().lower()
    with _switch_set_to(text):
        try:
            value = env_flag(VAR, True)
        except ValueError as e:
            assert VAR in str(e) and word not in FLAG_ON + FLAG_OFF + ("",)
        else:
            assert value is (True if not word else word in FLAG_ON)

@pytest.mark.parametrize("module,name,var", [
    ("hiraishin.kernels.fused.launch", "EMBED_NORM", "HIRAISHIN_EMBED_NORM"),
    ("hiraishin.kernels.mmvq.launch", "HEAD_ARGMAX", "HIRAISHIN_HEAD_ARGMAX"),
    ("hiraishin.backends.base", "ATTN_TRIM", "HIRAISHIN_ATTN_TRIM")])
def test_a_switch_with_a_bad_value_names_itself_on_import(tmp_path, module, name, var):
    """A module's switch is read once, at import: a fresh interpreter with a bad value fails there, naming it.
    (importlib: a package may export a function of its module's name, as kernels.mmvq does ``launch``.)"""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("HIRAISHIN_")}
    good = subprocess.run([sys.executable, "-c", f"import importlib; print(importlib.import_module({module!r}).{name})"], capture_output=True,
                          text=True, env={**env, var: "on"})
    assert good.returncode == 0 and good.stdout.strip() == "True", good.stderr
    bad = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                         env={**env, var: "maybe"})
    assert bad.returncode != 0 and f"{var}='maybe'" in bad.stderr


@pytest.mark.parametrize("text,want", [("", {}), ("2", {"t": 2}), ("1:1024", {"t": 1, "b": 1024}), (" 3 : 4 ", {"t": 3, "b": 4}),
                                       ("1:2:3", None), ("x", None), ("²", None), ("1:-2", None), ("1.5", None)])
def test_env_counts(text, want):
    """The colon-separated switches (a fusion's tokens and blocks): whole numbers, at most one per name."""
    from hiraishin.errors import BackendError
    from hiraishin.kernels.compile import env_counts

    if want is None:
        with pytest.raises(BackendError, match=rf"{VAR} must be T\[:B\]"):
            env_counts(VAR, ("t", "b"), "T[:B]", text)
    else:
        assert env_counts(VAR, ("t", "b"), "T[:B]", text) == want


@pytest.mark.parametrize("text,want", [("", None), ("0", None), ("4", 4), ("16", 16), ("17", "error"), ("²", "error"),
                                       ("four", "error")])
def test_the_mma_warps_switch(monkeypatch, text, want):
    import hiraishin.plans.subblock as sb
    from hiraishin.errors import PlanError

    monkeypatch.setattr(sb, "SUBBLOCK_MMA_FEW_COLS_NWARPS", text)
    if want == "error":
        with pytest.raises(PlanError, match=sb.ENV_MMA_NWARPS):
            sb._mma_few_cols_nwarps()
    else:
        assert sb._mma_few_cols_nwarps() == want


@given(ENV_TEXT)
def test_whole_number_reads_what_int_reads_in_ascii_digits(text):
    from hiraishin.switches import whole_number

    got = whole_number(text)
    stripped = text.strip()
    if stripped and stripped.isascii() and stripped.isdigit():
        assert got == int(stripped)
    else:
        assert got is None
