"""Replay on the synthetic micro Qwen3 (CPU emulator): BATCH_VARIANT shows the bug and the localizer
names the op; BATCH_INVARIANT is bit-identical everywhere, across the 256/384 KV boundaries too."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.decode.localize import localize
from hiraishin.decode.replay import replay
from hiraishin.decode.report import ReplayReport
from hiraishin.order import ReductionOrder

VAR = ReductionOrder.BATCH_VARIANT
INV = ReductionOrder.BATCH_INVARIANT
PROMPT = "The order of floating-point additions"


@pytest.fixture(scope="module")
def model(micro_model_path):
    from hiraishin.model.qwen3 import Qwen3

    return Qwen3.from_gguf(micro_model_path, device="cpu", n_ctx=512, progress=False)


@pytest.fixture(scope="module")
def variant_report(model):
    rep = replay(model, PROMPT, [2, 3, 5, 9, 16], order=VAR, n_new=16)
    localize(model, rep)
    return rep


def test_variant_replay_reproduces_the_bug(variant_report):
    rep = variant_report
    assert not rep.identical
    assert rep.max_abs_diff > 0
    assert any(b.max_abs_diff > 0 for b in rep.batches if b.batch_size >= 5)


def test_localizer_names_the_first_differing_op(variant_report):
    loc = variant_report.localization
    assert loc is not None and loc.name is not None
    assert loc.position == variant_report.first_divergence
    names = [name for name, _ in loc.ops]
    i = names.index(loc.name)
    assert all(d == 0.0 for _, d in loc.ops[:i])  # everything before it agrees
    assert loc.ops[i][1] == loc.max_abs_diff
    assert loc.name == "output" or loc.layer is not None
    assert loc.name in str(variant_report)


def test_invariant_replay_is_bit_identical(model):
    rep = replay(model, PROMPT, [2, 3, 5, 9, 16], order=INV, n_new=16)
    assert rep.identical and rep.max_abs_diff == 0.0 and not rep.flips


def test_invariant_replay_across_the_256_and_384_boundaries(model):
    # 400 positions; the first 244 are a shared prefix fed in passes of 16, the rest are compared,
    # so batches of 9 and 16 meet cell 256 (cut there by verify_limit) and cross cell 384
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.config.n_vocab, 400)]
    rep = replay(model, tokens, [9, 16], order=INV, start=244)
    assert rep.positions == range(244, 400)
    assert rep.identical, str(rep)
    assert all(d == 0.0 for b in rep.batches for d in b.diff_by_position)


def test_report_round_trips_and_plots(variant_report, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    back = ReplayReport.load(variant_report.save(tmp_path / "r.json"))
    assert back == variant_report
    from hiraishin.commands.common import save_figure

    save_figure(variant_report.plot(), tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert not list(tmp_path.glob("*.partial"))
