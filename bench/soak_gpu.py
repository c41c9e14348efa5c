"""Soak: long decoding with flat memory, invariance past position 4,096, out of memory at load.

    python bench/soak_gpu.py --device cuda --tokens 8192 --out bench/results/soak
    python bench/soak_gpu.py --device cpu --tokens 64 --shape micro --out /tmp/soak   # smoke test

1. Decodes ``--tokens`` tokens one at a time (greedy, ``BATCH_INVARIANT``) on the synthetic
   ``--shape`` model (``qwen3-0.6b`` by default: the real shape, random weights), sampling device
   memory (CuPy pool used bytes, ``cudaMemGetInfo`` free bytes) and host memory (VmRSS from
   /proc/self/status) every ``--sample-every`` tokens after a warm-up; passes if every sample
   after the warm-up stays within the tolerances below of the first one.
2. Re-runs 16 of the decoded tokens at positions past 4,096 (or as far as a short run reaches)
   in batches of 1, 5 and 16 under ``BATCH_INVARIANT``: the logits must be equal bit for bit.
3. (GPU only) Loads the model with a KV cache that cannot fit the device: the load must raise
   the library's error saying what would fit, and leave the pool's used bytes as they were.

Writes ``soak.json`` and ``soak.md`` to ``--out`` (atomically) and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

# Host memory: Python's allocator and Numba keep a little slack; the decode loop itself must not grow.
HOST_TOLERANCE_BYTES = 16 << 20
# Device memory: the KV cache and activation buffers are allocated before the loop; a few MiB of
# slack for CuPy's pool rounding.
DEVICE_TOLERANCE_BYTES = 4 << 20
# ... or this fraction of the first sample, whichever is larger ("flat within 1%").
RELATIVE_TOLERANCE = 0.01
# The invariance check runs past this position: split-KV attention's chunking and the verify
# stops at multiples of 256 cells are exercised well beyond the first 4,096 cells.
INVARIANCE_FROM = 4096
INVARIANCE_TOKENS = 16
INVARIANCE_BATCHES = (1, 5, 16)
# KV cells are allocated in multiples of this (the invariant order stops at multiples of 256).
CELL_ROUND = 256
# The OOM check asks for a KV cache this many times larger than the whole device.
OOM_FACTOR = 2


def host_rss_bytes() -> int:
    """Resident set size of this process (VmRSS, /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS")


def device_memory(device: str) -> dict:
    if device != "cuda":
        return {}
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return {"pool_used": int(pool.used_bytes()), "pool_total": int(pool.total_bytes()),
            "device_free": int(free), "device_total": int(total)}


def sample(step: int, device: str) -> dict:
    return {"tokens": step, "host_rss": host_rss_bytes(), **device_memory(device), "time": time.time()}


def flat(values: list[int], absolute: int) -> tuple[bool, int]:
    """Whether every value stays within tolerance of the first; and the largest deviation."""
    if not values:
        return True, 0
    worst = max(abs(v - values[0]) for v in values)
    return worst <= max(absolute, RELATIVE_TOLERANCE * values[0]), worst


def decode(model, tokens: int, every: int, warmup: int, device: str, order, log) -> tuple[list[int], list[dict]]:
    """Greedy one-token decoding from token 0; memory samples every ``every`` tokens after ``warmup``."""
    ids = [0]
    samples = []
    t0 = time.perf_counter()
    logits = model.forward([0], 0, order=order)
    for pos in range(1, tokens):
        nxt = int(np.argmax(logits[-1]))
        ids.append(nxt)
        logits = model.forward([nxt], pos, order=order)
        step = pos + 1
        if step >= warmup and (step - warmup) % every == 0:
            if device == "cuda":
                model.backend.synchronize()
            samples.append(sample(step, device))
            rate = step / (time.perf_counter() - t0)
            log(f"  {step:6d} tokens  {rate:7.1f} tok/s  rss {samples[-1]['host_rss'] / 2**20:8.1f} MiB"
                + (f"  pool {samples[-1]['pool_used'] / 2**20:9.1f} MiB" if device == "cuda" else ""))
    return ids, samples


def invariance(model, ids: list[int], order, log) -> dict:
    """Logits of the same tokens at the same positions in batches of 1, 5, 16: equal bit for bit."""
    start = min(INVARIANCE_FROM + 1, len(ids) - INVARIANCE_TOKENS)
    span = ids[start : start + INVARIANCE_TOKENS]
    results = {}
    for width in INVARIANCE_BATCHES:
        model.rollback(start)
        parts = []
        for at in range(0, len(span), width):
            chunk = span[at : at + width]
            parts.append(model.forward(chunk, start + at, order=order))
        results[width] = np.concatenate(parts)
    ref = results[INVARIANCE_BATCHES[0]]
    equal = {str(w): bool(np.array_equal(ref, r)) for w, r in results.items()}
    worst = {str(w): float(np.max(np.abs(ref.astype(np.float64) - r))) for w, r in results.items()}
    log(f"  positions {start}..{start + len(span) - 1}: bit-equal per batch width {equal}")
    return {"start": start, "n_tokens": len(span), "equal": equal, "max_abs_diff": worst,
            "finite": bool(np.isfinite(ref).all()), "pass": all(equal.values())}


def oom_at_load(path: Path, device: str, config, log) -> dict:
    """Load with a KV cache OOM_FACTOR times the device: the library's error, nothing left allocated."""
    from hiraishin import Qwen3
    from hiraishin.errors import HiraishinError

    if device != "cuda":
        return {"skipped": "only on cuda (host allocations are lazy: a huge KV cache may not fail)"}
    import cupy

    pool = cupy.get_default_memory_pool()
    gc.collect()
    pool.free_all_blocks()
    before = int(pool.used_bytes())
    _, total = cupy.cuda.runtime.memGetInfo()
    per_cell = config.n_layer * 2 * config.n_head_kv * config.head_dim * 2  # K and V, f16
    n_ctx = int(math.ceil(OOM_FACTOR * total / per_cell / CELL_ROUND)) * CELL_ROUND
    log(f"  loading with n_ctx = {n_ctx} ({n_ctx * per_cell / 2**30:.1f} GiB of KV cache)")
    error, kind = None, None
    try:
        model = Qwen3.from_gguf(path, device=device, n_ctx=n_ctx, progress=False)
        del model
    except HiraishinError as exc:
        error, kind = str(exc), type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - reported as a failure
        error, kind = f"{type(exc).__name__}: {exc}", "not a library error"
    gc.collect()
    after = int(pool.used_bytes())
    released = after <= before + DEVICE_TOLERANCE_BYTES
    says_fit = error is not None and "fit" in error
    log(f"  {kind}: {error}")
    log(f"  pool used before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB")
    return {"n_ctx": n_ctx, "error": error, "error_type": kind, "pool_used_before": before,
            "pool_used_after": after, "released": released,
            "pass": kind not in (None, "not a library error") and says_fit and released}


def markdown(report: dict) -> str:
    m, inv, oom = report["memory"], report["invariance"], report["oom_at_load"]
    lines = [
        f"# Soak: {report['tokens']} tokens on `{report['shape']}` ({report['device']})",
        "",
        f"{report['date']} · {report['device_name']} · `{report['command']}`",
        "",
        "| check | result |",
        "|---|---|",
        f"| decode | {report['tokens']} tokens in {report['decode_seconds']:.1f} s "
        f"({report['tokens'] / report['decode_seconds']:.1f} tok/s) |",
        f"| host RSS flat | {m['host_flat']} (largest change {m['host_worst'] / 2**20:.2f} MiB over "
        f"{len(report['samples'])} samples) |",
    ]
    if "device_flat" in m:
        lines.append(f"| device pool flat | {m['device_flat']} (largest change {m['device_worst'] / 2**20:.2f} MiB) |")
        lines.append(f"| device free flat | {m['free_flat']} (largest change {m['free_worst'] / 2**20:.2f} MiB) |")
    lines.append(f"| invariance, positions {inv['start']}..{inv['start'] + inv['n_tokens'] - 1}, batches "
                 f"{', '.join(inv['equal'])} | {'bit-equal' if inv['pass'] else 'DIFFERENT: ' + str(inv['max_abs_diff'])} |")
    if "skipped" in oom:
        lines.append(f"| OOM at load | skipped: {oom['skipped']} |")
    else:
        lines.append(f"| OOM at load (n_ctx {oom['n_ctx']}) | {oom['error_type']}: {oom['error']}; "
                     f"pool used {oom['pool_used_before']} -> {oom['pool_used_after']} bytes |")
    lines += ["", f"**{'PASS' if report['pass'] else 'FAIL'}**", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tokens", type=int, default=8192, help="tokens to decode (default 8192)")
    p.add_argument("--shape", default="qwen3-0.6b", help="synthetic shape (default qwen3-0.6b)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-every", type=int, default=512, help="tokens between memory samples")
    p.add_argument("--warmup", type=int, default=None, help="tokens before the first sample (default: one interval)")
    p.add_argument("--cache", default=None, help="model cache folder (default $HIRAISHIN_CACHE or ~/.cache/hiraishin)")
    p.add_argument("--out", required=True, help="folder for soak.json and soak.md")
    args = p.parse_args(argv)

    from hiraishin import Qwen3, ReductionOrder
    from hiraishin.atomic import atomic_write
    from hiraishin.model.synth import cached_model

    if args.tokens < INVARIANCE_TOKENS + 1:
        p.error(f"--tokens must be at least {INVARIANCE_TOKENS + 1}")
    if args.sample_every < 1:
        p.error("--sample-every must be positive")
    every = min(args.sample_every, max(1, args.tokens // 8))
    warmup = args.warmup if args.warmup is not None else every
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    order = ReductionOrder.BATCH_INVARIANT

    def log(message: str) -> None:
        print(message, flush=True)

    log(f"soak: {args.tokens} tokens on {args.shape} ({args.device}); samples every {every} after {warmup}")
    path = cached_model(args.shape, args.seed, args.cache)
    log(f"model {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    n_ctx = int(math.ceil((args.tokens + INVARIANCE_TOKENS) / CELL_ROUND)) * CELL_ROUND
    t0 = time.perf_counter()
    model = Qwen3.from_gguf(path, device=args.device, n_ctx=n_ctx, progress=False)
    log(f"loaded in {time.perf_counter() - t0:.1f} s (n_ctx {n_ctx}); decoding")
    t0 = time.perf_counter()
    ids, samples = decode(model, args.tokens, every, warmup, args.device, order, log)
    decode_s = time.perf_counter() - t0

    host_ok, host_worst = flat([s["host_rss"] for s in samples], HOST_TOLERANCE_BYTES)
    memory = {"host_flat": host_ok, "host_worst": host_worst}
    if args.device == "cuda":
        memory["device_flat"], memory["device_worst"] = flat([s["pool_used"] for s in samples], DEVICE_TOLERANCE_BYTES)
        memory["free_flat"], memory["free_worst"] = flat([s["device_free"] for s in samples], DEVICE_TOLERANCE_BYTES)
    log(f"memory flat: {memory}")
    log("invariance:")
    inv = invariance(model, ids, order, log)
    config = model.config
    del model
    log("out of memory at load:")
    oom = oom_at_load(path, args.device, config, log)

    ok = all(v for k, v in memory.items() if k.endswith("_flat")) and inv["pass"] and oom.get("pass", True)
    device_name = platform.processor() or platform.machine()
    if args.device == "cuda":
        import cupy

        device_name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    report = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": args.device,
              "device_name": device_name, "shape": args.shape, "seed": args.seed, "tokens": args.tokens,
              "n_ctx": n_ctx, "sample_every": every, "warmup": warmup, "decode_seconds": decode_s,
              "tolerances": {"host_bytes": HOST_TOLERANCE_BYTES, "device_bytes": DEVICE_TOLERANCE_BYTES,
                             "relative": RELATIVE_TOLERANCE},
              "samples": samples, "memory": memory, "invariance": inv, "oom_at_load": oom,
              "generated_tail": ids[-32:], "pid": os.getpid(), "pass": ok}
    with atomic_write(out / "soak.json") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    with atomic_write(out / "soak.md") as f:
        f.write(markdown(report))
    log(f"{'PASS' if ok else 'FAIL'}: wrote {out / 'soak.json'} and {out / 'soak.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
