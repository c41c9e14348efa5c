"""``hiraishin demo``: the synthetic model is written once into the cache; the invariant column is exact."""

from __future__ import annotations

from hiraishin.cli import main
from hiraishin.commands.demo import cache_dir, demo_models, run_demo


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HIRAISHIN_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HIRAISHIN_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "hiraishin")


def test_models_are_written_once(tmp_path):
    target, draft, cached = demo_models(cache=tmp_path)
    assert not cached and target.exists() and draft.exists()
    stamp = (target.stat().st_mtime_ns, draft.stat().st_mtime_ns)
    again = demo_models(cache=tmp_path)
    assert again == (target, draft, True)
    assert (target.stat().st_mtime_ns, draft.stat().st_mtime_ns) == stamp
    assert not list(tmp_path.glob(".*.tmp"))  # no half-written files left


def test_demo_runs_and_the_invariant_order_is_exact(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HIRAISHIN_CACHE", str(tmp_path))
    lines = []
    variant, invariant = run_demo(tokens=8, device="cpu", batch_sizes=(3, 9), n_draft=4, out=lines.append,
                                  progress=False)
    text = "\n".join(lines)
    assert invariant.replay.identical
    assert invariant.self_spec.matches_plain and invariant.self_spec.acceptance_rate == 1.0
    assert invariant.noisy_spec.matches_plain
    assert not variant.replay.identical  # batches of 9 leave the mat-vec kernel on the micro model
    assert "batch_invariant: every replayed logit is bit-identical" in text
    assert "batch 9" in text and "time" in text
    rc = main(["demo", "--device", "cpu", "--tokens", "4", "--batch-sizes", "2", "--n-draft", "2",
               "--json-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and "(cached)" in out
    assert len(list((tmp_path / "out").glob("demo-*.json"))) == 6
