"""``hiraishin bench``'s outputs: the llama-bench-like table and the JSON file (written atomically)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .atomic import atomic_write
from .errors import HiraishinError

__all__ = ["format_report", "write_json", "read_llama_bench"]

# Stock llama.cpp on an H200 with the same synthetic files (llama-bench -fa on, an sm_90 build of the
# sources llama-cpp-python 0.3.36 vendors; medians of its runs, 2026-12-02,
# bench/results/2026-12-02-h200-session4/c-host-profile-llama-cpp): tg128 3.90 ms/token (8B) and
# 1.38 (0.6B); one pass of 9 / 12 / 16 tokens 7.7 / 8.2 / 8.3 ms. Printed beside ours, not run here.
LLAMA_CPP_H200 = {"decode_ms_8b": 3.90, "draft_step_ms_0.6b": 1.38, "verify_9_16_ms_8b": 8.2}


def _json_ready(x):
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if np.isfinite(x) else None
    return x


def write_json(result: dict, path) -> Path:
    """Write ``result`` to ``path`` atomically (the old file or the whole new one, never half)."""
    with atomic_write(path) as f:
        json.dump(_json_ready(result), f, indent=2)
        f.write("\n")
    return Path(path)


def read_llama_bench(paths) -> dict:
    """Stock llama.cpp's figures from ``llama-bench -o json`` files (``bench/llama_cpp_session.sh``).

    Per model file name: ``decode_ms`` (a token-generation test: 1000 / tokens per second),
    ``prompt_tok_s`` by prompt length (``"512"`` is llama-bench's pp512) and ``pass_ms`` by prompt
    length (one pass of that many tokens: 1000 * n / tokens per second). Raises
    :class:`~hiraishin.errors.HiraishinError` naming the file that is not llama-bench's JSON.
    """
    models: dict = {}
    for path in paths:
        try:
            records = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(records, list):
                raise ValueError("not a list of llama-bench records")
            for rec in records:
                name = Path(str(rec["model_filename"])).name
                n_prompt, n_gen, ts = int(rec["n_prompt"]), int(rec["n_gen"]), float(rec["avg_ts"])
                if not ts > 0:
                    raise ValueError(f"avg_ts {ts!r} is not positive")
                m = models.setdefault(name, {"decode_ms": None, "prompt_tok_s": {}, "pass_ms": {}})
                if n_gen > 0 and n_prompt == 0:
                    m["decode_ms"] = 1e3 / ts
                elif n_prompt > 0 and n_gen == 0:
                    m["prompt_tok_s"][str(n_prompt)] = ts
                    m["pass_ms"][str(n_prompt)] = 1e3 * n_prompt / ts
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HiraishinError(f"{path}: not llama-bench JSON output ({type(exc).__name__}: {exc})") from None
    return {"measured": True, "files": [Path(p).name for p in paths], "models": models}


def _llama_lines(r: dict) -> list[str]:
    ref = r.get("llama_cpp")
    if not ref:
        return [f"stock llama.cpp, same files on an H200 (recorded figures, not run by this command): 8B decode "
                f"{LLAMA_CPP_H200['decode_ms_8b']:.2f} ms/token, 0.6B draft step "
                f"{LLAMA_CPP_H200['draft_step_ms_0.6b']:.2f} ms, 8B pass of 9-16 tokens "
                f"{LLAMA_CPP_H200['verify_9_16_ms_8b']:.1f} ms"]
    lines = [f"stock llama.cpp, measured by llama-bench ({', '.join(ref['files'])}):"]
    for name, m in ref["models"].items():
        parts = []
        if m["decode_ms"] is not None:
            parts.append(f"decode {m['decode_ms']:.3f} ms/token")
        if "512" in m["prompt_tok_s"]:
            parts.append(f"pp512 {m['prompt_tok_s']['512']:,.1f} tok/s")
        widths = sorted((int(n), ms) for n, ms in m["pass_ms"].items() if int(n) <= 16)
        if widths:
            parts.append("passes " + ", ".join(f"{n}: {ms:.3f} ms" for n, ms in widths))
        lines.append(f"  {name}: " + ("; ".join(parts) if parts else "no test this table reads"))
    return lines


# ---- the table -------------------------------------------------------------------------------

def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _spec_row(label: str, plain_ms: float, s: dict) -> str:
    """One row of the speculative table: a run's figures ``s`` beside plain decoding's ``plain_ms`` a token."""
    c = s["cycle_ms"]
    same = "yes" if s["matches_plain"] else f"no @{s['first_divergence']}"
    return (f"| {label:<18} | {plain_ms:>12.3f} | {s['speculative_ms_per_token']:>11.3f} | "
            f"{s['speedup']:>6.2f}x | {c['drafting']:>8.3f} | {c['verifying']:>9.3f} | "
            f"{c['bookkeeping']:>11.3f} | {s['tokens_per_cycle']:>9.2f} | {s['acceptance']:>6.1%} | "
            f"{s['mean_verify_batch']:>12.2f} | {same:>8} |")


def format_report(r: dict) -> str:
    """The llama-bench-like text table of a :func:`run_bench` result."""
    lines = []
    dev = r["device"]
    lines.append(f"hiraishin bench  {r['model']['name']} ({_mb(r['model']['bytes'])})  device {dev['backend']}: "
                 f"{dev.get('name', '?')}  date {r['date']}  commit {r['commit'][:12]}"
                 + ("  [quick: 1 repetition, no warm-up before prefill/verify passes]"
                    if r["settings"].get("quick") else ""))
    lines.append(f"copy bandwidth {r['copy_bandwidth_gbs']:,.1f} GB/s (device-to-device, bytes read + written); "
                 f"weight floor {r['model']['floor_ms']:.3f} ms/token; CUDA graphs {'on' if r['cuda_graphs'] else 'off'}")
    m = r["memory"]
    mem = f"memory: file(s) {_mb(m['file_bytes'])} + KV caches {_mb(m['kv_cache_bytes'])}"
    if "used_bytes" in m:
        mem += f"; backend holds {_mb(m['used_bytes'])} = {m['used_over_file_and_kv']:.2f}x of that"
    lines.append(mem)
    lines.append("")
    orders = list(r["orders"])
    hdr = f"| {'order':<16} | {'decode ms/tok':>13} | {'tok/s':>9} | {'one pass, synced':>16} | {'prefill tok/s':>13} |"
    lines.append(hdr)
    lines.append("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for name in orders:
        o = r["orders"][name]
        synced = o.get("decode_sync_ms")
        lines.append(f"| {name:<16} | {o['decode_ms']:>13.3f} | {o['decode_tok_s']:>9.2f} | "
                     f"{'-' if synced is None else f'{synced:.3f}':>16} | {o['prefill_tok_s']:>13.1f} |")
    lines.append(f"(decode: time between tokens of plain greedy decoding; one pass, synced: a pass bracketed by two "
                 f"synchronizations, the host's share included; prefill: {r['settings']['prefill']} tokens, in the "
                 f"passes plain decoding makes)")
    for name in orders:  # older JSON files lack the spread
        q = r["orders"][name].get("decode_ms_spread")
        if q:
            lines.append(f"  {name} decode over {q['n']} tokens: min {q['min']:.3f}, quartiles {q['q1']:.3f} / "
                         f"{q['median']:.3f} / {q['q3']:.3f}, max {q['max']:.3f} ms")
    lines.append("")
    widths = list(next(iter(r["orders"].values()))["verify_ms"]) if orders else []
    hdr = "| verify width | " + " | ".join(f"{n:>16}" for n in orders) + " |"
    lines.append(hdr)
    lines.append("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")
    for w in widths:
        lines.append(f"| {w:>12} | " + " | ".join(f"{r['orders'][n]['verify_ms'][w]:>13.3f} ms" for n in orders) + " |")
    lines.append("")
    d = r["draft"]
    lines.append(f"draft {d['name']}{' (the target itself)' if d['self'] else ''}: one-token step "
                 + ", ".join(f"{n} {v['decode_ms']:.3f} ms" + (f" ({v['decode_sync_ms']:.3f} synced)"
                                                                   if "decode_sync_ms" in v else "")
                             for n, v in d["orders"].items())
                 + f"; the fastest, {d['order']}")
    if "speculation_order" in d:  # (a JSON of older runs: the draft drafted under its fastest one-token step)
        widths = d["first_pass_widths"]
        lines.append(f"  a cycle's drafting, modelled from its first pass (1 token in {widths['1']} cycles, 2 in "
                     f"{widths['2']}) and its one-token steps: "
                     + ", ".join(f"{n} {v['cycle_drafting_ms']:.3f} ms (passes of 1 / 2 tokens "
                                 f"{v['pass_ms']['1']:.3f} / {v['pass_ms']['2']:.3f})" for n, v in d["orders"].items())
                     + f"; speculation drafts under the cheapest, {d['speculation_order']}")
    else:
        lines.append(f"  speculation drafts under its fastest order, {d['order']}")
    lines.append("")
    o = r["oracle"]
    lines.append("speculative decoding, ORACLE schedule (seeded, the original report's profile: which guesses are "
                 "right is scheduled; every draft step and verify pass runs for real)")
    sp = o["schedule"]
    lines.append(f"  schedule: acceptance {sp['acceptance']:.1%}, mean verify batch {sp['mean_verify_batch']:.2f}, "
                 f"{sp['tokens_per_cycle']:.2f} tokens per cycle, seed {o['seed']}")
    hdr = (f"| {'order':<18} | {'plain ms/tok':>12} | {'spec ms/tok':>11} | {'speedup':>7} | {'draft ms':>8} | "
           f"{'verify ms':>9} | {'bookkeep ms':>11} | {'tok/cycle':>9} | {'accept':>6} | {'verify batch':>12} | "
           f"{'== plain':>8} |")
    lines.append(hdr)
    lines.append("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")
    for name, s in r["speculative"].items():
        lines.append(_spec_row(name, s["plain_ms_per_token"], s))
        if s.get("ahead"):  # the draft running ahead (bench --draft-ahead)
            lines.append(_spec_row("  draft ahead", s["plain_ms_per_token"], s["ahead"]))
    rep = o["report"]
    rc = rep["cycle_ms"]
    lines.append(f"| {'report (RTX 5060)':<18} | {rep['plain_ms_per_token']:>12.3f} | "
                 f"{1e3 / rep['speculative_tok_s']:>11.3f} | {rep['speedup']:>6.2f}x | {rc['drafting']:>8.3f} | "
                 f"{rc['verifying']:>9.3f} | {rc['bookkeeping']:>11.3f} | {rep['tokens_per_cycle']:>9.2f} | "
                 f"{rep['acceptance']:>6.1%} | {rep['mean_verify_batch']:>12.2f} | {'yes':>8} |")
    for name, s in r["speculative"].items():  # older JSON files lack the chained baseline
        if "plain_chained_ms_per_token" in s:
            same = "the same tokens" if s.get("chained_matches_plain") else "OTHER TOKENS"
            lines.append(f"  {name} without a host wait per plain token (one chain): "
                         f"{s['plain_chained_ms_per_token']:.3f} ms/tok ({same}); "
                         f"speculative {s['speedup_vs_chained']:.2f}x that")
    for name, s in r["speculative"].items():  # older JSON files lack the rounds
        if s.get("rounds"):
            lines.append(f"  {name} speedup per round: " + ", ".join(f"{x['speedup']:.3f}x" for x in s["rounds"])
                         + " (the table: the round of the median speculative time)")
    lines.append("where each speedup comes from: tokens per cycle / (a cycle's drafting + verifying + bookkeeping, "
                 "each in plain decoding steps)")
    for name, s in r["speculative"].items():
        c, p = s["cycle_ms"], s["plain_ms_per_token"]
        if p and p > 0:
            d, v, b = c["drafting"] / p, c["verifying"] / p, c["bookkeeping"] / p
            lines.append(f"  {name}: {s['tokens_per_cycle']:.2f} / ({d:.2f} + {v:.2f} + {b:.2f}) = "
                         f"{s['tokens_per_cycle'] / (d + v + b):.2f}x")
    for name, s in r["speculative"].items():
        if s.get("ahead"):
            a = s["ahead"]
            lines.append(f"  {name} ahead: {a['ahead_cycles']:.0%} of cycles verified guesses the draft made during the "
                         f"verify before; speedup per round " + ", ".join(f"{x:.3f}x" for x in a["rounds_speedup"]))
    for name, s in r["speculative"].items():
        if not s["schedule_reproduced"]:
            lines.append(f"note: under {name} the target's argmax departed from the oracle schedule "
                         "(acceptance decided by the target's own argmax, as always)")
    lines += _llama_lines(r)
    return "\n".join(lines)
