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


def test_inspect_names_the_file_type_size_and_checks(micro_model_path, tmp_path, capsys):
    import json

    out = tmp_path / "i.json"
    assert main(["inspect", "-m", str(micro_model_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "file type     MOSTLY_Q4_K_M (15)" in text
    assert "model size" in text and "B parameters" in text
    assert "check         tokenizer: ok" in text
    data = json.loads(out.read_text())
    assert data["file_type_name"] == "MOSTLY_Q4_K_M (15)" and data["checks"]["tokenizer"] == "ok"
    assert data["meta"]["command"] == "inspect" and len(data["meta"]["model_sha256"]) == 64


def test_inspect_flags_what_compute_commands_refuse(micro_model_path, monkeypatch, capsys):
    import hiraishin.model.tokenizer as tokenizer
    from hiraishin.errors import GGUFError

    def broken(gguf, chat_template=False):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens[7] is out of vocabulary")

    monkeypatch.setattr(tokenizer, "validate_tokenizer", broken)
    # the same validation the compute commands run at load: inspect refuses the file as they would
    assert main(["inspect", str(micro_model_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "tokens[7]" in captured.err and "Traceback" not in captured.err


def test_inspect_flags_a_chat_template_that_only_chat_would_refuse(micro_model_path, monkeypatch, capsys):
    from hiraishin.errors import TemplateError
    from hiraishin.model.tokenizer import Tokenizer

    def broken(self):
        raise TemplateError("tokenizer.chat_template: syntax error at line 1")

    monkeypatch.setattr(Tokenizer, "check_chat_template", broken)
    assert main(["inspect", str(micro_model_path)]) == 0  # usable without --chat
    captured = capsys.readouterr()
    assert "token_embd.weight" in captured.out
    assert "chat template (--chat): REFUSED: tokenizer.chat_template: syntax error" in captured.out
    assert captured.err.count("\n") == 1 and "syntax error at line 1" in captured.err


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
