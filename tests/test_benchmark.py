"""``hiraishin bench`` on the CPU: a quick run on a micro synthetic model, the oracle schedule, the helpers.

The quick run is the CPU cost a notebook user without a GPU pays (seconds per token); it checks
that the JSON has every key the issue asks for, that the numbers are positive, and that exact
speculative decoding under the oracle schedule emits plain greedy decoding's tokens under
BATCH_INVARIANT (and reproduces the schedule).
"""

from __future__ import annotations

import argparse
import json

import pytest

from hiraishin import benchmark
from hiraishin.benchmark import REPORT, BenchSettings, OracleSchedule, parse_orders, parse_widths
from hiraishin.errors import HiraishinError


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    from hiraishin.model.synth import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("bench") / "micro.gguf", shape="micro", seed=0, progress=False)


def _run_command(argv):
    from hiraishin.commands import bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.run(args)


def test_quick_cpu_bench_writes_every_key_and_speculation_is_exact(micro_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HIRAISHIN_TEST_SWITCH", "7")  # a switch set for the run is recorded with it
    out = tmp_path / "bench.json"
    rc = _run_command([str(micro_path), "--device", "cpu", "--quick", "--orders", "invariant", "--widths", "1-2",
                       "--json", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ORACLE" in text and "batch_invariant" in text and "report (RTX 5060)" in text
    r = json.loads(out.read_text())
    assert r["model"]["name"] == "micro.gguf" and r["model"]["bytes"] == micro_path.stat().st_size
    assert r["device"]["backend"] == "cpu"
    assert r["date"] and r["commit"]
    assert r["environment"]["HIRAISHIN_TEST_SWITCH"] == "7"
    assert all(k.startswith("HIRAISHIN_") for k in r["environment"])
    assert r["copy_bandwidth_gbs"] > 0
    o = r["orders"]["batch_invariant"]
    assert o["decode_ms"] > 0 and o["prefill_tok_s"] > 0
    assert set(o["verify_ms"]) == {"1", "2"} and all(v > 0 for v in o["verify_ms"].values())
    assert r["draft"]["decode_ms"] > 0 and r["draft"]["order"] == "batch_invariant"
    s = r["speculative"]["batch_invariant"]
    assert s["oracle"] is True
    assert s["speedup"] > 0 and s["plain_ms_per_token"] > 0 and s["speculative_ms_per_token"] > 0
    assert all(s["cycle_ms"][k] >= 0 for k in ("drafting", "verifying", "bookkeeping"))
    assert s["cycle_ms"]["drafting"] > 0 and s["cycle_ms"]["verifying"] > 0
    assert s["tokens_per_cycle"] >= 1 and 0 <= s["acceptance"] <= 1 and s["mean_verify_batch"] >= 1
    # exact order: the target's argmax reproduces the schedule and the tokens are plain greedy's
    assert s["matches_plain"] is True and s["first_divergence"] is None
    assert s["schedule_reproduced"] is True
    # plain decoding as one chain (no host wait per token): the same tokens, its own speedup
    assert s["plain_chained_ms_per_token"] > 0 and s["chained_matches_plain"] is True
    assert s["speedup_vs_chained"] == pytest.approx(s["plain_chained_ms_per_token"] / s["speculative_ms_per_token"])
    # the raw numbers behind the medians: every round's speedup, the decode steps' spread
    assert len(s["rounds"]) == s["repetitions"] >= 1
    speedups = [x["speedup"] for x in s["rounds"]]
    assert s["speedup_range"] == [min(speedups), max(speedups)]
    plains = sorted(x["plain_ms_per_token"] for x in s["rounds"])
    assert s["plain_ms_per_token"] == pytest.approx((plains[(len(plains) - 1) // 2] + plains[len(plains) // 2]) / 2)
    q = o["decode_ms_spread"]
    assert q["min"] <= q["q1"] <= q["median"] <= q["q3"] <= q["max"] and q["n"] >= 1
    assert q["median"] == pytest.approx(o["decode_ms"])
    assert f"batch_invariant speedup per round: {speedups[0]:.3f}x" in text
    assert r["oracle"]["report"] == json.loads(json.dumps(REPORT))
    # the printed decomposition (tokens per cycle / a cycle in plain steps) is the speedup itself
    line = next(ln for ln in text.splitlines() if ln.startswith("  batch_invariant: "))
    assert line.endswith(f"= {s['speedup']:.2f}x"), line


def test_draft_orders_are_timed_apart_from_the_targets(micro_path, tmp_path):
    out = tmp_path / "bench.json"
    rc = _run_command([str(micro_path), "--device", "cpu", "--quick", "--orders", "invariant", "--draft-orders",
                       "fixed_split,invariant", "--widths", "1", "--json", str(out), "--quiet"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert set(r["orders"]) == {"batch_invariant"}  # the target under its order only
    assert set(r["draft"]["orders"]) == {"fixed_split", "batch_invariant"}
    orders = r["draft"]["orders"]
    assert r["draft"]["order"] == min(orders, key=lambda n: orders[n]["decode_ms"])  # the fastest one-token step
    # speculation drafts under the order whose passes of the schedule cost least, as the JSON's own figures say
    cheapest = min(orders, key=lambda n: orders[n]["cycle_drafting_ms"])
    assert r["draft"]["speculation_order"] == cheapest == r["speculative"]["batch_invariant"]["draft_order"]
    schedule = OracleSchedule.for_tokens(BenchSettings.make(quick=True).spec_tokens)
    for v in orders.values():
        assert set(v["pass_ms"]) == {"1", "2"} and all(t > 0 for t in v["pass_ms"].values())
        modelled = benchmark.cycle_drafting_ms(schedule, v["pass_ms"], v["decode_ms"])
        assert v["cycle_drafting_ms"] == pytest.approx(modelled)
    assert sum(r["draft"]["first_pass_widths"].values()) == len(schedule.k)
    assert r["speculative"]["batch_invariant"]["matches_plain"] is True
    with pytest.raises(HiraishinError, match="unknown order 'fastest'"):
        BenchSettings.make(orders=("invariant",), draft_orders=("fastest",))
    with pytest.raises(HiraishinError, match="needs draft_ahead"):
        BenchSettings.make(ahead_passes=2)
    with pytest.raises(HiraishinError, match="ahead_passes must be >= 2"):
        BenchSettings.make(draft_ahead=True, ahead_passes=1)


@pytest.mark.parametrize("ahead_passes", [None, 2])
def test_the_draft_ahead_bench_is_exact_and_verifies_guesses_made_ahead(micro_path, tmp_path, capsys, ahead_passes):
    """--draft-ahead: the oracle loop with the draft running ahead emits plain tokens, the target accepts exactly
    the guesses the per-token oracle calls right, and some cycles verify guesses made ahead (--ahead-passes 2:
    one guess each)."""
    out = tmp_path / "bench.json"
    cap = [] if ahead_passes is None else ["--ahead-passes", str(ahead_passes)]
    rc = _run_command([str(micro_path), "--device", "cpu", "--quick", "--orders", "invariant", "--widths", "1",
                       "--tokens", "24", "--draft-ahead", *cap, "--json", str(out), "--quiet"])
    assert rc == 0
    s = json.loads(out.read_text())["speculative"]["batch_invariant"]
    a = s["ahead"]
    assert a["ahead_passes"] == ahead_passes
    assert a["matches_plain"] is True and a["schedule_reproduced"] is True and a["tokens"] == 24
    assert 0 < a["ahead_cycles"] < 1 and a["speedup"] > 0 and a["speedup_range"][0] <= a["speedup_range"][1]
    assert a["tokens_per_cycle"] >= 1 and all(a["cycle_ms"][k] >= 0 for k in a["cycle_ms"])
    assert "batch_invariant ahead" in capsys.readouterr().out


def test_the_per_token_oracle_keeps_every_token_the_schedule_guesses():
    """agreement(): where the schedule's own cycles guess a token it is right or wrong as they say; the tokens
    they never guess (the target's token after a fully right cycle) are seeded draws."""
    from hiraishin.bench_spec import agreement

    sched = OracleSchedule.make(40, seed=5)
    agree = agreement(sched, 200, seed=5)
    t = 1
    for i in range(40):
        k, a = sched.cycle(i)
        assert all(agree[t:t + a]) and (a == k or not agree[t + a])
        t += a + 1
    assert agree == agreement(sched, 200, seed=5) and agree != agreement(sched, 200, seed=6)


def test_oracle_schedule_has_the_report_profile_and_is_seeded():
    sched = OracleSchedule.make(1000)
    prof = sched.profile()
    assert prof["acceptance"] == pytest.approx(REPORT["acceptance"], abs=1e-3)
    assert prof["mean_verify_batch"] == pytest.approx(REPORT["mean_verify_batch"], abs=1e-3)
    assert prof["tokens_per_cycle"] == pytest.approx(REPORT["tokens_per_cycle"], abs=5e-3)
    assert all(1 <= k <= 4 and 0 <= a <= k for k, a in zip(sched.k, sched.a))
    assert OracleSchedule.make(1000).k == sched.k and OracleSchedule.make(1000, seed=1).k != sched.k
    small = OracleSchedule.for_tokens(64)
    assert small.profile()["mean_verify_batch"] == pytest.approx(2.97, abs=0.05)
    assert OracleSchedule.make(5, n_draft=1).k == [1] * 5  # no endless nudging when k cannot grow


def test_first_pass_widths_are_the_draft_passes_the_oracle_loop_makes(micro_path, monkeypatch):
    """OracleSchedule.first_pass_widths, by which the bench picks the draft's order, is what
    bench_spec.speculative_decode feeds the draft first in each cycle: two tokens after a fully right
    cycle, else one."""
    from hiraishin import Qwen3, bench_spec
    from hiraishin.order import ReductionOrder

    fed = []
    real = bench_spec.draft_and_verify

    def spy(draft, target, tokens, *args, **kwargs):
        fed.append(len(tokens))
        return real(draft, target, tokens, *args, **kwargs)

    monkeypatch.setattr(bench_spec, "draft_and_verify", spy)
    order = ReductionOrder.BATCH_INVARIANT
    target = Qwen3.from_gguf(micro_path, device="cpu", progress=False, n_ctx=128)
    draft = Qwen3.from_gguf(micro_path, device="cpu", progress=False, n_ctx=128)
    prompt = list(range(3, 11))
    n = 30
    schedule = OracleSchedule.make(40, seed=11)
    reference, _ = benchmark.plain_decode(target, prompt, n + 5, order)
    run = bench_spec.speculative_decode(target, draft, prompt, n, order, order, schedule, reference)
    assert run.tokens == reference[:n]
    cycles = len(fed)
    assert cycles > 5 and 1 in fed and 2 in fed
    assert fed == schedule.first_pass_widths()[:cycles]


def test_cycle_drafting_prefers_the_cheaper_two_token_pass():
    """An order a little faster at one token but much slower at two drafts a cycle more slowly."""
    schedule = OracleSchedule.make(200, seed=4)
    twos = schedule.first_pass_widths().count(2)
    assert 0.4 < twos / 200 < 0.8  # the report's profile: most cycles accept every guess
    variant_like = benchmark.cycle_drafting_ms(schedule, {"1": 0.66, "2": 1.05}, 0.618)
    invariant_like = benchmark.cycle_drafting_ms(schedule, {"1": 0.67, "2": 0.78}, 0.620)
    assert invariant_like < variant_like
    passes = sum(schedule.k)
    assert variant_like == pytest.approx((200 * 0.66 + twos * 0.39 + (passes - 200) * 0.618) / 200)


def test_parsers():
    assert parse_widths("1-16") == tuple(range(1, 17))
    assert parse_widths("4,1-2") == (1, 2, 4)
    assert parse_orders("variant,batch_invariant") == ("variant", "invariant")
    for bad in ("0-3", "17", "x"):
        with pytest.raises(HiraishinError):
            parse_widths(bad)
    with pytest.raises(HiraishinError):
        parse_orders("fastest")


def test_commit_falls_back_to_the_environment(monkeypatch):
    def no_git(*args, **kwargs):
        raise OSError("no git")

    monkeypatch.setattr(benchmark.subprocess, "run", no_git)
    monkeypatch.setenv("HIRAISHIN_COMMIT", "abc123")
    assert benchmark.git_commit() == "abc123"
    monkeypatch.delenv("HIRAISHIN_COMMIT")
    assert benchmark.git_commit() == "unknown"


def _llama_bench_records(model="/tmp/qwen3-8b.gguf"):
    # the fields llama-bench -o json writes that read_llama_bench reads (plus one it ignores)
    return [{"model_filename": model, "n_prompt": 512, "n_gen": 0, "avg_ts": 10240.0, "build_commit": "x"},
            {"model_filename": model, "n_prompt": 0, "n_gen": 128, "avg_ts": 250.0},
            {"model_filename": model, "n_prompt": 16, "n_gen": 0, "avg_ts": 2000.0},
            {"model_filename": model, "n_prompt": 1, "n_gen": 0, "avg_ts": 200.0}]


def test_llama_bench_json_is_read_and_printed_beside_ours(micro_path, tmp_path, capsys):
    from hiraishin.bench_report import read_llama_bench

    f = tmp_path / "llama-bench-8b.json"
    f.write_text(json.dumps(_llama_bench_records()))
    got = read_llama_bench([f])
    m = got["models"]["qwen3-8b.gguf"]
    assert m["decode_ms"] == pytest.approx(4.0)
    assert m["prompt_tok_s"]["512"] == 10240.0
    assert m["pass_ms"]["16"] == pytest.approx(8.0) and m["pass_ms"]["1"] == pytest.approx(5.0)
    out = tmp_path / "bench.json"
    rc = _run_command([str(micro_path), "--device", "cpu", "--quick", "--orders", "invariant", "--widths", "1",
                       "--json", str(out), "--quiet", "--llama-bench", str(f)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "measured by llama-bench (llama-bench-8b.json)" in text
    assert "decode 4.000 ms/token; pp512 10,240.0 tok/s; passes 1: 5.000 ms, 16: 8.000 ms" in text
    assert json.loads(out.read_text())["llama_cpp"]["models"]["qwen3-8b.gguf"]["decode_ms"] == pytest.approx(4.0)


@pytest.mark.parametrize("content", ["{}", "not json", json.dumps([{"n_prompt": 1}]),
                                     json.dumps([{"model_filename": "m", "n_prompt": 1, "n_gen": 0, "avg_ts": 0}])])
def test_bad_llama_bench_json_names_the_file(tmp_path, content):
    from hiraishin.bench_report import read_llama_bench

    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(HiraishinError, match="bad.json: not llama-bench JSON"):
        read_llama_bench([f])
    with pytest.raises(HiraishinError, match="missing.json"):
        read_llama_bench([tmp_path / "missing.json"])


def test_even_out_gives_tokens_arriving_in_blocks_a_time_each():
    from hiraishin.bench_timing import even_out

    assert even_out([0.5, 0.25, 2.0], 1) == [0.5, 0.25, 2.0]  # one pass a graph: the gaps themselves
    assert even_out([4.0, 0.0, 0.0, 0.0], 4) == [1.0] * 4  # a block's tokens arrive together: the mean
    assert even_out([], 4) == []
