"""The whole forward pass on small shapes, for compute-sanitizer: every kernel a pass launches.

    compute-sanitizer --tool memcheck --error-exitcode 3 python bench/sanitize_engine.py [ORDER ...]
    (also --tool racecheck, --tool initcheck; ORDER: names of hiraishin bench's orders, default
    variant invariant fixed_split subblock)

A custom synthetic Qwen3 whose matrix rows are not multiples of the kernels' rows per CUDA block
(n_embd 768: 3 super-blocks per row; 6 query heads, 2 KV heads; n_ff 1280) runs eager passes
(no CUDA graphs, the CuPy memory pool off so every array is its own allocation and a read past
its end shows) under every order: 1 and 16 tokens at KV length 1, passes ending at and across the
128-cell chunk and 256-cell pad boundaries (FIXED_SPLIT's one-block attention with its q8_1 store
below 256 cells, two blocks past), with the fused kernels (no recording), the unfused
ones (recording), grouped and single mat-vecs, the tiled and the int8 MMA kernels; then CUDA-graph
passes of 1, 5 and 16 tokens (captured with programmatic dependent launch, replayed). Every pass is
checked bit for bit against the CPU backend too. Last, what runs between graph passes: a chain of
one-token graphs fed by their argmax's advance, the verify pass behind it, and plain greedy decoding
with passes enqueued ahead of the host (``greedy_stream``: a side stream, page-locked rows), once to
the end and once stopped early, their tokens against the CPU's greedy loop.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import git_commit  # noqa: E402

# (start position, tokens): KV length 1 and 16, the 128-cell chunk boundary, across 256
PASSES = ((0, 1), (1, 15), (16, 16), (32, 96), (128, 1), (129, 16), (145, 110), (255, 1), (256, 16))
# widths of the graph-replayed passes (eager, captured, replayed: positions 0, n, 2n)
GRAPH_WIDTHS = (1, 5, 16)


DEFAULT_ORDERS = ("variant", "invariant", "fixed_split", "subblock")


def main(argv=None) -> int:
    import cupy as cp

    from hiraishin import Qwen3
    from hiraishin.benchmark import ORDERS

    names = (sys.argv[1:] if argv is None else argv) or DEFAULT_ORDERS
    unknown = [n for n in names if n not in ORDERS]
    if unknown:
        raise SystemExit(f"unknown order(s) {', '.join(unknown)}; choose from {', '.join(ORDERS)}")
    orders = [ORDERS[n] for n in names]
    from hiraishin.model.synth import SynthShape, write_synthetic

    cp.cuda.set_allocator(None)  # every array its own cudaMalloc
    shape = SynthShape("sanitize", n_embd=768, n_layer=2, n_head=6, n_head_kv=2, n_ff=1280, vocab="micro",
                       tied=False, fill="gaussian")
    path = os.path.join(tempfile.mkdtemp(), "sanitize.gguf")
    write_synthetic(path, shape=shape, seed=3, progress=False)
    gpu = Qwen3.from_gguf(path, device="cuda", progress=False, cuda_graphs=False, n_ctx=512)
    cpu = Qwen3.from_gguf(path, device="cpu", progress=False, n_ctx=512)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, gpu.config.n_vocab, 300).tolist()
    bad = 0
    for order in orders:
        gpu.use_weight_layout_for(order)  # (SUBBLOCK: the Q4_K projections as tiles)
        for record in (None, {}):
            gpu.reset()
            cpu.reset()
            for start, n in PASSES:
                got = gpu.forward(tokens[start:start + n], start, order, record=record)
                want = cpu.forward(tokens[start:start + n], start, order)
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    bad += 1
                    print(f"MISMATCH {order.name} record={record is not None} pass ({start}, {n})")
        print(f"{order.name}: {len(PASSES) * 2} passes", flush=True)
    # Graph replays: captured passes launch their kernels with programmatic dependent launch (each
    # waits in HX_PDL_ENTRY), which eager passes never do. Each width runs eagerly, is captured,
    # then replayed at a later position with the same plan.
    graphs = Qwen3.from_gguf(path, device="cuda", progress=False, cuda_graphs=True, n_ctx=512)
    for order in orders:
        graphs.use_weight_layout_for(order)
        for n in GRAPH_WIDTHS:
            graphs.reset()
            cpu.reset()
            for start in (0, n, 2 * n):
                got = graphs.forward(tokens[start:start + n], start, order)
                want = cpu.forward(tokens[start:start + n], start, order)
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    bad += 1
                    print(f"MISMATCH {order.name} graph pass ({start}, {n})")
        print(f"{order.name}: graph passes of widths {GRAPH_WIDTHS}", flush=True)
    for order in orders:
        graphs.use_weight_layout_for(order)
        bad += _chains_and_streams(graphs, cpu, tokens[:8], order)
    print(f"{graphs.pass_graphs.captures} graphs captured")
    cp.cuda.runtime.deviceSynchronize()
    print(f"commit {git_commit()}; {bad} mismatches")
    return 1 if bad else 0


def _cpu_greedy(cpu, prompt, n: int, order) -> list[int]:
    """The n greedy tokens after ``prompt`` by the CPU's one-pass-at-a-time loop."""
    cpu.reset()
    out = [int(cpu.forward_argmax(prompt, 0, order)[-1])]
    while len(out) < n:
        out.append(int(cpu.forward_argmax([out[-1]], len(prompt) + len(out) - 1, order)[-1]))
    return out


