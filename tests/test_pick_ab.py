"""bench/pick_ab.py: the value a GPU call benchmarks after its A/B is the faster one only when no bit moved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import pick_ab  # noqa: E402


def _rows(ms: dict, sha: str = "ab") -> list:
    return [dict(model=m, order="subblock", width=w, replay_ms=t, logits_sha256=sha) for (m, w), t in ms.items()]


BASE = {("qwen3-8b.gguf", 1): 2.75, ("qwen3-8b.gguf", 9): 4.33, ("qwen3-8b.gguf", 16): 5.08,
        ("qwen3-0.6b.gguf", 9): 1.02}


def test_faster_with_the_same_bits_wins_and_only_the_chosen_model_and_widths_count():
    faster = {**BASE, ("qwen3-8b.gguf", 9): 4.10, ("qwen3-0.6b.gguf", 9): 9.0}  # the 0.6B is not compared
    assert pick_ab.pick(_rows(BASE), _rows(faster), "8b", {9, 16}, 0.01)[0]
    assert not pick_ab.pick(_rows(faster), _rows(BASE), "8b", {9, 16}, 0.01)[0]
    slightly = {**BASE, ("qwen3-8b.gguf", 9): 4.30}  # 0.3% less: under the 1% asked
    assert not pick_ab.pick(_rows(BASE), _rows(slightly), "8b", {9, 16}, 0.01)[0]


def test_different_bits_or_missing_rows_keep_the_base(tmp_path, capsys):
    faster = {**BASE, ("qwen3-8b.gguf", 9): 3.0}
    wins, why = pick_ab.pick(_rows(BASE), _rows(faster, sha="cd"), "8b", {9, 16}, 0.01)
    assert not wins and "digests differ" in why
    assert not pick_ab.pick(_rows(BASE), _rows({("qwen3-8b.gguf", 9): 3.0}), "8b", {9, 16}, 0.01)[0]
    (tmp_path / "replay-V-0.json").write_text(json.dumps({"rows": _rows(BASE)}))
    assert pick_ab.main([str(tmp_path), "V", "0", "wide"]) == 0  # no file for "wide": the base, said why
    out = capsys.readouterr()
    assert out.out.strip() == "0" and "cannot compare" in out.err
    (tmp_path / "replay-V-wide.json").write_text(json.dumps({"rows": _rows(faster)}))
    pick_ab.main([str(tmp_path), "V", "0", "wide"])
    assert capsys.readouterr().out.strip() == "wide"


def test_threshold_is_the_smallest_width_from_which_every_width_wins(tmp_path, capsys):
    widths = (2, 4, 6, 8)
    base = {("qwen3-8b.gguf", w): 3.0 + 0.1 * w for w in widths}
    cand = {**base, ("qwen3-8b.gguf", 6): 3.3, ("qwen3-8b.gguf", 8): 3.4}  # faster at 6 and 8 only
    assert pick_ab.pick_threshold(_rows(base), _rows(cand), "8b", set(widths), 0.01)[0] == 6
    cand[("qwen3-8b.gguf", 2)] = 2.0  # a win below a loss does not count: the threshold needs every width above
    assert pick_ab.pick_threshold(_rows(base), _rows(cand), "8b", set(widths), 0.01)[0] == 6
    assert pick_ab.pick_threshold(_rows(base), _rows(base), "8b", set(widths), 0.01)[0] is None
    (tmp_path / "replay-MIN-9.json").write_text(json.dumps({"rows": _rows(base)}))
    (tmp_path / "replay-MIN-2.json").write_text(json.dumps({"rows": _rows(cand, sha="cd")}))
    pick_ab.main([str(tmp_path), "MIN", "9", "2", "--threshold", "--widths", "2,4,6,8"])
    out = capsys.readouterr()  # different bits: the base
    assert out.out.strip() == "9" and "digests differ" in out.err
    (tmp_path / "replay-MIN-2.json").write_text(json.dumps({"rows": _rows(cand)}))
    pick_ab.main([str(tmp_path), "MIN", "9", "2", "--threshold", "--widths", "2,4,6,8"])
    assert capsys.readouterr().out.strip() == "6"


def test_non_finite_logits_never_win():
    faster = {**BASE, ("qwen3-8b.gguf", 9): 3.0}
    nan_rows = [dict(r, logits_finite=False) for r in _rows(faster)]
    wins, why = pick_ab.pick(_rows(BASE), nan_rows, "8b", {9, 16}, 0.01)
    assert not wins and "non-finite" in why
    assert pick_ab.pick(_rows(BASE), [dict(r, logits_finite=True) for r in _rows(faster)], "8b", {9, 16}, 0.01)[0]


# --passes: the fastest of several candidates, each pass relative to the base's
PASSES = [("qwen3-8b.gguf", "batch_invariant", 1), ("qwen3-0.6b.gguf", "fixed_split", 1)]
ONE_TOKEN = {("qwen3-8b.gguf", "batch_invariant", 1): 2.50, ("qwen3-0.6b.gguf", "fixed_split", 1): 0.66,
             ("qwen3-8b.gguf", "batch_invariant", 3): 3.40}


def _ordered_rows(ms: dict, sha: str = "ab", **extra) -> list:
    return [dict(model=m, order=o, width=w, replay_ms=t, logits_sha256=sha, **extra) for (m, o, w), t in ms.items()]


def test_fastest_is_the_lowest_relative_sum_of_the_named_passes(tmp_path, capsys):
    cands = {"1": _ordered_rows({**ONE_TOKEN, PASSES[0]: 2.45, ("qwen3-8b.gguf", "batch_invariant", 3): 9.0}),
             "1:4096": _ordered_rows({**ONE_TOKEN, PASSES[1]: 0.63})}  # -4.5% of the small pass beats -2%
    assert pick_ab.pick_fastest(_ordered_rows(ONE_TOKEN), cands, PASSES, 0.01)[0] == "1:4096"
    slightly = {"1": _ordered_rows({**ONE_TOKEN, PASSES[0]: 2.49})}  # 0.4% of one pass: under the 1% asked
    assert pick_ab.pick_fastest(_ordered_rows(ONE_TOKEN), slightly, PASSES, 0.01)[0] is None
    for v, rows in {"0": _ordered_rows(ONE_TOKEN), **cands}.items():
        (tmp_path / f"replay-E-{v.replace(':', '-')}.json").write_text(json.dumps({"rows": rows}))  # as named
    assert pick_ab.main([str(tmp_path), "E", "0", "1", "1:4096", "--passes",
                         "qwen3-8b.gguf:batch_invariant:1,qwen3-0.6b.gguf:fixed_split:1"]) == 0
    assert capsys.readouterr().out.strip() == "1:4096"


def test_fastest_never_picks_other_bits_a_missing_pass_or_non_finite_logits():
    fast = {k: t / 2 for k, t in ONE_TOKEN.items()}
    cands = {"other-bits": _ordered_rows(fast, sha="cd"),
             "partial": _ordered_rows({k: t for k, t in fast.items() if k[1] != "fixed_split"}),
             "nan": _ordered_rows(fast, logits_finite=False)}
    best, why = pick_ab.pick_fastest(_ordered_rows(ONE_TOKEN), cands, PASSES, 0.01)
    assert best is None and "digests differ" in why and "non-finite" in why
    assert pick_ab.pick_fastest(_ordered_rows(ONE_TOKEN), {"ok": _ordered_rows(fast)}, PASSES, 0.01)[0] == "ok"
