"""``hiraishin bench``: a llama-bench-like benchmark (decode, prefill, verify widths, oracle speculative, memory)."""

from __future__ import annotations

import argparse
import sys

NAME = "bench"
HELP = "benchmark decode, prefill, verify passes of widths 1..16 and exact speculative decoding (oracle schedule)"
EPILOG = ("Speculative decoding runs with an ORACLE schedule: which drafted tokens are right comes from a seeded "
          "schedule with the original report's profile (77.3%% accepted, mean verify batch 2.97, 2.52 tokens per "
          "cycle), while every draft step and verify pass runs for real. Without --draft the target drafts for "
          "itself (a second instance). --quick: a smoke run (one repetition, a few tokens; seconds per token on the "
          "CPU).")


def _orders(text):
    from ..benchmark import parse_orders
    from ..errors import HiraishinError

    try:
        return parse_orders(text)
    except HiraishinError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _widths(text):
    from ..benchmark import parse_widths
    from ..errors import HiraishinError

    try:
        return parse_widths(text)
    except HiraishinError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.gguf")
    p.add_argument("--draft", metavar="DRAFT.gguf", help="the draft model (default: the target drafts for itself)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON (atomically)")
    p.add_argument("--orders", type=_orders, default=None,
                   help="comma-separated orders: variant, invariant, fixed_split, subblock, invariant16 (default variant,invariant,subblock)")
    p.add_argument("--draft-orders", type=_orders, default=None, dest="draft_orders",
                   help="orders to time the draft under; speculation drafts under the one whose passes of the "
                        "oracle schedule cost least (only the target's order decides the tokens; default: --orders)")
    p.add_argument("--widths", type=_widths, default=None,
                   help="verify widths, e.g. 1-16 or 1,2,4 (default 1-16; quick 1,2,4,8,16)")
    p.add_argument("--prefill", type=int, default=None, help="prompt tokens of the prefill test (default 512; quick 16)")
    p.add_argument("--tokens", type=int, default=None, help="tokens of the speculative run (default 64; quick 6)")
    p.add_argument("--repetitions", type=int, default=None, help="timed repetitions (default 5; quick 1)")
    p.add_argument("--draft-ahead", action="store_true", dest="draft_ahead",
                   help="also exact speculation with the draft guessing the next cycle during the verify "
                        "(hiraishin.decode.ahead): 'ahead' beside each order's speculative figures")
    p.add_argument("--ahead-passes", type=int, default=None, metavar="N", dest="ahead_passes",
                   help="with --draft-ahead: the most passes the draft makes ahead (at least 2; default the "
                        "next cycle's draft length + 1)")
    p.add_argument("--quick", action="store_true", help="a smoke run: one repetition, a few tokens")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--llama-bench", metavar="FILE", action="append", default=[],
                   help="llama-bench -o json output(s) of stock llama.cpp on the same files and GPU "
                        "(bench/llama_cpp_session.sh): printed beside ours and kept in the JSON under llama_cpp "
                        "(default: recorded figures)")


def run(args) -> int:
    from ..bench_report import format_report, read_llama_bench, write_json
    from ..benchmark import BenchSettings, run_bench

    llama = read_llama_bench(args.llama_bench) if args.llama_bench else None  # checked before the run
    settings = BenchSettings.make(quick=args.quick, orders=args.orders, widths=args.widths, prefill=args.prefill,
                                  spec_tokens=args.tokens, repetitions=args.repetitions,
                                  draft_orders=args.draft_orders, draft_ahead=args.draft_ahead or None,
                                  ahead_passes=args.ahead_passes)
    result = run_bench(args.model, draft_path=args.draft, device=args.device, settings=settings,
                       progress=not args.quiet, argv=["hiraishin", *sys.argv[1:]] if sys.argv else None)
    if llama is not None:
        result["llama_cpp"] = llama
    print(format_report(result))
    if args.json:
        print(f"wrote {write_json(result, args.json)}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP, epilog=EPILOG)
    add_arguments(parser)
    parser.set_defaults(run=run)
