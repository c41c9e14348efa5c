"""``hiraishin plan``: the geometry an order gives one op, in words.

    hiraishin plan matvec --qtype Q6_K -K 4096 --ncols 5 --order variant
    hiraishin plan attention --n-queries 5 --kv-len 600 --n-head 32 --n-head-kv 8 --order all
"""

from __future__ import annotations

import argparse

from . import common

NAME = "plan"
HELP = "print the plan (the order of float adds) an order gives a mat-vec or an attention launch"
# Warps whose super-blocks are listed one by one (more would be a wall of numbers).
SHOWN_WARPS = 4


def _orders(text: str):
    if text == "all":
        return list(common.ORDERS.values())
    return [common.parse_order(text)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="op", metavar="OP", required=True)
    mv = sub.add_parser("matvec", help="a quantized mat-vec (or the variant order's wide-batch kernel)",
                        epilog=common.epilog(), formatter_class=common.formatter())
    mv.add_argument("--qtype", default="Q4_K", help="weight type: Q4_K, Q6_K, Q8_0 (default Q4_K)")
    mv.add_argument("-K", "--k", dest="k", type=common.positive_int, default=4096,
                    help="inputs per row (the row length; default 4096)")
    mv.add_argument("--ncols", type=common.positive_int, default=1,
                    help="columns (tokens) in the pass (default 1)")
    mv.add_argument("-N", "--rows", type=common.positive_int, default=4096,
                    help="rows of the weight (default 4096); the variant order's MMQ split past 8 columns uses it")
    _common(mv)
    at = sub.add_parser("attention", help="a flash-attention launch over the KV cache",
                        epilog=common.epilog(), formatter_class=common.formatter())
    at.add_argument("--n-queries", type=common.positive_int, default=1, help="queries (tokens) in the pass")
    at.add_argument("--kv-len", type=common.positive_int, default=512, help="filled KV cells (default 512)")
    at.add_argument("--n-head", type=common.positive_int, default=32, help="query heads (default 32, Qwen3-8B)")
    at.add_argument("--n-head-kv", type=common.positive_int, default=8, help="KV heads (default 8, Qwen3-8B)")
    at.add_argument("--head-dim", type=common.positive_int, default=128, help="head dimension (default 128)")
    _common(at)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--order", type=_orders, default=_orders(common.DEFAULT_ORDER),
                   help=f"variant | invariant | fixed_split | subblock | all (default {common.DEFAULT_ORDER})")
    p.add_argument("--device", default=None,
                   help="device profile for the tables (e.g. h200, rtx5060-laptop; default: the default profile)")


def warp_lines(plan, k: int) -> list[str]:
    """Which super-blocks of a ``k``-input row each warp sums, from the plan's thread map."""
    from ..errors import PlanError
    from ..plans import MMQStockPlan, SubBlockPlan

    if isinstance(plan, MMQStockPlan):  # llama.cpp's MMQ: the stream-k pieces of each tile
        first = plan.pieces()[0]
        return [f"  a row of {k} inputs is {plan.nblocks} super-blocks; tile 0 (rows 0..127) sums pieces " +
                ", ".join(f"{a}..{b - 1}" for a, b in first) + " (each in k order), then the fixup adds them"]
    if isinstance(plan, SubBlockPlan):  # the K split is the order; warps are a launch fact
        return [f"  a row of {k} inputs: segments of super-blocks " +
                ", ".join(f"{a}..{b - 1}" for a, b in plan.segment_bounds()) + ", each summed in k order"]
    qk = plan.traits.qk
    if k % qk:
        raise PlanError(f"-K {k} is not a multiple of {plan.qtype}'s block of {qk} inputs")
    n_blocks = k // qk
    if plan.kernel == "tiled":
        return [f"  a row of {k} inputs is {n_blocks} blocks of {qk}: one thread per output sums blocks "
                f"0..{n_blocks - 1} in order"]
    tb = plan.thread_blocks(n_blocks)
    lines = [f"  a row of {k} inputs is {n_blocks} blocks of {qk}; {plan.nwarps} warps:"]
    for w in range(min(plan.nwarps, SHOWN_WARPS)):
        blocks = sorted({b for tid in range(32 * w, 32 * (w + 1)) for b in tb[tid]})
        lines.append(f"    warp {w} sums blocks {', '.join(map(str, blocks)) or '(none)'}")
    if plan.nwarps > SHOWN_WARPS:
        lines.append(f"    ... {plan.nwarps - SHOWN_WARPS} more warps")
    return lines


def run(args) -> int:
    from .. import plans

    for order in args.order:
        if args.op == "matvec":
            plan = plans.matvec_plan(order, args.ncols, args.qtype, device=args.device, k=args.k, n=args.rows)
            print(f"{order.name}: mat-vec {args.qtype}, K {args.k}, {args.ncols} column(s)")
            print("  " + plan.describe().replace("\n", "\n  "))
            for line in warp_lines(plan, args.k):
                print(line)
        else:
            plan = plans.attention_plan(order, args.n_queries, args.kv_len, args.n_head, args.n_head_kv,
                                        args.head_dim, device=args.device)
            print(f"{order.name}: attention, {args.n_queries} quer{'y' if args.n_queries == 1 else 'ies'}, "
                  f"{args.kv_len} KV cells, {args.n_head}/{args.n_head_kv} heads")
            print("  " + plan.describe().replace("\n", "\n  "))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP, epilog=common.epilog(),
                                   formatter_class=common.formatter())
    add_arguments(parser)
    parser.set_defaults(run=run)
