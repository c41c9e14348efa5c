"""Time flash attention launches on a GPU under the three reduction orders.

Qwen3-8B heads (32 query heads, 8 KV heads, head dim 128), f16 cache, 1..16 queries at the end of
KV lengths 512, 2k, 8k and 32k; one "launch" is what ``flash_attn`` does for one layer (attention
kernel + combine when P > 1, plus the small host work of the call). Times are cupy Event
measurements: warm-up, then the median over repeats of the mean over back-to-back calls.
The bandwidth column counts the K/V cells each query block must read (every block reads its KV
head's cells once) against the time, to compare with the memory bandwidth.

    python bench/bench_fattn.py [--out DIR] [--quick]

writes DIR/bench_fattn.json (raw numbers, plans, device, date, command) and DIR/bench_fattn.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import assert_same_bits, git_commit  # noqa: E402

N_HEAD, N_HEAD_KV, HEAD_DIM = 32, 8, 128  # Qwen3-8B
KV_LENGTHS = (512, 2048, 8192, 32768)
QUERY_COUNTS = tuple(range(1, 17))


def attention_inputs(n_ctx: int):
    """Random Qwen3-8B-shaped inputs (seed 0): q (16, N_HEAD, D) float32 and an f16 cache of
    ``n_ctx`` cells (K, V), plus the cache of KV head 0 alone (K0, V0: what the emulator checks)."""
    rng = np.random.default_rng(0)
    k = rng.standard_normal((n_ctx, N_HEAD_KV, HEAD_DIM)).astype(np.float16)
    v = rng.standard_normal((n_ctx, N_HEAD_KV, HEAD_DIM)).astype(np.float16)
    q = rng.standard_normal((16, N_HEAD, HEAD_DIM)).astype(np.float32)
    return q, k, v, np.ascontiguousarray(k[:, :1]), np.ascontiguousarray(v[:, :1])


def provenance(cp, profile) -> dict:
    """The results-JSON fields of every attention benchmark: device, date, command, commit, shape."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return dict(
        device=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        compute_capability=profile.compute_capability,
        sm_count=profile.sm_count,
        occupancy=dict(profile.occupancy),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        git_commit=git_commit(),
        cupy=cp.__version__,
        shape=dict(n_head=N_HEAD, n_head_kv=N_HEAD_KV, head_dim=HEAD_DIM),
    )


