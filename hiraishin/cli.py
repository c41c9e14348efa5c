"""The ``hiraishin`` command line: one subcommand per module in ``hiraishin.commands``.

Each module has ``register(subparsers)``, which adds its parser and sets ``run=<function(args)>``
as the parser's default. A new subcommand is a new module plus its name in ``COMMANDS``.
Command modules import heavy things (Numba, CuPy) inside their ``run``, so that ``--help`` and
``inspect`` stay fast. A listed module that is not there (yet) is skipped.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from . import __version__
from .errors import HiraishinError

COMMANDS = ("inspect", "synth", "generate", "replay", "speculative", "plan", "demo", "bench")

# Exit status for bad input (a file that is not a usable model, a bad argument), as argparse uses.
EXIT_USAGE = 2
# Exit status after Ctrl-C (128 + SIGINT, what a shell reports for a process SIGINT killed).
EXIT_INTERRUPTED = 130
# Exit status when the reader of stdout went away (128 + SIGPIPE), e.g. ``hiraishin inspect F | head``.
EXIT_BROKEN_PIPE = 141


def available_commands() -> list[str]:
    """The names in ``COMMANDS`` whose module exists."""
    return [n for n in COMMANDS if importlib.util.find_spec(f"{__package__}.commands.{n}") is not None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hiraishin",
        description="Qwen3 GGUF on kernels whose float reduction order is an argument.",
    )
    parser.add_argument("--version", action="version", version=f"hiraishin {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in available_commands():
        importlib.import_module(f"{__package__}.commands.{name}").register(subparsers)
    return parser


def _silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a check failed, 2 bad input,
    130 interrupted, 141 stdout closed)."""
    from .atomic import install_sigterm_cleanup

    install_sigterm_cleanup()
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("hiraishin: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        print(f"\nhiraishin {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (HiraishinError, OSError) as exc:
        # One clear line, no traceback: the message names the file and what is wrong with it.
        message = str(exc).replace("\n", " ")
        print(f"hiraishin {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
