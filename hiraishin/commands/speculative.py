"""``hiraishin speculative``: greedy speculative decoding, checked against plain greedy decoding.

The defaults draft on every model: the draft guesses ``--draft-max`` tokens each cycle unless
a confidence cut is asked for (``--p-min-gap``, or llama.cpp's ``--draft-p-min``, a
probability). A run in which the draft proposed nothing says so: it checks nothing.
"""

from __future__ import annotations

import argparse
import sys

from . import common

NAME = "speculative"
HELP = "speculative decoding (a draft model or the target itself) vs plain greedy decoding"
DEFAULT_PROMPT = "Explain a hash map in one paragraph."
# Exit status when the tokens differ from plain decoding under an order that promises equality.
EXIT_NOT_EXACT = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..decode.speculative import DEFAULT_P_MIN, DEFAULT_P_MIN_GAP, LLAMA_CPP_DRAFT_P_MIN, MAX_P_MIN_GAP

    common.add_model(p, metavar="TARGET.gguf")
    who = p.add_mutually_exclusive_group()
    who.add_argument("-md", "--model-draft", "--draft", dest="draft", metavar="DRAFT.gguf",
                     help="the draft model (llama.cpp's -md)")
    who.add_argument("--self", dest="self_draft", action="store_true",
                     help="self-speculation: a second instance of the target drafts")
    p.add_argument("--draft-max", "--n-draft", dest="n_draft", type=common.positive_int, default=8, metavar="N",
                   help="most guesses per cycle (default 8)")
    p.add_argument("--draft-min", type=common.nonneg_int, default=0, metavar="N",
                   help="drop drafts shorter than N (verify the last token alone; default 0)")
    p.add_argument("--p-min-gap", type=common.finite_float(0.0, MAX_P_MIN_GAP), default=DEFAULT_P_MIN_GAP,
                   help="the draft stops when its top-two logits are closer than this "
                        f"(default {DEFAULT_P_MIN_GAP:g}: never)")
    p.add_argument("--draft-p-min", dest="p_min", type=common.finite_float(0.0, 1.0), default=DEFAULT_P_MIN,
                   metavar="P", help="the draft stops when its top token's probability is below P "
                                     f"(default {DEFAULT_P_MIN:g}: never; llama.cpp uses {LLAMA_CPP_DRAFT_P_MIN})")
    common.add_prompt(p, default=DEFAULT_PROMPT)
    common.add_n_predict(p, 32, "--tokens")
    common.add_run_options(p)
    p.add_argument("--draft-ahead", action="store_true",
                   help="the draft guesses the next cycle while the target verifies this one (no confidence "
                        "cut; the same tokens)")
    p.add_argument("--ahead-passes", type=int, default=None, metavar="N",
                   help="with --draft-ahead: the most passes the draft makes ahead (at least 2; default "
                        "--draft-max + 1)")
    p.add_argument("--draft-order", type=common.parse_order, default=None, metavar="ORDER",
                   help="the draft's reduction order (default --order's): only the target's order decides the "
                        "tokens, so the draft may run its fastest")
    p.add_argument("--no-plain", action="store_true", help="skip the plain greedy run used for comparison")
    common.add_ignore_eos(p, "--no-eos")


def run(args) -> int:
    from ..decode.ahead import MIN_AHEAD_PASSES
    from ..errors import HiraishinError
    from ..order import ReductionOrder

    path = common.model_path(args)
    if not args.self_draft and not args.draft:
        raise HiraishinError("no draft given: pass -md/--model-draft (or --draft) DRAFT.gguf, or --self")
    if args.draft_min > args.n_draft:
        raise HiraishinError(f"--draft-min {args.draft_min} is larger than --draft-max {args.n_draft}")
    if args.ahead_passes is not None and (not args.draft_ahead or args.ahead_passes < MIN_AHEAD_PASSES):
        raise HiraishinError(f"--ahead-passes {args.ahead_passes}: it needs --draft-ahead and at least "
                             f"{MIN_AHEAD_PASSES} passes")
    if args.draft_ahead and (args.p_min_gap > 0 or args.p_min > 0):
        raise HiraishinError("--draft-ahead takes no confidence cut: leave --p-min-gap and --draft-p-min at 0")
    text = common.read_prompt(args)
    common.check_output(args.json, "--json")
    header = common.open_header(path)
    draft_header = header if args.self_draft else common.open_header(args.draft)
    if draft_header.config.n_vocab != header.config.n_vocab:
        raise HiraishinError(f"{args.draft}: vocabulary of {draft_header.config.n_vocab} tokens; the target "
                             f"{path} has {header.config.n_vocab}")
    n_ctx = args.n_ctx or common.context_for(text, args.n_predict + args.n_draft, args.chat)
    common.check_ctx(n_ctx, header.config, args.device)
    common.check_ctx(n_ctx, draft_header.config, args.device)

    from ..decode.speculative import generate_speculative
    from ..model.qwen3 import Qwen3

    target = Qwen3.from_gguf(path, device=args.device, n_ctx=n_ctx, progress=True)
    prompt = common.prompt_ids(target, text, args)
    draft = Qwen3.from_gguf(path if args.self_draft else args.draft, device=args.device,
                            n_ctx=n_ctx, progress=True)
    target.use_weight_layout_for(args.order)  # (the layout each model's order reads fastest)
    draft.use_weight_layout_for(args.draft_order or args.order)
    plain = None
    if not args.no_plain:
        plain = target.generate(prompt, max_new_tokens=args.n_predict, order=args.order,
                                stop_at_eos=not args.ignore_eos, progress=True)
    res = generate_speculative(target, prompt, draft, n_draft=args.n_draft, order=args.order,
                               max_new_tokens=args.n_predict, p_min_gap=args.p_min_gap,
                               stop_at_eos=not args.ignore_eos,
                               plain_tokens=None if plain is None else plain.tokens, progress=True,
                               p_min=args.p_min, draft_min=args.draft_min, draft_ahead=args.draft_ahead,
                               ahead_passes=args.ahead_passes, draft_order=args.draft_order)
    print(res)
    if res.vacuous:
        print(f"hiraishin {NAME}: WARNING: the draft proposed no tokens in {len(res.cycles)} cycles; "
              "the comparison with plain decoding is vacuous", file=sys.stderr)
    if res.text:
        print(f"\n{res.text}")
    if args.json:
        res.meta.update(common.run_meta(NAME, path, target.backend.name, seed=args.seed, n_ctx=n_ctx,
                                        draft_file=path if args.self_draft else args.draft))
        print(f"wrote {res.save(args.json)}")
    # a mismatch is the finding under the variant order, a failure under any other
    return EXIT_NOT_EXACT if res.matches_plain is False and args.order != ReductionOrder.BATCH_VARIANT else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP, epilog=common.epilog(),
                                   formatter_class=common.formatter())
    add_arguments(parser)
    parser.set_defaults(run=run)