def write_results(out_dir, stem: str, record: dict, markdown_text: str) -> None:
    """``out_dir``/``stem``.json (the record) and .md."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(markdown_text)


def time_call(cp, fn, warmup: int, repeats: int, calls: int) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` back-to-back calls, in microseconds."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    samples = []
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(repeats):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1000.0 / calls)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="directory for bench_fattn.json and bench_fattn.md")
    parser.add_argument("--quick", action="store_true", help="fewer query counts and repeats")
    args = parser.parse_args(argv)

    import cupy as cp

    import dataclasses

    from hiraishin.backends import get_backend
    from hiraishin.kernels.attention.launch import current_profile
    from hiraishin.order import ReductionOrder
    from hiraishin.plans import attention_plan

    cuda, cpu = get_backend("cuda"), get_backend("cpu")

    orders = [ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT]
    counts = (1, 2, 4, 8, 16) if args.quick else QUERY_COUNTS
    repeats, calls = (3, 5) if args.quick else (7, 10)

    t_start = time.time()
    profile = current_profile(HEAD_DIM)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    # peak DRAM bandwidth from the driver: 2 transfers per clock (DDR/HBM) x bus width (the clock
    # field is gone from newer CUDA runtimes' properties: then unknown)
    clock_khz, bus_bits = props.get("memoryClockRate", 0), props.get("memoryBusWidth", 0)
    peak_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9 if clock_khz and bus_bits else None

    q_host, k_host, v_host, k0, v0 = attention_inputs(max(KV_LENGTHS))
    k, v, q_all = cp.asarray(k_host), cp.asarray(v_host), cp.asarray(q_host)
    # the bits are checked on the query heads of KV head 0 (a (query, head) output depends only on
    # its own query and KV head), so the CPU emulator runs 1/N_HEAD_KV of the work
    group = N_HEAD // N_HEAD_KV

    rows = []
    for kv_len in KV_LENGTHS:
        for n in counts:
            q = q_all[:n]
            q_pos = cp.arange(kv_len - n, kv_len, dtype=cp.int32)
            for order in orders:
                plan = attention_plan(order, n, kv_len, N_HEAD, N_HEAD_KV, HEAD_DIM, device=profile)
                # the bits first: this launch against the emulator
                got = cp.asnumpy(cuda.flash_attn(q, k, v, q_pos, plan))[:, :group]
                want = cpu.flash_attn(q_host[:n, :group], k0, v0, np.arange(kv_len - n, kv_len, dtype=np.int32),
                                      dataclasses.replace(plan, n_head=group, n_head_kv=1))
                assert_same_bits(f"kv {kv_len} T {n} {order.name}", got, want)
                us = time_call(cp, lambda: cuda.flash_attn(q, k, v, q_pos, plan), 3, repeats, calls)
                # K/V reads of each KV head's cells: once per block holding its queries
                reads = (-(-n * group // plan.queries_per_block) if plan.shared_kv
                         else -(-n // plan.queries_per_block) * group)
                bytes_read = reads * N_HEAD_KV * kv_len * HEAD_DIM * 2 * 2  # K and V, f16
                rows.append(dict(order=order.name, n_queries=n, kv_len=kv_len, us=round(us, 2),
                                 kernel=plan.kernel_name, parallel_blocks=plan.parallel_blocks,
                                 queries_per_block=plan.queries_per_block, kv_attended=plan.kv_attended,
                                 split_cells=plan.split_cells,
                                 block_read_gbs=round(bytes_read / (us * 1e-6) / 1e9, 1)))
                print(f"kv {kv_len:6d}  T {n:2d}  {order.name:16s} {plan.kernel_name:13s} "
                      f"P={plan.parallel_blocks:3d}  {us:9.1f} us  {rows[-1]['block_read_gbs']:8.1f} GB/s",
                      flush=True)

    record = dict(
        benchmark="bench_fattn",
        **provenance(cp, profile),
        peak_dram_gbs=round(peak_gbs, 1) if peak_gbs else None,
        validated="every timed launch checked bit for bit against the CPU emulator first (query heads of KV head 0)",
        timing=dict(warmup=3, repeats=repeats, calls_per_repeat=calls, statistic="median of means"),
        seconds=round(time.time() - t_start, 1),
        rows=rows,
    )
    if args.out:
        write_results(args.out, "bench_fattn", record, markdown(record, orders, counts))
    print(f"done in {record['seconds']} s")
    return 0


def markdown(record, orders, counts) -> str:
    lines = [
        "# Flash attention launch times",
        "",
        f"- device: {record['device']} (cc {record['compute_capability']}, {record['sm_count']} SMs, "
        f"peak DRAM ~{record['peak_dram_gbs']} GB/s), occupancy {record['occupancy']}",
        f"- date: {record['date']}, commit {record['git_commit']}, cupy {record['cupy']}",
        f"- {record['validated']}",
        f"- command: `{record['command']}`",
        f"- Qwen3-8B heads: {record['shape']}; time per flash_attn call in microseconds "
        f"({record['timing']['statistic']}); kernel and P in brackets",
        "",
    ]
    by_key = {(r["order"], r["n_queries"], r["kv_len"]): r for r in record["rows"]}
    kvs = sorted({r["kv_len"] for r in record["rows"]})
    for kv in kvs:
        lines += [f"## KV length {kv}", "", "| queries | " + " | ".join(o.name for o in orders) + " |",
                  "|---:|" + "---:|" * len(orders)]
        for n in counts:
            cells = []
            for o in orders:
                r = by_key[(o.name, n, kv)]
                short = r["kernel"].replace("fattn_", "")
                cells.append(f"{r['us']:.1f} ({short}, P={r['parallel_blocks']})")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
