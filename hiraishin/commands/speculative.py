"""``hiraishin speculative``: greedy speculative decoding, checked against plain greedy decoding."""

from __future__ import annotations

import argparse

from .replay import add_common, context_for, encode_prompt

NAME = "speculative"
HELP = "speculative decoding (a draft model or the target itself) vs plain greedy decoding"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="TARGET.gguf")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--draft", metavar="DRAFT.gguf", help="the draft model")
    who.add_argument("--self", dest="self_draft", action="store_true",
                     help="self-speculation: a second instance of the target drafts")
    p.add_argument("--n-draft", type=int, default=8, help="most guesses per cycle (default 8)")
    p.add_argument("--p-min-gap", type=float, default=3.0,
                   help="the draft stops when its top-two logits are closer than this (default 3.0; 0: never)")
    add_common(p, default_order="invariant")
    p.add_argument("--no-plain", action="store_true", help="skip the plain greedy run used for comparison")
    p.add_argument("--no-eos", action="store_true", help="do not stop at end-of-sequence tokens")


def run(args) -> int:
    from ..decode.speculative import generate_speculative
    from ..model.qwen3 import Qwen3
    from ..order import ReductionOrder

    order = args.order
    n_ctx = context_for(args.prompt, args.tokens + args.n_draft)
    target = Qwen3.from_gguf(args.model, device=args.device, n_ctx=n_ctx, progress=True)
    draft = Qwen3.from_gguf(args.model if args.self_draft else args.draft, device=args.device,
                            n_ctx=n_ctx, progress=True)
    prompt = encode_prompt(target, args.prompt)
    plain = None
    if not args.no_plain:
        plain = target.generate(prompt, max_new_tokens=args.tokens, order=order,
                                stop_at_eos=not args.no_eos, progress=True)
    res = generate_speculative(target, prompt, draft, n_draft=args.n_draft, order=order,
                               max_new_tokens=args.tokens, p_min_gap=args.p_min_gap,
                               stop_at_eos=not args.no_eos,
                               plain_tokens=None if plain is None else plain.tokens, progress=True)
    print(res)
    if res.text:
        print(f"\n{res.text}")
    if args.json:
        print(f"wrote {res.save(args.json)}")
    # a mismatch is the finding under the variant order, a failure under any other
    return 1 if res.matches_plain is False and order != ReductionOrder.BATCH_VARIANT else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(run=run)