def _chains_and_streams(graphs, cpu, prompt, order, n: int = 12) -> int:
    """Mismatches of a chain (+ the verify behind it) and of greedy_stream, to the end, stopped early and with
    each pass's top 5."""
    from hiraishin.decode.greedy import top_k_of

    bad = 0
    want = _cpu_greedy(cpu, prompt, n + 1, order)
    graphs.reset()
    got = [int(t) for t in graphs.greedy_chain_async(prompt, 0, n, order).tokens()]
    # a one-pass chain of the last token, and behind it the two-token pass of that token and its guess
    behind = graphs.greedy_chain_async([want[n - 1]], len(prompt) + n - 1, 1, order)
    verified = graphs.verify_chain(want[n - 1], behind, len(prompt) + n - 1, order)
    if got != want[:n] or int(verified[0]) != want[n]:
        bad += 1
        print(f"MISMATCH {order.name} chain {got} + verify {verified.tolist()} against {want}")
    # a chain, more passes behind it (greedy_chain_more: the draft running ahead), a verify behind a tail of those
    graphs.reset()
    h = n // 2
    chain = graphs.greedy_chain_async(prompt, 0, h, order)
    more = graphs.greedy_chain_more(chain, n - h, order)
    got = [int(t) for t in chain.tokens()] + [int(t) for t in more.tokens()]
    tail_pos = len(prompt) + n - 2  # more's second-to-last token was fed here: verify it and its successor
    verified = graphs.verify_chain(want[n - 2], more.tail(more.n - 1), tail_pos, order)
    if got != want[:n] or int(verified[0]) != want[n - 1]:
        bad += 1
        print(f"MISMATCH {order.name} chain + chain_more {got} + verify {verified.tolist()} against {want}")
    graphs.reset()
    first = int(graphs.forward_argmax(prompt, 0, order)[-1])
    stream = graphs.greedy_stream(first, len(prompt), n, order)
    got = [first] + [tok for tok, _ in stream]
    if got != want[:n + 1]:
        bad += 1
        print(f"MISMATCH {order.name} greedy_stream {got} against {want}")
    graphs.reset()
    first = int(graphs.forward_argmax(prompt, 0, order)[-1])
    stream = graphs.greedy_stream(first, len(prompt), n, order)
    early = [first] + [tok for _, (tok, _) in zip(range(3), stream)]
    stream.close()  # waits for the passes enqueued past the tokens taken
    if early != want[:4]:
        bad += 1
        print(f"MISMATCH {order.name} greedy_stream stopped early {early} against {want[:4]}")
    graphs.reset()  # with each pass's top 5 logits found on the device behind it (hx_topk_row)
    first = int(graphs.forward_argmax(prompt, 0, order)[-1])
    got = list(graphs.greedy_stream(first, len(prompt), n, order, top_k=5))
    cpu.reset()
    cpu.forward(prompt, 0, order)
    for i, (tok, _, ids, _) in enumerate(got):
        want_ids, _ = top_k_of(cpu.forward([want[i]], len(prompt) + i, order)[-1], 5)
        if tok != want[i + 1] or ids.tolist() != want_ids.tolist():
            bad += 1
            print(f"MISMATCH {order.name} greedy_stream top 5 at {i}: {tok} {ids.tolist()} against "
                  f"{want[i + 1]} {want_ids.tolist()}")
            break
    print(f"{order.name}: chain, verify behind it, chain_more, greedy_stream (whole, stopped early, top 5)",
          flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
