"""``hiraishin demo [MODEL.gguf]``: every mechanism of the batch-variance bug, and the fix of each.

With no model: a seeded synthetic Qwen3 whose rows span at least 4 Q6_K super-blocks (n_embd
1024, so the mat-vec's warp count changes which blocks a warp sums), written once into the cache
(``$HIRAISHIN_CACHE`` or ``~/.cache/hiraishin``) with a noisy draft of it. With ``MODEL.gguf``:
that file (self-speculation only, unless ``--draft`` is given). Runs on the GPU when there is
one, else on the CPU emulator; kernels are compiled (JIT) first, and the times printed exclude it.

It shows, each under ``BATCH_VARIANT`` and ``BATCH_INVARIANT``:

1. the mat-vec's warp count (4 warps for 1-4 columns, 2 for 5-8) and llama.cpp's MMQ order (int8
   tensor cores) past 8 columns, and the multi-query attention kernel: a replay at batch sizes 2..16, with the
   first op that differs for each;
2. attention's parallel blocks past 384 cells: one-token passes with P=4 and P=3 over 512
   attended cells agree below position 384 and differ from it on; a replay past 512;
3. the 256-cell verify guard: a batch that straddles cell 256 without the guard changes the
   logits of its earlier rows;
4. speculative decoding: exact under the invariant order, and where it leaves plain decoding
   under the variant one;
5. the SUBBLOCK order (exact at every width by construction): its replay and self-speculation,
   and that its plain decoding is its own reference, not BATCH_INVARIANT's tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..order import KV_PAD, ReductionOrder
from . import common

NAME = "demo"
HELP = "every mechanism of the batch-variance bug and its fix, on a synthetic Qwen3 (or yours)"

VAR, INV, SUB = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.SUBBLOCK
DEMO_PROMPT = "Speculative decoding promises"
DEMO_TOKENS = 16
DEMO_SEED = 0
# draft noise, as a fraction of each tensor's std: enough for rejections, little enough for acceptances
DEMO_DRAFT_NOISE = 0.05
N_DRAFT = 8
# Batch sizes of section 1: 2-4 keep the one-column warp count, 5 and 8 use 2 warps, 9 and 16
# leave the mat-vec for MMQ (llama.cpp's MMVQ_MAX_BATCH_SIZE = 8).
BATCH_SIZES = (2, 4, 5, 9, 16)
# Section 2: P=4 and P=3 over 512 attended cells differ only where chunk 3 (cells 384..511)
# holds real cells; one-token passes at positions ATTN_FROM..ATTN_TO-1 straddle 384.
P_SPLIT = 384
ATTN_FROM, ATTN_TO = 376, 392
# A seeded token sequence long enough to pass 512 cells (the next padding step after 384).
LONG_LEN = 520
LONG_REPLAY_FROM = 508
# Width of the replay past 512 cells (a verify batch of 8 guesses plus the last token).
LONG_BATCH = 9
# Positions before a compared range are fed in passes of this many tokens (not compared).
PREFIX_BATCH = 64
# Section 3: batches of 16 from a position that is not a multiple of 16 meet cell 256 inside a pass.
GUARD_FROM, GUARD_TO, GUARD_BATCH = 245, 261, 16


def demo_shape():
    """The demo's synthetic shape: 1 layer, n_embd 1024 (4 super-blocks per row), micro vocabulary."""
    from ..model.synth import MICRO_MATRIX_STD, SynthShape

    # n_embd 1024: a Q6_K row is 4 super-blocks, so 4 warps sum one block each and 2 warps two each;
    # n_ff 2048: ffn_down's rows are 8 super-blocks (Q4_K: one iteration of 4 warps, two of 2 warps).
    # 8 query heads and 2 KV heads as in Qwen3's grouped attention. One layer and the micro
    # vocabulary keep a one-token pass of the CPU emulator cheap (the demo runs in about 2 minutes).
    return SynthShape("demo", n_embd=1024, n_layer=1, n_head=8, n_head_kv=2, n_ff=2048, vocab="micro",
                      tied=True, fill="gaussian", matrix_std=MICRO_MATRIX_STD)


