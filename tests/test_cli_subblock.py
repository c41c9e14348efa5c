"""The SUBBLOCK order on the command line: its name parses everywhere and `plan` describes it."""

from __future__ import annotations

from hiraishin import ReductionOrder
from hiraishin.cli import main
from hiraishin.commands.common import parse_order


def test_subblock_parses():
    assert parse_order("subblock") is ReductionOrder.SUBBLOCK


def test_plan_describes_the_subblock_order(capsys):
    assert main(["plan", "matvec", "--order", "subblock", "--qtype", "Q6_K", "-K", "12288", "--ncols", "9"]) == 0
    out = capsys.readouterr().out
    assert "sub-block order, Q6_K, K=12288" in out and "16 K-segments of 3 super-block(s)" in out
    assert "segments of super-blocks 0..2, 3..5" in out
