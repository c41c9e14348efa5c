"""``hiraishin replay``: decode one token per pass, replay in batches, report every logit difference."""

from __future__ import annotations

import argparse

from ..errors import HiraishinError
from ..order import ReductionOrder

NAME = "replay"
HELP = "compare one-token passes with batched passes of the same sequence, logit by logit"

ORDERS = {
    "variant": ReductionOrder.BATCH_VARIANT,
    "invariant": ReductionOrder.BATCH_INVARIANT,
    "fixed_split": ReductionOrder.FIXED_SPLIT,
}
DEFAULT_PROMPT = "Explain a hash map in one paragraph."


def parse_order(name: str) -> ReductionOrder:
    """``variant`` / ``invariant`` / ``fixed_split`` (or a preset's full name) -> the preset."""
    key = name.lower().removeprefix("batch_")
    if key not in ORDERS:
        raise argparse.ArgumentTypeError(f"unknown order {name!r}; choose from {', '.join(ORDERS)}")
    return ORDERS[key]


def parse_batch_sizes(text: str) -> list[int]:
    """``"2,3,5"`` -> ``[2, 3, 5]``."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers >= 1, got {text!r}")
    return sizes


def kv_cells(n_tokens: int) -> int:
    """KV cache cells for ``n_tokens`` positions: rounded up to the 256-cell attention padding."""
    return max(256, -(-n_tokens // 256) * 256)


def context_for(prompt: str, n_new: int) -> int:
    """KV cells enough for ``prompt`` plus ``n_new`` tokens (a byte-level BPE token is at least one byte)."""
    from ..model.qwen3 import DEFAULT_N_CTX

    return max(DEFAULT_N_CTX, kv_cells(len(prompt.encode()) + n_new + 1))


def encode_prompt(model, prompt: str) -> list[int]:
    """Token ids of ``prompt``: the model's tokenizer, or comma-separated ids when it has none."""
    if model.tokenizer is not None and not prompt.startswith("ids:"):
        return list(model.tokenizer.encode(prompt))
    text = prompt.removeprefix("ids:")
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise HiraishinError(f"{model.name} has no tokenizer: give the prompt as ids:1,2,3") from None


def add_common(p: argparse.ArgumentParser, default_order: str = "variant") -> None:
    p.add_argument("--prompt", default=DEFAULT_PROMPT,
                   help="prompt text (or ids:1,2,3 for raw token ids)")
    p.add_argument("--tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--order", type=parse_order, default=ORDERS[default_order],
                   help=f"variant | invariant | fixed_split (default {default_order})")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", metavar="OUT.json", help="write the report as JSON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.gguf")
    add_common(p)
    p.add_argument("--batch-sizes", type=parse_batch_sizes, default=[2, 3, 5, 9, 16],
                   help="comma-separated batch sizes (default 2,3,5,9,16)")
    p.add_argument("--start", type=int, default=0,
                   help="compare from this position; earlier ones are a shared prefix (default 0)")
    p.add_argument("--plot", metavar="OUT.png", help="save the Δlogit-by-position plot")
    p.add_argument("--no-localize", action="store_true",
                   help="skip naming the first differing op (costs one more plain run)")


def run(args) -> int:
    from ..decode.replay import replay
    from ..model.qwen3 import Qwen3

    model = Qwen3.from_gguf(args.model, device=args.device, progress=True,
                            n_ctx=context_for(args.prompt, args.tokens))
    prompt = encode_prompt(model, args.prompt)
    report = replay(model, prompt, args.batch_sizes, order=args.order, n_new=args.tokens,
                    start=args.start, progress=True)
    if not args.no_localize and not report.identical:
        report.localize(model, progress=True)
    print(report)
    if not report.identical:
        print()
        print(report.histogram_table())
    print(f"\n{sum(v for k, v in report.timings.items() if k != 'total'):.1f} s "
          f"({', '.join(f'{k} {v:.1f} s' for k, v in report.timings.items() if k != 'total')})")
    if args.json:
        print(f"wrote {report.save(args.json)}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        report.plot().savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(run=run)
