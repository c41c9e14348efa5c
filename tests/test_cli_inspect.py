"""The ``hiraishin`` command line: ``inspect`` prints the tensor table, ``synth`` writes a loadable
file, bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hiraishin.cli import COMMANDS, main
from hiraishin.model.gguf_file import open_qwen3_gguf


def test_inspect_prints_config_and_tensor_table(micro_model_path, capsys):
    assert main(["inspect", str(micro_model_path)]) == 0
    out = capsys.readouterr().out
    assert "architecture  qwen3" in out and "n_embd 256, n_layer 2" in out
    assert "tied (token_embd.weight is also the output matrix)" in out
    lines = out.splitlines()
    # ggml order: ne0 (columns) then ne1 (rows), as in the reference table
    assert any(line.split()[:4] == ["token_embd.weight", "Q6_K", "256", "4096"] for line in lines)
    assert any(line.split()[:4] == ["blk.0.attn_k.weight", "Q4_K", "256", "128"] for line in lines)
    assert any(line.split()[:4] == ["blk.1.ffn_down.weight", "Q6_K", "768", "256"] for line in lines)
    assert any(line.split()[:3] == ["blk.0.attn_q_norm.weight", "F32", "128"] for line in lines)
    total = [line for line in lines if line.startswith("total")]
    m = open_qwen3_gguf(micro_model_path)
    assert len(total) == 1 and f"{sum(t.n_bytes for t in m.tensors.values()):,}" in total[0]
    assert sum(line.startswith(name + " ") for line in lines for name in m.tensors) == len(m.tensors)


def test_inspect_untied(tiny_model_path, capsys):
    assert main(["inspect", str(tiny_model_path)]) == 0
    out = capsys.readouterr().out
    assert "untied (output.weight is the output matrix)" in out
    assert any(line.split()[:4] == ["output.weight", "Q6_K", "512", "151936"] for line in out.splitlines())


@pytest.mark.parametrize("content, words", [(b"not a model", "not a GGUF"), (None, "no such file")])
def test_inspect_bad_file_is_one_line_and_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and words in captured.err and str(path) in captured.err
    assert "Traceback" not in captured.err


def test_synth_writes_a_loadable_file(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["synth", "--shape", "micro", "--seed", "3", "-o", str(out), "--quiet"]) == 0
    assert str(out) in capsys.readouterr().out
    m = open_qwen3_gguf(out)
    assert m.config.n_embd == 256 and m.metadata["general.name"].endswith("(seed 3)")


def test_synth_into_a_missing_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["synth", "--shape", "micro", "-o", str(tmp_path / "no" / "such" / "m.gguf"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_console_entry_point(micro_model_path):
    result = subprocess.run([sys.executable, "-m", "hiraishin.cli", "inspect", str(micro_model_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "token_embd.weight" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "hiraishin.cli", "inspect", str(micro_model_path) + ".nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_every_listed_command_registers():
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert {"inspect", "synth"} <= set(COMMANDS)
