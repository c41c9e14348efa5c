"""Replay, reports and localization against a small fake model (fast; real-model checks in test_replay.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from decode_fakes import FakeModel
from hypothesis import given
from hypothesis import strategies as st

from hiraishin.decode.replay import pass_spans, replay
from hiraishin.decode.localize import localize
from hiraishin.decode.report import ReplayReport
from hiraishin.errors import HiraishinError
from hiraishin.order import ReductionOrder

INV = ReductionOrder.BATCH_INVARIANT
VAR = ReductionOrder.BATCH_VARIANT


def test_invariant_replay_is_bit_identical():
    model = FakeModel()
    rep = replay(model, "hello world", [2, 3, 5, 9, 16], order=INV, n_new=20)
    assert rep.identical and rep.max_abs_diff == 0.0 and rep.first_divergence is None
    assert all(d == 0.0 for b in rep.batches for d in b.diff_by_position)
    assert all(b.n_zero == len(rep.positions) * 48 for b in rep.batches)
    assert "bit-identical" in str(rep)
    assert localize(model, rep) is None


def test_replay_decodes_plain_greedy_tokens():
    model = FakeModel()
    prompt = model.tokenizer.encode("hello world")
    rep = replay(model, prompt, [3], order=INV, n_new=15)
    assert rep.tokens[:len(prompt)] == prompt
    assert rep.tokens[len(prompt):] == model.generate(prompt, 15).tokens
    assert rep.plain_argmax[len(prompt) - 1:-1] == rep.tokens[len(prompt):]


def test_variant_replay_finds_the_batch_sizes_that_change_geometry():
    model = FakeModel()
    rep = replay(model, "hello world", [2, 3, 5, 9], order=VAR, n_new=20)
    assert rep[2].max_abs_diff == 0.0 and rep[3].max_abs_diff == 0.0
    assert rep[5].max_abs_diff > 0.0 and rep[9].max_abs_diff > 0.0
    assert rep.first_divergence == rep[5].first_diff
    assert rep[5].fraction_differ == len(rep[5].positions_differ) / len(rep.positions)
    assert sum(rep[5].delta_hist) + rep[5].n_zero == len(rep.positions) * 48
    loc = localize(model, rep)
    assert loc.name == "blk.0.attn_out" and loc.layer == 0 and loc.op == "attn_out"
    assert loc.batch_size == 5 and loc.position == rep.first_divergence
    assert loc.max_abs_diff > 0
    assert [name for name, _ in loc.ops][:2] == ["token_embd", "blk.0.attn_k"]
    assert rep.localization is loc and "blk.0.attn_out" in str(rep)


def test_flips_carry_the_plain_gap():
    model = FakeModel(variant_shift=0.5)
    rep = replay(model, "hello world", [2, 5], order=VAR, n_new=25)
    flips = rep[5].flips
    assert flips and not rep[2].flips
    for f in flips:
        i = f.position - rep.start
        assert f.plain_token == rep.plain_argmax[i] != f.batched_token
        assert f.plain_gap == rep.plain_gap[i] > 0
    assert sum(rep[5].gap_hist) == len(flips)
    assert "flip at" in str(rep)


def test_invariant_replay_across_the_256_and_384_boundaries():
    # a 300-token sequence, compared from 240: passes of 9 and 16 meet cells 256 and 384
    model = FakeModel(n_ctx=512)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 48, 400)]
    rep = replay(model, tokens, [5, 9, 16], order=INV, start=240)
    assert rep.positions == range(240, 400)
    assert rep.identical and rep.max_abs_diff == 0.0
    for start, n in model.passes:
        assert start // 256 == (start + n - 1) // 256


def test_without_the_boundary_guard_the_replay_differs_at_256():
    model = FakeModel(n_ctx=512)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 48, 300)]
    rep = replay(model, tokens, [16], order=ReductionOrder.custom(kv_boundary=None), start=245)
    assert not rep.identical and all(p < 256 for p in rep[16].positions_differ)


def test_report_json_round_trip(tmp_path):
    model = FakeModel(variant_shift=0.5)
    rep = replay(model, "hello world", [2, 5, 9], order=VAR, n_new=10)
    localize(model, rep)
    back = ReplayReport.load(rep.save(tmp_path / "r.json"))
    assert back == rep
    assert str(back) == str(rep)
    json.loads((tmp_path / "r.json").read_text())  # standard JSON (no NaN / Infinity)
    assert "Infinity" not in (tmp_path / "r.json").read_text()


def test_report_load_names_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(HiraishinError, match="bad.json"):
        ReplayReport.load(bad)
    bad.write_text(json.dumps({"model": "x", "surprise": 1}))
    with pytest.raises(HiraishinError, match="surprise"):
        ReplayReport.load(bad)


def test_plot_and_tables(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    model = FakeModel(variant_shift=0.5)
    rep = replay(model, "hello world", [2, 5], order=VAR, n_new=10)
    fig = rep.plot()
    assert isinstance(fig, Figure)
    # one panel per batch size, each with its own y label; the legend sits on the figure, off the data
    assert len(fig.axes) == 2
    assert [a.get_ylabel() for a in fig.axes] == ["batch 2\nmax |Δlogit|", "batch 5\nmax |Δlogit|"]
    assert all(a.get_legend() is None for a in fig.axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "argmax flip" in labels and "prompt ends" in labels and "batched pass edges" in labels
    # batch 2 is bit-identical under the fake's variant order: its panel says so in words
    assert any(t.get_text() == "bit-identical at every position" for t in fig.axes[0].texts)
    assert not any(t.get_text() == "bit-identical at every position" for t in fig.axes[1].texts)
    # each flip is marked with the plain top-2 gap it overturned
    from hiraishin.decode.plot import MAX_GAP_LABELS

    gaps = [t.get_text() for t in fig.axes[1].texts if t.get_text().startswith("gap ")]
    closest = sorted(rep[5].flips, key=lambda f: (f.plain_gap, f.position))[:MAX_GAP_LABELS]
    assert gaps == [f"gap {f.plain_gap:.2g}" for f in sorted(closest, key=lambda f: f.position)]
    assert len(gaps) == min(MAX_GAP_LABELS, len(rep[5].flips))
    fig.savefig(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert "b=5" in rep.histogram_table()
    identical = replay(FakeModel(), "hello", [2], order=INV, n_new=3)
    identical.plot()  # all zeros still draws


def test_bad_replay_arguments():
    model = FakeModel()
    with pytest.raises(HiraishinError, match="start"):
        replay(model, [1, 2, 3], [2], order=INV, start=3)
    with pytest.raises(HiraishinError, match="batch sizes"):
        replay(model, [1, 2, 3], [0], order=INV)
    rep = replay(model, [1, 2, 3], [2], order=INV)
    with pytest.raises(KeyError, match="batch size 7"):
        rep[7]


@given(start=st.integers(0, 700), length=st.integers(1, 300), batch=st.integers(1, 20),
       boundary=st.sampled_from([None, 128, 256]))
def test_pass_spans_cover_in_order_and_respect_the_boundary(start, length, batch, boundary):
    order = ReductionOrder.custom(kv_boundary=boundary)
    spans = list(pass_spans(start, start + length, batch, order))
    assert spans[0][0] == start
    for (s, n), (s2, _) in zip(spans, spans[1:]):
        assert s + n == s2
    assert spans[-1][0] + spans[-1][1] == start + length
    for s, n in spans:
        assert 1 <= n <= batch
        if boundary:
            assert s // boundary == (s + n - 1) // boundary
