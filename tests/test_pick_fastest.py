"""bench/pick_fastest.py: of several A/B values, the one whose named passes are fastest relative to the
first value's, and only among values whose every logits digest equals the first value's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import pick_fastest  # noqa: E402

PASSES = ["qwen3-8b.gguf:batch_invariant:1", "qwen3-0.6b.gguf:fixed_split:1"]


def _write(out: Path, value: str, ms: dict, sha: str = "same") -> None:
    rows = [dict(model=m, order=o, width=w, replay_ms=t, logits_sha256=sha) for (m, o, w), t in ms.items()]
    (out / f"replay-VAR-{value}.json").write_text(json.dumps({"rows": rows}))


BASE = {("qwen3-8b.gguf", "batch_invariant", 1): 2.50, ("qwen3-0.6b.gguf", "fixed_split", 1): 0.66,
        ("qwen3-8b.gguf", "batch_invariant", 3): 3.40}


def _pick(out: Path, values: str, capsys) -> str:
    assert pick_fastest.main([str(out), "VAR", values, *PASSES]) == 0
    return capsys.readouterr().out.strip()


def test_the_lowest_relative_sum_of_the_named_passes_wins(tmp_path, capsys):
    _write(tmp_path, "0", BASE)
    _write(tmp_path, "1", {**BASE, ("qwen3-8b.gguf", "batch_invariant", 1): 2.45,
                           ("qwen3-8b.gguf", "batch_invariant", 3): 9.0})  # an unnamed pass does not count
    _write(tmp_path, "1:4096", {**BASE, ("qwen3-0.6b.gguf", "fixed_split", 1): 0.63})  # -4.5% beats -2%
    assert _pick(tmp_path, "0 1 1:4096", capsys) == "1:4096"


def test_a_value_whose_bits_moved_or_that_lacks_a_pass_is_never_picked(tmp_path, capsys):
    _write(tmp_path, "0", BASE)
    _write(tmp_path, "fast", {k: t / 2 for k, t in BASE.items()}, sha="other")
    _write(tmp_path, "partial", {k: t / 3 for k, t in BASE.items() if k[1] != "fixed_split"})
    assert _pick(tmp_path, "0 fast partial", capsys) == "0"
