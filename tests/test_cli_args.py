"""Bad command-line input ends in one line on stderr and exit status 2, before any weight is loaded;
Ctrl-C is one line and 130; a closed stdout is silent; outputs are written atomically."""

from __future__ import annotations

import math
import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiraishin.cli import EXIT_INTERRUPTED, main


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a command gets as far as loading weights."""
    from hiraishin.model.qwen3 import Qwen3

    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the bad argument was refused")

    monkeypatch.setattr(Qwen3, "from_gguf", classmethod(lambda cls, *a, **k: refuse()))


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.lstrip("\n")  # a leading newline ends a progress bar's line
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("argv, byte", [
    (["generate", "{m}", "caf\udcff"], "0xff at character 3"),
    (["generate", "{m}", "-p", "caf\udcff", "-c", "512"], "0xff at character 3"),
    (["replay", "{m}", "--prompt", "\udcfe\udcff"], "0xfe at character 0"),
    (["replay", "{m}", "--prompt", "x\udcff", "--n-ctx", "512"], "0xff at character 1"),
    (["speculative", "{m}", "--self", "-p", "x\udcff"], "0xff at character 1"),
])
def test_non_utf8_prompt_is_one_line(argv, byte, micro_model_path, capsys, no_load):
    assert main([a.replace("{m}", str(micro_model_path)) for a in argv]) == 2
    one_line_error(capsys, "not valid UTF-8", byte)


def test_non_utf8_prompt_file(micro_model_path, tmp_path, capsys, no_load):
    f = tmp_path / "p.txt"
    f.write_bytes(b"caf\xe9")
    assert main(["generate", str(micro_model_path), "-f", str(f)]) == 2
    one_line_error(capsys, "p.txt", "not valid UTF-8", "0xe9")


@pytest.mark.parametrize("argv, words", [
    (["replay", "{m}", "--prompt", ""], ["--prompt is empty"]),
    (["generate", "{m}", ""], ["PROMPT is empty"]),
    (["replay", "{m}", "--n-ctx", "100000000"], ["would take", "fits at most"]),
    (["replay", "{m}", "--plot", "{t}/out.xyz"], ["unsupported extension 'xyz'"]),
    (["replay", "{m}", "--json", "{t}/no/such/out.json"], ["does not exist"]),
    (["generate", "{m}", "hi", "--json", "{t}"], ["is a folder"]),
    (["speculative", "{m}"], ["--draft"]),
    (["speculative", "{m}", "--self", "--draft-min", "9"], ["--draft-min 9", "--draft-max 8"]),
    (["speculative", "{m}", "--self", "--draft-ahead", "--p-min-gap", "1"], ["--draft-ahead", "--p-min-gap"]),
    (["speculative", "{m}", "--self", "--ahead-passes", "2"], ["--ahead-passes 2", "--draft-ahead"]),
    (["speculative", "{m}", "--self", "--draft-ahead", "--ahead-passes", "1"], ["--ahead-passes 1", "at least 2"]),
    (["generate", "{m}", "hi", "--system", "be brief"], ["need --chat"]),
    (["generate", "{m}", "hi", "-p", "there"], ["give the prompt once"]),
])
def test_bad_arguments_refused_before_loading(argv, words, micro_model_path, tmp_path, capsys, no_load):
    argv = [a.replace("{m}", str(micro_model_path)).replace("{t}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    one_line_error(capsys, *words)
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("argv, words", [
    (["speculative", "M.gguf", "--self", "--p-min-gap", "nan"], "finite"),
    (["speculative", "M.gguf", "--self", "--p-min-gap", "inf"], "finite"),
    (["speculative", "M.gguf", "--self", "--p-min-gap", "-1"], "0..1e+30"),
    (["speculative", "M.gguf", "--self", "--draft-p-min", "1.5"], "0..1"),
    (["speculative", "M.gguf", "--self", "--n-draft", "0"], ">= 1"),
    (["speculative", "M.gguf", "--self", "--draft-max", "0"], ">= 1"),
    (["generate", "M.gguf", "hi", "--n-ctx", "0"], ">= 1"),
    (["generate", "M.gguf", "hi", "--top-k", "-3"], ">= 1"),
    (["generate", "M.gguf", "hi", "--n-probs", "0"], ">= 1"),
    (["replay", "M.gguf", "--tokens", "-5"], ">= 0"),
    (["replay", "M.gguf", "--batch-sizes", "2,x"], "batch sizes"),
    (["replay", "M.gguf", "--order", "sideways"], "unknown order"),
    (["speculative", "M.gguf", "--self", "--draft-order", "fastest"], "unknown order 'fastest'"),
])
def test_bad_values_are_usage_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x) or x < 0),
                 st.text(alphabet="abcxyz!", min_size=1, max_size=5)))
def test_p_min_gap_takes_only_finite_non_negative_numbers(value):
    from hiraishin.commands.common import finite_float

    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        finite_float(0.0, 1e30)(str(value))


@settings(max_examples=40, deadline=None)
@given(st.integers(max_value=0))
def test_counts_below_one_are_refused(n):
    import argparse

    from hiraishin.commands.common import positive_int

    with pytest.raises(argparse.ArgumentTypeError):
        positive_int(str(n))


def test_ctrl_c_is_one_line_and_130(monkeypatch, capsys, micro_model_path):
    import hiraishin.commands.inspect as inspect_cmd

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_cmd, "run", interrupted)
    assert main(["inspect", str(micro_model_path)]) == EXIT_INTERRUPTED
    one_line_error(capsys, "interrupted")


def test_main_installs_sigterm_cleanup(micro_model_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        main(["inspect", str(micro_model_path)])
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_inspect_into_a_closed_pipe_is_silent(micro_model_path):
    cmd = f"{sys.executable} -m hiraishin.cli inspect {micro_model_path} | head -n 1"
    r = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=120)
    assert r.stdout.count("\n") == 1
    assert "Broken pipe" not in r.stderr and "Traceback" not in r.stderr and "Exception" not in r.stderr


def test_help_explains_the_orders(capsys):
    for command in ("generate", "replay", "speculative"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "reduction orders" in out and "4 warps for 1-4 columns" in out and "256 KV cells" in out
        assert "-n N, --n-predict N" in out and "-c N, --ctx-size N" in out


def test_plan_command_prints_the_warps(capsys):
    assert main(["plan", "matvec", "--qtype", "Q6_K", "-K", "4096", "--ncols", "5", "--order", "all"]) == 0
    out = capsys.readouterr().out
    assert "batch_variant: mat-vec Q6_K, K 4096, 5 column(s)" in out
    assert "warp 0 sums blocks 0, 2, 4, 6, 8, 10, 12, 14" in out  # 2 warps under the variant order
    assert "warp 0 sums blocks 0, 4, 8, 12" in out  # 4 warps under the invariant order
    assert main(["plan", "matvec", "--ncols", "9", "--order", "variant"]) == 0
    out = capsys.readouterr().out
    assert "stock MMQ order" in out and "tile 0 (rows 0..127) sums pieces 0..2, 3..6" in out
    assert main(["plan", "matvec", "--ncols", "9", "--qtype", "Q8_0", "--order", "variant"]) == 0
    assert "tiled" in capsys.readouterr().out
    assert main(["plan", "attention", "--n-queries", "5", "--kv-len", "600", "--order", "variant"]) == 0
    assert "fattn_tile" in capsys.readouterr().out
    assert main(["plan", "matvec", "-K", "1000"]) == 2
    one_line_error(capsys, "-K 1000", "256")


def test_broken_chat_template_is_one_line(micro_model_path, monkeypatch, capsys):
    import jinja2

    from hiraishin.model.tokenizer import Tokenizer

    def broken(self, messages, add_generation_prompt=True, **kwargs):
        raise jinja2.exceptions.UndefinedError("'foo' is undefined")

    monkeypatch.setattr(Tokenizer, "apply_chat_template", broken)
    assert main(["generate", str(micro_model_path), "hi", "--chat", "--device", "cpu", "-n", "1"]) == 2
    one_line_error(capsys, "chat_template", "'foo' is undefined")
