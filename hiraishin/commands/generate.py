"""``hiraishin generate``: greedy decoding of a prompt, streamed to stdout, with timings."""

from __future__ import annotations

import argparse
import sys

from ..order import ReductionOrder

NAME = "generate"
HELP = "greedy-decode a prompt with a Qwen3 GGUF, streaming the text"

ORDERS = {"variant": ReductionOrder.BATCH_VARIANT, "invariant": ReductionOrder.BATCH_INVARIANT,
          "fixed_split": ReductionOrder.FIXED_SPLIT}


def parse_order(name: str) -> ReductionOrder:
    """``variant`` / ``invariant`` / ``fixed_split`` (or ``batch_variant`` ...) -> the preset."""
    key = name.lower().removeprefix("batch_")
    if key not in ORDERS:
        raise argparse.ArgumentTypeError(f"unknown order {name!r}; choose from {', '.join(ORDERS)}")
    return ORDERS[key]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.gguf")
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--order", type=parse_order, default=ReductionOrder.BATCH_INVARIANT,
                   help="variant | invariant | fixed_split (default invariant)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--n-ctx", type=int, default=None, help="KV cache cells (default: enough for the run)")
    p.add_argument("--no-stop", action="store_true", help="do not stop at end-of-generation tokens")
    p.add_argument("--top-k", type=int, default=0, help="print the top-k logits of every new token")


def run(args) -> int:
    from ..model.qwen3 import DEFAULT_N_CTX, Qwen3

    n_ctx = args.n_ctx or max(DEFAULT_N_CTX, len(args.prompt.encode()) + args.max_new_tokens + 64)
    model = Qwen3.from_gguf(args.model, device=args.device, n_ctx=n_ctx, progress=True)
    if model.tokenizer is None:
        print(f"{model.name} has no tokenizer", file=sys.stderr)
        return 2

    def show(step):
        print(step.text, end="", flush=True)

    result = model.generate(args.prompt, max_new_tokens=args.max_new_tokens, order=args.order,
                            stop_at_eos=not args.no_stop, on_token=show, top_k=max(args.top_k, 1),
                            chat=args.chat)
    print()
    if args.top_k:
        for i, (ids, vals) in enumerate(zip(result.top_k_ids, result.top_k_logits)):
            cells = "  ".join(f"{model.tokenizer.token_text(int(t))!r}:{v:.3f}" for t, v in zip(ids, vals))
            print(f"[{i}] {cells}")
    print(f"\n{model.name} on {model.backend.name}, order {result.order}: {len(result.prompt_tokens)} prompt "
          f"tokens in {result.prefill_s:.2f} s ({result.prefill_tokens_per_s:.1f} tok/s), "
          f"{len(result.tokens)} new tokens, {result.decode_tokens_per_s:.1f} tok/s decoding, "
          f"stopped: {result.stop_reason}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(run=run)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=f"hiraishin {NAME}", description=HELP)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
