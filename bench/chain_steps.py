"""Device time per pass of a chain of one-token passes (``greedy_chain``: each pass feeds the token the
one before made, one host wait) against the same one-token graph replayed back to back: what a chain
adds between its passes. Run it from two trees (PYTHONPATH) to A/B a change of how passes are chained.

    python3 bench/chain_steps.py MODEL.gguf [...] [--orders fixed_split,invariant] [--steps 12]
                                 [--rounds 5] [--json F]

Per (model, order): a prompt of ``--context`` tokens, then ``--rounds`` chains of ``--steps`` passes
from the same position (the first rounds warm up: eager pass, capture), timed with CUDA events around
the chain on its stream (``PendingChain.spans``), least per pass kept; the chain's tokens must be the
same every round. ``replay_ms`` is the one-token graph replayed ``--steps`` times back to back.

``--graph-passes 2,4,8``: also the same chain from ONE graph holding N chained one-token passes,
launched steps / N times (timing only, no library path uses it yet). Between two graph launches
the next graph's first kernels start only when the last one has finished; inside a graph
programmatic dependent launch lets the next pass's blocks start early (the embedding, the first
norm, the first mat-vec's weight loads). The difference per pass is what capturing a draft chain or
plain decoding N passes to a graph could save. Its tokens and logit bits must equal the chain's
(the same launches); every position of the chain must have the same attention plan (the default
context and steps stay below 128 cells).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import replay_seconds, write_rows_json  # noqa: E402

from hiraishin.benchmark import ORDERS  # noqa: E402
from hiraishin.kernels.pdl import pdl_scope  # noqa: E402
from hiraishin.model.qwen3 import Qwen3  # noqa: E402

CONTEXT = 32
WARM_ROUNDS = 3  # eager pass, capture, first replay


def capture_passes(model, order, start: int, n: int):
    """ONE CUDA graph of ``n`` chained one-token passes at ``start ..`` (the one-token graph's buffers:
    each pass reads the token and position the one before wrote). Its attention plans are those of
    ``start ..``: every position it is launched at must have the same (checked by the caller)."""
    pg = model.pass_graphs
    c = model.config
    ids, pos = pg._inputs(1)
    buf = {**model.pass_buffers(1), "advance": pg._advance}
    for j in range(n):  # scratch exists before capture (no allocation inside it)
        model.backend.ops.attention_scratch(pg._plan(order, 1, start + j), 1, c.n_head, c.head_dim)
    with pg.stream:
        pg.stream.synchronize()
        pg.stream.begin_capture()
        try:
            with pdl_scope(pg.pdl):
                for j in range(n):
                    model.run_pass(ids, pos, start + j, order, buf)
        finally:
            graph = pg.stream.end_capture()
    return graph


def _plan_signature(plan) -> tuple:
    return (plan.kernel, plan.queries_per_block, plan.parallel_blocks, plan.chunk_cells, plan.kv_attended,
            plan.split_cells, plan.shared_kv)


def measure_graph_passes(model, order, context: int, steps: int, rounds: int, n: int, want_rows: np.ndarray) -> dict:
    """The chain of :func:`measure` from a graph of ``n`` passes launched ``steps / n`` times: device
    ms per pass (least over rounds) and whether its log rows (token, logit bits) equal ``want_rows``."""
    import cupy as cp

    pg = model.pass_graphs
    sigs = {_plan_signature(pg._plan(order, 1, p)) for p in range(context, context + steps)}
    if len(sigs) != 1:
        raise SystemExit(f"{order.name}: the attention plan changes between positions {context} and "
                         f"{context + steps - 1}; take a shorter --steps or --context")
    graph = capture_passes(model, order, context, n)
    per_pass, same = [], True
    for r in range(WARM_ROUNDS + rounds):
        with pg.stream:
            pg._log[context + 1:context + 1 + steps].fill(-1)  # only this round's passes can match want_rows
            pg._upload(1, np.array([7], np.int32), context)
            started, done = cp.cuda.Event(), cp.cuda.Event()
            started.record(pg.stream)
            for _ in range(steps // n):
                graph.launch(pg.stream)
            done.record(pg.stream)
        done.synchronize()
        rows = pg._log[context + 1:context + 1 + steps].get()
        same = same and bool(np.array_equal(rows, want_rows))
        if r >= WARM_ROUNDS:
            per_pass.append(cp.cuda.get_elapsed_time(started, done) / 1e3 / steps)
    return {"passes_per_graph": n, "ms_per_pass": 1e3 * min(per_pass), "s_per_pass": per_pass,
            "same_bits_as_chain": same}


def measure(path: str, order_names, steps: int, rounds: int, context: int = CONTEXT,
            graph_passes=()) -> list[dict]:
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=max(512, context + steps + 8), progress=False)
    rows = []
    for name in order_names:
        order = ORDERS[name]
        model.use_weight_layout_for(order)  # (SUBBLOCK: the Q4_K projections as tiles)
        model.reset()
        model.forward([100 + i % 1000 for i in range(context)], 0, order=order)
        per_pass, tokens = [], None
        for r in range(WARM_ROUNDS + rounds):
            pending = model.pass_graphs.chain_async(np.array([7], np.int32), context, steps, order)
            got = pending.tokens().tolist()
            chain_s, _ = pending.spans()
            if tokens is None:
                tokens = got
            if got != tokens:
                raise SystemExit(f"{name}: the chain's tokens changed between rounds: {tokens} vs {got}")
            if r >= WARM_ROUNDS:
                per_pass.append(chain_s / steps)
        graph = next(reversed(model.pass_graphs._graphs[(order, 1)].values()))
        replay = replay_seconds(graph, model.pass_graphs.stream, steps)
        want_rows = pending.dev.get()  # the last round's log rows: token, logit bits
        rows.append({"model": Path(path).name, "order": order.name, "steps": steps, "context": context,
                     "chain_ms_per_pass": 1e3 * min(per_pass), "replay_ms": 1e3 * min(replay),
                     "chain_s_per_pass": per_pass, "tokens": tokens, "graph_passes": []})
        r = rows[-1]
        print(f"{r['model']} {r['order']}: chain {r['chain_ms_per_pass']:.4f} ms a pass, back-to-back replay "
              f"{r['replay_ms']:.4f} (+{1e3 * (r['chain_ms_per_pass'] - r['replay_ms']):.1f} us)", flush=True)
        for n in graph_passes:
            g = measure_graph_passes(model, order, context, steps, rounds, n, want_rows)
            g["library_ms_per_pass"], g["library_same_bits"] = _library_chain(model, order, context, steps, rounds, n,
                                                                              want_rows)
            r["graph_passes"].append(g)
            print(f"  {n} passes a graph: {g['ms_per_pass']:.4f} ms a pass "
                  f"({1e3 * (g['ms_per_pass'] - r['chain_ms_per_pass']):+.1f} us against the chain; "
                  f"{'same bits' if g['same_bits_as_chain'] else 'BITS DIFFER'}); the library's chain with "
                  f"graph_passes={n}: {g['library_ms_per_pass']:.4f} "
                  f"({'same bits' if g['library_same_bits'] else 'BITS DIFFER'})", flush=True)
    return rows


def _library_chain(model, order, context: int, steps: int, rounds: int, n: int, want_rows) -> tuple[float, bool]:
    """The library's own chain (``PassGraphs.chain_async``) with ``graph_passes = n``: least ms per pass over the
    rounds after the warm-up (its blocks captured), and whether its log rows equal ``want_rows``."""
    pg = model.pass_graphs
    before, pg.graph_passes = pg.graph_passes, n
    try:
        per_pass, same = [], True
        for r in range(WARM_ROUNDS + rounds):
            with pg.stream:  # a skipped pass must not find the rows of an earlier round
                pg._log[context + 1:context + 1 + steps].fill(-1)
            pending = pg.chain_async(np.array([7], np.int32), context, steps, order)
            pending.tokens()
            same = same and bool(np.array_equal(pending.dev.get(), want_rows))
            if r >= WARM_ROUNDS:
                per_pass.append(pending.spans()[0] / steps)
        return 1e3 * min(per_pass), same
    finally:
        pg.graph_passes = before


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--orders", default="fixed_split,invariant")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, default=CONTEXT)
    ap.add_argument("--graph-passes", default="", help="comma-separated N: also a graph of N chained passes")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    graph_passes = [int(t) for t in args.graph_passes.split(",") if t.strip()]
    bad = [n for n in graph_passes if n < 1 or args.steps % n]
    if bad:
        ap.error(f"--graph-passes {bad}: each N must divide --steps {args.steps}")
    rows = []
    for path in args.models:
        rows += measure(path, [s.strip() for s in args.orders.split(",") if s.strip()], args.steps, args.rounds,
                        args.context, graph_passes)
    if args.json:
        write_rows_json(args.json, rows, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