def demo_models(seed: int = DEMO_SEED, noise: float = DEMO_DRAFT_NOISE, cache: Path | None = None,
                notice=None) -> tuple[Path, Path]:
    """Paths of the cached synthetic target and its noisy draft (written once, verified on use)."""
    from ..decode.draft import write_draft
    from ..model.synth import cached_model

    kw = {} if notice is None else {"notice": notice}
    shape = demo_shape()
    target = cached_model(shape, seed, cache, **kw)
    draft = cached_model(shape, seed, cache, noise=noise,
                         draft_writer=lambda t, p: write_draft(t, p, noise=noise, seed=seed + 1), **kw)
    return target, draft


@dataclass
class DemoResult:
    """What the demo measured (every number the printout shows)."""

    model: str
    backend: str
    compile_s: float
    model_file: str = ""
    replays: dict = field(default_factory=dict)  # name -> ReplayReport
    localized: dict = field(default_factory=dict)  # batch size -> (op name, mechanism) under BATCH_VARIANT
    split: dict = field(default_factory=dict)  # section 2: positions compared, positions that differ
    speculative: dict = field(default_factory=dict)  # (order, draft) -> SpeculativeResult
    plain: dict = field(default_factory=dict)  # order -> plain tokens
    seconds: dict = field(default_factory=dict)  # wall time per step
    cpu_seconds: dict = field(default_factory=dict)  # CPU time of this process per step (all threads)

    @property
    def invariant_exact(self) -> bool:
        """Every replay and speculative run under the exact orders (BATCH_INVARIANT, SUBBLOCK) is exact."""
        inv = [r for k, r in self.replays.items() if k.startswith(("invariant", "subblock"))]
        specs = [r for (o, _), r in self.speculative.items() if o in (INV.name, SUB.name)]
        return all(r.identical for r in inv) and all(s.matches_plain and not s.vacuous for s in specs)


def _warm_up(model, out) -> float:
    """Run one pass of every kernel shape the demo uses, so that JIT compilation is timed apart."""
    out("compiling kernels (Numba/NVRTC JIT; cached on disk after the first run) ...")
    t0 = time.perf_counter()
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    for order in (VAR, INV, ReductionOrder.custom(name="p3", parallel_blocks=3)):
        for width in (1, 2, 5, 9):
            model.reset()
            model.forward(ids[:width], 0, order=order)
    model.reset()
    return time.perf_counter() - t0


def _matvec_mechanism(width: int) -> str:
    from .. import plans

    one = plans.matvec_plan(VAR, 1, "Q6_K")
    p = plans.matvec_plan(VAR, width, "Q6_K")
    if p.kernel != "mmvq":
        what = "llama.cpp's MMQ order (int8 MMA)" if p.kernel == "mmq_stock" else "the tiled kernel"
        return f"mat-vec: {width} columns > {plans.MMVQ_MAX_BATCH_SIZE} leave for {what}"
    if p.nwarps != one.nwarps:
        return f"mat-vec: {p.nwarps} warps instead of {one.nwarps}"
    return "mat-vec: same geometry as one column"


def _attention_mechanism(width: int, kv_len: int, config) -> str:
    from .. import plans

    one = plans.attention_plan(VAR, 1, kv_len, config.n_head, config.n_head_kv, config.head_dim)
    p = plans.attention_plan(VAR, width, kv_len, config.n_head, config.n_head_kv, config.head_dim)
    return (f"attention: {p.kernel_name} with P={p.parallel_blocks} instead of "
            f"{one.kernel_name} with P={one.parallel_blocks}")


def _mechanism(op: str | None, width: int, kv_len: int, config) -> str:
    if op is None:
        return "-"
    name = op.rsplit(".", 1)[-1]
    if name == "attn":
        return _attention_mechanism(width, kv_len, config)
    return _matvec_mechanism(width)


def _host(x) -> np.ndarray:
    get = getattr(x, "get", None)  # a CuPy array from the record hook
    return np.asarray(get() if callable(get) and not isinstance(x, np.ndarray) else x)


