"""Device time per pass of a chain of one-token passes (``greedy_chain``: each pass feeds the token the
one before made, one host wait) against the same one-token graph replayed back to back: what a chain
adds between its passes. Run it from two trees (PYTHONPATH) to A/B a change of how passes are chained.

    python3 bench/chain_steps.py MODEL.gguf [...] [--orders fixed_split,invariant] [--steps 12]
                                 [--rounds 5] [--json F]

Per (model, order): a prompt of ``--context`` tokens, then ``--rounds`` chains of ``--steps`` passes
from the same position (the first rounds warm up: eager pass, capture), timed with CUDA events around
the chain on its stream (``PendingChain.spans``), least per pass kept; the chain's tokens must be the
same every round. ``replay_ms`` is the one-token graph replayed ``--steps`` times back to back.
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
from hiraishin.model.qwen3 import Qwen3  # noqa: E402

CONTEXT = 32
WARM_ROUNDS = 3  # eager pass, capture, first replay


def measure(path: str, order_names, steps: int, rounds: int, context: int = CONTEXT) -> list[dict]:
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=max(512, context + steps + 8), progress=False)
    rows = []
    for name in order_names:
        order = ORDERS[name]
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
        rows.append({"model": Path(path).name, "order": order.name, "steps": steps, "context": context,
                     "chain_ms_per_pass": 1e3 * min(per_pass), "replay_ms": 1e3 * min(replay),
                     "chain_s_per_pass": per_pass, "tokens": tokens})
        r = rows[-1]
        print(f"{r['model']} {r['order']}: chain {r['chain_ms_per_pass']:.4f} ms a pass, back-to-back replay "
              f"{r['replay_ms']:.4f} (+{1e3 * (r['chain_ms_per_pass'] - r['replay_ms']):.1f} us)", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--orders", default="fixed_split,invariant")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, default=CONTEXT)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    for path in args.models:
        rows += measure(path, [s.strip() for s in args.orders.split(",") if s.strip()], args.steps, args.rounds,
                        args.context)
    if args.json:
        write_rows_json(args.json, rows, command=" ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
