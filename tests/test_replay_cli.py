"""``hiraishin replay`` and ``hiraishin speculative`` on the synthetic micro model (CPU)."""

from __future__ import annotations

import pytest

from hiraishin.cli import main
from hiraishin.decode.report import ReplayReport
from hiraishin.decode.speculative import SpeculativeResult


def test_replay_command_writes_json_and_plot(micro_model_path, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["replay", str(micro_model_path), "--prompt", "Hello there", "--tokens", "6",
               "--batch-sizes", "3,9", "--order", "variant", "--device", "cpu",
               "--json", str(out), "--plot", str(png)])
    text = capsys.readouterr().out
    assert rc == 0
    rep = ReplayReport.load(out)
    assert rep.batch_sizes == [3, 9] and rep.order == "batch_variant" and rep.backend == "cpu"
    assert len(rep.tokens) == len(rep.plain_argmax)  # every position compared
    assert rep.tokens[-6:] == rep.plain_argmax[-7:-1]  # the 6 new tokens are the plain argmaxes
    assert "max|Δlogit|" in text and str(out) in text
    if not rep.identical:
        assert rep.localization is not None and rep.localization.name in text
    assert png.stat().st_size > 1000


def test_replay_command_takes_token_ids_and_the_invariant_order(micro_model_path, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["replay", str(micro_model_path), "--prompt", "ids:1,2,3,4", "--tokens", "4",
               "--batch-sizes", "2,5", "--order", "invariant", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    rep = ReplayReport.load(out)
    assert rep.tokens[:4] == [1, 2, 3, 4] and rep.identical
    assert "bit-identical" in capsys.readouterr().out


def test_speculative_command_self_and_draft(micro_model_path, tmp_path, capsys):
    from hiraishin.decode.draft import write_draft

    out = tmp_path / "s.json"
    rc = main(["speculative", str(micro_model_path), "--self", "--n-draft", "3", "--p-min-gap", "0",
               "--prompt", "Hello there", "--tokens", "8", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    res = SpeculativeResult.load(out)
    assert res.matches_plain and res.acceptance_rate == 1.0 and res.order == "batch_invariant"
    assert "identical to plain" in capsys.readouterr().out
    draft = write_draft(micro_model_path, tmp_path / "d.gguf", noise=0.2, seed=1)
    rc = main(["speculative", str(micro_model_path), "--draft", str(draft), "--n-draft", "2", "--p-min-gap", "0",
               "--prompt", "Hello there", "--tokens", "6", "--device", "cpu", "--json", str(out)])
    assert rc == 0 and SpeculativeResult.load(out).matches_plain
    rc = main(["speculative", str(micro_model_path), "--draft", str(draft), "--draft-order", "variant", "--n-draft",
               "2", "--prompt", "Hello there", "--tokens", "6", "--device", "cpu", "--json", str(out)])
    res = SpeculativeResult.load(out)
    assert rc == 0 and res.matches_plain and res.order == "batch_invariant" and res.draft_order == "batch_variant"


def test_speculative_command_with_the_draft_ahead(micro_model_path, tmp_path, capsys):
    out = tmp_path / "ahead.json"
    rc = main(["speculative", str(micro_model_path), "--self", "--draft-ahead", "--n-draft", "3", "--prompt",
               "Hello there", "--tokens", "12", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    res = SpeculativeResult.load(out)
    assert res.matches_plain and res.acceptance_rate == 1.0 and res.meta["draft_ahead"] is True
    assert sum(c.ahead for c in res.cycles) >= 1
    rc = main(["speculative", str(micro_model_path), "--self", "--draft-ahead", "--ahead-passes", "2", "--n-draft",
               "3", "--prompt", "Hello there", "--tokens", "12", "--device", "cpu", "--json", str(out)])
    capped = SpeculativeResult.load(out)
    assert rc == 0 and capped.matches_plain and capped.meta["ahead_passes"] == 2
    assert all(c.drafted <= 1 for c in capped.cycles if c.ahead) and any(c.ahead for c in capped.cycles)
    assert "draft ahead:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["replay", "M.gguf", "--batch-sizes", "2,x"], "batch sizes"),
    (["replay", "M.gguf", "--order", "sideways"], "unknown order"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_replay_check_gates_on_batch_invariance(micro_model_path, capsys):
    base = ["replay", str(micro_model_path), "-p", "Hello there", "-n", "12", "--batch-sizes", "9",
            "--device", "cpu", "--no-localize", "--check"]
    assert main(base + ["--order", "variant"]) == 1  # batches of 9 leave the mat-vec kernel
    assert "check FAILED" in capsys.readouterr().out
    assert main(base) == 0  # the default order is the invariant one, as for every command
    assert "check passed" in capsys.readouterr().out


def test_replay_json_records_the_run(micro_model_path, tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    assert main(["replay", "-m", str(micro_model_path), "-p", "ids:1,2,3", "-n", "2", "--batch-sizes", "2",
                 "--device", "cpu", "--json", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    from hiraishin import __version__
    from hiraishin.commands.common import file_sha256

    assert meta["schema_version"] == 1 and meta["hiraishin_version"] == __version__
    assert meta["model_sha256"] == file_sha256(micro_model_path) and meta["command"] == "replay"
    assert ReplayReport.load(out).meta == meta


def test_speculative_command_warns_when_nothing_was_drafted(micro_model_path, capsys):
    rc = main(["speculative", str(micro_model_path), "--self", "--p-min-gap", "1e9", "-p", "Hello", "-n", "4",
               "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 0 and "WARNING: the draft proposed no tokens" in captured.err
    assert "acceptance n/a (0 drafted)" in captured.out


def test_speculative_defaults_draft(micro_model_path, capsys):
    rc = main(["speculative", str(micro_model_path), "-md", str(micro_model_path), "-p", "Hello", "-n", "6",
               "--device", "cpu", "--draft-max", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "acceptance 100.0%" in out and "(0/0)" not in out and "identical to plain" in out


def test_missing_model_is_a_clean_error(tmp_path, capsys):
    rc = main(["replay", str(tmp_path / "nope.gguf"), "--device", "cpu"])
    assert rc == 2 and "nope.gguf" in capsys.readouterr().err