def _split_positions(model, seq, order_a, order_b) -> dict:
    """One-token passes at ATTN_FROM..ATTN_TO-1 under two orders: where layer 0's attention output
    differs, and where the logits do."""
    from ..decode.passes import feed

    model.reset()
    feed(model, seq[:ATTN_FROM], 0, order_a, PREFIX_BATCH)
    rows = {}
    for order in (order_a, order_b):
        model.rollback(ATTN_FROM)
        out = []
        for p in range(ATTN_FROM, ATTN_TO):
            rec: dict = {}
            logits = np.asarray(model.forward([seq[p]], p, order=order, record=rec))[-1]
            attn = next((v for k, v in rec.items() if k.endswith(".attn") and k.startswith("blk.0.")), None)
            out.append((_host(attn).tobytes() if attn is not None else b"", logits.tobytes()))
        rows[order.name] = out
    positions = list(range(ATTN_FROM, ATTN_TO))
    pairs = list(zip(positions, rows[order_a.name], rows[order_b.name]))
    return {"positions": positions,
            "attention_differ": [p for p, a, b in pairs if a[0] != b[0]],
            "differ": [p for p, a, b in pairs if a[1] != b[1]]}


def run_demo(model_path=None, draft_path=None, device: str = "auto", tokens: int = DEMO_TOKENS,
             prompt: str = DEMO_PROMPT, batch_sizes=BATCH_SIZES, cache: Path | None = None, out=print,
             progress: bool = False, long_len: int = LONG_LEN) -> DemoResult:
    """Run the demo, print it with ``out``; returns the measurements."""
    from ..decode.localize import localize
    from ..decode.replay import replay
    from ..decode.speculative import generate_speculative
    from ..model.qwen3 import Qwen3

    t0 = time.perf_counter()
    if model_path is None:
        model_path, draft_path = demo_models(cache=cache, notice=lambda m: out(f"  {m}"))
    write_s = time.perf_counter() - t0
    n_ctx = common.kv_cells(max(long_len, len(prompt.encode()) + tokens + N_DRAFT) + 1)
    t0 = time.perf_counter()
    target = Qwen3.from_gguf(model_path, device=device, n_ctx=n_ctx, progress=False)
    twin = Qwen3.from_gguf(model_path, device=device, n_ctx=n_ctx, progress=False)
    noisy = Qwen3.from_gguf(draft_path, device=device, n_ctx=n_ctx, progress=False) if draft_path else None
    load_s = time.perf_counter() - t0
    c = target.config
    out(f"hiraishin demo: {target.name} ({c.n_layer} layer{'s' if c.n_layer != 1 else ''}, n_embd {c.n_embd}, n_ff {c.n_ff}, "
        f"{c.n_head}/{c.n_head_kv} heads, vocab {c.n_vocab}) on {target.backend.name}; "
        f"files ready in {write_s:.1f} s, loaded in {load_s:.1f} s")
    res = DemoResult(target.name, target.backend.name, _warm_up(target, out), model_file=str(model_path))
    out(f"  compiled in {res.compile_s:.1f} s (not counted below)\n")
    ids = target.tokenizer.encode(prompt) if target.tokenizer is not None else [1, 2, 3, 4]
    out(f"prompt {prompt!r} ({len(ids)} tokens); {tokens} greedy tokens; positions count from 0 at the "
        "first prompt token, and the logits at p choose the token at p + 1\n")

    def timed(name, fn):
        t, cpu = time.perf_counter(), time.process_time()
        value = fn()
        res.seconds[name] = time.perf_counter() - t
        res.cpu_seconds[name] = time.process_time() - cpu
        return value

    # 1. batch shape: mat-vec warps, MMQ past 8 columns, multi-query attention --------------------------
    plain_inv = timed("plain", lambda: target.generate(ids, max_new_tokens=tokens, order=INV, stop_at_eos=False))
    res.plain[INV.name] = plain_inv.tokens
    seq = ids + plain_inv.tokens
    for key, order in (("variant", VAR), ("invariant", INV)):
        res.replays[key] = timed(f"replay {key}", lambda o=order: replay(target, seq, list(batch_sizes), order=o,
                                                                          progress=progress))
    rep_v = res.replays["variant"]

    def localize_all():
        for b in rep_v.batches:
            if b.first_diff is not None:
                loc = localize(target, rep_v, batch_size=b.batch_size)
                res.localized[b.batch_size] = (loc.name, _mechanism(loc.name, b.batch_size, loc.position + 1, c))
    timed("localize", localize_all)
    out(f"1. The batch width: replay of {len(seq)} positions in batches, against one token per pass")
    w = max(12, max((len(_cell1(rep_v, b, res)) for b in rep_v.batches), default=12))
    out(f"   {'batch':>5}  {'BATCH_VARIANT':<{w}}  BATCH_INVARIANT")
    for b in rep_v.batches:
        inv_b = res.replays["invariant"][b.batch_size]
        out(f"   {b.batch_size:>5}  {_cell1(rep_v, b, res):<{w}}  "
            + ("bit-identical" if not inv_b.positions_differ else f"{len(inv_b.positions_differ)} differ (!)"))
    out("   fix: BATCH_INVARIANT gives every column the one-column geometry (4 warps), splits wide batches "
        "into launches of <= 8 columns and sizes attention from the one-query kernel\n")

    # 2. attention's parallel blocks past 384 cells ----------------------------------------------
    rng = np.random.default_rng(DEMO_SEED)
    long_seq = [int(t) for t in rng.integers(0, c.n_vocab, long_len)]
    p4 = ReductionOrder.custom(name="P=4", parallel_blocks=4)
    p3 = ReductionOrder.custom(name="P=3", parallel_blocks=3)
    res.split = timed("P=4 vs P=3", lambda: _split_positions(target, long_seq, p4, p3))
    positions = res.split["positions"]
    out(f"2. Attention's parallel blocks: one-token passes at positions {positions[0]}..{positions[-1]} "
        f"(512 attended cells) with P=4 and with P=3")
    for what, key in (("layer 0's attention output", "attention_differ"), ("the logits", "differ")):
        d = res.split[key]
        below = [p for p in d if p < P_SPLIT]
        out(f"   {what}: {len(below)} of {P_SPLIT - positions[0]} positions below {P_SPLIT} differ, "
            f"{len(d) - len(below)} of {positions[-1] + 1 - P_SPLIT} from {P_SPLIT}"
            + (f" (first at {min(d)})" if d else ""))
    out(f"   (with P=3, block 0 takes chunks 0 and 3, and chunk 3 holds real cells only from cell {P_SPLIT}; "
        "the q8_1 quantization of the next mat-vec's input absorbs most last-bit differences)")
    for key, order in (("variant long", VAR), ("invariant long", INV)):
        res.replays[key] = timed(f"replay {key}", lambda o=order: replay(
            target, long_seq, [LONG_BATCH], order=o, start=LONG_REPLAY_FROM, prefill_batch=PREFIX_BATCH,
            progress=progress))
    v, i = res.replays["variant long"], res.replays["invariant long"]
    plan_v = _attention_mechanism(LONG_BATCH, long_len, c)
    out(f"   replay of positions {LONG_REPLAY_FROM}..{long_len - 1} (past 512 cells), batch {LONG_BATCH}: "
        f"BATCH_VARIANT {_differs(v)} ({plan_v}); BATCH_INVARIANT {_differs(i)}")
    out("   fix: BATCH_INVARIANT sizes P from the one-query kernel, so every launch at a KV length splits it "
        "the same way\n")

    # 3. the 256-cell verify guard ----------------------------------------------------------------
    unguarded = ReductionOrder(name="invariant_without_guard", matvec="invariant", attention="invariant",
                               kv_boundary=None)
    for key, order in (("without guard", unguarded), ("invariant guard", INV)):
        res.replays[key] = timed(f"replay {key}", lambda o=order: replay(
            target, long_seq[:GUARD_TO], [GUARD_BATCH], order=o, start=GUARD_FROM,
            prefill_batch=PREFIX_BATCH, progress=progress))
    ng = res.replays["without guard"]
    out(f"3. The 256-cell guard: batches of {GUARD_BATCH} from position {GUARD_FROM} (one pass holds cells "
        f"{GUARD_FROM + 1}..{GUARD_FROM + GUARD_BATCH}, across {KV_PAD})")
    ngb = ng[GUARD_BATCH]
    if not ngb.positions_differ:
        why = (f"the pass attends {2 * KV_PAD} padded cells instead of {KV_PAD}, but on this shape the extra "
               "chunks are fully masked for its earlier rows and a masked chunk leaves a block's partial "
               "sums unchanged; the guard matters where the padding moves real chunks to other blocks")
    elif max(ngb.positions_differ) < KV_PAD:
        why = f"all below {KV_PAD}: the pass attends {2 * KV_PAD} padded cells, so its earlier rows get another split"
    else:
        why = "(!) past the boundary too"
    out(f"   without the guard: {_differs(ng)}; {why}")
    out(f"   BATCH_INVARIANT (verify passes stop at multiples of {KV_PAD} cells): "
        f"{_differs(res.replays['invariant guard'])}\n")

    # 4. speculative decoding ---------------------------------------------------------------------
    plain_var = timed("plain variant", lambda: target.generate(ids, max_new_tokens=tokens, order=VAR,
                                                               stop_at_eos=False))
    res.plain[VAR.name] = plain_var.tokens
    drafts = [("self", twin)] + ([("noisy", noisy)] if noisy is not None else [])
    for order, plain in ((VAR, plain_var), (INV, plain_inv)):
        # the noisy draft runs under the invariant order only: it checks exactness with rejections, and
        # under the variant order the self draft already shows the divergence (at half the cost)
        for dname, draft in (drafts if order is INV else drafts[:1]):
            res.speculative[order.name, dname] = timed(f"speculative {order.name} {dname}", lambda o=order, d=draft, pl=plain: generate_speculative(
                target, ids, d, n_draft=N_DRAFT, order=o, max_new_tokens=tokens, stop_at_eos=False,
                plain_tokens=pl.tokens))
    out(f"4. Speculative decoding (draft-max {N_DRAFT}) against plain greedy decoding, {tokens} tokens")
    for dname, _ in drafts:
        cells = [_spec_cell(res.speculative[o.name, dname]) if (o.name, dname) in res.speculative else "-"
                 for o in (VAR, INV)]
        out(f"   {dname + ' draft':<12} BATCH_VARIANT: {cells[0]:<48} BATCH_INVARIANT: {cells[1]}")
    sv = res.speculative[VAR.name, "self"]
    if sv.first_divergence is not None:
        i = sv.first_divergence
        out(f"   BATCH_VARIANT, self draft, from position {sv.first_divergence_position}: plain "
            f"{_text(target, plain_var.tokens[i:i + 6])!r} vs speculative {_text(target, sv.tokens[i:i + 6])!r}")
    out("")

    # 5. the sub-block order: exact by construction, its own reference --------------------------
    plain_sub = timed("plain subblock", lambda: target.generate(ids, max_new_tokens=tokens, order=SUB,
                                                                stop_at_eos=False))
    res.plain[SUB.name] = plain_sub.tokens
    res.replays["subblock"] = timed("replay subblock", lambda: replay(target, ids + plain_sub.tokens,
                                                                      list(batch_sizes), order=SUB,
                                                                      progress=progress))
    res.speculative[SUB.name, "self"] = timed("speculative subblock self", lambda: generate_speculative(
        target, ids, twin, n_draft=N_DRAFT, order=SUB, max_new_tokens=tokens, stop_at_eos=False,
        plain_tokens=plain_sub.tokens))
    first = next((i for i, (a, b) in enumerate(zip(plain_sub.tokens, plain_inv.tokens)) if a != b), None)
    out("5. SUBBLOCK (each 32-value sub-block's exact integer dot scaled and added in k order, in K-segments "
        "fixed by the row length: the same float work at every width)")
    out(f"   replay in batches of {', '.join(map(str, batch_sizes))}: {_differs(res.replays['subblock'])}; "
        f"self-draft speculative: {_spec_cell(res.speculative[SUB.name, 'self'])}")
    out("   its plain decoding is its own reference: "
        + (f"it leaves BATCH_INVARIANT's plain tokens at generated token {first}" if first is not None
           else f"the same {tokens} tokens as BATCH_INVARIANT's here")
        + " (another order, other roundings; exactness is speculation == plain under one order)\n")
    total, cpu = sum(res.seconds.values()), sum(res.cpu_seconds.values())
    out("time (JIT excluded): " + ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items())
        + f"; total {total:.1f} s wall, {cpu:.1f} s CPU")
    out(("BATCH_INVARIANT: every replayed logit is bit-identical and speculative decoding emits plain "
         "decoding's tokens (and so under SUBBLOCK)") if res.invariant_exact
        else "BATCH_INVARIANT / SUBBLOCK: NOT exact: see above")
    return res


