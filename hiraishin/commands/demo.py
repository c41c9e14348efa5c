"""``hiraishin demo``: the batch-variance bug and its fix, side by side, on a small synthetic Qwen3.

With no arguments: writes a seeded synthetic model once (cached under
``$HIRAISHIN_CACHE`` or ``~/.cache/hiraishin``) plus a noisy draft of it, then
for ``BATCH_VARIANT`` and ``BATCH_INVARIANT`` runs plain greedy decoding, a
replay in batches of 2, 3, 5, 9 and 16, and speculative decoding with the
model as its own draft and with the noisy draft; prints what differs.
Runs on the GPU when there is one, else on the CPU emulator.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..order import ReductionOrder
from .replay import encode_prompt, kv_cells, parse_batch_sizes

NAME = "demo"
HELP = "batch-variant vs batch-invariant decoding on a small synthetic Qwen3 (cached), side by side"

# With this prompt the micro model reaches, within DEMO_TOKENS greedy tokens, a position whose top-2
# logits are closer than the batch-variant shift, so the variant order flips a token there. Other
# prompts may need more tokens to get there: the numbers are always computed, never assumed.
DEMO_PROMPT = "Speculative decoding promises"
DEMO_TOKENS = 40
DEMO_SHAPE = "micro"
DEMO_SEED = 0
# draft noise, as a fraction of each tensor's std: enough for rejections, little enough for acceptances
DEMO_DRAFT_NOISE = 0.05
ORDERS = (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT)


def cache_dir() -> Path:
    """``$HIRAISHIN_CACHE``, else ``~/.cache/hiraishin``."""
    env = os.environ.get("HIRAISHIN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hiraishin"


def _cached(path: Path, write) -> tuple[Path, bool]:
    """``path``, written by ``write(tmp_path)`` first if missing (atomically: no half files)."""
    if path.exists():
        return path, True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path, False


def demo_models(shape: str = DEMO_SHAPE, seed: int = DEMO_SEED, noise: float = DEMO_DRAFT_NOISE,
                cache: Path | None = None) -> tuple[Path, Path, bool]:
    """Paths of the cached synthetic target and its noisy draft; ``True`` if both were cached."""
    from ..decode.draft import write_draft
    from ..model.synth import write_synthetic

    cache = cache or cache_dir()
    target, hit_t = _cached(cache / f"qwen3-{shape}-seed{seed}.gguf",
                            lambda p: write_synthetic(p, shape=shape, seed=seed, progress=False))
    draft, hit_d = _cached(cache / f"qwen3-{shape}-seed{seed}-draft-noise{noise:g}.gguf",
                           lambda p: write_draft(target, p, noise=noise, seed=seed + 1))
    return target, draft, hit_t and hit_d


@dataclass
class OrderRun:
    """What the demo measured under one order."""

    order: str
    plain_tokens: list[int]
    replay: object  # ReplayReport
    self_spec: object  # SpeculativeResult
    noisy_spec: object  # SpeculativeResult
    seconds: dict = field(default_factory=dict)


def run_demo(tokens: int = DEMO_TOKENS, device: str = "auto", batch_sizes=(2, 3, 5, 9, 16), n_draft: int = 8,
             p_min_gap: float = 0.0, shape: str = DEMO_SHAPE, prompt: str = DEMO_PROMPT,
             cache: Path | None = None, out=print, progress: bool = True) -> list[OrderRun]:
    """Run the demo and print its table with ``out``; returns the measurements per order."""
    from ..decode.replay import replay
    from ..decode.speculative import generate_speculative
    from ..model.qwen3 import Qwen3

    t0 = time.perf_counter()
    target_path, draft_path, cached = demo_models(shape=shape, cache=cache)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n_ctx = kv_cells(len(prompt.encode()) + tokens + n_draft + 1)
    target = Qwen3.from_gguf(target_path, device=device, n_ctx=n_ctx, progress=False)
    self_draft = Qwen3.from_gguf(target_path, device=device, n_ctx=n_ctx, progress=False)
    noisy_draft = Qwen3.from_gguf(draft_path, device=device, n_ctx=n_ctx, progress=False)
    load_s = time.perf_counter() - t0
    ids = encode_prompt(target, prompt)
    c = target.config
    out(f"hiraishin demo: synthetic Qwen3 '{shape}' ({c.n_layer} layers, n_embd {c.n_embd}, n_ff {c.n_ff}, "
        f"vocab {c.n_vocab}) on {target.backend.name}")
    out(f"  model {target_path} ({'cached' if cached else f'written in {write_s:.1f} s'}), "
        f"loaded in {load_s:.1f} s")
    out(f"  prompt {prompt!r} ({len(ids)} tokens), {tokens} new tokens, greedy\n")

    from tqdm import tqdm

    runs = []
    with tqdm(total=4 * len(ORDERS), desc="demo", unit="step", disable=not progress, leave=False) as bar:
        for order in ORDERS:
            sec = {}

            def step(name):
                bar.set_postfix_str(f"{order.name}: {name}")
                sec[name] = time.perf_counter()

            def done(name):
                sec[name] = time.perf_counter() - sec[name]
                bar.update(1)

            step("plain")
            plain = target.generate(ids, max_new_tokens=tokens, order=order, stop_at_eos=False)
            done("plain")
            step("replay")
            rep = replay(target, ids + plain.tokens, batch_sizes, order=order)
            if not rep.identical:
                rep.localize(target)
            done("replay")
            specs = []
            for name, draft in (("spec_self", self_draft), ("spec_noisy", noisy_draft)):
                step(name)
                specs.append(generate_speculative(target, ids, draft, n_draft=n_draft, order=order,
                                                  max_new_tokens=tokens, p_min_gap=p_min_gap,
                                                  stop_at_eos=False, plain_tokens=plain.tokens))
                done(name)
            runs.append(OrderRun(order.name, plain.tokens, rep, specs[0], specs[1], sec))
    for line in _table(runs, tokens):
        out(line)
    return runs


def _spec_cell(res) -> str:
    match = "= plain" if res.matches_plain else f"≠ plain at {res.first_divergence}"
    return f"{match}, accept {res.acceptance_rate:.0%}"


def _table(runs: list[OrderRun], n_tokens: int) -> list[str]:
    w0, w = 32, 24
    rows = [f"{'':<{w0}}" + "".join(f"{r.order:>{w}}" for r in runs)]

    def row(label, cells):
        rows.append(f"{label:<{w0}}" + "".join(f"{c:>{w}}" for c in cells))

    def n_differ(r):
        return len({p for b in r.replay.batches for p in b.positions_differ})

    n_pos = len(runs[0].replay.positions)
    rows.append(f"replay of {n_pos} positions: max |Δlogit| vs one-token passes (argmax flips)")
    for i, b in enumerate(runs[0].replay.batch_sizes):
        row(f"  batch {b}", [f"{_g(r.replay.batches[i].max_abs_diff)} ({len(r.replay.batches[i].flips)} flips)"
                             for r in runs])
    row("  positions that differ", [f"{n_differ(r)} of {n_pos}" for r in runs])
    # a token flips where the shift beats the plain run's margin between its top two logits
    row("  smallest plain top-2 gap", [_g(min(r.replay.plain_gap)) for r in runs])
    row("  first differing op", [r.replay.localization.name if r.replay.localization
                                 and r.replay.localization.name else "-" for r in runs])
    rows.append(f"speculative decoding vs plain greedy ({n_tokens} tokens)")
    row("  target as its own draft", [_spec_cell(r.self_spec) for r in runs])
    row("  noisy draft", [_spec_cell(r.noisy_spec) for r in runs])
    row("  mean verify batch (self)", [f"{r.self_spec.mean_verify_batch:.2f}" for r in runs])
    rows.append("time")
    for key, label in (("plain", "plain decode"), ("replay", "replay + localize"),
                       ("spec_self", "speculative, self draft"), ("spec_noisy", "speculative, noisy draft")):
        row(f"  {label}", [f"{r.seconds[key]:.1f} s" for r in runs])
    rows.append("")
    inv = runs[-1]
    ok = inv.replay.identical and inv.self_spec.matches_plain and inv.noisy_spec.matches_plain
    rows.append(f"{inv.order}: " + ("every replayed logit is bit-identical and speculative decoding "
                                    f"emits plain decoding's {n_tokens} tokens" if ok
                                    else "NOT exact: see the rows above"))
    var = runs[0]
    rows.append(f"{var.order}: " + (f"{n_differ(var)} of {n_pos} positions change with the batch size"
                                    if not var.replay.identical else "no difference found at these sizes"))
    return rows


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=DEMO_TOKENS, help=f"tokens to generate (default {DEMO_TOKENS})")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-sizes", type=parse_batch_sizes, default=[2, 3, 5, 9, 16])
    p.add_argument("--n-draft", type=int, default=8)
    p.add_argument("--shape", default=DEMO_SHAPE, choices=["micro", "tiny"])
    p.add_argument("--prompt", default=DEMO_PROMPT)
    p.add_argument("--json-dir", metavar="DIR", help="save every replay and speculative report there as JSON")


def run(args) -> int:
    runs = run_demo(tokens=args.tokens, device=args.device, batch_sizes=args.batch_sizes,
                    n_draft=args.n_draft, shape=args.shape, prompt=args.prompt)
    if args.json_dir:
        d = Path(args.json_dir)
        d.mkdir(parents=True, exist_ok=True)
        for r in runs:
            r.replay.save(d / f"demo-replay-{r.order}.json")
            r.self_spec.save(d / f"demo-speculative-self-{r.order}.json")
            r.noisy_spec.save(d / f"demo-speculative-noisy-{r.order}.json")
        print(f"wrote reports to {d}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(run=run)
