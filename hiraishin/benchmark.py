"""``hiraishin bench``'s measurements: a llama-bench-like benchmark of one model (and a draft).

>>> from hiraishin.benchmark import BenchSettings, run_bench, format_report
>>> result = run_bench("Qwen3-8B-Q4_K_M.gguf", draft_path="Qwen3-0.6B-Q4_K_M.gguf", device="cuda")
>>> print(format_report(result))

What is measured, per reduction order (``settings.orders``):

* ``decode_ms``: one-token passes (plain decoding, as ``generate`` makes them with one logit per
  token: on CUDA graphs the next pass enqueued before the host reads a token, ``greedy_stream``) at a
  short context, median time between two tokens reaching the host; ``decode_sync_ms`` the same passes
  one at a time, each bracketed by synchronizations (the host's share of a step included);
* ``prefill_tok_s``: a prompt of ``prefill`` tokens (512 by default), in the passes plain
  decoding makes (cut at the order's KV boundary, ``order.verify_limit``), median over repetitions;
* ``verify_ms``: one pass of ``w`` tokens for each width ``w`` (1..16 by default), as a
  speculative verifier makes it, at the same context, median;
* ``speculative``: exact speculative decoding with an **oracle schedule** (below) against plain
  greedy decoding of the same tokens: ms per token of both, the speedup, the per-cycle split
  (drafting / verifying / bookkeeping ms), tokens per cycle, acceptance, and whether the
  emitted tokens equal plain greedy decoding's.

Plus the draft's one-token step under each order (``draft_orders``, default the target's) and its
passes of one and two tokens (a cycle's first pass); speculation drafts under the order whose passes
of the schedule cost least (:func:`cycle_drafting_ms`; only the target's order decides exactness),
the device-to-device copy
bandwidth (bytes read + written),
and the memory the backend holds against the file sizes plus KV caches.

The oracle. Synthetic weights do not agree like trained ones (a synthetic draft almost never
guesses the target's token), so *which* guesses are right comes from a seeded schedule with the
original report's profile (:data:`REPORT`): per cycle ``k`` drafted tokens (mean verify batch
``k + 1`` = 2.97) of which a prefix of ``a`` is right (77.3% of drafted tokens overall, 2.52
tokens out per cycle). Everything else runs for real: per cycle the draft model makes ``k``
passes, as the library's own loop (``hiraishin.decode.speculative``) does: one of the one or two
tokens its cache lacks, then ``k - 1`` of one token, each of its own previous guess, chained on the
device (``greedy_chain``: the host needs no guess before the last), and the target's verify pass
of ``k + 1`` tokens (cut to ``order.verify_limit``) enqueued behind them, one host wait for both
(``draft_and_verify``; drafting is the draft chain's device time, verifying the rest of the
cycle's passes). The tokens the verifier gets are the target's own plain-greedy tokens for the
scheduled-right prefix and a deliberately wrong token at the first rejection; acceptance compares each
drafted token with the target's argmax in that pass (so under an exact order the schedule is
reproduced, and the emitted tokens equal plain greedy decoding's; under ``BATCH_VARIANT`` any
divergence is reported); then both KV caches roll back to the accepted length.

Plain decoding hands each token to the host as it comes, as a loop that streams tokens or stops at a
stop token must (through ``greedy_stream`` where the model has it: the next pass already enqueued, so
the GPU does not wait for the host); ``plain_chained_ms_per_token`` is the same decoding as one chain
(one host wait for all), reported beside it with the speedup over it (``speedup_vs_chained``), so
neither baseline hides.

Timing: passes are bracketed by ``backend.synchronize()``; warm-up passes first (JIT, kernel
compilation, CUDA-graph capture are excluded); medians of several repetitions. A timed pass is
``forward_argmax`` (each position's greedy token, argmax on the device; what a decoding loop
needs, for plain and speculative decoding alike), so its time covers the pass, that argmax and
the copy of T token ids, not a copy of the logits. Only the model API is used (``from_gguf``,
``forward_argmax`` or else ``forward``, ``rollback``, ``reset``, ``kv_len``, ``backend``).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .errors import HiraishinError
from .decode.oracle import ORACLE_SEED, REPORT, OracleSchedule
from .bench_timing import even_out, seeded_prompt, timed_chain, timed_feed, timed_greedy_steps, timed_pass
from .bench_spec import agreement, first_divergence, speculative_decode, speculative_decode_ahead
from .decode.ahead import MIN_AHEAD_PASSES
from .order import ReductionOrder

__all__ = ["ORDERS", "REPORT", "BenchSettings", "OracleSchedule", "run_bench",
           "parse_orders", "parse_widths", "git_commit", "copy_bandwidth_gbs", "SCHEMA"]

SCHEMA = "hiraishin-bench/1"

# The orders a benchmark may run, by the short name the command line takes. Extend here.
ORDERS: dict[str, ReductionOrder] = {
    "variant": ReductionOrder.BATCH_VARIANT,
    "invariant": ReductionOrder.BATCH_INVARIANT,
    "fixed_split": ReductionOrder.FIXED_SPLIT,
    "subblock": ReductionOrder.SUBBLOCK,
    # BATCH_INVARIANT's bits with up to 16 columns per mat-vec launch instead of 8 (columns per
    # launch change no bit: issue 12's question whether 9-16 columns pay in one launch)
    "invariant16": ReductionOrder(name="batch_invariant_16", matvec="invariant", attention="invariant",
                                  kv_boundary=ReductionOrder.BATCH_INVARIANT.kv_boundary, max_cols_per_launch=16),
    # Draft orders (--draft-orders): BATCH_INVARIANT's attention and one-column geometry at every width,
    # but the mat-vec's warps per row fixed at 1 or 2 instead of 4. Batch-invariant orders of their own
    # (other bits than BATCH_INVARIANT's); for a draft only speed counts: on the 0.6B's rows of 1,024
    # values (4 Q4_K super-blocks) 4 warps leave half their threads without a super-block to sum.
    "nwarps1": ReductionOrder.custom(name="nwarps_1", nwarps=1),
    "nwarps2": ReductionOrder.custom(name="nwarps_2", nwarps=2),
}
DEFAULT_ORDERS = ("variant", "invariant", "subblock")


CONTEXT = 32  # prompt tokens before the decode / verify measurements (a short context, as tg128)
QUICK_CONTEXT = 8
# --quick verify widths (a CPU pass of 16 tokens of the tiny shape takes seconds); a quick run also
# skips the warm-up before prefill and verify passes (the decode measurement warmed the kernels up)
QUICK_WIDTHS = (1, 2, 4, 8, 16)
COPY_BYTES = 1 << 29  # bytes per device-to-device copy buffer on a GPU (512 MiB: far past the L2)
CPU_COPY_BYTES = 1 << 26  # 64 MiB on the CPU


@dataclass
class BenchSettings:
    """What to run. ``quick``: fewer repetitions and tokens (a CPU smoke run, seconds per token)."""

    orders: tuple[str, ...] = DEFAULT_ORDERS
    # orders the draft is timed under; speculation drafts under the cheapest (cycle_drafting_ms; its order
    # decides no token); None: the target's orders
    draft_orders: tuple[str, ...] | None = None
    widths: tuple[int, ...] = tuple(range(1, 17))
    prefill: int = 512
    quick: bool = False
    warmup: int = 2  # untimed passes before the timed ones (JIT, compilation, graph capture)
    pass_warmup: int = 2  # the same before each prefill and each verify width (quick: 0, see QUICK_WIDTHS)
    repetitions: int = 5
    decode_steps: int = 16
    spec_tokens: int = 64
    spec_repetitions: int = 3
    n_draft: int = 4  # most drafted tokens per cycle (the schedule's largest k)
    context: int = CONTEXT
    seed: int = ORACLE_SEED
    # also exact speculation with the draft running ahead (hiraishin.decode.ahead): "ahead" beside each order's
    draft_ahead: bool = False
    ahead_passes: int | None = None  # the most passes it makes ahead (None: the schedule's next draft length + 1)

    @classmethod
    def make(cls, quick: bool = False, **overrides) -> "BenchSettings":
        """Defaults (or the quick ones), with the non-None ``overrides`` applied."""
        base = cls(warmup=1, pass_warmup=0, repetitions=1, decode_steps=2, spec_tokens=6, spec_repetitions=1,
                   prefill=16, widths=QUICK_WIDTHS, context=QUICK_CONTEXT, quick=True) if quick else cls()
        for key, value in overrides.items():
            if value is not None:
                setattr(base, key, value)
        for name in base.orders + (base.draft_orders or ()):
            if name not in ORDERS:
                raise HiraishinError(f"unknown order {name!r}; choose from {', '.join(ORDERS)}")
        if not base.widths or min(base.widths) < 1 or max(base.widths) > 16:
            raise HiraishinError(f"verify widths must be in 1..16, got {base.widths}")
        if base.prefill < 1:
            raise HiraishinError(f"prefill must be >= 1 token, got {base.prefill}")
        if base.ahead_passes is not None:
            if not base.draft_ahead:
                raise HiraishinError("ahead_passes limits the draft running ahead: it needs draft_ahead")
            if base.ahead_passes < MIN_AHEAD_PASSES:
                raise HiraishinError(f"ahead_passes must be >= {MIN_AHEAD_PASSES} (the draft's guess of the target's "
                                     f"next token and one guess), got {base.ahead_passes}")
        return base


def parse_orders(text: str) -> tuple[str, ...]:
    """``"variant,invariant"`` -> ``("variant", "invariant")`` (preset full names accepted)."""
    names = tuple(s.strip().lower().removeprefix("batch_") for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in ORDERS]
    if not names or bad:
        raise HiraishinError(f"unknown order(s) {bad or text!r}; choose from {', '.join(ORDERS)}")
    return names


def parse_widths(text: str) -> tuple[int, ...]:
    """``"1-16"``, ``"1,2,4"`` or ``"1-4,8"`` -> sorted distinct widths."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise HiraishinError(f"widths must look like 1-16 or 1,2,4; got {text!r}") from None
    if not out or min(out) < 1 or max(out) > 16:
        raise HiraishinError(f"widths must be in 1..16; got {text!r}")
    return tuple(sorted(out))