def _cell1(rep, b, res) -> str:
    n = len(rep.positions)
    if not b.positions_differ:
        return "bit-identical"
    op, mech = res.localized.get(b.batch_size, ("?", "?"))
    flips = f", {len(b.flips)} flips" if b.flips else ""
    return f"{len(b.positions_differ)}/{n} differ{flips}; first op {op}: {mech}"


def _differs(rep) -> str:
    if rep.identical:
        return "bit-identical"
    parts = []
    for b in rep.batches:
        if b.positions_differ:
            ps = b.positions_differ
            parts.append(f"batch {b.batch_size}: {len(ps)}/{len(rep.positions)} positions differ ({ps[0]}..{ps[-1]})")
    return "; ".join(parts)


def _spec_cell(s) -> str:
    if s.vacuous:
        return "drafted nothing (vacuous)"
    match = "= plain" if s.matches_plain else f"≠ plain from position {s.first_divergence_position}"
    return f"{match}, accepted {s.accepted}/{s.drafted}"


def _text(model, ids) -> str:
    return model.tokenizer.decode(ids) if model.tokenizer is not None else ",".join(map(str, ids))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.gguf", nargs="?",
                   help="a Qwen3 GGUF to run the demo on (default: the cached synthetic model)")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL.gguf", help="the same (llama.cpp's name)")
    p.add_argument("-md", "--model-draft", "--draft", dest="draft", metavar="DRAFT.gguf",
                   help="a draft model for section 4 besides self-speculation")
    common.add_n_predict(p, DEMO_TOKENS, "--tokens")
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT, help=f"prompt (default {DEMO_PROMPT!r})")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", metavar="OUT.json", help="write every measurement as JSON")


