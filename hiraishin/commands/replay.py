"""``hiraishin replay``: decode one token per pass, replay in batches, report every logit difference.

``--check`` turns it into a gate: exit status 1 when any logit of any batch size differs from the
one-token passes (as vLLM's bitwise batch-invariance test and SGLang's ``test_deterministic`` do).
"""

from __future__ import annotations

import argparse

from . import common
# kept importable from here: the demo and older scripts use these names
from .common import context_for, kv_cells, parse_batch_sizes, parse_order  # noqa: F401

NAME = "replay"
HELP = "compare one-token passes with batched passes of the same sequence, logit by logit"
DEFAULT_PROMPT = "Explain a hash map in one paragraph."
DEFAULT_BATCH_SIZES = "2,3,5,9,16"
# Exit status of ``--check`` when a logit differs (2 stays "bad input").
EXIT_NOT_INVARIANT = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model(p)
    common.add_prompt(p, default=DEFAULT_PROMPT)
    common.add_n_predict(p, 32, "--tokens", minimum=0)
    common.add_run_options(p, "write the report as JSON")
    p.add_argument("--batch-sizes", type=parse_batch_sizes, default=parse_batch_sizes(DEFAULT_BATCH_SIZES),
                   help=f"comma-separated batch sizes (default {DEFAULT_BATCH_SIZES})")
    p.add_argument("--start", type=common.nonneg_int, default=0,
                   help="compare from this position; earlier ones are a shared prefix (default 0)")
    p.add_argument("--plot", metavar="OUT.png", help="save the Δlogit-by-position figure (png, pdf, svg, ...)")
    p.add_argument("--no-localize", action="store_true",
                   help="skip naming the first differing op (costs one more plain run)")
    p.add_argument("--check", action="store_true",
                   help=f"exit with status {EXIT_NOT_INVARIANT} when any logit differs (a CI gate)")


def run(args) -> int:
    path = common.model_path(args)
    text = common.read_prompt(args)
    common.check_output(args.json, "--json")
    common.check_plot(args.plot)
    header = common.open_header(path)
    n_ctx = args.n_ctx or context_for(text, args.n_predict, args.chat)
    common.check_ctx(n_ctx, header.config, args.device)

    from ..decode.localize import localize
    from ..decode.replay import replay
    from ..errors import HiraishinError
    from ..model.qwen3 import Qwen3

    model = Qwen3.from_gguf(path, device=args.device, progress=True, n_ctx=n_ctx)
    prompt = common.prompt_ids(model, text, args)
    if args.start >= len(prompt):
        raise HiraishinError(f"--start {args.start}: the prompt has {len(prompt)} tokens, so positions "
                             f"0..{len(prompt) - 1} can start the comparison")
    if len(prompt) + args.n_predict > n_ctx:
        raise HiraishinError(f"the prompt ({len(prompt)} tokens) plus -n {args.n_predict} needs "
                             f"{len(prompt) + args.n_predict} KV cells; --ctx-size is {n_ctx}")
    report = replay(model, prompt, args.batch_sizes, order=args.order, n_new=args.n_predict,
                    start=args.start, progress=True)
    if not args.no_localize and not report.identical:
        localize(model, report, progress=True)
    print(report)
    if not report.identical:
        print()
        print(report.histogram_table())
    print(f"\n{sum(v for k, v in report.timings.items() if k != 'total'):.1f} s "
          f"({', '.join(f'{k} {v:.1f} s' for k, v in report.timings.items() if k != 'total')})")
    if args.json:
        report.meta = common.run_meta(NAME, path, model.backend.name, seed=args.seed, n_ctx=n_ctx)
        print(f"wrote {report.save(args.json)}")
    if args.plot:
        print(f"wrote {common.save_figure(report.plot(), args.plot)}")
    if args.check:
        if report.identical:
            print(f"check passed: {args.order.name} is bit-identical at every position and batch size")
            return 0
        print(f"check FAILED: {args.order.name} changes logits with the batch size "
              f"(first at position {report.first_divergence})")
        return EXIT_NOT_INVARIANT
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP, epilog=common.epilog(),
                                   formatter_class=common.formatter())
    add_arguments(parser)
    parser.set_defaults(run=run)
