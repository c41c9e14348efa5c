"""bench/price_of_exactness.py: the table and plots are copies of the benchmark JSON they read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "results" / "2026-12-03-h200-session10" / "c-matvec-bench-tests-memcheck"


@pytest.fixture(scope="module")
def poe_module():
    sys.path.insert(0, str(REPO / "bench"))
    import price_of_exactness

    return price_of_exactness


def _with_order_rows(mmq: dict) -> dict:
    """The committed bench_mmq JSON plus made-up --all-orders rows (two shapes, three orders, widths 1..16;
    batch_variant's columns differing from width 16 below 9 columns)."""
    rows = []
    for shape in ("attn_q/attn_output 4096->4096", "output 4096->151936"):
        for order in ("batch_variant", "batch_invariant", "subblock"):
            for w in range(1, 17):
                rows.append(dict(shape=shape, qtype="Q4_K", k=4096, n=4096, kernel="order-matvec", order=order,
                                 ncols=w, time_us=10.0 + w + len(order), ratio_to_variant_one_col=1.0 + w / 10,
                                 bits_equal_width16=not (order == "batch_variant" and w <= 8)))
    return dict(mmq, results=mmq["results"] + rows)


def test_tables_and_plots_copy_their_inputs(tmp_path, poe_module):
    bench = json.loads((RUN / "hiraishin-bench.json").read_text())
    mmq = _with_order_rows(json.loads((RUN / "bench_mmq.json").read_text()))
    (tmp_path / "bench_mmq.json").write_text(json.dumps(mmq))
    assert poe_module.main([str(RUN / "hiraishin-bench.json"), "--matvec", str(tmp_path / "bench_mmq.json"),
                            "--out", str(tmp_path)]) == 0
    poe = json.loads((tmp_path / "price-of-exactness.json").read_text())
    assert {(r["order"], r["width"]): r["ms"] for r in poe["rows"]}[("subblock", 16)] == \
        bench["orders"]["subblock"]["verify_ms"]["16"]
    assert len(poe["matvec_orders"]) == 2 * 3 * 16
    md = (tmp_path / "price-of-exactness.md").read_text()
    assert "**output 4096->151936**" in md and "| width | batch_variant | batch_invariant | subblock |" in md
    # width 3: 10 + 3 + len(name); batch_variant's bits differ there (*), the exact orders' do not
    assert "| 3 | 26.0* | 28.0 | 21.0 |" in md and "| 12 | 35.0 | 37.0 | 30.0 |" in md
    for png in ("price-of-exactness.png", "price-of-exactness-matvec.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_every_order_there_is_no_matvec_plot(tmp_path, poe_module):
    assert poe_module.main([str(RUN / "hiraishin-bench.json"), "--matvec", str(RUN / "bench_mmq.json"),
                            "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "price-of-exactness.json").read_text())["matvec_orders"] == []
    assert not (tmp_path / "price-of-exactness-matvec.png").exists()
    assert "Every order's mat-vec" not in (tmp_path / "price-of-exactness.md").read_text()


def test_newest_matvec_prefers_the_bench_card_then_the_latest_date(tmp_path, poe_module):
    for folder, device, date in (("a", "NVIDIA H200", "2026-12-03T10:00"), ("b", "NVIDIA H200", "2026-12-01T10:00"),
                                 ("c", "NVIDIA H100", "2026-12-02T10:00")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "bench_mmq.json").write_text(json.dumps({"device": device, "date": date, "results": []}))
    assert poe_module.newest_matvec("NVIDIA H200", tmp_path) == tmp_path / "a" / "bench_mmq.json"
    assert poe_module.newest_matvec("NVIDIA H100", tmp_path) == tmp_path / "c" / "bench_mmq.json"
    assert poe_module.newest_matvec("NVIDIA B200", tmp_path) == tmp_path / "a" / "bench_mmq.json"  # no run of its own
    assert poe_module.newest_matvec("NVIDIA H200", tmp_path / "a" / "none") is None


def test_a_matvec_table_of_another_card_says_so(tmp_path, poe_module):
    bench = json.loads((RUN / "hiraishin-bench.json").read_text())
    mmq = json.loads((RUN / "bench_mmq.json").read_text())
    same = poe_module.markdown(poe_module.build(bench, mmq, ["x"]))
    assert f"timed on {mmq['device']}, {mmq['date'][:10]}, commit {mmq['commit']})" in same
    assert "another card" not in same
    other = poe_module.markdown(poe_module.build(dict(bench, device={"name": "NVIDIA H100 80GB HBM3"}), mmq, ["x"]))
    assert "another card than the passes above (NVIDIA H100 80GB HBM3)" in other


def test_newest_names_the_committed_run(tmp_path, poe_module):
    assert poe_module.main([str(RUN / "hiraishin-bench.json"), "--matvec", "newest", "--out", str(tmp_path)]) == 0
    poe = json.loads((tmp_path / "price-of-exactness.json").read_text())
    picked = poe_module.newest_matvec(poe["device"])
    assert poe["sources"][1] == str(picked.relative_to(REPO)) and poe["matvec"]
    assert poe["matvec_run"]["date"] == json.loads(picked.read_text())["date"]


def test_the_library_s_one_column_launch_is_taken_whichever_form(poe_module):
    """A bench_mmq run's SUBBLOCK rows are the launches the library picks ("mmq-onecol", "mmq-dp4a", "mmq-mma");
    its "other-mmq-*" row (the one-column form the library does not pick for the shape) is not one of them."""
    bench = json.loads((RUN / "hiraishin-bench.json").read_text())
    common = dict(shape="s", qtype="Q4_K", k=4096, n=4096, ncols=1, ratio_to_variant_one_col=1.0)
    mmq = {"device": "d", "date": "2026-12-06", "commit": "c", "results": [
        dict(common, kernel="variant-mmvq", time_us=7.3), dict(common, kernel="mmq-dp4a", time_us=8.2),
        dict(common, kernel="other-mmq-onecol", time_us=7.7), dict(common, kernel="mmq-mma", ncols=2, time_us=7.8)]}
    rows = poe_module.build(bench, mmq, ["x"])["matvec"]
    assert [(r["order"], r["ncols"], r["us"]) for r in rows] == [("batch_variant", 1, 7.3), ("subblock", 1, 8.2),
                                                                 ("subblock", 2, 7.8)]
