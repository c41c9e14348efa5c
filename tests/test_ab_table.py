"""bench/ab_table.py: the Markdown rows of an A/B folder, as the results READMEs print them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import ab_table  # noqa: E402

VAR = "HIRAISHIN_TEST_SWITCH"


def _write(folder: Path, value: str, date: str, times: dict, digest: str = "d") -> None:
    rows = [{"model": m, "order": o, "width": w, "replay_ms": t, "logits_sha256": digest + m + o + str(w)}
            for (m, o, w), t in times.items()]
    (folder / f"replay-{VAR}-{value}.json").write_text(json.dumps({"date": date, "rows": rows}))


TIMES = {("qwen3-8b.gguf", "subblock", 1): 2.5, ("qwen3-8b.gguf", "subblock", 3): 3.0,
         ("qwen3-0.6b.gguf", "subblock", 1): 0.75, ("qwen3-0.6b.gguf", "subblock", 3): 0.77}


def test_rows_keep_the_order_the_values_ran_in(tmp_path):
    # "8" sorts after "16" by name; the dates say 8 ran first
    _write(tmp_path, "8", "2026-12-06T06:00:00Z", TIMES)
    _write(tmp_path, "16", "2026-12-06T06:01:00Z", {k: t + 0.01 for k, t in TIMES.items()})
    (row,) = ab_table.rows_of(tmp_path, "f")
    assert row == (f"| `{VAR}` 8 → 16 (f) | SUBBLOCK, 1 / 3 tokens | 2.500 → 2.510 / 3.000 → 3.010 | "
                   "0.750 → 0.760 / 0.770 → 0.780 |")


def test_other_bits_are_marked_and_missing_passes_shown(tmp_path):
    _write(tmp_path, "0", "2026-12-06T06:00:00Z", TIMES)
    _write(tmp_path, "1", "2026-12-06T06:01:00Z", {k: t for k, t in TIMES.items() if k[0] != "qwen3-0.6b.gguf"},
           digest="other")
    (row,) = ab_table.rows_of(tmp_path)
    assert "**(digests differ)**" in row and row.endswith("| – / – |")


def test_a_folder_without_replays_is_an_error_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        ab_table.rows_of(tmp_path)


def test_the_committed_session30_folder(capsys):
    folder = REPO / "bench/results/2026-12-06-h100-session30/c-xstage"
    assert ab_table.main([str(folder), "--label", "c"]) == 0
    assert capsys.readouterr().out.startswith("| `HIRAISHIN_DP4A_XSTAGE` 0 → 1 (c) | SUBBLOCK, 1 / 3 tokens | 2.597 → 2.530")


def test_an_abmany_folder_gives_a_row_per_switch(tmp_path):
    _write(tmp_path, "0", "2026-12-06T06:00:00Z", TIMES)
    _write(tmp_path, "1", "2026-12-06T06:01:00Z", TIMES)
    other = "HIRAISHIN_OTHER_SWITCH"
    for value, date in (("wide", "2026-12-06T06:02:00Z"), ("0", "2026-12-06T06:03:00Z")):
        rows = [{"model": m, "order": o, "width": w, "replay_ms": t, "logits_sha256": m + o + str(w)}
                for (m, o, w), t in TIMES.items()]
        (tmp_path / f"replay-{other}-{value}.json").write_text(json.dumps({"date": date, "rows": rows}))
    rows = ab_table.rows_of(tmp_path)
    assert [r.split(" | ")[0] for r in rows] == [f"| `{other}` wide → 0", f"| `{VAR}` 0 → 1"]
