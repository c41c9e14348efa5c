"""Time the whole Qwen3 forward pass on a GPU: load, prefill, one-token decode, memory.

Synthetic Qwen3-0.6B and Qwen3-8B Q4_K_M files (``hiraishin synth``: real shapes and type mix,
random blocks) on the ``cuda`` backend, under the batch-variant and batch-invariant orders.
Reported per model and order: prefill tokens/s for a 128-token prompt, decode tokens/s (one token
per pass), and the weight bytes read per decoded token against the time as GB/s and as a
fraction of the GPU's memory bandwidth (each decode pass reads every weight once). Memory: the
CuPy pool after loading vs the file size + KV cache (the target is at most that + 10%).

    python bench/bench_model.py [--out DIR] [--shapes qwen3-0.6b,qwen3-8b] [--tokens 32]

writes DIR/bench_model.json and DIR/bench_model.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import assert_same_bits, git_commit  # noqa: E402

# H200 SXM HBM3e bandwidth (NVIDIA datasheet: 4.8 TB/s); other GPUs: pass --bandwidth.
DEFAULT_BANDWIDTH_GBS = 4800.0
PROMPT_TOKENS = 128
N_CTX = 1024
# Passes checked bit for bit against the CPU backend (the emulators) before any timing: a
# 9-token pass (llama.cpp's MMQ order under the variant order) then a one-token decode step, each with
# CUDA graphs on (the default, what generate runs) and off.
VALIDATE_WIDTHS = (9, 1)


def validate(model, path, prompt, order) -> None:
    """Raise benchlib.BitMismatch unless the GPU model's logits equal the CPU backend's."""
    from hiraishin.model.qwen3 import Qwen3

    cpu = Qwen3.from_gguf(path, device="cpu", n_ctx=sum(VALIDATE_WIDTHS), progress=False)
    graphs = model.cuda_graphs
    pos = 0
    for width in VALIDATE_WIDTHS:
        tokens = prompt[pos:pos + width]
        want = cpu.forward(tokens, pos, order=order)
        for on in (True, False):
            model.cuda_graphs = on
            assert_same_bits(f"{path.name} {order.name} {width} tokens at {pos}, cuda_graphs={on}",
                             model.forward(tokens, pos, order=order), want)
        pos += width
    model.cuda_graphs = graphs
    model.reset()


def bench_shape(shape: str, n_new: int, bandwidth: float, workdir: Path) -> dict:
    import cupy as cp
    import numpy as np

    from hiraishin.model.qwen3 import Qwen3
    from hiraishin.model.synth import write_synthetic
    from hiraishin.order import ReductionOrder

    path = workdir / f"{shape}.gguf"
    t0 = time.perf_counter()
    if not path.exists():
        write_synthetic(path, shape=shape, seed=0, progress=False)
    write_s = time.perf_counter() - t0

    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    t0 = time.perf_counter()
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=N_CTX, progress=False)
    cp.cuda.Device().synchronize()
    load_s = time.perf_counter() - t0
    held = pool.used_bytes() - before
    file_size = path.stat().st_size
    row = dict(shape=shape, file_bytes=file_size, weight_bytes=model.weights.nbytes,
               kv_cache_bytes=model.cache.nbytes, gpu_pool_bytes_after_load=held,
               memory_ratio=held / (file_size + model.cache.nbytes), write_s=write_s, load_s=load_s,
               cuda_graphs=model.cuda_graphs, validated_widths=list(VALIDATE_WIDTHS), orders={})
    prompt = np.random.default_rng(0).integers(0, model.config.n_vocab, PROMPT_TOKENS).tolist()
    for order in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT):
        validate(model, path, prompt, order)  # the bits first
        model.generate(prompt[:8], max_new_tokens=2, order=order, stop_at_eos=False)  # compile, warm up
        res = model.generate(prompt, max_new_tokens=n_new, order=order, stop_at_eos=False, top_k=1)
        decode_tps = res.decode_tokens_per_s
        gbs = decode_tps * model.weights.nbytes / 1e9
        row["orders"][order.name] = dict(
            prefill_s=res.prefill_s, prefill_tok_s=res.prefill_tokens_per_s, decode_tok_s=decode_tps,
            decode_ms_per_token=1000.0 / decode_tps, weight_gb_s=gbs, bandwidth_fraction=gbs / bandwidth,
            peak_pool_bytes=pool.total_bytes())
    del model
    pool.free_all_blocks()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="directory for bench_model.json and bench_model.md")
    parser.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per order (default 32)")
    parser.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBS, help="GB/s of the GPU memory")
    parser.add_argument("--workdir", default=None, help="where the synthetic files go (default: a temp dir)")
    args = parser.parse_args(argv)

    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hiraishin-bench-"))
    rows = []
    for shape in [s for s in args.shapes.split(",") if s]:
        row = bench_shape(shape, args.tokens, args.bandwidth, workdir)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)

    lines = [f"# Qwen3 forward on {device} ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, "
             f"commit {git_commit()})", "",
             "| model | order | prefill tok/s (128) | decode tok/s | ms/token | weights GB/s | of bandwidth | "
             "GPU pool / (file + KV) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, o in r["orders"].items():
            lines.append(f"| {r['shape']} | {name} | {o['prefill_tok_s']:.1f} | {o['decode_tok_s']:.1f} | "
                         f"{o['decode_ms_per_token']:.1f} | {o['weight_gb_s']:.0f} | {o['bandwidth_fraction']:.1%} | "
                         f"{r['memory_ratio']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(device=device, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    command=" ".join([sys.executable] + sys.argv), commit=git_commit(), rows=rows)
        (out / "bench_model.json").write_text(json.dumps(meta, indent=1))
        (out / "bench_model.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
