"""``hiraishin synth --shape tiny --seed 0 -o FILE``: write a synthetic Qwen3 Q4_K_M GGUF."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from ..model.synth import SHAPES

    parser = subparsers.add_parser(
        "synth",
        help="write a seeded synthetic Qwen3 Q4_K_M GGUF file",
        description="Write a synthetic Qwen3 GGUF with llama.cpp's keys, tensor names, shapes and "
        "Q4_K_M type mix. micro/tiny: seeded Gaussian weights; qwen3-0.6b/qwen3-8b: random "
        "blocks, for timing only.",
    )
    parser.add_argument("--shape", choices=tuple(SHAPES), default="tiny", help="model shape (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the .gguf file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..model.synth import write_synthetic

    path = write_synthetic(args.output, shape=args.shape, seed=args.seed, progress=not args.quiet)
    print(f"wrote {path} (shape {args.shape}, seed {args.seed}, {path.stat().st_size:,} bytes)")
    return 0
