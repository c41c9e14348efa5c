"""Subcommands of the ``hiraishin`` command line; each module has ``register(subparsers)``."""
