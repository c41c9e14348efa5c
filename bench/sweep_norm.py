"""Time the fused norm kernels in CUDA blocks of other sizes than rmsnorm's tree (``fused/launch.py``
NORM_BLOCK_THREADS; the block plays the tree, which changes no bit), and the norm inside the mat-vec
launches (``norm_mmvq/launch.py``'s limits): per variant, graph-replayed passes of both models
(``bench/replay_widths.py``), their logits digests checked against the first variant's.

    python3 bench/sweep_norm.py MODEL.gguf [...] [--variants tree,256,128] [--orders invariant] [--widths 1,3]
        [--json F]

A variant is "tree" (the tree's own thread count) or a thread count, optionally followed by
"/mmvq=T:B:G[:S]": norm_mmvq for passes of at most T tokens, launches of at most B CUDA blocks, G row
groups per CUDA block, and at most S CUDA blocks per SM (each then strides over several blocks' rows and
makes the norm once; 0 or absent: one CUDA block per G row groups) ("/mmvq=0:0:4": norm launches of their
own, as before norm_mmvq).

Session 5 measured two earlier forms, both slower and dropped (bench/results/2026-12-02-h200-session5):
smaller blocks whose threads read their tree threads' values one loop step at a time (b-norm-pdl), and
the tree's own block keeping its values and weights in registers (c-bench-tests).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_widths  # noqa: E402
from benchlib import write_rows_json  # noqa: E402

from hiraishin.benchmark import parse_widths  # noqa: E402
from hiraishin.kernels.fused import launch as fused_launch  # noqa: E402
from hiraishin.kernels.norm_mmvq import launch as norm_mmvq  # noqa: E402

_MMVQ_LIMITS = ("NORM_MMVQ_MAX_TOKENS", "NORM_MMVQ_MAX_BLOCKS", "NORM_MMVQ_GROUPS", "NORM_MMVQ_PER_SM")
_DEFAULTS = {name: getattr(norm_mmvq, name) for name in _MMVQ_LIMITS}


def _apply(variant: str) -> dict:
    """Set the module constants a variant names; returns them (for the JSON rows)."""
    threads_text, _, mmvq = variant.strip().partition("/mmvq=")
    threads = None if threads_text == "tree" else int(threads_text)
    fused_launch.NORM_BLOCK_THREADS = threads
    fused_launch._launches.clear()  # a launch compiles its kernel and fixes its geometry when first built
    knobs = {"norm_block_threads": threads}
    # every variant starts from the library's limits (a variant without "/mmvq=" does not inherit the one before)
    values = dict(_DEFAULTS)
    if mmvq:
        values.update(zip(_MMVQ_LIMITS, (int(v) for v in mmvq.split(":"))))
    for name, value in values.items():
        setattr(norm_mmvq, name, value)
    knobs.update({name.lower(): getattr(norm_mmvq, name) for name in _MMVQ_LIMITS})
    return knobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    replay_widths.add_arguments(ap)
    ap.add_argument("--variants", default="tree,256,128",
                    help="real threads per CUDA block ('tree': the tree's own), the first the reference of the bits")
    args = ap.parse_args(argv)
    orders = replay_widths.orders_of(ap, args)
    widths = parse_widths(args.widths)
    saved = fused_launch.NORM_BLOCK_THREADS, {name: getattr(norm_mmvq, name) for name in _MMVQ_LIMITS}
    rows, ref = [], {}
    try:
        for v in args.variants.split(","):
            knobs = _apply(v)
            print(f"== norm kernels: {v.strip()} ({knobs})", flush=True)
            for path in args.models:
                for r in replay_widths.measure(path, orders, widths, args.steps):
                    key = (r["model"], r["order"], r["width"])
                    ref.setdefault(key, r["logits_sha256"])
                    r.update(variant=v.strip(), **knobs, same_bits=ref[key] == r["logits_sha256"])
                    rows.append(r)
                    if not r["same_bits"]:
                        print(f"   BITS DIFFER from the first variant: {key}", flush=True)
    finally:
        fused_launch.NORM_BLOCK_THREADS = saved[0]
        for name, value in saved[1].items():
            setattr(norm_mmvq, name, value)
    if args.json:
        write_rows_json(args.json, rows)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
