"""GPU time of graph-replayed passes of a few widths, back to back, with a digest of their logits:
the quick A/B of a scheduling change (``HIRAISHIN_PDL_TRIGGER``, ``HIRAISHIN_PDL``) that must not
change a bit. Run it once per setting and compare the digests and the times.

    HIRAISHIN_PDL_TRIGGER=early python3 bench/replay_widths.py MODEL.gguf [...] \
        [--orders invariant,subblock] [--widths 1,3] [--steps 40] [--json F]

Per (model, order, width), after a prompt of ``--context`` tokens (32): one eager pass and two captured
replays at the same position, then
``--steps`` back-to-back replays of that width's graph, three times (the least per pass is kept);
the digest is SHA-256 of the last replay's float32 logits.

``--ablate``: also each variant of ``bench/ablate_pass.py`` (one kind of small launch left out of the
graph; garbage logits, only the time read) at these widths: where a verify pass's time goes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import replay_seconds, write_rows_json  # noqa: E402

from hiraishin.benchmark import ORDERS, parse_widths  # noqa: E402
from hiraishin.model.qwen3 import Qwen3  # noqa: E402

PROMPT = 32  # tokens prefilled before the timed passes (--context)


def measure(path: str, order_names, widths, steps: int, context: int = PROMPT) -> list[dict]:
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=max(512, context + 32), progress=False)
    rows = []
    for name in order_names:
        order = ORDERS[name]
        model.use_weight_layout_for(order)  # (SUBBLOCK: tiles unless HIRAISHIN_MMQ_WTILE=0)
        for T in widths:
            model.reset()
            model.forward([100 + i % 1000 for i in range(context)], 0, order=order)
            tokens = [7 + i for i in range(T)]
            for _ in range(3):  # eager, capture, replay: every pass at the same position
                logits = model.forward(tokens, context, order=order)
                model.rollback(context)
            host = np.ascontiguousarray(np.asarray(logits, np.float32))
            digest = hashlib.sha256(host.tobytes()).hexdigest()
            # equal digests of NaN logits compare nothing (synth format 1's timing models gave NaN through
            # the int8 MMA kernels): say so on the row and the line
            finite = bool(np.isfinite(host).all())
            graph = next(reversed(model.pass_graphs._graphs[(order, T)].values()))
            stream = model.pass_graphs.stream
            per_pass = replay_seconds(graph, stream, steps)
            rows.append({"model": Path(path).name, "order": order.name, "width": T, "context": context,
                         "replay_ms": 1e3 * min(per_pass),
                         "replay_s": per_pass, "logits_sha256": digest, "logits_finite": finite})
            print(f"{Path(path).name} {order.name:16s} width {T:2d}: {1e3 * min(per_pass):.3f} ms  {digest[:16]}"
                  f"{'' if finite else '  NON-FINITE LOGITS'}", flush=True)
    return rows


def measure_ablated(path: str, order_names, widths, steps: int, context: int = PROMPT) -> list[dict]:
    """:func:`measure` under each of ablate_pass.py's variants (rows gain ``variant``)."""
    from ablate_pass import VARIANTS, ablated

    rows = []
    for variant in VARIANTS:
        with ablated(variant):
            print(f"== {variant}", flush=True)
            rows += [dict(r, variant=variant) for r in measure(path, order_names, widths, steps, context)]
    return rows


# Sub-block MMA launches left out by the weights they read (``--ablate-matvecs``; rows n, K from the
# row bytes): the Qwen3-8B's kinds of mat-vec, to see which one's share of a pass grows with its width.
_QK_BYTES = (210, 144)  # Q6_K, Q4_K bytes per 256-value super-block (Q6_K first: 70 Q4_K blocks = 48 Q6_K)


def _k_of(w) -> int:
    """Values per row of a Q6_K or Q4_K weight of the Qwen3-8B shapes (row bytes alone decide there)."""
    row = int(w.shape[1])
    return next((row // b * 256 for b in _QK_BYTES if row % b == 0), 0)


MATVEC_VARIANTS = {
    "no Q/K/V": lambda ns, k: k == 4096 and (ns[0] == 4096 and len(ns) > 1 or ns == (1024,)),
    "no attn output": lambda ns, k: k == 4096 and ns == (4096,),
    "no gate/up": lambda ns, k: ns[0] == 12288,
    "no ffn_down": lambda ns, k: k == 12288,
    "no output head": lambda ns, k: ns[0] > 100000,
}


def measure_matvec_ablated(path: str, order_names, widths, steps: int, context: int = PROMPT) -> list[dict]:
    """:func:`measure` with each kind of sub-block mat-vec launch left out (rows gain ``variant``)."""
    import importlib

    mod = importlib.import_module("hiraishin.kernels.mmq.launch")
    single, multi = mod.MMQLaunch.__call__, mod.MMQMultiLaunch.__call__
    rows = [dict(r, variant="whole pass") for r in measure(path, order_names, widths, steps, context)]
    for variant, skip in MATVEC_VARIANTS.items():
        def call_single(self, w, xq, out, skip=skip):
            return out if skip((int(out.shape[1]),), _k_of(w)) else single(self, w, xq, out)

        def call_multi(self, ws, xq, outs, skip=skip):
            return outs if skip(tuple(int(o.shape[1]) for o in outs), _k_of(ws[0])) else multi(self, ws, xq, outs)

        with mock.patch.object(mod.MMQLaunch, "__call__", call_single), \
                mock.patch.object(mod.MMQMultiLaunch, "__call__", call_multi):
            print(f"== {variant}", flush=True)
            rows += [dict(r, variant=variant) for r in measure(path, order_names, widths, steps, context)]
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The models and what to replay (also bench/sweep_norm.py's)."""
    ap.add_argument("models", nargs="+")
    ap.add_argument("--orders", default="invariant")
    ap.add_argument("--widths", default="1,3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json")


def orders_of(ap: argparse.ArgumentParser, args) -> list[str]:
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    bad = [o for o in orders if o not in ORDERS]
    if bad:
        ap.error(f"unknown order(s) {', '.join(bad)}; known: {', '.join(sorted(ORDERS))}")
    return orders


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--ablate", action="store_true", help="also leave out each kind of small launch (ablate_pass.py)")
    ap.add_argument("--ablate-matvecs", action="store_true",
                    help="also leave out each kind of sub-block mat-vec launch (the 8B's shapes; SUBBLOCK)")
    ap.add_argument("--context", type=int, default=PROMPT,
                    help="tokens prefilled before the timed passes (default %(default)s; the attention plan "
                         "depends on it)")
    args = ap.parse_args(argv)
    if args.context < 1:
        ap.error(f"--context must be at least 1, got {args.context}")
    orders = orders_of(ap, args)
    run = measure_ablated if args.ablate else measure_matvec_ablated if args.ablate_matvecs else measure
    rows = [r for path in args.models for r in run(path, orders, parse_widths(args.widths), args.steps, args.context)]
    if args.json:
        # every switch a replay A/B may vary (final_session.sh's ab step), not only the PDL ones
        write_rows_json(args.json, rows, env={k: v for k, v in sorted(os.environ.items()) if k.startswith("HIRAISHIN_")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
