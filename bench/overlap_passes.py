"""Does a draft pass running beside a verify pass hide its time? Device time of the two one after the
other against the two on two streams at once.

    python3 bench/overlap_passes.py TARGET.gguf DRAFT.gguf [--orders subblock,invariant]
                                    [--draft-order fixed_split] [--widths 3] [--draft-passes 1,2]
                                    [--reps 20] [--batches 5] [--json F]

A speculative cycle now runs the draft's passes, then the target's verify pass, on one stream: the
draft's ~1.4 ms a cycle (bench/results/2026-12-04-h200-session19) adds to the verify's ~3 ms. A loop
that drafts the next cycle's first tokens while the verify runs (assuming its guesses are accepted)
would hide what the GPU can run side by side. This measures that before any loop is built: the
target's graph of a ``width``-token pass and ``n`` chained replays of the draft's one-token graph,
(1) each alone, (2) one after the other on one stream, (3) forked onto two streams and joined. The
hidden share is ``(sequential - overlapped) / draft``. Timing only (the passes' inputs stay where the
warm-up left them; the draft's chain restarts at the same position every batch, below 128 cells so its
attention plan never changes); ``--reps`` iterations a batch, the least per iteration over ``--batches``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import write_rows_json  # noqa: E402

from hiraishin.benchmark import ORDERS  # noqa: E402
from hiraishin.model.qwen3 import Qwen3  # noqa: E402

CONTEXT = 32
WARM_ROUNDS = 3  # eager pass, capture, first replay
DRAFT_TOKEN = 7


def _last_graph(model, order, width: int):
    return next(reversed(model.pass_graphs._graphs[(order, width)].values()))


def _warm(target, draft, order, draft_order, width: int, context: int):
    """Both models' prompts fed, the target's ``width``-token graph and the draft's one-token graph captured."""
    prompt = [100 + i % 1000 for i in range(context)]
    for m, o in ((target, order), (draft, draft_order)):
        m.reset()
        m.forward(prompt, 0, order=o)
    for _ in range(WARM_ROUNDS):
        target.forward([5 + j for j in range(width)], context, order=order)
        target.rollback(context)
        draft.pass_graphs.chain_async(np.array([DRAFT_TOKEN], np.int32), context, 2, draft_order).tokens()
    return _last_graph(target, order, width), _last_graph(draft, draft_order, 1)


def measure(target, draft, order, draft_order, width: int, passes: int, reps: int, batches: int,
            context: int) -> dict:
    import cupy as cp

    if context + reps * passes >= 128:
        raise SystemExit(f"the draft's chain would cross 128 cells ({context} + {reps} x {passes}): fewer --reps")
    verify, one = _warm(target, draft, order, draft_order, width, context)
    a, b = target.pass_graphs.stream, draft.pass_graphs.stream
    fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)

    def run(mode: str) -> float:
        per = []
        for _ in range(batches):
            with b:  # the draft's chain back at its start (its inputs advance with every replay)
                draft.pass_graphs._upload(1, np.array([DRAFT_TOKEN], np.int32), context)
            b.synchronize()
            a.synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(a)
            for _ in range(reps):
                if mode == "overlapped":
                    fork.record(a)  # both wait for the iteration before only, then run side by side
                    b.wait_event(fork)
                    verify.launch(a)
                    for _ in range(passes):
                        one.launch(b)
                    join.record(b)
                    a.wait_event(join)
                    continue
                if mode in ("verify", "sequential"):
                    verify.launch(a)
                if mode in ("draft", "sequential"):
                    for _ in range(passes):
                        one.launch(a)
            end.record(a)
            end.synchronize()
            per.append(cp.cuda.get_elapsed_time(start, end) / reps)
        return min(per)

    times = {mode: run(mode) for mode in ("verify", "draft", "sequential", "overlapped")}
    hidden = (times["sequential"] - times["overlapped"]) / times["draft"] if times["draft"] > 0 else 0.0
    return {"order": order.name, "draft_order": draft_order.name, "width": width, "draft_passes": passes,
            **{f"{k}_ms": v for k, v in times.items()}, "hidden_share": hidden}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--orders", default="subblock,invariant")
    ap.add_argument("--draft-order", default="fixed_split")
    ap.add_argument("--widths", default="3")
    ap.add_argument("--draft-passes", default="1,2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--context", type=int, default=CONTEXT)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    target = Qwen3.from_gguf(args.target, device="cuda", n_ctx=256, progress=False)
    draft = Qwen3.from_gguf(args.draft, device="cuda", n_ctx=256, progress=False)
    rows = []
    for name in (s.strip() for s in args.orders.split(",") if s.strip()):
        for width in (int(w) for w in args.widths.split(",")):
            for passes in (int(p) for p in args.draft_passes.split(",")):
                r = measure(target, draft, ORDERS[name], ORDERS[args.draft_order], width, passes, args.reps,
                            args.batches, args.context)
                r.update(target=Path(args.target).name, draft=Path(args.draft).name)
                rows.append(r)
                print(f"{r['order']} width {width} + {passes} draft pass(es) ({r['draft_order']}): verify "
                      f"{r['verify_ms']:.3f} ms, draft {r['draft_ms']:.3f}, one after the other "
                      f"{r['sequential_ms']:.3f}, side by side {r['overlapped_ms']:.3f} "
                      f"({100 * r['hidden_share']:.0f}% of the draft hidden)", flush=True)
    if args.json:
        write_rows_json(args.json, rows, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
