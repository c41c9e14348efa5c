"""``hiraishin generate``: greedy decoding of a prompt, streamed to stdout, with timings."""

from __future__ import annotations

import argparse
import sys
import warnings

from . import common

NAME = "generate"
HELP = "greedy-decode a prompt with a Qwen3 GGUF, streaming the text"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model(p)
    common.add_prompt(p, positional=True)
    common.add_n_predict(p, 64, "--max-new-tokens")
    common.add_run_options(p)
    common.add_ignore_eos(p, "--no-stop")
    p.add_argument("--n-probs", type=common.positive_int, default=None, metavar="N",
                   help="print the N largest logits of every new token (llama-server's n_probs); "
                        "decoding stays greedy")
    p.add_argument("--top-k", type=common.positive_int, default=None, dest="top_k_deprecated",
                   help=argparse.SUPPRESS)


def run(args) -> int:
    # every argument is checked before the weights load
    path = common.model_path(args)
    text = common.read_prompt(args)
    common.check_output(args.json, "--json")
    n_probs = args.n_probs
    if args.top_k_deprecated is not None:
        warnings.warn("--top-k is deprecated: it prints the top logits, it does not sample; use --n-probs",
                      FutureWarning, stacklevel=1)
        n_probs = n_probs or args.top_k_deprecated
    header = common.open_header(path)
    n_ctx = args.n_ctx or common.context_for(text, args.n_predict, args.chat)
    common.check_ctx(n_ctx, header.config, args.device)

    from ..model.qwen3 import Qwen3

    model = Qwen3.from_gguf(path, device=args.device, n_ctx=n_ctx, progress=True)
    model.use_weight_layout_for(args.order)  # (the layout the order reads fastest: Qwen3.weight_layout_for)
    ids = common.prompt_ids(model, text, args)

    def show(step):
        print(step.text, end="", flush=True)

    result = model.generate(ids, max_new_tokens=args.n_predict, order=args.order,
                            stop_at_eos=not args.ignore_eos, on_token=show, top_k=n_probs or 1)
    print()
    if n_probs:
        for i, (tids, vals) in enumerate(zip(result.top_k_ids, result.top_k_logits)):
            cells = "  ".join(f"{model.tokenizer.token_text(int(t))!r}:{v:.3f}" if model.tokenizer else
                              f"{int(t)}:{v:.3f}" for t, v in zip(tids, vals))
            print(f"[{i}] {cells}")
    print(f"\n{model.name} on {model.backend.name}, order {result.order}: {len(result.prompt_tokens)} prompt "
          f"tokens in {result.prefill_s:.2f} s ({result.prefill_tokens_per_s:.1f} tok/s), "
          f"{len(result.tokens)} new tokens, {result.decode_tokens_per_s:.1f} tok/s decoding, "
          f"stopped: {result.stop_reason}", file=sys.stderr)
    if args.json:
        data = result.to_dict()
        if not n_probs:
            data.pop("top_k_ids"), data.pop("top_k_logits")
        data["meta"] = common.run_meta(NAME, path, model.backend.name, seed=args.seed, n_ctx=n_ctx)
        print(f"wrote {common.write_json(args.json, data)}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP, epilog=common.epilog(),
                                   formatter_class=common.formatter())
    add_arguments(parser)
    parser.set_defaults(run=run)