# ---- facts about the run ---------------------------------------------------------------------

def git_commit() -> str:
    """``$HIRAISHIN_COMMIT`` when set (a copied tree's ``.git`` can be stale), else ``git rev-parse
    HEAD`` of the source tree, else ``"unknown"``."""
    if os.environ.get("HIRAISHIN_COMMIT", "unknown") != "unknown":
        return os.environ["HIRAISHIN_COMMIT"]
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _device_info(backend) -> dict:
    info = {"backend": backend.name}
    if backend.name == "cuda":
        try:
            cp = backend.xp
            props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
            name = props["name"]
            info["name"] = name.decode() if isinstance(name, bytes) else str(name)
            info["sms"] = int(props["multiProcessorCount"])
            info["memory_bytes"] = int(props["totalGlobalMem"])
        except Exception:  # noqa: BLE001 - a fact we can do without
            info["name"] = "unknown CUDA device"
    else:
        info["name"] = platform.processor() or platform.machine()
        info["cpus"] = os.cpu_count()
    return info


def copy_bandwidth_gbs(backend, nbytes: int | None = None, repetitions: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read + written (median)."""
    xp = getattr(backend, "xp", np)
    if nbytes is None:
        nbytes = COPY_BYTES if backend.name == "cuda" else CPU_COPY_BYTES
    src = xp.ones(nbytes // 4, dtype=np.float32)
    dst = xp.empty_like(src)
    xp.copyto(dst, src)  # warm-up (page faults, allocation)
    times = []
    for _ in range(repetitions):
        backend.synchronize()
        t0 = time.perf_counter()
        xp.copyto(dst, src)
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / statistics.median(times) / 1e9


def measure_decode(model, order, settings: BenchSettings, sync: bool = False) -> list[float]:
    """Seconds per token of one-token steps (greedy, after a prompt of ``settings.context``), warm-up
    steps left out: as plain decoding makes them (:func:`~hiraishin.bench_timing.timed_greedy_steps`), or with ``sync`` each pass
    on its own between two synchronizations (:func:`~hiraishin.bench_timing.timed_pass`)."""
    model.reset()
    best, _ = timed_feed(model, seeded_prompt(model, settings.context), 0, order)
    token = int(best[-1])
    if not sync:
        _, times = timed_greedy_steps(model, token, model.kv_len, settings.warmup + settings.decode_steps, order)
        block = getattr(getattr(model, "pass_graphs", None), "graph_passes", 1)  # tokens arriving block by block
        return even_out(times[settings.warmup:], block)
    times = []
    for i in range(settings.warmup + settings.decode_steps):
        pos = model.kv_len
        best, dt = timed_pass(model, [token], pos, order)
        token = int(best[-1])
        if i >= settings.warmup:
            times.append(dt)
    return times


def spread_ms(seconds: list[float]) -> dict:
    """How a median's samples spread, in ms: min, quartiles, max and the sample count."""
    ms = sorted(1e3 * t for t in seconds)
    if len(ms) < 2:
        q = [ms[0]] * 3 if ms else [float("nan")] * 3
    else:
        q = statistics.quantiles(ms, n=4, method="inclusive")
    return {"min": ms[0] if ms else float("nan"), "q1": q[0], "median": q[1], "q3": q[2],
            "max": ms[-1] if ms else float("nan"), "n": len(ms)}


def measure_prefill(model, order, settings: BenchSettings) -> tuple[float, int]:
    """(tokens per second, passes) of a ``settings.prefill``-token prompt from an empty cache."""
    prompt = seeded_prompt(model, settings.prefill, seed=1)
    times = []
    for i in range(settings.pass_warmup + settings.repetitions):
        model.reset()
        _, dt = timed_feed(model, prompt, 0, order)
        if i >= settings.pass_warmup:
            times.append(dt)
    passes, pos = 0, 0
    while pos < settings.prefill:
        pos += order.verify_limit(pos, settings.prefill - pos)
        passes += 1
    return settings.prefill / statistics.median(times), passes


# The widths of a draft's first pass in a cycle (OracleSchedule.first_pass_widths): the target's token, and after
# a cycle that accepted every guess also the draft's last guess.
FIRST_PASS_WIDTHS = (1, 2)


def cycle_drafting_ms(schedule: OracleSchedule, pass_ms: dict[str, float], step_ms: float) -> float:
    """A cycle's drafting under one draft order, modelled from its timings: the cycle's first pass of one or
    two tokens (``pass_ms[width]``, a pass at the cycle's start, after the host's wait) and ``k - 1`` chained
    one-token steps (``step_ms`` each), averaged over the cycles of ``schedule``. What the bench picks the
    draft's order by (:func:`run_bench`)."""
    widths = schedule.first_pass_widths()
    return sum(pass_ms[str(w)] + (k - 1) * step_ms for w, k in zip(widths, schedule.k)) / len(widths)


def measure_verify(model, order, settings: BenchSettings) -> dict[str, float]:
    """Median ms of one pass of ``w`` tokens at context ``settings.context``, per width ``w``."""
    model.reset()
    ctx = settings.context
    timed_feed(model, seeded_prompt(model, ctx), 0, order)
    batch = seeded_prompt(model, 16, seed=2)
    out = {}
    for w in settings.widths:
        if order.verify_limit(ctx, w) < w:
            raise HiraishinError(f"a verify pass of {w} tokens at position {ctx} crosses {order.name}'s KV boundary")
        times = []
        for i in range(settings.pass_warmup + settings.repetitions):
            _, dt = timed_pass(model, batch[:w], ctx, order)
            model.rollback(ctx)
            if i >= settings.pass_warmup:
                times.append(dt)
        out[str(w)] = 1e3 * statistics.median(times)
    return out


# ---- plain and speculative decoding, timed ---------------------------------------------------

def plain_decode(model, prompt, n_tokens: int, order) -> tuple[list[int], list[float]]:
    """Greedy tokens after ``prompt`` (the prefill's token first) and the seconds of each one-token step
    (:func:`~hiraishin.bench_timing.timed_greedy_steps`: plain decoding as the library makes it)."""
    model.reset()
    best, _ = timed_feed(model, prompt, 0, order)
    first = int(best[-1])
    rest, times = timed_greedy_steps(model, first, model.kv_len, n_tokens - 1, order)
    return [first] + rest, times


def plain_chained(model, prompt, n_tokens: int, order) -> tuple[float, list[int]]:
    """Plain greedy decoding of ``n_tokens`` after ``prompt`` as one chain (the prefill's token,
    then :func:`~hiraishin.bench_timing.timed_chain` of the rest: no host wait per token): (seconds per chained token,
    the tokens)."""
    model.reset()
    best, _ = timed_feed(model, prompt, 0, order)
    first = int(best[-1])
    if n_tokens < 2:
        return 0.0, [first]
    rest, dt = timed_chain(model, [first], model.kv_len, n_tokens - 1, order)
    return dt / (n_tokens - 1), [first] + rest


def measure_speculative(target, draft, order, draft_order, settings: BenchSettings) -> dict:
    """Plain vs oracle-scheduled speculative decoding of ``settings.spec_tokens`` tokens (medians).

    First the target's plain greedy tokens (the oracle's right guesses; also the warm-up), then
    (unless quick) one untimed speculative run, then ``spec_repetitions`` rounds of a timed plain
    run and a timed speculative run of the same tokens; the round with the median speculative
    time is reported.
    """
    n = settings.spec_tokens
    prompt = seeded_prompt(target, settings.context, seed=3)
    schedule = OracleSchedule.for_tokens(n, settings.seed, settings.n_draft)
    reference, _ = plain_decode(target, prompt, n + settings.n_draft + 1, order)
    if not settings.quick:
        speculative_decode(target, draft, prompt, n, order, draft_order, schedule, reference)
        plain_chained(target, prompt, n, order)
    agree = agreement(schedule, n + settings.n_draft + 1, settings.seed) if settings.draft_ahead else None
    if agree is not None and not settings.quick:
        speculative_decode_ahead(target, draft, prompt, n, order, draft_order, schedule, reference, agree,
                                 settings.ahead_passes)
    rounds, chained, aheads = [], [], []
    for _ in range(max(1, settings.spec_repetitions)):
        _, steps = plain_decode(target, prompt, n, order)
        run = speculative_decode(target, draft, prompt, n, order, draft_order, schedule, reference)
        rounds.append((sum(steps) / max(1, len(steps)), run))
        chained.append(plain_chained(target, prompt, n, order))
        if agree is not None:
            aheads.append(speculative_decode_ahead(target, draft, prompt, n, order, draft_order, schedule, reference,
                                                   agree, settings.ahead_passes))
    plain_s = statistics.median(p for p, _ in rounds)
    chained_s = statistics.median(c for c, _ in chained)
    # every round's own figures (the raw numbers behind the medians: how far one round is from the next)
    per_round = [{"plain_ms_per_token": 1e3 * p, "speculative_ms_per_token": 1e3 * r.total_s / r.emitted,
                  "speedup": p / (r.total_s / r.emitted), "plain_chained_ms_per_token": 1e3 * c}
                 for (p, r), (c, _) in zip(rounds, chained)]
    run = sorted((r for _, r in rounds), key=lambda s: s.total_s / s.emitted)[len(rounds) // 2]
    summary = _run_summary(run, plain_s, reference[:n])
    spec_s = summary["speculative_ms_per_token"] / 1e3
    out = {
        "oracle": True,
        "draft_order": draft_order.name,
        "plain_ms_per_token": 1e3 * plain_s,
        **summary,
        # plain decoding with no host wait per token (greedy_chain): its floor, had the loop no
        # use for each token as it comes (streaming, a stop token); the speedup over that too
        "plain_chained_ms_per_token": 1e3 * chained_s,
        "speedup_vs_chained": chained_s / spec_s,
        "chained_matches_plain": all(tokens == reference[:n] for _, tokens in chained),
        "repetitions": len(rounds),
        "rounds": per_round,
        "speedup_range": [min(r["speedup"] for r in per_round), max(r["speedup"] for r in per_round)],
    }
    if aheads:
        out["ahead"] = {**_ahead_summary(aheads, [p for p, _ in rounds], plain_s, reference[:n]),
                        "ahead_passes": settings.ahead_passes}
    return out


def _run_summary(run, plain_s: float, reference: list[int]) -> dict:
    """A timed speculative run's figures beside plain decoding's ``plain_s`` seconds a token."""
    cycles = len(run.cycle_s)
    spec_s = run.total_s / run.emitted
    drafted, accepted = sum(run.drafted), sum(run.accepted)
    divergence = first_divergence(run.tokens, reference)
    return {
        "speculative_ms_per_token": 1e3 * spec_s,
        "speedup": plain_s / spec_s,
        "cycle_ms": {"drafting": 1e3 * sum(run.drafting_s) / cycles,
                     "verifying": 1e3 * sum(run.verifying_s) / cycles,
                     "bookkeeping": 1e3 * (run.total_s - sum(run.drafting_s) - sum(run.verifying_s)) / cycles},
        "tokens_per_cycle": run.emitted / cycles,
        "acceptance": accepted / drafted if drafted else float("nan"),
        "mean_verify_batch": statistics.fmean(run.verify_widths),
        "cycles": cycles,
        "tokens": len(run.tokens),
        "schedule_reproduced": run.accepted == run.scheduled,
        "matches_plain": divergence is None,
        "first_divergence": divergence,
    }


def _ahead_summary(runs: list, plain_rounds: list[float], plain_s: float, reference: list[int]) -> dict:
    """The draft-ahead runs (one a round, beside that round's plain decoding): the median round's figures,
    every round's speedup, and the share of cycles whose guesses were made ahead."""
    per_round = [p / (r.total_s / r.emitted) for p, r in zip(plain_rounds, runs)]
    run = sorted(runs, key=lambda r: r.total_s / r.emitted)[len(runs) // 2]
    return {**_run_summary(run, plain_s, reference), "ahead_cycles": sum(run.ahead) / max(1, len(run.ahead)),
            "rounds_speedup": per_round, "speedup_range": [min(per_round), max(per_round)],
            "oracle": "per-token agreement: the schedule's where its cycles guess a token, else right with its "
                      "acceptance (hiraishin.bench_spec.agreement)"}


# ---- the whole benchmark ---------------------------------------------------------------------

def _n_ctx(settings: BenchSettings) -> int:
    need = max(settings.prefill, settings.context + max(16, settings.spec_tokens + 2 * settings.n_draft + 2))
    return max(256, -(-need // 256) * 256)


def _load(path, device, n_ctx):
    from .model.qwen3 import Qwen3

    return Qwen3.from_gguf(path, device=device, n_ctx=n_ctx, progress=False)


def _log(progress, msg):
    if progress:
        print(msg, file=sys.stderr, flush=True)


def run_bench(model_path, draft_path=None, device: str = "auto", settings: BenchSettings | None = None,
              progress: bool = False, argv: list[str] | None = None) -> dict:
    """Run every measurement and return the result as plain data (what ``--json`` writes).

    Without ``draft_path`` the draft is a second instance of the target (self-speculation).
    """
    settings = settings or BenchSettings()
    n_ctx = _n_ctx(settings)
    model_path = Path(model_path)
    target = _load(model_path, device, n_ctx)
    be = target.backend
    draft_file = Path(draft_path) if draft_path else model_path
    _log(progress, f"loaded {target.name} on {be.name}; loading the draft {draft_file.name}")
    draft = _load(draft_file, be.name, n_ctx)
    memory = {"file_bytes": model_path.stat().st_size + draft_file.stat().st_size,
              "kv_cache_bytes": int(target.cache.nbytes + draft.cache.nbytes)}
    used = getattr(be, "memory_used", None)
    if callable(used):
        memory["used_bytes"] = int(used())
        memory["used_over_file_and_kv"] = memory["used_bytes"] / (memory["file_bytes"] + memory["kv_cache_bytes"])
    schedule = OracleSchedule.for_tokens(settings.spec_tokens, settings.seed, settings.n_draft)  # each order's runs
    result = {
        "schema": SCHEMA,
        "model": {"name": target.name, "path": str(model_path), "bytes": model_path.stat().st_size,
                  "n_layer": target.config.n_layer, "n_embd": target.config.n_embd, "n_vocab": target.config.n_vocab},
        "device": _device_info(be),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": list(argv) if argv is not None else None,
        # the library's switches set for this run (A/B settings: HIRAISHIN_GRAPH_PASSES, HIRAISHIN_EMBED_NORM, ...)
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HIRAISHIN_")},
        "settings": asdict(settings) | {"n_ctx": n_ctx},
        "cuda_graphs": bool(getattr(target, "cuda_graphs", False)),
        "copy_bandwidth_gbs": copy_bandwidth_gbs(be),
        "memory": memory,
        "orders": {},
        "draft": {"name": draft.name, "bytes": draft_file.stat().st_size, "self": draft_path is None, "orders": {}},
        "oracle": {"seed": settings.seed, "report": REPORT,
                   "description": "ORACLE: which drafted tokens are right comes from a seeded schedule with the "
                                  "original report's profile; every draft step and verify pass runs for real",
                   "schedule": schedule.profile()},
        "speculative": {},
    }
    result["model"]["floor_ms"] = 1e3 * result["model"]["bytes"] / (result["copy_bandwidth_gbs"] * 1e9)
    draft_names = settings.draft_orders or settings.orders
    for name in draft_names:
        order = ORDERS[name]
        _log(progress, f"[{order.name}] draft step")
        draft.use_weight_layout_for(order)  # (tiles for SUBBLOCK on CUDA: Qwen3.weight_layout_for)
        steps = measure_decode(draft, order, settings)
        timings = result["draft"]["orders"][order.name] = {
            "decode_ms": 1e3 * statistics.median(steps), "decode_ms_spread": spread_ms(steps),
            "decode_sync_ms": 1e3 * statistics.median(measure_decode(draft, order, settings, sync=True)),
            # a cycle's first draft pass, synced, of one or two tokens (measure_verify's pass)
            "pass_ms": measure_verify(draft, order, replace(settings, widths=FIRST_PASS_WIDTHS)),
            "weight_layout": draft.weight_layout}
        timings["cycle_drafting_ms"] = cycle_drafting_ms(schedule, timings["pass_ms"], timings["decode_ms"])
    orders = result["draft"]["orders"]
    fastest = min(orders, key=lambda n: orders[n]["decode_ms"])
    result["draft"]["order"] = fastest  # the figure: the fastest one-token step
    result["draft"]["decode_ms"] = orders[fastest]["decode_ms"]
    # Speculation drafts under the order whose passes of the schedule cost least, not the fastest one-token step:
    # in ~60% of cycles the first pass takes two tokens, and on the 0.6B a two-token pass under BATCH_VARIANT
    # (its multi-column mat-vec geometry) costs far more than under the one-column-geometry orders.
    spec_name = min(orders, key=lambda n: orders[n]["cycle_drafting_ms"])
    result["draft"]["speculation_order"] = spec_name
    first = schedule.first_pass_widths()
    result["draft"]["first_pass_widths"] = {str(w): first.count(w) for w in FIRST_PASS_WIDTHS}
    draft_order = next(ORDERS[n] for n in draft_names if ORDERS[n].name == spec_name)
    for name in settings.orders:
        order = ORDERS[name]
        _log(progress, f"[{order.name}] decode")
        target.use_weight_layout_for(order)
        steps = measure_decode(target, order, settings)
        sync_steps = measure_decode(target, order, settings, sync=True)
        _log(progress, f"[{order.name}] prefill {settings.prefill}")
        tok_s, passes = measure_prefill(target, order, settings)
        _log(progress, f"[{order.name}] verify widths {settings.widths[0]}..{settings.widths[-1]}")
        verify = measure_verify(target, order, settings)
        result["orders"][order.name] = {
            "decode_ms": 1e3 * statistics.median(steps), "decode_tok_s": 1.0 / statistics.median(steps),
            "decode_ms_spread": spread_ms(steps),
            "decode_sync_ms": 1e3 * statistics.median(sync_steps),
            "prefill_tok_s": tok_s, "prefill_tokens": settings.prefill, "prefill_passes": passes,
            "verify_ms": verify, "weight_layout": target.weight_layout,
        }
        _log(progress, f"[{order.name}] speculative (oracle schedule), draft under {draft_order.name}")
        draft.use_weight_layout_for(draft_order)
        result["speculative"][order.name] = measure_speculative(target, draft, order, draft_order, settings)
    target.reset()
    draft.reset()
    return result
