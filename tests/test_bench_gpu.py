"""``hiraishin bench`` on a GPU, quick: both oracle loops (the draft after the verify, and running ahead of it) on CUDA
graphs emit plain decoding's tokens and reproduce the oracle, under every exact order (needs CuPy, ``-m gpu``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_quick_cuda_bench_with_the_draft_ahead(tiny_model_path):
    from hiraishin.benchmark import BenchSettings, run_bench

    settings = BenchSettings.make(quick=True, orders=("invariant", "fixed_split", "subblock"), widths=(1, 3),
                                  spec_tokens=24, draft_ahead=True)
    r = run_bench(tiny_model_path, device="cuda", settings=settings)
    assert r["cuda_graphs"] is True
    for name, s in r["speculative"].items():
        a = s["ahead"]
        for what, run in (("after", s), ("ahead", a)):
            assert run["matches_plain"] and run["schedule_reproduced"], (name, what, run)
        assert 0 < a["ahead_cycles"] < 1 and a["tokens"] == 24, (name, a)
