"""The ``hiraishin`` command line: one subcommand per module in ``hiraishin.commands``.

Each module has ``register(subparsers)``, which adds its parser and sets ``run=<function(args)>``
as the parser's default. A new subcommand is a new module plus its name in ``COMMANDS``.
Command modules import heavy things (Numba, CuPy) inside their ``run``, so that ``--help`` and
``inspect`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import HiraishinError

COMMANDS = ("inspect", "synth", "generate", "replay", "speculative", "demo")

# Exit status for bad input (a file that is not a usable model, a bad argument), as argparse uses.
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hiraishin",
        description="Qwen3 GGUF on kernels whose float reduction order is an argument.",
    )
    parser.add_argument("--version", action="version", version=f"hiraishin {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (HiraishinError, OSError) as exc:
        # One clear line, no traceback: the message names the file and what is wrong with it.
        print(f"hiraishin {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