def run(args) -> int:
    from ..errors import HiraishinError

    if args.model and args.model_opt and args.model != args.model_opt:
        raise HiraishinError(f"two models given: {args.model!r} and -m {args.model_opt!r}")
    path = args.model or args.model_opt
    if args.draft and not path:
        raise HiraishinError("--model-draft needs MODEL.gguf too (the synthetic model has its own draft)")
    args.prompt_pos, args.file, args.system, args.think, args.chat, args.prompt_default = None, None, None, None, False, None
    prompt = common.read_prompt(args)
    common.check_output(args.json, "--json")
    for f in (path, args.draft):
        if f is not None:
            header = common.open_header(f)
            common.check_ctx(common.kv_cells(LONG_LEN + 1), header.config, args.device)
    res = run_demo(path, args.draft, device=args.device, tokens=args.n_predict, prompt=prompt, progress=True)
    if args.json:
        data = {
            "model": res.model, "backend": res.backend, "compile_s": res.compile_s, "seconds": res.seconds,
            "cpu_seconds": res.cpu_seconds,
            "replays": {k: r.to_dict() for k, r in res.replays.items()},
            "localized": {str(k): list(v) for k, v in res.localized.items()},
            "attention_split": res.split,
            "speculative": {f"{o}/{d}": s.to_dict() for (o, d), s in res.speculative.items()},
            "plain": res.plain, "invariant_exact": res.invariant_exact,
            "meta": common.run_meta(NAME, res.model_file, res.backend),
        }
        print(f"wrote {common.write_json(args.json, data)}", file=sys.stderr)
    return 0 if res.invariant_exact else 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description=__doc__.split("\n\n", 1)[1],
                                   formatter_class=common.formatter(), epilog=common.epilog())
    add_arguments(parser)
    parser.set_defaults(run=run)
